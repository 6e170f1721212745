"""The layering rule of STYLE.md: sources hand chat and events over; they never talk to storage.

A module under lumio_ingestd/sources/ may not import a Redis or PostgreSQL client, nor the
daemon's pool or Redis connection: state a platform keeps goes through a store module of its
own (jetstream/store.py, seventv/store.py, sessions.py, seen.py), handed to the source.
"""

from __future__ import annotations

import ast
from pathlib import Path

SOURCES = Path(__file__).parent.parent / "lumio_ingestd" / "sources"
FORBIDDEN_MODULES = ("redis", "psycopg2")
FORBIDDEN_OWN = ("db.pool", "redisclient")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import, relative ones resolved against the package."""
    package = ".".join(path.relative_to(SOURCES.parent.parent).with_suffix("").parts[:-1])
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            found += [(node.lineno, module)]
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def test_no_source_module_imports_a_storage_client() -> None:
    modules = sorted(SOURCES.rglob("*.py"))
    assert len(modules) > 20, "the sources package moved?"
    offending = []
    for path in modules:
        for line, module in _imports(path):
            top = module.split(".")[0]
            own = module.removeprefix("lumio_ingestd.")
            if top in FORBIDDEN_MODULES or any(own == f or own.startswith(f + ".") for f in FORBIDDEN_OWN):
                offending.append(f"{path.relative_to(SOURCES.parent.parent)}:{line}: {module}")
    assert not offending, "sources import storage clients:\n" + "\n".join(offending)


def test_the_check_sees_relative_imports() -> None:
    probe = SOURCES / "twitch" / "source.py"
    modules = {m for _, m in _imports(probe)}
    assert "lumio_ingestd.sources.base" in modules
    assert "lumio_ingestd.metrics.Metrics" in modules
