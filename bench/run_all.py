"""Every benchmark in one run: one table on standard output, and bench/results/summary.json.

    make bench          (or .venv/bin/python bench/run_all.py [--quick])

Runs, in this process tree (each part starts its own private servers through
lumio_ingestd.devkit.servers, and the Twitch stand-in in a child process):

(a) chat end to end, WebSocket frames on loopback to committed rows, with
    the process's CPU per message, beside the raw limits measured on the
    same frames in the same run: JSON parse, parse and extract, Redis
    pipeline, COPY, and a naive one-INSERT-per-message baseline
    (bench_wire.py), and the single-thread floor: each step's CPU per
    message with no thread beside it, the highest end to end / parse +
    extract ratio that leaves, and the floor-limited rate (1e6 / floor) set
    against end to end; then the same total over 1, 4 and 16 sockets in one
    process, and two replicas (`shard = 0/2` and `1/2`, a process each) with
    the machine-wide figure (bench_wire_sockets.py, every pipeline in a child
    process). All of it on the short frames the figures have always used
    (~1.4 KB: one text fragment, one badge, spaced JSON); then (a') end to
    end, its CPU, floor and floor-limited rate, and 1 and 16 sockets (no
    replicas) on full-size frames (~2.2 KB: emote and mention fragments,
    three badges, a reply, compact JSON as Twitch sends it);
(b) `persist_event` p50/p99, time to park with the database stopped,
    replay throughput of 100,000 parked events over 1,000 accounts with the
    p99 of a live `persist_event` beside it, idle and during the replay, in
    alternating windows (bench_events.py in a child process of its own, PostgreSQL with fsync
    on), and the chat dead-letter drain (bench_chat_drain.py);
(c) shutdown drain time under load: SIGTERM to exit of the real daemon with
    the synthetic source running (bench_daemon.py);
(d) memory per idle source socket, 500 TwitchSource threads with their
    sessions open (bench_sockets.py, in a child process of its own: this
    process's heap, grown and freed by (a)-(c), would hide part of the cost);
(e) Kick chat, Pusher frames on loopback to committed rows through one
    KickSource socket, beside the single-thread parse rate of the same
    frames (bench_kick.py, the stand-in Kick in a child process);
(f) what `[redis] min_replicas_acked = 1` costs, beside 0, on a primary with
    one replica, in alternating pairs: chat end to end and `persist_event`
    p99, stored inline and parked (bench_replicas.py).
(g) chat storage (bench_storage.py): on 300,000 realistic chat rows over
    1,000 accounts and 30 days, what each way of compressing them leaves
    (the earlier release's, the daemon's, and the alternatives measured),
    bytes per row and ratio; on 10,000,000 such rows, "the latest 100
    messages of one account" without and with its index on plain
    PostgreSQL and on TimescaleDB uncompressed, and compressed the earlier
    way and the daemon's, with the indexes each plan reads and the time to
    build the index online (where TimescaleDB is installed).
(h) alert latency: the real daemon with one account's socket flooded with
    full-size chat as fast as it reads and another receiving 10 cheers a
    second; from each cheer's frame written to its alert received on Redis
    and on the SSE stream, p50 / p99 / max, idle and under the flood, in one
    run (bench_alerts.py).

Progress goes to standard error. `--quick` makes every part small (a smoke
run, not figures to quote). Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_alerts  # noqa: E402
import bench_chat_drain  # noqa: E402
import bench_daemon  # noqa: E402
import bench_kick  # noqa: E402
import bench_replicas  # noqa: E402
import bench_storage  # noqa: E402
import bench_wire  # noqa: E402
import bench_wire_sockets  # noqa: E402
from _paths import ROOT  # noqa: E402 - first: it sets up sys.path

from lumio_ingestd.devkit.servers import find_pg_bindir, find_redis_server  # noqa: E402

FULL: dict[str, dict[str, Any]] = {
        "wire": {"messages": 50_000, "runs": 3, "naive": 5_000, "shape": "short"},
        "wire_sockets": {"messages": 50_000, "runs": 3, "sockets": (1, 4, 16), "replica_sockets": (1, 8),
                         "shape": "short"},
        "wire_full": {"messages": 50_000, "runs": 3, "naive": 5_000, "shape": "full"},
        "wire_sockets_full": {"messages": 50_000, "runs": 3, "sockets": (1, 16), "replica_sockets": (),
                              "shape": "full"},
        "events": {"events": 2000, "down": 200, "blackhole": 3, "replay": 100_000,
                   "accounts": 1000},
        "chat_drain": {"messages": 100_000, "accounts": 100},
        "daemon": {"rates": (0.0, 2000.0, 5000.0), "runs": 3, "load_secs": 3.0},
        "sockets": {"sockets": 500, "wave": 50},
        "kick": {"messages": 20_000, "runs": 3},
        "replicas": {"messages": 50_000, "events": 1000, "runs": 3},
        "storage": {"rows": 10_000_000, "ratio_rows": 300_000, "accounts": 1000, "days": 30},
        "alerts": {"idle": 100, "load": 300, "rate": 10.0, "shape": "full"}}
QUICK: dict[str, dict[str, Any]] = {
         "wire": {"messages": 5_000, "runs": 1, "naive": 500, "shape": "short"},
         "wire_sockets": {"messages": 5_000, "runs": 1, "sockets": (1, 4, 16), "replica_sockets": (1, 8),
                          "shape": "short"},
         "wire_full": {"messages": 5_000, "runs": 1, "naive": 500, "shape": "full"},
         "wire_sockets_full": {"messages": 5_000, "runs": 1, "sockets": (1, 16), "replica_sockets": (),
                               "shape": "full"},
         "events": {"events": 200, "down": 20, "blackhole": 1, "replay": 2000, "accounts": 20},
         "chat_drain": {"messages": 5_000, "accounts": 10},
         "daemon": {"rates": (0.0, 2000.0), "runs": 1, "load_secs": 1.0},
         "sockets": {"sockets": 50, "wave": 50},
         "kick": {"messages": 2_000, "runs": 1},
         "replicas": {"messages": 3_000, "events": 100, "runs": 1},
         "storage": {"rows": 20_000, "ratio_rows": 20_000, "accounts": 100, "days": 10},
         "alerts": {"idle": 20, "load": 30, "rate": 10.0, "shape": "full"}}


def _version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False).stdout
    except OSError as exc:
        return f"unknown ({exc})"
    return out.strip()


def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    mem = re.search(r"^MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    pg = re.search(r"\d+(\.\d+)+", _version([str(find_pg_bindir() / "postgres"), "--version"]))
    redis = re.search(r"v=(\S+)", _version([find_redis_server(), "--version"]))
    return {
        "nproc": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(),
        "cpu_model": model.group(1).strip() if model else "unknown",
        "ram_gib": round(int(mem.group(1)) / 1024 / 1024, 1) if mem else None,
        "python": platform.python_version(), "kernel": platform.release(),
        "postgresql": pg.group(0) if pg else "unknown", "redis": redis.group(1) if redis else "unknown",
    }


def idle_sockets(sockets: int, wave: int) -> dict[str, Any]:
    """(d) in a fresh process (its own small table is not shown: this one prints the table)."""
    subprocess.run([sys.executable, str(ROOT / "bench" / "bench_sockets.py"), "--sockets", str(sockets),
                    "--wave", str(wave)], check=True, stdout=subprocess.DEVNULL, timeout=600)
    result: dict[str, Any] = json.loads((ROOT / "bench" / "results" / "bench_sockets.json").read_text())
    return result


def events_part(events: int, down: int, blackhole: int, replay: int, accounts: int) -> dict[str, Any]:
    """(b) in a fresh process, like (d): the heap (a) leaves behind makes every cyclic
    garbage collection of this one slow, which would show in the live p99."""
    subprocess.run([sys.executable, str(ROOT / "bench" / "bench_events.py"), "--events", str(events),
                    "--down", str(down), "--blackhole", str(blackhole), "--replay", str(replay),
                    "--accounts", str(accounts)], check=True, stdout=subprocess.DEVNULL, timeout=1200)
    result: dict[str, Any] = json.loads((ROOT / "bench" / "results" / "bench_events.json").read_text())
    return result


def _timed(label: str, fn: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], float]:
    print(f"running {label} ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    result = fn()
    took = time.monotonic() - started
    print(f"  {label}: {took:.0f}s", file=sys.stderr, flush=True)
    return result, took


def frame_rows(a: dict[str, Any]) -> list[tuple[str, str]]:
    """(a) and (a'), each on its shape: the frames' size and the CPU a message took end to end."""
    return [("    bytes per frame (payload, unframed)", f"{a['bytes_per_frame']:,.0f} B"),
            ("    process CPU per message, end to end", f"{a['cpu_us_per_message']:.1f} us")]


def floor_limit_rows(a: dict[str, Any]) -> list[tuple[str, str]]:
    """(a) and (a'): what one thread doing only this pipeline's work would reach, and end to end beside it."""
    return [("    floor-limited rate (1e6 / floor)", f"{a['floor_limited_rate']:,.0f} msg/s"),
            ("    end to end / floor-limited rate", f"{a['ratio_end_to_end_to_floor_limited']:.2f}")]


def full_frames_rows(a: dict[str, Any]) -> list[tuple[str, str]]:
    """(a'): the same pipeline on full-size frames, right after (a)'s rows."""
    return [(f"(a') chat, full-size frames (~{a['bytes_per_frame']:,.0f} B)", ""),
            ("    WebSocket frames -> committed rows", f"{a['median']['end_to_end']:,.0f} msg/s"),
            *frame_rows(a),
            ("    the floor (one thread alone, CPU/msg)", f"{a['single_thread_floor_us']['floor']:.1f} us"),
            *floor_limit_rows(a),
            *sockets_rows(a["sockets"])]


def sockets_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """(a)'s many-socket rows: one process, then replicas (machine-wide, and each)."""
    rows: list[tuple[str, str]] = []
    one = [c for c in s["configs"] if c["replicas"] == 1]
    for c in one:
        n = c["sockets_per_replica"]
        rows.append((f"    {n} socket{'s' if n > 1 else ''}, one process (total split evenly)",
                     f"{c['aggregate']:,.0f} msg/s"))
    if one:
        rows.append((f"    process CPU per message, {' / '.join(str(c['sockets_per_replica']) for c in one)} "
                     "socket(s)", " / ".join(f"{c['cpu_us_per_message']:.0f}" for c in one) + " us"))
    if s["ratio_most_sockets_to_one"] is not None:
        most = max(c["sockets_per_replica"] for c in one)
        rows.append((f"    {most} sockets / 1 socket, one process", f"{s['ratio_most_sockets_to_one']:.2f}"))
    for c in s["configs"]:
        if c["replicas"] > 1:
            n = c["sockets_per_replica"]
            rows.append((f"    {c['replicas']} replicas x {n} socket{'s' if n > 1 else ''}, machine-wide",
                         f"{c['aggregate']:,.0f} msg/s"))
            rows.append(("      each replica", " / ".join(f"{x:,.0f}" for x in c["per_replica"]) + " msg/s"))
    return rows


def storage_rows(g: dict[str, Any]) -> list[tuple[str, str]]:
    """(g): what compression leaves of realistic chat, each way; the latest 100 messages of
    an account without and with its index, per storage."""
    rows: list[tuple[str, str]] = []
    comp = g.get("compression")
    if comp is None:
        rows.append(("(g) chat compression", "TimescaleDB not installed"))
    else:
        rows.append((f"(g) chat compression, {comp['rows']:,} rows, {comp['accounts']:,} accounts, "
                     f"{comp['days']} days: bytes per row before -> after (ratio)", ""))
        for name, w in comp["ways"].items():
            rows.append((f"    {name} ({w['chunks_before']} -> {w['chunks_after']} chunks)",
                         f"{w['bytes_per_row_before']:.0f} -> {w['bytes_per_row_after']:.0f} B "
                         f"({w['ratio']:.3f})"))
        now = comp["ways"]["now"]
        rows.append(("    now, against the bytes before the account index",
                     f"{now['ratio_to_without_account_index']:.3f}"))
    rows.append((f"    latest 100 of an account, {g['rows']:,} rows: without / with its index", ""))
    for label, key in (("plain PostgreSQL", "plain"), ("TimescaleDB uncompressed", "timescaledb")):
        r = g.get(key)
        if r is None:
            continue
        rows.append((f"      {label} ({r['account_rows']:,} rows of the account)",
                     f"{r['without_index']['last_100_ms']:.2f} / {r['with_index']['last_100_ms']:.2f} ms"))
        rows.append(("        reads", ", ".join(r["with_index"]["last_100_plan"]["indexes"])))
        rows.append(("        the index: build (online) / bytes per row",
                     f"{r['index_build_secs']:.1f} s / "
                     f"{r['with_index']['bytes_per_row'] - r['without_index']['bytes_per_row']:.0f} B"))
    ts = g.get("timescaledb")
    if ts is not None:
        earlier, now = ts["compressed_earlier"], ts["compressed"]
        rows.append(("      TimescaleDB compressed, earlier / now",
                     f"{earlier['last_100_ms']:.2f} / {now['last_100_ms']:.2f} ms"))
        rows.append(("        bytes per row compressed, earlier / now",
                     f"{earlier['bytes_per_row']:.0f} / {now['bytes_per_row']:.0f} B"))
    return rows


def table(a: dict[str, Any], a_full: dict[str, Any], b: dict[str, Any], c: dict[str, Any],
          d: dict[str, Any], e: dict[str, Any], f: dict[str, Any],
          g: dict[str, Any], h: dict[str, Any]) -> list[tuple[str, str]]:
    med = a["median"]
    rows = [
        ("(a) chat, short frames: WebSocket frames -> committed rows", f"{med['end_to_end']:,.0f} msg/s"),
        *frame_rows(a),
        ("    raw: json.loads of the same frames", f"{med['json_parse']:,.0f} msg/s"),
        ("    parse + extract the row's fields, one thread", f"{med['parse_extract']:,.0f} msg/s"),
        ("    the stand-in's own send rate", f"{med['standin_send']:,.0f} msg/s"),
        ("    raw: Redis RPUSH, pipelined batches of 200", f"{med['redis_pipeline']:,.0f} msg/s"),
        ("    raw: one COPY into chat_messages", f"{med['copy']:,.0f} msg/s"),
        ("    naive: one INSERT per message, autocommit", f"{med['naive_insert']:,.0f} msg/s"),
        ("    end to end / COPY", f"{a['ratio_end_to_end_to_copy']:.2f}"),
        ("    end to end / parse + extract", f"{a['ratio_end_to_end_to_parse_extract']:.2f}"),
    ]
    floor = a["single_thread_floor_us"]
    rows += [
        ("    one thread alone, CPU/msg: parse + extract", f"{floor['parse_extract']:.1f} us"),
        ("      + frame read / rest of source / flusher",
         f"{floor['frame_read']:.1f} / {floor['source_rest']:.1f} / {floor['flush']:.1f} us"),
        ("      = the floor (no other thread)", f"{floor['floor']:.1f} us"),
        *floor_limit_rows(a),
        ("    ceiling of end to end / parse + extract",
         f"{floor['ceiling_ratio']:.2f}"),
    ]
    rows += sockets_rows(a["sockets"])
    rows += full_frames_rows(a_full)
    normal, stopped, holed = b["persist_normal"], b["park_db_stopped"], b["park_blackholed"]
    rows += [
        ("(b) persist_event, database up (p50 / p99)",
         f"{normal['p50_ms']:.2f} / {normal['p99_ms']:.2f} ms"),
        ("    time to park, database stopped (p50 / p99)",
         f"{stopped['p50_ms']:.2f} / {stopped['p99_ms']:.2f} ms"),
        ("    time to park, database black-holed (p50)", f"{holed['p50_ms'] / 1000:.2f} s"),
        (f"    replay of {b['replay']['events']:,} parked events, {b['replay']['accounts']:,} accounts",
         f"{b['replay']['events_per_sec']:,.0f} events/s"),
        ("    replay, all already stored", f"{b['replay_already_stored']['events_per_sec']:,.0f} events/s"),
        ("    live persist_event p99, idle / during replay",
         f"{b['live_idle']['p99_ms']:.2f} / {b['live_during_replay']['p99_ms']:.2f} ms"),
        ("    live p99 during replay / idle", f"{b['live_p99_ratio']:.2f}"),
        ("    chat dead-letter drain", f"{b['chat_drain']['messages_per_sec']:,.0f} msg/s"),
    ]
    first = True
    for rate, s in c["summary"].items():
        label = f"SIGTERM -> exit at {int(rate):,} chat/s (median / max)"
        rows.append((("(c) " if first else "    ") + label,
                     f"{s['sigterm_to_exit_median_secs']:.2f} / {s['sigterm_to_exit_max_secs']:.2f} s"))
        rows.append((f"    drain in the shutdown report at {int(rate):,} chat/s",
                     f"{s['drain_median_secs']:.2f} s"))
        first = False
    down = next((r for r in c["runs"] if r.get("case") == "database stopped"), None)
    if down is not None:
        rows.append(("    SIGTERM -> exit at 200 chat/s, database stopped",
                     f"{down['sigterm_to_exit_secs']:.2f} s"))
    rows += [
        (f"(d) RSS per idle source socket ({d['sockets']} open)", f"{d['rss_per_socket_kib']:.1f} KiB"),
        ("    threads per source socket", f"{d['threads_per_socket']:.2f}"),
        ("(e) Kick chat: Pusher frames -> committed rows", f"{e['median']['end_to_end']:,.0f} msg/s"),
        ("    parse + map of the same frames, one thread", f"{e['median']['parse']:,.0f} msg/s"),
        ("    end to end / parse", f"{e['ratio_end_to_end_to_parse']:.2f}"),
    ]
    fm = f["median"]
    rows += [
        ("(f) chat end to end, min_replicas_acked 0 / 1",
         f"{fm['chat_rate']['0']:,.0f} / {fm['chat_rate']['1']:,.0f} msg/s"),
        ("    chat hand-over (source side), 0 / 1",
         f"{fm['handover_rate']['0']:,.0f} / {fm['handover_rate']['1']:,.0f} msg/s"),
        ("    persist_event p99 stored inline, 0 / 1",
         f"{fm['stored_p99_ms']['0']:.2f} / {fm['stored_p99_ms']['1']:.2f} ms"),
        ("    persist_event p99 parked (database refusing), 0 / 1",
         f"{fm['parked_p99_ms']['0']:.2f} / {fm['parked_p99_ms']['1']:.2f} ms"),
    ]
    rows += storage_rows(g)
    rows.append((f"(h) alert latency, {h['rate_per_sec']:g} cheers/s beside a flooded socket "
                 f"({h['shape']} chat frames)", ""))
    rows += bench_alerts.rows(h)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the parts provoke warnings on purpose
    sizes = QUICK if args.quick else FULL
    started = time.monotonic()
    info = machine()
    a, ta = _timed("(a) chat end to end, short frames", lambda: bench_wire.run(**sizes["wire"]))
    a["sockets"], tsockets = _timed("(a) chat over many sockets and two replicas, short frames",
                                    lambda: bench_wire_sockets.run(**sizes["wire_sockets"]))
    ta += tsockets
    a_full, ta_full = _timed("(a') chat end to end, full-size frames",
                             lambda: bench_wire.run(**sizes["wire_full"]))
    a_full["sockets"], tsockets = _timed("(a') chat over many sockets, full-size frames",
                                         lambda: bench_wire_sockets.run(**sizes["wire_sockets_full"]))
    ta_full += tsockets
    b, tb = _timed("(b) event durability", lambda: events_part(**sizes["events"]))
    b["chat_drain"], tdrain = _timed("(b) chat dead-letter drain",
                                     lambda: bench_chat_drain.run(**sizes["chat_drain"]))
    tb += tdrain
    c, tc = _timed("(c) shutdown drain", lambda: bench_daemon.run(**sizes["daemon"]))
    d, td = _timed("(d) idle sockets", lambda: idle_sockets(**sizes["sockets"]))
    e, te = _timed("(e) Kick chat end to end", lambda: bench_kick.run(**sizes["kick"]))
    f, tf = _timed("(f) min_replicas_acked 0 / 1", lambda: bench_replicas.run(**sizes["replicas"]))
    g, tg = _timed("(g) chat storage", lambda: bench_storage.run(**sizes["storage"]))
    h, th = _timed("(h) alert latency", lambda: bench_alerts.run(**sizes["alerts"]))
    rows = table(a, a_full, b, c, d, e, f, g, h)
    total = time.monotonic() - started

    print(f"lumio-ingestd benchmarks: {info['nproc']} CPUs ({info['cpu_model']}), {info['ram_gib']} GiB RAM, "
          f"Linux {info['kernel']}, Python {info['python']}, PostgreSQL {info['postgresql']}, "
          f"Redis {info['redis']}")
    width = max(len(label) for label, _ in rows)
    print(f"{'measure':<{width}}  {'result':>22}")
    for label, value in rows:
        print(f"{label:<{width}}  {value:>22}")
    print(f"({total:.0f}s in all{'; --quick sizes' if args.quick else ''})")

    out = ROOT / "bench" / "results" / "summary.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "machine": info, "quick": args.quick,
        "seconds": {"a": ta, "a_full": ta_full, "b": tb, "c": tc, "d": td, "e": te, "f": tf, "g": tg,
                    "h": th, "total": total},
        "table": [{"measure": label.strip(), "result": value} for label, value in rows],
        "a_chat_end_to_end": a, "a_chat_end_to_end_full": a_full, "b_events": b, "c_shutdown": c,
        "d_idle_sockets": d, "e_kick_chat": e, "f_min_replicas_acked": f, "g_storage": g,
        "h_alert_latency": h,
    }, indent=2, default=str) + "\n")
    print(f"written to {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
