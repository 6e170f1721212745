"""The last delivery ids one socket handled: an in-memory window that spares the database repeats.

Platforms redeliver (at-least-once sockets). Nothing here is the guarantee
against duplicates (the database keys are); nothing durable lives here.
"""

from __future__ import annotations

from collections import deque


class RecentIds:
    """The last `size` message ids, oldest forgotten first (not thread-safe: one owner).

    A set answers `in`, a deque keeps the order: a new id (the sources add
    one per message, after `in` said no) costs a set insert and a deque
    append, against an OrderedDict's linked-list upkeep. A repeat is moved to
    the newest end, which costs a scan of the deque; the sources never add
    one (they skip an id already here), so that scan is off the hot path.
    """

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._known: set[str] = set()
        self._ids: deque[str] = deque()  # oldest first; the same ids as `_known`

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._known

    def __len__(self) -> int:
        return len(self._known)

    def add(self, message_id: str) -> None:
        if message_id in self._known:
            ids = self._ids
            ids.remove(message_id)
            ids.append(message_id)
            return
        if self._size <= 0:
            return
        self._known.add(message_id)
        ids = self._ids
        ids.append(message_id)
        if len(ids) > self._size:
            self._known.discard(ids.popleft())
