"""Conformance: every published Jetstream frame parses, or is refused as unsupported.

The frames are read at test time from the recorded corpus beside the repository
(`../shared/corpus/jetstream.jsonl`); they are not copied in. Without it, the
project's own frames of every kind (`support.corpus`) take their place.
Each line's `kind` label says what the frame is; the decoder must agree, and
the real source, fed every frame through the stand-in server, must store the
commits, refuse the rest with a counted reason, and keep running.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.devkit.standins.jetstream import JetstreamStandin, StandinEvent
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.jetstream.protocol import Account, BadFrame, Commit, Heartbeat, Identity, decode
from lumio_ingestd.sources.jetstream.source import JetstreamSource
from lumio_ingestd.stores.jetstream import JetstreamStore
from support import make_config
from support.corpus import CORPUS
from support.harness.servers import wait_until


def _lines() -> list[dict[str, Any]]:
    return CORPUS.lines("jetstream.jsonl")


def _expect(line: dict[str, Any]) -> str:
    """What the corpus label says the frame is: commit, identity, account, heartbeat or refused."""
    kind = line["kind"]
    if kind.startswith("OLD SCHEMA") or kind.startswith("client "):
        return "refused"
    for known in ("commit", "identity", "account", "heartbeat"):
        if kind.startswith(known):
            return known
    raise AssertionError(f"a corpus label this test does not know: {kind!r}: extend the test")


def _check(decoded: Any, line: dict[str, Any]) -> None:
    frame, expect = line["frame"], _expect(line)
    if expect == "heartbeat":
        assert isinstance(decoded, Heartbeat)
        return
    assert decoded.did == frame["did"] and decoded.time_us == frame["time_us"]
    if expect == "commit":
        assert isinstance(decoded, Commit)
        body = frame["commit"]
        assert line["kind"].startswith(f"commit/{decoded.operation} {decoded.collection}")
        assert (decoded.rkey, decoded.rev) == (body["rkey"], body["rev"])
        assert decoded.record == body.get("record") and decoded.cid == body.get("cid")
    elif expect == "identity":
        assert isinstance(decoded, Identity)
        assert decoded.handle == frame["identity"].get("handle")
    else:
        assert isinstance(decoded, Account)
        assert decoded.active == frame["account"]["active"]


def test_every_corpus_frame_parses_or_is_refused_as_unsupported() -> None:
    lines = _lines()
    assert len(lines) >= (150 if CORPUS.recorded else 10)
    outcomes: dict[str, int] = {}
    for line in lines:
        texts = [json.dumps(line["frame"])]
        if line.get("direction", "server->client") == "server->client":
            texts.append(line["raw"])  # the source text exactly, pretty-printed where it was
        for text in texts:
            try:
                decoded = decode(text.encode())
            except BadFrame as bad:
                assert _expect(line) == "refused", f"{line['source']}: refused ({bad})"
                assert bad.reason == "unsupported_schema", line["source"]
                outcomes["refused"] = outcomes.get("refused", 0) + 1
                continue
            _check(decoded, line)
            outcomes[_expect(line)] = outcomes.get(_expect(line), 0) + 1
    assert set(outcomes) == {"commit", "identity", "account", "heartbeat", "refused"}




@pytest.fixture
def corpus_server() -> Iterator[tuple[JetstreamStandin, list[dict[str, Any]]]]:
    lines = _lines()
    # The server's own clock orders the replay; the frames keep their times.
    base = 1_700_000_000_000_000
    events = [StandinEvent(base + i, line["raw"]) for i, line in enumerate(lines)]
    with JetstreamStandin(events) as server:
        yield server, lines


def test_every_corpus_frame_through_the_real_source(
        tmp_path: Path, pg_url: str, corpus_server: tuple[JetstreamStandin, list[dict[str, Any]]]) -> None:
    server, lines = corpus_server
    dids = sorted({line["frame"]["did"] for line in lines if "did" in line["frame"]})
    cfg = make_config(tmp_path, pg_url=pg_url, sections={
        "jetstream": {"url": server.url},  # every collection
        **{f"account.{i}": {"bluesky_did": did} for i, did in enumerate(dids, start=1)}})
    migrate(cfg.timescale)
    pool = Pool(cfg.timescale)
    metrics = Metrics()
    src = JetstreamSource(cfg.jetstream, cfg.accounts, JetstreamStore(pool), metrics,
                          batch_window_secs=0.05,
                          retention_secs=10 * 365 * 86400.0)
    try:
        with pool.transaction() as cur:
            cur.execute("INSERT INTO jetstream_cursor (name, time_us) VALUES ('default', 1)")
        # What the store must end with: per key the highest rev (a tombstone for a delete).
        expected: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        handled_times: list[int] = []
        refused = 0
        for line in lines:
            kind = _expect(line)
            if kind == "refused":
                refused += 1
                continue
            if kind == "heartbeat":
                continue
            frame = line["frame"]
            handled_times.append(frame["time_us"])
            if kind != "commit":
                continue
            body = frame["commit"]
            key = (frame["did"], body["collection"], body["rkey"])
            row = (body["rev"], body.get("cid"), body.get("record"), frame["time_us"])
            if key not in expected or body["rev"] >= expected[key][0]:
                expected[key] = row
        src.start()

        def cursor() -> int:
            with pool.transaction() as cur:
                cur.execute("SELECT time_us FROM jetstream_cursor")
                return int(cur.fetchone()[0])  # type: ignore[index]

        assert wait_until(lambda: cursor() == max(handled_times), timeout=20)
        with pool.transaction() as cur:
            cur.execute("SELECT did, collection, rkey, rev, cid, record, time_us FROM bsky_records")
            stored = {(r[0], r[1], r[2]): tuple(r[3:]) for r in cur.fetchall()}
        assert stored == {k: (v[0], None, None, v[3]) if v[2] is None else v for k, v in expected.items()}
        bad = metrics.source_bad_frames.labels("bluesky", "unsupported_schema")._value.get()
        assert bad == refused
        assert metrics.source_disconnects.labels("bluesky")._value.get() == 0 and src.alive
        assert metrics.jetstream_events.labels("commit", "create")._value.get() == sum(
            1 for line in lines if line["kind"].startswith("commit/create"))
        if CORPUS.recorded:  # the capture's hundred-odd DIDs do not fit a URL (the own frames' two do)
            assert server.connections[0].hello is not None
    finally:
        src.request_stop()
        src.join(5)
        pool.close()
