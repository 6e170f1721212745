"""A small threaded TCP proxy that injects network faults.

    proxy = FaultProxy("127.0.0.1", pg.port).start()
    proxy.latency(0.2)    # every chunk, both directions, delayed 0.2 s
    proxy.blackhole()     # nothing forwarded, nothing answered; reads hang
    proxy.reset()         # every connection (and each new one) gets a TCP RST
    proxy.refuse()        # listener closed: ECONNREFUSED (same port on re-listen)
    proxy.pass_through()  # heal
    proxy.close()

A mode switch applies to existing and new connections, and the call returns
only once every live connection has picked it up (after reset() every
existing connection is closed; after blackhole() nothing more is forwarded).
Blackholed bytes are left unread, not dropped: after pass_through() the
streams carry on intact, like a healed partition.  Under refuse() existing
connections keep forwarding.

One listener thread plus one thread per direction per connection; every
blocking call is a poll with a short timeout, so close() returns promptly.
"""

from __future__ import annotations

import atexit
import collections
import errno
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Self

__all__ = ["FaultProxy", "FaultProxyFactory"]

_POLL = 0.05  # seconds: upper bound of every blocking wait
_MODE_ACK_TIMEOUT = 5.0
_MAX_PENDING = 4 * 1024 * 1024
_RECV_SIZE = 65536

PASS = "pass"
LATENCY = "latency"
BLACKHOLE = "blackhole"
RESET = "reset"
REFUSE = "refuse"

_live_proxies: set[FaultProxy] = set()
_live_lock = threading.Lock()


def _close_all_proxies() -> None:
    with _live_lock:
        proxies = list(_live_proxies)
    for p in proxies:
        try:
            p.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


atexit.register(_close_all_proxies)


def _abort(sock: socket.socket) -> None:
    """Close with a TCP RST (SO_LINGER on, timeout 0)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def _poll_once(sock: socket.socket, events: int, timeout: float) -> bool:
    p = select.poll()
    p.register(sock, events)
    return bool(p.poll(max(0, int(timeout * 1000))))


class _Connection:
    """One proxied client connection: a c2u and a u2c pump thread."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, number: int) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream: socket.socket | None = None
        self.number = number
        self.name = f"faultproxy-{proxy.port}-conn{number}"
        self.stop = threading.Event()  # one direction failed: both stop
        self.done = threading.Event()  # sockets closed
        self.rst = False  # close with RST rather than FIN
        self.seen: dict[str, int] = {}  # direction -> mode generation acknowledged
        self.threads: list[threading.Thread] = []
        self._active = 0
        self._lock = threading.Lock()

    # -- threads
    def start(self) -> None:
        self._spawn("c2u", self._run_c2u)

    def _spawn(self, direction: str, target: Callable[[], None]) -> None:
        with self._lock:
            self._active += 1
        with self.proxy._cond:
            self.seen[direction] = -1
        t = threading.Thread(
            target=self._guard, args=(direction, target), name=f"{self.name}-{direction}", daemon=True
        )
        self.threads.append(t)
        t.start()

    def _guard(self, direction: str, target: Callable[[], None]) -> None:
        try:
            target()
        except Exception:  # noqa: BLE001 - any socket error ends the connection
            self.rst = True
            self.stop.set()
        finally:
            with self.proxy._cond:
                self.seen.pop(direction, None)
                self.proxy._cond.notify_all()
            with self._lock:
                self._active -= 1
                last = self._active == 0
            if last:
                self._close()

    def _close(self) -> None:
        for sock in (self.client, self.upstream):
            if sock is None:
                continue
            if self.rst:
                _abort(sock)
            else:
                try:
                    sock.close()
                except OSError:
                    pass
        self.proxy._forget(self)
        self.done.set()

    def _should_stop(self) -> bool:
        return self.stop.is_set() or self.proxy._closing.is_set()

    def _fail(self) -> None:
        self.rst = True
        self.stop.set()

    # -- c2u: waits out a blackhole, connects upstream, then pumps
    def _run_c2u(self) -> None:
        while True:
            mode, gen, _ = self.proxy._ack(self, "c2u")
            if self._should_stop():
                return
            if mode == RESET:
                self._fail()
                return
            if mode != BLACKHOLE:
                break
            self.proxy._wait_change(gen, _POLL)
        upstream = self._connect_upstream()
        if upstream is None:
            self._fail()
            return
        self.upstream = upstream
        self._spawn("u2c", lambda: self._pump(upstream, self.client, "u2c"))
        self._pump(self.client, upstream, "c2u")

    def _connect_upstream(self) -> socket.socket | None:
        host, port = self.proxy.target
        deadline = time.monotonic() + self.proxy.connect_timeout
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            return None
        for family, socktype, proto, _, addr in infos:
            sock = socket.socket(family, socktype, proto)
            sock.setblocking(False)
            err = sock.connect_ex(addr)
            if err in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY):
                while not _poll_once(sock, select.POLLOUT, _POLL):
                    mode, _, _ = self.proxy._ack(self, "c2u")  # the pump applies it next
                    if mode == RESET or self._should_stop() or time.monotonic() >= deadline:
                        break
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err == 0 and not _poll_once(sock, select.POLLOUT, 0):
                    err = errno.ETIMEDOUT
            if err == 0:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            sock.close()
        return None

    # -- one direction
    def _pump(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        src.setblocking(False)
        dst.setblocking(False)
        reader = select.poll()
        reader.register(src, select.POLLIN | select.POLLPRI)
        writer = select.poll()
        writer.register(dst, select.POLLOUT)
        pending: collections.deque[tuple[float, bytes]] = collections.deque()
        pending_bytes = 0
        eof = False
        while True:
            mode, gen, latency = self.proxy._ack(self, direction)
            if self._should_stop():
                return
            if mode == RESET:
                self._fail()
                return
            if mode == BLACKHOLE:  # hold everything, read nothing
                self.proxy._wait_change(gen, _POLL)
                continue
            now = time.monotonic()
            if pending and pending[0][0] <= now:
                due, chunk = pending[0]
                if not writer.poll(int(_POLL * 1000)):
                    continue
                try:
                    sent = dst.send(chunk)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    self._fail()
                    return
                pending_bytes -= sent
                if sent < len(chunk):
                    pending[0] = (due, chunk[sent:])
                else:
                    pending.popleft()
                continue
            if eof and not pending:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            timeout = _POLL if not pending else min(_POLL, max(0.0, pending[0][0] - now))
            if eof or pending_bytes >= _MAX_PENDING:
                self.proxy._wait_change(gen, timeout)
                continue
            if not reader.poll(int(timeout * 1000)):
                continue
            try:
                data = src.recv(_RECV_SIZE)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                self._fail()
                return
            if not data:
                eof = True
                continue
            delay = latency if mode == LATENCY else 0.0
            due = time.monotonic() + delay
            if pending:
                due = max(due, pending[-1][0])
            pending.append((due, data))
            pending_bytes += len(data)


class FaultProxy:
    """Threaded TCP proxy on 127.0.0.1 (free port) in front of (host, port)."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        listen_host: str = "127.0.0.1",
        connect_timeout: float = 5.0,
    ) -> None:
        self.target = (target_host, int(target_port))
        self.host = listen_host
        self.connect_timeout = connect_timeout
        self._port = 0
        self._cond = threading.Condition()
        self._mode = PASS
        self._latency = 0.0
        self._generation = 0
        self._closing = threading.Event()
        self._listening = False
        self._listen_error: OSError | None = None
        self._listener_sock: socket.socket | None = None
        self._listener_thread: threading.Thread | None = None
        self._conns: set[_Connection] = set()
        self._all_conns: list[_Connection] = []
        self._accepted = 0

    # -- properties
    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError("FaultProxy not started")
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def latency_seconds(self) -> float:
        return self._latency

    @property
    def connections_accepted(self) -> int:
        """Connections accepted so far (including ones reset on accept)."""
        with self._cond:
            return self._accepted

    @property
    def active_connections(self) -> int:
        with self._cond:
            return len(self._conns)

    @property
    def listening(self) -> bool:
        with self._cond:
            return self._listening

    # -- lifecycle
    def _bind(self, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, port))
            sock.listen(128)
            sock.settimeout(_POLL)
        except OSError:
            sock.close()
            raise
        return sock

    def start(self) -> Self:
        with self._cond:
            if self._listener_thread is not None:
                raise RuntimeError("FaultProxy already started")
            sock = self._bind(0)
            self._port = sock.getsockname()[1]
            self._listener_sock = sock
            self._listening = True
            self._listener_thread = threading.Thread(
                target=self._accept_loop, name=f"faultproxy-{self._port}-listener", daemon=True
            )
        with _live_lock:
            _live_proxies.add(self)
        self._listener_thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop the listener and every connection; join all threads (deadline)."""
        self._closing.set()
        with self._cond:
            self._cond.notify_all()
            threads = [self._listener_thread] if self._listener_thread else []
            threads += [t for c in self._all_conns for t in c.threads]
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with _live_lock:
            _live_proxies.discard(self)
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            raise RuntimeError(f"FaultProxy threads did not stop within {timeout} s: {stuck}")

    def __enter__(self) -> Self:
        if self._listener_thread is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- modes
    def pass_through(self) -> None:
        """Forward bytes both ways."""
        self._set_mode(PASS)

    def latency(self, seconds: float) -> None:
        """Delay every chunk, in both directions, by `seconds`."""
        if seconds < 0:
            raise ValueError("latency must be >= 0")
        self._set_mode(LATENCY, seconds)

    def blackhole(self) -> None:
        """Accept and hold connections, forward and answer nothing."""
        self._set_mode(BLACKHOLE)

    def reset(self) -> None:
        """RST every existing connection, and every new one on accept."""
        self._set_mode(RESET)

    def refuse(self) -> None:
        """Stop listening: new connections get ECONNREFUSED."""
        self._set_mode(REFUSE)

    def _set_mode(self, mode: str, latency: float = 0.0) -> None:
        if self._closing.is_set():
            raise RuntimeError("FaultProxy is closed")
        with self._cond:
            self._mode = mode
            self._latency = latency
            self._generation += 1
            gen = self._generation
            conns = list(self._conns)
            self._listen_error = None
            self._cond.notify_all()
            started = self._listener_thread is not None

            def applied() -> bool:
                if self._closing.is_set():
                    return True
                if started:
                    if mode == REFUSE and self._listening:
                        return False
                    if mode != REFUSE and not self._listening and self._listen_error is None:
                        return False
                if mode == RESET:
                    return all(c.done.is_set() for c in conns)
                return all(s >= gen for c in conns for s in c.seen.values())

            ok = self._cond.wait_for(applied, timeout=_MODE_ACK_TIMEOUT)
            if self._listen_error is not None:
                raise RuntimeError(
                    f"FaultProxy could not listen again on port {self._port}: {self._listen_error}"
                )
            if not ok:
                raise RuntimeError(
                    f"FaultProxy connections did not switch to {mode!r} within {_MODE_ACK_TIMEOUT} s"
                )

    # -- internals used by connections
    def _ack(self, conn: _Connection, direction: str) -> tuple[str, int, float]:
        with self._cond:
            gen = self._generation
            if conn.seen.get(direction) != gen:
                conn.seen[direction] = gen
                self._cond.notify_all()
            return self._mode, gen, self._latency

    def _wait_change(self, gen: int, timeout: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._generation != gen or self._closing.is_set(), timeout=timeout)

    def _forget(self, conn: _Connection) -> None:
        with self._cond:
            self._conns.discard(conn)
            self._cond.notify_all()

    def _accept_loop(self) -> None:
        sock = self._listener_sock
        try:
            while not self._closing.is_set():
                with self._cond:
                    want_listen = self._mode != REFUSE
                if not want_listen:
                    if sock is not None:
                        sock.close()
                        sock = None
                        with self._cond:
                            self._listening = False
                            self._cond.notify_all()
                    with self._cond:
                        self._cond.wait_for(
                            lambda: self._mode != REFUSE or self._closing.is_set(), timeout=_POLL
                        )
                    continue
                if sock is None:
                    try:
                        sock = self._bind(self._port)
                    except OSError as e:
                        with self._cond:
                            self._listen_error = e
                            self._cond.notify_all()
                        self._closing.wait(_POLL)
                        continue
                    with self._cond:
                        self._listening = True
                        self._listen_error = None
                        self._cond.notify_all()
                try:
                    client, _ = sock.accept()
                except TimeoutError:
                    continue
                except OSError:
                    self._closing.wait(_POLL)  # e.g. EMFILE: back off briefly
                    continue
                self._handle(client)
        finally:
            if sock is not None:
                sock.close()
            with self._cond:
                self._listening = False
                self._cond.notify_all()

    def _handle(self, client: socket.socket) -> None:
        with self._cond:
            self._accepted += 1
            number = self._accepted
            mode = self._mode
            if mode in (RESET, REFUSE) or self._closing.is_set():
                conn = None
            else:
                conn = _Connection(self, client, number)
                self._conns.add(conn)
                self._all_conns.append(conn)
        if conn is None:
            _abort(client)
            return
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.start()

    def __repr__(self) -> str:
        return f"<FaultProxy {self.host}:{self._port} -> {self.target[0]}:{self.target[1]} mode={self._mode}>"


FaultProxyFactory = Callable[[str, int], FaultProxy]
"""Type of the `fault_proxy` fixture: fault_proxy(host, port) -> started FaultProxy."""
