"""`fastjson`: orjson when installed, the standard library otherwise, with the same results.

The in-process tests run whichever path this interpreter has; one test runs
them again in a child process with `LUMIO_INGESTD_NO_ORJSON=1` (the fallback).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

import support
from lumio_ingestd import fastjson

DOCS = [
    '{"a":1,"b":[true,false,null],"c":"x"}',
    '{"a":1,"a":2}',
    '{"big":123456789012345678901234567890,"neg":-98765432109876543210}',
    '{"edge":9223372036854775807,"over":18446744073709551616}',
    '{"f":1.5,"e":1e-5,"g":-0.0,"h":-0,"i":1E+3}',
    '{"inf":1e999}',
    '{"nan":NaN,"x":Infinity,"y":-Infinity}',
    '{"s":"\\u0000\\ud83d\\ude00 caf\\u00e9"}',
    '{"lone":"\\ud800"}',
    '{"t":"tab\\t \\"q\\" \\\\ \\/"}',
    '  [1, 2 , {"k" : "v"} ]  ',
    '"just a string"',
    '{"unterminated": ',
    '{"a":1}x',
    '',
]


def _outcome(fn: Any, data: Any) -> Any:
    try:
        value = fn(data)
    except (ValueError, fastjson.NotFinite) as exc:  # the kind of failure is part of the result
        return ("raised", type(exc).__name__)
    # repr: 1 vs 1.0, nan, and int vs float are told apart
    return ("ok", repr(value))


@pytest.mark.parametrize("doc", DOCS)
def test_loads_gives_exactly_what_json_loads_gives(doc: str) -> None:
    assert _outcome(fastjson.loads, doc) == _outcome(json.loads, doc)
    raw = doc.encode()
    assert _outcome(fastjson.loads, raw) == _outcome(json.loads, raw)


def test_loads_of_bytes_json_loads_takes_and_orjson_does_not() -> None:
    for raw in ('{"a":"b"}'.encode("utf-16"), b'\xef\xbb\xbf{"a":1}', b'{"a":"\xff"}',
                b'{"a":"\xed\xa0\x80"}'):
        assert _outcome(fastjson.loads, raw) == _outcome(json.loads, raw)


@pytest.mark.parametrize("doc", DOCS)
def test_loads_finite_refuses_only_what_would_not_be_finite(doc: str) -> None:
    expected = _outcome(json.loads, doc)
    got = _outcome(fastjson.loads_finite, doc)
    if any(word in doc for word in ("1e999", "NaN")):
        assert got == ("raised", "NotFinite")
    else:
        assert got == expected


@pytest.mark.parametrize("value", [
    {"v": 1, "s": "caf\u00e9 \U0001F600", "n": None, "l": [1, 2.5, True], "d": {"x": "\t\n\"\\"}},
    {"big": 2**70, "neg": -(2**64)},
    {"f": 1e-5, "g": 1e16, "h": 0.1},
    {"k": "\u2028\u2029\x7f\x1f"},
])
def test_dumps_round_trips_to_the_same_value(value: dict[str, Any]) -> None:
    out = fastjson.dumps(value)
    assert isinstance(out, bytes)
    assert json.loads(out) == value
    assert out == json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode() or (
        "f" in value)  # a float's bytes may differ (1e-05 / 1e-5), never its value


def test_dumps_of_a_lone_surrogate_raises_unicode_encode_error_as_before() -> None:
    with pytest.raises(UnicodeEncodeError):
        fastjson.dumps({"s": "lone \ud800"})
    assert json.loads(fastjson.dumps({1: "int key"})) == {"1": "int key"}


def test_the_fallback_runs_the_same_tests_without_orjson() -> None:
    root = support.ROOT
    env = dict(os.environ, LUMIO_INGESTD_NO_ORJSON="1")
    probe = subprocess.run([sys.executable, "-c", "from lumio_ingestd import fastjson; "
                            "print(fastjson.USING_ORJSON)"], cwd=root, env=env,
                           capture_output=True, text=True, timeout=60, check=True)
    assert probe.stdout.strip() == "False"
    if os.environ.get("LUMIO_INGESTD_NO_ORJSON"):
        return  # this is the child run itself
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/base/test_fastjson.py",
         "tests/sources/test_hotpath.py", "tests/base/test_model.py"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stdout[-3000:]
