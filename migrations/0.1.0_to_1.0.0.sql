-- migrations/0.1.0_to_1.0.0.sql: upgrades a queue made by release 0.1.0
-- (schema version 17) to 1.0.0 (version 100), in place. Runs before schema/
-- and does nothing on any other database. Table changes go here; schema/,
-- applied next, replaces every function. A step records the version its
-- tables now have, which is what lets schema/ apply (schema/tables.sql).
DO $$
BEGIN
    IF pg_catalog.to_regclass('mq_schema_migrations') IS NULL THEN
        RETURN;
    END IF;
    IF (SELECT max(version) FROM mq_schema_migrations) IS DISTINCT FROM 17 THEN
        RETURN;
    END IF;
    -- A schedule belongs to the role that evaluates it first (NULL: to the
    -- next caller; mq_schedule).
    ALTER TABLE mq_schedules ADD COLUMN IF NOT EXISTS owner oid;
    -- mq_schedule and mq_cron_slots leave the consume duty: every grant of
    -- them goes, and roles.sql's mq_regrant() gives them back to the
    -- holders of the duties that keep them (produce, administer).
    PERFORM mq_run_ddl(pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM %s',
                                         mq_qualified(p.oid), acl.grantee::regrole))
    FROM pg_catalog.pg_proc p
    CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) acl
    WHERE p.pronamespace = pg_catalog.quote_ident(mq_queue_schema())::regnamespace
      AND p.proname = ANY (ARRAY['mq_schedule', 'mq_cron_slots']::name[])
      AND acl.privilege_type = 'EXECUTE'
      AND acl.grantee <> p.proowner
      AND acl.grantee <> 0::oid;
    INSERT INTO mq_schema_migrations (version, name) VALUES (100, '1.0.0');
END
$$;
