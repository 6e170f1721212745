"""A Twitch socket lost without a close, against a Twitch that keeps its orphaned subscriptions.

    .venv/bin/python bench/bench_twitch_orphans.py [--orphan-secs 120] [--duration 120]
        [--rate 10] [--after 10] [--code CHECKOUT]

Starts a private Redis and PostgreSQL (tests/support/harness), the stand-in
Twitch in this process with `orphan_secs` (a session whose socket dies
without a clean close keeps its subscriptions enabled that long: the next
session's POSTs get 409 and the notifications go to the dead session), and
the real daemon (`python -m lumio_ingestd run`; `--code` runs another
checkout's, to compare two) with one Twitch account. Once the account's
session holds its 11 subscriptions, chat is sent at `--rate` a second; the
session's TCP connection is cut (no close frame either way) and chat goes on
for `--duration` seconds. Then it waits for the flush and counts:

- of the chat sent from `--after` seconds after the reconnect (the welcome
  of the first session after the cut) on, how many are stored, and how many
  more than once;
- the sessions opened after the cut, and the POST, GET and DELETE requests
  to `/eventsub/subscriptions` after it (and their statuses);
- `source_subscriptions_total{result="orphan_replaced"}` from the daemon.

Prints one line and writes bench/results/bench_twitch_orphans.json. Not a
test: no thresholds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg2  # noqa: E402
from _paths import write_result  # noqa: E402 - before the imports of the repository: sys.path

from lumio_ingestd.db.migrate import migrate  # noqa: E402
from lumio_ingestd.devkit.standins.twitch import StandinError, TwitchStandin  # noqa: E402
from lumio_ingestd.devkit.standins.twitch_events import chat_event  # noqa: E402
from support.daemon import Daemon, metric_value  # noqa: E402
from support.harness import PostgresServer, RedisServer  # noqa: E402
from support.twitch import twitch_config  # noqa: E402

CHAT = "channel.chat.message"


def _stored(pg_url: str, ids: list[str]) -> Counter[str]:
    with psycopg2.connect(pg_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT message_id FROM chat_messages WHERE message_id = ANY(%s)", (ids,))
        rows = [str(r[0]) for r in cur.fetchall()]
    conn.close()
    return Counter(rows)


def run(orphan_secs: float, duration: float, rate: float, after: float,
        code: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-orphans-") as tmp:
        work = Path(tmp)
        with RedisServer(work / "redis") as redis_server, PostgresServer(work / "pg") as pg, \
                TwitchStandin(orphan_secs=orphan_secs) as fake:
            pg.create_database("lumio")
            pg_url = pg.url("lumio")
            cfg = twitch_config(work, pg_url, redis_server.url, fake, extra={
                "metrics": {"listen": "127.0.0.1:0"}, "chat": {"flush_interval_secs": 1}})
            migrate(cfg.timescale)
            with Daemon(cfg.path, work / "daemon.log", code=code) as daemon:
                _, metrics_port = daemon.ports()
                first = fake.wait_session(1, timeout=30)
                if not fake.wait_for(lambda: len(first.subscriptions) == 11, 30):
                    raise SystemExit(f"the first session never held its subscriptions:\n{daemon.log}")
                requests_before = len(fake.eventsub_requests)
                pace = threading.Event()  # never set: its timed wait spaces the messages out
                sent: list[tuple[float, str]] = []
                no_holder = 0
                fake.cut(first)
                cut_at = time.monotonic()
                while time.monotonic() < cut_at + duration:
                    mid = str(uuid.uuid4())
                    try:
                        fake.notify(CHAT, chat_event(mid, "after the cut"))
                    except StandinError:
                        no_holder += 1  # nobody holds the subscription: Twitch sends nothing
                    sent.append((time.monotonic(), mid))
                    pace.wait(max(0.0, sent[0][0] + len(sent) / rate - time.monotonic()))
                later = [s for s in fake.sessions[1:] if s.welcomed_at is not None]
                reconnect_at = later[0].welcomed_at if later else None
                counted = [mid for at, mid in sent if reconnect_at is not None and at >= reconnect_at + after]
                # The flush runs every second: the count is final once it held for 3 s (at most 30 s).
                stored = _stored(pg_url, counted)
                stable = 0
                for _ in range(30):
                    pace.wait(1.0)
                    now = _stored(pg_url, counted)
                    stable = stable + 1 if now == stored else 0
                    stored = now
                    if stable >= 3:
                        break
                try:
                    replaced = metric_value(metrics_port, "source_subscriptions_total",
                                            'result="orphan_replaced"')
                except AssertionError:
                    replaced = 0.0  # a daemon that never counts it
                calls = fake.eventsub_requests[requests_before:]
                by_method = Counter(method for method, _ in calls)
                statuses = Counter(f"{method} {status}" for method, status in calls)
                daemon.kill()
    return {
        "code": str(code) if code else "this checkout", "orphan_secs": orphan_secs,
        "duration_secs": duration, "rate_per_sec": rate, "after_secs": after,
        "sent_after_the_cut": len(sent), "sent_to_the_dead_session": len(fake.undelivered),
        "sent_with_no_holder": no_holder,
        "reconnect_secs_after_cut": round(reconnect_at - cut_at, 3) if reconnect_at else None,
        "sent_from_after": len(counted), "stored": len(stored),
        "stored_more_than_once": sum(1 for n in stored.values() if n > 1),
        "sessions_after_cut": len(fake.sessions) - 1,
        "posts": by_method["POST"], "gets": by_method["GET"], "deletes": by_method["DELETE"],
        "statuses": dict(sorted(statuses.items())), "orphan_replaced": replaced,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orphan-secs", type=float, default=120.0)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of chat after the cut")
    parser.add_argument("--rate", type=float, default=10.0, help="chat messages a second")
    parser.add_argument("--after", type=float, default=10.0,
                        help="count the chat sent from this long after the reconnect on")
    parser.add_argument("--code", type=Path, help="run the daemon of this checkout (to compare two)")
    args = parser.parse_args()
    r = run(args.orphan_secs, args.duration, args.rate, args.after, args.code)
    print(f"{r['code']}: of {r['sent_from_after']} chat sent from {args.after:g}s after the reconnect "
          f"({r['reconnect_secs_after_cut']}s after the cut), {r['stored']} stored "
          f"({r['stored_more_than_once']} more than once); {r['sessions_after_cut']} session(s) "
          f"after the cut; POST {r['posts']}, GET {r['gets']}, DELETE {r['deletes']} "
          f"({', '.join(f'{k}: {v}' for k, v in r['statuses'].items())}); "
          f"orphan_replaced {r['orphan_replaced']:g}")
    write_result("bench_twitch_orphans" + ("_" + args.code.name if args.code else ""), r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
