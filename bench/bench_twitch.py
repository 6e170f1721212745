"""Benchmark of the Twitch path: socket to rows, hand-off time, and alerts under a stalled client.

    .venv/bin/python bench/bench_twitch.py [--chat 5000] [--events 500] [--alert-events 1000]

Starts its own private PostgreSQL and Redis through tests/support/harness and the
stand-in Twitch (lumio_ingestd/devkit/standins/twitch.py), and measures:

- socket to rows: chat notifications and events sent by the stand-in, until
  every one is a row (chat through the queue, Redis and the flusher; events
  inline), in notifications per second;
- the session_reconnect hand-off: from the reconnect message to the old
  socket closed by the source, and whether anything was lost or doubled;
- ingest with live alerts: `persist` + `publish` per event, alone and with
  a stream client that never reads (it is dropped), p50/p99 per event.

Prints a table and writes bench/results/bench_twitch.json. Not a test: no
thresholds here.
"""

from __future__ import annotations

import argparse
import logging
import platform
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _paths import write_result  # noqa: E402 - first: it sets up sys.path

from lumio_ingestd.devkit.standins.twitch import StandinSession, TwitchStandin  # noqa: E402
from lumio_ingestd.events.alerts import STREAM_PATH, stream_handler  # noqa: E402
from lumio_ingestd.model import PlatformEvent  # noqa: E402
from lumio_ingestd.web.server import Routes  # noqa: E402
from support import twitch_frames as tf  # noqa: E402
from support.harness import PostgresServer, RedisServer  # noqa: E402
from support.harness.servers import wait_until  # noqa: E402
from support.http_client import serving  # noqa: E402
from support.twitch import EMIT_TOKEN, TwitchRig, make_rig  # noqa: E402


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]

    return {"n": len(ordered), "p50_ms": pct(50) * 1000, "p99_ms": pct(99) * 1000,
            "max_ms": ordered[-1] * 1000, "mean_ms": statistics.fmean(ordered) * 1000,
            "total_s": sum(ordered)}


def socket_to_rows(rig: TwitchRig, fake: TwitchStandin, n_chat: int, n_events: int) -> dict[str, Any]:
    session = fake.wait_session(1)
    if not fake.wait_for(lambda: len(session.subscriptions) == 11, 15):
        raise SystemExit("the source did not subscribe")
    every = max(1, n_chat // max(1, n_events))
    total_events = 0
    started = time.perf_counter()
    for i in range(n_chat):
        fake.notify("channel.chat.message", tf.chat_event(f"bench-{i}", f"message {i}"))
        if i % every == 0 and total_events < n_events:
            fake.notify("channel.cheer", tf.cheer_event(str(i)))
            total_events += 1
    sent = time.perf_counter() - started
    ok = wait_until(lambda: rig.rows("SELECT count(*) FROM chat_messages")[0][0] == n_chat and
                    rig.rows("SELECT count(*) FROM events")[0][0] == total_events, 300, interval=0.05)
    took = time.perf_counter() - started
    if not ok:
        raise SystemExit("socket to rows: not everything arrived")
    return {"chat": n_chat, "events": total_events, "send_seconds": sent, "seconds": took,
            "per_sec": (n_chat + total_events) / took}


def handoff(rig: TwitchRig, fake: TwitchStandin, rounds: int) -> dict[str, Any]:
    times = []
    lost = 0
    for r in range(rounds):
        old = fake.sessions[-1]
        before = len(fake.sessions)
        started = time.perf_counter()
        fake.reconnect(old)
        ids = [f"h{r}-{i}" for i in range(50)]
        for mid in ids:
            fake.notify("channel.chat.message", tf.chat_event(mid), session=old)
        def handed_off(b: int = before, o: StandinSession = old) -> bool:
            return len(fake.sessions) > b and not o.open

        def stored_once(i_: list[str] = ids) -> bool:
            return all(rig.chat_ids()[i] == 1 for i in i_)

        if not fake.wait_for(handed_off, 20):
            raise SystemExit("hand-off did not complete")
        times.append(time.perf_counter() - started)
        wait_until(stored_once, 30)
        lost += sum(1 for i in ids if rig.chat_ids()[i] != 1)
    return {**_stats(times), "lost_or_doubled": lost}


def alerts_under_a_stalled_client(rig: TwitchRig, n: int, payload_bytes: int) -> dict[str, Any]:
    def run(tag: str) -> list[float]:
        times = []
        for i in range(n):
            ev = PlatformEvent.new(account_id=42, platform="twitch", type="channel.cheer",
                                   payload={"n": i, "padding": "x" * payload_bytes},
                                   external_id=f"{tag}-{i}")
            started = time.perf_counter()
            if rig.sink.persist(ev).outcome != "stored":
                raise SystemExit("not stored")
            times.append(time.perf_counter() - started)
        return times

    alone = run("alone")
    routes = Routes()
    routes.add("GET", STREAM_PATH, stream_handler(rig.alerts, rig.cfg.http.emit_token, rig.metrics))
    with serving(routes, rig.metrics) as port:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(f"GET /v1/accounts/42/alerts/stream HTTP/1.0\r\nAuthorization: Bearer {EMIT_TOKEN}"
                     "\r\n\r\n".encode())
        wait_until(lambda: rig.alerts.client_count() == 1, 5)
        stalled = run("stalled")
        dropped = rig.value("http_alert_streams_dropped_total")
        sock.close()
    return {"payload_bytes": payload_bytes, "alone": _stats(alone), "stalled_client": _stats(stalled),
            "stalled_client_dropped": dropped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chat", type=int, default=5000)
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--handoffs", type=int, default=5)
    parser.add_argument("--alert-events", type=int, default=1000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    work = Path(tempfile.mkdtemp(prefix="bench-twitch-"))
    pg = PostgresServer(work / "pg")
    rd = RedisServer(work / "redis")
    results: dict[str, Any] = {"machine": {"python": platform.python_version(),
                                           "platform": platform.platform()}}
    try:
        pg.start()
        rd.start()
        with TwitchStandin(min_keepalive=10) as fake:
            rig = make_rig(work, pg.url(), rd.url, fake)
            try:
                rig.source().start()
                fake.wait_session(1)
                results["socket_to_rows"] = socket_to_rows(rig, fake, args.chat, args.events)
                results["handoff"] = handoff(rig, fake, args.handoffs)
                results["alerts"] = alerts_under_a_stalled_client(rig, args.alert_events, 16 * 1024)
            finally:
                rig.close()
    finally:
        pg.close()
        rd.close()

    s = results["socket_to_rows"]
    print(f"socket to rows: {s['chat']} chat + {s['events']} events in {s['seconds']:.2f}s "
          f"= {s['per_sec']:.0f}/s (sending took {s['send_seconds']:.2f}s)")
    h = results["handoff"]
    print(f"hand-off (reconnect message -> old socket closed): p50 {h['p50_ms']:.0f} ms, "
          f"max {h['max_ms']:.0f} ms over {h['n']}; lost or doubled: {h['lost_or_doubled']}")
    a = results["alerts"]
    print(f"{'persist + alert per event':<34}{'n':>6}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'total s':>9}")
    for key in ("alone", "stalled_client"):
        st = a[key]
        print(f"{key:<34}{st['n']:>6}{st['p50_ms']:>9.2f}{st['p99_ms']:>9.2f}{st['max_ms']:>9.2f}"
              f"{st['total_s']:>9.2f}")
    print(f"stalled client dropped: {a['stalled_client_dropped']:.0f}")
    write_result("bench_twitch", results)


if __name__ == "__main__":
    main()
