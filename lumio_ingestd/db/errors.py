"""Classifying database failures into transient, permanent and environmental.

The classifier is the single place that decides whether a failed write may be
retried (parked, buffered, left for the next flush) or must be refused. It is
table-driven: an exact SQLSTATE first, then its two-character class, then the
driver's exception class for errors that never reached the server.

Environmental errors (a missing table, column, function or grant) are handled
like transient ones by callers, so data waits for a migration or a GRANT
instead of being refused; they also raise an alert metric. This deliberately
differs from the original specification, which rejects every class-42 error
(docs/architecture.rst, "The database layer").
"""

from __future__ import annotations

import socket

import psycopg2

from lumio_ingestd.model import Classified, Kind


class DatabaseUnavailable(Exception):
    """Our own transient failure: no connection in time, or a deadline passed."""


class PoolTimeout(DatabaseUnavailable):
    """Every pooled connection stayed busy for the whole acquire timeout."""


class DeadlineExceeded(DatabaseUnavailable):
    """An operation outlived its deadline; its connection was cut."""


class PoolReentryError(RuntimeError):
    """A thread asked a pool for a second connection while holding one.

    This is a programming error, not a database failure: with every connection
    held, the second acquire would wait for the first, which never returns.
    """


# Exact SQLSTATEs win over their class.
_EXACT: dict[str, Kind] = {
    "40001": Kind.TRANSIENT,  # serialization_failure
    "40P01": Kind.TRANSIENT,  # deadlock_detected
    "40003": Kind.TRANSIENT,  # statement_completion_unknown: idempotent replay resolves it
    "55P03": Kind.TRANSIENT,  # lock_not_available
    "55006": Kind.TRANSIENT,  # object_in_use
    "57014": Kind.TRANSIENT,  # query_canceled (statement_timeout)
    "57P01": Kind.TRANSIENT,  # admin_shutdown
    "57P02": Kind.TRANSIENT,  # crash_shutdown
    "57P03": Kind.TRANSIENT,  # cannot_connect_now
    "57P05": Kind.TRANSIENT,  # idle_session_timeout
    "25006": Kind.TRANSIENT,  # read_only_sql_transaction: a failover in progress
    "25P03": Kind.TRANSIENT,  # idle_in_transaction_session_timeout
    # TimescaleDB's "tuple decompression limit exceeded by operation": a write
    # touched more rows of compressed chunks than one transaction may
    # decompress. The same write fails the same way however often it is
    # retried, so it is not an outage (class 53 would say so).
    "53400": Kind.PERMANENT,  # configuration_limit_exceeded
    "42P01": Kind.ENVIRONMENTAL,  # undefined_table
    "42703": Kind.ENVIRONMENTAL,  # undefined_column
    "42883": Kind.ENVIRONMENTAL,  # undefined_function
    "42P10": Kind.ENVIRONMENTAL,  # invalid_column_reference (ON CONFLICT without its index)
    "42501": Kind.ENVIRONMENTAL,  # insufficient_privilege
    "3D000": Kind.ENVIRONMENTAL,  # invalid_catalog_name (database missing)
    "3F000": Kind.ENVIRONMENTAL,  # invalid_schema_name
    "28000": Kind.ENVIRONMENTAL,  # invalid_authorization_specification
    "28P01": Kind.ENVIRONMENTAL,  # invalid_password
}

_BY_CLASS: dict[str, Kind] = {
    "08": Kind.TRANSIENT,  # connection exception
    "40": Kind.TRANSIENT,  # transaction rollback
    "53": Kind.TRANSIENT,  # insufficient resources (disk full, too many connections)
    "57": Kind.TRANSIENT,  # operator intervention
    "58": Kind.TRANSIENT,  # system error (I/O)
    "21": Kind.PERMANENT,  # cardinality violation (a key twice in one upsert)
    "22": Kind.PERMANENT,  # data exception
    "23": Kind.PERMANENT,  # integrity constraint violation
    "42": Kind.PERMANENT,  # syntax error or access rule violation (the syntax kind)
    "54": Kind.PERMANENT,  # program limit exceeded (value too large to index)
}


def classify(exc: BaseException) -> Classified:
    """Say whether `exc`, raised by a database call, may be retried."""
    sqlstate = getattr(exc, "pgcode", None)
    if isinstance(sqlstate, str) and sqlstate:
        kind = _EXACT.get(sqlstate) or _BY_CLASS.get(sqlstate[:2])
        if kind is not None:
            return Classified(kind, sqlstate, f"SQLSTATE {sqlstate}")
        # An unknown SQLSTATE (XX000, a TimescaleDB internal error...) is
        # retried: every write is idempotent, and the retry paths quarantine
        # what keeps failing, so retrying loses nothing while refusing would.
        return Classified(Kind.TRANSIENT, sqlstate, f"SQLSTATE {sqlstate} (unclassified)")
    if isinstance(exc, DatabaseUnavailable):
        return Classified(Kind.TRANSIENT, None, type(exc).__name__)
    if isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)):
        return Classified(Kind.TRANSIENT, None, "connection lost")
    if isinstance(exc, (socket.timeout, TimeoutError, ConnectionError)):
        return Classified(Kind.TRANSIENT, None, "network")
    # Values the driver refuses before sending: a NUL character (ValueError),
    # a lone surrogate (UnicodeEncodeError), an object it cannot adapt.
    if isinstance(exc, UnicodeError):
        return Classified(Kind.PERMANENT, None, "value cannot be encoded")
    if isinstance(exc, (ValueError, TypeError, psycopg2.DataError, psycopg2.ProgrammingError)):
        return Classified(Kind.PERMANENT, None, f"value refused by the driver: {exc}")
    return Classified(Kind.TRANSIENT, None, f"unclassified {type(exc).__name__}")


def describe_db_error(exc: BaseException, verdict: Classified) -> str:
    """A loggable description of a retryable database failure (no row values)."""
    if verdict.sqlstate:
        diag = getattr(exc, "diag", None)
        primary = getattr(diag, "message_primary", None) if diag is not None else None
        return f"SQLSTATE {verdict.sqlstate}" + (f" ({primary})" if primary else "")
    if isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)):
        # libpq's own messages (connection refused, server closed the connection).
        lines = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {lines[0] if lines else verdict.reason}"
    if isinstance(exc, DatabaseUnavailable):  # our own messages: pool and deadline
        return f"{type(exc).__name__}: {exc}"
    return f"{type(exc).__name__} ({verdict.kind.value})"
