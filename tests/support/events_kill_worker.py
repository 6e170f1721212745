"""A retry worker in a process of its own, for the SIGKILL tests (not a test module).

    python tests/support/events_kill_worker.py --pg-url URL --redis-url URL --tmp DIR \
        --instance ID [--kill-at FAILPOINT --hit N] [--loop]

Without --loop it runs one replay pass and exits 0. With --kill-at it SIGKILLs
itself the N-th time the worker reaches that failpoint: no `finally`, no lease
release, no put-back, exactly like the OOM killer or `kill -9`. With --loop it
runs the worker thread until it is killed, printing "leader" once it has
replayed while holding the lease.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]
for path in (str(_TESTS.parent), str(_TESTS)):
    if path not in sys.path:
        sys.path.insert(0, path)

from lumio_ingestd.db.pool import Pool  # noqa: E402
from lumio_ingestd.events.retry import EventRetryWorker  # noqa: E402
from lumio_ingestd.metrics import Metrics  # noqa: E402
from lumio_ingestd.stores.redisclient import connect  # noqa: E402
from support.events import event_config  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pg-url", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--tmp", required=True, type=Path)
    parser.add_argument("--instance", required=True)
    parser.add_argument("--kill-at", default="")
    parser.add_argument("--hit", type=int, default=1)
    parser.add_argument("--lease-ttl", type=float, default=1.0)
    parser.add_argument("--heartbeat-ttl", type=float, default=1.0)
    parser.add_argument("--loop", action="store_true")
    args = parser.parse_args()

    cfg = event_config(args.tmp, args.pg_url, args.redis_url, instance=args.instance)
    hits = 0

    def failpoint(name: str) -> None:
        nonlocal hits
        if name == args.kill_at:
            hits += 1
            if hits == args.hit:
                os.kill(os.getpid(), signal.SIGKILL)

    metrics = Metrics()
    worker = EventRetryWorker(connect(cfg.redis), Pool(cfg.timescale), metrics, cfg,
                              instance=args.instance, lease_ttl_secs=args.lease_ttl,
                              heartbeat_ttl_secs=args.heartbeat_ttl, batch_size=4,
                              failpoint=failpoint)
    if not args.loop:
        report = worker.run_pass()
        print(report, flush=True)
        return 0
    said = False
    while True:  # until killed; the test bounds this with its own timeout
        report = worker.run_pass()
        if report.leader and not said:
            print("leader", flush=True)
            said = True
        threading.Event().wait(0.1)


if __name__ == "__main__":
    sys.exit(main())
