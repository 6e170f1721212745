"""The demo's traffic: what a couple of live channels send, played through the stand-ins.

`Traffic` is a worker thread that, every 0.1 s, sends the chat due by then
and whatever the timeline holds for the current half second:

- both channels go live (`stream.online`) on the first turn and offline
  (`stream.offline`) in `final()`, when the demo stops it; meanwhile Helix
  `/streams` of the stand-in shows them live with a wandering viewer count,
  which the daemon's stream-status poller samples into `stream_stats`;
- chat at `rate` messages per second across the two channels (60/40), three
  times as much for the two seconds after a raid;
- a ten-second cycle of events, alternating the channels: follows, a sub,
  cheers, a resub (both as `channel.subscription.message` and as a
  `channel.chat.notification`), a gift bomb (one community gift of five and
  the five gifted subs), channel points, a raid;
- on Bluesky, a post by one of the accounts' DIDs every second, a like every
  four seconds, and posts by other DIDs (which the daemon's `wantedDids`
  filter keeps out) in between;
- on 7TV, twice a cycle, an emote added to the cycle's account's emote set,
  renamed, or removed (in turn per account: the first cycle adds and renames,
  so a short run shows both), made through the stand-in's "website" and
  dispatched on the EventAPI: each is one `emote.*` event;
- on Kick (account 1's Kick channel): a fifth of the chat, every fifth Kick
  message also delivered as a signed `chat.message.sent` webhook with the
  same id (stored once: counted once); over the Pusher socket a sub, a gift
  of three (one event, three recipients) and a host per cycle, and as
  webhooks a follow and a kicks gift; live at the start, offline at the end.

A notification counts as sent only when the stand-in put it on an open
session; one refused there (no session at that moment) is counted apart and
is not expected in the database. While `away` is set (the demo restarts the
daemon), a tip, a StreamElements follow and a Twitch follow go out every
second, and they count as sent all the same: the stand-ins keep them in the history the daemon heals from.
7TV emote changes pause meanwhile (7TV heals by a diff of the set: a change
undone within a gap leaves no row). Nothing durable here.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lumio_ingestd.devkit.demo.stack import LIKE, POST, DemoAccount, DemoKick
from lumio_ingestd.devkit.demo.streamelements import DemoTips
from lumio_ingestd.devkit.standins import twitch_events as te
from lumio_ingestd.devkit.standins.jetstream import JetstreamStandin, StandinEvent, commit, tid
from lumio_ingestd.devkit.standins.kick import KickStandin, pusher_chat, user, webhook_chat
from lumio_ingestd.devkit.standins.seventv import SevenTvStandin
from lumio_ingestd.devkit.standins.twitch import StandinError, TwitchStandin
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.worker import Worker

TICK_SECS = 0.1
CYCLE_BEATS = 20  # half seconds: a ten-second cycle
GIFT_BOMB_SIZE = 5
KICK_CHAT_SHARE = 0.2
KICK_WEBHOOK_EVERY = 5  # every fifth Kick chat message also arrives as a webhook
KICK_GIFT_SIZE = 3
RAID_BURST_SECS = 2.0
RAID_BURST_FACTOR = 3.0

_CHAT_LINES = (
    "PogChamp", "KEKW that was close", "gg", "LUL", "first time here, love the stream",
    "!uptime", "what game is next?", "Kappa", "hype hype hype", "that play was insane",
    "hello from Berlin", "W streamer", "can we get a 1 in chat", "1", "o7", "monkaS",
)


@dataclass(frozen=True)
class SentCounts:
    chat: int = 0
    events: int = 0
    bluesky: int = 0  # records by the accounts' DIDs, in the configured collections
    refused: int = 0  # notifications the stand-in had no open session for (never sent)
    by_type: Mapping[str, int] = field(default_factory=dict)
    viewers: int = 0  # what Helix /streams shows now, both channels together


class _Counts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._chat = 0
        self._bluesky = 0
        self._refused = 0
        self._events: Counter[str] = Counter()
        self.viewers = 0

    def add(self, *, chat: int = 0, bluesky: int = 0, refused: int = 0, event: str | None = None) -> None:
        with self._lock:
            self._chat += chat
            self._bluesky += bluesky
            self._refused += refused
            if event is not None:
                self._events[event] += 1

    def set_viewers(self, viewers: int) -> None:
        with self._lock:
            self.viewers = viewers

    def snapshot(self) -> SentCounts:
        with self._lock:
            return SentCounts(self._chat, sum(self._events.values()), self._bluesky, self._refused,
                              dict(self._events), self.viewers)


class Traffic(Worker):
    max_turn_secs = 30.0

    def __init__(self, twitch: TwitchStandin, jetstream: JetstreamStandin,
                 accounts: tuple[DemoAccount, ...], rate: float, metrics: Metrics,
                 notice: Callable[[str], None], *, seed: int | None = None,
                 tips: Callable[[random.Random], DemoTips] | None = None,
                 seventv: SevenTvStandin | None = None,
                 kick: KickStandin | None = None, kick_channel: DemoKick | None = None) -> None:
        super().__init__("demo-traffic", metrics)
        self._kick = kick if kick_channel is not None else None
        self._kick_channel = kick_channel
        self._kick_chat = 0
        self._twitch = twitch
        self._jetstream = jetstream
        self._accounts = accounts
        self._rate = rate
        self._notice = notice
        self._rng = random.Random(seed)
        self._counts = _Counts()
        self._started: float | None = None
        self._last: float = 0.0
        self._carry = 0.0
        self._beat = 0  # the next half second of the timeline to play
        self._burst_until = 0.0
        self._live = False
        self._last_time_us = 0
        self._tips = tips(self._rng) if tips is not None else None  # StreamElements, when started
        self._seventv = seventv
        self._emote_turns: Counter[int] = Counter()
        self._viewers: dict[str, int] = {}
        #: Set while the daemon is away on purpose (the demo's --gap): see the module docstring.
        self.away = threading.Event()

    @property
    def sent(self) -> SentCounts:
        return self._counts.snapshot()

    # -- the loop ---------------------------------------------------------------------------

    def run_once(self) -> float:
        now = time.monotonic()
        if self._started is None:
            self._started = self._last = now
            self._go_live()
        elapsed = now - self._started
        self._chat(now - self._last, now)
        self._last = now
        while self._beat <= int(elapsed * 2):
            self._play(self._beat, now)
            self._beat += 1
        return TICK_SECS

    def final(self) -> None:
        if self._live:
            for account in self._accounts:
                self._twitch.set_offline(account.twitch_user_id)
                self._notify(account, "stream.offline", te.offline_event(**self._channel(account)))
            if self._kick is not None and self._kick_channel is not None:
                k = self._kick_channel
                stream = {"id": 1, "channel": {"id": k.channel_id, "is_banned": False}}
                self._kick_socket(k.event_channel, "StopStreamBroadcast", "livestream.status.updated",
                                  {"livestream": stream})
            self._notice("the channels went offline (stream.offline, StopStreamBroadcast)")

    # -- chat ----------------------------------------------------------------------------------

    def _chat(self, dt: float, now: float) -> None:
        rate = self._rate * (RAID_BURST_FACTOR if now < self._burst_until else 1.0)
        due = self._carry + rate * dt
        n = int(due)
        self._carry = due - n
        for _ in range(n):
            if self._kick is not None and self._rng.random() < KICK_CHAT_SHARE:
                self._kick_chat_message()
                continue
            account = self._accounts[0 if self._rng.random() < 0.6 or len(self._accounts) == 1 else 1]
            chatter = str(200_000 + self._rng.randrange(3000))
            body = te.chat_event(str(uuid.uuid4()), self._rng.choice(_CHAT_LINES), chatter,
                                 **self._channel(account))
            if self._send(account, "channel.chat.message", body):
                self._counts.add(chat=1)

    # -- the timeline ----------------------------------------------------------------------------

    def _go_live(self) -> None:
        for account in self._accounts:
            stream_id, started = str(self._rng.randrange(10**10, 10**11)), te.now_text()
            # Helix /streams agrees with the socket: the same stream id (one session, one row).
            self._viewers[account.twitch_user_id] = self._rng.randrange(80, 400)
            self._twitch.set_live(account.twitch_user_id, viewers=self._viewers[account.twitch_user_id],
                                  title=f"{account.login} live", category="Just Chatting",
                                  stream_id=stream_id, started_at=started, login=account.login)
            self._notify(account, "stream.online", te.online_event(
                stream_id, started, **self._channel(account)))
        if self._kick is not None and self._kick_channel is not None:
            k = self._kick_channel
            self._kick_socket(k.event_channel, "StreamerIsLive", "livestream.status.updated", {"livestream": {
                "id": self._rng.randrange(10**6, 10**7), "channel_id": k.channel_id,
                "session_title": "demo on Kick", "created_at": te.now_text()}})
        self._count_viewers()
        self._live = True
        self._notice("the channels went live (stream.online, StreamerIsLive); chat is flowing")

    def _count_viewers(self) -> None:
        self._counts.set_viewers(sum(self._viewers.values()))

    def _wander(self, account: DemoAccount) -> None:
        user = account.twitch_user_id
        self._viewers[user] = max(1, self._viewers[user] + self._rng.randrange(-15, 20))
        self._twitch.set_live(user, viewers=self._viewers[user], title=f"{account.login} live",
                              category="Just Chatting", login=account.login)
        self._count_viewers()

    def _play(self, beat: int, now: float) -> None:
        cycle, step = divmod(beat, CYCLE_BEATS)
        if beat % 2 == 0:
            self._wander(self._accounts[(beat // 2) % len(self._accounts)])
        a = self._accounts[cycle % len(self._accounts)]
        b = self._accounts[(cycle + 1) % len(self._accounts)]
        user = str(300_000 + self._rng.randrange(5000))
        if step == 1:
            self._follow(a, user)
        elif step == 2:
            self._notify(b, "channel.subscribe", te.sub_event(user, is_gift=False, **self._channel(b)))
        elif step in (4, 14):
            who = a if step == 4 else b
            self._notify(who, "channel.cheer", te.cheer_event(user, self._rng.choice((100, 500, 1000)),
                                                              **self._channel(who)))
        elif step == 6:
            self._notify(b, "channel.subscription.message",
                         te.resub_message_event(user, self._rng.randrange(2, 40), **self._channel(b)))
            self._notify(b, "channel.chat.notification",
                         te.notification_event(str(uuid.uuid4()), **self._channel(b)))
        elif step == 8:
            self._gift_bomb(a, user)
        elif step in (10, 18):
            who = b if step == 10 else a
            self._notify(who, "channel.channel_points_custom_reward_redemption.add", te.redemption_event(
                str(uuid.uuid4()), user, te.now_text(), title="Hydrate!", cost=500, **self._channel(who)))
        elif step == 12:
            viewers = self._rng.randrange(50, 500)
            if self._notify(a, "channel.raid", te.raid_event(str(400_000 + cycle), viewers,
                                                             **self._channel(a))):
                self._burst_until = now + RAID_BURST_SECS
                self._notice(f"raid: {viewers} viewers arrive at {a.login}; chat bursts to "
                             f"{self._rate * RAID_BURST_FACTOR:.0f} messages/s")
        elif step in (5, 15):
            # Both on the cycle's account: its add and rename come 5 s apart, early in a run.
            self._emote(a)
        elif step == 16:
            self._follow(b, user)
        elif step == 3 and self._tips is not None:
            self._tips.play(cycle, lambda ev_type: self._counts.add(event=ev_type), self._notice,
                            healed=self.away.is_set())
        elif step in (7, 9, 11, 13):
            self._kick_event(step, cycle)
        if self.away.is_set() and beat % 2 == 1 and step != 3:
            # The daemon is away: tips and follows keep coming, for healing to find.
            if self._tips is not None:
                self._tips.play(cycle + beat, lambda ev_type: self._counts.add(event=ev_type),
                                self._notice, healed=True)
            self._follow(b, user)
        self._bluesky(beat, self._accounts[(beat // 2) % len(self._accounts)])

    def _gift_bomb(self, account: DemoAccount, gifter: str) -> None:
        if not self._notify(account, "channel.subscription.gift",
                            te.gift_event(GIFT_BOMB_SIZE, gifter, **self._channel(account))):
            return
        for i in range(GIFT_BOMB_SIZE):
            recipient = str(500_000 + self._rng.randrange(100_000) + i)
            self._notify(account, "channel.subscribe",
                         te.sub_event(recipient, is_gift=True, **self._channel(account)))
        self._notice(f"gift bomb: user{gifter} gifts {GIFT_BOMB_SIZE} subs to {account.login}")

    # -- Kick --------------------------------------------------------------------------------------

    def _kick_chat_message(self) -> None:
        assert self._kick is not None and self._kick_channel is not None
        k = self._kick_channel
        self._kick_chat += 1
        mid = str(uuid.uuid4())
        text = self._rng.choice(_CHAT_LINES)
        sender = 600_000 + self._rng.randrange(3000)
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # one time for both paths
        got = self._kick.publish(k.chat_channel, "ChatMessageEvent", pusher_chat(
            k.chatroom_id, mid, text, sender_id=sender, username=f"kviewer{sender}",
            created_at=stamp.replace("Z", "+00:00"))) > 0
        if self._kick_chat % KICK_WEBHOOK_EVERY == 0:
            try:
                status, _ = self._kick.send_webhook("chat.message.sent", webhook_chat(
                    (k.broadcaster_user_id, k.username), mid, text, sender_id=sender,
                    username=f"kviewer{sender}", created_at=stamp))
            except OSError:
                status = 0  # the daemon is away (the demo's --gap): not delivered
            got = got or status == 200
        if got:
            self._counts.add(chat=1)
        else:
            self._counts.add(refused=1)

    def _kick_event(self, step: int, cycle: int) -> None:
        if self._kick is None or self._kick_channel is None:
            return
        k = self._kick_channel
        if step == 9:
            months = self._rng.randrange(1, 24)
            kind = "channel.subscription.renewal" if months > 1 else "channel.subscription.new"
            self._kick_socket(k.chat_channel, "SubscriptionEvent", kind, {
                "chatroom_id": k.chatroom_id, "username": f"kick_fan_{cycle}", "months": months})
        elif step == 7:
            giftees = [f"lucky_{cycle}_{i}" for i in range(KICK_GIFT_SIZE)]
            if self._kick_socket(k.chat_channel, "GiftedSubscriptionsEvent", "channel.subscription.gifts", {
                    "chatroom_id": k.chatroom_id, "gifted_usernames": giftees,
                    "gifter_username": f"kick_gifter_{cycle}", "gifter_total": KICK_GIFT_SIZE}):
                self._notice(f"Kick gift: kick_gifter_{cycle} gifts {KICK_GIFT_SIZE} subs to {k.username}")
        elif step == 11:
            self._kick_socket(k.chat_channel, "StreamHostEvent", "StreamHostEvent", {
                "chatroom_id": k.chatroom_id, "optional_message": None,
                "number_viewers": self._rng.randrange(5, 200), "host_username": f"kick_host_{cycle}"})
        elif step == 13:
            broadcaster = user(k.broadcaster_user_id, k.username)
            follower = user(650_000 + cycle, f"kick_follower_{cycle}")
            self._kick_webhook("channel.followed", {"broadcaster": broadcaster, "follower": follower})
            self._kick_webhook("kicks.gifted", {
                "broadcaster": broadcaster, "sender": user(660_000 + cycle, f"kick_tipper_{cycle}"),
                "gift": {"amount": 100, "name": "Full Send", "type": "BASIC", "tier": "BASIC",
                         "message": f"gg {cycle}", "pinned_time_seconds": 0},
                "created_at": datetime.now(UTC).isoformat().replace("+00:00", "Z")})

    def _kick_socket(self, channel: str, event: str, stored_as: str, data: Mapping[str, Any]) -> bool:
        assert self._kick is not None
        if self._kick.publish(channel, event, dict(data)) > 0:
            self._counts.add(event=stored_as)
            return True
        self._counts.add(refused=1)
        return False

    def _kick_webhook(self, event_type: str, body: Mapping[str, Any]) -> bool:
        assert self._kick is not None
        try:
            status, _ = self._kick.send_webhook(event_type, dict(body))
        except OSError:
            status = 0
        if status == 200:
            self._counts.add(event=event_type)
            return True
        self._counts.add(refused=1)
        return False

    def _bluesky(self, beat: int, account: DemoAccount) -> None:
        if beat % 2 == 0:
            text = self._rng.choice(("live now, come hang out", "new video is up", "thanks for the raid!",
                                     "what a stream", "schedule for this week in the thread"))
            self._post(account.did, POST, {"$type": POST, "text": text, "langs": ["en"]})
            self._counts.add(bluesky=1)
        if beat % 8 == 4:
            subject = f"at://did:plc:someoneelse/{POST}/{tid(self._time_us())}"
            self._post(account.did, LIKE, {"$type": LIKE, "subject": {"uri": subject, "cid": "bafyreidemo"}})
            self._counts.add(bluesky=1)
        # Someone else posting: Jetstream filters it out by wantedDids; never stored.
        self._post(f"did:plc:stranger{self._rng.randrange(1000):04d}", POST, {"$type": POST, "text": "hi"})

    def _emote(self, account: DemoAccount) -> None:
        """Add an emote, rename it, remove it: one change per call, in turn."""
        if self._seventv is None or not account.emote_set_id or self.away.is_set():
            return
        turn = self._emote_turns[account.account_id]
        self._emote_turns[account.account_id] += 1
        k, phase = divmod(turn, 3)
        emote_id = f"01JDEMOADD{account.account_id}{k:015d}"
        name = self._rng.choice(("Pog", "Sadge", "catJAM", "monkaW", "OMEGALUL", "EZ", "Wowee"))
        if phase == 0:
            self._seventv.add_emote(account.emote_set_id, emote_id, f"{name}{k}")
            self._counts.add(event="emote.added")
            self._notice(f"7TV: {account.login} adds the emote {name}{k}")
        elif phase == 1:
            self._seventv.rename_emote(account.emote_set_id, emote_id, f"{name}{k}x")
            self._counts.add(event="emote.renamed")
        else:
            self._seventv.remove_emote(account.emote_set_id, emote_id)
            self._counts.add(event="emote.removed")

    def _post(self, did: str, collection: str, record: dict[str, Any]) -> None:
        time_us = self._time_us()
        record = {**record, "createdAt": datetime.now(UTC).isoformat().replace("+00:00", "Z")}
        self._jetstream.add(StandinEvent.of(commit(did, time_us, "create", collection, tid(time_us),
                                                   record=record)))

    def _time_us(self) -> int:
        # Jetstream's time_us only grows; rkeys made from it stay unique.
        self._last_time_us = max(self._last_time_us + 1, int(time.time() * 1_000_000))
        return self._last_time_us

    # -- sending ------------------------------------------------------------------------------------

    @staticmethod
    def _channel(account: DemoAccount) -> dict[str, str]:
        return {"broadcaster": account.twitch_user_id, "broadcaster_login": account.login}

    def _notify(self, account: DemoAccount, sub_type: str, event: Mapping[str, Any],
                version: str = "1") -> bool:
        if self._send(account, sub_type, event, version):
            self._counts.add(event=sub_type)
            return True
        return False

    def _follow(self, account: DemoAccount, user: str) -> None:
        """A follow: on the socket, and in Helix's follower list the daemon heals a gap from."""
        if self._twitch.follow(user, f"user{user}", broadcaster=account.twitch_user_id,
                               broadcaster_login=account.login) or self.away.is_set():
            self._counts.add(event="channel.follow")
        else:
            self._counts.add(refused=1)

    def _send(self, account: DemoAccount, sub_type: str, event: Mapping[str, Any],
              version: str = "1") -> bool:
        try:
            self._twitch.notify(sub_type, event, broadcaster=account.twitch_user_id, version=version)
        except StandinError:
            self._counts.add(refused=1)
            return False
        return True
