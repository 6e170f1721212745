"""StreamElements gaps healed from the REST history, on real servers and the stand-in.

The socket is cut and kept out while tips and activities happen; once it is
back, healing reads `/activities` and `/tips` for the gap and stores each
document once, with the socket's type and external_id and without donor PII;
the ledger row says `healed` with the rows healing stored. A history API
that fails, hangs or answers garbage holds up no live event and ends the gap
`partial` after its tries (or `healed` once it answers); a gap longer than
`heal_max_hours` is healed only for its recent part and says `partial`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lumio_ingestd.devkit.standins.streamelements import (
    AstroStandin,
    activity_doc,
    tip_activity_doc,
    tip_doc,
)
from lumio_ingestd.sources.streamelements.history import SeHistory
from lumio_ingestd.sources.streamelements.protocol import ACTIVITIES, TIPS
from lumio_ingestd.sources.streamelements.source import StreamElementsSource
from support.gaps import GapRig, make_gap_rig
from support.harness.servers import wait_until
from support.streamelements import ROOM, TOKEN, SeRig, make_rig

PII = ("donor@example.com", "203.0.113.7", '"geo"', '"email"', "ipAddress")


@dataclasses.dataclass
class Healing:
    astro: AstroStandin
    se: SeRig
    gaps: GapRig
    source: StreamElementsSource
    healer: SeHistory


@pytest.fixture
def healing(tmp_path: Path, pg_url: str, redis_url: str, request: pytest.FixtureRequest) -> Iterator[Healing]:
    opts = getattr(request, "param", {})
    with AstroStandin(token=TOKEN) as astro:
        se = make_rig(tmp_path, pg_url, redis_url, astro)
        gaps = make_gap_rig(se.pool, se.redis, se.metrics, pg_url,
                            heal_max_hours=opts.get("heal_max_hours", 72.0),
                            max_tries=opts.get("max_tries", 4)).start()
        cfg = dataclasses.replace(se.cfg.streamelements, api_url=astro.api_url)
        healer = SeHistory(se.cfg.accounts[0], cfg, se.events.persist_event, se.metrics,
                           timeout_secs=opts.get("timeout_secs", 5.0))
        source = se.source()
        source.gaps, source.healer = gaps.ledger, healer
        try:
            yield Healing(astro, se, gaps, source, healer)
        finally:
            se.close()
            gaps.stop()


def _tip(h: Healing, tip_id: str, *, also_activity: bool = True, at: float | None = None) -> None:
    created = None if at is None else (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at))
                                       + f".{int(at * 1000) % 1000:03d}Z")
    h.astro.publish(TIPS, ROOM, tip_doc(tip_id, ROOM, ip="203.0.113.7", created_at=created))
    if also_activity:
        h.astro.publish(ACTIVITIES, ROOM, tip_activity_doc(f"act-{tip_id}", tip_id, ROOM,
                                                           created_at=created))


def _cut(h: Healing) -> None:
    """The socket is dropped and every reconnect refused until `_admit`."""
    h.astro.refuse_upgrades(503, count=100_000)
    h.astro.drop(abrupt=True)
    assert h.astro.wait_for(lambda: not h.astro.live(), 10)


def _admit(h: Healing) -> None:
    h.astro.admit_upgrades()
    assert h.astro.wait_for(lambda: h.astro.subscribed(TIPS, ACTIVITIES), 15)


def _start(h: Healing) -> None:
    h.source.start()
    assert h.astro.wait_for(lambda: h.astro.subscribed(TIPS, ACTIVITIES), 10)


def test_a_dropped_socket_kept_out_while_tips_arrive_is_healed_once_without_pii(healing: Healing) -> None:
    h = healing
    _start(h)
    _tip(h, "tip-before")
    assert wait_until(lambda: h.se.stored()[("tip", "tip-before")] == 1, 10)

    _cut(h)
    during = [f"tip-gap-{i}" for i in range(4)]
    for tip_id in during:
        _tip(h, tip_id)  # as a tip and again as its activity: one `tip` row each
    h.astro.publish(ACTIVITIES, ROOM, activity_doc("act-follow-gap", ROOM, "follow"))
    h.astro.publish(ACTIVITIES, ROOM, activity_doc("act-raid-gap", ROOM, "raid"))
    time.sleep(1.0)  # the gap has a length worth measuring; nothing to wait on here
    _admit(h)
    _tip(h, "tip-after")

    rows = h.gaps.wait_rows(1, timeout=30)
    assert len(rows) == 1, rows
    row = rows[0]
    assert (row["platform"], row["source"], row["status"]) == ("streamelements", "astro", "healed")
    # tip-after may be read by healing (the window runs 5 s past the gap) before the socket
    # stores it: then healing stored it, and the socket's copy is the duplicate.
    assert row["healed_rows"] in (len(during) + 2, len(during) + 3), row
    assert (row["ended_at"] - row["started_at"]).total_seconds() >= 1.0

    assert wait_until(lambda: h.se.stored()[("tip", "tip-after")] == 1, 10)
    stored = h.se.stored()
    want = {("tip", t) for t in ["tip-before", *during, "tip-after"]} | {
        ("activity.follow", "act-follow-gap"), ("activity.raid", "act-raid-gap")}
    assert set(stored) == want, stored
    assert all(n == 1 for n in stored.values()), stored
    assert not any(m in str(p) for p in h.se.payloads() for m in PII)
    assert h.gaps.value("source_gap_healed_rows_total", platform="streamelements") == row["healed_rows"]
    assert h.gaps.value("source_gaps_total", platform="streamelements", status="healed") == 1
    # Late events are not live alerts: each row was announced by the socket or healed, never both.
    h.se.alerts.request_stop()
    h.se.alerts.join(10)
    alerts = h.gaps.value("events_alerts_published_total", sink="redis")
    assert alerts + row["healed_rows"] == len(stored), (alerts, row)


@pytest.mark.parametrize("healing", [{"max_tries": 6}], indirect=True)
def test_a_history_api_failing_then_answering_heals_later_and_live_tips_never_wait(healing: Healing) -> None:
    h = healing
    _start(h)
    _cut(h)
    _tip(h, "tip-missed")
    h.astro.fail_history("500", 2)
    h.astro.fail_history("garbage", 1)
    h.astro.fail_history("429", 1)
    _admit(h)
    _tip(h, "tip-live", also_activity=False)
    assert wait_until(lambda: h.se.stored()[("tip", "tip-live")] == 1, 5)  # not held up by healing
    rows = h.gaps.wait_rows(1, timeout=30)
    assert rows[0]["status"] == "healed", rows  # 500, 500, garbage, 429: the 5th try answers
    assert rows[0]["healed_rows"] == 1
    stored = h.se.stored()
    assert stored == {("tip", "tip-missed"): 1, ("tip", "tip-live"): 1}, stored
    statuses = [s for _, _, s in h.astro.history_requests]
    assert statuses[:4] == [500, 500, 200, 429], statuses


@pytest.mark.parametrize("healing", [{"max_tries": 3, "timeout_secs": 0.5}], indirect=True)
def test_a_hanging_history_api_ends_the_gap_partial_and_live_ingest_goes_on(healing: Healing) -> None:
    h = healing
    h.astro.hang_secs = 3.0
    _start(h)
    _cut(h)
    _tip(h, "tip-missed")
    h.astro.fail_history("hang", 100)
    _admit(h)
    for i in range(5):
        _tip(h, f"tip-live-{i}", also_activity=False)
    assert wait_until(lambda: all(h.se.stored()[("tip", f"tip-live-{i}")] == 1 for i in range(5)), 5)
    rows = h.gaps.wait_rows(1, timeout=30)
    assert rows[0]["status"] == "partial" and rows[0]["healed_rows"] == 0, rows
    assert "gave up after 3 tries" in (rows[0]["detail"] or "")
    assert ("tip", "tip-missed") not in h.se.stored()
    assert h.gaps.value("source_gaps_total", platform="streamelements", status="partial") == 1


@pytest.mark.parametrize("healing", [{"heal_max_hours": 2.0 / 3600}], indirect=True)
def test_a_gap_longer_than_heal_max_hours_is_healed_for_its_recent_part_only(healing: Healing) -> None:
    h = healing
    _start(h)
    _cut(h)
    old = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() - 30))
    # Happened long before the gap's end (the history says so): outside the 2 s healed.
    h.astro.keep_history(TIPS, ROOM, tip_doc("tip-old", ROOM, created_at=old))
    time.sleep(1.0)
    recent = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    h.astro.keep_history(TIPS, ROOM, tip_doc("tip-recent", ROOM, created_at=recent))
    _admit(h)
    rows = h.gaps.wait_rows(1, timeout=30)
    assert rows[0]["status"] == "partial", rows
    assert (rows[0]["detail"] or "").startswith("healed the last"), rows
    assert rows[0]["healed_rows"] == 1, rows
    assert h.se.stored() == {("tip", "tip-recent"): 1}


@pytest.mark.parametrize(("gap_secs", "tips"), [(1.0, 10), (3.0, 250)])
def test_requests_per_healed_gap_are_the_pages_of_both_lists(healing: Healing, gap_secs: float,
                                                              tips: int) -> None:
    """One request per page of activities and of tips (100 a page), plus the empty page that
    ends the activities; prints the figures (gap length, time to heal, requests)."""
    h = healing
    _start(h)
    _cut(h)
    cut_at = time.monotonic()
    now = time.time()
    for i in range(tips):  # a tip and its activity: two documents, one row
        _tip(h, f"tip-{i}", at=now - (tips - i) / 1000)  # a millisecond apart
    time.sleep(max(0.0, gap_secs - (time.monotonic() - cut_at)))
    before = len(h.astro.history_requests)
    _admit(h)
    [row] = h.gaps.wait_rows(1, timeout=60)
    assert row["status"] == "healed" and row["healed_rows"] == tips, row
    requests = len(h.astro.history_requests) - before
    pages = -(-tips // 100)
    # Activities: by `before` until a page is short (one more when the last page is full);
    # tips: by `offset` until `total`.
    assert requests == pages + (1 if tips % 100 == 0 else 0) + pages, requests
    closed = h.gaps.rows()[0]
    healed_in = h.se.rows("SELECT extract(epoch FROM closed_at - ended_at) FROM source_gaps")[0][0]
    print(f"\ngap {(closed['ended_at'] - closed['started_at']).total_seconds():.2f}s, {tips} tips "
          f"({2 * tips} documents): healed {row['healed_rows']} rows in {float(healed_in):.2f}s after "
          f"the gap ended, {requests} requests")
    assert sum(1 for n in h.se.stored().values() if n == 1) == tips


def test_more_activities_in_one_millisecond_than_a_page_end_the_gap_partial_and_say_why(
        healing: Healing) -> None:
    h = healing
    _start(h)
    _cut(h)
    same = time.strftime("%Y-%m-%dT%H:%M:%S.123Z", time.gmtime())
    for i in range(150):
        h.astro.publish(ACTIVITIES, ROOM, activity_doc(f"act-burst-{i}", ROOM, "follow", created_at=same))
    _admit(h)
    [row] = h.gaps.wait_rows(1, timeout=30)
    assert row["status"] == "partial" and "one millisecond" in (row["detail"] or ""), row
    assert row["healed_rows"] == 100  # the first page, stored; the rest cannot be asked for
    assert all(n == 1 for n in h.se.stored().values())


def test_an_open_gap_left_by_an_earlier_process_is_healed_when_the_path_comes_up(healing: Healing) -> None:
    """The previous process stopped while healing ran: its row stayed `open`; this one heals it."""
    from lumio_ingestd.model import Gap, GapKey

    h = healing
    end = int(time.time() * 1000) - 60_000
    start = end - 20_000
    at = (start + 5_000) / 1000
    _tip(h, "tip-left-open", at=at)  # no socket yet: only the history has it
    key = GapKey(h.se.cfg.accounts[0].account_id, "streamelements", "astro", "heal")
    assert h.gaps.table.insert(Gap(key, start, end), "open")
    _start(h)  # a first start for this path: no sourceseen record, so no new gap
    [row] = h.gaps.wait_rows(1, timeout=30)
    assert row["status"] == "healed" and row["healed_rows"] == 1, row
    assert h.se.stored() == {("tip", "tip-left-open"): 1}


@pytest.mark.parametrize(("faults", "status"), [(["401"], "healed"), (["401", "401"], "partial")])
def test_a_refused_token_is_read_again_once(healing: Healing, faults: list[str], status: str) -> None:
    h = healing
    _start(h)
    _cut(h)
    _tip(h, "tip-401", also_activity=False)
    for fault in faults:
        h.astro.fail_history(fault)
    _admit(h)
    [row] = h.gaps.wait_rows(1, timeout=30)
    assert row["status"] == status, row
    if status == "partial":
        assert "the token is refused" in (row["detail"] or ""), row
        assert [s for _, _, s in h.astro.history_requests] == [401, 401]  # and no more tries
    else:
        assert h.se.stored() == {("tip", "tip-401"): 1}
