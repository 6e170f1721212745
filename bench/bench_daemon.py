"""Benchmark of the daemon's process lifecycle: READY latency and SIGTERM-to-exit time.

    .venv/bin/python bench/bench_daemon.py [--runs 3] [--rates 0,200,2000] [--load-secs 3]

Starts a private Redis and PostgreSQL (tests/support/harness, as the tests do),
migrates, then for each synthetic chat rate runs `python -m lumio_ingestd run`
`--runs` times with a notify socket of its own and measures:

- READY latency: process start to the READY=1 datagram (includes the Python
  start-up and imports);
- SIGTERM to exit under load (the whole drain: sources hand their queues to
  Redis, final flush, close), and the drain time the shutdown report logs.

It also runs one stop with the database stopped just before SIGTERM. Prints a
table and writes bench/results/bench_daemon.json. Not a test: no thresholds.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _paths import ROOT  # noqa: E402 - first: it sets up sys.path

from lumio_ingestd.config import load  # noqa: E402
from lumio_ingestd.db.migrate import migrate  # noqa: E402
from support import write_ini  # noqa: E402
from support.daemon import Daemon, NotifySocket  # noqa: E402
from support.harness import PostgresServer, RedisServer  # noqa: E402

_REPORT = re.compile(r"shutdown (?:complete|INCOMPLETE)[^:]* in ([0-9.]+)s")


def _config(work: Path, name: str, redis_url: str, pg_url: str, rate: float) -> Path:
    sections: dict[str, dict[str, object]] = {
        "daemon": {"state_dir": work / name / "state", "instance_id": f"bench-{name}"},
        "redis": {"url": redis_url},
        "timescale": {"dsn": pg_url, "connect_timeout_secs": 2},
        "http": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "chat": {"flush_interval_secs": 1},
        "events": {"retry_interval_secs": 1},
    }
    if rate > 0:
        sections["synthetic"] = {"rate_per_sec": rate, "accounts": "1, 2, 3, 4", "event_every": 10,
                                 "run_id": name}
    (work / name).mkdir(parents=True, exist_ok=True)
    return write_ini(work / name / "ingestd.ini", sections)


def _one(work: Path, name: str, redis_url: str, pg_url: str, rate: float, load_secs: float,
         before_stop: Any = None) -> dict[str, Any]:
    cfg = _config(work, name, redis_url, pg_url, rate)
    with NotifySocket() as notify, Daemon(cfg, work / name / "daemon.log", notify=notify) as daemon:
        ready = notify.wait_for("READY=1", 30)
        threading.Event().wait(load_secs)
        if before_stop is not None:
            before_stop()
        sent = daemon.signal(signal.SIGTERM)
        code = daemon.wait(30)
        exit_secs = time.monotonic() - sent
        log = daemon.log
    report = _REPORT.search(log)
    chat = re.search(r"synthetic: stopped run=\S+ chat=(\d+) events=(\d+)", log)
    return {"rate": rate, "exit_code": code, "ready_secs": round(ready.at - daemon.started, 3),
            "sigterm_to_exit_secs": round(exit_secs, 3),
            "drain_secs": float(report.group(1)) if report else None,
            "chat": int(chat.group(1)) if chat else 0, "events": int(chat.group(2)) if chat else 0,
            "complete": "shutdown complete" in log}


def run(rates: tuple[float, ...] = (0.0, 200.0, 2000.0), runs: int = 3,
        load_secs: float = 3.0) -> dict[str, Any]:
    """`runs` daemon runs per synthetic chat rate, plus one stop with the database stopped."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-daemon-") as tmp:
        work = Path(tmp)
        with RedisServer(work / "redis") as redis_server, PostgresServer(work / "pg") as pg:
            pg.create_database("lumio")
            pg_url = pg.url("lumio")
            migrate(load(str(_config(work, "migrate", redis_server.url, pg_url, 0)), {}).timescale)
            for rate in rates:
                for i in range(runs):
                    rows.append(_one(work, f"r{int(rate)}-{i}", redis_server.url, pg_url, rate, load_secs))
            rows.append({**_one(work, "dbdown", redis_server.url, pg_url, 200, load_secs,
                                before_stop=lambda: pg.stop("fast")), "case": "database stopped"})
    summary = {}
    for rate in rates:
        mine = [r for r in rows if r["rate"] == rate and "case" not in r]
        summary[str(int(rate))] = {
            "ready_median_secs": statistics.median(r["ready_secs"] for r in mine),
            "sigterm_to_exit_median_secs": statistics.median(r["sigterm_to_exit_secs"] for r in mine),
            "sigterm_to_exit_max_secs": max(r["sigterm_to_exit_secs"] for r in mine),
            "drain_median_secs": statistics.median(r["drain_secs"] or 0.0 for r in mine),
        }
    return {"machine": platform.platform(), "python": platform.python_version(),
            "load_secs": load_secs, "runs": rows, "summary": summary}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rates", default="0,200,2000")
    parser.add_argument("--load-secs", type=float, default=3.0)
    args = parser.parse_args()
    result = run(tuple(float(r) for r in args.rates.split(",")), args.runs, args.load_secs)
    rows = result["runs"]
    print(f"{'rate/s':>7} {'case':<18} {'ready s':>8} {'SIGTERM->exit s':>16} {'drain s':>8} "
          f"{'chat':>7} {'events':>7} {'code':>5}")
    for row in rows:
        print(f"{row['rate']:>7.0f} {row.get('case', ''):<18} {row['ready_secs']:>8.3f} "
              f"{row['sigterm_to_exit_secs']:>16.3f} {row['drain_secs'] or 0:>8.3f} {row['chat']:>7} "
              f"{row['events']:>7} {row['exit_code']:>5}")
    out = ROOT / "bench" / "results" / "bench_daemon.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
