"""The daemon's garbage-collector policy: the one process-wide setting it changes.

Almost everything on the hot path (parsed frames, messages, entries, Redis
replies) is freed by reference counting the moment it is done with; cyclic
garbage is rare (a failed connection, a reload). CPython's default
collector nevertheless runs a generation-0 pass every 700 net container
allocations, and with sources holding batches in their `ChatQueue`s (up to
200 messages each, several containers per message) those passes found
nothing to free but kept promoting live, short-lived messages into the older
generations, whose passes then walked every long-lived object built at
start (configuration, metrics, connections, compiled patterns). Measured with
one Twitch socket: ~0.4 s of 16 s of collector time; with 16 sockets ~2.8 s
of 24 s.

`apply()` therefore (once, after the daemon is built) collects what start-up
left, freezes the survivors (they leave the collector's generations: they
live as long as the process) and raises the generation-0 threshold so a pass
sees mostly objects that are already dead or long-lived, not the few hundred
messages in flight. The collector stays enabled: cyclic garbage is still
freed, within `GEN0_THRESHOLD` allocations. The one cost: an object frozen
at start that later becomes part of a cycle (an account worker a reload
removes) is not freed; that is bounded by what the start built, once.
Nothing durable here.
"""

from __future__ import annotations

import gc

#: Net container allocations between generation-0 passes (CPython's default: 700). Sized well
#: above what the sources hold in memory at once (16 queues x 200 messages x a few containers);
#: the garbage it lets wait is a few MB at most.
GEN0_THRESHOLD = 50_000


def apply() -> None:
    """Freeze what exists now and raise the generation-0 threshold (call once, after start-up)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
