-- Where the timescaledb extension can be loaded, chat_messages and events
-- become hypertables on their time column. On plain PostgreSQL this is a
-- no-op, so the same migrations succeed unchanged.
DO $migration$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'timescaledb')
       -- Preloaded: its loader defines this setting. pg_settings lists a setting only once a
       -- loaded library defines it, and any role may read it (shared_preload_libraries
       -- itself needs superuser or pg_read_all_settings).
       AND EXISTS (SELECT 1 FROM pg_settings WHERE name = 'timescaledb.max_background_workers') THEN
        CREATE EXTENSION IF NOT EXISTS timescaledb;
        EXECUTE $$SELECT create_hypertable('chat_messages', 'created_at',
                    chunk_time_interval => interval '1 day',
                    if_not_exists => TRUE, migrate_data => TRUE)$$;
        EXECUTE $$SELECT create_hypertable('events', 'created_at',
                    chunk_time_interval => interval '7 days',
                    if_not_exists => TRUE, migrate_data => TRUE)$$;
    ELSE
        RAISE NOTICE 'timescaledb is not available: chat_messages and events stay plain tables';
    END IF;
END
$migration$;
