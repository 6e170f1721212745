"""The running daemon's own view, as a file: `STATE_DIR/status.json`.

`lumio-ingestd status` runs as a separate process and cannot ask the
daemon's threads anything, so the daemon writes what only it knows (each
source's connection state, last connect, last error and reconnect count; its
workers; its phase) into a small JSON file in its state directory: at start,
every couple of seconds from the supervisor loop (main thread), and once more
when it has stopped. A file rather than a socket: nothing to listen on, it
survives the daemon (the last snapshot tells what it was doing when it
stopped or died), and the unit's state directory is already private to it.

The file is replaced atomically (write a temporary file, rename it over the
old one), so a reader sees the old snapshot or the new one, never half of
one. It is not fsynced: a snapshot is advisory and rewritten seconds later;
after a machine crash the reader may find the previous one or none.

Format (`"v": 1`)::

    {"v": 1, "instance": "...", "pid": 123, "host": "...", "phase": "ingesting",
     "started_at": UNIX, "written_at": UNIX, "interval_secs": 2.0,
     "sources": [{"name": "...", "platform": "...", "state": "connected",
                  "since": UNIX, "last_connect": UNIX|null, "last_error": "..."|null,
                  "last_error_at": UNIX|null, "connects": N, "reconnects": N,
                  "connect_failures": N, "disconnects": N, "subscribe_refusals": N,
                  "unsubscribed": {"channel": "the platform's refusal", ...},
                  "held_elsewhere": [{"account": N, "subscription": "...", "session_id": "...",
                                      "status": "...", "ours": false, "why": "..."}]}],
     "workers": [{"name": "...", "alive": true, "healthy": true}]}

Nothing here is durable in the sense of the data path: losing the file loses
no chat and no event.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lumio_ingestd import boundedjson
from lumio_ingestd.sources.base import Source
from lumio_ingestd.worker import Worker

log = logging.getLogger("lumio_ingestd.localstate")

FILE_NAME = "status.json"
FORMAT_VERSION = 1
#: How often the daemon rewrites the snapshot (the supervisor's status refresh).
INTERVAL_SECS = 2.0


def snapshot_path(state_dir: Path) -> Path:
    return Path(state_dir) / FILE_NAME


def build_snapshot(*, instance: str, phase: str, started_at: float, workers: Sequence[Worker],
                   interval_secs: float = INTERVAL_SECS, now: float | None = None) -> dict[str, Any]:
    sources: list[dict[str, Any]] = []
    for worker in workers:
        for source in _sources_of(worker):
            sources.append({"name": source.name, **source.source_state.snapshot()})
    mono = time.monotonic()
    return {
        "v": FORMAT_VERSION, "instance": instance, "pid": os.getpid(), "host": socket.gethostname(),
        "phase": phase, "started_at": round(started_at, 3),
        "written_at": round(time.time() if now is None else now, 3), "interval_secs": interval_secs,
        "sources": sources,
        "workers": [{"name": w.name, "alive": w.alive, "healthy": w.healthy(mono)} for w in workers],
    }


def _sources_of(worker: Worker) -> list[Source]:
    """A source, or the sources a worker runs itself (`child_sources()`: the 7TV sockets)."""
    if isinstance(worker, Source):
        return [worker]
    children = getattr(worker, "child_sources", None)
    return list(children()) if callable(children) else []


def write_snapshot(path: Path, doc: dict[str, Any]) -> None:
    """Replace `path` atomically with `doc`; raises OSError."""
    tmp = path.with_name(f".{path.name}.tmp")
    data = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(tmp, path)


class LocalState:
    """The daemon's writer: never raises, and logs a failing write once per run of failures."""

    def __init__(self, state_dir: Path, instance: str, *, interval_secs: float = INTERVAL_SECS) -> None:
        self.path = snapshot_path(state_dir)
        self.instance = instance
        self.interval_secs = interval_secs
        self.started_at = time.time()
        self._failing = False

    def write(self, phase: str, workers: Sequence[Worker]) -> bool:
        try:
            doc = build_snapshot(instance=self.instance, phase=phase, started_at=self.started_at,
                                 workers=workers, interval_secs=self.interval_secs)
            write_snapshot(self.path, doc)
        except Exception as exc:  # noqa: BLE001 - a status file must never hurt the daemon
            if not self._failing:
                log.warning("cannot write the status snapshot %s: %s", self.path, exc)
                self._failing = True
            return False
        if self._failing:
            log.info("the status snapshot %s is written again", self.path)
            self._failing = False
        return True


def read_snapshot(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the snapshot, None), or (None, why there is none)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, f"no snapshot at {path} (the daemon never ran with this state_dir)"
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror or exc}"
    try:
        doc = boundedjson.loads(raw, max_bytes=1 << 30)
    except ValueError:
        return None, f"{path} is not valid JSON"
    if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION:
        return None, f"{path} has an unknown format"
    return doc, None


def pid_running(pid: object) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: no pid is that large
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True
