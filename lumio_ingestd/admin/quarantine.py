"""The operator's side of the quarantine lists: list, show, requeue, drop.

`lumio-ingestd quarantine ...` reads `lumio:chat:quarantine:{A}` and
`lumio:events:quarantine:{A}` (found with SCAN, or named by `--account`),
filtered by kind and `--id` (an event's `id`, a chat message's
`message_id`, or the `sha256:...` digest `list` shows for entries without
one).

- `requeue` puts entries back on the path they came from, stripped of the
  quarantine wrapper (`reason`, `sqlstate`, `quarantined_at`), so the workers
  see exactly the entry they once quarantined: chat onto the account's chat
  buffer (the flusher stores it), events onto the account's event dead-letter
  list (the retry worker stores it with its original id and created_at; the
  list's TTL is refreshed as a park does).
- `drop` deletes entries; its receipt holds every deleted entry in full.

Both act per account through one Lua script per batch of entries, over keys
sharing the account's hash tag: for each entry, `LREM quarantine 1 ENTRY` and,
only if that removed it, `RPUSH target ORIGINAL`. So an entry is moved, never
copied and deleted in two steps: whatever line this process dies at, it is
in the quarantine or in the target, once. An entry that another operator (or
another run) removed in the meantime is reported as `gone`, not pushed. New
entries that the workers quarantine while this runs are appended to the same
list and are neither touched nor lost.

Entries that cannot be requeued are skipped and reported: a `raw` entry (it
was not JSON; its original bytes are gone), an event quarantined as
`expired` (the retry worker judges age by the event's own created_at and
would quarantine it again at once), and every entry whose target key holds
something other than a list (a string, a hash, ...). A Lua script that fails
half-way keeps what it already did, so the script checks the target's type
before its first LREM: on a wrong type it changes nothing and says which
type it found, and the command names the key, leaves the entries where they
are and exits 65.

Durable when `requeue` or `drop` returns: what Redis acknowledged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis

from lumio_ingestd.events.deadletter import DEADLETTER_TTL_SECS
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.quarantine import entry_ident, original_entry, parse_quarantined

KINDS = ("chat", "events")
_PAGE = 500  # entries per LRANGE page and per script call

# KEYS[1] quarantine, KEYS[2] target; ARGV[1] TTL in ms for the target (0: leave it);
# then pairs (quarantine entry, original entry). Returns one 0/1 per pair: moved or not;
# or, when the target exists and is no list, {"wrongtype", TYPE} having changed nothing
# (an RPUSH failing after its LREM would lose the entry: Redis keeps a failed script's writes).
_REQUEUE = """
local kind = redis.call('TYPE', KEYS[2]).ok
if kind ~= 'none' and kind ~= 'list' then
    return {'wrongtype', kind}
end
local moved = {}
local any = false
for i = 2, #ARGV, 2 do
    if redis.call('LREM', KEYS[1], 1, ARGV[i]) == 1 then
        redis.call('RPUSH', KEYS[2], ARGV[i + 1])
        moved[#moved + 1] = 1
        any = true
    else
        moved[#moved + 1] = 0
    end
end
local ttl = tonumber(ARGV[1])
if any and ttl > 0 then
    redis.call('PEXPIRE', KEYS[2], ttl)
end
return moved
"""

# KEYS[1] quarantine; ARGV the entries. Returns one 0/1 per entry: removed or not.
_DROP = """
local removed = {}
for i = 1, #ARGV do
    removed[i] = redis.call('LREM', KEYS[1], 1, ARGV[i])
end
return removed
"""


def quarantine_key(kind: str, account: int) -> str:
    return rediskeys.chat_quarantine(account) if kind == "chat" else rediskeys.events_quarantine(account)


def target_key(kind: str, account: int) -> str:
    """Where a requeued entry goes: the path it came from."""
    return rediskeys.chat_buffer(account) if kind == "chat" else rediskeys.events_deadletter(account)


@dataclass(frozen=True, slots=True)
class Entry:
    kind: str  # "chat" | "events"
    account: int
    raw: bytes  # the quarantine entry exactly as stored
    obj: dict[str, Any] | None  # None when the stored bytes are not a JSON object

    @property
    def ident(self) -> str:
        return entry_ident(self.obj, self.raw)

    def field(self, name: str) -> str | None:
        value = self.obj.get(name) if self.obj is not None else None
        return None if value is None else str(value)

    @property
    def reason(self) -> str | None:
        return self.field("reason")

    @property
    def sqlstate(self) -> str | None:
        return self.field("sqlstate")

    def receipt(self, *, full: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "account": self.account, "id": self.ident,
                               "reason": self.reason, "sqlstate": self.sqlstate}
        if full:
            out["entry"] = (self.obj if self.obj is not None
                            else self.raw.decode("utf-8", "backslashreplace"))
        return out

    def line(self) -> str:
        """One line for `list`: kind, account, id, SQLSTATE, when, what it is, and the reason last
        (a database's reason can be long; the columns before it stay aligned)."""
        if self.kind == "events":
            what = " ".join(x for x in (self.field("platform"), self.field("type")) if x)
        else:
            what = " ".join(x for x in (self.field("platform"), self.field("user_login")) if x)
        if self.obj is None or "raw" in self.obj:
            what = "(not a readable entry)"
        when = self.field("quarantined_at") or "-"
        if len(when) > 20 and when.endswith("Z"):
            when = when[:19] + "Z"  # to the second
        return "  ".join([f"{self.kind:<6}", f"{self.account:>8}", f"{self.ident:<36}",
                          f"{self.sqlstate or '-':<5}", f"{when:<20}", f"{what or '-':<28}",
                          self.reason or "-"]).rstrip()


class Quarantines:
    """Reads and changes the quarantine lists through one Redis client."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        #: Per target key, the type found there by the last `requeue` when it was not a list.
        self.wrong_targets: dict[str, str] = {}
        self._requeue = client.register_script(_REQUEUE)
        self._drop = client.register_script(_DROP)

    def keys(self, *, account: int | None = None, kind: str | None = None) -> list[tuple[str, int]]:
        """(kind, account) of every non-empty quarantine list matching the filter, sorted."""
        kinds = [kind] if kind is not None else list(KINDS)
        found: set[tuple[str, int]] = set()
        for k in kinds:
            if account is not None:
                if self._client.exists(quarantine_key(k, account)):
                    found.add((k, account))
                continue
            for raw_key in self._client.scan_iter(match=f"lumio:{k}:quarantine:{{*}}", count=1000):
                key = raw_key.decode("utf-8", "replace") if isinstance(raw_key, bytes) else str(raw_key)
                try:
                    found.add((k, rediskeys.account_of(key)))
                except ValueError:  # not a key of ours: leave it alone
                    continue
        return sorted(found, key=lambda ka: (ka[1], KINDS.index(ka[0])))

    def entries(self, *, account: int | None = None, kind: str | None = None,
                ids: Sequence[str] = ()) -> Iterator[Entry]:
        """Every quarantined entry matching the filter, list by list, oldest first."""
        wanted = set(ids)
        for k, acc in self.keys(account=account, kind=kind):
            key = quarantine_key(k, acc)
            start = 0
            while True:
                page: list[bytes] = cast(list[bytes], self._client.lrange(key, start, start + _PAGE - 1))
                for raw in page:
                    entry = Entry(k, acc, bytes(raw), parse_quarantined(bytes(raw)))
                    if not wanted or entry.ident in wanted:
                        yield entry
                if len(page) < _PAGE:
                    break
                start += _PAGE

    def requeue(self, entries: Iterable[Entry]) -> dict[str, list[dict[str, Any]]]:
        """Move entries back where they came from; returns moved / gone / skipped."""
        result: dict[str, list[dict[str, Any]]] = {"moved": [], "gone": [], "skipped": []}
        self.wrong_targets = {}
        pairs: dict[tuple[str, int], list[tuple[Entry, bytes]]] = {}
        for entry in entries:
            original = original_entry(entry.obj) if entry.obj is not None else None
            if original is None:
                result["skipped"].append({**entry.receipt(), "why": "not JSON: its original bytes "
                                          "are gone; repair it by hand or drop it"})
                continue
            if entry.kind == "events" and entry.reason == "expired":
                result["skipped"].append({**entry.receipt(), "why": "expired: older than the "
                                          "dead-letter TTL by its created_at, the retry worker "
                                          "would quarantine it again"})
                continue
            pairs.setdefault((entry.kind, entry.account), []).append((entry, original))
        for (kind, account), items in pairs.items():
            ttl_ms = int(DEADLETTER_TTL_SECS * 1000) if kind == "events" else 0
            for chunk in _chunks(items, _PAGE):
                args: list[bytes | int] = [ttl_ms]
                for entry, original in chunk:
                    args += [entry.raw, original]
                target = target_key(kind, account)
                flags = self._requeue(keys=[quarantine_key(kind, account), target], args=args)
                if flags and flags[0] == b"wrongtype":
                    found = flags[1].decode("utf-8", "replace")
                    self.wrong_targets[target] = found
                    result["skipped"].extend(
                        {**entry.receipt(), "why": f"its target {target} holds a {found}, not a "
                         "list: nothing was moved; rename or remove that key, then requeue again"}
                        for entry, _ in chunk)
                    continue
                for (entry, _), flag in zip(chunk, flags, strict=True):
                    if int(flag):
                        result["moved"].append({**entry.receipt(), "to": target_key(kind, account)})
                    else:
                        result["gone"].append(entry.receipt())
        return result

    def drop(self, entries: Iterable[Entry]) -> dict[str, list[dict[str, Any]]]:
        """Delete entries; returns dropped (each in full) / gone."""
        result: dict[str, list[dict[str, Any]]] = {"dropped": [], "gone": []}
        by_list: dict[tuple[str, int], list[Entry]] = {}
        for entry in entries:
            by_list.setdefault((entry.kind, entry.account), []).append(entry)
        for (kind, account), items in by_list.items():
            for chunk in _chunks(items, _PAGE):
                flags = self._drop(keys=[quarantine_key(kind, account)], args=[e.raw for e in chunk])
                for entry, flag in zip(chunk, flags, strict=True):
                    if int(flag):
                        result["dropped"].append(entry.receipt(full=True))
                    else:
                        result["gone"].append(entry.receipt())
        return result


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def receipt_json(action: str, result: dict[str, list[dict[str, Any]]], not_found: Sequence[str]) -> str:
    body: dict[str, Any] = dict(result)
    body["not_found"] = list(not_found)
    body["counts"] = {name: len(items) for name, items in result.items()}
    return json.dumps({action: body}, ensure_ascii=False, sort_keys=True)


def show_json(entry: Entry) -> str:
    return json.dumps(entry.receipt(full=True), ensure_ascii=False, sort_keys=True, indent=2)
