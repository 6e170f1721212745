"""A plain HTTP client for the tests (http.client, one request per connection), and the HTTP rig."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.web.server import HttpServer, Routes


@dataclass
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def call(port: int, method: str, path: str, body: bytes | None = None,
         headers: Mapping[str, str] | None = None, timeout: float = 10.0) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


@contextmanager
def serving(routes: Routes, metrics: Metrics | None = None) -> Iterator[int]:
    """The daemon's HTTP server with `routes` on a free loopback port; yields the port."""
    server = HttpServer("127.0.0.1", 0, routes, metrics or Metrics(), read_timeout_secs=5)
    _, port = server.bind()
    server.start()
    try:
        yield port
    finally:
        server.request_stop()
        server.join(5)
        server.close_streams()
        server.close()
