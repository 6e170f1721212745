"""The 7TV EventAPI v3 wire protocol and the emote-set mapping (pure: no I/O).

Frames (docs/platforms.rst, "The EventAPI protocol") are `{"op", "t", "d", "s"?}` JSON text. `decode()`
turns one into a `Hello`, `Heartbeat`, `Reconnect`, `Ack`, `ErrorFrame`,
`EndOfStream` or `Dispatch`, or raises `BadFrame` with a short reason (the
metric label) and a detail (the log): not JSON, not an object, a client
opcode, a legacy v1 frame, a field of the wrong type. The dispatch bodies the
daemon follows are read by `set_update()` (`emote_set.update`: `pushed`,
`pulled` and `updated` items of key `emotes`) and `user_update()`
(`user.update`: `updated[key=connections]` nested `emote_set`/`emote_set_id`,
the switch of a connection's active emote set).

Mapping. The state of an emote set is `{emote id: Entry(name, added ms,
actor, renames, seen)}` with a `version` that grows by one with every change
set applied, and the emotes removed from it lately (`SetState.removed`: emote
id -> the added time of what was removed). Dispatches and REST snapshots go
through the same two steps, so both paths see one change the same way: a
target state (`judge_update()` for a dispatch; the REST set as it is, with
`carry_known()`), then `diff(stored, target)`, one `Change` per emote:
`added`, `removed`, `renamed`, or removed + added when the emote was taken
out and put back in between (its added time moved). `to_event()` makes the
`events` row; its `external_id` is derived from (emote set, emote, change,
the version of the stored state the change applies to, the names), so the
dispatch of a change and the REST diff of the same change, computed against
the same stored state, are one row. A rename's is derived from the emote
alone (set, emote, when it was added, how often it was renamed before:
`Entry.renames`, names), so a rename sent again after other changes to the
set is the same row.

7TV may send a dispatch again, byte for byte, after later changes.
`judge_update()` reads each item against the state. One that says what the
state already holds, or what it has gone past, is a repeat and changes
nothing: an addition of an emote the state has from that addition or a
later one, or removed after that addition; a removal of an emote removed
already, or of an earlier addition; a rename to the emote's name now. Only a
removal of the emote as the state has it, an addition of an emote the state
has not, and a rename from the emote's name now change the state. An item
that fits neither disagrees (a rename from another name; an addition of an
emote the state holds from an earlier addition, its removal not seen; a
change sent no later than the last change the state took for the emote):
then nothing of the dispatch is applied, and a heal asks the REST API what
is true. So a repeat never moves a name, an actor or a rename count, and one
rename is counted once whichever path sees it.

REST shapes (`GET /users/twitch/{id}`, `GET /users/{id}`,
`GET /emote-sets/{id}`) are read by `twitch_user()`, `user_active_set()` and
`emote_set()`; a body that does not fit raises `BadResponse`.

Nothing durable here.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from lumio_ingestd import boundedjson
from lumio_ingestd.model import PlatformEvent
from lumio_ingestd.sources import base

PLATFORM = "seventv"

OP_DISPATCH = 0
OP_HELLO = 1
OP_HEARTBEAT = 2
OP_RECONNECT = 4
OP_ACK = 5
OP_ERROR = 6
OP_END_OF_STREAM = 7
OP_IDENTIFY = 33
OP_RESUME = 34
OP_SUBSCRIBE = 35
OP_UNSUBSCRIBE = 36
OP_SIGNAL = 37
OP_BRIDGE = 38
CLIENT_OPS = frozenset({OP_IDENTIFY, OP_RESUME, OP_SUBSCRIBE, OP_UNSUBSCRIBE, OP_SIGNAL, OP_BRIDGE})

EMOTE_SET_UPDATE = "emote_set.update"
USER_UPDATE = "user.update"

MAX_FRAME_BYTES = 1024 * 1024
#: 7TV ids: 24 hex digits (v2/v3 ObjectIds) or 26 Crockford characters (ULIDs); bounded.
_ID = re.compile(r"[A-Za-z0-9]{1,64}")
#: Go's zero time.Time in unix ms (a pulled item's `timestamp` in captured frames): unknown.
_NO_TIME_BELOW = 0
_MAX_MS = 253402300799999  # 9999-12-31T23:59:59.999Z
MAX_NAME = 100

ChangeKind = Literal["added", "removed", "renamed"]
EVENT_TYPES: dict[str, str] = {"added": "emote.added", "removed": "emote.removed",
                               "renamed": "emote.renamed"}


class BadFrame(base.BadFrame):
    """The shared `BadFrame`; its message names the reason too."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail, message=f"{reason}: {detail}")


class BadResponse(ValueError):
    """A REST body that is not the shape 7TV documents."""


# -- frames ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    heartbeat_interval_ms: int
    session_id: str
    #: None: the server names no limit (absent, or -1).
    subscription_limit: int | None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    count: int | None


@dataclass(frozen=True, slots=True)
class Reconnect:
    reason: str


@dataclass(frozen=True, slots=True)
class Ack:
    command: str
    data: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ErrorFrame:
    message: str


@dataclass(frozen=True, slots=True)
class EndOfStream:
    code: int | None
    message: str


@dataclass(frozen=True, slots=True)
class Dispatch:
    type: str
    #: The envelope's `t` (unix ms), when it has a usable one.
    t: int | None
    body: Mapping[str, Any]


Frame = Hello | Heartbeat | Reconnect | Ack | ErrorFrame | EndOfStream | Dispatch


def decode(data: bytes | str, *, binary: bool = False) -> Frame:
    """One server frame; raises BadFrame (never anything else) when it is not one."""
    if binary:
        raise BadFrame("binary", f"binary frame of {len(data)} bytes (7TV sends text)")
    if len(data) > MAX_FRAME_BYTES:
        raise BadFrame("too_large", f"{len(data)} bytes > {MAX_FRAME_BYTES}")
    try:
        obj = boundedjson.loads(data, max_bytes=MAX_FRAME_BYTES)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadFrame("not_json", f"{type(exc).__name__}: {str(exc)[:120]}") from None
    if not isinstance(obj, dict):
        raise BadFrame("not_object", f"a JSON {type(obj).__name__}, not an object")
    if "op" not in obj:
        if "action" in obj or "channel" in obj:
            raise BadFrame("legacy_v1", f"EventAPI v1 frame (action={str(obj.get('action'))[:32]!r}); "
                                        "v1 is retired")
        raise BadFrame("no_op", f"no op in an object with keys {sorted(obj)[:8]}")
    op = obj["op"]
    if type(op) is not int:
        raise BadFrame("bad_op", f"op is {type(op).__name__} {str(op)[:32]!r}")
    d = obj.get("d")
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise BadFrame("bad_payload", f"op {op}: d is a {type(d).__name__}")
    if op == OP_DISPATCH:
        return _dispatch(obj, d)
    if op == OP_HELLO:
        return _hello(d)
    if op == OP_HEARTBEAT:
        count = d.get("count")
        return Heartbeat(count if type(count) is int else None)
    if op == OP_RECONNECT:
        return Reconnect(_text(d.get("reason"), 200))
    if op == OP_ACK:
        command = d.get("command")
        data_ = d.get("data")
        return Ack(_text(command, 32), data_ if isinstance(data_, dict) else {})
    if op == OP_ERROR:
        return ErrorFrame(_text(d.get("message"), 300) or json.dumps(d)[:300])
    if op == OP_END_OF_STREAM:
        code = d.get("code")
        return EndOfStream(code if type(code) is int else None, _text(d.get("message"), 200))
    if op in CLIENT_OPS:
        raise BadFrame("client_op", f"op {op} is sent by clients, not servers")
    raise BadFrame("unknown_op", f"op {op}")


def _hello(d: Mapping[str, Any]) -> Hello:
    interval = d.get("heartbeat_interval")
    if type(interval) is not int or interval <= 0:
        raise BadFrame("bad_hello", f"heartbeat_interval {str(interval)[:32]!r}")
    session = d.get("session_id")
    if not isinstance(session, str) or not session:
        raise BadFrame("bad_hello", "no session_id")
    limit = d.get("subscription_limit")
    if limit is not None and type(limit) is not int:
        raise BadFrame("bad_hello", f"subscription_limit {str(limit)[:32]!r}")
    return Hello(interval, session[:128], limit if limit is not None and limit >= 0 else None)


def _dispatch(obj: Mapping[str, Any], d: Mapping[str, Any]) -> Dispatch:
    kind = d.get("type")
    if not isinstance(kind, str) or not kind:
        raise BadFrame("bad_dispatch", "no type")
    body = d.get("body")
    if not isinstance(body, dict):
        raise BadFrame("bad_dispatch", f"{kind[:64]}: body is not an object")
    t = obj.get("t")
    return Dispatch(kind[:64], t if type(t) is int and 0 < t <= _MAX_MS else None, body)


def _text(value: object, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


def subscribe(sub_type: str, object_id: str) -> str:
    return json.dumps({"op": OP_SUBSCRIBE, "d": {"type": sub_type, "condition": {"object_id": object_id}}})


def unsubscribe(sub_type: str, object_id: str) -> str:
    return json.dumps({"op": OP_UNSUBSCRIBE, "d": {"type": sub_type, "condition": {"object_id": object_id}}})


def resume(session_id: str) -> str:
    return json.dumps({"op": OP_RESUME, "d": {"session_id": session_id}})


# -- dispatch bodies ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Actor:
    id: str
    username: str = ""
    display_name: str = ""

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "username": self.username, "display_name": self.display_name}


@dataclass(frozen=True, slots=True)
class Entry:
    """One emote in a set: its name there, when it was added (unix ms; None unknown), by whom."""

    name: str
    ts: int | None = None
    actor_id: str | None = None
    #: How often it was renamed in this set since it was added (a rename's identity).
    renames: int = 0
    #: The time (envelope `t`, unix ms) of the last dispatch that added or renamed it here.
    seen: int | None = None

    @property
    def last(self) -> int | None:
        """The latest time known of a change to it (7TV's added time is on the dispatches' clock:
        an addition's frame carries the same millisecond)."""
        known = [x for x in (self.ts, self.seen) if x is not None]
        return max(known) if known else None


@dataclass(frozen=True, slots=True)
class SetUpdate:
    set_id: str
    actor: Actor | None
    pushed: tuple[tuple[str, Entry], ...] = ()
    #: (emote id, its name, its added time): None when the body does not say (7TV sends Go's zero
    #: time for the added time of a removed emote).
    pulled: tuple[tuple[str, str | None, int | None], ...] = ()
    #: (emote id, new name, old name, added time): None when the body does not say.
    renamed: tuple[tuple[str, str, str | None, int | None], ...] = ()
    #: Items refused inside an otherwise good body (reason per item), for the log.
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SetSwitch:
    """A connection's active emote set changed: `old` (None: had none) -> `new` (None: removed)."""

    old: str | None
    new: str | None


@dataclass(frozen=True, slots=True)
class UserUpdate:
    user_id: str
    actor: Actor | None
    switches: tuple[SetSwitch, ...] = ()


def _id(value: object) -> str | None:
    return value if isinstance(value, str) and _ID.fullmatch(value) else None


def _ms(value: object) -> int | None:
    return value if type(value) is int and _NO_TIME_BELOW < value <= _MAX_MS else None


def _actor(value: object) -> Actor | None:
    if not isinstance(value, dict):
        return None
    actor_id = _id(value.get("id"))
    if actor_id is None:
        return None
    return Actor(actor_id, _text(value.get("username"), 64), _text(value.get("display_name"), 64))


def _entry(value: object) -> tuple[str, Entry] | None:
    """An ActiveEmote object ({id, name, timestamp, actor_id, ...}) as (id, Entry)."""
    if not isinstance(value, dict):
        return None
    emote_id = _id(value.get("id"))
    name = value.get("name")
    if emote_id is None or not isinstance(name, str) or not name:
        return None
    return emote_id, Entry(name[:MAX_NAME], _ms(value.get("timestamp")), _id(value.get("actor_id")))


def _items(body: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = body.get(key)
    if items is None:
        return []
    if not isinstance(items, list):
        raise BadFrame("bad_dispatch", f"{key} is a {type(items).__name__}, not a list")
    return [i for i in items if isinstance(i, dict)]


def set_update(d: Dispatch) -> SetUpdate:
    """The emote changes of an `emote_set.update` body; raises BadFrame when it is not one."""
    set_id = _id(d.body.get("id"))
    if set_id is None:
        raise BadFrame("bad_dispatch",
                       f"emote_set.update without a usable id ({str(d.body.get('id'))[:40]!r})")
    pushed: list[tuple[str, Entry]] = []
    pulled: list[tuple[str, str | None, int | None]] = []
    renamed: list[tuple[str, str, str | None, int | None]] = []
    skipped: list[str] = []
    for item in _items(d.body, "pushed"):
        if item.get("key") != "emotes":
            continue
        got = _entry(item.get("value"))
        if got is None:
            skipped.append("pushed item without an emote id and name")
        else:
            pushed.append(got)
    for item in _items(d.body, "pulled"):
        if item.get("key") != "emotes":
            continue
        old = item.get("old_value")
        if not isinstance(old, dict) or (emote_id := _id(old.get("id"))) is None:
            skipped.append("pulled item without an emote id")
        else:
            name = old.get("name")
            pulled.append((emote_id, name[:MAX_NAME] if isinstance(name, str) and name else None,
                           _ms(old.get("timestamp"))))
    for item in _items(d.body, "updated"):
        if item.get("key") != "emotes":
            continue
        got = _entry(item.get("value"))
        if got is None:
            skipped.append("updated item without an emote id and name")
        else:
            old_entry = _entry(item.get("old_value"))
            old_name = old_entry[1].name if old_entry is not None and old_entry[0] == got[0] else None
            renamed.append((got[0], got[1].name, old_name, got[1].ts))
    return SetUpdate(set_id, _actor(d.body.get("actor")), tuple(pushed), tuple(pulled),
                     tuple(renamed), tuple(skipped))


def user_update(d: Dispatch) -> UserUpdate:
    """The active-emote-set switches of a `user.update` body (none when it changed something else)."""
    user_id = _id(d.body.get("id"))
    if user_id is None:
        raise BadFrame("bad_dispatch", f"user.update without a usable id ({str(d.body.get('id'))[:40]!r})")
    switches: list[SetSwitch] = []
    for item in _items(d.body, "updated"):
        if item.get("key") != "connections":
            continue
        nested = item.get("value")
        if not isinstance(nested, list):
            continue
        for field_ in nested:
            if not isinstance(field_, dict):
                continue
            key = field_.get("key")
            if key == "emote_set":
                old, new = field_.get("old_value"), field_.get("value")
                switches.append(SetSwitch(_id(old.get("id")) if isinstance(old, dict) else None,
                                          _id(new.get("id")) if isinstance(new, dict) else None))
            elif key == "emote_set_id":
                switches.append(SetSwitch(_id(field_.get("old_value")), _id(field_.get("value"))))
    return UserUpdate(user_id, _actor(d.body.get("actor")), tuple(switches))


# -- state, diff and events ----------------------------------------------------------------------------


Emotes = Mapping[str, Entry]


@dataclass(frozen=True, slots=True)
class SetState:
    """The last known state of an account's emote set (as stored in `seventv_emote_sets`)."""

    set_id: str
    emotes: Emotes
    version: int
    user_id: str | None = None
    #: Emotes removed from the set lately, oldest first: emote id -> the added time (None:
    #: unknown) of what was removed. What tells an addition sent again after the removal from
    #: a new one; at most MAX_REMOVED.
    removed: Mapping[str, int | None] = field(default_factory=dict)


#: Removals remembered per set. 7TV repeats a dispatch soon (around a reconnect), not after
#: hundreds of later removals from the same set.
MAX_REMOVED = 500


@dataclass(frozen=True, slots=True)
class Judged:
    """What a dispatch does to a state (`judge_update`)."""

    #: The set and its removals after the dispatch (the state's own when something disagrees).
    emotes: dict[str, Entry]
    removed: dict[str, int | None]
    #: Items that repeat what the state holds or has gone past: "emote id: what".
    repeats: tuple[str, ...]
    #: Items that disagree with the state: "emote id: why". Then nothing is applied.
    disagreements: tuple[str, ...]


def _remember(removed: dict[str, int | None], emote_id: str, ts: int | None) -> None:
    removed.pop(emote_id, None)
    removed[emote_id] = ts
    while len(removed) > MAX_REMOVED:
        del removed[next(iter(removed))]


def _other_addition(emote_id: str, ts: int | None, have: Entry, what: str) -> tuple[bool, str] | None:
    """An item about another addition of the emote than the state's: (True, why) for an earlier
    one (a repeat), (False, why) for a later one (a disagreement); None when it is about the
    state's addition, or the times cannot tell."""
    if ts is None or have.ts is None or ts == have.ts:
        return None
    if ts < have.ts:
        return True, f"{emote_id}: {what} of an earlier addition"
    return False, f"{emote_id}: {what} of a later addition than the set has"


def judge_update(state: SetState, update: SetUpdate, t: int | None) -> Judged:
    """The state after a dispatch sent at `t` (its envelope time; None: unknown): pulled out,
    then pushed in, then renamed (the order in which one body's items can all hold), each item
    read against the state as the earlier items of the body left it (module doc: repeats)."""
    emotes, removed = dict(state.emotes), dict(state.removed)
    #: Changed by an earlier item of this body: one change set, one time; not "sent before".
    touched: set[str] = set()
    pushed_here: set[str] = set()
    repeats: list[str] = []
    disagree: list[str] = []

    def sent_before(emote_id: str, have: Entry) -> bool:
        """The dispatch was sent no later than the last change the state took for the emote."""
        last = have.last
        return t is not None and last is not None and emote_id not in touched and t <= last

    for emote_id, name, ts in update.pulled:
        have = emotes.get(emote_id)
        if have is None:
            if emote_id in removed:
                repeats.append(f"{emote_id}: removed already")
            else:
                disagree.append(f"{emote_id}: removal of an emote the set does not have")
        elif (other := _other_addition(emote_id, ts, have, "removal")) is not None:
            (repeats if other[0] else disagree).append(other[1])
        elif name is not None and name != have.name:
            disagree.append(f"{emote_id}: removal of {name!r}, the set has {have.name!r}")
        elif sent_before(emote_id, have):
            disagree.append(f"{emote_id}: removal sent before the emote's last change")
        else:
            del emotes[emote_id]
            _remember(removed, emote_id, have.ts)
            touched.add(emote_id)
    for emote_id, entry in update.pushed:
        have = emotes.get(emote_id)
        if have is not None:
            if entry.ts is not None and have.ts is not None:
                if entry.ts <= have.ts:
                    repeats.append(f"{emote_id}: added already")
                else:
                    disagree.append(f"{emote_id}: added again, the set has an earlier addition")
            elif entry.name == have.name:
                repeats.append(f"{emote_id}: added already")
            else:
                disagree.append(f"{emote_id}: added as {entry.name!r}, the set has {have.name!r}")
            continue
        if emote_id in removed:
            gone_ts = removed[emote_id]
            if entry.ts is None or gone_ts is None:
                disagree.append(f"{emote_id}: added, and removed before: no time to tell which is later")
                continue
            if entry.ts <= gone_ts:
                repeats.append(f"{emote_id}: removed since")
                continue
        emotes[emote_id] = Entry(entry.name, entry.ts, entry.actor_id, 0, t)
        removed.pop(emote_id, None)
        touched.add(emote_id)
        pushed_here.add(emote_id)
    for emote_id, name, old_name, ts in update.renamed:
        have = emotes.get(emote_id)
        if have is None:
            gone_ts = removed.get(emote_id)
            if ts is not None and gone_ts is not None and ts <= gone_ts:
                repeats.append(f"{emote_id}: removed since")
            else:
                disagree.append(f"{emote_id}: rename of an emote the set does not have")
        elif (other := _other_addition(emote_id, ts, have, "rename")) is not None:
            (repeats if other[0] else disagree).append(other[1])
        elif name == have.name:
            repeats.append(f"{emote_id}: named {name!r} already")
        elif old_name != have.name:
            disagree.append(f"{emote_id}: rename from {old_name!r}, the set has {have.name!r}")
        elif sent_before(emote_id, have):
            disagree.append(f"{emote_id}: rename sent before the emote's last change")
        else:
            # Renamed in the body that added it: the addition's row carries the new name, and
            # the count stays what a REST snapshot of the set would give.
            renames = have.renames + (0 if emote_id in pushed_here else 1)
            emotes[emote_id] = Entry(name, have.ts, have.actor_id, renames,
                                     t if t is not None else have.seen)
            touched.add(emote_id)
    if disagree:
        return Judged(dict(state.emotes), dict(state.removed), tuple(repeats), tuple(disagree))
    return Judged(emotes, removed, tuple(repeats), ())


def carry_known(old: Emotes, new: Emotes) -> dict[str, Entry]:
    """`new` (a REST snapshot, which has no rename counts nor dispatch times) with what `old`
    knows of each emote: the same emote, added at the same time, keeps its count (plus one when
    its name moved) and the time of its last dispatch."""
    out: dict[str, Entry] = {}
    for emote_id, entry in new.items():
        before = old.get(emote_id)
        if before is not None and (before.ts is None or entry.ts is None or before.ts == entry.ts):
            count = before.renames + (1 if before.name != entry.name else 0)
            entry = Entry(entry.name, entry.ts, entry.actor_id, count, before.seen)
        out[emote_id] = entry
    return out


def removed_after(old: SetState, new: Emotes) -> dict[str, int | None]:
    """The removals of `old`'s set once it is `new` (a REST snapshot of the same set): those of
    `old`, then the emotes it had that `new` has not."""
    removed = {k: v for k, v in old.removed.items() if k not in new}
    for emote_id, entry in old.emotes.items():
        if emote_id not in new:
            _remember(removed, emote_id, entry.ts)
    return removed


@dataclass(frozen=True, slots=True)
class Change:
    kind: ChangeKind
    emote_id: str
    name: str
    old_name: str | None = None
    #: When the emote was added to the set (unix ms), when known.
    ts: int | None = None
    actor_id: str | None = None
    #: A rename: how often the emote was renamed in the set before this one.
    renames: int = 0


def diff(old: Emotes, new: Emotes, *, compare_ts: bool = True) -> list[Change]:
    """One change per emote, in emote-id order. With `compare_ts`, an emote whose added time
    moved was removed and added again; without (a switch to another set) only names count."""
    changes: list[Change] = []
    for emote_id in sorted(set(old) | set(new)):
        before, after = old.get(emote_id), new.get(emote_id)
        if after is None:
            assert before is not None
            changes.append(Change("removed", emote_id, before.name, ts=before.ts))
        elif before is None:
            changes.append(Change("added", emote_id, after.name, ts=after.ts, actor_id=after.actor_id))
        elif compare_ts and before.ts is not None and after.ts is not None and before.ts != after.ts:
            changes.append(Change("removed", emote_id, before.name, ts=before.ts))
            changes.append(Change("added", emote_id, after.name, ts=after.ts, actor_id=after.actor_id))
        elif before.name != after.name:
            changes.append(Change("renamed", emote_id, after.name, old_name=before.name, ts=after.ts,
                                  actor_id=after.actor_id, renames=before.renames))
    return changes


def merge_known(old: Emotes, new: Emotes) -> dict[str, Entry]:
    """`new`, with what `old` knew of an emote that `new` leaves unknown (added time, actor)."""
    out: dict[str, Entry] = {}
    for emote_id, entry in new.items():
        before = old.get(emote_id)
        if before is not None and entry.ts is None and before.name == entry.name:
            entry = Entry(entry.name, before.ts, entry.actor_id or before.actor_id, before.renames)
        out[emote_id] = entry
    return out


def external_id(set_id: str, change: Change, version: int) -> str:
    """Deterministic. An addition or removal: (set, emote, change, version of the state it
    applies to, names). A rename: (set, emote, when the emote was added, how often it was renamed
    before, names): nothing the rest of the set does moves it, so the same rename sent again
    after later changes is the same row."""
    names = hashlib.sha256(f"{change.old_name or ''}\x00{change.name}".encode()).hexdigest()[:12]
    if change.kind == "renamed":
        added = change.ts if change.ts is not None else "-"
        return f"{set_id}:{change.emote_id}:renamed:a{added}:r{change.renames}:{names}"
    return f"{set_id}:{change.emote_id}:{change.kind}:v{version}:{names}"


def ms_to_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


@dataclass(frozen=True, slots=True)
class Context:
    """Where a change set comes from: what `to_event()` needs besides the change."""

    set_id: str
    version: int
    at: datetime
    via: Literal["eventapi", "rest"]
    actor: Actor | None = None
    previous_set_id: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


def to_event(account_id: int, change: Change, ctx: Context) -> PlatformEvent:
    actor: dict[str, str] | None = ctx.actor.to_json() if ctx.actor is not None else None
    if actor is None and change.actor_id is not None and change.kind != "removed":
        actor = {"id": change.actor_id}
    payload: dict[str, Any] = {
        "emote_set_id": ctx.set_id, "emote_id": change.emote_id, "name": change.name,
        "actor": actor, "via": ctx.via, "state_version": ctx.version,
    }
    if change.kind == "renamed":
        payload["old_name"] = change.old_name
    if change.ts is not None:
        payload["emote_added_at"] = ms_to_datetime(change.ts).isoformat().replace("+00:00", "Z")
    if ctx.previous_set_id is not None:
        payload["previous_emote_set_id"] = ctx.previous_set_id
    payload.update(ctx.extra)
    return PlatformEvent.new(
        account_id=account_id, platform=PLATFORM, type=EVENT_TYPES[change.kind], payload=payload,
        created_at=ctx.at, external_id=external_id(ctx.set_id, change, ctx.version),
        user_id=actor["id"] if actor is not None else None)


# -- REST bodies ------------------------------------------------------------------------------------------


def emote_set(obj: object) -> tuple[str, dict[str, Entry]]:
    """`GET /emote-sets/{id}`: (set id, emotes). `emotes` may be null or missing (an empty set)."""
    if not isinstance(obj, dict):
        raise BadResponse("emote set: not a JSON object")
    set_id = _id(obj.get("id"))
    if set_id is None:
        raise BadResponse(f"emote set: no usable id ({str(obj.get('id'))[:40]!r})")
    items = obj.get("emotes")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise BadResponse(f"emote set {set_id}: emotes is a {type(items).__name__}")
    emotes: dict[str, Entry] = {}
    for item in items:
        got = _entry(item)
        if got is None:
            raise BadResponse(f"emote set {set_id}: an emote without a usable id and name")
        emotes[got[0]] = got[1]
    return set_id, emotes


def twitch_user(obj: object) -> tuple[str, str | None]:
    """`GET /users/twitch/{id}` (the Twitch connection): (7TV user id, active emote set id)."""
    if not isinstance(obj, dict):
        raise BadResponse("twitch user: not a JSON object")
    user = obj.get("user")
    user_id = _id(user.get("id")) if isinstance(user, dict) else None
    if user_id is None:
        raise BadResponse("twitch user: no user.id")
    set_id = _id(obj.get("emote_set_id"))
    if set_id is None and isinstance(obj.get("emote_set"), dict):
        set_id = _id(obj["emote_set"].get("id"))
    return user_id, set_id


def user_active_set(obj: object, platform: str = "TWITCH") -> str | None:
    """`GET /users/{id}`: the active emote set of the user's connection on `platform`
    (else of the first connection that has one)."""
    if not isinstance(obj, dict):
        raise BadResponse("user: not a JSON object")
    connections = obj.get("connections")
    if connections is None:
        return None
    if not isinstance(connections, list):
        raise BadResponse("user: connections is not a list")
    found: list[tuple[bool, str]] = []
    for conn in connections:
        if not isinstance(conn, dict):
            continue
        set_id = _id(conn.get("emote_set_id"))
        if set_id is None and isinstance(conn.get("emote_set"), dict):
            set_id = _id(conn["emote_set"].get("id"))
        if set_id is not None:
            found.append((conn.get("platform") == platform, set_id))
    for preferred, set_id in found:
        if preferred:
            return set_id
    return found[0][1] if found else None
