-- schema/common.sql: limits shared by every function, and wake-ups.
-- Today's definitions; the migrations that created them must carry the same
-- text (tests/test_migrate.c compares the two). See schema/tables.sql.

-- Limits shared by every function and by the C library (include/pqmq.h).
CREATE OR REPLACE FUNCTION mq_limits(
    OUT max_batch int, OUT max_payload bigint, OUT max_duration interval)
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$ SELECT 10000, 16777216::bigint, interval '36500000 days' $$;

-- Wakes listeners of the given channels: one notification per channel on
-- mq_<channel>, plus one on mq. A channel whose notify name would be longer
-- than PostgreSQL's 63-byte limit wakes only mq. No payload data is sent.
CREATE OR REPLACE FUNCTION mq_wake(channel_names text[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF channel_names IS NULL OR cardinality(channel_names) = 0 THEN
        RETURN;
    END IF;
    PERFORM pg_notify('mq_' || c.n, '')
    FROM (SELECT DISTINCT n FROM unnest(channel_names) AS n
          WHERE n IS NOT NULL AND octet_length(n) <= 60) c;
    PERFORM pg_notify('mq', '');
END;
$$;

-- An interval with its months taken as 30 days and its days as 24 hours:
-- a fixed length, which compares and adds the same on every date.
CREATE OR REPLACE FUNCTION mq_fixed_length(x interval)
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
