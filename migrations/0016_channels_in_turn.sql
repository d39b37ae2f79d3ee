-- pqmq schema, version 16: channels served in turn.
--
-- An unfiltered poll visited the channels from a random point of the
-- chain-key space. A channel's key is its name's hash followed by its
-- args' hash, so the channels of one name sit in a range of 2^32 keys
-- among 2^64: the random point almost always fell outside every name,
-- and each poll started at the same channel, the name's first. With a
-- backlog the channels after the first few waited (the bench's 100
-- channels of one name: some not served for a minute), and their old
-- heads held back the low-water mark (mq_low_mark), so under a held
-- snapshot every poll fetched the dead rows of the channels served.
-- Now each session's unfiltered polls go round the channels in key order:
-- a poll starts after the last channel its session's previous poll took
-- from; a session without a turn yet (or behind a pooler that resets
-- sessions) starts at a random key of the range of a name found by one
-- probe (mq_random_start). Polls that name channels keep a random start
-- within each name.

-- The pick's helpers take where to start.
DROP FUNCTION IF EXISTS mq_pick_keys(text, bigint, bigint, int, int, int, timestamptz, int,
                                     timestamptz, uuid[], tid[], bigint[], timestamptz);
DROP FUNCTION IF EXISTS mq_pick_urgent(text, bigint, bigint, int, int, int, timestamptz, int,
                                       timestamptz, uuid[], tid[], bigint[], timestamptz,
                                       bigint[]);

-- Picks up to batch_size ready messages fairly across channels and locks
-- them (FOR NO KEY UPDATE SKIP LOCKED); returns their ids and, in the same
-- order, the ctids of the row versions it locked: the caller finds the rows
-- again by TID, with no index probe (a locked row version stays where it
-- is until this transaction ends). lane 0: every
-- ready message (the lease lane); lane 1 (the locked lane, mq_claim_locked):
-- first deliveries whose last locked delivery did not die and that this
-- transaction does not hold yet; lane 2: the others (see mq_claim_lane).
--
-- Fairness: channels are visited in turn, taking at most a quarter of the
-- batch from each, so a busy channel cannot starve a quiet one. An unfiltered
-- poll starts at the chain key after the last channel this session's previous
-- poll took from (the setting 'pqmq.next_' and mq_msgs' oid; mq_random_start
-- when there is none): a random point of the key space would almost always land
-- between names, whose keys sit in narrow ranges (the name's hash, then the
-- args'), and each poll would start at the same channel. A poll that names
-- channels starts each name's visit at a random key of that name's range,
-- where the args' hashes spread evenly.
-- Priority: within a channel, its urgent messages (priority above 0,
-- mq_pick_urgent) are taken before those of priority 0 (mq_pick_keys), and
-- none of priority 0 while it has urgent ones left.
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
    keys    bigint[];    -- the chain key of each message taken
    full_keys bigint[];  -- see mq_pick_urgent (unfiltered polls)
    urgent  boolean;
    turn    text;        -- the session setting of the turn (unfiltered polls)
    kept    text;
    start   bigint;      -- where the visit of a key range begins
    last_key bigint;     -- the last channel an unfiltered visit took from
BEGIN
    IF batch_size IS NULL OR batch_size < 1 OR batch_size > (mq_limits()).max_batch THEN
        RAISE EXCEPTION 'mq_poll: batch_size % is outside 1..%',
            batch_size, (mq_limits()).max_batch
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    per_key := GREATEST(1, (batch_size + 3) / 4);
    budget := 2 * batch_size + 16;
    mark := mq_low_mark(ts, false);
    IF channel_names IS NULL THEN
        -- A key in hex (to_hex: two's complement); anything else (unset,
        -- or set by hand) counts as unset. (No regular expression and no
        -- numeric: they cost more than the rest of this.)
        turn := 'pqmq.next_' || 'mq_msgs'::regclass::oid;
        kept := current_setting(turn, true);
        IF length(kept) BETWEEN 1 AND 16 AND btrim(kept, '0123456789abcdef') = '' THEN
            start := ('x' || lpad(kept, 16, '0'))::bit(64)::bigint;
        ELSE
            start := mq_random_start(mark);
        END IF;
    END IF;
    LOOP -- twice at most (below)
        ids := '{}';
        tids := '{}';
        keys := '{}';
        full_keys := '{}';
        low := NULL;
        -- One probe of an index that is empty unless priorities are used.
        urgent := EXISTS (
            SELECT 1 FROM mq_msgs m
            WHERE m.dead_since IS NULL
              AND (m.after_message_id IS NULL
                   OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
              AND m.priority > 0 -- mq_msgs_ready_urgent
              AND m.ready_at >= mark AND m.ready_at <= ts);

        IF channel_names IS NULL THEN
            -- One visit of the whole key space: each channel's urgent
            -- messages, then the rest of its allowance; channels whose urgent
            -- messages used it all are visited again for more of them.
            IF urgent THEN
                SELECT p.ids, p.tids, p.keys, p.low, p.full_keys
                INTO ids, tids, keys, low, full_keys
                FROM mq_pick_urgent(NULL, -9223372036854775808, 9223372036854775807,
                                    start, per_key, batch_size, budget, ts, lane, mark, ids, tids,
                                    keys, low, full_keys) p;
            END IF;
            IF cardinality(ids) < batch_size THEN
                SELECT p.ids, p.tids, p.keys, p.low INTO ids, tids, keys, low
                FROM mq_pick_keys(NULL, -9223372036854775808, 9223372036854775807,
                                  start, per_key, batch_size, budget, ts, lane, mark, ids, tids,
                                  keys, low) p;
            END IF;
            -- The last channel of this visit (from start up, then around;
            -- the urgent round 2 below starts over).
            last_key := keys[cardinality(keys)];
            IF cardinality(ids) < batch_size AND cardinality(full_keys) > 0 THEN
                SELECT p.ids, p.tids, p.keys, p.low, p.full_keys
                INTO ids, tids, keys, low, full_keys
                FROM mq_pick_urgent(NULL, -9223372036854775808, 9223372036854775807,
                                    start, batch_size, batch_size, budget, ts, lane, mark, ids,
                                    tids, keys, low, full_keys) p;
            END IF;
        ELSE
            -- Round 1 takes up to per_key from each named channel (its urgent
            -- messages first); round 2 takes more from channels that had
            -- more to give.
            FOR round IN 1..2 LOOP
                FOR nm IN SELECT d.n FROM (SELECT DISTINCT n FROM unnest(channel_names) AS n
                                          WHERE n IS NOT NULL) d
                          ORDER BY random() LOOP
                    EXIT WHEN cardinality(ids) >= batch_size;
                    lo := hashtext(nm)::bigint << 32;
                    hi := lo | 4294967295;
                    start := lo + floor(random() * 4294967296)::bigint;
                    IF urgent THEN
                        SELECT p.ids, p.tids, p.keys, p.low, p.full_keys
                        INTO ids, tids, keys, low, full_keys
                        FROM mq_pick_urgent(nm, lo, hi, start,
                                            CASE WHEN round = 1 THEN per_key ELSE batch_size END,
                                            batch_size, budget, ts, lane, mark, ids, tids,
                                            keys, low, full_keys) p;
                    END IF;
                    CONTINUE WHEN cardinality(ids) >= batch_size;
                    SELECT p.ids, p.tids, p.keys, p.low INTO ids, tids, keys, low
                    FROM mq_pick_keys(nm, lo, hi, start,
                                      CASE WHEN round = 1 THEN per_key ELSE batch_size END,
                                      batch_size, budget, ts, lane, mark, ids, tids, keys,
                                      low) p;
                END LOOP;
            END LOOP;
        END IF;

        -- Unfiltered polls top up from the time index, O(batch log n). When the
        -- channels' scan took something, the top-up starts at the first
        -- claimable message it found (low): the messages in flight before it
        -- were stepped over once already. What is older still sits in channels
        -- the scan's budget left unvisited, for the next poll, which starts
        -- where this one stopped. (A channel with urgent messages left gave
        -- all it was allowed to, so the batch is full: the time index, which
        -- would take its older messages of priority 0 first, is not read.)
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

        IF last_key IS NOT NULL THEN
            -- The next poll starts after the last channel taken from.
            PERFORM set_config(turn, to_hex(CASE WHEN last_key = 9223372036854775807
                                                 THEN -9223372036854775808
                                                 ELSE last_key + 1 END), false);
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

-- Where an unfiltered poll starts when its session has no turn (its first
-- poll, or each poll behind a pooler that resets sessions, such as PgBouncer
-- with DISCARD ALL): a random key of the range of the name of the first
-- channel at or after a random key of the whole space. A random key of the
-- whole space alone would nearly always fall between names (mq_pick_set),
-- and so start at a name's first channel every time. One probe of the
-- channel index, from the place mark on.
CREATE OR REPLACE FUNCTION mq_random_start(mark timestamptz)
RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET enable_bitmapscan = off
AS $$
DECLARE
    start bigint := LEAST(9223372036854775807, -9223372036854775808
                          + floor(random() * 18446744073709551616::numeric))::bigint;
    found bigint;
BEGIN
    SELECT m.channel_key INTO found FROM mq_msgs m
    WHERE m.dead_since IS NULL
      AND (m.after_message_id IS NULL
           OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
      AND m.priority <= 0 -- mq_msgs_ready_plain
      AND m.ready_at >= mark
      AND m.channel_key >= start
    ORDER BY m.channel_key LIMIT 1;
    IF found IS NULL THEN -- past the last channel: the first one
        SELECT m.channel_key INTO found FROM mq_msgs m
        WHERE m.dead_since IS NULL
          AND (m.after_message_id IS NULL
               OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
          AND m.priority <= 0
          AND m.ready_at >= mark
        ORDER BY m.channel_key LIMIT 1;
    END IF;
    IF found IS NULL THEN
        RETURN start;
    END IF;
    RETURN ((found >> 32) << 32) + floor(random() * 4294967296)::bigint;
END;
$$;

-- One visit of the channels whose chain key lies in [lo, hi], starting at
-- key start (mq_pick_set chooses it) and wrapping around once: takes up to per_key ready messages
-- of priority 0 from each channel (fewer by what the channel gave this poll
-- already: none after mq_pick_urgent took its allowance, as a channel may
-- have urgent messages left then), up to `want` in all, visiting at most
-- `budget` channels per direction, from the place mark on (mq_low_mark: the
-- probes pass the entries of deleted messages before it without visiting
-- the heap). Locks what it returns (FOR NO KEY UPDATE SKIP LOCKED), so
-- concurrent pollers skip each other's rows instead of waiting. Appends the
-- ids to ids, the locked row versions' ctids to tids and their chain keys
-- to keys (ids also says what not to take again), and lowers low to the
-- place (ready_at) of the first claimable message of the channels it took
-- from. lane: as in mq_pick_set.
--
-- The locked lane (lane 1) passes a row by when its locker (xmax) spent it:
-- the locker ended without committing, so the row's locked delivery died
-- with its consumer (a crash, a lost connection, a rollback); or the locker
-- is this transaction, which holds the row already (SKIP LOCKED skips only
-- other transactions' locks). xmax has 32 bits: the locker's full id is
-- found from this transaction's (me), both within 2^31 of each other; a
-- locker newer than this transaction counts as alive (it may still run).
-- The test is written out inline, here, in mq_pick_urgent and in
-- mq_pick_set: a function call per row (mq_lock_spent, until migration
-- 0011) cost a fifth of the locked lane's poll.
CREATE OR REPLACE FUNCTION mq_pick_keys(only_name text, lo bigint, hi bigint,
                                        start bigint, per_key int, want int, budget int,
                                        ts timestamptz, lane int, mark timestamptz,
                                        INOUT ids uuid[], INOUT tids tid[],
                                        INOUT keys bigint[], INOUT low timestamptz)
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
    got   uuid[];
    got_tid tid[];
    got_key bigint[];
    got_at timestamptz;
    -- This transaction's id, for the test of xmax (lanes 1 and 2).
    me    bigint := CASE WHEN lane <> 0 THEN pg_current_xact_id()::text::bigint END;
    me_lo bigint := me & 4294967295;
BEGIN
    -- Each probe finds the next chain key that has a claimable message, and
    -- where in the key that message is (at): the messages in flight and the
    -- dead entries before it are stepped over once, by the probe, and the
    -- key's scan starts at it. A key with nothing claimable is passed by.
    SELECT array_agg(j.id), array_agg(j.ctid), array_agg(j.k), min(j.at)
    INTO got, got_tid, got_key, got_at FROM (
        WITH RECURSIVE up(k, at, n) AS (
            SELECT f.k, f.at, 1 FROM (
                SELECT m.channel_key AS k, m.ready_at AS at FROM mq_msgs m
                WHERE m.dead_since IS NULL
                  AND (m.after_message_id IS NULL
                       OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                  AND m.priority <= 0 -- mq_msgs_ready_plain
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
                  AND m.priority <= 0
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
                  AND m.priority <= 0
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
                  AND m.priority <= 0
                  AND m.ready_at >= mark
                  AND m.ready_at <= ts AND m.attempt_at <= ts AND m.attempts > 0
                  AND (only_name IS NULL OR m.channel_name = only_name)
                  AND m.id <> ALL (ids)
                  AND m.channel_key > around.k AND m.channel_key < start
                ORDER BY m.channel_key, m.ready_at LIMIT 1) f
            WHERE around.n < budget
        )
        SELECT r.id, r.ctid, ks.k, ks.at
        FROM (SELECT u.k, u.at,
                     CASE WHEN cardinality(keys) = 0 THEN per_key
                          ELSE GREATEST(0, per_key - (SELECT count(*) FROM unnest(keys) AS x
                                                      WHERE x = u.k)::int) END AS lim
              FROM (SELECT up.k, up.at FROM up
                    UNION ALL
                    SELECT around.k, around.at FROM around) u) ks,
        LATERAL (
            SELECT m.id, m.ctid FROM mq_msgs m
            WHERE m.channel_key = ks.k
              AND m.dead_since IS NULL
              AND (m.after_message_id IS NULL
                   OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
              AND m.priority <= 0
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
            LIMIT ks.lim
            FOR NO KEY UPDATE SKIP LOCKED
        ) r
        LIMIT want - cardinality(ids)
    ) j;
    ids := ids || COALESCE(got, '{}');
    tids := tids || COALESCE(got_tid, '{}');
    keys := keys || COALESCE(got_key, '{}');
    low := LEAST(low, got_at);
END;
$$;

-- mq_pick_keys for the urgent messages (priority above 0, in
-- mq_msgs_ready_urgent): from each channel visited, up to per_key ready
-- messages (fewer by what it gave this poll already), highest priority
-- first and, within a priority, in the order of their places. Appends to
-- full_keys the channels that gave all they were allowed to, which may
-- hold more urgent messages (mq_pick_set visits them again).
CREATE OR REPLACE FUNCTION mq_pick_urgent(only_name text, lo bigint, hi bigint,
                                          start bigint, per_key int, want int, budget int,
                                          ts timestamptz, lane int, mark timestamptz,
                                          INOUT ids uuid[], INOUT tids tid[],
                                          INOUT keys bigint[], INOUT low timestamptz,
                                          INOUT full_keys bigint[])
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET enable_bitmapscan = off
AS $$
DECLARE
    got   uuid[];
    got_tid tid[];
    got_key bigint[];
    got_lim int[];
    got_at timestamptz;
    -- This transaction's id, for the test of xmax (lanes 1 and 2).
    me    bigint := CASE WHEN lane <> 0 THEN pg_current_xact_id()::text::bigint END;
    me_lo bigint := me & 4294967295;
BEGIN
    -- As in mq_pick_keys, where the index has the priority (negated, so
    -- that the highest comes first) between the chain key and the place:
    -- a probe finds a key's first claimable message in that order, and the
    -- key's scan starts at its (priority, place). Within a key the scan
    -- does not stop at now: it passes the entries of urgent messages not
    -- ready yet in the index, without visiting the heap.
    SELECT array_agg(j.id), array_agg(j.ctid), array_agg(j.k), array_agg(j.lim), min(j.at)
    INTO got, got_tid, got_key, got_lim, got_at FROM (
        WITH RECURSIVE up(k, np, at, n) AS (
            SELECT f.k, f.np, f.at, 1 FROM (
                SELECT m.channel_key AS k, -m.priority AS np, m.ready_at AS at FROM mq_msgs m
                WHERE m.dead_since IS NULL
                  AND (m.after_message_id IS NULL
                       OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                  AND m.priority > 0 -- mq_msgs_ready_urgent
                  AND m.ready_at >= mark
                  AND m.ready_at <= ts AND m.attempt_at <= ts AND m.attempts > 0
                  AND (only_name IS NULL OR m.channel_name = only_name)
                  AND m.id <> ALL (ids)
                  AND m.channel_key >= start AND m.channel_key <= hi
                ORDER BY m.channel_key, -m.priority, m.ready_at LIMIT 1) f
            UNION ALL
            SELECT f.k, f.np, f.at, up.n + 1 FROM up, LATERAL (
                SELECT m.channel_key AS k, -m.priority AS np, m.ready_at AS at FROM mq_msgs m
                WHERE m.dead_since IS NULL
                  AND (m.after_message_id IS NULL
                       OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                  AND m.priority > 0
                  AND m.ready_at >= mark
                  AND m.ready_at <= ts AND m.attempt_at <= ts AND m.attempts > 0
                  AND (only_name IS NULL OR m.channel_name = only_name)
                  AND m.id <> ALL (ids)
                  AND m.channel_key > up.k AND m.channel_key <= hi
                ORDER BY m.channel_key, -m.priority, m.ready_at LIMIT 1) f
            WHERE up.n < budget
        ),
        around(k, np, at, n) AS (
            SELECT f.k, f.np, f.at, 1 FROM (
                SELECT m.channel_key AS k, -m.priority AS np, m.ready_at AS at FROM mq_msgs m
                WHERE m.dead_since IS NULL
                  AND (m.after_message_id IS NULL
                       OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                  AND m.priority > 0
                  AND m.ready_at >= mark
                  AND m.ready_at <= ts AND m.attempt_at <= ts AND m.attempts > 0
                  AND (only_name IS NULL OR m.channel_name = only_name)
                  AND m.id <> ALL (ids)
                  AND m.channel_key >= lo AND m.channel_key < start
                ORDER BY m.channel_key, -m.priority, m.ready_at LIMIT 1) f
            UNION ALL
            SELECT f.k, f.np, f.at, around.n + 1 FROM around, LATERAL (
                SELECT m.channel_key AS k, -m.priority AS np, m.ready_at AS at FROM mq_msgs m
                WHERE m.dead_since IS NULL
                  AND (m.after_message_id IS NULL
                       OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                  AND m.priority > 0
                  AND m.ready_at >= mark
                  AND m.ready_at <= ts AND m.attempt_at <= ts AND m.attempts > 0
                  AND (only_name IS NULL OR m.channel_name = only_name)
                  AND m.id <> ALL (ids)
                  AND m.channel_key > around.k AND m.channel_key < start
                ORDER BY m.channel_key, -m.priority, m.ready_at LIMIT 1) f
            WHERE around.n < budget
        )
        SELECT r.id, r.ctid, ks.k, ks.lim, ks.at
        FROM (SELECT u.k, u.np, u.at,
                     GREATEST(0, per_key - (SELECT count(*) FROM unnest(keys) AS x
                                            WHERE x = u.k)::int) AS lim
              FROM (SELECT up.k, up.np, up.at FROM up
                    UNION ALL
                    SELECT around.k, around.np, around.at FROM around) u) ks,
        LATERAL (
            SELECT m.id, m.ctid FROM mq_msgs m
            WHERE m.channel_key = ks.k
              AND m.dead_since IS NULL
              AND (m.after_message_id IS NULL
                   OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
              AND m.priority > 0
              AND (-m.priority, m.ready_at) >= (ks.np, ks.at)
              AND m.ready_at >= mark
              AND m.ready_at <= ts
              -- Steps over the messages in flight (see ready_at).
              AND m.attempt_at <= ts
              AND m.attempts > 0
              AND (only_name IS NULL OR m.channel_name = only_name)
              AND m.id <> ALL (ids)
              -- The locked lane: first deliveries not left by a dead locker.
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
            ORDER BY -m.priority, m.ready_at
            LIMIT ks.lim
            FOR NO KEY UPDATE SKIP LOCKED
        ) r
        LIMIT want - cardinality(ids)
    ) j;
    ids := ids || COALESCE(got, '{}');
    tids := tids || COALESCE(got_tid, '{}');
    keys := keys || COALESCE(got_key, '{}');
    low := LEAST(low, got_at);
    -- A key that gave its whole allowance may have more.
    full_keys := full_keys || ARRAY(
        SELECT g.k FROM unnest(got_key, got_lim) AS g(k, l)
        GROUP BY g.k, g.l HAVING count(*) >= g.l);
END;
$$;

SELECT mq_secure();
SELECT mq_regrant();

INSERT INTO mq_schema_migrations (version, name)
VALUES (16, '0016_channels_in_turn')
ON CONFLICT (version) DO NOTHING;
