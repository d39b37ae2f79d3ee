-- pqmq schema, version 6: hardening against hostile and careless callers.
--
--   * Intervals: months count 30 days and days 24 hours, everywhere. The
--     checks compared intervals that way (PostgreSQL's interval order) while
--     timestamps added calendar months and days, so '-1 month +30 days
--     +1 second' passed as positive and could lease a message a day in the
--     past. Every interval a caller passes is first made fixed-length
--     (mq_fixed_length), so what is checked is what is added, on every date
--     and across daylight-saving changes.
--   * search_path: every function pins pg_catalog, then the queue's schema,
--     then pg_temp, by name. Before, functions created by psql under the
--     default path pinned "$user", public (SET search_path FROM CURRENT),
--     where any role able to create a schema named after the caller, or to
--     create in public, could plant an overload that beats a polymorphic
--     built-in and runs with the caller's rights.
--   * A queue schema in which roles other than its owner may CREATE is
--     refused: such a role could plant the same overloads next to the
--     queue's own functions (CVE-2018-1058's pattern).
--   * Internal helpers are not executable by PUBLIC.
--   * Bad input answered precisely: channel names over 1024 bytes, NULL
--     attempt numbers in mq_complete, id and attempt arrays of different
--     shapes in mq_release are refused (22023) and change nothing.

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
    -- Months count 30 days and days 24 hours, in the checks below and in
    -- the timestamps computed from them alike (see mq_fixed_length).
    IF cardinality(new_messages) <= lim.max_batch THEN
        new_messages := ARRAY(
            SELECT ROW(t.id, mq_fixed_length(t.delay), t.retries,
                       mq_fixed_length(t.retry_backoff), t.channel_name,
                       t.channel_args, mq_fixed_length(t.commit_interval), t.ordered,
                       t.name, t.payload_json, t.payload_bytes)::mq_new_t
            FROM unnest(new_messages) WITH ORDINALITY AS t
            ORDER BY t.ordinality);
    END IF;
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
            WHEN t.channel_name IS NULL THEN 'channel_name is NULL'
            WHEN octet_length(t.channel_name) > 1024
                THEN 'channel_name is over 1024 bytes'
            WHEN t.retries < 0 THEN 'retries is negative'
            WHEN t.delay < interval '0' THEN 'delay is negative'
            WHEN t.delay > lim.max_duration THEN 'delay is over 36500000 days'
            WHEN t.retry_backoff < interval '0'
                THEN 'retry_backoff is negative'
            WHEN t.retry_backoff > lim.max_duration
                THEN 'retry_backoff is over 36500000 days'
            WHEN t.commit_interval < interval '0'
                THEN 'commit_interval is negative'
            WHEN t.commit_interval > lim.max_duration
                THEN 'commit_interval is over 36500000 days'
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

CREATE OR REPLACE FUNCTION mq_keep_alive_count(msg_ids uuid[], duration interval)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts timestamptz := clock_timestamp();
    n  int;
BEGIN
    duration := mq_fixed_length(duration);
    IF duration IS NULL OR duration < interval '0' THEN
        RAISE EXCEPTION 'mq_keep_alive: duration % is NULL or negative', duration
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A client that doubles its keep-alive (sqlxmq's runner does) reaches
    -- any limit in time: longer durations are cut to the limit, not refused.
    duration := LEAST(duration, (mq_limits()).max_duration);
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
    duration := mq_fixed_length(duration);
    IF duration IS NULL OR duration < interval '0' THEN
        RAISE EXCEPTION 'mq_checkpoint: duration % is NULL or negative', duration
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    duration := LEAST(duration, (mq_limits()).max_duration);
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
    -- A NULL attempt number would turn off the check for its id.
    IF msg_attempts IS NOT NULL AND array_position(msg_attempts, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'mq_complete: attempt number % is NULL',
            array_position(msg_attempts, NULL)
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
    IF cardinality(msg_ids) IS DISTINCT FROM cardinality(msg_attempts)
       OR array_position(msg_attempts, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'mq_release: % ids but % attempt numbers (none may be NULL)',
            cardinality(msg_ids), cardinality(msg_attempts)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
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

-- Stored intervals with month or day parts (from before this version) get
-- the fixed length their checks assumed.
UPDATE mq_msgs SET retry_backoff = mq_fixed_length(retry_backoff)
WHERE pg_catalog.date_part('month', retry_backoff) <> 0
   OR pg_catalog.date_part('year', retry_backoff) <> 0
   OR pg_catalog.date_part('day', retry_backoff) <> 0;

INSERT INTO mq_schema_migrations (version, name)
VALUES (6, '0006_hardening')
ON CONFLICT (version) DO NOTHING;
