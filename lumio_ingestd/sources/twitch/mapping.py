"""Twitch EventSub frames into chat messages, platform events and control messages.

Pure functions, no I/O: the WebSocket session and the webhook receiver both
map through here, so a notification becomes the same rows whichever way it
came (docs/platforms.rst, "What the rows look like", Twitch):

- `channel.chat.message` is chat: `message_id` = the event's `message_id`
  (not the delivery id), `created_at` = the delivery timestamp
  (`metadata.message_timestamp`, or the webhook's timestamp header).
- Every other notification is one `events` row: `type` = the subscription
  type, `payload` = the notification's `event` object as Twitch sent it,
  `external_id` = the platform's own id of the event where it has one
  (`_OWN_ID`), else the delivery id; `channel.follow`, which has none, gets
  `follow:<user_id>:<followed_at epoch seconds>` (`follow_external_id`),
  which Helix's follower list gives the same follow when a gap is healed; `created_at` = the event's own time
  field where it has one (`_OWN_TIME`), else the delivery timestamp;
  `user_id` = the viewer the event is about (GDPR erasure finds it there).
- `channel.subscription.gift` and `channel.subscribe` with `is_gift` carry a
  `Gift` note, which `gifts.GiftLinker` uses to link the recipients to their
  gift; `stream.online` / `stream.offline` carry a `StreamChange`.

Own ids are taken only where the id names this one event: the update of a
redemption, the progress of a poll or the end of a hype train repeat the id of
what they update, so those use the delivery id (or they would be deduplicated
into the first row). The dedup key is (account, platform, external_id) across all
types, so numeric ids from other id sequences (unban requests, extension
transactions) are left out too: a collision with a stream id would drop one.

A frame that cannot be used raises `BadFrame` with a short `reason` (a label
of `source_bad_frames`): "utf8", "nul" (a raw NUL byte: not valid JSON text),
"json", "too_deep" (nested deeper than `boundedjson.DEFAULT_MAX_DEPTH`),
"shape" (a field missing or of the wrong type), "time" (a timestamp
outside 2000 .. now + 1 day), "too_large" (and, from the socket reader,
"binary"; from the source's subscription checks, "foreign_channel" and
"unsubscribed"). A `\\u0000` escape inside a string
is valid JSON; the model repairs it (U+FFFD) and counts it as sanitized.

Nothing durable here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from lumio_ingestd import boundedjson, fastjson
from lumio_ingestd.model import (
    MAX_JSON_DEPTH,
    ChatMessage,
    PlatformEvent,
    StreamChange,
    frame_is_clean,
    parse_time,
    slot_setters,
)
from lumio_ingestd.sources.base import BadFrame

PLATFORM = "twitch"
MAX_FRAME_BYTES = 512 * 1024

CHAT_TYPE = "channel.chat.message"
GIFT_TYPE = "channel.subscription.gift"
SUB_TYPE = "channel.subscribe"
FOLLOW_TYPE = "channel.follow"
CONTROL_TYPES = frozenset({"session_welcome", "session_keepalive", "session_reconnect", "revocation"})

# Subscription type -> the event field that is the platform's own id of this one event.
_OWN_ID: Mapping[str, str] = {
    "channel.channel_points_custom_reward_redemption.add": "id",
    "channel.channel_points_automatic_reward_redemption.add": "id",
    "stream.online": "id",
    "channel.chat.notification": "message_id",
    "channel.charity_campaign.donate": "id",
}

# Subscription type -> the event field that is this event's own time.
_OWN_TIME: Mapping[str, str] = {
    "channel.follow": "followed_at",
    "stream.online": "started_at",
    "channel.channel_points_custom_reward_redemption.add": "redeemed_at",
    "channel.channel_points_automatic_reward_redemption.add": "redeemed_at",
    "channel.ban": "banned_at",
    "channel.unban_request.create": "created_at",
    "channel.shoutout.create": "started_at",
    "channel.shoutout.receive": "started_at",
    "channel.poll.begin": "started_at",
    "channel.poll.end": "ended_at",
    "channel.prediction.begin": "started_at",
    "channel.prediction.lock": "locked_at",
    "channel.prediction.end": "ended_at",
    "channel.hype_train.begin": "started_at",
    "channel.hype_train.end": "ended_at",
    "channel.goal.begin": "started_at",
    "channel.goal.end": "ended_at",
    "channel.shield_mode.begin": "started_at",
    "channel.shield_mode.end": "ended_at",
    "channel.charity_campaign.start": "started_at",
    "channel.charity_campaign.stop": "stopped_at",
    "channel.ad_break.begin": "started_at",
    "automod.message.hold": "held_at",
}

# Where the viewer an event is about sits, first match wins (raids: the raider).
_USER_FIELDS = ("user_id", "chatter_user_id", "from_broadcaster_user_id", "requester_user_id")

# Condition keys that name the channel a subscription is about (webhooks: which account).
_CHANNEL_KEYS = ("broadcaster_user_id", "to_broadcaster_user_id", "from_broadcaster_user_id", "user_id")

# Chat fields kept next to the text (display data; the text itself is a column).
_CHAT_EXTRAS = ("message_type", "color", "badges", "cheer", "reply", "channel_points_custom_reward_id",
                "source_broadcaster_user_id", "source_message_id", "broadcaster_user_id")

_EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
_FUTURE_SLACK = timedelta(days=1)



@dataclass(frozen=True, slots=True)
class Envelope:
    """The `metadata` of a WebSocket frame, and its `payload`."""

    message_id: str
    message_type: str
    timestamp: datetime
    subscription_type: str | None
    subscription_version: str | None
    payload: Mapping[str, Any]
    # The frame passed `frame_is_clean`: its values need no repair walk.
    clean: bool = False


@dataclass(frozen=True, slots=True)
class Gift:
    """A gift note: the community gift itself ("bomb", with its total) or one gifted sub."""

    role: Literal["bomb", "recipient"]
    tier: str
    total: int = 0


@dataclass(frozen=True, slots=True)
class Notification:
    """What one notification became: chat, or an event with its notes."""

    chat: ChatMessage | None = None
    event: PlatformEvent | None = None
    gift: Gift | None = None
    stream: StreamChange | None = None


@dataclass(frozen=True, slots=True)
class Interpreted:
    """A WebSocket frame, classified: "chat", "event", "control" or "unsupported"."""

    kind: Literal["chat", "event", "control", "unsupported"]
    envelope: Envelope
    items: tuple[Notification, ...] = ()


# --------------------------------------------------------------------------- decoding


def decode_json(data: bytes | str) -> dict[str, Any]:
    """A JSON object from a frame or a request body; raises BadFrame."""
    return _decode(data)[0]


def decode_checked(data: bytes | str) -> tuple[dict[str, Any], bool]:
    """`decode_json`, and whether every value in it is known clean (`frame_is_clean`)."""
    return _decode(data, check_clean=True)


def _decode(data: bytes | str, check_clean: bool = False) -> tuple[dict[str, Any], bool]:
    """The object, and whether its values are known clean (only if `check_clean`)."""
    if len(data) > MAX_FRAME_BYTES:
        raise BadFrame("too_large", f"frame of {len(data)} bytes (limit {MAX_FRAME_BYTES})")
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadFrame("utf8", f"not UTF-8 (byte {exc.start})") from None
    else:
        text = data
    if "\x00" in text:
        raise BadFrame("nul", f"raw NUL character at offset {text.index(chr(0))}")
    clean = check_clean and frame_is_clean(text)
    # A clean frame was scanned for depth by the check (at most MAX_JSON_DEPTH): not again.
    depth = MAX_JSON_DEPTH if clean else None
    try:
        try:
            obj = boundedjson.loads(text, max_bytes=MAX_FRAME_BYTES, depth_at_most=depth,
                                    decode=fastjson.loads_finite if clean else fastjson.loads)
        except fastjson.NotFinite:
            clean = False
            obj = boundedjson.loads(text, max_bytes=MAX_FRAME_BYTES, depth_at_most=depth,
                                    decode=fastjson.loads)
    except boundedjson.JsonRefused as exc:
        # "too_deep" is its own label; "too_large" counts characters here (the
        # byte check above came first); anything else is plain "json".
        reason = exc.reason if exc.reason in ("too_deep", "too_large") else "json"
        raise BadFrame(reason, str(exc)) from None
    if not isinstance(obj, dict):
        raise BadFrame("json", f"not a JSON object but {type(obj).__name__}")
    return obj, clean


def _str(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise BadFrame("shape", f"{where}.{key} missing or not a non-empty string")
    return value


def _obj(obj: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = obj.get(key)
    if not isinstance(value, dict):
        raise BadFrame("shape", f"{where}.{key} missing or not an object")
    return value


def sane_time(text: str, where: str, now: datetime | None = None) -> datetime:
    """An RFC 3339 time within 2000-01-01 .. now + 1 day; raises BadFrame("time")."""
    try:
        ts = parse_time(text)
    except ValueError:
        raise BadFrame("time", f"{where} is not an RFC 3339 time") from None
    now = now or datetime.now(UTC)
    if not _EARLIEST <= ts <= now + _FUTURE_SLACK:
        raise BadFrame("time", f"{where} {text[:40]!r} is outside 2000-01-01 .. now + 1 day")
    return ts


def parse_envelope(data: bytes | str) -> Envelope:
    obj, clean = _decode(data, check_clean=True)
    metadata = _obj(obj, "metadata", "frame")
    payload = obj.get("payload")
    if not isinstance(payload, dict):
        raise BadFrame("shape", "frame.payload missing or not an object")
    sub_type = metadata.get("subscription_type")
    sub_version = metadata.get("subscription_version")
    return _new_envelope(
        _str(metadata, "message_id", "metadata"), _str(metadata, "message_type", "metadata"),
        sane_time(_str(metadata, "message_timestamp", "metadata"), "metadata.message_timestamp"),
        sub_type if isinstance(sub_type, str) and sub_type else None,
        sub_version if isinstance(sub_version, str) else None, payload, clean)


# Built on every frame: without the frozen dataclass's `__init__` (see `slot_setters`).
(_set_message_id, _set_message_type, _set_timestamp, _set_subscription_type,
 _set_subscription_version, _set_payload, _set_clean) = slot_setters(
    Envelope, ("message_id", "message_type", "timestamp", "subscription_type",
               "subscription_version", "payload", "clean"))
_set_chat, _set_event, _set_gift, _set_stream = slot_setters(
    Notification, ("chat", "event", "gift", "stream"))


def _new_envelope(message_id: str, message_type: str, timestamp: datetime, subscription_type: str | None,
                  subscription_version: str | None, payload: Mapping[str, Any], clean: bool) -> Envelope:
    env: Envelope = object.__new__(Envelope)
    _set_message_id(env, message_id)
    _set_message_type(env, message_type)
    _set_timestamp(env, timestamp)
    _set_subscription_type(env, subscription_type)
    _set_subscription_version(env, subscription_version)
    _set_payload(env, payload)
    _set_clean(env, clean)
    return env


def _chat_note(chat: ChatMessage) -> Notification:
    """`Notification(chat=chat)`, built the fast way."""
    note: Notification = object.__new__(Notification)
    _set_chat(note, chat)
    _set_event(note, None)
    _set_gift(note, None)
    _set_stream(note, None)
    return note


def interpret(account_id: int, data: bytes | str) -> Interpreted:
    """Classify one WebSocket frame and map it if it is a notification; raises BadFrame."""
    env = parse_envelope(data)
    if env.message_type in CONTROL_TYPES:
        return Interpreted("control", env)
    if env.message_type != "notification":
        return Interpreted("unsupported", env)
    sub_type = env.subscription_type or subscription_type_of(env.payload)
    items = map_notification(account_id, sub_type, env.payload, env.message_id, env.timestamp,
                             known_clean=env.clean)
    kind: Literal["chat", "event"] = "chat" if items and items[0].chat is not None else "event"
    return Interpreted(kind, env, tuple(items))


def subscription_type_of(body: Mapping[str, Any]) -> str:
    """The subscription type named inside a notification body (payload.subscription.type)."""
    return _str(_obj(body, "subscription", "payload"), "type", "payload.subscription")


def channel_of(body: Mapping[str, Any]) -> str | None:
    """The Twitch user id of the channel a subscription is about (its condition)."""
    sub = body.get("subscription")
    condition = sub.get("condition") if isinstance(sub, dict) else None
    if not isinstance(condition, dict):
        return None
    for key in _CHANNEL_KEYS:
        value = condition.get(key)
        if isinstance(value, str) and value:
            return value
    return None


# --------------------------------------------------------------------------- notifications


def map_notification(account_id: int, sub_type: str, body: Mapping[str, Any], delivery_id: str,
                     delivery_time: datetime, *, known_clean: bool = False) -> list[Notification]:
    """The rows of one notification body ({subscription, event} or batched {events: [...]}).

    `known_clean`: the body comes from a frame that passed `frame_is_clean`.
    """
    if not sub_type:
        raise BadFrame("shape", "notification without a subscription type")
    if "event" not in body and isinstance(body.get("events"), list):
        # Batched delivery (is_batching_enabled): one row per item, each with its own id.
        out: list[Notification] = []
        for i, item in enumerate(body["events"]):
            if not isinstance(item, dict):
                raise BadFrame("shape", f"payload.events[{i}] is not an object")
            item_id = item.get("id") if isinstance(item.get("id"), str) and item.get("id") else None
            out.append(_one(account_id, sub_type, _obj(item, "data", f"payload.events[{i}]"),
                            item_id or f"{delivery_id}:{i}", delivery_time, known_clean))
        return out
    return [_one(account_id, sub_type, _obj(body, "event", "payload"), delivery_id, delivery_time,
                 known_clean)]


def _one(account_id: int, sub_type: str, event: Mapping[str, Any], delivery_id: str,
         delivery_time: datetime, known_clean: bool = False) -> Notification:
    if sub_type == CHAT_TYPE:
        return _chat_note(map_chat(account_id, event, delivery_time, known_clean=known_clean))
    own_time = _own_time(sub_type, event)
    created_at = own_time or delivery_time
    own_key = _OWN_ID.get(sub_type)
    own_id = event.get(own_key) if own_key else None
    external_id = own_id if isinstance(own_id, (str, int)) and str(own_id) else delivery_id
    follower = event.get("user_id")
    if sub_type == FOLLOW_TYPE and own_time is not None and isinstance(follower, str) and follower:
        # From the content, so Helix's follower list (followers.py) names the same row.
        external_id = follow_external_id(follower, own_time)
    ev = PlatformEvent.new(account_id=account_id, platform=PLATFORM, type=sub_type, payload=event,
                           created_at=created_at, external_id=str(external_id),
                           user_id=_user_of(event), known_clean=known_clean)
    return Notification(event=ev, gift=_gift_of(sub_type, event), stream=_stream_of(sub_type, event, ev))


def follow_external_id(user_id: str, followed_at: datetime) -> str:
    """A follow's key on every path: EventSub (socket, webhook) and Helix's follower list."""
    return f"follow:{user_id}:{int(followed_at.timestamp())}"


def map_chat(account_id: int, event: Mapping[str, Any], delivery_time: datetime, *,
             known_clean: bool = False) -> ChatMessage:
    message = event.get("message")
    text = message.get("text") if isinstance(message, dict) else None
    extras: dict[str, Any] = {k: v for k in _CHAT_EXTRAS if (v := event.get(k)) is not None}
    if isinstance(message, dict) and isinstance(message.get("fragments"), list):
        extras["fragments"] = message["fragments"]
    return ChatMessage.create(
        platform=PLATFORM, account_id=account_id, message_id=_str(event, "message_id", "event"),
        created_at=delivery_time, user_id=_text(event.get("chatter_user_id")),
        user_login=_text(event.get("chatter_user_login")),
        display_name=_text(event.get("chatter_user_name")),
        text=text if isinstance(text, str) else "", extras=extras, known_clean=known_clean)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


def _own_time(sub_type: str, event: Mapping[str, Any]) -> datetime | None:
    key = _OWN_TIME.get(sub_type)
    value = event.get(key) if key else None
    if not isinstance(value, str):
        return None
    try:
        return sane_time(value, f"event.{key}")
    except BadFrame:
        return None  # the delivery timestamp is the fallback, as for types without one


def _user_of(event: Mapping[str, Any]) -> str | None:
    for key in _USER_FIELDS:
        value = event.get(key)
        if isinstance(value, (str, int)) and str(value):
            return str(value)
    return None


def _gift_of(sub_type: str, event: Mapping[str, Any]) -> Gift | None:
    tier = _text(event.get("tier"))
    if sub_type == GIFT_TYPE:
        total = event.get("total")
        return Gift("bomb", tier, total if isinstance(total, int) and total > 0 else 0)
    if sub_type == SUB_TYPE and event.get("is_gift") is True:
        return Gift("recipient", tier)
    return None


def _stream_of(sub_type: str, event: Mapping[str, Any], ev: PlatformEvent) -> StreamChange | None:
    if sub_type == "stream.online":
        stream_id = event.get("id")
        return StreamChange("online", str(stream_id) if stream_id else None, ev.created_at, PLATFORM)
    if sub_type == "stream.offline":
        return StreamChange("offline", None, ev.created_at, PLATFORM)
    return None
