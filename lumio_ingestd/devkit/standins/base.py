"""The lifecycle every stand-in shares: its servers on free loopback ports, their threads, waiting, closing.

`StandinServers` is the base class of the stand-ins (Twitch, Kick, 7TV,
StreamElements, Jetstream). It owns:

- a `websockets` sync server on a free port of 127.0.0.1 (`ws_port`, 0 until
  `start()`; `port` asserts it started), calling the stand-in's `_handle_ws`
  per connection, with no library pings or compression (the stand-ins speak
  their protocols' own keepalives);
- when the stand-in has an HTTP side (an `http_handler` class), a
  `ThreadingHTTPServer` on another free port (`http_port`); `JsonHandler` is
  the handler base that answers JSON and logs nothing;
- one thread serving each, plus the stand-in's own background `loops`, named
  `standin-<name>-<role>` and not daemons;
- the lock its state changes under (`_lock`), the condition on it
  (`_cond`, `_notify()`), `wait_for(predicate, timeout)`, and the stop
  event (`_stop`) that the loops and handlers watch;
- `close()`, in this order: the stop event is set under the condition (so
  waiters and handlers wake to it); the WebSocket server shuts down (it
  stops accepting, closes the open connections with 1001 and waits for their
  handlers); the HTTP server shuts down and closes its socket; then every
  thread is joined with a deadline of `JOIN_SECS` each.

What each platform says on those sockets (and its own connection records)
stays in its module. Nothing durable here.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from websockets.http11 import Request, Response
from websockets.sync.server import Server, ServerConnection, serve

HOST = "127.0.0.1"
#: What `websockets` calls before an upgrade: None to go on, or the HTTP answer to give instead.
ProcessRequest = Callable[[ServerConnection, Request], Response | None]
#: How long `close()` waits for each of the stand-in's threads.
JOIN_SECS = 10.0


class StandinHttpServer(ThreadingHTTPServer):
    # Hundreds of sources subscribing at once must not find the accept queue
    # full (5 by default: the kernel then resets connections, which the platforms do not).
    request_queue_size = 512
    daemon_threads = True


class JsonHandler(BaseHTTPRequestHandler):
    """An HTTP handler that answers JSON (or nothing) and logs nothing."""

    protocol_version = "HTTP/1.0"

    def _answer(self, status: int, obj: Mapping[str, Any] | None,
                headers: Mapping[str, str] | None = None) -> None:
        body = b"" if obj is None else json.dumps(obj).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if obj is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _headers(self) -> dict[str, str]:
        """The request's headers, their names in lower case."""
        return {k.lower(): v for k, v in self.headers.items()}

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the callers log what matters


class StandinServers:
    """The servers, threads, lock and stop event of one stand-in (see the module docstring).

    A stand-in subclass passes, once: its `name` (in its threads' names); the
    `lock` its state changes under (re-entrant by default: a `wait_for`
    predicate may call methods that take it); the `http_handler` class of its
    HTTP side, if any, and the `http_server` class to run it; its background
    `loops` ((role, target): each returns once `_stop` is set);
    `wait_poll_secs`, the longest `wait_for` sleeps between looks at its
    predicate without a notification; `close_timeout_secs`, how long the
    WebSocket server waits for a client's side of a closing handshake; and a
    `process_request` for the WebSocket upgrade. It implements `_handle_ws`.
    """

    def __init__(self, name: str, *, lock: threading.Lock | threading.RLock | None = None,
                 http_handler: type[BaseHTTPRequestHandler] | None = None,
                 http_server: type[ThreadingHTTPServer] = StandinHttpServer,
                 loops: Sequence[tuple[str, Callable[[], None]]] = (),
                 wait_poll_secs: float = 0.05, close_timeout_secs: float = 1.0,
                 process_request: ProcessRequest | None = None) -> None:
        self._name = name
        self._lock = lock if lock is not None else threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._http_handler = http_handler
        self._http_server = http_server
        self._loops = tuple(loops)
        self._wait_poll_secs = wait_poll_secs
        self._close_timeout_secs = close_timeout_secs
        self._ws_process_request = process_request
        self._ws: Server | None = None
        self._http: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self.ws_port = 0
        self.http_port = 0

    def _handle_ws(self, conn: ServerConnection) -> None:
        raise NotImplementedError

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Self:
        self._ws = serve(self._handle_ws, HOST, 0, ping_interval=None, compression=None,
                         close_timeout=self._close_timeout_secs, process_request=self._ws_process_request)
        self.ws_port = int(self._ws.socket.getsockname()[1])
        roles: list[tuple[str, Callable[[], None]]] = [("ws", self._ws.serve_forever)]
        if self._http_handler is not None:
            http = self._http = self._http_server((HOST, 0), self._http_handler)
            self.http_port = int(http.server_address[1])
            roles.append(("http", lambda: http.serve_forever(poll_interval=0.05)))
        roles.extend(self._loops)
        for role, target in roles:
            thread = threading.Thread(target=target, name=f"standin-{self._name}-{role}")
            thread.start()
            self._threads.append(thread)
        return self

    def close(self) -> None:
        with self._cond:
            self._stop.set()
            self._cond.notify_all()
        if self._ws is not None:
            self._ws.shutdown()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        for thread in self._threads:
            thread.join(JOIN_SECS)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        """The WebSocket port (once started)."""
        assert self._ws is not None, "not started"
        return self.ws_port

    def _ws_url(self, path: str) -> str:
        return f"ws://{HOST}:{self.ws_port}{path}"

    def _http_url(self, path: str) -> str:
        return f"http://{HOST}:{self.http_port}{path}"

    # -- waiting ------------------------------------------------------------------------------

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Whether `predicate` (evaluated under the lock) came true within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, self._wait_poll_secs))
            return True

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()
