"""Sources: the threads that bring chat and events in (platform sockets, test sources).

`build_sources` is the one place that decides, from the configuration, which
sources run; each is a `Worker` that, when stopped, hands what it holds in
memory to Redis (or the database, or the spool) in `final()` before its
thread ends. The shutdown gives all sources together 5 s for that.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lumio_ingestd.config import Config
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import PlatformEvent
from lumio_ingestd.sources.interfaces import ChatQueueLike
from lumio_ingestd.sources.synthetic import SyntheticSource
from lumio_ingestd.worker import Worker


@dataclass(frozen=True)
class SourceDeps:
    """What a source needs from the composition root."""

    metrics: Metrics
    #: A new in-memory persistence queue for one source (named after it).
    chat_queue: Callable[[str], ChatQueueLike]
    persist_event: Callable[[PlatformEvent], Any]


def build_sources(cfg: Config, deps: SourceDeps) -> list[Worker]:
    sources: list[Worker] = []
    if cfg.synthetic.rate_per_sec > 0:
        sources.append(SyntheticSource(cfg.synthetic, deps.chat_queue("source-synthetic"),
                                       deps.persist_event, deps.metrics))
    return sources


__all__ = ["SourceDeps", "SyntheticSource", "build_sources"]
