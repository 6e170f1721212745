"""Chat throughput: from a source's hands to committed rows, beside the raw COPY rate.

    .venv/bin/python bench/bench_chat.py [--messages N] [--runs R]

Starts a private PostgreSQL and Redis (tests/support/harness, the same servers the
tests use), applies the migrations, and measures, on the same table in the
same run:

- raw COPY: one `COPY chat_messages FROM STDIN` of N prepared rows into the
  empty table (the database's own ceiling; no Python per row in the timing);
- store: `insert_encoded` batches of `flush_batch_size` (new rows: COPY
  straight into the table under a savepoint), rows prepared beforehand;
- end to end: messages added one by one to a `ChatQueue` (as a source does),
  handed to `ChatIngest.persist_batch` (pipelined RPUSH), claimed and stored by
  the running flush threads; the clock stops when they have committed the
  last message.

The table is truncated before every measurement. Prints a table and writes
bench/results/bench_chat.json. Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _paths import ROOT  # noqa: E402 - first: it sets up sys.path

from lumio_ingestd.chat.flusher import flush_threads  # noqa: E402
from lumio_ingestd.chat.ingest import ChatIngest, ChatQueue  # noqa: E402
from lumio_ingestd.chat.store import encode_row, insert_encoded  # noqa: E402
from lumio_ingestd.config import load  # noqa: E402
from lumio_ingestd.db.migrate import migrate  # noqa: E402
from lumio_ingestd.db.pool import Pool  # noqa: E402
from lumio_ingestd.metrics import Metrics  # noqa: E402
from lumio_ingestd.model import CHAT_COLUMNS, ChatMessage  # noqa: E402
from lumio_ingestd.stores.redisclient import connect  # noqa: E402
from support.harness.servers import PostgresServer, RedisServer, wait_until  # noqa: E402

ACCOUNTS = 4
FLUSH_INTERVAL = 0.2


def make_messages(n: int, run: int) -> list[ChatMessage]:
    from datetime import UTC, datetime, timedelta

    base = datetime(2026, 3, 1, tzinfo=UTC)
    return [
        ChatMessage.create(
            platform="twitch", account_id=1 + i % ACCOUNTS, message_id=f"r{run}-{i:08d}",
            created_at=base + timedelta(microseconds=i * 997), user_id=f"{100000 + i % 5000}",
            user_login=f"viewer_{i % 5000}", display_name=f"Viewer{i % 5000}",
            text=f"PogChamp that was a great play, message number {i} KEKW",
            extras={"badges": [{"set_id": "subscriber", "id": "12"}], "color": "#1E90FF"})
        for i in range(n)
    ]


def write_config(tmp: Path, pg: PostgresServer, rds: RedisServer) -> Path:
    path = tmp / "ingestd.ini"
    path.write_text(
        "[daemon]\n"
        f"state_dir = {tmp / 'state'}\n"
        "instance_id = bench\n"
        "[redis]\n"
        f"url = {rds.url}\n"
        "[timescale]\n"
        f"dsn = {pg.url('postgres')}\n"
        "[chat]\n"
        f"flush_interval_secs = {FLUSH_INTERVAL}\n")
    return path


def truncate(pg: PostgresServer) -> None:
    conn = pg.connect("postgres")
    try:
        with conn.cursor() as cur:
            cur.execute("TRUNCATE chat_messages")
            cur.execute("CHECKPOINT")
    finally:
        conn.close()


def check_stored(pg: PostgresServer, expected: int) -> None:
    """Every message sent is in chat_messages, once."""
    conn = pg.connect("postgres")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*), count(DISTINCT message_id) FROM chat_messages")
            count, distinct = cur.fetchone() or (0, 0)
    finally:
        conn.close()
    if count != expected or distinct != expected:
        raise RuntimeError(f"stored {count} rows ({distinct} distinct), sent {expected}")


def raw_copy(pg: PostgresServer, msgs: list[ChatMessage]) -> float:
    payload = b"".join(encode_row(m) for m in msgs)
    truncate(pg)
    conn = pg.connect("postgres")
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            started = time.perf_counter()
            cur.copy_expert(f"COPY chat_messages ({', '.join(CHAT_COLUMNS)}) FROM STDIN",
                            io.BytesIO(payload), size=256 * 1024)
            conn.commit()
            elapsed = time.perf_counter() - started
    finally:
        conn.close()
    return len(msgs) / elapsed


def store_only(pg: PostgresServer, pool: Pool, msgs: list[ChatMessage], batch: int) -> float:
    rows = [encode_row(m) for m in msgs]
    truncate(pg)
    started = time.perf_counter()
    for i in range(0, len(rows), batch):
        with pool.transaction(deadline=time.monotonic() + 60) as cur:
            insert_encoded(cur, rows[i:i + batch])
    return len(msgs) / (time.perf_counter() - started)


def end_to_end(pg: PostgresServer, cfg: Any, pool: Pool, msgs: list[ChatMessage]) -> dict[str, float]:
    truncate(pg)
    client = connect(cfg.redis)
    metrics = Metrics()
    ingest = ChatIngest(client, pool, None, metrics, cfg)
    queue = ChatQueue(ingest, metrics)
    flushers = flush_threads(client, pool, metrics, cfg)
    for flusher in flushers:
        flusher.start()
    try:
        started = time.perf_counter()
        for msg in msgs:
            queue.add(msg)
        queue.drain()
        handed_over = time.perf_counter() - started
        def done() -> bool:
            return (metrics.registry.get_sample_value("chat_messages_flushed_total") or 0) >= len(msgs)

        if not wait_until(done, timeout=600, interval=0.01):
            raise RuntimeError("the flusher did not store every message")
        elapsed = time.perf_counter() - started
    finally:
        for flusher in flushers:
            flusher.request_stop()
        for flusher in flushers:
            flusher.join(30)
        client.close()
    check_stored(pg, len(msgs))
    paths = {p: metrics.registry.get_sample_value("chat_messages_total", {"path": p}) or 0
             for p in ("buffered", "direct", "spooled", "lost")}
    if paths["buffered"] != len(msgs):
        raise RuntimeError(f"not every message went through the buffer: {paths}")
    return {"rate": len(msgs) / elapsed, "handover_rate": len(msgs) / handed_over}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-chat-") as tmpdir:
        tmp = Path(tmpdir)
        pg = PostgresServer(tmp / "pg")
        rds = RedisServer(tmp / "redis")
        pg.start()
        rds.start()
        try:
            cfg = load(str(write_config(tmp, pg, rds)), {})
            migrate(cfg.timescale)
            pool = Pool(cfg.timescale)
            raw: list[float] = []
            store: list[float] = []
            e2e: list[float] = []
            handover: list[float] = []
            batch_size = cfg.chat.flush_batch_size
            raw_copy(pg, make_messages(min(args.messages, 20_000), -1))  # warm-up, not counted
            for run in range(args.runs):
                msgs = make_messages(args.messages, run)
                raw.append(raw_copy(pg, msgs))
                store.append(store_only(pg, pool, msgs, cfg.chat.flush_batch_size))
                result = end_to_end(pg, cfg, pool, msgs)
                e2e.append(result["rate"])
                handover.append(result["handover_rate"])
                print(f"run {run + 1}: raw COPY {raw[-1]:,.0f}/s, store {store[-1]:,.0f}/s, "
                      f"end to end {e2e[-1]:,.0f}/s", flush=True)
            pool.close()
        finally:
            rds.close()
            pg.close()

    med = {name: statistics.median(values) for name, values in
           (("raw_copy", raw), ("store", store), ("end_to_end", e2e), ("handover", handover))}
    ratio = med["end_to_end"] / med["raw_copy"]
    print()
    print(f"{'measure':<44} {'messages/s (median)':>20}")
    print(f"{'raw COPY into chat_messages':<44} {med['raw_copy']:>20,.0f}")
    print(f"{'insert_chat, batches of flush_batch_size':<44} {med['store']:>20,.0f}")
    print(f"{'ChatQueue hand-over to Redis':<44} {med['handover']:>20,.0f}")
    print(f"{'end to end: ChatQueue -> committed rows':<44} {med['end_to_end']:>20,.0f}")
    print(f"{'ratio end to end / raw COPY':<44} {ratio:>20.2f}")

    out = ROOT / "bench" / "results" / "bench_chat.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "messages_per_run": args.messages, "runs": args.runs, "accounts": ACCOUNTS,
        "flush_batch_size": batch_size, "flush_interval_secs": FLUSH_INTERVAL,
        "raw_copy_per_sec": raw, "store_per_sec": store, "handover_per_sec": handover,
        "end_to_end_per_sec": e2e, "median": med, "ratio_end_to_end_to_raw_copy": ratio,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
    }, indent=2) + "\n")
    print(f"\nwritten to {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
