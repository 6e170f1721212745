"""Removing one platform user's or one account's entries from Redis lists.

Used by GDPR erasure and account dissolution. The filter runs inside Redis as
a Lua script, one list at a time, so an entry pushed while it runs is either
seen or not, never half-removed, and a concurrent flush cannot resurrect what
was removed: the flush claims with its own atomic script.
"""

from __future__ import annotations

import redis

from lumio_ingestd.stores.redisclient import REDIS_ERRORS

# Removes entries whose platform and user_id match; in entries that are kept,
# drops matching children (gift recipients) and rewrites the entry in place.
# Returns {entries removed, children removed}.
_PURGE_USER = """
local removed, children = 0, 0
local items = redis.call('LRANGE', KEYS[1], 0, -1)
for i = #items, 1, -1 do
    local raw = items[i]
    local ok, obj = pcall(cjson.decode, raw)
    if ok and type(obj) == 'table' and obj['platform'] == ARGV[1] then
        if obj['user_id'] == ARGV[2] then
            redis.call('LSET', KEYS[1], i - 1, '__lumio_purged__')
            removed = removed + 1
        elseif type(obj['children']) == 'table' then
            local kept, dropped = {}, 0
            for _, child in ipairs(obj['children']) do
                if type(child) == 'table' and child['user_id'] == ARGV[2] then
                    dropped = dropped + 1
                else
                    table.insert(kept, child)
                end
            end
            if dropped > 0 then
                obj['children'] = kept
                if #kept == 0 then obj['children'] = cjson.decode('[]') end
                redis.call('LSET', KEYS[1], i - 1, cjson.encode(obj))
                children = children + dropped
            end
        end
    end
end
if removed > 0 then
    redis.call('LREM', KEYS[1], 0, '__lumio_purged__')
end
return {removed, children}
"""

USER_LIST_PATTERNS = (
    "lumio:chat:buffer:*", "lumio:chat:deadletter:*", "lumio:chat:quarantine:*",
    "lumio:chat:inflight:*", "lumio:events:deadletter:*", "lumio:events:quarantine:*",
    "lumio:events:inflight:*",
)


def purge_user(client: redis.Redis, platform: str, user_id: str) -> tuple[int, int]:
    """Remove a platform user's entries from every lumio list; (entries, children) removed."""
    script = client.register_script(_PURGE_USER)
    entries = children = 0
    for pattern in USER_LIST_PATTERNS:
        for key in client.scan_iter(match=pattern, count=500, _type="list"):
            got = script(keys=[key], args=[platform, user_id])
            entries += int(got[0])
            children += int(got[1])
    return entries, children


def delete_account_keys(client: redis.Redis, account_id: int) -> int:
    """Delete every lumio key of one account (its id is the key's hash tag)."""
    deleted = 0
    # Redis glob treats braces literally: `{4}` cannot match `{42}`.
    for key in client.scan_iter(match=f"lumio:*{{{account_id}}}*", count=500):
        deleted += int(client.delete(key))
    return deleted


__all__ = ["REDIS_ERRORS", "delete_account_keys", "purge_user"]
