"""The one-shot administrative commands: retention, GDPR erasure and export,
account dissolution. Each opens what it needs, does one job, prints a
receipt, and closes everything again; the exit code says how it went."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from . import exitcodes
from .config import Config
from .db.pool import Pool
from .lifecycle import dissolve as dissolve_mod
from .lifecycle import gdpr, retention
from .redisclient import connect


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
            receipt = gdpr.erase_user(pool, client, platform, user_id)
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
