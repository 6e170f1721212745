"""Chat end to end over many sockets: 1, 4 and 16 in one process, and two replicas on the machine.

    .venv/bin/python bench/bench_wire_sockets.py [--messages 50000] [--runs 3]
        [--sockets 1,4,16] [--replica-sockets 1,8] [--shape short|full]

The same pipeline as bench_wire.py (`bench_wire.Pipeline`: what `app.build`
wires for Twitch chat), but for N accounts: each its own `TwitchSource` with
its own `ChatQueue` and socket, the one `ChatIngest` and ONE `ChatFlusher`
over the accounts of the process's shard. Each configuration runs its
replicas as child processes of this script (`--replica CONFIG`), so that one
process's figure and two processes' figures come from the same harness:

- N sockets, one process: config `shard = 0/1`, accounts 1..N;
- two replicas x N sockets: two processes, the same 2N accounts in both
  configs, `shard = 0/2` and `shard = 1/2` (and distinct `instance_id`), so
  that `Config.owns` gives each its half of the sources and its flusher its
  half of the buffers, as in production; the same PostgreSQL and Redis.

Every configuration moves the same total (`--messages`, split evenly over
all its sockets). The stand-in Twitch (bench/standin_server.py, a process of
its own) prepares each session's frames as wire bytes, of `--shape` (as in
bench_wire.py: "short" or "full"-size frames), then blasts every session at
once, a thread per session. The clock runs from the blast command
until the last replica's flusher has committed its last message
(`chat_messages_flushed_total` in each replica, read there; the two share
CLOCK_MONOTONIC); then every account's row count and the distinct message ids
are checked (every message stored once). Reported per configuration:
aggregate messages/s (the machine-wide figure for two replicas), each
replica's own (its messages / its time to its last commit), the CPU the
replica processes spent per message (user + system, all their threads, from
the blast to their last commit), the stand-in's send rate and the frames'
mean payload bytes. `--replica-sockets ""` runs no replicas.

Prints a table and writes bench/results/bench_wire_sockets.json
(bench_wire_sockets_full.json for the full shape). Not a test.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _child import JsonLinesChild  # noqa: E402
from _paths import write_result  # noqa: E402 - first: it sets up sys.path
from bench_chat import truncate  # noqa: E402
from bench_wire import (  # noqa: E402
    Pipeline,
    broadcaster,
    prepare_chat,
    process_cpu_secs,
    result_name,
    servers,
    write_config,
)
from standin_server import SHAPES, StandinProcess, reply  # noqa: E402

from lumio_ingestd.config import load  # noqa: E402
from lumio_ingestd.devkit.servers import PostgresServer, RedisServer, wait_until  # noqa: E402

FLUSH_TIMEOUT_SECS = 600.0


def _cpu() -> dict[str, float]:
    """CPU seconds (user + system) of this process, and of its threads by role.

    Read from /proc/self/task/TID/stat for each live Python thread (the
    kernel's names are all "python" before 3.14, so the Python names decide):
    "sources" (every source-* thread), "flusher" (chat-flush, chat-flush-N), "other".
    """
    out = {"process": process_cpu_secs(), "sources": 0.0, "flusher": 0.0, "other": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    for thread in threading.enumerate():
        try:
            stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        fields = stat.rpartition(")")[2].split()
        secs = (int(fields[11]) + int(fields[12])) / tick  # utime, stime: fields 14 and 15
        role = ("sources" if thread.name.startswith("source-") else
                "flusher" if thread.name.startswith("chat-flush") else "other")
        out[role] += secs
    return out


def replica_main(config: str) -> int:
    """Child side: one replica's pipeline, driven over stdin/stdout.

        -> {"broadcasters"}                    once its sources are started
        <- {"cmd": "arm"}                      -> {"ok"}: the flushed count and CPU time now are the base
        <- {"cmd": "await", "n": N}            -> {"ok", "done_at", "cpu_secs"}: when base + N were
                                                  committed (time.monotonic(); "ok" false on
                                                  timeout), and the CPU (user + system) since
                                                  "arm" of the process and of its threads by
                                                  role (`_cpu`)
        <- {"cmd": "quit"}                     -> stops and exits
    """
    logging.basicConfig(level=logging.ERROR)  # as run_all: a stopping source may warn
    pipeline = Pipeline(load(config, {}))
    pipeline.start()
    base = 0.0
    cpu_base = _cpu()
    try:
        reply({"broadcasters": pipeline.broadcasters})
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["cmd"] == "arm":
                base, cpu_base = pipeline.flushed(), _cpu()
                reply({"ok": True})
            elif cmd["cmd"] == "await":
                def committed(target: float = base + int(cmd["n"])) -> bool:
                    return pipeline.flushed() >= target

                # A tight poll: the flusher commits every 0.2 s, the clock must not add to that.
                ok = wait_until(committed, FLUSH_TIMEOUT_SECS, interval=0.002)
                done_at = time.monotonic()
                cpu = _cpu()
                reply({"ok": ok, "done_at": done_at,
                        "cpu_secs": {k: cpu[k] - cpu_base[k] for k in cpu}})
            elif cmd["cmd"] == "quit":
                break
    finally:
        pipeline.close()
    return 0


class Replica(JsonLinesChild):
    """Parent side: this script as a child process with `--replica CONFIG`."""

    def __init__(self, config: Path) -> None:
        super().__init__(Path(__file__).resolve(), "--replica", str(config), what="a replica process",
                         quit_secs=60.0)
        self.broadcasters: list[str] = self.read()["broadcasters"]


def check_per_account(pg: PostgresServer, expected: dict[int, int]) -> None:
    """Every account's messages stored, each once (no more, no fewer, no repeats)."""
    conn = pg.connect("postgres")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT account_id, count(*), count(DISTINCT message_id) FROM chat_messages "
                        "GROUP BY account_id")
            stored = {int(a): (int(c), int(d)) for a, c, d in cur.fetchall()}
    finally:
        conn.close()
    wrong = {a: stored.get(a, (0, 0)) for a in set(expected) | set(stored)
             if stored.get(a, (0, 0)) != (expected.get(a, 0), expected.get(a, 0))}
    if wrong:
        raise RuntimeError(f"stored (rows, distinct) per account differ from those sent: {wrong}, "
                           f"sent {expected}")


def run_config(tmp: Path, pg: PostgresServer, rds: RedisServer, *, replicas: int, sockets: int,
               messages: int, runs: int, shape: str) -> dict[str, Any]:
    """`replicas` processes of `sockets` sources each; `messages` in all per run, of `shape`."""
    accounts = replicas * sockets
    per_account = messages // accounts
    total = per_account * accounts
    label = f"{replicas}x{sockets}"
    standin = StandinProcess("--subscribe-window", "120")
    procs: list[Replica] = []
    per_run: list[dict[str, Any]] = []
    try:
        for i in range(replicas):
            config = write_config(tmp / f"{label}-replica-{i}", pg, rds, standin.info, accounts=accounts,
                                  shard=f"{i}/{replicas}", instance_id=f"bench-replica-{i}")
            procs.append(Replica(config))
        owned = [len(p.broadcasters) for p in procs]
        if sum(owned) != accounts or len({b for p in procs for b in p.broadcasters}) != accounts:
            raise SystemExit(f"the shards do not split the {accounts} accounts: {owned}")
        if not standin.call("wait_sessions", n=accounts, timeout=120)["ok"]:
            raise SystemExit(f"fewer than {accounts} sources subscribed to the stand-in")
        for r in range(runs):
            truncate(pg)
            bytes_per_frame = prepare_chat(standin, per_account,
                                           [broadcaster(a) for a in range(1, accounts + 1)], shape)
            for p in procs:
                p.send("arm")
            for p in procs:
                p.read()
            for p, n in zip(procs, owned, strict=True):
                p.send("await", n=n * per_account)
            started = time.monotonic()
            sent = standin.call("blast")
            done = [p.read() for p in procs]
            if not all(d["ok"] for d in done) or sent["sent"] != total:
                raise SystemExit(f"{label}: sent {sent['sent']} of {total}, committed in time: "
                                 f"{[d['ok'] for d in done]}")
            check_per_account(pg, {a: per_account for a in range(1, accounts + 1)})
            elapsed = [d["done_at"] - started for d in done]
            per_run.append({
                "aggregate": total / max(elapsed),
                "per_replica": [n * per_account / e for n, e in zip(owned, elapsed, strict=True)],
                "standin_send": sent["sent"] / sent["seconds"],
                "seconds": max(elapsed),
                "bytes_per_frame": bytes_per_frame,
                "cpu_us_per_message": sum(d["cpu_secs"]["process"] for d in done) / total * 1e6,
                "cpu_us_per_message_by_role": {
                    role: sum(d["cpu_secs"][role] for d in done) / total * 1e6
                    for role in ("sources", "flusher", "other")},
            })
            print(f"  (a) {shape} frames, {replicas} process(es) x {sockets} socket(s), run {r + 1}/{runs}: "
                  f"{per_run[-1]['aggregate']:,.0f} msg/s", file=sys.stderr, flush=True)
    finally:
        for p in procs:
            p.close()
        standin.close()
    median_run = sorted(per_run, key=lambda x: x["aggregate"])[len(per_run) // 2]
    return {"replicas": replicas, "sockets_per_replica": sockets, "messages": total,
            "messages_per_socket": per_account, "per_run": per_run,
            "aggregate": statistics.median(x["aggregate"] for x in per_run),
            "per_replica": median_run["per_replica"],
            "standin_send": statistics.median(x["standin_send"] for x in per_run),
            "bytes_per_frame": statistics.median(x["bytes_per_frame"] for x in per_run),
            "cpu_us_per_message": statistics.median(x["cpu_us_per_message"] for x in per_run),
            "cpu_us_per_message_by_role": median_run["cpu_us_per_message_by_role"]}


def run(messages: int = 50_000, runs: int = 3, sockets: tuple[int, ...] = (1, 4, 16),
        replica_sockets: tuple[int, ...] = (1, 8), shape: str = "short") -> dict[str, Any]:
    """Every configuration, `runs` times each, on `shape`'s frames; medians of the aggregate.

    `sockets` or `replica_sockets` may be empty: those configurations are not run.
    """
    configs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-wire-sockets-") as tmpdir, \
            servers(Path(tmpdir)) as (pg, rds):
        tmp = Path(tmpdir)
        for replicas, counts in ((1, sockets), (2, replica_sockets)):
            for n in counts:
                configs.append(run_config(tmp, pg, rds, replicas=replicas, sockets=n, messages=messages,
                                          runs=runs, shape=shape))
    one = next((c for c in configs if c["replicas"] == 1 and c["sockets_per_replica"] == 1), None)
    most = max((c for c in configs if c["replicas"] == 1), key=lambda c: c["sockets_per_replica"],
               default=None)
    # Every configuration sends the same total, so the mean of theirs is the mean frame.
    return {"shape": shape, "messages_per_run": messages, "runs": runs,
            "bytes_per_frame": (statistics.fmean(c["bytes_per_frame"] for c in configs)
                                if configs else None),
            "configs": configs,
            "ratio_most_sockets_to_one": (most["aggregate"] / one["aggregate"]
                                          if one is not None and most is not None else None)}


def config_label(c: dict[str, Any]) -> str:
    if c["replicas"] == 1:
        return f"{c['sockets_per_replica']} socket(s), one process"
    return f"{c['replicas']} replicas x {c['sockets_per_replica']} socket(s), machine-wide"


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sockets", type=_ints, default=(1, 4, 16), help="one process: comma-separated")
    parser.add_argument("--replica-sockets", type=_ints, default=(1, 8),
                        help="two replicas: sockets per replica, comma-separated")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="short",
                        help="the chat frames (bench/standin_server.py, SHAPES)")
    parser.add_argument("--replica", metavar="CONFIG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replica:
        return replica_main(args.replica)
    result = run(args.messages, args.runs, args.sockets, args.replica_sockets, args.shape)
    size = f" (~{result['bytes_per_frame']:,.0f} B)" if result["bytes_per_frame"] is not None else ""
    print(f"chat end to end, {args.messages:,} {args.shape} frames{size}, median of {args.runs}")
    print(f"{'configuration':<56}{'msg/s':>10}  {'per replica':>16}  {'CPU us/msg (src/flush)':>22}  "
          f"{'stand-in send':>14}")
    for c in result["configs"]:
        each = " / ".join(f"{x:,.0f}" for x in c["per_replica"]) if c["replicas"] > 1 else ""
        roles = c["cpu_us_per_message_by_role"]
        cpu = f"{c['cpu_us_per_message']:.0f} ({roles['sources']:.0f}/{roles['flusher']:.0f})"
        print(f"{config_label(c):<56}{c['aggregate']:>10,.0f}  {each:>16}  {cpu:>22}  "
              f"{c['standin_send']:>14,.0f}")
    if result["ratio_most_sockets_to_one"] is not None:
        print(f"{'most sockets / one socket, one process':<56}{result['ratio_most_sockets_to_one']:>10.2f}")
    write_result(result_name("bench_wire_sockets", args.shape), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
