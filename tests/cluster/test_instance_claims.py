"""Chat in-flight claims carry a claim token: two processes with one instance
id never delete each other's claim, and the second is refused at start.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from lumio_ingestd.chat.lists import ChatLists, ClaimLost
from lumio_ingestd.cluster.instances import PROCESS_TOKEN, InstanceClaim
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.runtime.build import StartupError, _claim_instance, build
from lumio_ingestd.stores import rediskeys
from support import dbname_of, make_config
from support.chat import assert_exactly_once, counter_value, make_messages
from support.chat import make_rig as make_chat_rig
from support.harness.servers import PostgresServer


def test_two_processes_with_one_instance_id_never_delete_each_others_claim(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    rig = make_chat_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url)
    try:
        client = rig.oracle_redis()
        sent = make_messages(250, account=7)
        rig.ingest().persist_batch(sent)
        inflight = rediskeys.chat_inflight(7, "twin")
        # Tokens of processes on other hosts: neither can be proven dead.
        second = rig.flusher(instance="twin", claim_token="host-b|2|bbbb")
        seen: list[int] = []

        def meanwhile(step: str) -> None:
            if step == "chat.flush.claimed" and not seen:
                second.tick()  # the second process runs in the middle of the first's batch
                seen.append(client.llen(inflight))

        first = rig.flusher(instance="twin", claim_token="host-a|1|aaaa", failpoint=meanwhile)
        first.tick()
        assert seen == [100]  # the second left the first's batch alone
        assert client.get(rediskeys.instance_claim("twin")) == b"host-a|1|aaaa"
        second.tick()
        assert_exactly_once(rig.stored(), [m.message_id for m in sent])
        assert client.llen(inflight) == 0
        assert counter_value(rig.metrics, "chat_flush_batches_total", {"result": "ok"}) == 3
    finally:
        rig.close()



def test_a_list_under_another_token_is_never_finished_by_the_old_holder(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    inflight = rediskeys.chat_inflight(7, "twin")
    old = ChatLists(client, "host-a|1|aaaa")
    new = ChatLists(client, "host-b|2|bbbb", InstanceClaim(client, "twin", 10, "host-b|2|bbbb"))
    client.rpush(rediskeys.chat_buffer(7), b"e1", b"e2")
    assert old.claim(rediskeys.chat_buffer(7), inflight, 10) == ([b"e1", b"e2"], False)
    assert new.instance_claim is not None and new.instance_claim.take() is None
    assert new.claim(rediskeys.chat_buffer(7), inflight, 10) == ([b"e1", b"e2"], True)  # adopted
    with pytest.raises(ClaimLost):
        old.finish(inflight, rediskeys.chat_quarantine(7), [b"q"])
    assert old.move_all(inflight, rediskeys.chat_deadletter(7)) == 0
    assert client.llen(inflight) == 2 and client.llen(rediskeys.chat_quarantine(7)) == 0
    new.finish(inflight, rediskeys.chat_quarantine(7), [])
    assert client.llen(inflight) == 0 and not client.hlen(rediskeys.chat_claims(7))
    client.close()



def test_a_second_process_with_the_same_instance_id_is_refused_at_start(
        tmp_path: Path, redis_url: str) -> None:
    cfg = make_config(tmp_path, redis_url=redis_url,
                      sections={"daemon": {"instance_id": "twin", "state_dir": tmp_path / "state"}})
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    client.set(rediskeys.instance_claim("twin"), b"other-host|4242|cccc", px=15_000)
    with pytest.raises(StartupError, match="in use by another running process"):
        build(cfg, Metrics())
    assert not (tmp_path / "state" / "spool").exists()  # refused before anything was opened
    # A holder on this host whose pid is gone is a crashed process: taken over at once.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    client.set(rediskeys.instance_claim("twin"), f"{socket.gethostname()}|{dead}|dddd", px=15_000)
    _claim_instance(cfg, client)
    assert client.get(rediskeys.instance_claim("twin")) == PROCESS_TOKEN.encode()
    client.close()
