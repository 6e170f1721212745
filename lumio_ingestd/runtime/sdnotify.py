"""systemd's notify protocol with the standard library only.

One datagram of newline-separated `KEY=VALUE` lines to `$NOTIFY_SOCKET`: a
path, or `@name` for a Linux abstract socket (the `@` becomes a NUL byte).
Sending is best effort: without the variable every call is a no-op, and a
failure is logged once at debug level and never raised (sd_notify(3) treats
the protocol the same way). The environment is passed in; nothing here reads
`os.environ`.

Nothing durable lives here.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("lumio_ingestd.sdnotify")


class Notifier:
    def __init__(self, environ: Mapping[str, str]) -> None:
        address = environ.get("NOTIFY_SOCKET", "")
        self._address: str | None
        if address.startswith("@"):
            self._address = "\0" + address[1:]
        elif address.startswith("/"):
            self._address = address
        else:
            # unset, or a vsock: address (not needed for a service on the host)
            self._address = None
        self._failed_once = False

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, *lines: str) -> bool:
        """Send one message; True when it was handed to the socket."""
        if self._address is None:
            return False
        data = "\n".join(line.replace("\n", " ") for line in lines).encode("utf-8", "replace")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(data, self._address)
        except OSError as exc:
            if not self._failed_once:
                self._failed_once = True
                log.debug("sd_notify to $NOTIFY_SOCKET failed (%s); further failures are not logged", exc)
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={status}")

    def status(self, status: str) -> bool:
        return self.notify(f"STATUS={status}")

    def stopping(self, status: str) -> bool:
        return self.notify("STOPPING=1", f"STATUS={status}")

    def reloading(self, monotonic_usec: int) -> bool:
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")


def watchdog_interval(environ: Mapping[str, str], pid: int | None = None) -> float | None:
    """How often to send WATCHDOG=1 (half of $WATCHDOG_USEC), or None when not asked.

    `$WATCHDOG_PID`, when set, must be our pid: the variables may have been
    inherited from a parent that systemd meant instead.
    """
    raw_usec = environ.get("WATCHDOG_USEC", "")
    if not raw_usec.isdigit() or int(raw_usec) == 0:
        return None
    raw_pid = environ.get("WATCHDOG_PID", "")
    if raw_pid and raw_pid != str(pid if pid is not None else os.getpid()):
        return None
    return int(raw_usec) / 1_000_000 / 2
