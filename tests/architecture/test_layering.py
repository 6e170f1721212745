"""The layering rules, held through every import.

1. Sources hand chat and events over; they never talk to storage. Every module
   under `lumio_ingestd/sources/` (package `__init__`s included), imported
   alone in a fresh interpreter, leaves `redis` and `psycopg2` unloaded: what
   a source talks to are the protocols of `sources/interfaces.py`, whose
   implementations the runtime hands it.
2. No package imports one that imports it: the parts of `lumio_ingestd` form
   the order of `LAYERS`, and a module imports only from its own part or a
   lower one (function-level and type-checking imports included).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "lumio_ingestd"
STORAGE_CLIENTS = ("redis", "psycopg2")

#: Lowest first. "base" is the top-level modules the parts share (model, metrics, worker, logs,
#: outage, ...); "entry" is the command line (cli.py, __main__.py).
LAYERS = ("base", "config", "db", "web", "sources", "stores", "cluster", "chat", "events", "lifecycle",
          "runtime", "admin", "devkit", "entry")
ENTRY = ("cli", "__main__")

# Forks one child per module from an interpreter that has imported nothing of ours, so
# each import starts from the same clean state as `python -c "import MODULE"`, at a
# fraction of the cost of one interpreter per module.
_DRIVER = r"""
import importlib, json, os, sys
out = {}
for name in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(name)
            loaded = [m for m in CLIENTS if m in sys.modules]
        except BaseException as exc:
            loaded = ["import failed: %s: %s" % (type(exc).__name__, exc)]
        os.write(w, json.dumps(loaded).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    out[name] = json.loads(data)
print(json.dumps(out))
"""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _loaded_in_fresh_interpreters(modules: list[str]) -> dict[str, list[str]]:
    code = _DRIVER.replace("CLIENTS", repr(STORAGE_CLIENTS))
    proc = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True,
                          cwd=PACKAGE.parent, timeout=120, check=True)
    result: dict[str, list[str]] = json.loads(proc.stdout)
    return result


def test_no_module_under_sources_loads_a_storage_client() -> None:
    modules = sorted(_module_name(p) for p in (PACKAGE / "sources").rglob("*.py"))
    assert len(modules) > 30 and "lumio_ingestd.sources" in modules
    loaded = _loaded_in_fresh_interpreters(modules)
    offending = {m: found for m, found in loaded.items() if found}
    assert not offending, f"sources load storage clients: {offending}"


def test_the_fresh_import_check_sees_a_storage_client() -> None:
    # The stores do load them: the check above would see a source that reached one.
    loaded = _loaded_in_fresh_interpreters(["lumio_ingestd.stores.seen", "lumio_ingestd.db.pool"])
    assert loaded == {"lumio_ingestd.stores.seen": ["redis"], "lumio_ingestd.db.pool": ["psycopg2"]}


def part_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "lumio_ingestd":
        raise ValueError(module)
    if len(parts) == 1:
        return "base"
    if (PACKAGE / parts[1]).is_dir():
        return parts[1]
    return "entry" if parts[1] in ENTRY else "base"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of our own package, relative ones resolved."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # `from lumio_ingestd import chat` names a part too
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names
                      if target == "lumio_ingestd" and (PACKAGE / alias.name).is_dir()]
    return [(line, m) for line, m in found if m == "lumio_ingestd" or m.startswith("lumio_ingestd.")]


def test_every_part_has_a_layer() -> None:
    parts = {part_of(_module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert parts == set(LAYERS), parts ^ set(LAYERS)


def test_no_part_imports_a_part_above_it() -> None:
    rank = {part: n for n, part in enumerate(LAYERS)}
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = part_of(_module_name(path))
        for line, target in _imports(path):
            there = part_of(target)
            if rank[there] > rank[here]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {here} imports {there} ({target})")
    assert not upward, "imports against the layering:\n" + "\n".join(upward)


def test_the_layer_check_sees_relative_and_function_level_imports(tmp_path: Path) -> None:
    probe = PACKAGE / "runtime" / "build.py"
    targets = {m for _, m in _imports(probe)}
    assert "lumio_ingestd.chat.ingest" in targets  # imported inside build()
    assert part_of("lumio_ingestd.chat.ingest") == "chat" and part_of("lumio_ingestd.model") == "base"
    assert part_of("lumio_ingestd.cli") == "entry"
