"""The insert probe: finds out when the database answers again, so live inserts need not.

While the event path's breaker (db/breaker.py) is open, the sources park
every event without trying the database; something else has to notice when
it is back. The retry worker does when it commits a replay, but only on the
replica holding the drain lease, and only every `retry_interval_secs`. This
worker runs on every replica: every `interval_secs` while the breaker is
open it makes one canary insert into `events` and rolls it back
(`EventIngest.probe`), bounded like an inline insert. When it goes through
the breaker closes and the next event is inserted inline again. A probe that
hangs on a black-holed database holds this thread, never a socket's.

A canary write rather than `SELECT 1`: a table locked by a migration or a
revoked grant answers a SELECT and still refuses every event.

Nothing durable: the canary is rolled back.
"""

from __future__ import annotations

from lumio_ingestd.events.persist import EventIngest
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.worker import STOP_GRACE_SECS, IntervalWorker

#: How often an open breaker is probed: events park meanwhile, so this is at most how long
#: the inline path parks after the database is back.
PROBE_INTERVAL_SECS = 1.0


class InsertProbe(IntervalWorker):
    # A probe is bounded like an insert (a few seconds); the margin is the watchdog's.
    max_turn_secs = 30.0

    def __init__(self, ingest: EventIngest, metrics: Metrics, *,
                 interval_secs: float = PROBE_INTERVAL_SECS, name: str = "event-probe") -> None:
        super().__init__(name, metrics, interval_secs)
        self._ingest = ingest
        self.probes = 0

    def tick(self) -> None:
        if self._ingest.breaker.open:
            self.probes += 1
            self._ingest.probe()

    def wake(self) -> None:
        # A probe hanging on a black-holed database must not eat the shutdown budget.
        self._ingest.cut_calls_of(self.ident, STOP_GRACE_SECS)
