"""Applying the versioned SQL migrations shipped in `lumio_ingestd.db.migrations`.

Migrations run on a dedicated connection, never a pooled one, with
`statement_timeout = 0` (DDL on a large table may legitimately take long) and
`lock_timeout` (a DDL statement queued behind a long query would block every
later query on that table). A lock timeout is retried on a fixed interval up
to a budget, then the run fails. A session advisory lock serialises migrators:
a second replica waits for the first on the same budget instead of racing it.
The connection is closed afterwards, so neither setting reaches the pool.

A migration whose first line is `-- migrate: online` holds only index builds,
run outside a transaction so that a large table stays writable while they run
(`lumio_ingestd.db.online_index`); its ledger row is written once every index
is built, and a build is safe to run again after a crash before that row.

Durable when `migrate()` returns: every migration it reports as applied, each
committed in its own transaction together with its ledger row (an online one:
its indexes, then its ledger row).
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from dataclasses import dataclass
from importlib import resources

import psycopg2
import psycopg2.errors
import psycopg2.extensions

from lumio_ingestd.config import TimescaleConfig
from lumio_ingestd.db import online_index
from lumio_ingestd.db.pool import connect_kwargs

log = logging.getLogger("lumio_ingestd.db.migrate")

# Any fixed 64-bit number shared by every migrator of this schema.
MIGRATOR_LOCK_KEY = 0x6C756D696F6D6967  # "lumiomig"

_LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

#: Earlier contents (sha256) of shipped migrations, by version, that a database may have
#: applied: a file changed since only in what leaves such a database the same counts as
#: the same migration. 2 and 5 told whether TimescaleDB is preloaded by reading
#: shared_preload_libraries, which a role without superuser (or pg_read_all_settings)
#: may not read; they now read a setting TimescaleDB's loader defines.
EARLIER_CHECKSUMS: dict[int, frozenset[str]] = {
    2: frozenset({"5286a8666dadb2f88e0b3eda3397f7707d0256018bd1ae936e3a609f8ebef370"}),
    5: frozenset({"78d6cdc339d3b9b4a85114645b9ddf3339a77d6f3497e7f5146bb58700837161"}),
}


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    @property
    def online(self) -> bool:
        """Index builds outside a transaction (`online_index`), not one transaction."""
        return online_index.is_online(self.sql)


class MigrationError(Exception):
    """A migration run failed; nothing after the last committed migration applied."""


class MigrationLockTimeout(MigrationError):
    """The lock budget ran out: another session kept a lock we need."""


def packaged_migrations() -> list[Migration]:
    found = []
    for entry in resources.files("lumio_ingestd.db.migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            m = Migration(int(match.group(1)), match.group(2), entry.read_text("utf-8"))
            if m.online:
                try:
                    online_index.parse(m.sql)
                except ValueError as exc:
                    raise MigrationError(f"{entry.name}: {exc}") from exc
            found.append(m)
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two packaged migrations share a version: {versions}")
    return found


@dataclass
class _Budget:
    retries: int
    interval: float
    stop: threading.Event
    used: int = 0

    def spend(self, what: str) -> None:
        """Wait one interval before the next try, or fail when the budget is gone."""
        if self.used >= self.retries:
            raise MigrationLockTimeout(
                f"{what}: lock not available after {self.retries} retries "
                f"every {self.interval:g}s; another session holds it"
            )
        self.used += 1
        log.warning("%s: lock not available, retry %d/%d in %gs",
                    what, self.used, self.retries, self.interval)
        if self.stop.wait(self.interval):
            raise MigrationError("migration interrupted")


def migrate(cfg: TimescaleConfig, *, migrations: list[Migration] | None = None,
            stop: threading.Event | None = None) -> list[Migration]:
    """Apply what is missing; return the migrations applied by this run."""
    todo_all = packaged_migrations() if migrations is None else migrations
    budget = _Budget(cfg.migration_retries, cfg.migration_retry_interval_secs,
                     stop or threading.Event())
    conn = psycopg2.connect(cfg.dsn, **connect_kwargs(
        cfg, application_name="lumio-ingestd/migrate", statement_timeout_secs=0,
        extra_options=f"-c lock_timeout={int(cfg.migration_lock_timeout_secs * 1000)}",
    ))
    try:
        conn.autocommit = True
        _lock_migrator(conn, budget)
        try:
            return _apply(conn, todo_all, budget)
        finally:
            if not conn.closed:
                with conn.cursor() as cur:
                    cur.execute("SELECT pg_advisory_unlock(%s)", (MIGRATOR_LOCK_KEY,))
    finally:
        conn.close()


def _lock_migrator(conn: psycopg2.extensions.connection, budget: _Budget) -> None:
    while True:
        try:
            with conn.cursor() as cur:
                # lock_timeout bounds this wait like any other lock wait.
                cur.execute("SELECT pg_advisory_lock(%s)", (MIGRATOR_LOCK_KEY,))
            return
        except psycopg2.errors.LockNotAvailable:
            budget.spend("migrator lock (another migrate is running)")


def _apply(conn: psycopg2.extensions.connection, wanted: list[Migration],
           budget: _Budget) -> list[Migration]:
    with conn.cursor() as cur:
        cur.execute(_LEDGER_DDL)
        cur.execute("SELECT version, name, checksum FROM schema_migrations")
        applied = {row[0]: (row[1], row[2]) for row in cur.fetchall()}
    for m in wanted:
        if m.version in applied and applied[m.version][1] != m.checksum \
                and applied[m.version][1] not in EARLIER_CHECKSUMS.get(m.version, frozenset()):
            raise MigrationError(
                f"migration {m.version:04d}_{applied[m.version][0]} was applied with other "
                "contents than the file shipped now; refusing to continue"
            )
    done = []
    for m in wanted:
        if m.version in applied:
            continue
        label = f"migration {m.version:04d}_{m.name}"
        if m.online:
            _apply_online(conn, m, label, budget)
            log.info("applied %s", label)
            done.append(m)
            continue
        while True:
            try:
                conn.autocommit = False
                with conn.cursor() as cur:
                    cur.execute(m.sql)
                    cur.execute(
                        "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                        (m.version, m.name, m.checksum),
                    )
                conn.commit()
                break
            except psycopg2.errors.LockNotAvailable:
                conn.rollback()
                budget.spend(label)
            except psycopg2.Error as exc:
                conn.rollback()
                raise MigrationError(f"{label} failed: {exc.pgcode or ''} {exc}".strip()) from exc
            finally:
                if not conn.closed:
                    conn.autocommit = True
        log.info("applied %s", label)
        done.append(m)
    return done


def _apply_online(conn: psycopg2.extensions.connection, m: Migration, label: str,
                  budget: _Budget) -> None:
    """Build each index of an online migration (in autocommit), then write its ledger row.

    A lock timeout retries the build that timed out, on the same budget as any
    migration (its half-built index is dropped and built again)."""
    for index in online_index.parse(m.sql):
        while True:
            try:
                online_index.build(conn, index)
                break
            except psycopg2.errors.LockNotAvailable:
                budget.spend(f"{label} ({index.name})")
            except online_index.IndexBuildError as exc:
                raise MigrationError(f"{label} failed: {exc}") from exc
            except psycopg2.Error as exc:
                raise MigrationError(f"{label} failed: {exc.pgcode or ''} {exc}".strip()) from exc
    try:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                        (m.version, m.name, m.checksum))
    except psycopg2.Error as exc:
        raise MigrationError(f"{label}: its indexes are built, its ledger row failed: {exc}") from exc
