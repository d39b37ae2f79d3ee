-- pqmq schema, version 14: polls start where live rows start.
--
-- While another transaction holds back the xmin horizon (a long report, a
-- forgotten BEGIN in psql, a replica with hot_standby_feedback) no deleted
-- message can be pruned, and each poll stepped over the dead index entries
-- at the head of every channel it visited, visiting each one's row versions
-- in the heap. mq_low_mark keeps, per session, the place of the oldest live
-- row (the low-water mark); the pick's probes, its top-up and mq_wait_time
-- start there, so the entries before it are passed in the index, never
-- fetched. Everything that gives a message a place does so no earlier than
-- now (mq_commit, a chain's new head, mq_keep_place), so nothing lands
-- behind a mark but a row whose producer committed more than a second after
-- inserting it: a poll that finds nothing looks afresh, and the mark is
-- found afresh every ten seconds.

-- The low-water mark of the ready indexes: no live candidate sits at a
-- place (ready_at) before it, so a poll may start there instead of stepping
-- over the index entries of deleted messages, which pile up while another
-- transaction holds back the xmin horizon (a long report, a forgotten BEGIN,
-- a replica's feedback) and which each poll would otherwise visit in the
-- heap. It is the place of the oldest live row (in flight included), found
-- by this session from the time index and kept in a session setting
-- ('pqmq.low_' and mq_msgs' oid: a queue's, per connection): moved on from
-- where it was once a second, found afresh every ten seconds or, when afresh
-- is true (mq_pick_set: a poll that found nothing), every second, and
-- never later than a second ago. Rows can appear behind it only when a producer's transaction
-- commits more than a second after its insert (or a client writes
-- mq_msgs directly); such a row is found by the next poll that comes up
-- empty and at the latest ten seconds later. The other ways a row gets a
-- place keep it at or after now: mq_commit, a chain's new head (mq_unlink),
-- a retry, mq_keep_place.
CREATE OR REPLACE FUNCTION mq_low_mark(ts timestamptz, afresh boolean)
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- No more settings: it runs under its callers' (mq_pick_set, mq_wait_time),
-- once a poll, and each setting a call changes is saved and restored.
AS $$
DECLARE
    setting text := 'pqmq.low_' || 'mq_msgs'::regclass::oid;
    -- "mark,moved on,found afresh" in microseconds since 1970 (exact, and
    -- whatever DateStyle says): anything else (unset, or set by hand)
    -- counts as unset.
    kept    text := current_setting(setting, true);
    mark    timestamptz := '-infinity';
    moved   timestamptz;
    fresh   timestamptz;
    found_at timestamptz;
BEGIN
    IF kept ~ '^[0-9]{1,17},[0-9]{1,17},[0-9]{1,17}$' THEN
        mark := 'epoch'::timestamptz + split_part(kept, ',', 1)::bigint * interval '1 microsecond';
        moved := 'epoch'::timestamptz + split_part(kept, ',', 2)::bigint * interval '1 microsecond';
        fresh := 'epoch'::timestamptz + split_part(kept, ',', 3)::bigint * interval '1 microsecond';
    END IF;
    IF fresh IS NULL OR fresh > ts OR ts - fresh > interval '10 seconds'
       OR (afresh AND ts - fresh > interval '1 second') THEN
        mark := '-infinity';
        fresh := ts;
    ELSIF ts - moved <= interval '1 second' AND moved <= ts THEN
        RETURN LEAST(mark, ts - interval '1 second');
    END IF;
    -- Steps over the dead entries before the oldest live row once, here.
    SELECT m.ready_at INTO found_at FROM mq_msgs m
    WHERE m.dead_since IS NULL
      AND (m.after_message_id IS NULL
           OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
      AND m.ready_at > '-infinity'::timestamptz -- mq_msgs_ready_by_time
      AND m.ready_at >= mark
    ORDER BY m.ready_at
    LIMIT 1;
    mark := LEAST(COALESCE(found_at, ts), ts);
    PERFORM set_config(setting, (extract(epoch FROM mark) * 1000000)::bigint || ','
                                || (extract(epoch FROM ts) * 1000000)::bigint || ','
                                || (extract(epoch FROM fresh) * 1000000)::bigint, false);
    RETURN LEAST(mark, ts - interval '1 second');
END;
$$;


-- mq_pick_keys takes the mark from mq_pick_set, which finds it once a poll.
DROP FUNCTION IF EXISTS mq_pick_keys(text, bigint, bigint, int, int, int, timestamptz, int,
                                     uuid[], tid[], timestamptz);

-- One visit of the channels whose chain key lies in [lo, hi], starting at a
-- random key and wrapping around once: takes up to per_key ready messages
-- from each channel, up to `want` in all, visiting at most `budget` channels
-- per direction, from the place mark on (mq_low_mark: the probes pass the
-- entries of deleted messages before it without visiting the heap). Locks
-- what it returns (FOR NO KEY UPDATE SKIP LOCKED), so
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
                                        ts timestamptz, lane int, mark timestamptz,
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
                  AND m.ready_at >= mark
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
                  AND m.ready_at >= mark
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
                  AND m.ready_at >= mark
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
                  AND m.ready_at >= mark
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
    mark    timestamptz; -- see mq_low_mark
    again   timestamptz;
BEGIN
    IF batch_size IS NULL OR batch_size < 1 OR batch_size > (mq_limits()).max_batch THEN
        RAISE EXCEPTION 'mq_poll: batch_size % is outside 1..%',
            batch_size, (mq_limits()).max_batch
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    per_key := GREATEST(1, (batch_size + 3) / 4);
    budget := 2 * batch_size + 16;
    mark := mq_low_mark(ts, false);
    LOOP -- twice at most (below)
        ids := '{}';
        tids := '{}';
        low := NULL;

        IF channel_names IS NULL THEN
            SELECT p.ids, p.tids, p.low INTO ids, tids, low
            FROM mq_pick_keys(NULL, -9223372036854775808, 9223372036854775807,
                              per_key, batch_size, budget, ts, lane, mark, ids, tids, low) p;
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
                                      batch_size, budget, ts, lane, mark, ids, tids,
                                      low) p;
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
                  AND m.ready_at >= COALESCE(low, mark)
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

        -- Nothing past the mark: find it afresh (at most once a second: under
        -- a held snapshot that steps over every dead entry) and look again if
        -- a live row appeared behind it (mq_low_mark).
        EXIT WHEN cardinality(ids) > 0;
        again := mq_low_mark(ts, true);
        EXIT WHEN again >= mark;
        mark := again;
    END LOOP;
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
    -- Leases of the messages in flight, from where live rows start.
    mark    timestamptz := mq_low_mark(ts, false);
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
               AND m.ready_at >= mark AND m.ready_at <= ts
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
               AND m.ready_at >= mark AND m.ready_at <= ts
               AND m.attempts > 0
               AND m.channel_name = c.n)))
        INTO next_at
        FROM (SELECT DISTINCT n FROM unnest(channel_names) AS n) c;
    END IF;
    RETURN CASE WHEN next_at IS NOT NULL
                THEN GREATEST(next_at - clock_timestamp(), interval '0') END;
END;
$$;


-- Keeps a message's place (ready_at) no later than attempt_at when
-- attempt_at is set from outside the functions here, e.g. an operator's
-- UPDATE mq_msgs SET attempt_at = now() to retry at once: polls find
-- messages by ready_at. The functions keep the two in step themselves, so
-- the WHEN clause is false for them and this never runs on the hot path.
-- A time already past places the message now: never behind a poll's
-- low-water mark (mq_low_mark).
CREATE OR REPLACE FUNCTION mq_keep_place()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    NEW.ready_at := GREATEST(NEW.attempt_at, clock_timestamp());
    RETURN NEW;
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
        UPDATE mq_msgs s SET after_message_id = o_pred[width_bucket(s.after_message_id, o_id)],
            -- A new head joins the ready indexes no earlier than now, so
            -- never behind a poll's low-water mark (mq_low_mark).
            ready_at = CASE WHEN o_pred[width_bucket(s.after_message_id, o_id)]
                                 = '00000000-0000-0000-0000-000000000000'::uuid
                            THEN GREATEST(s.ready_at, clock_timestamp())
                            ELSE s.ready_at END
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
    ts    timestamptz := clock_timestamp();
BEGIN
    WITH c AS (
        -- Ready when its delay ends, and placed no earlier than now, so
        -- never behind a poll's low-water mark (mq_low_mark).
        UPDATE mq_msgs m SET
            attempt_at = CASE WHEN m.deliveries = 0
                              THEN GREATEST(m.attempt_at - m.commit_interval, ts)
                              ELSE m.attempt_at END,
            ready_at = CASE WHEN m.deliveries = 0
                            THEN GREATEST(m.attempt_at - m.commit_interval, ts)
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

-- CREATE OR REPLACE FUNCTION undid the pinned path and the grants.
SELECT mq_secure();
SELECT mq_regrant();

INSERT INTO mq_schema_migrations (version, name)
VALUES (14, '0014_low_water_mark')
ON CONFLICT (version) DO NOTHING;
