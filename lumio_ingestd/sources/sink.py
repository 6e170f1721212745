"""Where a source's mapped events go: `persist_event`, then the live alert, then stream sessions.

Shared by every platform's socket source and webhook receiver, so that all
of them store and announce an event the same way:

- `persist(ev, stream)` calls `persist_event` (inline insert, else park, else
  spool, else counted lost) and publishes the live alert when the event was
  taken now (stored, parked or spooled; not a redelivery the database
  already had), so an alert never goes out before its event's outcome and a
  refused event raises none; the chat threads step aside meanwhile
  (`Alerts.on_the_way`, eventgate.py). A `StreamChange` then opens or closes
  `stream_sessions`.
- An offline change is keyed by the stream it ends before it is persisted:
  `external_id` = `offline_external_id(stream id)`, the stream from the
  change itself or else `SessionStore.stream_before` (stores/sessions.py). The
  stream-status poller keys its offline the same way, so both paths give
  one row. Without a known stream the event keeps the id its mapping gave.

Durable when `persist` returns: whatever its `PersistResult` says.
"""

from __future__ import annotations

import dataclasses

from lumio_ingestd.model import PersistResult, PlatformEvent, StreamChange, offline_external_id
from lumio_ingestd.sources.interfaces import Alerts, PersistEvent, SessionStore

#: The outcomes that mean: this delivery was taken now (and is announced).
TAKEN = ("stored", "parked", "spooled")




class EventSink:
    def __init__(self, persist_event: PersistEvent, *,
                 alerts: Alerts | None, sessions: SessionStore | None) -> None:
        self._persist_event = persist_event
        self._alerts = alerts
        self.sessions = sessions

    def persist(self, ev: PlatformEvent, stream: StreamChange | None = None) -> PersistResult:
        if stream is not None and stream.kind == "offline" and self.sessions is not None:
            ev, stream = self._key_offline(ev, stream)
        if self._alerts is None:
            result = self._persist_event(ev)
        else:
            # The chat threads step aside until the alert is queued (eventgate.py): under a chat
            # flood this event would otherwise wait for the interpreter lock at every hand-over.
            with self._alerts.on_the_way():
                result = self._persist_event(ev)
                if result.outcome in TAKEN:
                    self._alerts.publish(result.event)
        if result.outcome in TAKEN:
            self.taken(result)
        if stream is not None and self.sessions is not None:
            self.sessions.apply(ev.account_id, stream)
        return result

    def _key_offline(self, ev: PlatformEvent,
                     stream: StreamChange) -> tuple[PlatformEvent, StreamChange]:
        assert self.sessions is not None
        stream_id = stream.stream_id or self.sessions.stream_before(
            ev.account_id, stream.platform, stream.at)
        if not stream_id:
            return ev, stream
        return (dataclasses.replace(ev, external_id=offline_external_id(stream_id)),
                dataclasses.replace(stream, stream_id=stream_id))

    def taken(self, result: PersistResult) -> None:
        """Called once for every event taken now (subclasses count their own kinds here)."""
