"""Reconnect storms.

Forced reconnects of a Twitch socket (4000 closes and dropped connections
alternating), each right after the new session subscribed: every one of those
sessions was healthy, so each reconnect waits the minimum backoff, not a
growing one. Nothing sent between them is lost or doubled, and file
descriptors, threads and RSS stay flat. `LUMIO_STORM_RECONNECTS` (default 100)
sets how many.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import tracemalloc
from pathlib import Path

from lumio_ingestd.devkit.standins.twitch import StandinSession, TwitchStandin
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.base import Source, SourceClosed
from lumio_ingestd.sources.twitch.helix import Subscription
from support import dbname_of
from support import twitch_frames as tf
from support.harness.servers import PostgresServer, wait_until
from support.twitch import make_rig

RECONNECTS = int(os.environ.get("LUMIO_STORM_RECONNECTS", "100"))
#: Set LUMIO_STORM_TRACEMALLOC=1 to print where memory grew (by file) after the first 10.
TRACE = bool(os.environ.get("LUMIO_STORM_TRACEMALLOC"))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _drop(session: StandinSession) -> None:
    """The TCP connection dies without a close frame."""
    sock: socket.socket = session.conn.socket
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def test_forced_reconnects_of_healthy_sessions_wait_the_minimum_and_leak_nothing(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    with TwitchStandin(min_keepalive=1) as fake:
        rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, fake)
        try:
            src = rig.source(subscriptions=(Subscription("channel.chat.message", "1"),))
            src.reconnect_min_secs = 0.05
            src.reconnect_max_secs = 30.0  # a growing backoff would show at once
            src.start()
            session = fake.wait_session(1)
            assert fake.wait_for(lambda: len(session.subscriptions) == 1, 10)
            sent: list[str] = []
            gaps: list[float] = []
            baseline: tuple[int, int, int] | None = None
            traced: tracemalloc.Snapshot | None = None
            started = time.monotonic()
            for n in range(2, RECONNECTS + 2):
                mid = f"storm-{n}"
                fake.notify("channel.chat.message", tf.chat_event(mid), session=session)
                sent.append(mid)
                cut = time.monotonic()
                if n % 2:
                    _drop(session)
                else:
                    fake.close_session(session, 4000, "storm")
                session = fake.wait_session(n, timeout=10)
                assert fake.wait_for(lambda s=session: len(s.subscriptions) == 1, 10)  # type: ignore[misc]
                gaps.append(time.monotonic() - cut)
                assert gaps[-1] < 5.0, f"reconnect {n - 1} took {gaps[-1]:.1f}s"
                if n == 11:
                    assert wait_until(lambda: set(sent) <= set(rig.chat_ids()), 10)
                    baseline = (_fds(), threading.active_count(), _rss_kib())
                    if TRACE:
                        tracemalloc.start()
                        traced = tracemalloc.take_snapshot()
            took = time.monotonic() - started
            assert wait_until(lambda: set(sent) <= set(rig.chat_ids()), 15)
            assert rig.chat_ids() == {mid: 1 for mid in sent}  # exactly once
            assert baseline is not None
            fds, threads, rss = _fds(), threading.active_count(), _rss_kib()
            print(f"\n{RECONNECTS} forced reconnects in {took:.1f}s (slowest {max(gaps):.2f}s); "
                  f"after the first 10: fds {baseline[0]} -> {fds}, threads {baseline[1]} -> "
                  f"{threads}, RSS {baseline[2]} -> {rss} KiB")
            if TRACE:
                assert traced is not None
                grown = tracemalloc.take_snapshot().compare_to(traced, "filename")
                tracemalloc.stop()
                for stat in grown[:8]:
                    print(f"  {stat.size_diff / 1024:+.0f} KiB  {stat.traceback[0].filename}")
                ours = sum(st.size_diff for st in grown if "/lumio_ingestd/" in st.traceback[0].filename
                           and "/standins/" not in st.traceback[0].filename)
                print(f"  daemon code (lumio_ingestd without the stand-ins): {ours / 1024:+.0f} KiB")
            assert fds - baseline[0] <= 4
            assert threads - baseline[1] <= 2
            assert rss - baseline[2] < 30 * 1024
            assert rig.value("worker_errors_total", worker=src.name) == 0
        finally:
            rig.close()


class _Flaky(Source):
    """A source whose sessions fail before (or after) being healthy, on demand."""

    platform = "test"

    def __init__(self) -> None:
        super().__init__("source-test-flaky", Metrics())
        self.healthy_after_connect = True
        self.fail_connect = False

    def connect(self) -> None:
        if self.fail_connect:
            raise OSError("refused")
        if self.healthy_after_connect:
            self.mark_healthy()

    def read_once(self) -> None:
        raise SourceClosed("dropped")

    def close(self) -> None:
        pass


def test_only_attempts_failing_before_healthy_grow_the_backoff() -> None:
    # Healthy sessions lost one after the other: always the minimum.
    src2 = _Flaky()
    src2.reconnect_min_secs, src2.reconnect_max_secs = 1.0, 60.0
    src2.stable_after_secs = 3600.0
    healthy = [_cycle(src2) for _ in range(10)]
    assert healthy == [1.0] * 10
    # Sessions that never become healthy grow it (full jitter: the ceiling doubles).
    src2.healthy_after_connect = False
    src2._rng.seed(1)
    unhealthy = [_cycle(src2) for _ in range(8)]
    assert max(unhealthy) > 8.0
    # Connect failures grow it too; one healthy session resets it.
    src2.fail_connect = True
    assert src2.run_once() >= 1.0
    src2.fail_connect = False
    src2.healthy_after_connect = True
    assert _cycle(src2) == 1.0


def _cycle(src: _Flaky) -> float:
    """One connect and one loss; the backoff the loss asked for."""
    assert not src.connected
    return src.run_once()
