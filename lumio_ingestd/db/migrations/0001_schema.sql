-- The base schema. Runs unchanged on plain PostgreSQL and on TimescaleDB;
-- the hypertable conversion is migration 0002.
--
-- No unique index here lacks the time column: a hypertable refuses those,
-- which is why the events dedup probe is a plain index on
-- (account_id, external_id, created_at) used under an advisory lock.

CREATE TABLE chat_messages (
    account_id   bigint      NOT NULL,
    platform     text        NOT NULL,
    message_id   text        NOT NULL,
    created_at   timestamptz NOT NULL,
    user_id      text        NOT NULL DEFAULT '',
    user_login   text        NOT NULL DEFAULT '',
    display_name text        NOT NULL DEFAULT '',
    text         text        NOT NULL DEFAULT '',
    extras       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    ingested_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, platform, message_id, created_at)
);
-- GDPR erasure and export find a platform user's messages across accounts.
CREATE INDEX chat_messages_user_idx ON chat_messages (platform, user_id, created_at);

CREATE TABLE events (
    id                uuid        NOT NULL,
    created_at        timestamptz NOT NULL,
    account_id        bigint      NOT NULL,
    platform          text        NOT NULL,
    type              text        NOT NULL,
    external_id       text,
    user_id           text,
    payload           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    stream_session_id bigint,
    ingested_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, created_at),
    CONSTRAINT events_external_id_not_empty CHECK (external_id <> '')
);
CREATE INDEX events_dedup_idx ON events (account_id, external_id, created_at)
    WHERE external_id IS NOT NULL;
CREATE INDEX events_account_time_idx ON events (account_id, created_at);
CREATE INDEX events_user_idx ON events (platform, user_id, created_at)
    WHERE user_id IS NOT NULL;

-- Rows that belong to an event (the recipients of a gift bundle), written in
-- the same transaction as their event. No foreign key: the parent may be a
-- hypertable, which cannot be referenced on every TimescaleDB version.
CREATE TABLE event_children (
    event_id         uuid        NOT NULL,
    event_created_at timestamptz NOT NULL,
    ordinal          integer     NOT NULL,
    kind             text        NOT NULL,
    user_id          text,
    user_login       text,
    payload          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    PRIMARY KEY (event_id, ordinal)
);
CREATE INDEX event_children_user_idx ON event_children (user_id) WHERE user_id IS NOT NULL;

CREATE TABLE stream_sessions (
    id          bigserial   PRIMARY KEY,
    account_id  bigint      NOT NULL,
    platform    text        NOT NULL,
    external_id text,
    started_at  timestamptz NOT NULL,
    ended_at    timestamptz,
    CONSTRAINT stream_sessions_range CHECK (ended_at IS NULL OR ended_at >= started_at)
);
CREATE UNIQUE INDEX stream_sessions_external_idx
    ON stream_sessions (account_id, platform, external_id) WHERE external_id IS NOT NULL;
CREATE INDEX stream_sessions_time_idx ON stream_sessions (account_id, started_at);

-- Bluesky records seen on Jetstream; the key of the record in its repo.
CREATE TABLE bsky_records (
    did        text   NOT NULL,
    collection text   NOT NULL,
    rkey       text   NOT NULL,
    rev        text   NOT NULL,
    cid        text,
    record     jsonb,
    time_us    bigint NOT NULL,
    PRIMARY KEY (did, collection, rkey)
);

-- Where each Jetstream consumer resumes; only ever moves forward.
CREATE TABLE jetstream_cursor (
    name       text        PRIMARY KEY,
    time_us    bigint      NOT NULL CHECK (time_us >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
