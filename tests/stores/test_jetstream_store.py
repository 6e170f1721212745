"""The Jetstream store against a real PostgreSQL: rev rule, tombstones, in-batch dedup, cursor."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.devkit.standins.jetstream import commit, tid
from lumio_ingestd.sources.jetstream.protocol import ApplyResult, Commit, decode
from lumio_ingestd.stores import jetstream as store
from support import make_config
from support.harness.servers import PostgresServer

DID = "did:plc:streamer1111aaaa2222bbbb"
T = 1_767_640_000_000_000
POST = "app.bsky.feed.post"


@pytest.fixture
def pool(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str) -> Iterator[Pool]:
    dbname = dict(kv.split("=", 1) for kv in pg_dsn.split())["dbname"]
    cfg = make_config(tmp_path, pg_url=pg_server.url(dbname))
    migrate(cfg.timescale)
    p = Pool(cfg.timescale)
    yield p
    p.close()


def c(t: int, op: str, rkey: str = "k1", *, rev_t: int | None = None, text: str = "",
      collection: str = POST) -> Commit:
    frame = commit(DID, t, op, collection, rkey, rev=tid(rev_t if rev_t is not None else t),
                   record={"$type": collection, "text": text or f"at {t}"})
    out = decode(json.dumps(frame))
    assert isinstance(out, Commit)
    return out


def apply(pool: Pool, commits: list[Commit], cursor: int | None = None, **kw: Any) -> ApplyResult:
    if cursor is None and commits:
        cursor = max(x.time_us for x in commits)
    with pool.transaction() as cur:
        return store.apply(cur, commits, cursor_name="default", cursor_us=cursor, **kw)


def rows(pool: Pool) -> dict[str, tuple[Any, ...]]:
    with pool.transaction() as cur:
        cur.execute("SELECT rkey, rev, cid, record, time_us FROM bsky_records ORDER BY rkey")
        return {r[0]: tuple(r[1:]) for r in cur.fetchall()}


def cursor(pool: Pool) -> int | None:
    with pool.transaction() as cur:
        return store.load_cursor(cur, "default")


def test_create_update_delete_of_one_key_in_one_batch(pool: Pool) -> None:
    batch = [c(T, "create", text="one"), c(T + 1, "update", text="two"), c(T + 2, "delete")]
    res = apply(pool, batch)  # without the in-batch dedup this is SQLSTATE 21000
    assert [x.operation for x in res.written] == ["delete"]
    assert res.stale == 2
    assert rows(pool) == {"k1": (tid(T + 2), None, None, T + 2)}  # a tombstone
    assert cursor(pool) == T + 2


def test_the_same_commit_twice_in_one_batch_and_again_later_is_one_write(pool: Pool) -> None:
    first = c(T, "create", text="hello")
    res = apply(pool, [first, first, c(T, "create", "k2"), first])
    assert sorted(x.rkey for x in res.written) == ["k1", "k2"] and res.stale == 2
    again = apply(pool, [first])  # a rewind replays it
    assert again.written == [] and again.stale == 1
    assert rows(pool)["k1"][2] == {"$type": POST, "text": "hello"}


def test_in_batch_dedup_keeps_the_newest_rev_even_out_of_order(pool: Pool) -> None:
    newer, older = c(T + 5, "update", text="newer"), c(T + 1, "create", text="older")
    res = apply(pool, [newer, older])
    assert res.written == [newer]
    assert rows(pool)["k1"][2]["text"] == "newer"


def test_an_older_update_does_not_overwrite_newer_state(pool: Pool) -> None:
    apply(pool, [c(T, "create", text="v1"), c(T + 3, "update", "k2", text="v3")])
    apply(pool, [c(T + 3, "update", text="v3")])
    res = apply(pool, [c(T + 1, "update", text="v2"), c(T + 1, "create", "k2", text="old")], cursor=T + 1)
    assert res.written == [] and res.stale == 2
    state = rows(pool)
    assert state["k1"][0] == tid(T + 3) and state["k1"][2]["text"] == "v3"
    assert state["k2"][2]["text"] == "v3"


def test_an_older_delete_does_not_delete_newer_state(pool: Pool) -> None:
    apply(pool, [c(T + 5, "create", text="recreated")])
    res = apply(pool, [c(T + 2, "delete")], cursor=T + 2)
    assert res.written == []
    assert rows(pool)["k1"][2] == {"$type": POST, "text": "recreated"}


def test_a_create_replayed_after_a_newer_delete_does_not_resurrect(pool: Pool) -> None:
    apply(pool, [c(T, "create", text="oops")])
    apply(pool, [c(T + 1, "delete")])
    res = apply(pool, [c(T, "create", text="oops")], cursor=T)  # the rewind cut between them
    assert res.written == []
    assert rows(pool) == {"k1": (tid(T + 1), None, None, T + 1)}
    # a delete of a record never seen leaves a tombstone too, for the same reason
    apply(pool, [c(T + 9, "delete", "k9")])
    apply(pool, [c(T + 8, "create", "k9")], cursor=T + 8)
    assert rows(pool)["k9"][2] is None


def test_a_newer_create_after_a_delete_is_written(pool: Pool) -> None:
    apply(pool, [c(T, "create"), c(T + 1, "delete", "k1")])
    res = apply(pool, [c(T + 2, "create", text="back")])
    assert [x.operation for x in res.written] == ["create"]
    assert rows(pool)["k1"][2]["text"] == "back"


def test_the_cursor_only_moves_forward(pool: Pool) -> None:
    apply(pool, [c(T + 10, "create", "a")])
    res = apply(pool, [c(T + 3, "create", "b")])  # an older batch after a newer one
    assert res.cursor == T + 10 and cursor(pool) == T + 10
    assert rows(pool)["b"]  # its records are stored all the same
    assert apply(pool, [], cursor=T + 11).cursor == T + 11  # identity/account-only batches move it
    assert apply(pool, [], cursor=None).cursor == T + 11


def test_the_cursor_is_written_in_the_batch_transaction(pool: Pool) -> None:
    with pytest.raises(RuntimeError):
        with pool.transaction() as cur:
            store.apply(cur, [c(T, "create")], cursor_name="default", cursor_us=T)
            raise RuntimeError("the commit never happens")
    assert rows(pool) == {} and cursor(pool) is None


def test_values_postgres_refuses_never_reach_it(pool: Pool) -> None:
    raw = (f'{{"did":"{DID}","time_us":{T},"kind":"commit","commit":{{"rev":"{tid(T)}",'
           f'"operation":"create","collection":"{POST}","rkey":"nul","cid":"c",'
           '"record":{"text":"a\\u0000b\\ud800","\\u0000":1}}}')
    ev = decode(raw)
    assert isinstance(ev, Commit)
    apply(pool, [ev])
    assert rows(pool)["nul"][2] == {"text": "a\ufffdb\ufffd", "\ufffd": 1}


def test_one_refused_commit_is_isolated_and_the_rest_stored(pool: Pool) -> None:
    with pool.transaction() as cur:
        cur.execute("ALTER TABLE bsky_records ADD CONSTRAINT no_poison CHECK (rkey <> 'poison')")
    batch = [c(T, "create", "a"), c(T + 1, "create", "poison"), c(T + 2, "create", "b")]
    with pytest.raises(psycopg2.errors.CheckViolation):
        apply(pool, batch)
    assert rows(pool) == {}
    res = apply(pool, batch, isolate=True)
    assert [x.rkey for x in res.written] == ["a", "b"]
    assert [(x.rkey, why) for x, why in res.refused] == [("poison", "SQLSTATE 23514")]
    assert set(rows(pool)) == {"a", "b"} and cursor(pool) == T + 2



def test_without_the_dedup_postgres_refuses_the_batch(pool: Pool) -> None:
    """Why rule 1 exists: the same key twice in one ON CONFLICT DO UPDATE is SQLSTATE 21000."""
    with pytest.raises(psycopg2.errors.CardinalityViolation):
        with pool.transaction() as cur:
            store._upsert(cur, [c(T, "create"), c(T + 1, "update")])
