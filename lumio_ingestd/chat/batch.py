"""One claimed chat batch, from its in-flight list to committed rows.

Shared by the flusher and the dead-letter drain. The batch is already in an
in-flight list owned by the caller (see `lists.claim`); here it is decoded,
stored with poison isolation, and only after the commit are its culprits
quarantined and the in-flight list deleted, in one atomic step. A process
killed anywhere in between leaves the batch in the in-flight list, and the
repeat is a no-op for the rows already committed.

`failpoint(step + ".inserted")` runs after the commit and before the delete,
`failpoint(step + ".deleted")` after the delete: the crash tests kill a
process exactly there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from lumio_ingestd.chat.decode import copy_line, entry_row
from lumio_ingestd.chat.lists import ChatLists, ClaimLost
from lumio_ingestd.chat.store import DB_ERRORS, Row, stageable, store_rows_isolating
from lumio_ingestd.db.errors import classify, describe_db_error
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import Classified, EntryError, Kind
from lumio_ingestd.outage import Outage
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.quarantine import quarantine_entry

log = logging.getLogger("lumio_ingestd.chat.batch")

Failpoint = Callable[[str], None]


#: Rows the flusher makes between two looks at the event gate: ~1 ms of work.
STEP_ASIDE_ROWS = 64


def no_failpoint(step: str) -> None:
    """The production failpoint: does nothing."""


class BatchDeferred(Exception):
    """The database could not take the batch now (a retryable failure); it stays in flight."""

    def __init__(self, cause: BaseException, verdict: Classified) -> None:
        super().__init__(verdict.reason)
        self.cause = cause
        self.verdict = verdict


@dataclass(frozen=True)
class BatchOutcome:
    stored: int  # messages of the batch now in the database (new or already there)


@dataclass(frozen=True)
class Claimed:
    """One account's batch, claimed into its in-flight list `inflight`."""

    account: int
    inflight: str
    entries: Sequence[bytes]


def store_batch(lists: ChatLists, pool: Pool, metrics: Metrics, *, account: int, inflight: str,
                entries: Sequence[bytes], deadline: float, failpoint: Failpoint = no_failpoint,
                step: str = "chat.flush") -> BatchOutcome:
    """Store a claimed batch, then quarantine its culprits and delete `inflight`.

    Raises BatchDeferred when the database failed in a way a retry may fix
    (the batch stays in flight), and REDIS_ERRORS from the final step
    (committed but still in flight: the next try re-inserts nothing).
    """
    outcomes: list[BatchOutcome] = []
    store_batches(lists, pool, metrics, [Claimed(account, inflight, entries)], deadline=deadline,
                  finished=lambda _, outcome: outcomes.append(outcome), failpoint=failpoint, step=step)
    return outcomes[0]


def store_batches(lists: ChatLists, pool: Pool, metrics: Metrics, batches: Sequence[Claimed], *,
                  deadline: float, finished: Callable[[Claimed, BatchOutcome], None],
                  failpoint: Failpoint = no_failpoint, step: str = "chat.flush",
                  step_aside: Callable[[], None] | None = None) -> None:
    """`store_batch` for several accounts' batches at once: one transaction (one COPY)
    for all of them, then each one's culprits quarantined and in-flight list deleted.

    Many accounts with a few messages each (many sockets, a short flush
    interval) cost one commit instead of one each, and the flusher thread one
    wait on the database instead of one per account, each of which it had to
    win the interpreter lock back from every source thread after. Poison
    isolation splits the whole set; a culprit goes to its own account's
    quarantine. All or nothing on a retryable failure: every batch stays in
    flight (BatchDeferred). `finished` is called for each batch once its
    in-flight list is gone (so a Redis error half-way, raised, leaves the
    batches before it reported and the rest in flight, to be resumed).
    `step_aside` is called every `STEP_ASIDE_ROWS` rows (eventgate.py).
    """
    quarantine: list[list[bytes]] = [[] for _ in batches]
    sent = [0] * len(batches)  # rows each batch sends to the database

    def rows() -> Iterator[Row[tuple[int, bytes]]]:
        # Made while the COPY sends them (`store_rows_isolating`): all of them
        # before it returns, so `sent` and `quarantine` are whole after it.
        made = 0
        for index, batch in enumerate(batches):
            for raw in batch.entries:
                made += 1
                if step_aside is not None and made % STEP_ASIDE_ROWS == 0:
                    step_aside()
                # Straight into the table as a COPY line where that is cheap and
                # provably the same row, else PostgreSQL takes the columns out.
                line = copy_line(raw)
                if line is not None or stageable(raw):
                    sent[index] += 1
                    yield ((index, raw), raw, True) if line is None else ((index, raw), line, False)
                    continue
                try:
                    row, repaired = entry_row(raw)
                except EntryError:
                    quarantine[index].append(quarantine_entry(raw, "undecodable", None))
                    continue
                if repaired:  # an entry written by something that skipped the edge
                    metrics.chat_sanitized.inc()
                sent[index] += 1
                yield ((index, raw), row, False)

    try:
        _, culprits = store_rows_isolating(pool, rows(), deadline)
    except DB_ERRORS as exc:
        raise BatchDeferred(exc, classify(exc)) from exc
    failpoint(f"{step}.inserted")
    for (index, raw), verdict in culprits:
        quarantine[index].append(quarantine_entry(raw, verdict.reason, verdict.sqlstate))
        sent[index] -= 1
    results = lists.finish_many([(batch.inflight, rediskeys.chat_quarantine(batch.account),
                                  quarantine[index]) for index, batch in enumerate(batches)])
    error: Exception | None = None
    for index, (batch, result) in enumerate(zip(batches, results, strict=True)):
        if isinstance(result, ClaimLost):
            # Another process with our instance id adopted the list: it finishes it
            # (our insert was idempotent; its quarantine is its own).
            log.error("chat: %s", result)
            finished(batch, BatchOutcome(stored=sent[index]))
        elif result is not None:
            error = error or result  # committed, still in flight: the next try re-inserts nothing
        else:
            if quarantine[index]:
                metrics.chat_quarantined.inc(len(quarantine[index]))
            finished(batch, BatchOutcome(stored=sent[index]))
    if error is not None:
        raise error
    failpoint(f"{step}.deleted")


def record_db_failure(metrics: Metrics, outage: Outage, cause: BaseException, verdict: Classified) -> None:
    """Log (once per outage) and count a retryable database failure."""
    if verdict.kind is Kind.ENVIRONMENTAL:
        metrics.db_environmental_errors.inc()
    outage.failed(describe_db_error(cause, verdict))
