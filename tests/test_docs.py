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
