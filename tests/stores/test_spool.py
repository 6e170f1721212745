"""The local spool on real files: round trips, crashes, torn tails, corruption, full and failing disks.

Crashes are real SIGKILLs of a child process; the full disk is a real tiny
tmpfs (ENOSPC) or, where mounting is not allowed, a real RLIMIT_FSIZE (EFBIG).
The only patched call is `os.fsync` raising EIO, to prove a batch whose fsync
failed is neither reported durable nor replayed.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import support
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.stores.spool import HEADER_SIZE, MAGIC, Spool, SpoolError, SpoolReplayer, segment_name
from support.harness.servers import wait_until

ROOT = support.ROOT
RECORD_HEAD = 9  # length u32, crc32 u32, kind u8


# -- helpers ---------------------------------------------------------------------------


def open_spool(directory: Path, metrics: Metrics, *, max_bytes: int = 1 << 30,
               segment_bytes: int = 1 << 20) -> Spool:
    spool = Spool(directory, max_bytes, metrics, segment_bytes=segment_bytes)
    spool.open()
    return spool


def drain(spool: Spool, max_records: int = 1000) -> list[tuple[str, bytes]]:
    got: list[tuple[str, bytes]] = []

    def handler(kind: str, entries: list[bytes]) -> None:
        assert entries, "a handler call always carries records"
        got.extend((kind, e) for e in entries)

    while spool.replay(handler, max_records):
        pass
    return got


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("spool-*.seg"))


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def run_child(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


# -- round trip ---------------------------------------------------------------------------


def test_round_trip_across_rotation_and_reopen(tmp_path: Path) -> None:
    metrics = Metrics()
    spool = open_spool(tmp_path / "spool", metrics, segment_bytes=4096)
    rng = random.Random(7)
    expected: list[tuple[str, bytes]] = []
    for i in range(300):
        kind = "chat" if rng.random() < 0.7 else "event"
        batch = [f"{kind}-{i}-{j}".encode() + bytes(rng.randrange(256) for _ in range(rng.randint(0, 90)))
                 for j in range(rng.randint(1, 12))]
        spool.append(kind, batch)
        expected.extend((kind, e) for e in batch)
    assert len(segments(tmp_path / "spool")) > 10, "rotation at segment_bytes"
    pending = spool.pending_bytes()
    assert pending == sample(metrics, "spool_bytes")
    spool.close()
    for seg in segments(tmp_path / "spool"):
        head = seg.read_bytes()[:HEADER_SIZE]
        assert head[:8] == MAGIC and struct.unpack_from("<I", head, 8)[0] == 1

    metrics2 = Metrics()
    spool = open_spool(tmp_path / "spool", metrics2, segment_bytes=4096)
    assert spool.pending_bytes() == pending, "accounting is rebuilt from disk"
    calls: list[tuple[str, int]] = []

    def handler(kind: str, entries: list[bytes]) -> None:
        calls.append((kind, len(entries)))

    assert spool.replay(handler, 25) <= 25
    assert all(n <= 25 for _, n in calls)
    rest = drain(spool, 50)
    first = sum(n for _, n in calls)
    assert [k for k, _ in expected[:first]] == [k for k, n in calls for _ in range(n)]
    assert expected[first:] == rest
    assert spool.pending_bytes() == 0 and sample(metrics2, "spool_bytes") == 0
    assert segments(tmp_path / "spool") == [], "replayed segments are deleted"
    assert sample(metrics2, "spool_records_total", kind="chat", op="replayed") == sum(
        1 for k, _ in expected if k == "chat")
    assert sample(metrics2, "spool_records_total", kind="event", op="replayed") == sum(
        1 for k, _ in expected if k == "event")
    # appends after a full drain start a fresh segment and survive another reopen
    spool.append("event", [b"late"])
    spool.close()
    spool = open_spool(tmp_path / "spool", Metrics())
    assert drain(spool) == [("event", b"late")]
    spool.close()
    # an empty spool reopened: new segment numbers must stay above the ack's, or the next
    # start would take the new file for one already replayed
    spool = open_spool(tmp_path / "spool", Metrics())
    spool.append("chat", [b"later"])
    spool.close()
    spool = open_spool(tmp_path / "spool", Metrics())
    assert drain(spool) == [("chat", b"later")]
    spool.close()


def test_append_after_close_and_second_owner_are_refused(tmp_path: Path) -> None:
    metrics = Metrics()
    spool = open_spool(tmp_path / "spool", metrics)
    with pytest.raises(SpoolError) as taken:
        open_spool(tmp_path / "spool", Metrics())
    assert taken.value.reason == "io" and "in use" in str(taken.value)
    spool.close()
    with pytest.raises(SpoolError) as closed:
        spool.append("chat", [b"a", b"b"])
    assert closed.value.reason == "closed"
    assert sample(metrics, "spool_lost_total", kind="chat", reason="closed") == 2


# -- crash during append ---------------------------------------------------------------------

APPEND_CHILD = r"""
import random, sys
from pathlib import Path
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.stores.spool import Spool
directory, first, seed, pad = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
spool = Spool(directory, 1 << 30, Metrics(), segment_bytes=256 * 1024)
spool.open()
print("open", flush=True)
i = first
while True:
    n = rng.randint(1, 60)
    kind = "chat" if i % 2 else "event"
    spool.append(kind, [f"{i}:{j}:{n}:".encode() + b"x" * rng.randint(0, pad) for j in range(n)])
    print(i, flush=True)
    i += 1
"""


@pytest.fixture(params=["disk", "memory"])
def kill_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """The test's disk, and a tmpfs: with no fsync cost there, most kills land inside a write."""
    if request.param == "disk" or not os.access("/dev/shm", os.W_OK):
        if request.param != "disk":
            warnings.warn("no writable /dev/shm: the in-memory kill run uses the disk", stacklevel=1)
        yield tmp_path / "spool"
        return
    base = Path(tempfile.mkdtemp(prefix="lumio-spool-", dir="/dev/shm"))
    try:
        yield base / "spool"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_sigkill_during_appends_keeps_every_reported_batch_exactly_once(kill_dir: Path) -> None:
    directory = kill_dir
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    # Big appends where writes are cheap (tmpfs), so that many kills land inside a pwrite.
    pad, rounds = (3000, 5) if "shm" not in str(directory) else (16_000, 8)
    reported: set[int] = set()
    torn = 0
    for round_no in range(rounds):
        first = round_no * 1_000_000
        child = subprocess.Popen(
            [sys.executable, "-c", APPEND_CHILD, str(directory), str(first), str(rng.randrange(1 << 30)),
             str(pad)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert child.stdout is not None
        try:
            assert child.stdout.readline() == "open\n"
            for _ in range(rng.randint(1, 40)):
                reported.add(int(child.stdout.readline()))
            # The child is just past a print here; a random pause puts the kill at a random
            # point of the next appends (a jitter, not a wait for a condition).
            threading.Event().wait(rng.uniform(0, 0.03))
            child.send_signal(signal.SIGKILL)
            child.wait(30)
            tail = child.stdout.read()  # not communicate(): it would bypass readline's buffer
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child.returncode == -signal.SIGKILL
        reported.update(int(line) for line in tail.split())
        recovery = Metrics()
        open_spool(directory, recovery).close()  # recover here, to see what the kill left
        torn += int(sample(recovery, "spool_torn_tails_total"))

    spool = open_spool(directory, Metrics())
    seen: dict[int, list[int]] = {}
    sizes: dict[int, int] = {}
    for kind, entry in drain(spool):
        i, j, n, _ = entry.split(b":", 3)
        batch = int(i)
        assert kind == ("chat" if batch % 2 else "event")
        seen.setdefault(batch, []).append(int(j))
        sizes[batch] = int(n)
    spool.close()
    msg = f"seed {seed}"
    missing = reported - seen.keys()
    assert not missing, f"reported appended but not in the spool: {sorted(missing)} ({msg})"
    for batch, js in seen.items():
        # exactly once and nothing half-written: each entry carries its batch's size
        assert js == list(range(sizes[batch])), f"batch {batch} incomplete or duplicated ({msg})"
    assert list(seen) == sorted(seen), f"batches replay in append order ({msg})"
    unreported = seen.keys() - reported
    assert len(unreported) <= rounds, "at most the one append in flight per kill may be there unreported"


# -- torn tail and corruption -------------------------------------------------------------------


def _batches(spool: Spool, count: int, size: int, kind: str = "chat") -> list[list[bytes]]:
    out = []
    for i in range(count):
        batch = [f"b{i:03d}-r{j}-".encode().ljust(40, b".") for j in range(size)]
        spool.append(kind, batch)
        out.append(batch)
    return out


@pytest.mark.parametrize("how", ["mid-record-plus-garbage", "at-a-record-boundary"])
def test_torn_tail_is_truncated_counted_and_the_rest_kept(
        tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "spool"
    spool = open_spool(directory, Metrics())
    batches = _batches(spool, 10, 3)
    spool.close()
    [seg] = segments(directory)
    size = seg.stat().st_size
    record = RECORD_HEAD + 40
    last_batch_start = size - 3 * record
    with open(seg, "r+b") as f:
        if how == "mid-record-plus-garbage":
            f.truncate(size - 5)
            f.seek(0, os.SEEK_END)
            f.write(b"\xde\xad\xbe\xef" * 11)
        else:
            f.truncate(last_batch_start + record)  # one whole record of a three-record append

    metrics = Metrics()
    caplog.set_level(logging.WARNING, logger="lumio_ingestd.spool")
    spool = open_spool(directory, metrics)
    assert sample(metrics, "spool_torn_tails_total") == 1
    assert any(seg.name in r.getMessage() and str(last_batch_start) in r.getMessage()
               and r.levelno == logging.WARNING for r in caplog.records)
    assert seg.stat().st_size == last_batch_start, "cut back to the end of the last whole append"
    spool.append("event", [b"after"])
    got = drain(spool)
    assert got == [("chat", e) for b in batches[:9] for e in b] + [("event", b"after")]
    spool.close()
    # recovery is idempotent: nothing more to cut on the next start
    metrics = Metrics()
    open_spool(directory, metrics).close()
    assert sample(metrics, "spool_torn_tails_total") == 0


def test_incomplete_segment_header_left_by_a_crash_is_removed(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    spool = open_spool(directory, Metrics())
    spool.append("chat", [b"one"])
    spool.close()
    (directory / segment_name(2)).write_bytes(MAGIC[:5])
    spool = open_spool(directory, Metrics())
    assert not (directory / segment_name(2)).exists()
    spool.append("chat", [b"two"])
    assert drain(spool) == [("chat", b"one"), ("chat", b"two")]
    spool.close()


def test_corruption_in_the_middle_is_skipped_counted_and_replay_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "spool"
    record = RECORD_HEAD + 50
    spool = open_spool(directory, Metrics(), segment_bytes=HEADER_SIZE + 30 * record)
    entries = [f"rec-{i:04d}".encode().ljust(50, b"-") for i in range(100)]
    for e in entries:
        spool.append("chat", [e])
    spool.close()
    segs = segments(directory)
    assert len(segs) == 4  # 30 + 30 + 30 + 10

    def poke(path: Path, offset: int, data: bytes) -> None:
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(data)

    poke(segs[0], HEADER_SIZE + 10 * record + RECORD_HEAD + 7, b"X")    # payload bit rot: bad CRC
    poke(segs[1], HEADER_SIZE + 5 * record, struct.pack("<I", 0xFFFF))  # length field destroyed
    poke(segs[3], HEADER_SIZE + 3 * record + 4, b"\0\0\0\0")            # CRC field, in the last file
    lost = {entries[10], entries[35], entries[93]}

    metrics = Metrics()
    caplog.set_level(logging.INFO, logger="lumio_ingestd.spool")
    spool = open_spool(directory, metrics)
    assert sample(metrics, "spool_torn_tails_total") == 0, "damage with valid records after it is no tear"
    assert segs[3].stat().st_size == HEADER_SIZE + 10 * record, "the last file is not cut"
    got = drain(spool)
    spool.close()
    assert got == [("chat", e) for e in entries if e not in lost]
    assert sample(metrics, "spool_lost_total", kind="chat", reason="corrupt") == 3
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    for seg in (segs[0], segs[1], segs[3]):
        assert any(str(seg) in m and "corrupt" in m for m in errors), errors


def test_segment_of_an_unknown_version_is_left_alone(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "spool"
    spool = open_spool(directory, Metrics())
    spool.append("chat", [b"old-1", b"old-2"])
    spool.close()
    foreign = directory / segment_name(2)
    content = MAGIC + struct.pack("<II", 99, 0) + b"whatever a newer daemon wrote"
    foreign.write_bytes(content)

    caplog.set_level(logging.ERROR, logger="lumio_ingestd.spool")
    spool = open_spool(directory, Metrics())
    assert any(str(foreign) in r.getMessage() and "99" in r.getMessage() for r in caplog.records)
    spool.append("event", [b"new"])
    assert drain(spool) == [("chat", b"old-1"), ("chat", b"old-2"), ("event", b"new")]
    spool.close()
    assert [p.name for p in segments(directory)] == [foreign.name]
    spool = open_spool(directory, Metrics())  # the ack is past it now: still not deleted
    assert drain(spool) == []
    spool.close()
    assert foreign.read_bytes() == content


# -- replay semantics -------------------------------------------------------------------------


def test_raising_handler_keeps_the_rest_in_order(tmp_path: Path) -> None:
    metrics = Metrics()
    spool = open_spool(tmp_path / "spool", metrics)
    expected: list[tuple[str, bytes]] = []
    for i in range(10):
        kind = "chat" if i % 2 == 0 else "event"  # alternating kinds: one handler call per append
        batch = [f"{i}-{j}".encode() for j in range(4)]
        spool.append(kind, batch)
        expected.extend((kind, e) for e in batch)
    got: list[tuple[str, bytes]] = []
    calls = 0

    def flaky(kind: str, entries: list[bytes]) -> None:
        nonlocal calls
        calls += 1
        if calls == 4:
            raise ConnectionError("targets down")
        got.extend((kind, e) for e in entries)

    with pytest.raises(ConnectionError):
        spool.replay(flaky, 1000)
    assert got == expected[:12]
    assert sample(metrics, "spool_records_total", kind="chat", op="replayed") == 8
    assert spool.pending_bytes() > 0
    assert drain(spool) == expected[12:], "the failed run comes first next time"
    spool.close()


REPLAY_CHILD = r"""
import os, signal, sys
from pathlib import Path
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.stores.spool import Spool
directory, out, kill_at = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
spool = Spool(directory, 1 << 30, Metrics(), segment_bytes=int(sys.argv[4]))
spool.open()
calls = 0
def handler(kind, entries):
    global calls
    with open(out, "ab") as f:  # the target stored it durably ...
        f.write(b",".join(entries) + b"\n")
        f.flush()
        os.fsync(f.fileno())
    calls += 1
    if calls == kill_at:  # ... and the process dies before the spool could ack
        os.kill(os.getpid(), signal.SIGKILL)
while spool.replay(handler, 7):
    pass
"""


@pytest.mark.parametrize("kill_at", [1, 5, 12])
def test_crash_between_handler_and_ack_redelivers_and_never_loses(tmp_path: Path, kill_at: int) -> None:
    directory = tmp_path / "spool"
    spool = open_spool(directory, Metrics(), segment_bytes=600)
    everything: list[bytes] = []
    for i in range(40):
        batch = [f"e{i:02d}.{j}".encode() for j in range(3)]
        spool.append("event", batch)
        everything.extend(batch)
    spool.close()
    assert len(segments(directory)) > 3
    out = tmp_path / "delivered"
    child = run_child(REPLAY_CHILD, str(directory), str(out), str(kill_at), "600")
    assert child.returncode == -signal.SIGKILL, child.stderr
    runs = [line.split(b",") for line in out.read_bytes().splitlines()]
    assert len(runs) == kill_at
    before = [e for run in runs[:-1] for e in run]

    spool = open_spool(directory, Metrics())
    after = [e for _, e in drain(spool)]
    spool.close()
    assert after[:len(runs[-1])] == runs[-1], "the unacked run is delivered again"
    assert before + after == everything, "and nothing acked before it is delivered twice or lost"


def test_append_does_not_wait_for_a_slow_handler(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool", Metrics())
    spool.append("chat", [b"first"])
    entered, release, appended = threading.Event(), threading.Event(), threading.Event()
    got: list[bytes] = []

    def slow(kind: str, entries: list[bytes]) -> None:
        entered.set()
        assert release.wait(10)
        got.extend(entries)

    def append_second() -> None:
        spool.append("chat", [b"second"])
        appended.set()

    replayer = threading.Thread(target=spool.replay, args=(slow,), name="test-slow-replay")
    replayer.start()
    appender = threading.Thread(target=append_second, name="test-appender")
    try:
        assert entered.wait(5)
        appender.start()
        assert appended.wait(5), "append blocked behind the handler"
    finally:
        release.set()
        replayer.join(10)
        appender.join(10)
    got.extend(e for _, e in drain(spool))
    assert got == [b"first", b"second"]
    spool.close()


# -- bounds and failures -----------------------------------------------------------------------


def test_size_cap_refuses_whole_batches_and_counts_them(tmp_path: Path) -> None:
    metrics = Metrics()
    spool = open_spool(tmp_path / "spool", metrics, max_bytes=2000)
    accepted: list[bytes] = []
    refused: SpoolError | None = None
    for i in range(100):
        batch = [f"{i}-{j}".encode().ljust(40, b"!") for j in range(5)]  # 5 * 49 = 245 bytes
        try:
            spool.append("chat", batch)
        except SpoolError as exc:
            refused = exc
            break
        accepted.extend(batch)
    assert refused is not None and refused.reason == "full"
    assert len(accepted) == 40 and spool.pending_bytes() == 40 * 49
    assert sample(metrics, "spool_lost_total", kind="chat", reason="full") == 5
    spool.append("event", [b"small"])  # a smaller batch still fits under the cap
    with pytest.raises(SpoolError):
        spool.append("event", [b"z" * 100] * 3)
    assert sample(metrics, "spool_lost_total", kind="event", reason="full") == 3
    spool.close()
    spool = open_spool(tmp_path / "spool", Metrics(), max_bytes=2000)
    assert drain(spool) == [("chat", e) for e in accepted] + [("event", b"small")]
    spool.append("chat", [b"room again"])  # replay freed the cap
    assert drain(spool) == [("chat", b"room again")]
    spool.close()


def test_failed_fsync_is_never_reported_durable_nor_replayed(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "spool"
    metrics = Metrics()
    spool = open_spool(directory, metrics)
    spool.append("chat", [b"a1", b"a2"])
    [seg] = segments(directory)
    size_before = seg.stat().st_size
    calls = 0

    def broken_fsync(fd: int) -> None:
        nonlocal calls
        calls += 1
        raise OSError(errno.EIO, "injected EIO")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(SpoolError) as failed:
        spool.append("chat", [b"b1", b"b2", b"b3"])
    monkeypatch.undo()
    assert failed.value.reason == "io" and calls >= 1
    assert sample(metrics, "spool_lost_total", kind="chat", reason="io") == 3
    assert seg.stat().st_size == size_before, "the bytes of the failed batch are cut off"
    spool.append("chat", [b"c1"])
    assert len(segments(directory)) == 2, "after a failed fsync the file is sealed, not reused"
    spool.close()
    spool = open_spool(directory, Metrics())
    assert drain(spool) == [("chat", b"a1"), ("chat", b"a2"), ("chat", b"c1")]
    spool.close()


def test_failed_fsync_of_a_new_segment_leaves_no_file(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "spool"
    metrics = Metrics()
    spool = open_spool(directory, metrics)

    def broken_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "injected EIO")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(SpoolError) as failed:
        spool.append("event", [b"x"])
    monkeypatch.undo()
    assert failed.value.reason == "io"
    assert sample(metrics, "spool_lost_total", kind="event", reason="io") == 1
    assert segments(directory) == []
    spool.append("event", [b"y"])
    spool.close()
    spool = open_spool(directory, Metrics())
    assert drain(spool) == [("event", b"y")]
    spool.close()


FILL_CHILD = r"""
import errno, json, resource, signal, sys
from pathlib import Path
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.stores.spool import Spool, SpoolError
directory, mode, segment_bytes = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
if mode == "fsize":
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
    limit = 48 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
metrics = Metrics()
spool = Spool(directory, 1 << 30, metrics, segment_bytes=segment_bytes)
spool.open()
appended, error = [], None
for i in range(100000):
    try:
        spool.append("event", [f"{i}:{j}:".encode() + b"y" * 300 for j in range(10)])
    except SpoolError as exc:
        cause = exc.__cause__
        error = [exc.reason, errno.errorcode.get(getattr(cause, "errno", 0) or 0, str(cause)), i]
        break
    appended.append(i)
lost = metrics.registry.get_sample_value("spool_lost_total", {"kind": "event", "reason": "io"})
got = []
while spool.replay(lambda kind, entries: got.extend(e.decode() for e in entries)):
    pass
spool.append("event", [b"after"])  # the drain freed the disk (or the file limit is per file)
spool.close()
print(json.dumps({"appended": appended, "error": error, "lost": lost, "got": got}))
"""


def _check_fill(directory: Path, mode: str, segment_bytes: int, expect_errno: str) -> None:
    child = run_child(FILL_CHILD, str(directory), mode, str(segment_bytes))
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout)
    appended: list[int] = result["appended"]
    assert result["error"] is not None and result["error"][:2] == ["io", expect_errno], result["error"]
    failed = result["error"][2]
    assert len(appended) > 3 and failed == appended[-1] + 1
    assert result["lost"] == 10, "the refused batch is counted, entry by entry"
    assert result["got"] == [f"{i}:{j}:" + "y" * 300 for i in appended for j in range(10)], \
        "every earlier record replays after the failure; nothing of the failed batch"
    spool = open_spool(directory, Metrics())
    assert drain(spool) == [("event", b"after")], "the spool still takes appends, durably"
    spool.close()


@pytest.fixture
def tiny_filesystem(tmp_path: Path) -> Iterator[Path | None]:
    """A 256 KiB tmpfs (a real ENOSPC), or None where mounting is not permitted."""
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    mount = shutil.which("mount")
    done = mount is not None and subprocess.run(
        [mount, "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(mountpoint)],
        capture_output=True).returncode == 0
    if not done:
        warnings.warn("cannot mount a tmpfs here (not root or no CAP_SYS_ADMIN): the disk-full test "
                      "falls back to RLIMIT_FSIZE (EFBIG)", stacklevel=1)
        yield None
        return
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def test_disk_full_is_reported_counted_and_the_spool_stays_readable(
        tmp_path: Path, tiny_filesystem: Path | None) -> None:
    if tiny_filesystem is not None:
        _check_fill(tiny_filesystem / "spool", "tmpfs", 64 * 1024, "ENOSPC")
    else:
        _check_fill(tmp_path / "spool", "fsize", 1 << 20, "EFBIG")


def test_file_size_limit_is_reported_counted_and_the_spool_stays_readable(tmp_path: Path) -> None:
    _check_fill(tmp_path / "spool", "fsize", 1 << 20, "EFBIG")


# -- concurrency and the replayer worker --------------------------------------------------------


def test_concurrent_appenders_and_replayer_deliver_each_record_once(tmp_path: Path) -> None:
    metrics = Metrics()
    spool = open_spool(tmp_path / "spool", metrics, segment_bytes=32 * 1024)
    got: list[tuple[str, bytes]] = []
    got_lock = threading.Lock()
    pause = threading.Event()

    def handler(kind: str, entries: list[bytes]) -> None:
        pause.wait(0.001)  # a target with some latency, so appends and replays interleave
        with got_lock:
            got.extend((kind, e) for e in entries)

    replayer = SpoolReplayer(spool, handler, metrics, interval_secs=0.005, batch_records=64)
    replayer.start()
    threads_n, batches_n = 4, 150
    sent = [0] * threads_n

    def appender(t: int) -> None:
        rng = random.Random(t)
        kind = "chat" if t % 2 else "event"
        for _ in range(batches_n):
            n = rng.randint(1, 20)
            spool.append(kind, [f"t{t}:{sent[t] + j}:".encode() + b"p" * rng.randint(0, 200)
                                for j in range(n)])
            sent[t] += n

    threads = [threading.Thread(target=appender, args=(t,), name=f"test-append-{t}")
               for t in range(threads_n)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
            assert not th.is_alive()
        total = sum(sent)
        assert wait_until(lambda: len(got) >= total and spool.pending_bytes() == 0, 30), \
            f"{len(got)} of {total} replayed"
    finally:
        replayer.request_stop()
        assert replayer.join(5)
    spool.close()
    per_thread: dict[int, list[int]] = {t: [] for t in range(threads_n)}
    for kind, entry in got:
        t_s, seq, _ = entry.split(b":", 2)
        t = int(t_s[1:])
        assert kind == ("chat" if t % 2 else "event")
        per_thread[t].append(int(seq))
    for t in range(threads_n):
        assert per_thread[t] == list(range(sent[t])), f"thread {t}: each record once, in order"
    written = sum(sample(metrics, "spool_records_total", kind=k, op="written") for k in ("chat", "event"))
    replayed = sum(sample(metrics, "spool_records_total", kind=k, op="replayed") for k in ("chat", "event"))
    assert written == replayed == sum(sent)
    assert sample(metrics, "worker_errors_total", worker="spool-replayer") == 0


def test_replayer_waits_out_an_outage_quietly_then_drains(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    spool = open_spool(tmp_path / "spool", metrics)
    for i in range(20):
        spool.append("chat", [f"m{i}".encode()])
    failures = 0
    got: list[bytes] = []

    def handler(kind: str, entries: list[bytes]) -> None:
        nonlocal failures
        if failures < 5:
            failures += 1
            raise ConnectionError("redis and the database are down")
        got.extend(entries)

    caplog.set_level(logging.DEBUG, logger="lumio_ingestd")
    replayer = SpoolReplayer(spool, handler, metrics, interval_secs=0.01, batch_records=3)
    replayer.start()
    try:
        assert wait_until(lambda: len(got) == 20, 10)
    finally:
        replayer.request_stop()
        assert replayer.join(5)
    spool.close()
    assert got == [f"m{i}".encode() for i in range(20)]
    down = [r for r in caplog.records if "targets unavailable" in r.getMessage()]
    assert len(down) == 5
    assert [r.levelno for r in down] == [logging.INFO] + [logging.DEBUG] * 4, "one info line per outage"
    assert not any(r.exc_info for r in caplog.records), "no traceback per tick"
    assert any("targets are back" in r.getMessage() for r in caplog.records)
    assert sample(metrics, "worker_errors_total", worker="spool-replayer") == 0


def test_replayer_stops_promptly(tmp_path: Path) -> None:
    metrics = Metrics()
    spool = open_spool(tmp_path / "spool", metrics)
    spool.append("event", [b"e"])
    got: list[bytes] = []
    replayer = SpoolReplayer(spool, lambda kind, entries: got.extend(entries), metrics, interval_secs=60)
    replayer.start()
    try:
        assert wait_until(lambda: got == [b"e"] and replayer.turns >= 1, 5)
    finally:
        started = time.monotonic()
        replayer.request_stop()
        assert replayer.join(5)
    assert time.monotonic() - started < 1.0, "a 60 s interval must not delay the stop"
    spool.close()
