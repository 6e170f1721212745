"""Writing chat batches to `chat_messages`: idempotent, fast, and poison-proof.

`insert_chat` COPYs a batch into a per-connection temporary staging table and
moves it into `chat_messages` with one `INSERT ... SELECT ... ON CONFLICT DO
NOTHING`: one round trip for the data instead of a multi-row VALUES per page,
and a replay of rows already stored inserts nothing. The unique key of
`chat_messages` is (account_id, platform, message_id, created_at), so the same
message twice (even inside one batch) is one row. Because a batch of new
messages conflicts with nothing, it is first COPYed straight into the table
under a savepoint, which halves the database's work; only a batch that meets a
unique violation takes the staging path (see `insert_encoded`).

Version-2 chat entries (what `ChatMessage.to_entry` writes: values already
as `ChatMessage.create` leaves them) need no Python at all on their way in:
`insert_entries` COPYs them as they came out of Redis into a `jsonb` staging
table, and PostgreSQL takes the columns out (`jsonb_to_record`) in the
`INSERT ... SELECT ... ON CONFLICT DO NOTHING`. `stageable` says which entries
may take that path (a few byte scans, no parse); the rest (version 1, or a
value that needs repair) are decoded and written as COPY lines as before.

`store_isolating` is for batches that may hold a row the database refuses (a
permanent SQLSTATE, or a value the driver cannot encode): it splits the batch
in halves, each in its own transaction, until the culprits stand alone, stores
everything else and returns the culprits with their classification. A
transient failure is raised at once; the caller keeps the whole batch.
`store_rows_isolating` may be given its rows as a generator (the flusher and
the dead-letter drain do): the first transaction's COPY then makes them a
piece at a time as psycopg2 reads them, so PostgreSQL stores one piece while
the next is made, and every row is made before it returns or raises a
database error (the halves need them all); a failure while making them is
`RowsNotMade`, which is not split or stored at all.

What is durable when these return: `insert_chat`, nothing until the caller's
transaction commits; `store_isolating`, every row of the batch except the
returned culprits (each part commits on its own, so a raise may leave some
parts committed: the replay of those is a no-op).
"""

from __future__ import annotations

import io
import itertools
import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Generic, Protocol, TypeVar

import psycopg2
import psycopg2.errors

from lumio_ingestd.db.errors import DatabaseUnavailable, classify
from lumio_ingestd.db.pool import Cursor, Pool
from lumio_ingestd.model import (
    CHAT_COLUMNS,
    CHAT_ENTRY_VERSION,
    MAX_ENTRY_BYTES,
    ChatMessage,
    Classified,
    Kind,
)

T = TypeVar("T")

#: A row on its way to `chat_messages`: (item, payload, staged). The payload is
#: an `encode_row` COPY line, or (staged) a version-2 entry for `insert_entries`.
#: The item is what a refusal is reported as (a message, a raw entry).
Row = tuple[T, bytes, bool]

#: Exceptions a database write may raise that `classify` knows how to judge.
#: (PoolReentryError, a programming error, is deliberately not among them.)
DB_ERRORS: tuple[type[Exception], ...] = (
    psycopg2.Error, DatabaseUnavailable, OSError, ValueError, TypeError)

_COLS = ", ".join(CHAT_COLUMNS)
_STAGING = "lumio_chat_staging"
# ON COMMIT DELETE ROWS empties it at every commit; a rollback of the
# transaction that created it drops it, hence IF NOT EXISTS on every call.
_CREATE_STAGING = (
    f"CREATE TEMP TABLE IF NOT EXISTS {_STAGING} "
    "(LIKE chat_messages INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
)
_COPY = f"COPY {_STAGING} ({_COLS}) FROM STDIN"
_COPY_DIRECT = f"COPY chat_messages ({_COLS}) FROM STDIN"
_SAVEPOINT = "lumio_chat_copy"
# The DELETE ... RETURNING leaves the staging table empty, so a second call in
# the same transaction does not see the first call's rows again.
_MOVE = (
    f"WITH moved AS (DELETE FROM {_STAGING} RETURNING {_COLS}) "
    f"INSERT INTO chat_messages ({_COLS}) SELECT {_COLS} FROM moved "
    "ON CONFLICT DO NOTHING"
)
_COPY_CHUNK = 256 * 1024
# Rows made while they are sent (`store_rows_isolating`) are made this much at a
# time: 16-64 KiB measured +22 % against the whole batch first, 256 KiB no gain.
_STREAM_CHUNK = 32 * 1024

_ENTRIES = "lumio_chat_entries"
_CREATE_ENTRIES = f"CREATE TEMP TABLE IF NOT EXISTS {_ENTRIES} (e jsonb NOT NULL) ON COMMIT DELETE ROWS"
# CSV with two control characters as delimiter and quote: an entry without
# line breaks and without those two bytes (see `stageable`) is one field,
# copied byte for byte (CSV gives a backslash no meaning, unlike COPY text).
_COPY_ENTRIES = f"COPY {_ENTRIES} (e) FROM STDIN WITH (FORMAT csv, DELIMITER E'\\x1f', QUOTE E'\\x1e')"
_TIME_SHAPE = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$"
_MOVE_ENTRIES = (
    f"WITH moved AS (DELETE FROM {_ENTRIES} RETURNING e) "
    f"INSERT INTO chat_messages ({_COLS}) "
    "SELECT r.account_id, r.platform, r.message_id, "
    # Only the one shape `format_time` writes: PostgreSQL would also take
    # 'yesterday' or 'infinity'. Anything else is NULL, refused (23502).
    f"CASE WHEN r.created_at ~ '{_TIME_SHAPE}' THEN r.created_at::timestamptz END, "
    "coalesce(r.user_id, ''), coalesce(r.user_login, ''), coalesce(r.display_name, ''), "
    "coalesce(r.text, ''), coalesce(r.extras, '{}') "
    "FROM moved, jsonb_to_record(moved.e) AS r(account_id bigint, platform text, "
    "message_id text, created_at text, user_id text, user_login text, display_name text, "
    "text text, extras jsonb) ON CONFLICT DO NOTHING"
)
# What both JSON encoders (fastjson, orjson or not) write first for a chat entry.
_STAGED_PREFIX = b'{"v":%d,' % CHAT_ENTRY_VERSION
# Escapes that decode to a character `ChatMessage.create` would replace (NUL,
# a surrogate): such an entry takes the repairing path.
NEEDS_REPAIR = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")

# COPY text format: backslash, newline, carriage return and tab are escaped;
# no column is ever NULL, so `\N` never needs to be written.
_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})
# One encoder, built once: json.dumps() with options builds a new one per call.
_EXTRAS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def extras_json(extras: object) -> str:
    return _EXTRAS.encode(extras) if extras else "{}"


def encode_row(msg: ChatMessage) -> bytes:
    """One COPY text line for `msg`, in `CHAT_COLUMNS` order.

    Raises UnicodeEncodeError for a lone surrogate (only possible when a
    message was built without `ChatMessage.create`).
    """
    return encode_fields((str(int(msg.account_id)), msg.platform, msg.message_id,
                          msg.created_at.isoformat(), msg.user_id, msg.user_login,
                          msg.display_name, msg.text, extras_json(msg.extras)))


def encode_fields(fields: tuple[str, ...]) -> bytes:
    """One COPY text line of the column values in `CHAT_COLUMNS` order."""
    # One escape pass over the whole line: the fields are joined with NUL,
    # which a repaired value never holds, and the NULs become the tabs. Each
    # `in` is one C scan; most lines need none of the replacements.
    line = "\x00".join(fields)
    if line.count("\x00") != len(fields) - 1:
        # A NUL in a value: escape field by field; the server refuses the NUL itself.
        return "\t".join(f.translate(_ESCAPES) for f in fields).encode("utf-8") + b"\n"
    if "\\" in line:
        line = line.replace("\\", "\\\\")
    if "\n" in line:
        line = line.replace("\n", "\\n")
    if "\r" in line:
        line = line.replace("\r", "\\r")
    if "\t" in line:
        line = line.replace("\t", "\\t")
    return line.replace("\x00", "\t").encode("utf-8") + b"\n"


def insert_chat(cur: Cursor, msgs: Sequence[ChatMessage]) -> int:
    """Insert `msgs` in the caller's transaction; returns the rows newly inserted."""
    return insert_encoded(cur, [encode_row(m) for m in msgs])


def insert_encoded(cur: Cursor, rows: Sequence[bytes]) -> int:
    """Insert rows made by `encode_row`; returns the rows newly inserted.

    First a plain COPY straight into `chat_messages` under a savepoint: for a
    batch of new messages (the normal case) that is all, at the speed of
    COPY itself. Only when it meets a unique violation (a replay, a resumed
    batch, the same message twice) does it roll back to the savepoint and take
    the staging path, whose ON CONFLICT DO NOTHING skips what is stored.
    """
    if not rows:
        return 0
    payload = b"".join(rows)
    return _copy_lines(cur, io.BytesIO(payload), lambda: rows, _COPY_CHUNK)


def _copy_lines(cur: Cursor, source: _Readable, every_line: Callable[[], Sequence[bytes]],
                size: int) -> int:
    """`insert_encoded` of the COPY lines that psycopg2 reads from `source`, `size` bytes
    at a time; `every_line()` gives them all again (from the first) for the staging path."""
    cur.execute(f"SAVEPOINT {_SAVEPOINT}")
    try:
        cur.copy_expert(_COPY_DIRECT, source, size=size)
    except psycopg2.errors.UniqueViolation:
        cur.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
    else:
        return len(every_line())
    cur.execute(_CREATE_STAGING)
    cur.copy_expert(_COPY, io.BytesIO(b"".join(every_line())), size=_COPY_CHUNK)
    cur.execute(_MOVE)
    return max(0, cur.rowcount)


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...

    def readline(self, size: int = -1, /) -> bytes: ...


class RowsNotMade(Exception):
    """Making the rows of a batch failed (a bug): not a database error, so the batch is
    neither split nor finished; the caller keeps it whole."""


class _MadeWhileSent(Generic[T]):
    """Rows made while a COPY sends them: psycopg2 `read`s the COPY lines a piece
    at a time, and each piece is made only then, so that PostgreSQL stores one
    piece while the next is made. Every row made is kept (`rows`); staged ones
    are sent after the COPY (`insert_entries`). Whatever making them raises is
    kept and raised as RowsNotMade, now and by every later call, whatever
    psycopg2 makes of it."""

    def __init__(self, rows: Iterable[Row[T]]) -> None:
        self.rows: list[Row[T]] = []
        self._todo: Iterator[Row[T]] = iter(rows)
        self._failed: Exception | None = None

    def any(self) -> bool:
        """Whether there is a row at all (the first one is made now, and sent first)."""
        for row in self._made():
            self._todo = itertools.chain((row,), self._todo)
            return True
        return False

    def _made(self) -> Iterator[Row[T]]:
        """The rows not made yet, as they are made."""
        if self._failed is not None:
            raise RowsNotMade(f"making the rows failed: {self._failed!r}") from self._failed
        try:
            # Not `yield from`: a read that stops early closes this generator, and
            # `yield from` would close the rows' own generator with it.
            for row in self._todo:  # noqa: UP028
                yield row
        except Exception as exc:
            self._failed = exc
            raise RowsNotMade(f"making the rows failed: {exc!r}") from exc

    def _rows(self) -> Iterator[Row[T]]:
        """`_made`, each row kept in `rows` as it is made."""
        rows = self.rows
        for row in self._made():
            rows.append(row)
            yield row

    def read(self, size: int = -1, /) -> bytes:
        pieces: list[bytes] = []
        held = 0
        for _, payload, staged in self._rows():
            if staged:
                continue
            pieces.append(payload)
            held += len(payload)
            if held >= size > 0:
                break
        return b"".join(pieces)

    def readline(self, size: int = -1, /) -> bytes:
        """One COPY line (the file protocol; psycopg2 `read`s a COPY FROM)."""
        for _, payload, staged in self._rows():
            if not staged:
                return payload
        return b""

    def every_row(self) -> list[Row[T]]:
        """All of them: the ones not made yet are made now."""
        for _ in self._rows():
            pass
        return self.rows

    def lines(self) -> list[bytes]:
        return [payload for _, payload, staged in self.every_row() if not staged]

    def insert(self, cur: Cursor) -> int:
        """`insert_rows` of them all; returns the rows newly inserted."""
        inserted = _copy_lines(cur, self, self.lines, _STREAM_CHUNK)
        return inserted + insert_entries(cur, [payload for _, payload, staged in self.rows if staged])


def stageable(raw: bytes) -> bool:
    """Whether `raw` may go to PostgreSQL unread (`insert_entries`).

    A version-2 entry, within `MAX_ENTRY_BYTES`, holding no byte that would
    end or split its CSV field (line breaks, the delimiter, the quote) and no
    escape of a character the edge would have repaired. Anything else that is
    malformed (not JSON, a missing key, a bad time) is refused by PostgreSQL
    and isolated like any refused row.
    """
    return (raw.startswith(_STAGED_PREFIX) and len(raw) <= MAX_ENTRY_BYTES
            and b"\n" not in raw and b"\r" not in raw and b"\x1e" not in raw and b"\x1f" not in raw
            and (b"\\u" not in raw or NEEDS_REPAIR.search(raw) is None))


def insert_entries(cur: Cursor, entries: Sequence[bytes]) -> int:
    """Insert `stageable` entries in the caller's transaction; returns the rows newly inserted."""
    if not entries:
        return 0
    cur.execute(_CREATE_ENTRIES)
    cur.copy_expert(_COPY_ENTRIES, io.BytesIO(b"\n".join(entries) + b"\n"), size=_COPY_CHUNK)
    cur.execute(_MOVE_ENTRIES)
    return max(0, cur.rowcount)


def insert_rows(cur: Cursor, rows: Iterable[Row[T]]) -> int:
    """Insert COPY lines and staged entries alike; returns the rows newly inserted."""
    made = _MadeWhileSent(rows)
    return made.insert(cur) if made.any() else 0


def store_isolating(pool: Pool, msgs: Sequence[ChatMessage], deadline: float,
                    ) -> tuple[int, list[tuple[ChatMessage, Classified]]]:
    """Store `msgs`, isolating rows that can never be stored.

    Returns (rows newly inserted, culprits with their classification). Each
    transaction is bounded by `deadline` (monotonic). A retryable failure
    (transient or environmental) is raised unchanged.
    """
    culprits: list[tuple[ChatMessage, Classified]] = []
    encoded: list[Row[ChatMessage]] = []
    for msg in msgs:
        # Screened one by one: a value the driver cannot even encode needs no
        # round trip to be found.
        try:
            encoded.append((msg, encode_row(msg), False))
        except UnicodeError as exc:
            reason = f"value cannot be encoded ({type(exc).__name__})"
            culprits.append((msg, Classified(Kind.PERMANENT, None, reason)))
    inserted, refused = store_rows_isolating(pool, encoded, deadline)
    return inserted, culprits + refused


def store_rows_isolating(pool: Pool, rows: Iterable[Row[T]], deadline: float,
                         ) -> tuple[int, list[tuple[T, Classified]]]:
    """`store_isolating` for rows already encoded or staged (`Row`).

    The rows may be made while the first transaction sends them (a generator:
    it is consumed once, a piece at a time as the COPY reads, so PostgreSQL
    stores one piece while the next is made; measured +22 % against making
    the whole batch first). Every row is made before this returns or raises a
    database error. The culprits are returned as their items (a message, a
    raw entry).
    """
    made = _MadeWhileSent(rows)
    if not made.any():
        return 0, []
    try:
        with pool.transaction(deadline=deadline) as cur:
            inserted = made.insert(cur)
    except DB_ERRORS as exc:
        every = made.every_row()
        verdict = classify(exc)
        if verdict.retryable:
            raise
        if len(every) == 1:
            return 0, [(every[0][0], _with_message(verdict, exc))]
        mid = len(every) // 2
        return _isolate(pool, [every[mid:], every[:mid]], deadline)
    return inserted, []


def _isolate(pool: Pool, stack: list[Sequence[Row[T]]], deadline: float,
             ) -> tuple[int, list[tuple[T, Classified]]]:
    """Store the parts on `stack` (the last first), each refused part split in halves until
    its culprits stand alone; returns (rows newly inserted, culprits)."""
    culprits: list[tuple[T, Classified]] = []
    inserted = 0
    # Depth-first, first half first: parts are committed in batch order.
    while stack:
        part = stack.pop()
        try:
            with pool.transaction(deadline=deadline) as cur:
                inserted += insert_rows(cur, part)
        except DB_ERRORS as exc:
            verdict = classify(exc)
            if verdict.retryable:
                raise
            if len(part) == 1:
                culprits.append((part[0][0], _with_message(verdict, exc)))
                continue
            mid = len(part) // 2
            stack.append(part[mid:])
            stack.append(part[:mid])
    return inserted, culprits


def _with_message(verdict: Classified, exc: BaseException) -> Classified:
    """The verdict with the server's primary message, for the quarantine entry.

    (It may quote the refused value, so it goes to the quarantine, never to a log.)
    """
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    if not primary:
        lines = str(exc).strip().splitlines()
        primary = lines[0] if lines else None
    text = primary
    if not text or text in verdict.reason:
        return verdict
    return Classified(verdict.kind, verdict.sqlstate, f"{verdict.reason}: {text[:500]}")
