"""Puts the repository, tests/ and bench/ on sys.path, so a bench script imports the
package, the test harness and its sibling scripts however it is started. Every bench
script imports this first (Python already puts bench/ itself on the path).

DURABLE_PG: PostgreSQL settings for measurements that must pay for durability (the
harness turns fsync off for speed in tests)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _extra in (ROOT, ROOT / "tests", ROOT / "bench"):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))

DURABLE_PG = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}


def write_result(name: str, result: Any) -> Path:
    """`result` as bench/results/NAME.json (the folder made if need be); says where."""
    out = ROOT / "bench" / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {out.relative_to(ROOT)}")
    return out
