-- pqmq schema, version 11: one row per message.
--
-- Until now a message was two rows: the hot one in mq_msgs and its payload
-- in mq_payloads. Each insert wrote two heap rows and two primary-key
-- entries, each claim probed mq_payloads for the payload, and each
-- completion deleted from both tables. Here the payload columns (name,
-- payload_json, payload_bytes, last_error) move into mq_msgs, and
-- mq_payloads becomes a view of them, so the seed's clients still read a
-- message's payload by id; the grants on the table pass to the view. An
-- UPDATE through the view changes the message; a DELETE deletes it.
--
-- The pick (mq_pick_set, mq_pick_keys, which replace mq_pick_batch and
-- mq_pick) returns the ctids of the row versions it locked beside their
-- ids, so the claim's UPDATE and the locked lane's read find the rows by
-- TID instead of probing the primary key again; and the locked lane's test
-- of a row's locker (mq_lock_spent) is written inline in it: a call per row
-- cost a fifth of that lane's poll.

ALTER TABLE mq_msgs
    ADD COLUMN IF NOT EXISTS name text,
    ADD COLUMN IF NOT EXISTS payload_json jsonb,
    ADD COLUMN IF NOT EXISTS payload_bytes bytea,
    ADD COLUMN IF NOT EXISTS last_error text;

-- Moves the payloads once: only while mq_payloads is still a table.
DO $$
DECLARE
    grantees   oid[];
    privileges text[];
BEGIN
    IF (SELECT c.relkind FROM pg_catalog.pg_class c
        WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('mq_payloads'))
       IS DISTINCT FROM 'r' THEN
        RETURN;
    END IF;
    UPDATE mq_msgs m SET name = p.name, payload_json = p.payload_json,
                         payload_bytes = p.payload_bytes, last_error = p.last_error
    FROM mq_payloads p
    WHERE p.id OPERATOR(pg_catalog.=) m.id;
    -- A message whose payload row was missing (deleted by hand) keeps an
    -- empty name, as mq_insert gives a message with none.
    UPDATE mq_msgs SET name = '' WHERE name IS NULL;
    SELECT pg_catalog.array_agg(a.grantee), pg_catalog.array_agg(a.privilege_type)
    INTO grantees, privileges
    FROM pg_catalog.pg_class c
    CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) a
    WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('mq_payloads')
      AND a.grantee OPERATOR(pg_catalog.<>) c.relowner;
    DROP TABLE mq_payloads;
    CREATE VIEW mq_payloads AS
        SELECT m.id, m.name, m.payload_json, m.payload_bytes, m.last_error
        FROM mq_msgs m;
    FOR i IN 1 .. COALESCE(pg_catalog.cardinality(grantees), 0) LOOP
        EXECUTE pg_catalog.format('GRANT %s ON mq_payloads TO %s', privileges[i],
            CASE WHEN grantees[i] OPERATOR(pg_catalog.=) 0::oid THEN 'PUBLIC'
                 ELSE grantees[i]::regrole::text END);
    END LOOP;
END
$$;

ALTER TABLE mq_msgs ALTER COLUMN name SET NOT NULL;

CREATE OR REPLACE VIEW mq_payloads AS
    SELECT m.id, m.name, m.payload_json, m.payload_bytes, m.last_error
    FROM mq_msgs m;

-- Records each touched chain's new tail: the batch's last message on it.
-- Called by mq_insert under the chains' locks. Each chain's row is found
-- by a probe of its key (a LATERAL index scan per chain) and then updated
-- by TID: a join of the batch's chains with mq_chains was a nested loop,
-- n² per batch.
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
DECLARE
    at_tid  tid[];  -- the chains' rows, sorted, and each one's new tail
    at_id   uuid[];
    new_n   text[]; -- chains with no row yet
    new_a   text[];
    new_id  uuid[];
BEGIN
    WITH last AS (
        SELECT DISTINCT ON (t.channel_name, COALESCE(t.channel_args, ''))
               t.channel_name, COALESCE(t.channel_args, '') AS args, t.id
        FROM unnest(new_messages) WITH ORDINALITY AS t
        WHERE t.ordered
        ORDER BY t.channel_name, COALESCE(t.channel_args, ''), t.ordinality DESC
    ),
    found AS (
        SELECT l.channel_name, l.args, l.id, c.ctid AS at
        FROM last l
        LEFT JOIN LATERAL (
            SELECT c.ctid FROM mq_chains c
            WHERE c.channel_key = ((hashtext(l.channel_name)::bigint << 32)
                                   | (hashtext(l.args)::bigint & 4294967295))
              AND c.channel_name = l.channel_name
              AND c.channel_args = l.args
            OFFSET 0 -- a probe per chain: never flattened into a join
        ) c ON true
    )
    SELECT array_agg(f.at ORDER BY f.at) FILTER (WHERE f.at IS NOT NULL),
           array_agg(f.id ORDER BY f.at) FILTER (WHERE f.at IS NOT NULL),
           array_agg(f.channel_name) FILTER (WHERE f.at IS NULL),
           array_agg(f.args) FILTER (WHERE f.at IS NULL),
           array_agg(f.id) FILTER (WHERE f.at IS NULL)
    INTO at_tid, at_id, new_n, new_a, new_id
    FROM found f;

    IF at_tid IS NOT NULL THEN
        UPDATE mq_chains c SET tail_id = at_id[width_bucket(c.ctid, at_tid)]
        WHERE c.ctid = ANY (at_tid);
    END IF;
    IF new_id IS NOT NULL THEN
        INSERT INTO mq_chains (channel_name, channel_args, tail_id)
        SELECT * FROM unnest(new_n, new_a, new_id);
    END IF;
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
    -- The members that left sorted by id, with their predecessors; then
    -- the same for what walk found: rows are matched to them by binary
    -- search (width_bucket), since joining the arrays was a nested loop,
    -- n² per batch.
    s_id    uuid[];
    s_after uuid[];
    o_id    uuid[];
    o_pred  uuid[];
    h_tid    tid[];  -- chain rows whose tail left: sorted, with the new tail
    h_pred   uuid[];
    gone_tid tid[];  -- chain rows of chains now empty
    nil      uuid := '00000000-0000-0000-0000-000000000000';
BEGIN
    SELECT array_agg(u.id ORDER BY u.id), array_agg(u.after ORDER BY u.id)
    INTO s_id, s_after
    FROM unnest(g_id, g_after) AS u(id, after);

    -- Each member that left walks back over the members that left with it
    -- to the nearest predecessor that stayed.
    WITH RECURSIVE walk(id, pred, cn, ca) AS (
        SELECT u.id, u.after, u.cn, u.ca
        FROM unnest(g_id, g_after, g_name, g_args) AS u(id, after, cn, ca)
        UNION ALL
        SELECT w.id, s_after[width_bucket(w.pred, s_id)], w.cn, w.ca
        FROM walk w
        WHERE s_id[width_bucket(w.pred, s_id)] = w.pred
    )
    SELECT array_agg(w.id), array_agg(w.pred), array_agg(w.cn), array_agg(w.ca)
    INTO r_id, r_pred, r_name, r_args
    FROM walk w
    WHERE s_id[width_bucket(w.pred, s_id)] IS DISTINCT FROM w.pred;

    SELECT array_agg(u.id ORDER BY u.id), array_agg(u.pred ORDER BY u.id)
    INTO o_id, o_pred
    FROM unnest(r_id, r_pred) AS u(id, pred);

    WITH moved AS (
        UPDATE mq_msgs s SET after_message_id = o_pred[width_bucket(s.after_message_id, o_id)]
        -- Found by after_message_id = ANY: an index condition on
        -- mq_msgs_successor, whose predicate follows.
        WHERE s.after_message_id = ANY (o_id)
          AND s.after_message_id IS NOT NULL
          AND s.after_message_id <> '00000000-0000-0000-0000-000000000000'::uuid
        RETURNING s.channel_name, s.after_message_id AS pred
    )
    SELECT array_agg(DISTINCT mv.channel_name) INTO chans
    FROM moved mv
    WHERE mv.pred = '00000000-0000-0000-0000-000000000000'::uuid;

    -- Chains whose recorded tail left: found by a probe of each chain's
    -- key, then handed back to the nearest predecessor that stayed, or
    -- forgotten when the chain emptied (by TID, as in mq_record_tails).
    SELECT array_agg(c.at ORDER BY c.at) FILTER (WHERE u.pred <> nil),
           array_agg(u.pred ORDER BY c.at) FILTER (WHERE u.pred <> nil),
           array_agg(c.at) FILTER (WHERE u.pred = nil)
    INTO h_tid, h_pred, gone_tid
    FROM unnest(r_id, r_pred, r_name, r_args) AS u(id, pred, cn, ca),
    LATERAL (
        SELECT c.ctid AS at FROM mq_chains c
        WHERE c.channel_key = ((hashtext(u.cn)::bigint << 32)
                               | (hashtext(u.ca)::bigint & 4294967295))
          AND c.channel_name = u.cn
          AND c.channel_args = u.ca
          AND c.tail_id = u.id
        OFFSET 0 -- a probe per chain: never flattened into a join
    ) c;
    IF h_tid IS NOT NULL THEN
        UPDATE mq_chains c SET tail_id = h_pred[width_bucket(c.ctid, h_tid)]
        WHERE c.ctid = ANY (h_tid);
    END IF;
    IF gone_tid IS NOT NULL THEN
        DELETE FROM mq_chains c WHERE c.ctid = ANY (gone_tid);
    END IF;
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

    IF NOT has_ordered THEN
        -- No chains to extend: a plain insert.
        INSERT INTO mq_msgs (id, created_at, attempt_at, attempts, retry_backoff,
                             channel_name, channel_args, commit_interval, ready_at,
                             name, payload_json, payload_bytes)
        SELECT t.id, ts,
               ts + COALESCE(t.delay, interval '0')
                  + COALESCE(t.commit_interval, interval '0'),
               LEAST(COALESCE(t.retries, 4)::bigint + 1, 2147483647)::int,
               COALESCE(t.retry_backoff, interval '1 second'),
               t.channel_name, COALESCE(t.channel_args, ''), t.commit_interval,
               ts + COALESCE(t.delay, interval '0')
                  + COALESCE(t.commit_interval, interval '0'),
               COALESCE(t.name, ''), t.payload_json::jsonb, t.payload_bytes
        FROM unnest(new_messages) AS t;
    ELSE
        WITH batch AS (
            SELECT t.*, COALESCE(t.channel_args, '') AS args
            FROM unnest(new_messages) WITH ORDINALITY AS t(
                id, delay, retries, retry_backoff, channel_name, channel_args,
                commit_interval, ordered, name, payload_json, payload_bytes, ord)
        )
        INSERT INTO mq_msgs (id, created_at, attempt_at, attempts, retry_backoff,
                             channel_name, channel_args, commit_interval,
                             after_message_id, ready_at, name, payload_json,
                             payload_bytes)
        SELECT b.id, ts,
               ts + COALESCE(b.delay, interval '0')
                  + COALESCE(b.commit_interval, interval '0'),
               LEAST(COALESCE(b.retries, 4)::bigint + 1, 2147483647)::int,
               COALESCE(b.retry_backoff, interval '1 second'),
               b.channel_name, b.args, b.commit_interval,
               CASE WHEN b.ordered THEN COALESCE(
                   lag(b.id) OVER chain,
                   -- The chain's live tail, for its first message in the
                   -- batch only: a probe of its key (a join of the batch
                   -- with the chains' tails was a nested loop, n² per
                   -- batch). A scalar subquery stays a probe by id, where
                   -- EXISTS could become a join that reads the primary key
                   -- whole.
                   (SELECT c.tail_id FROM mq_chains c
                    WHERE c.channel_key = ((hashtext(b.channel_name)::bigint << 32)
                                           | (hashtext(b.args)::bigint & 4294967295))
                      AND c.channel_name = b.channel_name
                      AND c.channel_args = b.args
                      AND (SELECT m.id FROM mq_msgs m WHERE m.id = c.tail_id) IS NOT NULL
                    LIMIT 1),
                   '00000000-0000-0000-0000-000000000000'::uuid)
               END,
               ts + COALESCE(b.delay, interval '0')
                  + COALESCE(b.commit_interval, interval '0'),
               COALESCE(b.name, ''), b.payload_json::jsonb, b.payload_bytes
        FROM batch b
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

-- Picks up to batch_size ready messages fairly across channels and locks
-- them (FOR NO KEY UPDATE SKIP LOCKED); returns their ids and, in the same
-- order, the ctids of the row versions it locked: the caller finds the rows
-- again by TID, with no index probe (a locked row version stays where it
-- is until this transaction ends). lane 0: every
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
CREATE OR REPLACE FUNCTION mq_pick_set(channel_names text[], batch_size int,
                                       ts timestamptz, lane int,
                                       OUT ids uuid[], OUT tids tid[])
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
    got     uuid[];
    got_tid tid[];
    -- This transaction's id, for the test of xmax (lanes 1 and 2).
    me      bigint := CASE WHEN lane <> 0 THEN pg_current_xact_id()::text::bigint END;
    me_lo   bigint := me & 4294967295;
    per_key int;
    budget  int;
    nm      text;
    lo      bigint;
    hi      bigint;
    low     timestamptz; -- see mq_pick_keys
BEGIN
    IF batch_size IS NULL OR batch_size < 1 OR batch_size > (mq_limits()).max_batch THEN
        RAISE EXCEPTION 'mq_poll: batch_size % is outside 1..%',
            batch_size, (mq_limits()).max_batch
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    per_key := GREATEST(1, (batch_size + 3) / 4);
    budget := 2 * batch_size + 16;
    ids := '{}';
    tids := '{}';

    IF channel_names IS NULL THEN
        SELECT p.ids, p.tids, p.low INTO ids, tids, low
        FROM mq_pick_keys(NULL, -9223372036854775808, 9223372036854775807,
                          per_key, batch_size, budget, ts, lane, ids, tids, low) p;
    ELSE
        -- Round 1 takes up to per_key from each named channel; round 2 takes
        -- more from channels that had more to give.
        FOR round IN 1..2 LOOP
            FOR nm IN SELECT d.n FROM (SELECT DISTINCT n FROM unnest(channel_names) AS n
                                      WHERE n IS NOT NULL) d
                      ORDER BY random() LOOP
                EXIT WHEN cardinality(ids) >= batch_size;
                lo := hashtext(nm)::bigint << 32;
                hi := lo | 4294967295;
                SELECT p.ids, p.tids, p.low INTO ids, tids, low
                FROM mq_pick_keys(nm, lo, hi,
                                  CASE WHEN round = 1 THEN per_key ELSE batch_size END,
                                  batch_size, budget, ts, lane, ids, tids, low) p;
            END LOOP;
        END LOOP;
    END IF;

    -- Unfiltered polls top up from the time index, O(batch log n). When the
    -- channels' scan took something, the top-up starts at the first
    -- claimable message it found (low): the messages in flight before it
    -- were stepped over once already. What is older still sits in channels
    -- the scan's budget left unvisited, for a later poll from another
    -- random point.
    IF channel_names IS NULL AND cardinality(ids) < batch_size THEN
        SELECT array_agg(s.id), array_agg(s.ctid) INTO got, got_tid FROM (
            SELECT m.id, m.ctid FROM mq_msgs m
            WHERE m.dead_since IS NULL
              AND (m.after_message_id IS NULL
                   OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
              AND m.ready_at > '-infinity'::timestamptz -- mq_msgs_ready_by_time
              AND m.ready_at >= COALESCE(low, '-infinity'::timestamptz)
              AND m.ready_at <= ts
              -- Steps over the messages in flight (see ready_at).
              AND m.attempt_at <= ts
              AND m.attempts > 0
              AND (lane = 0 OR (lane = 1) = (m.deliveries = 0
                                             AND (m.xmax = '0'::xid
                                                  OR NOT CASE -- spent (mq_pick_keys)
                    WHEN m.xmax::text::bigint < 3 THEN false
                    WHEN (me_lo - m.xmax::text::bigint + 6442450944) % 4294967296
                         - 2147483648 < 0 THEN false
                    WHEN m.xmax::text::bigint = me_lo THEN true
                    ELSE COALESCE(pg_xact_status((me - ((me_lo - m.xmax::text::bigint
                                                          + 6442450944) % 4294967296
                                                         - 2147483648))::text::xid8)
                                  = 'aborted', false)
                    END)))
              AND m.id <> ALL (ids)
            ORDER BY m.ready_at
            LIMIT batch_size - cardinality(ids)
            FOR NO KEY UPDATE SKIP LOCKED
        ) s;
        ids := ids || COALESCE(got, '{}');
        tids := tids || COALESCE(got_tid, '{}');
    END IF;
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
    tids    tid[];
    max_dur interval := (mq_limits()).max_duration; -- once, not per row
BEGIN
    SELECT p.ids, p.tids INTO picked, tids
    FROM mq_pick_set(channel_names, batch_size, ts, lane) p;

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
            -- The row versions the pick locked, by TID: no index probe,
            -- whatever the statistics say.
            WHERE m.ctid = ANY (tids)
            RETURNING m.id, m.commit_interval IS NULL AS committed,
                      m.attempt_at - ts AS lease, m.channel_name,
                      m.channel_args, m.deliveries, m.attempts, m.ready_at,
                      m.name, m.payload_json, m.payload_bytes
        )
        SELECT c.id, c.committed, c.name, c.payload_json::text, c.payload_bytes,
               c.lease, interval '0', c.channel_name, c.channel_args,
               c.deliveries, c.attempts, NULL::text, false
        FROM claimed c
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
    tids   tid[];
BEGIN
    SELECT p.ids, p.tids INTO picked, tids
    FROM mq_pick_set(channel_names, batch_size, ts, 1) p;
    IF cardinality(picked) > 0 THEN
        RETURN QUERY
        SELECT m.id, m.commit_interval IS NULL, m.name, m.payload_json::text,
               m.payload_bytes, interval '0', interval '0', m.channel_name,
               m.channel_args, m.deliveries + 1, m.attempts - 1, NULL::text, false
        FROM mq_msgs m
        WHERE m.ctid = ANY (tids) -- the locked row versions (mq_pick_set)
        ORDER BY m.ready_at, m.id;
        RETURN;
    END IF;
    RETURN QUERY SELECT NULL::uuid, NULL::boolean, NULL::text, NULL::text,
        NULL::bytea, NULL::interval, mq_wait_time(channel_names, ts),
        NULL::text, NULL::text, NULL::int, NULL::int, NULL::text, NULL::boolean;
END;
$$;

-- One visit of the channels whose chain key lies in [lo, hi], starting at a
-- random key and wrapping around once: takes up to per_key ready messages
-- from each channel, up to `want` in all, visiting at most `budget` channels
-- per direction. Locks what it returns (FOR NO KEY UPDATE SKIP LOCKED), so
-- concurrent pollers skip each other's rows instead of waiting. Appends the
-- ids to ids and the locked row versions' ctids to tids (ids also says what
-- not to take again), and lowers low to the place (ready_at) of the first
-- claimable message of the channels it took from. lane: as in mq_pick_set.
--
-- The locked lane (lane 1) passes a row by when its locker (xmax) spent it:
-- the locker ended without committing, so the row's locked delivery died
-- with its consumer (a crash, a lost connection, a rollback); or the locker
-- is this transaction, which holds the row already (SKIP LOCKED skips only
-- other transactions' locks). xmax has 32 bits: the locker's full id is
-- found from this transaction's (me), both within 2^31 of each other; a
-- locker newer than this transaction counts as alive (it may still run).
-- The test is written out inline, here and in mq_pick_set: a function
-- call per row (mq_lock_spent, until migration 0011) cost a fifth of the
-- locked lane's poll.
CREATE OR REPLACE FUNCTION mq_pick_keys(only_name text, lo bigint, hi bigint,
                                        per_key int, want int, budget int,
                                        ts timestamptz, lane int,
                                        INOUT ids uuid[], INOUT tids tid[],
                                        INOUT low timestamptz)
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
    got_tid tid[];
    got_at timestamptz;
    -- This transaction's id, for the test of xmax (lanes 1 and 2).
    me    bigint := CASE WHEN lane <> 0 THEN pg_current_xact_id()::text::bigint END;
    me_lo bigint := me & 4294967295;
BEGIN
    -- Each probe finds the next chain key that has a claimable message, and
    -- where in the key that message is (at): the messages in flight and the
    -- dead entries before it are stepped over once, by the probe, and the
    -- key's scan starts at it. A key with nothing claimable is passed by.
    SELECT array_agg(j.id), array_agg(j.ctid), min(j.at) INTO got, got_tid, got_at FROM (
        WITH RECURSIVE up(k, at, n) AS (
            SELECT f.k, f.at, 1 FROM (
                SELECT m.channel_key AS k, m.ready_at AS at FROM mq_msgs m
                WHERE m.dead_since IS NULL
                  AND (m.after_message_id IS NULL
                       OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                  AND m.ready_at <= ts AND m.attempt_at <= ts AND m.attempts > 0
                  AND (only_name IS NULL OR m.channel_name = only_name)
                  AND m.id <> ALL (ids)
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
                  AND m.id <> ALL (ids)
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
                  AND m.id <> ALL (ids)
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
                  AND m.id <> ALL (ids)
                  AND m.channel_key > around.k AND m.channel_key < start
                ORDER BY m.channel_key, m.ready_at LIMIT 1) f
            WHERE around.n < budget
        )
        SELECT r.id, r.ctid, ks.at
        FROM (SELECT up.k, up.at FROM up
              UNION ALL
              SELECT around.k, around.at FROM around) ks,
        LATERAL (
            SELECT m.id, m.ctid FROM mq_msgs m
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
              AND m.id <> ALL (ids)
              -- The locked lane: first deliveries not left by a dead locker.
              AND (lane = 0 OR (lane = 1) = (m.deliveries = 0
                                             AND (m.xmax = '0'::xid
                                                  OR NOT CASE -- spent (above)
                    WHEN m.xmax::text::bigint < 3 THEN false
                    WHEN (me_lo - m.xmax::text::bigint + 6442450944) % 4294967296
                         - 2147483648 < 0 THEN false
                    WHEN m.xmax::text::bigint = me_lo THEN true
                    ELSE COALESCE(pg_xact_status((me - ((me_lo - m.xmax::text::bigint
                                                          + 6442450944) % 4294967296
                                                         - 2147483648))::text::xid8)
                                  = 'aborted', false)
                    END)))
            ORDER BY m.ready_at
            LIMIT per_key
            FOR NO KEY UPDATE SKIP LOCKED
        ) r
        LIMIT want - cardinality(ids)
    ) j;
    ids := ids || COALESCE(got, '{}');
    tids := tids || COALESCE(got_tid, '{}');
    low := LEAST(low, got_at);
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
                        ELSE GREATEST(m.attempt_at, ts + duration) END,
        payload_json = COALESCE(new_payload_json::jsonb, m.payload_json),
        payload_bytes = COALESCE(new_payload_bytes, m.payload_bytes)
    WHERE m.id = msg_id
      AND m.deliveries > 0
      AND m.attempt_at > ts;
    RETURN FOUND;
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
                        ELSE m.ready_at END,
        last_error = left(error, 10000)
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
                            ELSE m.ready_at END,
            last_error = left(error, 10000)
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
    IF dead THEN
        PERFORM pg_notify('mq_dead', '');
    END IF;
    RETURN true;
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
    SELECT m.id, m.channel_name, m.channel_args, m.name, m.deliveries,
           m.last_error, m.dead_since, m.after_message_id IS NOT NULL,
           m.payload_json::text, m.payload_bytes
    FROM mq_msgs m
    WHERE m.dead_since IS NOT NULL
      AND (channel_names IS NULL OR m.channel_name = ANY (channel_names))
    ORDER BY m.dead_since, m.id
    LIMIT max_rows;
END;
$$;

-- Deletes the messages of one channel (of one chain when channel_args is
-- not NULL; only dead ones when dead_only), whatever their state, and
-- returns what it deleted. Chains are repaired as by mq_complete (which it
-- calls), so nothing of another channel is touched. A consumer still
-- holding one of them finds it gone when it completes (ignored).
CREATE OR REPLACE FUNCTION mq_purge(channel text, args text DEFAULT NULL,
                                    dead_only boolean DEFAULT false)
RETURNS TABLE(id uuid, channel_args text, name text, was_dead boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ids   uuid[];
    argss text[];
    names text[];
    dead  boolean[];
BEGIN
    IF channel IS NULL OR channel = '' THEN
        RAISE EXCEPTION 'mq_purge: channel is NULL or empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM mq_reap_dead();
    -- Locked first, so that what is returned is what is deleted.
    SELECT pg_catalog.array_agg(v.id ORDER BY v.channel_args, v.id),
           pg_catalog.array_agg(v.channel_args ORDER BY v.channel_args, v.id),
           pg_catalog.array_agg(v.name ORDER BY v.channel_args, v.id),
           pg_catalog.array_agg(v.was_dead ORDER BY v.channel_args, v.id)
    INTO ids, argss, names, dead
    FROM (
        SELECT m.id, m.channel_args, m.name, m.dead_since IS NOT NULL AS was_dead
        FROM mq_msgs m
        WHERE m.channel_name = channel
          AND (args IS NULL OR m.channel_args = args)
          AND (NOT COALESCE(dead_only, false) OR m.dead_since IS NOT NULL)
        FOR UPDATE OF m
    ) v;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    PERFORM mq_complete(ids);
    RETURN QUERY SELECT u.id, u.a, u.n, u.d
                 FROM unnest(ids, argss, names, dead) AS u(id, a, n, d);
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
    SELECT p.id, p.channel_args, m.name,
           CASE WHEN p.behind THEN 'waiting'
                WHEN p.attempt_at <= ts THEN 'ready'
                WHEN p.deliveries > 0 THEN 'in_flight'
                WHEN p.commit_interval IS NOT NULL THEN 'uncommitted'
                ELSE 'scheduled' END,
           GREATEST(p.attempt_at - ts, interval '0'),
           p.deliveries, p.attempts, p.ordered,
           m.payload_json::text, m.payload_bytes, m.last_error
    FROM picked p
    LEFT JOIN LATERAL (
        SELECT q.name, q.payload_json, q.payload_bytes, q.last_error
        FROM mq_msgs q WHERE q.id = p.id LIMIT 1
    ) m ON true
    ORDER BY p.behind, p.k1, p.k2, p.k3
    LIMIT max_rows;
END;
$$;

-- Replaced by mq_pick_set and mq_pick_keys (they return the locked rows'
-- ctids too); the test of a row's locker is inline in them.
DROP FUNCTION IF EXISTS mq_pick_batch(text[], int, timestamptz, int);
DROP FUNCTION IF EXISTS mq_pick(text, bigint, bigint, int, int, int, uuid[], timestamptz, int);
DROP FUNCTION IF EXISTS mq_lock_spent(xid);

-- CREATE OR REPLACE FUNCTION undid the pinned path and the grants.
SELECT mq_secure();
SELECT mq_regrant();

INSERT INTO mq_schema_migrations (version, name)
VALUES (11, '0011_one_row')
ON CONFLICT (version) DO NOTHING;
