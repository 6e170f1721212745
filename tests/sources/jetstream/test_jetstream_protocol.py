"""Jetstream frame decoding, the subscribe URL and the rewound cursor (pure functions).

The fixtures are our own, in the shapes of docs/platforms.rst, "Event frames"; the published
frames are checked in test_corpus_jetstream.py.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from lumio_ingestd.devkit.standins.jetstream import account, commit, identity, tid
from lumio_ingestd.sources.jetstream.protocol import (
    BAD_FRAME_REASONS,
    Account,
    BadFrame,
    Commit,
    Heartbeat,
    Identity,
    collection_wanted,
    decode,
    options_update,
    resume_cursor,
    subscribe_url,
)

DID = "did:plc:aaaa1111bbbb2222cccc3333"
T = 1_767_640_000_123_456


def _dec(obj: Any) -> Any:
    return decode(json.dumps(obj).encode())


def test_commit_create_update_delete() -> None:
    rec = {"$type": "app.bsky.feed.post", "text": "going live now!", "langs": ["en"]}
    c = _dec(commit(DID, T, "create", "app.bsky.feed.post", "3lzz2abcd7k2c", rev="3lzz2abcdeg2b",
                    record=rec, cid="bafyreiexample"))
    assert c == Commit(DID, T, "create", "app.bsky.feed.post", "3lzz2abcd7k2c", "3lzz2abcdeg2b",
                       "bafyreiexample", rec)
    assert c.uri == f"at://{DID}/app.bsky.feed.post/3lzz2abcd7k2c"
    u = _dec(commit(DID, T + 1, "update", "app.bsky.actor.profile", "self", record={"a": 1}))
    assert (u.operation, u.rkey, u.record) == ("update", "self", {"a": 1})
    d = _dec(commit(DID, T + 2, "delete", "app.bsky.feed.like", "3lzz1xyzw2s2d"))
    assert (d.operation, d.record, d.cid) == ("delete", None, None)
    # a delete that carries a record anyway: the record is ignored, not stored
    odd = commit(DID, T + 3, "delete", "app.bsky.feed.like", "k")
    odd["commit"]["record"] = {"x": 1}
    assert _dec(odd).record is None


def test_identity_account_and_heartbeat() -> None:
    handle = "streamer.example.com"
    assert _dec(identity(DID, T, handle)) == Identity(DID, T, handle, T // 1000)
    assert _dec(identity(DID, T)).handle is None  # real captures carry no handle
    a = _dec(account(DID, T, active=False, status="deactivated"))
    assert a == Account(DID, T, False, "deactivated", T // 1000)
    assert decode('{"kind":"heartbeat","payload":""}') == Heartbeat()


def test_records_are_sanitized_at_the_edge() -> None:
    raw = ('{"did":"' + DID + '","time_us":' + str(T) + ',"kind":"commit","commit":{"rev":"3lzz2abcdeg2b",'
           '"operation":"create","collection":"app.bsky.feed.post","rkey":"k","cid":"c",'
           '"record":{"text":"a\\u0000b\\ud83dc","k\\u0000":[1.5,"\\udc00"]}}}')
    c = decode(raw)
    assert isinstance(c, Commit)
    assert c.record == {"text": "a\ufffdb\ufffdc", "k\ufffd": [1.5, "\ufffd"]}


@pytest.mark.parametrize(("data", "binary", "reason"), [
    (b"\x28\xb5\x2f\xfd compressed", True, "binary"),
    (b'{"kind":"commit","did":"\xff\xfe"}', False, "not_utf8"),
    (b'{"kind": "commit", "did":', False, "not_json"),
    (b"[1, 2]", False, "not_object"),
    (b"null", False, "not_object"),
    (b"[" * 100_000 + b"]" * 100_000, False, "not_json"),
])
def test_undecodable_messages(data: bytes, binary: bool, reason: str) -> None:
    with pytest.raises(BadFrame) as info:
        decode(data, binary=binary)
    assert info.value.reason == reason


def _broken(**changes: Any) -> dict[str, Any]:
    frame = commit(DID, T, "create", "app.bsky.feed.post", "3lzz2abcd7k2c")
    for path, value in changes.items():
        target = frame["commit"] if path in ("rev", "operation", "collection", "rkey", "record", "cid",
                                             "type") else frame
        if value is _DELETE:
            target.pop(path, None)
        else:
            target[path] = value
    return frame


_DELETE = object()


@pytest.mark.parametrize(("frame", "reason"), [
    ({"did": DID, "time_us": T, "type": "com", "commit": {"type": "c"}}, "unsupported_schema"),
    ({"type": "options_update", "payload": {}}, "unsupported_schema"),
    ({"did": DID, "time_us": T, "kind": "labels"}, "unsupported_kind"),
    ({"did": DID, "time_us": T}, "malformed"),
    (_broken(operation="upsert"), "unsupported_operation"),
    (_broken(operation=_DELETE, type="c"), "unsupported_schema"),
    (_broken(did="not-a-did"), "malformed"),
    (_broken(did=_DELETE), "malformed"),
    (_broken(time_us="1767640000123456"), "malformed"),
    (_broken(time_us=True), "malformed"),
    (_broken(time_us=1_767_640_000_123), "malformed"),  # milliseconds, not microseconds
    (_broken(time_us=-5), "malformed"),
    (_broken(collection="post"), "malformed"),
    (_broken(collection=None), "malformed"),
    (_broken(rkey=""), "malformed"),
    (_broken(rkey="a/b"), "malformed"),
    (_broken(rkey=".."), "malformed"),
    (_broken(rkey="k" * 513), "malformed"),
    (_broken(rev=""), "malformed"),
    (_broken(rev=5), "malformed"),
    (_broken(record="text"), "malformed"),
    (_broken(record=_DELETE), "malformed"),
    (_broken(cid=12), "malformed"),
    (_broken(commit="x"), "malformed"),
    ({"did": DID, "time_us": T, "kind": "account", "account": {"active": "yes"}}, "malformed"),
    ({"did": DID, "time_us": T, "kind": "identity", "identity": {"handle": 5}}, "malformed"),
    ({"did": DID, "time_us": T, "kind": "identity", "identity": {"seq": "1"}}, "malformed"),
])
def test_malformed_and_unsupported_frames_are_refused_with_a_reason(frame: dict[str, Any],
                                                                    reason: str) -> None:
    with pytest.raises(BadFrame) as info:
        _dec(frame)
    assert info.value.reason == reason
    assert info.value.reason in BAD_FRAME_REASONS
    assert info.value.detail


def test_a_refusal_names_the_event_but_never_carries_the_record() -> None:
    frame = _broken(rkey="a/b")
    frame["commit"]["record"] = {"text": "secret-ish post text " * 20}
    with pytest.raises(BadFrame) as info:
        _dec(frame)
    assert (info.value.did, info.value.time_us) == (DID, T)
    assert "secret-ish" not in str(info.value)


def test_resume_cursor_rewinds_in_microseconds_and_clamps_at_zero() -> None:
    assert resume_cursor(None, 5) is None
    assert resume_cursor(T, 5) == T - 5_000_000
    assert resume_cursor(T, 0) == T
    assert resume_cursor(T, 0.25) == T - 250_000
    assert resume_cursor(3_000_000, 5) == 0
    assert resume_cursor(0, 5) == 0


def test_subscribe_url_repeats_the_filters_and_keeps_other_parameters() -> None:
    url = subscribe_url("wss://js.example/subscribe?maxMessageSizeBytes=1000&cursor=1",
                        collections=("app.bsky.feed.post", "app.bsky.graph.*"),
                        dids=("did:plc:a", "did:web:b.example"), cursor=T)
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == ("wss", "js.example", "/subscribe")
    q = parse_qs(parts.query)
    assert q == {"maxMessageSizeBytes": ["1000"],
                 "wantedCollections": ["app.bsky.feed.post", "app.bsky.graph.*"],
                 "wantedDids": ["did:plc:a", "did:web:b.example"], "cursor": [str(T)]}
    live = parse_qs(urlsplit(subscribe_url("ws://h/subscribe", collections=(), dids=("did:plc:a",),
                                           cursor=None)).query)
    assert live == {"wantedDids": ["did:plc:a"]}


def test_collection_filter_matches_exact_names_and_prefixes() -> None:
    wanted = ("app.bsky.feed.post", "app.bsky.graph.*")
    assert collection_wanted("app.bsky.feed.post", wanted)
    assert collection_wanted("app.bsky.graph.follow", wanted)
    assert not collection_wanted("app.bsky.feed.like", wanted)
    assert not collection_wanted("app.bsky.graphx.follow", wanted)
    assert collection_wanted("anything.at.all", ())


def test_tids_sort_by_time() -> None:
    revs = [tid(T + d) for d in (0, 1, 999, 1_000_000, 10**12)]
    assert revs == sorted(revs) and all(len(r) == 13 for r in revs)
    assert tid(1_779_719_009_132_431)[:2] == "3m"  # like the real revs of that time ("3mmoojp7vgo2g")


def test_long_filter_lists_go_in_an_options_update_instead_of_the_url() -> None:
    url = subscribe_url("ws://h/subscribe?x=1", collections=("app.bsky.feed.post",), dids=("did:plc:a",),
                        cursor=7, require_hello=True)
    assert parse_qs(urlsplit(url).query) == {"x": ["1"], "requireHello": ["true"], "cursor": ["7"]}
    hello = json.loads(options_update(("app.bsky.feed.post",), ("did:plc:a", "did:plc:b")))
    assert hello == {"type": "options_update", "payload": {
        "wantedCollections": ["app.bsky.feed.post"], "wantedDids": ["did:plc:a", "did:plc:b"],
        "maxMessageSizeBytes": 0}}
