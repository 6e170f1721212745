"""The shipped dashboard and alert rules refer to metrics the daemon exports, and are documented.

`make promtool` (part of `make test`) checks and unit-tests the rules; here:
every metric name in every dashboard expression and every rule exists in the
registry (`lumio_ingestd.metrics`, with the suffixes Prometheus adds), every
dashboard expression parses (promtool checks them as recording rules), the
dashboard takes its data source from a variable, and every alert has a
summary, a description, a runbook pointer, a severity, a unit test and a
runbook section in docs/operating.rst.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import support
from lumio_ingestd.metrics import Metrics

ROOT = support.ROOT
DASHBOARD = ROOT / "monitoring" / "grafana" / "lumio-ingestd.json"
RULES = ROOT / "monitoring" / "prometheus" / "lumio-ingestd.rules.yml"
RULE_TESTS = ROOT / "monitoring" / "prometheus" / "tests"
OPERATING = ROOT / "docs" / "operating.rst"

#: Series Prometheus itself makes, not the daemon.
PROMETHEUS_SERIES = {"up"}
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
             "group_right", "bool", "offset", "inf", "nan"}


def exported_names() -> set[str]:
    """Every series name the daemon's registry can export (labelled families included)."""
    names: set[str] = set()
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",), "info": ("_info",),
                "histogram": ("_bucket", "_count", "_sum", "_created"),
                "summary": ("", "_count", "_sum", "_created")}
    for family in Metrics(process=True).registry.collect():
        names.update(family.name + s for s in suffixes[family.type])
        names.update(sample.name for sample in family.samples)
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords and labels aside)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings (label values, label_replace args)
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range selectors
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    found = set()
    for m in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", s):
        if s[m.end():].lstrip().startswith("(") or m.group(0) in _KEYWORDS:
            continue  # a function call or an operator
        found.add(m.group(0))
    return found


def dashboard_targets() -> Iterator[tuple[dict[str, Any], str]]:
    doc = json.loads(DASHBOARD.read_text())
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            yield panel, target["expr"]


def parse_rules() -> list[dict[str, str]]:
    """The alerts of the rules file: name, expr, severity and annotations (a small YAML reader
    for this file's shape; the test environment has no YAML library)."""
    alerts: list[dict[str, str]] = []
    lines = RULES.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^(\s*)- alert: (\S+)$", line)
        if m:
            alerts.append({"alert": m.group(2)})
        elif alerts and (m := re.match(r"^(\s*)(expr|severity|summary|description|runbook):\s*(.*)$", line)):
            indent, key, value = len(m.group(1)), m.group(2), m.group(3)
            if value == "|":
                block = []
                while i + 1 < len(lines) and (not lines[i + 1].strip()
                                              or len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent):
                    i += 1
                    block.append(lines[i].strip())
                value = " ".join(b for b in block if b)
            alerts[-1][key] = value.strip().strip('"')
        i += 1
    return alerts


# --------------------------------------------------------------------------- tests


def test_the_name_extractor_finds_what_an_expression_selects() -> None:
    expr = ('histogram_quantile(0.99, sum by (instance, le) (rate(x_bucket{le!="1", a=~"$i"}[5m])))'
            ' > 2.5 or label_replace(y == 0, "k", "v", "", "") and on(job) z offset 5m')
    assert metric_names(expr) == {"x_bucket", "y", "z"}


def test_every_dashboard_metric_is_exported() -> None:
    exported = exported_names()
    used: set[str] = set()
    for panel, expr in dashboard_targets():
        names = metric_names(expr)
        assert names, f"panel {panel['title']!r}: no metric in {expr!r}"
        missing = names - exported - PROMETHEUS_SERIES
        assert not missing, f"panel {panel['title']!r} uses {sorted(missing)}, not in lumio_ingestd.metrics"
        used |= names
    doc = json.loads(DASHBOARD.read_text())
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((\w+), *\w+\)", var["query"]["query"])
            assert m and m.group(1) in exported, var["query"]
    # The panels the issue asks for are there: rates, latency, depths, outcomes, sources,
    # alert fan-out, HTTP and the process.
    for name in ("chat_messages_total", "source_frames_total", "chat_flush_duration_seconds_bucket",
                 "events_insert_duration_seconds_bucket", "chat_buffer_depth", "chat_dead_letter_depth",
                 "events_dead_letter_depth", "spool_bytes", "events_persist_failures_total",
                 "source_state", "source_disconnects_total", "events_alerts_published_total",
                 "events_alerts_dropped_total", "http_webhook_requests_total",
                 "process_resident_memory_bytes", "daemon_threads", "process_open_fds"):
        assert name in used, name


def test_every_rule_metric_is_exported_and_every_alert_is_documented_and_tested() -> None:
    exported = exported_names()
    alerts = parse_rules()
    assert len(alerts) >= 10
    operating = OPERATING.read_text()
    tests = "\n".join(p.read_text() for p in RULE_TESTS.glob("*.yml"))
    for alert in alerts:
        name = alert["alert"]
        missing = metric_names(alert["expr"]) - exported - PROMETHEUS_SERIES
        assert not missing, f"{name} uses {sorted(missing)}, not in lumio_ingestd.metrics"
        assert metric_names(alert["expr"]), name
        assert alert.get("severity") in ("critical", "warning"), name
        assert alert.get("summary") and alert.get("description"), name
        assert alert.get("runbook") == f"docs/operating.rst#runbook-{name.lower()}", name
        assert re.search(rf"^\.\. _runbook-{name}:\n\n{name}\n-{{{len(name)}}}$", operating, re.M), \
            f"docs/operating.rst has no runbook section {name!r}"
        # A unit test that evaluates it at least twice (quiet and firing).
        assert tests.count(f"alertname: {name}\n") >= 2, f"{name} has no promtool unit test"


def test_the_dashboard_uses_a_data_source_variable_and_its_expressions_parse(tmp_path: Path) -> None:
    doc = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    assert doc["schemaVersion"] >= 36  # Grafana 10 reads it
    for panel in doc["panels"]:
        assert panel["gridPos"]["x"] >= 0 and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
    # Every expression, with Grafana's variables filled in, is valid PromQL: promtool checks
    # them as recording rules.
    promtool = shutil.which(os.environ.get("PROMTOOL") or "promtool")  # as `make promtool` finds it
    assert promtool, "promtool is missing: apt-get install prometheus, or PROMTOOL=/path/to/promtool"
    rules = ["groups:", "  - name: dashboard", "    rules:"]
    for n, (_, expr) in enumerate(dashboard_targets()):
        filled = (expr.replace("$__rate_interval", "5m").replace("$instance", ".*"))
        rules += [f"      - record: dashboard:expr_{n}", f"        expr: {json.dumps(filled)}"]
    path = tmp_path / "dashboard.rules.yml"
    path.write_text("\n".join(rules) + "\n")
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
