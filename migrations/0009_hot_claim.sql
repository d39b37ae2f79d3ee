-- pqmq schema, version 9: claims that write no index entry.
--
-- Until now every claim moved attempt_at (the lease), which the candidate
-- indexes keyed on, and decremented attempts, which their predicates read:
-- each claim wrote a new row version plus three index entries (primary key
-- and both candidate indexes), and left as many dead ones for polls to step
-- over. Here the ready indexes key on a new column, ready_at (the message's
-- place in the ready order), which a claim leaves alone; no index reads
-- attempt_at, attempts, deliveries or retry_backoff. A claim is then a HOT
-- update: one heap tuple on the same page (the table keeps half of each page
-- free for it), no index entry.
--
-- The price: a message in flight keeps its index entry among the ready
-- ones, so polls step over it (a heap visit each). Keep-alives and failures,
-- which are rare, move a message to its new attempt_at; a final attempt
-- moves to 'infinity', the range where mq_reap_dead finds it. So the polls
-- step over the short jobs in flight only. Always ready_at <= attempt_at
-- (or 'infinity'): a message is claimable exactly when attempt_at <= now,
-- as before. A trigger keeps that true when attempt_at is set by hand.
--
-- Statements on arrays of ids now look rows up with id = ANY (...), an
-- index condition whatever ANALYZE last saw, instead of joining the array
-- (a generic plan made while the table looked empty scanned the whole
-- primary key for every completion), and the hot functions may not plan a
-- sequential scan, a hash join or a merge join: a plan cached while the
-- queue looked empty must still probe indexes when it is huge.

ALTER TABLE mq_msgs ADD COLUMN IF NOT EXISTS ready_at timestamptz;

UPDATE mq_msgs
SET ready_at = CASE WHEN attempts = 0 AND dead_since IS NULL AND deliveries > 0
                    THEN 'infinity'::timestamptz
                    ELSE attempt_at END
WHERE ready_at IS NULL;

ALTER TABLE mq_msgs ALTER COLUMN ready_at SET DEFAULT now();
ALTER TABLE mq_msgs ALTER COLUMN ready_at SET NOT NULL;

-- Room on every page for the row version a claim writes, so the claim can
-- stay on its page (HOT). Applies to pages written from now on.
ALTER TABLE mq_msgs SET (fillfactor = 50);

CREATE INDEX IF NOT EXISTS mq_msgs_ready_by_channel
    ON mq_msgs (channel_key, ready_at)
    WHERE dead_since IS NULL
      AND (after_message_id IS NULL
           OR after_message_id = '00000000-0000-0000-0000-000000000000'::uuid);

CREATE INDEX IF NOT EXISTS mq_msgs_ready_by_time
    ON mq_msgs (ready_at)
    WHERE dead_since IS NULL
      AND (after_message_id IS NULL
           OR after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
      AND ready_at > '-infinity'::timestamptz;

-- Each of these reads a column a claim writes.
DROP INDEX IF EXISTS mq_msgs_candidates_by_channel;
DROP INDEX IF EXISTS mq_msgs_candidates_by_time;
DROP INDEX IF EXISTS mq_msgs_final_attempt;

-- Serializes producers (and mq_complete, mq_skip) per chain: the advisory
-- locks of the chains the batch appends to, in key order against deadlock.
CREATE OR REPLACE FUNCTION mq_lock_new_chains(new_messages mq_new_t[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
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
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
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
        -- The keys as an array: an index condition in any join order.
        WHERE c.channel_key = ANY (ARRAY(
                  SELECT (hashtext(k.channel_name)::bigint << 32)
                         | (hashtext(k.args)::bigint & 4294967295) FROM last k))
          AND c.channel_key = ((hashtext(l.channel_name)::bigint << 32)
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

-- Takes the advisory locks of the chains the given messages belong to, in
-- key order (as mq_insert does): chain structure changes only under them.
CREATE OR REPLACE FUNCTION mq_lock_chains(msg_ids uuid[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
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
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
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
    keys AS (
        SELECT array_agg((hashtext(r.cn)::bigint << 32)
                         | (hashtext(r.ca)::bigint & 4294967295)) AS k
        FROM r
    ),
    handed AS (
        UPDATE mq_chains c SET tail_id = r.pred
        FROM r
        -- The keys as an array: an index condition in any join order.
        WHERE c.channel_key = ANY ((SELECT keys.k FROM keys)::bigint[])
          AND c.channel_key = ((hashtext(r.cn)::bigint << 32)
                               | (hashtext(r.ca)::bigint & 4294967295))
          AND c.channel_name = r.cn
          AND c.channel_args = r.ca
          AND c.tail_id = r.id
          AND r.pred <> '00000000-0000-0000-0000-000000000000'::uuid
    )
    DELETE FROM mq_chains c
    USING r
    WHERE c.channel_key = ANY ((SELECT keys.k FROM keys)::bigint[])
      AND c.channel_key = ((hashtext(r.cn)::bigint << 32)
                           | (hashtext(r.ca)::bigint & 4294967295))
      AND c.channel_name = r.cn
      AND c.channel_args = r.ca
      AND c.tail_id = r.id
      AND r.pred = '00000000-0000-0000-0000-000000000000'::uuid;
    RETURN chans;
END;
$$;

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

-- Second phase of a two-phase insert: the messages become ready at once
-- (or when their delay ends) and listeners are woken.
CREATE OR REPLACE FUNCTION mq_commit(msg_ids uuid[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    chans text[];
BEGIN
    WITH c AS (
        UPDATE mq_msgs m SET
            attempt_at = CASE WHEN m.deliveries = 0
                              THEN m.attempt_at - m.commit_interval
                              ELSE m.attempt_at END,
            ready_at = CASE WHEN m.deliveries = 0
                            THEN m.attempt_at - m.commit_interval
                            ELSE m.ready_at END,
            commit_interval = NULL
        WHERE m.id = ANY (msg_ids)
          AND m.commit_interval IS NOT NULL
        RETURNING m.channel_name
    )
    SELECT array_agg(DISTINCT c.channel_name) INTO chans FROM c;
    PERFORM mq_wake(chans);
END;
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
            WHERE m.dead_since IS NULL
              AND (m.after_message_id IS NULL
                   OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
              AND m.ready_at > '-infinity'::timestamptz -- mq_msgs_ready_by_time
              AND m.ready_at <= ts
              -- Steps over the messages in flight (see ready_at).
              AND m.attempt_at <= ts
              AND m.attempts > 0
              AND m.id <> ALL (picked)
            ORDER BY m.ready_at
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

    -- Nothing claimed: report when the earliest candidate becomes ready,
    -- a message that is not ready yet (one probe) or a lease that runs out
    -- (the messages in flight, which the poll just stepped over).
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
    RETURN QUERY SELECT NULL::uuid, NULL::boolean, NULL::text, NULL::text,
        NULL::bytea, NULL::interval,
        CASE WHEN next_at IS NOT NULL
             THEN GREATEST(next_at - clock_timestamp(), interval '0') END,
        NULL::text, NULL::text, NULL::int, NULL::int, NULL::text, NULL::boolean;
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
            ORDER BY m.ready_at
            LIMIT per_key
            FOR NO KEY UPDATE SKIP LOCKED
        ) r
        LIMIT want - cardinality(picked)
    ) j;
    RETURN picked || COALESCE(got, '{}');
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
    n       int;
    g_id    uuid[];
    g_after uuid[];
    g_name  text[];
    g_args  text[];
    by_id   uuid[]; -- msg_ids sorted, and their attempt numbers
    att     int[];
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
    -- A row's attempt number is found by binary search (width_bucket) in
    -- the ids sorted once: a linear search per row made large batches
    -- quadratic.
    IF msg_attempts IS NOT NULL THEN
        SELECT array_agg(u.id ORDER BY u.id), array_agg(u.a ORDER BY u.id)
        INTO by_id, att
        FROM unnest(msg_ids, msg_attempts) AS u(id, a);
    END IF;
    -- Unordered messages need no chain lock: they go first, and usually
    -- that is all there is.
    -- Rows are found by id = ANY (an index condition whatever the
    -- statistics say; a join with the array could become a scan of the
    -- whole primary key after ANALYZE saw an empty table).
    WITH gone AS (
        DELETE FROM mq_msgs m
        WHERE m.id = ANY (msg_ids)
          AND m.after_message_id IS NULL
          AND (msg_attempts IS NULL OR m.deliveries = att[width_bucket(m.id, by_id)])
        RETURNING m.id
    ),
    cold AS (
        DELETE FROM mq_payloads p WHERE p.id = ANY (ARRAY(SELECT g.id FROM gone g))
    )
    SELECT count(*) INTO n FROM gone;
    IF n = cardinality(msg_ids) THEN
        RETURN n;
    END IF;

    PERFORM mq_lock_chains(msg_ids);
    WITH gone AS (
        DELETE FROM mq_msgs m
        WHERE m.id = ANY (msg_ids)
          AND m.after_message_id IS NOT NULL
          AND (msg_attempts IS NULL OR m.deliveries = att[width_bucket(m.id, by_id)])
        RETURNING m.id, m.after_message_id, m.channel_name, m.channel_args
    ),
    cold AS (
        DELETE FROM mq_payloads p WHERE p.id = ANY (ARRAY(SELECT g.id FROM gone g))
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

-- Hands claimed messages back unstarted (a runner stopping with jobs still
-- queued): ready again at once, with the attempt refunded. Only the given
-- delivery (attempt number) of a message still leased is released.
CREATE OR REPLACE FUNCTION mq_release(msg_ids uuid[], msg_attempts int[])
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    ts    timestamptz := clock_timestamp();
    n     int;
    chans text[];
    by_id uuid[]; -- as in mq_complete
    att   int[];
BEGIN
    IF cardinality(msg_ids) IS DISTINCT FROM cardinality(msg_attempts)
       OR array_position(msg_attempts, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'mq_release: % ids but % attempt numbers (none may be NULL)',
            cardinality(msg_ids), cardinality(msg_attempts)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT array_agg(u.id ORDER BY u.id), array_agg(u.a ORDER BY u.id)
    INTO by_id, att
    FROM unnest(msg_ids, msg_attempts) AS u(id, a);
    WITH r AS (
        -- The message keeps its place (ready_at), so the release is a HOT
        -- update, except for a final attempt, which comes back from
        -- 'infinity'.
        UPDATE mq_msgs m SET
            attempt_at = ts,
            attempts = m.attempts + 1,
            deliveries = m.deliveries - 1,
            retry_backoff = m.retry_backoff / 2,
            dead_since = NULL,
            ready_at = LEAST(m.ready_at, ts)
        WHERE m.id = ANY (msg_ids)
          AND m.deliveries = att[width_bucket(m.id, by_id)]
          AND m.attempt_at > ts
        RETURNING m.channel_name
    )
    SELECT count(*), array_agg(DISTINCT r.channel_name) INTO n, chans FROM r;
    PERFORM mq_wake(chans);
    RETURN n;
END;
$$;

-- mq_keep_alive that reports how many messages it extended.
CREATE OR REPLACE FUNCTION mq_keep_alive_count(msg_ids uuid[], duration interval)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
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
    -- A kept-alive message is a long one: it moves out of the polls' way
    -- (ready_at), a final attempt stays at 'infinity'.
    UPDATE mq_msgs m SET
        attempt_at = ts + duration,
        commit_interval = CASE WHEN m.deliveries = 0 AND m.commit_interval IS NOT NULL
                               THEN m.commit_interval + ((ts + duration) - m.attempt_at)
                               ELSE m.commit_interval END,
        ready_at = CASE WHEN m.ready_at = 'infinity'::timestamptz THEN m.ready_at
                        ELSE ts + duration END
    WHERE m.id = ANY (ARRAY(SELECT l.id FROM mq_msgs l
                            WHERE l.id = ANY (msg_ids)
                              AND l.attempt_at > ts
                              AND l.attempt_at < ts + duration
                            FOR NO KEY UPDATE SKIP LOCKED));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
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
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
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
                         2147483647)::int,
        -- Moves with the lease, or stays at 'infinity' while no attempt is left.
        ready_at = CASE WHEN m.attempts::bigint + COALESCE(extra_retries, 0) = 0
                        THEN 'infinity'::timestamptz
                        ELSE GREATEST(m.attempt_at, ts + duration) END
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
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    ts timestamptz := clock_timestamp();
    n  int;
BEGIN
    -- Final attempts in flight wait at ready_at 'infinity' (mq_claim): one
    -- range of mq_msgs_ready_by_time.
    UPDATE mq_msgs m SET dead_since = m.attempt_at
    WHERE m.id = ANY (ARRAY(
        SELECT l.id FROM mq_msgs l
        WHERE l.dead_since IS NULL
          AND (l.after_message_id IS NULL
               OR l.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
          AND l.ready_at > '-infinity'::timestamptz -- mq_msgs_ready_by_time
          AND l.ready_at = 'infinity'::timestamptz
          AND l.attempts = 0 AND l.attempt_at <= ts
        FOR NO KEY UPDATE SKIP LOCKED));
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM pg_notify('mq_dead', '');
    END IF;
    RETURN n;
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
        UPDATE mq_msgs m SET attempts = retries + 1, attempt_at = ts, dead_since = NULL,
                             ready_at = ts
        WHERE m.id = ANY (msg_ids) AND m.dead_since IS NOT NULL
        RETURNING m.channel_name
    )
    SELECT count(*), array_agg(DISTINCT r.channel_name) INTO n, chans FROM r;
    PERFORM mq_wake(chans);
    RETURN n;
END;
$$;

-- One row per channel with messages (only the named ones when channel_names
-- is not NULL), each message counted in exactly one state:
--   dead         ran out of attempts (dead_since set, or final lease over)
--   waiting      ordered, behind an earlier message of its chain
--   uncommitted  two-phase, not yet committed, commit interval running
--   in_flight    delivered and leased, or failed and waiting for its retry
--   scheduled    not delivered yet, delay running
--   ready        a poll would take it now
-- blocked_chains: dead chain heads (their chain waits for retry or skip).
-- oldest_ready_age: seconds since the oldest ready message became ready.
-- removed: messages of the channel deleted so far (completed or purged).
--
-- Cost: what it reads never includes the waiting messages. total and
-- waiting come from the counters; dead, scheduled and uncommitted messages
-- and final attempts are read through the partial indexes that hold them
-- (mq_msgs_dead and the part of mq_msgs_ready_by_time later than now);
-- messages in flight are told from ready ones by reading the ready range
-- of mq_msgs_ready_by_time (the price of claims that write no index
-- entry); ready is what remains. The oldest ready message is a probe of
-- mq_msgs_ready_by_channel per chain key of the channel.
CREATE OR REPLACE FUNCTION mq_metrics(channel_names text[] DEFAULT NULL)
RETURNS TABLE(channel_name text, ready bigint, in_flight bigint, scheduled bigint,
              uncommitted bigint, waiting bigint, dead bigint,
              blocked_chains bigint, oldest_ready_age double precision,
              removed bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts timestamptz := pg_catalog.clock_timestamp();
BEGIN
    PERFORM mq_count_fold();
    RETURN QUERY
    WITH counts AS (
        SELECT x.channel_name, pg_catalog.sum(x.total)::bigint AS total,
               pg_catalog.sum(x.waiting)::bigint AS waiting,
               pg_catalog.sum(x.removed)::bigint AS removed
        FROM (SELECT c.channel_name, c.total, c.waiting, c.removed FROM mq_counts c
              UNION ALL
              SELECT d.channel_name, d.total, d.waiting, d.removed
              FROM mq_count_deltas d) x
        WHERE channel_names IS NULL
           OR x.channel_name OPERATOR(pg_catalog.=) ANY (channel_names)
        GROUP BY x.channel_name
    ),
    -- Not ready and not waiting. Messages not ready yet and final attempts
    -- are ranges of mq_msgs_ready_by_time past now; messages in flight
    -- that were not kept alive sit among the ready ones (a claim leaves
    -- ready_at where it was), so that part reads the ready range.
    later AS (
        SELECT m.channel_name,
               CASE WHEN m.deliveries > 0 THEN 'f'
                    WHEN m.commit_interval IS NOT NULL THEN 'u'
                    ELSE 's' END AS st, false AS head
        FROM mq_msgs m
        WHERE m.dead_since IS NULL
          AND (m.after_message_id IS NULL
               OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
          AND m.ready_at > '-infinity'::timestamptz -- mq_msgs_ready_by_time
          AND m.ready_at > ts AND m.ready_at < 'infinity'::timestamptz
          AND m.attempts > 0
        UNION ALL
        -- (all channels: the whole ready range of the time index)
        SELECT m.channel_name, 'f', false FROM mq_msgs m
        WHERE channel_names IS NULL
          AND m.dead_since IS NULL
          AND (m.after_message_id IS NULL
               OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
          AND m.ready_at > '-infinity'::timestamptz
          AND m.ready_at <= ts
          AND m.attempt_at > ts
          AND m.attempts > 0
        UNION ALL
        -- (named channels: only their ranges of the channel index)
        SELECT m.channel_name, 'f', false
        FROM (SELECT DISTINCT n FROM pg_catalog.unnest(channel_names) AS n) c,
        LATERAL (
            SELECT m.channel_name FROM mq_msgs m
            WHERE m.channel_key >= (pg_catalog.hashtext(c.n)::bigint << 32)
              AND m.channel_key <= ((pg_catalog.hashtext(c.n)::bigint << 32) | 4294967295)
              AND m.channel_name = c.n
              AND m.dead_since IS NULL
              AND (m.after_message_id IS NULL
                   OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
              AND m.ready_at <= ts
              AND m.attempt_at > ts
              AND m.attempts > 0
        ) m
        WHERE channel_names IS NOT NULL
        UNION ALL
        SELECT m.channel_name,
               CASE WHEN m.attempt_at > ts THEN 'f' ELSE 'd' END,
               m.attempt_at <= ts
                 AND m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid
        FROM mq_msgs m
        WHERE m.dead_since IS NULL
          AND (m.after_message_id IS NULL
               OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
          AND m.ready_at > '-infinity'::timestamptz
          AND m.ready_at = 'infinity'::timestamptz
          AND m.attempts = 0
        UNION ALL
        SELECT m.channel_name, 'd',
               m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid
        FROM mq_msgs m
        WHERE m.dead_since IS NOT NULL
    ),
    by_state AS (
        SELECT l.channel_name,
               pg_catalog.count(*) FILTER (WHERE l.st = 'f') AS f,
               pg_catalog.count(*) FILTER (WHERE l.st = 's') AS s,
               pg_catalog.count(*) FILTER (WHERE l.st = 'u') AS u,
               pg_catalog.count(*) FILTER (WHERE l.st = 'd') AS d,
               pg_catalog.count(*) FILTER (WHERE l.st = 'd' AND l.head) AS b
        FROM later l
        GROUP BY l.channel_name
    )
    SELECT c.channel_name,
           c.total - c.waiting - COALESCE(b.f + b.s + b.u + b.d, 0),
           COALESCE(b.f, 0), COALESCE(b.s, 0), COALESCE(b.u, 0), c.waiting,
           COALESCE(b.d, 0), COALESCE(b.b, 0),
           COALESCE(pg_catalog.date_part('epoch', ts OPERATOR(pg_catalog.-) o.at), 0),
           c.removed
    FROM counts c
    LEFT JOIN by_state b ON b.channel_name = c.channel_name
    LEFT JOIN LATERAL mq_oldest_ready(c.channel_name, ts) o(at) ON true
    WHERE c.total > 0
       OR (channel_names IS NOT NULL AND c.channel_name = ANY (channel_names))
    ORDER BY c.channel_name;
END;
$$;

-- When the oldest ready message of a channel became ready (NULL: none is
-- ready): a loose index scan over the channel's chain keys, one probe each.
CREATE OR REPLACE FUNCTION mq_oldest_ready(channel text, ts timestamptz)
RETURNS timestamptz
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    WITH RECURSIVE keys(k) AS (
        SELECT (SELECT m.channel_key FROM mq_msgs m
                WHERE m.dead_since IS NULL
                  AND (m.after_message_id IS NULL
                       OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                  AND m.channel_key >= (pg_catalog.hashtext(channel)::bigint << 32)
                  AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32)
                                        | 4294967295)
                ORDER BY m.channel_key LIMIT 1)
        UNION ALL
        SELECT (SELECT m.channel_key FROM mq_msgs m
                WHERE m.dead_since IS NULL
                  AND (m.after_message_id IS NULL
                       OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                  AND m.channel_key > keys.k
                  AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32)
                                        | 4294967295)
                ORDER BY m.channel_key LIMIT 1)
        FROM keys WHERE keys.k IS NOT NULL
    )
    SELECT pg_catalog.min(f.at)
    FROM keys,
    LATERAL (
        SELECT m.attempt_at AS at FROM mq_msgs m
        WHERE m.channel_key = keys.k
          AND m.dead_since IS NULL
          AND (m.after_message_id IS NULL
               OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
          AND m.ready_at <= ts
          AND m.attempt_at <= ts
          AND m.attempts > 0
          AND m.channel_name = channel
        ORDER BY m.ready_at
        LIMIT 1
    ) f
    WHERE keys.k IS NOT NULL AND f.at <= ts
$$;

-- The next max_rows messages of a channel (and of one chain when
-- channel_args is not NULL) in the order polls would deliver them, without
-- claiming or locking anything (args NULL: all chains): first the chain heads and unordered
-- messages by the time they become ready, then the ordered messages behind
-- them, chain by chain, each in chain order. Dead messages are left out
-- (pqmq dead lists them). state is as in mq_metrics.
CREATE OR REPLACE FUNCTION mq_peek(channel text, args text DEFAULT NULL,
                                   max_rows int DEFAULT 10)
RETURNS TABLE(id uuid, channel_args text, name text, state text,
              ready_in interval, attempt int, attempts_left int,
              is_ordered boolean, payload_json text, payload_bytes bytea,
              last_error text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts timestamptz := pg_catalog.clock_timestamp();
BEGIN
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > (mq_limits()).max_batch THEN
        RAISE EXCEPTION 'mq_peek: max_rows % is outside 1..%',
            max_rows, (mq_limits()).max_batch
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH RECURSIVE heads AS (
        -- Candidates: the (channel_key, ready_at) index, one key range.
        SELECT m.id, m.channel_args, m.attempt_at, m.deliveries, m.attempts,
               m.commit_interval, m.after_message_id
        FROM mq_msgs m
        WHERE m.dead_since IS NULL
          AND m.attempts > 0
          AND (m.after_message_id IS NULL
               OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
          AND m.channel_key >= (pg_catalog.hashtext(channel)::bigint << 32)
          AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32)
                                | 4294967295)
          AND m.channel_name = channel
          AND (args IS NULL OR m.channel_args = args)
        ORDER BY m.attempt_at, m.id
        LIMIT max_rows
    ),
    -- Followers, through the successor index, at most max_rows deep.
    chain(id, channel_args, attempt_at, deliveries, attempts, commit_interval,
          after_message_id, head_at, head_id, depth) AS (
        SELECT h.id, h.channel_args, h.attempt_at, h.deliveries, h.attempts,
               h.commit_interval, h.after_message_id, h.attempt_at, h.id, 0
        FROM heads h
        WHERE h.after_message_id IS NOT NULL
        UNION ALL
        SELECT s.id, s.channel_args, s.attempt_at, s.deliveries, s.attempts,
               s.commit_interval, s.after_message_id, c.head_at, c.head_id,
               c.depth + 1
        FROM chain c
        JOIN mq_msgs s ON s.after_message_id = c.id
                      AND s.after_message_id IS NOT NULL
                      AND s.after_message_id <> '00000000-0000-0000-0000-000000000000'::uuid
        WHERE c.depth < max_rows
    ),
    picked AS (
        SELECT h.id, h.channel_args, h.attempt_at, h.deliveries, h.attempts,
               h.commit_interval, h.after_message_id IS NOT NULL AS ordered,
               false AS behind, h.attempt_at AS k1, h.id AS k2, 0 AS k3
        FROM heads h
        UNION ALL
        SELECT c.id, c.channel_args, c.attempt_at, c.deliveries, c.attempts,
               c.commit_interval, true, true, c.head_at, c.head_id, c.depth
        FROM chain c
        WHERE c.depth > 0
    )
    SELECT p.id, p.channel_args, pl.name,
           CASE WHEN p.behind THEN 'waiting'
                WHEN p.attempt_at <= ts THEN 'ready'
                WHEN p.deliveries > 0 THEN 'in_flight'
                WHEN p.commit_interval IS NOT NULL THEN 'uncommitted'
                ELSE 'scheduled' END,
           GREATEST(p.attempt_at - ts, interval '0'),
           p.deliveries, p.attempts, p.ordered,
           pl.payload_json::text, pl.payload_bytes, pl.last_error
    FROM picked p
    LEFT JOIN LATERAL (
        SELECT q.name, q.payload_json, q.payload_bytes, q.last_error
        FROM mq_payloads q WHERE q.id = p.id LIMIT 1
    ) pl ON true
    ORDER BY p.behind, p.k1, p.k2, p.k3
    LIMIT max_rows;
END;
$$;

-- Keeps a message's place (ready_at) no later than attempt_at when
-- attempt_at is set from outside the functions here, e.g. an operator's
-- UPDATE mq_msgs SET attempt_at = now() to retry at once: polls find
-- messages by ready_at. The functions keep the two in step themselves, so
-- the WHEN clause is false for them and this never runs on the hot path.
CREATE OR REPLACE FUNCTION mq_keep_place()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    NEW.ready_at := NEW.attempt_at;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER mq_msgs_keep_place
    BEFORE INSERT OR UPDATE OF attempt_at ON mq_msgs
    FOR EACH ROW
    WHEN (NEW.attempt_at < NEW.ready_at AND NEW.ready_at <> 'infinity'::timestamptz)
    EXECUTE FUNCTION mq_keep_place();

-- CREATE OR REPLACE FUNCTION undid the pinned path and the grants.
SELECT mq_secure();

INSERT INTO mq_schema_migrations (version, name)
VALUES (9, '0009_hot_claim')
ON CONFLICT (version) DO NOTHING;
