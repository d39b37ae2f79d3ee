-- schema/common.sql: limits shared by every function, and wake-ups.
-- Today's definitions; the migrations that created them must carry the same
-- text (tests/test_migrate.c compares the two). See schema/tables.sql.

-- Limits shared by every function and by the C library (include/pqmq.h).
CREATE OR REPLACE FUNCTION mq_limits(
    OUT max_batch int, OUT max_payload bigint, OUT max_duration interval)
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$ SELECT 10000, 16777216::bigint, interval '3650 days' $$;

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
