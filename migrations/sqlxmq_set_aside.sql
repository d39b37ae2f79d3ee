-- migrations/sqlxmq_set_aside.sql: adopting a database made by the original
-- (sqlxmq) schema, part 1 of 2. Runs before schema/ and does nothing unless
-- the current schema holds the original's mq_msgs (no pqmq version recorded,
-- no `deliveries` column).
--
-- The original's two tables are set aside under other names, so that
-- schema/ creates this release's tables as on a new database;
-- sqlxmq_import.sql, which runs after schema/, moves the messages over and
-- drops what was set aside. The original's functions that pqmq has no
-- signature for are dropped (the others are replaced by schema/): a
-- three-argument mq_poll with a default would make every two-argument call
-- ambiguous, and the original's indexes depend on mq_uuid_exists.
DO $$
BEGIN
    IF pg_catalog.to_regclass('mq_msgs') IS NULL
       OR pg_catalog.to_regclass('mq_schema_migrations') IS NOT NULL
       OR EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                  WHERE a.attrelid = pg_catalog.to_regclass('mq_msgs')
                    AND a.attname = 'deliveries' AND NOT a.attisdropped) THEN
        RETURN;
    END IF;
    DROP FUNCTION IF EXISTS mq_uuid_exists(uuid) CASCADE;
    DROP FUNCTION IF EXISTS mq_latest_message(text, text);
    DROP FUNCTION IF EXISTS mq_active_channels(text[], int);
    DROP FUNCTION IF EXISTS mq_poll_locking(text[], int);
    DROP FUNCTION IF EXISTS mq_poll(text[], int, interval);
    ALTER TABLE mq_msgs RENAME TO mq_sqlxmq_msgs;
    ALTER TABLE mq_payloads RENAME TO mq_sqlxmq_payloads;
    -- The primary keys' names (and their indexes') are this release's.
    ALTER TABLE mq_sqlxmq_msgs RENAME CONSTRAINT mq_msgs_pkey TO mq_sqlxmq_msgs_pkey;
    ALTER TABLE mq_sqlxmq_payloads RENAME CONSTRAINT mq_payloads_pkey TO mq_sqlxmq_payloads_pkey;
END
$$;
