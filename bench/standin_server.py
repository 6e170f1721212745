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
    <- {"cmd": "prepare_chat", "n": N, "broadcaster": B, "path": P}
                                                        -> {"ok"}: N channel.chat.message frames
                                                           for B's session, also written to P
                                                           (one per line) for the raw limits
    <- {"cmd": "blast"}                                 -> {"sent", "seconds"}: sends the prepared
                                                           frames as fast as the socket takes them
    <- {"cmd": "quit"}                                  -> exits
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import _paths  # noqa: E402, F401 - first: it sets up sys.path

from lumio_ingestd.standins import twitch_events as te  # noqa: E402
from lumio_ingestd.standins.twitch import StandinSession, TwitchStandin  # noqa: E402


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def raise_fd_limit() -> None:
    """Hundreds of sockets (and their threads' files) need more than the usual 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribe-window", type=float, default=10.0)
    args = parser.parse_args()
    raise_fd_limit()
    standin = TwitchStandin(subscribe_window_secs=args.subscribe_window)
    standin.record_sent = False
    standin.start()
    prepared: tuple[StandinSession, list[bytes]] | None = None
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
                session = standin.active_session("channel.chat.message", cmd["broadcaster"])
                if session is None:
                    _reply({"ok": False})
                    continue
                frames = [json.dumps(standin.notification(session, "channel.chat.message", te.chat_event(
                    str(uuid.uuid4()), f"PogChamp that was a great play, message {i} KEKW",
                    str(100_000 + i % 5000), broadcaster=cmd["broadcaster"])))
                    for i in range(int(cmd["n"]))]
                Path(cmd["path"]).write_text("\n".join(frames) + "\n")
                prepared = (session, standin.encode_bulk(frames))
                _reply({"ok": True})
            elif cmd["cmd"] == "blast":
                if prepared is None:
                    _reply({"sent": 0, "seconds": 0.0})
                    continue
                session, frames = prepared
                started = time.perf_counter()
                sent = standin.send_bulk(session, frames)
                _reply({"sent": sent, "seconds": time.perf_counter() - started})
            elif cmd["cmd"] == "quit":
                break
    finally:
        standin.close()
    return 0



class StandinProcess:
    """The parent's side: starts this script as a child process and calls it."""

    def __init__(self, *args: str) -> None:
        self._proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self._read()

    def _read(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the stand-in process ended (exit {self._proc.poll()})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def call(self, cmd: str, **args: Any) -> dict[str, Any]:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")
        self._proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self._proc.stdin.close()
                self._proc.wait(30)
            except (OSError, ValueError):
                pass
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)
        if self._proc.stdout is not None:
            self._proc.stdout.close()


if __name__ == "__main__":
    sys.exit(main())
