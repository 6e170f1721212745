"""`lumio-ingestd status`: one look at everything an operator asks first.

It reads, and never changes:

- Redis (one SCAN over `lumio:*`, never KEYS, then pipelined LLEN, GET and
  PTTL): where writes go (the primary the Sentinels name, the Cluster's
  primaries, or the one server), the instances' heartbeats, the lease holders with their TTL, and per
  kind of list (chat buffers, chat and event in-flight lists, dead letters,
  quarantines) the total, the number of accounts and the ten largest;
- the database: the migrations applied (and those shipped but not applied),
  the Jetstream cursors with their lag, the gaps ledger (the open gaps and
  the last ten closed ones, `source_gaps`), and on TimescaleDB its version
  and, per table, the compressed and uncompressed chunks with their bytes
  (the compressed ones before and after compression);
- the local spool (`spool.inspect`, without its lock): size, records, the
  oldest record, and which process holds it;
- the local daemon's snapshot `STATE_DIR/status.json` (`runtime/localstate.py`): its
  phase and each source's state, last connect, last error and reconnects.

Each part is read on its own: Redis down still shows the database, the spool
and the snapshot, and the exit code (69) says that something could not be
read. `--json` prints `collect()`'s document, whose shape (`"v": 1`) is
stable: keys are only ever added. Nothing durable happens here.

Every value read may have been left by another writer, an older version or a
person: a time that is no time (milliseconds where seconds belong, NaN,
1e999, -1e20), a pid that is no pid. Such a value is shown as unreadable
(None in the JSON, with a `problem` saying what it was, and a warning in the
log) and the rest is printed as usual; it never stops the command.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg2
import psycopg2.errors
import redis

from lumio_ingestd import exitcodes
from lumio_ingestd.cluster.instances import parse_heartbeat
from lumio_ingestd.config import Config
from lumio_ingestd.db.compression import storage, timescaledb_version
from lumio_ingestd.db.migrate import packaged_migrations
from lumio_ingestd.db.pool import connect_kwargs
from lumio_ingestd.runtime.localstate import pid_running, read_snapshot, snapshot_path
from lumio_ingestd.stores.gaps import listing as gap_listing
from lumio_ingestd.stores.redisclient import REDIS_ERRORS, describe_primary
from lumio_ingestd.stores.spool import inspect as inspect_spool

FORMAT_VERSION = 1
TOP = 10
WIDTH = 100

#: (JSON name, human label, key prefix) of the lists counted per account.
LISTS = (
    ("chat_buffer", "chat buffers", "lumio:chat:buffer:{"),
    ("chat_inflight", "chat in flight", "lumio:chat:inflight:{"),
    ("chat_deadletter", "chat dead letters", "lumio:chat:deadletter:{"),
    ("chat_quarantine", "chat quarantine", "lumio:chat:quarantine:{"),
    ("events_deadletter", "event dead letters", "lumio:events:deadletter:{"),
    ("events_inflight", "events in flight", "lumio:events:inflight:{"),
    ("events_quarantine", "event quarantine", "lumio:events:quarantine:{"),
)
_INSTANCE_PREFIX = "lumio:instance:"

log = logging.getLogger("lumio_ingestd.status")


def _number(value: object) -> float | None:
    """A finite number, or None (bools, strings, NaN and infinities are no figure)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _count(value: object) -> int:
    """A counter from the snapshot: a non-negative int, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _iso(ts: object) -> str | None:
    """Unix seconds as ISO 8601 UTC; None for anything that is not a time datetime can hold."""
    secs = _number(ts)
    if secs is None:
        return None
    try:
        return datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"
    except (ValueError, OverflowError, OSError):  # before year 1 or after 9999
        return None


def _error(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__


# --------------------------------------------------------------------------- collecting


def collect(cfg: Config, *, connect_redis: Callable[[], redis.Redis],
            now: Callable[[], float] = time.time) -> dict[str, Any]:
    started = now()
    return {
        "v": FORMAT_VERSION,
        "generated_at": _iso(started),
        "config": str(cfg.path),
        "daemon": _daemon(cfg, started),
        "redis": _redis(cfg, connect_redis, started),
        "database": _database(cfg, started),
        "spool": spool_section(cfg, started),
    }


def exit_code(doc: dict[str, Any]) -> int:
    ok = doc["redis"]["ok"] and doc["database"]["ok"]
    return exitcodes.OK if ok else exitcodes.UNAVAILABLE


def _empty_list() -> dict[str, Any]:
    return {"total": 0, "accounts": 0, "largest": []}


def _redis(cfg: Config, connect_redis: Callable[[], redis.Redis], now: float) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": False, "error": None, "primary": None, "instances": [],
                           "leases": [], "lists": {name: _empty_list() for name, _, _ in LISTS},
                           "problems": []}
    try:
        client = connect_redis()
    except REDIS_ERRORS as exc:
        out["error"] = _error(exc)
        return out
    try:
        out["primary"] = describe_primary(cfg.redis, client)
        _read_redis(client, now, out)
        out["ok"] = True
    except REDIS_ERRORS as exc:
        out["error"] = _error(exc)
        out["instances"], out["leases"], out["problems"] = [], [], []
        out["lists"] = {name: _empty_list() for name, _, _ in LISTS}
    finally:
        client.close()
    return out


def _read_redis(client: redis.Redis, now: float, out: dict[str, Any]) -> None:
    instances: list[str] = []
    leases: list[str] = []
    lists: dict[str, list[tuple[int, str]]] = {name: [] for name, _, _ in LISTS}
    for raw in client.scan_iter(match="lumio:*", count=1000):
        key = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        if key.startswith(_INSTANCE_PREFIX):
            instances.append(key)
            continue
        if key.endswith(":leader"):
            leases.append(key)
            continue
        for name, _, prefix in LISTS:
            if key.startswith(prefix):
                try:
                    account = int(key[len(prefix):key.index("}", len(prefix))])
                except ValueError:
                    break  # not a key of ours
                lists[name].append((account, key))
                break
    pipe = client.pipeline(transaction=False)
    for key in sorted(instances) + sorted(leases):
        pipe.get(key)
        pipe.pttl(key)
    for name, _, _ in LISTS:
        for _, key in lists[name]:
            pipe.llen(key)
    replies = iter(pipe.execute(raise_on_error=False))

    def ttl(reply: object) -> float | None:
        return round(reply / 1000, 3) if isinstance(reply, int) and reply >= 0 else None

    for key in sorted(instances):
        value, pttl = next(replies), next(replies)
        instance = key[len(_INSTANCE_PREFIX):]
        if isinstance(value, bytes) or value is None:
            beat = parse_heartbeat(value)
            problem = beat.problem
        else:  # WRONGTYPE: the key is no string
            beat = parse_heartbeat(None)
            problem = f"unreadable: {_error(value) if isinstance(value, Exception) else value}"
        last_beat = _iso(beat.at)
        if beat.at is not None and last_beat is None:
            problem = f"unreadable time {beat.at!r}"
        if problem:
            log.warning("status: the heartbeat of instance %r (%s) is %s; shown as unreadable",
                        instance, key, problem)
        out["instances"].append({
            "instance": instance, "pid": beat.pid, "host": beat.host,
            "last_beat": last_beat,
            "age_secs": round(max(0.0, now - beat.at), 3) if last_beat and beat.at else None,
            "ttl_secs": ttl(pttl), "problem": problem})
    for key in sorted(leases):
        value, pttl = next(replies), next(replies)
        token = value.decode("utf-8", "replace") if isinstance(value, bytes) else None
        # A lease token is "OWNER:RANDOM" (cluster/lease.py); the owner is an instance id.
        holder = token.rsplit(":", 1)[0] if token and ":" in token else token
        out["leases"].append({"lease": key, "holder": holder, "ttl_secs": ttl(pttl)})
    for name, _, _ in LISTS:
        per_account: dict[int, int] = {}
        for account, key in lists[name]:
            depth = next(replies)
            if isinstance(depth, int):
                per_account[account] = per_account.get(account, 0) + depth
            else:  # WRONGTYPE: a key of a list's name holding something else (a writer's mistake)
                problem = f"{key} is not a list ({_error(depth) if isinstance(depth, Exception) else depth})"
                log.warning("status: %s; not counted", problem)
                out["problems"].append(problem)
        per_account = {a: d for a, d in per_account.items() if d > 0}
        largest = sorted(per_account.items(), key=lambda ad: (-ad[1], ad[0]))[:TOP]
        out["lists"][name] = {"total": sum(per_account.values()), "accounts": len(per_account),
                              "largest": [{"account": a, "depth": d} for a, d in largest]}


def _database(cfg: Config, now: float) -> dict[str, Any]:
    shipped = packaged_migrations()
    out: dict[str, Any] = {"ok": False, "error": None,
                           "migrations": {"applied": [], "pending": []}, "jetstream_cursors": [],
                           "timescaledb": None, "storage": [],
                           "gaps": {"open": [], "last": []}}
    try:
        conn = psycopg2.connect(cfg.timescale.dsn, **connect_kwargs(
            cfg.timescale, application_name="lumio-ingestd/status", statement_timeout_secs=10))
    except psycopg2.Error as exc:
        out["error"] = _error(exc)
        return out
    try:
        conn.autocommit = True
        applied: dict[int, dict[str, Any]] = {}
        with conn.cursor() as cur:
            try:
                cur.execute("SELECT version, name, applied_at FROM schema_migrations ORDER BY version")
                for version, name, applied_at in cur.fetchall():
                    applied[int(version)] = {"version": int(version), "name": str(name),
                                             "applied_at": _iso(applied_at.timestamp())}
            except psycopg2.errors.UndefinedTable:
                pass  # never migrated: everything is pending
            cursors: list[dict[str, Any]] = []
            try:
                cur.execute("SELECT name, time_us, updated_at FROM jetstream_cursor ORDER BY name")
                for name, time_us, updated_at in cur.fetchall():
                    at = int(time_us) / 1_000_000
                    cursor_at = _iso(at)
                    if cursor_at is None:
                        log.warning("status: the Jetstream cursor %r holds %d, which is no time "
                                    "in microseconds; shown as unreadable", name, time_us)
                    cursors.append({"name": str(name), "time_us": int(time_us), "cursor_at": cursor_at,
                                    "lag_secs": round(max(0.0, now - at), 3) if cursor_at else None,
                                    "updated_at": _iso(updated_at.timestamp()) if updated_at else None})
            except psycopg2.errors.UndefinedTable:
                pass
        out["migrations"] = {
            "applied": [applied[v] for v in sorted(applied)],
            "pending": [{"version": m.version, "name": m.name} for m in shipped
                        if m.version not in applied]}
        out["jetstream_cursors"] = cursors
        out["timescaledb"] = timescaledb_version(conn)
        out["storage"] = [t.as_dict() for t in storage(conn) or []]
        with conn.cursor() as cur:
            try:
                open_rows, last_rows = gap_listing(cur, last=TOP)
                out["gaps"] = {"open": [r.as_json() for r in open_rows],
                               "last": [r.as_json() for r in last_rows]}
            except psycopg2.errors.UndefinedTable:
                pass  # not migrated yet: the migrations line says so
        out["ok"] = True
    except psycopg2.Error as exc:
        out["error"] = _error(exc)
    finally:
        conn.close()
    return out


def spool_section(cfg: Config, now: float) -> dict[str, Any]:
    info = inspect_spool(cfg.daemon.state_dir / "spool")
    oldest_age: float | None = None
    if info.oldest_created_at is not None:
        try:
            created = datetime.fromisoformat(info.oldest_created_at.replace("Z", "+00:00"))
            oldest_age = round(max(0.0, now - created.timestamp()), 3)
        except ValueError:
            pass
    return {"directory": str(info.directory), "exists": info.exists, "segments": info.segments,
            "pending_bytes": info.pending_bytes, "records": dict(info.records),
            "oldest_created_at": info.oldest_created_at, "oldest_age_secs": oldest_age,
            "held_by_pid": info.holder_pid, "problems": list(info.problems)}


def _held_elsewhere(value: object) -> list[dict[str, Any]]:
    """A source's subscriptions held by another connection (sources/base.py `held_elsewhere`),
    each field as what it should be or None."""
    out: list[dict[str, Any]] = []
    for h in value if isinstance(value, list) else ():
        if not isinstance(h, dict):
            continue
        account = h.get("account")
        text = {k: v[:200] if isinstance(v, str) else None for k, v in (
            (key, h.get(key)) for key in ("subscription", "session_id", "status", "why"))}
        out.append({"account": account if isinstance(account, int) and not isinstance(account, bool)
                    else None, **text, "ours": h.get("ours") is True})
    return out


def _daemon(cfg: Config, now: float) -> dict[str, Any]:
    path = snapshot_path(cfg.daemon.state_dir)
    doc, problem = read_snapshot(path)
    out: dict[str, Any] = {"snapshot": str(path), "found": doc is not None, "running": False,
                           "problem": problem, "instance": None, "pid": None, "phase": None,
                           "written_at": None, "age_secs": None, "sources": [], "workers": []}
    if doc is None:
        return out
    written = _number(doc.get("written_at"))
    if _iso(written) is None:
        written = None
    age = max(0.0, now - written) if written is not None else None
    interval = _number(doc.get("interval_secs"))
    fresh_for = 3 * interval + 5 if interval is not None and interval > 0 else 15.0
    running = (doc.get("phase") != "stopped" and pid_running(doc.get("pid"))
               and age is not None and age <= fresh_for)
    if not running and doc.get("phase") != "stopped":
        out["problem"] = ("the daemon is not running, or stopped writing its snapshot "
                          f"({age:.0f}s old)" if age is not None else "the snapshot has no time")
    sources = []
    for s in doc.get("sources") or []:
        if not isinstance(s, dict):
            continue
        sources.append({
            "name": s.get("name"), "platform": s.get("platform"), "state": s.get("state"),
            "since": _iso(s.get("since")), "last_connect": _iso(s.get("last_connect")),
            "last_error": s.get("last_error"), "last_error_at": _iso(s.get("last_error_at")),
            "connects": _count(s.get("connects")), "reconnects": _count(s.get("reconnects")),
            "connect_failures": _count(s.get("connect_failures")),
            "disconnects": _count(s.get("disconnects")),
            "subscribe_refusals": _count(s.get("subscribe_refusals")),
            "unsubscribed": [{"channel": str(k), "error": str(v)} for k, v in (
                s["unsubscribed"].items() if isinstance(s.get("unsubscribed"), dict) else ())],
            "held_elsewhere": _held_elsewhere(s.get("held_elsewhere"))})
    pid = doc.get("pid")
    out.update({"running": running, "instance": doc.get("instance"),
                "pid": pid if 0 < _count(pid) < 1 << 31 else None,
                "phase": doc.get("phase"), "written_at": _iso(written),
                "age_secs": round(age, 3) if age is not None else None, "sources": sources,
                "workers": [{"name": w.get("name"), "alive": bool(w.get("alive")),
                             "healthy": bool(w.get("healthy"))}
                            for w in doc.get("workers") or [] if isinstance(w, dict)]})
    return out


# --------------------------------------------------------------------------- rendering


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by None: JSON has no such numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def to_json(doc: dict[str, Any]) -> str:
    return json.dumps(_finite(doc), ensure_ascii=False, sort_keys=True, indent=2, allow_nan=False)


def _cut(text: object, width: int) -> str:
    s = "-" if text is None else str(text)
    return s if len(s) <= width else s[:width - 1] + "~"


def _path(text: object, width: int) -> str:
    """A path cut on the left: its end says more than its start."""
    s = str(text)
    return s if len(s) <= width else "~" + s[-(width - 1):]


def _age(secs: object) -> str:
    if _number(secs) is None:
        return "-"
    assert isinstance(secs, (int, float))
    s = int(secs)
    if s < 120:
        return f"{secs:.1f}s" if s < 10 else f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 172800:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _ago(iso: object, now_iso: str) -> str:
    """An ISO time as its age relative to the document's time."""
    if not isinstance(iso, str):
        return "-"
    then = datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    return _age(datetime.fromisoformat(now_iso.replace("Z", "+00:00")).timestamp() - then) + " ago"


@dataclass
class _Out:
    lines: list[str]

    def add(self, text: str = "") -> None:
        self.lines.append(text[:WIDTH].rstrip())


def render(doc: dict[str, Any]) -> str:
    """The human form; every line fits in 100 columns."""
    o = _Out([])
    now = doc["generated_at"]
    o.add(f"lumio-ingestd status at {now} ({_path(doc['config'], 60)})")
    _render_daemon(o, doc["daemon"], now)
    _render_redis(o, doc["redis"])
    _render_database(o, doc["database"])
    render_spool(o, doc["spool"])
    return "\n".join(o.lines) + "\n"


def _render_daemon(o: _Out, d: dict[str, Any], now: str) -> None:
    o.add()
    o.add(f"Daemon on this machine ({_path(d['snapshot'], 70)})")
    if not d["found"]:
        o.add(f"  {_cut(d['problem'], 96)}")
        return
    o.add(f"  instance {_cut(d['instance'], 30)}  pid {d['pid']}  phase {d['phase']}  "
          f"{'running' if d['running'] else 'NOT RUNNING'}  snapshot {_age(d['age_secs'])} old")
    if d["problem"]:
        o.add(f"  {_cut(d['problem'], 96)}")
    dead = [w["name"] for w in d["workers"] if not w["alive"] or not w["healthy"]]
    o.add(f"  workers {len(d['workers']) - len(dead)}/{len(d['workers'])} alive and healthy"
          + (f"; not: {', '.join(dead)}" if dead else ""))
    if not d["sources"]:
        o.add("  no platform sources")
        return
    o.add(f"  {'SOURCE':<24} {'PLATFORM':<14} {'STATE':<10} {'SINCE':<10} {'CONNECTED':<12} "
          f"{'RECONN':>6}  LAST ERROR")
    for s in d["sources"]:
        o.add(f"  {_cut(s['name'], 24):<24} {_cut(s['platform'], 14):<14} {_cut(s['state'], 10):<10} "
              f"{_cut(_ago(s['since'], now).removesuffix(' ago'), 10):<10} "
              f"{_cut(_ago(s['last_connect'], now), 12):<12} {s['reconnects']:>6}  "
              f"{_cut(s['last_error'], 15)}")
        if s["last_error"] and len(str(s["last_error"])) > 15:
            o.add(f"      last error {_ago(s['last_error_at'], now)}: {_cut(s['last_error'], 70)}")
        for u in s["unsubscribed"]:
            o.add(f"      not subscribed: {_cut(u['channel'], 50)} (retrying; "
                  f"{s['subscribe_refusals']} refusals so far)")
            o.add(f"        refused with: {_cut(u['error'], 80)}")
        for h in s.get("held_elsewhere", []):
            holder = f"session {h['session_id']}" if h["session_id"] else "an unlisted holder"
            o.add(f"      held elsewhere (account {h['account'] if h['account'] is not None else '?'}): "
                  f"{_cut(h['subscription'], 60)}")
            o.add(f"        by {_cut(holder, 60)} ({'ours, live' if h['ours'] else 'not ours'}, "
                  f"{_cut(h['status'], 24)})")
            o.add(f"        {_cut(h['why'], 90)}")


def _render_redis(o: _Out, r: dict[str, Any]) -> None:
    o.add()
    o.add("Redis" + ("" if r["ok"] else f": UNREACHABLE ({_cut(r['error'], 80)})"))
    if r.get("primary"):
        o.add(f"  primary {r['primary']}")
    if not r["ok"]:
        return
    o.add(f"  instances ({len(r['instances'])})" + ("" if r["instances"] else ": none alive"))
    for i in r["instances"]:
        beat = ("unreadable" if i.get("problem") else "unknown") if i["age_secs"] is None \
            else _age(i["age_secs"]) + " ago"
        o.add(f"    {_cut(i['instance'], 36):<36} pid {_cut(i['pid'], 8):<8} "
              f"last beat {beat:>11}  ttl {_age(i['ttl_secs'])}")
        if i.get("problem"):
            o.add(f"      heartbeat {_cut(i['problem'], 84)}")
    o.add(f"  leases ({len(r['leases'])})" + ("" if r["leases"] else ": none held"))
    for lease in r["leases"]:
        o.add(f"    {_cut(lease['lease'], 40):<40} held by {_cut(lease['holder'], 30):<30} "
              f"ttl {_age(lease['ttl_secs'])}")
    o.add("  lists: total in how many accounts; the largest as ACCOUNT=DEPTH")
    for name, label, _ in LISTS:
        lst = r["lists"][name]
        head = f"    {label:<20} {lst['total']:>10} in {lst['accounts']:>5} account(s)"
        largest = [f"{x['account']}={x['depth']}" for x in lst["largest"]]
        _wrap(o, head, largest)
    for problem in r.get("problems", []):
        o.add(f"  problem: {_cut(problem, 88)}")


def _wrap(o: _Out, head: str, items: list[str]) -> None:
    line = head + ("  " if items else "")
    indent = " " * 8
    for item in items:
        if len(line) + len(item) + 1 > WIDTH:
            o.add(line)
            line = indent
        line += item + " "
    o.add(line)


def _render_database(o: _Out, d: dict[str, Any]) -> None:
    o.add()
    o.add("Database" + ("" if d["ok"] else f": UNREACHABLE ({_cut(d['error'], 80)})"))
    if not d["ok"]:
        return
    applied, pending = d["migrations"]["applied"], d["migrations"]["pending"]
    last = applied[-1] if applied else None
    o.add(f"  migrations: {len(applied)} applied"
          + (f", latest {last['version']:04d}_{_cut(last['name'], 30)} at {last['applied_at']}"
             if last else ""))
    if pending:
        o.add("  PENDING (run `lumio-ingestd migrate`): "
              + ", ".join(f"{m['version']:04d}_{m['name']}" for m in pending))
    cursors = d["jetstream_cursors"]
    o.add(f"  jetstream cursors ({len(cursors)})" + ("" if cursors else ": none saved"))
    for c in cursors:
        o.add(f"    {_cut(c['name'], 30):<30} at {c['cursor_at'] or 'an unreadable time'}  "
              f"lag {_age(c['lag_secs'])}")
    gaps = d.get("gaps") or {"open": [], "last": []}
    o.add(f"  open gaps ({len(gaps['open'])})" + ("" if gaps["open"] else ": none"))
    for g in gaps["open"]:
        o.add("    " + _gap_line(g))
    o.add(f"  last closed gaps ({len(gaps['last'])})" + ("" if gaps["last"] else ": none"))
    for g in gaps["last"]:
        o.add("    " + _gap_line(g))
    if d["timescaledb"] is None:
        o.add("  plain PostgreSQL (no TimescaleDB): nothing is compressed")
        return
    o.add(f"  TimescaleDB {_cut(d['timescaledb'], 20)}: chunks and bytes per table")
    for t in d["storage"]:
        before, after = t["compressed_before_bytes"], t["compressed_after_bytes"]
        ratio = f" ({before / after:.1f}x)" if after else ""
        o.add(f"    {t['table']:<14} compressed {t['compressed_chunks']:>5}: {_bytes(before)} -> "
              f"{_bytes(after)}{ratio};  uncompressed {t['uncompressed_chunks']:>5}: "
              f"{_bytes(t['uncompressed_bytes'])}")


def _gap_line(g: dict[str, Any]) -> str:
    healed = f", {g['healed_rows']} row(s) stored late" if g["healed_rows"] else ""
    detail = f" ({_cut(g['detail'], 40)})" if g.get("detail") else ""
    return (f"account {g['account_id']} {g['platform']}/{g['source']} {g['started_at']} "
            f"+{_age(g['seconds'])} {g['status']}{healed}{detail}")


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return ""


def spool_lines(section: dict[str, Any]) -> list[str]:
    """The spool part of the human form alone (`spool status`)."""
    o = _Out([])
    render_spool(o, section)
    return o.lines[1:]


def render_spool(o: _Out, s: dict[str, Any]) -> None:
    o.add()
    holder = f"held by pid {s['held_by_pid']}" if s["held_by_pid"] else "not held by any process"
    o.add(f"Spool ({_path(s['directory'], 60)}): {holder if s['exists'] else 'no directory yet'}")
    if s["exists"]:
        o.add(f"  {s['pending_bytes']} bytes waiting for replay in {s['segments']} segment(s): "
              f"{s['records']['chat']} chat, {s['records']['event']} event record(s)")
        if s["oldest_created_at"]:
            o.add(f"  oldest record created {s['oldest_created_at']} "
                  f"({_age(s['oldest_age_secs'])} ago)")
    for problem in s["problems"]:
        o.add(f"  problem: {_cut(problem, 86)}")
