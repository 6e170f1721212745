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
    <- {"cmd": "prepare_chat", "n": N, "broadcasters": [B, ...], "path": P, "shape": S}
                                                        -> {"ok", "missing", "bytes_per_frame"}: for
                                                           each broadcaster, N channel.chat.message
                                                           frames for its session, encoded as wire
                                                           bytes; all written to P (one per line;
                                                           optional) for the raw limits.
                                                           "broadcaster": B is one broadcaster.
                                                           "shape" (`SHAPES`): "short" (default) is
                                                           `twitch_events.chat_event` (one text
                                                           fragment, one badge, no reply) in
                                                           json.dumps's default spacing; "full" is
                                                           `twitch_events.full_chat_event` (emote and
                                                           mention fragments, three badges, a
                                                           reply) in compact JSON, as Twitch sends
                                                           it. "bytes_per_frame": the frames' mean
                                                           payload, before WebSocket framing.
                                                           "missing": the broadcasters with no
                                                           session (then nothing is prepared and
                                                           "ok" is false; an unknown shape, too,
                                                           with "error")
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _paths  # noqa: E402, F401 - first: it sets up sys.path
from _child import JsonLinesChild  # noqa: E402

from lumio_ingestd.devkit.standins import twitch_events as te  # noqa: E402
from lumio_ingestd.devkit.standins.twitch import StandinSession, TwitchStandin  # noqa: E402


def reply(obj: dict[str, Any]) -> None:
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


def _chatter(i: int) -> str:
    """Message `i`'s chatter: 5,000 of them take turns."""
    return str(100_000 + i % 5000)


def _short_event(i: int, broadcaster: str) -> dict[str, Any]:
    return te.chat_event(str(uuid.uuid4()), f"PogChamp that was a great play, message {i} KEKW",
                         _chatter(i), broadcaster=broadcaster)


def _full_event(i: int, broadcaster: str) -> dict[str, Any]:
    return te.full_chat_event(str(uuid.uuid4()), i, _chatter(i), broadcaster=broadcaster)


@dataclass(frozen=True)
class Shape:
    """What a prepared chat frame holds (`event`: message i to a broadcaster) and how it is written."""

    event: Callable[[int, str], dict[str, Any]]
    separators: tuple[str, str] | None  # json.dumps's; None: its default, ", " and ": "


#: prepare_chat's "shape". "short" keeps the spaced frames the benchmarks have always
#: sent, so earlier figures stay comparable; "full" is a busy channel's message, compact
#: as Twitch writes it.
SHAPES: dict[str, Shape] = {"short": Shape(_short_event, None),
                            "full": Shape(_full_event, (",", ":"))}


def chat_frames(standin: TwitchStandin, session: StandinSession, broadcaster: str, n: int,
                shape: str = "short") -> list[str]:
    """`n` channel.chat.message notifications to `broadcaster` on `session`, as text frames."""
    how = SHAPES[shape]
    return [json.dumps(standin.notification(session, "channel.chat.message", how.event(i, broadcaster)),
                       separators=how.separators) for i in range(n)]


def mean_payload_bytes(frames: list[str]) -> float:
    """The frames' mean size in bytes as sent, before WebSocket framing (0 for none)."""
    return sum(len(f.encode()) for f in frames) / len(frames) if frames else 0.0


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


def serve_standin(subscribe_window_secs: float) -> TwitchStandin:
    """The child side's start: a started stand-in Twitch whose addresses and secrets are the
    first line the parent reads (`StandinProcess.info`). The caller closes it."""
    raise_fd_limit()
    standin = TwitchStandin(subscribe_window_secs=subscribe_window_secs)
    standin.record_sent = False
    standin.start()
    reply({"ws_url": standin.ws_url, "helix_url": standin.helix_url, "oauth_url": standin.oauth_url,
           "client_id": standin.client_id, "client_secret": standin.client_secret,
           "access_token": standin.access_token, "refresh_token": standin.refresh_token})
    return standin


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribe-window", type=float, default=10.0)
    args = parser.parse_args()
    standin = serve_standin(args.subscribe_window)
    prepared: list[Prepared] = []
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["cmd"] == "wait_sessions":
                def subscribed(n: int = int(cmd["n"])) -> bool:
                    return sum(1 for s in standin.sessions if s.open and s.subscriptions) >= n

                ok = standin.wait_for(subscribed, float(cmd.get("timeout", 60)))
                reply({"ok": ok, "sessions": sum(1 for s in standin.sessions if s.open)})
            elif cmd["cmd"] == "prepare_chat":
                shape = str(cmd.get("shape", "short"))
                if shape not in SHAPES:
                    prepared = []
                    reply({"ok": False, "missing": [], "error": f"unknown shape {shape!r}"})
                    continue
                broadcasters = [str(b) for b in cmd.get("broadcasters") or [cmd["broadcaster"]]]
                sessions = {b: standin.active_session("channel.chat.message", b) for b in broadcasters}
                missing = [b for b, session in sessions.items() if session is None]
                if missing:
                    prepared = []
                    reply({"ok": False, "missing": missing})
                    continue
                texts: list[str] = []
                prepared = []
                for b in broadcasters:
                    session = sessions[b]
                    assert session is not None
                    frames = chat_frames(standin, session, b, int(cmd["n"]), shape)
                    texts += frames
                    prepared.append(Prepared(b, session, standin.encode_bulk(frames)))
                if cmd.get("path"):
                    Path(cmd["path"]).write_text("\n".join(texts) + "\n")
                reply({"ok": True, "missing": [], "bytes_per_frame": mean_payload_bytes(texts)})
            elif cmd["cmd"] == "blast":
                reply(blast(standin, prepared))
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
