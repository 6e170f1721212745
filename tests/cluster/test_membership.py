"""The pieces of `shard = auto` on their own: rendezvous ownership, owner keys, the lease gate.

Against a real Redis: two `Membership` workers (run turn by turn here) split
the accounts and hand one over only after its old owner released it; a
`LeaseGated` worker runs on one replica at a time and moves when the holder stops.
"""

from __future__ import annotations

import threading

import redis

from lumio_ingestd.cluster.lease import Lease, LeaseGated
from lumio_ingestd.cluster.membership import Membership, owner
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.worker import Worker

ACCOUNTS = range(1, 201)


def test_rendezvous_moves_only_what_the_newcomer_gains() -> None:
    before = {a: owner(a, ["r1", "r2", "r3"]) for a in ACCOUNTS}
    after = {a: owner(a, ["r1", "r2", "r3", "r4"]) for a in ACCOUNTS}
    moved = [a for a in ACCOUNTS if before[a] != after[a]]
    assert moved and all(after[a] == "r4" for a in moved)
    assert 25 <= len(moved) <= 75  # about a quarter
    gone = {a: owner(a, ["r1", "r3"]) for a in ACCOUNTS}
    assert all(gone[a] == before[a] for a in ACCOUNTS if before[a] != "r2")
    assert owner(1, []) is None


def _member(client: redis.Redis, name: str, accounts: range) -> Membership:
    m = Membership(client, name, 5.0, Metrics(), interval_secs=0.1)
    m.set_accounts(accounts)
    m.run_once()  # the first turn only announces
    return m


def test_an_account_moves_only_after_its_old_owner_released_it(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    accounts = range(1, 41)
    one = _member(client, "m-one", accounts)
    one.run_once()
    mine = one.target()
    assert mine == frozenset(accounts)  # alone: everything
    one.settled(frozenset(accounts), released=())
    two = _member(client, "m-two", accounts)
    two.run_once()
    gains = {a for a in accounts if owner(a, ["m-one", "m-two"]) == "m-two"}
    assert gains
    assert two.target() == frozenset()  # m-one still holds their keys
    one.run_once()
    assert one.target() == frozenset(accounts) - gains  # m-one lets them go...
    two.run_once()
    assert two.target() == frozenset()  # ...but holds the keys until its sources stopped
    one.settled(frozenset(accounts) - gains, released=gains)
    two.run_once()
    assert two.target() == frozenset(gains)
    assert two.flushes(min(gains)) and not one.flushes(min(gains))
    for a in accounts:
        holder = client.get(f"lumio:owner:{{{a}}}")
        assert holder == (b"m-two" if a in gains else b"m-one")
    client.close()


class _Counting(Worker):
    def __init__(self, name: str, metrics: Metrics) -> None:
        super().__init__(name, metrics)
        self.runs = 0
        self.ran = threading.Event()

    def run_once(self) -> float:
        self.runs += 1
        self.ran.set()
        return 0.05


def test_a_lease_gated_worker_runs_on_one_replica_and_moves_when_it_stops(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.delete("lumio:test:gate")
    metrics = Metrics()
    inner = [_Counting("kick-webhook-subscriptions", metrics) for _ in range(2)]
    gates = [LeaseGated(w, Lease(client, "lumio:test:gate", 3.0, metrics, owner=f"r{i}"), 3.0,
                        retry_secs=0.05) for i, w in enumerate(inner)]
    gates[0].start()
    assert inner[0].ran.wait(5)
    gates[1].start()
    assert not inner[1].ran.wait(0.5)  # the lease is r0's
    gates[0].request_stop()
    assert gates[0].join(5)
    assert inner[1].ran.wait(5)  # released at r0's stop: r1 takes over at once
    gates[1].request_stop()
    assert gates[1].join(5)
    assert client.get("lumio:test:gate") is None
    client.close()
