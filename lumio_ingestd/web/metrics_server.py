"""The Prometheus listener on `[metrics] listen`, serving the daemon's own registry.

prometheus_client's WSGI app on the standard library's threading WSGI server,
as its `start_http_server` does, with three differences: the address is always
explicit (prometheus_client would bind 0.0.0.0), the accept loop polls every
50 ms so stopping it does not cost half a second of the drain budget, and
request lines are logged at debug level instead of printed.

The server thread and its request threads are daemon threads. That is the one
place the daemon allows them: a scrape holds no state and writes nothing, so
being cut off at exit loses nothing. Nothing durable lives here.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

log = logging.getLogger("lumio_ingestd.metrics_server")

_POLL_SECS = 0.05


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics: %s %s", self.address_string(), format % args)


class _Server4(ThreadingWSGIServer):
    address_family = socket.AF_INET


class _Server6(ThreadingWSGIServer):
    address_family = socket.AF_INET6


class MetricsServer:
    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        self._requested = (host, port)
        self._registry = registry
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> tuple[str, int]:
        """Bind and serve; returns the bound address (port 0 = a free port). Raises OSError."""
        host, port = self._requested
        server_class = _Server6 if ":" in host else _Server4
        self._server = make_server(host, port, make_wsgi_app(self._registry), server_class,
                                   handler_class=_QuietHandler)
        # Daemon by design (see the module docstring): it holds no state.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(_POLL_SECS,),
                                        name="metrics", daemon=True)
        self._thread.start()
        return self.address

    @property
    def address(self) -> tuple[str, int]:
        if self._server is None:
            raise RuntimeError("metrics server is not started")
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop serving and release the port (shutdown alone keeps it bound)."""
        if self._server is None:
            return
        server, self._server = self._server, None
        if self._thread is not None and self._thread.is_alive():
            server.shutdown()  # returns once serve_forever noticed (within _POLL_SECS)
            self._thread.join(timeout)
        server.server_close()
