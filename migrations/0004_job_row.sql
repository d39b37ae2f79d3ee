-- pqmq schema, version 4: one definition of the job row.
--
-- The row a consumer gets for a job is the composite type mq_job_t, defined
-- once here and read by lib/job.c. The functions that hand out jobs return
-- it: mq_claim (the poll), mq_complete_claim (completion, then the poll, in
-- one statement) and mq_dead_jobs (dead letters as jobs). Adding a column to
-- a job is an edit of mq_job_t, of the function that fills it, and of
-- lib/job.c.
--
-- mq_poll_jobs and mq_complete_poll (versions 1 and 3) keep their result
-- columns for the clients that call them; they are now views of mq_claim.
-- Their result types stay as they were, so that every migration can still be
-- applied again over this one.

DO $$
BEGIN
    CREATE TYPE mq_job_t AS (
        id               uuid,
        is_committed     boolean,
        name             text,
        payload_json     text,
        payload_bytes    bytea,
        retry_backoff    interval,
        wait_time        interval,
        channel_name     text,
        channel_args     text,
        attempt          int,
        attempts_left    int,
        last_error       text,
        blocking         boolean
    );
EXCEPTION WHEN duplicate_object THEN
    NULL;
END
$$;

-- Claims up to batch_size ready messages (see DESIGN.md, the SQL contract).
--
-- Fairness: channels are visited from a random point of the chain-key space
-- (one random point per name when the poll names channels), taking at most a
-- quarter of the batch from each, so a busy channel cannot starve a quiet one.
-- Cost: each channel visited is one index probe (loose index scan); a budget
-- bounds the visits, and the time index fills whatever is left. Nothing here
-- groups or sorts the whole backlog.
CREATE OR REPLACE FUNCTION mq_claim(channel_names text[], batch_size int)
RETURNS SETOF mq_job_t
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Custom plans (a new session's first five calls) pick hash joins over the
-- whole table for arrays of ids; the generic plan probes the indexes.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    ts      timestamptz := clock_timestamp();
    picked  uuid[] := '{}';
    got     uuid[];
    per_key int;
    budget  int;
    nm      text;
    lo      bigint;
    hi      bigint;
    next_at timestamptz;
    max_dur interval := (mq_limits()).max_duration; -- once, not per row
BEGIN
    IF batch_size IS NULL OR batch_size < 1 OR batch_size > (mq_limits()).max_batch THEN
        RAISE EXCEPTION 'mq_poll: batch_size % is outside 1..%',
            batch_size, (mq_limits()).max_batch
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    per_key := GREATEST(1, (batch_size + 3) / 4);
    budget := 2 * batch_size + 16;

    IF channel_names IS NULL THEN
        picked := mq_pick(NULL, -9223372036854775808, 9223372036854775807,
                          per_key, batch_size, budget, picked, ts);
    ELSE
        -- Round 1 takes up to per_key from each named channel; round 2 takes
        -- more from channels that had more to give.
        FOR round IN 1..2 LOOP
            FOR nm IN SELECT d.n FROM (SELECT DISTINCT n FROM unnest(channel_names) AS n
                                      WHERE n IS NOT NULL) d
                      ORDER BY random() LOOP
                EXIT WHEN cardinality(picked) >= batch_size;
                lo := hashtext(nm)::bigint << 32;
                hi := lo | 4294967295;
                picked := mq_pick(nm, lo, hi,
                                  CASE WHEN round = 1 THEN per_key ELSE batch_size END,
                                  batch_size, budget, picked, ts);
            END LOOP;
        END LOOP;
    END IF;

    -- Unfiltered polls top up from the time index: exact and O(batch log n).
    IF channel_names IS NULL AND cardinality(picked) < batch_size THEN
        SELECT array_agg(s.id) INTO got FROM (
            SELECT m.id FROM mq_msgs m
            WHERE m.attempts > 0
              AND (m.after_message_id IS NULL
                   OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
              AND m.attempt_at <= ts
              AND m.id <> ALL (picked)
            ORDER BY m.attempt_at
            LIMIT batch_size - cardinality(picked)
            FOR NO KEY UPDATE SKIP LOCKED
        ) s;
        picked := picked || COALESCE(got, '{}');
    END IF;

    -- Not busy: a good moment to notice messages whose last lease ran out.
    IF cardinality(picked) < batch_size THEN
        PERFORM mq_reap_dead();
    END IF;

    IF cardinality(picked) > 0 THEN
        RETURN QUERY
        WITH claimed AS (
            UPDATE mq_msgs m SET
                attempt_at = ts + m.retry_backoff,
                attempts = m.attempts - 1,
                -- Doubling stops at the duration limit so it never overflows.
                retry_backoff = CASE WHEN m.retry_backoff * 2 > max_dur
                                     THEN m.retry_backoff ELSE m.retry_backoff * 2 END,
                deliveries = m.deliveries + 1
            -- Joined through unnest and looked up per id (LIMIT 1 keeps the
            -- payload lookup an index probe): plans cached while the tables
            -- were small must not turn into scans of a big backlog.
            FROM unnest(picked) AS k(id)
            WHERE m.id = k.id
            RETURNING m.id, m.commit_interval IS NULL AS committed,
                      m.attempt_at - ts AS lease, m.channel_name,
                      m.channel_args, m.deliveries, m.attempts, m.attempt_at
        )
        SELECT c.id, c.committed, p.name, p.payload_json::text, p.payload_bytes,
               c.lease, interval '0', c.channel_name, c.channel_args,
               c.deliveries, c.attempts, NULL::text, false
        FROM claimed c
        LEFT JOIN LATERAL (
            SELECT p.name, p.payload_json, p.payload_bytes FROM mq_payloads p
            WHERE p.id = c.id LIMIT 1
        ) p ON true
        ORDER BY c.attempt_at, c.id;
        RETURN;
    END IF;

    -- Nothing claimed: report when the earliest candidate becomes ready.
    IF channel_names IS NULL THEN
        SELECT min(m.attempt_at) INTO next_at FROM mq_msgs m
        WHERE m.attempts > 0
          AND (m.after_message_id IS NULL
               OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid);
    ELSE
        SELECT min(f.at) INTO next_at
        FROM (SELECT DISTINCT n FROM unnest(channel_names) AS n) c,
        LATERAL (
            SELECT m.attempt_at AS at FROM mq_msgs m
            WHERE m.attempts > 0
              AND (m.after_message_id IS NULL
                   OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
              AND m.channel_key BETWEEN hashtext(c.n)::bigint << 32
                                    AND (hashtext(c.n)::bigint << 32) | 4294967295
              AND m.channel_name = c.n
            ORDER BY m.attempt_at
            LIMIT 1
        ) f;
    END IF;
    RETURN QUERY SELECT NULL::uuid, NULL::boolean, NULL::text, NULL::text,
        NULL::bytea, NULL::interval,
        CASE WHEN next_at IS NOT NULL
             THEN GREATEST(next_at - clock_timestamp(), interval '0') END,
        NULL::text, NULL::text, NULL::int, NULL::int, NULL::text, NULL::boolean;
END;
$$;

-- Completes msg_ids (as mq_complete, fenced by msg_attempts; may be empty),
-- then claims as mq_claim: one round trip and one commit per batch. Every
-- row carries how many of msg_ids were completed (mq_claim always returns at
-- least one row). If the statement fails, neither took effect.
CREATE OR REPLACE FUNCTION mq_complete_claim(msg_ids uuid[], msg_attempts int[],
                                             channel_names text[], batch_size int)
RETURNS TABLE(job mq_job_t, completed int)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    n int := 0;
BEGIN
    IF cardinality(msg_ids) > 0 THEN
        n := mq_complete(msg_ids, msg_attempts);
    END IF;
    RETURN QUERY SELECT j, n FROM mq_claim(channel_names, batch_size) j;
END;
$$;

-- Dead letters (mq_dead_letters) as jobs, for readers of mq_job_t: attempt
-- is the number of deliveries made; no lease, no wait.
CREATE OR REPLACE FUNCTION mq_dead_jobs(channel_names text[], max_rows int)
RETURNS SETOF mq_job_t
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT d.id, true, d.name, d.payload_json, d.payload_bytes, NULL::interval,
           NULL::interval, d.channel_name, d.channel_args, d.attempts, 0,
           d.last_error, d.blocking
    FROM mq_dead_letters(channel_names, max_rows) d
$$;

-- The seed's poll, on mq_claim directly.
CREATE OR REPLACE FUNCTION mq_poll(channel_names text[], batch_size int DEFAULT 1)
RETURNS TABLE(id uuid, is_committed boolean, name text, payload_json text,
              payload_bytes bytea, retry_backoff interval, wait_time interval)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT j.id, j.is_committed, j.name, j.payload_json, j.payload_bytes,
           j.retry_backoff, j.wait_time
    FROM mq_claim(channel_names, batch_size) j
$$;

-- Version 1's poll with its columns (the C library used it before mq_claim).
CREATE OR REPLACE FUNCTION mq_poll_jobs(channel_names text[], batch_size int)
RETURNS TABLE(id uuid, is_committed boolean, name text, payload_json text,
              payload_bytes bytea, retry_backoff interval, wait_time interval,
              channel_name text, channel_args text, attempt int,
              attempts_left int)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT j.id, j.is_committed, j.name, j.payload_json, j.payload_bytes,
           j.retry_backoff, j.wait_time, j.channel_name, j.channel_args,
           j.attempt, j.attempts_left
    FROM mq_claim(channel_names, batch_size) j
$$;

-- Version 3's completing poll with its columns.
CREATE OR REPLACE FUNCTION mq_complete_poll(msg_ids uuid[], msg_attempts int[],
                                            channel_names text[], batch_size int)
RETURNS TABLE(id uuid, is_committed boolean, name text, payload_json text,
              payload_bytes bytea, retry_backoff interval, wait_time interval,
              channel_name text, channel_args text, attempt int,
              attempts_left int, completed int)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT (c.job).id, (c.job).is_committed, (c.job).name, (c.job).payload_json,
           (c.job).payload_bytes, (c.job).retry_backoff, (c.job).wait_time,
           (c.job).channel_name, (c.job).channel_args, (c.job).attempt,
           (c.job).attempts_left, c.completed
    FROM mq_complete_claim(msg_ids, msg_attempts, channel_names, batch_size) c
$$;

INSERT INTO mq_schema_migrations (version, name)
VALUES (4, '0004_job_row')
ON CONFLICT (version) DO NOTHING;
