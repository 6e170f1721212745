"""Kick's public `GET /livestreams`: which accounts are live, for the stream-status poller.

Its answer names no stream: the stream id is derived from the account and
the start time (`kick_stream_key`), as the Kick socket and webhook derive
theirs. Nothing durable here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

from lumio_ingestd.sources.httpclient import join
from lumio_ingestd.sources.kick.mapping import stream_key
from lumio_ingestd.sources.statusclient import LiveStream, StatusClient, as_id, as_text, as_time, as_viewers


class KickLivestreams(StatusClient):
    """Kick public API `GET /livestreams` by `broadcaster_user_id`."""

    platform = "kick"
    batch = 50

    def url(self, ids: Sequence[str]) -> str:
        query = urlencode([("broadcaster_user_id", i) for i in ids] + [("limit", "100")])
        return join(self._api_url, "livestreams") + "?" + query

    def user_of(self, item: Mapping[str, Any]) -> str:
        return as_id(item["broadcaster_user_id"], "broadcaster_user_id")

    def item(self, user_id: str, item: Mapping[str, Any]) -> LiveStream | None:
        category = item.get("category")
        started = as_time(item.get("started_at"))
        if started is None:
            raise ValueError("a livestream without a usable started_at")
        own = item.get("stream_id") or item.get("id")
        return LiveStream(
            user_id=user_id, stream_id=str(own) if isinstance(own, (str, int)) and str(own) else "",
            viewers=as_viewers(item.get("viewer_count")), title=as_text(item.get("stream_title")),
            category=as_text(category.get("name")) if isinstance(category, dict) else None,
            started_at=started, login=as_text(item.get("slug")), name=as_text(item.get("slug")))

    def session_key(self, account_id: int, live: LiveStream) -> str:
        # Kick's /livestreams names no stream: the key comes from the start time, as
        # the Kick socket and webhook derive it, so all three meet on one row.
        assert live.started_at is not None
        return kick_stream_key(account_id, live.started_at)


#: The id of one Kick stream, from its account and start: the Kick mapping's own rule.
kick_stream_key = stream_key
