-- bench/in_flight.sql: what messages in flight cost a poll. A claim of
-- logged messages moves its channels' cursors past them and writes a
-- receipt; one of mq_rows' messages leaves its place in the ready indexes
-- (a HOT update), so polls step over the short jobs in flight. This times a
-- poll of 100 over 2,000 ready messages, first alone, then behind 10,000
-- messages in flight (claimed, leases of an hour), on :channels channels
-- (default 100).
--
--   build/cli/pqmq -d CONNINFO --schema inflight migrate --create-schema
--   psql -X -d CONNINFO -v channels=100 -f bench/in_flight.sql
--
-- It empties the queue of schema "inflight" (a scratch schema).
\if :{?channels}
\else
\set channels 100
\endif
SET search_path = inflight;
SET client_min_messages = warning;
-- In batches of 100, as producers insert (plain messages: the log).
CREATE FUNCTION pg_temp.fill(n int, channels int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR b IN 0 .. (n - 1) / 100 LOOP
        PERFORM inflight.mq_insert(ARRAY(
            SELECT ROW(gen_random_uuid(), NULL, 3, interval '1 hour', 'c' || (g % channels), '',
                       NULL, false, 'n', '{}', NULL)::inflight.mq_new_t
            FROM generate_series(b * 100 + 1, LEAST(n, b * 100 + 100)) g));
    END LOOP;
END
$$;
-- Milliseconds per poll of 100, each rolled back so every poll sees the same queue.
CREATE FUNCTION pg_temp.time_polls(k int) RETURNS numeric LANGUAGE plpgsql AS $$
DECLARE
    t0    timestamptz;
    total double precision := 0;
    n     int;
BEGIN
    FOR i IN 1..k LOOP
        t0 := clock_timestamp();
        BEGIN
            SELECT count(*) INTO n FROM inflight.mq_claim(NULL, 100);
            RAISE EXCEPTION 'roll back';
        EXCEPTION WHEN raise_exception THEN NULL;
        END;
        total := total + extract(epoch FROM clock_timestamp() - t0);
    END LOOP;
    RETURN round((total / k * 1000)::numeric, 3);
END
$$;
TRUNCATE mq_rows, mq_chains, mq_log, mq_cursors, mq_cursor_keys, mq_receipts, mq_done, mq_log_gone;
SELECT pg_temp.fill(2000, :channels);
VACUUM ANALYZE mq_rows, mq_log, mq_cursors, mq_receipts, mq_done, mq_log_gone;
SELECT pg_temp.time_polls(30) AS idle_ms \gset
TRUNCATE mq_rows, mq_chains, mq_log, mq_cursors, mq_cursor_keys, mq_receipts, mq_done, mq_log_gone;
SELECT pg_temp.fill(10000, :channels);
SELECT count(*) FROM (SELECT mq_claim(NULL, 100) FROM generate_series(1, 100)) c;
SELECT pg_temp.fill(2000, :channels);
VACUUM ANALYZE mq_rows, mq_log, mq_cursors, mq_receipts, mq_done, mq_log_gone;
SELECT pg_temp.time_polls(30) AS busy_ms \gset
SELECT :channels AS channels, :idle_ms AS "ms per poll, 2,000 ready",
       :busy_ms AS "same behind 10,000 in flight",
       round(:busy_ms / :idle_ms, 2) AS ratio;
TRUNCATE mq_rows, mq_chains, mq_log, mq_cursors, mq_cursor_keys, mq_receipts, mq_done, mq_log_gone;
