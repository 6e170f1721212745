"""Small helpers shared by the tests: writing configs that the real loader reads."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from lumio_ingestd.config import Config, load


def dbname_of(pg_dsn: str) -> str:
    """The database name in a libpq key/value DSN (what the `pg_dsn` fixture gives)."""
    return dict(kv.split("=", 1) for kv in pg_dsn.split())["dbname"]


def write_ini(path: Path, sections: Mapping[str, Mapping[str, object]]) -> Path:
    lines: list[str] = []
    for section, keys in sections.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {value}" for key, value in keys.items())
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def make_config(tmp_path: Path, *, pg_url: str = "postgresql://lumio@127.0.0.1:1/lumio",
                redis_url: str = "redis://127.0.0.1:1/0",
                sections: Mapping[str, Mapping[str, object]] | None = None,
                environ: Mapping[str, str] | None = None) -> Config:
    """Build a Config through the real loader, with servers and overrides filled in."""
    merged: dict[str, dict[str, object]] = {
        "daemon": {"state_dir": tmp_path / "state", "instance_id": "test-1"},
        "redis": {"url": redis_url},
        "timescale": {"dsn": pg_url},
    }
    for section, keys in (sections or {}).items():
        merged.setdefault(section, {}).update(keys)
    path = write_ini(tmp_path / "ingestd.ini", merged)
    return load(str(path), environ or {})
