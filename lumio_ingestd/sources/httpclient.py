"""One bounded HTTP request with the standard library (Helix, OAuth, 7TV, Kick, status polls).

`http://` is accepted as well as `https://`, so the daemon can be pointed at
a local stand-in. Every request has two bounds:

- a whole-request deadline: `timeout` covers the connect, the TLS handshake,
  sending, the status line, the headers and the body together. Each read
  waits at most for what is left of it, so a server that trickles its answer
  a byte at a time cannot hold the caller past the deadline
  (`DeadlineExceeded`);
- a cap on the response size, `max_bytes` (the caller's, per endpoint; 1 MiB
  unless it says otherwise): a `Content-Length` above it is refused before
  the body is read, and a body read in pieces stops one piece past it
  (`ResponseTooLarge`).

Connection problems raise `HttpUnavailable` (both of the above are kinds of
it). Nothing durable here.
"""

from __future__ import annotations

import functools
import http.client
import io
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from lumio_ingestd import boundedjson

MAX_RESPONSE_BYTES = 1024 * 1024
#: The body is read in pieces of this size (the cap is checked after each).
_READ_PIECE = 64 * 1024


class HttpUnavailable(Exception):
    """The server could not be reached, or answered with something that is not HTTP."""


class DeadlineExceeded(HttpUnavailable):
    """The whole request (connect, send, headers, body) did not finish within its timeout."""


class ResponseTooLarge(HttpUnavailable):
    """The response is larger than the cap the caller gave for this endpoint."""


@dataclass(frozen=True, slots=True)
class HttpResult:
    status: int
    body: bytes
    #: Response headers, names in lower case (rate-limit headers, Retry-After).
    headers: Mapping[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        """The body as JSON (None when it is not). Its size was bounded by the request's cap,
        which may be above the decoder's default; the depth bound still applies."""
        try:
            return boundedjson.loads(self.body, max_bytes=max(len(self.body), boundedjson.DEFAULT_MAX_BYTES))
        except ValueError:
            return None

    def message(self) -> str:
        """The error text of a Twitch error body ({"message": ...}), else the start of the body."""
        obj = self.json()
        if isinstance(obj, dict) and isinstance(obj.get("message"), str):
            return str(obj["message"])[:200]
        return self.body[:200].decode("utf-8", "replace")


class Cancel:
    """Lets another thread cut the request in flight (a stopping source's `wake()`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self.cancelled = False

    def attach(self, conn: http.client.HTTPConnection | None) -> None:
        with self._lock:
            self._conn = conn
            if conn is not None and self.cancelled:
                raise HttpUnavailable("cancelled")

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            sock = self._conn.sock if self._conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # not connected (yet, or any more)

    def reset(self) -> None:
        with self._lock:
            self.cancelled = False


def join(base: str, path: str) -> str:
    return base.rstrip("/") + "/" + path.lstrip("/")


class _DeadlineReader(io.RawIOBase):
    """A socket's reads, each waiting at most for what is left before the deadline."""

    def __init__(self, sock: socket.socket, deadline: float, holder: Any) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline
        # The reader the base made holds the socket open (the connection's close() only
        # closes it once no reader is left); it is never read, and closed with this one.
        self._holder = holder

    def close(self) -> None:
        if not self.closed:
            self._holder.close()
        super().close()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline passed")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _Response(http.client.HTTPResponse):
    """An HTTPResponse whose status line, headers and body are read under one deadline."""

    def __init__(self, sock: socket.socket, debuglevel: int = 0, method: str | None = None,
                 url: str | None = None, *, deadline: float) -> None:
        super().__init__(sock, debuglevel, method, url)
        self.fp = io.BufferedReader(_DeadlineReader(sock, deadline, self.fp))


class _HttpsConnection(http.client.HTTPSConnection):
    """HTTPS whose TLS handshake waits only for what is left of the request's deadline."""

    def __init__(self, host: str, port: int | None, *, timeout: float, deadline: float) -> None:
        tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=tls)
        self._deadline = deadline
        self._tls = tls

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)  # TCP only (no proxy tunnel is ever set up)
        self.sock.settimeout(max(0.001, self._deadline - time.monotonic()))
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self.host)


def request(method: str, url: str, *, headers: dict[str, str], body: bytes | None = None,
            timeout: float, cancel: Cancel | None = None,
            max_bytes: int = MAX_RESPONSE_BYTES) -> HttpResult:
    """One request, done within `timeout` seconds in all, its answer at most `max_bytes`."""
    deadline = time.monotonic() + timeout
    parts = urlsplit(url)
    host = parts.hostname or ""
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = _HttpsConnection(host, parts.port, timeout=timeout, deadline=deadline)
    elif parts.scheme == "http":
        conn = http.client.HTTPConnection(host, parts.port, timeout=timeout)
    else:
        raise HttpUnavailable(f"unsupported URL scheme {parts.scheme!r}")
    conn.response_class = functools.partial(_Response, deadline=deadline)  # type: ignore[assignment]
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    where = f"{method} {host}{parts.path}"
    try:
        if cancel is not None:
            cancel.attach(conn)
        conn.connect()
        if cancel is not None:
            cancel.attach(conn)  # now with its socket, which cancel() shuts down
        left = deadline - time.monotonic()
        if left <= 0 or conn.sock is None:
            raise TimeoutError("the request's deadline passed while connecting")
        conn.sock.settimeout(left)
        conn.request(method, target, body=body, headers=headers)
        response = conn.getresponse()
        announced = response.getheader("Content-Length")
        if announced is not None and announced.strip().isdigit() and int(announced) > max_bytes:
            raise ResponseTooLarge(f"{where}: the response announces {int(announced)} bytes, more "
                                   f"than the {max_bytes} this call takes")
        pieces: list[bytes] = []
        size = 0
        while True:
            piece = response.read(_READ_PIECE)
            if not piece:
                break
            size += len(piece)
            if size > max_bytes:
                raise ResponseTooLarge(f"{where}: response larger than the {max_bytes} bytes this "
                                       f"call takes")
            pieces.append(piece)
        return HttpResult(response.status, b"".join(pieces),
                          {k.lower(): v for k, v in response.getheaders()})
    except (OSError, http.client.HTTPException) as exc:
        if time.monotonic() >= deadline:
            raise DeadlineExceeded(f"{where}: no complete answer within {timeout:g}s") from None
        raise HttpUnavailable(f"{where}: {type(exc).__name__}: {exc}") from None
    finally:
        if cancel is not None:
            cancel.attach(None)
        conn.close()
