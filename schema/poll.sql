-- schema/poll.sql: the poll entry points: mq_claim and its lanes
-- (mq_claim_lane, mq_claim_locked), the seed's mq_poll and mq_poll_jobs,
-- and what an empty poll answers (_mq_wait_time, from the chain heads of
-- _mq_chain_heads). What they pick is chosen in schema/pick.sql.

-- The heads of the chains whose key lies in [lo, hi] (only_name's, when not
-- NULL), in key order: the first entry of each chain key in mq_msgs_chain,
-- at most `most` keys visited (NULL: all), and none after the first live
-- head due by due_by (NULL: to the end). _mq_next_head_at stops at a head
-- due now, which answers its question: an empty poll of the locked lane,
-- whose workers hold most heads, walked every chain to learn it. A loose
-- index scan, one probe a statement: on Citus each probe is a router query,
-- where a recursive scan is not one it can ship ("column ... does not
-- exist"). _mq_next_head_at, mq_metrics, _mq_oldest_ready and mq_peek read
-- the heads here; run it in a statement of its own (on Citus a statement
-- that reads the queue's tables runs on the worker, where this function
-- cannot).
CREATE OR REPLACE FUNCTION _mq_chain_heads(lo bigint, hi bigint, only_name text, most int,
                                           due_by timestamptz)
RETURNS TABLE(head_id uuid, head_key bigint, head_name text, head_at timestamptz,
              head_ready_at timestamptz, head_attempts int, head_deliveries int,
              head_dead boolean, head_uncommitted boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    from_k bigint := lo;
    seen   int := 0;
BEGIN
    LOOP
        SELECT m.id, m.channel_key, m.channel_name, m.attempt_at, m.ready_at, m.attempts,
               m.deliveries, m.dead_since IS NOT NULL, m.commit_interval IS NOT NULL
        INTO head_id, head_key, head_name, head_at, head_ready_at, head_attempts,
             head_deliveries, head_dead, head_uncommitted
        FROM mq_rows m
        WHERE m.chain_seq IS NOT NULL -- mq_msgs_chain
          AND m.channel_key >= from_k AND m.channel_key <= hi
        ORDER BY m.channel_key, m.chain_seq LIMIT 1;
        EXIT WHEN NOT FOUND;
        IF only_name IS NULL OR head_name = only_name THEN
            RETURN NEXT;
            EXIT WHEN head_at <= due_by AND NOT head_dead AND head_attempts > 0;
        END IF;
        seen := seen + 1;
        EXIT WHEN head_key = hi OR seen >= most;
        from_k := head_key + 1;
    END LOOP;
END;
$$;

-- When the earliest head of the chains whose key lies in [lo, hi] (and of
-- only_name's, when not NULL) comes due: its lease or delay ends (a time
-- past: ready now, but held by another transaction). At most 1000 chains
-- (_mq_chain_heads): a queue with more may answer later than its earliest
-- head (a poll still finds it).
CREATE OR REPLACE FUNCTION _mq_next_head_at(lo bigint, hi bigint, only_name text,
                                            paused boolean DEFAULT false)
RETURNS timestamptz
-- (PL/pgSQL keeps its plan: a SQL function with a SET clause is parsed and
-- planned again at every call, a large part of an empty poll.)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    -- (read in a statement of its own: on Citus a statement that reads a
    -- queue table runs on the worker, where _mq_chain_heads cannot)
    names text[] := CASE WHEN paused THEN ARRAY(SELECT p.channel_name FROM mq_paused p) END;
BEGIN
    -- A paused channel's heads are passed (paused: some channel is), so
    -- the walk does not stop at the first head due.
    RETURN (SELECT min(h.head_at)
            FROM _mq_chain_heads(lo, hi, only_name, 1000,
                                 CASE WHEN NOT paused THEN clock_timestamp() END) h
            WHERE NOT h.head_dead AND h.head_attempts > 0
              AND (NOT paused OR h.head_name <> ALL (names)));
END;
$$;

-- How long until the earliest candidate of these channels (NULL: all)
-- becomes ready: a message that is not ready yet (one probe), a lease
-- that runs out (the messages in flight, which the poll just stepped over;
-- in the log, a receipt's that still holds a member), a chain's head that
-- comes due (_mq_next_head_at: only when chained, _mq_pick_set's answer),
-- or now for a logged message past its cursor (the poll passed it: another
-- transaction holds the cursor, or its lane is not the caller's). NULL when
-- there is none. A paused channel's messages (paused: the poll's probe of
-- mq_paused found one) are no candidates: they wait for mq_resume, whose
-- notification wakes the pollers.
CREATE OR REPLACE FUNCTION _mq_wait_time(channel_names text[], ts timestamptz,
                                         chained boolean, paused boolean DEFAULT false)
RETURNS interval
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    citus   boolean := COALESCE(current_setting('pqmq.citus', true) = 'on', false); -- (no log)
    next_at timestamptz;
    -- Leases of the messages in flight, from where live rows start.
    mark    timestamptz := _mq_low_mark(ts, false);
    rg      record;
    x       record;
    seen    int;
    -- How far ahead the receipts' leases are read: one that runs out
    -- later is answered as this wait (a poll then looks again).
    ahead   interval := interval '5 seconds';
BEGIN
    -- chained is _mq_pick_set's probe, made once a poll: a queue without
    -- chains has no head to come due, and skips their walk
    -- (_mq_next_head_at, a good part of an empty poll).
    IF channel_names IS NULL THEN
        -- (A statement of its own while a channel is paused: the filter
        -- would change the estimates, and so the plan, of the other.)
        IF NOT paused THEN
            SELECT LEAST(
                (SELECT m.ready_at FROM mq_rows m
                 WHERE m.dead_since IS NULL
                   AND m.after_message_id IS NULL
                   AND m.ready_at > '-infinity'::timestamptz
                   AND m.ready_at > ts AND m.ready_at < 'infinity'::timestamptz
                 ORDER BY m.ready_at LIMIT 1),
                (SELECT min(m.attempt_at) FROM mq_rows m
                 WHERE m.dead_since IS NULL
                   AND m.after_message_id IS NULL
                   AND m.ready_at > '-infinity'::timestamptz
                   AND m.ready_at >= mark AND m.ready_at <= ts
                   AND m.attempts > 0))
            INTO next_at;
        ELSE
            SELECT LEAST(
                (SELECT m.ready_at FROM mq_rows m
                 WHERE m.dead_since IS NULL
                   AND m.after_message_id IS NULL
                   AND m.ready_at > '-infinity'::timestamptz
                   AND m.ready_at > ts AND m.ready_at < 'infinity'::timestamptz
                   AND NOT EXISTS (SELECT 1 FROM mq_paused p
                                   WHERE p.channel_name = m.channel_name)
                 ORDER BY m.ready_at LIMIT 1),
                (SELECT min(m.attempt_at) FROM mq_rows m
                 WHERE m.dead_since IS NULL
                   AND m.after_message_id IS NULL
                   AND m.ready_at > '-infinity'::timestamptz
                   AND m.ready_at >= mark AND m.ready_at <= ts
                   AND m.attempts > 0
                   AND NOT EXISTS (SELECT 1 FROM mq_paused p
                                   WHERE p.channel_name = m.channel_name)))
            INTO next_at;
        END IF;
        -- (Its own statement: on Citus a statement that reads the queue's
        -- tables runs on the worker, where this function cannot.)
        IF chained THEN
            next_at := LEAST(next_at, _mq_next_head_at(-9223372036854775808,
                                                      9223372036854775807, NULL, paused));
        END IF;
    ELSE
        -- A paused channel's messages are no candidates: its name is left
        -- out here, and so of the log's part below.
        IF paused THEN
            channel_names := ARRAY(SELECT u.n FROM unnest(channel_names) AS u(n)
                                   WHERE NOT EXISTS (SELECT 1 FROM mq_paused p
                                                     WHERE p.channel_name = u.n));
        END IF;
        -- Each channel index (plain and urgent) for its range of chain keys.
        SELECT min(LEAST(
            (SELECT m.ready_at FROM mq_rows m
             WHERE m.priority <= 0 -- mq_msgs_ready_plain
               AND _mq_in_channel(m.dead_since, m.after_message_id, m.channel_key,
                                 m.channel_name, c.n)
               AND m.ready_at > ts AND m.ready_at < 'infinity'::timestamptz
             ORDER BY m.ready_at LIMIT 1),
            (SELECT min(m.attempt_at) FROM mq_rows m
             WHERE m.priority <= 0
               AND _mq_in_channel(m.dead_since, m.after_message_id, m.channel_key,
                                 m.channel_name, c.n)
               AND m.ready_at >= mark AND m.ready_at <= ts AND m.attempts > 0),
            (SELECT m.ready_at FROM mq_rows m
             WHERE m.priority > 0 -- mq_msgs_ready_urgent
               AND _mq_in_channel(m.dead_since, m.after_message_id, m.channel_key,
                                 m.channel_name, c.n)
               AND m.ready_at > ts AND m.ready_at < 'infinity'::timestamptz
             ORDER BY m.ready_at LIMIT 1),
            (SELECT min(m.attempt_at) FROM mq_rows m
             WHERE m.priority > 0
               AND _mq_in_channel(m.dead_since, m.after_message_id, m.channel_key,
                                 m.channel_name, c.n)
               AND m.ready_at >= mark AND m.ready_at <= ts AND m.attempts > 0)))
        INTO next_at
        FROM (SELECT DISTINCT n FROM unnest(channel_names) AS n) c;
        -- (As above: a statement that reads no table.)
        IF chained THEN
            next_at := LEAST(next_at, (
                SELECT min(_mq_next_head_at(hashtext(c.n)::bigint << 32,
                                           (hashtext(c.n)::bigint << 32) | 4294967295, c.n))
                FROM (SELECT DISTINCT n FROM unnest(channel_names) AS n) c));
        END IF;
    END IF;
    -- The log, over the whole key space or each name's range.
    FOR rg IN SELECT (-9223372036854775808)::bigint AS lo, 9223372036854775807::bigint AS hi
              WHERE channel_names IS NULL AND NOT citus
              UNION
              SELECT hashtext(u.n)::bigint << 32, (hashtext(u.n)::bigint << 32) | 4294967295
              FROM unnest(channel_names) AS u(n) WHERE u.n IS NOT NULL AND NOT citus LOOP
        EXIT WHEN next_at <= ts;
        -- A message past its cursor that this poll passed is ready now, for
        -- a poll made once the cursor's holder ends (no notification says
        -- when): a locked-lane worker's cursor, or one whose locked delivery
        -- died, which the lease lane takes before the locked lane goes on.
        -- (A paused channel's cursors are passed, in a statement of its own,
        -- as above.)
        IF NOT paused AND EXISTS (
               SELECT 1 FROM mq_cursors c
               WHERE c.channel_key >= rg.lo AND c.channel_key <= rg.hi
                 AND EXISTS (SELECT 1 FROM mq_log l
                             WHERE l.channel_key = c.channel_key AND l.place > c.place
                               AND NOT EXISTS (SELECT 1 FROM mq_log_gone g
                                               WHERE g.channel_key = l.channel_key
                                                 AND g.place = l.place)))
           OR paused AND EXISTS (
               SELECT 1 FROM mq_cursors c
               WHERE c.channel_key >= rg.lo AND c.channel_key <= rg.hi
                 AND NOT EXISTS (SELECT 1 FROM mq_paused p
                                 WHERE p.channel_name = c.channel_name)
                 AND EXISTS (SELECT 1 FROM mq_log l
                             WHERE l.channel_key = c.channel_key AND l.place > c.place
                               AND NOT EXISTS (SELECT 1 FROM mq_log_gone g
                                               WHERE g.channel_key = l.channel_key
                                                 AND g.place = l.place))) THEN
            next_at := ts;
            EXIT;
        END IF;
        -- A lease that ran out, which the poll's reap passed (a completion
        -- holds its receipt, or more than the reap's 64 ran out): poll
        -- again now. Not this transaction's own locked-lane receipts.
        IF EXISTS (SELECT 1 FROM mq_receipts r
                   WHERE r.lease_until < 'infinity'::timestamptz -- mq_receipts_open
                     AND r.lease_until <= ts
                     AND (channel_names IS NULL
                          OR r.channel_key >= rg.lo AND r.channel_key <= rg.hi)
                     AND (r.holder IS NULL
                          OR r.holder IS DISTINCT FROM pg_current_xact_id_if_assigned())) THEN
            next_at := ts;
            EXIT;
        END IF;
        -- A lease that runs out within `ahead`: the earliest of those
        -- that still hold a member (neither completed nor moved), at most
        -- 64 looked at (past them: the last one's). The read is bounded on
        -- both sides: the open receipts' index keeps an entry for every
        -- receipt finished since the last vacuum, at its old lease, and a
        -- read of all of them would grow with each finished receipt. (The
        -- whole key space is no index condition: a plan would read every
        -- entry of the primary key for it.)
        seen := 0;
        FOR x IN SELECT r.channel_key, r.lo, r.places, r.moved, r.lease_until
                 FROM mq_receipts r
                 WHERE r.lease_until < 'infinity'::timestamptz -- mq_receipts_open
                   AND r.lease_until > ts
                   AND r.lease_until < LEAST(next_at, ts + ahead)
                   AND (channel_names IS NULL
                        OR r.channel_key >= rg.lo AND r.channel_key <= rg.hi)
                   AND (r.holder IS NULL
                        OR r.holder IS DISTINCT FROM pg_current_xact_id_if_assigned())
                 ORDER BY r.lease_until
                 LIMIT 64 LOOP
            seen := seen + 1;
            IF seen = 64 OR (SELECT count(DISTINCT p)
                             FROM (SELECT unnest(d.places) FROM mq_done d
                                   WHERE d.channel_key = x.channel_key AND d.lo = x.lo
                                   UNION ALL
                                   SELECT unnest(x.moved)) AS u(p))
                            < cardinality(x.places) THEN
                next_at := LEAST(next_at, x.lease_until);
                EXIT;
            END IF;
        END LOOP;
        -- A lease that runs out later: the poll looks again once `ahead`
        -- has passed (_mq_latest_lease: from the latest lease down).
        IF (next_at IS NULL OR next_at > ts + ahead)
           AND _mq_latest_lease(ts + ahead, rg.lo, rg.hi, channel_names IS NULL)
               IS NOT NULL THEN
            next_at := ts + ahead;
        END IF;
    END LOOP;
    RETURN CASE WHEN next_at IS NOT NULL
                THEN GREATEST(next_at - clock_timestamp(), interval '0') END;
END;
$$;

-- Claims up to batch_size ready messages (see DESIGN.md, the SQL contract):
-- the lease lane, mq_claim_lane's lane 0.
-- Parameters: channel_names (NULL: every channel); batch_size.
-- Returns: up to batch_size mq_job_t rows, or one row with only wait_time when
--   none is ready. Duty: consume.
CREATE OR REPLACE FUNCTION mq_claim(channel_names text[], batch_size int)
RETURNS SETOF mq_job_t
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY SELECT * FROM mq_claim_lane(channel_names, batch_size, 0);
END;
$$;

-- How much of a batch the log's first round leaves for mq_rows' pick when
-- mq_rows may have something ready (rows_in): a quarter, at least one; of a
-- batch of one, one every other poll at random. (SQL, inlined where it is
-- called: no plpgsql call a poll.)
CREATE OR REPLACE FUNCTION _mq_rows_share(rows_in boolean, batch_size int)
RETURNS int
LANGUAGE sql VOLATILE
RETURN CASE WHEN NOT rows_in THEN 0
            WHEN batch_size > 1 THEN GREATEST(1, batch_size / 4)
            WHEN pg_catalog.random() < 0.5 THEN 1
            ELSE 0 END;

-- Claims up to batch_size ready messages of a lane (see _mq_pick_set):
-- round 1 of the log, mq_rows' pick, round 2 of the log. Lane 0 (mq_claim)
-- and lane 2 lease them; lane 2, the rest of lane 0 once lane 1 is taken
-- out (retries and messages whose locked delivery died), is what a runner
-- whose workers use the locked lane claims with leases. Lane 1, the locked
-- lane (mq_claim_locked), claims first deliveries for the caller's open
-- transaction and writes nothing in mq_rows: the jobs are held by row
-- locks until that transaction ends (in the log, by the cursor's lock and
-- a receipt that names the transaction).
-- Parameters: channel_names (NULL: every channel); batch_size; lane: 0, 1 or
--   2 (another is refused).
-- Returns: as mq_claim; lane 1's jobs held by the caller's transaction.
--   Duty: consume.
CREATE OR REPLACE FUNCTION mq_claim_lane(channel_names text[], batch_size int, lane int)
RETURNS SETOF mq_job_t
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    citus   boolean := COALESCE(current_setting('pqmq.citus', true) = 'on', false); -- (no log)
    ts      timestamptz := clock_timestamp();
    picked  uuid[];
    tids    tid[];
    max_dur interval; -- the lease lanes' (_mq_limits), once, not per row
    chained boolean;
    rows_in boolean;
    -- Whether any channel is paused: one probe a poll, and the filters of
    -- mq_paused below run only when it finds one (schema/pause.sql).
    paused  boolean := EXISTS (SELECT 1 FROM mq_paused);
    idle    mq_job_t;
    first   int; -- what round 1 of the log may take
    short   boolean;
    n       int;
    got     int;
BEGIN
    IF lane IS NULL OR lane < 0 OR lane > 2 THEN
        RAISE EXCEPTION 'mq_claim_lane: lane % is not 0, 1 or 2', lane
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM _mq_poll_args(channel_names, batch_size);
    -- Receipts whose leases ran out (and the locked lane's, committed
    -- without completing all) hand their messages back first.
    IF NOT citus AND EXISTS (SELECT 1 FROM mq_receipts x
                             WHERE x.lease_until < 'infinity'::timestamptz
                               AND x.lease_until <= ts) THEN
        PERFORM _mq_log_reap(ts);
    END IF;
    -- Whether mq_rows may have something to give: two probes, a chain there
    -- or anything else that may be ready.
    chained := EXISTS (SELECT 1 FROM mq_rows m
                       WHERE m.chain_seq IS NOT NULL -- mq_msgs_chain
                         AND m.channel_key >= '-9223372036854775808'::bigint);
    rows_in := citus OR chained OR EXISTS (SELECT 1 FROM mq_rows m
                          WHERE m.ready_at > '-infinity'::timestamptz -- mq_msgs_ready_by_time
                            AND m.dead_since IS NULL AND m.after_message_id IS NULL
                            AND m.ready_at <= ts);
    -- Round 1 of the log (a quarter of the batch a channel), then mq_rows'
    -- pick, then round 2 of the log: each channel's share, wherever its
    -- messages are. Round 1 leaves mq_rows a quarter of the batch (of a
    -- batch of one, every other poll at random), so that its messages
    -- (chains, retries, late producers' ones) are not starved by a log that
    -- could fill every batch.
    n := 0;
    first := batch_size - _mq_rows_share(rows_in, batch_size);
    RETURN QUERY SELECT * FROM _mq_log_pick(channel_names, batch_size, first, ts, lane, 1,
                                            paused);
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n >= batch_size THEN
        RETURN;
    END IF;
    short := n < first;
    IF rows_in THEN
        SELECT p.ids, p.tids, p.chained INTO picked, tids, chained
        FROM _mq_pick_set(channel_names, batch_size - n, ts, lane, paused) p;
    ELSE
        picked := '{}';
    END IF;

    -- Not busy: a good moment to notice messages whose last lease ran out
    -- (the lease lanes: the locked lane leases nothing). Looked for first,
    -- as mq_reap_dead looks: a call of it that finds none (most calls)
    -- costs more than the probe.
    IF lane <> 1 AND cardinality(picked) < batch_size AND EXISTS (
           SELECT 1 FROM mq_rows l
           WHERE l.dead_since IS NULL
             AND l.ready_at > '-infinity'::timestamptz -- mq_msgs_ready_by_time
             AND l.ready_at = 'infinity'::timestamptz
             AND l.attempts = 0 AND l.attempt_at <= ts) THEN
        PERFORM mq_reap_dead();
    END IF;

    IF cardinality(picked) > 0 AND lane = 1 THEN
        -- The locked lane reads the rows, with the counts a lease would
        -- give them, and writes nothing: the caller's transaction holds
        -- them by the pick's row locks until it completes or fails them.
        RETURN QUERY
        SELECT m.id, m.commit_interval IS NULL, m.name, m.payload_json::text,
               m.payload_bytes, interval '0', interval '0', m.channel_name,
               m.channel_args, m.deliveries + 1, m.attempts - 1, NULL::text, false
        FROM mq_rows m
        WHERE m.ctid = ANY (tids) -- the locked row versions (_mq_pick_set)
        ORDER BY m.ready_at, m.id;
    ELSIF cardinality(picked) > 0 AND current_setting('pqmq.citus', true) = 'on' THEN
        max_dur := (_mq_limits()).max_duration;
        -- The same claim in the form Citus ships to a worker: immutable
        -- functions of the row's columns only (_mq_at), and the lease
        -- computed from what the update returns.
        RETURN QUERY
        WITH claimed AS (
            UPDATE mq_rows m SET
                attempt_at = _mq_at(ts, CASE WHEN m.retry_backoff > interval '0'
                                            THEN m.retry_backoff
                                            ELSE interval '1 second' END),
                attempts = m.attempts - 1,
                retry_backoff = CASE WHEN m.retry_backoff * 2 > max_dur
                                     THEN m.retry_backoff ELSE m.retry_backoff * 2 END,
                deliveries = m.deliveries + 1,
                first_claimed_at = COALESCE(m.first_claimed_at, ts),
                ready_at = CASE WHEN m.attempts = 1 THEN 'infinity'::timestamptz
                                ELSE m.ready_at END
            WHERE m.ctid = ANY (tids)
            RETURNING m.id, m.commit_interval IS NULL AS committed,
                      m.attempt_at, m.channel_name,
                      m.channel_args, m.deliveries, m.attempts, m.ready_at,
                      m.name, m.payload_json, m.payload_bytes
        )
        SELECT c.id, c.committed, c.name, c.payload_json::text, c.payload_bytes,
               c.attempt_at - ts, interval '0', c.channel_name, c.channel_args,
               c.deliveries, c.attempts, NULL::text, false
        FROM claimed c
        ORDER BY c.ready_at, c.id;
    ELSIF cardinality(picked) > 0 THEN
        max_dur := (_mq_limits()).max_duration;
        RETURN QUERY
        WITH claimed AS (
            -- Writes no indexed column (ready_at stays), so the new row
            -- version is a HOT update: no index entry is written. Only a
            -- final attempt moves, to 'infinity', where mq_reap_dead looks.
            UPDATE mq_rows m SET
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
                first_claimed_at = COALESCE(m.first_claimed_at, ts),
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
    END IF;

    n := n + cardinality(picked);
    -- (When round 1 wanted some and neither it nor mq_rows' pick found
    -- any, or it came back short with every channel it took from drained
    -- (pqmq.log_more off, _mq_log_pick), round 1 walked every channel it
    -- could take from: round 2 would walk them again for what committed
    -- since, which the next poll finds.)
    IF (first = 0 OR n > 0)
       AND NOT (short AND COALESCE(current_setting('pqmq.log_more', true), '') = 'off') THEN
        RETURN QUERY SELECT * FROM _mq_log_pick(channel_names, batch_size, batch_size - n, ts,
                                                lane, 2, paused);
        GET DIAGNOSTICS got = ROW_COUNT;
        n := n + got;
    END IF;
    IF n > 0 THEN
        RETURN;
    END IF;

    -- Nothing claimed: the one row says when to poll again (the rest NULL),
    -- after a look for logged messages whose producers committed late.
    PERFORM _mq_log_upkeep(ts, NULL);
    idle.wait_time := _mq_wait_time(channel_names, ts, chained, paused);
    RETURN NEXT idle;
END;
$$;

-- The locked lane: claims up to batch_size first deliveries for the
-- caller's open transaction and writes nothing; mq_claim_lane's lane 1.
-- The jobs are held by row locks (FOR NO KEY UPDATE, SKIP LOCKED by other
-- pollers) until that transaction ends: completing them there (mq_complete,
-- attempt 0) commits with the caller's own writes; a rollback or a crash
-- leaves them ready again at once, with no attempt spent. A message whose
-- locked delivery died that way, and every retry, is delivered by the lease
-- lanes only (mq_claim, mq_claim_lane's lane 2), whose lease counts the
-- attempt before the handler runs: so a message that kills its consumer
-- still ends dead after its retries.
-- Parameters: channel_names (NULL: every channel); batch_size.
-- Returns: as mq_claim, the jobs held by the caller's transaction.
--   Duty: consume.
CREATE OR REPLACE FUNCTION mq_claim_locked(channel_names text[], batch_size int)
RETURNS SETOF mq_job_t
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY SELECT * FROM mq_claim_lane(channel_names, batch_size, 1);
END;
$$;

-- The seed's poll, on mq_claim directly. (PL/pgSQL, as mq_poll_jobs: it
-- keeps the statement's plan, where a SQL function with a SET clause is
-- parsed and planned at every call.)
-- Parameters: channel_names (NULL: every channel); batch_size.
-- Returns: the seed's columns of mq_claim's rows. Duty: consume.
CREATE OR REPLACE FUNCTION mq_poll(channel_names text[], batch_size int DEFAULT 1)
RETURNS TABLE(id uuid, is_committed boolean, name text, payload_json text,
              payload_bytes bytea, retry_backoff interval, wait_time interval)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY
        SELECT j.id, j.is_committed, j.name, j.payload_json, j.payload_bytes,
               j.retry_backoff, j.wait_time
        FROM mq_claim(channel_names, batch_size) j;
END;
$$;

-- Version 1's poll with its columns (the C library used it before mq_claim).
-- Parameters: channel_names (NULL: every channel); batch_size.
-- Returns: mq_claim's rows without the error and chain columns. Duty: consume.
CREATE OR REPLACE FUNCTION mq_poll_jobs(channel_names text[], batch_size int)
RETURNS TABLE(id uuid, is_committed boolean, name text, payload_json text,
              payload_bytes bytea, retry_backoff interval, wait_time interval,
              channel_name text, channel_args text, attempt int,
              attempts_left int)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY
        SELECT j.id, j.is_committed, j.name, j.payload_json, j.payload_bytes,
               j.retry_backoff, j.wait_time, j.channel_name, j.channel_args,
               j.attempt, j.attempts_left
        FROM mq_claim(channel_names, batch_size) j;
END;
$$;

-- Keeps a message's place (ready_at) no later than attempt_at when
-- attempt_at is set from outside the functions here, e.g. an operator's
-- UPDATE mq_rows SET attempt_at = now() to retry at once: polls find
-- messages by ready_at. The functions keep the two in step themselves, so
-- the WHEN clause is false for them and this never runs on the hot path.
-- A time already past places the message now: never behind a poll's
-- low-water mark (_mq_low_mark). (A row inserted by hand: _mq_fill_row,
-- schema/tables.sql, does the same.)
CREATE OR REPLACE FUNCTION _mq_keep_place()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    NEW.ready_at := GREATEST(NEW.attempt_at, clock_timestamp());
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER mq_msgs_keep_place
    BEFORE UPDATE OF attempt_at ON mq_rows
    FOR EACH ROW
    WHEN (NEW.attempt_at < NEW.ready_at AND NEW.ready_at <> 'infinity'::timestamptz)
    EXECUTE FUNCTION _mq_keep_place();
