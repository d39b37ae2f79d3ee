-- schema/poll.sql: polling: claiming ready messages fairly across channels (mq_claim), and the
-- older entry points that return subsets of its row.

-- Whether a poll of lane may take a row (deliveries and xmax are the row's;
-- me is this transaction's id, me_lo its low 32 bits). Lane 0 takes every
-- row; lane 1 (the locked lane) first deliveries whose locker did not spend
-- them, lane 2 the others. A locker (xmax) spent a row when it ended
-- without committing, so the row's locked delivery died with its consumer
-- (a crash, a lost connection, a rollback), or when it is this transaction,
-- which holds the row already (SKIP LOCKED skips only other transactions'
-- locks). xmax has 32 bits: the locker's full id is found from me, both
-- within 2^31 of each other; a locker newer than this transaction counts as
-- alive (it may still run).
-- The scans call this once per row they pass, rows other consumers hold
-- included, so it must cost what the expression costs: the planner inlines
-- it into each scan. That is why it has a standard SQL body (RETURN) and no
-- pinned search_path: PostgreSQL never inlines a function with settings,
-- and a call per row costs many times the inlined test. Its names are
-- resolved once, when the schema is applied, and kept by OID, so no path at
-- call time can change what it runs (docs/security.md).
CREATE OR REPLACE FUNCTION mq_lane_admits(lane int, deliveries int, locker xid,
                                          me bigint, me_lo bigint)
RETURNS boolean
LANGUAGE sql
RETURN lane = 0 OR (lane = 1) = (deliveries = 0 AND (locker = '0'::xid OR NOT CASE
    WHEN locker::text::bigint < 3 THEN false
    WHEN (me_lo - locker::text::bigint + 6442450944) % 4294967296 - 2147483648 < 0 THEN false
    WHEN locker::text::bigint = me_lo THEN true
    ELSE COALESCE(pg_catalog.pg_xact_status(
                      (me - ((me_lo - locker::text::bigint + 6442450944) % 4294967296
                             - 2147483648))::text::xid8) = 'aborted', false)
    END));

-- Whether a ready index's entry is one a poll may take: live, not waiting
-- in a chain, placed in [from_at, ts], not in flight (attempt_at), with an
-- attempt left, of the named channel (only_name; NULL: any), and not taken
-- by this poll already (ids). Each scan that calls it adds the priority
-- test of the index it reads, which must be written out in the statement
-- for PostgreSQL to use a partial index.
-- Inlined like mq_lane_admits (a standard SQL body, no settings), so that
-- its conditions bound the index scans as if they were written in place.
CREATE OR REPLACE FUNCTION mq_claimable(dead_since timestamptz, after_message_id uuid,
                                        ready_at timestamptz, attempt_at timestamptz,
                                        attempts int, id uuid, channel_name text,
                                        from_at timestamptz, ts timestamptz,
                                        only_name text, ids uuid[])
RETURNS boolean
LANGUAGE sql IMMUTABLE
RETURN dead_since IS NULL AND after_message_id IS NULL
    AND ready_at >= from_at AND ready_at <= ts
    AND attempt_at <= ts AND attempts > 0
    AND (only_name IS NULL OR channel_name = only_name)
    AND id <> ALL (ids);

-- Whether an entry of the channel indexes (mq_msgs_ready_plain and
-- mq_msgs_ready_urgent, whichever the statement's priority test names) is
-- one of channel name's: live, not waiting in a chain, in the name's range
-- of chain keys (the name's hash, then the args') and of that name (two
-- names can share a hash). Inlined (as mq_claimable): the range bounds the
-- index scan.
CREATE OR REPLACE FUNCTION mq_in_channel(dead_since timestamptz, after_message_id uuid,
                                         channel_key bigint, channel_name text, name text)
RETURNS boolean
LANGUAGE sql IMMUTABLE
RETURN dead_since IS NULL AND after_message_id IS NULL
    AND channel_key >= (pg_catalog.hashtext(name)::bigint << 32)
    AND channel_key <= ((pg_catalog.hashtext(name)::bigint << 32) | 4294967295)
    AND channel_name = name;

-- The key a walk's next probe starts at (the walks of mq_pick_keys,
-- mq_pick_urgent and mq_pick_chains): the direction's first key a, then
-- the key after the last one found (k); none once k has reached the
-- direction's last key b. Inlined (as mq_claimable).
CREATE OR REPLACE FUNCTION mq_walk_next(k bigint, a bigint, b bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE
RETURN CASE WHEN k IS NULL THEN a WHEN k < b THEN k + 1 END;

-- Schemas of before chained was returned: a changed result needs a DROP.
DO $$
DECLARE
    was regprocedure := pg_catalog.to_regprocedure(
        'mq_pick_set(text[], integer, timestamp with time zone, integer)');
BEGIN
    IF was IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM pg_catalog.pg_proc p
           WHERE p.oid OPERATOR(pg_catalog.=) was
             AND 'chained' OPERATOR(pg_catalog.=) ANY (p.proargnames)) THEN
        DROP FUNCTION mq_pick_set(text[], integer, timestamptz, integer);
    END IF;
    IF pg_catalog.to_regprocedure('mq_wait_time(text[], timestamp with time zone)')
       IS NOT NULL THEN
        DROP FUNCTION mq_wait_time(text[], timestamptz);
    END IF;
END
$$;

-- Picks up to batch_size ready messages fairly across channels and locks
-- them (FOR NO KEY UPDATE SKIP LOCKED); returns their ids and, in the same
-- order, the ctids of the row versions it locked: the caller finds the rows
-- again by TID, with no index probe (a locked row version stays where it
-- is until this transaction ends). lane 0: every
-- ready message (the lease lane); lane 1 (the locked lane, mq_claim_locked):
-- first deliveries whose last locked delivery did not die and that this
-- transaction does not hold yet; lane 2: the others (see mq_claim_lane).
-- chained: whether the queue has chain entries (its probe below), which
-- the caller passes on to mq_wait_time when nothing was picked.
--
-- Fairness: channels are visited in turn, taking at most a quarter of the
-- batch from each, so a busy channel cannot starve a quiet one. An unfiltered
-- poll starts at the chain key after the last channel this session's previous
-- poll took from (the setting 'pqmq.next_' and mq_msgs' oid; mq_random_start
-- when there is none): a random point of the key space would almost always land
-- between names, whose keys sit in narrow ranges (the name's hash, then the
-- args'), and each poll would start at the same channel. A poll that names
-- channels starts each name's visit at a random key of that name's range,
-- where the args' hashes spread evenly. (The turn is the session's own: a
-- turn shared by all sessions started concurrent polls at the same key,
-- each stepping over the heads the other had locked; docs/performance.md.)
-- Priority: within a channel, its urgent messages (priority above 0,
-- mq_pick_urgent) are taken before those of priority 0 (mq_pick_keys), and
-- none of priority 0 while it has urgent ones left. A chain's head
-- (mq_pick_chains) is taken by its own priority: before the channel's
-- urgent messages when none of them outranks it, else after them.
-- Cost: each channel visited is one index probe (loose index scan); a budget
-- bounds the visits, and the time index fills whatever is left. Nothing here
-- groups or sorts the whole backlog.
CREATE OR REPLACE FUNCTION mq_pick_set(channel_names text[], batch_size int,
                                       ts timestamptz, lane int,
                                       OUT ids uuid[], OUT tids tid[],
                                       OUT chained boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    got     uuid[];
    got_tid tid[];
    -- This transaction's id, for the test of xmax (lanes 1 and 2).
    me      bigint := CASE WHEN lane <> 0 THEN mq_xact_id() END;
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
    -- Each named channel is visited (and, when nothing is ready, probed for
    -- its wait time): a bound, not a scan of a caller's list.
    IF cardinality(channel_names) > 1000 THEN
        RAISE EXCEPTION 'mq_poll: % channel names are over the limit of 1000',
            cardinality(channel_names)
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Poll all channels (NULL), or put the channels in fewer names: a name''s channels differ by their args.';
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
    -- One probe: a queue without chains skips their pass (a call).
    chained := EXISTS (SELECT 1 FROM mq_msgs m
                       WHERE m.chain_seq IS NOT NULL -- mq_msgs_chain
                         -- (always true: an index condition, so that the plan
                         -- is a probe whatever it thinks of the table)
                         AND m.channel_key >= '-9223372036854775808'::bigint);
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
              AND m.after_message_id IS NULL
              AND m.priority > 0 -- mq_msgs_ready_urgent
              AND m.ready_at >= mark AND m.ready_at <= ts);

        IF channel_names IS NULL THEN
            -- One visit of the whole key space: each channel's urgent
            -- messages, then the rest of its allowance; channels whose urgent
            -- messages used it all are visited again for more of them.
            IF urgent AND chained THEN
                -- Chain heads that no urgent message of their channel outranks.
                SELECT p.ids, p.tids, p.keys INTO ids, tids, keys
                FROM mq_pick_chains(NULL, -9223372036854775808, 9223372036854775807,
                                    start, per_key, batch_size, budget, ts, lane, true, mark,
                                    ids, tids, keys) p;
            END IF;
            IF urgent THEN
                SELECT p.ids, p.tids, p.keys, p.low, p.full_keys
                INTO ids, tids, keys, low, full_keys
                FROM mq_pick_urgent(NULL, -9223372036854775808, 9223372036854775807,
                                    start, per_key, batch_size, budget, ts, lane, mark, ids, tids,
                                    keys, low, full_keys) p;
            END IF;
            IF chained THEN
                SELECT p.ids, p.tids, p.keys INTO ids, tids, keys
                FROM mq_pick_chains(NULL, -9223372036854775808, 9223372036854775807,
                                    start, per_key, batch_size, budget, ts, lane, urgent,
                                    mark, ids, tids, keys) p;
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
                    IF urgent AND chained AND round = 1 THEN
                        SELECT p.ids, p.tids, p.keys INTO ids, tids, keys
                        FROM mq_pick_chains(nm, lo, hi, start, per_key, batch_size, budget, ts,
                                            lane, true, mark, ids, tids, keys) p;
                    END IF;
                    IF urgent THEN
                        SELECT p.ids, p.tids, p.keys, p.low, p.full_keys
                        INTO ids, tids, keys, low, full_keys
                        FROM mq_pick_urgent(nm, lo, hi, start,
                                            CASE WHEN round = 1 THEN per_key ELSE batch_size END,
                                            batch_size, budget, ts, lane, mark, ids, tids,
                                            keys, low, full_keys) p;
                    END IF;
                    IF chained AND round = 1 THEN -- (a chain gives one message a poll)
                        SELECT p.ids, p.tids, p.keys INTO ids, tids, keys
                        FROM mq_pick_chains(nm, lo, hi, start, per_key, batch_size, budget, ts,
                                            lane, urgent, mark, ids, tids, keys) p;
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
                WHERE m.ready_at > '-infinity'::timestamptz -- mq_msgs_ready_by_time
                  AND mq_claimable(m.dead_since, m.after_message_id, m.ready_at,
                                   m.attempt_at, m.attempts, m.id, m.channel_name,
                                   COALESCE(low, mark), ts, NULL, ids)
                  AND mq_lane_admits(lane, m.deliveries, m.xmax, me, me_lo)
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
AS $$
DECLARE
    start bigint := LEAST(9223372036854775807, -9223372036854775808
                          + floor(random() * 18446744073709551616::numeric))::bigint;
    found bigint;
BEGIN
    SELECT m.channel_key INTO found FROM mq_msgs m
    WHERE m.dead_since IS NULL
      AND m.after_message_id IS NULL
      AND m.priority <= 0 -- mq_msgs_ready_plain
      AND m.ready_at >= mark
      AND m.channel_key >= start
    ORDER BY m.channel_key LIMIT 1;
    IF found IS NULL THEN -- past the last channel: the first one
        SELECT m.channel_key INTO found FROM mq_msgs m
        WHERE m.dead_since IS NULL
          AND m.after_message_id IS NULL
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
-- place keep it at or after now: mq_commit, a retry, mq_keep_place.
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
    parts   text[] := string_to_array(kept, ',');
    mark    timestamptz := '-infinity';
    moved   timestamptz;
    fresh   timestamptz;
    found_at timestamptz;
BEGIN
    -- Three runs of 1 to 17 digits. (No regular expression: its matcher
    -- costs more than the rest of a read, and an empty poll reads the mark
    -- three times.)
    IF cardinality(parts) = 3 AND btrim(kept, '0123456789,') = ''
       AND length(parts[1]) BETWEEN 1 AND 17 AND length(parts[2]) BETWEEN 1 AND 17
       AND length(parts[3]) BETWEEN 1 AND 17 THEN
        mark := 'epoch'::timestamptz + parts[1]::bigint * interval '1 microsecond';
        moved := 'epoch'::timestamptz + parts[2]::bigint * interval '1 microsecond';
        fresh := 'epoch'::timestamptz + parts[3]::bigint * interval '1 microsecond';
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
      AND m.after_message_id IS NULL
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

-- The heads of the chains whose key lies in [lo, hi] (only_name's, when not
-- NULL), in key order: the first entry of each chain key in mq_msgs_chain,
-- at most `most` keys visited (NULL: all), and none after the first live
-- head due by due_by (NULL: to the end). mq_next_head_at stops at a head
-- due now, which answers its question: an empty poll of the locked lane,
-- whose workers hold most heads, walked every chain to learn it. A loose
-- index scan, one probe a statement: on Citus each probe is a router query,
-- where a recursive scan is not one it can ship ("column ... does not
-- exist"). mq_next_head_at, mq_metrics, mq_oldest_ready and mq_peek read
-- the heads here; run it in a statement of its own (on Citus a statement
-- that reads the queue's tables runs on the worker, where this function
-- cannot).
CREATE OR REPLACE FUNCTION mq_chain_heads(lo bigint, hi bigint, only_name text, most int,
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
        FROM mq_msgs m
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
-- (mq_chain_heads): a queue with more may answer later than its earliest
-- head (a poll still finds it).
CREATE OR REPLACE FUNCTION mq_next_head_at(lo bigint, hi bigint, only_name text)
RETURNS timestamptz
-- (PL/pgSQL keeps its plan: a SQL function with a SET clause is parsed and
-- planned again at every call, a large part of an empty poll.)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN (SELECT min(h.head_at)
            FROM mq_chain_heads(lo, hi, only_name, 1000, clock_timestamp()) h
            WHERE NOT h.head_dead AND h.head_attempts > 0);
END;
$$;

-- How long until the earliest candidate of these channels (NULL: all)
-- becomes ready: a message that is not ready yet (one probe), a lease
-- that runs out (the messages in flight, which the poll just stepped over)
-- or a chain's head that comes due (mq_next_head_at: only when chained,
-- mq_pick_set's answer). NULL when there is none.
CREATE OR REPLACE FUNCTION mq_wait_time(channel_names text[], ts timestamptz,
                                        chained boolean)
RETURNS interval
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    next_at timestamptz;
    -- Leases of the messages in flight, from where live rows start.
    mark    timestamptz := mq_low_mark(ts, false);
BEGIN
    -- chained is mq_pick_set's probe, made once a poll: a queue without
    -- chains has no head to come due, and skips their walk
    -- (mq_next_head_at, a good part of an empty poll).
    IF channel_names IS NULL THEN
        SELECT LEAST(
            (SELECT m.ready_at FROM mq_msgs m
             WHERE m.dead_since IS NULL
               AND m.after_message_id IS NULL
               AND m.ready_at > '-infinity'::timestamptz
               AND m.ready_at > ts AND m.ready_at < 'infinity'::timestamptz
             ORDER BY m.ready_at LIMIT 1),
            (SELECT min(m.attempt_at) FROM mq_msgs m
             WHERE m.dead_since IS NULL
               AND m.after_message_id IS NULL
               AND m.ready_at > '-infinity'::timestamptz
               AND m.ready_at >= mark AND m.ready_at <= ts
               AND m.attempts > 0))
        INTO next_at;
        -- (Its own statement: on Citus a statement that reads the queue's
        -- tables runs on the worker, where this function cannot.)
        IF chained THEN
            next_at := LEAST(next_at, mq_next_head_at(-9223372036854775808,
                                                      9223372036854775807, NULL));
        END IF;
    ELSE
        -- Each channel index (plain and urgent) for its range of chain keys.
        SELECT min(LEAST(
            (SELECT m.ready_at FROM mq_msgs m
             WHERE m.priority <= 0 -- mq_msgs_ready_plain
               AND mq_in_channel(m.dead_since, m.after_message_id, m.channel_key,
                                 m.channel_name, c.n)
               AND m.ready_at > ts AND m.ready_at < 'infinity'::timestamptz
             ORDER BY m.ready_at LIMIT 1),
            (SELECT min(m.attempt_at) FROM mq_msgs m
             WHERE m.priority <= 0
               AND mq_in_channel(m.dead_since, m.after_message_id, m.channel_key,
                                 m.channel_name, c.n)
               AND m.ready_at >= mark AND m.ready_at <= ts AND m.attempts > 0),
            (SELECT m.ready_at FROM mq_msgs m
             WHERE m.priority > 0 -- mq_msgs_ready_urgent
               AND mq_in_channel(m.dead_since, m.after_message_id, m.channel_key,
                                 m.channel_name, c.n)
               AND m.ready_at > ts AND m.ready_at < 'infinity'::timestamptz
             ORDER BY m.ready_at LIMIT 1),
            (SELECT min(m.attempt_at) FROM mq_msgs m
             WHERE m.priority > 0
               AND mq_in_channel(m.dead_since, m.after_message_id, m.channel_key,
                                 m.channel_name, c.n)
               AND m.ready_at >= mark AND m.ready_at <= ts AND m.attempts > 0)))
        INTO next_at
        FROM (SELECT DISTINCT n FROM unnest(channel_names) AS n) c;
        -- (As above: a statement that reads no table.)
        IF chained THEN
            next_at := LEAST(next_at, (
                SELECT min(mq_next_head_at(hashtext(c.n)::bigint << 32,
                                           (hashtext(c.n)::bigint << 32) | 4294967295, c.n))
                FROM (SELECT DISTINCT n FROM unnest(channel_names) AS n) c));
        END IF;
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
AS $$
DECLARE
    ts      timestamptz := clock_timestamp();
    picked  uuid[];
    tids    tid[];
    max_dur interval := (mq_limits()).max_duration; -- once, not per row
    chained boolean;
    idle    mq_job_t;
BEGIN
    SELECT p.ids, p.tids, p.chained INTO picked, tids, chained
    FROM mq_pick_set(channel_names, batch_size, ts, lane) p;

    -- Not busy: a good moment to notice messages whose last lease ran out.
    -- Looked for first, as mq_reap_dead looks: a call of it that finds
    -- none (most calls) costs more than the probe.
    IF cardinality(picked) < batch_size AND EXISTS (
           SELECT 1 FROM mq_msgs l
           WHERE l.dead_since IS NULL
             AND l.ready_at > '-infinity'::timestamptz -- mq_msgs_ready_by_time
             AND l.ready_at = 'infinity'::timestamptz
             AND l.attempts = 0 AND l.attempt_at <= ts) THEN
        PERFORM mq_reap_dead();
    END IF;

    IF cardinality(picked) > 0 AND current_setting('pqmq.citus', true) = 'on' THEN
        -- The same claim in the form Citus ships to a worker: immutable
        -- functions of the row's columns only (mq_at), and the lease
        -- computed from what the update returns.
        RETURN QUERY
        WITH claimed AS (
            UPDATE mq_msgs m SET
                attempt_at = mq_at(ts, CASE WHEN m.retry_backoff > interval '0'
                                            THEN m.retry_backoff
                                            ELSE interval '1 second' END),
                attempts = m.attempts - 1,
                retry_backoff = CASE WHEN m.retry_backoff * 2 > max_dur
                                     THEN m.retry_backoff ELSE m.retry_backoff * 2 END,
                deliveries = m.deliveries + 1,
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
        RETURN;
    ELSIF cardinality(picked) > 0 THEN
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

    -- Nothing claimed: the one row says when to poll again (the rest NULL).
    idle.wait_time := mq_wait_time(channel_names, ts, chained);
    RETURN NEXT idle;
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
AS $$
DECLARE
    ts     timestamptz := clock_timestamp();
    picked uuid[];
    tids   tid[];
    chained boolean;
    idle   mq_job_t;
BEGIN
    SELECT p.ids, p.tids, p.chained INTO picked, tids, chained
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
    idle.wait_time := mq_wait_time(channel_names, ts, chained); -- as in mq_claim_lane
    RETURN NEXT idle;
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
CREATE OR REPLACE FUNCTION mq_pick_keys(only_name text, lo bigint, hi bigint,
                                        start bigint, per_key int, want int, budget int,
                                        ts timestamptz, lane int, mark timestamptz,
                                        INOUT ids uuid[], INOUT tids tid[],
                                        INOUT keys bigint[], INOUT low timestamptz)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    -- (as in mq_pick_set)
    me    bigint := CASE WHEN lane <> 0 THEN mq_xact_id() END;
    me_lo bigint := me & 4294967295;
BEGIN
    -- Each probe finds the next chain key that has a claimable message, and
    -- where in the key that message is (at): the messages in flight and the
    -- dead entries before it are stepped over once, by the probe, and the
    -- key's scan starts at it. A key with nothing claimable is passed by.
    SELECT ids || COALESCE(array_agg(j.id), '{}'), tids || COALESCE(array_agg(j.ctid), '{}'),
           keys || COALESCE(array_agg(j.k), '{}'), LEAST(low, min(j.at))
    INTO ids, tids, keys, low FROM (
        -- The walk: the keys from start up to hi, then from lo up to start,
        -- at most budget keys in each direction (d); a step is one probe
        -- from the key after the last one found, and a probe that finds
        -- nothing ends the direction. (mq_pick_chains and mq_pick_urgent
        -- walk the same way.)
        SELECT r.id, r.ctid, ks.k, ks.at
        FROM (SELECT u.k, u.at,
                     GREATEST(0, per_key - cardinality(array_positions(keys, u.k))) AS lim
              FROM (VALUES (start, hi), (lo, CASE WHEN start > lo THEN start - 1 END)) d(a, b),
              LATERAL (
                  WITH RECURSIVE walk(k, at, n) AS (
                      SELECT NULL::bigint, NULL::timestamptz, 0
                      UNION ALL
                      SELECT f.k, f.at, w.n + 1 FROM walk w, LATERAL (
                          SELECT m.channel_key AS k, m.ready_at AS at FROM mq_msgs m
                          WHERE m.priority <= 0 -- mq_msgs_ready_plain
                            AND mq_claimable(m.dead_since, m.after_message_id, m.ready_at,
                                             m.attempt_at, m.attempts, m.id,
                                             m.channel_name, mark, ts, only_name, ids)
                            AND m.channel_key >= mq_walk_next(w.k, d.a, d.b)
                            AND m.channel_key <= d.b
                          ORDER BY m.channel_key, m.ready_at LIMIT 1) f
                      WHERE w.n < budget
                  )
                  SELECT w.k, w.at FROM walk w WHERE w.k IS NOT NULL) u) ks,
        LATERAL (
            SELECT m.id, m.ctid FROM mq_msgs m
            WHERE m.channel_key = ks.k
              AND m.priority <= 0
              -- Steps over the messages in flight (see ready_at).
              AND mq_claimable(m.dead_since, m.after_message_id, m.ready_at, m.attempt_at,
                               m.attempts, m.id, m.channel_name, ks.at, ts, only_name, ids)
              -- The locked lane: first deliveries not left by a dead locker.
              AND mq_lane_admits(lane, m.deliveries, m.xmax, me, me_lo)
            ORDER BY m.ready_at
            LIMIT ks.lim
            FOR NO KEY UPDATE SKIP LOCKED
        ) r
        LIMIT want - cardinality(ids)
    ) j;
END;
$$;

-- The chains whose key lies in [lo, hi], visited as mq_pick_keys visits
-- channels (from start, wrapping around once, at most budget keys per
-- direction, a loose index scan of mq_msgs_chain): from each, its head, if
-- a poll of this lane may claim it and its channel has allowance left
-- (per_key, less what it gave this poll already). The head is the key's
-- first live entry and nothing else of the chain is ever looked at: when
-- the head cannot be claimed (in flight, delayed, uncommitted, dead, or
-- locked by another transaction, the locked lane's or a completion's) the
-- chain gives nothing. So the head is read first and then locked by its
-- TID (SKIP LOCKED): a lock that fails, or finds the row changed since,
-- takes nothing; a scan that locked as it went would step to the second
-- member. With urgent (some channel has urgent messages) a head is taken
-- only if no claimable urgent message of its channel has a higher priority
-- (mq_pick_set calls this again after mq_pick_urgent). Appends as
-- mq_pick_keys does. Under a held snapshot the entries of deleted members
-- before a head are visited in the heap by each probe (the low-water mark
-- covers the ready indexes only).
CREATE OR REPLACE FUNCTION mq_pick_chains(only_name text, lo bigint, hi bigint,
                                          start bigint, per_key int, want int, budget int,
                                          ts timestamptz, lane int, urgent boolean,
                                          mark timestamptz, INOUT ids uuid[],
                                          INOUT tids tid[], INOUT keys bigint[])
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    -- (as in mq_pick_set)
    me      bigint := CASE WHEN lane <> 0 THEN mq_xact_id() END;
    me_lo   bigint := me & 4294967295;
BEGIN
    IF cardinality(ids) >= want THEN
        RETURN;
    END IF;
    SELECT ids || COALESCE(array_agg(j.id), '{}'), tids || COALESCE(array_agg(j.ctid), '{}'),
           keys || COALESCE(array_agg(j.k), '{}')
    INTO ids, tids, keys FROM (
        SELECT r.id, r.ctid, ks.k
        FROM (VALUES (start, hi), (lo, CASE WHEN start > lo THEN start - 1 END)) d(a, b),
        LATERAL ( -- (the walk of mq_pick_keys)
            -- The probe has no upper bound: every entry of mq_msgs_chain
            -- qualifies, so it stops at the first one whatever the bounds,
            -- but PostgreSQL 15 tests each entry left on the index page
            -- against each bound, once a chain, so a bound it does not need
            -- costs every pick. The key found past the range ends the walk
            -- and is not taken.
            WITH RECURSIVE walk(k, at, n) AS (
                SELECT NULL::bigint, NULL::tid, 0 WHERE d.a <= d.b
                UNION ALL
                SELECT f.k, f.at, w.n + 1 FROM walk w, LATERAL (
                    SELECT m.channel_key AS k, m.ctid AS at FROM mq_msgs m
                    WHERE m.chain_seq IS NOT NULL -- mq_msgs_chain
                      AND m.channel_key >= mq_walk_next(w.k, d.a, d.b)
                    ORDER BY m.channel_key, m.chain_seq LIMIT 1) f
                WHERE w.n < budget
            )
            SELECT w.k, w.at FROM walk w WHERE w.k <= d.b) ks,
        LATERAL (
            -- The head's row version as this statement sees it, by TID.
            SELECT m.id, m.ctid FROM mq_msgs m
            WHERE m.ctid = ks.at
              AND m.dead_since IS NULL
              AND m.attempt_at <= ts
              AND m.attempts > 0
              AND (only_name IS NULL OR m.channel_name = only_name)
              AND m.id <> ALL (ids)
              AND (cardinality(keys) = 0 -- (the first pick of a poll: nothing to count)
                   OR per_key > cardinality(array_positions(keys, ks.k)))
              -- The locked lane: first deliveries not left by a dead locker.
              AND mq_lane_admits(lane, m.deliveries, m.xmax, me, me_lo)
              AND (NOT urgent OR NOT EXISTS (
                    SELECT 1 FROM mq_msgs u
                    WHERE u.channel_key = ks.k
                      AND u.priority > 0 -- mq_msgs_ready_urgent
                      AND u.priority > m.priority
                      AND mq_claimable(u.dead_since, u.after_message_id, u.ready_at,
                                       u.attempt_at, u.attempts, u.id, u.channel_name,
                                       mark, ts, NULL, ids)))
            FOR NO KEY UPDATE SKIP LOCKED
        ) r
        LIMIT want - cardinality(ids)
    ) j;
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
AS $$
DECLARE
    got_key bigint[]; -- the keys taken from, and their allowances (full_keys)
    got_lim int[];
    -- (as in mq_pick_set)
    me    bigint := CASE WHEN lane <> 0 THEN mq_xact_id() END;
    me_lo bigint := me & 4294967295;
BEGIN
    -- As in mq_pick_keys, where the index has the priority (negated, so
    -- that the highest comes first) between the chain key and the place:
    -- a probe finds a key's first claimable message in that order, and the
    -- key's scan starts at its (priority, place). Within a key the scan
    -- does not stop at now: it passes the entries of urgent messages not
    -- ready yet in the index, without visiting the heap.
    SELECT ids || COALESCE(array_agg(j.id), '{}'), tids || COALESCE(array_agg(j.ctid), '{}'),
           LEAST(low, min(j.at)), array_agg(j.k), array_agg(j.lim)
    INTO ids, tids, low, got_key, got_lim FROM (
        SELECT r.id, r.ctid, ks.k, ks.lim, ks.at
        FROM (SELECT u.k, u.np, u.at,
                     GREATEST(0, per_key - cardinality(array_positions(keys, u.k))) AS lim
              FROM (VALUES (start, hi), (lo, CASE WHEN start > lo THEN start - 1 END)) d(a, b),
              LATERAL ( -- (the walk of mq_pick_keys)
                  WITH RECURSIVE walk(k, np, at, n) AS (
                      SELECT NULL::bigint, NULL::smallint, NULL::timestamptz, 0
                      UNION ALL
                      SELECT f.k, f.np, f.at, w.n + 1 FROM walk w, LATERAL (
                          SELECT m.channel_key AS k, -m.priority AS np, m.ready_at AS at
                          FROM mq_msgs m
                          WHERE m.priority > 0 -- mq_msgs_ready_urgent
                            AND mq_claimable(m.dead_since, m.after_message_id, m.ready_at,
                                             m.attempt_at, m.attempts, m.id,
                                             m.channel_name, mark, ts, only_name, ids)
                            AND m.channel_key >= mq_walk_next(w.k, d.a, d.b)
                            AND m.channel_key <= d.b
                          ORDER BY m.channel_key, -m.priority, m.ready_at LIMIT 1) f
                      WHERE w.n < budget
                  )
                  SELECT w.k, w.np, w.at FROM walk w WHERE w.k IS NOT NULL) u) ks,
        LATERAL (
            SELECT m.id, m.ctid FROM mq_msgs m
            WHERE m.channel_key = ks.k
              AND m.priority > 0
              AND (-m.priority, m.ready_at) >= (ks.np, ks.at)
              -- Steps over the messages in flight (see ready_at).
              AND mq_claimable(m.dead_since, m.after_message_id, m.ready_at, m.attempt_at,
                               m.attempts, m.id, m.channel_name, mark, ts, only_name, ids)
              -- The locked lane: first deliveries not left by a dead locker.
              AND mq_lane_admits(lane, m.deliveries, m.xmax, me, me_lo)
            ORDER BY -m.priority, m.ready_at
            LIMIT ks.lim
            FOR NO KEY UPDATE SKIP LOCKED
        ) r
        LIMIT want - cardinality(ids)
    ) j;
    keys := keys || COALESCE(got_key, '{}');
    -- A key that gave its whole allowance may have more.
    full_keys := full_keys || ARRAY(
        SELECT g.k FROM unnest(got_key, got_lim) AS g(k, l)
        GROUP BY g.k, g.l HAVING count(*) >= g.l);
END;
$$;

-- The seed's poll, on mq_claim directly. (PL/pgSQL, as mq_poll_jobs: it
-- keeps the statement's plan, where a SQL function with a SET clause is
-- parsed and planned at every call.)
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
-- UPDATE mq_msgs SET attempt_at = now() to retry at once: polls find
-- messages by ready_at. The functions keep the two in step themselves, so
-- the WHEN clause is false for them and this never runs on the hot path.
-- A time already past places the message now: never behind a poll's
-- low-water mark (mq_low_mark). (A row inserted by hand: mq_fill_row,
-- schema/tables.sql, does the same.)
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

CREATE OR REPLACE TRIGGER mq_msgs_keep_place
    BEFORE UPDATE OF attempt_at ON mq_msgs
    FOR EACH ROW
    WHEN (NEW.attempt_at < NEW.ready_at AND NEW.ready_at <> 'infinity'::timestamptz)
    EXECUTE FUNCTION mq_keep_place();
