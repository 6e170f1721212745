"""Memory per idle source socket: N real `TwitchSource` threads, each with its EventSub session open.

    .venv/bin/python bench/bench_sockets.py [--sockets 500] [--wave 50]

The stand-in Twitch runs in a process of its own (bench/standin_server.py),
so its side of the N connections (and its threads) does not count here. This
process builds what the sources share (metrics, chat and event ingest over a
pool and a Redis client that idle sources never touch, so no server is
needed), then reads VmRSS and Threads from /proc/self/status, starts N
sources (one per account, each with its token file, its OAuth validation,
its WebSocket session and its 11 Helix subscriptions) in waves of `--wave`,
waits until the stand-in counts N subscribed sessions, lets them idle through
a keepalive, and reads again. Reported: KiB of RSS and threads per socket.

Prints a table and writes bench/results/bench_sockets.json. Not a test.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _paths import write_result  # noqa: E402 - first: it sets up sys.path
from standin_server import StandinProcess, raise_fd_limit  # noqa: E402

from lumio_ingestd.chat.ingest import ChatIngest, ChatQueue  # noqa: E402
from lumio_ingestd.config import AccountConfig, Config, RedisConfig, Secret, TimescaleConfig, TwitchConfig  # noqa: E402
from lumio_ingestd.db.pool import Pool  # noqa: E402
from lumio_ingestd.events.persist import EventIngest  # noqa: E402
from lumio_ingestd.metrics import Metrics  # noqa: E402
from lumio_ingestd.sources.twitch.oauth import TokenStore  # noqa: E402
from lumio_ingestd.sources.twitch.sink import TwitchSink  # noqa: E402
from lumio_ingestd.sources.twitch.source import TwitchSource  # noqa: E402
from lumio_ingestd.stores.redisclient import connect  # noqa: E402

#: Nothing listens here: the idle sources never write, so the pool and Redis stay unconnected.
UNUSED_DSN = "postgresql://lumio@127.0.0.1:1/unused"
UNUSED_REDIS = "redis://127.0.0.1:1/0"


def _status() -> dict[str, int]:
    """VmRSS (KiB) and Threads of this process."""
    out: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "Threads"):
            out[key] = int(value.split()[0])
    return out


def run(sockets: int = 500, wave: int = 50) -> dict[str, Any]:
    raise_fd_limit()
    standin = StandinProcess("--subscribe-window", "300")
    sources: list[TwitchSource] = []
    info = standin.info
    try:
        with tempfile.TemporaryDirectory(prefix="bench-sockets-") as tmpdir:
            tmp = Path(tmpdir)
            cfg = Config(path=str(tmp / "none.ini"), redis=RedisConfig(url=UNUSED_REDIS),
                         timescale=TimescaleConfig(dsn=UNUSED_DSN))
            twitch = TwitchConfig(eventsub_ws_url=info["ws_url"], helix_url=info["helix_url"],
                                  oauth_url=info["oauth_url"], client_id=info["client_id"],
                                  client_secret=Secret(info["client_secret"]), keepalive_timeout_secs=10)
            metrics = Metrics()
            pool = Pool(cfg.timescale)
            client = connect(cfg.redis)
            chat = ChatIngest(client, pool, None, metrics, cfg)
            sink = TwitchSink(EventIngest(client, pool, None, metrics, cfg).persist_event, metrics,
                              alerts=None, sessions=None)
            accounts = []
            for i in range(1, sockets + 1):
                token = tmp / f"token-{i}.json"
                token.write_text(json.dumps({"access_token": info["access_token"],
                                             "refresh_token": info["refresh_token"]}))
                accounts.append(AccountConfig(i, twitch_user_id=str(900_000 + i), twitch_token_file=token))
            gc.collect()
            before = _status()
            started = time.monotonic()
            for first in range(0, sockets, wave):
                for account in accounts[first:first + wave]:
                    assert account.twitch_token_file is not None
                    tokens = TokenStore(account.twitch_token_file, twitch.oauth_url, twitch.client_id,
                                        twitch.client_secret, metrics)
                    source = TwitchSource(account, twitch, chat_queue=ChatQueue(chat, metrics), sink=sink,
                                          tokens=tokens, metrics=metrics, subscribe_window_secs=240)
                    sources.append(source)
                    source.start()
                n = min(first + wave, sockets)
                if not standin.call("wait_sessions", n=n, timeout=240)["ok"]:
                    raise SystemExit(f"fewer than {n} sessions subscribed")
            connect_secs = time.monotonic() - started
            threading.Event().wait(11.0)  # idle through a keepalive (10 s) on every session
            gc.collect()
            after = _status()
            open_sessions = standin.call("wait_sessions", n=sockets, timeout=5)
    finally:
        for source in sources:
            source.request_stop()
        stuck = [s.name for s in sources if not s.join(10)]
        standin.close()
    rss_kib = after["VmRSS"] - before["VmRSS"]
    return {"sockets": sockets, "wave": wave, "rss_before_kib": before["VmRSS"],
            "rss_after_kib": after["VmRSS"], "rss_per_socket_kib": rss_kib / sockets,
            "threads_before": before["Threads"], "threads_after": after["Threads"],
            "threads_per_socket": (after["Threads"] - before["Threads"]) / sockets,
            "all_subscribed": bool(open_sessions["ok"]), "connect_secs": connect_secs,
            "sources_not_stopped": stuck}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=500)
    parser.add_argument("--wave", type=int, default=50)
    args = parser.parse_args()
    r = run(args.sockets, args.wave)
    print(f"{r['sockets']} idle TwitchSource sockets (all subscribed: {r['all_subscribed']}, "
          f"connected in {r['connect_secs']:.1f}s)")
    print(f"RSS {r['rss_before_kib']:,} KiB -> {r['rss_after_kib']:,} KiB = "
          f"{r['rss_per_socket_kib']:.1f} KiB per socket")
    print(f"threads {r['threads_before']} -> {r['threads_after']} = {r['threads_per_socket']:.2f} per socket")
    write_result("bench_sockets", r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
