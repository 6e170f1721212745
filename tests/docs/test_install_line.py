"""The README's install line holds every package `make test` needs on a fresh machine.

A newcomer runs the README's `apt-get install ...` line and then `make test`;
CI installs its own list (`.ci/run`). When a test starts calling a new
program, or the Makefile's test target does, the line must grow with it, or
the newcomer's `make test` fails where CI passes. So this test reads the
commands from where they are called (the Makefile's test target and what it
depends on; `shutil.which`, `subprocess.run([...])` and the like in tests/
and the dev servers), maps each to the Debian package that brings it, and
checks that the README's line, the same line in docs/development.rst and
`.ci/run` all install that package.
"""

from __future__ import annotations

import re

import support

ROOT = support.ROOT

#: Each program `make test` runs, and the Debian package that brings it (a package the
#: install line names: redis-cli comes with redis-server, through its dependency redis-tools).
#: A program missing here fails `test_every_command_make_test_runs_has_a_package`.
COMMAND_PACKAGES = {
    "make": "make",
    "python3 -m venv": "python3-venv",
    "redis-server": "redis-server",
    "redis-cli": "redis-server",
    "initdb": "postgresql",
    "postgres": "postgresql",
    "pg_config": "postgresql",
    "psql": "postgresql",
    "promtool": "prometheus",
    "systemd-analyze": "systemd",
    "systemd-sysusers": "systemd",
    "openssl": "openssl",
}
#: In every Debian install (Priority: required), and shell built-ins: nothing to install.
ALWAYS_THERE = {"mount", "umount", "touch", "command", "echo", "rm", "sh", "true"}

# Where a test or a dev server names a program it runs.
_CALLS = (
    re.compile(r"""shutil\.which\(\s*["']([\w.+-]+)["']"""),
    re.compile(r"""_tool\(\s*["']([\w.+-]+)["']"""),
    re.compile(r"""subprocess\.(?:run|Popen|check_call|check_output)\(\s*\[\s*["']([\w.+-]+)["']"""),
    re.compile(r"""with_name\(\s*["']([\w.+-]+)["']\)"""),
    re.compile(r"""bindir\(\)\s*/\s*["']([\w.+-]+)["']"""),
    re.compile(r"""bindir\s*/\s*["']([\w.+-]+)["']"""),
)


def install_line(text: str, where: str) -> list[str]:
    """The packages of the one `apt-get install` line (continued with a backslash) in `text`."""
    found = re.findall(r"^ +apt-get install((?:[^\n]*\\\n)*[^\n]*)$", text, re.M)
    assert len(found) == 1, f"{where}: expected one apt-get install line, found {len(found)}"
    words = found[0].replace("\\\n", " ").split()
    return [w for w in words if not w.startswith("-")]


def make_variables(makefile: str) -> dict[str, str]:
    return {m.group(1): m.group(2).strip()
            for m in re.finditer(r"^(\w+)\s*[?:]?=\s*(.*)$", makefile, re.M)}


def make_recipes(makefile: str) -> dict[str, tuple[list[str], list[str]]]:
    """target -> (prerequisites, recipe lines), for the simple rules this Makefile has."""
    rules: dict[str, tuple[list[str], list[str]]] = {}
    current: str | None = None
    for line in makefile.splitlines():
        if line.startswith("\t") and current is not None:
            rules[current][1].append(line.strip())
            continue
        m = re.match(r"^([\w$().-]+)\s*:(?!=)\s*(.*)$", line)
        current = None
        if m and not m.group(1).startswith("."):
            current = m.group(1)
            rules[current] = (m.group(2).split(), [])
    return rules


def makefile_test_commands() -> set[str]:
    """The programs the recipes of `make test` (and what it depends on) run from outside .venv."""
    makefile = (ROOT / "Makefile").read_text()
    variables = make_variables(makefile)
    rules = make_recipes(makefile)

    def expand(text: str) -> str:
        for _ in range(5):
            text = re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), ""), text)
        return text

    commands: set[str] = set()
    todo, seen = ["test"], set()
    while todo:
        target = todo.pop()
        if target in seen:
            continue
        seen.add(target)
        prerequisites, recipe = rules.get(expand(target), rules.get(target, ([], [])))
        for p in prerequisites:
            todo.append(p if p in rules else expand(p))
        for line in recipe:
            for part in re.split(r"&&|\|\||;|\{|\}", expand(line).lstrip("@-")):
                words = part.split()
                if not words or "/" in words[0] and words[0].startswith(variables["VENV"]):
                    continue  # empty, or a program of the virtualenv
                if words[0] == "command":  # `command -v PROGRAM`
                    words = words[2:3]
                if not words:
                    continue
                if words[:3] == [variables["PYTHON"], "-m", "venv"]:
                    commands.add("python3 -m venv")
                elif words[0] != "exit":
                    commands.add(words[0])
    return commands | {"make"}


def called_commands() -> dict[str, set[str]]:
    """Program -> the files that run it, in tests/ and the dev servers the tests start."""
    out: dict[str, set[str]] = {}
    files = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "lumio_ingestd" / "devkit").rglob("*.py")]
    for path in files:
        text = path.read_text()
        for pattern in _CALLS:
            for name in pattern.findall(text):
                out.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    # The PostgreSQL binaries are looked up as a pair by name.
    if "find_pg_bindir" in (ROOT / "lumio_ingestd/devkit/servers.py").read_text():
        for name in ("initdb", "postgres", "pg_config"):
            out.setdefault(name, set()).add("lumio_ingestd/devkit/servers.py")
    return out


def test_the_scan_finds_the_programs_it_is_meant_to_find() -> None:
    # The scan itself works: these are known to be called (else the patterns rotted).
    found = set(called_commands()) | makefile_test_commands()
    assert {"redis-server", "redis-cli", "initdb", "postgres", "promtool", "systemd-analyze",
            "systemd-sysusers", "openssl", "python3 -m venv", "make"} <= found, found


def test_every_command_make_test_runs_has_a_package() -> None:
    called = called_commands()
    for name in makefile_test_commands():
        called.setdefault(name, set()).add("Makefile")
    unknown = {name: sorted(where) for name, where in called.items()
               if name not in COMMAND_PACKAGES and name not in ALWAYS_THERE}
    assert not unknown, (f"make test runs programs with no Debian package named: {unknown}; add "
                         "each to COMMAND_PACKAGES here and its package to the install line of "
                         "README.rst, docs/development.rst and .ci/run")


def test_the_readme_line_installs_every_package_make_test_needs() -> None:
    readme = install_line((ROOT / "README.rst").read_text(), "README.rst")
    development = install_line((ROOT / "docs/development.rst").read_text(), "docs/development.rst")
    assert development == readme, "docs/development.rst and README.rst must give the same line"
    needed = set(COMMAND_PACKAGES.values())
    assert needed <= set(readme), f"README.rst's install line misses {sorted(needed - set(readme))}"
    ci = (ROOT / ".ci/run").read_text()
    in_ci = set(re.findall(r"need\+=\(([\w.+-]+)\)", ci))
    assert needed <= in_ci, f".ci/run does not install {sorted(needed - in_ci)}"
