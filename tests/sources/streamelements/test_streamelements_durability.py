"""StreamElements tips through a database and Redis outage, and the donor PII rule, on real servers.

A tip that arrives while PostgreSQL is down is parked in Redis; while Redis
is down too it goes to the spool; after recovery each is stored once with the
id and created_at it was given at ingest. Donor email, geolocation and IP are
in none of the parked entries, spool records or rows, unless
`keep_donor_pii = true`, which keeps them.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from lumio_ingestd.devkit.standins.streamelements import AstroStandin, activity_doc, tip_activity_doc, tip_doc
from lumio_ingestd.events.persist import event_spool_handler
from lumio_ingestd.model import PlatformEvent
from lumio_ingestd.sources.streamelements.protocol import ACTIVITIES, TIPS
from lumio_ingestd.stores import rediskeys
from support import dbname_of
from support.harness.servers import PostgresServer, RedisServer, wait_until
from support.streamelements import ACCOUNT, ROOM, TOKEN, SeRig, make_rig

PII = (b"donor@example.com", b"203.0.113.7", b'"geo"', b'"email"', b"ipAddress")


def _pii_free(blob: bytes) -> bool:
    return not any(marker in blob for marker in PII)


def _parked(rig: SeRig) -> list[bytes]:
    return [e if isinstance(e, bytes) else e.encode()
            for e in rig.redis.lrange(rediskeys.events_deadletter(ACCOUNT), 0, -1)]


def _spool_bytes(rig: SeRig) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(rig.spool._dir.glob("*.seg")))


def _publish_tip(astro: AstroStandin, tip_id: str) -> None:
    astro.publish(TIPS, ROOM, tip_doc(tip_id, ROOM, ip="203.0.113.7"))
    astro.publish(ACTIVITIES, ROOM, tip_activity_doc(f"act-{tip_id}", tip_id, ROOM))


def test_a_database_outage_during_tips_parks_spools_and_replays_each_once_without_pii(
        tmp_path: Path, private_pg: PostgresServer, private_redis: RedisServer) -> None:
    with AstroStandin(token=TOKEN) as astro:
        rig = make_rig(tmp_path, private_pg.url(), private_redis.url, astro)
        try:
            rig.source().start()
            assert astro.wait_for(lambda: astro.subscribed(TIPS, ACTIVITIES), 10)
            _publish_tip(astro, "tip-before")
            assert wait_until(lambda: rig.stored()[("tip", "tip-before")] == 1, 10)

            private_pg.stop()
            parked_ids = [f"tip-parked-{i}" for i in range(3)]
            for tip_id in parked_ids:
                _publish_tip(astro, tip_id)  # on both topics: one parked entry each
            astro.publish(ACTIVITIES, ROOM, activity_doc("act-follow", ROOM, "follow"))
            assert wait_until(lambda: len(_parked(rig)) == 4, 20), _parked(rig)
            parked = _parked(rig)
            assert all(_pii_free(e) for e in parked), parked
            in_redis = {e.external_id: e for e in map(PlatformEvent.from_entry, parked)}
            assert set(in_redis) == {*parked_ids, "act-follow"}
            assert all(in_redis[i].type == "tip" for i in parked_ids)

            private_pg.start()
            report = rig.worker().run_pass()
            assert report.stored == 4 and report.stopped is None, report
            rows = {r[0]: r for r in rig.rows("SELECT external_id, id::text, created_at FROM events")}
            for ext, ev in in_redis.items():  # stored with the id and time given at ingest
                assert rows[ext][1] == str(ev.id) and rows[ext][2] == ev.created_at

            # Both down (this Redis keeps nothing across a restart: the parked entries above
            # were replayed first): the spool takes the tip.
            private_pg.stop()
            private_redis.stop()
            _publish_tip(astro, "tip-spooled")
            assert wait_until(lambda: rig.value("spool_records_total", kind="event", op="written") >= 1, 20)
            spooled = _spool_bytes(rig)
            assert b"tip-spooled" in spooled and _pii_free(spooled)
            assert rig.value("events_persist_failures_total", outcome="lost") == 0

            private_redis.start()
            private_pg.start()
            assert wait_until(lambda: _up(rig), 10)
            assert rig.spool.replay(event_spool_handler(rig.events)) == 1
            report = rig.worker().run_pass()
            assert report.stored == 1 and report.stopped is None, report

            payloads = [r[0] for r in rig.rows("SELECT payload::text FROM events")]
            assert all(_pii_free(p.encode()) for p in payloads)
            assert dict(rig.stored()) == {("tip", "tip-before"): 1, **{("tip", i): 1 for i in parked_ids},
                                          ("activity.follow", "act-follow"): 1, ("tip", "tip-spooled"): 1}
            assert rig.value("streamelements_pii_removed_total") > 0
        finally:
            rig.close()


def _up(rig: SeRig) -> bool:
    try:
        return bool(rig.redis.ping())
    except Exception:  # noqa: BLE001 - still starting
        return False


def test_keep_donor_pii_true_stores_the_donor_fields(tmp_path: Path, pg_server: PostgresServer,
                                                     pg_dsn: str, redis_url: str) -> None:
    with AstroStandin(token=TOKEN) as astro:
        rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, astro, keep_pii=True)
        try:
            rig.source().start()
            assert astro.wait_for(lambda: astro.subscribed(TIPS, ACTIVITIES), 10)
            tip_id = f"tip-{uuid.uuid4().hex[:8]}"
            astro.publish(TIPS, ROOM, tip_doc(tip_id, ROOM, ip="203.0.113.7"))
            assert wait_until(lambda: rig.stored()[("tip", tip_id)] == 1, 10)
            (payload,) = rig.payloads()
            user = payload["document"]["donation"]["user"]
            assert (user["email"], user["geo"], user["ipAddress"]) == ("donor@example.com", "DE",
                                                                       "203.0.113.7")
            assert rig.value("streamelements_pii_removed_total") == 0
        finally:
            rig.close()
