"""The demo from start to end: set up, run the daemon under traffic, drain, account, clean up.

1. A temporary directory under /tmp; private Redis and PostgreSQL in it; the
   migrations; the Twitch and Jetstream stand-ins; a real configuration file
   (see `stack`).
2. The real daemon as a child process (`daemon`), until both Twitch sources
   are subscribed and the Jetstream source is connected.
3. The traffic (`traffic`) and a live progress line (`progress`) fed by the
   observer (`observe`): rows, Redis depths, the daemon's metrics, alerts.
   With `--chaos` the database is stopped for a few seconds mid-run (`chaos`).
   With `--gap` the daemon is stopped (SIGTERM) for a few seconds mid-run and
   started again while the traffic goes on: tips, StreamElements activities
   and Twitch follows sent meanwhile are healed from the stand-ins' history,
   and the summary shows the gaps ledger.
4. At the end of `--duration`, or on Ctrl-C (SIGINT; also SIGTERM, SIGHUP):
   the traffic stops (the channels go offline); after a normal end the demo
   waits, bounded, until everything sent is stored; a Ctrl-C skips that wait.
   Then SIGTERM to the daemon and a wait for its drain (a further Ctrl-C
   sends a second SIGTERM, which cuts the daemon's drain short).
5. The summary (`summary`): a table for people, and the same as JSON in a file
   (`--json FILE`, or a new file under /tmp named on the last line; `--json -`
   prints it instead). Then everything started is stopped in reverse
   order and the directory removed (`--keep` keeps it).

Signals reach the main loop through `SignalQueue` (the handler only
enqueues). Exit codes: 0 when everything sent is accounted for, 69 when a
server binary is missing or a server cannot start, 70 when the daemon failed
or the summary found a problem. Nothing durable: the demo throws it all away.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from lumio_ingestd import exitcodes
from lumio_ingestd.devkit.demo import streamelements as se
from lumio_ingestd.devkit.demo.chaos import Chaos
from lumio_ingestd.devkit.demo.daemon import DaemonFailed, DaemonProcess
from lumio_ingestd.devkit.demo.observe import AlertListener, Observer, Snapshot
from lumio_ingestd.devkit.demo.progress import Console, status_line
from lumio_ingestd.devkit.demo.stack import Stack, start_stack
from lumio_ingestd.devkit.demo.summary import Summary, build, render
from lumio_ingestd.devkit.demo.traffic import Traffic
from lumio_ingestd.devkit.servers import DevServerError, cleanup_all, wait_until
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.runtime.signals import SignalQueue
from lumio_ingestd.sources.twitch.helix import SUBSCRIPTIONS
from lumio_ingestd.worker import Worker

log = logging.getLogger("lumio_ingestd.demo.run")

TICK_SECS = 0.5
READY_TIMEOUT_SECS = 30.0
SETTLE_TIMEOUT_SECS = 30.0
DAEMON_STOP_TIMEOUT_SECS = 30.0
CHAOS_DOWN_SECS = 5.0
CHAOS_AT_SECS_UNBOUNDED = 15.0  # when there is no --duration
GAP_SECS = 5.0
_STOP = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


@dataclass(frozen=True)
class Options:
    duration: float  # seconds of traffic; 0 = until Ctrl-C
    chaos: bool
    rate: float  # chat messages per second, both channels together
    keep: bool
    gap: bool = False
    json_path: str | None = None  # the machine-readable summary; None: a new file under /tmp, '-': stdout


def run(opts: Options, environ: Mapping[str, str], out: TextIO) -> int:
    console = Console(out, tty=out.isatty())
    signals = SignalQueue()
    signals.install(_STOP)
    root = Path(tempfile.mkdtemp(prefix="lumio-demo-", dir="/tmp"))
    os.chmod(root, 0o755)  # PostgreSQL runs as another user when we are root
    try:
        with ExitStack() as cleanup:
            cleanup.callback(_remove, root, opts.keep, console)  # runs last
            cleanup.callback(cleanup_all)
            return _run(opts, environ, console, signals, root, cleanup)
    except DevServerError as exc:
        console.end_status()
        console.print(f"lumio-ingestd demo: cannot start a server: {exc}")
        return exitcodes.UNAVAILABLE
    except DaemonFailed as exc:
        console.end_status()
        console.print(f"lumio-ingestd demo: {exc}")
        return exitcodes.SOFTWARE
    except Exception:
        # A bug here; what was started is stopped all the same (the ExitStack above).
        console.end_status()
        log.exception("lumio-ingestd demo failed")
        return exitcodes.SOFTWARE
    finally:
        signals.restore()


def _run(opts: Options, environ: Mapping[str, str], console: Console, signals: SignalQueue,
         root: Path, cleanup: ExitStack) -> int:
    metrics = Metrics()  # the demo's own threads count their errors here
    _intro(opts, console, root)
    stack = start_stack(root, cleanup, console.notice)
    daemon = DaemonProcess(stack.config_path, root / "daemon.log", environ)
    cleanup.callback(daemon.kill)  # only does anything when the normal stop did not happen
    daemon.start()
    http_port, metrics_port = daemon.wait_listening(READY_TIMEOUT_SECS)
    stack.kick.webhook_url = f"http://127.0.0.1:{http_port}/webhooks/kick"
    console.notice(f"the daemon runs as pid {daemon.pid} (http 127.0.0.1:{http_port}, metrics "
                   f"http://127.0.0.1:{metrics_port}/metrics); its log is {daemon.log_path}")
    if not wait_until(lambda: _sources_ready(stack) or not daemon.alive, READY_TIMEOUT_SECS, 0.1) \
            or not daemon.alive:
        raise DaemonFailed(f"the daemon's sources did not connect and subscribe within "
                           f"{READY_TIMEOUT_SECS:.0f}s; its log {daemon.log_path} ends with:\n"
                           f"{daemon.log_tail()}")
    console.notice("both Twitch sources are subscribed (11 EventSub types each); the Kick source is "
                   "subscribed (chatroom and channel); Jetstream is connected; both 7TV emote sets are "
                   "followed")

    listener = AlertListener(stack.redis.client(), metrics)
    listener.start()
    cleanup.callback(_stop_worker, listener)
    observer = Observer(stack.database_url, stack.redis.client(),
                        tuple(a.account_id for a in stack.accounts))
    observer.metrics_port = metrics_port
    cleanup.callback(observer.close)
    astro = stack.astro
    tips = (lambda rng: se.DemoTips(astro, [a.account_id for a in stack.accounts], rng)) \
        if astro is not None else None
    traffic = Traffic(stack.twitch, stack.jetstream, stack.accounts, opts.rate, metrics, console.notice,
                      tips=tips, seventv=stack.seventv, kick=stack.kick,
                      kick_channel=stack.kick_channel)
    chaos = None
    if opts.chaos:
        start_at = max(3.0, opts.duration * 0.3) if opts.duration else CHAOS_AT_SECS_UNBOUNDED
        chaos = Chaos(stack.pg, console.notice, start_at=start_at, down_secs=CHAOS_DOWN_SECS)
    gap_at: float | None = None
    if opts.gap:
        gap_at = max(3.0, opts.duration * 0.4) if opts.duration else CHAOS_AT_SECS_UNBOUNDED
    restarts: list[int] = []  # exit codes of the daemons stopped for the gap
    console.started = time.monotonic()
    traffic.start()
    cleanup.callback(_stop_worker, traffic)

    def snapshot(exact: bool = False, with_metrics: bool = True) -> Snapshot:
        return observer.sample(traffic.sent, listener.count, exact=exact, metrics=with_metrics)

    interrupted = False
    previous: Snapshot | None = None
    shown_viewers: int | None = None  # the stored minute of viewer statistics last announced
    while True:
        if _stop_requested(signals, TICK_SECS):
            interrupted = True
            console.notice("stopping (Ctrl-C)")
            break
        elapsed = console.elapsed()
        if opts.duration and elapsed >= opts.duration:
            break
        if chaos is not None:
            chaos.step(elapsed)
        if gap_at is not None and elapsed >= gap_at and not restarts:
            console.end_status()
            daemon, http_port, metrics_port = _gap(daemon, stack, traffic, observer, console, signals,
                                                   environ, root, cleanup, restarts)
        if not daemon.alive:
            raise DaemonFailed(f"the daemon exited on its own; its log {daemon.log_path} ends with:\n"
                               f"{daemon.log_tail()}")
        snap = snapshot()
        phase = "chaos: db stopped" if chaos is not None and chaos.down else "running"
        if snap.rows is not None and snap.rows.viewers not in (None, shown_viewers):
            shown_viewers = snap.rows.viewers
            console.notice(f"stream_stats: a minute of viewer statistics stored (the poller's "
                           f"samples): peak {shown_viewers:,} viewers across both channels")
        console.status(status_line(snap, previous, console.elapsed(), phase))
        previous = snap

    _stop_worker(traffic)  # the channels go offline in its final()
    if chaos is not None:
        chaos.finish()
    settled = False if interrupted else _settle(snapshot, console, signals)
    last = snapshot()  # the daemon's metrics as they are before the SIGTERM
    console.end_status()
    console.notice("sending SIGTERM to the daemon and waiting for its drain")
    code = daemon.stop(DAEMON_STOP_TIMEOUT_SECS, lambda secs: _stop_requested(signals, secs))
    drain = daemon.drain()
    final = snapshot(exact=True, with_metrics=False)
    _stop_worker(listener)
    summary = build(final, last, listener.by_type(), gaps=_ledger(stack.database_url), run={
        "duration_secs": round(console.elapsed(), 1), "chaos": opts.chaos, "rate": opts.rate,
        "gap": {"restarted": bool(restarts), "first_exit_code": restarts[0] if restarts else None,
                "away_secs": GAP_SECS} if opts.gap else None,
        "interrupted": interrupted, "settled": settled, "tmpdir": str(root),
        "daemon": {"pid": daemon.pid, "exit_code": code, "drain_complete": drain[0] if drain else None,
                   "drain_secs": drain[1] if drain else None},
        "ports": {"redis": stack.redis.port, "postgres": stack.pg.port, "twitch_ws": stack.twitch.ws_port,
                  "twitch_http": stack.twitch.http_port, "jetstream": stack.jetstream.port,
                  **({"astro": stack.astro.port} if stack.astro is not None else {}),
                  "kick_ws": stack.kick.ws_port, "kick_http": stack.kick.http_port,
                  "http": http_port, "metrics": metrics_port},
    })
    for line in render(summary):
        console.print(line)
    if opts.json_path == "-":
        console.print(summary.document())
    else:
        try:
            console.print(f"machine-readable summary: {_write_document(summary, opts.json_path)}")
        except OSError as exc:
            console.print(f"lumio-ingestd demo: cannot write the machine-readable summary: {exc}")
            return exitcodes.SOFTWARE
    first_ok = all(c == exitcodes.OK for c in restarts)
    return exitcodes.OK if summary.ok and code == exitcodes.OK and first_ok else exitcodes.SOFTWARE


def _gap(daemon: DaemonProcess, stack: Stack, traffic: Traffic, observer: Observer, console: Console,
         signals: SignalQueue, environ: Mapping[str, str], root: Path, cleanup: ExitStack,
         restarts: list[int]) -> tuple[DaemonProcess, int, int]:
    """Stop the daemon for GAP_SECS while the traffic goes on, then start a new one."""
    console.notice(f"--gap: stopping the daemon (SIGTERM) for {GAP_SECS:g}s; tips, follows and Bluesky "
                   "posts go on and are healed from the platforms' history when it is back")
    traffic.away.set()
    restarts.append(daemon.stop(DAEMON_STOP_TIMEOUT_SECS, lambda secs: _stop_requested(signals, secs)))
    _stop_requested(signals, GAP_SECS)
    again = DaemonProcess(stack.config_path, root / f"daemon-{len(restarts) + 1}.log", environ)
    cleanup.callback(again.kill)
    again.start()
    http_port, metrics_port = again.wait_listening(READY_TIMEOUT_SECS)
    stack.kick.webhook_url = f"http://127.0.0.1:{http_port}/webhooks/kick"
    observer.metrics_port = metrics_port
    if not wait_until(lambda: _sources_ready(stack) or not again.alive, READY_TIMEOUT_SECS, 0.1) \
            or not again.alive:
        raise DaemonFailed(f"the restarted daemon's sources did not subscribe within "
                           f"{READY_TIMEOUT_SECS:.0f}s; its log {again.log_path} ends with:\n"
                           f"{again.log_tail()}")
    traffic.away.clear()
    console.notice(f"--gap: the daemon is back as pid {again.pid} and subscribed; healing runs")
    return again, http_port, metrics_port


def _ledger(database_url: str) -> list[Mapping[str, object]]:
    """The gaps ledger as the summary shows it (empty when it cannot be read)."""
    import psycopg2  # the demo's own read of the database, like the observer's

    try:
        conn = psycopg2.connect(database_url, connect_timeout=5)
    except psycopg2.Error:
        return []
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT account_id, platform, source, status, "
                        "extract(epoch FROM ended_at - started_at)::float8, healed_rows "
                        "FROM source_gaps ORDER BY started_at, account_id, platform, source")
            return [{"account_id": int(a), "platform": str(p), "source": str(s), "status": str(st),
                     "seconds": round(float(secs), 3), "healed_rows": int(n)}
                    for a, p, s, st, secs, n in cur.fetchall()]
    except psycopg2.Error:
        return []
    finally:
        conn.close()


def _intro(opts: Options, console: Console, root: Path) -> None:
    until = f"for {opts.duration:g}s (Ctrl-C ends it sooner)" if opts.duration else "until you press Ctrl-C"
    console.print("lumio-ingestd demo: the whole pipeline on this machine, with nothing configured.")
    console.print(f"  working directory {root} ({'kept' if opts.keep else 'removed'} at the end)")
    console.print(f"  traffic {until}: about {opts.rate:g} chat messages/s across two Twitch channels "
                  "and a Kick channel (socket and webhooks), follows, subs, resubs, cheers, gifts, "
                  "channel points, a raid, a host, Bluesky posts, StreamElements tips, 7TV emote changes")
    if opts.chaos:
        console.print(f"  --chaos: PostgreSQL is stopped for {CHAOS_DOWN_SECS:g}s mid-run; watch events "
                      "park in Redis and replay when it is back")


def _sources_ready(stack: Stack) -> bool:
    for account in stack.accounts:
        session = stack.twitch.active_session("channel.chat.message", account.twitch_user_id)
        if session is None or len(session.subscriptions) < len(SUBSCRIPTIONS):
            return False
    if stack.astro is not None and not se.ready(stack.astro, [a.account_id for a in stack.accounts]):
        return False
    seventv = stack.seventv
    if seventv is not None and not all(
            seventv.subscribed("emote_set.update", a.emote_set_id) for a in stack.accounts if a.emote_set_id):
        return False  # subscribed = the set's baseline is stored: changes from now on are events
    k = stack.kick_channel
    if not stack.kick.subscribed(k.chat_channel) or not stack.kick.subscribed(k.event_channel):
        return False
    return len(stack.jetstream.connections) >= 1


def _settle(snapshot: Callable[[], Snapshot], console: Console, signals: SignalQueue) -> bool:
    """Wait (bounded) until every message and event sent is stored and nothing waits in Redis."""
    started = console.elapsed()
    previous: Snapshot | None = None
    while console.elapsed() - started < SETTLE_TIMEOUT_SECS:
        snap = snapshot()
        rows, depths, sent = snap.rows, snap.depths, snap.sent
        if (rows is not None and depths is not None and rows.chat >= sent.chat
                and rows.events >= sent.events and rows.bluesky >= sent.bluesky
                and depths.chat_waiting == 0 and depths.events_waiting == 0):
            console.status(status_line(snap, previous, console.elapsed(), "all stored"), force=True)
            return True
        console.status(status_line(snap, previous, console.elapsed(), "settling"))
        previous = snap
        if _stop_requested(signals, TICK_SECS):
            console.notice("not waiting for the rest (Ctrl-C); the daemon's drain keeps it in Redis")
            return False
    console.notice(f"gave up waiting after {SETTLE_TIMEOUT_SECS:.0f}s for everything to be stored")
    return False


def _stop_requested(signals: SignalQueue, timeout: float) -> bool:
    return any(s in _STOP for s in signals.wait(timeout))


def _stop_worker(worker: Worker) -> None:
    worker.request_stop()
    if not worker.join(10.0):
        log.error("%s did not stop within 10s", worker.name)


def _write_document(summary: Summary, path: str | None) -> Path:
    """The summary as JSON in `path`, or in a new file under /tmp (the run's directory is
    removed at the end, and the summary is what outlives it)."""
    if path is None:
        fd, name = tempfile.mkstemp(prefix="lumio-demo-summary-", suffix=".json", dir="/tmp")
        os.close(fd)
        path = name
    target = Path(path)
    target.write_text(summary.document() + "\n")
    return target


def _remove(root: Path, keep: bool, console: Console) -> None:
    if keep:
        console.print(f"stopped everything the demo started; kept {root} (configuration, daemon.log, data)")
        return
    shutil.rmtree(root, ignore_errors=True)
    console.print(f"stopped everything the demo started and removed {root}")
