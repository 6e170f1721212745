"""SIGKILL of a replaying process at every named step, and of a lease holder.

The killed process is a real one (tests/support/events_kill_worker.py) that SIGKILLs
itself at a failpoint: nothing of it runs after that line. The oracle then
checks that every parked event is still somewhere (database, dead-letter or
in-flight list), and, after a restarted replayer ran, that each is stored
exactly once.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import support
from lumio_ingestd.events.deadletter import DeadLetters
from lumio_ingestd.model import PlatformEvent
from support import dbname_of
from support.events import (
    Rig,
    all_parked_ids,
    db_rows,
    make_event,
    make_rig,
    stored_ids,
    stored_rows,
)
from support.harness.servers import PostgresServer, wait_until

SCRIPT = support.ROOT / "tests" / "support" / "events_kill_worker.py"
LEASE_TTL = 1.0


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[Rig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url)
    yield r
    r.close()


def _command(rig: Rig, tmp_path: Path, instance: str, *extra: str) -> list[str]:
    return [sys.executable, str(SCRIPT), "--pg-url", rig.pg_url,
            "--redis-url", rig.cfg.redis.url, "--tmp", str(tmp_path), "--instance", instance,
            "--lease-ttl", str(LEASE_TTL), "--heartbeat-ttl", str(LEASE_TTL), *extra]


def _events() -> list[PlatformEvent]:
    return [make_event(n=i, external_id=f"sub-{i}" if i % 2 else None, children=i % 3)
            for i in range(6)]


def _assert_nothing_lost(rig: Rig, events: list[PlatformEvent]) -> None:
    in_db = stored_ids(rig.pg_url)
    assert len(in_db) == len(set(in_db)), "a second row"
    somewhere = set(in_db) | set(all_parked_ids(rig.redis))
    assert somewhere >= {str(e.id) for e in events}, "an event vanished"


def _assert_exactly_once(rig: Rig, events: list[PlatformEvent]) -> None:
    assert stored_rows(rig.pg_url) == {str(e.id): (e.created_at, 7, e.external_id) for e in events}
    assert db_rows(rig.pg_url, "SELECT count(*) FROM event_children") == [
        (sum(len(e.children) for e in events),)]
    assert all_parked_ids(rig.redis) == []


@pytest.mark.parametrize("at,hit,restart_as,recovered", [
    ("events.retry.claimed", 1, "other", 0),
    ("events.retry.inserted", 2, "other", 1),   # committed, never settled: found stored later
    ("events.retry.inserted", 2, "same", 1),    # restarted under the same instance id
    ("events.retry.deleted", 2, "other", 0),
])
def test_sigkill_during_a_replay_loses_nothing_and_makes_no_second_row(
        rig: Rig, tmp_path: Path, at: str, hit: int, restart_as: str, recovered: int) -> None:
    events = _events()
    DeadLetters(rig.redis).park(7, [e.to_entry() for e in events])
    proc = subprocess.run(_command(rig, tmp_path, "doomed", "--kill-at", at, "--hit", str(hit)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    _assert_nothing_lost(rig, events)

    # The next process: it must wait out the dead holder's lease, then finish the job.
    worker = rig.worker("doomed" if restart_as == "same" else "successor",
                        lease_ttl_secs=LEASE_TTL, heartbeat_ttl_secs=LEASE_TTL)
    assert wait_until(lambda: worker.run_pass().leader and not all_parked_ids(rig.redis),
                      timeout=LEASE_TTL + 5, interval=0.1)
    _assert_exactly_once(rig, events)
    assert rig.failures("recovered") == recovered
    # And replaying the whole lot again (every entry parked twice) still makes no second row.
    DeadLetters(rig.redis).park(7, [e.to_entry() for e in events])
    report = worker.run_pass()
    assert (report.stored, report.recovered) == (0, len(events))
    _assert_exactly_once(rig, events)


def test_a_killed_lease_holder_is_replaced_after_the_lease_ttl(rig: Rig, tmp_path: Path) -> None:
    first = _events()
    DeadLetters(rig.redis).park(7, [e.to_entry() for e in first])
    holder = subprocess.Popen(_command(rig, tmp_path, "replica-a", "--loop"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "leader"
        assert wait_until(lambda: len(stored_ids(rig.pg_url)) == len(first), timeout=10)
        standby = rig.worker("replica-b", lease_ttl_secs=LEASE_TTL, heartbeat_ttl_secs=LEASE_TTL)
        second = [make_event(n=100 + i) for i in range(3)]
        report = standby.run_pass()
        assert not report.leader  # A holds it and keeps extending it
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        killed = time.monotonic()
        DeadLetters(rig.redis).park(7, [e.to_entry() for e in second])
        assert wait_until(lambda: standby.run_pass().leader, timeout=LEASE_TTL + 5, interval=0.05)
        took = time.monotonic() - killed
        assert took <= LEASE_TTL + 1.0, f"took over after {took:.2f}s"
        assert wait_until(lambda: standby.run_pass() and not all_parked_ids(rig.redis), timeout=5)
        _assert_exactly_once(rig, first + second)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)
