-- migrations/0.1.0_to_1.0.0.sql: upgrades a queue made by release 0.1.0
-- (schema version 17) to 1.0.0 (version 100), in place. Runs before schema/
-- and does nothing on any other database. Table changes go here; schema/,
-- applied next, replaces every function. A step records the version its
-- tables now have, which is what lets schema/ apply (schema/tables.sql).
DO $$
DECLARE
    base bigint;
    n    bigint;
    fn   regprocedure;
    ddl  text;
    -- The queue's schema (this step calls none of 0.1.0's helpers, which
    -- it drops below).
    nsp  oid := (SELECT c.relnamespace FROM pg_catalog.pg_class c
                 WHERE c.oid = pg_catalog.to_regclass('mq_schema_migrations'));
BEGIN
    IF pg_catalog.to_regclass('mq_schema_migrations') IS NULL THEN
        RETURN;
    END IF;
    IF (SELECT max(version) FROM mq_schema_migrations) IS DISTINCT FROM 17 THEN
        RETURN;
    END IF;
    -- 0.1.0's table of messages is 1.0.0's mq_rows (mq_msgs becomes the
    -- view of every live message: schema/tables.sql).
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_class c
               WHERE c.oid = pg_catalog.to_regclass('mq_msgs') AND c.relkind = 'r') THEN
        ALTER TABLE mq_msgs RENAME TO mq_rows;
    END IF;
    -- Chains are kept by place (chain_seq), not by links: each chain's
    -- members get places in their link order, heads first (in flight, dead
    -- or delayed, each keeps its state); a member whose predecessor is gone
    -- (written by hand) follows its chain's linked ones, oldest first.
    -- after_message_id becomes the nil UUID for every ordered message.
    ALTER TABLE mq_rows ADD COLUMN IF NOT EXISTS chain_seq bigint;
    CREATE SEQUENCE IF NOT EXISTS mq_chain_seq INCREMENT BY 16384;
    base := pg_catalog.nextval('mq_chain_seq');
    WITH RECURSIVE walk(id, k, depth) AS (
        SELECT m.id, m.channel_key, 0::bigint FROM mq_rows m
        WHERE m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid
        UNION ALL
        SELECT s.id, w.k, w.depth + 1 FROM walk w
        JOIN mq_rows s ON s.after_message_id = w.id
    ),
    placed AS (
        SELECT m.id, pg_catalog.row_number() OVER (
                   ORDER BY m.channel_key, w.depth IS NULL, w.depth, m.created_at, m.id) AS n
        FROM mq_rows m
        LEFT JOIN walk w ON w.id = m.id
        WHERE m.after_message_id IS NOT NULL
    ),
    done AS (
        UPDATE mq_rows m SET chain_seq = base + p.n,
                             after_message_id = '00000000-0000-0000-0000-000000000000'::uuid
        FROM placed p
        WHERE m.id = p.id
        RETURNING p.n
    )
    SELECT max(d.n) INTO n FROM done d;
    PERFORM pg_catalog.setval('mq_chain_seq', base + COALESCE(n, 0));
    -- The ready indexes hold unordered messages only (schema/tables.sql
    -- makes them anew), the chain index replaces the successor index, the
    -- tails are not kept, the relinking helpers go, and the counters are
    -- made anew by schema/stats.sql (waiting: every ordered message).
    DROP INDEX IF EXISTS mq_msgs_ready_plain;
    DROP INDEX IF EXISTS mq_msgs_ready_urgent;
    DROP INDEX IF EXISTS mq_msgs_ready_by_time;
    DROP INDEX IF EXISTS mq_msgs_successor;
    DELETE FROM mq_chains;
    DROP FUNCTION IF EXISTS mq_record_tails(mq_new_t[]);
    DROP FUNCTION IF EXISTS mq_lock_chains(uuid[]);
    DROP FUNCTION IF EXISTS mq_unlink(uuid[], uuid[], text[], text[]);
    DROP TRIGGER IF EXISTS mq_count_relinked ON mq_rows;
    DROP FUNCTION IF EXISTS mq_count_relinked();
    DROP TRIGGER IF EXISTS mq_count_inserted ON mq_rows;
    DROP TRIGGER IF EXISTS mq_count_deleted ON mq_rows;
    DROP TRIGGER IF EXISTS mq_count_truncated ON mq_rows;
    DROP TRIGGER IF EXISTS mq_count_unchained ON mq_rows;
    -- A schedule belongs to the role that evaluates it first (NULL: to the
    -- next caller; mq_schedule).
    ALTER TABLE mq_schedules ADD COLUMN IF NOT EXISTS owner oid;
    -- mq_schedule and mq_cron_slots leave the consume duty: every grant of
    -- them goes, and roles.sql's mq_regrant() gives them back to the
    -- holders of the duties that keep them (produce, administer).
    FOR ddl IN
        SELECT pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s.%I(%s) FROM %s', nsp::regnamespace,
                                 p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid),
                                 acl.grantee::regrole)
        FROM pg_catalog.pg_proc p
        CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) acl
        WHERE p.pronamespace = nsp
          AND p.proname = ANY (ARRAY['mq_schedule', 'mq_cron_slots']::name[])
          AND acl.privilege_type = 'EXECUTE'
          AND acl.grantee <> p.proowner
          AND acl.grantee <> 0::oid
    LOOP
        EXECUTE ddl;
    END LOOP;
    -- Internal helpers are named _mq_* from 1.0.0 on, the API keeps its
    -- names: 0.1.0's helpers go, with the triggers that call them; schema/
    -- makes their successors.
    FOR fn IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = nsp
          AND p.proname LIKE 'mq\_%'
          AND p.proname <> ALL (ARRAY[
                  'mq_checkpoint', 'mq_checkpoint_found', 'mq_claim', 'mq_claim_lane',
                  'mq_claim_locked', 'mq_clear', 'mq_clear_all', 'mq_clear_count', 'mq_commit',
                  'mq_complete', 'mq_complete_all', 'mq_complete_claim', 'mq_complete_poll',
                  'mq_create_roles', 'mq_cron_slots', 'mq_dead_jobs', 'mq_dead_letters', 'mq_delete',
                  'mq_duties', 'mq_fail', 'mq_grant', 'mq_insert', 'mq_insert_unique',
                  'mq_keep_alive', 'mq_keep_alive_count', 'mq_metrics', 'mq_peek', 'mq_poll',
                  'mq_poll_jobs', 'mq_purge', 'mq_reap_dead', 'mq_release', 'mq_retry', 'mq_revoke',
                  'mq_schedule', 'mq_schema_version', 'mq_skip', 'mq_stats']::name[])
    LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s CASCADE', fn);
    END LOOP;
    INSERT INTO mq_schema_migrations (version, name) VALUES (100, '1.0.0');
END
$$;
