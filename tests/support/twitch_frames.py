"""Twitch EventSub event bodies and frames for the tests: our own fixtures (docs/platforms.rst).

The corpus (../shared/corpus) is read only by the conformance test; these are
the shapes the other tests rely on, with ids of our own. The event bodies are
the stand-in's (`lumio_ingestd.devkit.standins.twitch_events`, shared with the demo);
the frames around them are built here.
"""

from __future__ import annotations

import json
from typing import Any

from lumio_ingestd.devkit.standins.twitch_events import (
    BROADCASTER,
    chat_event,
    cheer_event,
    follow_event,
    gift_event,
    notification_event,
    offline_event,
    online_event,
    raid_event,
    redemption_event,
    sub_event,
)

__all__ = [
    "BROADCASTER", "chat_event", "cheer_event", "control", "follow_event", "frame", "gift_event",
    "notification_event", "offline_event", "online_event", "raid_event", "redemption_event",
    "sub_event", "subscription",
]


def subscription(sub_type: str, version: str = "1",
                 transport: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": "f1c2a387-161a-49f9-a165-0f21d7a4e1c4", "status": "enabled", "type": sub_type,
            "version": version, "cost": 0, "condition": {"broadcaster_user_id": BROADCASTER},
            "transport": transport or {"method": "websocket", "session_id": "AgoQtest"},
            "created_at": "2026-01-05T18:00:01.000000000Z"}


def frame(sub_type: str, event: dict[str, Any], *, message_id: str = "d0000000-0000-0000-0000-000000000001",
          timestamp: str = "2026-01-05T18:01:02.345678901Z", message_type: str = "notification",
          version: str = "1") -> str:
    return json.dumps({
        "metadata": {"message_id": message_id, "message_type": message_type,
                     "message_timestamp": timestamp, "subscription_type": sub_type,
                     "subscription_version": version},
        "payload": {"subscription": subscription(sub_type, version), "event": event}})


def control(message_type: str, payload: dict[str, Any],
            message_id: str = "c0000000-0000-0000-0000-0000000000ff",
            timestamp: str = "2026-01-05T18:00:00.123456789Z") -> str:
    return json.dumps({"metadata": {"message_id": message_id, "message_type": message_type,
                                    "message_timestamp": timestamp}, "payload": payload})
