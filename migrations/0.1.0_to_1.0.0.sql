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
    INSERT INTO mq_schema_migrations (version, name) VALUES (100, '1.0.0');
END
$$;
