"""The one-shot administrative commands: retention, GDPR erasure and export,
account dissolution, and the operator's view (status, quarantine, spool).
Each opens what it needs, does one job, prints a receipt, and closes
everything again; the exit code says how it went."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from lumio_ingestd import exitcodes
from lumio_ingestd.config import Config
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.lifecycle import dissolve as dissolve_mod
from lumio_ingestd.lifecycle import gdpr, retention
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.stores import refused_frames
from lumio_ingestd.stores.redisclient import connect
from lumio_ingestd.stores.spool import lock_holder

log = logging.getLogger("lumio_ingestd.admin")


@contextmanager
def _pool(cfg: Config) -> Iterator[Pool]:
    pool = Pool(cfg.timescale, name="admin", size=1)
    try:
        yield pool
    finally:
        pool.close()


def retention_once(cfg: Config, batch_size: int) -> int:
    with _pool(cfg) as pool:
        report = retention.run_retention(pool, cfg, batch_size=batch_size)
    print(json.dumps({"retention": {"deleted": report.deleted,
                                    "dropped_chunks": report.dropped_chunks}}, sort_keys=True))
    return exitcodes.OK


def gdpr_erase(cfg: Config, platform: str, user_id: str) -> int:
    client = connect(cfg.redis)
    try:
        with _pool(cfg) as pool:
            receipt = gdpr.erase_user(pool, client, platform, user_id,
                                      frames=refused_frames.for_config(cfg, Metrics()))
    finally:
        client.close()
    print(receipt.to_json())
    return exitcodes.OK


def export(cfg: Config, output: str | None, account: int | None, platform: str | None,
           user_id: str | None) -> int:
    out: TextIO
    with _pool(cfg) as pool:
        if output is None:
            counts = gdpr.export(pool, sys.stdout, account=account, platform=platform, user_id=user_id)
        else:
            with open(output, "w", encoding="utf-8") as out:
                counts = gdpr.export(pool, out, account=account, platform=platform, user_id=user_id)
    print(json.dumps({"export": counts}, sort_keys=True), file=sys.stderr)
    return exitcodes.OK


def dissolve(cfg: Config, account_id: int) -> int:
    client = connect(cfg.redis)
    try:
        with _pool(cfg) as pool:
            receipt = dissolve_mod.dissolve_account(pool, client, account_id)
    finally:
        client.close()
    print(receipt.to_json())
    return exitcodes.OK


# -- the operator's view -----------------------------------------------------------------


def status(cfg: Config, as_json: bool) -> int:
    """`status [--json]`: 0, or 69 when Redis or the database could not be read."""
    from lumio_ingestd.admin.status import collect, exit_code, render, to_json

    doc = collect(cfg, connect_redis=lambda: connect(cfg.redis))
    sys.stdout.write(to_json(doc) + "\n" if as_json else render(doc))
    sys.stdout.flush()
    return exit_code(doc)


def quarantine(cfg: Config, action: str, account: int | None, kind: str | None,
               ids: list[str], everything: bool) -> int:
    """`quarantine list|show|requeue|drop`; 66 when nothing matched."""
    from lumio_ingestd.admin.quarantine import Quarantines, receipt_json, show_json

    client = connect(cfg.redis)
    try:
        store = Quarantines(client)
        entries = list(store.entries(account=account, kind=kind, ids=ids))
        not_found = sorted(set(ids) - {e.ident for e in entries})
        if action == "list":
            for entry in entries:
                print(entry.line())
            print(f"{len(entries)} quarantined entr{'y' if len(entries) == 1 else 'ies'}",
                  file=sys.stderr)
            return exitcodes.OK
        if not entries:
            print("quarantine: no quarantined entry matches"
                  + (f" (ids not found: {', '.join(not_found)})" if not_found else ""), file=sys.stderr)
            return exitcodes.NOINPUT
        if action == "show":
            for entry in entries:
                print(show_json(entry))
            return exitcodes.OK
        if action == "drop" and not ids and not everything:
            print(f"quarantine drop: {len(entries)} entries match; name them with --id, or add "
                  "--all to drop every entry the filter matches", file=sys.stderr)
            return exitcodes.USAGE
        result = store.requeue(entries) if action == "requeue" else store.drop(entries)
    finally:
        client.close()
    print(receipt_json(action, result, not_found))
    for key, found in sorted(store.wrong_targets.items()):
        log.error("quarantine requeue: %s holds a %s, not a list; its entries stay in the "
                  "quarantine (nothing was moved): rename or remove that key, then requeue again",
                  key, found)
    return exitcodes.DATAERR if store.wrong_targets else exitcodes.OK


def spool_status(cfg: Config, as_json: bool) -> int:
    from lumio_ingestd.admin.status import spool_lines, spool_section

    section = spool_section(cfg, time.time())
    if as_json:
        print(json.dumps(section, sort_keys=True, indent=2))
    else:
        print("\n".join(spool_lines(section)))
    return exitcodes.OK


def spool_replay(cfg: Config) -> int:
    """Replay the local spool into Redis (or the database) without the daemon.

    Opens the spool exactly as the daemon does, so it takes the spool's lock
    and refuses (75) while a daemon holds it. Stops at the first batch that
    neither Redis nor the database takes (69); what is left stays spooled.
    """
    from lumio_ingestd.chat.ingest import ChatIngest, chat_spool_handler
    from lumio_ingestd.events import EventIngest, event_spool_handler
    from lumio_ingestd.metrics import Metrics
    from lumio_ingestd.stores.spool import Spool, SpoolError

    metrics = Metrics()
    spool = Spool(cfg.daemon.state_dir / "spool", cfg.daemon.spool_max_bytes, metrics)
    try:
        spool.open()
    except SpoolError as exc:
        holder = lock_holder(cfg.daemon.state_dir / "spool")
        print(f"spool replay: {exc}" + (f" (pid {holder}); the running daemon replays it itself"
                                        if holder else ""), file=sys.stderr)
        return exitcodes.TEMPFAIL
    client = connect(cfg.redis)
    replayed = {"chat": 0, "event": 0}
    error: str | None = None
    before = spool.pending_bytes()
    try:
        with _pool(cfg) as pool:
            chat = chat_spool_handler(ChatIngest(client, pool, None, metrics, cfg))
            events = event_spool_handler(EventIngest(client, pool, None, metrics, cfg))

            def handle(kind: str, entries: list[bytes]) -> None:
                (chat if kind == "chat" else events)(kind, entries)
                replayed[kind] += len(entries)

            while True:
                try:
                    if spool.replay(handle) == 0:
                        break
                except SpoolError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the targets refused; the rest stays
                    error = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
                    break
    finally:
        after = spool.pending_bytes()
        spool.close()
        client.close()
    print(json.dumps({"spool_replay": {"replayed": replayed, "pending_bytes_before": before,
                                       "pending_bytes_after": after, "error": error}},
                     sort_keys=True))
    return exitcodes.OK if error is None else exitcodes.UNAVAILABLE
