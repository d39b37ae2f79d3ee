-- schema/pick.sql: what a poll may take and how it picks it: the row
-- predicates the scans inline (_mq_lane_admits, _mq_claimable,
-- _mq_in_channel, _mq_walk_next), the fair pick across channels
-- (_mq_pick_set) with where it starts (_mq_random_start) and its low-water
-- mark (_mq_low_mark). The walks it runs are in schema/pick_walks.sql, the
-- poll entry points that call it in schema/poll.sql.


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
CREATE OR REPLACE FUNCTION _mq_lane_admits(lane int, deliveries int, locker xid,
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
-- Inlined like _mq_lane_admits (a standard SQL body, no settings), so that
-- its conditions bound the index scans as if they were written in place.
CREATE OR REPLACE FUNCTION _mq_claimable(dead_since timestamptz, after_message_id uuid,
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
-- names can share a hash). Inlined (as _mq_claimable): the range bounds the
-- index scan.
CREATE OR REPLACE FUNCTION _mq_in_channel(dead_since timestamptz, after_message_id uuid,
                                          channel_key bigint, channel_name text, name text)
RETURNS boolean
LANGUAGE sql IMMUTABLE
RETURN dead_since IS NULL AND after_message_id IS NULL
    AND channel_key >= (pg_catalog.hashtext(name)::bigint << 32)
    AND channel_key <= ((pg_catalog.hashtext(name)::bigint << 32) | 4294967295)
    AND channel_name = name;

-- The key a walk's next probe starts at (the walks of _mq_pick_keys,
-- _mq_pick_urgent and _mq_pick_chains): the direction's first key a, then
-- the key after the last one found (k); none once k has reached the
-- direction's last key b. Inlined (as _mq_claimable).
CREATE OR REPLACE FUNCTION _mq_walk_next(k bigint, a bigint, b bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE
RETURN CASE WHEN k IS NULL THEN a WHEN k < b THEN k + 1 END;

-- Schemas of before chained was returned: a changed result needs a DROP.
DO $$
DECLARE
    was regprocedure := pg_catalog.to_regprocedure(
        '_mq_pick_set(text[], integer, timestamp with time zone, integer)');
BEGIN
    IF was IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM pg_catalog.pg_proc p
           WHERE p.oid OPERATOR(pg_catalog.=) was
             AND 'chained' OPERATOR(pg_catalog.=) ANY (p.proargnames)) THEN
        DROP FUNCTION _mq_pick_set(text[], integer, timestamptz, integer);
    END IF;
    IF pg_catalog.to_regprocedure('_mq_wait_time(text[], timestamp with time zone)')
       IS NOT NULL THEN
        DROP FUNCTION _mq_wait_time(text[], timestamptz);
    END IF;
END
$$;

-- A poll's arguments, checked before anything is claimed: a batch size in
-- 1..max_batch and at most 1000 channel names.
CREATE OR REPLACE FUNCTION _mq_poll_args(channel_names text[], batch_size int)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF batch_size IS NULL OR batch_size < 1 OR batch_size > (_mq_limits()).max_batch THEN
        RAISE EXCEPTION 'mq_poll: batch_size % is outside 1..%',
            batch_size, (_mq_limits()).max_batch
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
-- chained: whether the queue has chain entries (its probe below), which
-- the caller passes on to _mq_wait_time when nothing was picked. paused:
-- whether some channel is paused (the caller's probe of mq_paused): the
-- walks then pass the paused channels' keys (schema/pause.sql).
--
-- Fairness: channels are visited in turn, taking at most a quarter of the
-- batch from each, so a busy channel cannot starve a quiet one. An unfiltered
-- poll starts at the chain key after the last channel this session's previous
-- poll took from (the setting 'pqmq.next_' and mq_rows' oid; _mq_random_start
-- when there is none): a random point of the key space would almost always land
-- between names, whose keys sit in narrow ranges (the name's hash, then the
-- args'), and each poll would start at the same channel. A poll that names
-- channels starts each name's visit at a random key of that name's range,
-- where the args' hashes spread evenly. (The turn is the session's own: a
-- turn shared by all sessions started concurrent polls at the same key,
-- each stepping over the heads the other had locked; docs/performance.md.)
-- Priority: within a channel, its urgent messages (priority above 0,
-- _mq_pick_urgent) are taken before those of priority 0 (_mq_pick_keys), and
-- none of priority 0 while it has urgent ones left. A chain's head
-- (_mq_pick_chains) is taken by its own priority: before the channel's
-- urgent messages when none of them outranks it, else after them.
-- Cost: each channel visited is one index probe (loose index scan); a budget
-- bounds the visits, and the time index fills whatever is left. Nothing here
-- groups or sorts the whole backlog.
CREATE OR REPLACE FUNCTION _mq_pick_set(channel_names text[], batch_size int,
                                        ts timestamptz, lane int,
                                        OUT ids uuid[], OUT tids tid[],
                                        OUT chained boolean, paused boolean DEFAULT false)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    got     uuid[];
    got_tid tid[];
    -- This transaction's id, for the test of xmax (lanes 1 and 2).
    me      bigint := CASE WHEN lane <> 0 THEN _mq_xact_id() END;
    me_lo   bigint := me & 4294967295;
    per_key int;
    budget  int;
    nm      text;
    lo      bigint;
    hi      bigint;
    low     timestamptz; -- see _mq_pick_keys
    mark    timestamptz; -- see _mq_low_mark
    again   timestamptz;
    keys    bigint[];    -- the chain key of each message taken
    full_keys bigint[];  -- see _mq_pick_urgent (unfiltered polls)
    urgent  boolean;
    turn    text;        -- the session setting of the turn (unfiltered polls)
    kept    text;
    start   bigint;      -- where the visit of a key range begins
    last_key bigint;     -- the last channel an unfiltered visit took from
BEGIN
    per_key := GREATEST(1, (batch_size + 3) / 4);
    budget := 2 * batch_size + 16;
    mark := _mq_low_mark(ts, false);
    IF channel_names IS NULL THEN
        -- A key in hex (to_hex: two's complement); anything else (unset,
        -- or set by hand) counts as unset. (No regular expression and no
        -- numeric: they cost more than the rest of this.)
        turn := 'pqmq.next_' || 'mq_msgs'::regclass::oid;
        kept := current_setting(turn, true);
        IF length(kept) BETWEEN 1 AND 16 AND btrim(kept, '0123456789abcdef') = '' THEN
            start := ('x' || lpad(kept, 16, '0'))::bit(64)::bigint;
        ELSE
            start := _mq_random_start(mark);
        END IF;
    END IF;
    -- One probe: a queue without chains skips their pass (a call).
    chained := EXISTS (SELECT 1 FROM mq_rows m
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
            SELECT 1 FROM mq_rows m
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
                FROM _mq_pick_chains(NULL, -9223372036854775808, 9223372036854775807,
                                    start, per_key, batch_size, budget, ts, lane, true, mark,
                                    ids, tids, keys, paused => paused) p;
            END IF;
            IF urgent THEN
                SELECT p.ids, p.tids, p.keys, p.low, p.full_keys
                INTO ids, tids, keys, low, full_keys
                FROM _mq_pick_urgent(NULL, -9223372036854775808, 9223372036854775807,
                                    start, per_key, batch_size, budget, ts, lane, mark, ids, tids,
                                    keys, low, full_keys, paused => paused) p;
            END IF;
            IF chained THEN
                SELECT p.ids, p.tids, p.keys INTO ids, tids, keys
                FROM _mq_pick_chains(NULL, -9223372036854775808, 9223372036854775807,
                                    start, per_key, batch_size, budget, ts, lane, urgent,
                                    mark, ids, tids, keys, paused => paused) p;
            END IF;
            IF cardinality(ids) < batch_size THEN
                SELECT p.ids, p.tids, p.keys, p.low INTO ids, tids, keys, low
                FROM _mq_pick_keys(NULL, -9223372036854775808, 9223372036854775807,
                                  start, per_key, batch_size, budget, ts, lane, mark, ids, tids,
                                  keys, low, paused => paused) p;
            END IF;
            -- The last channel of this visit (from start up, then around;
            -- the urgent round 2 below starts over).
            last_key := keys[cardinality(keys)];
            IF cardinality(ids) < batch_size AND cardinality(full_keys) > 0 THEN
                SELECT p.ids, p.tids, p.keys, p.low, p.full_keys
                INTO ids, tids, keys, low, full_keys
                FROM _mq_pick_urgent(NULL, -9223372036854775808, 9223372036854775807,
                                    start, batch_size, batch_size, budget, ts, lane, mark, ids,
                                    tids, keys, low, full_keys, paused => paused) p;
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
                        FROM _mq_pick_chains(nm, lo, hi, start, per_key, batch_size, budget, ts,
                                            lane, true, mark, ids, tids, keys, paused => paused) p;
                    END IF;
                    IF urgent THEN
                        SELECT p.ids, p.tids, p.keys, p.low, p.full_keys
                        INTO ids, tids, keys, low, full_keys
                        FROM _mq_pick_urgent(nm, lo, hi, start,
                                            CASE WHEN round = 1 THEN per_key ELSE batch_size END,
                                            batch_size, budget, ts, lane, mark, ids, tids,
                                            keys, low, full_keys, paused => paused) p;
                    END IF;
                    IF chained AND round = 1 THEN -- (a chain gives one message a poll)
                        SELECT p.ids, p.tids, p.keys INTO ids, tids, keys
                        FROM _mq_pick_chains(nm, lo, hi, start, per_key, batch_size, budget, ts,
                                            lane, urgent, mark, ids, tids, keys, paused => paused) p;
                    END IF;
                    CONTINUE WHEN cardinality(ids) >= batch_size;
                    SELECT p.ids, p.tids, p.keys, p.low INTO ids, tids, keys, low
                    FROM _mq_pick_keys(nm, lo, hi, start,
                                      CASE WHEN round = 1 THEN per_key ELSE batch_size END,
                                      batch_size, budget, ts, lane, mark, ids, tids, keys,
                                      low, paused => paused) p;
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
        -- While a channel is paused (paused: mq_claim_lane's probe of
        -- mq_paused), the time index would step over the paused channels'
        -- ready messages at every poll: a second visit of the channels, each
        -- giving up to the rest of the batch, tops up instead.
        IF paused AND channel_names IS NULL AND cardinality(ids) < batch_size THEN
            SELECT p.ids, p.tids, p.keys, p.low INTO ids, tids, keys, low
            FROM _mq_pick_keys(NULL, -9223372036854775808, 9223372036854775807,
                              start, batch_size, batch_size, budget, ts, lane, mark, ids, tids,
                              keys, low, paused => paused) p;
        ELSIF channel_names IS NULL AND cardinality(ids) < batch_size THEN
            SELECT array_agg(s.id), array_agg(s.ctid) INTO got, got_tid FROM (
                SELECT m.id, m.ctid FROM mq_rows m
                WHERE m.ready_at > '-infinity'::timestamptz -- mq_msgs_ready_by_time
                  AND _mq_claimable(m.dead_since, m.after_message_id, m.ready_at,
                                   m.attempt_at, m.attempts, m.id, m.channel_name,
                                   COALESCE(low, mark), ts, NULL, ids)
                  AND _mq_lane_admits(lane, m.deliveries, m.xmax, me, me_lo)
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
        -- a live row appeared behind it (_mq_low_mark).
        EXIT WHEN cardinality(ids) > 0;
        again := _mq_low_mark(ts, true);
        EXIT WHEN again >= mark;
        mark := again;
    END LOOP;
END;
$$;

-- Where an unfiltered poll starts when its session has no turn (its first
-- poll, or each poll behind a pooler that resets sessions, such as PgBouncer
-- with DISCARD ALL): a random key of the range of the name of the first
-- channel at or after a random key of the whole space. A random key of the
-- whole space alone would nearly always fall between names (_mq_pick_set),
-- and so start at a name's first channel every time. One probe of the
-- channel index, from the place mark on.
CREATE OR REPLACE FUNCTION _mq_random_start(mark timestamptz)
RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    start bigint := LEAST(9223372036854775807, -9223372036854775808
                          + floor(random() * 18446744073709551616::numeric))::bigint;
    found bigint;
BEGIN
    SELECT m.channel_key INTO found FROM mq_rows m
    WHERE m.dead_since IS NULL
      AND m.after_message_id IS NULL
      AND m.priority <= 0 -- mq_msgs_ready_plain
      AND m.ready_at >= mark
      AND m.channel_key >= start
    ORDER BY m.channel_key LIMIT 1;
    IF found IS NULL THEN -- past the last channel: the first one
        SELECT m.channel_key INTO found FROM mq_rows m
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
-- ('pqmq.low_' and mq_rows' oid: a queue's, per connection): moved on from
-- where it was once a second, found afresh every ten seconds or, when afresh
-- is true (_mq_pick_set: a poll that found nothing), every second, and
-- never later than a second ago. Rows can appear behind it only when a producer's transaction
-- commits more than a second after its insert (or a client writes
-- mq_rows directly); such a row is found by the next poll that comes up
-- empty and at the latest ten seconds later. The other ways a row gets a
-- place keep it at or after now: mq_commit, a retry, _mq_keep_place.
CREATE OR REPLACE FUNCTION _mq_low_mark(ts timestamptz, afresh boolean)
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- No more settings: it runs under its callers' (_mq_pick_set, _mq_wait_time),
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
    SELECT m.ready_at INTO found_at FROM mq_rows m
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
