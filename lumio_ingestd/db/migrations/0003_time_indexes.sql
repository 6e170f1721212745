-- Retention deletes by time across all accounts: without an index on the
-- time column alone every batch would scan the whole table. (A hypertable
-- has one already; a second, on plain PostgreSQL only, costs nothing there.)
DO $migration$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_indexes WHERE tablename = 'chat_messages'
                   AND indexdef LIKE '%(created_at DESC)%') THEN
        CREATE INDEX chat_messages_created_at_idx ON chat_messages (created_at);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_indexes WHERE tablename = 'events'
                   AND indexdef LIKE '%(created_at DESC)%') THEN
        CREATE INDEX events_created_at_idx ON events (created_at);
    END IF;
END
$migration$;
CREATE INDEX event_children_time_idx ON event_children (event_created_at);
