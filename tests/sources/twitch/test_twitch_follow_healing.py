"""Twitch follows missed during a gap, read back from Helix's follower list, on the stand-in.

A follow is keyed by its content (`follow:<user_id>:<followed_at epoch s>`) on
the EventSub path and on the Helix path, so a follow seen on both is one
row. The source is stopped (its stop recorded) while people follow, then a
new one starts: the ledger has a `healed` row for the events path with the
follows the socket had not stored, and a `not_healable` row for the chat on
the same socket with the same bounds. Helix's 429 (`Ratelimit-Reset`) is
waited out and a 401 refreshes the token once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lumio_ingestd.devkit.standins.twitch import TwitchStandin
from lumio_ingestd.sources.twitch.followers import FollowerHistory
from lumio_ingestd.sources.twitch.source import TwitchSource
from support import dbname_of
from support.gaps import GapRig, make_gap_rig
from support.harness.servers import PostgresServer, wait_until
from support.twitch import TwitchRig, make_rig


@pytest.fixture
def fake() -> Iterator[TwitchStandin]:
    with TwitchStandin(min_keepalive=1, reconnect_grace_secs=5) as f:
        yield f


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
        fake: TwitchStandin) -> Iterator[tuple[TwitchRig, GapRig]]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, fake)
    gaps = make_gap_rig(r.pool, r.redis, r.metrics, r.pg_url).start()
    try:
        yield r, gaps
    finally:
        r.close()
        gaps.stop()


def _source(rig: TwitchRig, gaps: GapRig) -> TwitchSource:
    src = rig.source()
    src.gaps = gaps.ledger
    src.healer = FollowerHistory(rig.cfg.accounts[0], rig.cfg.twitch, src._tokens,
                                 rig.events.persist_event, rig.metrics)
    return src


def _follows(rig: TwitchRig) -> dict[str, int]:
    return {k: n for k, n in rig.event_ids().items() if k.startswith("follow:")}


def _subscribed(fake: TwitchStandin, n: int) -> None:
    s = fake.wait_session(n)
    assert fake.wait_for(lambda: "channel.follow" in s.subscriptions, 10)


@pytest.mark.parametrize("faults", [[], [429, 401, 500]])
def test_follows_missed_while_stopped_are_healed_once_on_both_paths(
        rig: tuple[TwitchRig, GapRig], fake: TwitchStandin, faults: list[int]) -> None:
    r, gaps = rig
    first = _source(r, gaps)
    first.start()
    _subscribed(fake, 1)
    fake.follow("9000", "early")
    assert wait_until(lambda: len(_follows(r)) == 1, 10), r.event_ids()
    first.request_stop()
    assert first.join(10)

    for i in range(15):
        fake.follow(str(100 + i), f"fan{i}")  # nobody subscribed: only Helix's list has them
    fake.followers_faults.extend(faults)
    refreshes = fake.refreshes
    second = _source(r, gaps)
    second.start()
    _subscribed(fake, 2)
    fake.follow("9001", "late")

    rows = gaps.wait_rows(2, timeout=30)
    by_source = {row["source"]: row for row in rows}
    assert set(by_source) == {"eventsub", "chat"}, rows
    events, chat = by_source["eventsub"], by_source["chat"]
    assert events["status"] == "healed" and chat["status"] == "not_healable", rows
    assert (events["started_at"], events["ended_at"]) == (chat["started_at"], chat["ended_at"])
    # The 15 follows of the gap; "late" too when healing read it before the socket stored it.
    assert events["healed_rows"] in (15, 16), events
    assert wait_until(lambda: len(_follows(r)) == 17, 10), _follows(r)
    follows = _follows(r)
    assert all(n == 1 for n in follows.values()), follows
    assert {k.split(":")[1] for k in follows} == {"9000", "9001", *(str(100 + i) for i in range(15))}
    statuses = [s for _, s in fake.followers_requests]
    assert statuses[:len(faults)] == faults and statuses[-1] == 200
    if 401 in faults:
        assert fake.refreshes == refreshes + 1  # the token was renewed once
    assert gaps.value("source_gap_healed_rows_total", platform="twitch") == events["healed_rows"]


def test_a_follow_keeps_one_row_when_eventsub_and_helix_both_bring_it(
        rig: tuple[TwitchRig, GapRig], fake: TwitchStandin) -> None:
    r, gaps = rig
    src = _source(r, gaps)
    src.start()
    _subscribed(fake, 1)
    for i in range(3):
        fake.follow(str(500 + i), f"both{i}")  # on the socket, and in the list
    assert wait_until(lambda: len(_follows(r)) == 3, 10)
    src.request_stop()
    assert src.join(10)
    again = _source(r, gaps)
    again.start()
    _subscribed(fake, 2)
    [row] = [x for x in gaps.wait_rows(2, timeout=30) if x["source"] == "eventsub"]
    # The window starts 5 s before the stop: healing read the three again, as duplicates.
    assert row["status"] == "healed" and row["healed_rows"] == 0, row
    assert _follows(r) == {k: 1 for k in _follows(r)} and len(_follows(r)) == 3
