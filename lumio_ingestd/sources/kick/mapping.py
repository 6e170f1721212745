"""Kick frames (Pusher socket) and webhook bodies into chat messages and platform events.

Pure functions, no I/O. Both paths map through here so that one chat
message or event seen on the socket and on a webhook becomes one row
(docs/platforms.rst, "What the rows look like", Kick):

- Chat: `message_id` = Kick's message id (Pusher `data.id`, webhook
  `message_id`), `created_at` = Kick's `created_at` cut to the whole second
  (the chat key includes it; the two paths print it with different
  precision), sender id, slug (`user_login`) and username (`display_name`);
  badges, colour, reply metadata and emotes go to the extras.
- Events: `type` = the official webhook event name for both paths
  (`channel.subscription.new`, `channel.subscription.gifts`, `kicks.gifted`,
  `livestream.status.updated`, `moderation.banned`, ...); a Pusher event
  without a webhook counterpart keeps its name without the namespace
  (`StreamHostEvent`, `UserUnbannedEvent`, `MessageDeletedEvent`).
- `external_id`: most Pusher events carry no id, and the webhook's message id
  names the delivery, not the event, so an event that both paths can carry
  gets a content id: `FAMILY:HASH:BUCKET`, HASH over (account, family,
  canonical content: lower-cased user names, sorted giftees, amounts),
  BUCKET = the event time divided by `bucket_secs` (its own time where it
  has one, else when the frame arrived). A repeat inside the bucket is the
  same row; two identical events inside one bucket are one row (accepted:
  a user cannot subscribe twice in five minutes), and a pair that straddles
  a bucket boundary is two rows. Webhook-only events (`channel.followed`,
  `livestream.metadata.updated`, a redemption's later status) use the
  webhook message id; a deletion uses the id Kick gives it.
- A gift is one event with the giftees as `gift_recipient` children; the
  same gift seen again as `LuckyUsersWhoGotGiftSubscriptionsEvent` on the
  channel has the same content id, so it is counted once.
- `livestream.status.updated` carries a `StreamChange`; its stream id (and
  external id) is derived from the stream's start time, which both paths
  give, so both open the same `stream_sessions` row (`stream_key`).

Frames that cannot be used raise `BadFrame` (reasons as for Twitch:
"utf8", "nul", "json", "shape", "time", "too_large"). Nothing durable here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from lumio_ingestd import boundedjson, fastjson
from lumio_ingestd.model import (
    MAX_JSON_DEPTH,
    ChatMessage,
    EventChild,
    PlatformEvent,
    StreamChange,
    frame_is_clean,
)
from lumio_ingestd.sources.base import BadFrame
from lumio_ingestd.sources.twitch.mapping import decode_checked, decode_json, sane_time

PLATFORM = "kick"
BUCKET_SECS = 300
CHILD_KIND = "gift_recipient"

CHAT_TYPE = "chat.message.sent"
GIFTS_TYPE = "channel.subscription.gifts"
STATUS_TYPE = "livestream.status.updated"

#: The ten documented webhook event types (all version 1).
WEBHOOK_TYPES = frozenset({
    "chat.message.sent", "channel.followed", "channel.subscription.new", "channel.subscription.renewal",
    "channel.subscription.gifts", "channel.reward.redemption.updated", "livestream.status.updated",
    "livestream.metadata.updated", "moderation.banned", "kicks.gifted"})


@dataclass(frozen=True, slots=True)
class Item:
    """What a frame or body became: a chat message, or an event (with its stream change)."""

    chat: ChatMessage | None = None
    event: PlatformEvent | None = None
    stream: StreamChange | None = None


@dataclass(frozen=True, slots=True)
class PusherFrame:
    event: str  # as sent, namespace included
    name: str  # the part after the last backslash
    channel: str | None
    data: Any  # `data` decoded (twice when it was a JSON string)
    # Every value in `data` is known clean (`frame_is_clean` passed on the text it came from).
    clean: bool = False


@dataclass(frozen=True, slots=True)
class Interpreted:
    kind: Literal["chat", "event", "control", "unsupported"]
    frame: PusherFrame
    items: tuple[Item, ...] = ()


# --------------------------------------------------------------------------- helpers


def _text(value: object) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


def _low(value: object) -> str:
    return _text(value).strip().lower()


def _obj(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _id(value: object) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, str)) and str(value):
        return str(value)
    return None


def _need_obj(obj: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = obj.get(key)
    if not isinstance(value, dict):
        raise BadFrame("shape", f"{where}.{key} missing or not an object")
    return value


def _need_str(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value:
        raise BadFrame("shape", f"{where}.{key} missing or not a non-empty string")
    return value


def _time(value: object, where: str) -> datetime | None:
    """An event's own time, or None when absent or unusable (the fallback then applies)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        try:
            return datetime.fromtimestamp(float(value), UTC)  # legacy frames: unix seconds
        except (OverflowError, OSError, ValueError):
            return None
    if not isinstance(value, str) or not value:
        return None
    try:
        return sane_time(value, where)
    except BadFrame:
        return None


def _second(ts: datetime) -> datetime:
    return ts.replace(microsecond=0)


def content_id(account_id: int, family: str, content: Sequence[object], at: datetime,
               bucket_secs: int) -> str:
    """The deterministic external id of an event without an id of its own (see the module doc)."""
    canonical = json.dumps([account_id, family, *content], separators=(",", ":"), ensure_ascii=False)
    # surrogatepass: a lone surrogate in a user name (valid JSON, repaired later in the row)
    # must not make the frame raise; any other text hashes as it always did.
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return f"{family}:{digest}:{int(at.timestamp()) // max(1, bucket_secs)}"


def stream_key(account_id: int, started_at: datetime) -> str:
    """The id of one Kick stream (Kick's webhooks carry none): from its start, to the second.

    The socket, the webhook and the stream-status poller all derive it the
    same way, so each gives the same `stream_sessions` row and events row.
    """
    digest = hashlib.sha256(f"{account_id}:{int(started_at.timestamp())}".encode()).hexdigest()[:24]
    return f"live:{digest}"


def _event(account_id: int, type_: str, payload: Mapping[str, Any], at: datetime, external_id: str,
           user_id: object = None, children: tuple[EventChild, ...] = (),
           stream: StreamChange | None = None, *, clean: bool) -> Item:
    """`clean`: every value in `payload` comes from a frame or body that passed `frame_is_clean`."""
    ev = PlatformEvent.new(account_id=account_id, platform=PLATFORM, type=type_, payload=payload,
                           created_at=at, external_id=external_id, user_id=_id(user_id), children=children,
                           known_clean=clean)
    return Item(event=ev, stream=stream)


def _giftees(names: Sequence[object]) -> tuple[list[str], tuple[EventChild, ...]]:
    logins = [_text(n) for n in names if _text(n)]
    children = tuple(EventChild(kind=CHILD_KIND, user_login=n, payload={"username": n}) for n in logins)
    return sorted(n.lower() for n in logins), children


def _gift(account_id: int, payload: Mapping[str, Any], gifter: str, giftees: Sequence[object],
          at: datetime, bucket_secs: int, user_id: object = None,
          children: tuple[EventChild, ...] | None = None, *, clean: bool) -> Item:
    keys, made = _giftees(giftees)
    ext = content_id(account_id, "gift", [_low(gifter), keys], at, bucket_secs)
    return _event(account_id, GIFTS_TYPE, payload, at, ext, user_id,
                  children if children is not None else made, clean=clean)


def _subscription_type(months: object) -> str:
    return "channel.subscription.renewal" if isinstance(months, int) and months > 1 else \
        "channel.subscription.new"


# Handlers: (account, body, message id, sent at, bucket_secs, known clean) -> rows.
_WebhookHandler = Callable[[int, Mapping[str, Any], str, datetime, int, bool], list[Item]]


# --------------------------------------------------------------------------- Pusher


def parse_frame(data: bytes | str) -> PusherFrame:
    """One Pusher frame: `{"event", "channel"?, "data"}`, `data` decoded when it is a JSON string."""
    obj, clean = decode_checked(data)
    event = obj.get("event")
    if not isinstance(event, str) or not event:
        raise BadFrame("shape", "frame.event missing or not a non-empty string")
    channel = obj.get("channel")
    inner = obj.get("data")
    if isinstance(inner, str):
        # Pusher sends `data` as JSON inside a string: that text is what the check reads
        # (the frame around it has a long string and escaped quotes, so it never passes).
        try:
            inner, clean = _decode_inner(inner) if inner else ({}, True)
        except ValueError as exc:
            raise BadFrame("json", f"frame.data of {event[:64]} is a string but not JSON: {exc}") from None
    return PusherFrame(event=event, name=event.rsplit("\\", 1)[-1], channel=channel if isinstance(
        channel, str) else None, data=inner, clean=clean)


def _decode_inner(text: str) -> tuple[Any, bool]:
    """The JSON in a frame's `data` string, and whether its values are known clean."""
    if frame_is_clean(text):
        try:  # depth already scanned by the check
            return boundedjson.loads(text, depth_at_most=MAX_JSON_DEPTH, decode=fastjson.loads_finite), True
        except fastjson.NotFinite:
            return boundedjson.loads(text, depth_at_most=MAX_JSON_DEPTH, decode=fastjson.loads), False
    return boundedjson.loads(text, decode=fastjson.loads), False


def interpret(account_id: int, data: bytes | str, received_at: datetime, *,
              bucket_secs: int = BUCKET_SECS) -> Interpreted:
    """Classify one Pusher frame and map it when it is chat or an event; raises BadFrame."""
    frame = parse_frame(data)
    if frame.event.startswith(("pusher:", "pusher_internal:")):
        return Interpreted("control", frame)
    handler = _PUSHER.get(frame.name)
    if handler is None:
        return Interpreted("unsupported", frame)
    if not isinstance(frame.data, dict):
        raise BadFrame("shape", f"{frame.name}: data is not an object")
    items = tuple(handler(account_id, frame.data, received_at, bucket_secs, frame.clean))
    kind: Literal["chat", "event"] = "chat" if items and items[0].chat is not None else "event"
    return Interpreted(kind, frame, items)


def pusher_chat(account_id: int, d: Mapping[str, Any], received_at: datetime,
                bucket_secs: int, clean: bool) -> list[Item]:
    sender = _obj(d.get("sender"))
    identity = _obj(sender.get("identity"))
    created = _time(d.get("created_at"), "data.created_at") or received_at
    extras: dict[str, Any] = {}
    for key, value in (("type", d.get("type")), ("color", identity.get("color")),
                       ("badges", identity.get("badges")), ("metadata", d.get("metadata"))):
        if value not in (None, [], {}):
            extras[key] = value
    msg = ChatMessage.create(platform=PLATFORM, account_id=account_id,
                             message_id=_need_str(d, "id", "data"), created_at=_second(created),
                             user_id=_text(_id(sender.get("id"))), user_login=_text(sender.get("slug")),
                             display_name=_text(sender.get("username")), text=_text(d.get("content")),
                             extras=extras, known_clean=clean)
    return [Item(chat=msg)]


def pusher_subscription(account_id: int, d: Mapping[str, Any], received_at: datetime,
                        bucket_secs: int, clean: bool) -> list[Item]:
    username = _need_str(d, "username", "data")
    months = d.get("months")
    ext = content_id(account_id, "sub", [_low(username), months if isinstance(months, int) else None],
                     received_at, bucket_secs)
    return [_event(account_id, _subscription_type(months), d, received_at, ext, clean=clean)]


def pusher_gifts(account_id: int, d: Mapping[str, Any], received_at: datetime,
                 bucket_secs: int, clean: bool) -> list[Item]:
    names = d.get("gifted_usernames")
    if not isinstance(names, list):
        raise BadFrame("shape", "data.gifted_usernames missing or not a list")
    return [_gift(account_id, d, _text(d.get("gifter_username")), names, received_at, bucket_secs,
                  clean=clean)]


def pusher_lucky_users(account_id: int, d: Mapping[str, Any], received_at: datetime,
                       bucket_secs: int, clean: bool) -> list[Item]:
    names = d.get("usernames")
    if not isinstance(names, list):
        raise BadFrame("shape", "data.usernames missing or not a list")
    # The channel object repeats the whole channel record: only its id is kept.
    payload = {"usernames": names, "gifter_username": d.get("gifter_username"),
               "channel_id": _obj(d.get("channel")).get("id"),
               "seen_as": "LuckyUsersWhoGotGiftSubscriptionsEvent"}
    return [_gift(account_id, payload, _text(d.get("gifter_username")), names, received_at, bucket_secs,
                  clean=clean)]


def pusher_host(account_id: int, d: Mapping[str, Any], received_at: datetime,
                bucket_secs: int, clean: bool) -> list[Item]:
    host = _need_str(d, "host_username", "data")
    viewers = d.get("number_viewers")
    ext = content_id(account_id, "host", [_low(host), viewers if isinstance(viewers, int) else None],
                     received_at, bucket_secs)
    return [_event(account_id, "StreamHostEvent", d, received_at, ext, clean=clean)]


def pusher_reward(account_id: int, d: Mapping[str, Any], received_at: datetime,
                  bucket_secs: int, clean: bool) -> list[Item]:
    username = _need_str(d, "username", "data")
    ext = content_id(account_id, "reward", [_low(username), _text(d.get("reward_title")),
                                            _text(d.get("user_input"))], received_at, bucket_secs)
    return [_event(account_id, "channel.reward.redemption.updated", d, received_at, ext, d.get("user_id"),
                   clean=clean)]


def pusher_kicks(account_id: int, d: Mapping[str, Any], received_at: datetime,
                 bucket_secs: int, clean: bool) -> list[Item]:
    sender = _obj(d.get("sender"))
    at = _time(d.get("created_at"), "data.created_at") or received_at
    message = d.get("message") if d.get("message") is not None else _obj(d.get("gift")).get("message")
    ext = content_id(account_id, "kicks", [_low(sender.get("username")), _text(message)], at, bucket_secs)
    return [_event(account_id, "kicks.gifted", d, at, ext, sender.get("id"), clean=clean)]


def pusher_live(account_id: int, d: Mapping[str, Any], received_at: datetime,
                bucket_secs: int, clean: bool) -> list[Item]:
    stream = _need_obj(d, "livestream", "data")
    started = _time(stream.get("created_at"), "data.livestream.created_at") or received_at
    key = stream_key(account_id, started)
    change = StreamChange("online", key, started, PLATFORM)
    return [_event(account_id, STATUS_TYPE, d, started, key, stream=change, clean=clean)]


def pusher_offline(account_id: int, d: Mapping[str, Any], received_at: datetime,
                   bucket_secs: int, clean: bool) -> list[Item]:
    ext = content_id(account_id, "offline", [], received_at, bucket_secs)
    return [_event(account_id, STATUS_TYPE, d, received_at, ext,
                   stream=StreamChange("offline", None, received_at, PLATFORM), clean=clean)]


def pusher_banned(account_id: int, d: Mapping[str, Any], received_at: datetime,
                  bucket_secs: int, clean: bool) -> list[Item]:
    user = _need_obj(d, "user", "data")
    ext = content_id(account_id, "ban", [_low(user.get("username")),
                                         _low(_obj(d.get("banned_by")).get("username"))],
                     received_at, bucket_secs)
    return [_event(account_id, "moderation.banned", d, received_at, ext, user.get("id"), clean=clean)]


def pusher_unbanned(account_id: int, d: Mapping[str, Any], received_at: datetime,
                    bucket_secs: int, clean: bool) -> list[Item]:
    user = _need_obj(d, "user", "data")
    own = _id(d.get("id"))
    ext = own or content_id(account_id, "unban", [_low(user.get("username"))], received_at, bucket_secs)
    return [_event(account_id, "UserUnbannedEvent", d, received_at, ext, user.get("id"), clean=clean)]


def pusher_deleted(account_id: int, d: Mapping[str, Any], received_at: datetime,
                   bucket_secs: int, clean: bool) -> list[Item]:
    message_id = _id(_obj(d.get("message")).get("id"))
    own = _id(d.get("id"))
    if own is None and message_id is None:
        raise BadFrame("shape", "MessageDeletedEvent without data.id or data.message.id")
    ext = own or f"deleted:{message_id}"
    return [_event(account_id, "MessageDeletedEvent", d, received_at, ext, clean=clean)]


def foreign_channel(frame: PusherFrame, channels: Sequence[str], chatroom_id: str) -> str | None:
    """Why a chat or event frame is not the account's to store, else None: it came on a channel
    the account's source did not subscribe to (or on none), or its `data.chatroom_id` names
    another chatroom (docs/platforms.rst, "The Pusher socket")."""
    if frame.channel is None:
        return "it names no channel"
    if frame.channel not in channels:
        return f"it came on channel {frame.channel[:80]!r}, not on this account's {', '.join(channels)}"
    room = _id(frame.data.get("chatroom_id")) if isinstance(frame.data, dict) else None
    if room is not None and room != chatroom_id:
        return f"its data.chatroom_id is {room[:32]!r}, not this account's {chatroom_id}"
    return None


_Handler = Callable[[int, Mapping[str, Any], datetime, int, bool], list[Item]]

_PUSHER: Mapping[str, _Handler] = {
    "ChatMessageEvent": pusher_chat,
    "SubscriptionEvent": pusher_subscription,
    "GiftedSubscriptionsEvent": pusher_gifts,
    "LuckyUsersWhoGotGiftSubscriptionsEvent": pusher_lucky_users,
    "StreamHostEvent": pusher_host,
    "RewardRedeemedEvent": pusher_reward,
    "KicksGifted": pusher_kicks,
    "StreamerIsLive": pusher_live,
    "StopStreamBroadcast": pusher_offline,
    "UserBannedEvent": pusher_banned,
    "UserUnbannedEvent": pusher_unbanned,
    "MessageDeletedEvent": pusher_deleted,
}


# --------------------------------------------------------------------------- webhooks


def broadcaster_of(body: Mapping[str, Any]) -> str | None:
    """The Kick user id of the channel a webhook body is about (`broadcaster.user_id`)."""
    return _id(_obj(body.get("broadcaster")).get("user_id"))


def map_webhook(account_id: int, event_type: str, body: Mapping[str, Any], message_id: str,
                sent_at: datetime, *, bucket_secs: int = BUCKET_SECS,
                known_clean: bool = False) -> list[Item] | None:
    """The rows of one webhook body; None for an event type this code does not know.

    `known_clean`: the body passed `frame_is_clean` (`decode_checked`)."""
    handler = _WEBHOOK.get(event_type)
    if handler is None:
        return None
    return handler(account_id, body, message_id, sent_at, bucket_secs, known_clean)


def webhook_chat(account_id: int, b: Mapping[str, Any], message_id: str, sent_at: datetime,
                 bucket_secs: int, clean: bool) -> list[Item]:
    sender = _obj(b.get("sender"))
    identity = _obj(sender.get("identity"))
    created = _time(b.get("created_at"), "body.created_at") or sent_at
    extras: dict[str, Any] = {}
    for key, value in (("color", identity.get("username_color")), ("badges", identity.get("badges")),
                       ("replies_to", b.get("replies_to")), ("emotes", b.get("emotes"))):
        if value not in (None, [], {}):
            extras[key] = value
    msg = ChatMessage.create(platform=PLATFORM, account_id=account_id,
                             message_id=_need_str(b, "message_id", "body"), created_at=_second(created),
                             user_id=_text(_id(sender.get("user_id"))),
                             user_login=_text(sender.get("channel_slug")),
                             display_name=_text(sender.get("username")), text=_text(b.get("content")),
                             extras=extras, known_clean=clean)
    return [Item(chat=msg)]


def webhook_follow(account_id: int, b: Mapping[str, Any], message_id: str, sent_at: datetime,
                   bucket_secs: int, clean: bool) -> list[Item]:
    follower = _obj(b.get("follower"))
    return [_event(account_id, "channel.followed", b, sent_at, message_id, follower.get("user_id"),
                   clean=clean)]


def webhook_subscription(type_: str) -> _WebhookHandler:
    def handle(account_id: int, b: Mapping[str, Any], message_id: str, sent_at: datetime,
               bucket_secs: int, clean: bool) -> list[Item]:
        subscriber = _need_obj(b, "subscriber", "body")
        at = _time(b.get("created_at"), "body.created_at") or sent_at
        duration = b.get("duration")
        ext = content_id(account_id, "sub", [_low(subscriber.get("username")),
                                             duration if isinstance(duration, int) else None],
                         at, bucket_secs)
        return [_event(account_id, type_, b, at, ext, subscriber.get("user_id"), clean=clean)]
    return handle


def webhook_gifts(account_id: int, b: Mapping[str, Any], message_id: str, sent_at: datetime,
                  bucket_secs: int, clean: bool) -> list[Item]:
    gifter = _obj(b.get("gifter"))
    giftees = b.get("giftees")
    if not isinstance(giftees, list):
        raise BadFrame("shape", "body.giftees missing or not a list")
    people = [_obj(g) for g in giftees]
    children = tuple(EventChild(kind=CHILD_KIND, user_id=_id(g.get("user_id")),
                                user_login=_text(g.get("username")) or None,
                                payload={"username": g.get("username")}) for g in people)
    at = _time(b.get("created_at"), "body.created_at") or sent_at
    return [_gift(account_id, b, _text(gifter.get("username")), [g.get("username") for g in people],
                  at, bucket_secs, gifter.get("user_id"), children, clean=clean)]


def webhook_redemption(account_id: int, b: Mapping[str, Any], message_id: str, sent_at: datetime,
                       bucket_secs: int, clean: bool) -> list[Item]:
    redeemer = _obj(b.get("redeemer"))
    reward = _obj(b.get("reward"))
    at = _time(b.get("redeemed_at"), "body.redeemed_at") or sent_at
    status = _text(b.get("status"))
    if status == "pending":  # the redemption itself: what the socket sees as RewardRedeemedEvent
        ext = content_id(account_id, "reward", [_low(redeemer.get("username")), _text(reward.get("title")),
                                                _text(b.get("user_input"))], at, bucket_secs)
    else:  # a later decision on it: the redemption id repeats, so the delivery names this row
        own = _id(b.get("id"))
        ext = f"{own}:{status}" if own and status else message_id
    return [_event(account_id, "channel.reward.redemption.updated", b, at, ext, redeemer.get("user_id"),
                   clean=clean)]


def webhook_status(account_id: int, b: Mapping[str, Any], message_id: str, sent_at: datetime,
                   bucket_secs: int, clean: bool) -> list[Item]:
    is_live = b.get("is_live")
    if not isinstance(is_live, bool):
        raise BadFrame("shape", "body.is_live missing or not a boolean")
    if is_live:
        started = _time(b.get("started_at"), "body.started_at") or sent_at
        key = stream_key(account_id, started)
        return [_event(account_id, STATUS_TYPE, b, started, key,
                       stream=StreamChange("online", key, started, PLATFORM), clean=clean)]
    ended = _time(b.get("ended_at"), "body.ended_at") or sent_at
    ext = content_id(account_id, "offline", [], ended, bucket_secs)
    return [_event(account_id, STATUS_TYPE, b, ended, ext,
                   stream=StreamChange("offline", None, ended, PLATFORM), clean=clean)]


def webhook_metadata(account_id: int, b: Mapping[str, Any], message_id: str, sent_at: datetime,
                     bucket_secs: int, clean: bool) -> list[Item]:
    return [_event(account_id, "livestream.metadata.updated", b, sent_at, message_id, clean=clean)]


def webhook_banned(account_id: int, b: Mapping[str, Any], message_id: str, sent_at: datetime,
                   bucket_secs: int, clean: bool) -> list[Item]:
    banned = _need_obj(b, "banned_user", "body")
    at = _time(_obj(b.get("metadata")).get("created_at"), "body.metadata.created_at") or sent_at
    ext = content_id(account_id, "ban", [_low(banned.get("username")),
                                         _low(_obj(b.get("moderator")).get("username"))], at, bucket_secs)
    return [_event(account_id, "moderation.banned", b, at, ext, banned.get("user_id"), clean=clean)]


def webhook_kicks(account_id: int, b: Mapping[str, Any], message_id: str, sent_at: datetime,
                  bucket_secs: int, clean: bool) -> list[Item]:
    sender = _obj(b.get("sender"))
    at = _time(b.get("created_at"), "body.created_at") or sent_at
    ext = content_id(account_id, "kicks", [_low(sender.get("username")),
                                           _text(_obj(b.get("gift")).get("message"))], at, bucket_secs)
    return [_event(account_id, "kicks.gifted", b, at, ext, sender.get("user_id"), clean=clean)]


_WEBHOOK: Mapping[str, _WebhookHandler] = {
    "chat.message.sent": webhook_chat,
    "channel.followed": webhook_follow,
    "channel.subscription.new": webhook_subscription("channel.subscription.new"),
    "channel.subscription.renewal": webhook_subscription("channel.subscription.renewal"),
    "channel.subscription.gifts": webhook_gifts,
    "channel.reward.redemption.updated": webhook_redemption,
    "livestream.status.updated": webhook_status,
    "livestream.metadata.updated": webhook_metadata,
    "moderation.banned": webhook_banned,
    "kicks.gifted": webhook_kicks,
}

__all__ = ["BadFrame", "Interpreted", "Item", "PLATFORM", "PusherFrame", "broadcaster_of", "content_id",
           "decode_checked", "decode_json", "foreign_channel", "interpret", "map_webhook", "parse_frame",
           "stream_key"]
