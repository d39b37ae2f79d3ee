-- Migration 0018: writes through the mq_payloads view. Clients
-- of the original schema (the sqlxmq crate and SQL written after its
-- migrations) write and lock mq_payloads, a view of mq_msgs since 0011.
-- An INSERT and a DELETE through the view now keep the queue's invariants
-- (INSTEAD OF triggers); an UPDATE and a lock were and stay PostgreSQL's
-- own, the view being automatically updatable. schema/payloads.sql and
-- schema/roles.sql (mq_secure) carry the same text.
--
-- The view is a plain view of one table, so PostgreSQL updates it and locks
-- it (SELECT ... FOR UPDATE, LOCK TABLE) by itself: an UPDATE changes the
-- message's row, and concurrent updates of one row wait and recheck as on a
-- table. INSERT and DELETE need more than a rewrite onto mq_msgs, so they
-- have INSTEAD OF triggers. Both functions run as the queue's owner
-- (mq_secure), as the view's own reads and writes of mq_msgs do: the right
-- to write through the view is the view's grant, nothing more.

-- A message's payload is written with it, by mq_insert; a payload cannot
-- exist without its message or twice for one. So an INSERT is refused with
-- the error the original schema's constraints give in the same state: an
-- id that is a message has its payload already (unique_violation, the
-- original's primary key), an id that is none has no message to carry it
-- (foreign_key_violation). Nothing is written, so no message is ever half
-- written.
CREATE OR REPLACE FUNCTION mq_payloads_insert()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NEW.id IS NULL OR NEW.name IS NULL THEN
        RAISE EXCEPTION 'mq_payloads: % must not be NULL',
            CASE WHEN NEW.id IS NULL THEN 'id' ELSE 'name' END
            USING ERRCODE = 'not_null_violation',
                  COLUMN = CASE WHEN NEW.id IS NULL THEN 'id' ELSE 'name' END;
    END IF;
    IF EXISTS (SELECT 1 FROM mq_msgs m WHERE m.id = NEW.id) THEN
        RAISE EXCEPTION 'mq_payloads: message % has its payload already', NEW.id
            USING ERRCODE = 'unique_violation',
                  HINT = 'UPDATE mq_payloads replaces a message''s payload.';
    END IF;
    RAISE EXCEPTION 'mq_payloads: no message %', NEW.id
        USING ERRCODE = 'foreign_key_violation',
              HINT = 'mq_insert writes a message with its payload.';
END;
$$;

-- A payload goes with its message: deleting one through the view completes
-- the message as mq_delete does (the original's mq_delete deleted both), so
-- a chain's next message moves up instead of waiting forever on a deleted
-- predecessor. A row the statement saw but that is gone by now (completed
-- meanwhile, or deleted by the same statement's WITH) is not counted.
-- Each row takes its own chain's lock: a DELETE of many rows of different
-- chains takes them in the order it finds the rows, so two such DELETEs
-- at once can deadlock (40P01, which the crate retries); mq_delete takes
-- them in key order and never does.
CREATE OR REPLACE FUNCTION mq_payloads_delete()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF mq_complete(ARRAY[OLD.id]) = 0 THEN
        RETURN NULL;
    END IF;
    RETURN OLD;
END;
$$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                   WHERE t.tgrelid = 'mq_payloads'::regclass
                     AND t.tgname = 'mq_payloads_insert') THEN
        CREATE TRIGGER mq_payloads_insert INSTEAD OF INSERT ON mq_payloads
            FOR EACH ROW EXECUTE FUNCTION mq_payloads_insert();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                   WHERE t.tgrelid = 'mq_payloads'::regclass
                     AND t.tgname = 'mq_payloads_delete') THEN
        CREATE TRIGGER mq_payloads_delete INSTEAD OF DELETE ON mq_payloads
            FOR EACH ROW EXECUTE FUNCTION mq_payloads_delete();
    END IF;
END
$$;

-- Every function of the queue (every function of its schema named mq_*):
-- a pinned path (pg_catalog, the queue's schema, pg_temp), no EXECUTE for
-- PUBLIC, and the duty functions run as the owner, as do the functions of
-- the mq_payloads view's triggers (schema/payloads.sql), which stand for the
-- view's own access to mq_msgs. CREATE OR REPLACE FUNCTION
-- resets the first and the last (not the grants), so a migration that
-- replaces or adds functions ends with SELECT mq_secure().
CREATE OR REPLACE FUNCTION mq_secure()
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    q text := mq_queue_schema();
    f record;
BEGIN
    FOR f IN
        SELECT mq_qualified(p.oid) AS sig,
               EXISTS (SELECT 1 FROM mq_duties() d
                       WHERE d.function_name OPERATOR(pg_catalog.=) p.proname::text)
               OR EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                          WHERE t.tgfoid OPERATOR(pg_catalog.=) p.oid
                            AND t.tgrelid OPERATOR(pg_catalog.=)
                                pg_catalog.to_regclass('mq_payloads')) AS definer
        FROM pg_catalog.pg_proc p
        WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.quote_ident(q)::regnamespace
          AND p.proname::text OPERATOR(pg_catalog.~~) 'mq\_%'
          AND p.prokind OPERATOR(pg_catalog.=) 'f'
    LOOP
        PERFORM mq_run_ddl(pg_catalog.format(
            'ALTER FUNCTION %s %s SET search_path = pg_catalog, %I, pg_temp',
            f.sig, CASE WHEN f.definer THEN 'SECURITY DEFINER' ELSE 'SECURITY INVOKER' END, q));
        PERFORM mq_run_ddl(pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f.sig));
    END LOOP;
END;
$$;

SELECT mq_secure();

INSERT INTO mq_schema_migrations (version, name)
VALUES (18, '0018_payloads_writes')
ON CONFLICT (version) DO NOTHING;
