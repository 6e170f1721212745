"""The Redis key layout (docs/architecture.rst, "Redis keys"). The account id sits in braces so that all
of one account's keys share a Redis Cluster hash slot and one Lua script may
touch several of them."""

from __future__ import annotations

CHAT_DRAIN_LEADER = "lumio:chat:deadletter:drain:leader"
EVENTS_DRAIN_LEADER = "lumio:events:deadletter:drain:leader"
#: `shard = auto`: the replica that keeps Kick's webhook subscriptions in line.
KICK_SUBSCRIPTIONS_LEADER = "lumio:kick:subscriptions:leader"
#: `shard = auto`: the replica that runs the TimescaleDB compression policies.
COMPRESSION_LEADER = "lumio:timescale:compression:leader"
#: The lease of each timer that runs on one replica only (`Built.leader_timers`), by worker name.
LEADER_KEYS = {"kick-webhook-subscriptions": KICK_SUBSCRIPTIONS_LEADER,
               "timescale-compression": COMPRESSION_LEADER}


def leader_key(worker: str) -> str:
    """The lease key of a one-replica timer; a new such timer needs its key named here (KeyError)."""
    return LEADER_KEYS[worker]


def chat_buffer(account_id: int) -> str:
    return f"lumio:chat:buffer:{{{account_id}}}"


def chat_deadletter(account_id: int) -> str:
    return f"lumio:chat:deadletter:{{{account_id}}}"


def chat_quarantine(account_id: int) -> str:
    return f"lumio:chat:quarantine:{{{account_id}}}"


def chat_inflight(account_id: int, instance: str) -> str:
    return f"lumio:chat:inflight:{{{account_id}}}:{instance}"


def events_deadletter(account_id: int) -> str:
    return f"lumio:events:deadletter:{{{account_id}}}"


def events_quarantine(account_id: int) -> str:
    return f"lumio:events:quarantine:{{{account_id}}}"


def events_inflight(account_id: int, instance: str) -> str:
    return f"lumio:events:inflight:{{{account_id}}}:{instance}"


def events_held(account_id: int, instance: str) -> str:
    """Hash: durable copies of the gift bombs an instance holds in memory (events/held.py)."""
    return f"lumio:events:held:{{{account_id}}}:{instance}"


def instance_heartbeat(instance: str) -> str:
    return f"lumio:instance:{instance}"


def chat_claims(account_id: int) -> str:
    """Hash: in-flight owner -> the claim token of the process whose batch its list holds."""
    return f"lumio:chat:claims:{{{account_id}}}"


def instance_claim(instance: str) -> str:
    """The claim token of the one process running as `instance` (a string with a TTL)."""
    return f"lumio:claim:{instance}"


def account_owner(account_id: int) -> str:
    """`shard = auto`: the instance running the account's sources (cluster/membership.py)."""
    return f"lumio:owner:{{{account_id}}}"


def account_of(key: str) -> int:
    """The account id inside a key's braces."""
    start = key.index("{") + 1
    return int(key[start:key.index("}", start)])


def instance_of_inflight(key: str) -> str:
    """The instance id after the hash tag of an in-flight key."""
    return key[key.index("}:") + 2:]


def webhook_seen(platform: str, message_id: str) -> str:
    """A webhook delivery id already handled (a string with a TTL; one key per delivery)."""
    return f"lumio:webhooks:{platform}:seen:{message_id}"


def source_seen(account_id: int) -> str:
    """Hash: `platform:source` -> epoch ms when that path was last known connected and subscribed."""
    return f"lumio:sourceseen:{{{account_id}}}"
