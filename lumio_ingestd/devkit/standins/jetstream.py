"""A stand-in Jetstream v1 server: a real WebSocket server on loopback.

Used by the tests, the benchmarks and `lumio-ingestd demo` (it needs the
`websockets` package: the `demo` and `test` extras).

It holds a list of events, each with the server's `time_us`, and serves
`/subscribe` the way docs/platforms.rst, "The subscribe URL and the cursor", describes Jetstream:

- `cursor` (unix µs): replay from the first event with time_us >= cursor, then
  stream live; no cursor, or one in the future, = live only (events added
  after the connection). A cursor older than `oldest_retained_us` is clamped
  to the oldest retained event, silently, like the real server.
- `wantedCollections` (exact NSIDs or prefixes like `app.bsky.graph.*`)
  filters commits; identity and account events pass it. `wantedDids` filters
  every event that has a DID. Frames without a DID (junk on purpose) always go out.
- `requireHello=true`: nothing is sent until the client's `options_update`
  message, whose payload then sets the filters.
- Every connection's query is recorded (`connections`), so tests can assert
  the cursor the client asked for.
- `drop_after(time_us)` closes the connection right after that event has
  been handled (sent or filtered), once; `abrupt=True` cuts the TCP stream
  without a close frame.

The `websockets` sync server starts threads per connection; that is fine for
a stand-in peer (the daemon's own client must not). Nothing durable here: the
events live in memory.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection

from lumio_ingestd.devkit.standins.base import StandinServers

_POLL = 0.05


@dataclass(frozen=True)
class StandinEvent:
    """One frame as the server holds it. `payload` bytes with `binary=False` go out
    as a text frame carrying exactly those bytes (valid UTF-8 or not)."""

    time_us: int
    payload: str | bytes
    did: str | None = None
    collection: str | None = None  # set for commits only: what wantedCollections filters
    binary: bool = False

    @classmethod
    def of(cls, frame: dict[str, Any], *, time_us: int | None = None) -> StandinEvent:
        """From a JSON object, sent compact; the server time defaults to its `time_us`."""
        t = time_us if time_us is not None else frame.get("time_us")
        if not isinstance(t, int):
            raise ValueError("no time_us: pass one")
        commit = frame.get("commit")
        collection = commit.get("collection") if frame.get("kind") == "commit" and isinstance(
            commit, dict) else None
        did = frame.get("did") if isinstance(frame.get("did"), str) else None
        return cls(t, json.dumps(frame, separators=(",", ":")), did,
                   collection if isinstance(collection, str) else None)


@dataclass
class ConnectionLog:
    cursor: int | None
    wanted_collections: list[str]
    wanted_dids: list[str]
    query: str
    sent: list[int] = field(default_factory=list)  # time_us of the events sent on it
    hello: dict[str, Any] | None = None  # the options_update payload, with requireHello=true


class JetstreamStandin(StandinServers):
    def __init__(self, events: Iterable[StandinEvent] = (), *, oldest_retained_us: int | None = None,
                 ignore_filters: bool = False) -> None:
        # close_timeout: the websockets default, which this stand-in has always had.
        super().__init__("jetstream", close_timeout_secs=10.0)
        self.events: list[StandinEvent] = list(events)
        self.oldest_retained_us = oldest_retained_us
        self.ignore_filters = ignore_filters  # an instance that sends everything (they differ)
        self.connections: list[ConnectionLog] = []
        self._drops: dict[int, bool] = {}  # time_us -> abrupt

    @property
    def url(self) -> str:
        return self._ws_url("/subscribe")

    # -- control -------------------------------------------------------------------

    def add(self, *events: StandinEvent) -> None:
        """Append events (they go out live to every connection)."""
        with self._cond:
            self.events.extend(events)
            self._cond.notify_all()

    def drop_after(self, time_us: int, *, abrupt: bool = False) -> None:
        """Close the connection that handles the event with this time_us, once."""
        with self._cond:
            self._drops[time_us] = abrupt

    def wait_connections(self, n: int, timeout: float = 10.0) -> bool:
        return self.wait_for(lambda: len(self.connections) >= n, timeout)

    # -- serving ---------------------------------------------------------------------

    def _start_index(self, cursor: int | None) -> int:
        now_us = int(time.time() * 1_000_000)
        if cursor is None or cursor > now_us:
            return len(self.events)
        if self.oldest_retained_us is not None:
            cursor = max(cursor, self.oldest_retained_us)
        for i, ev in enumerate(self.events):
            if ev.time_us >= cursor:
                return i
        return len(self.events)

    def _handle_ws(self, conn: ServerConnection) -> None:
        assert conn.request is not None
        parts = urlsplit(conn.request.path)
        query = parse_qs(parts.query)
        raw_cursor = query.get("cursor", [None])[0]
        log = ConnectionLog(
            cursor=int(raw_cursor) if raw_cursor is not None else None,
            wanted_collections=query.get("wantedCollections", []),
            wanted_dids=query.get("wantedDids", []),
            query=parts.query,
        )
        with self._cond:
            index = self._start_index(log.cursor)
        if query.get("requireHello", [""])[0] == "true":
            # Nothing goes out before the subscriber's options_update sets the filters.
            try:
                hello = json.loads(conn.recv(timeout=10))
            except (TimeoutError, ConnectionClosed, ValueError):
                return
            if not (isinstance(hello, dict) and hello.get("type") == "options_update"
                    and isinstance(hello.get("payload"), dict)):
                conn.close(1008, "expected options_update")
                return
            log.hello = hello["payload"]
            log.wanted_collections = list(log.hello.get("wantedCollections") or [])
            log.wanted_dids = list(log.hello.get("wantedDids") or [])
        with self._cond:
            self.connections.append(log)
            self._cond.notify_all()
        while True:
            with self._cond:
                while index >= len(self.events) and not self._stop.is_set():
                    self._cond.wait(_POLL)
                    if index >= len(self.events):
                        break
                if self._stop.is_set():
                    return
                ev = self.events[index] if index < len(self.events) else None
                drop = self._drops.pop(ev.time_us, None) if ev is not None else None
            if ev is None:
                if not self._client_alive(conn):
                    return
                continue
            index += 1
            try:
                if self.ignore_filters or self._wanted(ev, log):
                    if ev.binary:
                        conn.send(ev.payload if isinstance(ev.payload, bytes) else ev.payload.encode(),
                                  text=False)
                    elif isinstance(ev.payload, bytes):
                        conn.send(ev.payload, text=True)
                    else:
                        conn.send(ev.payload)
                    log.sent.append(ev.time_us)
                if drop is not None:
                    if drop:
                        conn.socket.shutdown(socket.SHUT_RDWR)
                    else:
                        conn.close(1001, "dropped on request")
                    return
            except (ConnectionClosed, OSError):
                return

    @staticmethod
    def _client_alive(conn: ServerConnection) -> bool:
        try:
            conn.recv(timeout=0)  # the client sends nothing; this only notices a close
        except TimeoutError:
            return True
        except ConnectionClosed:
            return False
        return True

    @staticmethod
    def _wanted(ev: StandinEvent, log: ConnectionLog) -> bool:
        if ev.did is not None and log.wanted_dids and ev.did not in log.wanted_dids:
            return False
        if ev.collection is not None and log.wanted_collections:
            return any(ev.collection.startswith(w[:-1]) if w.endswith(".*") else ev.collection == w
                       for w in log.wanted_collections)
        return True


# -- frame builders (the shapes of docs/platforms.rst, "Event frames") ---------------------

_S32 = "234567abcdefghijklmnopqrstuvwxyz"


def tid(time_us: int, clock_id: int = 0) -> str:
    """A repo revision (TID): 13 base32-sortable characters of (µs << 10 | clock id)."""
    n = (time_us << 10) | (clock_id & 0x3FF)
    out = []
    for _ in range(13):
        out.append(_S32[n & 31])
        n >>= 5
    return "".join(reversed(out))


def commit(did: str, time_us: int, op: str, collection: str, rkey: str, *,
           rev: str | None = None, record: dict[str, Any] | None = None,
           cid: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"rev": rev or tid(time_us), "operation": op, "collection": collection,
                            "rkey": rkey}
    if op != "delete":
        body["record"] = record if record is not None else {"$type": collection, "n": time_us}
        digest = hashlib.sha256(f"{did}/{collection}/{rkey}@{time_us}".encode()).hexdigest()
        body["cid"] = cid or f"bafyrei{digest[:52]}"
    return {"did": did, "time_us": time_us, "kind": "commit", "commit": body}


def identity(did: str, time_us: int, handle: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"did": did, "seq": time_us // 1000, "time": "2026-01-05T19:06:50.000Z"}
    if handle:
        body["handle"] = handle
    return {"did": did, "time_us": time_us, "kind": "identity", "identity": body}


def account(did: str, time_us: int, active: bool = True, status: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"active": active, "did": did, "seq": time_us // 1000,
                            "time": "2026-01-05T19:06:51.000Z"}
    if status:
        body["status"] = status
    return {"did": did, "time_us": time_us, "kind": "account", "account": body}
