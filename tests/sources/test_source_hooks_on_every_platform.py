"""Kick, StreamElements and 7TV use the Source base's two hooks, each against its stand-in.

1. `mark_healthy()`: a session that was welcomed and subscribed (Kick: every
   Pusher channel's `subscription_succeeded`; StreamElements: a successful
   subscribe `response`; 7TV: the op 5 Ack of every subscribe sent) resets
   the reconnect backoff, so losing healthy sessions one after the other
   waits the minimum each time, while sessions whose subscribes are refused
   (welcomed, never working) grow it, and the next healthy one resets it.
   The backoff asked for is recorded at each loss (attempt number, delay).
2. `quarantine_frame()`: a frame that cannot be decoded, and one that decodes
   but is refused (a shape or room the daemon cannot take), end up in the
   `FrameQuarantine` attached as `src.frame_quarantine` with their raw bytes
   and counted; the good frame after them is stored exactly once.

Plus the composition root: the daemon's one quarantine reaches every Kick and
StreamElements source and the 7TV worker (which hands it to its sockets).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import pytest

from lumio_ingestd.devkit.standins.kick import KickStandin, pusher_chat
from lumio_ingestd.devkit.standins.seventv import SevenTvStandin
from lumio_ingestd.devkit.standins.streamelements import AstroStandin, tip_doc
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.pii import scrub_frame
from lumio_ingestd.runtime.build import build
from lumio_ingestd.sources.base import Source
from lumio_ingestd.sources.kick import KickSource
from lumio_ingestd.sources.seventv import SevenTvSource
from lumio_ingestd.sources.streamelements import StreamElementsSource
from lumio_ingestd.sources.streamelements.protocol import ACTIVITIES, TIPS
from lumio_ingestd.stores.refused_frames import FrameQuarantine
from support import make_config
from support.harness.servers import wait_until
from support.kick import CHAT_CHANNEL, CHATROOM, KickRig
from support.kick import make_rig as make_kick_rig
from support.seventv import SevenTvRig
from support.seventv import make_rig as make_seventv_rig
from support.streamelements import ROOM, TOKEN, SeRig
from support.streamelements import make_rig as make_se_rig

MIN_SECS = 0.05
MAX_SECS = 30.0  # a backoff that grows shows at once against this ceiling
DROP_CODE = 1011  # a close that takes the usual backoff on every platform (no forced wait)
SET_A = "01HSETA0000000000000000001"
USER = "01HUSER0000000000000000001"


class Backoffs:
    """Records (attempt, delay) each time the source asks for its reconnect backoff."""

    def __init__(self, src: Source) -> None:
        self.src = src
        self.got: list[tuple[int, float]] = []
        self._next = src.next_backoff
        src.next_backoff = self  # type: ignore[method-assign]

    def __call__(self) -> float:
        delay = self._next()
        self.got.append((self.src._attempts, delay))
        return delay


class Platform(Protocol):
    """One platform's source against its stand-in: what the tests below need from each."""

    name: str
    bad_reasons: tuple[str, str]  # why each of `send_bad`'s two frames is refused

    def start(self, quarantine: FrameQuarantine | None = None) -> None: ...
    @property
    def source(self) -> Source: ...
    def connections(self) -> int: ...
    def subscribe_seen(self, n: int) -> bool: ...
    def answered(self) -> bool: ...
    def drop(self, n: int) -> None: ...
    def refuse(self, on: bool) -> None: ...
    def send_bad(self, n: int) -> list[bytes]: ...
    def send_good(self, n: int) -> str: ...
    def stored(self) -> dict[str, int]: ...
    def value(self, name: str, **labels: str) -> float: ...
    def close(self) -> None: ...


class Kick:
    name = "kick"
    bad_reasons = ("json", "shape")

    def __init__(self, tmp_path: Path, pg_url: str, redis_url: str) -> None:
        self.fake = KickStandin().start()
        self.rig: KickRig = make_kick_rig(tmp_path, pg_url, redis_url, self.fake)
        self.src: KickSource = self.rig.source()

    def start(self, quarantine: FrameQuarantine | None = None) -> None:
        self.src.reconnect_min_secs, self.src.reconnect_max_secs = MIN_SECS, MAX_SECS
        self.src.frame_quarantine = quarantine
        self.src.start()

    @property
    def source(self) -> Source:
        return self.src

    def connections(self) -> int:
        return len(self.fake.connections)

    def subscribe_seen(self, n: int) -> bool:
        pc = self.fake.connections[n - 1]
        sent = sum(f.get("event") == "pusher:subscribe" for f in list(pc.inbound))
        return bool(sent == len(self.src.channels))

    def answered(self) -> bool:
        return set(self.src.subscribed) >= set(self.src.channels)

    def drop(self, n: int) -> None:
        self.fake.close_connection(self.fake.connections[n - 1], DROP_CODE, "dropped by the test")

    def refuse(self, on: bool) -> None:
        self.fake.refuse_subscribes = on

    def send_bad(self, n: int) -> list[bytes]:
        frames = ['{"event": "App\\\\Events\\\\ChatMessageEvent", not json',
                  json.dumps({"event": "App\\Events\\ChatMessageEvent", "channel": CHAT_CHANNEL,
                              "data": json.dumps({"content": "a chat message without an id"})})]
        for text in frames:
            assert self.fake.send_raw(self.fake.connections[n - 1], text)
        return [t.encode() for t in frames]

    def send_good(self, n: int) -> str:
        mid = str(uuid.uuid4())
        assert self.fake.publish(CHAT_CHANNEL, "ChatMessageEvent", pusher_chat(CHATROOM, mid, "good")) == 1
        return mid

    def stored(self) -> dict[str, int]:
        return dict(self.rig.chat_ids())

    def value(self, name: str, **labels: str) -> float:
        return self.rig.value(name, **labels)

    def close(self) -> None:
        try:
            self.rig.close()
        finally:
            self.fake.close()


class StreamElements:
    name = "streamelements"
    bad_reasons = ("json", "room")

    def __init__(self, tmp_path: Path, pg_url: str, redis_url: str) -> None:
        self.astro = AstroStandin(token=TOKEN).start()
        self.rig: SeRig = make_se_rig(tmp_path, pg_url, redis_url, self.astro)
        self.src: StreamElementsSource = self.rig.source()

    def start(self, quarantine: FrameQuarantine | None = None) -> None:
        self.src.reconnect_min_secs, self.src.reconnect_max_secs = MIN_SECS, MAX_SECS
        self.src.frame_quarantine = quarantine
        self.src.start()

    @property
    def source(self) -> Source:
        return self.src

    def connections(self) -> int:
        return len(self.astro.connections)

    def subscribe_seen(self, n: int) -> bool:
        return len(self.astro.connections[n - 1].subscribes) >= len(self.src.topics)

    def answered(self) -> bool:
        return all(t.state == "active" for t in list(self.src.topics.values()))

    def drop(self, n: int) -> None:
        assert self.astro.connections[n - 1].open and len(self.astro.live()) == 1
        self.astro.drop(code=DROP_CODE)

    def refuse(self, on: bool) -> None:
        for topic in (TIPS, ACTIVITIES):
            if on:
                self.astro.fail_subscribe(topic, "err_internal_error", times=None)
            else:
                self.astro.allow_subscribe(topic)

    def send_bad(self, n: int) -> list[bytes]:
        frames = ['{"type": "message", "topic": "channel.tips", not json',
                  json.dumps({"type": "message", "topic": TIPS, "room": "someone-else",
                              "data": tip_doc("tipOther", "someone-else")})]
        for text in frames:
            self.astro.send_raw(text, conn=n - 1)
        return [t.encode() for t in frames]

    def send_good(self, n: int) -> str:
        tip = f"tip{uuid.uuid4().hex[:12]}"
        self.astro.publish(TIPS, ROOM, tip_doc(tip, ROOM))
        return tip

    def stored(self) -> dict[str, int]:
        return {external_id: n for (_, external_id), n in self.rig.stored().items()}

    def value(self, name: str, **labels: str) -> float:
        return self.rig.value(name, **labels)

    def close(self) -> None:
        try:
            self.rig.close()
        finally:
            self.astro.close()


class SevenTv:
    name = "seventv"
    bad_reasons = ("not_json", "bad_dispatch")

    def __init__(self, tmp_path: Path, pg_url: str, redis_url: str) -> None:
        self.standin = SevenTvStandin(heartbeat_interval_ms=1000).start()
        self.standin.add_set(SET_A, {"01HEMOTE000000000000000001": "peepoHappy"})
        self.standin.add_user(USER, set_id=SET_A)
        # A configured set: one subscription (emote_set.update) on every connection, from its start.
        self.rig: SevenTvRig = make_seventv_rig(
            tmp_path, pg_url, redis_url, self.standin,
            {7: {"seventv_user_id": USER, "seventv_emote_set_id": SET_A}})
        self.src: SevenTvSource = self.rig.source(start=False)
        self.emotes = 1
        self.acks = 0.0

    def start(self, quarantine: FrameQuarantine | None = None) -> None:
        self.src.reconnect_min_secs, self.src.reconnect_max_secs = MIN_SECS, MAX_SECS
        self.src.frame_quarantine = quarantine  # the worker hands it to the sockets it makes
        self.src.start()
        assert wait_until(lambda: bool(self.src.sockets), 5)
        # The set's first REST fetch is its baseline (no change events): an emote added
        # before it is part of the baseline, so send_good waits for it (a heal after the
        # subscribe ack, slow on a loaded machine).
        assert wait_until(lambda: self.rig.value("seventv_heals_total", result="baseline") >= 1, 10)

    @property
    def source(self) -> Source:
        return self.src.sockets[0]

    def connections(self) -> int:
        return len(self.standin.connections)

    def subscribe_seen(self, n: int) -> bool:
        c = self.standin.connections[n - 1]
        return bool(c.subs) or c.refused > 0

    def answered(self) -> bool:
        # One subscription per connection: one more ack read since the last healthy session.
        acks = self.rig.value("source_frames_total", platform="seventv", kind="ack")
        if acks > self.acks:
            self.acks = acks
            return True
        return False

    def drop(self, n: int) -> None:
        self.standin.close_connection(self.standin.connections[n - 1], DROP_CODE, "dropped by the test")

    def refuse(self, on: bool) -> None:
        self.standin.refuse_subscribes = on

    def send_bad(self, n: int) -> list[bytes]:
        frames = ['{"op": 0, "d": {"type": "emote_set.update", not json',
                  json.dumps({"op": 0, "d": {"type": "emote_set.update",
                                             "body": {"id": SET_A, "kind": 3, "pushed": "not a list"}}})]
        for text in frames:
            assert self.standin.send_raw(self.standin.connections[n - 1], text)
        return [t.encode() for t in frames]

    def send_good(self, n: int) -> str:
        self.emotes += 1
        emote = f"01HEMOTE{self.emotes:018d}"
        self.standin.add_emote(SET_A, emote, f"Emote{self.emotes}")
        return emote

    def stored(self) -> dict[str, int]:
        got: dict[str, int] = {}
        for kind, emote, _, _ in self.rig.changes():
            if kind == "emote.added":
                got[emote] = got.get(emote, 0) + 1
        return got

    def value(self, name: str, **labels: str) -> float:
        return self.rig.value(name, **labels)

    def close(self) -> None:
        try:
            self.rig.close()
        finally:
            self.standin.close()


PLATFORMS: dict[str, Callable[[Path, str, str], Platform]] = {
    "kick": Kick, "streamelements": StreamElements, "seventv": SevenTv}


@pytest.fixture(params=sorted(PLATFORMS))
def platform(request: pytest.FixtureRequest, tmp_path: Path, pg_url: str,
             redis_url: str) -> Iterator[Platform]:
    p = PLATFORMS[request.param](tmp_path, pg_url, redis_url)
    try:
        yield p
    finally:
        p.close()


def healthy(p: Platform, n: int) -> None:
    """Connection `n` (1-based) is up and the source has taken it for a working session."""
    assert wait_until(lambda: p.connections() >= n and p.subscribe_seen(n), 10), \
        f"{p.name}: no subscribing connection #{n}"
    assert p.connections() == n
    # The source read the answers to its subscribes; it reads nothing else before acting on them.
    assert wait_until(p.answered, 5), f"{p.name}: session #{n}'s subscribes were never answered"


def refused(p: Platform, n: int) -> None:
    """Connection `n` is up and has sent its subscribes, which the stand-in refuses."""
    assert wait_until(lambda: p.connections() >= n and p.subscribe_seen(n), 10), \
        f"{p.name}: no subscribing connection #{n}"
    assert p.connections() == n


def test_healthy_sessions_reset_the_backoff_and_refused_ones_grow_it(platform: Platform) -> None:
    p = platform
    p.start()
    backoffs = Backoffs(p.source)
    n = 1
    healthy(p, n)
    for _ in range(4):  # healthy sessions lost one after the other
        p.drop(n)
        n += 1
        healthy(p, n)
    assert backoffs.got == [(1, MIN_SECS)] * 4, backoffs.got
    p.refuse(True)
    p.drop(n)  # still a healthy one: the minimum
    for _ in range(3):  # welcomed, subscribes refused, lost: each attempt counts
        n += 1
        refused(p, n)
        p.drop(n)
    p.refuse(False)
    n += 1
    healthy(p, n)
    p.drop(n)  # working again: the minimum again
    n += 1
    healthy(p, n)
    attempts = [a for a, _ in backoffs.got]
    assert attempts == [1] * 5 + [2, 3, 4] + [1], backoffs.got
    for attempt, delay in backoffs.got:
        assert MIN_SECS <= delay <= MIN_SECS * 2 ** (attempt - 1)
    assert p.value("worker_errors_total", worker=p.source.name) == 0


def test_refused_frames_are_quarantined_with_their_bytes_and_the_good_one_is_stored(
        platform: Platform, tmp_path: Path) -> None:
    p = platform
    quarantine = FrameQuarantine(tmp_path / "quarantine", Metrics())
    p.start(quarantine)
    healthy(p, 1)
    before = p.send_good(1)
    assert wait_until(lambda: before in p.stored(), 10), p.stored()
    sent = p.send_bad(1)
    after = p.send_good(1)
    assert wait_until(lambda: after in p.stored(), 10), p.stored()
    assert wait_until(lambda: len(quarantine.entries()) == 2, 5), quarantine.entries()
    kept = quarantine.entries()
    # Kept as sent, less any donor PII (the StreamElements tip carries an email and a geo).
    assert [(e["platform"], e["reason"], base64.b64decode(str(e["raw_b64"]))) for e in kept] == \
        [(p.name, reason, scrub_frame(raw)[0]) for reason, raw in zip(p.bad_reasons, sent, strict=True)]
    assert all(e["size"] == len(raw) and e["truncated"] is False for e, raw in zip(kept, sent, strict=True))
    for reason in set(p.bad_reasons):
        assert p.value("source_bad_frames_total", platform=p.name, reason=reason) == \
            p.bad_reasons.count(reason)
    got = p.stored()  # exactly once, nothing taken along
    assert got[before] == 1 and got[after] == 1 and set(got.values()) == {1}, got
    assert p.connections() == 1 and p.source.connected


def test_the_daemon_gives_its_quarantine_to_every_kick_streamelements_and_seventv_source(
        tmp_path: Path, redis_url: str) -> None:
    token = tmp_path / "se-token"
    token.write_text("eyJhbGciOiJIUzI1NiJ9.e30.sig\n")
    token.chmod(0o600)
    # Accounts run only once the process holds its instance claim: a real Redis.
    cfg = make_config(tmp_path, redis_url=redis_url, sections={
        "daemon": {"state_dir": tmp_path / "state"},
        "seventv": {"enabled": "true"},
        "account.1": {"kick_broadcaster_user_id": "100", "kick_chatroom_id": "11",
                      "streamelements_channel_id": "5f0000000000000000000001",
                      "streamelements_token_file": token, "seventv_user_id": USER}})
    parts = build(cfg, Metrics())
    try:
        mine = [s for s in parts.sources if isinstance(s, KickSource | StreamElementsSource | SevenTvSource)]
        assert sorted(type(s).__name__ for s in mine) == ["KickSource", "SevenTvSource",
                                                          "StreamElementsSource"]
        kept = {id(s.frame_quarantine) for s in mine}
        assert len(kept) == 1 and isinstance(mine[0].frame_quarantine, FrameQuarantine)
    finally:
        for _, close in reversed(parts.closers):
            close()
