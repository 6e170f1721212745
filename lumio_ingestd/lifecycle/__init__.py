"""The long-running database work: retention, GDPR erasure and
export, account dissolution, and the startup backfill. Each runs with the
statement limit lifted for its own transactions only (`Pool.begin_unbounded`)
while the rest of the pool keeps its `statement_timeout`."""
