"""The command line as a user runs it: exit codes and messages."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import support
from support import write_ini

ROOT = support.ROOT
EXAMPLE = ROOT / "etc" / "lumio" / "ingestd.ini"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lumio_ingestd", *args], capture_output=True,
                          text=True, timeout=60, env=env or {"PATH": "/usr/bin:/bin"}, cwd=ROOT)


def test_example_config_passes_check_config() -> None:
    result = _cli("-c", str(EXAMPLE), "check-config")
    assert result.returncode == 0, result.stderr
    assert "configuration OK" in result.stdout


def test_config_from_environment_variable() -> None:
    result = _cli("check-config", env={"PATH": "/usr/bin:/bin", "LUMIO_INGESTD_CONFIG": str(EXAMPLE)})
    assert result.returncode == 0, result.stderr
    assert str(EXAMPLE) in result.stdout


def test_bad_config_exits_78_naming_file_section_and_key(tmp_path: Path) -> None:
    path = write_ini(tmp_path / "bad.ini", {"timescale": {"pool_size": "five"},
                                            "chat": {"flush_intervall_secs": 5}})
    for command in ("check-config", "migrate", "run"):
        result = _cli("-c", str(path), command)
        assert result.returncode == 78, (command, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert any(str(path) in line and "[timescale]" in line and "pool_size" in line for line in lines)
        assert any("[chat]" in line and "flush_intervall_secs" in line for line in lines)


def test_missing_config_file_exits_78(tmp_path: Path) -> None:
    result = _cli("-c", str(tmp_path / "absent.ini"), "check-config")
    assert result.returncode == 78
    assert str(tmp_path / "absent.ini") in result.stderr


def test_usage_errors_exit_64() -> None:
    assert _cli("no-such-command").returncode == 64
    assert _cli("-c").returncode == 64
    assert _cli("check-config", "--bogus").returncode == 64


def test_check_config_contacts_no_server(tmp_path: Path) -> None:
    """Point every server at a listener we own and see that nobody connects."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted: list[object] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                accepted.append(listener.accept())
            except TimeoutError:
                continue

    th = threading.Thread(target=watch)
    th.start()
    try:
        path = write_ini(tmp_path / "c.ini", {
            "redis": {"url": f"redis://127.0.0.1:{port}/0"},
            "timescale": {"dsn": f"postgresql://lumio@127.0.0.1:{port}/lumio"},
            "twitch": {"helix_url": f"http://127.0.0.1:{port}/helix"},
        })
        result = _cli("-c", str(path), "check-config")
        assert result.returncode == 0, result.stderr
    finally:
        done.set()
        th.join(5)
        listener.close()
    assert accepted == []


def test_check_config_never_prints_secrets(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("s3cr3t-value\n")
    path = write_ini(tmp_path / "c.ini", {"http": {"emit_token_file": secret},
                                          "timescale": {"dsn": "postgresql://lumio:pw123@127.0.0.1/lumio"}})
    result = _cli("-c", str(path), "check-config")
    assert result.returncode == 0, result.stderr
    assert "s3cr3t-value" not in result.stdout + result.stderr
    assert "pw123" not in result.stdout + result.stderr
