"""StreamElements: tips and activities over the Astro gateway (one source per account).

- `protocol`: frames, subscribe requests, the token file, PII removal and the
  mapping of tips and activities to events (pure).
- `source`: `StreamElementsSource`, the per-account thread (welcome,
  subscribes, pings, reconnect tokens, errors per topic).

`build_streamelements()` makes a source for every account of this shard that
has `streamelements_channel_id` and `streamelements_token_file`; its events go
through the shared `EventSink` (persist_event, then the live alert).
Nothing durable here.
"""

from __future__ import annotations

from collections.abc import Callable

from lumio_ingestd.config import Config
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import PersistResult, PlatformEvent
from lumio_ingestd.sources.interfaces import Alerts
from lumio_ingestd.sources.sink import EventSink
from lumio_ingestd.sources.streamelements.source import StreamElementsSource


def build_streamelements(cfg: Config, metrics: Metrics, *,
                         persist_event: Callable[[PlatformEvent], PersistResult],
                         alerts: Alerts | None) -> list[StreamElementsSource]:
    sink = EventSink(persist_event, alerts=alerts, sessions=None)
    sources: list[StreamElementsSource] = []
    for account in cfg.accounts:
        if not account.streamelements_channel_id or account.streamelements_token_file is None:
            continue
        if not cfg.owns(account.account_id):
            continue
        sources.append(StreamElementsSource(account, cfg.streamelements, sink=sink, metrics=metrics))
    return sources


__all__ = ["StreamElementsSource", "build_streamelements"]
