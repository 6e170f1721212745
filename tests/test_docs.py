"""Documentation that is generated from code must match it."""

from __future__ import annotations

from pathlib import Path

from lumio_ingestd.config import SCHEMA
from tools.config_docs import README, rewrite


def test_readme_documents_every_config_key() -> None:
    text = README.read_text()
    assert rewrite(text) == text, "README.rst is stale: run `python tools/config_docs.py`"
    for s in SCHEMA:
        assert f"``{s.key}``" in text


def test_example_config_and_readme_name_the_same_keys() -> None:
    example = (Path(__file__).resolve().parent.parent / "etc/lumio/ingestd.ini").read_text()
    for s in SCHEMA:
        assert f"{s.key} =" in example, s.key


def test_readme_documents_every_metric() -> None:
    from tools.metrics_docs import rewrite as rewrite_metrics

    text = README.read_text()
    assert rewrite_metrics(text) == text, \
        "README.rst is stale: run `PYTHONPATH=. python tools/metrics_docs.py`"
    for name in ("events_persist_failures_total{outcome}", "events_dead_letter_depth",
                 "chat_messages_total{path}", "chat_quarantined_total", "events_quarantined_total",
                 "chat_dead_letter_depth", "chat_buffer_depth"):
        assert f"``{name}" in text, name  # the names INTERFACE.md promises
