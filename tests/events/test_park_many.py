"""`DeadLetters.park_many` sends one MULTI per account (each MULTI touches one
Redis Cluster slot), observed on a real Redis with MONITOR.
"""

from __future__ import annotations

import re
import threading

import redis

from lumio_ingestd.events.deadletter import DeadLetters
from support.harness.servers import wait_until


def test_park_many_sends_one_multi_per_account(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    lines: list[str] = []
    ready = threading.Event()
    done = threading.Event()

    def watch() -> None:
        with client.monitor() as monitor:  # type: ignore[no-untyped-call]
            ready.set()
            for item in monitor.listen():
                command = str(item["command"])
                lines.append(command)
                if "lumio:test:park-done" in command:
                    done.set()
                    return

    watcher = threading.Thread(target=watch, name="test-monitor")
    watcher.start()
    assert ready.wait(5)
    DeadLetters(client).park_many({7: [b"a", b"b"], 8: [b"c"], 9: [b"d"]})
    client.get("lumio:test:park-done")
    assert done.wait(5) or wait_until(done.is_set, 5)
    watcher.join(5)
    blocks: list[set[str]] = []
    current: set[str] | None = None
    for line in lines:
        word = line.split(" ", 1)[0].upper()
        if word == "MULTI":
            current = set()
        elif word == "EXEC":
            assert current is not None
            blocks.append(current)
            current = None
        elif current is not None:
            current.update(re.findall(r"\{(\d+)\}", line))
    assert sorted(tuple(sorted(b)) for b in blocks) == [("7",), ("8",), ("9",)]
    for account, n in ((7, 2), (8, 1), (9, 1)):
        assert client.llen(f"lumio:events:deadletter:{{{account}}}") == n
    client.close()
