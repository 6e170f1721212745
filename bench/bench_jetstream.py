"""Benchmark of the Jetstream apply path: records per second.

    .venv/bin/python bench/bench_jetstream.py [--records 20000] [--batch 500]

Starts its own private PostgreSQL (fsync and synchronous_commit on, as in
production) through tests/support/harness, and measures:

- `store.apply` alone: batches of new creates, then the same batches again
  (a rewind's replay: every commit stale), then batches that repeat each key
  several times (in-batch dedup);
- end to end: the real source fed by the stand-in Jetstream server over a
  loopback WebSocket, from a saved cursor, until the cursor is committed.

Prints a table and writes bench/results/bench_jetstream.json. Not a test: no
thresholds here.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from _paths import DURABLE_PG, write_result  # noqa: E402 - first: it sets up sys.path

from lumio_ingestd.db.migrate import migrate  # noqa: E402
from lumio_ingestd.db.pool import Pool  # noqa: E402
from lumio_ingestd.devkit.standins.jetstream import JetstreamStandin, StandinEvent, commit  # noqa: E402
from lumio_ingestd.metrics import Metrics  # noqa: E402
from lumio_ingestd.sources.jetstream.protocol import Commit, decode  # noqa: E402
from lumio_ingestd.sources.jetstream.source import JetstreamSource  # noqa: E402
from lumio_ingestd.stores import jetstream as store  # noqa: E402
from support import make_config  # noqa: E402
from support.harness import PostgresServer  # noqa: E402

DID = "did:plc:benchbenchbenchbenchbenc"
POST = "app.bsky.feed.post"


def _frames(n: int, base_us: int, keys: int | None = None) -> list[dict[str, Any]]:
    record = {"$type": POST, "text": "a post of a typical length " * 4, "langs": ["en"],
              "createdAt": "2026-01-05T19:06:40.000Z"}
    return [commit(DID, base_us + i, "create" if keys is None else "update", POST,
                   f"k{i if keys is None else i % keys}", record=record) for i in range(n)]


def _commits(frames: list[dict[str, Any]]) -> list[Commit]:
    out = [decode(json.dumps(f)) for f in frames]
    return [c for c in out if isinstance(c, Commit)]


def _apply_all(pool: Pool, commits: list[Commit], batch: int) -> tuple[float, int]:
    written = 0
    started = time.perf_counter()
    for i in range(0, len(commits), batch):
        chunk = commits[i:i + batch]
        with pool.transaction() as cur:
            res = store.apply(cur, chunk, cursor_name="bench", cursor_us=chunk[-1].time_us)
        written += len(res.written)
    return time.perf_counter() - started, written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    work = Path(tempfile.mkdtemp(prefix="bench-jetstream-"))
    pg = PostgresServer(work / "pg", settings=DURABLE_PG)
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "settings": {"records": args.records, "batch": args.batch, "pg": DURABLE_PG},
    }
    base = (int(time.time()) - 600) * 1_000_000
    try:
        pg.start()
        pg.create_database("bench")
        cfg = make_config(work, pg_url=pg.url("bench"))
        migrate(cfg.timescale)
        pool = Pool(cfg.timescale)
        try:
            new = _commits(_frames(args.records, base))
            took, written = _apply_all(pool, new, args.batch)
            results["apply_new"] = {"records": written, "seconds": took, "per_sec": written / took}
            took, written = _apply_all(pool, new, args.batch)
            results["apply_replayed"] = {"records": len(new), "seconds": took, "per_sec": len(new) / took,
                                         "written": written}
            dup = _commits(_frames(args.records, base + args.records, keys=args.batch // 5))
            took, written = _apply_all(pool, dup, args.batch)
            results["apply_in_batch_duplicates"] = {"records": len(dup), "seconds": took,
                                                    "per_sec": len(dup) / took, "written": written}
            with pool.transaction() as cur:
                cur.execute("TRUNCATE bsky_records, jetstream_cursor")
                cur.execute("INSERT INTO jetstream_cursor (name, time_us) VALUES ('default', %s)", (base,))
        finally:
            pool.close()

        frames = _frames(args.records, base + 10_000_000)
        with JetstreamStandin([StandinEvent.of(f) for f in frames]) as server:
            e2e = make_config(work, pg_url=pg.url("bench"), sections={
                "jetstream": {"url": server.url, "collections": POST}, "account.1": {"bluesky_did": DID}})
            pool = Pool(e2e.timescale)
            src = JetstreamSource(e2e.jetstream, e2e.accounts, store.JetstreamStore(pool), Metrics(),
                                  batch_max=args.batch)
            last = frames[-1]["time_us"]
            started = time.perf_counter()
            src.start()
            try:
                while True:
                    with pool.transaction() as cur:
                        cur.execute("SELECT time_us FROM jetstream_cursor WHERE name = 'default'")
                        row = cur.fetchone()
                    if row is not None and row[0] >= last:
                        break
                    if time.perf_counter() - started > 600:
                        raise SystemExit("end to end run did not finish in 10 minutes")
                    src.stop_event.wait(0.02)
                took = time.perf_counter() - started
            finally:
                src.request_stop()
                src.join(10)
                pool.close()
        results["end_to_end"] = {"records": len(frames), "seconds": took, "per_sec": len(frames) / took}
    finally:
        pg.close()

    print(f"{'measure':<28}{'records':>9}{'seconds':>10}{'records/s':>12}")
    for key in ("apply_new", "apply_replayed", "apply_in_batch_duplicates", "end_to_end"):
        r = results[key]
        print(f"{key:<28}{r['records']:>9}{r['seconds']:>10.2f}{r['per_sec']:>12.0f}")
    write_result("bench_jetstream", results)


if __name__ == "__main__":
    main()
