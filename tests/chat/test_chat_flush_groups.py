"""The flusher stores several accounts' small batches in one transaction.

With many sockets and a short flush interval each account holds a few dozen
messages a pass; one commit per account made the flusher thread wait on the
database once per account (and win the interpreter lock back from every source
thread each time). Checked here on a real PostgreSQL through the rows' `xmin`
(the id of the transaction that inserted them): one per group, a group within
`flush_batch_size`, poison rows quarantined under their own account, and a
failed transaction leaving every batch of its group in flight.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from lumio_ingestd import fastjson
from lumio_ingestd.chat.batch import Claimed
from lumio_ingestd.chat.flusher import transactions
from lumio_ingestd.chat.store import stageable
from lumio_ingestd.model import ChatMessage
from lumio_ingestd.stores import rediskeys
from support import dbname_of
from support.chat import ChatRig, assert_exactly_once, counter_value, make_messages, make_rig
from support.harness.servers import PostgresServer


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[ChatRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url,
                 chat={"flush_batch_size": 100}, timescale={"statement_timeout_secs": 1})
    yield r
    r.close()


def _transactions(rig: ChatRig) -> dict[str, set[int]]:
    """Inserting transaction (xmin) -> accounts whose rows it inserted."""
    with rig.db() as conn, conn.cursor() as cur:
        cur.execute("SELECT xmin::text, account_id FROM chat_messages")
        found: dict[str, set[int]] = {}
        for xmin, account in cur.fetchall():
            found.setdefault(xmin, set()).add(int(account))
        return found


def _ids(msgs: list[ChatMessage]) -> list[str]:
    return [m.message_id for m in msgs]


def test_small_batches_of_many_accounts_are_one_transaction(rig: ChatRig) -> None:
    sent = [m for account in range(1, 17) for m in make_messages(5, account=account)]
    assert rig.ingest().persist_batch(sent) == {"buffered": 80}
    flusher = rig.flusher()
    flusher.tick()
    assert_exactly_once(rig.stored(), _ids(sent))
    assert list(_transactions(rig).values()) == [set(range(1, 17))]
    # Counted per account batch, as before.
    assert counter_value(rig.metrics, "chat_flush_batches_total", {"result": "ok"}) == 16
    assert counter_value(rig.metrics, "chat_messages_flushed_total") == 80
    assert rig.chat_keys() == []


def test_small_batches_share_a_transaction_within_the_batch_size_and_full_ones_go_alone(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url,
                   chat={"flush_batch_size": 10})
    try:
        # Accounts 1-5 hold 4 each; account 3 holds 25 (10 + 10 + 5: three rounds).
        sent = [m for account in (1, 2, 4, 5) for m in make_messages(4, account=account)]
        big = make_messages(25, account=3)
        rig.ingest().persist_batch(sent + big)
        rig.flusher().tick()
        assert_exactly_once(rig.stored(), _ids(sent + big))
        # Round 1: 4 + 4, account 3's full batch alone, 4 + 4; rounds 2 and 3: account
        # 3's next 10 and its last 5.
        assert sorted(sorted(a) for a in _transactions(rig).values()) == [
            [1, 2], [3], [3], [3], [4, 5]]
        assert counter_value(rig.metrics, "chat_messages_flushed_total") == len(sent) + 25
        assert rig.chat_keys() == []
    finally:
        rig.close()


def test_transactions_never_exceed_the_batch_size() -> None:
    def claims(*sizes: int) -> list[tuple[Claimed, bool]]:
        return [(Claimed(i, f"inflight-{i}", [b"x"] * n), False) for i, n in enumerate(sizes)]

    def cut(*sizes: int) -> list[list[int]]:
        return [[c.account for c, _ in g] for g in transactions(claims(*sizes), 10)]

    assert cut(4, 10, 4, 3, 9, 1) == [[0], [1], [2, 3], [4, 5]]
    assert cut(10, 10) == [[0], [1]]
    assert cut(1, 2, 3, 4) == [[0, 1, 2, 3]]
    assert cut(6, 5) == [[0], [1]]  # never more than a full batch in one transaction
    assert cut() == []


def test_a_refused_row_is_quarantined_under_its_own_account(rig: ChatRig) -> None:
    sent = [m for account in range(1, 5) for m in make_messages(5, account=account)]
    rig.ingest().persist_batch(sent)
    template = json.loads(make_messages(1, account=2)[0].to_entry())
    poison = fastjson.dumps({**template, "message_id": "bad-time", "created_at": "yesterday"})
    assert stageable(poison)  # it reaches PostgreSQL, which refuses it (23502)
    rig.oracle_redis().rpush(rediskeys.chat_buffer(2), poison)
    rig.flusher().tick()
    assert_exactly_once(rig.stored(), _ids(sent) + ["bad-time"], quarantined=["bad-time"])
    quarantined = rig.quarantined(2)
    assert [q["message_id"] for q in quarantined] == ["bad-time"]
    assert quarantined[0]["sqlstate"] == "23502"
    assert all(rig.quarantined(a) == [] for a in (1, 3, 4))
    # The good rows of the four accounts still went in one transaction with it.
    assert set().union(*_transactions(rig).values()) == {1, 2, 3, 4}
    assert counter_value(rig.metrics, "chat_quarantined_total") == 1
    assert [k for k in rig.chat_keys() if "quarantine" not in k] == []


def test_a_failed_group_leaves_every_batch_in_flight_then_stores_once(rig: ChatRig) -> None:
    sent = [m for account in range(1, 4) for m in make_messages(5, account=account)]
    rig.ingest().persist_batch(sent)
    flusher = rig.flusher()
    with rig.db() as locker, locker.cursor() as cur:
        cur.execute("BEGIN; LOCK TABLE chat_messages IN ACCESS EXCLUSIVE MODE")
        flusher.tick()  # the group's insert waits for the lock until statement_timeout
        cur.execute("ROLLBACK")
    assert rig.stored() == {}
    assert flusher.consecutive_failures == {1: 1, 2: 1, 3: 1}
    assert counter_value(rig.metrics, "chat_flush_batches_total", {"result": "failed"}) == 3
    client = rig.oracle_redis()
    for account in (1, 2, 3):
        assert client.llen(rediskeys.chat_inflight(account, flusher.instance)) == 5
        assert client.llen(rediskeys.chat_buffer(account)) == 0
    flusher.tick()
    assert_exactly_once(rig.stored(), _ids(sent))
    assert flusher.consecutive_failures == {}
    assert rig.chat_keys() == []
