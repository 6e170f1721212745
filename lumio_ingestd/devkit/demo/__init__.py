"""`lumio-ingestd demo`: the whole pipeline on one machine, with nothing configured.

Private Redis and PostgreSQL servers in a temporary directory, the
migrations, stand-ins for Twitch and Bluesky Jetstream that speak the real
wire protocols, realistic traffic, the real daemon (`lumio-ingestd run`, a
child process) ingesting it, a live progress line, and on Ctrl-C (or after
`--duration`) the drain, a summary of what was stored, parked, quarantined
and lost, and the removal of everything it started. `run` has the steps.

The stand-ins need the `websockets` package, which only the `demo` (and
`test`) extra installs: without it `main` says how to get it and returns 69.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import TextIO

from lumio_ingestd import exitcodes

INSTALL_HINT = "pip install 'lumio-ingestd[demo]'"


def main(*, duration: float, chaos: bool, rate: float, keep: bool, environ: Mapping[str, str],
         out: TextIO | None = None, gap: bool = False, json_path: str | None = None) -> int:
    try:
        importlib.import_module("websockets")
    except ImportError:
        print("lumio-ingestd demo: the platform stand-ins need the `websockets` package, which is not "
              f"installed: {INSTALL_HINT} (or `make demo` in a source checkout)", file=sys.stderr)
        return exitcodes.UNAVAILABLE
    from lumio_ingestd.devkit.demo.run import Options, run  # imports the stand-ins, hence websockets
    from lumio_ingestd.logs import setup_logging

    setup_logging("warning", environ)  # the demo's own problems; the daemon logs to its file
    return run(Options(duration=duration, chaos=chaos, rate=rate, keep=keep, gap=gap, json_path=json_path),
               environ,
               out if out is not None else sys.stdout)
