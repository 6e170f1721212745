-- Viewer statistics per account, platform and minute (the stream-status
-- poller's samples). `ts` is the start of the minute; a later write for the
-- same minute merges into the row (the average weighted by samples).
CREATE TABLE stream_stats (
    account_id  bigint           NOT NULL,
    platform    text             NOT NULL,
    ts          timestamptz      NOT NULL,
    viewers_avg double precision NOT NULL,
    viewers_max integer          NOT NULL,
    samples     integer          NOT NULL,
    title       text,
    category    text,
    CONSTRAINT stream_stats_samples CHECK (samples > 0)
);
CREATE UNIQUE INDEX stream_stats_key ON stream_stats (account_id, platform, ts);

-- The ids of the window writes already merged into stream_stats. A window
-- write is replayed at least once from the dead-letter lists and the spool;
-- its id, inserted in the same transaction as the merge, makes the replay
-- of a write that did commit a no-op instead of counting its samples twice.
CREATE TABLE stream_stats_writes (
    id uuid        PRIMARY KEY,
    ts timestamptz NOT NULL
);
CREATE INDEX stream_stats_writes_ts_idx ON stream_stats_writes (ts);

DO $migration$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'timescaledb')
       -- Preloaded: its loader defines this setting. pg_settings lists a setting only once a
       -- loaded library defines it, and any role may read it (shared_preload_libraries
       -- itself needs superuser or pg_read_all_settings).
       AND EXISTS (SELECT 1 FROM pg_settings WHERE name = 'timescaledb.max_background_workers') THEN
        CREATE EXTENSION IF NOT EXISTS timescaledb;
        EXECUTE $$SELECT create_hypertable('stream_stats', 'ts',
                    chunk_time_interval => interval '7 days',
                    if_not_exists => TRUE, migrate_data => TRUE)$$;
    ELSE
        RAISE NOTICE 'timescaledb is not available: stream_stats stays a plain table';
    END IF;
END
$migration$;
