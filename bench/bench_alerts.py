"""Alert latency: an event's frame written to its socket -> its alert on Redis and on the SSE stream.

    .venv/bin/python bench/bench_alerts.py [--idle 100] [--load 300] [--rate 10] [--shape full]

The real daemon (`lumio-ingestd run`, a process of its own, as systemd runs it)
with two Twitch accounts on a stand-in Twitch (this script with `--standin`, a
process of its own: a load generator in the daemon's process would share its
GIL). Account 1's socket is flooded with chat as fast as the daemon reads it;
account 2 receives `channel.cheer` notifications at `--rate` a second. This
process subscribes to `lumio:alerts:{2}` on Redis and to the daemon's SSE
stream of account 2, and takes the time each cheer's alert arrives. The
stand-in takes the time just before it writes each cheer's frame; both clocks
are CLOCK_MONOTONIC, shared by every process of the machine.

Two windows in one run: idle (no chat, `--idle` cheers) and under load (the
flood running, `--load` cheers, after a second for the flood to reach its
rate). Reported for each: p50, p99 and max of the latency on each path, the
alerts that did not arrive, and the chat rate the daemon stored meanwhile.
At the end every cheer must be stored once and every flooded message once
(the run fails otherwise).

Prints a table and writes bench/results/bench_alerts.json. Not a test:
nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _child import JsonLinesChild  # noqa: E402
from _paths import write_result  # noqa: E402 - first: it sets up sys.path
from bench_wire import broadcaster, servers, write_config  # noqa: E402
from standin_server import chat_frames, reply, serve_standin  # noqa: E402

from lumio_ingestd.devkit.servers import PostgresServer, RedisServer, wait_until  # noqa: E402
from lumio_ingestd.devkit.standins import twitch_events as te  # noqa: E402
from lumio_ingestd.devkit.standins.twitch import StandinSession, TwitchStandin  # noqa: E402
from lumio_ingestd.events.alerts import alerts_channel  # noqa: E402
from support.daemon import Daemon, NotifySocket  # noqa: E402

FLOODED, ALERTED = 1, 2  # the accounts
EMIT_TOKEN = "bench-alerts-token"
CHAT, CHEER = "channel.chat.message", "channel.cheer"
FLOOD_CHUNK = 256  # frames per sendall


# --------------------------------------------------------------------------- the stand-in side


class Flood:
    """Chat on one session as fast as its socket takes it, until stopped.

    Frames are filled into a template: one frame of `shape` built as the
    stand-in builds them (standin_server.py, `chat_frames`), its two message
    ids (the delivery's and the chat message's, uuids) cut out and replaced by
    ids of the same width per message. Building each frame anew
    would cost this process ~20 us a message, taken from the two cores the
    daemon runs on.
    """

    def __init__(self, standin: TwitchStandin, session: StandinSession, broadcaster_id: str,
                 shape: str) -> None:
        self._standin, self._session = standin, session
        text = chat_frames(standin, session, broadcaster_id, 1, shape)[0]
        frame = json.loads(text)
        head, rest = text.split(frame["metadata"]["message_id"])
        middle, tail = rest.split(frame["payload"]["event"]["message_id"])
        wire = TwitchStandin.encode_bulk([text])[0]
        self._parts = (wire[:len(wire) - len(text.encode())] + head.encode(), middle.encode(), tail.encode())
        self.bytes_per_frame = len(text.encode())
        self._run = uuid.uuid4().hex[:8]
        self.sent = 0
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="bench-flood")

    def _frames(self, first: int, n: int) -> list[bytes]:
        start, middle, tail = self._parts
        out = []
        for i in range(first, first + n):
            ident = f"{self._run}-0000-4000-8000-{i:012x}".encode()
            out.append(b"".join((start, ident, middle, ident, tail)))
        return out

    def _main(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            chunk = self._frames(self.sent, FLOOD_CHUNK)
            written = self._standin.send_bulk(self._session, chunk)
            self.sent += written
            if written < len(chunk):
                break  # the session closed
        self.seconds = time.monotonic() - started

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def send_cheers(standin: TwitchStandin, session: StandinSession, broadcaster_id: str, n: int,
                rate: float) -> list[dict[str, Any]]:
    """`n` cheers at `rate` a second; each one's delivery id and the time just before its write."""
    sent: list[dict[str, Any]] = []
    pause = threading.Event()
    started = time.monotonic()
    for i in range(n):
        pause.wait(max(0.0, started + i / rate - time.monotonic()))
        delivery = str(uuid.uuid4())
        text = json.dumps(standin.notification(
            session, CHEER, te.cheer_event(str(300_000 + i), 100, broadcaster=broadcaster_id),
            message_id=delivery), separators=(",", ":"))
        at = time.monotonic()
        if not standin.send_raw(session, text):
            raise SystemExit("the stand-in's cheer session closed")
        sent.append({"id": delivery, "at": at})
    return sent


def standin_main() -> int:
    """Child side, one JSON object per line:

        -> {"ws_url", ...}                                 the stand-in's addresses and secrets
        <- {"cmd": "wait_subscribed", "chat", "cheer", "timeout"}
                                                           -> {"ok"}: the broadcaster "chat" has a
                                                              session subscribed to chat, "cheer" one
                                                              subscribed to cheers
        <- {"cmd": "flood", "broadcaster", "shape"}        -> {"ok", "bytes_per_frame"}: started
        <- {"cmd": "cheers", "broadcaster", "n", "rate"}   -> {"sent": [{"id", "at"}]}: when done
        <- {"cmd": "stop_flood"}                           -> {"sent", "seconds"}
        <- {"cmd": "quit"}
    """
    standin = serve_standin(60.0)
    flood: Flood | None = None
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["cmd"] == "wait_subscribed":
                # The subscriptions are made one by one: wait for the two this run uses.
                def subscribed(chat: str = cmd["chat"], cheer: str = cmd["cheer"]) -> bool:
                    return (standin.active_session(CHAT, chat) is not None
                            and standin.active_session(CHEER, cheer) is not None)

                # Polled: `wait_for` holds the stand-in's lock, which `active_session` takes.
                reply({"ok": wait_until(subscribed, float(cmd["timeout"]), interval=0.05)})
            elif cmd["cmd"] == "flood":
                session = standin.active_session(CHAT, cmd["broadcaster"])
                if session is None:
                    raise SystemExit(f"no chat session for {cmd['broadcaster']}")
                flood = Flood(standin, session, cmd["broadcaster"], cmd["shape"])
                flood.start()
                reply({"ok": True, "bytes_per_frame": flood.bytes_per_frame})
            elif cmd["cmd"] == "cheers":
                session = standin.active_session(CHEER, cmd["broadcaster"])
                if session is None:
                    raise SystemExit(f"no cheer session for {cmd['broadcaster']}")
                reply({"sent": send_cheers(standin, session, cmd["broadcaster"], int(cmd["n"]),
                                            float(cmd["rate"]))})
            elif cmd["cmd"] == "stop_flood":
                assert flood is not None
                flood.stop()
                reply({"sent": flood.sent, "seconds": flood.seconds})
            elif cmd["cmd"] == "quit":
                break
    finally:
        if flood is not None:
            flood.stop()
        standin.close()
    return 0


class AlertStandin(JsonLinesChild):
    def __init__(self) -> None:
        super().__init__(Path(__file__).resolve(), "--standin", what="the stand-in process")
        self.info = self.read()


# --------------------------------------------------------------------------- this process: the alerts


class Arrivals:
    """When each alert arrived, by the event's external id (its delivery id), on one path."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.at: dict[str, float] = {}
        self._lock = threading.Lock()
        self.stop = threading.Event()

    def record(self, data: bytes, at: float) -> None:
        external_id = json.loads(data)["external_id"]
        with self._lock:
            self.at.setdefault(external_id, at)

    def get(self, external_id: str) -> float | None:
        with self._lock:
            return self.at.get(external_id)


def redis_listener(rds: RedisServer, arrivals: Arrivals) -> Callable[[], None]:
    client = rds.client()
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(alerts_channel(ALERTED))

    def run() -> None:
        try:
            while not arrivals.stop.is_set():
                message = pubsub.get_message(timeout=0.2)
                if message is not None and message["type"] == "message":
                    arrivals.record(message["data"], time.monotonic())
        finally:
            pubsub.close()
            client.close()

    return run


def sse_listener(port: int, arrivals: Arrivals) -> Callable[[], None]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"GET /v1/accounts/{ALERTED}/alerts/stream HTTP/1.1\r\nHost: bench\r\n"
                 f"Authorization: Bearer {EMIT_TOKEN}\r\n\r\n".encode())
    sock.settimeout(0.2)

    def run() -> None:
        buffer = b""
        try:
            while not arrivals.stop.is_set():
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    return
                at = time.monotonic()
                buffer += data
                *messages, buffer = buffer.split(b"\n\n")
                for message in messages:
                    for line in message.split(b"\n"):
                        if line.startswith(b"data: "):
                            arrivals.record(line[6:], at)
        finally:
            sock.close()

    return run


def _ms(values: list[float], q: float) -> float:
    """The `q` quantile (nearest rank), in ms: of 100 values the p99 is the 99th, not the max."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1000


def latencies(sent: list[dict[str, Any]], paths: list[Arrivals]) -> dict[str, Any]:
    out: dict[str, Any] = {"events": len(sent)}
    for path in paths:
        took = [at - s["at"] for s in sent if (at := path.get(s["id"])) is not None]
        out[path.name] = {"p50_ms": statistics.median(took) * 1000 if took else None,
                          "p99_ms": _ms(took, 0.99) if took else None,
                          "max_ms": max(took) * 1000 if took else None,
                          "missing": len(sent) - len(took)}
    # Each event's own times (monotonic s), for a look at the slow ones.
    out["samples"] = [[s["id"], s["at"], *(path.get(s["id"]) for path in paths)] for s in sent]
    return out


def _count(pg: PostgresServer, sql: str) -> int:
    conn = pg.connect("postgres")
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def run(idle: int = 100, load: int = 300, rate: float = 10.0, shape: str = "full",
        code: Path | None = None) -> dict[str, Any]:
    """One daemon, the idle window then the loaded one; `code`: another checkout's daemon."""
    with tempfile.TemporaryDirectory(prefix="bench-alerts-") as tmpdir, servers(Path(tmpdir)) as (pg, rds):
        tmp = Path(tmpdir)
        standin = AlertStandin()
        notify = NotifySocket()
        try:
            token = tmp / "emit_token"
            token.write_text(EMIT_TOKEN + "\n")
            config = write_config(tmp, pg, rds, standin.info, accounts=2, instance_id="bench-alerts",
                                  extra={"http": {"listen": "127.0.0.1:0", "emit_token_file": token},
                                         "metrics": {"listen": "127.0.0.1:0"}})
            with Daemon(config, tmp / "daemon.log", notify=notify, code=code) as daemon:
                notify.wait_for("READY=1", 60)
                http_port, _ = daemon.ports()
                if not standin.call("wait_subscribed", chat=broadcaster(FLOODED),
                                    cheer=broadcaster(ALERTED), timeout=60)["ok"]:
                    raise SystemExit("the daemon's two sources did not subscribe to the stand-in")
                paths = [Arrivals("redis"), Arrivals("sse")]
                threads = [threading.Thread(target=redis_listener(rds, paths[0]), name="bench-redis-sub"),
                           threading.Thread(target=sse_listener(http_port, paths[1]), name="bench-sse")]
                for t in threads:
                    t.start()
                try:
                    # The SSE client is registered once its first alert arrives: a warm-up cheer.
                    warm = standin.call("cheers", broadcaster=broadcaster(ALERTED), n=1, rate=rate)["sent"]
                    if not wait_until(lambda: all(p.get(warm[0]["id"]) for p in paths), 30):
                        raise SystemExit("the warm-up alert did not arrive on both paths")
                    print(f"  (h) idle: {idle} cheers at {rate:g}/s", file=sys.stderr, flush=True)
                    idle_sent = standin.call("cheers", broadcaster=broadcaster(ALERTED), n=idle,
                                             rate=rate)["sent"]
                    print(f"  (h) under load: {load} cheers at {rate:g}/s, account {FLOODED} flooded",
                          file=sys.stderr, flush=True)
                    chat_before = _count(pg, "SELECT count(*) FROM chat_messages")
                    flood = standin.call("flood", broadcaster=broadcaster(FLOODED), shape=shape)
                    threading.Event().wait(1.0)  # the flood reaches its rate
                    chat_from, t_from = _count(pg, "SELECT count(*) FROM chat_messages"), time.monotonic()
                    load_sent = standin.call("cheers", broadcaster=broadcaster(ALERTED), n=load,
                                             rate=rate)["sent"]
                    chat_to, t_to = _count(pg, "SELECT count(*) FROM chat_messages"), time.monotonic()
                    flooded = standin.call("stop_flood")
                    every = [*warm, *idle_sent, *load_sent]
                    wait_until(lambda: all(p.get(s["id"]) for p in paths for s in every), 10)
                finally:
                    for p in paths:
                        p.stop.set()
                    for t in threads:
                        t.join(10)
                stored = chat_before + flooded["sent"]
                if not wait_until(lambda: _count(pg, "SELECT count(*) FROM chat_messages") >= stored, 300):
                    raise SystemExit("the daemon did not store every flooded message")
        finally:
            notify.close()
            standin.close()
        rows = _count(pg, "SELECT count(*) FROM chat_messages")
        distinct = _count(pg, "SELECT count(DISTINCT message_id) FROM chat_messages")
        cheers = _count(pg, f"SELECT count(*) FROM events WHERE account_id = {ALERTED}")
        cheer_ids = _count(pg, f"SELECT count(DISTINCT external_id) FROM events WHERE account_id = {ALERTED}")
        if (rows, distinct) != (stored, stored) or (cheers, cheer_ids) != (len(every), len(every)):
            raise SystemExit(f"not stored exactly once: chat {rows} rows / {distinct} distinct of "
                             f"{stored} sent; cheers {cheers} / {cheer_ids} of {len(every)}")
    return {"rate_per_sec": rate, "shape": shape, "bytes_per_frame": flood["bytes_per_frame"],
            "idle": latencies(idle_sent, paths), "load": latencies(load_sent, paths),
            "flood": {"sent": flooded["sent"], "seconds": flooded["seconds"],
                      "stored_per_sec": (chat_to - chat_from) / (t_to - t_from)},
            "stored": {"chat": rows, "cheers": cheers}}


def rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The table's rows, shared by `main` and run_all's (h)."""
    out = []
    loaded = f"under load ({result['flood']['stored_per_sec']:,.0f} chat/s)"
    for window in ("idle", "load"):
        for path in ("redis", "sse"):
            r = result[window][path]
            label = "idle" if window == "idle" else loaded
            out.append((f"    {label}, {'Redis' if path == 'redis' else 'SSE'}: p50 / p99 / max",
                        f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f} / {r['max_ms']:.1f} ms"))
            if r["missing"]:
                out.append((f"      alerts that did not arrive ({path})", f"{r['missing']}"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=100)
    parser.add_argument("--load", type=int, default=300)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--shape", choices=("short", "full"), default="full")
    parser.add_argument("--code", type=Path, help="run the daemon of this checkout (to compare two)")
    parser.add_argument("--standin", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.standin:
        return standin_main()
    logging.basicConfig(level=logging.ERROR)
    result = run(args.idle, args.load, args.rate, args.shape, args.code)
    print(f"alert latency, frame written -> alert received, {args.rate:g} cheers/s "
          f"({result['shape']} chat frames, {result['bytes_per_frame']} B)")
    for label, value in rows(result):
        print(f"{label:<60}{value:>26}")
    write_result("bench_alerts", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
