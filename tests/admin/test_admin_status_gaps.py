"""`lumio-ingestd status` lists the gaps ledger: every open gap and the last ten closed ones."""

from __future__ import annotations

from pathlib import Path

from test_admin_status import config, run_cli, status_json

from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.model import Gap, GapKey
from lumio_ingestd.stores.gaps import GapTable


def test_status_shows_the_open_gaps_and_the_last_ten_closed(tmp_path: Path, pg_url: str,
                                                            redis_url: str) -> None:
    cfg = config(tmp_path, pg_url, redis_url)
    migrate(cfg.timescale)
    pool = Pool(cfg.timescale)
    table = GapTable(pool)
    base = 1_780_000_000_000
    se = GapKey(5, "streamelements", "astro", "heal")
    kick = GapKey(6, "kick", "pusher")
    try:
        table.insert(Gap(se, base, base + 20_000), "open")
        for i in range(12):
            gap = Gap(kick, base + i * 60_000, base + i * 60_000 + 3_500)
            table.insert(gap, "not_healable")
        healed = Gap(se, base - 600_000, base - 580_000)
        table.insert(healed, "open")
        table.close(healed, "healed", 7)
    finally:
        pool.close()
    code, doc = status_json(cfg)
    gaps = doc["database"]["gaps"]
    assert [(g["account_id"], g["status"], g["seconds"]) for g in gaps["open"]] == [(5, "open", 20.0)]
    assert len(gaps["last"]) == 10
    assert gaps["last"][0]["status"] == "healed" and gaps["last"][0]["healed_rows"] == 7
    assert all(g["status"] == "not_healable" and g["seconds"] == 3.5 for g in gaps["last"][1:])
    human = run_cli(cfg, "status").stdout
    assert "open gaps (1)" in human and "last closed gaps (10)" in human
    assert "account 5 streamelements/astro" in human and "healed, 7 row(s) stored late" in human
