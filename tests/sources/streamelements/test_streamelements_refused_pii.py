"""StreamElements: a refused tip's donor PII never reaches the refused-frame file, and
`gdpr-erase` covers what that file may still hold.

Against the stand-in Astro gateway, with the daemon's own refused-frame file (as the
composition root places it under the state directory), real Redis and PostgreSQL:

1. Three tips refused (a bad `createdAt`, another room's, one without `_id`) are counted, said
   in the log and kept without the donor's email, geolocation or IP address; the good tip
   after them is stored once, also without them. With `keep_donor_pii = true` they are kept
   as sent.
2. Frames that are not JSON: one naming a PII field is withheld, an email address elsewhere
   is masked; JSON inside a string (Pusher's `data`, a socket.io packet) is stripped too.
3. `lumio-ingestd gdpr-erase` drops every refused frame of the platform naming the user and
   takes PII out of the entries an older version left (written here as it wrote them).
"""

from __future__ import annotations

import base64
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import support
from lumio_ingestd.devkit.standins.streamelements import AstroStandin, tip_doc
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.pii import scrub_frame
from lumio_ingestd.sources.streamelements.protocol import TIPS
from lumio_ingestd.stores import refused_frames
from lumio_ingestd.stores.refused_frames import FrameQuarantine
from support.harness.servers import wait_until
from support.streamelements import ROOM, TOKEN, SeRig, make_rig

EMAIL = "donor@example.com"
IP = "203.0.113.77"


@pytest.fixture
def astro() -> Iterator[AstroStandin]:
    with AstroStandin(token=TOKEN) as a:
        yield a


def frame(data: dict[str, object], room: str = ROOM) -> str:
    return json.dumps({"id": "f-" + str(data.get("_id", "none")), "ts": "2026-01-01T00:00:00Z",
                       "type": "message", "topic": TIPS, "room": room, "data": data})


def refused_tips() -> list[str]:
    no_id = tip_doc("unused", ROOM, ip=IP)
    del no_id["_id"]
    return [frame(tip_doc("tipBadTime", ROOM, ip=IP, created_at="not a time")),
            frame(tip_doc("tipOtherRoom", "someone-else", ip=IP), room="someone-else"),
            frame(no_id)]


def kept_bytes(q: FrameQuarantine) -> list[bytes]:
    return [base64.b64decode(str(e["raw_b64"])) for e in q.entries()]


def run(rig: SeRig, astro: AstroStandin, q: FrameQuarantine) -> None:
    src = rig.source()
    src.frame_quarantine = q
    src.start()
    assert wait_until(lambda: all(t.state == "active" for t in list(src.topics.values())), 10)
    for text in refused_tips():
        astro.send_raw(text)
    astro.publish(TIPS, ROOM, tip_doc("tipGood", ROOM, ip=IP))
    assert wait_until(lambda: rig.stored() == {("tip", "tipGood"): 1}, 10), rig.stored()
    assert wait_until(lambda: len(q.entries()) == 3, 5), q.entries()


def test_refused_tips_are_kept_without_donor_pii(tmp_path: Path, pg_url: str, redis_url: str,
                                                astro: AstroStandin,
                                                caplog: pytest.LogCaptureFixture) -> None:
    rig = make_rig(tmp_path, pg_url, redis_url, astro)
    q = refused_frames.for_config(rig.cfg, rig.metrics)
    assert q.directory == rig.cfg.daemon.state_dir / "quarantine"
    try:
        with caplog.at_level(logging.WARNING):
            run(rig, astro, q)
    finally:
        rig.close()
    reasons = sorted(str(e["reason"]) for e in q.entries())
    assert reasons == ["room", "shape", "time"]
    for reason in reasons:
        assert rig.value("source_bad_frames_total", platform="streamelements", reason=reason) == 1
        assert any(f"({reason})" in r.getMessage() for r in caplog.records), reason
    text = q.path.read_bytes() + b"".join(kept_bytes(q))
    for secret in (EMAIL.encode(), IP.encode(), b'"geo"', b'"email"', b"ipAddress"):
        assert secret not in text, secret
    for entry, raw in zip(q.entries(), kept_bytes(q), strict=True):
        doc = json.loads(raw)
        user = doc["data"]["donation"]["user"]
        assert user == {"username": "kind_donor", "channel": doc["data"]["channel"]}
        assert entry["pii_removed"] == 3 and entry["truncated"] is False
    assert rig.value("streamelements_pii_removed_total") >= 9
    stored = json.dumps(rig.payloads())
    assert EMAIL not in stored and IP not in stored


def test_keep_donor_pii_keeps_refused_tips_as_sent(tmp_path: Path, pg_url: str, redis_url: str,
                                                   astro: AstroStandin) -> None:
    rig = make_rig(tmp_path, pg_url, redis_url, astro, keep_pii=True)
    q = refused_frames.for_config(rig.cfg, rig.metrics)
    try:
        run(rig, astro, q)
    finally:
        rig.close()
    assert sorted(kept_bytes(q)) == sorted(t.encode() for t in refused_tips())


def test_frames_that_are_not_plain_json_are_scrubbed_too(tmp_path: Path) -> None:
    broken = b'{"type":"message","topic":"channel.tips", "data": {"email": "' + EMAIL.encode() + b'", oops'
    assert scrub_frame(broken) == (None, 1)
    masked, n = scrub_frame(b"not json at all, write to " + EMAIL.encode() + b" please")
    assert n == 1 and masked is not None and EMAIL.encode() not in masked and b"please" in masked
    pusher = json.dumps({"event": "App\\Events\\X", "channel": "c",
                         "data": json.dumps({"user": {"email": EMAIL, "name": "n"}})}).encode()
    clean, n = scrub_frame(pusher)
    assert n == 1 and clean is not None and EMAIL.encode() not in clean
    assert json.loads(json.loads(clean)["data"]) == {"user": {"name": "n"}}
    socketio = b'42["event",{"data":{"geo":"DE","ipAddress":"' + IP.encode() + b'","amount":5}}]'
    clean, n = scrub_frame(socketio)
    assert n == 2 and clean == b'42["event",{"data":{"amount":5}}]'
    plain = b'{"a": 1}'
    assert scrub_frame(plain) == (plain, 0)
    # A frame larger than what is kept is scrubbed whole before it is cut.
    q = FrameQuarantine(tmp_path / "quarantine", Metrics(), max_frame_bytes=100)
    big = json.dumps({"filler": "x" * 500, "email": EMAIL}).encode()
    q.add("streamelements", "too_large", big, "test")
    entry = q.entries()[-1]
    assert entry["size"] == len(big) and entry["truncated"] is True and entry["pii_removed"] == 1
    assert EMAIL.encode() not in base64.b64decode(str(entry["raw_b64"]))


def test_gdpr_erase_covers_the_refused_frame_file(tmp_path: Path, pg_url: str, redis_url: str) -> None:
    rig = make_rig(tmp_path, pg_url, redis_url, None)
    rig.close()
    q = refused_frames.for_config(rig.cfg, Metrics())
    target = "4242001"
    q.add("twitch", "shape", json.dumps({"event": {"user_id": target, "text": "theirs"}}), "x")
    q.add("twitch", "shape", json.dumps({"event": {"user_id": "99", "text": "someone else"}}), "x")
    q.add("kick", "shape", json.dumps({"sender": {"id": target}}), "x")  # another platform's user
    # What an older version kept: a refused tip as sent, PII included.
    old = {"at": "2026-01-01T00:00:00Z", "platform": "streamelements", "reason": "time", "detail": "",
           "size": 10, "truncated": False,
           "raw_b64": base64.b64encode(frame(tip_doc("tipOld", ROOM, ip=IP)).encode()).decode()}
    with q.path.open("ab") as f:
        f.write(json.dumps(old).encode() + b"\n")
    result = subprocess.run([sys.executable, "-m", "lumio_ingestd", "-c", str(rig.cfg.path), "gdpr-erase",
                             "--platform", "twitch", "--user-id", target],
                            capture_output=True, text=True, timeout=60, cwd=support.ROOT)
    assert result.returncode == 0, result.stderr
    receipt = json.loads(result.stdout)["erasure"]
    assert receipt["refused_frames"] == 1 and receipt["refused_frames_pii"] == 3
    left = [(e["platform"], base64.b64decode(str(e["raw_b64"]))) for e in q.entries()]
    assert [p for p, _ in left] == ["twitch", "kick", "streamelements"]
    assert target.encode() not in left[0][1] and target.encode() in left[1][1]
    assert EMAIL.encode() not in q.path.read_bytes() and EMAIL.encode() not in left[2][1]
    assert json.loads(left[2][1])["data"]["_id"] == "tipOld"
