"""Chat throughput on a Redis Cluster beside a single Redis, in the same run.

    .venv/bin/python bench/bench_cluster.py [--messages N] [--runs R]

Starts a private PostgreSQL, one redis-server, and a Redis Cluster of three
primaries and three replicas (tests/support/harness: `RedisServer`,
`RedisClusterServers`), and measures bench_chat.py's end-to-end path
(`ChatQueue` -> pipelined RPUSH -> `ChatFlusher` -> committed rows) on each,
alternating, `--runs` times. Prints the medians and writes
bench/results/bench_cluster.json. Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from _paths import ROOT  # first of the local imports: it sets up sys.path
from bench_chat import end_to_end, make_messages

from lumio_ingestd.config import load
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.db.pool import Pool
from support.harness.cluster import RedisClusterServers
from support.harness.servers import PostgresServer, RedisServer


def _config(tmp: Path, name: str, pg: PostgresServer, url: str, cluster: bool) -> Path:
    path = tmp / f"{name}.ini"
    path.write_text(
        "[daemon]\n"
        f"state_dir = {tmp / 'state'}\n"
        f"instance_id = bench-{name}\n"
        f"accounts_dir = {tmp / 'none'}\n"
        "[redis]\n"
        f"url = {url}\n"
        f"cluster = {'true' if cluster else 'false'}\n"
        "[timescale]\n"
        f"dsn = {pg.url('postgres')}\n"
        "[chat]\n"
        "flush_interval_secs = 0.2\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"single": [], "cluster": []}
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmpdir:
        tmp = Path(tmpdir)
        with PostgresServer(tmp / "pg") as pg, RedisServer(tmp / "redis") as single, \
                RedisClusterServers(tmp / "cluster") as cluster:
            cfgs = {"single": load(str(_config(tmp, "single", pg, single.url, False)), {}),
                    "cluster": load(str(_config(tmp, "cluster", pg, cluster.url, True)), {})}
            migrate(cfgs["single"].timescale)
            pool = Pool(cfgs["single"].timescale)
            try:
                for run in range(args.runs):
                    for name, cfg in cfgs.items():
                        msgs = make_messages(args.messages, run * 2 + (name == "cluster"))
                        rates[name].append(end_to_end(pg, cfg, pool, msgs)["rate"])
                        print(f"run {run + 1} {name}: {rates[name][-1]:,.0f} messages/s", file=sys.stderr)
            finally:
                pool.close()
    med = {name: statistics.median(values) for name, values in rates.items()}
    print(f"end to end, ChatQueue -> committed rows (median of {args.runs} x {args.messages:,}):")
    print(f"  single redis-server:                 {med['single']:>10,.0f} messages/s")
    print(f"  Redis Cluster (3 primaries + 3 replicas): {med['cluster']:>10,.0f} messages/s")
    out = ROOT / "bench" / "results" / "bench_cluster.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"messages_per_run": args.messages, "runs": args.runs, "per_run": rates,
                               "median": med}, indent=2) + "\n")
    print(f"written to {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
