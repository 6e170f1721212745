"""Two flushers on the same accounts while chat keeps arriving: nothing lost, nothing doubled."""

from __future__ import annotations

import threading
from pathlib import Path

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import ChatMessage
from support import dbname_of
from support.chat import assert_exactly_once, counter_value, make_messages, make_rig
from support.harness.servers import PostgresServer, wait_until


def test_two_flushers_on_one_account(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str,
                                     redis_url: str) -> None:
    rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url,
                   chat={"flush_interval_secs": 0.02, "flush_batch_size": 25})
    try:
        ingest = rig.ingest()
        sent: list[ChatMessage] = make_messages(2400, account=7) + make_messages(600, account=8)
        own = [Metrics(), Metrics()]
        flushers = [rig.flusher(instance=name, metrics=m) for name, m in zip(("a", "b"), own, strict=True)]
        producing = threading.Event()

        def produce() -> None:
            for i in range(0, len(sent), 40):
                assert sum(ingest.persist_batch(sent[i:i + 40]).values()) == 40
                producing.wait(0.002)  # chat arrives over time, not in one lump

        producer = threading.Thread(target=produce, name="producer")
        for f in flushers:
            f.start()
        producer.start()
        producer.join(60)
        assert not producer.is_alive()
        assert wait_until(lambda: len(rig.stored()) == len(sent), timeout=30)
        for f in flushers:
            f.request_stop()
        assert all(f.join(10) for f in flushers)

        assert_exactly_once(rig.stored(), [m.message_id for m in sent])
        assert rig.chat_keys() == []
        flushed = [counter_value(m, "chat_messages_flushed_total") for m in own]
        # Each message went through exactly one flusher: claims never overlap.
        assert sum(flushed) == len(sent)
        assert all(n > 0 for n in flushed), flushed
        assert counter_value(rig.metrics, "chat_messages_total", {"path": "buffered"}) == len(sent)
    finally:
        rig.close()
