-- pqmq schema, version 0: adopt a database created by the original (sqlxmq)
-- schema, keeping its messages. Runs before 0001 and does nothing unless the
-- current schema holds the original's mq_msgs (no `deliveries` column).
--
-- What changes, and why:
--   * the original's sentinel row (the nil UUID) and the foreign key that
--     needed it go: pqmq reads the nil UUID in after_message_id as "head of
--     its chain" without a row behind it;
--   * after_message_id loses its default (nil), which would make every
--     unordered message a chain head;
--   * messages the original delivered for the last time (attempts 0, no
--     attempt_at: they lingered forever) become dead letters, listed by
--     mq_dead_letters and retried with mq_retry;
--   * the original's internal helpers and indexes are dropped (0001 creates
--     pqmq's); so is lock_number, which later versions of the original add
--     and which no pqmq insert fills;
--   * the columns pqmq adds are added; 0001 onwards then apply as on a new
--     database, and 0005 records the tail of every existing chain.
-- Queued, delayed, uncommitted (two-phase) and ordered messages keep their
-- meaning: the original and pqmq encode them the same way.

-- Refuse a queue schema whose owner is not trusted, before anything is
-- created in it: a schema's owner may drop what is in it and plant
-- functions and operators there that the queue's callers would run (a role
-- with CREATE on the database makes a schema named like the installing
-- superuser, on its default path "$user", public). Trusted: the installing
-- role itself, or a superuser (for a schema owned by pg_database_owner,
-- public on PostgreSQL 15, the database's owner).
DO $$
DECLARE
    nsp   oid := COALESCE(
        (SELECT c.relnamespace FROM pg_catalog.pg_class c
         WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('mq_msgs')),
        (SELECT n.oid FROM pg_catalog.pg_namespace n
         WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()));
    owner oid := (SELECT n.nspowner FROM pg_catalog.pg_namespace n
                  WHERE n.oid OPERATOR(pg_catalog.=) nsp);
    eff   oid;
BEGIN
    IF owner IS NULL THEN
        RETURN; -- no schema: creating the first object says so
    END IF;
    eff := CASE WHEN owner OPERATOR(pg_catalog.=) (SELECT r.oid FROM pg_catalog.pg_roles r
                                                  WHERE r.rolname OPERATOR(pg_catalog.=) 'pg_database_owner')
                THEN (SELECT d.datdba FROM pg_catalog.pg_database d
                      WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                ELSE owner END;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r
                   WHERE r.oid OPERATOR(pg_catalog.=) eff
                     AND (r.rolsuper OR r.rolname OPERATOR(pg_catalog.=) CURRENT_USER)) THEN
        RAISE EXCEPTION 'pqmq: the queue schema % is owned by role %, which is neither the installing role (%) nor a superuser',
            nsp::regnamespace, owner::regrole, CURRENT_USER
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'The owner of a schema can drop the queue''s objects in it and put functions there that the queue''s callers would run with their rights.',
                  HINT = 'Install into a schema that the installing role owns (CREATE SCHEMA ... AUTHORIZATION), as that role; check the search_path: the queue goes into its first schema that exists.';
    END IF;
END
$$;

DO $$
DECLARE
    fk text;
BEGIN
    IF to_regclass('mq_msgs') IS NULL
       OR EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                  WHERE a.attrelid = to_regclass('mq_msgs')
                    AND a.attname = 'deliveries' AND NOT a.attisdropped) THEN
        RETURN;
    END IF;

    FOR fk IN SELECT c.conname FROM pg_catalog.pg_constraint c
              WHERE c.conrelid = to_regclass('mq_msgs') AND c.contype = 'f' LOOP
        EXECUTE pg_catalog.format('ALTER TABLE mq_msgs DROP CONSTRAINT %I', fk);
    END LOOP;
    ALTER TABLE mq_msgs ALTER COLUMN after_message_id DROP DEFAULT;
    DELETE FROM mq_msgs WHERE id = '00000000-0000-0000-0000-000000000000'::uuid;
    DELETE FROM mq_payloads WHERE id = '00000000-0000-0000-0000-000000000000'::uuid;

    -- The helpers' indexes depend on mq_uuid_exists and go with it.
    DROP FUNCTION IF EXISTS mq_uuid_exists(uuid) CASCADE;
    DROP INDEX IF EXISTS mq_msgs_channel_name_channel_args_after_message_id_idx;
    DROP INDEX IF EXISTS mq_msgs_channel_name_channel_args_created_at_id_idx;
    DROP INDEX IF EXISTS mq_msgs_channel_name_channel_args_attempt_at_idx;
    DROP FUNCTION IF EXISTS mq_latest_message(text, text);
    DROP FUNCTION IF EXISTS mq_active_channels(text[], int);
    DROP FUNCTION IF EXISTS mq_poll_locking(text[], int);
    -- A three-argument mq_poll with a default would make every two-argument
    -- call ambiguous once 0001 defines pqmq's.
    DROP FUNCTION IF EXISTS mq_poll(text[], int, interval);
    ALTER TABLE mq_msgs DROP COLUMN IF EXISTS lock_number;

    ALTER TABLE mq_msgs
        ADD COLUMN deliveries int NOT NULL DEFAULT 0,
        ADD COLUMN dead_since timestamptz;
    UPDATE mq_msgs SET created_at = pg_catalog.now() WHERE created_at IS NULL;
    -- Delivered for the last time: dead now.
    UPDATE mq_msgs SET attempt_at = pg_catalog.now(), dead_since = pg_catalog.now(),
                       deliveries = 1
    WHERE attempt_at IS NULL;
    ALTER TABLE mq_msgs
        ALTER COLUMN created_at SET NOT NULL,
        ALTER COLUMN attempt_at SET NOT NULL,
        ALTER COLUMN channel_args SET DEFAULT '',
        ADD COLUMN channel_key bigint GENERATED ALWAYS AS (
            (hashtext(channel_name)::bigint << 32)
            | (hashtext(channel_args)::bigint & 4294967295)
        ) STORED;
    ALTER TABLE mq_payloads ADD COLUMN IF NOT EXISTS last_error text;
END
$$;

-- Recorded like every migration (the table is 0001's, created here first).
CREATE TABLE IF NOT EXISTS mq_schema_migrations (
    version    int PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO mq_schema_migrations (version, name)
VALUES (0, '0000_adopt_sqlxmq')
ON CONFLICT (version) DO NOTHING;
