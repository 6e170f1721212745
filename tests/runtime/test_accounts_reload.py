"""`[daemon] accounts_dir` and SIGHUP: accounts added, removed and changed without a restart.

The loader tests read real files. The daemon test runs `python -m lumio_ingestd
run` against the stand-in Twitch, real Redis and PostgreSQL, with chat
flowing to every account from a pump thread the whole time: one SIGHUP adds
an account (a new file), removes one and changes another (its token file);
a second SIGHUP meets a broken file and must change nothing. The untouched
account's socket must never be reconnected, and in the database every chat
message the stand-in delivered is stored exactly once, for every account.
"""

from __future__ import annotations

import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from lumio_ingestd.cli import main as cli_main
from lumio_ingestd.config import ConfigError, load
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.devkit.standins.twitch import StandinSession, TwitchStandin
from support import dbname_of, write_ini
from support.accounts import Pump, account_section, broadcaster, sessions_of, stored_chat, subscribed
from support.daemon import Daemon, NotifySocket
from support.harness.servers import PostgresServer, wait_until

SHUTDOWN_BUDGET = 8.0


# --------------------------------------------------------------------------- the loader


def _main(tmp_path: Path, accounts_dir: Path, **accounts: dict[str, object]) -> Path:
    return write_ini(tmp_path / "ingestd.ini", {
        "daemon": {"state_dir": tmp_path / "state", "accounts_dir": accounts_dir},
        **{f"account.{k[1:]}": v for k, v in accounts.items()},
    })


def test_accounts_dir_adds_the_accounts_of_every_ini_file(tmp_path: Path) -> None:
    d = tmp_path / "accounts.d"
    d.mkdir()
    write_ini(d / "b.ini", {"account.7": {"twitch_user_id": "7007"}})
    write_ini(d / "a.ini", {"account.3": {"bluesky_did": "did:plc:three"},
                            "account.5": {"kick_chatroom_id": "55"}})
    (d / "notes.txt").write_text("[account.9]\nbogus = 1\n")  # not *.ini: not read
    cfg = load(str(_main(tmp_path, d, a1={"twitch_user_id": "1001"})), {})
    assert [a.account_id for a in cfg.accounts] == [1, 3, 5, 7]
    assert cfg.accounts[3].twitch_user_id == "7007"
    assert cfg.daemon.accounts_dir == d


def test_a_missing_accounts_dir_holds_no_accounts(tmp_path: Path) -> None:
    cfg = load(str(_main(tmp_path, tmp_path / "absent", a1={"twitch_user_id": "1001"})), {})
    assert [a.account_id for a in cfg.accounts] == [1]


def test_accounts_dir_problems_name_their_file_section_and_key(tmp_path: Path) -> None:
    d = tmp_path / "accounts.d"
    d.mkdir()
    write_ini(d / "a.ini", {"account.2": {"twitch_user_id": "2002"}, "account.4": {"twitch_usr_id": "x"}})
    write_ini(d / "b.ini", {"account.2": {"twitch_user_id": "2222"}, "redis": {"url": "redis://x:1/0"},
                            "account.6": {"twitch_user_id": "1001"}})
    main = _main(tmp_path, d, a1={"twitch_user_id": "1001"}, a4={"bluesky_did": "did:plc:x"})
    with pytest.raises(ConfigError) as err:
        load(str(main), {})
    text = [str(p) for p in err.value.problems]
    assert f"{d / 'a.ini'}: [account.4] twitch_usr_id: unknown key (did you mean \"twitch_user_id\"?)" in text
    assert f"{d / 'a.ini'}: [account.4]: [account.4] is also in {main} (an account is configured once)" \
        in text
    assert f"{d / 'b.ini'}: [account.2]: [account.2] is also in {d / 'a.ini'} " \
           "(an account is configured once)" in text
    assert f"{d / 'b.ini'}: [redis]: only [account.N] sections belong in accounts_dir" in text
    assert f"{d / 'b.ini'}: [account.6] twitch_user_id: \"1001\" is also the twitch_user_id of " \
           f"[account.1] in {main}" in text
    assert len(text) == 5, text  # b.ini's account.2 is reported once, as a duplicate


def test_check_config_validates_the_accounts_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "accounts.d"
    d.mkdir()
    main = _main(tmp_path, d, a1={"twitch_user_id": "1001"})
    write_ini(d / "a.ini", {"account.2": {"twitch_user_id": "2002"}})
    assert cli_main(["-c", str(main), "check-config"]) == 0
    (d / "b.ini").write_text("[account.3\ntwitch_user_id = 3\n")
    assert cli_main(["-c", str(main), "check-config"]) == 78
    assert str(d / "b.ini") in capsys.readouterr().err


# --------------------------------------------------------------------------- the daemon


def test_sighup_adds_removes_and_changes_accounts_while_chat_flows_exactly_once(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    pg_url = pg_server.url(dbname_of(pg_dsn))
    d = tmp_path / "accounts.d"
    d.mkdir()
    with TwitchStandin() as fake:
        secret = tmp_path / "client_secret"
        secret.write_text(fake.client_secret + "\n")
        main = write_ini(tmp_path / "ingestd.ini", {
            "daemon": {"state_dir": tmp_path / "state", "instance_id": "reload-test",
                       "accounts_dir": d},
            "redis": {"url": redis_url},
            "timescale": {"dsn": pg_url, "connect_timeout_secs": 2},
            "chat": {"flush_interval_secs": 0.2},
            "http": {"listen": "127.0.0.1:0"},
            "metrics": {"listen": "127.0.0.1:0"},
            "twitch": {"client_id": fake.client_id, "client_secret_file": secret,
                       "eventsub_ws_url": fake.ws_url, "helix_url": fake.helix_url,
                       "oauth_url": fake.oauth_url},
            "account.1": account_section(tmp_path, fake, 1),
        })
        write_ini(d / "a.ini", {"account.2": account_section(tmp_path, fake, 2),
                                "account.3": account_section(tmp_path, fake, 3)})
        migrate(load(str(main), {}).timescale)
        with NotifySocket() as notify, Daemon(main, tmp_path / "reload.log", notify=notify) as daemon:
            with Pump(fake, [1, 2, 3]) as pump:
                notify.wait_for("READY=1", 20)
                assert wait_until(lambda: all(subscribed(fake, a) for a in (1, 2, 3)), 20), daemon.log
                first_of_1 = subscribed(fake, 1)
                assert first_of_1 is not None
                old_of_3 = subscribed(fake, 3)
                assert wait_until(lambda: len(pump.ids(1)) > 50 and len(pump.ids(2)) > 50, 20)

                # Add 4 (a new file), remove 2, change 3 (another token file).
                write_ini(d / "a.ini", {"account.3": account_section(tmp_path, fake, 3, token="new")})
                write_ini(d / "b.ini", {"account.4": account_section(tmp_path, fake, 4)})
                pump.accounts.append(4)
                hup = time.monotonic()
                sent = daemon.signal(signal.SIGHUP)
                notify.wait_for("READY=1", 10, after=sent)
                # Twitch sockets 2 and 3 stop, 3 and 4 start; the stream-status poller (one
                # worker for all accounts) restarts; socket 1 keeps running.
                daemon.wait_log(r"reload: accounts added 4, removed 2, changed 3; 3 worker\(s\) stopped, "
                                r"3 started, 1 kept running", 10)
                reloaded = time.monotonic()
                assert wait_until(lambda: subscribed(fake, 4) is not None, 20), daemon.log
                assert wait_until(lambda: subscribed(fake, 3) not in (None, old_of_3), 20), daemon.log
                assert old_of_3 is not None and old_of_3.closed.is_set()
                assert subscribed(fake, 2) is None
                assert wait_until(lambda: len(pump.ids(4)) > 30 and len(pump.ids(3, after=reloaded)) > 30, 20)

                # A broken file: refused, nothing changes.
                sessions_before = len(fake.sessions)
                write_ini(d / "c.ini", {"account.5": {"twitch_user_id": broadcaster(5), "twitch_tokn": "x"}})
                daemon.signal(signal.SIGHUP)
                daemon.wait_log(r"reload: the configuration has 1 problem\(s\); keeping the running one: "
                                + str(d / "c.ini") + r": \[account\.5\] twitch_tokn: unknown key", 10)
                time.sleep(1.0)  # what a wrong reload would start has had time to connect
                assert len(fake.sessions) == sessions_before
                assert subscribed(fake, 5) is None
                assert wait_until(lambda: len(pump.ids(1, after=time.monotonic() - 0.5)) > 10, 10)
            # The pump has stopped: stop the daemon and count.
            daemon.signal(signal.SIGTERM)
            assert daemon.wait(SHUTDOWN_BUDGET + 2) == 0, daemon.log

    # Account 1 was never touched: one socket the whole time.
    assert sessions_of(fake, 1) == [first_of_1], [s.id for s in sessions_of(fake, 1)]
    assert first_of_1.close_code is None
    stored = stored_chat(pg_url)
    duplicates = {m: n for m, n in stored.items() if n > 1}
    assert not duplicates, list(duplicates)[:5]
    unknown = set(stored) - set(pump.sent)
    assert not unknown, sorted(unknown)[:5]
    for account in (1, 4):  # never interrupted / started by the reload: everything sent is stored
        missing = pump.ids(account) - set(stored)
        assert not missing, (account, sorted(missing)[:5])
    # Removed and changed: everything sent before the SIGHUP was handed over and stored;
    # for 3, everything sent to its new socket too. (What the stand-in wrote into a socket
    # the daemon was closing is what Twitch would have lost the same way.)
    for account in (2, 3):
        missing = pump.ids(account, before=hup) - set(stored)
        assert not missing, (account, sorted(missing)[:5])
    new_of_3 = _subscribed_ids_after(pump, 3, old_of_3)
    assert not (new_of_3 - set(stored)), sorted(new_of_3 - set(stored))[:5]
    print(f"reload test: {len(pump.sent)} chat messages sent, {sum(stored.values())} stored; "
          f"reload applied in {reloaded - hup:.2f}s")


def _subscribed_ids_after(pump: Pump, account: int, old: StandinSession | None) -> set[str]:
    """Ids sent to an account's sockets other than `old` (its socket after the change)."""
    assert old is not None
    return {m for m, (a, _at, s) in list(pump.sent.items()) if a == account and s != old.id}


def test_the_plan_restarts_only_what_a_changed_account_touches() -> None:
    # Per-account workers of untouched accounts are kept; a multiplexed worker restarts
    # when an account it serves changes; a reload with the same accounts plans nothing.
    from lumio_ingestd.config import AccountConfig, Config
    from lumio_ingestd.metrics import Metrics
    from lumio_ingestd.runtime.reconcile import AccountParts, AccountWorkers
    from lumio_ingestd.worker import Worker

    class Idle(Worker):
        def run_once(self) -> float:
            return 0.05

    def builder(cfg: Config, metrics: Metrics) -> AccountParts:
        parts = AccountParts()
        parts.sources = [Idle(f"source-x-{a.account_id}", metrics) for a in cfg.accounts]
        if cfg.accounts:
            parts.timers = [Idle("multiplexed", metrics)]
        return parts

    cfg = Config(path="x", accounts=(AccountConfig(1, twitch_user_id="1"),
                                     AccountConfig(2, twitch_user_id="2")))
    workers = AccountWorkers(builder, Metrics())
    workers.initial(cfg)
    plan = workers.plan(replace(cfg, accounts=(AccountConfig(1, twitch_user_id="1"),
                                               AccountConfig(2, twitch_user_id="22"), AccountConfig(3))))
    assert (plan.added, plan.removed, plan.changed) == ([3], [], [2])
    assert sorted(w.name for w in plan.stop) == ["multiplexed", "source-x-2"]
    assert sorted(w.name for w, _ in plan.start) == ["multiplexed", "source-x-2", "source-x-3"]
    assert plan.kept == 1
    assert workers.plan(cfg).empty
