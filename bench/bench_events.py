"""Benchmark of event durability: inline persist latency, time to park, replay throughput.

    .venv/bin/python bench/bench_events.py [--events 2000] [--replay 100000] [--accounts 1000]

Starts its own private PostgreSQL (fsync and synchronous_commit on, as in
production) and Redis through tests/support/harness, and measures:

- `persist_event` latency in normal operation (p50/p99/max), events with and
  without an external id (the advisory-lock + EXISTS path and the ON CONFLICT
  path), some with gift recipients;
- time to park with the database stopped (connection refused) and black-holed
  (a fault proxy that answers nothing: the insert bound of 3 s decides);
- replay throughput of the retry worker (events per second of replay) on
  `--replay` parked events spread over `--accounts` accounts, with a live
  `persist_event` every 5 ms on the same pool beside it: its p50/p99 idle
  and during the replay. The replay runs in passes of `--window` seconds
  (the worker's pass budget) with `--idle-window` seconds between them; the
  live samples between passes are the idle figure, so idle and loaded
  windows alternate and see the same background load.

Prints a table and writes bench/results/bench_events.json. Not a test: no
thresholds here.
"""

from __future__ import annotations

import argparse
import logging
import platform
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _paths import DURABLE_PG, write_result  # noqa: E402 - first: it sets up sys.path

from lumio_ingestd.events.deadletter import DeadLetters  # noqa: E402
from lumio_ingestd.model import PlatformEvent  # noqa: E402
from support.events import make_event, make_rig  # noqa: E402
from support.harness import FaultProxy, PostgresServer, RedisServer  # noqa: E402


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]

    return {"n": len(ordered), "p50_ms": pct(50) * 1000, "p99_ms": pct(99) * 1000,
            "max_ms": ordered[-1] * 1000, "mean_ms": statistics.fmean(ordered) * 1000}


def _time_each(events: list[PlatformEvent], persist: Callable[[PlatformEvent], str],
               expect: str) -> list[float]:
    times = []
    for ev in events:
        started = time.perf_counter()
        outcome = persist(ev)
        times.append(time.perf_counter() - started)
        if outcome != expect:
            raise SystemExit(f"unexpected outcome {outcome!r} (wanted {expect!r})")
    return times


def _mixed(n: int, account: int, tag: str) -> list[PlatformEvent]:
    return [make_event(account=account, n=i, external_id=f"{tag}-{i}" if i % 2 else None,
                       children=3 if i % 10 == 0 else 0) for i in range(n)]


class _LiveProbe:
    """A live `persist_event` every `every` seconds on its own thread, each timed.

    Each sample is filed under the phase ("idle" or "during") that was set
    both when it started and when it ended; one that straddles a change of
    phase is dropped, so neither side gets the other's samples.
    """

    def __init__(self, rig: Any, every: float, tag: str) -> None:
        self._rig = rig
        self._every = every
        self._tag = tag
        self.phase = "idle"
        self.samples: dict[str, list[float]] = {"idle": [], "during": []}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-live")

    def __enter__(self) -> _LiveProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(self._every):
            ev = make_event(account=999_999, n=n,
                            external_id=f"{self._tag}-{n}" if n % 2 else None)
            n += 1
            phase = self.phase
            started = time.perf_counter()
            outcome = self._rig.ingest.persist_event(ev).outcome
            took = time.perf_counter() - started
            if outcome != "stored":
                raise SystemExit(f"live persist_event: {outcome!r}")
            if self.phase == phase:
                self.samples[phase].append(took)


def _replay_with_live(rig: Any, replay: int, accounts: int, *, already: int,
                      live_every: float = 0.005, window: float = 2.0,
                      idle_window: float = 1.0) -> dict[str, Any]:
    """Replay the backlog in passes of `window` seconds, `idle_window` seconds apart.

    The live probe runs throughout: its samples between the passes are the
    idle figure, those during them the loaded one. Interleaving the two
    windows makes both see the same background load (this machine is shared),
    where one idle stretch before one long replay would compare two moments.
    """
    per = max(1, replay // accounts)
    dl = DeadLetters(rig.redis)
    backlog: dict[int, list[bytes]] = {}
    for account in range(1000, 1000 + accounts):
        backlog[account] = [ev.to_entry() for ev in _mixed(per, account, f"r{account}")]
    for account, entries in backlog.items():
        dl.park(account, entries)
    total = per * accounts
    # Each pass ends after `window` seconds (the daemon's pass budget; the
    # next pass continues where it stopped), the gap between two is idle.
    worker = rig.worker("bench", lease_ttl_secs=60, batch_size=100, pass_budget_secs=window)
    stored = recovered = passes = 0
    took = 0.0
    with _LiveProbe(rig, live_every, "live") as probe:
        while True:
            probe.phase = "idle"
            time.sleep(idle_window)
            probe.phase = "during"
            started = time.perf_counter()
            report = worker.run_pass()
            took += time.perf_counter() - started
            passes += 1
            stored += report.stored
            # An entry parked while its insert's reply was lost (the black-hole
            # case) may have been committed when the path healed: the replay finds
            # it stored and counts it recovered, still one row.
            recovered += report.recovered
            if report.stopped != "budget":
                break
        probe.phase = "idle"
        time.sleep(idle_window)
    if stored + recovered != total + already or report.stopped:
        raise SystemExit(f"replay incomplete: {stored} stored, {recovered} recovered, "
                         f"last pass {report} "
                         f"(wanted {total + already})")
    out: dict[str, Any] = {
        "replay": {"events": stored, "recovered": recovered, "accounts": accounts,
                   "seconds": took, "passes": passes,
                   "events_per_sec": stored / took},
        "live_idle": _stats(probe.samples["idle"]),
        "live_during_replay": _stats(probe.samples["during"]),
    }
    out["live_p99_ratio"] = out["live_during_replay"]["p99_ms"] / out["live_idle"]["p99_ms"]
    # The same backlog again: every entry already stored (dedup path only).
    for account, entries in backlog.items():
        dl.park(account, entries)
    recovered = 0
    started = time.perf_counter()
    while True:
        report = worker.run_pass()
        recovered += report.recovered
        if report.stopped != "budget":
            break
    seconds = time.perf_counter() - started
    out["replay_already_stored"] = {"events": recovered, "seconds": seconds,
                                    "events_per_sec": recovered / seconds}
    return out


def run(events: int = 2000, down: int = 200, blackhole: int = 3, replay: int = 100_000,
        accounts: int = 1000, window: float = 2.0, idle_window: float = 1.0) -> dict[str, Any]:
    """Every measure; `events` inline inserts, `down` and `blackhole` parks, `replay` replayed."""
    quiet = logging.getLogger("lumio_ingestd")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # one "parking it" warning per event otherwise
    work = Path(tempfile.mkdtemp(prefix="bench-events-"))
    pg = PostgresServer(work / "pg", settings=DURABLE_PG)
    rd = RedisServer(work / "redis")
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "settings": {"insert_timeout_secs": 3, "pool_size": 5, "pg": DURABLE_PG},
    }
    try:
        pg.start()
        rd.start()
        proxy = FaultProxy("127.0.0.1", pg.port).start()
        try:
            # The measured paths talk to the database directly; only the
            # black-hole case goes through the (Python, so slower) fault proxy.
            rig = make_rig(work, pg.url(), rd.url, timescale={"pool_size": 5})
            holed = make_rig(work, f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres", rd.url,
                             migrate_db=False, timescale={"pool_size": 5})
            rig.warm()
            holed.warm()

            # 1. normal operation
            sample = _mixed(events, 1, "n")
            times = _time_each(sample, lambda ev: rig.ingest.persist_event(ev).outcome, "stored")
            results["persist_normal"] = _stats(times)
            with_ext = [t for ev, t in zip(sample, times, strict=True) if ev.external_id]
            without = [t for ev, t in zip(sample, times, strict=True) if not ev.external_id]
            results["persist_normal_external_id"] = _stats(with_ext)
            results["persist_normal_no_external_id"] = _stats(without)

            # 2. time to park, database black-holed (first on a pooled connection, then fresh)
            proxy.blackhole()
            times = _time_each(_mixed(blackhole, 2, "b"),
                               lambda ev: holed.ingest.persist_event(ev).outcome, "parked")
            results["park_blackholed"] = _stats(times)
            proxy.pass_through()
            holed.close()

            # 3. time to park, database stopped
            pg.stop()
            times = _time_each(_mixed(down, 3, "d"),
                               lambda ev: rig.ingest.persist_event(ev).outcome, "parked")
            results["park_db_stopped"] = _stats(times)
            pg.start()

            # 4. replay throughput: a backlog across `accounts` accounts, with a live
            # persist_event every `live_every` seconds beside it (the same pool).
            results.update(_replay_with_live(rig, replay, accounts, already=blackhole + down,
                                             window=window, idle_window=idle_window))
            rig.close()
        finally:
            proxy.close()
    finally:
        pg.close()
        rd.close()
        shutil.rmtree(work, ignore_errors=True)
        quiet.setLevel(level)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000, help="inline inserts to time")
    parser.add_argument("--down", type=int, default=200, help="parks to time with the database stopped")
    parser.add_argument("--blackhole", type=int, default=3, help="parks to time with it black-holed")
    parser.add_argument("--replay", type=int, default=100_000, help="parked events to replay")
    parser.add_argument("--accounts", type=int, default=1000, help="accounts they are spread over")
    parser.add_argument("--window", type=float, default=2.0,
                        help="seconds of each replay pass (the live 'during' windows)")
    parser.add_argument("--idle-window", type=float, default=1.0,
                        help="seconds between two passes (the live 'idle' windows)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    results = run(args.events, args.down, args.blackhole, args.replay, args.accounts,
                  args.window, args.idle_window)

    print(f"{'measure':<34}{'n':>7}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    for key in ("persist_normal", "persist_normal_external_id", "persist_normal_no_external_id",
                "park_db_stopped", "park_blackholed", "live_idle", "live_during_replay"):
        s = results[key]
        print(f"{key:<34}{s['n']:>7}{s['p50_ms']:>10.2f}{s['p99_ms']:>10.2f}{s['max_ms']:>10.2f}")
    for key in ("replay", "replay_already_stored"):
        r = results[key]
        print(f"{key:<34}{r['events']:>7} events in {r['seconds']:.2f}s = {r['events_per_sec']:.0f}/s"
              + (f" ({r['passes']} passes)" if "passes" in r else ""))
    print(f"{'live p99 during replay / idle':<34}{results['live_p99_ratio']:>7.2f}")
    write_result("bench_events", results)


if __name__ == "__main__":
    main()
