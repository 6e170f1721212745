"""The stand-in Twitch as a process of its own, driven over stdin/stdout (for the benchmarks).

    .venv/bin/python bench/standin_server.py [--subscribe-window SECS]

A benchmark measures the daemon's side of a socket; a load generator in the
same process would take turns with it for the GIL, which Twitch does not. So
the stand-in runs here, in its own process, and the benchmark talks to it
with one JSON object per line:

    -> (on start) {"ws_url", "helix_url", "oauth_url", "client_id", "client_secret",
                   "access_token", "refresh_token"}
    <- {"cmd": "wait_sessions", "n": N, "timeout": T}   -> {"ok", "sessions"}: N sessions with
                                                             at least one subscription each
    <- {"cmd": "prepare_chat", "n": N, "broadcasters": [B, ...], "path": P}
                                                        -> {"ok", "missing"}: for each broadcaster,
                                                           N channel.chat.message frames for its
                                                           session, encoded as wire bytes; all
                                                           written to P (one per line; optional)
                                                           for the raw limits. "broadcaster": B
                                                           is one broadcaster. "missing": the
                                                           broadcasters with no session (then
                                                           nothing is prepared and "ok" is false)
    <- {"cmd": "blast"}                                 -> {"sent", "seconds", "sessions"}: every
                                                           prepared session's frames sent at once,
                                                           one thread per session (`sendall`
                                                           releases the GIL), each as fast as its
                                                           socket takes them; "sessions" lists
                                                           each one's {"broadcaster", "sent",
                                                           "seconds"}
    <- {"cmd": "quit"}                                  -> exits
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _paths  # noqa: E402, F401 - first: it sets up sys.path
from _child import JsonLinesChild  # noqa: E402

from lumio_ingestd.devkit.standins import twitch_events as te  # noqa: E402
from lumio_ingestd.devkit.standins.twitch import StandinSession, TwitchStandin  # noqa: E402


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def raise_fd_limit() -> None:
    """Hundreds of sockets (and their threads' files) need more than the usual 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@dataclass
class Prepared:
    """One session's blast: its frames as wire bytes, made before the clock starts."""

    broadcaster: str
    session: StandinSession
    frames: list[bytes]


def chat_frames(standin: TwitchStandin, session: StandinSession, broadcaster: str, n: int) -> list[str]:
    return [json.dumps(standin.notification(session, "channel.chat.message", te.chat_event(
        str(uuid.uuid4()), f"PogChamp that was a great play, message {i} KEKW",
        str(100_000 + i % 5000), broadcaster=broadcaster))) for i in range(n)]


def blast(standin: TwitchStandin, prepared: list[Prepared]) -> dict[str, Any]:
    """Every prepared session at once, one sending thread each; released together."""
    results: list[tuple[int, float]] = [(0, 0.0)] * len(prepared)
    go = threading.Barrier(len(prepared) + 1)

    def send(i: int, p: Prepared) -> None:
        go.wait()
        started = time.perf_counter()
        sent = standin.send_bulk(p.session, p.frames)
        results[i] = (sent, time.perf_counter() - started)

    threads = [threading.Thread(target=send, args=(i, p), name=f"blast-{p.broadcaster}")
               for i, p in enumerate(prepared)]
    for t in threads:
        t.start()
    started = time.perf_counter()
    go.wait()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    return {"sent": sum(sent for sent, _ in results), "seconds": seconds,
            "sessions": [{"broadcaster": p.broadcaster, "sent": sent, "seconds": secs}
                         for p, (sent, secs) in zip(prepared, results, strict=True)]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribe-window", type=float, default=10.0)
    args = parser.parse_args()
    raise_fd_limit()
    standin = TwitchStandin(subscribe_window_secs=args.subscribe_window)
    standin.record_sent = False
    standin.start()
    prepared: list[Prepared] = []
    try:
        _reply({"ws_url": standin.ws_url, "helix_url": standin.helix_url, "oauth_url": standin.oauth_url,
                "client_id": standin.client_id, "client_secret": standin.client_secret,
                "access_token": standin.access_token, "refresh_token": standin.refresh_token})
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["cmd"] == "wait_sessions":
                def subscribed(n: int = int(cmd["n"])) -> bool:
                    return sum(1 for s in standin.sessions if s.open and s.subscriptions) >= n

                ok = standin.wait_for(subscribed, float(cmd.get("timeout", 60)))
                _reply({"ok": ok, "sessions": sum(1 for s in standin.sessions if s.open)})
            elif cmd["cmd"] == "prepare_chat":
                broadcasters = [str(b) for b in cmd.get("broadcasters") or [cmd["broadcaster"]]]
                sessions = {b: standin.active_session("channel.chat.message", b) for b in broadcasters}
                missing = [b for b, session in sessions.items() if session is None]
                if missing:
                    prepared = []
                    _reply({"ok": False, "missing": missing})
                    continue
                texts: list[str] = []
                prepared = []
                for b in broadcasters:
                    session = sessions[b]
                    assert session is not None
                    frames = chat_frames(standin, session, b, int(cmd["n"]))
                    texts += frames
                    prepared.append(Prepared(b, session, standin.encode_bulk(frames)))
                if cmd.get("path"):
                    Path(cmd["path"]).write_text("\n".join(texts) + "\n")
                _reply({"ok": True, "missing": []})
            elif cmd["cmd"] == "blast":
                _reply(blast(standin, prepared))
            elif cmd["cmd"] == "quit":
                break
    finally:
        standin.close()
    return 0



class StandinProcess(JsonLinesChild):
    """The parent's side: starts this script as a child process and calls it."""

    def __init__(self, *args: str) -> None:
        super().__init__(Path(__file__).resolve(), *args, what="the stand-in process")
        self.info = self.read()


if __name__ == "__main__":
    sys.exit(main())
