-- schema/workers.sql: the runners that consume the queue (mq_workers,
-- pqmq workers, serve's dashboard). A pqmq_runner registers when it starts,
-- heartbeats every few seconds (one HOT update of its row) and leaves when
-- it stops; a runner killed without stopping stops heartbeating: it is
-- shown as gone once its heartbeat is stale_after old, and its row is
-- deleted an hour after its last heartbeat.

-- Deletes the rows of runners not seen for an hour.
CREATE OR REPLACE FUNCTION _mq_worker_prune(ts timestamptz)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM mq_workers w WHERE w.last_seen < ts - interval '1 hour';
END;
$$;

-- Registers a runner that starts, and prunes the rows of runners long gone.
-- Parameters: host, pid: where it runs; version: pqmq's; channels: those it
--   consumes (NULL: every channel); threads: its worker threads.
-- Returns: its id, for mq_worker_beat and mq_worker_leave. Duty: consume.
CREATE OR REPLACE FUNCTION mq_worker_register(host text, pid int, version text,
                                              channels text[], threads int)
RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts timestamptz := pg_catalog.clock_timestamp();
    id bigint;
BEGIN
    PERFORM _mq_worker_prune(ts);
    INSERT INTO mq_workers AS w (host, pid, version, channels, threads, started_at, last_seen)
    VALUES (pg_catalog.left(COALESCE(host, ''), 255), COALESCE(pid, 0),
            pg_catalog.left(COALESCE(version, ''), 64), channels[1:100], COALESCE(threads, 0),
            ts, ts)
    RETURNING w.id INTO id;
    RETURN id;
END;
$$;

-- A runner's heartbeat: it is alive, with these figures.
-- Parameters: worker_id (mq_worker_register's); jobs_done, jobs_failed:
--   since it started; in_flight: jobs it holds now.
-- Returns: false when its row is gone (register again). Duty: consume.
CREATE OR REPLACE FUNCTION mq_worker_beat(worker_id bigint, jobs_done bigint,
                                          jobs_failed bigint, in_flight int)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    UPDATE mq_workers w SET last_seen = pg_catalog.clock_timestamp(),
                            jobs_done = COALESCE(mq_worker_beat.jobs_done, w.jobs_done),
                            jobs_failed = COALESCE(mq_worker_beat.jobs_failed, w.jobs_failed),
                            in_flight = COALESCE(mq_worker_beat.in_flight, w.in_flight)
    WHERE w.id = worker_id;
    RETURN FOUND;
END;
$$;

-- A runner that stops takes its row away.
-- Parameters: worker_id (mq_worker_register's).
-- Returns: whether its row was there. Duty: consume.
CREATE OR REPLACE FUNCTION mq_worker_leave(worker_id bigint)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM mq_workers w WHERE w.id = worker_id;
    RETURN FOUND;
END;
$$;

-- The runners, oldest first: live while their last heartbeat is less than
-- stale_after old, else gone (killed, or cut off from the database). Rows
-- of runners not seen for an hour are deleted first.
-- Parameters: stale_after: how old a heartbeat may be (runners beat every
--   5 seconds).
-- Returns: one row per runner (seen_ago: seconds since its heartbeat).
--   Duty: administer.
CREATE OR REPLACE FUNCTION mq_workers(stale_after interval DEFAULT interval '30 seconds')
RETURNS TABLE(id bigint, host text, pid int, version text, channels text[], threads int,
              in_flight int, jobs_done bigint, jobs_failed bigint, started_at timestamptz,
              last_seen timestamptz, seen_ago double precision, live boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts timestamptz := pg_catalog.clock_timestamp();
BEGIN
    PERFORM _mq_worker_prune(ts);
    RETURN QUERY
    SELECT w.id, w.host, w.pid, w.version, w.channels, w.threads, w.in_flight, w.jobs_done,
           w.jobs_failed, w.started_at, w.last_seen,
           GREATEST(pg_catalog.date_part('epoch', ts - w.last_seen), 0),
           w.last_seen > ts - COALESCE(stale_after, interval '30 seconds')
    FROM mq_workers w
    ORDER BY w.started_at, w.id;
END;
$$;
