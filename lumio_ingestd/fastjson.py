"""JSON on the chat hot path: orjson when it is installed, the standard library otherwise.

orjson is optional (the `speed` extra); the daemon runs the same without it.
Results are exactly `json.loads` / the stdlib encoder's: wherever orjson
would answer differently it is not used for that document, and wherever it
refuses a document the standard library decides (and raises what it always
raised):

- integers of 19 digits or more (orjson turns those past 64 bits into
  floats): a digit run that long anywhere in the raw text sends the document
  to the standard library;
- NaN, Infinity, numbers that overflow, lone surrogate escapes, UTF-16/32
  bytes, bad UTF-8: orjson refuses them, the standard library decides;
- encoding: a lone surrogate, a non-str key or an int past 64 bits make
  orjson refuse, and the stdlib encoder runs (raising UnicodeEncodeError for
  the surrogate, as before). Output is compact UTF-8 either way; the bytes
  of a float may be written differently (`1e-05` / `1e-5`), the value not.

`LUMIO_INGESTD_NO_ORJSON=1` in the environment, read once at import, makes
this module ignore orjson (tests use it to force the fallback). Pure
functions, nothing durable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, Final

_orjson: Any
try:
    if os.environ.get("LUMIO_INGESTD_NO_ORJSON", "") not in ("", "0"):
        raise ImportError("orjson disabled by LUMIO_INGESTD_NO_ORJSON")
    import orjson as _orjson
except ImportError:
    _orjson = None

#: Whether the hot path uses orjson.
USING_ORJSON: Final = _orjson is not None

_DIGITS = bytes(1 if 0x30 <= c <= 0x39 else 0 for c in range(256))
_LONG_NUMBER = b"\x01" * 19


class NotFinite(Exception):
    """`loads_finite` met NaN, Infinity or a number that overflows to infinity.

    Not a ValueError, so no JSON error handler takes it for bad JSON."""


def _finite(literal: str) -> float:
    value = float(literal)
    if value in (_INF, -_INF):
        raise NotFinite(literal[:32])
    return value


def _no_constant(literal: str) -> float:
    raise NotFinite(literal)


_INF = float("inf")
# The hooks run only for numbers with a fraction or an exponent, and constants.
_FINITE_DECODER = json.JSONDecoder(parse_float=_finite, parse_constant=_no_constant)
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)


def _has_long_number(data: str | bytes | bytearray) -> bool:
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    return _LONG_NUMBER in raw.translate(_DIGITS)


def loads(data: str | bytes | bytearray) -> Any:
    """Exactly `json.loads(data)`."""
    if _orjson is not None and not _has_long_number(data):
        try:
            return _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass  # the standard library decides, and says why
    return json.loads(data)


def loads_finite(text: str) -> Any:
    """`json.loads(text)`, but NaN, Infinity and overflowing numbers raise NotFinite."""
    if _orjson is not None and not _has_long_number(text):
        try:
            return _orjson.loads(text)
        except _orjson.JSONDecodeError:
            pass
    return _FINITE_DECODER.decode(text)


def loads_orjson(data: bytes) -> Any:
    """orjson's parse alone, for a caller with a slower way of its own: raises ValueError
    when orjson is not used or refuses `data`. Unlike `loads`, a number past 64 bits
    comes back as a float (`json.loads` keeps it an int)."""
    if _orjson is None:
        raise ValueError("orjson is not used")
    return _orjson.loads(data)


def _dumps_std(obj: Any) -> bytes:
    return _ENCODER.encode(obj).encode()


def _dumps_orjson(obj: Any) -> bytes:
    try:
        result: bytes = _orjson.dumps(obj)
    except TypeError:  # orjson.JSONEncodeError: the stdlib encoder decides
        return _dumps_std(obj)
    return result


#: Compact UTF-8 JSON (ensure_ascii off); a lone surrogate raises UnicodeEncodeError.
dumps: Callable[[Any], bytes] = _dumps_orjson if USING_ORJSON else _dumps_std


def dumps_utc_z(obj: Any) -> bytes:
    """orjson's compact JSON, an aware datetime in UTC written `YYYY-MM-DDTHH:MM:SS[.ffffff]Z`.

    orjson only: raises TypeError without it, and whatever orjson refuses (a
    lone surrogate, an int past 64 bits) raises TypeError too; the caller
    then writes the document through `dumps`.
    """
    if _orjson is None:
        raise TypeError("orjson is not used")
    result: bytes = _orjson.dumps(obj, option=_orjson.OPT_UTC_Z)
    return result
