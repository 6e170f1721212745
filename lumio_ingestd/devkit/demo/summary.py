"""The demo's closing account: what was sent, where each of it ended up, whether anything was lost.

Built after the daemon exited, from three witnesses:

- the traffic's own count of what the stand-ins sent;
- the database (rows and distinct keys, so a duplicate would show) and Redis
  (what still waits in buffers, dead-letter, in-flight and quarantine lists
  for the next start), both read after the daemon's drain;
- the daemon's `/metrics` as last scraped before the SIGTERM (parked,
  recovered, spooled, lost: counters the database cannot tell).

`unaccounted` is sent minus stored minus waiting minus quarantined: zero when
every message and event is somewhere the daemon said it would be. The run is
`ok` when nothing is unaccounted, nothing is duplicated and the daemon counted
nothing lost. `machine_line()` is the same as one JSON line for scripts and
tests. Nothing durable here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from lumio_ingestd.devkit.demo.observe import Depths, Rows, Snapshot

MACHINE_PREFIX = "demo-summary: "


@dataclass(frozen=True)
class Tally:
    sent: int
    stored: int  # distinct rows
    duplicates: int
    waiting_in_redis: int
    quarantined: int
    lost: int  # as the daemon counted it
    unaccounted: int

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicates == 0 and self.unaccounted == 0


@dataclass(frozen=True)
class Summary:
    chat: Tally
    events: Tally
    events_parked: int
    events_replayed: int  # stored by the retry worker, or found already stored by it
    events_rejected: int
    chat_deadletter_replayed: int
    chat_spooled: int
    gift_recipients: int
    bluesky_sent: int
    bluesky_stored: int
    events_sent_by_type: Mapping[str, int]
    alerts: Mapping[str, int]
    not_sent: int
    run: Mapping[str, Any] = field(default_factory=dict)  # duration, chaos, drain, ports, tmpdir...
    #: The gaps ledger (`source_gaps`): one entry per gap of an account's source path.
    gaps: list[Mapping[str, Any]] = field(default_factory=list)

    @property
    def healed_rows(self) -> int:
        return sum(int(g["healed_rows"]) for g in self.gaps)

    @property
    def ok(self) -> bool:
        return self.chat.ok and self.events.ok

    def document(self) -> str:
        """The whole summary as one JSON document, for scripts and tests."""
        data = asdict(self)
        data["ok"] = self.ok
        data["healed_rows"] = self.healed_rows
        return json.dumps(data, sort_keys=True)

    def machine_line(self) -> str:
        return MACHINE_PREFIX + self.document()


def _tally(sent: int, rows: int, distinct: int, waiting: int, quarantined: int, lost: int) -> Tally:
    return Tally(sent=sent, stored=distinct, duplicates=rows - distinct, waiting_in_redis=waiting,
                 quarantined=quarantined, lost=lost,
                 unaccounted=sent - distinct - waiting - quarantined)


def build(final: Snapshot, last_metrics: Snapshot, alerts: Mapping[str, int],
          run: Mapping[str, Any], gaps: list[Mapping[str, Any]] | None = None) -> Summary:
    """`final`: rows (exact) and depths after the daemon exited; `last_metrics`: its last scrape."""
    rows = final.rows or Rows(0, 0, 0, 0, 0, 0)
    depths = final.depths or Depths(0, 0, 0, 0, 0, 0, 0)
    sent = final.sent
    m = last_metrics.metric
    chat = _tally(sent.chat, rows.chat, rows.chat_distinct or 0, depths.chat_waiting,
                  depths.chat_quarantine, int(m("chat_messages_total", path="lost")))
    events = _tally(sent.events, rows.events, rows.events_distinct or 0, depths.events_waiting,
                    depths.events_quarantine, int(m("events_persist_failures_total", outcome="lost")))
    return Summary(
        chat=chat, events=events,
        events_parked=int(m("events_persist_failures_total", outcome="parked")),
        events_replayed=int(m("events_persisted_total", path="replay")
                            + m("events_persist_failures_total", outcome="recovered")),
        events_rejected=int(m("events_persist_failures_total", outcome="rejected")),
        chat_deadletter_replayed=int(m("chat_dead_letters_replayed_total")),
        chat_spooled=int(m("chat_messages_total", path="spooled")),
        gift_recipients=rows.children, bluesky_sent=sent.bluesky, bluesky_stored=rows.bluesky,
        events_sent_by_type=dict(sent.by_type), alerts=dict(alerts), not_sent=sent.refused,
        run=dict(run), gaps=list(gaps or []))


def render(s: Summary) -> list[str]:
    """The summary for people: a small table and a verdict."""
    head = f"{'':<18}{'sent':>9}{'stored':>9}{'in Redis':>10}{'quarantined':>13}{'lost':>6}"
    lines = ["", "Summary", head]
    for label, t in (("chat messages", s.chat), ("platform events", s.events)):
        lines.append(f"{label:<18}{t.sent:>9,}{t.stored:>9,}{t.waiting_in_redis:>10,}"
                     f"{t.quarantined:>13,}{t.lost:>6,}")
    lines.append(f"{'Bluesky records':<18}{s.bluesky_sent:>9,}{s.bluesky_stored:>9,}")
    lines.append(f"  events parked in Redis while the database was unreachable: {s.events_parked}, "
                 f"replayed from there: {s.events_replayed}")
    lines.append("  chat moved to the dead-letter lists and replayed from there: "
                 f"{s.chat_deadletter_replayed}")
    lines.append(f"  gift recipients linked to their gift bomb: {s.gift_recipients}; chat spooled to "
                 f"disk: {s.chat_spooled}; events rejected: {s.events_rejected}")
    top = ", ".join(f"{k} {v}" for k, v in sorted(s.alerts.items(), key=lambda kv: (-kv[1], kv[0]))[:6])
    seen = f"  live alerts seen on lumio:alerts:*: {sum(s.alerts.values())}"
    lines.append(seen + (f" ({top})" if top else ""))
    daemon = s.run.get("daemon", {})
    if daemon:
        drain = daemon.get("drain_secs")
        lines.append(f"  the daemon drained in {drain:.2f}s and exited with code {daemon.get('exit_code')}"
                     if drain is not None else f"  the daemon exited with code {daemon.get('exit_code')}")
    if s.gaps:
        by: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
        for g in s.gaps:
            by.setdefault((str(g["platform"]), str(g["source"]), str(g["status"])), []).append(g)
        lines.append(f"  gaps ledger: {len(s.gaps)} gaps; healing stored {s.healed_rows} events the "
                     "live path had not (late, no live alert):")
        for (platform, source, status), items in sorted(by.items()):
            rows = sum(int(g["healed_rows"]) for g in items)
            longest = max(float(g["seconds"]) for g in items)
            lines.append(f"    {platform}/{source}: {len(items)} {status}, longest {longest:.1f}s"
                         + (f", {rows} rows healed" if rows else ""))
    if s.not_sent:
        lines.append(f"  {s.not_sent} notifications were not sent (the stand-in had no open session)")
    problems = [f"{name}: {problem}" for name, t in (("chat", s.chat), ("events", s.events))
                for problem in _problems(t)]
    if not problems:
        waiting = s.chat.waiting_in_redis + s.events.waiting_in_redis
        lines.append("Every chat message and event sent was stored exactly once; nothing was lost."
                     if waiting == 0 else
                     f"Nothing was lost or stored twice; {waiting} entries were still waiting in Redis "
                     "for the next start when the demo stopped.")
    else:
        lines.append("PROBLEM: " + "; ".join(problems))
    return lines


def _problems(t: Tally) -> list[str]:
    out = []
    if t.lost:
        out.append(f"{t.lost} counted lost")
    if t.duplicates:
        out.append(f"{t.duplicates} stored twice")
    if t.unaccounted:
        out.append(f"{t.unaccounted} sent but neither stored, waiting nor quarantined")
    return out
