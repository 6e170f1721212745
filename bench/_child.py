"""A bench script's helper process, driven with one JSON object per line.

The stand-ins and the replicas of the benchmarks run as child processes (a load
generator or a second replica in the measuring process would share its GIL).
`JsonLinesChild` starts a script with `sys.executable`, writes commands as
`{"cmd": ..., **args}` lines to its stdin and reads its answers as lines from its
stdout; `close()` asks it to quit, then kills it if it does not. Nothing durable.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


class JsonLinesChild:
    def __init__(self, script: Path, *args: str, what: str, quit_secs: float = 30.0) -> None:
        self._what = what
        self._quit_secs = quit_secs
        self._proc = subprocess.Popen([sys.executable, str(script), *args],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def read(self) -> dict[str, Any]:
        """The child's next answer; raises RuntimeError when it ended instead."""
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self._what} ended (exit {self._proc.poll()})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def send(self, cmd: str, **args: Any) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")
        self._proc.stdin.flush()

    def call(self, cmd: str, **args: Any) -> dict[str, Any]:
        self.send(cmd, **args)
        return self.read()

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self.send("quit")
                assert self._proc.stdin is not None
                self._proc.stdin.close()
                self._proc.wait(self._quit_secs)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
