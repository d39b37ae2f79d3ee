-- pqmq schema, version 1.
--
-- Objects are created in the first schema of the current search_path, and every
-- function pins that path (SET search_path FROM CURRENT), so a client only needs
-- the queue's schema on its own search_path to call them unqualified.
-- Applying this file twice is harmless: every statement is guarded.
--
-- Vocabulary used below:
--   candidate  a row a poll may claim: attempts left, and unordered or the head
--              of its chain (after_message_id NULL or the nil UUID)
--   lease      attempt_at of a claimed message: it is redelivered after it
--   chain      the ordered messages of one (channel_name, channel_args)
--   chain key  (hashtext(channel_name) << 32) | hashtext(channel_args): groups a
--              channel's rows together in an index and spreads channels
--              uniformly, so a poll can start at a random channel

CREATE TABLE IF NOT EXISTS mq_schema_migrations (
    version    int PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

DO $$
BEGIN
    CREATE TYPE mq_new_t AS (
        id               uuid,
        delay            interval,
        retries          int,
        retry_backoff    interval,
        channel_name     text,
        channel_args     text,
        commit_interval  interval,
        ordered          boolean,
        name             text,
        payload_json     text,
        payload_bytes    bytea
    );
EXCEPTION WHEN duplicate_object THEN
    NULL;
END
$$;

-- The small, hot row: everything a poll reads and writes.
CREATE TABLE IF NOT EXISTS mq_msgs (
    id               uuid PRIMARY KEY,
    created_at       timestamptz NOT NULL DEFAULT now(),
    attempt_at       timestamptz NOT NULL DEFAULT now(),
    attempts         int NOT NULL DEFAULT 5,
    retry_backoff    interval NOT NULL DEFAULT interval '1 second',
    channel_name     text NOT NULL,
    channel_args     text NOT NULL DEFAULT '',
    commit_interval  interval,
    after_message_id uuid,
    -- How many times the message has been claimed: the attempt number a
    -- consumer sees, and what lets mq_commit tell "pending" from "delivered".
    deliveries       int NOT NULL DEFAULT 0,
    -- When the message ran out of attempts (set by mq_fail or mq_reap_dead);
    -- NULL while it may still be delivered.
    dead_since       timestamptz,
    channel_key      bigint GENERATED ALWAYS AS (
        (hashtext(channel_name)::bigint << 32)
        | (hashtext(channel_args)::bigint & 4294967295)
    ) STORED
);

-- Polls walk this index channel by channel (loose index scan on channel_key)
-- and take each channel's oldest ready rows.
CREATE INDEX IF NOT EXISTS mq_msgs_candidates_by_channel
    ON mq_msgs (channel_key, attempt_at)
    WHERE attempts > 0
      AND (after_message_id IS NULL
           OR after_message_id = '00000000-0000-0000-0000-000000000000'::uuid);

-- The exact ready set in time order: fills a batch and answers wait_time.
CREATE INDEX IF NOT EXISTS mq_msgs_candidates_by_time
    ON mq_msgs (attempt_at)
    WHERE attempts > 0
      AND (after_message_id IS NULL
           OR after_message_id = '00000000-0000-0000-0000-000000000000'::uuid);

-- A chain never forks: each message has at most one successor.
CREATE UNIQUE INDEX IF NOT EXISTS mq_msgs_successor
    ON mq_msgs (after_message_id)
    WHERE after_message_id IS NOT NULL
      AND after_message_id <> '00000000-0000-0000-0000-000000000000'::uuid;

-- Messages on their final attempt, found when their lease runs out.
CREATE INDEX IF NOT EXISTS mq_msgs_final_attempt
    ON mq_msgs (attempt_at)
    WHERE attempts = 0 AND dead_since IS NULL;

-- Dead letters, oldest first.
CREATE INDEX IF NOT EXISTS mq_msgs_dead
    ON mq_msgs (dead_since)
    WHERE dead_since IS NOT NULL;

-- A queue table churns: vacuum it early and without throttling.
ALTER TABLE mq_msgs SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);

-- The large, cold row: written once, read once per delivery.
CREATE TABLE IF NOT EXISTS mq_payloads (
    id            uuid PRIMARY KEY,
    name          text NOT NULL,
    payload_json  jsonb,
    payload_bytes bytea,
    last_error    text
);

-- (Guarded: since migration 0011 mq_payloads is a view of mq_msgs, and
-- this file must still apply over it.)
DO $$
BEGIN
    IF (SELECT c.relkind FROM pg_catalog.pg_class c
        WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('mq_payloads')) = 'r' THEN
        ALTER TABLE mq_payloads SET (
            autovacuum_vacuum_scale_factor = 0.02,
            autovacuum_vacuum_threshold = 500,
            autovacuum_vacuum_cost_delay = 0
        );
    END IF;
END
$$;

-- The last message appended to each non-empty chain. Only touched while the
-- chain's advisory lock is held (see mq_insert and mq_delete).
CREATE TABLE IF NOT EXISTS mq_chains (
    channel_name text NOT NULL,
    channel_args text NOT NULL,
    tail_id      uuid NOT NULL,
    channel_key  bigint GENERATED ALWAYS AS (
        (hashtext(channel_name)::bigint << 32)
        | (hashtext(channel_args)::bigint & 4294967295)
    ) STORED
);

CREATE INDEX IF NOT EXISTS mq_chains_key ON mq_chains (channel_key);

-- Limits shared by every function and by the C library (include/pqmq.h).
CREATE OR REPLACE FUNCTION mq_limits(
    OUT max_batch int, OUT max_payload bigint, OUT max_duration interval)
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$ SELECT 10000, 16777216::bigint, interval '3650 days' $$;

-- Serializes producers (and mq_complete, mq_skip) per chain: the advisory
-- locks of the chains the batch appends to, in key order against deadlock.
CREATE OR REPLACE FUNCTION mq_lock_new_chains(new_messages mq_new_t[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(k.a, k.b)
    FROM (
        SELECT DISTINCT hashtext(t.channel_name) AS a,
                        hashtext(COALESCE(t.channel_args, '')) AS b
        FROM unnest(new_messages) AS t
        WHERE t.ordered
        ORDER BY 1, 2
    ) k;
END;
$$;

-- Records each touched chain's new tail: the batch's last message on it.
-- Called by mq_insert under the chains' locks.
CREATE OR REPLACE FUNCTION mq_record_tails(new_messages mq_new_t[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    WITH last AS (
        SELECT DISTINCT ON (t.channel_name, COALESCE(t.channel_args, ''))
               t.channel_name, COALESCE(t.channel_args, '') AS args, t.id
        FROM unnest(new_messages) WITH ORDINALITY AS t
        WHERE t.ordered
        ORDER BY t.channel_name, COALESCE(t.channel_args, ''), t.ordinality DESC
    ),
    moved AS (
        UPDATE mq_chains c SET tail_id = l.id
        FROM last l
        WHERE c.channel_key = ((hashtext(l.channel_name)::bigint << 32)
                               | (hashtext(l.args)::bigint & 4294967295))
          AND c.channel_name = l.channel_name
          AND c.channel_args = l.args
        RETURNING c.channel_name, c.channel_args
    )
    INSERT INTO mq_chains (channel_name, channel_args, tail_id)
    SELECT l.channel_name, l.args, l.id
    FROM last l
    WHERE NOT EXISTS (SELECT 1 FROM moved mv
                      WHERE mv.channel_name = l.channel_name
                        AND mv.channel_args = l.args);
END;
$$;

-- Inserts a batch in one statement: all of it, or (on any error) none of it.
CREATE OR REPLACE FUNCTION mq_insert(new_messages mq_new_t[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Custom plans (a new session's first five calls) pick hash joins over the
-- whole table for arrays of ids; the generic plan probes the indexes.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    ts      timestamptz := clock_timestamp();
    lim     record;
    bad     record;
    chans   text[];
    has_ordered boolean;
BEGIN
    IF new_messages IS NULL OR cardinality(new_messages) = 0 THEN
        RETURN;
    END IF;
    lim := mq_limits();
    IF cardinality(new_messages) > lim.max_batch THEN
        RAISE EXCEPTION 'mq_insert: batch of % messages is over the limit of %',
            cardinality(new_messages), lim.max_batch
            USING ERRCODE = 'program_limit_exceeded';
    END IF;

    -- Reject the whole batch on the first bad message, naming it.
    SELECT m.ord, m.why INTO bad
    FROM (
        SELECT t.ordinality AS ord, CASE
            WHEN t.id IS NULL THEN 'id is NULL'
            WHEN t.id = '00000000-0000-0000-0000-000000000000'::uuid
                THEN 'id is the nil UUID'
            WHEN t.channel_name IS NULL OR t.channel_name = ''
                THEN 'channel_name is NULL or empty'
            WHEN t.retries < 0 THEN 'retries is negative'
            WHEN t.delay < interval '0' THEN 'delay is negative'
            WHEN t.delay > lim.max_duration THEN 'delay is over 3650 days'
            WHEN t.retry_backoff <= interval '0'
                THEN 'retry_backoff is not positive'
            WHEN t.retry_backoff > lim.max_duration
                THEN 'retry_backoff is over 3650 days'
            WHEN t.commit_interval < interval '0'
                THEN 'commit_interval is negative'
            WHEN t.commit_interval > lim.max_duration
                THEN 'commit_interval is over 3650 days'
            WHEN octet_length(t.payload_json) > lim.max_payload
                THEN 'payload_json is over 16 MiB'
            WHEN octet_length(t.payload_bytes) > lim.max_payload
                THEN 'payload_bytes is over 16 MiB'
            END AS why
        FROM unnest(new_messages) WITH ORDINALITY AS t
    ) m
    WHERE m.why IS NOT NULL
    ORDER BY m.ord
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'mq_insert: message % of the batch: %', bad.ord, bad.why
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    has_ordered := EXISTS (SELECT 1 FROM unnest(new_messages) AS t WHERE t.ordered);

    IF has_ordered THEN
        PERFORM mq_lock_new_chains(new_messages);
    END IF;

    INSERT INTO mq_payloads (id, name, payload_json, payload_bytes)
    SELECT t.id, COALESCE(t.name, ''), t.payload_json::jsonb, t.payload_bytes
    FROM unnest(new_messages) AS t;

    IF NOT has_ordered THEN
        -- No chains to extend: a plain insert.
        INSERT INTO mq_msgs (id, created_at, attempt_at, attempts, retry_backoff,
                             channel_name, channel_args, commit_interval)
        SELECT t.id, ts,
               ts + COALESCE(t.delay, interval '0')
                  + COALESCE(t.commit_interval, interval '0'),
               LEAST(COALESCE(t.retries, 4)::bigint + 1, 2147483647)::int,
               COALESCE(t.retry_backoff, interval '1 second'),
               t.channel_name, COALESCE(t.channel_args, ''), t.commit_interval
        FROM unnest(new_messages) AS t;
    ELSE
        WITH batch AS (
            SELECT t.*, COALESCE(t.channel_args, '') AS args
            FROM unnest(new_messages) WITH ORDINALITY AS t(
                id, delay, retries, retry_backoff, channel_name, channel_args,
                commit_interval, ordered, name, payload_json, payload_bytes, ord)
        ),
        -- The live tail of each chain this batch appends to.
        -- (LATERAL ... LIMIT 1: an index probe per chain, whatever the plan.)
        tails AS (
            SELECT w.channel_name, w.args AS channel_args, t.tail_id
            FROM (SELECT DISTINCT b.channel_name, b.args FROM batch b WHERE b.ordered) w,
            LATERAL (
                SELECT c.tail_id FROM mq_chains c
                JOIN mq_msgs m ON m.id = c.tail_id
                WHERE c.channel_key = ((hashtext(w.channel_name)::bigint << 32)
                                       | (hashtext(w.args)::bigint & 4294967295))
                  AND c.channel_name = w.channel_name
                  AND c.channel_args = w.args
                LIMIT 1
            ) t
        )
        INSERT INTO mq_msgs (id, created_at, attempt_at, attempts, retry_backoff,
                             channel_name, channel_args, commit_interval,
                             after_message_id)
        SELECT b.id, ts,
               ts + COALESCE(b.delay, interval '0')
                  + COALESCE(b.commit_interval, interval '0'),
               LEAST(COALESCE(b.retries, 4)::bigint + 1, 2147483647)::int,
               COALESCE(b.retry_backoff, interval '1 second'),
               b.channel_name, b.args, b.commit_interval,
               CASE WHEN b.ordered THEN COALESCE(
                   lag(b.id) OVER chain,
                   tl.tail_id,
                   '00000000-0000-0000-0000-000000000000'::uuid)
               END
        FROM batch b
        LEFT JOIN tails tl
          ON b.ordered AND tl.channel_name = b.channel_name AND tl.channel_args = b.args
        WINDOW chain AS (PARTITION BY b.ordered, b.channel_name, b.args ORDER BY b.ord)
        ORDER BY b.ord;
    END IF;

    IF has_ordered THEN
        PERFORM mq_record_tails(new_messages);
    END IF;

    SELECT array_agg(DISTINCT t.channel_name) INTO chans
    FROM unnest(new_messages) AS t;
    PERFORM mq_wake(chans);
END;
$$;

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

-- Claims up to batch_size ready messages (see DESIGN.md section 2).
--
-- Fairness: channels are visited from a random point of the chain-key space
-- (one random point per name when the poll names channels), taking at most a
-- quarter of the batch from each, so a busy channel cannot starve a quiet one.
-- Cost: each channel visited is one index probe (loose index scan); a budget
-- bounds the visits, and the time index fills whatever is left. Nothing here
-- groups or sorts the whole backlog.
CREATE OR REPLACE FUNCTION mq_poll_jobs(channel_names text[], batch_size int)
RETURNS TABLE(id uuid, is_committed boolean, name text, payload_json text,
              payload_bytes bytea, retry_backoff interval, wait_time interval,
              channel_name text, channel_args text, attempt int,
              attempts_left int)
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
        FOR nm IN SELECT d.n FROM (SELECT DISTINCT n FROM unnest(channel_names) AS n
                                  WHERE n IS NOT NULL) d
                  ORDER BY random() LOOP
            EXIT WHEN cardinality(picked) >= batch_size;
            lo := hashtext(nm)::bigint << 32;
            hi := lo | 4294967295;
            picked := mq_pick(nm, lo, hi, per_key, batch_size, budget, picked, ts);
        END LOOP;
        -- A second round takes more from channels that had more to give.
        IF cardinality(picked) < batch_size THEN
            FOR nm IN SELECT d.n FROM (SELECT DISTINCT n FROM unnest(channel_names) AS n
                                      WHERE n IS NOT NULL) d
                      ORDER BY random() LOOP
                EXIT WHEN cardinality(picked) >= batch_size;
                lo := hashtext(nm)::bigint << 32;
                hi := lo | 4294967295;
                picked := mq_pick(nm, lo, hi, batch_size, batch_size, budget,
                                  picked, ts);
            END LOOP;
        END IF;
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
               c.deliveries, c.attempts
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
        NULL::text, NULL::text, NULL::int, NULL::int;
END;
$$;

-- One visit of the channels whose chain key lies in [lo, hi], starting at a
-- random key and wrapping around once: takes up to per_key ready messages
-- from each channel, up to `want` in all, visiting at most `budget` channels
-- per direction. Locks what it returns (FOR NO KEY UPDATE SKIP LOCKED), so
-- concurrent pollers skip each other's rows instead of waiting.
CREATE OR REPLACE FUNCTION mq_pick(only_name text, lo bigint, hi bigint,
                                   per_key int, want int, budget int,
                                   picked uuid[], ts timestamptz)
RETURNS uuid[]
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    start bigint := LEAST(hi::numeric, lo::numeric
                          + floor(random() * (hi::numeric - lo::numeric + 1)))::bigint;
    got   uuid[];
BEGIN
    SELECT array_agg(j.id) INTO got FROM (
        WITH RECURSIVE up(k, n) AS (
            SELECT (SELECT m.channel_key FROM mq_msgs m
                    WHERE m.attempts > 0
                      AND (m.after_message_id IS NULL
                           OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                      AND m.channel_key >= start AND m.channel_key <= hi
                    ORDER BY m.channel_key LIMIT 1), 1
            UNION ALL
            SELECT (SELECT m.channel_key FROM mq_msgs m
                    WHERE m.attempts > 0
                      AND (m.after_message_id IS NULL
                           OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                      AND m.channel_key > up.k AND m.channel_key <= hi
                    ORDER BY m.channel_key LIMIT 1), up.n + 1
            FROM up WHERE up.k IS NOT NULL AND up.n < budget
        ),
        around(k, n) AS (
            SELECT (SELECT m.channel_key FROM mq_msgs m
                    WHERE m.attempts > 0
                      AND (m.after_message_id IS NULL
                           OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                      AND m.channel_key >= lo AND m.channel_key < start
                    ORDER BY m.channel_key LIMIT 1), 1
            UNION ALL
            SELECT (SELECT m.channel_key FROM mq_msgs m
                    WHERE m.attempts > 0
                      AND (m.after_message_id IS NULL
                           OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                      AND m.channel_key > around.k AND m.channel_key < start
                    ORDER BY m.channel_key LIMIT 1), around.n + 1
            FROM around WHERE around.k IS NOT NULL AND around.n < budget
        )
        SELECT r.id
        FROM (SELECT up.k FROM up WHERE up.k IS NOT NULL
              UNION ALL
              SELECT around.k FROM around WHERE around.k IS NOT NULL) ks,
        LATERAL (
            SELECT m.id FROM mq_msgs m
            WHERE m.channel_key = ks.k
              AND m.attempts > 0
              AND (m.after_message_id IS NULL
                   OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
              AND m.attempt_at <= ts
              AND (only_name IS NULL OR m.channel_name = only_name)
              AND m.id <> ALL (picked)
            ORDER BY m.attempt_at
            LIMIT per_key
            FOR NO KEY UPDATE SKIP LOCKED
        ) r
        LIMIT want - cardinality(picked)
    ) j;
    RETURN picked || COALESCE(got, '{}');
END;
$$;

-- The seed's polling entry point, same signature; the C library calls
-- mq_poll_jobs for the extra columns.
CREATE OR REPLACE FUNCTION mq_poll(channel_names text[], batch_size int DEFAULT 1)
RETURNS TABLE(id uuid, is_committed boolean, name text, payload_json text,
              payload_bytes bytea, retry_backoff interval, wait_time interval)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT j.id, j.is_committed, j.name, j.payload_json, j.payload_bytes,
           j.retry_backoff, j.wait_time
    FROM mq_poll_jobs(channel_names, batch_size) j
$$;

-- Second phase of a two-phase insert: the messages become ready at once
-- (or when their delay ends) and listeners are woken.
CREATE OR REPLACE FUNCTION mq_commit(msg_ids uuid[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    chans text[];
BEGIN
    WITH c AS (
        UPDATE mq_msgs m SET
            attempt_at = CASE WHEN m.deliveries = 0
                              THEN m.attempt_at - m.commit_interval
                              ELSE m.attempt_at END,
            commit_interval = NULL
        WHERE m.id = ANY (msg_ids)
          AND m.commit_interval IS NOT NULL
        RETURNING m.channel_name
    )
    SELECT array_agg(DISTINCT c.channel_name) INTO chans FROM c;
    PERFORM mq_wake(chans);
END;
$$;

-- Deletes messages: completion, or cancellation of pending ones. Deleting any
-- member of a chain links its successor to its nearest surviving predecessor,
-- so the rest of the chain keeps its order.
CREATE OR REPLACE FUNCTION mq_delete(msg_ids uuid[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM mq_complete(msg_ids);
END;
$$;

-- mq_delete that returns how many messages it deleted. With msg_attempts
-- (one per id: the attempt number the consumer got) a message is deleted
-- only if it is still on that attempt: a consumer whose lease ran out and
-- whose message was delivered again cannot complete it for the new owner.
-- A consumer completing inside its own transaction rolls back on a short
-- count.
CREATE OR REPLACE FUNCTION mq_complete(msg_ids uuid[], msg_attempts int[] DEFAULT NULL)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Custom plans (a new session's first five calls) pick hash joins over the
-- whole table for arrays of ids; the generic plan probes the indexes.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    n       int;
    g_id    uuid[];
    g_after uuid[];
    g_name  text[];
    g_args  text[];
BEGIN
    IF msg_ids IS NULL OR cardinality(msg_ids) = 0 THEN
        RETURN 0;
    END IF;
    IF msg_attempts IS NOT NULL AND cardinality(msg_attempts) <> cardinality(msg_ids) THEN
        RAISE EXCEPTION 'mq_complete: % ids but % attempt numbers',
            cardinality(msg_ids), cardinality(msg_attempts)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Unordered messages need no chain lock: they go first, and usually
    -- that is all there is.
    WITH want AS (
        SELECT * FROM unnest(msg_ids, msg_attempts) AS u(id, attempt)
    ),
    gone AS (
        DELETE FROM mq_msgs m USING want w
        WHERE m.id = w.id
          AND m.after_message_id IS NULL
          AND (w.attempt IS NULL OR m.deliveries = w.attempt)
        RETURNING m.id
    ),
    cold AS (
        DELETE FROM mq_payloads p USING gone g WHERE p.id = g.id
    )
    SELECT count(*) INTO n FROM gone;
    IF n = cardinality(msg_ids) THEN
        RETURN n;
    END IF;

    PERFORM mq_lock_chains(msg_ids);
    WITH want AS (
        SELECT * FROM unnest(msg_ids, msg_attempts) AS u(id, attempt)
    ),
    gone AS (
        DELETE FROM mq_msgs m USING want w
        WHERE m.id = w.id
          AND m.after_message_id IS NOT NULL
          AND (w.attempt IS NULL OR m.deliveries = w.attempt)
        RETURNING m.id, m.after_message_id, m.channel_name, m.channel_args
    ),
    cold AS (
        DELETE FROM mq_payloads p USING gone g WHERE p.id = g.id
    )
    SELECT array_agg(g.id), array_agg(g.after_message_id),
           array_agg(g.channel_name), array_agg(g.channel_args)
    INTO g_id, g_after, g_name, g_args
    FROM gone g;

    IF g_id IS NOT NULL THEN
        PERFORM mq_wake(mq_unlink(g_id, g_after, g_name, g_args));
    END IF;
    RETURN n + COALESCE(cardinality(g_id), 0);
END;
$$;

-- Takes the advisory locks of the chains the given messages belong to, in
-- key order (as mq_insert does): chain structure changes only under them.
CREATE OR REPLACE FUNCTION mq_lock_chains(msg_ids uuid[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(k.a, k.b)
    FROM (
        SELECT DISTINCT hashtext(m.channel_name) AS a, hashtext(m.channel_args) AS b
        FROM mq_msgs m
        WHERE m.id = ANY (msg_ids) AND m.after_message_id IS NOT NULL
        ORDER BY 1, 2
    ) k;
END;
$$;

-- Repairs chains after members left them (deleted, or detached by mq_skip):
-- each successor is linked to its nearest predecessor that stayed, and a
-- chain's recorded tail moves back the same way (an emptied chain is
-- forgotten). Arrays: the members that left, with their old predecessor,
-- channel and args. Returns the channels whose chain got a new head.
-- Callers hold the chains' locks (mq_lock_chains).
CREATE OR REPLACE FUNCTION mq_unlink(g_id uuid[], g_after uuid[], g_name text[],
                                     g_args text[])
RETURNS text[]
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    r_id    uuid[];
    r_pred  uuid[];
    r_name  text[];
    r_args  text[];
    chans   text[];
BEGIN
    WITH RECURSIVE g AS (
        SELECT * FROM unnest(g_id, g_after, g_name, g_args) AS u(id, after, cn, ca)
    ),
    walk(id, pred, cn, ca) AS (
        SELECT g.id, g.after, g.cn, g.ca FROM g
        UNION ALL
        SELECT w.id, g.after, w.cn, w.ca FROM walk w JOIN g ON g.id = w.pred
    )
    SELECT array_agg(w.id), array_agg(w.pred), array_agg(w.cn), array_agg(w.ca)
    INTO r_id, r_pred, r_name, r_args
    FROM walk w
    WHERE NOT (w.pred = ANY (g_id));

    WITH moved AS (
        UPDATE mq_msgs s SET after_message_id = r.pred
        FROM unnest(r_id, r_pred) AS r(id, pred)
        WHERE s.after_message_id = r.id
          -- (the predicate of mq_msgs_successor, so that index is used)
          AND s.after_message_id IS NOT NULL
          AND s.after_message_id <> '00000000-0000-0000-0000-000000000000'::uuid
        RETURNING s.channel_name, r.pred
    )
    SELECT array_agg(DISTINCT mv.channel_name) INTO chans
    FROM moved mv
    WHERE mv.pred = '00000000-0000-0000-0000-000000000000'::uuid;

    WITH r AS (
        SELECT * FROM unnest(r_id, r_pred, r_name, r_args) AS u(id, pred, cn, ca)
    ),
    handed AS (
        UPDATE mq_chains c SET tail_id = r.pred
        FROM r
        WHERE c.channel_key = ((hashtext(r.cn)::bigint << 32)
                               | (hashtext(r.ca)::bigint & 4294967295))
          AND c.channel_name = r.cn
          AND c.channel_args = r.ca
          AND c.tail_id = r.id
          AND r.pred <> '00000000-0000-0000-0000-000000000000'::uuid
    )
    DELETE FROM mq_chains c
    USING r
    WHERE c.channel_key = ((hashtext(r.cn)::bigint << 32)
                           | (hashtext(r.ca)::bigint & 4294967295))
      AND c.channel_name = r.cn
      AND c.channel_args = r.ca
      AND c.tail_id = r.id
      AND r.pred = '00000000-0000-0000-0000-000000000000'::uuid;
    RETURN chans;
END;
$$;

-- Hands claimed messages back unstarted (a runner stopping with jobs still
-- queued): ready again at once, with the attempt refunded. Only the given
-- delivery (attempt number) of a message still leased is released.
CREATE OR REPLACE FUNCTION mq_release(msg_ids uuid[], msg_attempts int[])
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts    timestamptz := clock_timestamp();
    n     int;
    chans text[];
BEGIN
    WITH r AS (
        UPDATE mq_msgs m SET
            attempt_at = ts,
            attempts = m.attempts + 1,
            deliveries = m.deliveries - 1,
            retry_backoff = m.retry_backoff / 2,
            dead_since = NULL
        FROM unnest(msg_ids, msg_attempts) AS u(id, attempt)
        WHERE m.id = u.id
          AND m.deliveries = u.attempt
          AND m.attempt_at > ts
        RETURNING m.channel_name
    )
    SELECT count(*), array_agg(DISTINCT r.channel_name) INTO n, chans FROM r;
    PERFORM mq_wake(chans);
    RETURN n;
END;
$$;

-- Pushes the lease of in-flight messages (or the commit deadline of pending
-- two-phase messages) to now + duration. Never shortens a lease, and never
-- touches a message whose lease already ran out: that one belongs to the
-- next poll (or, with no attempts left, is dead and stays dead).
CREATE OR REPLACE FUNCTION mq_keep_alive(msg_ids uuid[], duration interval)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM mq_keep_alive_count(msg_ids, duration);
END;
$$;

-- mq_keep_alive that reports how many messages it extended.
CREATE OR REPLACE FUNCTION mq_keep_alive_count(msg_ids uuid[], duration interval)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts timestamptz := clock_timestamp();
    n  int;
BEGIN
    IF duration IS NULL OR duration < interval '0'
       OR duration > (mq_limits()).max_duration THEN
        RAISE EXCEPTION 'mq_keep_alive: duration % is outside 0..3650 days', duration
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- SKIP LOCKED: a row locked by a consumer's open transaction is not
    -- waited for (pollers skip it too, so it cannot be redelivered meanwhile).
    UPDATE mq_msgs m SET
        attempt_at = ts + duration,
        commit_interval = CASE WHEN m.deliveries = 0 AND m.commit_interval IS NOT NULL
                               THEN m.commit_interval + ((ts + duration) - m.attempt_at)
                               ELSE m.commit_interval END
    FROM (SELECT l.id FROM mq_msgs l
          WHERE l.id = ANY (msg_ids)
            AND l.attempt_at > ts
            AND l.attempt_at < ts + duration
          FOR NO KEY UPDATE SKIP LOCKED) held
    WHERE m.id = held.id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;

-- Keep-alive plus progress: replaces the payload where a new one is given and
-- grants extra_retries more deliveries. Only a delivered message whose lease
-- is still running is touched, so a dead message is never revived.
CREATE OR REPLACE FUNCTION mq_checkpoint(msg_id uuid, duration interval,
                                         new_payload_json text,
                                         new_payload_bytes bytea,
                                         extra_retries int)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM mq_checkpoint_found(msg_id, duration, new_payload_json,
                                new_payload_bytes, extra_retries);
END;
$$;

-- mq_checkpoint that reports whether the message was found holding a lease.
CREATE OR REPLACE FUNCTION mq_checkpoint_found(msg_id uuid, duration interval,
                                               new_payload_json text,
                                               new_payload_bytes bytea,
                                               extra_retries int)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts timestamptz := clock_timestamp();
BEGIN
    IF duration IS NULL OR duration < interval '0'
       OR duration > (mq_limits()).max_duration THEN
        RAISE EXCEPTION 'mq_checkpoint: duration % is outside 0..3650 days', duration
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF extra_retries < 0 THEN
        RAISE EXCEPTION 'mq_checkpoint: extra_retries % is negative', extra_retries
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(new_payload_json) > (mq_limits()).max_payload
       OR octet_length(new_payload_bytes) > (mq_limits()).max_payload THEN
        RAISE EXCEPTION 'mq_checkpoint: payload is over 16 MiB'
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    UPDATE mq_msgs m SET
        attempt_at = GREATEST(m.attempt_at, ts + duration),
        attempts = LEAST(m.attempts::bigint + COALESCE(extra_retries, 0),
                         2147483647)::int
    WHERE m.id = msg_id
      AND m.deliveries > 0
      AND m.attempt_at > ts;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF new_payload_json IS NOT NULL OR new_payload_bytes IS NOT NULL THEN
        UPDATE mq_payloads p SET
            payload_json = COALESCE(new_payload_json::jsonb, p.payload_json),
            payload_bytes = COALESCE(new_payload_bytes, p.payload_bytes)
        WHERE p.id = msg_id;
    END IF;
    RETURN true;
END;
$$;

-- Records why an attempt failed and schedules the retry one backoff from now
-- (the backoff of the attempt that failed). With no attempts left the
-- message is dead at once: kept, never delivered again, announced on mq_dead.
-- With an attempt number, only that delivery may fail the message.
CREATE OR REPLACE FUNCTION mq_fail(msg_id uuid, error text, msg_attempt int DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts   timestamptz := clock_timestamp();
    dead boolean;
BEGIN
    UPDATE mq_msgs m SET
        attempt_at = CASE WHEN m.attempts > 0
                          THEN ts + m.retry_backoff / 2
                          ELSE ts END,
        dead_since = CASE WHEN m.attempts > 0 THEN NULL ELSE ts END
    WHERE m.id = msg_id
      AND m.deliveries > 0
      AND m.attempt_at > ts
      AND (msg_attempt IS NULL OR m.deliveries = msg_attempt)
    RETURNING m.attempts = 0 INTO dead;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE mq_payloads p SET last_error = left(error, 10000) WHERE p.id = msg_id;
    IF dead THEN
        PERFORM pg_notify('mq_dead', '');
    END IF;
    RETURN true;
END;
$$;

-- Marks the messages whose final lease ran out as dead and announces them
-- on mq_dead. Cheap (a tiny partial index); polls call it when idle, and
-- mq_dead_letters before listing. Returns how many it marked.
CREATE OR REPLACE FUNCTION mq_reap_dead()
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts timestamptz := clock_timestamp();
    n  int;
BEGIN
    UPDATE mq_msgs m SET dead_since = m.attempt_at
    FROM (SELECT l.id FROM mq_msgs l
          WHERE l.attempts = 0 AND l.dead_since IS NULL AND l.attempt_at <= ts
          FOR NO KEY UPDATE SKIP LOCKED) d
    WHERE m.id = d.id;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM pg_notify('mq_dead', '');
    END IF;
    RETURN n;
END;
$$;

-- Lists dead messages (oldest first): those that ran out of attempts and
-- were never completed. blocking: it still heads an ordered chain, which
-- waits behind it until mq_retry or mq_skip.
CREATE OR REPLACE FUNCTION mq_dead_letters(channel_names text[], max_rows int DEFAULT 100)
RETURNS TABLE(id uuid, channel_name text, channel_args text, name text,
              attempts int, last_error text, dead_since timestamptz,
              blocking boolean, payload_json text, payload_bytes bytea)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > (mq_limits()).max_batch THEN
        RAISE EXCEPTION 'mq_dead_letters: max_rows % is outside 1..%',
            max_rows, (mq_limits()).max_batch
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM mq_reap_dead();
    RETURN QUERY
    SELECT m.id, m.channel_name, m.channel_args, p.name, m.deliveries,
           p.last_error, m.dead_since, m.after_message_id IS NOT NULL,
           p.payload_json::text, p.payload_bytes
    FROM mq_msgs m
    LEFT JOIN mq_payloads p ON p.id = m.id
    WHERE m.dead_since IS NOT NULL
      AND (channel_names IS NULL OR m.channel_name = ANY (channel_names))
    ORDER BY m.dead_since, m.id
    LIMIT max_rows;
END;
$$;

-- Gives dead messages `retries` more retries (retries + 1 deliveries), ready
-- now. A dead chain head delivered again keeps its chain's order.
CREATE OR REPLACE FUNCTION mq_retry(msg_ids uuid[], retries int DEFAULT 0)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts    timestamptz := clock_timestamp();
    chans text[];
    n     int;
BEGIN
    IF retries IS NULL OR retries < 0 OR retries > 2147483646 THEN
        RAISE EXCEPTION 'mq_retry: retries % is outside 0..2147483646', retries
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM mq_reap_dead();
    WITH r AS (
        UPDATE mq_msgs m SET attempts = retries + 1, attempt_at = ts, dead_since = NULL
        WHERE m.id = ANY (msg_ids) AND m.dead_since IS NOT NULL
        RETURNING m.channel_name
    )
    SELECT count(*), array_agg(DISTINCT r.channel_name) INTO n, chans FROM r;
    PERFORM mq_wake(chans);
    RETURN n;
END;
$$;

-- Moves ordered messages out of their chains into the dead letters (kept,
-- never delivered again) and releases the next message of each chain.
-- This is how a chain blocked by a dead head moves on.
CREATE OR REPLACE FUNCTION mq_skip(msg_ids uuid[])
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts      timestamptz := clock_timestamp();
    g_id    uuid[];
    g_after uuid[];
    g_name  text[];
    g_args  text[];
BEGIN
    IF msg_ids IS NULL OR cardinality(msg_ids) = 0 THEN
        RETURN 0;
    END IF;
    PERFORM mq_lock_chains(msg_ids);
    WITH old AS (
        SELECT l.id, l.after_message_id AS after FROM mq_msgs l
        WHERE l.id = ANY (msg_ids) AND l.after_message_id IS NOT NULL
        FOR UPDATE
    ),
    moved AS (
        UPDATE mq_msgs m SET after_message_id = NULL, attempts = 0,
                             attempt_at = LEAST(m.attempt_at, ts),
                             dead_since = COALESCE(m.dead_since, ts)
        FROM old
        WHERE m.id = old.id
        RETURNING m.id, old.after, m.channel_name, m.channel_args
    )
    SELECT array_agg(mv.id), array_agg(mv.after), array_agg(mv.channel_name),
           array_agg(mv.channel_args)
    INTO g_id, g_after, g_name, g_args
    FROM moved mv;
    IF g_id IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM mq_wake(mq_unlink(g_id, g_after, g_name, g_args));
    PERFORM pg_notify('mq_dead', '');
    RETURN cardinality(g_id);
END;
$$;

-- Per channel: messages in all, ready now, waiting (delayed, leased,
-- retrying, uncommitted or behind their chain), dead, and chains blocked by
-- a dead head. Reads the whole table: for monitoring, not for hot paths.
CREATE OR REPLACE FUNCTION mq_stats(channel_names text[] DEFAULT NULL)
RETURNS TABLE(channel_name text, total bigint, ready bigint, waiting bigint,
              dead bigint, blocked_chains bigint)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    WITH m AS (
        SELECT m.channel_name,
               m.attempts = 0 AND m.attempt_at <= clock_timestamp() AS is_dead,
               m.attempts > 0 AND m.attempt_at <= clock_timestamp()
                 AND (m.after_message_id IS NULL
                      OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                 AS is_ready,
               m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid AS is_head
        FROM mq_msgs m
        WHERE channel_names IS NULL OR m.channel_name = ANY (channel_names)
    )
    SELECT m.channel_name, count(*), count(*) FILTER (WHERE m.is_ready),
           count(*) FILTER (WHERE NOT m.is_ready AND NOT m.is_dead),
           count(*) FILTER (WHERE m.is_dead),
           count(*) FILTER (WHERE m.is_dead AND m.is_head)
    FROM m
    GROUP BY m.channel_name
    ORDER BY m.channel_name
$$;

INSERT INTO mq_schema_migrations (version, name)
VALUES (1, '0001_schema')
ON CONFLICT (version) DO NOTHING;
