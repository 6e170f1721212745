"""Cutting database calls that outlive their deadline.

`statement_timeout` only helps while the server answers; a black-holed server
never sends the 57014, and libpq waits in poll() for as long as the kernel
keeps the socket. `DeadlineGuard` runs one small thread that, once an
operation's deadline passes, shuts down that connection's socket: the blocked
call returns at once with a connection error, which `bound()` turns into
`DeadlineExceeded`. The thread exists only while deadlines are pending, so a
process never waits for it at exit.

Nothing durable lives here: a cut connection is discarded by its pool.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2

from lumio_ingestd.db.errors import DeadlineExceeded

log = logging.getLogger("lumio_ingestd.db.deadline")


class DeadlineGuard:
    def __init__(self, name: str, linger_secs: float = 1.0) -> None:
        self._name = name
        self._linger = linger_secs
        self._cond = threading.Condition()
        self._pending: dict[int, tuple[float, Any, int]] = {}
        self._fired: set[int] = set()
        self._next_token = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextmanager
    def bound(self, conn: Any, deadline: float | None) -> Iterator[None]:
        """Run the block with `conn`'s socket cut at `deadline` (monotonic).

        Without a deadline the call is still registered, so that a stop can
        cut it (`expire_thread`); nothing else ever does.
        """
        if deadline is None:
            deadline = math.inf
        elif deadline <= time.monotonic():
            raise DeadlineExceeded(f"{self._name}: deadline passed before the call started")
        with self._cond:
            token = self._next_token
            self._next_token += 1
            self._pending[token] = (deadline, conn, threading.get_ident())
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"pg-deadline-{self._name}", daemon=False
                )
                self._thread.start()
            self._cond.notify()
        settled = False
        try:
            yield
        except Exception as exc:
            settled = True
            if self._settle(token):
                raise DeadlineExceeded(
                    f"{self._name}: database call cut after its deadline ({exc.__class__.__name__})"
                ) from exc
            raise
        finally:
            if not settled:  # success, or a BaseException: never leave the token behind
                self._settle(token)

    def _settle(self, token: int) -> bool:
        with self._cond:
            self._pending.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                return True
            return False

    def expire_thread(self, thread_ident: int, at: float) -> int:
        """Bring the deadlines of one thread's pending calls forward to `at`.

        A worker asked to stop uses this to end a call that would otherwise
        run to its full deadline (a black-holed server). Returns how many
        calls it shortened.
        """
        with self._cond:
            shortened = 0
            for token, (deadline, conn, ident) in list(self._pending.items()):
                if ident == thread_ident and deadline > at:
                    self._pending[token] = (at, conn, ident)
                    shortened += 1
            if shortened:
                self._cond.notify()
            return shortened

    def close(self) -> None:
        with self._cond:
            self._closed = True
            thread = self._thread
            self._cond.notify()
        if thread is not None:
            thread.join(timeout=2.0)

    def _run(self) -> None:
        with self._cond:
            idle_since: float | None = None
            while True:
                now = time.monotonic()
                if not self._pending:
                    if self._closed:
                        break
                    if idle_since is None:
                        idle_since = now
                    elif now - idle_since >= self._linger:
                        break
                    self._cond.wait(self._linger)
                    continue
                idle_since = None
                for token, (deadline, conn, _) in list(self._pending.items()):
                    if deadline <= now:
                        del self._pending[token]
                        self._fired.add(token)
                        _cut(conn)
                if self._pending:
                    earliest = min(d for d, _, _ in self._pending.values())
                    # Capped: an unbounded call's deadline is infinite.
                    self._cond.wait(min(3600.0, max(0.0, earliest - time.monotonic())))
            self._thread = None


def _cut(conn: Any) -> None:
    """Shut the connection's socket down so a blocked libpq call returns."""
    try:
        fd = os.dup(conn.fileno())
    except (psycopg2.Error, OSError, ValueError) as exc:  # it closed itself meanwhile
        log.debug("deadline: nothing to cut (%s)", exc)
        return
    sock = socket.socket(fileno=fd)
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError as exc:
        log.debug("deadline: shutdown failed (%s)", exc)
    finally:
        sock.close()
    log.warning("database call outlived its deadline; connection cut")
