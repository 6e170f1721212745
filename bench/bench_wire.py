"""Chat end to end from the wire: WebSocket frames on loopback to committed rows, beside the raw limits.

    .venv/bin/python bench/bench_wire.py [--messages 50000] [--runs 3] [--naive 5000]
        [--shape short|full]

Starts a private PostgreSQL and Redis (lumio_ingestd.devkit.servers, as the tests
do) and the stand-in Twitch in a process of its own (bench/standin_server.py:
a load generator in this process would share the GIL with what is measured).
A real `TwitchSource` subscribes to it, with the real `ChatQueue`,
`ChatIngest` (pipelined RPUSH into Redis) and a running `ChatFlusher`
(COPY into `chat_messages` every 0.2 s), wired as the daemon wires them
(`Pipeline`, which bench_wire_sockets.py uses too). Each run:

- end to end: the stand-in sends N `channel.chat.message` notifications as
  fast as its socket takes them; the clock runs from the command until the
  flusher has committed the last of them (rows checked after), and so does
  this process's CPU (user + system, every thread: the pipeline runs here,
  the stand-in in its own process), reported per message;
- the raw limits, on the very frames of that run: `json.loads` of each frame;
  RPUSH of their entries in pipelined batches of 200 (what a source's queue
  hands over at once); one `COPY chat_messages FROM STDIN` of their rows; and
  a naive baseline, one autocommitted INSERT per message (on `--naive` of them);
- one round of the single-thread floor (`floor_round`) on the same frames:
  the CPU per message of each step with no thread beside it.

Then, over the runs: the floor (`single_thread_floor`, each step's median),
the highest end to end / parse + extract ratio it leaves, the floor-limited
rate, 1e6 / floor (the messages a second one thread would reach doing nothing
but this pipeline's work), and end to end against it: the median of each
run's ratio to the floor measured right after it (this machine's speed
drifts by a third within minutes, so a floor measured once beside three runs
moved that ratio from 0.64 to 0.92 between two runs of this script).

`--shape` picks the frames (bench/standin_server.py, `SHAPES`): "short", one
text fragment and one badge in spaced JSON (~1.4 KB, the frames of earlier
figures), or "full", a busy channel's message with emote and mention
fragments, three badges and a reply, compact as Twitch sends it (~2.2 KB).
Every measure of a run is on that shape's frames.

Prints a table and writes bench/results/bench_wire.json (bench_wire_full.json
for the full shape). Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _paths import write_result  # noqa: E402 - first: it sets up sys.path
from bench_chat import check_stored, raw_copy, truncate  # noqa: E402
from standin_server import SHAPES, StandinProcess  # noqa: E402

from lumio_ingestd.chat.flusher import flush_threads  # noqa: E402
from lumio_ingestd.chat.ingest import ChatIngest, ChatQueue  # noqa: E402
from lumio_ingestd.config import Config, TimescaleConfig, load  # noqa: E402
from lumio_ingestd.db.migrate import migrate  # noqa: E402
from lumio_ingestd.db.pool import Pool  # noqa: E402
from lumio_ingestd.devkit.servers import PostgresServer, RedisServer, wait_until  # noqa: E402
from lumio_ingestd.devkit.standins.twitch import TwitchStandin  # noqa: E402
from lumio_ingestd.events.persist import EventIngest  # noqa: E402
from lumio_ingestd.metrics import Metrics  # noqa: E402
from lumio_ingestd.model import CHAT_COLUMNS, ChatMessage  # noqa: E402
from lumio_ingestd.runtime import gcpolicy  # noqa: E402
from lumio_ingestd.sources import SourceDeps  # noqa: E402
from lumio_ingestd.sources.twitch import build as build_twitch  # noqa: E402
from lumio_ingestd.sources.twitch.mapping import interpret  # noqa: E402
from lumio_ingestd.sources.ws import _FrameReader  # noqa: E402
from lumio_ingestd.stores.redisclient import connect  # noqa: E402
from lumio_ingestd.stores.seen import SeenDeliveries  # noqa: E402
from lumio_ingestd.stores.sessions import StreamSessions  # noqa: E402
from support import write_ini  # noqa: E402

REDIS_BATCH = 200  # ChatQueue's max_batch: what one source hands to Redis at once
FLUSH_INTERVAL = 0.2


def broadcaster(account_id: int) -> str:
    """The Twitch user id of bench account `account_id`."""
    return str(777_000 + account_id)


def prepare_chat(standin: StandinProcess, n: int, broadcasters: list[str], shape: str,
                 path: Path | None = None) -> float:
    """The stand-in's frames for the next blast: `n` per broadcaster, of `shape`
    (written to `path` too, when given); returns their mean payload bytes."""
    reply = standin.call("prepare_chat", n=n, broadcasters=broadcasters, shape=shape,
                         path=str(path) if path is not None else None)
    if not reply["ok"]:
        raise SystemExit(reply.get("error") or f"the stand-in has no session for {reply['missing']}")
    return float(reply["bytes_per_frame"])


def process_cpu_secs() -> float:
    """This process's CPU time so far, user + system, every thread."""
    times = os.times()
    return times.user + times.system


def write_config(tmp: Path, pg: PostgresServer, rds: RedisServer, standin: dict[str, Any], *,
                 accounts: int = 1, shard: str = "0/1", instance_id: str = "bench-wire",
                 extra: dict[str, dict[str, object]] | None = None) -> Path:
    """An ingestd.ini in `tmp` for accounts 1..`accounts`, each with a token file of its own
    (`extra`: more sections)."""
    tmp.mkdir(parents=True, exist_ok=True)
    secret = tmp / "client_secret"
    secret.write_text(standin["client_secret"] + "\n")
    sections: dict[str, dict[str, object]] = {
        "daemon": {"state_dir": tmp / "state", "instance_id": instance_id, "shard": shard},
        "redis": {"url": rds.url},
        "timescale": {"dsn": pg.url("postgres")},
        "chat": {"flush_interval_secs": FLUSH_INTERVAL},
        "twitch": {"eventsub_ws_url": standin["ws_url"], "helix_url": standin["helix_url"],
                   "oauth_url": standin["oauth_url"], "client_id": standin["client_id"],
                   "client_secret_file": secret},
    }
    for i in range(1, accounts + 1):
        token = tmp / f"token-{i}.json"
        token.write_text(json.dumps({"access_token": standin["access_token"],
                                     "refresh_token": standin["refresh_token"]}))
        sections[f"account.{i}"] = {"twitch_user_id": broadcaster(i), "twitch_token_file": token}
    sections.update(extra or {})
    return write_ini(tmp / "ingestd.ini", sections)


class Pipeline:
    """Chat from Twitch sockets to committed rows, made as `runtime.build` makes it.

    `twitch.build` gives one `TwitchSource` per account of this config's
    shard, each with a `ChatQueue` of its own over the one `ChatIngest`; the
    `flush_threads` cover the shard's accounts. No spool (the servers stay up),
    no alerts. Nothing runs until `start()`.
    """

    def __init__(self, cfg: Config) -> None:
        self.metrics = metrics = Metrics()
        self.pool = pool = Pool(cfg.timescale)
        self.client = client = connect(cfg.redis)
        chat = ChatIngest(client, pool, None, metrics, cfg)
        events = EventIngest(client, pool, None, metrics, cfg)
        seen = SeenDeliveries(client, "twitch")
        twitch = build_twitch(cfg, SourceDeps(
            metrics=metrics, chat_queue=lambda name: ChatQueue(chat, metrics),
            persist_chat=chat.buffer_or_persist, persist_event=events.persist_event, alerts=None,
            sessions=StreamSessions(pool, metrics), seen=lambda platform: seen))
        self.sources = twitch.sources
        #: False: the flushers own no account (they leave a floor round's buffers alone).
        self.flushing = True
        self.flushers = flush_threads(client, pool, metrics, cfg,
                                      owns=lambda account: self.flushing and cfg.owns(account))
        self.broadcasters = [a.twitch_user_id for a in cfg.accounts
                             if a.twitch_user_id is not None and cfg.owns(a.account_id)]

    def start(self) -> None:
        gcpolicy.apply()  # as the daemon does once it is built (`lumio-ingestd run`)
        for flusher in self.flushers:
            flusher.start()
        for source in self.sources:
            source.start()

    def flushed(self) -> float:
        """chat_messages_flushed_total, read from its counter alone.

        Polled every few ms while the clock runs: `registry.get_sample_value`
        collects every metric of the registry, which with 16 sources took
        ~7 % of the interpreter lock from the pipeline being measured.
        """
        for metric in self.metrics.chat_messages_flushed.collect():
            for sample in metric.samples:
                if sample.name == "chat_messages_flushed_total":
                    return float(sample.value)
        return 0.0

    def close(self) -> None:
        for source in self.sources:
            source.request_stop()
        for flusher in self.flushers:
            flusher.request_stop()
        for source in self.sources:
            source.join(10)
        for flusher in self.flushers:
            flusher.join(10)
        self.pool.close()
        self.client.close()


@contextmanager
def servers(tmp: Path) -> Iterator[tuple[PostgresServer, RedisServer]]:
    """A private PostgreSQL (migrated) and Redis under `tmp`, stopped on the way out."""
    pg = PostgresServer(tmp / "pg")
    rds = RedisServer(tmp / "redis")
    try:
        pg.start()
        rds.start()
        migrate(TimescaleConfig(dsn=pg.url("postgres")))
        yield pg, rds
    finally:
        rds.close()
        pg.close()


def json_parse_rate(frames: list[str]) -> float:
    started = time.perf_counter()
    for frame in frames:
        json.loads(frame)
    return len(frames) / (time.perf_counter() - started)


def parse_extract_rate(frames: list[str]) -> float:
    """One thread: each frame parsed, mapped and sanitized into its row (`interpret`)."""
    started = time.perf_counter()
    for frame in frames:
        interpret(1, frame)
    return len(frames) / (time.perf_counter() - started)


def _cpu_us_per(n: int, step: Callable[[], object]) -> float:
    """This thread's CPU (user + system) per message for `step`, in microseconds."""
    started = time.thread_time()
    step()
    return (time.thread_time() - started) / n * 1e6


def single_thread_floor(rounds: list[dict[str, float]]) -> dict[str, float]:
    """CPU per message (us) of each step of the pipeline, on this one thread, nothing else running.

    One round (`floor_round`) after each end-to-end run, on that run's frames:
    the machine's speed drifts within minutes, and the end to end / floor
    ratio must set each against the other measured at the same time. A
    `Pipeline` of the same config, built and never started: its source and
    its first flusher are driven from here, one step after the other, on the
    run's frames. The steps: parse + extract (`interpret`, the reference of the
    ratio); the frame read (`_FrameReader` on a buffer holding the frames'
    wire bytes: the socket reads and the read loop are left out); the rest of the source
    (`_dispatch`: dedup, the subscription check, the queue, the entry and the
    pipelined RPUSH; its own parse + extract taken off); the flusher (claim,
    COPY lines, COPY, commit, finish; its waits on PostgreSQL and Redis are
    not CPU and are left out). Each step's median of the rounds, every
    round on a new pipeline and an empty table (the live pipeline's flushers
    own no account meanwhile, and its source has nothing to read). Their sum, `floor`, is what
    one message costs the interpreter lock with no second thread to hand it
    to, so `parse_extract / floor` is the highest end to end / parse +
    extract ratio this code reaches on this machine: threads only add to it.
    """
    out = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    out["ceiling_ratio"] = out["parse_extract"] / out["floor"]
    return out


def floor_round(cfg: Config, pg: PostgresServer, frames: list[str]) -> dict[str, float]:
    truncate(pg)  # the end-to-end runs (or the last round) stored these very messages
    pipeline = Pipeline(cfg)
    try:
        source, flusher = pipeline.sources[0], pipeline.flushers[0]
        n = len(frames)
        data = [f.encode() for f in frames]
        reader = _FrameReader(None)  # type: ignore[arg-type] # never reads: the buffer holds it all
        reader._buf += b"".join(TwitchStandin.encode_bulk(frames))

        def dispatch_all() -> None:
            for d in data:
                source.client._dispatch(d, None)  # type: ignore[arg-type] # only control frames use it
            source.release()

        def flush_all() -> None:
            while pipeline.flushed() < n:
                flusher.tick()

        out = {"parse_extract": _cpu_us_per(n, lambda: [interpret(1, f) and None for f in frames]),
               "frame_read": _cpu_us_per(n, lambda: [reader.message(0.0) and None for _ in data]),
               "source": _cpu_us_per(n, dispatch_all),
               "flush": _cpu_us_per(n, flush_all)}
        check_stored(pg, n)
    finally:
        pipeline.close()
    out["source_rest"] = out.pop("source") - out["parse_extract"]
    out["floor"] = out["parse_extract"] + out["frame_read"] + out["source_rest"] + out["flush"]
    return out


def redis_pipeline_rate(rds: RedisServer, msgs: list[ChatMessage]) -> float:
    entries = [m.to_entry() for m in msgs]
    client = rds.client(socket_timeout=30)
    try:
        client.delete("bench:pipeline")
        started = time.perf_counter()
        for i in range(0, len(entries), REDIS_BATCH):
            pipe = client.pipeline(transaction=False)
            pipe.rpush("bench:pipeline", *entries[i:i + REDIS_BATCH])
            pipe.execute()
        rate = len(entries) / (time.perf_counter() - started)
        client.delete("bench:pipeline")
    finally:
        client.close()
    return rate


def naive_insert_rate(pg: PostgresServer, msgs: list[ChatMessage]) -> float:
    """The baseline a first version would write: one INSERT per message, each its own commit."""
    truncate(pg)
    sql = (f"INSERT INTO chat_messages ({', '.join(CHAT_COLUMNS)}) "
           f"VALUES ({', '.join(['%s'] * len(CHAT_COLUMNS))})")
    conn = pg.connect("postgres")  # autocommit
    try:
        with conn.cursor() as cur:
            started = time.perf_counter()
            for msg in msgs:
                cur.execute(sql, msg.row())
            elapsed = time.perf_counter() - started
    finally:
        conn.close()
    return len(msgs) / elapsed


def raw_limits(pg: PostgresServer, rds: RedisServer, frames_path: Path, naive: int) -> dict[str, float]:
    """The raw limits on a run's frames (read back from where the stand-in wrote them); the
    frames and messages are this function's own, gone when it returns."""
    frames = frames_path.read_text().splitlines()
    msgs = [item.chat for f in frames for item in interpret(1, f).items if item.chat is not None]
    return {"json_parse": json_parse_rate(frames), "parse_extract": parse_extract_rate(frames),
            "redis_pipeline": redis_pipeline_rate(rds, msgs), "copy": raw_copy(pg, msgs),
            "naive_insert": naive_insert_rate(pg, msgs[:naive])}


def run(messages: int = 50_000, runs: int = 3, naive: int = 5_000, shape: str = "short") -> dict[str, Any]:
    """Every measure of (a) on `shape`'s frames, `runs` times; medians in "median"."""
    per_run: list[dict[str, float]] = []
    rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-wire-") as tmpdir, servers(Path(tmpdir)) as (pg, rds):
        tmp = Path(tmpdir)
        standin = StandinProcess()
        try:
            cfg = load(str(write_config(tmp, pg, rds, standin.info)), {})
            pipeline = Pipeline(cfg)
            pipeline.start()
            try:
                if not standin.call("wait_sessions", n=1, timeout=30)["ok"]:
                    raise SystemExit("the source did not subscribe to the stand-in")
                for r in range(runs):
                    truncate(pg)
                    frames_path = tmp / f"frames-{r}.txt"
                    bytes_per_frame = prepare_chat(standin, messages, [broadcaster(1)], shape, frames_path)
                    base = pipeline.flushed()

                    def all_flushed(b: float = base) -> bool:
                        return pipeline.flushed() >= b + messages

                    # What this process made since the pipeline started (the last run's
                    # raw limits: ~10^5 objects) would be walked by the collections of the
                    # pipeline's garbage, which the daemon's heap never holds (run 3 measured
                    # 0.7 x run 1): freed, and the rest frozen as the daemon's start-up is.
                    gc.collect()
                    gc.freeze()
                    cpu_started = process_cpu_secs()
                    started = time.perf_counter()
                    sent = standin.call("blast")
                    if not wait_until(all_flushed, 600, interval=0.005):
                        raise SystemExit("the flusher did not store every message")
                    elapsed = time.perf_counter() - started
                    cpu = process_cpu_secs() - cpu_started
                    check_stored(pg, messages)
                    per_run.append({
                        "end_to_end": messages / elapsed,
                        "standin_send": sent["sent"] / sent["seconds"],
                        **raw_limits(pg, rds, frames_path, naive),
                        "cpu_us_per_message": cpu / messages * 1e6,
                        "bytes_per_frame": bytes_per_frame,
                    })
                    pipeline.flushing = False
                    try:
                        rounds.append(floor_round(cfg, pg, frames_path.read_text().splitlines()))
                    finally:
                        pipeline.flushing = True
                    # Each run's end to end against the floor measured right after it.
                    per_run[-1]["end_to_end_to_floor_limited"] = (
                        per_run[-1]["end_to_end"] * rounds[-1]["floor"] / 1e6)
                    print(f"  (a) {shape} frames, run {r + 1}/{runs}: end to end "
                          f"{per_run[-1]['end_to_end']:,.0f}/s", file=sys.stderr, flush=True)
            finally:
                pipeline.close()
            floor = single_thread_floor(rounds)
        finally:
            standin.close()
    median = {key: statistics.median(r[key] for r in per_run) for key in per_run[0]}
    floor_limited = 1e6 / floor["floor"]
    return {"shape": shape, "bytes_per_frame": median["bytes_per_frame"],
            "messages_per_run": messages, "runs": runs, "naive_messages": min(naive, messages),
            "redis_batch": REDIS_BATCH, "flush_interval_secs": FLUSH_INTERVAL, "per_run": per_run,
            "median": median, "cpu_us_per_message": median["cpu_us_per_message"],
            "single_thread_floor_us": floor, "floor_limited_rate": floor_limited,
            "ratio_end_to_end_to_copy": median["end_to_end"] / median["copy"],
            "ratio_end_to_end_to_parse_extract": median["end_to_end"] / median["parse_extract"],
            "ratio_end_to_end_to_floor_limited": median["end_to_end_to_floor_limited"]}


def result_name(name: str, shape: str) -> str:
    """A result file's name: bench/results/NAME.json for the short shape, NAME_SHAPE.json for another."""
    return name if shape == "short" else f"{name}_{shape}"


ROWS = (
    ("end_to_end", "WebSocket frames -> committed rows (TwitchSource, Redis, flusher)"),
    ("standin_send", "the stand-in's own send rate (its process)"),
    ("json_parse", "json.loads of the same frames"),
    ("parse_extract", "parse + extract the row's fields of the same frames, one thread"),
    ("redis_pipeline", f"RPUSH of their entries, pipelined batches of {REDIS_BATCH}"),
    ("copy", "one COPY of their rows into chat_messages"),
    ("naive_insert", "naive: one INSERT per message, autocommit"),
)

FLOOR_ROWS = (
    ("parse_extract", "single thread, CPU us/msg: parse + extract"),
    ("frame_read", "  + the frame read from a buffer"),
    ("source_rest", "  + the rest of the source (dedup, queue, entry, RPUSH)"),
    ("flush", "  + the flusher (claim, COPY lines, COPY, commit, finish)"),
    ("floor", "  = the floor: one message, no second thread"),
    ("ceiling_ratio", "highest end to end / parse + extract (parse + extract / floor)"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--naive", type=int, default=5_000)
    parser.add_argument("--shape", choices=tuple(SHAPES), default="short",
                        help="the chat frames (bench/standin_server.py, SHAPES)")
    args = parser.parse_args()
    result = run(args.messages, args.runs, args.naive, args.shape)
    title = f"chat, {args.shape} frames, messages/s (median of {args.runs})"
    print(f"{title:<68}{'value':>12}")
    for key, label in ROWS:
        print(f"{label:<68}{result['median'][key]:>12,.0f}")
    print(f"{'bytes per frame (payload, before WebSocket framing)':<68}{result['bytes_per_frame']:>12,.0f}")
    print(f"{'process CPU us per message, end to end (user + system)':<68}"
          f"{result['cpu_us_per_message']:>12.1f}")
    print(f"{'ratio end to end / COPY':<68}{result['ratio_end_to_end_to_copy']:>12.2f}")
    print(f"{'ratio end to end / parse + extract':<68}"
          f"{result['ratio_end_to_end_to_parse_extract']:>12.2f}")
    for key, label in FLOOR_ROWS:
        print(f"{label:<68}{result['single_thread_floor_us'][key]:>12.2f}")
    print(f"{'floor-limited rate, messages/s (1e6 / floor)':<68}{result['floor_limited_rate']:>12,.0f}")
    print(f"{'ratio end to end / floor-limited rate':<68}"
          f"{result['ratio_end_to_end_to_floor_limited']:>12.2f}")
    write_result(result_name("bench_wire", args.shape), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
