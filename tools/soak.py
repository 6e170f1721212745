"""`make soak DURATION=600`: the demo's stack under steady load while faults run at random.

The demo's private Redis (AOF on) and PostgreSQL, its Twitch and Jetstream
stand-ins and the real daemon as a child process (lumio_ingestd.devkit.demo), with
the demo's traffic on two Twitch channels and Bluesky. Every few seconds a
fault from docs/development.rst, "The chaos soak", is picked at random (seeded: the seed is
printed first, `--seed N` replays the same schedule):

- `pg-fast` / `pg-immediate`: PostgreSQL stopped (fast or immediate
  shutdown) for a few seconds, then started on the same port;
- `redis-stop`: Redis stopped (SHUTDOWN with its AOF) and started again;
- `redis-oom`: Redis `maxmemory` set just under what it uses (noeviction:
  every write answers OOM) for a few seconds;
- `kill`: the traffic pauses, the daemon is SIGKILLed once it has read what
  was sent, and started again with the same configuration (and instance id);
- `socket-drop`: the stand-in closes an account's EventSub socket (4000), or
  cuts its TCP connection without a close frame.

Not here (yet): a black-holed or slow database (needs the fault proxy of the
tests), a full disk under the spool. The demo's PostgreSQL runs without fsync
and with synchronous_commit off (it is thrown away); the soak starts it with
fsync, synchronous_commit and full_page_writes on (`-c` on the command line:
ALTER SYSTEM cannot override the demo's own `-c ...=off`) and refuses to run
unless the server reports them on, or an immediate shutdown would lose
commits the daemon was told were durable (with synchronous_commit off a
commit is acknowledged before its WAL is written, and SIGQUIT drops it).

At the end the traffic stops, every fault is undone, the run waits (bounded)
until everything sent is stored, the daemon gets SIGTERM, and the demo's
summary is printed: every chat message, event and Bluesky record sent must
be stored exactly once, nothing counted lost by any of the daemon's lives.
Why the kill pauses the traffic first: a SIGKILL loses what is in the
daemon's memory (the 0.1 s chat queue, frames not read yet), which EventSub
never redelivers; that window is the design's, and the soak checks
everything else. Exit 0 when the account is clean, 70 otherwise, 69 when a
server cannot start.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import psycopg2

from lumio_ingestd import exitcodes
from lumio_ingestd.devkit.demo.daemon import DaemonFailed, DaemonProcess
from lumio_ingestd.devkit.demo.observe import AlertListener, Observer, Snapshot
from lumio_ingestd.devkit.demo.run import _sources_ready
from lumio_ingestd.devkit.demo.stack import Stack, start_stack
from lumio_ingestd.devkit.demo.summary import build, render
from lumio_ingestd.devkit.demo.traffic import TICK_SECS, Traffic
from lumio_ingestd.devkit.servers import DevServerError, cleanup_all, wait_until
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.worker import Worker

FAULTS = ("pg-fast", "pg-immediate", "redis-stop", "redis-oom", "kill", "socket-drop")
_LISTENING = re.compile(r"listening on http=\S+:\d+ metrics=\S+:(\d+)")
READY_SECS = 60.0
#: PostgreSQL as durable as a real one (the demo's runs without fsync).
DURABLE_PG = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
SETTLE_SECS = 120.0


class PausableTraffic(Traffic):
    """The demo's traffic, with a pause (the clock of the chat rate does not run while paused)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.paused = False

    def run_once(self) -> float:
        if self.paused:
            self._last = time.monotonic()  # no burst of "due" chat after the pause
            return TICK_SECS
        return super().run_once()


class Soak:
    def __init__(self, stack: Stack, daemon: DaemonProcess, traffic: PausableTraffic,
                 observer: Observer, listener: AlertListener, rng: random.Random,
                 say: Callable[[str], None]) -> None:
        self.stack = stack
        self.daemon = daemon
        self.traffic = traffic
        self.observer = observer
        self.listener = listener
        self.rng = rng
        self.say = say
        self.lost_in_earlier_lives = 0
        self.counts: dict[str, int] = dict.fromkeys(FAULTS, 0)

    def snapshot(self, exact: bool = False, with_metrics: bool = True) -> Snapshot:
        return self.observer.sample(self.traffic.sent, self.listener.count, exact=exact,
                                    metrics=with_metrics)

    def fault(self, name: str) -> None:
        self.counts[name] += 1
        hold = self.rng.uniform(2.0, 8.0)
        pg, redis_server = self.stack.pg, self.stack.redis
        if name in ("pg-fast", "pg-immediate"):
            pg.stop("fast" if name == "pg-fast" else "immediate")
            self.say(f"{name}: PostgreSQL down for {hold:.1f}s")
            self._hold(hold)
            pg.start()
        elif name == "redis-stop":
            redis_server.stop()
            self.say(f"redis-stop: Redis down for {hold:.1f}s")
            self._hold(hold)
            redis_server.start()
        elif name == "redis-oom":
            client = redis_server.client()
            try:
                used = int(client.info("memory")["used_memory"])
                client.config_set("maxmemory", str(max(1, used - 1024 * 1024)))
                self.say(f"redis-oom: Redis refuses writes (OOM) for {hold:.1f}s")
                self._hold(hold)
            finally:
                client.config_set("maxmemory", "0")
                client.close()
        elif name == "kill":
            self._kill_and_restart()
        elif name == "socket-drop":
            account = self.rng.choice(self.stack.accounts)
            session = self.stack.twitch.active_session("channel.chat.message", account.twitch_user_id)
            if session is None:
                return
            if self.rng.random() < 0.5:
                self.stack.twitch.close_session(session, 4000, "soak")
                self.say(f"socket-drop: account {account.account_id}'s EventSub socket closed (4000)")
            else:
                try:
                    session.conn.socket.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                self.say(f"socket-drop: account {account.account_id}'s EventSub TCP connection cut")

    def _hold(self, secs: float) -> None:
        end = time.monotonic() + secs
        while time.monotonic() < end:
            self._check_alive()
            time.sleep(min(0.5, max(0.0, end - time.monotonic())))

    def _check_alive(self) -> None:
        if not self.daemon.alive:
            raise DaemonFailed(f"the daemon exited on its own; its log {self.daemon.log_path} ends "
                               f"with:\n{self.daemon.log_tail()}")

    def _kill_and_restart(self) -> None:
        self.traffic.paused = True
        time.sleep(1.5)  # what was sent is read and handed over (chat queue: 0.1 s)
        snap = self.snapshot()
        self.lost_in_earlier_lives += int(snap.metric("chat_messages_total", path="lost")
                                          + snap.metric("events_persist_failures_total", outcome="lost"))
        runs = len(_LISTENING.findall(self.daemon.log_text()))
        self.daemon.kill()
        self.say("kill: daemon SIGKILLed (traffic paused); starting it again")
        self.daemon.start()
        if not wait_until(lambda: len(_LISTENING.findall(self.daemon.log_text())) > runs
                          or not self.daemon.alive, READY_SECS, 0.1) or not self.daemon.alive:
            raise DaemonFailed(f"the restarted daemon did not come up; its log ends with:\n"
                               f"{self.daemon.log_tail()}")
        self.observer.metrics_port = int(_LISTENING.findall(self.daemon.log_text())[-1])
        if not wait_until(lambda: _sources_ready(self.stack), READY_SECS, 0.1):
            raise DaemonFailed("the restarted daemon's sources did not subscribe again")
        self.traffic.paused = False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load and faults")
    parser.add_argument("--seed", type=int, default=None, help="replay a run's fault schedule")
    parser.add_argument("--rate", type=float, default=50.0, help="chat messages per second")
    parser.add_argument("--every", type=float, default=12.0, help="mean seconds between faults")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"comma-separated subset of {','.join(FAULTS)}")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)

    def say(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    # The soak's own observers (alert listener) fail their turns while Redis is
    # down by design: one line each, not a traceback.
    logging.basicConfig(level=logging.WARNING, format="[%(asctime)s] %(message)s",
                        datefmt="%H:%M:%S")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_no_traceback)

    faults = [f for f in args.faults.split(",") if f in FAULTS] or list(FAULTS)
    say(f"soak: seed {seed} (replay with --seed {seed}), {args.duration:g}s, {args.rate:g} chat/s, "
        f"a fault every ~{args.every:g}s from {', '.join(faults)}")
    root = Path(tempfile.mkdtemp(prefix="lumio-soak-", dir="/tmp"))
    os.chmod(root, 0o755)  # PostgreSQL runs as another user when we are root
    try:
        with ExitStack() as cleanup:
            cleanup.callback(cleanup_all)
            return _run(args, faults, rng, seed, root, cleanup, say)
    except DevServerError as exc:
        say(f"soak: cannot start a server: {exc}")
        return exitcodes.UNAVAILABLE
    except DaemonFailed as exc:
        say(f"soak FAILED (seed {seed}): {exc}")
        return exitcodes.SOFTWARE
    finally:
        if args.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def _run(args: argparse.Namespace, faults: list[str], rng: random.Random, seed: int, root: Path,
         cleanup: ExitStack, say: Callable[[str], None]) -> int:
    metrics = Metrics()
    stack = start_stack(root, cleanup, say, pg_settings=DURABLE_PG)
    require_durable(stack.pg.url("postgres"))
    daemon = DaemonProcess(stack.config_path, root / "daemon.log", os.environ)
    cleanup.callback(daemon.kill)
    daemon.start()
    _, metrics_port = daemon.wait_listening(READY_SECS)
    if not wait_until(lambda: _sources_ready(stack), READY_SECS, 0.1):
        raise DaemonFailed("the daemon's sources did not subscribe")
    listener = AlertListener(stack.redis.client(), metrics)
    listener.start()
    cleanup.callback(_stop_worker, listener)
    observer = Observer(stack.database_url, stack.redis.client(),
                        tuple(a.account_id for a in stack.accounts))
    observer.metrics_port = metrics_port
    cleanup.callback(observer.close)
    traffic = PausableTraffic(stack.twitch, stack.jetstream, stack.accounts, args.rate, metrics, say,
                              seed=seed)
    traffic.start()
    cleanup.callback(_stop_worker, traffic)
    soak = Soak(stack, daemon, traffic, observer, listener, rng, say)
    started = time.monotonic()
    next_fault = started + rng.expovariate(1.0 / args.every)
    while time.monotonic() - started < args.duration:
        soak._check_alive()
        if time.monotonic() >= next_fault:
            soak.fault(rng.choice(faults))
            next_fault = time.monotonic() + rng.expovariate(1.0 / args.every)
        time.sleep(0.25)
    traffic.request_stop()
    traffic.join(10)
    say("load and faults over; waiting for everything sent to be stored")
    settled = wait_until(lambda: _settled(soak.snapshot()), SETTLE_SECS, 0.5)
    last = soak.snapshot()
    code = daemon.stop(30.0, _never_interrupted)
    final = soak.snapshot(exact=True, with_metrics=False)
    listener.request_stop()
    listener.join(10)
    summary = build(final, last, listener.by_type(), run={
        "seed": seed, "duration_secs": round(time.monotonic() - started, 1), "faults": soak.counts,
        "settled": settled, "daemon_exit_code": code, "lost_in_earlier_lives": soak.lost_in_earlier_lives,
    })
    for line in render(summary):
        print(line)
    print(summary.machine_line())
    bluesky_ok = final.rows is not None and final.rows.bluesky >= final.sent.bluesky
    ok = summary.ok and soak.lost_in_earlier_lives == 0 and code == exitcodes.OK and bluesky_ok
    say(f"soak {'passed' if ok else 'FAILED'} (seed {seed}); faults: "
        + ", ".join(f"{k} {v}" for k, v in soak.counts.items()))
    return exitcodes.OK if ok else exitcodes.SOFTWARE


def _no_traceback(record: logging.LogRecord) -> bool:
    if record.exc_info and record.exc_info[1] is not None:
        record.msg = f"{record.getMessage()} ({type(record.exc_info[1]).__name__})"
        record.args = ()
        record.exc_info = None
        record.exc_text = None
    return True


def require_durable(url: str) -> None:
    """Raise DevServerError unless the server at `url` reports every `DURABLE_PG` setting on.

    An immediate shutdown is a crash: with synchronous_commit off it drops the
    commits of the last few hundred milliseconds after acknowledging them, and
    the soak would count the daemon's correct work as missing. (An earlier
    version set these with ALTER SYSTEM, which the demo server's `-c ...=off`
    on its command line silently overrode.)
    """
    conn = psycopg2.connect(url, connect_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT name, setting, source FROM pg_settings WHERE name = ANY(%s)",
                        (list(DURABLE_PG),))
            found = {name: (setting, source) for name, setting, source in cur.fetchall()}
    finally:
        conn.close()
    wrong = [f"{name}={setting} (from {source})"
             for name, value in DURABLE_PG.items()
             for setting, source in [found.get(name, ("missing", "nowhere"))] if setting != value]
    if wrong:
        raise DevServerError(f"PostgreSQL is not durable: {', '.join(wrong)}")


def _stop_worker(worker: Worker) -> None:
    worker.request_stop()
    worker.join(10)


def _never_interrupted(secs: float) -> bool:
    time.sleep(secs)
    return False


def _settled(snap: Snapshot) -> bool:
    rows, depths, sent = snap.rows, snap.depths, snap.sent
    return (rows is not None and depths is not None and rows.chat >= sent.chat
            and rows.events >= sent.events and rows.bluesky >= sent.bluesky
            and depths.chat_waiting == 0 and depths.events_waiting == 0)


if __name__ == "__main__":
    sys.exit(main())
