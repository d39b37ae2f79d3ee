-- schema/roles.sql: the duties (produce, consume, administer), granting them,
-- and every function's security: pg_catalog, the queue's schema and pg_temp
-- pinned, no EXECUTE for PUBLIC, the duty functions SECURITY DEFINER. Applied
-- after every other file (_mq_secure() alters the functions they define).

-- The queue's schema: where mq_rows is. (Not current_schema(), which is
-- pg_catalog inside the functions, whose path starts with it.)
CREATE OR REPLACE FUNCTION _mq_queue_schema()
RETURNS text
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT n.nspname::text
    FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
    WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('mq_rows')
$$;

-- The queue's schema version (the highest in mq_schema_migrations), for
-- every duty: pqmq_migrate and the pqmq command read it to learn that the
-- queue is current, and the duties have no rights on the tables.
-- Parameters: none.
-- Returns: the queue's schema version (100 for release 1.0.0). Duty: produce,
--   consume, administer.
CREATE OR REPLACE FUNCTION mq_schema_version()
RETURNS int
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT COALESCE(pg_catalog.max(version), 0) FROM mq_schema_migrations
$$;

-- Which function belongs to which duty. A function given to a duty is added
-- here; every install and upgrade applies this file again and calls
-- _mq_regrant() (at the end), so holders of the duty get it.
-- Parameters: none.
-- Returns: one row per (duty, function). Duty: the queue's owner (or a
--   superuser).
CREATE OR REPLACE FUNCTION mq_duties()
RETURNS TABLE(duty text, function_name text)
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$
    VALUES ('produce', 'mq_schema_version'), ('consume', 'mq_schema_version'),
           ('administer', 'mq_schema_version'),
           ('produce', 'mq_insert'), ('produce', 'mq_insert_unique'), ('produce', 'mq_commit'),
           -- A schedule inserts messages: producing (a runner that
           -- carries schedules needs it); operators list slots.
           ('produce', 'mq_schedule'), ('produce', 'mq_cron_slots'),
           ('administer', 'mq_cron_slots'),
           ('consume', 'mq_claim'), ('consume', 'mq_claim_locked'),
           ('consume', 'mq_claim_lane'),
           ('consume', 'mq_complete_claim'),
           ('consume', 'mq_poll'), ('consume', 'mq_poll_jobs'),
           ('consume', 'mq_complete'), ('consume', 'mq_complete_all'),
           ('consume', 'mq_complete_poll'),
           ('consume', 'mq_delete'), ('consume', 'mq_fail'),
           ('consume', 'mq_keep_alive'), ('consume', 'mq_keep_alive_count'),
           ('consume', 'mq_checkpoint'), ('consume', 'mq_checkpoint_found'),
           ('consume', 'mq_release'),
           ('administer', 'mq_dead_jobs'), ('administer', 'mq_dead_letters'),
           ('administer', 'mq_retry'),
           ('administer', 'mq_skip'), ('administer', 'mq_delete'),
           ('administer', 'mq_clear'), ('administer', 'mq_clear_all'),
           ('administer', 'mq_clear_count'),
           ('administer', 'mq_stats'), ('administer', 'mq_reap_dead'),
           ('administer', 'mq_metrics'), ('administer', 'mq_peek'),
           ('administer', 'mq_purge'), ('administer', 'mq_alert_metrics'),
           -- A runner registers and heartbeats (schema/workers.sql).
           ('consume', 'mq_worker_register'), ('consume', 'mq_worker_beat'),
           ('consume', 'mq_worker_leave'), ('administer', 'mq_workers'),
           -- Pausing a channel (schema/pause.sql).
           ('administer', 'mq_pause'), ('administer', 'mq_resume'),
           ('administer', 'mq_paused_channels'),
           -- One message's story (schema/story.sql).
           ('administer', 'mq_message'), ('administer', 'mq_message_payload'),
           ('administer', 'mq_waiting')
$$;

-- Lets grantee do duty ('produce', 'consume' or 'administer') on this
-- queue: USAGE on the schema and EXECUTE on the duty's functions, nothing
-- on the tables. Refuses a role that can create objects in the queue's
-- schema (see the top of this file). Returns how many functions it granted.
-- Parameters: duty: 'produce', 'consume' or 'administer'; grantee.
-- Returns: how many functions it granted. Duty: the queue's owner (or a
--   superuser).
CREATE OR REPLACE FUNCTION mq_grant(duty text, grantee regrole)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    q  text := _mq_queue_schema();
    fn text;
    n  int := 0;
BEGIN
    IF grantee IS NULL OR NOT EXISTS (
            SELECT 1 FROM mq_duties() d WHERE d.duty OPERATOR(pg_catalog.=) mq_grant.duty) THEN
        RAISE EXCEPTION 'mq_grant: duty % is not one of produce, consume, administer (or role is NULL)',
            pg_catalog.quote_nullable(duty)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.has_schema_privilege(grantee, q, 'CREATE') THEN
        RAISE EXCEPTION 'mq_grant: role % can create objects in schema %', grantee, q
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'An object it creates there would run with the queue owner''s rights.',
                  HINT = pg_catalog.format('REVOKE CREATE ON SCHEMA %I FROM PUBLIC (and from %s).',
                                           q, grantee);
    END IF;
    PERFORM _mq_run_ddl(pg_catalog.format('GRANT USAGE ON SCHEMA %I TO %s', q, grantee));
    FOR fn IN
        SELECT _mq_qualified(p.oid)
        FROM pg_catalog.pg_proc p
        JOIN mq_duties() d ON d.function_name OPERATOR(pg_catalog.=) p.proname::text
        WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.quote_ident(q)::regnamespace
          AND d.duty OPERATOR(pg_catalog.=) mq_grant.duty
    LOOP
        PERFORM _mq_run_ddl(pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', fn, grantee));
        n := n OPERATOR(pg_catalog.+) 1;
    END LOOP;
    RETURN n;
END;
$$;

-- Takes duty away from grantee (its USAGE on the schema stays: other
-- duties may need it), except the functions that another duty grantee
-- still holds has too (mq_schema_version, mq_delete, mq_cron_slots): it
-- holds a duty when it may run the duty's anchor function, as in
-- _mq_regrant. Returns how many functions it revoked.
-- Parameters: duty; grantee.
-- Returns: how many functions it revoked. Duty: the queue's owner (or a
--   superuser).
CREATE OR REPLACE FUNCTION mq_revoke(duty text, grantee regrole)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    fn text;
    n  int := 0;
BEGIN
    FOR fn IN
        SELECT _mq_qualified(p.oid)
        FROM pg_catalog.pg_proc p
        JOIN mq_duties() d ON d.function_name OPERATOR(pg_catalog.=) p.proname::text
        WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.quote_ident(_mq_queue_schema())::regnamespace
          AND d.duty OPERATOR(pg_catalog.=) mq_revoke.duty
          AND NOT EXISTS (
              SELECT 1
              FROM mq_duties() o
              JOIN (VALUES ('produce', 'mq_insert'), ('consume', 'mq_claim'),
                           ('administer', 'mq_stats')) AS a(duty, anchor)
                ON a.duty OPERATOR(pg_catalog.=) o.duty
              JOIN pg_catalog.pg_proc ap
                ON ap.proname::text OPERATOR(pg_catalog.=) a.anchor
               AND ap.pronamespace OPERATOR(pg_catalog.=) p.pronamespace
              WHERE o.function_name OPERATOR(pg_catalog.=) p.proname::text
                AND o.duty OPERATOR(pg_catalog.<>) mq_revoke.duty
                AND pg_catalog.has_function_privilege(grantee, ap.oid, 'EXECUTE'))
    LOOP
        PERFORM _mq_run_ddl(pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM %s', fn,
                                             grantee));
        n := n OPERATOR(pg_catalog.+) 1;
    END LOOP;
    RETURN n;
END;
$$;

-- Grants each duty's functions again to every role that holds the duty
-- (a direct EXECUTE on one of its functions: mq_insert, mq_claim,
-- mq_stats). For migrations that add functions to a duty.
CREATE OR REPLACE FUNCTION _mq_regrant()
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    h record;
BEGIN
    FOR h IN
        SELECT DISTINCT a.duty, acl.grantee::regrole AS grantee
        FROM (VALUES ('produce', 'mq_insert'), ('consume', 'mq_claim'),
                     ('administer', 'mq_stats')) AS a(duty, anchor)
        JOIN pg_catalog.pg_proc p
          ON p.proname::text OPERATOR(pg_catalog.=) a.anchor
         AND p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.quote_ident(_mq_queue_schema())::regnamespace
        CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) acl
        WHERE acl.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
          AND acl.grantee OPERATOR(pg_catalog.<>) p.proowner
          AND acl.grantee OPERATOR(pg_catalog.<>) 0::oid
    LOOP
        PERFORM mq_grant(h.duty, h.grantee);
    END LOOP;
END;
$$;

-- Creates NOLOGIN group roles PREFIX_producer, PREFIX_consumer and
-- PREFIX_admin (those that do not exist yet; needs CREATEROLE) and grants
-- them their duties. Roles are cluster-wide, a queue is one schema of one
-- database: the default prefix names both. Give login roles membership:
-- GRANT PREFIX_consumer TO worker_app. Returns the three names.
-- Parameters: prefix (NULL: the database and schema names).
-- Returns: the duty and name of each role. Duty: the queue's owner (or a
--   superuser).
CREATE OR REPLACE FUNCTION mq_create_roles(prefix text DEFAULT NULL)
RETURNS TABLE(duty text, role_name text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    p text := COALESCE(prefix, pg_catalog.current_database()::text OPERATOR(pg_catalog.||) '_'
                               OPERATOR(pg_catalog.||) _mq_queue_schema()::text);
    r record;
BEGIN
    IF p OPERATOR(pg_catalog.=) '' OR pg_catalog.octet_length(p) OPERATOR(pg_catalog.>) 54 THEN
        RAISE EXCEPTION 'mq_create_roles: prefix % must be 1..54 bytes (role names: 63)',
            pg_catalog.quote_literal(p)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR r IN SELECT * FROM (VALUES ('produce', '_producer'), ('consume', '_consumer'),
                                   ('administer', '_admin')) AS v(duty, suffix)
    LOOP
        duty := r.duty;
        role_name := p OPERATOR(pg_catalog.||) r.suffix;
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles o
                       WHERE o.rolname OPERATOR(pg_catalog.=) role_name) THEN
            EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', role_name);
        END IF;
        PERFORM mq_grant(r.duty, role_name::regrole);
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Every function of the queue (every function of its schema named mq_* or
-- _mq_*, the API and its helpers):
-- a pinned path (pg_catalog, the queue's schema, pg_temp), no EXECUTE for
-- PUBLIC, and the duty functions run as the owner, as do the functions of
-- the mq_msgs and mq_payloads views' triggers (schema/payloads.sql), which
-- stand for the views' own access to mq_rows and the log. CREATE OR REPLACE FUNCTION
-- resets the first and the last (not the grants), so a migration that
-- replaces or adds functions ends with SELECT _mq_secure().
CREATE OR REPLACE FUNCTION _mq_secure()
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    q text := _mq_queue_schema();
    f record;
BEGIN
    FOR f IN
        SELECT _mq_qualified(p.oid) AS sig,
               EXISTS (SELECT 1 FROM mq_duties() d
                       WHERE d.function_name OPERATOR(pg_catalog.=) p.proname::text)
               OR EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                          WHERE t.tgfoid OPERATOR(pg_catalog.=) p.oid
                            AND t.tgrelid OPERATOR(pg_catalog.=) ANY (ARRAY[
                                    pg_catalog.to_regclass('mq_payloads'),
                                    pg_catalog.to_regclass('mq_msgs')])) AS definer,
               p.prosqlbody IS NOT NULL AS parsed
        FROM pg_catalog.pg_proc p
        WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.quote_ident(q)::regnamespace
          AND p.proname::text OPERATOR(pg_catalog.~) '^_?mq_'
          AND p.prokind OPERATOR(pg_catalog.=) 'f'
    LOOP
        -- (A standard SQL body keeps no path: see schema/trust.sql.)
        PERFORM _mq_run_ddl(pg_catalog.format(
            'ALTER FUNCTION %s %s%s', f.sig,
            CASE WHEN f.definer THEN 'SECURITY DEFINER' ELSE 'SECURITY INVOKER' END,
            CASE WHEN NOT f.parsed
                 THEN pg_catalog.format(' SET search_path = pg_catalog, %I, pg_temp', q) END));
        PERFORM _mq_run_ddl(pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f.sig));
    END LOOP;
END;
$$;

SELECT _mq_secure();
-- Holders of a duty get the functions it gained since they were granted it.
SELECT _mq_regrant();

DO $$
DECLARE
    q   text := _mq_queue_schema();
    g   record;
BEGIN
    -- Roles that used the queue through table rights keep working.
    FOR g IN
        SELECT DISTINCT acl.grantee
        FROM pg_catalog.pg_class c
        CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) acl
        WHERE c.relnamespace OPERATOR(pg_catalog.=) pg_catalog.quote_ident(q)::regnamespace
          AND c.relname OPERATOR(pg_catalog.=) 'mq_rows'
          AND acl.grantee OPERATOR(pg_catalog.<>) c.relowner
    LOOP
        IF g.grantee OPERATOR(pg_catalog.=) 0::oid
           OR pg_catalog.has_schema_privilege(g.grantee, q, 'CREATE') THEN
            RAISE WARNING 'pqmq: % has rights on %.mq_rows but gets no duty: %',
                CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0::oid THEN 'PUBLIC'
                     ELSE g.grantee::regrole::text END,
                q,
                CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0::oid THEN 'grant duties to roles, not to PUBLIC'
                     ELSE 'it can create objects in the schema' END;
            CONTINUE;
        END IF;
        PERFORM mq_grant(d.duty, g.grantee::regrole)
        FROM (VALUES ('produce'), ('consume'), ('administer')) AS d(duty);
    END LOOP;
END
$$;

-- The release this schema is (a step of migrations/ records it when it
-- upgrades; a fresh install here).
INSERT INTO mq_schema_migrations (version, name)
VALUES (100, '1.0.0')
ON CONFLICT (version) DO NOTHING;
