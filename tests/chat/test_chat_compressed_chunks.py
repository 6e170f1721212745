"""Chat stored exactly once into compressed chunks: the flush path (COPY straight into
the table, and the staging path after a unique violation) and the dead-letter drain
replaying messages of 70 hours and 10 days ago, some already stored, some twice in the
list. The same test runs on uncompressed chunks for the same result."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lumio_ingestd.chat.store import insert_chat
from lumio_ingestd.model import ChatMessage
from lumio_ingestd.stores import rediskeys
from support import dbname_of
from support.chat import ChatRig, assert_exactly_once, make_rig
from support.harness.servers import PostgresServer, wait_until


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[ChatRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url)
    yield r
    r.close()


def _messages(prefix: str, n: int, hours_ago: float, account: int = 7) -> list[ChatMessage]:
    start = datetime.now(UTC) - timedelta(hours=hours_ago)
    return [ChatMessage.create(platform="twitch", account_id=account, message_id=f"{prefix}-{i}",
                               created_at=start + timedelta(seconds=i), user_id=f"u{i % 5}",
                               text=f"{prefix} message {i}", extras={"seq": i})
            for i in range(n)]


def _compressed_chunks(rig: ChatRig) -> int:
    with rig.db() as conn, conn.cursor() as cur:
        cur.execute("SELECT to_regclass('timescaledb_information.chunks') IS NOT NULL")
        row = cur.fetchone()
        if not row or not row[0]:
            return 0
        cur.execute("SELECT count(*) FROM timescaledb_information.chunks "
                    "WHERE hypertable_name = 'chat_messages' AND is_compressed")
        row = cur.fetchone()
        return int(row[0]) if row else 0


def test_late_chat_into_compressed_chunks_is_stored_exactly_once(
        rig: ChatRig, compress: Callable[[str], int]) -> None:
    late = _messages("late", 300, 70)  # a dead letter near the end of its 72 h
    older = _messages("older", 300, 240)  # requeued from the quarantine, say
    other = _messages("other", 100, 240, account=8)
    with rig.pool.transaction() as cur:
        assert insert_chat(cur, [*late, *older, *other]) == 700
    compressed = compress(rig.cfg.timescale.dsn)
    assert _compressed_chunks(rig) == compressed

    new_late, new_older = _messages("new-late", 50, 70.5), _messages("new-older", 50, 240.5)
    # The flush path: a batch of stored and new rows meets a unique violation on the
    # compressed chunk and takes the staging path (ON CONFLICT DO NOTHING).
    with rig.pool.transaction() as cur:
        assert insert_chat(cur, [*late[:20], *new_late[:10], *older[:20], *new_older[:10]]) == 20
    # New rows only: COPY straight into the compressed chunks.
    with rig.pool.transaction() as cur:
        assert insert_chat(cur, new_late[10:20]) == 10

    # The drain: replays of stored rows, new rows, and a new row twice.
    entries = [m.to_entry() for m in [*late[100:150], *older[100:150], *new_late[20:], *new_older[10:],
                                      new_late[30], new_older[40]]]
    rig.client.rpush(rediskeys.chat_deadletter(7), *entries)
    drain = rig.drain()
    drain.start()
    assert wait_until(lambda: rig.client.llen(rediskeys.chat_deadletter(7)) == 0 and not rig.chat_keys(),
                      timeout=30)
    drain.request_stop()
    assert drain.join(10)
    every = [*late, *older, *other, *new_late, *new_older]
    assert_exactly_once(rig.stored(), [m.message_id for m in every])
    rows = rig.rows()
    for m in (new_older[45], new_late[49], older[120]):
        assert rows[m.message_id][2] == m.created_at  # stored with its original time
