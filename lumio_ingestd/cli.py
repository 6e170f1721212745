"""The command line: argv -> configuration -> the chosen command -> exit code.

This is the composition root's front door: it is the only place that reads
`os.environ` (and hands it to `config.load`), sets up logging, and maps
failures to the sysexits codes of docs/deployment.rst, "Exit codes".
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

import psycopg2

from lumio_ingestd import __version__, exitcodes
from lumio_ingestd.admin import commands as admin
from lumio_ingestd.config import Config, ConfigError, load, redacted_lines, resolve_path
from lumio_ingestd.db.compression import ensure_compression
from lumio_ingestd.db.errors import DatabaseUnavailable, classify
from lumio_ingestd.db.migrate import MigrationError, MigrationLockTimeout, migrate
from lumio_ingestd.logs import setup_logging
from lumio_ingestd.model import Kind
from lumio_ingestd.stores.redisclient import REDIS_ERRORS

log = logging.getLogger("lumio_ingestd")

# Failures that mean "a server we need is not there", not a bug: exit 69.
_UNAVAILABLE: tuple[type[Exception], ...] = (
    psycopg2.OperationalError, DatabaseUnavailable, *REDIS_ERRORS)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error exits 64 (EX_USAGE) instead of 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(exitcodes.USAGE, f"{self.prog}: error: {message}\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lumio-ingestd", description="Lumio's ingest daemon.")
    parser.add_argument("-c", "--config", metavar="PATH",
                        help="configuration file (default: $LUMIO_INGESTD_CONFIG, "
                             "then /etc/lumio/ingestd.ini)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.add_parser("run", help="run the daemon in the foreground (the default)")
    sub.add_parser("migrate", help="apply database migrations, then exit")
    sub.add_parser("check-config", help="validate the configuration without contacting any server")
    ret = sub.add_parser("retention", help="delete chat and events past their retention, once")
    ret.add_argument("--once", action="store_true", required=True,
                     help="run one retention pass now (the daemon runs it daily by itself)")
    ret.add_argument("--batch-size", type=_positive_int, default=10_000, help="rows per transaction")
    erase = sub.add_parser("gdpr-erase", help="erase every row and buffered entry of a platform user")
    erase.add_argument("--platform", required=True, choices=PLATFORMS)
    erase.add_argument("--user-id", required=True)
    exp = sub.add_parser("export", help="write an account's or a platform user's rows as JSON Lines")
    who = exp.add_mutually_exclusive_group(required=True)
    who.add_argument("--account", type=_positive_int, metavar="A")
    who.add_argument("--platform", choices=PLATFORMS)
    exp.add_argument("--user-id", help="with --platform")
    exp.add_argument("-o", "--output", metavar="FILE", help="write here instead of standard output")
    dis = sub.add_parser("dissolve-account", help="delete all rows and Redis keys of one account")
    dis.add_argument("account", type=_positive_int, metavar="A")
    dis.add_argument("--yes", action="store_true", help="confirm: this cannot be undone")
    st = sub.add_parser("status", help="instances, leases, list depths per account, spool, "
                                       "migrations, Jetstream lag and this machine's daemon")
    st.add_argument("--json", action="store_true", help="print the stable JSON document instead")
    qu = sub.add_parser("quarantine", help="list, show, requeue or drop quarantined chat and events")
    qu.add_argument("action", choices=("list", "show", "requeue", "drop"))
    qu.add_argument("--account", type=_positive_int, metavar="A", help="only this account")
    qu.add_argument("--kind", choices=("chat", "events"), help="only chat or only events")
    qu.add_argument("--id", dest="ids", action="append", default=[], metavar="ID",
                    help="an event id, a chat message id or a sha256:... digest (repeatable)")
    qu.add_argument("--all", dest="everything", action="store_true",
                    help="drop: every entry the filter matches (drop needs --id or --all)")
    sp = sub.add_parser("spool", help="the local spool: status, or replay it without the daemon")
    sp.add_argument("action", choices=("status", "replay"))
    sp.add_argument("--json", action="store_true", help="status: print JSON")
    demo = sub.add_parser("demo", help="run the whole pipeline against private servers and platform "
                                       "stand-ins, with live progress (takes no -c)")
    demo.add_argument("--duration", type=_seconds, default=0.0, metavar="N",
                      help="seconds of traffic, then drain, summary and cleanup (default 0: until Ctrl-C)")
    demo.add_argument("--chaos", action="store_true",
                      help="stop PostgreSQL for 5 s mid-run: events park in Redis and replay")
    demo.add_argument("--gap", action="store_true",
                      help="stop the daemon for 5 s mid-run and start it again: what happened "
                           "meanwhile is healed from the stand-ins' history; the summary shows the ledger")
    demo.add_argument("--rate", type=_positive_float, default=300.0, metavar="R",
                      help="chat messages per second across both channels (default 300)")
    demo.add_argument("--keep", action="store_true",
                      help="keep the temporary directory (configuration, daemon log, data) at the end")
    demo.add_argument("--json", metavar="FILE", dest="json_path",
                      help="write the machine-readable summary (JSON) here, '-' for standard output "
                           "(default: a new file under /tmp, named on the summary's last line)")
    return parser


PLATFORMS = ("twitch", "kick", "streamelements", "seventv", "bluesky")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (0 or more), got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds (0 or more), got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    parser = _build_parser()
    args = parser.parse_args(argv)
    command = args.command or "run"
    if command == "demo":
        if args.config is not None:
            parser.error("demo takes no -c/--config: it writes a configuration of its own")
        from lumio_ingestd.devkit.demo import main as demo  # the demo's dependencies only when it runs

        return demo(duration=args.duration, chaos=args.chaos, rate=args.rate, keep=args.keep,
                    environ=env, gap=args.gap, json_path=args.json_path)
    if command == "export" and (args.platform is None) != (args.user_id is None):
        parser.error("export: --platform and --user-id go together (or use --account)")
    if command == "dissolve-account" and not args.yes:
        parser.error(f"dissolve-account deletes every row and Redis key of account {args.account} "
                     "and cannot be undone: add --yes to confirm")
    path = resolve_path(args.config, env)
    try:
        cfg = load(path, env)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"lumio-ingestd: configuration error: {problem}", file=sys.stderr)
        return exitcodes.CONFIG
    if command == "check-config":
        return _check_config(cfg)
    setup_logging(cfg.daemon.log_level, env)
    handlers: dict[str, Callable[[Config], int]] = {
        "migrate": _migrate,
        "run": lambda c: _run(c, env),
        "retention": lambda c: admin.retention_once(c, args.batch_size),
        "gdpr-erase": lambda c: admin.gdpr_erase(c, args.platform, args.user_id),
        "export": lambda c: admin.export(c, args.output, args.account, args.platform, args.user_id),
        "dissolve-account": lambda c: admin.dissolve(c, args.account),
        "status": lambda c: admin.status(c, args.json),
        "quarantine": lambda c: admin.quarantine(c, args.action, args.account, args.kind, args.ids,
                                                 args.everything),
        "spool": lambda c: (admin.spool_status(c, args.json) if args.action == "status"
                            else admin.spool_replay(c)),
    }
    try:
        return handlers[command](cfg)
    except _UNAVAILABLE as exc:
        if _refused_by_database(exc):
            log.error("%s: the database refused it: %s", command, str(exc).strip())
            return exitcodes.SOFTWARE
        log.error("%s: a required service is unavailable: %s", command, str(exc).strip())
        return exitcodes.UNAVAILABLE
    except Exception:
        log.exception("%s failed with an internal error", command)
        return exitcodes.SOFTWARE


def _refused_by_database(exc: Exception) -> bool:
    """An error psycopg2 raises as OperationalError that is no outage: the server
    refused the work itself (TimescaleDB's decompression limit, SQLSTATE 53400),
    and would refuse it again."""
    return bool(getattr(exc, "pgcode", None)) and classify(exc).kind is Kind.PERMANENT


def _check_config(cfg: Config) -> int:
    print(f"{cfg.path}: configuration OK")
    for line in redacted_lines(cfg):
        print(f"  {line}")
    return exitcodes.OK


def _migrate(cfg: Config) -> int:
    try:
        applied = migrate(cfg.timescale)
    except MigrationLockTimeout as exc:
        log.error("migrate: %s", exc)
        return exitcodes.UNAVAILABLE
    except MigrationError as exc:
        log.error("migrate: %s", exc)
        return exitcodes.SOFTWARE
    except psycopg2.OperationalError as exc:
        log.error("migrate: cannot reach the database: %s", str(exc).strip())
        return exitcodes.UNAVAILABLE
    if applied:
        log.info("migrate: applied %s", ", ".join(f"{m.version:04d}_{m.name}" for m in applied))
    else:
        log.info("migrate: schema is up to date")
    try:
        # Not a migration: the policies follow a configuration key, not the schema.
        state = ensure_compression(cfg.timescale)
    except psycopg2.OperationalError as exc:
        log.error("migrate: cannot reach the database: %s", str(exc).strip())
        return exitcodes.UNAVAILABLE
    except psycopg2.Error as exc:
        log.error("migrate: setting up compression failed: %s", str(exc).strip())
        return exitcodes.SOFTWARE
    if state.policies:
        log.info("migrate: compression policies (chunks older than %g h): %s",
                 state.hours, ", ".join(sorted(state.policies)))
    return exitcodes.OK


def _run(cfg: Config, env: Mapping[str, str]) -> int:
    """The daemon: App.run() until a stop signal; SIGHUP reloads `cfg.path` with the same `env`."""
    from lumio_ingestd.runtime import gcpolicy
    from lumio_ingestd.runtime.app import (  # the runtime is only imported by the command that needs it
        App,
        stragglers,
    )

    # `systemctl kill -s SIGUSR1 --kill-whom=main` prints every thread's stack without stopping us.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    result = App(cfg, env, reload=lambda: load(cfg.path, env), gc_policy=gcpolicy.apply).run()
    left = stragglers()
    if left:
        # The interpreter would wait for these forever at exit; what they hold
        # in memory is already counted in the shutdown report.
        log.error("run: exiting without waiting for threads still running: %s", ", ".join(left))
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(result.code)
    return result.code
