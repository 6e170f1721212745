"""Which EventSub sessions are ours and live: the ones a socket of this process holds open.

A subscription Twitch lists is bound to a session id (`transport.session_id`).
When a new session's subscription is refused with 409, the subscription that
holds it may be bound to:

- this session (a create whose answer was lost, asked again): ours;
- another session of ours that is still live: the old socket of a planned
  `session_reconnect` hand-off (both sockets are open until the new welcome),
  or another socket of this process for the same condition. Never deleted:
  events flow there;
- a session whose subscriptions the live socket carries: after a hand-off the
  new session inherits the old one's subscriptions, which may still name the
  old id. Ours as long as the socket that inherited them is open;
- anything else: a session that is not ours, or not live any more (its socket
  died without a clean close, and Twitch has not noticed yet). Those are the
  orphans the source deletes and creates again (see `subscriber.py`).

`LiveSessions` is that set for one process, filled by each `EventSubClient`
(`set` when a session is welcomed or inherits one, `clear` when its sockets
close). The Twitch build makes one and hands it to every Twitch source;
thread-safe. Nothing durable here: a restarted process holds no session.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class LiveSessions:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_owner: dict[str, frozenset[str]] = {}

    def set(self, owner: str, session_ids: Iterable[str]) -> None:
        """`owner`'s open sockets carry the subscriptions of these sessions (replaces the last set)."""
        ids = frozenset(session_ids)
        with self._lock:
            if ids:
                self._by_owner[owner] = ids
            else:
                self._by_owner.pop(owner, None)

    def clear(self, owner: str) -> None:
        """`owner` holds no open socket any more."""
        with self._lock:
            self._by_owner.pop(owner, None)

    def ids(self) -> frozenset[str]:
        with self._lock:
            return frozenset().union(*self._by_owner.values())

    def __contains__(self, session_id: object) -> bool:
        with self._lock:
            return any(session_id in ids for ids in self._by_owner.values())
