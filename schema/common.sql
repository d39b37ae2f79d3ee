-- schema/common.sql: limits shared by every function, and wake-ups.

-- Limits shared by every function and by the C library (include/pqmq.h,
-- lib/produce.c): messages per batch, bytes per payload (JSON and binary
-- each), bytes of payload per insert, bytes per channel name, channel args
-- and message name, and the longest duration. (PL/pgSQL: a SQL function with
-- a SET clause is planned again at every call, twice the cost of this one,
-- and every batch calls it.)
DO $$
DECLARE
    was regprocedure := pg_catalog.to_regprocedure(
        pg_catalog.quote_ident(pg_catalog.current_schema()) OPERATOR(pg_catalog.||) '._mq_limits()');
BEGIN
    -- A changed result needs a DROP (the queue's functions call it by name).
    IF was IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM pg_catalog.pg_proc p
           WHERE p.oid OPERATOR(pg_catalog.=) was
             AND 'max_text' OPERATOR(pg_catalog.=) ANY (p.proargnames)) THEN
        DROP FUNCTION _mq_limits();
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION _mq_limits(
    OUT max_batch int, OUT max_payload bigint, OUT max_duration interval,
    OUT max_batch_payload bigint, OUT max_text int)
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    max_batch := 10000;
    max_payload := 16777216;
    max_duration := interval '36500000 days';
    max_batch_payload := 268435456;
    max_text := 1024;
END;
$$;

-- Wakes listeners of the given channels: one notification per channel on
-- mq_<channel>, plus one on mq. A channel whose notify name would be longer
-- than PostgreSQL's 63-byte limit wakes only mq. No payload data is sent.
CREATE OR REPLACE FUNCTION _mq_wake(channel_names text[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF channel_names IS NULL OR cardinality(channel_names) = 0 THEN
        RETURN;
    END IF;
    IF cardinality(channel_names) = 1 THEN
        -- (A batch on one channel passes its name once, and skips the
        -- DISTINCT below, which costs more than the notification.)
        IF octet_length(channel_names[1]) <= 60 THEN
            PERFORM pg_notify('mq_' || channel_names[1], '');
        END IF;
    ELSE
        PERFORM pg_notify('mq_' || c.n, '')
        FROM (SELECT DISTINCT n FROM unnest(channel_names) AS n
              WHERE n IS NOT NULL AND octet_length(n) <= 60) c;
    END IF;
    PERFORM pg_notify('mq', '');
END;
$$;

-- at + d, declared IMMUTABLE (timestamptz + interval is STABLE: a day's
-- length depends on the time zone). Citus ships an UPDATE to a worker only
-- when the functions it applies to a row's columns are immutable; the
-- queue's intervals have a fixed length (_mq_fixed_length), so it is. Used
-- on Citus, and in statements too rare for a call per row to matter. A
-- standard SQL body, whose operator was resolved when the schema was
-- applied: so no settings, which a call would set and restore (mq_commit
-- makes two calls a row). The planner still calls it, as it inlines no immutable function
-- around a stable operator.
CREATE OR REPLACE FUNCTION _mq_at(at timestamptz, d interval)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE
RETURN at OPERATOR(pg_catalog.+) d;

-- This transaction's id (pg_current_xact_id) where the queue's rows are,
-- for the tests of a row's locker (xmax) on the locked lane: on Citus, the
-- worker's, found by a statement that reads a queue table (Citus runs it on
-- the worker that holds the queue, in this transaction); else this server's.
CREATE OR REPLACE FUNCTION _mq_xact_id()
RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF current_setting('pqmq.citus', true) = 'on' THEN
        RETURN (SELECT pg_current_xact_id()::text::bigint FROM mq_schema_migrations LIMIT 1);
    END IF;
    RETURN pg_current_xact_id()::text::bigint;
END;
$$;

-- A function's signature with its schema and its argument types'
-- schemas, whatever the search_path: for the GRANT, REVOKE and ALTER
-- FUNCTION statements the queue builds, which a Citus coordinator forwards
-- as text to workers that resolve names under a path of their own.
CREATE OR REPLACE FUNCTION _mq_qualified(f oid)
RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    -- Only pg_catalog on the path (until this function returns): every
    -- other name comes out qualified.
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog', true);
    RETURN f::pg_catalog.regprocedure::text;
END;
$$;

-- Runs a GRANT, REVOKE or ALTER FUNCTION the queue builds (its names
-- qualified: _mq_qualified) with only pg_catalog on the search_path: a
-- Citus coordinator deparses such a statement for its workers, naming what
-- the path leaves visible without its schema, and the workers resolve
-- those names under a path of their own. Not for PUBLIC (_mq_secure).
CREATE OR REPLACE FUNCTION _mq_run_ddl(command text)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog', true);
    EXECUTE command;
END;
$$;

-- An interval with its months taken as 30 days and its days as 24 hours:
-- a fixed length, which compares and adds the same on every date.
CREATE OR REPLACE FUNCTION _mq_fixed_length(x interval)
RETURNS interval
LANGUAGE sql IMMUTABLE STRICT
SET search_path FROM CURRENT
AS $$
    SELECT x OPERATOR(pg_catalog.-) pg_catalog.make_interval(0, f.m, 0, f.d)
             OPERATOR(pg_catalog.+) pg_catalog.make_interval(hours => f.h)
    FROM (SELECT g.m, g.d, (g.m OPERATOR(pg_catalog.*) 720)
                           OPERATOR(pg_catalog.+) (g.d OPERATOR(pg_catalog.*) 24) AS h
          FROM (SELECT (pg_catalog.date_part('year', x) OPERATOR(pg_catalog.*) 12
                        OPERATOR(pg_catalog.+) pg_catalog.date_part('month', x))::int AS m,
                       pg_catalog.date_part('day', x)::int AS d) g) f
$$;
