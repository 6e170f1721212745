"""The tests' support package: configs the real loader reads, and where things are.

Its modules hold each part's rigs and helpers (`support.chat`, `support.twitch`,
...) and the real servers (`support.harness`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lumio_ingestd.config import Config, load
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources import SourceDeps
from lumio_ingestd.stores.seen import SeenDeliveries
from lumio_ingestd.worker import Worker

#: The repository's root.
ROOT = Path(__file__).resolve().parents[2]
#: The corpus of recorded third-party platform frames, `../shared/corpus` beside the
#: repository where it exists (it does in CI; it is not part of the repository, and its
#: frames are never copied in). `LUMIO_INGESTD_CORPUS` points elsewhere (a path that does
#: not exist: a clone without it). Where it is absent, the conformance tests read the
#: project's own frames (`support.corpus`) instead and say so in pytest's header.
CORPUS = Path(os.environ.get("LUMIO_INGESTD_CORPUS") or ROOT.parent / "shared" / "corpus")


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


def source_deps(**given: Any) -> SourceDeps:
    """A `SourceDeps` for building sources without the runtime: what a test does not give is
    absent (None), or a function that fails the test when a build calls it."""

    def unused(what: str) -> Callable[..., Any]:
        def called(*args: object, **kwargs: object) -> Any:
            raise AssertionError(f"the build used {what}")
        return called

    defaults: dict[str, Any] = {
        "metrics": Metrics(), "chat_queue": lambda name: None, "persist_chat": unused("persist_chat"),
        "persist_event": unused("persist_event"), "alerts": None, "sessions": None,
        "seen": lambda platform: SeenDeliveries(None, platform)}
    return SourceDeps(**{**defaults, **given})


def only(workers: Sequence[Worker]) -> Any:
    """The one worker a build made, or None when it made none."""
    assert len(workers) <= 1, workers
    return workers[0] if workers else None
