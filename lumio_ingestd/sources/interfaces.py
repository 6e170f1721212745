"""What a source talks to: the protocols the runtime's implementations fulfil.

A source (a platform socket, a webhook receiver, the stream-status poller)
hands chat and events over and keeps its state through these; it is given
implementations at construction (`runtime/build.py`) and never imports a
store class, a Redis client or a database pool. The implementations live in
chat/, events/ and stores/ and match these protocols by shape, without
importing this module. `tests/architecture/test_layering.py` imports every module
under sources/ in a fresh interpreter and fails if redis or psycopg2 loads.

Nothing durable lives here: each protocol says what is durable when its
implementation returns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from lumio_ingestd.model import (
    ChatMessage,
    Classified,
    GapKey,
    HealOutcome,
    HealWindow,
    OpenSession,
    PersistResult,
    PlatformEvent,
    StreamChange,
)

if TYPE_CHECKING:  # the platforms' own types; their packages import this module
    from lumio_ingestd.sources.jetstream.protocol import ApplyResult, Commit
    from lumio_ingestd.sources.seventv.protocol import SetState

#: Persist one event: inline insert, else park, else spool (events/persist.py). Durable as its
#: `PersistResult` says.
PersistEvent = Callable[[PlatformEvent], PersistResult]
#: Buffer one chat message in Redis, else insert it, else spool it (chat/ingest.py); the outcome.
PersistChat = Callable[[ChatMessage], str]



class ChatQueueLike(Protocol):
    """A source's in-memory chat persistence queue (chat/ingest.py `ChatQueue`).

    `add` may hand a full batch over; `poll` hands over what has waited long
    enough; `drain` hands over everything (a source's `final()`). Durable when
    a hand-over returns: in Redis, the database or the spool (or counted lost).
    """

    def add(self, msg: ChatMessage, now: float | None = None) -> None: ...

    def poll(self, now: float | None = None) -> None: ...

    def drain(self) -> object: ...


class Alerts(Protocol):
    """The live alert publisher (events/alerts.py): fire and forget, never blocks the caller."""

    def publish(self, ev: PlatformEvent) -> None: ...

    def on_the_way(self) -> AbstractContextManager[None]:
        """Around an event's persistence and publish: chat steps aside meanwhile (eventgate.py)."""
        ...


class SessionStore(Protocol):
    """`stream_sessions` (stores/sessions.py): opened and closed by stream changes.

    `apply` returns True when committed; a failed write is kept in memory and
    retried by `retry_pending`, in order.
    """

    def apply(self, account_id: int, change: StreamChange) -> bool: ...

    def stream_before(self, account_id: int, platform: str, at: datetime) -> str | None: ...

    def open_streams(self, platform: str, accounts: list[int]) -> dict[int, OpenSession]: ...

    def retry_pending(self) -> None: ...

    def drop_pending(self) -> None: ...


class OpenSessions(Protocol):
    """The part of `SessionStore` the stream-status poller reads."""

    def open_streams(self, platform: str, accounts: list[int]) -> dict[int, OpenSession]: ...


class SeenIds(Protocol):
    """Webhook delivery ids already handled (stores/seen.py): a hint, not the guarantee."""

    def seen(self, message_id: str) -> bool: ...

    def mark(self, message_id: str) -> None: ...


class FrameSink(Protocol):
    """The refused-frame file (stores/refused_frames.py): a refused frame's bytes, for people."""

    def add(self, platform: str, reason: str, raw: bytes | str, detail: str = "") -> None: ...


class StatsSink(Protocol):
    """Per-minute viewer statistics (events/streamstats.py `StreamStats`)."""

    def add(self, account_id: int, platform: str, viewers: int, *, title: str | None = None,
            category: str | None = None, at: datetime | None = None) -> None: ...

    def flush_due(self, now: datetime | None = None) -> int: ...

    def flush_all(self, budget_secs: float | None = None) -> int: ...

    def cut_calls_of(self, thread_ident: int | None) -> None: ...


class SetStateStore(Protocol):
    """A 7TV account's followed emote set (stores/seventv.py). `save` is a compare-and-set on
    `expected_version`: False when another writer moved it first. Durable when it returns True."""

    def load(self, account_id: int) -> SetState | None: ...

    def save(self, account_id: int, state: SetState, expected_version: int | None) -> bool: ...


class JetstreamStore(Protocol):
    """Jetstream records and cursor (stores/jetstream.py): each call one bounded transaction.
    Durable when `apply` returns: the batch and the cursor, together. `classify` says what a
    failed call's exception means (retry, refuse, or fix the environment)."""

    def load_cursor(self, name: str, *, timeout: float) -> int | None: ...

    def apply(self, commits: Sequence[Commit], *, cursor_name: str, cursor_us: int | None,
              isolate: bool, timeout: float) -> ApplyResult: ...

    def classify(self, exc: BaseException) -> Classified: ...


class HeldCopies(Protocol):
    """A durable copy of a held gift bomb (events/held.py `HeldGifts`)."""

    def keep(self, ev: PlatformEvent) -> bool: ...

    def done(self, ev: PlatformEvent) -> None: ...


class GapLedger(Protocol):
    """The gaps ledger (events/gaps.py `GapLedgerWorker`): when a source's paths are up.

    `up` and `down` only note the change in memory and return at once (the ledger's own
    thread records it in Redis, finds the gap and writes `source_gaps`); `stopped` records
    the stop time in Redis before it returns (bounded), so the next process's gap starts
    exactly there. Times are epoch milliseconds.
    """

    def up(self, keys: Sequence[GapKey], at_ms: int) -> None: ...

    def down(self, keys: Sequence[GapKey], at_ms: int) -> None: ...

    def stopped(self, keys: Sequence[GapKey], at_ms: int) -> None: ...


class Healer(Protocol):
    """Reads a platform's history for a gap's window and stores what it holds through
    `persist_event` (never a live alert). Raises `HealRetry` or `HealFailed` (model.py)."""

    def heal(self, window: HealWindow) -> HealOutcome: ...
