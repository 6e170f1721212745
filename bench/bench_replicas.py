"""What `[redis] min_replicas_acked = 1` costs: chat end to end and `persist_event`, 0 beside 1.

    .venv/bin/python bench/bench_replicas.py [--messages 50000] [--events 1000] [--runs 3]

Starts a private PostgreSQL (fsync and synchronous_commit on) and a Redis
primary with one replica (`--replicaof`), and measures, with
`min_replicas_acked` 0 and 1 in alternating pairs (the order swapped every
run, so a background load hits both alike):

- chat end to end: bench_chat.py's path (`ChatQueue` -> pipelined RPUSH,
  with WAIT when on -> `ChatFlusher` -> committed rows), `--messages` over
  four accounts, in messages per second, and the source side alone (the
  rate at which `ChatQueue` hands them over, WAIT included);
- `persist_event` p50/p99 with the database up (the inline insert: Redis is
  not written, so WAIT is never sent) and with the database refusing
  (connection refused at once, so the event is parked: the one RPUSH of the
  park, plus WAIT when on).

Prints the medians and writes bench/results/bench_replicas.json. Not a test:
nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _paths import DURABLE_PG, write_result  # first of the local imports: it sets up sys.path
from bench_chat import end_to_end, make_messages

from lumio_ingestd.config import Config, load
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.events.persist import EventIngest
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.stores.redisclient import connect
from support.events import make_event
from support.harness.servers import PostgresServer, RedisServer, wait_until

MODES = (0, 1)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config(tmp: Path, acked: int, redis_url: str, dsn: str, name: str) -> Config:
    path = tmp / f"{name}.ini"
    path.write_text(
        "[daemon]\n"
        f"state_dir = {tmp / 'state'}\n"
        f"instance_id = bench-{name}\n"
        f"accounts_dir = {tmp / 'none'}\n"
        "[redis]\n"
        f"url = {redis_url}\n"
        f"min_replicas_acked = {acked}\n"
        "[timescale]\n"
        f"dsn = {dsn}\n"
        "connect_timeout_secs = 2\n"
        "[chat]\n"
        "flush_interval_secs = 0.2\n"
        "[events]\n"
        "insert_timeout_secs = 2\n")
    return load(str(path), {})


def _pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] * 1000


def _persist(cfg: Config, pool: Pool, n: int, expect: str, tag: str) -> dict[str, float]:
    client = connect(cfg.redis)
    ingest = EventIngest(client, pool, None, Metrics(), cfg)
    times: list[float] = []
    try:
        for i in range(n):
            ev = make_event(1 + i % 4, external_id=f"{tag}-{i}", n=i)
            started = time.perf_counter()
            outcome = ingest.persist_event(ev).outcome
            times.append(time.perf_counter() - started)
            if outcome != expect:
                raise RuntimeError(f"persist_event: {outcome!r}, expected {expect!r}")
        client.delete(*[k for k in client.scan_iter(match="lumio:events:deadletter:*")] or ["none"])
    finally:
        client.close()
    return {"p50_ms": _pct(times, 50), "p99_ms": _pct(times, 99)}


def run(messages: int = 50_000, events: int = 1000, runs: int = 3) -> dict[str, Any]:
    per_run: dict[str, dict[int, list[float]]] = {
        "chat_rate": {m: [] for m in MODES}, "handover_rate": {m: [] for m in MODES},
        "stored_p99_ms": {m: [] for m in MODES},
        "stored_p50_ms": {m: [] for m in MODES}, "parked_p99_ms": {m: [] for m in MODES},
        "parked_p50_ms": {m: [] for m in MODES}}
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmpdir:
        tmp = Path(tmpdir)
        with PostgresServer(tmp / "pg", settings=DURABLE_PG) as pg, \
                RedisServer(tmp / "primary") as primary:
            replica = RedisServer(tmp / "replica", extra_args=(
                "--replicaof", "127.0.0.1", str(primary.port)))
            replica.start()
            try:
                probe = replica.client()
                if not wait_until(lambda: probe.info("replication").get("master_link_status") == "up",
                                  30):
                    raise RuntimeError("the replica did not sync")
                probe.close()
                cfgs = {m: _config(tmp, m, primary.url, pg.url("postgres"), f"up{m}") for m in MODES}
                refused = {m: _config(tmp, m, primary.url,
                                      f"postgresql://postgres@127.0.0.1:{_closed_port()}/postgres",
                                      f"down{m}") for m in MODES}
                migrate(cfgs[0].timescale)
                pool = Pool(cfgs[0].timescale)
                dead_pool = Pool(refused[0].timescale)
                try:
                    for r in range(runs):
                        for m in (MODES if r % 2 == 0 else tuple(reversed(MODES))):
                            msgs = make_messages(messages, r * 2 + m)
                            chat = end_to_end(pg, cfgs[m], pool, msgs)
                            rate = chat["rate"]
                            per_run["handover_rate"][m].append(chat["handover_rate"])
                            stored = _persist(cfgs[m], pool, events, "stored", f"s{r}{m}")
                            parked = _persist(refused[m], dead_pool, events, "parked", f"p{r}{m}")
                            per_run["chat_rate"][m].append(rate)
                            per_run["stored_p50_ms"][m].append(stored["p50_ms"])
                            per_run["stored_p99_ms"][m].append(stored["p99_ms"])
                            per_run["parked_p50_ms"][m].append(parked["p50_ms"])
                            per_run["parked_p99_ms"][m].append(parked["p99_ms"])
                            print(f"run {r + 1} min_replicas_acked={m}: chat {rate:,.0f} msg/s "
                                  f"(hand-over {chat['handover_rate']:,.0f} msg/s), "
                                  f"persist_event p99 stored {stored['p99_ms']:.2f} ms, "
                                  f"parked {parked['p99_ms']:.2f} ms", file=sys.stderr)
                finally:
                    pool.close()
                    dead_pool.close()
            finally:
                replica.close()
    median = {name: {str(m): statistics.median(v) for m, v in by_mode.items()}
              for name, by_mode in per_run.items()}
    return {"messages_per_run": messages, "events_per_run": events, "runs": runs,
            "per_run": {name: {str(m): v for m, v in by_mode.items()}
                        for name, by_mode in per_run.items()},
            "median": median}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    result = run(args.messages, args.events, args.runs)
    med = result["median"]
    print(f"min_replicas_acked 0 / 1, a primary with one replica (median of {args.runs} pairs):")
    print(f"  chat end to end:                  {med['chat_rate']['0']:>9,.0f} / "
          f"{med['chat_rate']['1']:,.0f} msg/s")
    print(f"  chat hand-over (the source's side): {med['handover_rate']['0']:>9,.0f} / "
          f"{med['handover_rate']['1']:,.0f} msg/s")
    print(f"  persist_event p99, stored inline: {med['stored_p99_ms']['0']:>9.2f} / "
          f"{med['stored_p99_ms']['1']:.2f} ms")
    print(f"  persist_event p99, parked:        {med['parked_p99_ms']['0']:>9.2f} / "
          f"{med['parked_p99_ms']['1']:.2f} ms")
    write_result("bench_replicas", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
