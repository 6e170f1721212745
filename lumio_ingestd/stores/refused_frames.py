"""Refused frames, kept with their raw bytes in a bounded file quarantine.

See docs/architecture.rst, "Refused frames".

A frame or webhook body a platform sent that the daemon refuses (not UTF-8,
not JSON, nested too deep, too large, a shape it cannot read) is counted in
`source_bad_frames` and, here, kept for an operator: one JSON line per frame
in `[daemon] state_dir/quarantine/frames.jsonl` with the time, platform,
reason, the short detail, the frame's size and its bytes (base64, the first
`max_frame_bytes` of them; `truncated` says when there were more).

Donor PII never reaches the file: every frame goes through
`pii.scrub_frame` before it is kept (email, geolocation and IP keys taken out
at any depth, JSON inside strings included; text that is not JSON and names
such a key is withheld, `raw_withheld`; email addresses masked), unless its
platform is in `keep_pii` (`[streamelements] keep_donor_pii = true`). The
entry says how many fields went (`pii_removed`). `erase()` serves `gdpr-erase`:
it drops every kept frame of the platform that names the user, and takes the
PII out of the other entries (files an older version wrote may hold some).

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
import fcntl
import json
import logging
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from lumio_ingestd import boundedjson
from lumio_ingestd.config import Config
from lumio_ingestd.logs import Throttled
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import format_time
from lumio_ingestd.pii import scrub_frame

log = logging.getLogger("lumio_ingestd.framequarantine")

MAX_BYTES = 16 * 1024 * 1024
MAX_FRAME_BYTES = 64 * 1024
FILE_NAME = "frames.jsonl"
#: Held while the file is written or rewritten (the daemon appends, `gdpr-erase` rewrites).
LOCK_NAME = ".frames.lock"




QUARANTINE_DIR = "quarantine"


def frame_pii_kept(cfg: Config) -> frozenset[str]:
    """The platforms whose refused frames keep donor PII: StreamElements with keep_donor_pii."""
    return frozenset({"streamelements"}) if cfg.streamelements.keep_donor_pii else frozenset()


def for_config(cfg: Config, metrics: Metrics) -> FrameQuarantine:
    """The daemon's frame quarantine, as the configuration places it."""
    return FrameQuarantine(cfg.daemon.state_dir / QUARANTINE_DIR, metrics, keep_pii=frame_pii_kept(cfg))


class FrameQuarantine:
    def __init__(self, directory: Path, metrics: Metrics, *, max_bytes: int = MAX_BYTES,
                 max_frame_bytes: int = MAX_FRAME_BYTES, keep_pii: frozenset[str] = frozenset()) -> None:
        self.directory = directory
        #: Platforms whose frames are kept with donor PII (the operator asked for it).
        self.keep_pii = keep_pii
        self.path = directory / FILE_NAME
        self._metrics = metrics
        self._max_bytes = max_bytes
        self._max_frame = max_frame_bytes
        self._lock = threading.Lock()
        self._failed_log = Throttled(log)

    def add(self, platform: str, reason: str, raw: bytes | str, detail: str = "") -> None:
        data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else bytes(raw)
        size = len(data)
        removed = 0
        scrubbed: bytes | None = data
        if platform not in self.keep_pii:
            # Before truncation: a cut frame is no longer JSON and could not be taken apart.
            scrubbed, removed = scrub_frame(data)
            if removed and platform == "streamelements":
                self._metrics.streamelements_pii_removed.inc(removed)
        kept = (scrubbed or b"")[:self._max_frame]
        entry: dict[str, object] = {
            "at": format_time(datetime.now(UTC)), "platform": platform[:32], "reason": reason[:64],
            "detail": detail[:300], "size": size, "truncated": scrubbed is not None and
            len(kept) < len(scrubbed), "raw_b64": base64.b64encode(kept).decode("ascii")}
        if removed:
            entry["pii_removed"] = removed
        if scrubbed is None:
            entry["raw_withheld"] = "not JSON, and it names donor PII fields"
        line = json.dumps(entry, separators=(",", ":")).encode() + b"\n"
        try:
            with self._lock, self._locked():
                self._write(line)
        except OSError as exc:
            self._metrics.frames_quarantined.labels("failed").inc()
            self._failed_log.log(logging.WARNING, "frame quarantine: cannot write to %s (%s); "
                                 "refused frames are only counted", self.path, exc)
            return
        self._metrics.frames_quarantined.labels("kept").inc()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Across processes: the daemon's appends and a `gdpr-erase` rewrite never interleave."""
        if not self.directory.is_dir():
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.directory, 0o700)
        fd = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write(self, line: bytes) -> None:
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

    def erase(self, platform: str, user_id: str) -> tuple[int, int]:
        """For `gdpr-erase`: drop every kept frame of `platform` whose bytes name `user_id` (as a
        whole word: an id, a login), and take donor PII out of the other entries (unless their
        platform is in `keep_pii`). Returns (frames dropped, PII fields removed). Raises OSError."""
        token = re.compile(rb"(?<![A-Za-z0-9_.@-])" + re.escape(user_id.encode()) + rb"(?![A-Za-z0-9_@-])")
        dropped = removed = 0
        with self._lock, self._locked():
            for path in (self.path.with_name(FILE_NAME + ".1"), self.path):
                try:
                    lines = path.read_bytes().splitlines()
                except FileNotFoundError:
                    continue
                out: list[bytes] = []
                changed = False
                for line in lines:
                    try:
                        entry = boundedjson.loads(line)
                        raw = base64.b64decode(str(entry["raw_b64"]), validate=True)
                    except (ValueError, KeyError, TypeError):
                        out.append(line)  # not ours to judge: left as it is
                        continue
                    if entry.get("platform") == platform and token.search(raw):
                        dropped += 1
                        changed = True
                        continue
                    if entry.get("platform") not in self.keep_pii:
                        clean, n = scrub_frame(raw)
                        if n:
                            removed += n
                            changed = True
                            entry["raw_b64"] = base64.b64encode(clean or b"").decode("ascii")
                            entry["pii_removed"] = int(entry.get("pii_removed") or 0) + n
                            if clean is None:
                                entry["raw_withheld"] = "not JSON, and it names donor PII fields"
                            line = json.dumps(entry, separators=(",", ":")).encode()
                    out.append(line)
                if changed:
                    tmp = path.with_name(f".{path.name}.tmp")
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                    try:
                        view = memoryview(b"".join(x + b"\n" for x in out))
                        while view:
                            view = view[os.write(fd, view):]
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    os.replace(tmp, path)
        return dropped, removed

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
