"""Configuration of lumio-ingestd: `/etc/lumio/ingestd.ini` into frozen, typed objects.

This module is the only code that reads the configuration file, secret files
and the environment. `load()` reads them once at start-up, checks every value,
and builds frozen dataclasses (`Config` and one class per section). Those are
passed down to the parts that need them; nothing else looks at files or
`os.environ` for settings. Even here the environment is only the `environ`
argument (`LUMIO_INGESTD_CONFIG` in `resolve_path`, `CREDENTIALS_DIRECTORY`
in `load`), so tests can pass a dict.

The schema is one table, `SCHEMA`: for every key its section, its default as
written in the file, how it is parsed and what it means. The loader, the
dataclass defaults, the example file (`example_ini()`, shipped as
`etc/lumio/ingestd.ini`) and the README are all made from it, so they cannot
drift apart.

Rules the loader enforces, all problems collected into one `ConfigError`:
unknown sections and keys are errors (a typo must not be silently ignored),
comments go on their own line, every value is type-checked, and secrets are
read only from files, never from the INI file or the environment. A secret
is wrapped in `Secret`, which prints as `***`; no message ever contains one.
"""

from __future__ import annotations

import configparser
import difflib
import hmac
import ipaddress
import os
import re
import socket
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

__all__ = [
    "ACCOUNT_SECTION",
    "DEFAULT_PATH",
    "SCHEMA",
    "SECTION_HELP",
    "AccountConfig",
    "ChatConfig",
    "Config",
    "ConfigError",
    "ConfigProblem",
    "DaemonConfig",
    "EventsConfig",
    "HttpConfig",
    "JetstreamConfig",
    "MetricsConfig",
    "RedisConfig",
    "Secret",
    "Setting",
    "SyntheticConfig",
    "TimescaleConfig",
    "TwitchConfig",
    "example_ini",
    "load",
    "redacted_lines",
    "resolve_path",
]

DEFAULT_PATH: Final = "/etc/lumio/ingestd.ini"
ENV_CONFIG: Final = "LUMIO_INGESTD_CONFIG"
ENV_CREDENTIALS: Final = "CREDENTIALS_DIRECTORY"

# How the per-account section is spelled in SCHEMA and the docs; in a file it
# is `[account.1]`, `[account.2]`, ...
ACCOUNT_SECTION: Final = "account.N"

# A secret file bigger than this is a mistake (a wrong path), not a secret; the
# cap also keeps `password_file = /dev/zero` from hanging the start.
_MAX_SECRET_BYTES: Final = 64 * 1024


# ---------------------------------------------------------------------------
# Secrets and errors


class Secret:
    """A secret string that never prints itself.

    `repr()`, `str()` and f-strings give `***`, so a Secret that ends up in a
    log line, a traceback's locals or a dataclass repr leaks nothing. Call
    `reveal()` only where the value is handed to a client library.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret itself."""
        return self._value

    def __repr__(self) -> str:
        return "***"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        # Constant time, although config comparisons are hardly an oracle.
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    """One thing wrong with the configuration.

    `section` is empty for a problem with the whole file (missing, unparsable),
    `key` is empty for a problem with a whole section (unknown section).
    """

    file: str
    section: str
    key: str
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.section:
            where += f": [{self.section}]"
        if self.key:
            where += f" {self.key}"
        return f"{where}: {self.message}"


class ConfigError(Exception):
    """The configuration is unusable; `problems` lists everything found, in file order."""

    def __init__(self, problems: Iterable[ConfigProblem]) -> None:
        self.problems: tuple[ConfigProblem, ...] = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)

    def __reduce__(self) -> tuple[type[ConfigError], tuple[tuple[ConfigProblem, ...]]]:
        return (ConfigError, (self.problems,))


class _Invalid(Exception):
    """A value does not fit its key. The message says what was expected and what was got."""


# ---------------------------------------------------------------------------
# Value kinds: how the text of one key becomes a typed value, and back.


@dataclass(frozen=True, slots=True)
class _Context:
    """What parsers may consult besides the value: only the environment given to load()."""

    environ: Mapping[str, str]


def _got(raw: str) -> str:
    return f'got "{raw}"' if raw else "got an empty value"


_USERINFO_PASSWORD = re.compile(r"(//[^:/@\s]*:)[^\s]*@")
_QUERY_PASSWORD = re.compile(r"((?:^|[?&;\s])password=)[^&\s]*", re.IGNORECASE)


def _redact(text: str) -> str:
    """Replace the password of a URL (user:PASSWORD@ or ?password=) with ***."""
    text = _USERINFO_PASSWORD.sub(r"\1***@", text)
    return _QUERY_PASSWORD.sub(r"\1***", text)


def _url_has_password(url: str) -> bool:
    return _redact(url) != url


class _Kind:
    """Base of the value kinds. A kind is stateless; one instance serves one key."""

    __slots__ = ()

    def parse(self, raw: str, ctx: _Context) -> Any:
        """The typed value of `raw` (already stripped); raises _Invalid."""
        raise NotImplementedError

    def render(self, value: Any) -> str:
        """The value as it would be written in the file (secrets as ***)."""
        return str(value)

    def show(self, text: str) -> str:
        """`text` made safe for a message or a printout (URL passwords redacted)."""
        return text


_DIGITS = re.compile(r"[0-9]{1,19}")
# At most 9 digits before the point: a wait of more than ~31 years overflows
# threading's TIMEOUT_MAX, and is a typo anyway.
_DECIMAL = re.compile(r"(?:[0-9]{1,9}(?:\.[0-9]*)?|\.[0-9]+)")


@dataclass(frozen=True, slots=True)
class _Int(_Kind):
    minimum: int
    maximum: int = 2**63 - 1
    unit: str = ""

    def expected(self) -> str:
        what = f"a whole number of {self.unit}" if self.unit else "a whole number"
        if self.maximum == 2**63 - 1:
            return f"{what} >= {self.minimum}"
        return f"{what} from {self.minimum} to {self.maximum}"

    def parse(self, raw: str, ctx: _Context) -> int:
        if _DIGITS.fullmatch(raw) and self.minimum <= int(raw) <= self.maximum:
            return int(raw)
        raise _Invalid(f"expected {self.expected()}, {_got(raw)}")


def _format_float(value: float) -> str:
    if value.is_integer():
        return str(int(value))
    text = repr(value)
    if "e" in text:
        text = f"{value:.12f}".rstrip("0").rstrip(".")
    return text


@dataclass(frozen=True, slots=True)
class _Float(_Kind):
    """A decimal number (no exponent, no inf/nan) with a lower bound."""

    minimum: float = 0.0
    inclusive: bool = False
    unit: str = "seconds"

    def parse(self, raw: str, ctx: _Context) -> float:
        if _DECIMAL.fullmatch(raw):
            value = float(raw)
            if value > self.minimum or (self.inclusive and value == self.minimum):
                return value
        bound = ">=" if self.inclusive else ">"
        raise _Invalid(
            f"expected a number of {self.unit} {bound} {_format_float(self.minimum)}, {_got(raw)}"
        )

    def render(self, value: Any) -> str:
        return _format_float(float(value))


@dataclass(frozen=True, slots=True)
class _Choice(_Kind):
    choices: tuple[str, ...]

    def parse(self, raw: str, ctx: _Context) -> str:
        if raw.lower() in self.choices:
            return raw.lower()
        raise _Invalid(f"expected one of {', '.join(self.choices)}, {_got(raw)}")


@dataclass(frozen=True, slots=True)
class _Text(_Kind):
    """A string matching a pattern; empty means None when `optional`, else the empty string."""

    pattern: re.Pattern[str]
    expected: str
    optional: bool = False
    empty_ok: bool = False

    def parse(self, raw: str, ctx: _Context) -> str | None:
        if not raw and self.optional:
            return None
        if (not raw and self.empty_ok) or self.pattern.fullmatch(raw):
            return raw
        raise _Invalid(f"expected {self.expected}, {_got(raw)}")

    def render(self, value: Any) -> str:
        return "" if value is None else str(value)


@dataclass(frozen=True, slots=True)
class _InstanceId(_Kind):
    """Empty means hostname:pid, computed when the config is loaded."""

    # Printable ASCII without space and braces: it goes into Redis key names
    # after the {ACCOUNT} hash tag.
    pattern: re.Pattern[str] = re.compile(r"[!-z|~]{1,200}")
    reserved: re.Pattern[str] = re.compile(r"\.(?:dl|f[1-9][0-9]?)$")

    def parse(self, raw: str, ctx: _Context) -> str:
        if not raw:
            return _default_instance_id()
        if self.pattern.fullmatch(raw):
            if self.reserved.search(raw):
                # chat/lists.py: "ID.dl" and "ID.fN" own the drain's and flush thread N's
                # in-flight lists of instance ID; an instance so named would be taken for them.
                raise _Invalid('expected an id not ending in ".dl" or ".f" and a number (they name '
                              f"this instance's worker lists), {_got(raw)}")
            return raw
        raise _Invalid(
            "expected up to 200 printable ASCII characters without spaces or braces "
            f"(or nothing, for HOSTNAME:PID), {_got(raw)}"
        )


def _default_instance_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class _AbsPath(_Kind):
    def parse(self, raw: str, ctx: _Context) -> Path:
        if raw.startswith("/") and "\0" not in raw:
            return Path(raw)
        raise _Invalid(f"expected an absolute path, {_got(raw)}")


_SHARD = re.compile(r"([0-9]{1,6})/([0-9]{1,6})")


@dataclass(frozen=True, slots=True)
class _Shard(_Kind):
    """INDEX/COUNT -> (index, count, False); `auto` -> (0, 1, True)."""

    def parse(self, raw: str, ctx: _Context) -> tuple[int, int, bool]:
        if raw == "auto":
            return 0, 1, True
        m = _SHARD.fullmatch(raw)
        if m:
            index, count = int(m.group(1)), int(m.group(2))
            if 0 <= index < count:
                return index, count, False
        raise _Invalid(f'expected INDEX/COUNT with 0 <= INDEX < COUNT, like "0/1", or auto, {_got(raw)}')

    def render(self, value: Any) -> str:
        index, count, auto = value
        return "auto" if auto else f"{index}/{count}"


_HOSTNAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


@dataclass(frozen=True, slots=True)
class _Listen(_Kind):
    """HOST:PORT or [IPV6]:PORT -> (host, port); the host is kept without brackets."""

    def parse(self, raw: str, ctx: _Context) -> tuple[str, int]:
        expected = f'expected HOST:PORT with a port from 0 to 65535 (IPv6 as "[::1]:9464"), {_got(raw)}'
        if raw.startswith("["):
            host, sep, port = raw[1:].partition("]:")
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                raise _Invalid(expected) from None
        else:
            host, sep, port = raw.rpartition(":")
            if ":" in host:
                raise _Invalid(f'expected an IPv6 address in brackets, like "[::1]:9464", {_got(raw)}')
            if not _HOSTNAME.fullmatch(host):
                raise _Invalid(expected)
        if not sep or not _DIGITS.fullmatch(port) or int(port) > 65535:
            raise _Invalid(expected)
        return host, int(port)

    def render(self, value: Any) -> str:
        host, port = value
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class _Url(_Kind):
    """A URL with one of `schemes` and a host name."""

    schemes: tuple[str, ...]

    def expected(self) -> str:
        names = [f"{s}://" for s in self.schemes]
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
        return f"a {listed} URL"

    def invalid(self, raw: str, why: str = "") -> _Invalid:
        return _Invalid(f"expected {self.expected()}{why}, {_got(self.show(raw))}")

    def split(self, raw: str) -> Any:
        if not raw or any(c.isspace() for c in raw):
            raise self.invalid(raw)
        try:
            parts = urlsplit(raw)
            _ = parts.port  # raises ValueError on a bad port
        except ValueError:
            raise self.invalid(raw) from None
        if parts.scheme not in self.schemes:
            raise self.invalid(raw)
        return parts

    def parse(self, raw: str, ctx: _Context) -> str:
        if not self.split(raw).hostname:
            raise self.invalid(raw, " with a host")
        return raw

    def show(self, text: str) -> str:
        return _redact(text)


@dataclass(frozen=True, slots=True)
class _RedisUrl(_Url):
    schemes: tuple[str, ...] = ("redis", "rediss", "unix")

    def parse(self, raw: str, ctx: _Context) -> str:
        parts = self.split(raw)
        if parts.scheme == "unix":
            if not parts.path.startswith("/") or parts.hostname:
                raise self.invalid(raw, ' (unix:///path/to/redis.sock)')
        elif not parts.hostname:
            raise self.invalid(raw, " with a host")
        elif parts.path not in ("", "/") and not re.fullmatch(r"/[0-9]{1,5}", parts.path):
            raise self.invalid(raw, " whose path is a database number, like /0")
        return raw


@dataclass(frozen=True, slots=True)
class _Dsn(_Url):
    """A libpq connection URI; the host may be empty (the local socket)."""

    schemes: tuple[str, ...] = ("postgresql", "postgres")

    def parse(self, raw: str, ctx: _Context) -> str:
        self.split(raw)
        return raw


# An NSID (atproto Lexicon id): a reversed domain name plus a name segment.
_NSID = re.compile(
    r"[a-zA-Z](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
    r"(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)+"
    r"\.[a-zA-Z][a-zA-Z0-9]{0,62}"
)
# Jetstream also takes a prefix such as app.bsky.* or app.bsky.graph.*.
_NSID_PREFIX = re.compile(
    r"[a-zA-Z](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
    r"(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)+\.\*"
)
_MAX_COLLECTIONS: Final = 100  # Jetstream's limit on wantedCollections


@dataclass(frozen=True, slots=True)
class _Collections(_Kind):
    """Comma-separated NSIDs -> tuple; empty = every collection."""

    def parse(self, raw: str, ctx: _Context) -> tuple[str, ...]:
        if not raw:
            return ()
        items = tuple(item.strip() for item in raw.split(","))
        for item in items:
            if not (_NSID.fullmatch(item) or _NSID_PREFIX.fullmatch(item)):
                raise _Invalid(
                    "expected comma-separated collection NSIDs like app.bsky.feed.post "
                    f'(or prefixes like app.bsky.*), got "{item}" in "{raw}"'
                    if item
                    else f'expected comma-separated collection NSIDs, got an empty entry in "{raw}"'
                )
        seen: set[str] = set()
        for item in items:
            if item in seen:
                raise _Invalid(f'"{item}" is listed twice')
            seen.add(item)
        if len(items) > _MAX_COLLECTIONS:
            raise _Invalid(
                f"expected at most {_MAX_COLLECTIONS} collections (Jetstream's limit), got {len(items)}"
            )
        return items

    def render(self, value: Any) -> str:
        return ", ".join(value)


@dataclass(frozen=True, slots=True)
class _IdList(_Kind):
    """Comma-separated positive account ids -> tuple of ints (at least one, no repeats)."""

    def parse(self, raw: str, ctx: _Context) -> tuple[int, ...]:
        items = [item.strip() for item in raw.split(",")]
        ids: list[int] = []
        for item in items:
            if not re.fullmatch(r"[1-9][0-9]{0,18}", item) or int(item) >= 2**63:
                raise _Invalid(f"expected comma-separated account ids like 1, 2, 3, {_got(raw)}")
            if int(item) in ids:
                raise _Invalid(f'"{item}" is listed twice')
            ids.append(int(item))
        return tuple(ids)

    def render(self, value: Any) -> str:
        return ", ".join(str(v) for v in value)


_TRUE: Final = ("true", "yes", "on", "1")
_FALSE: Final = ("false", "no", "off", "0")


@dataclass(frozen=True, slots=True)
class _Bool(_Kind):
    def parse(self, raw: str, ctx: _Context) -> bool:
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise _Invalid(f"expected true or false, {_got(raw)}")

    def render(self, value: Any) -> str:
        return "true" if value else "false"


@dataclass(frozen=True, slots=True)
class _Names(_Kind):
    """Comma-separated names -> tuple (at least one, no repeats), each matching `pattern`
    (or, with `choices`, one of them)."""

    expected: str
    pattern: re.Pattern[str] | None = None
    choices: tuple[str, ...] = ()

    def parse(self, raw: str, ctx: _Context) -> tuple[str, ...]:
        items = tuple(item.strip().lower() if self.choices else item.strip() for item in raw.split(","))
        for item in items:
            ok = item in self.choices if self.choices else bool(self.pattern and self.pattern.fullmatch(item))
            if not ok:
                shown = f'"{item}" in "{raw}"' if item else f'an empty entry in "{raw}"'
                raise _Invalid(f"expected comma-separated {self.expected}, got {shown}")
        if len(set(items)) != len(items):
            twice = next(i for i in items if items.count(i) > 1)
            raise _Invalid(f'"{twice}" is listed twice')
        return items

    def render(self, value: Any) -> str:
        return ",".join(value)


def _credential_path(raw: str, ctx: _Context) -> Path:
    """An absolute path as is; a bare name inside $CREDENTIALS_DIRECTORY (systemd LoadCredential=)."""
    if raw.startswith("/"):
        return Path(raw)
    if "/" in raw or raw in (".", ".."):
        raise _Invalid(f'expected an absolute path or a bare credential name (no "/"), {_got(raw)}')
    directory = ctx.environ.get(ENV_CREDENTIALS, "")
    if not directory:
        raise _Invalid(
            f'"{raw}" is a credential name, but ${ENV_CREDENTIALS} is not set; '
            f"give an absolute path, or run under systemd with LoadCredential={raw}:/path/to/file"
        )
    if not directory.startswith("/"):
        raise _Invalid(f'${ENV_CREDENTIALS} must be an absolute path, got "{directory}"')
    return Path(directory) / raw


@dataclass(frozen=True, slots=True)
class _SecretFile(_Kind):
    """A path or credential name -> Secret (the file's content without trailing newlines)."""

    # Twitch's limit for an EventSub webhook secret: 10 to 100 ASCII characters.
    ascii_length: tuple[int, int] | None = None

    def parse(self, raw: str, ctx: _Context) -> Secret | None:
        if not raw:
            return None
        path = _credential_path(raw, ctx)
        try:
            with open(path, "rb") as f:
                data = f.read(_MAX_SECRET_BYTES + 1)
        except OSError as e:
            raise _Invalid(f"cannot read {path}: {e.strerror or type(e).__name__}") from None
        if len(data) > _MAX_SECRET_BYTES:
            raise _Invalid(
                f"{path} is larger than {_MAX_SECRET_BYTES // 1024} KiB; expected a file holding one secret"
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise _Invalid(f"{path} is not UTF-8 text") from None
        text = text.rstrip("\r\n")
        if not text:
            raise _Invalid(f"{path} is empty")
        if self.ascii_length is not None:
            low, high = self.ascii_length
            if not (text.isascii() and low <= len(text) <= high):
                raise _Invalid(f"the secret in {path} must be {low} to {high} ASCII characters")
        return Secret(text)

    def render(self, value: Any) -> str:
        return "" if value is None else "***"


@dataclass(frozen=True, slots=True)
class _ReadableFile(_Kind):
    """A path or credential name -> Path, checked to be readable now (the daemon reads it later)."""

    def parse(self, raw: str, ctx: _Context) -> Path | None:
        if not raw:
            return None
        path = _credential_path(raw, ctx)
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            raise _Invalid(f"cannot read {path}: {e.strerror or type(e).__name__}") from None
        return path

    def render(self, value: Any) -> str:
        return "" if value is None else str(value)


# ---------------------------------------------------------------------------
# The schema


@dataclass(frozen=True, slots=True)
class Setting:
    """One key of the configuration file.

    `default` is the text the key has when it is absent ("" = unset, or
    computed: see `help`); `example` is the text shown in the example file,
    commented out there when `commented`. `fields` are the attributes of the
    section's dataclass that the key fills (two for `shard` and `listen`).
    """

    section: str
    key: str
    default: str
    help: str
    kind: _Kind = field(repr=False, compare=False)
    fields: tuple[str, ...]
    example: str
    commented: bool = False
    secret: bool = False


def _s(
    section: str,
    key: str,
    default: str,
    kind: _Kind,
    help: str,
    *,
    fields: tuple[str, ...] | None = None,
    example: str | None = None,
    commented: bool = False,
) -> Setting:
    return Setting(
        section=section,
        key=key,
        default=default,
        help=help,
        kind=kind,
        fields=fields if fields is not None else (key,),
        example=example if example is not None else default,
        commented=commented,
        secret=isinstance(kind, _SecretFile),
    )


_CREDENTIAL_HELP = (
    "an absolute path, or a bare name looked up in $CREDENTIALS_DIRECTORY "
    "(systemd LoadCredential=). The file holds only the secret; a trailing "
    "newline is dropped."
)
_WS = _Url(("ws", "wss"))
_HTTP = _Url(("http", "https"))
_SECONDS = _Float()
_LISTEN = _Listen()

SECTION_HELP: Final[Mapping[str, str]] = {
    "daemon": "The process itself.",
    "redis": "Redis: the buffer for chat and the dead-letter lists for events.",
    "timescale": "TimescaleDB (or plain PostgreSQL): where chat and events are stored.",
    "chat": "Chat messages: buffered in Redis, written to the database in batches.",
    "events": "Platform events (subs, cheers, raids, ...): inserted at once, parked in Redis on failure.",
    "metrics": "Prometheus metrics, served at /metrics.",
    "http": "Webhooks, the emit API, live alert streams and health checks.",
    "twitch": "Twitch: EventSub over WebSocket and webhooks, Helix, OAuth.",
    "jetstream": "Bluesky Jetstream.",
    "kick": "Kick: the Pusher chat socket, the official webhooks and their subscriptions.",
    "streamelements": "StreamElements: tips and activities over the Astro WebSocket gateway.",
    "seventv": "7TV: emote-set changes over the EventAPI, checked against the REST API.",
    "streamstatus": (
        "Stream status: the live status and viewer count of every account of this shard, "
        "polled from the platforms' APIs (a safety net for missed online/offline events, "
        "and per-minute statistics)."
    ),
    "synthetic": (
        "A synthetic test source: steady made-up chat and events with ids "
        "syn-RUN-SEQ, for load tests and demos. Off unless rate_per_sec is above 0; "
        "never enable it on a production database."
    ),
    ACCOUNT_SECTION: (
        "One section per Lumio account, [account.N] with N the account id "
        "(a positive whole number). A platform is ingested for the account when "
        "its keys are set."
    ),
}

SCHEMA: Final[tuple[Setting, ...]] = (
    # [daemon]
    _s("daemon", "instance_id", "", _InstanceId(),
       "Name of this process in Redis (in-flight lists, heartbeats); unique among "
       "running processes, not ending in .dl or .f and a number (the names of its "
       "workers' lists). Empty = HOSTNAME:PID."),
    _s("daemon", "state_dir", "/var/lib/lumio-ingestd", _AbsPath(),
       "Directory of the local spool, the cursors and the quarantine files; an absolute path."),
    _s("daemon", "log_level", "info", _Choice(("debug", "info", "warning", "error")),
       "Lowest level that is logged: debug, info, warning or error."),
    _s("daemon", "shard", "0/1", _Shard(),
       "This replica's share of the accounts, as INDEX/COUNT: the replica's index "
       "(from 0) and the number of replicas. 0/1 = a single replica. auto = the live "
       "replicas (their lumio:instance heartbeats) split the accounts among themselves "
       "by rendezvous hashing, and move them when one stops, dies or joins.",
       fields=("shard_index", "shard_count", "shard_auto")),
    _s("daemon", "accounts_dir", "/etc/lumio/accounts.d", _AbsPath(),
       "Directory whose .ini files may hold more [account.N] sections (and nothing else); "
       "a missing directory holds none. Read at start and again on SIGHUP, which starts, "
       "stops and restarts the sources of the accounts added, removed and changed."),
    _s("daemon", "spool_max_bytes", "1073741824", _Int(1),
       "Largest size of the local spool, which holds chat and events while Redis "
       "and the database are both down, in bytes."),
    _s("daemon", "shutdown_timeout_secs", "8", _SECONDS,
       "Time a stop may take to hand what is in memory to Redis, flush and spool "
       "the rest, in seconds. Keep it below the unit's TimeoutStopSec."),
    # [redis]
    _s("redis", "url", "redis://127.0.0.1:6379/0", _RedisUrl(),
       "The Redis server: redis://HOST:PORT/DB, rediss:// for TLS, or "
       "unix:///path/to/redis.sock?db=N. Keep the password out of the URL: use password_file."),
    _s("redis", "password_file", "", _SecretFile(),
       "File holding the Redis password: " + _CREDENTIAL_HELP + " Unset = no password.",
       fields=("password",), example="redis_password", commented=True),
    _s("redis", "socket_timeout_secs", "2", _SECONDS,
       "Longest wait for the answer to one Redis command, in seconds."),
    _s("redis", "connect_timeout_secs", "2", _SECONDS,
       "Longest wait for a connection to Redis, in seconds."),
    _s("redis", "cluster", "false", _Bool(),
       "true: url names one node of a Redis Cluster; the client finds the others, follows "
       "MOVED and failovers. Every multi-key operation stays within one account's {ACCOUNT} slot."),
    # [timescale]
    _s("timescale", "dsn", "postgresql://lumio@127.0.0.1:5432/lumio", _Dsn(),
       "The database, as a libpq URI: postgresql://USER@HOST:PORT/DBNAME?PARAM=VALUE. "
       "Keep the password out of it: use password_file."),
    _s("timescale", "password_file", "", _SecretFile(),
       "File holding the database password: " + _CREDENTIAL_HELP + " Unset = no password "
       "(or ~/.pgpass, peer authentication).",
       fields=("password",), example="db_password", commented=True),
    _s("timescale", "pool_size", "5", _Int(1),
       "Database connections the daemon keeps open; a whole number >= 1."),
    _s("timescale", "statement_timeout_secs", "30", _Float(inclusive=True),
       "Longest time one SQL statement may run before the server cancels it, in "
       "seconds; 0 = no limit."),
    _s("timescale", "acquire_timeout_secs", "30", _SECONDS,
       "Longest wait for a free connection from the pool, in seconds."),
    _s("timescale", "connect_timeout_secs", "5", _Int(2, unit="seconds"),
       "Longest wait for a new database connection, in whole seconds (at least 2: "
       "libpq rounds lower values up)."),
    _s("timescale", "tcp_user_timeout_secs", "10", _Float(inclusive=True),
       "How long sent data may stay unacknowledged before a database connection "
       "counts as dead (TCP_USER_TIMEOUT), in seconds; 0 = the OS default."),
    _s("timescale", "keepalive_idle_secs", "10", _Int(1, unit="seconds"),
       "Idle time before TCP keepalive probes start on a database connection, in whole seconds."),
    _s("timescale", "migration_lock_timeout_secs", "5", _SECONDS,
       "How long a migration waits for a table lock before that attempt gives up "
       "(lock_timeout), in seconds."),
    _s("timescale", "migration_retries", "12", _Int(0),
       "Further attempts at the migrations after one gave up; 0 = try once."),
    _s("timescale", "migration_retry_interval_secs", "5", _SECONDS,
       "Pause between two migration attempts, in seconds."),
    # [chat]
    _s("chat", "flush_interval_secs", "5", _SECONDS,
       "How often the chat buffers in Redis are written to the database, in seconds."),
    _s("chat", "flush_batch_size", "1000", _Int(1),
       "Most chat messages written in one database batch."),
    _s("chat", "flush_workers", "2", _Int(1, 16),
       "Chat flush threads of this process. Each claims its own batches (its own "
       "in-flight list per account), so while one waits on the database another "
       "claims and writes the next: one busy account's backlog, or many sockets' "
       "buffers, are written over that many connections of the pool at once."),
    _s("chat", "max_flush_failures", "5", _Int(1),
       "Failed flushes in a row after which an account's batch moves to its "
       "dead-letter list."),
    _s("chat", "deadletter_ttl_hours", "72", _Float(unit="hours"),
       "How long a chat dead-letter list is kept in Redis, in hours."),
    _s("chat", "deadletter_drain_interval_secs", "60", _SECONDS,
       "How often the chat dead-letter lists are replayed into the database, in seconds."),
    _s("chat", "retention_days", "30", _Int(1, unit="days"),
       "Chat messages older than this are deleted, in days."),
    # [events]
    _s("events", "insert_timeout_secs", "3", _SECONDS,
       "Longest time the inline insert of one event may take, waiting for a "
       "pooled connection included, before the event is parked, in seconds."),
    _s("events", "retry_interval_secs", "30", _SECONDS,
       "How often parked events are replayed into the database, in seconds."),
    _s("events", "retention_days", "365", _Int(1, unit="days"),
       "Events older than this are deleted, in days."),
    # [metrics]
    _s("metrics", "listen", "127.0.0.1:9464", _LISTEN,
       "Address of the metrics listener, HOST:PORT (IPv6 as [::1]:9464); port 0 = "
       "any free port. Do not expose it beyond the scraper.",
       fields=("listen_host", "listen_port")),
    # [http]
    _s("http", "listen", "127.0.0.1:8780", _LISTEN,
       "Address of the HTTP listener (webhooks, emit API, alert streams, /healthz, "
       "/readyz), HOST:PORT (IPv6 as [::1]:8780); port 0 = any free port.",
       fields=("listen_host", "listen_port")),
    _s("http", "emit_token_file", "", _SecretFile(),
       "File holding the bearer token of POST /v1/events/emit and the alert "
       "streams: " + _CREDENTIAL_HELP + " Unset = those endpoints answer 403.",
       fields=("emit_token",), example="emit_token", commented=True),
    _s("http", "trusted_proxy_header", "",
       _Text(re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}"), "an HTTP header name such as "
             "X-Forwarded-For", optional=True),
       "Header in which the reverse proxy in front of the listener names the client "
       "(the first address of X-Forwarded-For, or X-Real-IP). Set it only when every "
       "request comes through that proxy: it turns on max_connections_per_client, keyed "
       "on the header's value. Unset = no per-client cap (behind a proxy every request "
       "has the proxy's address).", example="X-Forwarded-For", commented=True),
    _s("http", "max_connections_per_client", "16", _Int(1),
       "With trusted_proxy_header: requests one client may have open at once (read, "
       "in flight or streaming); more are answered 429."),
    # [twitch]
    _s("twitch", "eventsub_ws_url", "wss://eventsub.wss.twitch.tv/ws", _WS,
       "EventSub WebSocket endpoint (ws:// or wss://)."),
    _s("twitch", "helix_url", "https://api.twitch.tv/helix", _HTTP,
       "Helix API base URL (http:// or https://)."),
    _s("twitch", "oauth_url", "https://id.twitch.tv/oauth2", _HTTP,
       "OAuth base URL, for token refresh and validation (http:// or https://)."),
    _s("twitch", "client_id", "",
       _Text(re.compile(r"[!-~]{1,200}"), "a client id without spaces", empty_ok=True),
       "Client id of the Twitch application. Empty = Twitch is not used."),
    _s("twitch", "client_secret_file", "", _SecretFile(),
       "File holding the Twitch application's client secret: " + _CREDENTIAL_HELP,
       fields=("client_secret",), example="twitch_client_secret", commented=True),
    _s("twitch", "webhook_secret_file", "", _SecretFile(ascii_length=(10, 100)),
       "File holding the HMAC secret of the EventSub webhook subscriptions "
       "(10 to 100 ASCII characters): " + _CREDENTIAL_HELP,
       fields=("webhook_secret",), example="twitch_webhook_secret", commented=True),
    _s("twitch", "keepalive_timeout_secs", "30", _Int(10, 600, unit="seconds"),
       "Keepalive interval asked for in the EventSub WebSocket URL, in whole "
       "seconds from 10 to 600; the connection counts as dead when nothing "
       "arrives for longer."),
    # [jetstream]
    _s("jetstream", "url", "wss://jetstream2.us-east.bsky.network/subscribe", _WS,
       "Jetstream subscribe endpoint (ws:// or wss://)."),
    _s("jetstream", "collections", "", _Collections(),
       "Collections to receive, comma-separated NSIDs such as app.bsky.feed.post "
       "(or prefixes such as app.bsky.graph.*). Empty = Jetstream is not used; it runs when "
       "this is set and an account of this shard has a bluesky_did."),
    _s("jetstream", "rewind_secs", "5", _Float(inclusive=True),
       "On reconnect, resume this far before the saved cursor, in seconds "
       "(replays are idempotent)."),
    # [kick]
    _s("kick", "pusher_url",
       "wss://ws-us2.pusher.com/app/32cbd69e4b950bf97679?protocol=7&client=js&version=8.4.0&flash=false",
       _WS, "Kick's Pusher WebSocket endpoint for chat and channel events (ws:// or wss://)."),
    _s("kick", "api_url", "https://api.kick.com/public/v1", _HTTP,
       "Kick public API base URL: webhook subscriptions and livestream look-ups (http:// or https://)."),
    _s("kick", "oauth_url", "https://id.kick.com", _HTTP,
       "Kick OAuth base URL, for the app token (client credentials; http:// or https://)."),
    _s("kick", "client_id", "",
       _Text(re.compile(r"[!-~]{1,200}"), "a client id without spaces", empty_ok=True),
       "Client id of the Kick application (webhook subscriptions, livestream look-ups). "
       "Empty = no Kick API calls; the Pusher socket and webhooks need none."),
    _s("kick", "client_secret_file", "", _SecretFile(),
       "File holding the Kick application's client secret: " + _CREDENTIAL_HELP,
       fields=("client_secret",), example="kick_client_secret", commented=True),
    _s("kick", "webhook_public_key_file", "", _ReadableFile(),
       "PEM file with the public key Kick signs webhooks with. Unset = Kick's published key, "
       "shipped with the package.",
       example="/etc/lumio/kick_webhook_public_key.pem", commented=True),
    _s("kick", "webhook_max_age_secs", "600", _SECONDS,
       "Webhook deliveries older than this, or dated this far in the future, are refused, in seconds."),
    _s("kick", "manage_webhooks", "false", _Bool(),
       "true: create and keep the accounts' webhook subscriptions through the API (needs "
       "client_id and client_secret_file); false: leave them to the Kick app settings."),
    # [streamelements]
    _s("streamelements", "astro_url", "wss://astro.streamelements.com", _WS,
       "StreamElements Astro WebSocket gateway (ws:// or wss://)."),
    _s("streamelements", "topics", "channel.tips,channel.activities",
       _Names("topics like channel.tips", re.compile(r"[a-z0-9_]+(?:\.[a-z0-9_-]+)+")),
       "Topics every account subscribes to, comma-separated."),
    _s("streamelements", "keep_donor_pii", "false", _Bool(),
       "true: keep donors' email, geo and IP address in stored tips and activities; false "
       "(the default): removed before they reach Redis, the spool or the database."),
    # [seventv]
    _s("seventv", "enabled", "false", _Bool(),
       "true: follow the 7TV emote sets of this shard's accounts (configured with "
       "seventv_user_id / seventv_emote_set_id, or found from twitch_user_id)."),
    _s("seventv", "eventapi_url", "wss://events.7tv.io/v3", _WS,
       "7TV EventAPI WebSocket endpoint (ws:// or wss://)."),
    _s("seventv", "api_url", "https://7tv.io/v3", _HTTP,
       "7TV REST API base URL (http:// or https://)."),
    # [streamstatus]
    _s("streamstatus", "interval_secs", "60", _SECONDS,
       "How often the live status of every account is polled, in seconds."),
    _s("streamstatus", "platforms", "twitch,kick",
       _Names("platforms from twitch, kick", choices=("twitch", "kick")),
       "Platforms polled, comma-separated (twitch, kick). A platform is polled only when its "
       "client_id and client_secret_file are set."),
    _s("streamstatus", "request_timeout_secs", "5", _SECONDS,
       "Longest time one status request to a platform API may take, in seconds."),
    # [synthetic]
    _s("synthetic", "rate_per_sec", "0", _Float(inclusive=True, unit="messages per second"),
       "Chat messages per second the synthetic source makes; 0 = the source is off."),
    _s("synthetic", "accounts", "1", _IdList(),
       "Account ids the synthetic messages are spread over, comma-separated."),
    _s("synthetic", "event_every", "10", _Int(1),
       "One synthetic event for every this many chat messages."),
    _s("synthetic", "run_id", "",
       _Text(re.compile(r"[A-Za-z0-9_.-]{1,64}"), "up to 64 letters, digits, _ . or -",
             optional=True),
       "Name of the run in the synthetic ids (syn-RUN-SEQ). Empty = a random one per start."),
    # [account.N]
    _s(ACCOUNT_SECTION, "twitch_user_id", "",
       _Text(re.compile(r"[0-9]{1,20}"), "a numeric Twitch user id", optional=True),
       "The account's Twitch broadcaster user id (digits).",
       example="123456"),
    _s(ACCOUNT_SECTION, "twitch_token_file", "", _ReadableFile(),
       "JSON file with the account's Twitch access_token and refresh_token; the "
       "daemon rewrites it on refresh. An absolute path, or a bare name looked up "
       "in $CREDENTIALS_DIRECTORY.",
       example="/var/lib/lumio-ingestd/twitch-token-1.json", commented=True),
    _s(ACCOUNT_SECTION, "bluesky_did", "",
       _Text(re.compile(r"did:[a-z]+:[a-zA-Z0-9._:%-]*[a-zA-Z0-9._-]"), "a DID like did:plc:...",
             optional=True),
       "The account's Bluesky DID (did:plc:... or did:web:...).",
       example="did:plc:abcdefghijklmnopqrstuvwx"),
    _s(ACCOUNT_SECTION, "kick_broadcaster_user_id", "",
       _Text(re.compile(r"[0-9]{1,20}"), "a numeric Kick user id", optional=True),
       "The account's Kick user id (broadcaster.user_id in Kick's webhooks).",
       example="4377088", commented=True),
    _s(ACCOUNT_SECTION, "kick_chatroom_id", "",
       _Text(re.compile(r"[0-9]{1,20}"), "a numeric Kick chatroom id", optional=True),
       "The account's Kick chatroom id: the Pusher channel chatrooms.ID.v2 (chat, subs, gifts).",
       example="4309481", commented=True),
    _s(ACCOUNT_SECTION, "kick_channel_id", "",
       _Text(re.compile(r"[0-9]{1,20}"), "a numeric Kick channel id", optional=True),
       "The account's Kick channel id: the Pusher channel channel.ID (live status, hosts); optional.",
       example="4378473", commented=True),
    _s(ACCOUNT_SECTION, "streamelements_channel_id", "",
       _Text(re.compile(r"[A-Za-z0-9_-]{1,64}"), "a StreamElements channel id", optional=True),
       "The account's StreamElements channel id (the Astro room).",
       example="5b2e2007760aeb7729487dab"),
    _s(ACCOUNT_SECTION, "streamelements_token_file", "", _ReadableFile(),
       'File with the account\'s StreamElements token: JSON {"token": ..., "token_type": '
       '"jwt", "oauth2" or "apikey"}, or the bare JWT. An absolute path, or a bare name '
       "looked up in $CREDENTIALS_DIRECTORY.",
       example="/var/lib/lumio-ingestd/streamelements-token-1.json", commented=True),
    _s(ACCOUNT_SECTION, "seventv_user_id", "",
       _Text(re.compile(r"[A-Za-z0-9]{1,64}"), "a 7TV user id", optional=True),
       "The account's 7TV user id. Empty = found from twitch_user_id through the 7TV API.",
       example="01F74BZYAR00069YQS4JB48G14"),
    _s(ACCOUNT_SECTION, "seventv_emote_set_id", "",
       _Text(re.compile(r"[A-Za-z0-9]{1,64}"), "a 7TV emote set id", optional=True),
       "The 7TV emote set to follow. Empty = the user's active emote set, from the 7TV API "
       "(and followed when the user switches it).",
       example="01FE3WJ4PR0009RT43H1DH4XQX"),
)

_BY_SECTION: Final[dict[str, dict[str, Setting]]] = {}
for _setting in SCHEMA:
    _BY_SECTION.setdefault(_setting.section, {})[_setting.key] = _setting
del _setting
_FIXED_SECTIONS: Final = tuple(s for s in _BY_SECTION if s != ACCOUNT_SECTION)
_ACCOUNT_NAME = re.compile(r"account\.([1-9][0-9]{0,18})")


def _default(section: str, key: str) -> Any:
    """The typed default of one key, parsed from SCHEMA's text (so the two cannot differ)."""
    setting = _BY_SECTION[section][key]
    return setting.kind.parse(setting.default, _Context(environ={}))


# ---------------------------------------------------------------------------
# The typed configuration. Field defaults come from SCHEMA, so that tests may
# build one with a few fields changed; load() is the way to get a checked one.


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    instance_id: str = field(default_factory=_default_instance_id)
    state_dir: Path = _default("daemon", "state_dir")
    log_level: str = _default("daemon", "log_level")
    shard_index: int = _default("daemon", "shard")[0]
    shard_count: int = _default("daemon", "shard")[1]
    shard_auto: bool = _default("daemon", "shard")[2]
    accounts_dir: Path = _default("daemon", "accounts_dir")
    spool_max_bytes: int = _default("daemon", "spool_max_bytes")
    shutdown_timeout_secs: float = _default("daemon", "shutdown_timeout_secs")


def _redacting_repr(obj: Any, url_field: str) -> str:
    parts = []
    for f in fields(obj):
        value = getattr(obj, f.name)
        text = repr(_redact(value)) if f.name == url_field else repr(value)
        parts.append(f"{f.name}={text}")
    return f"{type(obj).__name__}({', '.join(parts)})"


@dataclass(frozen=True, slots=True)
class RedisConfig:
    url: str = _default("redis", "url")
    password: Secret | None = None
    socket_timeout_secs: float = _default("redis", "socket_timeout_secs")
    connect_timeout_secs: float = _default("redis", "connect_timeout_secs")
    cluster: bool = _default("redis", "cluster")

    def __repr__(self) -> str:
        return _redacting_repr(self, "url")


@dataclass(frozen=True, slots=True)
class TimescaleConfig:
    dsn: str = _default("timescale", "dsn")
    password: Secret | None = None
    pool_size: int = _default("timescale", "pool_size")
    statement_timeout_secs: float = _default("timescale", "statement_timeout_secs")
    acquire_timeout_secs: float = _default("timescale", "acquire_timeout_secs")
    connect_timeout_secs: int = _default("timescale", "connect_timeout_secs")
    tcp_user_timeout_secs: float = _default("timescale", "tcp_user_timeout_secs")
    keepalive_idle_secs: int = _default("timescale", "keepalive_idle_secs")
    migration_lock_timeout_secs: float = _default("timescale", "migration_lock_timeout_secs")
    migration_retries: int = _default("timescale", "migration_retries")
    migration_retry_interval_secs: float = _default("timescale", "migration_retry_interval_secs")

    def __repr__(self) -> str:
        return _redacting_repr(self, "dsn")


@dataclass(frozen=True, slots=True)
class ChatConfig:
    flush_interval_secs: float = _default("chat", "flush_interval_secs")
    flush_batch_size: int = _default("chat", "flush_batch_size")
    flush_workers: int = _default("chat", "flush_workers")
    max_flush_failures: int = _default("chat", "max_flush_failures")
    deadletter_ttl_hours: float = _default("chat", "deadletter_ttl_hours")
    deadletter_drain_interval_secs: float = _default("chat", "deadletter_drain_interval_secs")
    retention_days: int = _default("chat", "retention_days")


@dataclass(frozen=True, slots=True)
class EventsConfig:
    insert_timeout_secs: float = _default("events", "insert_timeout_secs")
    retry_interval_secs: float = _default("events", "retry_interval_secs")
    retention_days: int = _default("events", "retention_days")


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    listen_host: str = _default("metrics", "listen")[0]
    listen_port: int = _default("metrics", "listen")[1]


@dataclass(frozen=True, slots=True)
class HttpConfig:
    listen_host: str = _default("http", "listen")[0]
    listen_port: int = _default("http", "listen")[1]
    emit_token: Secret | None = None
    trusted_proxy_header: str | None = None
    max_connections_per_client: int = _default("http", "max_connections_per_client")


@dataclass(frozen=True, slots=True)
class TwitchConfig:
    eventsub_ws_url: str = _default("twitch", "eventsub_ws_url")
    helix_url: str = _default("twitch", "helix_url")
    oauth_url: str = _default("twitch", "oauth_url")
    client_id: str = _default("twitch", "client_id")
    client_secret: Secret | None = None
    webhook_secret: Secret | None = None
    keepalive_timeout_secs: int = _default("twitch", "keepalive_timeout_secs")


@dataclass(frozen=True, slots=True)
class JetstreamConfig:
    url: str = _default("jetstream", "url")
    collections: tuple[str, ...] = _default("jetstream", "collections")
    rewind_secs: float = _default("jetstream", "rewind_secs")


@dataclass(frozen=True, slots=True)
class KickConfig:
    pusher_url: str = _default("kick", "pusher_url")
    api_url: str = _default("kick", "api_url")
    oauth_url: str = _default("kick", "oauth_url")
    client_id: str = _default("kick", "client_id")
    client_secret: Secret | None = None
    webhook_public_key_file: Path | None = None
    webhook_max_age_secs: float = _default("kick", "webhook_max_age_secs")
    manage_webhooks: bool = _default("kick", "manage_webhooks")


@dataclass(frozen=True, slots=True)
class StreamElementsConfig:
    astro_url: str = _default("streamelements", "astro_url")
    topics: tuple[str, ...] = _default("streamelements", "topics")
    keep_donor_pii: bool = _default("streamelements", "keep_donor_pii")


@dataclass(frozen=True, slots=True)
class SevenTvConfig:
    enabled: bool = _default("seventv", "enabled")
    eventapi_url: str = _default("seventv", "eventapi_url")
    api_url: str = _default("seventv", "api_url")


@dataclass(frozen=True, slots=True)
class StreamStatusConfig:
    interval_secs: float = _default("streamstatus", "interval_secs")
    platforms: tuple[str, ...] = _default("streamstatus", "platforms")
    request_timeout_secs: float = _default("streamstatus", "request_timeout_secs")


@dataclass(frozen=True, slots=True)
class SyntheticConfig:
    rate_per_sec: float = _default("synthetic", "rate_per_sec")
    accounts: tuple[int, ...] = _default("synthetic", "accounts")
    event_every: int = _default("synthetic", "event_every")
    run_id: str | None = None


@dataclass(frozen=True, slots=True)
class AccountConfig:
    account_id: int
    twitch_user_id: str | None = None
    twitch_token_file: Path | None = None
    bluesky_did: str | None = None
    kick_broadcaster_user_id: str | None = None
    kick_chatroom_id: str | None = None
    kick_channel_id: str | None = None
    streamelements_channel_id: str | None = None
    streamelements_token_file: Path | None = None
    seventv_user_id: str | None = None
    seventv_emote_set_id: str | None = None


@dataclass(frozen=True, slots=True)
class Config:
    path: str
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    redis: RedisConfig = field(default_factory=RedisConfig)
    timescale: TimescaleConfig = field(default_factory=TimescaleConfig)
    chat: ChatConfig = field(default_factory=ChatConfig)
    events: EventsConfig = field(default_factory=EventsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    twitch: TwitchConfig = field(default_factory=TwitchConfig)
    jetstream: JetstreamConfig = field(default_factory=JetstreamConfig)
    kick: KickConfig = field(default_factory=KickConfig)
    streamelements: StreamElementsConfig = field(default_factory=StreamElementsConfig)
    seventv: SevenTvConfig = field(default_factory=SevenTvConfig)
    streamstatus: StreamStatusConfig = field(default_factory=StreamStatusConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    accounts: tuple[AccountConfig, ...] = ()
    #: With `shard = auto`: the accounts this replica holds now (set by the
    #: daemon from its membership, never read from a file); None = by INDEX/COUNT.
    owned: frozenset[int] | None = None

    def owns(self, account_id: int) -> bool:
        """Whether this replica runs the account's sources."""
        if self.owned is not None:
            return account_id in self.owned
        if self.daemon.shard_auto:
            return False  # nothing until the membership hands accounts out
        return account_id % self.daemon.shard_count == self.daemon.shard_index

    @property
    def leads(self) -> bool:
        """Whether this replica builds the one-per-deployment workers (Kick subscriptions).

        Replica 0 with INDEX/COUNT; every replica with `auto`, where a lease
        decides which one runs them (lease.LeaseGated).
        """
        return self.daemon.shard_auto or self.daemon.shard_index == 0


# Section name -> the dataclass built from it; Config has one attribute per fixed section.
_SECTION_CLASSES: Final[Mapping[str, type[Any]]] = {
    "daemon": DaemonConfig,
    "redis": RedisConfig,
    "timescale": TimescaleConfig,
    "chat": ChatConfig,
    "events": EventsConfig,
    "metrics": MetricsConfig,
    "http": HttpConfig,
    "twitch": TwitchConfig,
    "jetstream": JetstreamConfig,
    "kick": KickConfig,
    "streamelements": StreamElementsConfig,
    "seventv": SevenTvConfig,
    "streamstatus": StreamStatusConfig,
    "synthetic": SyntheticConfig,
    ACCOUNT_SECTION: AccountConfig,
}


# ---------------------------------------------------------------------------
# Loading


def resolve_path(cli_path: str | None, environ: Mapping[str, str]) -> str:
    """The config file to read: `-c PATH`, else $LUMIO_INGESTD_CONFIG (if not empty), else DEFAULT_PATH."""
    if cli_path is not None:
        return cli_path
    return environ.get(ENV_CONFIG) or DEFAULT_PATH


def _read(path: str, problems: list[ConfigProblem]) -> configparser.ConfigParser | None:
    """Parse the file; on failure record why (with the line configparser gives) and return None."""
    parser = configparser.ConfigParser(
        interpolation=None,
        strict=True,
        empty_lines_in_values=False,
        default_section="__no_default__",
        inline_comment_prefixes=None,
    )

    def problem(message: str, section: str = "", key: str = "") -> None:
        problems.append(ConfigProblem(path, section, key, message))

    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except FileNotFoundError:
        problem("file not found")
    except OSError as e:
        problem(f"cannot read the file: {e.strerror or type(e).__name__}")
    except UnicodeDecodeError as e:
        problem(f"not UTF-8 text (byte {e.start})")
    except configparser.DuplicateOptionError as e:
        problem(f"line {e.lineno}: set twice in this section", e.section, e.option)
    except configparser.DuplicateSectionError as e:
        problem(f"line {e.lineno}: section appears twice", e.section)
    except configparser.MissingSectionHeaderError as e:
        problem(f"line {e.lineno}: a key before the first [section] header")
    except configparser.ParsingError as e:
        for lineno, _line in e.errors:
            # The line itself is not shown: it may be a pasted secret.
            problem(f'line {lineno}: expected a "[section]" header, a "key = value" line or a comment')
    except configparser.Error as e:
        problem(f"cannot parse the file: {e.message}")
    else:
        return parser
    return None


def _check_raw(raw: str, setting: Setting) -> None:
    """Mistakes of form, before the value's own parser sees it."""
    shown = setting.kind.show(raw)
    if "\n" in raw:
        raise _Invalid(
            "a value must be on one line (an indented line continues the previous value), "
            f'got "{shown.replace(chr(10), chr(92) + "n")}"'
        )
    if raw[:1] in ("#", ";") or re.search(r"\s[#;]", raw):
        raise _Invalid(f'comments must be on their own line, got "{shown}"')
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        raise _Invalid(f'write values without quotes, got {shown}')


def _unknown_key(section: str, key: str, known: Mapping[str, Setting]) -> str:
    if f"{key}_file" in known:
        return f"unknown key; secrets are read from files: use {key}_file"
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f'did you mean "{close[0]}"?' if close else f"known keys: {', '.join(known)}"
    return f"unknown key ({hint})"


def _unknown_section(name: str) -> str:
    if name == "DEFAULT":
        return "a [DEFAULT] section is not supported; set each key in its own section"
    if name.lower().startswith("account"):
        return (
            "account sections are named [account.N] with N the account id, a positive "
            "whole number without leading zeros, like [account.1]"
        )
    close = difflib.get_close_matches(name, [*_FIXED_SECTIONS, "account.1"], n=1)
    hint = f"did you mean [{close[0]}]?" if close else "known sections: " + ", ".join(
        f"[{s}]" for s in (*_FIXED_SECTIONS, "account.N")
    )
    return f"unknown section ({hint})"


def _parse_section(
    path: str,
    section: str,
    schema_section: str,
    items: Iterable[tuple[str, str]],
    ctx: _Context,
    problems: list[ConfigProblem],
) -> dict[str, Any] | None:
    """Field values of one section, defaults filled in; None if any key had a problem."""
    known = _BY_SECTION[schema_section]
    given: dict[str, str] = {}
    ok = True
    for key, raw in items:
        if key not in known:
            problems.append(ConfigProblem(path, section, key, _unknown_key(section, key, known)))
            ok = False
        else:
            given[key] = raw
    values: dict[str, Any] = {}
    for key, setting in known.items():
        raw = given.get(key, setting.default)
        try:
            if key in given:
                _check_raw(raw, setting)
            value = setting.kind.parse(raw, ctx)
        except _Invalid as e:
            problems.append(ConfigProblem(path, section, key, str(e)))
            ok = False
            continue
        if len(setting.fields) == 1:
            values[setting.fields[0]] = value
        else:
            values.update(zip(setting.fields, value, strict=True))
    return values if ok else None


def load(path: str, environ: Mapping[str, str]) -> Config:
    """Read and check the config file at `path`; raise ConfigError listing every problem.

    `environ` is consulted only for $CREDENTIALS_DIRECTORY (bare names of secret files).
    """
    problems: list[ConfigProblem] = []
    parser = _read(path, problems)
    if parser is None:
        raise ConfigError(problems)
    ctx = _Context(environ=environ)

    # Anything in the renamed default section would feed every section: reject it.
    if parser.defaults():
        problems.append(ConfigProblem(path, parser.default_section, "", _unknown_section("DEFAULT")))
        for key in list(parser.defaults()):
            parser.remove_option(parser.default_section, key)

    sections: dict[str, dict[str, Any] | None] = {}
    accounts: list[AccountConfig] = []
    for name in parser.sections():
        items = parser.items(name, raw=True)
        account = _ACCOUNT_NAME.fullmatch(name)
        if name in _BY_SECTION and name != ACCOUNT_SECTION:
            sections[name] = _parse_section(path, name, name, items, ctx, problems)
        elif account and int(account.group(1)) < 2**63:
            values = _parse_section(path, name, ACCOUNT_SECTION, items, ctx, problems)
            if values is not None:
                accounts.append(AccountConfig(account_id=int(account.group(1)), **values))
        else:
            problems.append(ConfigProblem(path, name, "", _unknown_section(name)))
    for name in _FIXED_SECTIONS:
        if name not in sections:
            sections[name] = _parse_section(path, name, name, (), ctx, problems)

    origins = {a.account_id: path for a in accounts}
    daemon = sections.get("daemon")
    if daemon is not None:
        accounts += _load_accounts_dir(daemon["accounts_dir"], origins, ctx, problems)
    accounts.sort(key=lambda a: a.account_id)
    _check_across(path, sections, accounts, problems, origins)
    if problems:
        raise ConfigError(problems)
    built = {name: _SECTION_CLASSES[name](**values) for name, values in sections.items() if values}
    return Config(path=path, accounts=tuple(accounts), **built)


def _check_across(
    path: str,
    sections: Mapping[str, Mapping[str, Any] | None],
    accounts: list[AccountConfig],
    problems: list[ConfigProblem],
    origins: Mapping[int, str] | None = None,
) -> None:
    """Rules that involve more than one key (an account's problem names its own file)."""
    for section, url_key in (("redis", "url"), ("timescale", "dsn")):
        values = sections.get(section)
        if values and values["password"] is not None and _url_has_password(values[url_key]):
            problems.append(
                ConfigProblem(path, section, url_key,
                              "has a password and password_file is set too; keep only password_file")
            )
    owners: dict[tuple[str, str], int] = {}
    for account in accounts:
        section = f"account.{account.account_id}"
        where = (origins or {}).get(account.account_id, path)
        for needs, key in (("twitch_token_file", "twitch_user_id"),
                           ("streamelements_token_file", "streamelements_channel_id")):
            if getattr(account, needs) is not None and getattr(account, key) is None:
                problems.append(ConfigProblem(where, section, needs, f"is set but {key} is not"))
        for key in ("twitch_user_id", "bluesky_did", "kick_broadcaster_user_id", "kick_chatroom_id",
                    "kick_channel_id", "streamelements_channel_id", "seventv_emote_set_id"):
            value = getattr(account, key)
            if value is None:
                continue
            first = owners.setdefault((key, value), account.account_id)
            if first != account.account_id:
                problems.append(
                    ConfigProblem(where, section, key, f'"{value}" is also the {key} of [account.{first}]'
                                  + _in_file(origins, first, where))
                )


def _in_file(origins: Mapping[int, str] | None, account_id: int, here: str) -> str:
    there = (origins or {}).get(account_id)
    return f" in {there}" if there is not None and there != here else ""


def _load_accounts_dir(directory: Path, origins: dict[int, str], ctx: _Context,
                       problems: list[ConfigProblem]) -> list[AccountConfig]:
    """The [account.N] sections of every *.ini in `directory` (missing: none).

    `origins` (account id -> file) gains each account read; an id already there
    is a problem naming both files.
    """
    try:
        files = sorted(p for p in directory.iterdir() if p.name.endswith(".ini") and p.is_file())
    except FileNotFoundError:
        return []
    except OSError as e:
        why = e.strerror or type(e).__name__
        problems.append(ConfigProblem(str(directory), "", "", f"[daemon] accounts_dir: cannot list: {why}"))
        return []
    accounts: list[AccountConfig] = []
    for file in files:
        name = str(file)
        parser = _read(name, problems)
        if parser is None:
            continue
        if parser.defaults():
            problems.append(ConfigProblem(name, parser.default_section, "", _unknown_section("DEFAULT")))
        for section in parser.sections():
            match = _ACCOUNT_NAME.fullmatch(section)
            if match is None or int(match.group(1)) >= 2**63:
                hint = ("only [account.N] sections belong in accounts_dir" if section in _BY_SECTION
                        else _unknown_section(section))
                problems.append(ConfigProblem(name, section, "", hint))
                continue
            account_id = int(match.group(1))
            values = _parse_section(name, section, ACCOUNT_SECTION, parser.items(section, raw=True), ctx,
                                    problems)
            first = origins.setdefault(account_id, name)
            if first != name:
                problems.append(ConfigProblem(name, section, "", f"[account.{account_id}] is also in {first}"
                                              " (an account is configured once)"))
            elif values is not None:
                accounts.append(AccountConfig(account_id=account_id, **values))
    return accounts


# ---------------------------------------------------------------------------
# Output: the effective config, and the example file


def redacted_lines(cfg: Config) -> list[str]:
    """The effective configuration as `section.key = value` lines, safe to print or log.

    Secrets show as `***` (empty when unset), URL passwords as `***`. Every key
    of every fixed section is listed, then every key of each account.
    """
    lines = []
    for setting in SCHEMA:
        if setting.section == ACCOUNT_SECTION:
            continue
        obj = getattr(cfg, setting.section)
        lines.append(f"{setting.section}.{setting.key} = {_render(setting, obj)}".rstrip())
    for account in cfg.accounts:
        for setting in _BY_SECTION[ACCOUNT_SECTION].values():
            lines.append(f"account.{account.account_id}.{setting.key} = {_render(setting, account)}".rstrip())
    return lines


def _render(setting: Setting, obj: Any) -> str:
    values = tuple(getattr(obj, name) for name in setting.fields)
    text = setting.kind.render(values[0] if len(values) == 1 else values)
    return setting.kind.show(text)


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, width=78, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False)


def example_ini() -> str:
    """The example configuration (etc/lumio/ingestd.ini), made from SCHEMA.

    Every key of every fixed section with its default, the secret files
    commented out, and one [account.1]. It loads with load() as it is.
    """
    out = [
        "# lumio-ingestd configuration: /etc/lumio/ingestd.ini (or -c PATH, or $LUMIO_INGESTD_CONFIG).",
        "#",
        *_comment(
            "Every key is shown with its default; a key left out has that default. Unknown "
            "sections and keys are errors. Durations are in seconds unless the key says otherwise."
        ),
        *_comment(
            'Comments go on their own line: "key = value  # note" is an error, because the '
            "note would become part of the value. Values are written without quotes."
        ),
        *_comment(
            "Secrets are never written here. A *_file key names a file holding the secret: an "
            "absolute path, or a bare name looked up in $CREDENTIALS_DIRECTORY, for example "
            "with LoadCredential=redis_password:/etc/lumio/credentials/redis_password in the unit."
        ),
        "#",
        "# Check a changed file with: lumio-ingestd -c PATH check-config",
        "# (Generated from lumio_ingestd.config.SCHEMA by example_ini(); edit that instead.)",
    ]
    for section, settings in _BY_SECTION.items():
        header = "account.1" if section == ACCOUNT_SECTION else section
        out += ["", "", *_comment(SECTION_HELP[section]), f"[{header}]"]
        for i, setting in enumerate(settings.values()):
            if i:
                out.append("")
            out += _comment(setting.help)
            line = f"{setting.key} = {setting.example}".rstrip()
            out.append(f"# {line}" if setting.commented else line)
    return "\n".join(out) + "\n"
