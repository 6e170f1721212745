"""Bounded JSON decoding: `loads(data, *, max_depth=..., max_bytes=...)` for data from outside.

Use it instead of `json.loads` for every decode of data this process did
not just build itself: Redis entries, spool records, HTTP bodies, socket
frames, files and API answers. `json.loads` recurses once per nesting level,
so a few hundred kilobytes of `[` raise RecursionError (not a ValueError) and
blow up whatever loop called it; a huge document costs memory and time
before anyone looks at it. Here both limits are checked on the raw text
BEFORE the recursive parser runs:

- size: `len(data)` (bytes, or characters for a str) above `max_bytes` is
  refused at once;
- depth: a cheap scan counts the nesting of `[`/`{` outside strings
  (escapes respected); deeper than `max_depth` is refused. A document with
  fewer brackets than `max_depth` in all needs no scan (one C-speed count).

Every failure, including plain "not JSON", raises `JsonRefused` (a
ValueError) with a short `reason` label: "too_large", "too_deep",
"not_utf8", "not_json". Bytes are decoded as `json.loads` does (UTF-8, with
its surrogate and UTF-16 detection), so this is a drop-in replacement; a
caller that needs strict UTF-8 decodes first and passes the str.

Typical use:

    from lumio_ingestd import boundedjson
    try:
        obj = boundedjson.loads(frame, max_bytes=512 * 1024)
    except boundedjson.JsonRefused as exc:
        count(exc.reason); quarantine(frame)

Nothing durable here; pure functions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final

#: Nesting deeper than this is refused. Every real payload this daemon sees
#: nests well under 20 levels; stored entries are capped at 32 by `clean_json`
#: inside one object.
DEFAULT_MAX_DEPTH: Final = 64
#: Larger documents are refused before they are parsed.
DEFAULT_MAX_BYTES: Final = 1024 * 1024

REASONS: Final = ("too_large", "too_deep", "not_utf8", "not_json")

# A JSON string (unrolled loop: no backtracking blow-up on long strings).
_STRING_B = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET_B = bytes(c for c in range(256) if c not in b"[]{}")
_NOT_MARK = bytes(c for c in range(256) if c not in b'"[]{}')
_PARENS = bytes.maketrans(b"[]{}", b"()()")


class JsonRefused(ValueError):
    """A document refused before or while parsing; `reason` is one of REASONS."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        assert reason in REASONS, reason
        self.reason = reason


def loads(data: bytes | bytearray | str, *, max_depth: int = DEFAULT_MAX_DEPTH,
          max_bytes: int = DEFAULT_MAX_BYTES,
          decode: Callable[[Any], Any] | None = None, depth_at_most: int | None = None) -> Any:
    """`json.loads(data)` within the limits; raises JsonRefused (never RecursionError).

    `decode`: called instead of `json.loads` (an exception of its own that is
    not a ValueError passes through). `depth_at_most`: the caller's own scan
    of this very `data` found it nested no deeper than this (as
    `depth_exceeds` counts), so the scan is not run again when that is within
    `max_depth`.
    """
    size = len(data)
    if size > max_bytes:
        raise JsonRefused("too_large", f"JSON document of {size} bytes (limit {max_bytes})")
    if (depth_at_most is None or depth_at_most > max_depth) and depth_exceeds(data, max_depth):
        raise JsonRefused("too_deep", f"JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(data) if decode is None else decode(data)
    except UnicodeDecodeError as exc:
        raise JsonRefused("not_utf8", f"not UTF-8 (byte {exc.start})") from None
    except ValueError as exc:
        raise JsonRefused("not_json", f"not JSON: {exc}"[:200]) from None
    except RecursionError:  # a backstop: the scan above is meant to make this unreachable
        raise JsonRefused("too_deep", "JSON nested too deeply") from None


def depth_exceeds(data: bytes | bytearray | str, max_depth: int) -> bool:
    """Whether `data` nests `[`/`{` deeper than `max_depth` outside JSON strings.

    Invalid JSON may be judged either way; the parser refuses it anyway, and
    it never recurses past a bracket this scan did not count (strings are
    removed only between quote pairs, exactly where the parser reads a string).

    On every socket frame, so the common case stays at C speed: one pass
    keeps only the quotes and brackets (`marks`); a document with few
    brackets is answered there; otherwise, when no escaped backslash makes
    quotes ambiguous, every adjacent `""` pair is a string without a bracket
    inside, and if removing them leaves no quote, what is left is exactly the
    brackets outside strings, whose depth is found by removing the innermost
    pairs once per level. Anything else takes the exact scan.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    marks = raw.translate(None, _NOT_MARK)
    if marks.count(b"[") + marks.count(b"{") <= max_depth:
        return False
    if b"\\" in raw:
        if b"\\\\" in raw:
            return _depth_exceeds_exact(raw, max_depth)
        # No escaped backslash: every backslash starts an escape, and only `\"`
        # hides a quote (the bracket after any other escape is in a string anyway).
        marks = raw.replace(b'\\"', b"").translate(None, _NOT_MARK)
    outside = marks.replace(b'""', b"")
    if b'"' in outside:
        # A string with a bracket in it kept its quotes (which would also stop the
        # passes below from ever emptying `nest`).
        return _depth_exceeds_exact(raw, max_depth)
    # No quote left: `outside` is exactly the brackets outside strings.
    nest = outside.translate(_PARENS)
    for _ in range(max_depth):
        nest = nest.replace(b"()", b"")
        if not nest:
            return False
    return _depth_exceeds_exact(raw, max_depth)  # deep, or unbalanced: the exact answer


def _depth_exceeds_exact(raw: bytes, max_depth: int) -> bool:
    """`depth_exceeds` by a scan of every bracket outside the strings the regex finds."""
    brackets = _STRING_B.sub(b"", raw).translate(None, _NOT_BRACKET_B).decode("ascii")
    depth = 0
    for c in brackets:
        if c in "[{":
            depth += 1
            if depth > max_depth:
                return True
        else:
            depth -= 1
    return False
