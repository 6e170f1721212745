"""The command line: argv -> configuration -> the chosen command -> exit code.

This is the composition root's front door: it is the only place that reads
`os.environ` (and hands it to `config.load`), sets up logging, and maps
failures to the sysexits codes of INTERFACE.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

import psycopg2

from . import __version__, exitcodes
from .config import Config, ConfigError, load, redacted_lines, resolve_path
from .db.migrate import MigrationError, MigrationLockTimeout, migrate
from .logs import setup_logging

log = logging.getLogger("lumio_ingestd")


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
    return parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    args = _build_parser().parse_args(argv)
    command = args.command or "run"
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
        "run": _run,
    }
    try:
        return handlers[command](cfg)
    except Exception:
        log.exception("%s failed with an internal error", command)
        return exitcodes.SOFTWARE


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
    return exitcodes.OK


def _run(cfg: Config) -> int:
    log.error("run: the daemon runtime is not built yet in this version")
    return exitcodes.SOFTWARE
