-- pqmq schema, version 5: clients of the original (sqlxmq) schema share the queue.
--
-- Programs written against the original schema (the sqlxmq crate and others
-- that call its functions) work unchanged on a pqmq database:
--   * the empty channel name is a channel like any other (the crate's
--     default); its listeners are woken on mq_ and mq, as before;
--   * a zero retry backoff is accepted and means "retry at once" (mq_fail
--     schedules the retry now); a delivery of such a message is still leased
--     for one second, extended by keep-alives, so two consumers never hold
--     it at once;
--   * durations may be up to 36,500,000 days (about 100,000 years). That
--     limit is real: a longer delay, backoff or commit interval could carry
--     a timestamp past PostgreSQL's range and make every poll fail.
--     Keep-alive and checkpoint durations beyond it are cut to it, not
--     refused: the crate doubles its keep-alive without end, and a long job
--     must never start failing it;
--   * mq_clear(text[]) and mq_clear_all() delete the messages of the given
--     channels (or of all), as the original's do (see mq_clear_count).
-- Signatures of the original's functions and of mq_new_t are unchanged.

CREATE OR REPLACE FUNCTION mq_limits(
    OUT max_batch int, OUT max_payload bigint, OUT max_duration interval)
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$ SELECT 10000, 16777216::bigint, interval '36500000 days' $$;

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
            WHEN t.channel_name IS NULL THEN 'channel_name is NULL'
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
                -- A zero backoff retries at once (mq_fail), but a delivery
                -- is still leased: one second, extended by keep-alives.
                attempt_at = ts + CASE WHEN m.retry_backoff > interval '0'
                                       THEN m.retry_backoff
                                       ELSE interval '1 second' END,
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

CREATE OR REPLACE FUNCTION mq_keep_alive_count(msg_ids uuid[], duration interval)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts timestamptz := clock_timestamp();
    n  int;
BEGIN
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

-- Deletes every message of the given channels (all_channels: of every
-- channel), whatever its state: ready, delayed, uncommitted, held by a
-- consumer (whose completion then finds nothing: mq_complete counts 0), or
-- dead. Ordered chains go whole, so no chain is left with a gap; their
-- bookkeeping in mq_chains goes with them, and a message inserted afterwards
-- heads a new chain. Chain structure changes only under the chains'
-- advisory locks (as in mq_insert and mq_complete): those of every chain of
-- the channels are taken first, in key order, and a chain that appears after
-- that (a concurrent insert) is left alone. The nil UUID is never a message
-- (the original kept a row for it; pqmq needs none), so nothing here can
-- remove what a later ordered insert relies on. Returns how many it deleted.
CREATE OR REPLACE FUNCTION mq_clear_count(channel_names text[],
                                          all_channels boolean DEFAULT false)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    la int[];
    lb int[];
    n  int;
BEGIN
    all_channels := COALESCE(all_channels, false);
    IF NOT all_channels
       AND (channel_names IS NULL OR pg_catalog.cardinality(channel_names) = 0) THEN
        RETURN 0;
    END IF;
    SELECT pg_catalog.array_agg(k.a ORDER BY k.a, k.b),
           pg_catalog.array_agg(k.b ORDER BY k.a, k.b)
    INTO la, lb
    FROM (
        SELECT DISTINCT pg_catalog.hashtext(c.channel_name) AS a,
                        pg_catalog.hashtext(c.channel_args) AS b
        FROM (SELECT h.channel_name, h.channel_args FROM mq_chains h
              WHERE all_channels OR h.channel_name = ANY (channel_names)
              UNION
              SELECT m.channel_name, m.channel_args FROM mq_msgs m
              WHERE m.after_message_id IS NOT NULL
                AND (all_channels OR m.channel_name = ANY (channel_names))) c
    ) k;
    PERFORM pg_catalog.pg_advisory_xact_lock(u.a, u.b)
    FROM unnest(la, lb) WITH ORDINALITY AS u(a, b, o)
    ORDER BY u.o;

    WITH locked AS (
        SELECT u.a, u.b FROM unnest(la, lb) AS u(a, b)
    ),
    gone AS (
        DELETE FROM mq_msgs m
        WHERE (all_channels OR m.channel_name = ANY (channel_names))
          AND m.id <> '00000000-0000-0000-0000-000000000000'::uuid
          AND (m.after_message_id IS NULL
               OR EXISTS (SELECT 1 FROM locked l
                          WHERE l.a = pg_catalog.hashtext(m.channel_name)
                            AND l.b = pg_catalog.hashtext(m.channel_args)))
        RETURNING m.id
    ),
    cold AS (
        DELETE FROM mq_payloads p USING gone g WHERE p.id = g.id
    ),
    chains AS (
        DELETE FROM mq_chains c
        WHERE (all_channels OR c.channel_name = ANY (channel_names))
          AND EXISTS (SELECT 1 FROM locked l
                      WHERE l.a = pg_catalog.hashtext(c.channel_name)
                        AND l.b = pg_catalog.hashtext(c.channel_args))
    )
    SELECT pg_catalog.count(*) INTO n FROM gone;
    RETURN n;
END;
$$;

-- The original's mq_clear: deletes the messages of the given channels.
CREATE OR REPLACE FUNCTION mq_clear(channel_names text[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM mq_clear_count(channel_names, false);
END;
$$;

-- The original's mq_clear_all: deletes every message.
CREATE OR REPLACE FUNCTION mq_clear_all()
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM mq_clear_count(NULL, true);
END;
$$;

-- A database adopted from the original schema (0000_adopt_sqlxmq) has
-- chains but no record of their tails: record the last message of each
-- chain that has none. On any other database this finds nothing.
INSERT INTO mq_chains (channel_name, channel_args, tail_id)
SELECT DISTINCT ON (m.channel_name, m.channel_args)
       m.channel_name, m.channel_args, m.id
FROM mq_msgs m
WHERE m.after_message_id IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM mq_msgs s WHERE s.after_message_id = m.id)
  AND NOT EXISTS (SELECT 1 FROM mq_chains c
                  WHERE c.channel_name = m.channel_name
                    AND c.channel_args = m.channel_args)
ORDER BY m.channel_name, m.channel_args, m.created_at DESC, m.id DESC;

INSERT INTO mq_schema_migrations (version, name)
VALUES (5, '0005_sqlxmq_clients')
ON CONFLICT (version) DO NOTHING;
