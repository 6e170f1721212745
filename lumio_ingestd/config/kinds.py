"""How a configuration value is read: the value kinds, secrets and the errors.

Each `_Kind` parses one key's text into a value and renders it back; `Secret`
wraps a secret read from a file (it prints as `***`); `ConfigProblem` and
`ConfigError` say what is wrong and where. Nothing durable here.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

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
class _HostPorts(_Kind):
    """Comma-separated HOST:PORT (IPv6 in brackets) -> tuple of (host, port); empty -> ()."""

    def parse(self, raw: str, ctx: _Context) -> tuple[tuple[str, int], ...]:
        if not raw:
            return ()
        found: list[tuple[str, int]] = []
        for item in (part.strip() for part in raw.split(",")):
            if not item:
                raise _Invalid(f'expected comma-separated HOST:PORT, got an empty entry in "{raw}"')
            try:
                host, port = _Listen().parse(item, ctx)
            except _Invalid:
                raise _Invalid(f'expected comma-separated HOST:PORT with ports from 1 to 65535 '
                               f'(IPv6 as "[::1]:26379"), got "{item}" in "{raw}"') from None
            if port == 0:
                raise _Invalid(f'port 0 in "{item}": a Sentinel listens on a real port (usually 26379)')
            if (host, port) in found:
                raise _Invalid(f'"{item}" is listed twice')
            found.append((host, port))
        return tuple(found)

    def render(self, value: Any) -> str:
        return ",".join(_Listen().render(v) for v in value)


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
