-- pqmq schema, version 10: the locked lane.
--
-- mq_claim_locked claims for the caller's open transaction and writes
-- nothing: its jobs are held by row locks until that transaction ends, so
-- a consumer's writes and the completion commit together, one commit per
-- batch, and a rollback or a crash makes the messages ready again at once
-- with no attempt spent. What it cannot do is count the attempts of a
-- delivery that died, since everything it would write dies with it. So it
-- delivers first attempts only, and none whose last locked delivery died
-- (the locker left in the row's xmax aborted: mq_lock_spent); those, and
-- every retry, go through mq_claim, whose lease counts the attempt before
-- the handler runs. A message that kills its consumer still ends dead.
--
-- mq_claim's picking and its wait time move to mq_pick_batch and
-- mq_wait_time, shared by both lanes; mq_pick gains the lane. mq_fail fails
-- a locked job inside the transaction that holds it. mq_complete_all
-- completes all of a batch or fails, for a completion sent together with
-- its COMMIT. mq_insert rewrites a batch's intervals only when one has a
-- month or day field.

-- Inserts a batch in one statement: all of it, or (on any error) none of it.
CREATE OR REPLACE FUNCTION mq_insert(new_messages mq_new_t[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
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
    -- the timestamps computed from them alike (see mq_fixed_length). Only
    -- a batch with a month or day field in it is rewritten: the C library
    -- sends none, and a call of mq_fixed_length per value took a fifth of
    -- an insert.
    IF cardinality(new_messages) <= lim.max_batch AND EXISTS (
           SELECT 1 FROM unnest(new_messages) AS t, LATERAL (
               VALUES (t.delay), (t.retry_backoff), (t.commit_interval)) AS v(x)
           WHERE pg_catalog.date_part('day', v.x) <> 0
              OR pg_catalog.date_part('month', v.x) <> 0
              OR pg_catalog.date_part('year', v.x) <> 0) THEN
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
                             channel_name, channel_args, commit_interval, ready_at)
        SELECT t.id, ts,
               ts + COALESCE(t.delay, interval '0')
                  + COALESCE(t.commit_interval, interval '0'),
               LEAST(COALESCE(t.retries, 4)::bigint + 1, 2147483647)::int,
               COALESCE(t.retry_backoff, interval '1 second'),
               t.channel_name, COALESCE(t.channel_args, ''), t.commit_interval,
               ts + COALESCE(t.delay, interval '0')
                  + COALESCE(t.commit_interval, interval '0')
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
                WHERE c.channel_key = ((hashtext(w.channel_name)::bigint << 32)
                                       | (hashtext(w.args)::bigint & 4294967295))
                  AND c.channel_name = w.channel_name
                  AND c.channel_args = w.args
                  -- (a scalar subquery stays a probe by id; EXISTS could
                  -- become a join that reads the primary key whole)
                  AND (SELECT m.id FROM mq_msgs m WHERE m.id = c.tail_id) IS NOT NULL
                LIMIT 1
            ) t
        )
        INSERT INTO mq_msgs (id, created_at, attempt_at, attempts, retry_backoff,
                             channel_name, channel_args, commit_interval,
                             after_message_id, ready_at)
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
               END,
               ts + COALESCE(b.delay, interval '0')
                  + COALESCE(b.commit_interval, interval '0')
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

-- Whether the locked lane must pass a row by, from its locker (xmax): the
-- locker ended without committing, so the row's locked delivery died with
-- its consumer (a crash, a lost connection, a rollback); or the locker is
-- this transaction, which holds the row already (SKIP LOCKED skips only
-- other transactions' locks). xmax has 32 bits: its full id is found from
-- the current transaction's (both within 2^31 of each other). A locker newer
-- than the caller counts as alive (it may still be running).
CREATE OR REPLACE FUNCTION mq_lock_spent(locker xid)
RETURNS boolean
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT CASE WHEN x < 3 OR back < 0 THEN false
                WHEN back = 0 THEN true
                ELSE COALESCE(pg_xact_status((cur - back)::text::xid8) = 'aborted', false)
           END
    FROM (SELECT c.cur, c.x,
                 ((c.cur & 4294967295) - c.x + 6442450944) % 4294967296 - 2147483648 AS back
          FROM (SELECT pg_current_xact_id()::text::bigint AS cur,
                       COALESCE(locker::text::bigint, 0) AS x) c) d
$$;

-- One visit of the channels whose chain key lies in [lo, hi], starting at a
-- random key and wrapping around once: takes up to per_key ready messages
-- from each channel, up to `want` in all, visiting at most `budget` channels
-- per direction. Locks what it returns (FOR NO KEY UPDATE SKIP LOCKED), so
-- concurrent pollers skip each other's rows instead of waiting. lane: as in
-- mq_pick_batch.
CREATE OR REPLACE FUNCTION mq_pick(only_name text, lo bigint, hi bigint,
                                   per_key int, want int, budget int,
                                   picked uuid[], ts timestamptz, lane int)
RETURNS uuid[]
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
-- (version 2) Without bitmap scans the ordered index scan, which stops after
-- per_key rows, is the only fit; the bitmap plan read and sorted whole channels.
SET enable_bitmapscan = off
AS $$
DECLARE
    start bigint := LEAST(hi::numeric, lo::numeric
                          + floor(random() * (hi::numeric - lo::numeric + 1)))::bigint;
    got   uuid[];
BEGIN
    -- Each probe finds the next chain key that has a claimable message, and
    -- where in the key that message is (at): the messages in flight and the
    -- dead entries before it are stepped over once, by the probe, and the
    -- key's scan starts at it. A key with nothing claimable is passed by.
    SELECT array_agg(j.id) INTO got FROM (
        WITH RECURSIVE up(k, at, n) AS (
            SELECT f.k, f.at, 1 FROM (
                SELECT m.channel_key AS k, m.ready_at AS at FROM mq_msgs m
                WHERE m.dead_since IS NULL
                  AND (m.after_message_id IS NULL
                       OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                  AND m.ready_at <= ts AND m.attempt_at <= ts AND m.attempts > 0
                  AND (only_name IS NULL OR m.channel_name = only_name)
                  AND m.id <> ALL (picked)
                  AND m.channel_key >= start AND m.channel_key <= hi
                ORDER BY m.channel_key, m.ready_at LIMIT 1) f
            UNION ALL
            SELECT f.k, f.at, up.n + 1 FROM up, LATERAL (
                SELECT m.channel_key AS k, m.ready_at AS at FROM mq_msgs m
                WHERE m.dead_since IS NULL
                  AND (m.after_message_id IS NULL
                       OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                  AND m.ready_at <= ts AND m.attempt_at <= ts AND m.attempts > 0
                  AND (only_name IS NULL OR m.channel_name = only_name)
                  AND m.id <> ALL (picked)
                  AND m.channel_key > up.k AND m.channel_key <= hi
                ORDER BY m.channel_key, m.ready_at LIMIT 1) f
            WHERE up.n < budget
        ),
        around(k, at, n) AS (
            SELECT f.k, f.at, 1 FROM (
                SELECT m.channel_key AS k, m.ready_at AS at FROM mq_msgs m
                WHERE m.dead_since IS NULL
                  AND (m.after_message_id IS NULL
                       OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                  AND m.ready_at <= ts AND m.attempt_at <= ts AND m.attempts > 0
                  AND (only_name IS NULL OR m.channel_name = only_name)
                  AND m.id <> ALL (picked)
                  AND m.channel_key >= lo AND m.channel_key < start
                ORDER BY m.channel_key, m.ready_at LIMIT 1) f
            UNION ALL
            SELECT f.k, f.at, around.n + 1 FROM around, LATERAL (
                SELECT m.channel_key AS k, m.ready_at AS at FROM mq_msgs m
                WHERE m.dead_since IS NULL
                  AND (m.after_message_id IS NULL
                       OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                  AND m.ready_at <= ts AND m.attempt_at <= ts AND m.attempts > 0
                  AND (only_name IS NULL OR m.channel_name = only_name)
                  AND m.id <> ALL (picked)
                  AND m.channel_key > around.k AND m.channel_key < start
                ORDER BY m.channel_key, m.ready_at LIMIT 1) f
            WHERE around.n < budget
        )
        SELECT r.id
        FROM (SELECT up.k, up.at FROM up
              UNION ALL
              SELECT around.k, around.at FROM around) ks,
        LATERAL (
            SELECT m.id FROM mq_msgs m
            WHERE m.channel_key = ks.k
              AND m.dead_since IS NULL
              AND (m.after_message_id IS NULL
                   OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
              AND m.ready_at >= ks.at
              AND m.ready_at <= ts
              -- Steps over the messages in flight (see ready_at).
              AND m.attempt_at <= ts
              AND m.attempts > 0
              AND (only_name IS NULL OR m.channel_name = only_name)
              AND m.id <> ALL (picked)
              -- The locked lane: first deliveries not left by a dead locker.
              AND (lane = 0 OR (lane = 1) = (m.deliveries = 0
                                             AND (m.xmax = '0'::xid
                                                  OR NOT mq_lock_spent(m.xmax))))
            ORDER BY m.ready_at
            LIMIT per_key
            FOR NO KEY UPDATE SKIP LOCKED
        ) r
        LIMIT want - cardinality(picked)
    ) j;
    RETURN picked || COALESCE(got, '{}');
END;
$$;

-- Picks up to batch_size ready messages fairly across channels and locks
-- them (FOR NO KEY UPDATE SKIP LOCKED); returns their ids. lane 0: every
-- ready message (the lease lane); lane 1 (the locked lane, mq_claim_locked):
-- first deliveries whose last locked delivery did not die and that this
-- transaction does not hold yet; lane 2: the others (see mq_claim_lane).
--
-- Fairness: channels are visited from a random point of the chain-key space
-- (one random point per name when the poll names channels), taking at most a
-- quarter of the batch from each, so a busy channel cannot starve a quiet one.
-- Cost: each channel visited is one index probe (loose index scan); a budget
-- bounds the visits, and the time index fills whatever is left. Nothing here
-- groups or sorts the whole backlog.
CREATE OR REPLACE FUNCTION mq_pick_batch(channel_names text[], batch_size int,
                                         ts timestamptz, lane int)
RETURNS uuid[]
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    picked  uuid[] := '{}';
    got     uuid[];
    per_key int;
    budget  int;
    nm      text;
    lo      bigint;
    hi      bigint;
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
                          per_key, batch_size, budget, picked, ts, lane);
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
                                  batch_size, budget, picked, ts, lane);
            END LOOP;
        END LOOP;
    END IF;

    -- Unfiltered polls top up from the time index: exact and O(batch log n).
    IF channel_names IS NULL AND cardinality(picked) < batch_size THEN
        SELECT array_agg(s.id) INTO got FROM (
            SELECT m.id FROM mq_msgs m
            WHERE m.dead_since IS NULL
              AND (m.after_message_id IS NULL
                   OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
              AND m.ready_at > '-infinity'::timestamptz -- mq_msgs_ready_by_time
              AND m.ready_at <= ts
              -- Steps over the messages in flight (see ready_at).
              AND m.attempt_at <= ts
              AND m.attempts > 0
              AND (lane = 0 OR (lane = 1) = (m.deliveries = 0
                                             AND (m.xmax = '0'::xid
                                                  OR NOT mq_lock_spent(m.xmax))))
              AND m.id <> ALL (picked)
            ORDER BY m.ready_at
            LIMIT batch_size - cardinality(picked)
            FOR NO KEY UPDATE SKIP LOCKED
        ) s;
        picked := picked || COALESCE(got, '{}');
    END IF;
    RETURN picked;
END;
$$;

-- How long until the earliest candidate of these channels (NULL: all)
-- becomes ready: a message that is not ready yet (one probe) or a lease
-- that runs out (the messages in flight, which the poll just stepped over).
-- NULL when there is none.
CREATE OR REPLACE FUNCTION mq_wait_time(channel_names text[], ts timestamptz)
RETURNS interval
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    next_at timestamptz;
BEGIN
    IF channel_names IS NULL THEN
        SELECT LEAST(
            (SELECT m.ready_at FROM mq_msgs m
             WHERE m.dead_since IS NULL
               AND (m.after_message_id IS NULL
                    OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
               AND m.ready_at > '-infinity'::timestamptz
               AND m.ready_at > ts AND m.ready_at < 'infinity'::timestamptz
             ORDER BY m.ready_at LIMIT 1),
            (SELECT min(m.attempt_at) FROM mq_msgs m
             WHERE m.dead_since IS NULL
               AND (m.after_message_id IS NULL
                    OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
               AND m.ready_at > '-infinity'::timestamptz
               AND m.ready_at <= ts
               AND m.attempts > 0))
        INTO next_at;
    ELSE
        SELECT min(LEAST(
            (SELECT m.ready_at FROM mq_msgs m
             WHERE m.dead_since IS NULL
               AND (m.after_message_id IS NULL
                    OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
               AND m.channel_key BETWEEN hashtext(c.n)::bigint << 32
                                     AND (hashtext(c.n)::bigint << 32) | 4294967295
               AND m.ready_at > ts AND m.ready_at < 'infinity'::timestamptz
               AND m.channel_name = c.n
             ORDER BY m.ready_at LIMIT 1),
            (SELECT min(m.attempt_at) FROM mq_msgs m
             WHERE m.dead_since IS NULL
               AND (m.after_message_id IS NULL
                    OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
               AND m.channel_key BETWEEN hashtext(c.n)::bigint << 32
                                     AND (hashtext(c.n)::bigint << 32) | 4294967295
               AND m.ready_at <= ts
               AND m.attempts > 0
               AND m.channel_name = c.n)))
        INTO next_at
        FROM (SELECT DISTINCT n FROM unnest(channel_names) AS n) c;
    END IF;
    RETURN CASE WHEN next_at IS NOT NULL
                THEN GREATEST(next_at - clock_timestamp(), interval '0') END;
END;
$$;

-- Claims up to batch_size ready messages (see DESIGN.md, the SQL contract):
-- the lease lane, mq_claim_lane's lane 0.
CREATE OR REPLACE FUNCTION mq_claim(channel_names text[], batch_size int)
RETURNS SETOF mq_job_t
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY SELECT * FROM mq_claim_lane(channel_names, batch_size, 0);
END;
$$;

-- Claims up to batch_size ready messages of a lane (see mq_pick_batch) and
-- leases them. Lane 2, the rest of lane 0 once lane 1 is taken out (retries
-- and messages whose locked delivery died), is what a runner whose workers
-- use the locked lane claims with leases.
CREATE OR REPLACE FUNCTION mq_claim_lane(channel_names text[], batch_size int, lane int)
RETURNS SETOF mq_job_t
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
-- Custom plans (a new session's first five calls) pick hash joins over the
-- whole table for arrays of ids; the generic plan probes the indexes.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    ts      timestamptz := clock_timestamp();
    picked  uuid[];
    max_dur interval := (mq_limits()).max_duration; -- once, not per row
BEGIN
    picked := mq_pick_batch(channel_names, batch_size, ts, lane);

    -- Not busy: a good moment to notice messages whose last lease ran out.
    IF cardinality(picked) < batch_size THEN
        PERFORM mq_reap_dead();
    END IF;

    IF cardinality(picked) > 0 THEN
        RETURN QUERY
        WITH claimed AS (
            -- Writes no indexed column (ready_at stays), so the new row
            -- version is a HOT update: no index entry is written. Only a
            -- final attempt moves, to 'infinity', where mq_reap_dead looks.
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
                deliveries = m.deliveries + 1,
                ready_at = CASE WHEN m.attempts = 1 THEN 'infinity'::timestamptz
                                ELSE m.ready_at END
            -- Looked up by id = ANY: an index condition whatever the
            -- statistics say (a join with the array could turn into a scan
            -- of the whole primary key once ANALYZE saw an empty table).
            WHERE m.id = ANY (picked)
            RETURNING m.id, m.commit_interval IS NULL AS committed,
                      m.attempt_at - ts AS lease, m.channel_name,
                      m.channel_args, m.deliveries, m.attempts, m.ready_at
        )
        SELECT c.id, c.committed, p.name, p.payload_json::text, p.payload_bytes,
               c.lease, interval '0', c.channel_name, c.channel_args,
               c.deliveries, c.attempts, NULL::text, false
        FROM claimed c
        LEFT JOIN LATERAL (
            SELECT p.name, p.payload_json, p.payload_bytes FROM mq_payloads p
            WHERE p.id = c.id LIMIT 1
        ) p ON true
        -- Oldest first (final attempts, now at 'infinity', last).
        ORDER BY c.ready_at, c.id;
        RETURN;
    END IF;

    -- Nothing claimed: the one row says when to poll again.
    RETURN QUERY SELECT NULL::uuid, NULL::boolean, NULL::text, NULL::text,
        NULL::bytea, NULL::interval, mq_wait_time(channel_names, ts),
        NULL::text, NULL::text, NULL::int, NULL::int, NULL::text, NULL::boolean;
END;
$$;

-- The locked lane: claims up to batch_size first deliveries for the
-- caller's open transaction and writes nothing. The jobs are held by row
-- locks (FOR NO KEY UPDATE, SKIP LOCKED by other pollers) until that
-- transaction ends: completing them there (mq_complete, attempt 0) commits
-- with the caller's own writes; a rollback or a crash leaves them ready
-- again at once, with no attempt spent. A message whose locked delivery
-- died that way, and every retry, is delivered by mq_claim only, whose
-- lease counts the attempt before the handler runs: so a message that kills
-- its consumer still ends dead after its retries.
CREATE OR REPLACE FUNCTION mq_claim_locked(channel_names text[], batch_size int)
RETURNS SETOF mq_job_t
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    ts     timestamptz := clock_timestamp();
    picked uuid[];
BEGIN
    picked := mq_pick_batch(channel_names, batch_size, ts, 1);
    IF cardinality(picked) > 0 THEN
        RETURN QUERY
        SELECT m.id, m.commit_interval IS NULL, p.name, p.payload_json::text,
               p.payload_bytes, interval '0', interval '0', m.channel_name,
               m.channel_args, m.deliveries + 1, m.attempts - 1, NULL::text, false
        FROM mq_msgs m
        LEFT JOIN LATERAL (
            SELECT p.name, p.payload_json, p.payload_bytes FROM mq_payloads p
            WHERE p.id = m.id LIMIT 1
        ) p ON true
        WHERE m.id = ANY (picked)
        ORDER BY m.ready_at, m.id;
        RETURN;
    END IF;
    RETURN QUERY SELECT NULL::uuid, NULL::boolean, NULL::text, NULL::text,
        NULL::bytea, NULL::interval, mq_wait_time(channel_names, ts),
        NULL::text, NULL::text, NULL::int, NULL::int, NULL::text, NULL::boolean;
END;
$$;

-- Records why an attempt failed and schedules the retry one backoff from now
-- (the backoff of the attempt that failed). With no attempts left the
-- message is dead at once: kept, never delivered again, announced on mq_dead.
-- With an attempt number, only that delivery may fail the message. A job of
-- the locked lane fails inside the transaction that holds it.
CREATE OR REPLACE FUNCTION mq_fail(msg_id uuid, error text, msg_attempt int DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    ts   timestamptz := clock_timestamp();
    dead boolean;
BEGIN
    UPDATE mq_msgs m SET
        attempt_at = CASE WHEN m.attempts > 0
                          THEN ts + m.retry_backoff / 2
                          ELSE ts END,
        dead_since = CASE WHEN m.attempts > 0 THEN NULL ELSE ts END,
        ready_at = CASE WHEN m.attempts > 0
                        THEN ts + m.retry_backoff / 2
                        ELSE m.ready_at END
    WHERE m.id = msg_id
      AND m.deliveries > 0
      AND m.attempt_at > ts
      AND (msg_attempt IS NULL OR m.deliveries = msg_attempt)
    RETURNING m.attempts = 0 INTO dead;
    IF NOT FOUND THEN
        -- A locked delivery (mq_claim_locked) held by this transaction:
        -- its attempt is counted here, as a lease would have counted it.
        UPDATE mq_msgs m SET
            attempts = m.attempts - 1,
            deliveries = m.deliveries + 1,
            retry_backoff = CASE WHEN m.retry_backoff * 2 > (mq_limits()).max_duration
                                 THEN m.retry_backoff ELSE m.retry_backoff * 2 END,
            attempt_at = CASE WHEN m.attempts > 1 THEN ts + m.retry_backoff ELSE ts END,
            dead_since = CASE WHEN m.attempts > 1 THEN NULL ELSE ts END,
            ready_at = CASE WHEN m.attempts > 1 THEN ts + m.retry_backoff
                            ELSE m.ready_at END
        WHERE m.id = msg_id
          AND m.attempt_at <= ts
          AND m.dead_since IS NULL
          AND m.attempts > 0
          AND (msg_attempt IS NULL OR m.deliveries = msg_attempt)
          AND m.xmax = xid(pg_current_xact_id_if_assigned())
        RETURNING m.attempts = 0 INTO dead;
    END IF;
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

-- Completes every one of msg_ids, each still on its attempt number, or
-- fails: a consumer that commits its effects in the same transaction must
-- not commit those of a message that is no longer its own (delivered again
-- after its lease ran out, or gone), and cannot read a count first when
-- the COMMIT is already on its way (pqmq_complete_commit sends both at
-- once). SQLSTATE PQ001 names the shortfall. Returns how many it completed.
CREATE OR REPLACE FUNCTION mq_complete_all(msg_ids uuid[], msg_attempts int[])
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    n int := mq_complete(msg_ids, msg_attempts);
BEGIN
    IF n < cardinality(msg_ids) THEN
        RAISE EXCEPTION 'mq_complete_all: % of % messages were delivered again or are gone',
            cardinality(msg_ids) - n, cardinality(msg_ids)
            USING ERRCODE = 'PQ001';
    END IF;
    RETURN n;
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
    RETURN QUERY SELECT j, n FROM mq_claim_lane(channel_names, batch_size, 0) j;
END;
$$;

-- Which function belongs to which duty. Later migrations that add a
-- function to a duty replace this and call mq_regrant().
CREATE OR REPLACE FUNCTION mq_duties()
RETURNS TABLE(duty text, function_name text)
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$
    VALUES ('produce', 'mq_insert'), ('produce', 'mq_commit'),
           ('consume', 'mq_claim'), ('consume', 'mq_claim_locked'),
           ('consume', 'mq_claim_lane'),
           ('consume', 'mq_complete_claim'),
           ('consume', 'mq_poll'), ('consume', 'mq_poll_jobs'),
           ('consume', 'mq_complete'), ('consume', 'mq_complete_all'),
           ('consume', 'mq_complete_poll'),
           ('consume', 'mq_delete'), ('consume', 'mq_fail'),
           ('consume', 'mq_keep_alive'), ('consume', 'mq_keep_alive_count'),
           ('consume', 'mq_checkpoint'), ('consume', 'mq_checkpoint_found'),
           ('consume', 'mq_release'),
           ('administer', 'mq_dead_jobs'), ('administer', 'mq_dead_letters'),
           ('administer', 'mq_retry'),
           ('administer', 'mq_skip'), ('administer', 'mq_delete'),
           ('administer', 'mq_clear'), ('administer', 'mq_clear_all'),
           ('administer', 'mq_clear_count'),
           ('administer', 'mq_stats'), ('administer', 'mq_reap_dead'),
           ('administer', 'mq_metrics'), ('administer', 'mq_peek'),
           ('administer', 'mq_purge')
$$;

-- Version 9's mq_pick, without the lane (mq_pick_batch replaces its caller).
DROP FUNCTION IF EXISTS mq_pick(text, bigint, bigint, int, int, int, uuid[], timestamptz);

-- CREATE OR REPLACE FUNCTION undid the pinned path and the grants; the
-- consume duty has a new function.
SELECT mq_secure();
SELECT mq_regrant();

INSERT INTO mq_schema_migrations (version, name)
VALUES (10, '0010_locked_lane')
ON CONFLICT (version) DO NOTHING;
