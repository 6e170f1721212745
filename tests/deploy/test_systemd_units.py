"""The systemd units: `systemd-analyze verify` and the offline security rating.

The tools come with the Debian package `systemd` (no systemd as PID 1 is
needed). `verify` runs with `--root` on a temporary tree that holds the units
and an executable at the ExecStart path, since verify insists that the
binary exists; `--recursive-errors=no` makes an unknown key an error instead
of a warning, which is what catches typos.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import support
from lumio_ingestd.config import DaemonConfig

ROOT = support.ROOT
UNITS = ROOT / "systemd"
SERVICE = UNITS / "lumio-ingestd.service"
TEMPLATE = UNITS / "lumio-ingestd@.service"
SYSUSERS = UNITS / "lumio-ingestd.sysusers"
EXEC = "/opt/lumio-ingestd/bin/lumio-ingestd"
# (file, the name verify and security load it under)
UNIT_NAMES = [(SERVICE, "lumio-ingestd.service"), (TEMPLATE, "lumio-ingestd@0.service")]


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} not found: install the Debian package `systemd` (apt-get install systemd)"
    return path


@pytest.fixture
def unit_root(tmp_path: Path) -> Path:
    """A root tree for --root: the units under /etc/systemd/system and the ExecStart binary."""
    root = tmp_path / "root"
    units = root / "etc/systemd/system"
    units.mkdir(parents=True)
    for unit in (SERVICE, TEMPLATE):
        shutil.copy(unit, units / unit.name)
    binary = root / EXEC.lstrip("/")
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    return root


def _verify(root: Path, name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_tool("systemd-analyze"), "verify", "--man=no", "--recursive-errors=no",
                           f"--root={root}", name], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("unit", "name"), UNIT_NAMES, ids=["service", "template"])
def test_systemd_analyze_verify_passes(unit_root: Path, unit: Path, name: str) -> None:
    result = _verify(unit_root, name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Unknown" not in result.stderr, result.stderr


def test_verify_would_catch_a_typo(unit_root: Path) -> None:
    """The check above can fail: a misspelt key makes verify fail."""
    unit = unit_root / "etc/systemd/system" / SERVICE.name
    unit.write_text(unit.read_text().replace("TimeoutStopSec=", "TimeoutStopSecs="))
    result = _verify(unit_root, SERVICE.name)
    assert result.returncode != 0 and "TimeoutStopSecs" in result.stderr


@pytest.mark.parametrize(("unit", "name"), UNIT_NAMES, ids=["service", "template"])
def test_security_exposure_is_below_2(unit_root: Path, unit: Path, name: str) -> None:
    result = subprocess.run([_tool("systemd-analyze"), "security", "--offline=yes", f"--root={unit_root}",
                             "--no-pager", name], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", result.stdout)
    assert m, result.stdout
    assert float(m.group(1)) < 2.0, result.stdout


def _settings(unit: Path) -> dict[str, list[str]]:
    """Key -> every value it is given (unit files repeat keys), comments and sections dropped."""
    out: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key, []).append(value)
    return out


def _seconds(text: str) -> float:
    m = re.fullmatch(r"([0-9.]+)(ms|s|min)?", text)
    assert m, text
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, None: 1.0, "min": 60.0}[m.group(2)]


@pytest.mark.parametrize("unit", [SERVICE, TEMPLATE], ids=["service", "template"])
def test_units_say_what_the_daemon_relies_on(unit: Path) -> None:
    s = _settings(unit)
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"]
    assert s["Restart"] == ["on-failure"] and s["RestartPreventExitStatus"] == ["78"]
    # Comfortably above the drain budget, so SIGKILL never cuts the final flush.
    assert _seconds(s["TimeoutStopSec"][0]) >= DaemonConfig().shutdown_timeout_secs + 5
    assert _seconds(s["WatchdogSec"][0]) >= 10
    assert s["ConfigurationDirectory"] == ["lumio"]
    assert s["StateDirectory"][0].startswith("lumio-ingestd")
    assert s["LoadCredential"] and all(":" in v for v in s["LoadCredential"])
    assert "ProcSubset" not in s  # the process metrics read /proc/stat
    assert s["ExecStart"][0].startswith(EXEC + " ") and s["ExecStart"][0].endswith(" run")
    assert s["User"] == ["lumio-ingestd"]


def test_the_template_reads_the_instance_file() -> None:
    s = _settings(TEMPLATE)
    assert "--config /etc/lumio/ingestd-%i.ini" in s["ExecStart"][0]
    assert s["AssertPathExists"] == ["/etc/lumio/ingestd-%i.ini"]
    assert s["StateDirectory"] == ["lumio-ingestd/%i"]
    assert s["SyslogIdentifier"] == ["lumio-ingestd@%i"]


def test_sysusers_file_creates_the_service_user(tmp_path: Path) -> None:
    result = subprocess.run([_tool("systemd-sysusers"), f"--root={tmp_path}", "--dry-run", str(SYSUSERS)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Creating user 'lumio-ingestd'" in result.stdout + result.stderr
