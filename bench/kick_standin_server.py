"""The stand-in Kick's Pusher server as a process of its own, driven over stdin/stdout (bench_kick.py).

    .venv/bin/python bench/kick_standin_server.py

As bench/standin_server.py does for Twitch: the load generator must not share
the GIL with the source being measured. One JSON object per line:

    -> (on start) {"pusher_url"}
    <- {"cmd": "wait_subscribed", "channel": C, "timeout": T}  -> {"ok"}
    <- {"cmd": "prepare_chat", "n": N, "chatroom": R, "path": P} -> {"ok"}: N ChatMessageEvent frames
                                                                  for chatrooms.R.v2, also written to P
    <- {"cmd": "blast"}        -> {"sent", "seconds"}: the prepared frames (encoded as wire bytes
                                  when prepared), as fast as the socket takes them
    <- {"cmd": "quit"}         -> exits
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import _paths  # noqa: E402, F401 - first: it sets up sys.path

from lumio_ingestd.devkit.standins.kick import KickStandin, PusherConnection, pusher_chat  # noqa: E402


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> int:
    standin = KickStandin().start()
    prepared: tuple[PusherConnection, list[bytes]] | None = None
    try:
        _reply({"pusher_url": standin.pusher_url})
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["cmd"] == "wait_subscribed":
                channel = str(cmd["channel"])
                ok = standin.wait_for(lambda c=channel: bool(standin.subscribed(c)), float(cmd["timeout"]))
                _reply({"ok": ok})
            elif cmd["cmd"] == "prepare_chat":
                channel = f"chatrooms.{cmd['chatroom']}.v2"
                conns = standin.subscribed(channel)
                if not conns:
                    _reply({"ok": False})
                    continue
                frames = [json.dumps({"event": "App\\Events\\ChatMessageEvent", "channel": channel,
                                      "data": json.dumps(pusher_chat(
                                          int(cmd["chatroom"]), str(uuid.uuid4()),
                                          f"PogChamp that was a great play, message {i} [emote:37226:KEKW]",
                                          sender_id=100_000 + i % 5000, username=f"viewer{i % 5000}"))})
                          for i in range(int(cmd["n"]))]
                Path(cmd["path"]).write_text("\n".join(frames) + "\n")
                prepared = (conns[0], standin.encode_bulk(frames))
                _reply({"ok": True})
            elif cmd["cmd"] == "blast":
                if prepared is None:
                    _reply({"sent": 0, "seconds": 0.0})
                    continue
                started = time.perf_counter()
                sent = standin.send_bulk(*prepared)
                _reply({"sent": sent, "seconds": time.perf_counter() - started})
            elif cmd["cmd"] == "quit":
                break
    finally:
        standin.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
