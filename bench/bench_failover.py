"""`shard = auto` failover: SIGKILL of one replica to all of its accounts connected elsewhere.

    .venv/bin/python bench/bench_failover.py [--runs 5] [--accounts 30] [--replicas 3]

Each run starts `--replicas` real daemons (`python -m lumio_ingestd run`,
`shard = auto`) on private Redis and PostgreSQL and the stand-in Twitch (in
this process), waits until every account has one socket and its owner key
names its rendezvous owner, SIGKILLs one replica and measures:

- kill -> its heartbeat `lumio:instance:INSTANCE` gone (the TTL: at least
  15 s, `max(15, 3 * [chat] flush_interval_secs)`);
- heartbeat gone -> every one of its accounts subscribed on a survivor's
  socket (the membership turn, 2 s, plus the connect and the subscriptions);
- the total, kill -> all connected elsewhere.

Prints a table and the medians; writes bench/results/bench_failover.json.
Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis
from _paths import ROOT  # first of the local imports: it sets up sys.path

from lumio_ingestd.cluster.membership import owner  # noqa: E402
from lumio_ingestd.config import load  # noqa: E402
from lumio_ingestd.db.migrate import migrate  # noqa: E402
from lumio_ingestd.devkit.servers import wait_until  # noqa: E402
from lumio_ingestd.devkit.standins.twitch import TwitchStandin  # noqa: E402
from support import write_ini  # noqa: E402
from support.accounts import account_section, sessions_of, subscribed  # noqa: E402
from support.daemon import Daemon  # noqa: E402
from support.harness import PostgresServer, RedisServer  # noqa: E402


def _config(work: Path, fake: TwitchStandin, name: str, redis_url: str, pg_url: str,
            accounts: dict[str, dict[str, object]]) -> Path:
    secret = work / "client_secret"
    secret.write_text(fake.client_secret + "\n")
    return write_ini(work / f"{name}.ini", {
        "daemon": {"state_dir": work / f"state-{name}", "instance_id": name, "shard": "auto",
                   "accounts_dir": work / "none"},
        "redis": {"url": redis_url},
        "timescale": {"dsn": pg_url, "connect_timeout_secs": 2, "pool_size": 2},
        "chat": {"flush_interval_secs": 0.2},
        "http": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "twitch": {"client_id": fake.client_id, "client_secret_file": secret,
                   "eventsub_ws_url": fake.ws_url, "helix_url": fake.helix_url, "oauth_url": fake.oauth_url},
        **accounts,
    })


def _one(work: Path, run: int, redis_url: str, pg_url: str, n_accounts: int,
         n_replicas: int) -> dict[str, Any]:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    ids = list(range(1, n_accounts + 1))
    names = [f"r{run}-{i}" for i in range(n_replicas)]
    with TwitchStandin() as fake, ExitStack() as stack:
        accounts = {f"account.{a}": account_section(work, fake, a, token=f"r{run}") for a in ids}
        configs = {n: _config(work, fake, n, redis_url, pg_url, accounts) for n in names}
        if run == 0:
            migrate(load(str(configs[names[0]]), {}).timescale)
        daemons = {n: stack.enter_context(Daemon(configs[n], work / f"{n}.log")) for n in names}

        def settled() -> bool:
            owners = client.mget([f"lumio:owner:{{{a}}}" for a in ids])
            keys_ok = all(v is not None and v.decode() == owner(a, names)
                          for a, v in zip(ids, owners, strict=True))
            return keys_ok and all(sum(1 for s in sessions_of(fake, a) if s.open) == 1 for a in ids)

        if not wait_until(settled, 60):
            raise RuntimeError("the replicas did not settle:\n" + daemons[names[0]].log[-3000:])
        victim = names[-1]
        theirs = [a for a in ids if owner(a, names) == victim]
        old = {a: s.id for a in theirs if (s := subscribed(fake, a)) is not None}
        daemons[victim].signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: not client.exists(f"lumio:instance:{victim}"), 30)
        expired = time.monotonic()

        def moved() -> bool:
            return all((s := subscribed(fake, a)) is not None and s.id != old.get(a) for a in theirs)

        ok = wait_until(moved, 60)
        done = time.monotonic()
        for name in names[:-1]:
            daemons[name].signal(signal.SIGTERM)
        for name in names[:-1]:
            daemons[name].wait(15)
    client.close()
    return {"run": run, "accounts_moved": len(theirs), "ok": ok,
            "kill_to_expiry_secs": round(expired - killed, 3),
            "expiry_to_connected_secs": round(done - expired, 3),
            "kill_to_connected_secs": round(done - killed, 3)}


def run(runs: int = 5, accounts: int = 30, replicas: int = 3) -> dict[str, Any]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        work = Path(tmp)
        with RedisServer(work / "redis") as redis_server, PostgresServer(work / "pg") as pg:
            pg.create_database("lumio")
            for i in range(runs):
                rows.append(_one(work, i, redis_server.url, pg.url("lumio"), accounts, replicas))
                print(f"run {i}: {rows[-1]}", file=sys.stderr)
    good = [r for r in rows if r["ok"]]
    summary = {key: statistics.median(r[key] for r in good) if good else None
               for key in ("kill_to_expiry_secs", "expiry_to_connected_secs", "kill_to_connected_secs")}
    return {"accounts": accounts, "replicas": replicas, "runs": rows, "median": summary}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--accounts", type=int, default=30)
    parser.add_argument("--replicas", type=int, default=3)
    args = parser.parse_args()
    result = run(args.runs, args.accounts, args.replicas)
    print(f"{'run':>4} {'moved':>6} {'kill->expiry s':>15} {'expiry->connected s':>20} "
          f"{'kill->connected s':>18}")
    for r in result["runs"]:
        print(f"{r['run']:>4} {r['accounts_moved']:>6} {r['kill_to_expiry_secs']:>15.2f} "
              f"{r['expiry_to_connected_secs']:>20.2f} {r['kill_to_connected_secs']:>18.2f}"
              + ("" if r["ok"] else "  (did not finish)"))
    m = result["median"]
    print(f"median: kill->expiry {m['kill_to_expiry_secs']}s, expiry->connected "
          f"{m['expiry_to_connected_secs']}s, kill->connected {m['kill_to_connected_secs']}s")
    out = ROOT / "bench" / "results" / "bench_failover.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
