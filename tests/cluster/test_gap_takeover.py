"""`shard = auto`: a replica SIGKILLed, its account taken over; the new owner heals the gap.

Two daemons share a StreamElements account. The one running it is SIGKILLed;
tips happen while nobody runs it; once its heartbeat has expired the other
takes the account over, subscribes, and heals the gap from the REST history:
one `healed` row starting at the killed replica's last `sourceseen` record,
every tip stored exactly once.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

import psycopg2
import redis

from lumio_ingestd.config import load
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.devkit.standins.streamelements import AstroStandin, tip_doc
from lumio_ingestd.sources.streamelements.protocol import ACTIVITIES, TIPS
from lumio_ingestd.stores import rediskeys
from support import write_ini
from support.daemon import Daemon
from support.harness.servers import wait_until

ACCOUNT = 42
ROOM = "60aa00000000000000000001"
TOKEN = "eyJhbGciOiJIUzI1NiJ9.takeover.sig"


def _config(tmp_path: Path, astro: AstroStandin, instance: str, pg_url: str, redis_url: str) -> Path:
    token = tmp_path / "se-token.json"
    token.write_text(json.dumps({"token": TOKEN, "token_type": "jwt"}))
    token.chmod(0o600)
    return write_ini(tmp_path / f"{instance}.ini", {
        "daemon": {"state_dir": tmp_path / f"state-{instance}", "instance_id": instance, "shard": "auto",
                   "accounts_dir": tmp_path / "none", "seen_interval_secs": 0.5},
        "redis": {"url": redis_url},
        "timescale": {"dsn": pg_url, "connect_timeout_secs": 2, "pool_size": 3},
        "chat": {"flush_interval_secs": 0.2},
        "events": {"retry_interval_secs": 0.5},
        "http": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "streamelements": {"astro_url": astro.url, "api_url": astro.api_url},
        f"account.{ACCOUNT}": {"streamelements_channel_id": ROOM, "streamelements_token_file": token},
    })


def _query(pg_url: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg2.connect(pg_url) as conn, conn.cursor() as cur:
        cur.execute(sql)
        rows = list(cur.fetchall())
    conn.close()
    return rows


def test_a_killed_replicas_gap_is_healed_by_the_replica_that_takes_the_account_over(
        tmp_path: Path, pg_url: str, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    with AstroStandin(token=TOKEN) as astro:
        paths = {i: _config(tmp_path, astro, i, pg_url, redis_url) for i in ("auto-a", "auto-b")}
        migrate(load(str(paths["auto-a"]), {}).timescale)
        daemons = {i: Daemon(p, tmp_path / f"{i}.log") for i, p in paths.items()}
        try:
            assert astro.wait_for(lambda: astro.subscribed(TIPS, ACTIVITIES), 30)
            owner = client.get(f"lumio:owner:{{{ACCOUNT}}}")
            assert isinstance(owner, bytes)
            killed, survivor = (("auto-a", "auto-b") if owner.decode() == "auto-a"
                                else ("auto-b", "auto-a"))
            astro.publish(TIPS, ROOM, tip_doc("tip-live", ROOM))
            assert wait_until(lambda: _query(pg_url, "SELECT count(*) FROM events") == [(1,)], 15)
            time.sleep(1.0)  # a periodic record after the tip
            daemons[killed].signal(signal.SIGKILL)
            assert daemons[killed].proc.wait(10) is not None
            last = client.hget(rediskeys.source_seen(ACCOUNT), "streamelements:astro")
            assert last is not None
            assert astro.wait_for(lambda: not astro.live(), 10)
            away = [f"tip-away-{i}" for i in range(6)]
            for tip_id in away:
                astro.publish(TIPS, ROOM, tip_doc(tip_id, ROOM))  # nobody subscribed
            # The heartbeat (15 s) expires, the survivor takes the account over and heals.
            assert astro.wait_for(lambda: astro.subscribed(TIPS, ACTIVITIES), 60), daemons[survivor].log
            assert wait_until(lambda: _query(pg_url, "SELECT status FROM source_gaps") == [("healed",)],
                              30), (_query(pg_url, "SELECT * FROM source_gaps"), daemons[survivor].log)
            daemons[survivor].signal(signal.SIGTERM)
            assert daemons[survivor].wait(20) == 0
        finally:
            for d in daemons.values():
                d.kill()
    stored = Counter(str(r[0]) for r in _query(pg_url, "SELECT external_id FROM events"))
    assert stored == Counter(["tip-live", *away]), stored
    [(started, status, healed)] = _query(pg_url, "SELECT started_at, status, healed_rows FROM source_gaps")
    assert status == "healed" and healed == len(away)
    assert int(started.timestamp() * 1000) == int(last)  # type: ignore[attr-defined]
    client.close()
