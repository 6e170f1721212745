"""Event durability: from a source's hands to a committed `events` row.

- `store`: the idempotent insert of one event and its child rows (advisory
  lock + bounded EXISTS on the external id, else ON CONFLICT on the key).
- `deadletter`: the Redis side: park, crash-safe claims into per-instance
  in-flight lists, put-back, quarantine moves (Lua/MULTI, one hash tag).
- `persist`: `EventIngest.persist_event` (inline, else park, else spool, else
  counted lost), the fail-fast `insert_event`, and the spool replay handler.
- `retry`: `EventRetryWorker`, the leader-gated replay of parked events.
"""

from lumio_ingestd.events.persist import EventIngest, event_spool_handler
from lumio_ingestd.events.retry import EventRetryWorker, PassReport
from lumio_ingestd.model import PersistResult

__all__ = ["EventIngest", "EventRetryWorker", "PassReport", "PersistResult", "event_spool_handler"]
