"""Render the configuration reference of docs/configuration.rst from `config.SCHEMA`.

`make docs` (or `python tools/config_docs.py`) rewrites the block between the
CONFIG-KEYS markers of docs/configuration.rst; `test_docs.py` fails
when the two drift apart.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lumio_ingestd.config import SCHEMA, SECTION_HELP

CONFIGURATION = Path(__file__).resolve().parent.parent / "docs" / "configuration.rst"
START = ".. CONFIG-KEYS-START\n"
END = ".. CONFIG-KEYS-END\n"


def render() -> str:
    out: list[str] = []
    section = None
    for s in SCHEMA:
        if s.section != section:
            section = s.section
            title = f"[{section}]"
            out += ["", title, "-" * len(title), "", SECTION_HELP.get(section, ""), ""]
        default = f"[{s.default}]" if s.default else "[unset]"
        out += [f"``{s.key}`` {default}", f"    {s.help}", ""]
    return "\n".join(out).lstrip("\n") + "\n"


def rewrite(text: str) -> str:
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return head + START + "\n" + render() + "\n" + END + tail


if __name__ == "__main__":
    CONFIGURATION.write_text(rewrite(CONFIGURATION.read_text()))
    sys.exit(0)
