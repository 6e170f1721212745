"""Twitch EventSub event bodies and frames for the tests (our own fixtures, shaped like PROTOCOLS.md 1.8/1.9).

The corpus (../shared/corpus) is read only by the conformance test; these are
the shapes the other tests rely on, written here with ids of our own.
"""

from __future__ import annotations

import json
from typing import Any

BROADCASTER = "12826"


def chat_event(message_id: str, text: str = "hi Kappa", chatter: str = "4145994") -> dict[str, Any]:
    return {
        "broadcaster_user_id": BROADCASTER, "broadcaster_user_login": "twitch",
        "broadcaster_user_name": "Twitch", "chatter_user_id": chatter,
        "chatter_user_login": f"viewer{chatter}", "chatter_user_name": f"Viewer{chatter}",
        "message_id": message_id,
        "message": {"text": text, "fragments": [{"type": "text", "text": text, "cheermote": None,
                                                 "emote": None, "mention": None}]},
        "color": "#00FF7F", "badges": [{"set_id": "subscriber", "id": "6", "info": "9"}],
        "message_type": "text", "cheer": None, "reply": None, "channel_points_custom_reward_id": None,
        "source_broadcaster_user_id": None, "source_broadcaster_user_login": None,
        "source_broadcaster_user_name": None, "source_message_id": None, "source_badges": None,
    }


def cheer_event(user: str = "1234", bits: int = 100) -> dict[str, Any]:
    return {"is_anonymous": False, "user_id": user, "user_login": f"user{user}",
            "user_name": f"User{user}", "broadcaster_user_id": BROADCASTER,
            "broadcaster_user_login": "twitch", "broadcaster_user_name": "Twitch",
            "message": f"Cheer{bits} great run", "bits": bits}


def follow_event(user: str = "1234", followed_at: str = "2026-01-05T18:16:11.171067130Z") -> dict[str, Any]:
    return {"user_id": user, "user_login": f"user{user}", "user_name": f"User{user}",
            "broadcaster_user_id": BROADCASTER, "broadcaster_user_login": "twitch",
            "broadcaster_user_name": "Twitch", "followed_at": followed_at}


def redemption_event(redemption_id: str, user: str = "1234",
                     redeemed_at: str = "2026-01-05T18:30:00.000000000Z") -> dict[str, Any]:
    return {"id": redemption_id, "broadcaster_user_id": BROADCASTER, "broadcaster_user_login": "twitch",
            "broadcaster_user_name": "Twitch", "user_id": user, "user_login": f"user{user}",
            "user_name": f"User{user}", "user_input": "pogchamp", "status": "unfulfilled",
            "reward": {"id": "5da06b43-5555-4e8f-a091-000000000006", "title": "title", "cost": 100,
                       "prompt": "reward prompt"},
            "redeemed_at": redeemed_at}


def raid_event(raider: str = "888", viewers: int = 150) -> dict[str, Any]:
    return {"from_broadcaster_user_id": raider, "from_broadcaster_user_login": f"user{raider}",
            "from_broadcaster_user_name": f"User{raider}", "to_broadcaster_user_id": BROADCASTER,
            "to_broadcaster_user_login": "twitch", "to_broadcaster_user_name": "Twitch",
            "viewers": viewers}


def gift_event(total: int, gifter: str | None = "49912639", tier: str = "1000") -> dict[str, Any]:
    return {"user_id": gifter, "user_login": f"user{gifter}" if gifter else None,
            "user_name": f"User{gifter}" if gifter else None, "broadcaster_user_id": BROADCASTER,
            "broadcaster_user_login": "twitch", "broadcaster_user_name": "Twitch", "total": total,
            "tier": tier, "cumulative_total": None if gifter is None else 20,
            "is_anonymous": gifter is None}


def sub_event(user: str, *, is_gift: bool, tier: str = "1000") -> dict[str, Any]:
    return {"user_id": user, "user_login": f"user{user}", "user_name": f"User{user}",
            "broadcaster_user_id": BROADCASTER, "broadcaster_user_login": "twitch",
            "broadcaster_user_name": "Twitch", "tier": tier, "is_gift": is_gift}


def notification_event(message_id: str, notice_type: str = "resub") -> dict[str, Any]:
    return {"notice_type": notice_type, "broadcaster_user_id": BROADCASTER,
            "broadcaster_user_login": "twitch", "broadcaster_user_name": "Twitch",
            "chatter_user_id": "777", "chatter_user_login": "loyal", "chatter_user_name": "Loyal",
            "chatter_is_anonymous": False, "color": "", "badges": [],
            "system_message": "Loyal subscribed at Tier 1.", "message_id": message_id,
            "message": {"text": "love it", "fragments": []},
            "resub": {"cumulative_months": 12, "duration_months": 1, "streak_months": 3,
                      "sub_tier": "1000", "is_prime": False, "is_gift": False,
                      "gifter_is_anonymous": None, "gifter_user_id": None,
                      "gifter_user_login": None, "gifter_user_name": None}}


def online_event(stream_id: str, started_at: str) -> dict[str, Any]:
    return {"id": stream_id, "broadcaster_user_id": BROADCASTER, "broadcaster_user_login": "twitch",
            "broadcaster_user_name": "Twitch", "type": "live", "started_at": started_at}


def offline_event() -> dict[str, Any]:
    return {"broadcaster_user_id": BROADCASTER, "broadcaster_user_login": "twitch",
            "broadcaster_user_name": "Twitch"}


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
