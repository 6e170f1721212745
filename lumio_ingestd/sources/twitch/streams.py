"""Twitch Helix `GET /streams`: which accounts are live, for the stream-status poller.

Nothing durable here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

from lumio_ingestd.sources.httpclient import join
from lumio_ingestd.sources.statusclient import LiveStream, StatusClient, as_id, as_text, as_time, as_viewers


class HelixStreams(StatusClient):
    """Twitch Helix `GET /streams` by `user_id`."""

    platform = "twitch"
    batch = 100

    def url(self, ids: Sequence[str]) -> str:
        query = urlencode([("user_id", i) for i in ids] + [("first", "100")])
        return join(self._api_url, "streams") + "?" + query

    def headers(self, token: str) -> dict[str, str]:
        return {**super().headers(token), "Client-Id": self._client_id}

    def user_of(self, item: Mapping[str, Any]) -> str:
        return as_id(item["user_id"], "user_id")

    def item(self, user_id: str, item: Mapping[str, Any]) -> LiveStream | None:
        stream_id = as_id(item["id"], "id")
        viewers = as_viewers(item.get("viewer_count"))
        if item.get("type", "live") != "live":
            return None  # only a live stream is a session (not a rerun or a premiere)
        return LiveStream(
            user_id=user_id, stream_id=stream_id, viewers=viewers, title=as_text(item.get("title")),
            category=as_text(item.get("game_name")), started_at=as_time(item.get("started_at")),
            login=as_text(item.get("user_login")), name=as_text(item.get("user_name")))
