-- schema/trust.sql: what every function trusts and who may call what.
-- Applied after the other schema/ files (name order); the migration that
-- introduced it (0006_hardening) carries the same statements.

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

-- Refuse a schema others can create in, before changing anything.
DO $$
DECLARE
    nsp oid := (SELECT c.relnamespace FROM pg_catalog.pg_class c
                WHERE c.oid = pg_catalog.to_regclass('mq_msgs'));
    owner oid := (SELECT n.nspowner FROM pg_catalog.pg_namespace n WHERE n.oid = nsp);
    who text;
BEGIN
    SELECT r.rolname INTO who
    FROM pg_catalog.pg_roles r
    WHERE NOT r.rolsuper
      AND NOT pg_catalog.pg_has_role(r.oid, owner, 'USAGE')
      AND pg_catalog.has_schema_privilege(r.oid, nsp, 'CREATE')
    ORDER BY r.rolname
    LIMIT 1;
    IF who IS NOT NULL THEN
        RAISE EXCEPTION 'pqmq: role % may create objects in the queue schema %',
            who, nsp::regnamespace
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Revoke CREATE on that schema from every role but its owner '
                         '(REVOKE CREATE ON SCHEMA ... FROM PUBLIC), or install into '
                         'a schema of its own.';
    END IF;
END
$$;

-- Every function pins pg_catalog, the queue's schema and pg_temp, by name;
-- internal helpers are not for PUBLIC. (Later migrations that create
-- functions repeat this block.)
DO $$
DECLARE
    nsp oid := (SELECT c.relnamespace FROM pg_catalog.pg_class c
                WHERE c.oid = pg_catalog.to_regclass('mq_msgs'));
    nm  text := (SELECT n.nspname FROM pg_catalog.pg_namespace n WHERE n.oid = nsp);
    f   regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             WHERE p.pronamespace = nsp AND p.proname LIKE 'mq\_%' LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                                  f, nm);
    END LOOP;
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             WHERE p.pronamespace = nsp
               AND p.proname IN ('mq_lock_new_chains', 'mq_record_tails', 'mq_wake',
                                 'mq_pick', 'mq_lock_chains', 'mq_unlink',
                                 'mq_fixed_length') LOOP
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
