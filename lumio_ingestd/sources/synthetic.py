"""A synthetic source: steady made-up chat and events, enabled only by configuration.

For load tests, demos and the daemon's own shutdown tests. It behaves like a
platform source: chat goes through the source's in-memory persistence queue
(`ChatQueue`, pushed to Redis in batches), events go through `persist_event`
one at a time. Ids are deterministic, `syn-RUN-SEQ` with SEQ counting from 1:
chat message SEQ has message id `syn-RUN-SEQ`, and every `event_every`-th
message also makes an event whose external id is the same string. So a test
that reads the final line can check that each of them is stored exactly once.

On stop, `final()` drains the queue before the worker reports stopped, and
logs one line with the totals (`synthetic: stopped run=... chat=N events=M
...`). No chat text is logged. What is durable when a message counts as
generated: it is in the queue, which `final()` hands to Redis, the database
or the spool; an event counts once `persist_event` returned.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from lumio_ingestd.config import Config, SyntheticConfig
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import ChatMessage, PlatformEvent
from lumio_ingestd.sources import Built, SourceDeps
from lumio_ingestd.sources.interfaces import ChatQueueLike
from lumio_ingestd.worker import Worker

log = logging.getLogger("lumio_ingestd.sources.synthetic")

PLATFORM = "synthetic"
EVENT_TYPE = "synthetic.tip"
# Longest burst one turn makes after a stall, so one turn stays short.
_MAX_PER_TURN = 2000




def message_id(run_id: str, seq: int) -> str:
    return f"syn-{run_id}-{seq}"


class SyntheticSource(Worker):
    max_turn_secs = 30.0

    def __init__(self, cfg: SyntheticConfig, queue: ChatQueueLike,
                 persist_event: Callable[[PlatformEvent], Any], metrics: Metrics,
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__("source-synthetic", metrics)
        self.run_id = cfg.run_id or secrets.token_hex(4)
        self._rate = cfg.rate_per_sec
        self._accounts = cfg.accounts
        self._event_every = cfg.event_every
        self._queue = queue
        self._persist_event = persist_event
        self._clock = clock
        self._started: float | None = None
        self.seq = 0  # the last chat message generated
        self.events = 0  # events whose persist_event returned
        self.event_failures = 0  # events whose persist_event raised
        self._delay = min(0.05, max(0.005, 1.0 / self._rate)) if self._rate > 0 else 1.0

    def run_once(self) -> float:
        now = self._clock()
        if self._started is None:
            self._started = now
            log.info("synthetic: started run=%s rate=%g/s accounts=%s event_every=%d",
                     self.run_id, self._rate, ",".join(map(str, self._accounts)), self._event_every)
        due = min(_MAX_PER_TURN, int((now - self._started) * self._rate) - self.seq)
        for _ in range(max(0, due)):
            if self.stop_event.is_set():
                break
            self._emit_one()
        self._queue.poll()
        return self._delay

    def _emit_one(self) -> None:
        seq = self.seq + 1
        ident = message_id(self.run_id, seq)
        account = self._accounts[seq % len(self._accounts)]
        now = datetime.now(UTC)
        self._queue.add(ChatMessage.create(
            platform=PLATFORM, account_id=account, message_id=ident, created_at=now,
            user_id=f"u{seq % 97}", user_login=f"viewer{seq % 97}", display_name=f"Viewer{seq % 97}",
            text=f"synthetic message {seq}"))
        self.seq = seq
        if seq % self._event_every == 0:
            event = PlatformEvent.new(account_id=account, platform=PLATFORM, type=EVENT_TYPE,
                                      external_id=ident, created_at=now,
                                      payload={"run": self.run_id, "seq": seq, "amount": seq % 100})
            try:
                self._persist_event(event)
            except Exception:
                self.event_failures += 1
                raise
            self.events += 1

    def final(self) -> None:
        # What is still in memory goes to Redis (or the database, or the spool)
        # before this worker reports stopped.
        try:
            self._queue.drain()
        finally:
            log.info("synthetic: stopped run=%s chat=%d events=%d event_failures=%d event_every=%d",
                     self.run_id, self.seq, self.events, self.event_failures, self._event_every)


def build(cfg: Config, deps: SourceDeps) -> Built:
    """The synthetic source, when `[synthetic] rate_per_sec` is above 0."""
    built = Built()
    if cfg.synthetic.rate_per_sec > 0:
        built.sources.append(SyntheticSource(cfg.synthetic, deps.chat_queue("source-synthetic"),
                                             deps.persist_event, deps.metrics))
    return built
