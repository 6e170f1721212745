-- The last known state of each account's 7TV emote set: what the EventAPI
-- dispatches and the REST snapshots are compared with. One row per account
-- (the set it follows; a switch of the active set replaces it). `emotes` is
-- {emote id: [name, added at (unix ms) or null, actor id or null]}.
-- `version` grows by one with every change set applied; it is part of the
-- external id of the events a change set stores, and a save only succeeds
-- from the version it was computed against.
CREATE TABLE seventv_emote_sets (
    account_id      bigint      PRIMARY KEY,
    emote_set_id    text        NOT NULL,
    seventv_user_id text,
    emotes          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    version         bigint      NOT NULL CHECK (version > 0),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
