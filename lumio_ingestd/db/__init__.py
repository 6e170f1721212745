"""The TimescaleDB layer: connection pool, error classifier, migrations.

Nothing here holds data of its own: what is durable is what a transaction
opened through `Pool.transaction()` or `Pool.begin_unbounded()` committed.
"""
