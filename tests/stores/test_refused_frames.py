"""Refused frames are kept with their raw bytes in a bounded file quarantine
(docs/architecture.rst, "Refused frames").
"""

from __future__ import annotations

import base64
import stat
from pathlib import Path

from lumio_ingestd.devkit.standins.twitch import TwitchStandin
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.stores.refused_frames import FrameQuarantine
from support import dbname_of
from support.harness.servers import PostgresServer, wait_until
from support.twitch import make_rig


def test_refused_frames_are_kept_with_their_raw_bytes_and_the_quarantine_is_bounded(
        tmp_path: Path) -> None:
    metrics = Metrics()
    frames = FrameQuarantine(tmp_path / "quarantine", metrics, max_bytes=4096, max_frame_bytes=100)
    frames.add("twitch", "json", b"\xff not json")
    frames.add("bluesky", "too_large", b"x" * 1000, "a frame of 1000 bytes")
    first, second = frames.entries()
    assert (first["platform"], first["reason"], base64.b64decode(str(first["raw_b64"]))) == \
        ("twitch", "json", b"\xff not json")
    assert (second["size"], second["truncated"], len(base64.b64decode(str(second["raw_b64"])))) == \
        (1000, True, 100)
    for i in range(200):
        frames.add("twitch", "json", f"frame {i}".encode())
    kept = frames.entries()
    total = sum(p.stat().st_size for p in (tmp_path / "quarantine").iterdir())
    assert total <= 2 * 4096 and kept[-1]["raw_b64"] == base64.b64encode(b"frame 199").decode()
    assert stat.S_IMODE((tmp_path / "quarantine").stat().st_mode) == 0o700
    assert metrics.registry.get_sample_value("frames_quarantined_total", {"result": "kept"}) == 202



def test_the_twitch_source_quarantines_a_refused_frame_with_its_bytes(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    with TwitchStandin(min_keepalive=1) as fake:
        rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, fake)
        try:
            src = rig.source()
            quarantine = FrameQuarantine(tmp_path / "q", rig.metrics)
            src.frame_quarantine = quarantine
            src.start()
            s1 = fake.wait_session(1)
            assert fake.wait_for(lambda: len(s1.subscriptions) == 11 and s1.open, 10)
            assert fake.send_raw(s1, b"\xff\xfe not utf-8")
            assert fake.send_raw(s1, "[" * 5000 + "]" * 5000)
            assert wait_until(lambda: len(quarantine.entries()) == 2, 10)
            utf8, deep = quarantine.entries()
            assert (utf8["reason"], base64.b64decode(str(utf8["raw_b64"]))) == ("utf8", b"\xff\xfe not utf-8")
            assert deep["reason"] == "too_deep" and deep["size"] == 10_000
        finally:
            rig.close()
