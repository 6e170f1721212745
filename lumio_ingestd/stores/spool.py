"""The local spool: chat and events that neither Redis nor the database would take.

Owns the files under its directory (normally `<state_dir>/spool`):

- `spool-NNNNNNNN.seg`, append-only segments, oldest first. Each starts with a
  16-byte header (magic `LUMSPOOL`, format version u32, reserved u32) and then
  holds records framed as `[length u32][crc32 u32][kind u8][payload]`
  (little endian; the CRC covers the kind byte and the payload). The kind byte
  is 1 (chat) or 2 (event); its high bit says "more records of the same
  append follow", which is how recovery tells a complete append from one the
  process died in the middle of.
- `ack`: the replay position (segment number, offset) behind a CRC, replaced
  atomically (temp file, fsync, rename, fsync of the directory).
- `spool.lock`: an exclusive flock, so two processes never share a spool.

What is durable when a function returns:

- `append(kind, entries)` returned: every entry is on disk (written in one
  `pwrite` and one `fsync`, plus a directory fsync when it opened a new segment)
  and will be handed to a replay handler at least once, in this process or after
  a restart. When it raises `SpoolError`, none of the entries will ever be
  replayed: a partly written batch is cut off again, and after a failed fsync
  the bytes are never trusted (PostgreSQL's "fsyncgate": the kernel may have
  dropped the dirty pages and a second fsync can succeed falsely), so the batch
  is truncated away and the segment is sealed; the next append opens a new file.
- `replay(handler)` returned: the records the handler accepted are gone from
  the spool, and the `ack` file says so (best effort: if the ack cannot be
  written the position is kept in memory and a restart re-delivers).
  Delivery is at least once, never at most once: a crash between the handler's
  return and the ack re-delivers that batch after the restart. That is harmless
  because every insert downstream is idempotent (chat `ON CONFLICT DO NOTHING`,
  events keyed on their original id and `created_at`).

Bounds: `max_bytes` caps the record bytes not yet replayed (rebuilt from the
files at start); an append that would pass it is refused whole ("full"). On
disk there may be up to one segment more (headers, the replayed part of the
file being written): a segment is removed as soon as it is fully replayed, and
the file being written too once the spool is empty.

Recovery (`open()`): leftover segments already replayed are deleted; a segment
with an unknown header is logged and left on disk untouched; the last segment
is verified record by record and a torn tail (a record cut short, a bad CRC
with nothing valid after it, or an append cut in the middle) is truncated back
to the end of the last complete append, fsynced and counted in
`spool_torn_tails`. Older segments are verified as they are replayed (every
record's CRC is checked on every read): a corrupt stretch in the middle is
logged, counted in `spool_lost{kind,"corrupt"}` and skipped up to the next
valid record, so one bad sector never costs the rest of the file. After a
start, appends always go to a new segment; recovered files are only read.

`SpoolReplayer` is the worker that replays the spool to the composition
root's handler every few seconds while it holds anything. `inspect()` counts
what a spool directory holds without locking it (for `lumio-ingestd status`
and `spool status`; `spool replay` opens the spool like the daemon does, so
it refuses while the daemon holds the lock).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from lumio_ingestd import boundedjson
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.worker import IntervalWorker

log = logging.getLogger("lumio_ingestd.spool")

#: A replay handler: gets one kind ("chat" | "event") and that kind's entries, oldest first;
#: returning means the entries are stored elsewhere, raising means "not now".
Handler = Callable[[str, list[bytes]], None]

FORMAT_VERSION = 1
MAGIC = b"LUMSPOOL"
DEFAULT_SEGMENT_BYTES = 8 * 1024 * 1024
#: Largest payload of one record. A longer entry is refused ("full"), never split.
MAX_RECORD_BYTES = 16 * 1024 * 1024

_HEADER = struct.Struct("<8sII")        # magic, format version, reserved
_HEADER_BYTES = _HEADER.pack(MAGIC, FORMAT_VERSION, 0)
HEADER_SIZE = _HEADER.size              # 16: the offset of a segment's first record
_RECORD = struct.Struct("<IIB")         # payload length, crc32(kind byte + payload), kind byte
_KIND_CODES = {"chat": 1, "event": 2}
_CODE_KINDS = {code: kind for kind, code in _KIND_CODES.items()}
_MORE = 0x80                            # kind-byte flag: the append continues after this record
_KIND_BYTE_CRC = {kb: zlib.crc32(bytes([kb])) for code in _CODE_KINDS for kb in (code, code | _MORE)}
# Any byte that can be a valid kind byte: the cheap first test when searching for the next record.
_KIND_BYTE_RE = re.compile(b"[" + b"".join(re.escape(bytes([kb])) for kb in sorted(_KIND_BYTE_CRC)) + b"]")

_ACK = struct.Struct("<8sIIQI")         # magic, version, segment number, offset, crc32 of the rest
_ACK_MAGIC = b"LUMSPACK"
_SEGMENT_RE = re.compile(r"spool-(\d{8,})\.seg")


class SpoolError(Exception):
    """The spool refused or failed. `reason` is "full", "io" or "closed"."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"spool {reason}: {message}")
        self.reason = reason


@dataclass
class _Segment:
    number: int
    path: Path
    start: int              # offset of the first record not yet replayed
    end: int                # end of the last complete, fsynced append
    fd: int | None = None   # open for writing only while it is the active (last) segment


@dataclass
class _Hole:
    """A corrupt stretch of a segment, [start, end), and what it probably held."""
    start: int
    end: int
    records: int
    kind: str


@dataclass
class _Run:
    """What one read found: consecutive records of one kind, or a hole."""
    kind: str
    entries: list[bytes]
    next_pos: int
    hole: _Hole | None = None


def segment_name(number: int) -> str:
    return f"spool-{number:08d}.seg"


class Spool:
    """A bounded, fsync'd, CRC-framed, append-only spool. Thread-safe.

    One lock guards the state; appends hold it for their write and fsync. The
    replay handler is always called without it, so a slow target never stalls
    an append. Replays are serialized among themselves.
    """

    def __init__(self, directory: Path, max_bytes: int, metrics: Metrics, *,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        if max_bytes < 1 or segment_bytes <= HEADER_SIZE:
            raise ValueError("max_bytes must be positive and segment_bytes larger than a header")
        self._dir = Path(directory)
        self._max_bytes = max_bytes
        self._segment_bytes = segment_bytes
        self._metrics = metrics
        self._lock = threading.Lock()
        self._replay_lock = threading.Lock()
        self._segments: list[_Segment] = []
        self._next_number = 1
        self._pending = 0
        self._lock_fd: int | None = None
        self._opened = False
        self._closed = False
        self._failing: str | None = None     # reason of the current run of refused appends
        self._ack_failing = False

    # -- lifecycle ---------------------------------------------------------------

    def open(self) -> None:
        """Take the directory, recover what an earlier process left, and get ready to append."""
        with self._lock:
            if self._opened:
                raise RuntimeError("spool already opened")
            try:
                self._open_locked()
            except SpoolError:
                self._release_dir_lock()
                raise
            except OSError as exc:
                self._release_dir_lock()
                raise SpoolError("io", f"cannot open spool in {self._dir}: {exc}") from exc
            self._opened = True
            self._metrics.spool_bytes.set(self._pending)
        if self._pending:
            log.info("spool: %d bytes in %d segment(s) of %s wait for replay",
                     self._pending, len(self._segments), self._dir)

    def close(self) -> None:
        """Stop taking appends and release the directory. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._segments and self._segments[-1].fd is not None:
                self._seal(self._segments[-1])
            self._release_dir_lock()

    # -- writing -----------------------------------------------------------------

    def append(self, kind: str, entries: Sequence[bytes]) -> None:
        """Store all of `entries` durably, or none of them (SpoolError, counted in spool_lost)."""
        code = _KIND_CODES.get(kind)
        if code is None:
            raise ValueError(f"unknown spool kind {kind!r}")
        count = len(entries)
        if count == 0:
            return
        data, largest = _frame(code, entries)
        with self._lock:
            if not self._opened or self._closed:
                self._refuse(kind, count, "closed", "the spool is not open")
            if largest > MAX_RECORD_BYTES:
                self._refuse(kind, count, "full", f"an entry of {largest} bytes exceeds the record limit")
            if self._pending + len(data) > self._max_bytes:
                self._refuse(kind, count, "full",
                             f"{len(data)} more bytes would exceed the cap of {self._max_bytes} "
                             f"({self._pending} pending)")
            try:
                segment = self._segment_for(len(data))
                self._write(segment, data)
            except OSError as exc:
                self._refuse(kind, count, "io", f"{errno.errorcode.get(exc.errno or 0, exc.errno)}: {exc}",
                             exc)
            segment.end += len(data)
            self._pending += len(data)
            self._metrics.spool_bytes.set(self._pending)
            self._metrics.spool_records.labels(kind, "written").inc(count)
            if self._failing is not None:
                log.warning("spool: taking appends again after a run of %s failures", self._failing)
                self._failing = None

    def pending_bytes(self) -> int:
        """Bytes of records not yet replayed (the figure `max_bytes` caps)."""
        with self._lock:
            return self._pending

    # -- replay ------------------------------------------------------------------

    def replay(self, handler: Handler, max_records: int = 1000) -> int:
        """Hand up to `max_records` records to `handler`, oldest first, in runs of one kind.

        Returns the number of records the handler accepted. A record leaves the
        spool only after the handler returned for it; when the handler raises,
        its exception propagates and that run (and everything after it) stays.
        """
        if max_records < 1:
            raise ValueError("max_records must be positive")
        delivered = 0
        with self._replay_lock:
            while delivered < max_records:
                with self._lock:
                    if not self._opened or self._closed:
                        if delivered:
                            return delivered
                        raise SpoolError("closed", "the spool is not open")
                    segment = self._next_readable()
                    if segment is None:
                        break
                    path, start, end = segment.path, segment.start, segment.end
                try:
                    run = _read_run(path, start, end, max_records - delivered)
                except OSError as exc:
                    raise SpoolError("io", f"cannot read {path}: {exc}") from exc
                if run.hole is not None:
                    with self._lock:
                        if self._closed:
                            return delivered
                        self._skip_hole(segment, run.hole)
                    continue
                handler(run.kind, run.entries)
                with self._lock:
                    if self._closed:
                        # No ack after close (another process may own the directory now);
                        # a restart re-delivers this run, which downstream dedups.
                        return delivered
                    self._advance(segment, run.next_pos)
                    self._metrics.spool_records.labels(run.kind, "replayed").inc(len(run.entries))
                delivered += len(run.entries)
        return delivered

    # -- internals: open ---------------------------------------------------------

    def _open_locked(self) -> None:
        self._segments = []
        if not self._dir.is_dir():
            self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            # The spool holds chat text and event payloads: the daemon's user only,
            # whatever the umask (mkdir's mode is masked by it).
            os.chmod(self._dir, 0o700)
            _fsync_dir(self._dir.parent)
        self._lock_fd = os.open(self._dir / "spool.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise SpoolError("io", f"{self._dir} is in use by another process") from exc
        tmp = self._dir / "ack.tmp"
        if tmp.exists():
            tmp.unlink()  # an ack write that never got renamed: the old ack still stands
        ack = self._read_ack()
        numbers = sorted(int(m.group(1)) for p in self._dir.iterdir()
                         if (m := _SEGMENT_RE.fullmatch(p.name)) is not None)
        highest = max([*numbers, ack[0] if ack else 0])
        changed = False
        for i, number in enumerate(numbers):
            changed |= self._recover_segment(number, i == len(numbers) - 1, ack)
        if changed:
            _fsync_dir(self._dir)
        # Never reuse a number the ack may name: a new segment below it would look replayed.
        self._next_number = highest + 1
        self._pending = sum(s.end - s.start for s in self._segments)

    def _read_ack(self) -> tuple[int, int] | None:
        path = self._dir / "ack"
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) == _ACK.size:
            magic, version, number, offset, crc = _ACK.unpack(raw)
            if magic == _ACK_MAGIC and version == FORMAT_VERSION and crc == zlib.crc32(raw[:-4]):
                return number, offset
        # Starting from the oldest segment instead only re-delivers (idempotent downstream).
        log.warning("spool: %s is unreadable; replaying every segment from its start", path)
        return None

    def _recover_segment(self, number: int, last: bool, ack: tuple[int, int] | None) -> bool:
        """Adopt one segment found at start; True when the directory changed."""
        path = self._dir / segment_name(number)
        with open(path, "rb") as f:
            head = f.read(HEADER_SIZE)
            size = os.fstat(f.fileno()).st_size
        if len(head) < HEADER_SIZE:
            if _HEADER_BYTES.startswith(head):
                # Created, but the process died before the header was durable: it never held a record.
                log.warning("spool: %s has an incomplete header (crash while creating it); removed", path)
                path.unlink()
                return True
            log.error("spool: %s is not a spool segment (short, unknown header); left on disk, not read",
                      path)
            return False
        magic, version, _ = _HEADER.unpack(head)
        if magic != MAGIC:
            log.error("spool: %s is not a spool segment (bad magic); left on disk, not read", path)
            return False
        if version != FORMAT_VERSION:
            log.error("spool: %s has format version %d, this daemon reads %d; left on disk, not read",
                      path, version, FORMAT_VERSION)
            return False
        start = HEADER_SIZE
        if ack is not None:
            if number < ack[0]:
                path.unlink()  # replayed completely; the crash came before its removal
                return True
            if number == ack[0]:
                start = max(HEADER_SIZE, ack[1])
        end = size
        changed = False
        if last:
            end = self._cut_torn_tail(path)
            changed = end != size
        if start > end:
            log.warning("spool: ack of %s points past its end (%d > %d); nothing of it is pending",
                        path, start, end)
            start = end
        self._segments.append(_Segment(number, path, start, end))
        return changed

    def _cut_torn_tail(self, path: Path) -> int:
        """Verify the last segment; truncate it after its last complete append. Returns its end."""
        with open(path, "rb") as f:
            data = f.read()
        size = len(data)
        pos = good_end = HEADER_SIZE
        while pos < size:
            rec = _parse_at(data, pos, size)
            if rec is not None:
                pos, _, more = rec
                if not more:
                    good_end = pos
                continue
            resume = _resync(data, pos + 1, size)
            if resume is None:
                break
            # Valid records follow, so this is damage, not a tear: replay will skip and count it.
            log.error("spool: %s is corrupt at offset %d; valid records resume at %d", path, pos, resume)
            pos = resume
        if good_end == size:
            return size
        with open(path, "r+b") as f:
            os.ftruncate(f.fileno(), good_end)
            os.fsync(f.fileno())
        self._metrics.spool_torn_tails.inc()
        log.warning("spool: torn tail in %s at offset %d: %d bytes of an unfinished append removed",
                    path, good_end, size - good_end)
        return good_end

    # -- internals: writing --------------------------------------------------------

    def _refuse(self, kind: str, count: int, reason: str, message: str,
                cause: OSError | None = None) -> NoReturn:
        self._metrics.spool_lost.labels(kind, reason).inc(count)
        if self._failing != reason:
            # Once per run of failures: a full disk must not turn into one error line per message.
            level = logging.WARNING if reason == "closed" else logging.ERROR
            log.log(level, "spool: refused %d %s record(s) (%s): %s", count, kind, reason, message)
            self._failing = reason
        raise SpoolError(reason, message) from cause

    def _segment_for(self, size: int) -> _Segment:
        active = self._segments[-1] if self._segments and self._segments[-1].fd is not None else None
        if active is not None and active.end > HEADER_SIZE and active.end + size > self._segment_bytes:
            self._seal(active)
            active = None
        return active if active is not None else self._create_segment()

    def _create_segment(self) -> _Segment:
        number = self._next_number
        self._next_number += 1  # even on failure: a file we could not remove must not block the name
        path = self._dir / segment_name(number)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            _pwrite_all(fd, _HEADER_BYTES, 0)
            os.fsync(fd)
            _fsync_dir(self._dir)  # the new name must survive a crash, or its records are lost with it
        except OSError:
            os.close(fd)
            _remove_quietly(path, self._dir)
            raise
        segment = _Segment(number, path, HEADER_SIZE, HEADER_SIZE, fd)
        self._segments.append(segment)
        return segment

    def _write(self, segment: _Segment, data: bytes) -> None:
        assert segment.fd is not None
        try:
            _pwrite_all(segment.fd, data, segment.end)
            os.fsync(segment.fd)
        except OSError:
            # Whatever of the batch reached the file is not durable and must never be replayed.
            # Never retry the fsync (fsyncgate): cut the bytes off, and leave the file alone.
            self._cut_back(segment)
            self._seal(segment)
            raise

    def _cut_back(self, segment: _Segment) -> None:
        assert segment.fd is not None
        try:
            os.ftruncate(segment.fd, segment.end)
        except OSError as exc:
            log.error("spool: could not cut a failed append off %s at %d (%s); a restart may "
                      "replay records that were reported lost", segment.path, segment.end, exc)
            return
        try:
            # Persist the new size. This fsync reports nothing as durable; it only makes the
            # truncation stick, so a restart does not find the refused batch again.
            os.fsync(segment.fd)
        except OSError as exc:
            log.warning("spool: the cut of a failed append off %s at %d may not survive a crash (%s); "
                        "a restart may replay records that were reported lost", segment.path,
                        segment.end, exc)

    def _seal(self, segment: _Segment) -> None:
        if segment.fd is None:
            return
        fd, segment.fd = segment.fd, None
        try:
            os.close(fd)
        except OSError as exc:  # everything in it up to `end` was fsynced already
            log.warning("spool: closing %s: %s", segment.path, exc)

    # -- internals: replay -----------------------------------------------------------

    def _next_readable(self) -> _Segment | None:
        """The oldest segment with records left; drained segments are removed on the way."""
        while self._segments:
            segment = self._segments[0]
            if segment.start < segment.end:
                return segment
            # Drained. The active segment goes too once the spool is empty: the next append
            # opens a fresh file, so a spool that has caught up holds no files at all.
            self._seal(segment)
            self._segments.pop(0)
            # Ack first: a crash after it and before the unlink leaves a file the ack names
            # as replayed, which open() deletes; a missing file is never an error.
            self._write_ack(segment.number + 1, HEADER_SIZE)
            _remove_quietly(segment.path, self._dir)
        return None

    def _advance(self, segment: _Segment, pos: int) -> None:
        self._pending -= pos - segment.start
        segment.start = pos
        self._metrics.spool_bytes.set(self._pending)
        self._write_ack(segment.number, pos)

    def _skip_hole(self, segment: _Segment, hole: _Hole) -> None:
        log.error("spool: %s is corrupt at offsets %d-%d; %d %s record(s) skipped and counted lost",
                  segment.path, hole.start, hole.end, hole.records, hole.kind)
        self._metrics.spool_lost.labels(hole.kind, "corrupt").inc(hole.records)
        self._advance(segment, hole.end)

    def _write_ack(self, number: int, offset: int) -> None:
        body = _ACK.pack(_ACK_MAGIC, FORMAT_VERSION, number, offset, 0)[:-4]
        raw = body + struct.pack("<I", zlib.crc32(body))
        tmp, final = self._dir / "ack.tmp", self._dir / "ack"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                _pwrite_all(fd, raw, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
            _fsync_dir(self._dir)
        except OSError as exc:
            # Not fatal: the position is kept in memory, and a restart re-delivers from the
            # older ack (duplicates downstream are harmless; nothing is lost).
            if not self._ack_failing:
                log.warning("spool: cannot write the replay position to %s (%s); a restart "
                            "would re-deliver", final, exc)
                self._ack_failing = True
            _remove_quietly(tmp, None)
            return
        self._ack_failing = False

    def _release_dir_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None


class _TargetsDown(Exception):
    """The replay handler raised: Redis and the database are still unavailable."""


class SpoolReplayer(IntervalWorker):
    """Every `interval_secs`, replays the spool to `handler` until it is empty or the handler fails.

    A failing handler means the targets are still down: that is logged once per
    outage (info), not as a traceback per tick, and the next tick tries again.
    A turn stops after `turn_budget_secs` and continues right away, so a huge
    spool never makes the watchdog think the worker hangs, and a stop request
    is honoured between two handler calls.
    """

    def __init__(self, spool: Spool, handler: Handler, metrics: Metrics, interval_secs: float, *,
                 batch_records: int = 1000, turn_budget_secs: float = 5.0,
                 name: str = "spool-replayer") -> None:
        super().__init__(name, metrics, interval_secs)
        self._spool = spool
        self._handler = handler
        self._batch_records = batch_records
        self._turn_budget_secs = turn_budget_secs
        self._failed_ticks = 0
        self._more = False

    def run_once(self) -> float:
        self.tick()
        return 0.0 if self._more else self.interval_secs

    def tick(self) -> None:
        self._more = False
        if self._spool.pending_bytes() == 0:
            return
        replayed = 0
        down = False
        deadline = time.monotonic() + self._turn_budget_secs
        while not self.stop_event.is_set():
            try:
                n = self._spool.replay(self._call_handler, self._batch_records)
            except _TargetsDown as exc:
                self._note_outage(exc.__cause__)
                down = True
                break
            except SpoolError as exc:
                if exc.reason == "closed":  # shutting down: nothing to do any more
                    return
                raise
            replayed += n
            if n == 0:
                break
            if time.monotonic() >= deadline:
                self._more = True
                break
        if replayed:
            log.info("spool replay: %d record(s) replayed, %d bytes left", replayed,
                     self._spool.pending_bytes())
        if not down and self._failed_ticks:
            log.info("spool replay: targets are back after %d failed attempt(s)", self._failed_ticks)
            self._failed_ticks = 0

    def _call_handler(self, kind: str, entries: list[bytes]) -> None:
        try:
            self._handler(kind, entries)
        except Exception as exc:
            raise _TargetsDown() from exc

    def _note_outage(self, cause: BaseException | None) -> None:
        self._failed_ticks += 1
        # The class only: database messages may quote row values (a COPY error
        # carries the offending line), and chat text is never logged above debug.
        what = type(cause).__name__ if cause is not None else "unknown"
        level = logging.INFO if self._failed_ticks == 1 else logging.DEBUG
        log.log(level, "spool replay: targets unavailable (%s); retrying every %.1fs",
                what, self.interval_secs)


# -- framing -----------------------------------------------------------------------


def _frame(code: int, entries: Sequence[bytes]) -> tuple[bytes, int]:
    """The records of one append, and the size of its largest entry."""
    parts: list[bytes] = []
    largest = 0
    last = len(entries) - 1
    for i, entry in enumerate(entries):
        payload = bytes(entry)
        largest = max(largest, len(payload))
        kb = code | _MORE if i < last else code
        parts.append(_RECORD.pack(len(payload), zlib.crc32(payload, _KIND_BYTE_CRC[kb]), kb))
        parts.append(payload)
    return b"".join(parts), largest


def _parse_at(data: bytes, pos: int, end: int) -> tuple[int, int, bool] | None:
    """A valid record at `pos` within `data[:end]`: (next offset, kind code, more); else None."""
    if pos + _RECORD.size > end:
        return None
    length, crc, kb = _RECORD.unpack_from(data, pos)
    first = _KIND_BYTE_CRC.get(kb)
    body = pos + _RECORD.size
    if first is None or length > MAX_RECORD_BYTES or body + length > end:
        return None
    if zlib.crc32(memoryview(data)[body:body + length], first) != crc:
        return None
    return body + length, kb & ~_MORE, bool(kb & _MORE)


def _resync(data: bytes, start: int, end: int) -> int | None:
    """Offset of the first valid record at or after `start`, or None."""
    for m in _KIND_BYTE_RE.finditer(data, start + _RECORD.size - 1, end):
        pos = m.start() - (_RECORD.size - 1)
        if _parse_at(data, pos, end) is not None:
            return pos
    return None


def _read_run(path: Path, start: int, end: int, limit: int) -> _Run:
    """Read records of one kind from `path` in [start, end), at most `limit`; or the hole at `start`."""
    entries: list[bytes] = []
    kind: str | None = None
    pos = start
    with open(path, "rb", buffering=1 << 20) as f:
        f.seek(start)
        while pos < end and len(entries) < limit:
            head = f.read(_RECORD.size)
            payload = b""
            ok = len(head) == _RECORD.size
            if ok:
                length, crc, kb = _RECORD.unpack(head)
                first = _KIND_BYTE_CRC.get(kb)
                ok = first is not None and pos + _RECORD.size + length <= end
                if ok and first is not None:
                    payload = f.read(length)
                    ok = len(payload) == length and zlib.crc32(payload, first) == crc
            if not ok:
                if entries:
                    break  # deliver the good records first; the hole is the next read's business
                f.seek(start)
                return _Run("", [], start, _find_hole(f.read(end - start), start))
            record_kind = _CODE_KINDS[kb & ~_MORE]
            if kind is None:
                kind = record_kind
            elif record_kind != kind:
                break
            entries.append(payload)
            pos += _RECORD.size + len(payload)
    return _Run(kind or "", entries, pos, None)


def _find_hole(data: bytes, base: int) -> _Hole:
    """The corrupt stretch at the start of `data` (which begins at file offset `base`)."""
    resume = _resync(data, 1, len(data))
    size = resume if resume is not None else len(data)
    # Count the records it held when their length fields still chain up to the resume point.
    kind = "chat"
    if len(data) >= _RECORD.size:
        kb = data[_RECORD.size - 1]
        kind = _CODE_KINDS.get(kb & ~_MORE, "chat")
    pos, hops = 0, 0
    while pos + _RECORD.size <= size:
        pos += _RECORD.size + _RECORD.unpack_from(data, pos)[0]
        hops += 1
    records = hops if pos == size and hops else 1
    return _Hole(base, base + size, records, kind)


# -- file helpers --------------------------------------------------------------------


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError(errno.EIO, "pwrite wrote nothing")
        view = view[written:]
        offset += written


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_quietly(path: Path, directory: Path | None) -> None:
    """Remove a file we no longer need; a failure is logged, never raised."""
    try:
        path.unlink(missing_ok=True)
        if directory is not None:
            _fsync_dir(directory)
    except OSError as exc:
        log.warning("spool: cannot remove %s: %s", path, exc)


# -- read-only inspection (`lumio-ingestd status`, `spool status`) -----------------


@dataclass
class SpoolInfo:
    """What a spool directory holds, read without taking its lock (the daemon may hold it).

    `pending_bytes` counts the framed records not yet replayed, as the daemon's
    `spool_bytes` gauge does; a record being appended or replayed right now may
    or may not be counted. `oldest_created_at` is the `created_at` of the
    oldest record not yet replayed (None when it has none, or is empty).
    """

    directory: Path
    exists: bool = False
    segments: int = 0
    pending_bytes: int = 0
    records: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_KIND_CODES, 0))
    oldest_created_at: str | None = None
    oldest_segment_mtime: float | None = None
    holder_pid: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def total_records(self) -> int:
        return sum(self.records.values())


def inspect(directory: Path) -> SpoolInfo:
    """Count what `directory` holds for replay. Never writes, never locks, never raises OSError."""
    info = SpoolInfo(Path(directory))
    if not info.directory.is_dir():
        return info
    info.exists = True
    info.holder_pid = lock_holder(info.directory)
    ack = _peek_ack(info.directory / "ack")
    try:
        numbers = sorted(int(m.group(1)) for p in info.directory.iterdir()
                         if (m := _SEGMENT_RE.fullmatch(p.name)) is not None)
    except OSError as exc:
        info.problems.append(f"cannot list {info.directory}: {exc.strerror or exc}")
        return info
    for number in numbers:
        if ack is not None and number < ack[0]:
            continue  # replayed; removed at the next start
        start = max(HEADER_SIZE, ack[1]) if ack is not None and number == ack[0] else HEADER_SIZE
        path = info.directory / segment_name(number)
        try:
            _count_segment(path, start, info)
        except FileNotFoundError:
            continue  # replayed and removed while we looked
        except OSError as exc:
            info.problems.append(f"cannot read {path}: {exc.strerror or exc}")
    return info


def _count_segment(path: Path, start: int, info: SpoolInfo) -> None:
    with open(path, "rb", buffering=1 << 20) as f:
        st = os.fstat(f.fileno())
        head = f.read(HEADER_SIZE)
        if len(head) < HEADER_SIZE or _HEADER.unpack(head)[:2] != (MAGIC, FORMAT_VERSION):
            info.problems.append(f"{path} is not a segment this version reads")
            return
        pos, size, counted = start, st.st_size, 0
        f.seek(pos)
        while pos + _RECORD.size <= size:
            head = f.read(_RECORD.size)
            if len(head) < _RECORD.size:
                break
            length, _, kb = _RECORD.unpack(head)
            kind = _CODE_KINDS.get(kb & ~_MORE)
            if kind is None or pos + _RECORD.size + length > size:
                break  # a torn tail or damage: the daemon deals with it
            if info.oldest_created_at is None:
                info.oldest_created_at = _created_at(f.read(length))
            else:
                f.seek(length, os.SEEK_CUR)
            info.records[kind] += 1
            counted += 1
            pos += _RECORD.size + length
        if counted:
            info.segments += 1
            info.pending_bytes += pos - start
            if info.oldest_segment_mtime is None:
                info.oldest_segment_mtime = st.st_mtime


def _created_at(payload: bytes) -> str | None:
    try:
        obj = boundedjson.loads(payload, max_bytes=1 << 30)
    except ValueError:
        return None
    value = obj.get("created_at") if isinstance(obj, dict) else None
    return value if isinstance(value, str) else None


def _peek_ack(path: Path) -> tuple[int, int] | None:
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if len(raw) != _ACK.size:
        return None
    magic, version, number, offset, crc = _ACK.unpack(raw)
    if magic != _ACK_MAGIC or version != FORMAT_VERSION or crc != zlib.crc32(raw[:-4]):
        return None
    return number, offset


def lock_holder(directory: Path) -> int | None:
    """The pid holding `spool.lock` (from /proc/locks), without touching the lock; None if free."""
    try:
        inode = os.stat(Path(directory) / "spool.lock").st_ino
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" (blocked waiters carry "->")
        parts = line.split()
        if len(parts) < 6 or parts[1] != "FLOCK" or "->" in parts:
            continue
        try:
            if int(parts[5].rsplit(":", 1)[1]) == inode:
                return int(parts[4])
        except (ValueError, IndexError):
            continue
    return None
