"""Refused frames, kept with their raw bytes in a bounded file quarantine.

See docs/architecture.rst, "Refused frames".

A frame or webhook body a platform sent that the daemon refuses (not UTF-8,
not JSON, nested too deep, too large, a shape it cannot read) is counted in
`source_bad_frames` and, here, kept for an operator: one JSON line per frame
in `[daemon] state_dir/quarantine/frames.jsonl` with the time, platform,
reason, the short detail, the frame's size and its bytes (base64, the first
`max_frame_bytes` of them; `truncated` says when there were more).

Bounded: when the file passes `max_bytes` it is renamed to `frames.jsonl.1`
(replacing the previous one) and a new file is started, so the quarantine
never holds more than about twice `max_bytes`. Refused frames come from
outside, so the newest are the ones worth keeping. The directory is 0700:
frames hold chat text.

Thread-safe (every source and request thread shares one). A write failure
(disk full, read-only) is counted in `frames_quarantined{result="failed"}`
and logged once a minute, never raised: a refused frame must not take a
source down. Durable when `add` returns: written, not fsynced (a refused
frame is evidence, not data the daemon promised to keep).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

from lumio_ingestd import boundedjson
from lumio_ingestd.logs import Throttled
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import format_time

log = logging.getLogger("lumio_ingestd.framequarantine")

MAX_BYTES = 16 * 1024 * 1024
MAX_FRAME_BYTES = 64 * 1024
FILE_NAME = "frames.jsonl"




class FrameQuarantine:
    def __init__(self, directory: Path, metrics: Metrics, *, max_bytes: int = MAX_BYTES,
                 max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.directory = directory
        self.path = directory / FILE_NAME
        self._metrics = metrics
        self._max_bytes = max_bytes
        self._max_frame = max_frame_bytes
        self._lock = threading.Lock()
        self._failed_log = Throttled(log)

    def add(self, platform: str, reason: str, raw: bytes | str, detail: str = "") -> None:
        data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else bytes(raw)
        kept = data[:self._max_frame]
        line = json.dumps({
            "at": format_time(datetime.now(UTC)), "platform": platform[:32], "reason": reason[:64],
            "detail": detail[:300], "size": len(data), "truncated": len(kept) < len(data),
            "raw_b64": base64.b64encode(kept).decode("ascii"),
        }, separators=(",", ":")).encode() + b"\n"
        try:
            with self._lock:
                self._write(line)
        except OSError as exc:
            self._metrics.frames_quarantined.labels("failed").inc()
            self._failed_log.log(logging.WARNING, "frame quarantine: cannot write to %s (%s); "
                                 "refused frames are only counted", self.path, exc)
            return
        self._metrics.frames_quarantined.labels("kept").inc()

    def _write(self, line: bytes) -> None:
        if not self.directory.is_dir():
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.directory, 0o700)
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size and size + len(line) > self._max_bytes:
            os.replace(self.path, self.path.with_name(FILE_NAME + ".1"))
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def entries(self) -> list[dict[str, object]]:
        """Everything kept, oldest first (for operators and tests)."""
        out: list[dict[str, object]] = []
        for path in (self.path.with_name(FILE_NAME + ".1"), self.path):
            try:
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                continue
            out += [boundedjson.loads(line) for line in text.splitlines() if line]
        return out
