"""StreamElements: tips and activities over the Astro gateway (one source per account).

- `protocol`: frames, subscribe requests, the token file, PII removal and the
  mapping of tips and activities to events (pure).
- `source`: `StreamElementsSource`, the per-account thread (welcome,
  subscribes, pings, reconnect tokens, errors per topic).
- `history`: `SeHistory`, the healer of a gap: activities and tips read back
  from the REST API (`[streamelements] api_url`).

`build()` makes a source for every account of this shard that
has `streamelements_channel_id` and `streamelements_token_file`; its events go
through the shared `EventSink` (persist_event, then the live alert).
Nothing durable here.
"""

from __future__ import annotations

from lumio_ingestd.config import Config
from lumio_ingestd.sources import Built, SourceDeps
from lumio_ingestd.sources.sink import EventSink
from lumio_ingestd.sources.streamelements.history import SeHistory
from lumio_ingestd.sources.streamelements.source import StreamElementsSource


def build(cfg: Config, deps: SourceDeps) -> Built:
    sink = EventSink(deps.persist_event, alerts=deps.alerts, sessions=None)
    built = Built()
    for account in cfg.accounts:
        if not account.streamelements_channel_id or account.streamelements_token_file is None:
            continue
        if not cfg.owns(account.account_id):
            continue
        source = StreamElementsSource(account, cfg.streamelements, sink=sink, metrics=deps.metrics,
                                      frames=deps.frames)
        # Healed events take persist_event only: they are late, no live alert.
        source.healer = SeHistory(account, cfg.streamelements, deps.persist_event, deps.metrics)
        built.sources.append(source)
    return built


__all__ = ["StreamElementsSource", "build"]
