"""The source thread's per-frame CPU, without the socket and without Redis: a micro benchmark.

    .venv/bin/python bench/bench_hotpath.py [--frames 30000] [--runs 5]

The frames are the ones bench_wire.py's stand-in sends (`channel.chat.message`
notifications, as bytes off the wire). Three rows, each the best of `--runs`:

- interpret: `mapping.interpret` (parse, check, map into a ChatMessage);
- dispatch: what `EventSubClient` does per frame after the read: interpret,
  the duplicate check, the frame count, `TwitchSource.on_notification`'s
  checks, `ChatQueue.add` (batches of 200 handed to an ingest stand-in that
  only builds each entry, what `ChatIngest.persist_batch` does before Redis),
  the recent-id record;
- entry: `ChatMessage.to_entry` alone.

Prints CPU microseconds per frame (this thread's CPU time, so that other
processes on a shared machine disturb it less). Not a test: nothing here
asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import _paths  # noqa: F401 - first: it sets up sys.path

from lumio_ingestd import fastjson  # noqa: E402
from lumio_ingestd.chat.ingest import ChatQueue  # noqa: E402
from lumio_ingestd.devkit.standins import twitch_events as te  # noqa: E402
from lumio_ingestd.metrics import Metrics  # noqa: E402
from lumio_ingestd.model import ChatMessage  # noqa: E402
from lumio_ingestd.sources.twitch.eventsub import EventSubClient  # noqa: E402
from lumio_ingestd.sources.twitch.mapping import Envelope, Notification, interpret  # noqa: E402

BROADCASTER = "777001"


def frames(n: int) -> list[bytes]:
    """The stand-in's chat frames (bench/standin_server.py `prepare_chat`), encoded."""
    sub = {"id": str(uuid.uuid4()), "status": "enabled", "type": "channel.chat.message",
           "version": "1", "cost": 0, "condition": {"broadcaster_user_id": BROADCASTER},
           "transport": {"method": "websocket", "session_id": "s" * 36},
           "created_at": "2026-01-05T18:00:00.123456789Z"}
    out = []
    for i in range(n):
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"
        event = te.chat_event(str(uuid.uuid4()), f"PogChamp that was a great play, message {i} KEKW",
                              str(100_000 + i % 5000), broadcaster=BROADCASTER)
        out.append(json.dumps({
            "metadata": {"message_id": str(uuid.uuid4()), "message_type": "notification",
                         "message_timestamp": now, "subscription_type": "channel.chat.message",
                         "subscription_version": "1"},
            "payload": {"subscription": sub, "event": event}}).encode())
    return out


class _Ingest:
    """ChatIngest's work before Redis: each message's entry."""

    def persist_batch(self, msgs: Sequence[ChatMessage]) -> Counter[str]:
        entries = [m.to_entry() for m in msgs]
        return Counter({"buffered": len(entries)})


class _Handler:
    """TwitchSource.on_notification's path for a chat frame of a subscribed type."""

    def __init__(self, queue: ChatQueue) -> None:
        self.queue = queue
        self.types = frozenset({"channel.chat.message"})

    def on_notification(self, env: Envelope, items: tuple[Notification, ...]) -> None:
        sub_type = env.subscription_type
        if sub_type not in self.types:
            raise AssertionError(sub_type)
        for note in items:
            if note.chat is not None:
                self.queue.add(note.chat)

    def on_bad_frame(self, exc: Exception, raw: bytes = b"") -> None:
        raise AssertionError(exc)

    def on_unsupported(self, env: Envelope) -> None:
        raise AssertionError(env)

    def on_revocation(self, env: Envelope) -> None:
        raise AssertionError(env)


def _best(runs: int, n: int, once: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.thread_time()
        once()
        best = min(best, time.thread_time() - started)
    return best / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=30_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    data = frames(args.frames)
    metrics = Metrics()

    def interpret_all() -> None:
        for frame in data:
            interpret(1, frame)

    def dispatch_all() -> None:
        queue = ChatQueue(_Ingest(), metrics)  # type: ignore[arg-type]
        client = EventSubClient("ws://unused", 10, 1, _Handler(queue), metrics,  # type: ignore[arg-type]
                                recent_ids=10_000)
        dispatch: Any = client._dispatch  # noqa: SLF001 - the per-frame step itself
        for frame in data:
            dispatch(frame, None)
        queue.drain()
        assert client._chat_frames == len(data)  # noqa: SLF001

    msgs = [it.chat for f in data for it in interpret(1, f).items if it.chat is not None]

    def entries() -> None:
        for m in msgs:
            m.to_entry()

    rows: list[tuple[str, Any]] = [
        ("interpret (parse + check + map)", _best(args.runs, len(data), interpret_all)),
        ("dispatch (interpret + dedup + queue + entry)", _best(args.runs, len(data), dispatch_all)),
        ("ChatMessage.to_entry", _best(args.runs, len(msgs), entries)),
    ]
    print(f"per frame, microseconds (best of {args.runs} x {len(data):,}; orjson "
          f"{'on' if fastjson.USING_ORJSON else 'off'})")
    for label, value in rows:
        print(f"  {label:<48}{value:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
