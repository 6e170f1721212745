"""Benchmark of chat storage: bytes per row and two account queries, on plain PostgreSQL
and on TimescaleDB before and after compression.

    .venv/bin/python bench/bench_storage.py [--rows 1000000] [--accounts 1000] [--days 10]

Starts a private PostgreSQL without TimescaleDB and, where it is installed, one with
it; migrates both with the daemon's migrations (so chat_messages is a hypertable with
day chunks on the second) and fills each with the same `--rows` chat rows, made by the
server from a fixed seed: `--accounts` accounts with a skewed share of the traffic
(a few busy channels, many quiet ones), over `--days` days, each row with a random
message id (a UUID, as Twitch's), a numeric user id from a pool per account, a login
and display name, a text of 1 to 15 words and the `extras` a Twitch message carries
(badges, colour, now and then emotes or a reply).

Measures, on each: the bytes per row (table, indexes and TOAST; `hypertable_size` on
TimescaleDB), and the median time of "the last 100 messages of one account" and of
"messages per minute of one account over one day" (20 runs each, warm, on an account
of median traffic). Then compresses every chunk of the hypertable with the daemon's
settings (`lumio_ingestd.db.compression`: segment by account_id, order by created_at
DESC), timing it, and measures again. Writes bench/results/bench_storage.json.
Not a test: no thresholds here.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _paths import ROOT  # noqa: E402 - first: it sets up sys.path

from lumio_ingestd.db.compression import TABLES, enable_columnstore  # noqa: E402
from lumio_ingestd.db.migrate import migrate  # noqa: E402
from lumio_ingestd.devkit.servers import PostgresServer, timescaledb_installed  # noqa: E402
from support import make_config  # noqa: E402

RUNS = 20

# Words of chat: short, repetitive, with emote names among them (as chat is).
_WORDS = ("lol", "gg", "KEKW", "PogChamp", "LUL", "nice", "what", "is", "this", "the", "stream",
          "hello", "hi", "chat", "omg", "no", "yes", "that", "was", "so", "good", "bad", "play",
          "again", "clip", "it", "haha", "W", "L", "monkaS", "Kappa", "OMEGALUL", "love", "you",
          "streamer", "game", "boss", "first", "try", "when", "raid", "sub", "hype", "let's", "go")

_FILL = """
SELECT setseed(0.42);
INSERT INTO chat_messages (account_id, platform, message_id, created_at, user_id, user_login,
                           display_name, text, extras)
SELECT a.account, 'twitch', gen_random_uuid()::text,
       %(start)s::timestamptz + random() * %(span)s::interval,
       u.uid::text, 'viewer' || u.uid, 'Viewer' || u.uid,
       (SELECT string_agg((%(words)s::text[])[1 + floor(random() * %(nwords)s)::int], ' ')
          FROM generate_series(1, 1 + floor(random() * 15)::int + 0 * g)),
       jsonb_build_object(
           'badges', CASE WHEN random() < 0.4 THEN jsonb_build_array(jsonb_build_object(
                         'set_id', 'subscriber', 'id', (1 + floor(random() * 24))::text, 'info', ''))
                     ELSE '[]'::jsonb END,
           'color', CASE WHEN random() < 0.7
                         THEN '#' || lpad(to_hex((u.uid * 2654435761) %% 16777216), 6, '0')
                         ELSE '' END,
           'message_type', 'text')
       || CASE WHEN random() < 0.15 THEN jsonb_build_object('emotes', jsonb_build_array(
                jsonb_build_object('id', 'emotesv2_' || md5(floor(random() * 50)::text), 'begin', 0,
                                   'end', 6)))
               ELSE '{}'::jsonb END
       || CASE WHEN random() < 0.05 THEN jsonb_build_object('reply', jsonb_build_object(
                'parent_message_id', gen_random_uuid()::text, 'parent_user_login', 'viewer' || g))
               ELSE '{}'::jsonb END
  FROM generate_series(1, %(rows)s) g,
       LATERAL (SELECT 1 + floor(power(random(), 2.5) * %(accounts)s)::int + 0 * g AS account) a,
       LATERAL (SELECT 10000000 + a.account * 1000 + floor(power(random(), 2) * 1000)::int AS uid) u
"""


def _one(cur: Any, sql: str, params: Any = None) -> Any:
    cur.execute(sql, params)
    row = cur.fetchone()
    return row[0] if row else None


def _size(cur: Any, hyper: bool) -> int:
    if hyper:
        return int(_one(cur, "SELECT hypertable_size('chat_messages')"))
    return int(_one(cur, "SELECT pg_total_relation_size('chat_messages')"))


def _median_ms(cur: Any, sql: str, params: Any) -> float:
    cur.execute(sql, params)  # warm
    cur.fetchall()
    times = []
    for _ in range(RUNS):
        started = time.perf_counter()
        cur.execute(sql, params)
        cur.fetchall()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


LAST_100 = ("SELECT * FROM chat_messages WHERE account_id = %s "
            "ORDER BY created_at DESC LIMIT 100")
PER_MINUTE = ("SELECT date_trunc('minute', created_at) AS minute, count(*) FROM chat_messages "
              "WHERE account_id = %s AND created_at >= %s AND created_at < %s + interval '1 day' "
              "GROUP BY 1 ORDER BY 1")


def _queries(cur: Any, account: int, day: Any) -> dict[str, float]:
    return {"last_100_ms": _median_ms(cur, LAST_100, (account,)),
            "per_minute_day_ms": _median_ms(cur, PER_MINUTE, (account, day, day))}


def measure(server: PostgresServer, work: Path, rows: int, accounts: int, days: int) -> dict[str, Any]:
    server.create_database("bench")
    cfg = make_config(work, pg_url=server.url("bench"))
    migrate(cfg.timescale)
    conn = server.connect("bench")
    try:
        with conn.cursor() as cur:
            cur.execute("SET statement_timeout = 0")
            started = time.perf_counter()
            cur.execute(_FILL, {"start": "2026-01-01T00:00:00Z", "span": f"{days} days",
                                "words": list(_WORDS), "nwords": len(_WORDS), "rows": rows,
                                "accounts": accounts})
            fill_secs = time.perf_counter() - started
            cur.execute("VACUUM ANALYZE chat_messages")
            hyper = server.timescaledb
            stored = int(_one(cur, "SELECT count(*) FROM chat_messages"))
            # An account of median traffic, and a day in the middle of the range.
            cur.execute("SELECT account_id FROM chat_messages GROUP BY 1 ORDER BY count(*), 1")
            ranked = [r[0] for r in cur.fetchall()]
            account = int(ranked[len(ranked) // 2])
            per_account = int(_one(cur, "SELECT count(*) FROM chat_messages WHERE account_id = %s",
                                   (account,)))
            day = _one(cur, "SELECT date_trunc('day', min(created_at)) + %s * interval '1 day' "
                            "FROM chat_messages", (days // 2,))
            out: dict[str, Any] = {
                "timescaledb": hyper, "rows": stored, "fill_secs": round(fill_secs, 1),
                "account": account, "account_rows": per_account,
                "uncompressed": {"bytes": _size(cur, hyper), **_queries(cur, account, day)}}
            out["uncompressed"]["bytes_per_row"] = out["uncompressed"]["bytes"] / stored
            if not hyper:
                return out
            for table in TABLES:
                enable_columnstore(conn, table)
            started = time.perf_counter()
            chunks = int(_one(cur, "SELECT count(compress_chunk(c)) FROM show_chunks('chat_messages') c"))
            compress_secs = time.perf_counter() - started
            cur.execute("ANALYZE chat_messages")
            out["compress_secs"] = round(compress_secs, 2)
            out["chunks"] = chunks
            out["compressed"] = {"bytes": _size(cur, hyper), **_queries(cur, account, day)}
            out["compressed"]["bytes_per_row"] = out["compressed"]["bytes"] / stored
            out["ratio"] = out["compressed"]["bytes"] / out["uncompressed"]["bytes"]
            if int(_one(cur, "SELECT count(*) FROM chat_messages")) != stored:
                raise SystemExit("rows changed while compressing")
            return out
    finally:
        conn.close()


def run(rows: int = 1_000_000, accounts: int = 1000, days: int = 10) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    result: dict[str, Any] = {"rows": rows, "accounts": accounts, "days": days}
    try:
        variants = [("plain", False)] + ([("timescaledb", True)] if timescaledb_installed() else [])
        for name, tsdb in variants:
            with PostgresServer(work / name, timescaledb=tsdb) as server:
                (work / f"cfg-{name}").mkdir()
                result[name] = measure(server, work / f"cfg-{name}", rows, accounts, days)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--accounts", type=int, default=1000)
    parser.add_argument("--days", type=int, default=10)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    result = run(args.rows, args.accounts, args.days)
    out = ROOT / "bench" / "results" / "bench_storage.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
