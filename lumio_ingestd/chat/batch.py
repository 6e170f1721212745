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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import rediskeys
from ..db.errors import Classified, Kind, classify
from ..db.pool import Pool
from ..metrics import Metrics
from ..model import EntryError
from ..outage import Outage, describe_db_error
from ..quarantine import quarantine_entry
from .decode import entry_row
from .lists import ChatLists, ClaimLost
from .store import DB_ERRORS, Row, stageable, store_rows_isolating

log = logging.getLogger(__name__)

Failpoint = Callable[[str], None]


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
    inserted: int  # rows this batch newly inserted
    quarantined: int


def store_batch(lists: ChatLists, pool: Pool, metrics: Metrics, *, account: int, inflight: str,
                entries: Sequence[bytes], deadline: float, failpoint: Failpoint = no_failpoint,
                step: str = "chat.flush") -> BatchOutcome:
    """Store a claimed batch, then quarantine its culprits and delete `inflight`.

    Raises BatchDeferred when the database failed in a way a retry may fix
    (the batch stays in flight), and REDIS_ERRORS from the final step
    (committed but still in flight: the next try re-inserts nothing).
    """
    rows: list[Row[bytes]] = []
    quarantine: list[bytes] = []
    for raw in entries:
        if stageable(raw):  # PostgreSQL reads it; Python never decodes it
            rows.append((raw, raw, True))
            continue
        try:
            row, repaired = entry_row(raw)
        except EntryError:
            quarantine.append(quarantine_entry(raw, "undecodable", None))
            continue
        if repaired:  # an entry written by something that skipped the edge
            metrics.chat_sanitized.inc()
        rows.append((raw, row, False))
    try:
        inserted, culprits = store_rows_isolating(pool, rows, deadline)
    except DB_ERRORS as exc:
        raise BatchDeferred(exc, classify(exc)) from exc
    failpoint(f"{step}.inserted")
    for raw, verdict in culprits:
        quarantine.append(quarantine_entry(raw, verdict.reason, verdict.sqlstate))
    try:
        lists.finish(inflight, rediskeys.chat_quarantine(account), quarantine)
    except ClaimLost as exc:
        # Another process with our instance id adopted the list: it finishes it
        # (our insert was idempotent; its quarantine is its own).
        log.error("chat: %s", exc)
        return BatchOutcome(stored=len(rows) - len(culprits), inserted=inserted, quarantined=0)
    failpoint(f"{step}.deleted")
    if quarantine:
        metrics.chat_quarantined.inc(len(quarantine))
    return BatchOutcome(stored=len(rows) - len(culprits), inserted=inserted,
                        quarantined=len(quarantine))


def record_db_failure(metrics: Metrics, outage: Outage, cause: BaseException, verdict: Classified) -> None:
    """Log (once per outage) and count a retryable database failure."""
    if verdict.kind is Kind.ENVIRONMENTAL:
        metrics.db_environmental_errors.inc()
    outage.failed(describe_db_error(cause, verdict))
