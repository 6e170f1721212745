"""A chat flusher or dead-letter drain that SIGKILLs itself at one named step.

    python tests/support/chat_kill_worker.py CONFIG ROLE FAILPOINT [--heartbeat-ttl S] [--lease-ttl S]

ROLE is `flush` or `drain`; FAILPOINT a step name such as `chat.flush.claimed`.
The worker runs one pass (`tick()`); when it reaches FAILPOINT the process
kills itself with SIGKILL, so nothing after that line runs: no finally, no
atexit, no socket close. Exit code 3 means the failpoint was never reached.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

from lumio_ingestd.chat.deadletter import ChatDeadLetterDrain  # noqa: E402
from lumio_ingestd.chat.flusher import ChatFlusher  # noqa: E402
from lumio_ingestd.config import load  # noqa: E402
from lumio_ingestd.db.pool import Pool  # noqa: E402
from lumio_ingestd.metrics import Metrics  # noqa: E402
from lumio_ingestd.stores.redisclient import connect  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("role", choices=("flush", "drain"))
    parser.add_argument("failpoint")
    parser.add_argument("--heartbeat-ttl", type=float, default=1.0)
    parser.add_argument("--lease-ttl", type=float, default=1.0)
    args = parser.parse_args()

    def failpoint(step: str) -> None:
        if step == args.failpoint:
            os.kill(os.getpid(), signal.SIGKILL)

    cfg = load(args.config, {})
    pool = Pool(cfg.timescale)
    client = connect(cfg.redis)
    metrics = Metrics()
    worker: ChatFlusher | ChatDeadLetterDrain
    if args.role == "flush":
        worker = ChatFlusher(client, pool, metrics, cfg, heartbeat_ttl_secs=args.heartbeat_ttl,
                             failpoint=failpoint)
    else:
        worker = ChatDeadLetterDrain(client, pool, metrics, cfg, heartbeat_ttl_secs=args.heartbeat_ttl,
                                     lease_ttl_secs=args.lease_ttl, failpoint=failpoint)
    worker.tick()
    print(f"failpoint {args.failpoint} was not reached", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
