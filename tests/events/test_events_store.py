"""The idempotent event insert against a real PostgreSQL: dedup, the lock, children, refusals."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import psycopg2
import pytest

from lumio_ingestd.db.errors import classify
from lumio_ingestd.events import store
from lumio_ingestd.model import Kind, PlatformEvent
from support import dbname_of
from support.events import (
    Rig,
    children_of,
    db_rows,
    make_event,
    make_rig,
    one_waits_on_an_advisory_lock,
    stored_ids,
)
from support.harness.servers import PostgresServer


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[Rig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url)
    yield r
    r.close()


def _insert(rig: Rig, ev: PlatformEvent) -> bool:
    with rig.pool.transaction() as cur:
        return store.insert_event(cur, ev)


def test_an_event_without_external_id_is_one_row_by_its_key(rig: Rig) -> None:
    ev = make_event(n=1)
    assert _insert(rig, ev) is True
    assert _insert(rig, ev) is False  # the replay of the same (id, created_at)
    rows = db_rows(rig.pg_url, "SELECT id, created_at, account_id, type, external_id, payload "
                               "FROM events")
    assert rows == [(str(ev.id), ev.created_at, 7, "channel.subscription.gift", None,
                     {"n": 1, "tier": "1000"})]


def test_the_same_external_id_is_stored_once_whatever_the_id(rig: Rig) -> None:
    first = make_event(external_id="gift-1", n=1)
    # A redelivery: the platform's id again, a new row id and a later delivery time.
    again = make_event(external_id="gift-1", n=1, created_at=first.created_at + timedelta(seconds=40))
    other_account = make_event(account=8, external_id="gift-1", n=1)
    # Platforms number their own things: the same id on another platform is another event.
    other_platform = replace(make_event(external_id="gift-1", n=1), platform="kick")
    assert _insert(rig, first) is True
    assert _insert(rig, again) is False
    assert _insert(rig, other_account) is True
    assert _insert(rig, other_platform) is True
    assert sorted(stored_ids(rig.pg_url)) == sorted([str(first.id), str(other_account.id),
                                                     str(other_platform.id)])


def test_the_dedup_probe_is_bounded_to_its_window(rig: Rig) -> None:
    """Inside DEDUP_WINDOW the external id dedups; far outside it, the probe does not look."""
    first = make_event(external_id="gift-2")
    near = replace(first, id=uuid.uuid4(), created_at=first.created_at - store.DEDUP_WINDOW
                   + timedelta(minutes=1))
    far = replace(first, id=uuid.uuid4(), created_at=first.created_at - 2 * store.DEDUP_WINDOW)
    assert _insert(rig, first) is True
    assert _insert(rig, near) is False
    assert _insert(rig, far) is True


def test_the_advisory_lock_serialises_two_writers_of_one_external_id(rig: Rig) -> None:
    """B starts while A's row is not committed: without the lock B's EXISTS would miss it."""
    a = make_event(external_id="cheer-9", n=1)
    b = make_event(external_id="cheer-9", n=2)
    results: dict[str, bool] = {}
    conn = psycopg2.connect(rig.pg_url)
    try:
        with conn.cursor() as cur:  # A: inserted, lock held, not committed
            assert store.insert_event(cur, a) is True
            writer = threading.Thread(target=lambda: results.setdefault("b", _insert(rig, b)),
                                      name="writer-b")
            writer.start()
            assert one_waits_on_an_advisory_lock(rig.pg_url), "writer B never waited on A's advisory lock"
            assert "b" not in results
        conn.commit()
        writer.join(timeout=10)
    finally:
        conn.close()
    assert results == {"b": False}
    assert stored_ids(rig.pg_url) == [str(a.id)]


def test_concurrent_writers_of_one_external_id_make_one_row(rig: Rig) -> None:
    events = [make_event(external_id="raid-3", n=i) for i in range(8)]
    start = threading.Barrier(len(events), timeout=10)
    results: list[bool] = []
    lock = threading.Lock()

    def write(ev: PlatformEvent) -> None:
        start.wait()
        new = _insert(rig, ev)
        with lock:
            results.append(new)

    rig_pool_size = rig.pool.size
    assert rig_pool_size >= 2
    threads = [threading.Thread(target=write, args=(ev,), name=f"w{i}") for i, ev in enumerate(events)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert sorted(results) == [False] * 7 + [True]
    assert len(stored_ids(rig.pg_url)) == 1


def test_children_are_written_with_their_event_and_only_once(rig: Rig) -> None:
    ev = make_event(external_id="bundle-1", children=3)
    assert _insert(rig, ev) is True
    assert children_of(rig.pg_url, ev.id) == [(0, "r0.0"), (1, "r0.1"), (2, "r0.2")]
    # The replay of the same event, and a redelivery with a new id: no new child rows.
    assert _insert(rig, ev) is False
    redelivered = replace(ev, id=uuid.uuid4())
    assert _insert(rig, redelivered) is False
    assert children_of(rig.pg_url, redelivered.id) == []
    assert db_rows(rig.pg_url, "SELECT count(*) FROM event_children") == [(3,)]


def test_a_failed_child_row_rolls_back_its_event(rig: Rig) -> None:
    """One transaction: an event never lands without its children."""
    ev = make_event(children=2)
    with pytest.raises(psycopg2.Error), rig.pool.transaction() as cur:
        cur.execute("ALTER TABLE event_children ADD CONSTRAINT no_r1 CHECK (user_id <> 'r0.1')")
        store.insert_event(cur, ev)
    assert stored_ids(rig.pg_url) == []


@pytest.mark.parametrize("broken,sqlstate", [
    # A hand-built event past what the model allows: an account beyond bigint,
    # and an empty external id (the model turns "" into NULL; the CHECK refuses it).
    ({"account_id": 2**63}, "22003"),
    ({"external_id": ""}, "23514"),
], ids=["bigint-overflow", "empty-external-id"])
def test_values_the_database_refuses_are_permanent(rig: Rig, broken: dict[str, object],
                                                   sqlstate: str) -> None:
    ev = replace(make_event(), **broken)  # type: ignore[arg-type]
    with pytest.raises(psycopg2.Error) as info, rig.pool.transaction() as cur:
        store.insert_event(cur, ev)
    assert info.value.pgcode == sqlstate
    assert classify(info.value).kind is Kind.PERMANENT
    assert not store.already_stored(info.value)
    assert stored_ids(rig.pg_url) == []
