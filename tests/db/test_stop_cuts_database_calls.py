"""A stop request cuts a worker's database call that hangs on a dead server,
so the shutdown budget goes to the final flush, not to a black-holed insert."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from lumio_ingestd.chat.flusher import ChatFlusher
from lumio_ingestd.chat.ingest import ChatIngest
from lumio_ingestd.db.errors import DeadlineExceeded
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.stores.redisclient import connect
from support import dbname_of
from support.chat import chat_config, make_messages
from support.harness.proxy import FaultProxyFactory
from support.harness.servers import PostgresServer, wait_until


def test_expire_calls_of_cuts_only_that_threads_call(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, fault_proxy: FaultProxyFactory) -> None:
    proxy = fault_proxy("127.0.0.1", pg_server.port)
    cfg = chat_config(tmp_path, f"postgresql://postgres@127.0.0.1:{proxy.port}/{dbname_of(pg_dsn)}",
                      "redis://127.0.0.1:1/0", timescale={"statement_timeout_secs": 30})
    pool = Pool(cfg.timescale)
    try:
        with pool.transaction() as cur:  # warm connections while the path is healthy
            cur.execute("SELECT 1")
        proxy.blackhole()
        outcome: list[BaseException] = []
        started = threading.Event()

        def stuck() -> None:
            started.set()
            try:
                with pool.transaction(deadline=time.monotonic() + 60) as cur:
                    cur.execute("SELECT 1")
            except Exception as exc:  # noqa: BLE001 - the test inspects it
                outcome.append(exc)

        th = threading.Thread(target=stuck)
        th.start()
        assert started.wait(5)
        assert pool.expire_calls_of(threading.get_ident(), 0.1) == 0  # not this thread's
        assert wait_until(lambda: pool.expire_calls_of(th.ident, 0.2) == 1, timeout=5)
        cut_at = time.monotonic()
        th.join(5)
        assert not th.is_alive() and time.monotonic() - cut_at < 1.5
        assert isinstance(outcome[0], DeadlineExceeded)
    finally:
        pool.close()


def test_stopping_flusher_does_not_wait_for_a_black_holed_batch(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
        fault_proxy: FaultProxyFactory) -> None:
    proxy = fault_proxy("127.0.0.1", pg_server.port)
    direct = chat_config(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url)
    migrate(direct.timescale)
    cfg = chat_config(tmp_path, f"postgresql://postgres@127.0.0.1:{proxy.port}/{dbname_of(pg_dsn)}",
                      redis_url, chat={"flush_interval_secs": 0.05})
    metrics = Metrics()
    pool, client = Pool(cfg.timescale), connect(cfg.redis)
    ingest = ChatIngest(client, pool, None, metrics, cfg)
    flusher = ChatFlusher(client, pool, metrics, cfg, instance="stopper", heartbeat_ttl_secs=15,
                          batch_timeout_secs=30, final_budget_secs=1.0)
    try:
        with pool.transaction() as cur:
            cur.execute("SELECT 1")
        proxy.blackhole()
        ingest.persist_batch(make_messages(50, account=3))  # Redis takes them
        flusher.start()
        # Wait until the flusher's batch is stuck on the dead server.
        assert wait_until(lambda: pool.expire_calls_of(flusher.ident, 5) == 1, timeout=5)
        started = time.monotonic()
        flusher.request_stop()
        assert flusher.join(10)
        elapsed = time.monotonic() - started
        # 0.5 s grace for the stuck call, then the final pass's own 1 s budget.
        assert elapsed < 2.5, elapsed
        # Nothing lost: the batch waits in this instance's in-flight list.
        assert client.llen("lumio:chat:inflight:{3}:stopper") + client.llen("lumio:chat:buffer:{3}") == 50
    finally:
        proxy.pass_through()
        pool.close()
        client.close()


def test_an_unbounded_transaction_can_still_be_cut_by_a_stop(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str) -> None:
    cfg = chat_config(tmp_path, pg_server.url(dbname_of(pg_dsn)), "redis://127.0.0.1:1/0")
    pool = Pool(cfg.timescale)
    outcome: list[BaseException] = []
    try:
        def long_work() -> None:
            try:
                with pool.begin_unbounded() as cur:  # no deadline, no statement timeout
                    cur.execute("SELECT pg_sleep(30)")
            except Exception as exc:  # noqa: BLE001 - the test inspects it
                outcome.append(exc)

        th = threading.Thread(target=long_work)
        th.start()
        assert wait_until(lambda: pool.expire_calls_of(th.ident, 0.1) == 1, timeout=5)
        th.join(5)
        assert not th.is_alive()
        assert isinstance(outcome[0], DeadlineExceeded)
    finally:
        pool.close()
