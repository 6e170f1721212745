"""The Debian package's source files agree with each other and with the units (offline).

`make deb-test` installs the built package and checks it end to end; these
checks are the fast ones: the user, state directory and paths named in the
units, sysusers.d, tmpfiles.d and the build script are the same; the
maintainer scripts are valid sh and never enable or start the service.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import support

ROOT = support.ROOT
DEB = ROOT / "packaging" / "deb"
SCRIPTS = ["postinst", "prerm", "postrm"]


def _unit_values(unit: Path, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in unit.read_text().splitlines() if line.startswith(key + "=")]


def test_user_and_state_directory_agree() -> None:
    sysusers = (ROOT / "systemd" / "lumio-ingestd.sysusers").read_text()
    user_line = next(ln for ln in sysusers.splitlines() if ln.startswith("u "))
    _, user, _, _, home, *_ = re.findall(r'"[^"]*"|\S+', user_line)
    tmpfiles = (DEB / "lumio-ingestd.tmpfiles").read_text()
    kind, path, mode, owner, group, _ = next(ln for ln in tmpfiles.splitlines()
                                             if ln and not ln.startswith("#")).split()
    unit = ROOT / "systemd" / "lumio-ingestd.service"
    assert _unit_values(unit, "User") == [user] and _unit_values(unit, "Group") == [user]
    assert (kind, owner, group, mode) == ("d", user, user, "0700")
    assert path == home == "/var/lib/" + _unit_values(unit, "StateDirectory")[0]
    assert _unit_values(unit, "StateDirectoryMode") == ["0700"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_maintainer_scripts_are_sh_and_never_enable_or_start(name: str) -> None:
    script = DEB / name
    assert script.stat().st_mode & 0o111
    result = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    code = "\n".join(ln for ln in script.read_text().splitlines() if not ln.lstrip().startswith("#"))
    assert not re.search(r"\b(enable|start|restart|userdel|deluser|groupdel|redis-cli|psql)\b",
                         code.replace("try-restart", "")), code
    # systemctl only where systemd runs.
    for line in code.splitlines():
        if "systemctl" in line or "deb-systemd-invoke" in line:
            assert "/run/systemd/system" in code


def test_purge_removes_the_state_but_not_the_user() -> None:
    postrm = (DEB / "postrm").read_text()
    assert 'rm -rf "${DPKG_ROOT}/var/lib/lumio-ingestd"' in postrm
    assert "purge" in postrm and "userdel" not in postrm

