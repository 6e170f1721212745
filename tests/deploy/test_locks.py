"""The lock files: every dependency pinned with its hashes, the dev venv holding the
package's run-time pins, and the interpreter running these tests holding exactly the
dev lock (what `make venv` installs).

`make lock` (packaging/lock.py) writes both files; these tests say when it is due.
"""

from __future__ import annotations

import configparser
import importlib.metadata
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import support

RUNTIME_LOCK = support.ROOT / "packaging" / "requirements.lock"
DEV_LOCK = support.ROOT / "packaging" / "requirements-dev.lock"
HINT = "run `make lock` and commit both lock files"


@dataclass(frozen=True)
class Pin:
    version: str
    marker: str
    hashes: frozenset[str]

    def applies(self) -> bool:
        return not self.marker or Marker(self.marker).evaluate()


def read_lock(path: Path) -> dict[str, Pin]:
    text = re.sub(r"\\\n\s*", " ", path.read_text())  # one requirement a line
    pins: dict[str, Pin] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-z0-9-]+)==(\S+)(?: ; (.+?))?((?:\s+--hash=sha256:[0-9a-f]{64})+)\s*", line)
        assert m, f"{path.name}: requirement {number} is not `name==version [; marker] --hash=...`: {line!r}"
        name, version, marker, hashes = m.groups()
        assert name not in pins, f"{path.name}: {name} is pinned twice"
        pins[name] = Pin(version, marker or "", frozenset(re.findall(r"[0-9a-f]{64}", hashes)))
    return pins


def _setup_names(section: str, key: str) -> set[str]:
    setup = configparser.ConfigParser()
    setup.read(support.ROOT / "setup.cfg")
    return {str(canonicalize_name(Requirement(ln).name)) for ln in setup[section][key].splitlines()
            if ln.strip() and not ln.strip().startswith("#")}


def test_the_runtime_lock_pins_every_runtime_dependency() -> None:
    locked = read_lock(RUNTIME_LOCK)
    wanted = _setup_names("options", "install_requires")
    assert wanted <= locked.keys(), f"not locked: {sorted(wanted - locked.keys())} ({HINT})"
    # Anything else is pulled in by those, and only where a marker says so.
    extra = {name for name in locked.keys() - wanted if not locked[name].marker}
    assert not extra, f"locked for no dependency of setup.cfg: {sorted(extra)} ({HINT})"


def test_the_dev_lock_pins_every_tool_and_the_package_pins_as_they_are() -> None:
    runtime, dev = read_lock(RUNTIME_LOCK), read_lock(DEV_LOCK)
    for extra in ("test", "demo"):
        wanted = _setup_names("options.extras_require", extra)
        assert wanted <= dev.keys(), f"[{extra}] not locked: {sorted(wanted - dev.keys())} ({HINT})"
    differ = {name: (pin, dev.get(name)) for name, pin in runtime.items() if dev.get(name) != pin}
    assert not differ, f"the dev lock's run-time pins differ from the package's: {differ} ({HINT})"


def test_this_interpreter_runs_exactly_the_dev_lock() -> None:
    """What `make test` runs is what the lock says: no version resolved on the day."""
    installed = {str(canonicalize_name(d.metadata["Name"])): d.version
                 for d in importlib.metadata.distributions()}
    installed.pop("pip", None)  # the venv's own, from the interpreter that made it
    installed.pop("lumio-ingestd", None)
    wanted = {name: pin.version for name, pin in read_lock(DEV_LOCK).items() if pin.applies()}
    other = {name: (version, installed.get(name)) for name, version in wanted.items()
             if installed.get(name) != version}
    assert installed == wanted, (f"missing or other versions (locked, installed): {other}, "
                                 f"not locked: {sorted(installed.keys() - wanted.keys())} (run `make venv`)")
