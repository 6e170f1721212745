"""The 7TV set-state store against a real PostgreSQL: what a state keeps besides its emotes
(the removals, oldest first, and each emote's last dispatch time) comes back as it was saved,
through jsonb (which keeps no key order); a row of the earlier shape reads as before."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.sources.seventv.protocol import MAX_REMOVED, Entry, SetState
from lumio_ingestd.stores.seventv import META, SetStateStore
from support import make_config
from support.harness.servers import PostgresServer

SET = "01HSET00000000000000000001"


@pytest.fixture
def pool(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str) -> Iterator[Pool]:
    dbname = dict(kv.split("=", 1) for kv in pg_dsn.split())["dbname"]
    cfg = make_config(tmp_path, pg_url=pg_server.url(dbname))
    migrate(cfg.timescale)
    p = Pool(cfg.timescale)
    yield p
    p.close()


def test_removals_and_dispatch_times_come_back_as_saved(pool: Pool) -> None:
    store = SetStateStore(pool)
    # Removal order is not key order: "Z" went first.
    removed = {"Z9": 30, "A1": None, "M5": 10}
    state = SetState(SET, {"E1": Entry("Clap", 100, "U1", 2, 250), "E2": Entry("KEKW", None, None)}, 1,
                     "U7", removed)
    assert store.save(7, state, None)
    back = store.load(7)
    assert back == state
    assert back is not None and list(back.removed) == ["Z9", "A1", "M5"]
    # Bounded on the way in too: only the newest MAX_REMOVED of a longer list are read.
    many = {f"R{i}": i for i in range(MAX_REMOVED + 5)}
    assert store.save(7, SetState(SET, {}, 2, "U7", many), 1)
    again = store.load(7)
    assert again is not None and len(again.removed) == MAX_REMOVED and next(iter(again.removed)) == "R5"


def test_a_row_of_the_earlier_shape_reads_as_before_and_emotes_alone_skip_the_rest(pool: Pool) -> None:
    store = SetStateStore(pool)
    with pool.transaction() as cur:
        cur.execute("INSERT INTO seventv_emote_sets (account_id, emote_set_id, emotes, version) "
                    "VALUES (8, %s, %s::jsonb, 3)",
                    (SET, json.dumps({"E1": ["Clap", 100, "U1"], "E2": ["KEKW", 200, None, 1]})))
    assert store.load(8) == SetState(SET, {"E1": Entry("Clap", 100, "U1"), "E2": Entry("KEKW", 200, None, 1)},
                                     3)
    assert store.save(8, SetState(SET, {"E1": Entry("Clap", 100, "U1", 0, 150)}, 4, None, {"E2": 200}), 3)
    with pool.transaction() as cur:
        cur.execute("SELECT emotes FROM seventv_emote_sets WHERE account_id = 8")
        row = cur.fetchone()
    assert row is not None
    emotes = row[0]
    # A reader of the emotes alone (a value that is a list) sees exactly the emotes.
    assert {k: v for k, v in emotes.items() if isinstance(v, list)} == {"E1": ["Clap", 100, "U1"]}
    assert emotes[META] == {"removed": [["E2", 200]], "seen": {"E1": 150}}
