"""The frames the conformance tests replay: the recorded corpus where it exists, else the project's own.

The recorded corpus (`support.CORPUS`, `../shared/corpus` beside the
repository, or `LUMIO_INGESTD_CORPUS`) holds third-party captures and
documentation examples of every platform's wire messages. It is not part of
the repository and its frames are never copied in (their licences do not allow
it), so a user's clone does not have it. Without it, every conformance test
(`tests/sources/<platform>/test_<platform>_corpus.py`,
`tests/sources/test_hotpath_every_path.py`) runs on the project's own frames,
made here in the same line format (`kind`, `frame`, `raw`, `headers`,
`verify`, ...): every kind of frame each source handles or refuses, payload-
only Twitch lines, a revocation and two session_reconnects, webhook requests
signed with the stand-ins' own Kick key and Twitch secrets. What is bound to
a particular capture is checked with the recorded corpus only: its counts,
Kick's real signed delivery against the key the package ships, the many DIDs
of the Jetstream capture that do not fit a URL. Nothing is skipped; pytest's
header and summary say which frames ran (`report_lines`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import support
from lumio_ingestd.devkit.standins import twitch_events as tev
from lumio_ingestd.devkit.standins.kick import test_key_pair
from lumio_ingestd.sources.twitch import helix
from lumio_ingestd.sources.twitch.webhook import signature as twitch_signature


@dataclass(frozen=True)
class Corpus:
    """Where the frames come from: `recorded` True for the recorded corpus."""

    directory: Path
    recorded: bool

    def lines(self, name: str) -> list[dict[str, Any]]:
        if self.recorded:
            with (self.directory / name).open(encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.strip()]
        own: Callable[[], list[dict[str, Any]]] | None = _OWN.get(name)
        if own is None:  # never a silent skip: a new corpus file needs own frames here
            raise AssertionError(f"{name}: the recorded corpus is not at {self.directory} and "
                                 "tests/support/corpus.py has no own frames for it")
        return own()

    def kick_key_pem(self) -> str:
        """The public key the corpus's signed Kick deliveries verify against."""
        if self.recorded:
            return (self.directory / "kick_webhook_public_key.pem").read_text()
        return test_key_pair().public_pem()


CORPUS = Corpus(support.CORPUS, support.CORPUS.is_dir())


def report_lines() -> list[str]:
    """What pytest's header and summary say about the corpus."""
    if CORPUS.recorded:
        return [f"corpus: the conformance tests replay the recorded platform frames in {CORPUS.directory}"]
    return [f"corpus: no recorded corpus at {CORPUS.directory} (it is not part of the repository): "
            "the conformance tests (tests/sources/*/test_*_corpus.py, "
            "tests/sources/test_hotpath_every_path.py) run on the project's own frames "
            "(tests/support/corpus.py); the checks bound to recorded captures were not made "
            "(docs/development.rst, \"Tests\")"]


# --------------------------------------------------------------------------- own frames

def _user(user_id: int, name: str, **extra: Any) -> dict[str, Any]:
    return {"is_anonymous": False, "user_id": user_id, "username": name, "is_verified": False,
            "profile_picture": "", "channel_slug": name.lower(), "identity": None, **extra}


def _webhook(event_type: str, label: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"source": "lumio-ingestd tests (own)", "license": "the project's", "transport": "webhook",
            "kind": f"webhook {event_type} v1 ({label})", "frame": body, "raw": json.dumps(body),
            "headers": {"Kick-Event-Type": event_type, "Kick-Event-Version": "1"}}


def _pusher(kind: str, frame: dict[str, Any]) -> dict[str, Any]:
    return {"source": "lumio-ingestd tests (own)", "license": "the project's",
            "transport": "pusher-websocket", "kind": kind, "frame": frame, "raw": json.dumps(frame)}


def _chat_data(message_id: str, chatroom: int, content: str, created_at: str, sender: int,
               name: str, **extra: Any) -> dict[str, Any]:
    return {"id": message_id, "chatroom_id": chatroom, "content": content, "type": "message",
            "created_at": created_at, "sender": {"id": sender, "username": name, "slug": name.lower(),
                                                 "identity": {"color": "#00AA00", "badges": []}},
            **extra}


@functools.cache
def _kick() -> tuple[dict[str, Any], ...]:
    broadcaster = _user(5550001, "OwnStreamer", is_verified=True)
    fan = _user(5550002, "own_fan")
    out = [
        _webhook("chat.message.sent", "chat", {
            "message_id": "own-kick-wh-1", "broadcaster": broadcaster, "sender": fan,
            "content": "hello from the webhook [emote:1:wave]", "emotes": [],
            "created_at": "2026-01-05T17:00:01Z"}),
        _webhook("channel.followed", "follow", {"broadcaster": broadcaster, "follower": fan}),
        _webhook("channel.subscription.renewal", "renewal", {
            "broadcaster": broadcaster, "subscriber": fan, "duration": 4,
            "created_at": "2026-01-05T17:00:02Z", "expires_at": "2026-02-05T17:00:02Z"}),
        _webhook("channel.subscription.gifts", "gifts", {
            "broadcaster": broadcaster, "gifter": fan,
            "giftees": [_user(5550003, "own_giftee_a"), _user(5550004, "own_giftee_b")],
            "created_at": "2026-01-05T17:00:03Z", "expires_at": "2026-02-05T17:00:03Z"}),
        _webhook("channel.subscription.gifts", "anonymous gifts", {
            "broadcaster": broadcaster, "gifter": {"is_anonymous": True},
            "giftees": [_user(5550005, "own_giftee_c")],
            "created_at": "2026-01-05T17:00:04Z", "expires_at": "2026-02-05T17:00:04Z"}),
        _webhook("channel.subscription.new", "new", {
            "broadcaster": broadcaster, "subscriber": fan, "duration": 1,
            "created_at": "2026-01-05T17:00:05Z", "expires_at": "2026-02-05T17:00:05Z"}),
        _webhook("channel.reward.redemption.updated", "redemption", {
            "id": "01OWNREDEMPTION000000000001", "user_input": "a song please", "status": "accepted",
            "redeemed_at": "2026-01-05T17:00:06.500Z",
            "reward": {"id": "01OWNREWARD0000000000000001", "title": "Song", "cost": 500,
                       "description": "pick a song"},
            "redeemer": {"user_id": 5550002, "username": "own_fan", "is_verified": False,
                         "profile_picture": "", "channel_slug": "own_fan"},
            "broadcaster": {"user_id": 5550001, "username": "OwnStreamer", "is_verified": True,
                            "profile_picture": "", "channel_slug": "ownstreamer"}}),
        _webhook("livestream.status.updated", "started", {
            "broadcaster": broadcaster, "is_live": True, "title": "Own stream",
            "started_at": "2026-01-05T16:00:00+01:00", "ended_at": None}),
        _webhook("livestream.status.updated", "ended", {
            "broadcaster": broadcaster, "is_live": False, "title": "Own stream",
            "started_at": "2026-01-05T16:00:00+01:00", "ended_at": "2026-01-05T19:00:00+01:00"}),
        _webhook("livestream.metadata.updated", "metadata", {
            "broadcaster": broadcaster, "metadata": {
                "title": "Own stream, part two", "language": "de", "has_mature_content": False,
                "category": {"id": 7, "name": "Just Chatting", "thumbnail": ""}}}),
        _webhook("moderation.banned", "timeout", {
            "broadcaster": broadcaster, "moderator": _user(5550006, "own_mod"),
            "banned_user": _user(5550007, "own_troll"),
            "metadata": {"reason": "spam", "created_at": "2026-01-05T17:00:07Z",
                         "expires_at": "2026-01-05T17:10:07Z"}}),
        _webhook("kicks.gifted", "kicks", {
            "broadcaster": {k: v for k, v in broadcaster.items() if k not in ("is_anonymous", "identity")},
            "sender": {k: v for k, v in fan.items() if k not in ("is_anonymous", "identity")},
            "gift": {"amount": 100, "name": "Hype", "type": "BASIC", "tier": "BASIC", "message": "gg",
                     "pinned_time_seconds": 0},
            "created_at": "2026-01-05T17:00:08.250Z"}),
    ]
    signed = {"broadcaster": broadcaster, "is_live": True, "title": "Signed stream",
              "started_at": "2026-01-05T17:30:00Z", "ended_at": None}
    raw = json.dumps(signed)
    message_id = "01OWNSIGNEDDELIVERY0000001"
    key = test_key_pair()
    out.append({**_webhook("livestream.status.updated", "signed with the stand-in's key", signed),
                "raw": raw, "verify": {"signature_valid": True},
                "headers": {"Kick-Event-Message-Id": message_id,
                            "Kick-Event-Message-Timestamp": "2026-01-05T17:30:19Z",
                            "Kick-Event-Signature": key.sign(
                                f"{message_id}.2026-01-05T17:30:19Z.{raw}".encode()),
                            "Kick-Event-Type": "livestream.status.updated", "Kick-Event-Version": "1"}})
    room = 700001
    out += [
        _pusher("pusher:ChatMessageEvent (chatrooms.<id>.v2)", {
            "event": "App\\Events\\ChatMessageEvent", "channel": f"chatrooms.{room}.v2",
            "data": json.dumps(_chat_data("own-kick-1", room, "hi there", "2026-01-05T17:01:00+00:00",
                                          6660001, "OwnChatter"))}),
        _pusher("pusher:ChatMessageEvent inner data only (decoded)",
                _chat_data("own-kick-2", room, "just the data", "2026-01-05T17:01:01+00:00", 6660002,
                           "OtherChatter")),
        _pusher("pusher:ChatMessageEvent (emote content, escaped slashes)", {
            "event": "App\\Events\\ChatMessageEvent", "channel": f"chatrooms.{room}.v2",
            "data": json.dumps(_chat_data("own-kick-3", room, "[emote:42:wave] a/b",
                                          "2026-01-05T17:01:02Z", 6660003, "Emoter")).replace("/", "\\/")}),
        _pusher("pusher:ChatMessageEvent with metadata.message_ref", {
            "event": "App\\Events\\ChatMessageEvent", "channel": f"chatrooms.{room}.v2",
            "data": json.dumps(_chat_data("own-kick-4", room, "with a ref", "2026-01-05T17:01:03+00:00",
                                          6660004, "Reffer", metadata={"message_ref": "1767632463000"}))}),
        _pusher("pusher:UserBannedEvent (timeout, has expires_at)", {
            "event": "App\\Events\\UserBannedEvent", "channel": f"chatrooms.{room}.v2",
            "data": json.dumps({"id": "own-ban-1", "user": {"id": 6660005, "username": "Loud",
                                                              "slug": "loud"},
                                "banned_by": {"id": 6660006, "username": "Mod", "slug": "mod"},
                                "expires_at": "2026-01-05T17:11:00+00:00"})}),
        _pusher("pusher:connection_established", {
            "event": "pusher:connection_established",
            "data": json.dumps({"socket_id": "4242.1717", "activity_timeout": 120})}),
        _pusher("pusher_internal:subscription_succeeded", {
            "event": "pusher_internal:subscription_succeeded", "channel": f"chatrooms.{room}.v2",
            "data": "{}"}),
        _pusher("pusher:ping (server->client)", {"event": "pusher:ping", "data": {}}),
        _pusher("pusher:ChatMessageSentEvent (LEGACY v1 chatroom channel, gift info message)", {
            "event": "App\\Events\\ChatMessageSentEvent", "channel": f"chatrooms.{room}",
            "data": json.dumps({"message": {"id": "own-legacy-1", "message": None, "type": "info",
                                            "chatroom_id": room, "created_at": 1767632500,
                                            "action": "gift", "subscriptions_count": 2},
                                "user": {"id": 6660007, "username": "OldGifter"}})}),
        _pusher("pusher:LuckyUsersWhoGotGiftSubscriptionsEvent (channel.<id>)", {
            "event": "App\\Events\\LuckyUsersWhoGotGiftSubscriptionsEvent", "channel": "channel.700002",
            "data": json.dumps({"channel": {"id": 700002, "chatroom": {"id": room}},
                                "usernames": ["lucky_one", "lucky_two", "lucky_three"],
                                "gifter_username": "Generous"})}),
    ]
    return tuple(out)


@functools.cache
def _jetstream() -> tuple[dict[str, Any], ...]:
    def line(kind: str, frame: dict[str, Any], direction: str = "server->client") -> dict[str, Any]:
        return {"source": "lumio-ingestd tests (own)", "license": "the project's", "kind": kind,
                "direction": direction, "frame": frame, "raw": json.dumps(frame, indent=1)}

    def commit(did: str, t: int, op: str, collection: str, rkey: str, rev: str,
               record: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"rev": rev, "operation": op, "collection": collection, "rkey": rkey}
        if record is not None:
            body.update(record=record, cid=f"bafyown{rkey}{rev}")
        return line(f"commit/{op} {collection}", {"did": did, "time_us": t, "kind": "commit",
                                                  "commit": body})

    a, b = "did:plc:ownaaaaaaaaaaaaaaaaaaaaa", "did:plc:ownbbbbbbbbbbbbbbbbbbbbb"
    t = 1_767_632_400_000_000
    post = {"$type": "app.bsky.feed.post", "text": "own post", "createdAt": "2026-01-05T17:00:00Z"}
    return (
        commit(a, t + 1, "create", "app.bsky.feed.post", "3own1", "3ownrev1", post),
        commit(a, t + 2, "update", "app.bsky.feed.post", "3own1", "3ownrev2", {**post, "text": "edited"}),
        commit(b, t + 3, "create", "app.bsky.feed.like", "3own2", "3ownrev3",
               {"$type": "app.bsky.feed.like", "createdAt": "2026-01-05T17:00:01Z",
                "subject": {"uri": f"at://{a}/app.bsky.feed.post/3own1", "cid": "bafyown"}}),
        commit(b, t + 4, "create", "place.own.custom", "3own3", "3ownrev4",
               {"$type": "place.own.custom", "n": 1}),
        commit(b, t + 5, "delete", "app.bsky.feed.like", "3own2", "3ownrev5"),
        line("identity", {"did": a, "time_us": t + 6, "kind": "identity",
                          "identity": {"did": a, "seq": 7, "time": "2026-01-05T17:00:02Z"}}),
        line("identity (with a handle)", {"did": b, "time_us": t + 7, "kind": "identity",
                                          "identity": {"did": b, "handle": "own.example", "seq": 8,
                                                       "time": "2026-01-05T17:00:03Z"}}),
        line("account", {"did": a, "time_us": t + 8, "kind": "account",
                         "account": {"active": True, "did": a, "seq": 9,
                                     "time": "2026-01-05T17:00:04Z"}}),
        line("account (deactivated)", {"did": b, "time_us": t + 9, "kind": "account",
                                       "account": {"active": False, "status": "deactivated", "did": b,
                                                   "seq": 10, "time": "2026-01-05T17:00:05Z"}}),
        line("heartbeat", {"kind": "heartbeat", "payload": ""}),
        line("client options_update", {"type": "options_update", "payload": {
            "wantedCollections": ["app.bsky.feed.post"], "wantedDids": [a]}}, "client->server"),
        line("client heartbeat", {"type": "heartbeat", "payload": ""}, "client->server"),
        line("OLD SCHEMA commit (type com)", {"did": a, "time_us": t + 10, "type": "com",
                                              "commit": {"type": "c", "collection": "app.bsky.feed.post",
                                                         "rkey": "3own9", "rev": "3ownrev9"}}),
    )


def _twitch_line(kind: str, frame: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"source": "lumio-ingestd tests (own)", "license": "the project's", "kind": kind,
            "frame": frame, "raw": json.dumps(frame, separators=(",", ":")), **extra}


def _twitch_events() -> list[tuple[str, str, dict[str, Any]]]:
    """(type, version, event) of every type the source subscribes to, and two it does not."""
    return [
        ("channel.chat.message", "1", tev.chat_event("own-chat-1", "hello from the own frames")),
        ("channel.chat.notification", "1", tev.notification_event("own-notice-1", "resub")),
        ("channel.subscribe", "1", tev.sub_event("7001", is_gift=False)),
        ("channel.subscription.gift", "1", tev.gift_event(5, "7002")),
        ("channel.subscription.message", "1", tev.resub_message_event("7003", 7)),
        ("channel.cheer", "1", tev.cheer_event("7004", 250)),
        ("channel.raid", "1", tev.raid_event("7005", 42)),
        ("channel.follow", "2", tev.follow_event("7006", "2026-01-05T17:20:00.123456789Z")),
        ("channel.channel_points_custom_reward_redemption.add", "1", tev.redemption_event("own-red-1")),
        # Offline first: after an online, the offline is keyed by the stream it ends instead.
        ("stream.offline", "1", tev.offline_event()),
        ("stream.online", "1", tev.online_event("own-stream-1", "2026-01-05T17:00:00Z")),
        ("channel.ban", "1", {"user_id": "7007", "user_login": "banned", "user_name": "Banned",
                              "broadcaster_user_id": tev.BROADCASTER, "broadcaster_user_login": "twitch",
                              "broadcaster_user_name": "Twitch", "moderator_user_id": "7008",
                              "reason": "spam", "banned_at": "2026-01-05T17:21:00Z",
                              "is_permanent": True, "ends_at": None}),
        ("channel.update", "2", {"broadcaster_user_id": tev.BROADCASTER, "broadcaster_user_login": "twitch",
                                 "broadcaster_user_name": "Twitch", "title": "own title",
                                 "language": "en", "category_id": "509658",
                                 "category_name": "Just Chatting", "content_classification_labels": []}),
    ]


def _payload(sub_type: str, version: str, event: dict[str, Any], transport: dict[str, Any]
             ) -> dict[str, Any]:
    return {"subscription": {"id": f"own-sub-{sub_type}", "status": "enabled", "type": sub_type,
                             "version": version, "cost": 0,
                             "condition": helix.condition_for(sub_type, tev.BROADCASTER),
                             "transport": transport, "created_at": "2026-01-05T17:00:00.5Z"},
            "event": event}


@functools.cache
def _twitch_ws() -> tuple[dict[str, Any], ...]:
    ws = {"method": "websocket", "session_id": "AgoQown"}

    def control(kind: str, message_type: str, payload: dict[str, Any], n: int) -> dict[str, Any]:
        return _twitch_line(kind, {"metadata": {"message_id": f"own-control-{n}",
                                                "message_type": message_type,
                                                "message_timestamp": "2026-01-05T17:00:00.1Z"},
                                   "payload": payload})

    session = {"id": "AgoQown", "status": "connected", "connected_at": "2026-01-05T17:00:00.1Z",
               "keepalive_timeout_seconds": 10, "reconnect_url": None}
    out = [
        control("session_welcome", "session_welcome", {"session": session}, 1),
        control("session_keepalive", "session_keepalive", {}, 2),
        control("session_keepalive (again)", "session_keepalive", {}, 3),
    ]
    for n, (sub_type, version, event) in enumerate(_twitch_events()):
        out.append(_twitch_line(f"notification {sub_type} v{version}", {
            "metadata": {"message_id": f"own-ws-{n}", "message_type": "notification",
                         "message_timestamp": f"2026-01-05T17:10:{n:02d}.5Z",
                         "subscription_type": sub_type, "subscription_version": version},
            "payload": _payload(sub_type, version, event, ws)}))
    for n, (sub_type, version, event) in enumerate(_twitch_events()[1:6]):
        event = {**event, **({"message_id": f"own-payload-{n}"} if "message_id" in event else {})}
        out.append(_twitch_line(f"PAYLOAD ONLY {sub_type}", _payload(sub_type, version, event, ws)))
    revoked = _payload("channel.cheer", "1", {}, ws)["subscription"]
    out.append(control("revocation channel.cheer", "revocation",
                       {"subscription": {**revoked, "status": "authorization_revoked"}}, 4))
    for n in (5, 6):
        out.append(control("session_reconnect", "session_reconnect", {"session": {
            **session, "status": "reconnecting", "keepalive_timeout_seconds": None,
            "reconnect_url": "wss://eventsub.wss.twitch.tv/ws?reconnect=own"}}, n))
    return tuple(out)


#: The own signed webhook requests: (secret, message id, timestamp, body).
_SIGNED: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
    ("own-secret-1", "own-signed-follow", "2026-01-05T17:30:00.5Z", {
        "subscription": {"id": "own-signed-sub-1", "status": "enabled", "type": "channel.follow",
                         "version": "1", "condition": {"broadcaster_user_id": "44429626"},
                         "transport": {"method": "webhook", "callback": "https://own.example/hook"},
                         "created_at": "2026-01-05T17:29:00Z"},
        "event": {"user_id": "7101", "user_login": "ownfollower", "user_name": "OwnFollower",
                  "broadcaster_user_id": "44429626", "broadcaster_user_login": "ownhost",
                  "broadcaster_user_name": "OwnHost"}}),
    ("own-secret-2", "own-signed-verification", "2026-01-05T17:31:00.5Z", {
        "challenge": "own-challenge-1",
        "subscription": {"id": "own-signed-sub-2", "status": "webhook_callback_verification_pending",
                         "type": "channel.subscribe", "version": "1",
                         "condition": {"broadcaster_user_id": "88525095"},
                         "transport": {"method": "webhook", "callback": "https://own.example/hook"},
                         "created_at": "2026-01-05T17:31:00Z", "cost": 0}}),
)


@functools.cache
def _twitch_webhook() -> tuple[dict[str, Any], ...]:
    hook = {"method": "webhook", "callback": "https://own.example/hook"}
    out = [_twitch_line(f"notification body {sub_type} v{version}",
                        _payload(sub_type, version, event, hook))
           for sub_type, version, event in _twitch_events()]
    for secret, message_id, timestamp, body in _SIGNED:
        raw = json.dumps(body, separators=(",", ":"))
        message_type = "webhook_callback_verification" if "challenge" in body else "notification"
        out.append(_twitch_line(f"{message_type} {body['subscription']['type']} (signed, own secret)",
                                body, raw=raw, verify={"hmac_secret": secret, "signature_valid": True},
                                headers={
            "Twitch-Eventsub-Message-Id": message_id, "Twitch-Eventsub-Message-Retry": "0",
            "Twitch-Eventsub-Message-Signature": twitch_signature(secret, message_id, timestamp,
                                                                  raw.encode()),
            "Twitch-Eventsub-Message-Timestamp": timestamp,
            "Twitch-Eventsub-Message-Type": message_type,
            "Twitch-Eventsub-Subscription-Type": body["subscription"]["type"],
            "Twitch-Eventsub-Subscription-Version": "1"}))
    return tuple(out)


def _se_line(kind: str, frame: dict[str, Any], direction: str = "server->client") -> dict[str, Any]:
    return {"source": "lumio-ingestd tests (own)", "license": "the project's", "kind": f"astro {kind}",
            "direction": direction, "frame": frame, "raw": json.dumps(frame)}


#: The own StreamElements tip: its id, and the times its moderation frames carry.
SE_TIP = {"id": "own0000000000000000tip01", "created_at": "2026-01-05T17:40:09.302Z",
          "pending_at": "2026-01-05T17:40:17.099Z", "allowed_at": "2026-01-05T17:40:25.924Z"}


@functools.cache
def _streamelements() -> tuple[dict[str, Any], ...]:
    room = "own00000000000000000room"
    donation = {"user": {"username": "OwnTipper", "geo": "ZZ", "email": "tipper@own.example",
                         "channel": room},
                "message": "for the stream", "amount": 4.2, "currency": "USD", "paymentMethod": "card"}

    def tip(frame_id: str, topic: str, approved: str, updated: str, **extra: Any) -> dict[str, Any]:
        return {"id": frame_id, "ts": updated[:19] + "Z", "type": "message", "topic": topic, "room": room,
                "data": {"donation": donation, "_id": SE_TIP["id"], "channel": room, "provider": "card",
                         "approved": approved, "status": "success", "createdAt": SE_TIP["created_at"],
                         "updatedAt": updated, "transactionId": "OWN-TX-1", **extra}}

    return (
        _se_line("welcome", {"id": "01OWNWELCOME", "ts": "2026-01-05T17:39:00Z", "type": "welcome",
                             "data": {"message": "hello", "client_id": "01OWNCLIENT"}}),
        _se_line("client subscribe channel.activities", {
            "type": "subscribe", "nonce": "own-1", "data": {"topic": "channel.activities", "room": room,
                                                            "token": "eyJown.jwt.sig", "token_type": "jwt"}},
            "client->server"),
        _se_line("client unsubscribe channel.activities", {
            "type": "unsubscribe", "nonce": "own-2", "data": {"topic": "channel.activities"}},
            "client->server"),
        _se_line("response", {"id": "01OWNRESP1", "ts": "2026-01-05T17:39:01Z", "type": "response",
                              "nonce": "own-1", "data": {"message": "subscribed",
                                                         "topic": "channel.activities", "room": room}}),
        _se_line("response error=err_bad_request", {
            "id": "01OWNRESP2", "ts": "2026-01-05T17:39:01Z", "type": "response", "nonce": "own-3",
            "error": "err_bad_request", "data": {"message": "no such topic"}}),
        _se_line("reconnect", {"type": "reconnect", "data": {"message": "restarting",
                                                             "reconnect_token": "eyJown.reconnect"}}),
        _se_line("message channel.activities activity=follow/twitch (no _id)", {
            "id": "01OWNACT1", "ts": "2026-01-05T17:39:30Z", "type": "message",
            "topic": "channel.activities", "room": room,
            "data": {"type": "follow", "provider": "twitch", "channel": room}}),
        _se_line("message channel.activities activity=follow/twitch", {
            "id": "01OWNACT2", "ts": "2026-01-05T17:39:31Z", "type": "message",
            "topic": "channel.activities",
            "data": {"type": "follow", "provider": "twitch", "channel": room,
                     "data": {"username": "ownfollower", "displayName": "OwnFollower",
                              "providerId": "7201"},
                     "_id": "own00000000000000follow1", "createdAt": "2026-01-05T17:39:30.608Z",
                     "updatedAt": "2026-01-05T17:39:30.608Z", "activityId": "own00000000000000follow1"}}),
        _se_line("message channel.tips.moderation", tip("01OWNTIP1", "channel.tips.moderation", "pending",
                                                        SE_TIP["pending_at"])),
        _se_line("message channel.tips.moderation", tip("01OWNTIP2", "channel.tips.moderation", "allowed",
                                                        SE_TIP["allowed_at"], approvedBy="owner")),
        _se_line("message channel.tips", tip("01OWNTIP1", "channel.tips", "allowed", SE_TIP["pending_at"])),
        _se_line("message channel.session.reset", {
            "id": "01OWNRESET", "ts": "2026-01-05T17:41:00Z", "type": "message",
            "topic": "channel.session.reset", "data": {"latest-follower": {"name": "OwnFollower"}}}),
        _se_line("DATA ONLY (inner `data` of a 'channel.contests' message) event=state",
                 {"event": "state", "data": {"contestId": "own-contest", "state": "running"}}),
    )


#: The ids and names of the own 7TV frames (7TV's ids are 24 hex digits).
SEVENTV = {"user": "6a0000000000000000000001", "set": "6a0000000000000000000001",
           "new_set": "6a0000000000000000000003", "emote": "6a0000000000000000000004",
           "actor": "own_editor", "name": "OwnEmote", "pushed_as": "OwnEmoteGe"}


@functools.cache
def _seventv() -> tuple[dict[str, Any], ...]:
    ids = SEVENTV
    v3 = "websocket wss://events.7tv.io/v3"
    legacy = "legacy v1 websocket"

    def line(kind: str, frame: dict[str, Any], direction: str = "server->client",
             transport: str = v3) -> dict[str, Any]:
        return {"source": "lumio-ingestd tests (own)", "license": "the project's", "kind": kind,
                "direction": direction, "transport": transport, "frame": frame, "raw": json.dumps(frame)}

    actor = {"id": ids["user"], "username": ids["actor"], "display_name": "Own Editor"}

    def emote(name: str, ts: int) -> dict[str, Any]:
        return {"actor_id": ids["user"], "flags": 0, "id": ids["emote"], "name": name, "timestamp": ts,
                "data": {"animated": False, "flags": 0, "id": ids["emote"], "lifecycle": 3,
                         "listed": True, "name": ids["pushed_as"], "tags": []}}

    pushed = emote(ids["pushed_as"], 1767632600000)
    renamed = emote(ids["name"], 1767632600000)
    emote_set = {"capacity": 300, "immutable": False, "privileged": False, "tags": []}
    return (
        line("op1 HELLO", {"op": 1, "t": 1767632600100, "d": {"heartbeat_interval": 1000,
                                                               "session_id": "own"}}),
        line("op0 DISPATCH emote_set.update (pushed+pulled+updated)", {
            "op": 0, "t": 1767632600000, "d": {"type": "emote_set.update", "body": {
                "id": ids["set"], "kind": 3, "actor": actor,
                "pushed": [{"key": "emotes", "index": 3, "type": "object", "value": pushed}],
                "pulled": [{"key": "emotes", "index": 3, "type": "object", "value": None,
                            "old_value": {"actor_id": ids["user"], "flags": 0, "id": ids["emote"],
                                          "name": ids["name"], "timestamp": -62135596800000}}],
                "updated": [{"key": "emotes", "index": 3, "type": "object",
                             "old_value": {k: v for k, v in pushed.items() if k != "data"},
                             "value": renamed}]}}}),
        line("op0 DISPATCH user.update (connections[0].emote_set changed, nested=true)", {
            "op": 0, "t": 1767632700000, "d": {"type": "user.update", "body": {
                "id": ids["user"], "kind": 1, "actor": actor,
                "updated": [{"key": "connections", "index": 0, "nested": True, "type": "", "value": [
                    {"index": None, "key": "emote_set", "type": "object",
                     "old_value": {**emote_set, "id": ids["set"], "name": "old set"},
                     "value": {**emote_set, "id": ids["new_set"], "name": "new set"}}]}]}}}),
        line("op35 SUBSCRIBE emote_set.update", {"op": 35, "d": {
            "type": "emote_set.update", "condition": {"object_id": ids["set"]}}}, "client->server"),
        line("op36 UNSUBSCRIBE emote_set.update", {"op": 36, "d": {
            "type": "emote_set.update", "condition": {"object_id": ids["set"]}}}, "client->server"),
        line("legacy v1 action=join", {"action": "join", "payload": "ownchannel"}, "client->server",
             legacy),
        line("legacy v1 action=ping", {"action": "ping"}, transport=legacy),
        line("legacy v1 action=ADD", {"channel": "ownchannel", "emote_id": ids["emote"],
                                      "name": ids["name"], "action": "ADD", "actor": "Own"},
             transport=legacy),
    )


def _copy(frames: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """A deep copy: a test may change the frames it was given."""
    copied: list[dict[str, Any]] = json.loads(json.dumps(frames))
    return copied


_OWN: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "kick.jsonl": lambda: _copy(_kick()),
    "seventv.jsonl": lambda: _copy(_seventv()),
    "jetstream.jsonl": lambda: _copy(_jetstream()),
    "streamelements.jsonl": lambda: _copy(_streamelements()),
    "twitch_eventsub_ws.jsonl": lambda: _copy(_twitch_ws()),
    "twitch_eventsub_webhook.jsonl": lambda: _copy(_twitch_webhook()),
}
