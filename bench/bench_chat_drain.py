"""Benchmark of the chat dead-letter drain: parked chat messages replayed into chat_messages.

    .venv/bin/python bench/bench_chat_drain.py [--messages 100000] [--accounts 100]

Starts its own private PostgreSQL (fsync on) and Redis through tests/support/harness,
parks `--messages` chat messages in the dead-letter lists of `--accounts`
accounts, and times one pass of ChatDeadLetterDrain (the default
flush_batch_size of 1000). Writes bench/results/bench_chat_drain.json. Not a
test: no thresholds here.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from _paths import DURABLE_PG, ROOT  # noqa: E402 - first: it sets up sys.path

from lumio_ingestd.stores import rediskeys  # noqa: E402
from support.chat import make_messages, make_rig  # noqa: E402
from support.harness import PostgresServer, RedisServer  # noqa: E402


def run(messages: int = 100_000, accounts: int = 100) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-chat-drain-"))
    pg = PostgresServer(work / "pg", settings=DURABLE_PG)
    rd = RedisServer(work / "redis")
    try:
        pg.start()
        rd.start()
        rig = make_rig(work, pg.url(), pg.url(), rd.url, chat={"flush_batch_size": 1000})
        try:
            per = max(1, messages // accounts)
            for account in range(1, accounts + 1):
                entries = [m.to_entry() for m in make_messages(per, account=account)]
                for i in range(0, len(entries), 5000):
                    rig.client.rpush(rediskeys.chat_deadletter(account), *entries[i:i + 5000])
            drain = rig.drain(pass_budget_secs=3600.0)
            started = time.perf_counter()
            drain.tick()
            took = time.perf_counter() - started
            stored = sum(rig.stored().values())
            if stored != per * accounts:
                raise SystemExit(f"chat drain incomplete: {stored} of {per * accounts}")
            return {"messages": stored, "accounts": accounts, "seconds": took,
                    "messages_per_sec": stored / took}
        finally:
            rig.close()
    finally:
        pg.close()
        rd.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--accounts", type=int, default=100)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    result = run(args.messages, args.accounts)
    print(f"chat dead-letter drain: {result['messages']} messages in {result['seconds']:.2f}s "
          f"= {result['messages_per_sec']:,.0f}/s")
    out = ROOT / "bench" / "results" / "bench_chat_drain.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
