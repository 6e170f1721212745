"""A second process started under a live one's instance id while Redis is down runs no account.

Two real daemon processes, one real Redis (AOF on, as in production) stopped
and started again, the Twitch stand-in. The first daemon runs the accounts;
Redis stops; a second daemon with the same `instance_id` starts (its claim at
start cannot be checked, so it starts); Redis comes back. The second must
find the claim held and open no EventSub socket: every account keeps exactly
the one socket the first opened. When the first is SIGKILLed, the second
takes the claim (its holder's pid is gone on this host) and runs the
accounts. Both with `shard = auto` (where the owner keys hold the instance id,
so without the claim the second took them as its own) and with INDEX/COUNT.
"""

from __future__ import annotations

import signal
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from lumio_ingestd.config import load
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.devkit.standins.twitch import TwitchStandin
from support import dbname_of, write_ini
from support.accounts import account_section, sessions_of, subscribed
from support.daemon import Daemon
from support.harness.servers import PostgresServer, RedisServer, wait_until

ACCOUNTS = [1, 2, 3]
#: How long the second process is watched after Redis is back: several membership turns
#: (2 s) and claim refreshes (a third of the 15 s heartbeat TTL).
WATCH_SECS = 8.0


def _config(tmp_path: Path, fake: TwitchStandin, name: str, shard: str, pg_url: str,
            redis_url: str) -> Path:
    secret = tmp_path / "client_secret"
    secret.write_text(fake.client_secret + "\n")
    return write_ini(tmp_path / f"{name}.ini", {
        "daemon": {"state_dir": tmp_path / f"state-{name}", "instance_id": "dup", "shard": shard,
                   "accounts_dir": tmp_path / "none"},
        "redis": {"url": redis_url, "connect_timeout_secs": 1, "socket_timeout_secs": 1},
        "timescale": {"dsn": pg_url, "connect_timeout_secs": 2, "pool_size": 2},
        "chat": {"flush_interval_secs": 0.2},
        "http": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "twitch": {"client_id": fake.client_id, "client_secret_file": secret,
                   "eventsub_ws_url": fake.ws_url, "helix_url": fake.helix_url,
                   "oauth_url": fake.oauth_url},
        **{f"account.{a}": account_section(tmp_path, fake, a) for a in ACCOUNTS},
    })


def _open(fake: TwitchStandin, account: int) -> int:
    return sum(1 for s in sessions_of(fake, account) if s.open)


def _sid(fake: TwitchStandin, account: int) -> str | None:
    session = subscribed(fake, account)
    return session.id if session is not None else None


def _each_once(fake: TwitchStandin) -> bool:
    return all(_open(fake, a) == 1 and subscribed(fake, a) is not None for a in ACCOUNTS)


@pytest.mark.parametrize("shard", ["auto", "0/1"])
def test_a_duplicate_started_during_a_redis_outage_runs_no_account_until_it_holds_the_claim(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, shard: str) -> None:
    pg_url = pg_server.url(dbname_of(pg_dsn))
    with ExitStack() as stack, TwitchStandin() as fake:
        redis_server = stack.enter_context(RedisServer(tmp_path / "redis",
                                                       extra_args=("--appendonly", "yes")))
        first_cfg = _config(tmp_path, fake, "first", shard, pg_url, redis_server.url)
        second_cfg = _config(tmp_path, fake, "second", shard, pg_url, redis_server.url)
        migrate(load(str(first_cfg), {}).timescale)
        first = stack.enter_context(Daemon(first_cfg, tmp_path / "first.log"))

        def logs() -> str:
            return "\n".join(f"--- {d.log_path.name}\n{d.log[-4000:]}" for d in (first, second))

        second = first  # for logs() until the second exists
        assert wait_until(lambda: _each_once(fake), 40), logs()
        steady = {a: _sid(fake, a) for a in ACCOUNTS}

        redis_server.stop()
        second = stack.enter_context(Daemon(second_cfg, tmp_path / "second.log"))
        second.wait_log(r"cannot check whether instance id 'dup' is in use", 30)
        second.ports()  # it runs (HTTP and metrics listening) ...
        redis_server.start()
        second.wait_log(r"instance id 'dup' is in use by another process", 30)

        # ... and while the first holds the claim, it opens no EventSub socket.
        watched_until = time.monotonic() + WATCH_SECS
        while time.monotonic() < watched_until:
            assert {a: _open(fake, a) for a in ACCOUNTS} == {a: 1 for a in ACCOUNTS}, logs()
            assert {a: _sid(fake, a) for a in ACCOUNTS} == steady, logs()
            time.sleep(0.1)
        assert second.proc.poll() is None, logs()

        # The first dies: the second takes the claim (the holder's pid is gone) and the accounts.
        first.signal(signal.SIGKILL)
        first.wait(10)
        assert wait_until(lambda: _each_once(fake) and all(
            _sid(fake, a) != steady[a] for a in ACCOUNTS), 40), logs()
        second.signal(signal.SIGTERM)
        assert second.wait(20) == 0, logs()
        overlaps = {a: [(s.opened_at, s.closed_at) for s in sessions_of(fake, a)] for a in ACCOUNTS}
    # Never two sockets of one account at once: each opened after the one before it closed.
    for account, spans in overlaps.items():
        assert len(spans) == 2, (account, spans)
        (_, closed), (opened, _) = spans
        assert closed is not None and closed <= opened, (account, spans)
