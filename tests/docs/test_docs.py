"""The documentation: README.rst and docs/.

Blocks generated from code (configuration keys, metrics) must match it; the
README stays a short landing page; every alert has a runbook with a stable
anchor in docs/operating.rst; links between the documents resolve; nothing
cites notes outside the repository; every package path named exists.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from lumio_ingestd.config import SCHEMA
from tools.config_docs import CONFIGURATION, rewrite
from tools.metrics_docs import OPERATING
from tools.metrics_docs import rewrite as rewrite_metrics


def _root() -> Path:
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file() and (parent / "lumio_ingestd").is_dir():
            return parent
    raise AssertionError("the repository root was not found above this test")


ROOT = _root()
README = ROOT / "README.rst"
DOCS = ROOT / "docs"
RULES = ROOT / "monitoring" / "prometheus" / "lumio-ingestd.rules.yml"
README_MAX_LINES = 250

#: What must not appear in the docs: notes outside the repository, issue and wave numbers.
FORBIDDEN = (
    re.compile(r"\b(?:PROTOCOLS|INTERFACE|RELIABILITY|STYLE|DESIGN|OPS)\.md\b"),
    re.compile(r"\bissues?\s+#?\d+", re.I),
    re.compile(r"(?<![-\w])waves?\s+\d+", re.I),
    re.compile(r"\bseeds?\s+0\d\d\b", re.I),
    re.compile(r"\.\./shared\b|/work/shared\b"),
)
_ADORNMENT = re.compile(r"""^([=\-~^"'`#*+<>:.])\1+\s*$""")
_LABEL = re.compile(r"^\.\. _([^:`]+):\s*$", re.M)
_LINK = re.compile(r"`[^`<]*<([^<>`\s]+)>`__?")
_PACKAGE_PATH = re.compile(r"lumio_ingestd/[\w./<>*-]*")


def documents() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.rst"))]


def make_id(name: str) -> str:
    """The anchor docutils makes of a label or a section title."""
    text = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().lower()
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def anchors(text: str) -> set[str]:
    """Every anchor of a document: its explicit labels and its section titles."""
    found = {make_id(label) for label in _LABEL.findall(text)}
    lines = text.splitlines()
    for title, under in zip(lines, lines[1:], strict=False):
        if title.strip() and not _ADORNMENT.match(title) and _ADORNMENT.match(under) \
                and len(under.rstrip()) >= len(title.rstrip()):
            found.add(make_id(title.replace("``", "").replace("*", "")))
    return found


def test_configuration_documents_every_config_key() -> None:
    assert CONFIGURATION == DOCS / "configuration.rst"
    text = CONFIGURATION.read_text()
    assert rewrite(text) == text, "docs/configuration.rst is stale: run `make docs`"
    for s in SCHEMA:
        assert f"``{s.key}``" in text


def test_example_config_and_docs_name_the_same_keys() -> None:
    example = (ROOT / "etc/lumio/ingestd.ini").read_text()
    for s in SCHEMA:
        assert f"{s.key} =" in example, s.key


def test_operating_documents_every_metric() -> None:
    assert OPERATING == DOCS / "operating.rst"
    text = OPERATING.read_text()
    assert rewrite_metrics(text) == text, "docs/operating.rst is stale: run `make docs`"
    for name in ("events_persist_failures_total{outcome}", "events_dead_letter_depth",
                 "chat_messages_total{path}", "chat_quarantined_total", "events_quarantined_total",
                 "chat_dead_letter_depth", "chat_buffer_depth"):
        assert f"``{name}" in text, name  # the names other services rely on


def test_the_readme_is_a_short_landing_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, \
        f"README.rst has {len(text.splitlines())} lines; move detail into docs/"
    assert "make demo" in text
    assert "make test" in text
    assert "apt-get install" in text and " prometheus" in text  # promtool, for `make test`


def test_every_document_is_reachable_from_the_readme() -> None:
    readme = README.read_text()
    index = (DOCS / "index.rst").read_text()
    assert "docs/index.rst" in readme
    for doc in sorted(DOCS.glob("*.rst")):
        if doc.name != "index.rst":
            assert f"<{doc.name}>" in index, f"docs/index.rst does not link {doc.name}"


def _alert_runbooks() -> dict[str, str | None]:
    """alert name -> its runbook annotation (None when it has none)."""
    found: dict[str, str | None] = {}
    name = None
    for line in RULES.read_text().splitlines():
        if m := re.match(r"^\s*- alert:\s*(\S+)\s*$", line):
            name = m.group(1)
            found[name] = None
        elif name and (m := re.match(r"^\s*runbook:\s*\"?([^\"]*)\"?\s*$", line)):
            found[name] = m.group(1)
    return found


def test_every_alert_has_a_runbook_in_operating() -> None:
    runbooks = _alert_runbooks()
    assert len(runbooks) >= 10
    text = OPERATING.read_text()
    labels = {make_id(label): label for label in _LABEL.findall(text)}
    for name, runbook in runbooks.items():
        anchor = make_id(f"runbook-{name}")
        assert runbook == f"docs/operating.rst#{anchor}", f"{name}: runbook is {runbook!r}"
        assert anchor in labels, f"docs/operating.rst has no label for {name}"
        label, title = re.escape(labels[anchor]), re.escape(name)
        section = rf"^\.\. _{label}:\n\n{title}\n([-=~^])\1{{{len(name) - 1},}}$"
        assert re.search(section, text, re.M), f"the label of {name} is not on a section titled {name}"


def test_links_between_documents_resolve() -> None:
    broken = []
    for doc in documents():
        for target in _LINK.findall(doc.read_text()):
            if re.match(r"^[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.is_file():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".rst" and anchor not in anchors(dest.read_text()):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_docs_cite_nothing_outside_the_repository() -> None:
    found = []
    for doc in documents():
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            found += [f"{doc.relative_to(ROOT)}:{number}: {m.group(0)}"
                      for pattern in FORBIDDEN for m in pattern.finditer(line)]
    assert not found, "say it in the docs' own words, without outside notes or issue numbers:\n" \
        + "\n".join(found)


def _named_paths(text: str) -> set[str]:
    paths = set()
    for m in _PACKAGE_PATH.finditer(text):
        path = m.group(0).rstrip(".,;:)")
        if "<" not in path and "*" not in path:
            paths.add(path)
    return paths


def test_every_package_path_named_exists() -> None:
    missing = sorted({f"{path} ({doc.relative_to(ROOT)})"
                      for doc in documents() for path in _named_paths(doc.read_text())
                      if not (ROOT / path).exists()})
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def test_the_code_map_names_existing_parts() -> None:
    text = README.read_text()
    code_map = text[text.index("\nCode map\n"):text.index("\nDocumentation\n")]
    missing = []
    for name in sorted(set(re.findall(r"``([\w/.<>]+(?:/|\.py))``", code_map))):
        if "<" in name:
            continue
        tail = name.rstrip("/")
        package = ROOT / "lumio_ingestd"
        if not ((ROOT / tail).exists() or (package / tail).exists()
                or any(p.as_posix().endswith("/" + tail) for p in package.rglob(Path(tail).name))):
            missing.append(name)
    assert not missing, "the README's code map names parts that do not exist: " + ", ".join(missing)
