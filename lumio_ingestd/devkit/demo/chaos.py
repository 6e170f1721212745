"""`--chaos`: the database goes away for a few seconds in the middle of the run, then comes back.

`Chaos.step(elapsed)` is called from the demo's main loop: at `start_at` it
stops the private PostgreSQL (a fast shutdown: sessions are cut, new
connections refused), `down_secs` later it starts it again on the same port.
Meanwhile the daemon parks events in Redis (the dead-letter depth rises),
keeps chat in the Redis buffers (then the chat dead-letter lists), and the
Jetstream source backs off; once the database is back the retry worker and
the drains replay all of it. `finish()` makes sure it is running again.
Nothing durable here.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from lumio_ingestd.devkit.servers import PostgresServer


class _State(enum.Enum):
    WAITING = "waiting"
    DOWN = "down"
    DONE = "done"


class Chaos:
    def __init__(self, pg: PostgresServer, notice: Callable[[str], None], *, start_at: float,
                 down_secs: float) -> None:
        self._pg = pg
        self._notice = notice
        self.start_at = start_at
        self.down_secs = down_secs
        self._state = _State.WAITING
        self._up_at = 0.0

    @property
    def down(self) -> bool:
        return self._state is _State.DOWN

    def step(self, elapsed: float) -> None:
        if self._state is _State.WAITING and elapsed >= self.start_at:
            self._pg.stop("fast")
            self._state = _State.DOWN
            self._up_at = elapsed + self.down_secs
            self._notice(f"chaos: PostgreSQL stopped for {self.down_secs:.0f}s; events now park in "
                         "Redis and chat waits in its buffers")
        elif self._state is _State.DOWN and elapsed >= self._up_at:
            self._restart()

    def finish(self) -> None:
        if self._state is _State.DOWN:
            self._restart()

    def _restart(self) -> None:
        self._pg.start()
        self._state = _State.DONE
        self._notice("chaos: PostgreSQL is back; the daemon replays what it parked")
