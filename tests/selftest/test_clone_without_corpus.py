"""A user's clone has no recorded corpus beside it: its conformance tests run, none is skipped.

The recorded platform frames live outside the repository (`../shared/corpus`);
a clone elsewhere does not have them. This copies the repository's package,
tests and configuration to a fresh directory (with no `../shared` next to
it), runs the conformance tests there in a child pytest, as `make test` would,
and checks that every one ran on the project's own frames and passed, and
that the run said so in its summary.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import support

ROOT = support.ROOT
CONFORMANCE = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests/sources").glob("*/test_*_corpus.py"))
CONFORMANCE.append("tests/sources/test_hotpath_every_path.py")


def test_a_clone_without_the_recorded_corpus_runs_every_conformance_test(tmp_path: Path) -> None:
    clone = tmp_path / "somewhere" / "lumio-ingestd"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache")
    for part in ("lumio_ingestd", "tests"):
        shutil.copytree(ROOT / part, clone / part, ignore=ignore)
    for name in ("pyproject.toml", "setup.cfg"):
        shutil.copy(ROOT / name, clone / name)
    assert not (clone.parent / "shared").exists()
    env = {k: v for k, v in os.environ.items() if k != "LUMIO_INGESTD_CORPUS"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             *CONFORMANCE], cwd=clone, env=env, capture_output=True, text=True,
                            timeout=600)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    summary = re.search(r"^(\d+) passed(.*) in [\d.]+s", out, re.M)
    assert summary, out[-3000:]
    assert int(summary.group(1)) >= 20 and "skipped" not in summary.group(2), summary.group(0)
    assert "SKIPPED" not in out, out[-3000:]
    assert (f"corpus: no recorded corpus at {clone.parent / 'shared' / 'corpus'} (it is not part of "
            "the repository)") in out, out[-3000:]
    assert "run on the project's own frames" in out
