"""One bounded HTTP request with the standard library (Helix and OAuth calls).

`http://` is accepted as well as `https://`, so the daemon can be pointed at
a local stand-in. Every request has a timeout and a cap on the response size;
connection problems raise `HttpUnavailable`. Nothing durable here.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from lumio_ingestd import boundedjson

MAX_RESPONSE_BYTES = 1024 * 1024


class HttpUnavailable(Exception):
    """The server could not be reached, or answered with something that is not HTTP."""


@dataclass(frozen=True, slots=True)
class HttpResult:
    status: int
    body: bytes
    #: Response headers, names in lower case (rate-limit headers, Retry-After).
    headers: Mapping[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        try:
            return boundedjson.loads(self.body)
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


def request(method: str, url: str, *, headers: dict[str, str], body: bytes | None = None,
            timeout: float, cancel: Cancel | None = None) -> HttpResult:
    parts = urlsplit(url)
    host = parts.hostname or ""
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(host, parts.port, timeout=timeout,
                                           context=ssl.create_default_context())
    elif parts.scheme == "http":
        conn = http.client.HTTPConnection(host, parts.port, timeout=timeout)
    else:
        raise HttpUnavailable(f"unsupported URL scheme {parts.scheme!r}")
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    try:
        if cancel is not None:
            cancel.attach(conn)
        conn.request(method, target, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read(MAX_RESPONSE_BYTES + 1)
        if len(data) > MAX_RESPONSE_BYTES:
            raise HttpUnavailable(f"{method} {parts.path}: response larger than {MAX_RESPONSE_BYTES} bytes")
        return HttpResult(response.status, data,
                          {k.lower(): v for k, v in response.getheaders()})
    except (OSError, http.client.HTTPException) as exc:
        raise HttpUnavailable(f"{method} {host}{parts.path}: {type(exc).__name__}: {exc}") from None
    finally:
        if cancel is not None:
            cancel.attach(None)
        conn.close()
