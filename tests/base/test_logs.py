"""Logging: the journal's line format, the text format, and what never reaches the log.

The first tests call `setup_logging` on a StringIO. The last one runs the real
daemon under `JOURNAL_STREAM` at debug level, with a Redis password file
holding a sentinel and the synthetic source on: every line has a `<N>`
prefix, the sentinel never appears, and chat text appears only at debug.
"""

from __future__ import annotations

import io
import logging
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from lumio_ingestd.logs import setup_logging
from support import write_ini
from support.daemon import Daemon, NotifySocket

SENTINEL = "Sentinel-Secret-4711"


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def _boom() -> None:
    raise ValueError("bad value\nsecond line")


def test_journal_format_has_priority_prefixes_no_timestamp_and_one_line_tracebacks(
        restore_root_logger: None) -> None:
    out = io.StringIO()
    setup_logging("debug", {"JOURNAL_STREAM": "8:1234"}, out)
    log = logging.getLogger("lumio_ingestd.test")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    log.critical("c")
    try:
        _boom()
    except ValueError:
        log.exception("it failed")
    lines = out.getvalue().splitlines()
    assert [line[:3] for line in lines] == ["<7>", "<6>", "<4>", "<3>", "<2>", "<3>"]
    assert lines[1] == "<6>lumio_ingestd.test [MainThread]: i"
    assert not any(re.search(r"\d{4}-\d\d-\d\d", line) for line in lines)  # the journal stamps time
    # The traceback is part of its record's one line, newlines escaped.
    assert "Traceback (most recent call last):\\n" in lines[5]
    assert "ValueError: bad value\\nsecond line" in lines[5]


def test_text_format_is_timestamped_and_keeps_a_traceback_in_one_record(
        restore_root_logger: None) -> None:
    out = io.StringIO()
    setup_logging("info", {}, out)
    log = logging.getLogger("lumio_ingestd.test")
    log.debug("hidden")
    try:
        _boom()
    except ValueError:
        log.exception("it failed")
    text = out.getvalue()
    assert "hidden" not in text
    first, *rest = text.splitlines()
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ERROR   lumio_ingestd.test \[MainThread\]: "
                    r"it failed$", first)
    # Continuation lines are indented, so a reader (and grep -A) sees one record.
    assert rest and all(line.startswith("    ") for line in rest)


def test_the_daemon_under_the_journal_logs_prefixed_lines_without_secrets_or_chat_text(
        tmp_path: Path, redis_url: str) -> None:
    secret = tmp_path / "redis_password"
    secret.write_text(SENTINEL + "\n")
    # At debug, the most verbose level, with the database unreachable so that the error
    # paths log too (events are parked, chat waits in Redis).
    path = write_ini(tmp_path / "j.ini", {
        "daemon": {"state_dir": tmp_path / "state", "log_level": "debug", "instance_id": "journal"},
        "redis": {"url": redis_url, "password_file": secret},
        "timescale": {"dsn": "postgresql://lumio@127.0.0.1:1/lumio"},
        "http": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "synthetic": {"rate_per_sec": 100, "run_id": "journal", "event_every": 5},
    })
    with NotifySocket() as notify, Daemon(path, tmp_path / "j.log", notify=notify,
                                          env={"JOURNAL_STREAM": "8:1234"}) as daemon:
        notify.wait_for("READY=1", 20)
        daemon.wait_log(r"parking it", 10)
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(10) == 0, daemon.log
    lines = daemon.log.splitlines()
    assert len(lines) > 10 and all(re.match(r"<[0-7]>\S", line) for line in lines), daemon.log
    assert SENTINEL not in daemon.log
    # Chat text is only ever logged at debug (<7>).
    assert not [line for line in lines if "synthetic message" in line and not line.startswith("<7>")]
    assert "<6>lumio_ingestd.app [MainThread]: ready in" in daemon.log
    assert "synthetic: stopped run=journal" in daemon.log
