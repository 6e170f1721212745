"""Events stored exactly once into compressed chunks: parked events replayed with their
original id and time (70 hours ago), some already stored, and redeliveries of one
external id under new ids, parked or live, into chunks 70 hours and 10 days old (the
advisory lock and the NOT EXISTS probe, then the primary key). The same test runs on
uncompressed chunks for the same result."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lumio_ingestd.events.deadletter import DeadLetters
from support.events import Rig, db_rows, make_event, make_rig, old

ACCOUNT = 9


@pytest.fixture
def rig(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[Rig]:
    r = make_rig(tmp_path, pg_url, redis_url)
    yield r
    r.close()


def test_replays_into_compressed_chunks_are_stored_exactly_once(
        rig: Rig, compress: Callable[[str], int]) -> None:
    stored = [make_event(ACCOUNT, external_id=f"s-{i}", n=i, created_at=old(70 + i / 100), children=i % 2)
              for i in range(40)]
    stored += [make_event(ACCOUNT, external_id=f"o-{i}", n=i, created_at=old(240 + i / 100))
               for i in range(40)]
    stored += [make_event(ACCOUNT, n=i, created_at=old(71)) for i in range(10)]  # no external id
    for ev in stored:
        assert rig.ingest.persist_event(ev).outcome == "stored"
    compress(rig.cfg.timescale.dsn)

    fresh = [make_event(ACCOUNT, external_id=f"f-{i}", n=i, created_at=old(70.5 + i / 100), children=2)
             for i in range(20)]
    # Redeliveries: the same external id under a new event id and the original time.
    redelivered = [dataclasses.replace(ev, id=uuid.uuid4()) for ev in stored[:40:4]]
    # (Parked events past 72 h are quarantined as expired: the 10-day-old chunks are
    # reached by live redeliveries only, below.)
    parked = [*stored[:30], *fresh, *redelivered, fresh[3], *stored[80:]]
    DeadLetters(rig.redis).park(ACCOUNT, [ev.to_entry() for ev in parked])
    worker = rig.worker()
    stored_now = quarantined = 0
    for _ in range(10):
        report = worker.run_pass()
        stored_now, quarantined = stored_now + report.stored, quarantined + report.quarantined
        if not rig.redis.exists(f"lumio:events:deadletter:{{{ACCOUNT}}}"):
            break
    assert quarantined == 0 and stored_now == len(fresh)
    # Live redeliveries of stored events, in chunks 70 h and 10 days old, are duplicates.
    for ev in (stored[5], stored[41], stored[79]):
        again = rig.ingest.persist_event(dataclasses.replace(ev, id=uuid.uuid4()))
        assert again.outcome == "duplicate", again

    counts = dict(db_rows(rig.pg_url, "SELECT coalesce(external_id, id::text), count(*) FROM events "
                                      "GROUP BY 1"))
    expected = {ev.external_id or str(ev.id) for ev in [*stored, *fresh]}
    assert set(counts) == expected and set(counts.values()) == {1}
    ids = {str(r[0]) for r in db_rows(rig.pg_url, "SELECT id FROM events")}
    assert ids == {str(ev.id) for ev in [*stored, *fresh]}  # the original ids, not the redeliveries'
    times = dict(db_rows(rig.pg_url, "SELECT id::text, created_at FROM events"))
    assert all(times[str(ev.id)] == ev.created_at for ev in fresh)
    children = dict(db_rows(rig.pg_url, "SELECT event_id::text, count(*) FROM event_children GROUP BY 1"))
    assert all(children[str(ev.id)] == 2 for ev in fresh)
    assert [children.get(str(ev.id), 0) for ev in stored[:40]] == [i % 2 for i in range(40)]
