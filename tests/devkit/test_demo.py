"""`lumio-ingestd demo`, end to end: the real command, its own servers, stand-ins and daemon.

The demo runs as a subprocess from the repository, exactly as a user runs it.
Its database is gone when it returns, so the oracle is its machine-readable
summary (a JSON file the last line names, or `--json FILE`), which it builds from the database and
Redis after the daemon's drain and from the daemon's metrics; on top, the
test checks that nothing it started is still running (no process naming its
temporary directory, none of its ports open) and that the directory is gone.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import support
from lumio_ingestd import cli
from lumio_ingestd.devkit.demo.observe import Rows, Snapshot
from lumio_ingestd.devkit.demo.progress import Console, status_line
from lumio_ingestd.devkit.demo.traffic import SentCounts

ROOT = support.ROOT
PROMISED_EVENTS = {
    "stream.online", "stream.offline", "channel.follow", "channel.subscribe",
    "channel.subscription.message", "channel.chat.notification", "channel.subscription.gift",
    "channel.cheer", "channel.raid", "channel.channel_points_custom_reward_redemption.add",
    "emote.added", "emote.renamed",
}


def _demo(*args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The demo's output, and its summary from the file its last line names."""
    proc = subprocess.run([sys.executable, "-m", "lumio_ingestd", "demo", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    said = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    named = [line for line in proc.stdout.splitlines() if line.startswith("machine-readable summary: ")]
    assert len(named) == 1, said
    # A person reads the table: no JSON on the terminal.
    assert not any(line.lstrip().startswith(("{", "demo-summary")) for line in proc.stdout.splitlines()), said
    path = Path(named[0].split(": ", 1)[1])
    try:
        return proc, json.loads(path.read_text())
    finally:
        path.unlink()


def _processes_naming(text: str) -> list[str]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


def _open_ports(ports: dict[str, int]) -> list[str]:
    open_ = []
    for name, port in ports.items():
        with socket.socket() as s:
            s.settimeout(1.0)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                open_.append(f"{name} {port}")
    return open_


def _assert_nothing_left(summary: dict[str, Any]) -> None:
    run = summary["run"]
    tmpdir = run["tmpdir"]
    assert tmpdir.startswith("/tmp/lumio-demo-")
    assert not Path(tmpdir).exists(), f"{tmpdir} was not removed"
    assert _processes_naming(tmpdir) == [], "processes of the demo are still running"
    assert not Path(f"/proc/{run['daemon']['pid']}").exists(), "the daemon is still there"
    assert set(run["ports"]) >= {"redis", "postgres", "twitch_ws", "twitch_http", "jetstream", "http",
                                 "metrics", "kick_ws", "kick_http"}
    assert _open_ports(run["ports"]) == []


def _assert_exactly_once(summary: dict[str, Any]) -> None:
    for kind in ("chat", "events"):
        tally = summary[kind]
        assert tally["sent"] > 0, tally
        assert tally["stored"] == tally["sent"], f"{kind}: {tally}"
        assert tally["duplicates"] == 0, f"{kind}: {tally}"
        assert tally["lost"] == 0, f"{kind}: {tally}"
        assert tally["unaccounted"] == 0 and tally["waiting_in_redis"] == 0, f"{kind}: {tally}"
        assert tally["quarantined"] == 0, f"{kind}: {tally}"
    assert summary["ok"] is True
    assert summary["not_sent"] == 0
    assert summary["bluesky_sent"] > 0 and summary["bluesky_stored"] == summary["bluesky_sent"]
    assert summary["run"]["settled"] is True
    assert summary["run"]["daemon"]["exit_code"] == 0
    assert summary["run"]["daemon"]["drain_complete"] is True


def test_demo_ingests_realistic_traffic_exactly_once_and_leaves_nothing_running() -> None:
    proc, summary = _demo("--duration", "15")  # the summary goes to a new file under /tmp
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_exactly_once(summary)
    assert set(summary["events_sent_by_type"]) >= PROMISED_EVENTS
    # StreamElements: each tip goes out on both topics and is one `tip` row (and one alert).
    assert summary["events_sent_by_type"]["tip"] >= 1
    # A few hundred chat messages per second for 15 s, bursts included.
    assert summary["chat"]["sent"] > 15 * 150
    # One gift bomb of five per ten-second cycle: five recipients linked to each; on Kick a gift of
    # three per cycle, one event with its three recipients.
    gifts = summary["events_sent_by_type"]["channel.subscription.gift"]
    kick_gifts = summary["events_sent_by_type"].get("channel.subscription.gifts", 0)
    assert kick_gifts >= 1
    assert summary["gift_recipients"] == 5 * gifts + 3 * kick_gifts
    # Kick: chat over the socket and webhooks, events over both.
    assert {"StreamHostEvent", "channel.followed", "kicks.gifted",
            "livestream.status.updated"} <= set(summary["events_sent_by_type"])
    # Every event and every new Bluesky post went out as a live alert, once.
    alerts = summary["alerts"]
    assert {k: v for k, v in alerts.items() if k != "bluesky.post"} == summary["events_sent_by_type"]
    assert 0 < alerts["bluesky.post"] <= summary["bluesky_sent"]
    assert summary["events_parked"] == 0  # nothing went wrong, nothing parked
    # Not a terminal: the progress comes as plain periodic lines.
    progress = [line for line in proc.stdout.splitlines() if "| chat " in line]
    assert len(progress) >= 5 and "\r" not in proc.stdout
    assert "Every chat message and event sent was stored exactly once" in proc.stdout
    _assert_nothing_left(summary)


def test_demo_chaos_parks_and_replays_while_the_database_is_stopped(tmp_path: Path) -> None:
    proc, summary = _demo("--duration", "15", "--chaos", "--json", str(tmp_path / "summary.json"))
    assert f"machine-readable summary: {tmp_path / 'summary.json'}" in proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_exactly_once(summary)
    assert "chaos: PostgreSQL stopped" in proc.stdout and "chaos: PostgreSQL is back" in proc.stdout
    assert "db DOWN" in proc.stdout  # the progress showed the outage
    # Events sent during the outage were parked, and every parked one was replayed once.
    assert summary["events_parked"] > 0
    assert summary["events_replayed"] == summary["events_parked"]
    # Chat waited in Redis, failed its flushes and went through the dead-letter drain.
    assert summary["chat_deadletter_replayed"] > 0
    _assert_nothing_left(summary)


def test_demo_without_websockets_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "websockets", None)  # `import websockets` now fails
    assert cli.main(["demo", "--duration", "1"], environ={}) == 69
    assert "pip install 'lumio-ingestd[demo]'" in capsys.readouterr().err


def test_demo_takes_no_config_file() -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["-c", "/etc/lumio/ingestd.ini", "demo"], environ={})
    assert exc.value.code == 64


def test_on_a_terminal_the_progress_line_is_rewritten_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # wide enough for the whole line, whatever runs the tests
    out = io.StringIO()
    console = Console(out, tty=True)
    console.notice("a setup step")
    console.started = 0.0  # traffic "started" long ago: every line has a time
    sent = SentCounts(chat=10, events=2, bluesky=1)
    snap = Snapshot(1.0, sent, Rows(9, 2, 0, 1), None, None, alerts=2)
    console.status(status_line(snap, None, 1.0, "running"))
    console.status(status_line(snap, None, 2.0, "running"))
    console.notice("raid!")
    console.end_status()
    text = out.getvalue()
    assert text.startswith("  - a setup step\n")
    assert text.count("\r\x1b[K[") == 3  # two redraws and the clear before the notice
    assert "raid!\n" in text and text.endswith("db up\n")
    assert "buffer ?" in text  # Redis did not answer: shown as "?"
