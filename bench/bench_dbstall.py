"""A black-holed database: alert latency through the hole, and a SIGTERM inside it.

    .venv/bin/python bench/bench_dbstall.py [--hole 25] [--stop-at 5] [--code DIR]

The real daemon (`lumio-ingestd run`, a process of its own) with one Twitch
account on the stand-in Twitch (in this process); its PostgreSQL is reached
through the test harness's fault proxy, which black-holes it (stops
forwarding, closes nothing). 100 chat messages and 5 cheers a second on the
account's socket; this process takes the time just before each frame is
written and when each cheer's alert arrives on Redis (`support.traffic`).
`[events] insert_timeout_secs` is the default 3 s.

(1) the hole: `--hole` seconds black-holed, then healed; the alert latency of
    the cheers written in the hole (the first, and p50 / p99 / max of the
    others), events parked, and once the daemon caught up, chat and cheers
    stored once, missing or twice.
(2) the stop: the same traffic, SIGTERM `--stop-at` seconds into the hole;
    signal to exit, the shutdown report, any LOST line; the hole ends, a
    second run (the same instance id, no account) drains what the first left
    for up to 90 s; then what was written before the signal (and more than
    0.5 s before it) is missing, or stored twice.

`--code DIR` runs the daemon of another checkout (to compare before/after).
Prints a table and writes bench/results/bench_dbstall.json. Not a test:
nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import logging
import math
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _paths import write_result  # noqa: E402 - first: it sets up sys.path
from bench_wire import servers  # noqa: E402

from lumio_ingestd.devkit.servers import PostgresServer, RedisServer, wait_until  # noqa: E402
from lumio_ingestd.devkit.standins.twitch import StandinSession, TwitchStandin  # noqa: E402
from support.daemon import Daemon, NotifySocket, metric_value  # noqa: E402
from support.harness.proxy import FaultProxy  # noqa: E402
from support.traffic import ACCOUNT, AlertTimes, Traffic, twitch_daemon_config  # noqa: E402

CHAT_PER_SEC = 100
CHEER_EVERY = 20
SHUTDOWN_BUDGET = 8.0
INSERT_TIMEOUT = 3.0  # [events] insert_timeout_secs: the default


def _config(tmp: Path, name: str, twitch: TwitchStandin, rds: RedisServer, pg_url: str, *,
            with_account: bool) -> Path:
    # One instance id for both runs: the second resumes the first's in-flight lists at once.
    return twitch_daemon_config(
        tmp, name, twitch, redis_url=rds.url, pg_url=pg_url, instance_id="bench-dbstall",
        with_account=with_account, sections={
            "chat": {"flush_interval_secs": 1, "deadletter_drain_interval_secs": 2},
            "events": {"insert_timeout_secs": INSERT_TIMEOUT, "retry_interval_secs": 2}})


def _subscribed(twitch: TwitchStandin) -> StandinSession:
    session = twitch.wait_session(1, timeout=60)
    if not twitch.wait_for(lambda: {"channel.chat.message", "channel.cheer"} <= set(session.subscriptions),
                           60):
        raise SystemExit("the daemon did not subscribe to chat and cheers")
    return session


def _stored(pg: PostgresServer) -> tuple[dict[str, int], dict[str, int]]:
    conn = pg.connect("postgres")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT message_id, count(*) FROM chat_messages GROUP BY 1")
            chat = {str(k): int(n) for k, n in cur.fetchall()}
            cur.execute("SELECT external_id, count(*) FROM events WHERE type = 'channel.cheer' GROUP BY 1")
            cheers = {str(k): int(n) for k, n in cur.fetchall()}
    finally:
        conn.close()
    return chat, cheers


def _tally(ids: list[str], stored: dict[str, int]) -> dict[str, int]:
    return {"sent": len(ids), "missing": sum(1 for i in ids if i not in stored),
            "twice": sum(1 for i in ids if stored.get(i, 0) > 1)}


def _summary(took: list[float]) -> dict[str, Any]:
    return {"n": len(took), "p50_ms": statistics.median(took) * 1000 if took else None,
            "p99_ms": _ms(took, 0.99), "max_ms": max(took) * 1000 if took else None}


def _ms(values: list[float], q: float) -> float | None:
    """The `q` quantile (nearest rank) in ms."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1000


def hole(hole_secs: float, code: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-dbstall-") as tmpdir, \
            servers(Path(tmpdir)) as (pg, rds), TwitchStandin(min_keepalive=1) as twitch:
        tmp = Path(tmpdir)
        proxy = FaultProxy("127.0.0.1", pg.port).start()
        alerts = AlertTimes(rds.url, ACCOUNT)
        try:
            cfg = _config(tmp, "hole", twitch, rds, f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres",
                          with_account=True)
            with NotifySocket() as notify, Daemon(cfg, tmp / "hole.log", notify=notify, code=code) as daemon:
                notify.wait_for("READY=1", 60)
                _, metrics_port = daemon.ports()
                traffic = Traffic(twitch, _subscribed(twitch), chat_per_sec=CHAT_PER_SEC,
                                  cheer_every=CHEER_EVERY).start()
                try:
                    wait_until(lambda: len(traffic.cheers) >= 10, 30)
                    print(f"  black hole for {hole_secs:g}s", file=sys.stderr, flush=True)
                    proxy.blackhole()
                    holed = time.monotonic()
                    threading_wait(hole_secs)
                    healed = time.monotonic()
                    proxy.pass_through()
                    threading_wait(2.0)
                finally:
                    traffic.stop()
                cheers = [m for m, _ in traffic.cheers]
                chat = [m for m, _ in traffic.chat]
                print("  waiting for every alert and row", file=sys.stderr, flush=True)
                wait_until(lambda: all(alerts.get(m) for m in cheers), 120)

                def caught_up() -> bool:
                    got_chat, got_cheers = _stored(pg)
                    return set(chat) <= set(got_chat) and set(cheers) <= set(got_cheers)

                wait_until(caught_up, 120, interval=0.5)
                parked = metric_value(metrics_port, "events_persist_failures_total", 'outcome="parked"')
                daemon.signal(signal.SIGTERM)
                daemon.wait(SHUTDOWN_BUDGET + 5)
        finally:
            alerts.close()
            proxy.close()
        got_chat, got_cheers = _stored(pg)
    in_hole = [(m, at) for m, at in traffic.cheers if holed <= at < healed]
    took = [(alerts.get(m) or math.inf) - at for m, at in in_hole]
    # Written once the first insert of the hole had timed out: nothing asks the database then.
    timed_out = in_hole[0][1] + INSERT_TIMEOUT if in_hole else math.inf
    after_timeout = [t for (_, at), t in zip(in_hole, took, strict=True) if at >= timed_out]
    return {
        "hole_secs": hole_secs, "cheers_in_hole": len(in_hole),
        "first_ms": took[0] * 1000 if took else None,
        "all": _summary(took),
        "after_the_first": _summary(took[1:]),
        "after_the_first_timeout": _summary(after_timeout),
        "alerts_missing": sum(1 for t in took if math.isinf(t)),
        "parked": int(parked),
        "chat": _tally(chat, got_chat), "cheers": _tally(cheers, got_cheers),
    }


def stop(hole_secs: float, stop_at: float, code: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-dbstall-") as tmpdir, \
            servers(Path(tmpdir)) as (pg, rds), TwitchStandin(min_keepalive=1) as twitch:
        tmp = Path(tmpdir)
        proxy = FaultProxy("127.0.0.1", pg.port).start()
        try:
            cfg = _config(tmp, "stop", twitch, rds, f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres",
                          with_account=True)
            with NotifySocket() as notify, Daemon(cfg, tmp / "stop.log", notify=notify, code=code) as daemon:
                notify.wait_for("READY=1", 60)
                traffic = Traffic(twitch, _subscribed(twitch), chat_per_sec=CHAT_PER_SEC,
                                  cheer_every=CHEER_EVERY).start()
                try:
                    wait_until(lambda: len(traffic.cheers) >= 10, 30)
                    print(f"  black hole, SIGTERM {stop_at:g}s into it", file=sys.stderr, flush=True)
                    proxy.blackhole()
                    holed = time.monotonic()
                    threading_wait(stop_at)
                    sent = daemon.signal(signal.SIGTERM)
                finally:
                    traffic.stop()
                code_ = daemon.wait(SHUTDOWN_BUDGET + 10)
                exit_secs = time.monotonic() - sent
                first_log = daemon.log
            threading_wait(max(0.0, holed + hole_secs - time.monotonic()))
            proxy.pass_through()
            print("  second run: draining what the first left", file=sys.stderr, flush=True)
            second_cfg = _config(tmp, "drain", twitch, rds, pg.url("postgres"), with_account=False)
            chat = [m for m, at in traffic.chat if at < sent]
            cheers = [m for m, at in traffic.cheers if at < sent]
            with NotifySocket() as notify, Daemon(second_cfg, tmp / "drain.log", notify=notify,
                                                  code=code) as second:
                notify.wait_for("READY=1", 60)

                def drained() -> bool:
                    got_chat, got_cheers = _stored(pg)
                    return set(chat) <= set(got_chat) and set(cheers) <= set(got_cheers)

                wait_until(drained, 90, interval=0.5)
                second.signal(signal.SIGTERM)
                second.wait(SHUTDOWN_BUDGET + 5)
                second_log = second.log
        finally:
            proxy.close()
        got_chat, got_cheers = _stored(pg)
    early_chat = [m for m, at in traffic.chat if at < sent - 0.5]
    early_cheers = [m for m, at in traffic.cheers if at < sent - 0.5]
    report = [line.split("]: ", 1)[-1] for line in first_log.splitlines()
              if "shutdown complete" in line or "shutdown INCOMPLETE" in line or "exiting without" in line]
    return {
        "hole_secs": hole_secs, "stop_at_secs": stop_at, "exit_code": code_, "exit_secs": exit_secs,
        "report": report,
        "lost_lines": [line.split("]: ", 1)[-1] for line in (first_log + second_log).splitlines()
                       if "LOST" in line],
        "before_signal": {"chat": _tally(chat, got_chat), "cheers": _tally(cheers, got_cheers)},
        "over_half_a_second_before": {"chat": _tally(early_chat, got_chat),
                                      "cheers": _tally(early_cheers, got_cheers)},
    }


def threading_wait(secs: float) -> None:
    threading.Event().wait(max(0.0, secs))


def _f(value: float | None, unit: str = "ms") -> str:
    return "-" if value is None else f"{value:,.1f} {unit}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hole", type=float, default=25.0, help="seconds the database is black-holed")
    parser.add_argument("--stop-at", type=float, default=5.0, help="seconds into the hole of the SIGTERM")
    parser.add_argument("--code", type=Path, help="run the daemon of this checkout (to compare two)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    print("(1) the hole", file=sys.stderr, flush=True)
    one = hole(args.hole, args.code)
    print("(2) the stop", file=sys.stderr, flush=True)
    two = stop(args.hole, args.stop_at, args.code)
    result = {"code": str(args.code) if args.code else "this checkout", "hole": one, "stop": two}
    print(f"a black-holed database, {CHAT_PER_SEC} chat/s and {CHAT_PER_SEC / CHEER_EVERY:g} cheers/s "
          f"on one Twitch socket ({result['code']})")
    rows = [
        (f"(1) {one['hole_secs']:g} s hole: cheers written in it", f"{one['cheers_in_hole']}"),
        ("    frame -> alert, the first", _f(one["first_ms"])),
        *((f"    frame -> alert, {label} ({one[key]['n']}): p50 / p99 / max",
           " / ".join(_f(one[key][k]) for k in ("p50_ms", "p99_ms", "max_ms")))
          for key, label in (("all", "all"), ("after_the_first", "all but the first"),
                             ("after_the_first_timeout", "written after the first timed out"))),
        ("    events parked", f"{one['parked']}"),
        ("    stored afterwards: chat missing / twice",
         f"{one['chat']['missing']} / {one['chat']['twice']} of {one['chat']['sent']}"),
        ("    stored afterwards: cheers missing / twice",
         f"{one['cheers']['missing']} / {one['cheers']['twice']} of {one['cheers']['sent']}"),
        (f"(2) SIGTERM {two['stop_at_secs']:g} s into the hole: exit code, SIGTERM to exit",
         f"{two['exit_code']}, {two['exit_secs']:.2f} s"),
        ("    missing after a second run: chat / cheers written before the signal",
         f"{two['before_signal']['chat']['missing']} of {two['before_signal']['chat']['sent']} / "
         f"{two['before_signal']['cheers']['missing']} of {two['before_signal']['cheers']['sent']}"),
        ("    ... written more than 0.5 s before it",
         f"{two['over_half_a_second_before']['chat']['missing']} / "
         f"{two['over_half_a_second_before']['cheers']['missing']}"),
        ("    stored twice (chat / cheers)",
         f"{two['before_signal']['chat']['twice']} / {two['before_signal']['cheers']['twice']}"),
        ("    LOST lines", f"{len(two['lost_lines'])}"),
    ]
    for label, value in rows:
        print(f"{label:<80}{value:>34}")
    for line in two["report"] + two["lost_lines"]:
        print(f"    {line}")
    write_result("bench_dbstall", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
