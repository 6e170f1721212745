"""`lumio-ingestd demo --gap`: the daemon restarted mid-run while tips and follows keep coming.

What the stand-ins sent while the daemon was away (tips and StreamElements
follows, Twitch follows, Bluesky posts) is stored exactly once all the same:
healed from their history. The summary shows the ledger: the healed rows,
one healed gap per StreamElements and Twitch events path, and the chat paths
`not_healable`.
"""

from __future__ import annotations

from typing import Any

from test_demo import _demo


def _stored_once(summary: dict[str, Any]) -> None:
    """Every item sent is stored once (what the stand-ins could not deliver while the daemon
    was away is counted apart as not sent: Twitch and Kick chat, Twitch events but follows)."""
    for kind in ("chat", "events"):
        tally = summary[kind]
        assert tally["sent"] > 0 and tally["stored"] == tally["sent"], f"{kind}: {tally}"
        assert tally["duplicates"] == 0 and tally["lost"] == 0 and tally["unaccounted"] == 0, tally
    assert summary["ok"] is True
    assert summary["bluesky_stored"] == summary["bluesky_sent"] > 0  # the cursor rewound the gap


def test_a_restart_mid_run_is_healed_and_the_summary_shows_the_ledger() -> None:
    proc, summary = _demo("--duration", "12", "--gap")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _stored_once(summary)
    assert summary["run"]["gap"] == {"restarted": True, "first_exit_code": 0, "away_secs": 5.0}
    statuses = {(g["platform"], g["source"], g["status"]) for g in summary["gaps"]}
    assert {("streamelements", "astro", "healed"), ("twitch", "eventsub", "healed"),
            ("twitch", "chat", "not_healable"), ("kick", "pusher", "not_healable"),
            ("jetstream", "jetstream", "healed")} <= statuses, summary["gaps"]
    healed = {(g["platform"], g["source"]): 0 for g in summary["gaps"]}
    for g in summary["gaps"]:
        healed[(g["platform"], g["source"])] += g["healed_rows"]
    assert healed[("streamelements", "astro")] > 0 and healed[("twitch", "eventsub")] > 0, summary["gaps"]
    assert summary["healed_rows"] == sum(healed.values())
    assert all(4.0 < g["seconds"] < 30.0 for g in summary["gaps"]), summary["gaps"]
    assert "gaps ledger:" in proc.stdout and "rows healed" in proc.stdout
