"""Instance heartbeats and claims: `lumio:instance:INSTANCE` and `lumio:claim:INSTANCE`.

Every replica refreshes its heartbeat key with a TTL (the chat flusher, the
chat dead-letter drain and the event retry worker all do); while the key
exists, the replica's in-flight lists are left alone. The value is a small
JSON object, `{"pid": N, "host": "...", "at": UNIX_SECONDS}`, so that
`lumio-ingestd status` can say when each replica last beat. Liveness itself
only ever asks whether the key exists; the value is for people.

`Heartbeat` refreshes the liveness key (and, when given one, the
`InstanceClaim`: which process runs as this instance id). `PROCESS_TOKEN`
names this process in claims and in-flight lists.

Claim before owning: a process runs an account only while it holds its
instance claim. One started while Redis was down could not check the claim;
it starts with no account (`ClaimKeeper`, or the membership with
`shard = auto`, takes the claim once Redis answers) and, when another live
process holds it, keeps none: the two would otherwise both run the accounts,
since an owner key holding the instance id looks like its own to both.

Nothing durable lives here.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from lumio_ingestd import boundedjson
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.redisclient import REDIS_ERRORS
from lumio_ingestd.worker import Worker

log = logging.getLogger("lumio_ingestd.chat.lists")


def heartbeat_value(now: float | None = None) -> bytes:
    """The value a heartbeat SET writes: who beat, and when (wall clock)."""
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                       "at": round(time.time() if now is None else now, 3)},
                      separators=(",", ":")).encode()


#: The latest `at` a heartbeat can hold and still be Unix seconds (9999-12-31): a value in
#: milliseconds (about 1.7e12) is past it, and so are 1e999 (infinity) and NaN.
_LATEST_AT = 253_402_300_799.0


@dataclass(frozen=True, slots=True)
class HeartbeatInfo:
    pid: int | None
    host: str | None
    at: float | None  # Unix seconds of the last beat, when the value says
    problem: str | None = None  # why the value, or part of it, could not be read


def _seconds(value: object) -> float | None:
    """`value` as Unix seconds, or None when it is no time a heartbeat can hold."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        at = float(value)
    except OverflowError:  # an integer too large for a float
        return None
    return at if 0.0 <= at <= _LATEST_AT else None  # NaN fails both comparisons


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "~"


def parse_heartbeat(raw: bytes | None) -> HeartbeatInfo:
    """Read a heartbeat value; older formats (`pid=N`, a bare Unix time) are understood too.

    Another writer may have left anything under the key: what cannot be read is
    None, and `problem` says what it was, so a reader shows it and goes on."""
    if raw is None:
        return HeartbeatInfo(None, None, None)
    text = raw.decode("utf-8", "replace").strip()
    try:
        obj: Any = boundedjson.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        pid, host, at = obj.get("pid"), obj.get("host"), obj.get("at")
        seconds = _seconds(at)
        return HeartbeatInfo(
            pid if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 1 << 31 else None,
            host if isinstance(host, str) else None, seconds,
            None if seconds is not None or at is None
            else f"unreadable time {_shown(at)} (not Unix seconds)")
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        seconds = _seconds(obj)
        return HeartbeatInfo(None, None, seconds, None if seconds is not None
                             else f"unreadable time {_shown(obj)} (not Unix seconds)")
    if text.startswith("pid=") and text[4:].isascii() and text[4:].isdigit() and len(text) < 16:
        return HeartbeatInfo(int(text[4:]), None, None)
    return HeartbeatInfo(None, None, None, f"unreadable value {_shown(text)}")


#: This process's claim token: host and pid (so a restart on the same host can
#: tell that the holder is dead), and a random part (pids are reused).
PROCESS_TOKEN = f"{socket.gethostname()}|{os.getpid()}|{uuid.uuid4().hex[:12]}"


# KEYS: the instance claim. ARGV: token, ttl ms, force ("1": take it over).
# Returns nil when it is ours now, else the holder's token.
_TAKE_CLAIM = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] and ARGV[3] ~= '1' then
    return holder
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
return false
"""


# KEYS: the instance claim. ARGV: token. Deletes it only if it is ours.
_DROP_CLAIM = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


class InstanceClaim:
    """`lumio:claim:INSTANCE`: which process runs as this instance id (its token, a TTL).

    Taken at start (`app.build` refuses to start while another live process
    holds it) and kept by the chat workers' heartbeats. A holder on this host
    whose pid is gone is dead: its claim is taken over at once, so a restart
    does not wait for the TTL. `held` says whether it was ours at the last try.
    """

    def __init__(self, client: redis.Redis, instance: str, ttl_secs: float,
                 token: str = PROCESS_TOKEN) -> None:
        self.key = rediskeys.instance_claim(instance)
        self.instance = instance
        self.ttl_secs = ttl_secs
        self.token = token
        self.held = False
        self._client = client
        self._take = client.register_script(_TAKE_CLAIM)
        self._drop = client.register_script(_DROP_CLAIM)
        self._warned_of: str | None = None

    def take(self) -> str | None:
        """Take or refresh the claim; None when it is ours, else the live holder's token.
        Raises REDIS_ERRORS."""
        ttl = max(1, int(self.ttl_secs * 1000))
        holder: Any = self._take(keys=[self.key], args=[self.token, ttl, "0"])
        if holder is not None:
            other = holder.decode("utf-8", "replace") if isinstance(holder, bytes) else str(holder)
            if not _dead_here(other):
                self.held = False
                if other != self._warned_of:
                    self._warned_of = other
                    log.error("instance id %r is in use by another process (%s); this one runs "
                              "no account and leaves its in-flight chat alone until it holds the "
                              "claim", self.instance, other)
                return other
            self._take(keys=[self.key], args=[self.token, ttl, "1"])
            log.info("instance id %r: the previous process (%s) is gone; taking over its claim",
                     self.instance, other)
        self.held = True
        self._warned_of = None
        return None

    def release(self) -> None:
        self._drop(keys=[self.key], args=[self.token])
        self.held = False


class ClaimKeeper(Worker):
    """With INDEX/COUNT sharding: takes and refreshes the instance claim every third of its TTL,
    so the main thread (runtime/app.py) runs the accounts only while `held()`.

    A turn Redis does not answer leaves `held()` as it was: a process that holds
    the claim keeps its accounts through an outage (no other can take the claim
    meanwhile), and one that never held it keeps none."""

    def __init__(self, claim: InstanceClaim, metrics: Metrics, *, name: str = "instance-claim") -> None:
        super().__init__(name, metrics)
        self.claim = claim
        self.on_change: Callable[[], None] = lambda: None

    def held(self) -> bool:
        return self.claim.held

    def run_once(self) -> float:
        before = self.claim.held
        try:
            self.claim.take()
        except REDIS_ERRORS as exc:
            log.debug("instance claim: Redis did not answer (%s); kept as it was", type(exc).__name__)
        if self.claim.held != before:
            self.on_change()
        return max(0.05, self.claim.ttl_secs / 3)


def _dead_here(token: str) -> bool:
    """Whether the process that wrote `token` ran on this host and is gone."""
    parts = token.split("|")
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return False  # another part of this very process (tests run several)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, someone else's
    return False


class Heartbeat:
    """This instance's liveness key, refreshed at most every third of its TTL, and with it
    the instance claim (`InstanceClaim`) when one is given."""

    def __init__(self, client: redis.Redis, instance: str, ttl_secs: float,
                 metrics: Metrics | None = None, claim: InstanceClaim | None = None) -> None:
        self.key = rediskeys.instance_heartbeat(instance)
        self.ttl_secs = ttl_secs
        self.claim = claim
        self._client = client
        self._metrics = metrics
        self._refreshed = float("-inf")

    def beat(self, force: bool = False) -> None:
        """SET with the TTL; raises REDIS_ERRORS."""
        now = time.monotonic()
        if force or now - self._refreshed >= self.ttl_secs / 3:
            self._client.set(self.key, heartbeat_value(), px=max(1, int(self.ttl_secs * 1000)))
            if self.claim is not None:
                self.claim.take()
            self._refreshed = now
            if self._metrics is not None:
                self._metrics.instance_heartbeat.set(time.time())

    def stop(self) -> None:
        """Delete the key: what this instance left in flight is recovered at once."""
        self._client.delete(self.key)
        if self.claim is not None:
            self.claim.release()
        self._refreshed = float("-inf")
