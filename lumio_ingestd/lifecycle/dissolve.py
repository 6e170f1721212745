"""Account dissolution: every row and every Redis key of one account, gone.

Durable when `dissolve_account` returns: the deletes are committed in one
unbounded transaction, then the account's Redis keys are deleted.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

import redis

from lumio_ingestd.db.pool import Pool
from lumio_ingestd.lifecycle.redis_purge import delete_account_keys

log = logging.getLogger("lumio_ingestd.lifecycle.dissolve")


@dataclass
class DissolutionReceipt:
    account_id: int
    chat_messages: int
    events: int
    event_children: int
    stream_sessions: int
    stream_stats: int
    seventv_emote_sets: int
    redis_keys: int

    def to_json(self) -> str:
        return json.dumps({"dissolution": asdict(self)}, sort_keys=True)


def dissolve_account(pool: Pool, client: redis.Redis, account_id: int) -> DissolutionReceipt:
    with pool.begin_unbounded() as cur:
        cur.execute("DELETE FROM chat_messages WHERE account_id = %s", (account_id,))
        chat = cur.rowcount
        cur.execute("""DELETE FROM event_children c USING events e
                        WHERE c.event_id = e.id AND c.event_created_at = e.created_at
                          AND e.account_id = %s""", (account_id,))
        children = cur.rowcount
        cur.execute("DELETE FROM events WHERE account_id = %s", (account_id,))
        events = cur.rowcount
        cur.execute("DELETE FROM stream_sessions WHERE account_id = %s", (account_id,))
        sessions = cur.rowcount
        cur.execute("DELETE FROM stream_stats WHERE account_id = %s", (account_id,))
        stats = cur.rowcount
        cur.execute("DELETE FROM seventv_emote_sets WHERE account_id = %s", (account_id,))
        emote_sets = cur.rowcount
    keys = delete_account_keys(client, account_id)
    receipt = DissolutionReceipt(account_id, chat, events, children, sessions, stats, emote_sets, keys)
    log.info("account dissolved: %s", receipt.to_json())
    return receipt
