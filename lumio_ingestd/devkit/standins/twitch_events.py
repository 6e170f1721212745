"""Twitch EventSub `event` bodies (docs/platforms.rst, "Subscriptions"), with ids the caller picks.

What the stand-in Twitch sends inside a notification: the tests build their
frames from these, and `lumio-ingestd demo` its traffic. Every builder takes
the channel as `broadcaster` (user id) and `broadcaster_login`; the defaults
are the channel of Twitch's own examples. Pure functions, nothing durable.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

BROADCASTER = "12826"
BROADCASTER_LOGIN = "twitch"


def now_text() -> str:
    """An RFC 3339 timestamp with nanoseconds, as Twitch writes them."""
    ts = datetime.now(UTC)
    return ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond:06d}123Z"


def _user(prefix: str, user_id: str | None, login: str | None) -> dict[str, Any]:
    """`{prefix}_id`, `{prefix}_login`, `{prefix}_name` (the display name: the login, capitalized)."""
    return {f"{prefix}_id": user_id, f"{prefix}_login": login,
            f"{prefix}_name": login.capitalize() if login is not None else None}


def _channel(broadcaster: str, login: str) -> dict[str, Any]:
    return _user("broadcaster_user", broadcaster, login)


def chat_event(message_id: str, text: str = "hi Kappa", chatter: str = "4145994", *,
               broadcaster: str = BROADCASTER, broadcaster_login: str = BROADCASTER_LOGIN,
               chatter_login: str | None = None) -> dict[str, Any]:
    return {
        **_channel(broadcaster, broadcaster_login),
        **_user("chatter_user", chatter, chatter_login or f"viewer{chatter}"),
        "message_id": message_id,
        "message": {"text": text, "fragments": [{"type": "text", "text": text, "cheermote": None,
                                                 "emote": None, "mention": None}]},
        "color": "#00FF7F", "badges": [{"set_id": "subscriber", "id": "6", "info": "9"}],
        "message_type": "text", "cheer": None, "reply": None, "channel_points_custom_reward_id": None,
        "source_broadcaster_user_id": None, "source_broadcaster_user_login": None,
        "source_broadcaster_user_name": None, "source_message_id": None, "source_badges": None,
    }


def full_chat_event(message_id: str, n: int, chatter: str = "4145994", *,
                    broadcaster: str = BROADCASTER, broadcaster_login: str = BROADCASTER_LOGIN
                    ) -> dict[str, Any]:
    """A chat message as busy channels send them: ~2.2 KB as a compact notification.

    What `chat_event` leaves out and real chat carries: text around an emote
    and a mention fragment, three badges, and a reply to an earlier message
    (the parent's and the thread's ids, users and text); the cheer and
    channel-points fields stay null as in most messages. `n` varies the text
    and the users, so no two messages of a run are the same.
    """
    mention_id = str(200_000 + n % 7919)
    mention_login = f"friend{mention_id}"
    parent_id = f"3b2a0b6c-0c5e-4f8e-9a41-{n % 10**12:012d}"
    head, middle, tail = f"round {n} clutch ", " clip it ", " PogChamp"
    text = f"{head}Kappa{middle}@{mention_login}{tail}"
    fragments = [
        {"type": "text", "text": head, "cheermote": None, "emote": None, "mention": None},
        {"type": "emote", "text": "Kappa", "cheermote": None, "mention": None,
         "emote": {"id": "25", "emote_set_id": "0", "owner_id": "0", "format": ["static"]}},
        {"type": "text", "text": middle, "cheermote": None, "emote": None, "mention": None},
        {"type": "mention", "text": f"@{mention_login}", "cheermote": None, "emote": None,
         "mention": {"user_id": mention_id, "user_login": mention_login,
                     "user_name": mention_login.capitalize()}},
        {"type": "text", "text": tail, "cheermote": None, "emote": None, "mention": None},
    ]
    return {
        **chat_event(message_id, text, chatter, broadcaster=broadcaster,
                     broadcaster_login=broadcaster_login),
        "message": {"text": text, "fragments": fragments},
        "color": "#1E90FF",
        "badges": [{"set_id": "moderator", "id": "1", "info": ""},
                   {"set_id": "subscriber", "id": "12", "info": "16"},
                   {"set_id": "sub-gifter", "id": "5", "info": ""}],
        "reply": {"parent_message_id": parent_id, "parent_message_body": "gg",
                  **_user("parent_user", mention_id, mention_login), "thread_message_id": parent_id,
                  **_user("thread_user", mention_id, mention_login)},
    }


def cheer_event(user: str = "1234", bits: int = 100, *, broadcaster: str = BROADCASTER,
                broadcaster_login: str = BROADCASTER_LOGIN) -> dict[str, Any]:
    return {"is_anonymous": False, **_user("user", user, f"user{user}"),
            **_channel(broadcaster, broadcaster_login), "message": f"Cheer{bits} great run", "bits": bits}


def follow_event(user: str = "1234", followed_at: str = "2026-01-05T18:16:11.171067130Z", *,
                 broadcaster: str = BROADCASTER, broadcaster_login: str = BROADCASTER_LOGIN
                 ) -> dict[str, Any]:
    return {**_user("user", user, f"user{user}"), **_channel(broadcaster, broadcaster_login),
            "followed_at": followed_at}


def redemption_event(redemption_id: str, user: str = "1234",
                     redeemed_at: str = "2026-01-05T18:30:00.000000000Z", *,
                     broadcaster: str = BROADCASTER, broadcaster_login: str = BROADCASTER_LOGIN,
                     title: str = "title", cost: int = 100) -> dict[str, Any]:
    return {"id": redemption_id, **_channel(broadcaster, broadcaster_login),
            **_user("user", user, f"user{user}"), "user_input": "pogchamp", "status": "unfulfilled",
            "reward": {"id": "5da06b43-5555-4e8f-a091-000000000006", "title": title, "cost": cost,
                       "prompt": "reward prompt"},
            "redeemed_at": redeemed_at}


def raid_event(raider: str = "888", viewers: int = 150, *, broadcaster: str = BROADCASTER,
               broadcaster_login: str = BROADCASTER_LOGIN) -> dict[str, Any]:
    return {**_user("from_broadcaster_user", raider, f"user{raider}"),
            **_user("to_broadcaster_user", broadcaster, broadcaster_login), "viewers": viewers}


def gift_event(total: int, gifter: str | None = "49912639", tier: str = "1000", *,
               broadcaster: str = BROADCASTER, broadcaster_login: str = BROADCASTER_LOGIN
               ) -> dict[str, Any]:
    return {**_user("user", gifter, f"user{gifter}" if gifter else None),
            **_channel(broadcaster, broadcaster_login), "total": total,
            "tier": tier, "cumulative_total": None if gifter is None else 20,
            "is_anonymous": gifter is None}


def sub_event(user: str, *, is_gift: bool, tier: str = "1000", broadcaster: str = BROADCASTER,
              broadcaster_login: str = BROADCASTER_LOGIN) -> dict[str, Any]:
    return {**_user("user", user, f"user{user}"), **_channel(broadcaster, broadcaster_login),
            "tier": tier, "is_gift": is_gift}


def resub_message_event(user: str, months: int = 12, text: str = "still here", *,
                        broadcaster: str = BROADCASTER, broadcaster_login: str = BROADCASTER_LOGIN
                        ) -> dict[str, Any]:
    """`channel.subscription.message`: a resub shared in chat."""
    return {**_user("user", user, f"user{user}"), **_channel(broadcaster, broadcaster_login),
            "tier": "1000", "message": {"text": text, "emotes": None}, "cumulative_months": months,
            "streak_months": None, "duration_months": 1}


def notification_event(message_id: str, notice_type: str = "resub", *, broadcaster: str = BROADCASTER,
                       broadcaster_login: str = BROADCASTER_LOGIN) -> dict[str, Any]:
    """`channel.chat.notification` (a resub notice unless `notice_type` says otherwise)."""
    return {"notice_type": notice_type, **_channel(broadcaster, broadcaster_login),
            "chatter_user_id": "777", "chatter_user_login": "loyal", "chatter_user_name": "Loyal",
            "chatter_is_anonymous": False, "color": "", "badges": [],
            "system_message": "Loyal subscribed at Tier 1.", "message_id": message_id,
            "message": {"text": "love it", "fragments": []},
            "resub": {"cumulative_months": 12, "duration_months": 1, "streak_months": 3,
                      "sub_tier": "1000", "is_prime": False, "is_gift": False,
                      "gifter_is_anonymous": None, "gifter_user_id": None,
                      "gifter_user_login": None, "gifter_user_name": None}}


def online_event(stream_id: str, started_at: str, *, broadcaster: str = BROADCASTER,
                 broadcaster_login: str = BROADCASTER_LOGIN) -> dict[str, Any]:
    return {"id": stream_id, **_channel(broadcaster, broadcaster_login), "type": "live",
            "started_at": started_at}


def offline_event(*, broadcaster: str = BROADCASTER, broadcaster_login: str = BROADCASTER_LOGIN
                  ) -> dict[str, Any]:
    return _channel(broadcaster, broadcaster_login)
