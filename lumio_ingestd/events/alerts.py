"""Live alerts: every event taken at ingest goes out on Redis and to Server-Sent Events clients.

Ingest paths (platform sockets, webhooks, the emit API) call
`AlertPublisher.publish(ev)` once an event was stored, parked or spooled:
replays of parked events are not published again (their alert went out when
they were parked), nor are redeliveries the database found already stored.

Publishing never blocks ingest, and under a chat flood it goes first (an
alert holds the process's `EventGate` from the put until its PUBLISH was
answered, so the chat threads step aside meanwhile: eventgate.py):

- Redis: `publish()` puts the alert on a bounded queue (a full queue drops
  the alert and counts it); the publisher's own thread sends
  `PUBLISH lumio:alerts:{ACCOUNT}` in pipelined batches. A Redis outage costs
  alerts (counted), never ingest time.
- SSE: every client of `GET /v1/accounts/ACCOUNT/alerts/stream` has its own
  bounded queue that `publish()` fills with `put_nowait`; the client's
  request thread writes it to the socket. A client whose queue is full has
  fallen behind: it is dropped (its stream is shut down) and counted, and
  the others carry on.

The alert is the event's JSON (`PlatformEvent.to_json()`: id, created_at,
account_id, platform, type, external_id, user_id, payload, children). On the
stream each is an SSE message `id: <event id>`, `event: alert`,
`data: <json>`; a comment line every `heartbeat_secs` keeps idle connections
open through proxies. The stream needs `Authorization: Bearer <[http]
emit_token_file>` (401 without or with a wrong one; 403 when no token is
configured, naming the key).

Nothing durable here: alerts are best effort, the events themselves are
durable on their own paths before they are published.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import redis

from lumio_ingestd.config import Secret
from lumio_ingestd.eventgate import EventGate
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import PlatformEvent
from lumio_ingestd.stores.redisclient import REDIS_ERRORS
from lumio_ingestd.web.bearer import check_bearer
from lumio_ingestd.web.server import Handler, Request, Response, Stream, StreamResponse
from lumio_ingestd.worker import Worker

log = logging.getLogger("lumio_ingestd.alerts")

STREAM_PATH = r"/v1/accounts/(?P<account>[0-9]{1,19})/alerts/stream"
TOKEN_KEY = "[http] emit_token_file"


def alerts_channel(account_id: int) -> str:
    return f"lumio:alerts:{{{account_id}}}"


class AlertClient:
    """One SSE client's bounded queue; `drop()` ends its stream."""

    def __init__(self, account_id: int, max_queue: int) -> None:
        self.account_id = account_id
        self.queue: queue.Queue[bytes] = queue.Queue(maxsize=max_queue)
        self.dropped = threading.Event()
        self.on_drop: Callable[[], None] | None = None

    def offer(self, data: bytes) -> bool:
        try:
            self.queue.put_nowait(data)
        except queue.Full:
            return False
        return True

    def drop(self) -> None:
        self.dropped.set()
        if self.on_drop is not None:
            self.on_drop()  # shuts the socket down: wakes a write blocked on the slow reader


class AlertPublisher(Worker):
    """The Redis publishing thread and the registry of SSE clients."""

    max_turn_secs = 30.0

    def __init__(self, client: redis.Redis | None, metrics: Metrics, *, queue_max: int = 10_000,
                 client_queue_max: int = 256, batch: int = 200, name: str = "alerts",
                 gate: EventGate | None = None) -> None:
        super().__init__(name, metrics)
        self._redis = client
        #: Held from an event's persistence until its PUBLISH was answered (eventgate.py).
        self.gate = gate if gate is not None else EventGate()
        self._queue: queue.Queue[tuple[int, bytes] | None] = queue.Queue(maxsize=queue_max)
        self._client_queue_max = client_queue_max
        self._batch = batch
        self._clients: dict[int, set[AlertClient]] = {}
        self._finished = False
        self._finish_lock = threading.Lock()
        self._lock = threading.Lock()
        self._redis_down = False

    # -- the ingest side: never blocks ---------------------------------------------

    def on_the_way(self) -> AbstractContextManager[None]:
        return self.gate.held()

    def publish(self, ev: PlatformEvent) -> None:
        data = json.dumps(ev.to_json(), ensure_ascii=False, separators=(",", ":")).encode()
        if self._redis is not None:
            # With `final()`'s flag under one lock: an alert put after its last drain would
            # never be sent, and its hold on the gate never released.
            with self._finish_lock:
                if self._finished:
                    # The publisher's thread has sent its last batch (a source handing
                    # over a held gift at stop can come later): counted, not silent.
                    self.metrics.events_alerts_dropped.labels("shutdown").inc()
                else:
                    # Held until the publisher's thread sent it: the gate's hand-over to that thread.
                    self.gate.hold()
                    try:
                        self._queue.put_nowait((ev.account_id, data))
                    except queue.Full:
                        self.gate.release()
                        self.metrics.events_alerts_dropped.labels("queue_full").inc()
        with self._lock:
            clients = list(self._clients.get(ev.account_id, ()))
        if not clients:
            return
        message = b"id: %s\nevent: alert\ndata: %s\n\n" % (str(ev.id).encode(), data)
        for client in clients:
            if client.offer(message):
                continue
            self.metrics.events_alerts_dropped.labels("client_slow").inc()
            if not client.dropped.is_set():
                self.metrics.http_alert_streams_dropped.inc()
                log.warning("alerts: a stream client of account %s fell behind (%d alerts queued); "
                            "dropping it", ev.account_id, client.queue.qsize())
                self.unsubscribe(client)
                client.drop()

    # -- SSE clients ----------------------------------------------------------------------

    def subscribe(self, account_id: int) -> AlertClient:
        client = AlertClient(account_id, self._client_queue_max)
        with self._lock:
            self._clients.setdefault(account_id, set()).add(client)
        self.metrics.http_alert_streams.inc()
        return client

    def unsubscribe(self, client: AlertClient) -> None:
        with self._lock:
            clients = self._clients.get(client.account_id)
            if clients is None or client not in clients:
                return
            clients.discard(client)
            if not clients:
                del self._clients[client.account_id]
        self.metrics.http_alert_streams.dec()

    def client_count(self) -> int:
        with self._lock:
            return sum(len(c) for c in self._clients.values())

    # -- the Redis thread -------------------------------------------------------------------

    def run_once(self) -> float:
        try:
            first = self._queue.get(timeout=1.0)
        except queue.Empty:
            return 0.0
        batch = [first] if first is not None else []
        while len(batch) < self._batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                batch.append(item)
        try:
            self._send(batch)
        finally:
            self.gate.release(len(batch))
        return 0.0

    def _send(self, batch: list[tuple[int, bytes]]) -> None:
        if not batch or self._redis is None:
            return
        try:
            pipe = self._redis.pipeline(transaction=False)
            for account_id, data in batch:
                pipe.publish(alerts_channel(account_id), data)
            pipe.execute()
        except REDIS_ERRORS as exc:
            self.metrics.events_alerts_dropped.labels("redis_error").inc(len(batch))
            if not self._redis_down:
                log.warning("alerts: Redis refused PUBLISH (%s); alerts are dropped until it is back",
                            type(exc).__name__)
            self._redis_down = True
            return
        if self._redis_down:
            log.info("alerts: publishing to Redis again")
            self._redis_down = False
        self.metrics.events_alerts_published.labels("redis").inc(len(batch))

    def wake(self) -> None:
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass  # the queue is busy: the loop turns anyway

    def final(self) -> None:
        """Send what is queued (one bounded try), drop the rest; end the open streams."""
        with self._finish_lock:
            self._finished = True
        left: list[tuple[int, bytes]] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                left.append(item)
        try:
            if left and not self._redis_down:
                self._send(left)
            elif left:
                self.metrics.events_alerts_dropped.labels("shutdown").inc(len(left))
        finally:
            self.gate.release(len(left))
        with self._lock:
            clients = [c for cs in self._clients.values() for c in cs]
        for client in clients:
            client.drop()


# --------------------------------------------------------------------------- the SSE route


#: Open alert streams at most: the HTTP server's request slots are shared, and
#: webhooks (which Twitch revokes after repeated failures) must keep the rest.
MAX_STREAMS = 32
#: How often an idle stream looks for a client that went away.
PEER_CHECK_SECS = 0.5


def stream_handler(publisher: AlertPublisher, token: Secret | None, metrics: Metrics, *,
                   heartbeat_secs: float = 15.0, max_streams: int = MAX_STREAMS) -> Handler:
    """GET /v1/accounts/ACCOUNT/alerts/stream."""

    def handle(request: Request) -> Response | StreamResponse:
        refused = check_bearer(request, token, TOKEN_KEY, "the alert streams")
        if refused is not None:
            return refused
        if publisher.client_count() >= max_streams:
            return Response.json(503, {"error": f"too many alert streams (at most {max_streams})"},
                                 headers={"Retry-After": "5"})
        account_id = int(request.params["account"])
        if not 0 < account_id < 2**63:
            return Response.json(404, {"error": "no such account"})

        def run(stream: Stream) -> None:
            client = publisher.subscribe(account_id)
            client.on_drop = stream.close
            try:
                _serve(stream, client, heartbeat_secs, metrics)
            finally:
                publisher.unsubscribe(client)

        return StreamResponse(run, headers={"X-Accel-Buffering": "no"})

    return handle


def _serve(stream: Stream, client: AlertClient, heartbeat_secs: float, metrics: Metrics) -> None:
    if not stream.write(b"retry: 2000\n: connected\n\n"):
        return
    last_write = time.monotonic()
    while not stream.peer_gone() and not client.dropped.is_set():
        # At most a short wait per turn: a client that went away frees its slot
        # within it (peer_gone), not at the next heartbeat write.
        wait = max(0.05, min(PEER_CHECK_SECS, last_write + heartbeat_secs - time.monotonic()))
        try:
            data = client.queue.get(timeout=wait)
        except queue.Empty:
            if time.monotonic() - last_write >= heartbeat_secs:
                if not stream.write(b": keepalive\n\n"):
                    return
                last_write = time.monotonic()
            continue
        if not stream.write(data):
            return
        last_write = time.monotonic()
        metrics.events_alerts_published.labels("sse").inc()
