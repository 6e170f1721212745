-- The gaps ledger: one row per stretch in which a source that should have
-- been connected and subscribed was not (a reconnect, a restart, an account
-- taken over by another replica). `started_at` is the last moment the source
-- was known connected, `ended_at` when it was subscribed again. `status` is
-- `open` while healing from the platform's history runs, then `healed`,
-- `partial` (the part older than heal_max_hours, or the history API failed
-- for good) or `not_healable` (no history to read: chat). `healed_rows` counts
-- the rows healing stored that the live path had not.
CREATE TABLE source_gaps (
    account_id  bigint      NOT NULL,
    platform    text        NOT NULL,
    source      text        NOT NULL,
    started_at  timestamptz NOT NULL,
    ended_at    timestamptz NOT NULL,
    status      text        NOT NULL,
    healed_rows integer     NOT NULL DEFAULT 0,
    detail      text,
    closed_at   timestamptz,
    PRIMARY KEY (account_id, platform, source, started_at),
    CONSTRAINT source_gaps_status
        CHECK (status IN ('open', 'healed', 'partial', 'not_healable')),
    CONSTRAINT source_gaps_bounds CHECK (ended_at >= started_at)
);
CREATE INDEX source_gaps_open_idx ON source_gaps (account_id) WHERE status = 'open';
CREATE INDEX source_gaps_closed_idx ON source_gaps (closed_at DESC) WHERE status <> 'open';
