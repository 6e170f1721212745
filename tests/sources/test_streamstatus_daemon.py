"""The stream-status poller inside the real daemon process: SIGTERM mid-minute, restart, merge.

`python -m lumio_ingestd run` polls the stand-in Helix twice a second for
one live account (no socket source: the account has no user token). A
SIGTERM in the middle of a minute must write that minute's partial window
within the 8 s drain; a second process started in the same minute takes more
samples, and its window merges into the same row: every sample of both runs
is counted exactly once.
"""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime
from pathlib import Path

from lumio_ingestd.config import load
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.devkit.standins.twitch import TwitchStandin
from lumio_ingestd.events.streamstats import minute_of
from support import dbname_of, write_ini
from support.daemon import Daemon, NotifySocket
from support.harness.servers import PostgresServer, wait_until
from support.streamstatus import db_rows

SHUTDOWN_BUDGET = 8.0
EXIT_SLACK = 1.0
# Both runs must fall into one minute: started no later than this second of it.
LATEST_START_SECOND = 45


def _config(tmp_path: Path, fake: TwitchStandin, pg_url: str, redis_url: str, *,
            request_timeout: float = 2) -> Path:
    secret = tmp_path / "client_secret"
    secret.write_text(fake.client_secret + "\n")
    path = write_ini(tmp_path / "status.ini", {
        "daemon": {"state_dir": tmp_path / "state", "instance_id": "test-status", "log_level": "info"},
        "redis": {"url": redis_url},
        "timescale": {"dsn": pg_url, "connect_timeout_secs": 2},
        "http": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "events": {"retry_interval_secs": 0.5},
        "twitch": {"client_id": fake.client_id, "client_secret_file": secret,
                   "helix_url": fake.helix_url, "oauth_url": fake.oauth_url},
        "streamstatus": {"interval_secs": 0.5, "platforms": "twitch",
                         "request_timeout_secs": request_timeout},
        "account.42": {"twitch_user_id": fake.user_id},
    })
    migrate(load(str(path), {}).timescale)
    return path


def _answered(fake: TwitchStandin) -> int:
    return sum(1 for r in fake.streams_requests if r["status"] == 200)


def _run(cfg: Path, log: Path, fake: TwitchStandin, polls: int) -> tuple[int, float, str]:
    """Start the daemon, let it take `polls` samples or more, SIGTERM it between two polls.

    Returns the samples it took (answers it got), the SIGTERM-to-exit time and its log.
    """
    before = _answered(fake)
    with NotifySocket() as notify, Daemon(cfg, log, notify=notify) as daemon:
        notify.wait_for("READY=1", 20)
        assert fake.wait_for(lambda: _answered(fake) >= before + polls, 15), daemon.log
        # Signal just after an answer, well before the next poll (0.45 s at the earliest):
        # no request is in flight, so every answer counted here is a sample taken.
        seen = _answered(fake)
        assert fake.wait_for(lambda: _answered(fake) > seen, 5), daemon.log
        time.sleep(0.1)
        taken = _answered(fake) - before
        sent = daemon.signal(signal.SIGTERM)
        assert daemon.wait(SHUTDOWN_BUDGET + EXIT_SLACK) == 0, daemon.log
        exit_secs = time.monotonic() - sent
        assert _answered(fake) - before == taken, "a poll went out after the SIGTERM"
        return taken, exit_secs, daemon.log


def test_sigterm_mid_minute_writes_the_partial_window_and_a_restart_merges_into_it(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    pg_url = pg_server.url(dbname_of(pg_dsn))
    with TwitchStandin() as fake:
        cfg = _config(tmp_path, fake, pg_url, redis_url)
        stream = fake.set_live(fake.user_id, viewers=100, title="first", category="Chess")
        now = datetime.now(UTC)
        if now.second > LATEST_START_SECOND:
            wait_until(lambda: datetime.now(UTC).second < 2, 62 - now.second)
        minute = minute_of(datetime.now(UTC))

        first, exit_first, log_first = _run(cfg, tmp_path / "first.log", fake, 3)
        assert exit_first < SHUTDOWN_BUDGET, log_first
        assert "window(s) taken at the stop" in log_first, log_first
        rows = db_rows(pg_url, "SELECT ts, viewers_avg, viewers_max, samples, title FROM stream_stats")
        assert rows == [(minute, 100.0, 100, first, "first")], (rows, first)

        fake.set_live(fake.user_id, viewers=200, title="second", category="Chess")
        second, exit_second, log_second = _run(cfg, tmp_path / "second.log", fake, 2)
        assert exit_second < SHUTDOWN_BUDGET, log_second
        assert minute_of(datetime.now(UTC)) == minute, "the runs took longer than the minute"

    total = first + second
    rows = db_rows(pg_url, "SELECT ts, viewers_avg, viewers_max, samples, title, category "
                           "FROM stream_stats WHERE account_id = 42 AND platform = 'twitch'")
    assert rows == [(minute, (100 * first + 200 * second) / total, 200, total, "second", "Chess")]
    # The stream was found live by both runs: one stream.online row, one open session.
    assert db_rows(pg_url, "SELECT type, external_id FROM events") == [("stream.online", stream)]
    assert db_rows(pg_url, "SELECT external_id, ended_at FROM stream_sessions") == [(stream, None)]
    print(f"SIGTERM to exit with a partial window: {exit_first:.2f}s and {exit_second:.2f}s; "
          f"samples {first} + {second}")


def test_a_hanging_helix_does_not_delay_the_shutdown(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    with TwitchStandin() as fake:
        fake.streams_hang = True  # accepts the request and never answers
        cfg = _config(tmp_path, fake, pg_server.url(dbname_of(pg_dsn)), redis_url, request_timeout=60)
        with NotifySocket() as notify, Daemon(cfg, tmp_path / "hang.log", notify=notify) as daemon:
            notify.wait_for("READY=1", 20)
            assert fake.wait_for(lambda: len(fake.streams_requests) == 1, 15), daemon.log
            sent = daemon.signal(signal.SIGTERM)
            assert daemon.wait(SHUTDOWN_BUDGET + EXIT_SLACK) == 0, daemon.log
            exit_secs = time.monotonic() - sent
    print(f"SIGTERM to exit with a Helix request hanging: {exit_secs:.2f}s")
    assert exit_secs < 2.0, daemon.log  # the request in flight is cut, not waited for
    assert "shutdown complete" in daemon.log, daemon.log
