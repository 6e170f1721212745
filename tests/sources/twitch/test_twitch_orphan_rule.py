"""Listing and deleting EventSub subscriptions, and which holders of a 409 are orphans.

Against the stand-in Twitch over real sockets and real HTTP, without storage:
the Helix client follows every page of a listing, filters by type and by
user, deletes by id; and the subscribe pass of a new session deletes only
what a session that is not ours and not live holds. A subscription on the
current session, on another live session of this process, or inherited
through a `session_reconnect` hand-off is never deleted.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from lumio_ingestd.config import Secret
from lumio_ingestd.devkit.standins.twitch import TwitchStandin
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.base import BadFrame
from lumio_ingestd.sources.twitch.eventsub import EventSubClient
from lumio_ingestd.sources.twitch.helix import (
    SUBSCRIPTIONS,
    HeldSubscription,
    HelixClient,
    HelixError,
)
from lumio_ingestd.sources.twitch.livesessions import LiveSessions
from lumio_ingestd.sources.twitch.mapping import Envelope, Notification
from lumio_ingestd.sources.twitch.oauth import TokenStore
from lumio_ingestd.sources.twitch.subscriber import Subscriber, SubscribeResult, judge
from support.twitch import write_token_file

CHAT = "channel.chat.message"
ALL = len(SUBSCRIPTIONS)
PAGE = 3


class _Handler:
    """Where the raw sessions' frames go (these tests look at subscriptions only)."""

    def __init__(self) -> None:
        self.notifications: list[str] = []

    def on_notification(self, env: Envelope, items: tuple[Notification, ...]) -> None:
        self.notifications.append(env.message_id)

    def on_revocation(self, env: Envelope) -> None:
        pass

    def on_bad_frame(self, exc: BadFrame, raw: bytes = b"") -> None:
        raise AssertionError(f"bad frame: {exc}")

    def on_unsupported(self, env: Envelope) -> None:
        pass


class _Rig:
    def __init__(self, fake: TwitchStandin, tmp_path: Path) -> None:
        self.fake = fake
        self.metrics = Metrics()
        self.tokens = TokenStore(write_token_file(tmp_path / "token.json", fake.access_token,
                                                  fake.refresh_token),
                                 fake.oauth_url, fake.client_id, Secret(fake.client_secret), self.metrics)
        self.helix = HelixClient(fake.helix_url, fake.client_id, self.tokens)
        self.subscriber = Subscriber(self.helix, fake.user_id, self.metrics, name="test")
        self.live = LiveSessions()
        self.clients: list[EventSubClient] = []

    def client(self, name: str) -> EventSubClient:
        c = EventSubClient(self.fake.ws_url, 10, 42, _Handler(), self.metrics, name=name, live=self.live)
        self.clients.append(c)
        return c

    def subscribe(self, client: EventSubClient) -> SubscribeResult:
        assert client.session_id is not None
        return self.subscriber.subscribe(SUBSCRIPTIONS, client.session_id, mine=client.chain,
                                         ours=self.live.ids, deadline=time.monotonic() + 10,
                                         stopping=lambda: False)

    def counted(self, result: str) -> float:
        v = self.metrics.registry.get_sample_value("source_subscriptions_total",
                                                   {"platform": "twitch", "result": result})
        return 0.0 if v is None else v

    def requests(self) -> Counter[str]:
        return Counter(method for method, _ in self.fake.eventsub_requests)

    def close(self) -> None:
        for c in self.clients:
            c.reset()


@pytest.fixture
def fake() -> Iterator[TwitchStandin]:
    with TwitchStandin(min_keepalive=1, orphan_secs=120.0) as f:
        f.helix_page_size = PAGE
        yield f


@pytest.fixture
def rig(fake: TwitchStandin, tmp_path: Path) -> Iterator[_Rig]:
    r = _Rig(fake, tmp_path)
    try:
        yield r
    finally:
        r.close()


def test_the_listing_follows_every_page_filters_and_deleting_frees_a_subscription(rig: _Rig) -> None:
    fake = rig.fake
    a = rig.client("a")
    session_a = a.connect()
    assert rig.subscribe(a).created == {s.type for s in SUBSCRIPTIONS}
    assert rig.counted("ok") == ALL

    listing = rig.helix.list_subscriptions(user_id=fake.user_id, timeout=5)
    assert (len(listing.items), listing.pages, listing.unreadable) == (ALL, -(-ALL // PAGE), 0)
    assert len({h.id for h in listing.items}) == ALL
    assert {(h.method, h.session_id, h.status) for h in listing.items} == {
        ("websocket", session_a, "enabled")}
    assert all(h.connected_at and h.disconnected_at is None for h in listing.items)
    raid = rig.helix.list_subscriptions(sub_type="channel.raid", timeout=5)
    assert [dict(h.condition) for h in raid.items] == [{"to_broadcaster_user_id": fake.user_id}]
    with pytest.raises(ValueError):
        rig.helix.list_subscriptions(sub_type=CHAT, user_id=fake.user_id, timeout=5)

    chat = next(h for h in listing.items if h.type == CHAT)
    rig.helix.delete_subscription(chat.id, timeout=5)
    rig.helix.delete_subscription(chat.id, timeout=5)  # gone already (404): done all the same
    assert [(m, s) for m, s in fake.eventsub_requests if m == "DELETE"] == [("DELETE", 204), ("DELETE", 404)]
    assert CHAT not in {s["type"] for s in fake.listed_subscriptions()}
    fake.eventsub_faults["DELETE"] = [500]
    with pytest.raises(HelixError) as caught:
        rig.helix.delete_subscription(chat.id, timeout=5)
    assert caught.value.status == 500

    fake.expire_access_token()  # a 401 refreshes the token once and asks again
    assert len(rig.helix.list_subscriptions(user_id=fake.user_id, timeout=5).items) == ALL - 1
    assert fake.refreshes == 1

    # A pass on the current session: every type is ours already; nothing is deleted.
    deletes = rig.requests()["DELETE"]
    again = rig.subscribe(a)
    assert again.created == {s.type for s in SUBSCRIPTIONS} and not again.replaced and not again.held
    assert rig.requests()["DELETE"] == deletes
    assert rig.counted("exists") == ALL - 1 and rig.counted("ok") == ALL + 1  # chat created anew


def test_the_orphans_of_a_cut_session_are_deleted_and_created_on_the_new_one(rig: _Rig) -> None:
    fake = rig.fake
    client = rig.client("source-twitch-42")
    session_a = client.connect()
    rig.subscribe(client)
    fake.cut(fake.sessions[0])  # no close frame either way: Twitch keeps the subscriptions
    client.reset()  # what the source does when its socket ends
    assert fake.holder(CHAT) is fake.sessions[0]
    before = rig.requests()

    session_b = client.connect()
    result = rig.subscribe(client)
    assert result.created == {s.type for s in SUBSCRIPTIONS} and not result.held
    assert {h.session_id for h in result.replaced} == {session_a} and len(result.replaced) == ALL
    assert rig.counted("orphan_replaced") == ALL
    made = rig.requests() - before
    # One POST refused, one listing (every page), then each orphan deleted before its POST.
    assert made == Counter({"POST": 1 + ALL, "GET": -(-ALL // PAGE), "DELETE": ALL})
    assert {(s["transport"]["session_id"], s["status"]) for s in fake.listed_subscriptions()} == {
        (session_b, "enabled")}
    assert fake.holder(CHAT) is fake.sessions[1]


def test_a_subscription_of_another_live_session_of_ours_is_never_deleted(rig: _Rig) -> None:
    fake = rig.fake
    first, second = rig.client("source-twitch-42"), rig.client("source-twitch-42-successor")
    session_a = first.connect()
    rig.subscribe(first)
    second.connect()  # both sockets of this process are open: A is ours and live

    result = rig.subscribe(second)
    assert result.created == set() and not result.replaced
    assert {(h.session_id, h.ours) for h in result.held} == {(session_a, True)}
    assert len(result.held) == ALL
    assert rig.requests()["DELETE"] == 0 and rig.counted("exists") == ALL
    assert fake.holder(CHAT) is fake.sessions[0]

    # Once the first socket is gone without a close (and closed on our side), A is an orphan.
    fake.cut(fake.sessions[0])
    first.reset()
    assert rig.subscribe(second).created == {s.type for s in SUBSCRIPTIONS}
    assert rig.counted("orphan_replaced") == ALL and fake.holder(CHAT) is fake.sessions[1]


def test_after_a_hand_over_the_inherited_subscriptions_are_the_new_sessions(rig: _Rig) -> None:
    fake = rig.fake
    client = rig.client("source-twitch-42")
    session_a = client.connect()
    rig.subscribe(client)
    fake.reconnect(fake.sessions[0])
    deadline = time.monotonic() + 10
    while client.handoffs == 0 and time.monotonic() < deadline:
        client.read(0.05)
    assert client.handoffs == 1 and client.session_id != session_a
    assert client.chain == [session_a, client.session_id] and rig.live.ids() == set(client.chain)
    # The new session carries them; the listing still names the session they were created on.
    assert {s["transport"]["session_id"] for s in fake.listed_subscriptions()} == {session_a}
    assert fake.holder(CHAT) is fake.sessions[1]

    result = rig.subscribe(client)  # every POST is a 409: the session holds them all already
    assert result.created == {s.type for s in SUBSCRIPTIONS} and not result.replaced
    assert rig.requests()["DELETE"] == 0 and rig.counted("exists") == ALL


def _held(session_id: str | None, method: str = "websocket") -> HeldSubscription:
    return HeldSubscription(f"id-{session_id}-{method}", CHAT, "1", "enabled", {}, method, session_id,
                            None, None)


def test_only_a_websocket_session_neither_mine_nor_ours_is_an_orphan() -> None:
    holders = [_held("current"), _held("inherited"), _held("other-live"), _held("dead"),
               _held(None, "webhook"), _held(None)]
    verdict = judge(holders, mine={"current", "inherited"}, ours={"current", "inherited", "other-live"})
    assert [h.session_id for h in verdict.mine] == ["current", "inherited"]
    assert [h.session_id for h in verdict.ours] == ["other-live"]
    assert [h.session_id for h in verdict.orphans] == ["dead"]
    assert [(h.method, h.session_id) for h in verdict.foreign] == [("webhook", None), ("websocket", None)]
    assert not verdict.replaceable  # something of ours holds it: nothing is deleted
    assert judge([_held("dead")], mine={"current"}, ours={"current"}).replaceable


def test_a_listing_item_without_what_a_decision_needs_is_not_read() -> None:
    good = {"id": "x", "type": CHAT, "version": "1", "status": "enabled",
            "condition": {"broadcaster_user_id": "1"},
            "transport": {"method": "websocket", "session_id": "s", "connected_at": "t"}}
    assert HeldSubscription.parse(good) == HeldSubscription(
        "x", CHAT, "1", "enabled", {"broadcaster_user_id": "1"}, "websocket", "s", "t", None)
    for broken in ({**good, "id": ""}, {**good, "condition": None}, {**good, "transport": {}},
                   {**good, "version": 1}, "text", None):
        assert HeldSubscription.parse(broken) is None
