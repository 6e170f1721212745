"""Chat durability: from a source's hands to a committed `chat_messages` row.

- `store`: the idempotent batch insert (COPY; on a conflict, COPY into a
  staging table and one `INSERT ... ON CONFLICT DO NOTHING`) and poison
  isolation by bisection.
- `lists`: the Redis side: atomic claims into per-instance in-flight lists,
  dead-letter moves, orphan recovery, instance heartbeats (Lua, one hash tag).
- `decode`: reading entries back, with a shortcut for those that need no repair.
- `batch`: one claimed batch from decode to commit to delete.
- `outage`: log a dependency's outage once, and its end.
- `ingest`: `ChatIngest.buffer_or_persist` (Redis, else the database, else the
  spool, else counted lost) and `ChatQueue`, a source's bounded in-memory queue.
- `flusher`: `ChatFlusher`, the worker that drains the buffers every
  `flush_interval_secs`.
- `deadletter`: `ChatDeadLetterDrain`, the leader-gated replay of dead letters.
"""
