"""Render the metrics reference of docs/operating.rst from `lumio_ingestd.metrics.Metrics`.

`make docs` (or `PYTHONPATH=. python tools/metrics_docs.py`) rewrites the
block between the METRICS markers of docs/operating.rst; `test_docs.py`
fails when the two drift apart.
"""

from __future__ import annotations

import sys
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from lumio_ingestd.metrics import Metrics

OPERATING = Path(__file__).resolve().parent.parent / "docs" / "operating.rst"
START = ".. METRICS-START\n"
END = ".. METRICS-END\n"


def render() -> str:
    rows: list[tuple[str, str, str]] = []
    # The declared metrics themselves: their label names are known before any
    # sample exists (a labelled family has none until first used).
    for metric in vars(Metrics()).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        kind = metric._type  # noqa: SLF001 - prometheus_client keeps these private
        name = metric._name + ("_total" if kind == "counter" else "")  # noqa: SLF001
        labels = metric._labelnames  # noqa: SLF001
        shown = f"``{name}{{{','.join(labels)}}}``" if labels else f"``{name}``"
        rows.append((shown, str(kind), " ".join(metric._documentation.split())))  # noqa: SLF001
    out = [".. list-table::", "   :header-rows: 1", "   :widths: 40 10 50", "",
           "   * - metric", "     - type", "     - meaning"]
    for shown, kind, doc in rows:
        out += [f"   * - {shown}", f"     - {kind}", f"     - {doc}"]
    return "\n".join(out) + "\n"


def rewrite(text: str) -> str:
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return head + START + "\n" + render() + "\n" + END + tail


if __name__ == "__main__":
    OPERATING.write_text(rewrite(OPERATING.read_text()))
    sys.exit(0)
