"""Re-resolve both lock files: `make lock`.

Writes two hash-pinned requirement files from setup.cfg's ranges:

- packaging/requirements.lock: the run-time dependencies (install_requires),
  what the Debian package installs (`make deb`);
- packaging/requirements-dev.lock: everything the development venv holds
  (`make test`, `make demo`, `make bench`, `.ci/run`, `make deb-test`): the
  run-time pins above, copied as they are, plus the `test` and `demo` extras
  and setuptools (the editable install builds without isolation, so that no
  unpinned build tool is fetched).

Each set is resolved for the interpreter the package runs on
(/usr/bin/python3.11) with `pip install --dry-run --report`, binary wheels
only; the dev set is resolved with the run-time set pinned, so the two
agree by construction (a test checks it). A dependency pulled in only under
an environment marker (async-timeout: redis on Python < 3.11.3) keeps that
marker, so one file serves other 3.11+ interpreters too. Every pin lists the
sha256 of every wheel of that version on the index, plus the one pip chose
here, so `pip install --require-hashes` accepts the wheel of any platform.

Nothing else changes a lock: a fresh clone installs exactly these versions,
whatever was released since. Run it to take up new releases on purpose, or
after changing a dependency in setup.cfg; then run `make test` with the new
locks and commit them with what the new versions needed.
"""

from __future__ import annotations

import configparser
import json
import re
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_LOCK = ROOT / "packaging" / "requirements.lock"
DEV_LOCK = ROOT / "packaging" / "requirements-dev.lock"
PYTHON = "/usr/bin/python3.11"
# The index's JSON file listing (PEP 691): every wheel of a release, with its sha256.
INDEX = "https://pypi.org/simple"
DEV_EXTRAS = ("test", "demo")
# The build backend of the editable install (pyproject.toml's build-system).
BUILD = ["setuptools>=64"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Pin:
    name: str
    version: str
    hashes: set[str]
    markers: set[str] = field(default_factory=set)  # empty: needed everywhere

    def lines(self) -> list[str]:
        marker = " or ".join(f"({m})" if len(self.markers) > 1 else m for m in sorted(self.markers))
        head = f"{self.name}=={self.version}" + (f" ; {marker}" if marker else "")
        digests = sorted(self.hashes)
        return [f"{head} \\"] + [f"    --hash=sha256:{d}" + (" \\" if i < len(digests) - 1 else "")
                                 for i, d in enumerate(digests)]


def setup_requirements() -> tuple[list[str], dict[str, list[str]]]:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")

    def split(text: str) -> list[str]:
        return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]

    extras = {k: split(v) for k, v in setup["options.extras_require"].items()}
    return split(setup["options"]["install_requires"]), extras


def resolve(venv_python: Path, requirements: list[str], work: Path) -> dict[str, Pin]:
    """What pip would install for `requirements`, with the marker of every dependency
    that only some environments pull in."""
    report = work / "report.json"
    subprocess.run([str(venv_python), "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                    "--only-binary=:all:", "--report", str(report), *requirements], check=True)
    items = json.loads(report.read_text())["install"]
    pins = {canonical(i["metadata"]["name"]): Pin(canonical(i["metadata"]["name"]), i["metadata"]["version"],
                                                  {i["download_info"]["archive_info"]["hashes"]["sha256"]})
            for i in items}
    unconditional = {canonical(re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0]) for r in requirements}
    for item in items:
        for dep in item["metadata"].get("requires_dist") or []:
            spec, _, marker = dep.partition(";")
            name = canonical(re.split(r"[<>=!~ (\[]", spec.strip(), maxsplit=1)[0])
            if name not in pins or "extra" in marker:
                continue
            if marker.strip():
                pins[name].markers.add(marker.strip().replace("'", '"'))
            else:
                unconditional.add(name)
    for name in unconditional & pins.keys():
        pins[name].markers.clear()
    return pins


def add_index_hashes(pins: dict[str, Pin]) -> None:
    for pin in pins.values():
        request = urllib.request.Request(f"{INDEX}/{pin.name}/",
                                         headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                files = json.load(answer)["files"]
        except OSError as exc:
            raise SystemExit(f"lock: cannot list {pin.name}'s files on {INDEX}: {exc}") from exc
        for f in files:
            parts = f["filename"].split("-")
            if f["filename"].endswith(".whl") and len(parts) >= 5 and parts[1] == pin.version:
                pin.hashes.add(f["hashes"]["sha256"])


def write(path: Path, header: list[str], pins: list[Pin]) -> None:
    lines = [f"# {h}" for h in header]
    for pin in sorted(pins, key=lambda p: p.name):
        lines += pin.lines()
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path.relative_to(ROOT)}: {len(pins)} distributions")


def main() -> int:
    runtime_wanted, extras = setup_requirements()
    with tempfile.TemporaryDirectory(prefix="lumio-lock-") as tmp:
        work = Path(tmp)
        subprocess.run([PYTHON, "-m", "venv", str(work / "venv")], check=True)
        python = work / "venv" / "bin" / "python3"
        runtime = resolve(python, runtime_wanted, work)
        pinned = [f"{p.name}=={p.version}" for p in runtime.values() if not p.markers]
        dev_wanted = pinned + [r for e in DEV_EXTRAS for r in extras[e]] + BUILD
        dev = resolve(python, dev_wanted, work)
    # A run-time dependency under a marker this interpreter does not meet stays out of the
    # dev resolution, and one it meets is in both: either way the dev lock takes the
    # run-time pin as it is.
    dev.update(runtime)
    add_index_hashes(dev)
    made = "Generated by `make lock` (packaging/lock.py) from setup.cfg; do not edit."
    write(RUNTIME_LOCK, ["The run-time dependencies: what the Debian package installs (make deb),",
                         "each with the sha256 of every wheel of that version. " + made],
          list(runtime.values()))
    write(DEV_LOCK, ["The development venv (make test, make demo, make bench, .ci/run): the run-time",
                     "pins of requirements.lock and the test and demo tools. " + made],
          list(dev.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
