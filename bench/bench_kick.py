"""Kick chat from the wire: Pusher frames on loopback to committed rows, beside the parse rate.

    .venv/bin/python bench/bench_kick.py [--messages 20000] [--runs 3]

Starts a private PostgreSQL and Redis (lumio_ingestd.devkit.servers) and the
stand-in Kick's Pusher server in a process of its own
(bench/kick_standin_server.py). A real `KickSource` subscribes to it, with
the real `ChatQueue`, `ChatIngest` and the running flush threads (every 0.2 s).
Each run:

- end to end: the stand-in sends N `ChatMessageEvent` frames (string-encoded
  `data`, as Kick sends them) as fast as its socket takes them, on one socket;
  the clock runs until the flusher has committed the last of them;
- parse: the same frames through `mapping.interpret` (outer JSON, inner JSON,
  the `ChatMessage` built and sanitized) on one thread, nothing else running.

The ratio end to end / parse says how much of one core's parsing budget the
rest of the path (socket reads, the queue, Redis, COPY) leaves. Prints a
table and writes bench/results/bench_kick.json. Not a test: nothing asserts
a speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _child import JsonLinesChild  # noqa: E402
from _paths import ROOT, write_result  # noqa: E402 - first: it sets up sys.path
from bench_chat import check_stored, truncate  # noqa: E402

from lumio_ingestd.chat.flusher import flush_threads  # noqa: E402
from lumio_ingestd.chat.ingest import ChatIngest, ChatQueue  # noqa: E402
from lumio_ingestd.config import load  # noqa: E402
from lumio_ingestd.db.migrate import migrate  # noqa: E402
from lumio_ingestd.db.pool import Pool  # noqa: E402
from lumio_ingestd.devkit.servers import PostgresServer, RedisServer, wait_until  # noqa: E402
from lumio_ingestd.events.persist import EventIngest  # noqa: E402
from lumio_ingestd.metrics import Metrics  # noqa: E402
from lumio_ingestd.sources.kick.mapping import interpret  # noqa: E402
from lumio_ingestd.sources.kick.source import KickSource  # noqa: E402
from lumio_ingestd.sources.sink import EventSink  # noqa: E402
from lumio_ingestd.stores.redisclient import connect  # noqa: E402
from support import write_ini  # noqa: E402

CHATROOM = 777001
FLUSH_INTERVAL = 0.2


class _Standin(JsonLinesChild):
    def __init__(self) -> None:
        super().__init__(ROOT / "bench" / "kick_standin_server.py", what="the stand-in process")
        self.info = self.read()


def parse_rate(frames: list[str]) -> float:
    now = datetime.now(UTC)
    started = time.perf_counter()
    for frame in frames:
        interpret(1, frame, now)
    return len(frames) / (time.perf_counter() - started)


def run(messages: int = 20_000, runs: int = 3) -> dict[str, Any]:
    per_run: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-kick-") as tmpdir:
        tmp = Path(tmpdir)
        pg = PostgresServer(tmp / "pg")
        rds = RedisServer(tmp / "redis")
        standin = _Standin()
        try:
            pg.start()
            rds.start()
            cfg = load(str(write_ini(tmp / "ingestd.ini", {
                "daemon": {"state_dir": tmp / "state", "instance_id": "bench-kick"},
                "redis": {"url": rds.url}, "timescale": {"dsn": pg.url("postgres")},
                "chat": {"flush_interval_secs": FLUSH_INTERVAL},
                "kick": {"pusher_url": standin.info["pusher_url"]},
                "account.1": {"kick_chatroom_id": str(CHATROOM)}})), {})
            migrate(cfg.timescale)
            metrics = Metrics()
            pool = Pool(cfg.timescale)
            client = connect(cfg.redis)
            chat = ChatIngest(client, pool, None, metrics, cfg)
            events = EventIngest(client, pool, None, metrics, cfg)
            source = KickSource(cfg.accounts[0], cfg.kick, chat_queue=ChatQueue(chat, metrics),
                                sink=EventSink(events.persist_event, alerts=None, sessions=None),
                                metrics=metrics)
            flushers = flush_threads(client, pool, metrics, cfg)
            for flusher in flushers:
                flusher.start()
            source.start()
            try:
                if not standin.call("wait_subscribed", channel=f"chatrooms.{CHATROOM}.v2", timeout=30)["ok"]:
                    raise SystemExit("the source did not subscribe to the stand-in")

                def flushed() -> float:
                    return metrics.registry.get_sample_value("chat_messages_flushed_total") or 0.0

                for r in range(runs):
                    truncate(pg)
                    frames_path = tmp / f"frames-{r}.txt"
                    if not standin.call("prepare_chat", n=messages, chatroom=CHATROOM,
                                        path=str(frames_path))["ok"]:
                        raise SystemExit("the stand-in has no subscribed connection")
                    base = flushed()
                    started = time.perf_counter()
                    sent = standin.call("blast")
                    if not wait_until(lambda b=base: flushed() >= b + messages, 600, interval=0.005):
                        raise SystemExit("the flusher did not store every message")
                    elapsed = time.perf_counter() - started
                    check_stored(pg, messages)
                    frames = frames_path.read_text().splitlines()
                    per_run.append({"end_to_end": messages / elapsed,
                                    "standin_send": sent["sent"] / max(sent["seconds"], 1e-9),
                                    "parse": parse_rate(frames)})
                    print(f"  (e) run {r + 1}/{runs}: end to end {per_run[-1]['end_to_end']:,.0f}/s, "
                          f"parse {per_run[-1]['parse']:,.0f}/s", file=sys.stderr, flush=True)
            finally:
                source.request_stop()
                for flusher in flushers:
                    flusher.request_stop()
                source.join(10)
                for flusher in flushers:
                    flusher.join(10)
                pool.close()
                client.close()
        finally:
            standin.close()
            rds.close()
            pg.close()
    median = {key: statistics.median(r[key] for r in per_run) for key in per_run[0]}
    return {"messages_per_run": messages, "runs": runs, "flush_interval_secs": FLUSH_INTERVAL,
            "per_run": per_run, "median": median,
            "ratio_end_to_end_to_parse": median["end_to_end"] / median["parse"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    result = run(args.messages, args.runs)
    med = result["median"]
    print(f"{'Kick chat, messages/s (median of ' + str(args.runs) + ')':<60}{'value':>12}")
    print(f"{'Pusher frames -> committed rows (one KickSource socket)':<60}{med['end_to_end']:>12,.0f}")
    print(f"{'the stand-in own send rate (its process)':<60}{med['standin_send']:>12,.0f}")
    print(f"{'parse + map of the same frames, one thread':<60}{med['parse']:>12,.0f}")
    print(f"{'ratio end to end / parse':<60}{result['ratio_end_to_end_to_parse']:>12.2f}")
    write_result("bench_kick", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
