"""Benchmark of the local spool: append throughput, replay throughput, start-up time.

    .venv/bin/python bench/bench_spool.py [--dir DIR] [--entry-bytes 300]

Runs on real files (by default a temporary directory on the filesystem of
/var/tmp, i.e. the disk, since that is where a state directory lives) and
measures:

- appends of batches of 1 and of 100 entries: records/s and appends/s (each
  append is one write and one fsync, so appends/s is fsyncs/s);
- replay to a handler that does nothing: records/s (each handler call ends
  with an atomic ack file: write, fsync, rename, directory fsync);
- `open()` of a spool holding many segments (only the last one is verified).

No servers are needed. Prints a table and writes bench/results/bench_spool.json.
Not a test: no thresholds here.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from _paths import write_result  # noqa: E402 - first: it sets up sys.path

from lumio_ingestd.metrics import Metrics  # noqa: E402
from lumio_ingestd.stores.spool import Spool  # noqa: E402


def _entry(i: int, size: int) -> bytes:
    head = f'{{"v":1,"platform":"twitch","account_id":"acc-{i % 50}","message_id":"m-{i}","text":"'
    return (head.encode() + b"x" * max(0, size - len(head) - 2) + b'"}')[:max(size, 1)]


def bench_append(directory: Path, batch: int, seconds: float, entry_bytes: int) -> dict[str, Any]:
    spool = Spool(directory, 1 << 40, Metrics())
    spool.open()
    entries = [_entry(i, entry_bytes) for i in range(batch)]
    appends = 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        spool.append("chat", entries)
        appends += 1
    took = time.perf_counter() - started
    spool.close()
    return {"batch": batch, "appends": appends, "records": appends * batch, "seconds": round(took, 3),
            "records_per_s": round(appends * batch / took), "fsyncs_per_s": round(appends / took),
            "mb_per_s": round(appends * batch * (entry_bytes + 9) / took / 1e6, 2)}


def bench_replay(directory: Path, records: int, entry_bytes: int) -> dict[str, Any]:
    spool = Spool(directory, 1 << 40, Metrics())
    spool.open()
    entries = [_entry(i, entry_bytes) for i in range(1000)]
    for _ in range(records // 1000):
        spool.append("chat", entries)
    spool.close()

    started = time.perf_counter()
    spool = Spool(directory, 1 << 40, Metrics())
    spool.open()
    opened = time.perf_counter() - started
    segments = len(list(directory.glob("spool-*.seg")))
    seen = 0

    def handler(kind: str, batch: list[bytes]) -> None:
        nonlocal seen
        seen += len(batch)

    started = time.perf_counter()
    while spool.replay(handler, 1000):
        pass
    took = time.perf_counter() - started
    spool.close()
    assert seen == records // 1000 * 1000
    return {"records": seen, "segments": segments, "open_seconds": round(opened, 3),
            "replay_seconds": round(took, 3), "replay_records_per_s": round(seen / took)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"),
                        help="where to create the temporary spool directories")
    parser.add_argument("--entry-bytes", type=int, default=300, help="size of one entry (a chat message)")
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each append run")
    parser.add_argument("--replay-records", type=int, default=200_000)
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="bench-spool-", dir=args.dir))
    results: dict[str, Any] = {"machine": platform.platform(), "entry_bytes": args.entry_bytes,
                               "dir": str(args.dir)}
    try:
        results["append_batch_1"] = bench_append(base / "a1", 1, args.seconds, args.entry_bytes)
        results["append_batch_100"] = bench_append(base / "a100", 100, args.seconds, args.entry_bytes)
        results["replay"] = bench_replay(base / "replay", args.replay_records, args.entry_bytes)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    print(f"{'run':<18} {'records/s':>11} {'fsyncs/s':>10} {'MB/s':>7}")
    for key in ("append_batch_1", "append_batch_100"):
        r = results[key]
        print(f"{key:<18} {r['records_per_s']:>11} {r['fsyncs_per_s']:>10} {r['mb_per_s']:>7}")
    r = results["replay"]
    print(f"{'replay':<18} {r['replay_records_per_s']:>11}   ({r['records']} records in "
          f"{r['segments']} segments; open() took {r['open_seconds']} s)")
    write_result("bench_spool", results)


if __name__ == "__main__":
    main()
