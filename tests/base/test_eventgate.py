"""The event gate (lumio_ingestd/eventgate.py) with real threads.

Pins what the chat threads may rely on: `step_aside()` returns at once while
the gate is open; while it is held it waits, and returns as soon as the last
hold is released; it never waits longer than `max_hold_secs` after the gate
closed (a slow event path costs chat a bounded pause, never a stall), and
once that bound has passed it does not wait again for the same closing.
Holds count: nested holds, `release(n)`, `held()` on an exception, and
concurrent holders all end with the gate open and `holds == 0`.

No assert on speed: waits are on events and threads, with generous upper
bounds (a thread that should return does within 5 s); the only fixed
windows are the negative ones ("still waiting 0.3 s later").
"""

from __future__ import annotations

import threading
import time

import pytest

from lumio_ingestd.eventgate import EventGate

#: Longer than any test here runs: a step_aside that returns did not run into its bound.
FOREVER = 600.0
#: The generous upper bound for "returns promptly".
PROMPTLY = 5.0
#: The negative window: a waiter that should wait is still waiting this long after it started.
STILL_WAITING = 0.3


class Stepper:
    """One chat-like thread that calls `gate.step_aside()` once and says when it returned."""

    def __init__(self, gate: EventGate) -> None:
        self.gate = gate
        self.started = threading.Event()
        self.returned = threading.Event()
        #: `gate.holds` seen by the thread right after step_aside returned.
        self.holds_after = -1
        self.thread = threading.Thread(target=self._run, name="stepper", daemon=True)
        self.thread.start()
        assert self.started.wait(PROMPTLY)

    def _run(self) -> None:
        self.started.set()
        self.gate.step_aside()
        self.holds_after = self.gate.holds
        self.returned.set()

    def join(self) -> None:
        self.thread.join(PROMPTLY)
        assert not self.thread.is_alive()


def test_step_aside_returns_at_once_while_the_gate_is_open() -> None:
    gate = EventGate(max_hold_secs=FOREVER)
    assert gate.holds == 0
    stepper = Stepper(gate)
    assert stepper.returned.wait(PROMPTLY), "step_aside waited on an open gate"
    stepper.join()
    # Open again after a hold and its release: no leftover of the closing.
    with gate.held():
        assert gate.holds == 1
    assert gate.holds == 0
    again = Stepper(gate)
    assert again.returned.wait(PROMPTLY), "step_aside waited on a gate opened again"
    again.join()


def test_step_aside_waits_while_held_and_returns_when_released() -> None:
    gate = EventGate(max_hold_secs=FOREVER)
    gate.hold()
    stepper = Stepper(gate)
    assert not stepper.returned.wait(STILL_WAITING), "step_aside did not wait on a held gate"
    gate.release()
    # With a bound of 10 minutes only the release can have woken it.
    assert stepper.returned.wait(PROMPTLY), "step_aside did not return when the gate opened"
    stepper.join()
    assert stepper.holds_after == 0


def test_every_waiting_thread_returns_on_the_release() -> None:
    gate = EventGate(max_hold_secs=FOREVER)
    gate.hold()
    steppers = [Stepper(gate) for _ in range(8)]
    assert not any(s.returned.wait(STILL_WAITING / 8) for s in steppers)
    gate.release()
    for s in steppers:
        assert s.returned.wait(PROMPTLY)
        s.join()


def test_step_aside_waits_at_most_max_hold_after_the_gate_closed() -> None:
    gate = EventGate(max_hold_secs=0.05)
    gate.hold()
    try:
        stepper = Stepper(gate)
        # Never released: only the bound can end the wait.
        assert stepper.returned.wait(PROMPTLY), "step_aside stalled on a gate held past max_hold"
        stepper.join()
        assert stepper.holds_after == 1 and gate.holds == 1, "not the bound: the gate had opened"
    finally:
        gate.release()
    assert gate.holds == 0


def test_once_the_bound_passed_step_aside_does_not_wait_again() -> None:
    """The bound counts from when the gate closed, not from each call: a thread that steps
    aside over and over while one slow event holds the gate pays the bound once."""
    max_hold = 1.0
    gate = EventGate(max_hold_secs=max_hold)
    gate.hold()
    try:
        first = Stepper(gate)
        assert first.returned.wait(PROMPTLY)
        first.join()
        assert gate.holds == 1
        # Past the bound now (the first call waited it out). Many more calls, gate still
        # held: together far less than one more bound (each would cost a whole one if the
        # bound restarted at every call).
        started = time.monotonic()
        for _ in range(100):
            gate.step_aside()
            if time.monotonic() - started >= max_hold:
                break  # one more whole bound: it waited again (stop here, not after 100 of them)
        assert time.monotonic() - started < max_hold, "step_aside waited again for the same closing"
        assert gate.holds == 1
        # A nested hold while closed does not start a new bound either.
        gate.hold()
        started = time.monotonic()
        gate.step_aside()
        assert time.monotonic() - started < max_hold, "a nested hold restarted the bound"
        gate.release()
    finally:
        gate.release()
    assert gate.holds == 0


def test_a_new_closing_gets_a_new_bound() -> None:
    gate = EventGate(max_hold_secs=FOREVER)
    gate.hold()
    gate.release()
    # A later closing waits again (its bound counts from this hold, not the first one).
    gate.hold()
    stepper = Stepper(gate)
    assert not stepper.returned.wait(STILL_WAITING)
    gate.release()
    assert stepper.returned.wait(PROMPTLY)
    stepper.join()


def test_nested_holds_keep_the_gate_closed_until_the_last_release() -> None:
    gate = EventGate(max_hold_secs=FOREVER)
    gate.hold()
    gate.hold()
    assert gate.holds == 2
    stepper = Stepper(gate)
    gate.release()
    assert gate.holds == 1
    assert not stepper.returned.wait(STILL_WAITING), "one release of two opened the gate"
    gate.release()
    assert stepper.returned.wait(PROMPTLY)
    stepper.join()
    assert gate.holds == 0


def test_release_n_takes_n_holds_at_once() -> None:
    """What the alert thread does after a batch of n PUBLISHes."""
    gate = EventGate(max_hold_secs=FOREVER)
    for _ in range(5):
        gate.hold()
    stepper = Stepper(gate)
    gate.release(3)
    assert gate.holds == 2
    assert not stepper.returned.wait(STILL_WAITING), "release(3) of 5 holds opened the gate"
    gate.release(2)
    assert gate.holds == 0
    assert stepper.returned.wait(PROMPTLY)
    stepper.join()
    # release(0) (an empty batch: the publisher woken for nothing) changes nothing.
    gate.hold()
    gate.release(0)
    assert gate.holds == 1
    gate.release()
    assert gate.holds == 0


def test_held_releases_when_the_block_raises() -> None:
    gate = EventGate(max_hold_secs=FOREVER)
    with pytest.raises(RuntimeError), gate.held():
        assert gate.holds == 1
        raise RuntimeError("the event's path failed")
    assert gate.holds == 0
    stepper = Stepper(gate)
    assert stepper.returned.wait(PROMPTLY), "the gate stayed closed after a failed block"
    stepper.join()


def test_concurrent_holders_end_with_the_gate_open() -> None:
    """Sink threads hold and release while the alert thread releases batches and a chat
    thread steps aside: the count is kept under the gate's lock, so nothing is lost and
    the gate ends open. The bound is unlimited here, so a chat thread only ever gets
    past a closed gate by its opening: one left closed would leave it stuck."""
    gate = EventGate(max_hold_secs=FOREVER)
    rounds = 2000
    go = threading.Barrier(9, timeout=PROMPTLY)
    errors: list[BaseException] = []

    def holder() -> None:
        try:
            go.wait()
            for _ in range(rounds):
                with gate.held():
                    pass
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def batcher() -> None:
        # Two holds, then one release(2): the alert thread's way.
        try:
            go.wait()
            for _ in range(rounds):
                gate.hold()
                gate.hold()
                gate.release(2)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def chat() -> None:
        try:
            go.wait()
            for _ in range(rounds):
                gate.step_aside()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = ([threading.Thread(target=holder, daemon=True) for _ in range(6)]
               + [threading.Thread(target=batcher, daemon=True) for _ in range(2)]
               + [threading.Thread(target=chat, daemon=True)])
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not any(th.is_alive() for th in threads), "a thread is stuck on the gate"
    assert errors == []
    assert gate.holds == 0
    last = Stepper(gate)
    assert last.returned.wait(PROMPTLY), "the gate stayed closed after every hold was released"
    last.join()
