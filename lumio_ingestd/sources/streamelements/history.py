"""Healing StreamElements: the activities and tips of a gap, read back from the REST API.

`SeHistory.heal(window)` reads, with the account's token (Bearer):

- `GET {api_url}/activities/{channel}?after=MS&before=MS&limit=100`: newest
  first; the next page asks `before` = the oldest `createdAt` seen + 1 ms
  (documents already read are skipped), until a page is short or brings
  nothing new (a full page of documents of one millisecond cannot be paged
  past: the gap ends `partial`);
- `GET {api_url}/tips/{channel}?after=MS&before=MS&limit=100&offset=N`:
  `{"docs": [...], "total": N}`, paged by `offset`.

Each document is mapped exactly as the socket maps it (protocol.map_message,
with the topic it would have arrived on): the same type and `external_id`
(`tip` = the tip's `_id`, also for a tip seen as an activity; `activity.<type>`
= the activity's `_id`), donor PII removed unless `keep_donor_pii`. So a fact
the socket stored too is one row. Each goes through `persist_event` (insert,
park, spool), never the live alert: it is late. A document refused by the
mapping is counted in `source_bad_frames` and skipped.

A 401 re-reads the token file once and asks again; a second 401 fails the
gap for good. Other failures raise `HealRetry` / `HealFailed` (sources/history.py).

Durable when `heal` returns: every document of the window went through
`persist_event` (see its result); a failure part-way leaves the documents
before it stored, and the next try finds them as duplicates.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

from lumio_ingestd.config import AccountConfig, StreamElementsConfig
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import (
    HealFailed,
    HealOutcome,
    HealRetry,
    HealWindow,
    PlatformEvent,
    parse_time,
)
from lumio_ingestd.sources.base import BadFrame
from lumio_ingestd.sources.history import HistoryClient, Unauthorized
from lumio_ingestd.sources.httpclient import join
from lumio_ingestd.sources.interfaces import PersistEvent
from lumio_ingestd.sources.sink import TAKEN
from lumio_ingestd.sources.streamelements.protocol import ACTIVITIES, PLATFORM, TIPS, Frame, map_message
from lumio_ingestd.sources.streamelements.source import TokenFile

log = logging.getLogger("lumio_ingestd.sources.streamelements.history")

PAGE = 100
#: A window with more pages than this is cut (and the try fails, to be tried again later).
MAX_PAGES = 500


class SeHistory:
    """The `Healer` of one account's StreamElements gaps."""

    def __init__(self, account: AccountConfig, se: StreamElementsConfig, persist_event: PersistEvent,
                 metrics: Metrics, *, timeout_secs: float = 10.0) -> None:
        if not account.streamelements_channel_id or account.streamelements_token_file is None:
            raise ValueError(f"account {account.account_id} has no StreamElements channel and token")
        self.account_id = account.account_id
        self.channel = account.streamelements_channel_id
        self.api_url = se.api_url
        self.keep_pii = se.keep_donor_pii
        self.tokens = TokenFile(account.streamelements_token_file)
        self._persist = persist_event
        self._metrics = metrics
        self.client = HistoryClient(PLATFORM, metrics, timeout_secs=timeout_secs)

    def cancel(self) -> None:
        self.client.cancel.cancel()

    def heal(self, window: HealWindow) -> HealOutcome:
        self.client.cancel.reset()
        start = self.client.requests
        rows = seen = 0
        taken: set[tuple[str, str | None]] = set()
        try:
            for topic, doc in self._documents(window):
                seen += 1
                ev = self._map(topic, doc)
                if ev is None:
                    continue
                key = (ev.type, ev.external_id)
                if key in taken:
                    continue  # a tip read as a tip and again as its activity: one row
                result = self._persist(ev)
                if result.outcome in TAKEN:
                    rows += 1
                if result.durable:
                    taken.add(key)
                else:
                    raise HealRetry(f"an event could not be kept ({result.outcome}: {result.error})")
        except HealRetry as exc:
            raise HealRetry(str(exc), after_secs=exc.after_secs, rows=rows,
                            requests=self.client.requests - start) from None
        except HealFailed as exc:
            raise HealFailed(str(exc), rows=rows, requests=self.client.requests - start) from None
        return HealOutcome(rows, seen, self.client.requests - start)

    # -- reading -------------------------------------------------------------------------------

    def _documents(self, window: HealWindow) -> Iterator[tuple[str, Mapping[str, Any]]]:
        yield from ((ACTIVITIES, d) for d in self._activities(window))
        yield from ((TIPS, d) for d in self._tips(window))

    def _activities(self, window: HealWindow) -> Iterator[Mapping[str, Any]]:
        before = window.until_ms + 1
        ids: set[str] = set()
        for _ in range(MAX_PAGES):
            page = self._docs(self._get("activities", after=window.since_ms, before=before, limit=PAGE),
                              "activities")
            fresh = [d for d in page if str(d.get("_id")) not in ids]
            if not fresh:
                if len(page) >= PAGE and len({_created_ms(d) for d in page}) == 1:
                    # Paging is by time: a full page of one millisecond cannot be paged past.
                    raise HealFailed(f"more than {PAGE} activities at one millisecond "
                                     f"({page[0].get('createdAt')!s:.40}); the rest cannot be read")
                return
            oldest = before
            for doc in fresh:
                ids.add(str(doc.get("_id")))
                at = _created_ms(doc)
                if at is not None:
                    oldest = min(oldest, at)
                if at is None or window.since_ms <= at <= window.until_ms:
                    yield doc
            if len(page) < PAGE:
                return
            before = oldest + 1
        raise HealRetry(f"more than {MAX_PAGES} pages of activities")

    def _tips(self, window: HealWindow) -> Iterator[Mapping[str, Any]]:
        offset = 0
        for _ in range(MAX_PAGES):
            obj = self._get("tips", after=window.since_ms, before=window.until_ms + 1, limit=PAGE,
                            offset=offset)
            if not isinstance(obj, dict):
                raise HealRetry("tips: the answer is not an object with docs")
            page = self._docs(obj.get("docs"), "tips")
            total = obj.get("total")
            for doc in page:
                at = _created_ms(doc)
                if at is None or window.since_ms <= at <= window.until_ms:
                    yield doc
            offset += len(page)
            if not page or not isinstance(total, int) or offset >= total:
                return
        raise HealRetry(f"more than {MAX_PAGES} pages of tips")

    @staticmethod
    def _docs(obj: Any, what: str) -> list[Mapping[str, Any]]:
        docs = obj.get("docs") if isinstance(obj, dict) else obj
        if not isinstance(docs, list):
            raise HealRetry(f"{what}: the answer is not a list of documents")
        return [d for d in docs if isinstance(d, dict)]

    def _get(self, what: str, **params: int) -> Any:
        url = join(self.api_url, f"{what}/{quote(self.channel, safe='')}") + "?" + urlencode(params)
        try:
            return self.client.get_json(url, self._headers())
        except Unauthorized as exc:
            log.info("streamelements: account %d: %s; reading the token file again", self.account_id, exc)
            try:
                return self.client.get_json(url, self._headers())
            except Unauthorized as again:
                raise HealFailed(f"the token is refused ({again})") from None

    def _headers(self) -> dict[str, str]:
        try:
            token = self.tokens.load()
        except (OSError, ValueError) as exc:
            raise HealFailed(f"cannot read the token: {exc}") from None
        return {"Authorization": f"Bearer {token.token}", "Accept": "application/json"}

    # -- mapping -------------------------------------------------------------------------------

    def _map(self, topic: str, doc: Mapping[str, Any]) -> PlatformEvent | None:
        frame = Frame(type="message", id=None, ts=None, nonce=None, error=None, topic=topic,
                      room=self.channel, data=doc)
        try:
            mapped = map_message(self.account_id, frame, keep_pii=self.keep_pii)
        except BadFrame as exc:
            self._metrics.source_bad_frames.labels(PLATFORM, exc.reason).inc()
            log.warning("streamelements: account %d: a %s document from the history refused (%s): %s",
                        self.account_id, topic, exc.reason, exc)
            return None
        if mapped.pii_removed:
            self._metrics.streamelements_pii_removed.inc(mapped.pii_removed)
        return mapped.event


def _created_ms(doc: Mapping[str, Any]) -> int | None:
    value = doc.get("createdAt")
    if not isinstance(value, str):
        return None
    try:
        return int(parse_time(value).timestamp() * 1000)
    except ValueError:
        return None
