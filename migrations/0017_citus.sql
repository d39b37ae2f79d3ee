-- Migration 0017: the queue on Citus (README, "Citus"). On a Citus
-- coordinator pqmq_migrate makes the queue's schema a distributed schema:
-- its tables are single-shard tables that Citus places together on one node,
-- so every statement of a poll, an insert or a completion is a router query
-- to that node and keeps its meaning (FOR UPDATE SKIP LOCKED included).
-- Citus ships each statement to the worker as text and refuses some forms:
-- an UPDATE may apply only immutable functions to a row's columns (mq_at),
-- none that are volatile (clock_timestamp() is read into a variable first),
-- an INSERT cannot read the queue's tables in its SELECT, and a statement
-- cannot read a trigger's transition table. The functions below avoid
-- those forms; where the form Citus accepts costs more on one server, the
-- function keeps both and takes the Citus one when pqmq.citus is on (set on
-- the queue's functions by pqmq_migrate on Citus). mq_lock_chains takes its
-- locks where the function runs, as mq_lock_new_chains does.

-- at + d, declared IMMUTABLE (timestamptz + interval is STABLE: a day's
-- length depends on the time zone). Citus ships an UPDATE to a worker only
-- when the functions it applies to a row's columns are immutable; the
-- queue's intervals have a fixed length (mq_fixed_length), so it is. Used
-- on Citus, and in statements too rare for a call per row to matter.
CREATE OR REPLACE FUNCTION mq_at(at timestamptz, d interval)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$ SELECT at OPERATOR(pg_catalog.+) d $$;

-- This transaction's id (pg_current_xact_id) where the queue's rows are,
-- for the tests of a row's locker (xmax) on the locked lane: on Citus, the
-- worker's, found by a statement that reads a queue table (Citus runs it on
-- the worker that holds the queue, in this transaction); else this server's.
CREATE OR REPLACE FUNCTION mq_xact_id()
RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF current_setting('pqmq.citus', true) = 'on' THEN
        RETURN (SELECT pg_current_xact_id()::text::bigint FROM mq_schema_migrations LIMIT 1);
    END IF;
    RETURN pg_current_xact_id()::text::bigint;
END;
$$;

-- The triggers: one delta row per channel per statement; about one
-- statement in 250 also folds.
CREATE OR REPLACE FUNCTION mq_count_inserted()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    names  text[];
    totals bigint[];
    waits  bigint[];
BEGIN
    IF pg_catalog.current_setting('pqmq.citus', true) = 'on' THEN
        -- Citus ships an INSERT to the shard as text, where the transition
        -- table is unknown: it is read here first.
        SELECT pg_catalog.array_agg(d.channel_name), pg_catalog.array_agg(d.total),
               pg_catalog.array_agg(d.waiting)
        INTO names, totals, waits
        FROM (SELECT n.channel_name, pg_catalog.count(*) AS total,
                     pg_catalog.count(*) FILTER (
                         WHERE n.after_message_id OPERATOR(pg_catalog.<>)
                               '00000000-0000-0000-0000-000000000000'::uuid) AS waiting
              FROM mq_new_rows n
              GROUP BY n.channel_name) d;
        INSERT INTO mq_count_deltas (channel_name, total, waiting, removed)
        SELECT u.n, u.t, u.w, 0 FROM unnest(names, totals, waits) AS u(n, t, w);
    ELSE
        INSERT INTO mq_count_deltas (channel_name, total, waiting, removed)
        SELECT n.channel_name, pg_catalog.count(*),
               pg_catalog.count(*) FILTER (
                   WHERE n.after_message_id OPERATOR(pg_catalog.<>)
                         '00000000-0000-0000-0000-000000000000'::uuid),
               0
        FROM mq_new_rows n
        GROUP BY n.channel_name;
    END IF;
    IF pg_catalog.random() < 0.004 THEN
        PERFORM mq_count_fold();
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION mq_count_deleted()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    names  text[];
    totals bigint[];
    waits  bigint[];
BEGIN
    IF pg_catalog.current_setting('pqmq.citus', true) = 'on' THEN
        -- As in mq_count_inserted.
        SELECT pg_catalog.array_agg(d.channel_name), pg_catalog.array_agg(d.total),
               pg_catalog.array_agg(d.waiting)
        INTO names, totals, waits
        FROM (SELECT o.channel_name, pg_catalog.count(*) AS total,
                     pg_catalog.count(*) FILTER (
                         WHERE o.after_message_id OPERATOR(pg_catalog.<>)
                               '00000000-0000-0000-0000-000000000000'::uuid) AS waiting
              FROM mq_old_rows o
              GROUP BY o.channel_name) d;
        INSERT INTO mq_count_deltas (channel_name, total, waiting, removed)
        SELECT u.n, -u.t, -u.w, u.t
        FROM unnest(names, totals, waits) AS u(n, t, w);
    ELSE
        INSERT INTO mq_count_deltas (channel_name, total, waiting, removed)
        SELECT o.channel_name, -pg_catalog.count(*),
               -pg_catalog.count(*) FILTER (
                   WHERE o.after_message_id OPERATOR(pg_catalog.<>)
                         '00000000-0000-0000-0000-000000000000'::uuid),
               pg_catalog.count(*)
        FROM mq_old_rows o
        GROUP BY o.channel_name;
    END IF;
    IF pg_catalog.random() < 0.004 THEN
        PERFORM mq_count_fold();
    END IF;
    RETURN NULL;
END;
$$;

-- mq_insert's work, and mq_insert_unique's (schema/keys.sql): checks the
-- whole batch, then inserts the messages that take[i] marks (NULL: all),
-- message i with unique key unique_keys[i] (NULL: none) kept key_retention
-- after it is deleted, with priority priorities[i] (NULL: 0). Ordered
-- messages not taken are not in any chain.
CREATE OR REPLACE FUNCTION mq_insert_rows(new_messages mq_new_t[], unique_keys text[],
                                          key_retention interval, take boolean[],
                                          priorities int[])
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
    afters  uuid[];
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
    IF priorities IS NOT NULL THEN
        IF cardinality(priorities) <> cardinality(new_messages) THEN
            RAISE EXCEPTION 'mq_insert: % messages but % priorities',
                cardinality(new_messages), cardinality(priorities)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT p.o, p.v INTO bad FROM unnest(priorities) WITH ORDINALITY AS p(v, o)
        WHERE p.v < 0 OR p.v > 32767 ORDER BY p.o LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'mq_insert: message % of the batch: priority % is outside 0..32767',
                bad.o, bad.v
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;

    -- Only what the caller takes (mq_insert_unique: not the messages whose
    -- key another message holds), checked above with the rest.
    IF take IS NOT NULL THEN
        SELECT COALESCE(array_agg(new_messages[t.o] ORDER BY t.o), '{}'),
               COALESCE(array_agg(unique_keys[t.o] ORDER BY t.o), '{}'),
               COALESCE(array_agg(priorities[t.o] ORDER BY t.o), '{}')
        INTO new_messages, unique_keys, priorities
        FROM generate_subscripts(new_messages, 1) AS t(o)
        WHERE take[t.o];
        IF cardinality(new_messages) = 0 THEN
            RETURN;
        END IF;
    END IF;

    has_ordered := EXISTS (SELECT 1 FROM unnest(new_messages) AS t WHERE t.ordered);

    IF has_ordered THEN
        PERFORM mq_lock_new_chains(new_messages);
    END IF;

    IF current_setting('pqmq.citus', true) = 'on' THEN
        -- Citus copies the rows of the insert below to the worker, and a
        -- duplicate id fails there without its SQLSTATE: found here first,
        -- in the batch or the queue (a race with another producer of the
        -- same id still fails, as XX000).
        SELECT t.id INTO bad FROM unnest(new_messages) AS t
        GROUP BY t.id HAVING count(*) > 1
        LIMIT 1;
        IF NOT FOUND THEN
            SELECT m.id INTO bad FROM mq_msgs m
            WHERE m.id = ANY (ARRAY(SELECT t.id FROM unnest(new_messages) AS t))
            LIMIT 1;
        END IF;
        IF FOUND THEN
            RAISE EXCEPTION 'duplicate key value violates unique constraint "mq_msgs_pkey"'
                USING ERRCODE = 'unique_violation',
                      DETAIL = format('Key (id)=(%s) already exists.', bad.id);
        END IF;
    END IF;
    IF has_ordered AND current_setting('pqmq.citus', true) = 'on' THEN
        -- Citus cannot ship an INSERT whose SELECT reads the queue's tables
        -- (it adds a filter on a distribution column that single-shard
        -- tables lack): each message's predecessor is found first, as
        -- below, and the insert that follows reads only the arrays.
        WITH batch AS (
            SELECT t.*, COALESCE(t.channel_args, '') AS args
            FROM unnest(new_messages) WITH ORDINALITY AS t(
                id, delay, retries, retry_backoff, channel_name, channel_args,
                commit_interval, ordered, name, payload_json, payload_bytes, ord)
        )
        SELECT array_agg(a.after ORDER BY a.ord) INTO afters FROM (
            SELECT b.ord, CASE WHEN b.ordered THEN COALESCE(
                       lag(b.id) OVER chain,
                       (SELECT c.tail_id FROM mq_chains c
                        WHERE c.channel_key = ((hashtext(b.channel_name)::bigint << 32)
                                               | (hashtext(b.args)::bigint & 4294967295))
                          AND c.channel_name = b.channel_name
                          AND c.channel_args = b.args
                          AND (SELECT m.id FROM mq_msgs m WHERE m.id = c.tail_id) IS NOT NULL
                        LIMIT 1),
                       '00000000-0000-0000-0000-000000000000'::uuid)
                   END AS after
            FROM batch b
            WINDOW chain AS (PARTITION BY b.ordered, b.channel_name, b.args ORDER BY b.ord)
        ) a;
    END IF;

    IF NOT has_ordered OR afters IS NOT NULL THEN
        -- No chains to extend (or their links found above): a plain insert.
        INSERT INTO mq_msgs (id, created_at, attempt_at, attempts, retry_backoff,
                             channel_name, channel_args, commit_interval, after_message_id,
                             ready_at, name, payload_json, payload_bytes, unique_key,
                             key_retention, priority)
        SELECT t.id, ts,
               ts + COALESCE(t.delay, interval '0')
                  + COALESCE(t.commit_interval, interval '0'),
               LEAST(COALESCE(t.retries, 4)::bigint + 1, 2147483647)::int,
               COALESCE(t.retry_backoff, interval '1 second'),
               t.channel_name, COALESCE(t.channel_args, ''), t.commit_interval,
               afters[t.ordinality::int],
               ts + COALESCE(t.delay, interval '0')
                  + COALESCE(t.commit_interval, interval '0'),
               COALESCE(t.name, ''), t.payload_json::jsonb, t.payload_bytes,
               unique_keys[t.ordinality::int],
               CASE WHEN unique_keys[t.ordinality::int] IS NOT NULL THEN key_retention END,
               COALESCE(priorities[t.ordinality::int], 0)
        FROM unnest(new_messages) WITH ORDINALITY AS t;
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
                             payload_bytes, unique_key, key_retention, priority)
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
               COALESCE(b.name, ''), b.payload_json::jsonb, b.payload_bytes,
               unique_keys[b.ord::int],
               CASE WHEN unique_keys[b.ord::int] IS NOT NULL THEN key_retention END,
               COALESCE(priorities[b.ord::int], 0)
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
    -- (Nothing to do: and Citus fails on the statement below when its
    -- condition is false whatever the rows.)
    IF msg_ids IS NULL OR cardinality(msg_ids) = 0 THEN
        RETURN;
    END IF;
    WITH c AS (
        -- Ready when its delay ends, and placed no earlier than now, so
        -- never behind a poll's low-water mark (mq_low_mark).
        UPDATE mq_msgs m SET
            -- (mq_at: see schema/common.sql.)
            attempt_at = CASE WHEN m.deliveries = 0
                              THEN GREATEST(mq_at(m.attempt_at, - m.commit_interval), ts)
                              ELSE m.attempt_at END,
            ready_at = CASE WHEN m.deliveries = 0
                            THEN GREATEST(mq_at(m.attempt_at, - m.commit_interval), ts)
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

    -- Nothing claimed: the one row says when to poll again.
    RETURN QUERY SELECT NULL::uuid, NULL::boolean, NULL::text, NULL::text,
        NULL::bytea, NULL::interval, mq_wait_time(channel_names, ts),
        NULL::text, NULL::text, NULL::int, NULL::int, NULL::text, NULL::boolean;
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
    me    bigint := CASE WHEN lane <> 0 THEN mq_xact_id() END;
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
    me    bigint := CASE WHEN lane <> 0 THEN mq_xact_id() END;
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
    ts    timestamptz := clock_timestamp();
    n     int;
    until timestamptz;
BEGIN
    duration := mq_fixed_length(duration);
    IF duration IS NULL OR duration < interval '0' THEN
        RAISE EXCEPTION 'mq_keep_alive: duration % is NULL or negative', duration
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A client that doubles its keep-alive (sqlxmq's runner does) reaches
    -- any limit in time: longer durations are cut to the limit, not refused.
    duration := LEAST(duration, (mq_limits()).max_duration);
    -- Computed once, outside the statement (which Citus then ships whole).
    until := ts + duration;
    -- SKIP LOCKED: a row locked by a consumer's open transaction is not
    -- waited for (pollers skip it too, so it cannot be redelivered meanwhile).
    -- A kept-alive message is a long one: it moves out of the polls' way
    -- (ready_at), a final attempt stays at 'infinity'.
    UPDATE mq_msgs m SET
        attempt_at = until,
        commit_interval = CASE WHEN m.deliveries = 0 AND m.commit_interval IS NOT NULL
                               THEN m.commit_interval + (until - m.attempt_at)
                               ELSE m.commit_interval END,
        ready_at = CASE WHEN m.ready_at = 'infinity'::timestamptz THEN m.ready_at
                        ELSE until END
    WHERE m.id = ANY (ARRAY(SELECT l.id FROM mq_msgs l
                            WHERE l.id = ANY (msg_ids)
                              AND l.attempt_at > ts
                              AND l.attempt_at < until
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
    ts    timestamptz := clock_timestamp();
    until timestamptz;
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
    until := ts + duration; -- as in mq_keep_alive_count
    UPDATE mq_msgs m SET
        attempt_at = GREATEST(m.attempt_at, until),
        attempts = LEAST(m.attempts::bigint + COALESCE(extra_retries, 0),
                         2147483647)::int,
        -- Moves with the lease, or stays at 'infinity' while no attempt is left.
        ready_at = CASE WHEN m.attempts::bigint + COALESCE(extra_retries, 0) = 0
                        THEN 'infinity'::timestamptz
                        ELSE GREATEST(m.attempt_at, until) END,
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
    mine xid;
BEGIN
    -- (mq_at: see schema/common.sql.)
    UPDATE mq_msgs m SET
        attempt_at = CASE WHEN m.attempts > 0
                          THEN mq_at(ts, m.retry_backoff / 2)
                          ELSE ts END,
        dead_since = CASE WHEN m.attempts > 0 THEN NULL ELSE ts END,
        ready_at = CASE WHEN m.attempts > 0
                        THEN mq_at(ts, m.retry_backoff / 2)
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
        mine := (mq_xact_id() & 4294967295)::text::xid;
        UPDATE mq_msgs m SET
            attempts = m.attempts - 1,
            deliveries = m.deliveries + 1,
            retry_backoff = CASE WHEN m.retry_backoff * 2 > (mq_limits()).max_duration
                                 THEN m.retry_backoff ELSE m.retry_backoff * 2 END,
            attempt_at = CASE WHEN m.attempts > 1 THEN mq_at(ts, m.retry_backoff) ELSE ts END,
            dead_since = CASE WHEN m.attempts > 1 THEN NULL ELSE ts END,
            ready_at = CASE WHEN m.attempts > 1 THEN mq_at(ts, m.retry_backoff)
                            ELSE m.ready_at END,
            last_error = left(error, 10000)
        WHERE m.id = msg_id
          AND m.attempt_at <= ts
          AND m.dead_since IS NULL
          AND m.attempts > 0
          AND (msg_attempt IS NULL OR m.deliveries = msg_attempt)
          AND m.xmax = mine
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
DECLARE
    a int[];
    b int[];
BEGIN
    -- Read first, locked after: on Citus a statement that reads the queue's
    -- tables runs on the worker that holds them, and these locks must be
    -- taken where mq_lock_new_chains takes them (where this function runs).
    SELECT array_agg(k.a ORDER BY k.a, k.b), array_agg(k.b ORDER BY k.a, k.b) INTO a, b
    FROM (
        SELECT DISTINCT hashtext(m.channel_name) AS a, hashtext(m.channel_args) AS b
        FROM mq_msgs m
        WHERE m.id = ANY (msg_ids) AND m.after_message_id IS NOT NULL
    ) k;
    PERFORM pg_advisory_xact_lock(k.a, k.b)
    FROM unnest(a, b) WITH ORDINALITY AS k(a, b, o)
    ORDER BY k.o;
END;
$$;

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
        UPDATE mq_chains c SET tail_id = COALESCE(at_id[width_bucket(c.ctid, at_tid)]) -- (see mq_unlink)
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
    ts       timestamptz;
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

    ts := clock_timestamp(); -- a value, not a call in the statement (Citus)
    WITH moved AS (
        -- (COALESCE of one value: Citus's deparser takes an array element
        -- at the top of a SET inside WITH for an element assignment, and
        -- crashes.)
        UPDATE mq_msgs s SET after_message_id = COALESCE(o_pred[width_bucket(s.after_message_id,
                                                                             o_id)]),
            -- A new head joins the ready indexes no earlier than now, so
            -- never behind a poll's low-water mark (mq_low_mark).
            ready_at = CASE WHEN o_pred[width_bucket(s.after_message_id, o_id)]
                                 = '00000000-0000-0000-0000-000000000000'::uuid
                            THEN GREATEST(s.ready_at, ts)
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
        UPDATE mq_chains c SET tail_id = COALESCE(h_pred[width_bucket(c.ctid, h_tid)]) -- (above)
        WHERE c.ctid = ANY (h_tid);
    END IF;
    IF gone_tid IS NOT NULL THEN
        DELETE FROM mq_chains c WHERE c.ctid = ANY (gone_tid);
    END IF;
    RETURN chans;
END;
$$;

-- Inserts a batch as mq_insert does, where message i carries the key
-- unique_keys[i] (NULL: none). A message whose key another live message of
-- its channel holds (queued, scheduled, in flight, or waiting for its
-- commit; not a dead letter), or that a deleted message still holds for its
-- retention window, is not inserted: mode 'keep' leaves the holder as it
-- is; 'replace' gives a holder that has not started (never delivered, not
-- held by a consumer) this message's name, payload and schedule;
-- 'replace_payload' its name and payload only. A batch is taken as if its
-- messages were inserted one after another: later messages with a key that
-- an earlier one took are kept, or replace it. retention: how long a key
-- outlives the completion of its message (NULL: not at all). priorities:
-- as for mq_insert; 'replace' gives the holder the priority too.
-- Returns, in batch order, the id each message stands for (its own, or the
-- holder's) and what happened: 'inserted', 'kept' or 'replaced'.
CREATE OR REPLACE FUNCTION mq_insert_unique(new_messages mq_new_t[], unique_keys text[],
                                            mode text DEFAULT 'keep',
                                            retention interval DEFAULT NULL,
                                            priorities int[] DEFAULT NULL)
RETURNS TABLE(id uuid, outcome text)
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
    ts    timestamptz := clock_timestamp();
    n     int := cardinality(new_messages);
    lim   record;
    bad   int;
    ids   uuid[];
    outs  text[];
    take  boolean[];
    eff   mq_new_t[];
    g     record;
    holder uuid;
    expires timestamptz;
    fresh boolean;
    live  boolean;
    got   tid;
    src   mq_new_t;
    at0   timestamptz; -- 'replace': when the new message is due
    prio  int[];
BEGIN
    IF n IS NULL OR n = 0 THEN
        RETURN;
    END IF;
    lim := mq_limits();
    IF unique_keys IS NOT NULL AND cardinality(unique_keys) <> n THEN
        RAISE EXCEPTION 'mq_insert_unique: % messages but % unique keys',
            n, cardinality(unique_keys)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF mode IS NULL OR mode NOT IN ('keep', 'replace', 'replace_payload') THEN
        RAISE EXCEPTION 'mq_insert_unique: mode % is not keep, replace or replace_payload',
            COALESCE(quote_literal(mode), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF retention < interval '0' OR retention > lim.max_duration THEN
        RAISE EXCEPTION 'mq_insert_unique: retention % is outside 0..36500000 days', retention
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    retention := NULLIF(mq_fixed_length(retention), interval '0');
    SELECT min(k.o) INTO bad FROM unnest(unique_keys) WITH ORDINALITY AS k(key, o)
    WHERE k.key = '' OR octet_length(k.key) > 1024;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'mq_insert_unique: message % of the batch: unique key is %', bad,
            CASE WHEN unique_keys[bad] = '' THEN 'empty (NULL means none)'
                 ELSE 'over 1024 bytes' END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Every message is checked before any key is taken or any holder changed.
    PERFORM mq_insert_rows(new_messages, NULL, NULL, array_fill(false, ARRAY[n]), priorities);

    -- Forget a few keys whose window has passed (those who keep keys pay).
    DELETE FROM mq_keys k WHERE k.ctid = ANY (ARRAY(
        SELECT e.ctid FROM mq_keys e WHERE e.expires_at <= ts
        ORDER BY e.expires_at LIMIT 2 * n + 16 FOR UPDATE SKIP LOCKED));

    ids := ARRAY(SELECT (new_messages[t.o]).id FROM generate_subscripts(new_messages, 1) AS t(o) ORDER BY t.o);
    outs := array_fill('inserted'::text, ARRAY[n]);
    take := array_fill(true, ARRAY[n]);
    eff := new_messages;
    prio := priorities;

    -- Each key once (the first message of the batch with it, "first"), in
    -- key order so that producers racing on the same keys cannot deadlock.
    -- The upsert takes a free key or locks the row of a held one; the
    -- primary key decides between racing producers.
    FOR g IN
        WITH b AS (
            SELECT t.o, (new_messages[t.o]).channel_name AS ch, unique_keys[t.o] AS key
            FROM generate_subscripts(new_messages, 1) AS t(o)
            WHERE unique_keys[t.o] IS NOT NULL
        )
        SELECT b.ch, b.key, min(b.o) AS first, max(b.o) AS last,
               array_agg(b.o ORDER BY b.o) AS members
        FROM b GROUP BY b.ch, b.key ORDER BY b.ch, b.key
    LOOP
        INSERT INTO mq_keys AS k (channel_name, unique_key, message_id)
        VALUES (g.ch, g.key, ids[g.first])
        ON CONFLICT (channel_name, unique_key) DO UPDATE SET message_id = k.message_id
        RETURNING k.message_id, k.expires_at, k.xmax = '0'::xid INTO holder, expires, fresh;
        -- In 'replace' modes the last message with the key is what the
        -- holder ends up with, as if the batch were inserted in order.
        src := new_messages[CASE WHEN mode = 'keep' THEN g.first ELSE g.last END];
        IF NOT fresh THEN
            live := EXISTS (SELECT 1 FROM mq_msgs m
                            WHERE m.id = holder AND m.dead_since IS NULL);
            IF live OR (expires IS NOT NULL AND expires > ts) THEN
                got := NULL;
                IF live AND mode <> 'keep' THEN
                    -- Not started: never delivered and held by no consumer
                    -- (the locked lane's claim is a row lock).
                    SELECT m.ctid INTO got FROM mq_msgs m
                    WHERE m.id = holder AND m.deliveries = 0 AND m.dead_since IS NULL
                    FOR NO KEY UPDATE SKIP LOCKED;
                END IF;
                IF got IS NOT NULL THEN
                    -- (A value, and mq_at, where Citus needs them: see
                    -- schema/common.sql.)
                    at0 := ts + COALESCE(mq_fixed_length(src.delay), interval '0');
                    UPDATE mq_msgs m SET
                        name = COALESCE(src.name, ''),
                        payload_json = src.payload_json::jsonb,
                        payload_bytes = src.payload_bytes,
                        attempt_at = CASE WHEN mode = 'replace'
                            THEN mq_at(at0, COALESCE(m.commit_interval, interval '0'))
                            ELSE m.attempt_at END,
                        ready_at = CASE WHEN mode = 'replace'
                            THEN mq_at(at0, COALESCE(m.commit_interval, interval '0'))
                            ELSE m.ready_at END,
                        priority = CASE WHEN mode = 'replace'
                            THEN COALESCE(priorities[g.last], 0) ELSE m.priority END
                    WHERE m.ctid = got;
                END IF;
                FOR i IN 1 .. cardinality(g.members) LOOP
                    ids[g.members[i]] := holder;
                    outs[g.members[i]] := CASE WHEN got IS NULL THEN 'kept' ELSE 'replaced' END;
                    take[g.members[i]] := false;
                END LOOP;
                CONTINUE;
            END IF;
            -- The holder is dead or gone and its window over: the key is free.
            UPDATE mq_keys k SET message_id = COALESCE(ids[g.first]), expires_at = NULL -- (COALESCE: see mq_unlink)
            WHERE k.channel_name = g.ch AND k.unique_key = g.key;
        END IF;
        -- The first message is inserted (with the last one's payload in
        -- 'replace' modes); the others stand for it.
        eff[g.first] := ROW(ids[g.first], CASE WHEN mode = 'replace' THEN src.delay
                                               ELSE (new_messages[g.first]).delay END,
                            (new_messages[g.first]).retries, (new_messages[g.first]).retry_backoff,
                            g.ch, (new_messages[g.first]).channel_args,
                            (new_messages[g.first]).commit_interval,
                            (new_messages[g.first]).ordered, src.name, src.payload_json,
                            src.payload_bytes)::mq_new_t;
        IF priorities IS NOT NULL THEN
            prio[g.first] := priorities[CASE WHEN mode = 'replace' THEN g.last ELSE g.first END];
        END IF;
        FOR i IN 2 .. cardinality(g.members) LOOP
            ids[g.members[i]] := ids[g.first];
            outs[g.members[i]] := CASE WHEN mode = 'keep' THEN 'kept' ELSE 'replaced' END;
            take[g.members[i]] := false;
        END LOOP;
    END LOOP;

    PERFORM mq_insert_rows(eff, unique_keys, retention, take, prio);
    RETURN QUERY SELECT ids[i], outs[i] FROM generate_series(1, n) AS i ORDER BY i;
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
    -- (Nothing to do: and Citus fails on the statement below when its
    -- condition is false whatever the rows.)
    IF cardinality(msg_ids) = 0 THEN
        RETURN 0;
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
    keyed uuid[];
    n     int;
BEGIN
    IF retries IS NULL OR retries < 0 OR retries > 2147483646 THEN
        RAISE EXCEPTION 'mq_retry: retries % is outside 0..2147483646', retries
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM mq_reap_dead();
    -- (As in mq_commit.)
    IF msg_ids IS NULL OR cardinality(msg_ids) = 0 THEN
        RETURN 0;
    END IF;
    WITH r AS (
        UPDATE mq_msgs m SET attempts = retries + 1, attempt_at = ts, dead_since = NULL,
                             ready_at = ts
        WHERE m.id = ANY (msg_ids) AND m.dead_since IS NOT NULL
        RETURNING m.id, m.channel_name, m.unique_key
    )
    SELECT count(*), array_agg(DISTINCT r.channel_name),
           array_agg(r.id) FILTER (WHERE r.unique_key IS NOT NULL)
    INTO n, chans, keyed FROM r;
    -- A live message holds its key again (schema/keys.sql).
    IF keyed IS NOT NULL THEN
        PERFORM mq_retake_keys(keyed);
    END IF;
    PERFORM mq_wake(chans);
    RETURN n;
END;
$$;

-- When a message with a key is deleted (completed, cancelled, purged), its
-- key is kept for the message's retention window, or freed at once; a dead
-- letter's key is freed (a dead message holds no key: the work it stood
-- for did not get done). Only the key row that names this message.
CREATE OR REPLACE FUNCTION mq_release_key()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    until timestamptz;
BEGIN
    IF OLD.dead_since IS NULL AND OLD.key_retention IS NOT NULL THEN
        until := clock_timestamp() + OLD.key_retention; -- a value (Citus)
        UPDATE mq_keys k SET expires_at = until
        WHERE k.channel_name = OLD.channel_name AND k.unique_key = OLD.unique_key
          AND k.message_id = OLD.id;
    ELSE
        DELETE FROM mq_keys k
        WHERE k.channel_name = OLD.channel_name AND k.unique_key = OLD.unique_key
          AND k.message_id = OLD.id;
    END IF;
    RETURN NULL;
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
-- mq_msgs_ready_plain per chain key of the channel (and a read of the
-- channel's urgent messages).
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
    r  record;
BEGIN
    PERFORM mq_count_fold();
    FOR r IN
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
        -- (named channels: only their ranges of the channel indexes, plain
        -- and urgent)
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
              AND m.priority <= 0
              AND m.ready_at <= ts
              AND m.attempt_at > ts
              AND m.attempts > 0
        ) m
        WHERE channel_names IS NOT NULL
        UNION ALL
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
              AND m.priority > 0
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
    SELECT c.channel_name AS ch,
           c.total - c.waiting - COALESCE(b.f + b.s + b.u + b.d, 0) AS rdy,
           COALESCE(b.f, 0) AS f, COALESCE(b.s, 0) AS s, COALESCE(b.u, 0) AS u,
           c.waiting AS w, COALESCE(b.d, 0) AS d, COALESCE(b.b, 0) AS bl, c.removed AS rm
    FROM counts c
    LEFT JOIN by_state b ON b.channel_name = c.channel_name
    WHERE c.total > 0
       OR (channel_names IS NOT NULL AND c.channel_name = ANY (channel_names))
    ORDER BY c.channel_name
    LOOP
        -- Each channel's oldest ready message is found here, not in the
        -- statement above: on Citus that statement runs on the worker that
        -- holds the queue, where a function that reads its tables cannot.
        channel_name := r.ch;
        ready := r.rdy;
        in_flight := r.f;
        scheduled := r.s;
        uncommitted := r.u;
        waiting := r.w;
        dead := r.d;
        blocked_chains := r.bl;
        oldest_ready_age := COALESCE(pg_catalog.date_part(
            'epoch', ts OPERATOR(pg_catalog.-) mq_oldest_ready(r.ch, ts)), 0);
        removed := r.rm;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- A function's signature with its schema and its argument types'
-- schemas, whatever the search_path: for the GRANT, REVOKE and ALTER
-- FUNCTION statements the queue builds, which a Citus coordinator forwards
-- as text to workers that resolve names under a path of their own.
CREATE OR REPLACE FUNCTION mq_qualified(f oid)
RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    -- Only pg_catalog on the path (until this function returns): every
    -- other name comes out qualified.
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog', true);
    RETURN f::pg_catalog.regprocedure::text;
END;
$$;

-- Runs a GRANT, REVOKE or ALTER FUNCTION the queue builds (its names
-- qualified: mq_qualified) with only pg_catalog on the search_path: a
-- Citus coordinator deparses such a statement for its workers, naming what
-- the path leaves visible without its schema, and the workers resolve
-- those names under a path of their own. Not for PUBLIC (mq_secure).
CREATE OR REPLACE FUNCTION mq_run_ddl(command text)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog', true);
    EXECUTE command;
END;
$$;

-- Lets grantee do duty ('produce', 'consume' or 'administer') on this
-- queue: USAGE on the schema and EXECUTE on the duty's functions, nothing
-- on the tables. Refuses a role that can create objects in the queue's
-- schema (see the top of this file). Returns how many functions it granted.
CREATE OR REPLACE FUNCTION mq_grant(duty text, grantee regrole)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    q  text := mq_queue_schema();
    fn text;
    n  int := 0;
BEGIN
    IF grantee IS NULL OR NOT EXISTS (
            SELECT 1 FROM mq_duties() d WHERE d.duty OPERATOR(pg_catalog.=) mq_grant.duty) THEN
        RAISE EXCEPTION 'mq_grant: duty % is not one of produce, consume, administer (or role is NULL)',
            pg_catalog.quote_nullable(duty)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.has_schema_privilege(grantee, q, 'CREATE') THEN
        RAISE EXCEPTION 'mq_grant: role % can create objects in schema %', grantee, q
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'An object it creates there would run with the queue owner''s rights.',
                  HINT = pg_catalog.format('REVOKE CREATE ON SCHEMA %I FROM PUBLIC (and from %s).',
                                           q, grantee);
    END IF;
    PERFORM mq_run_ddl(pg_catalog.format('GRANT USAGE ON SCHEMA %I TO %s', q, grantee));
    FOR fn IN
        SELECT mq_qualified(p.oid)
        FROM pg_catalog.pg_proc p
        JOIN mq_duties() d ON d.function_name OPERATOR(pg_catalog.=) p.proname::text
        WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.quote_ident(q)::regnamespace
          AND d.duty OPERATOR(pg_catalog.=) mq_grant.duty
    LOOP
        PERFORM mq_run_ddl(pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', fn, grantee));
        n := n OPERATOR(pg_catalog.+) 1;
    END LOOP;
    RETURN n;
END;
$$;

-- Takes duty away from grantee (its USAGE on the schema stays: other
-- duties may need it). Returns how many functions it revoked.
CREATE OR REPLACE FUNCTION mq_revoke(duty text, grantee regrole)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    fn text;
    n  int := 0;
BEGIN
    FOR fn IN
        SELECT mq_qualified(p.oid)
        FROM pg_catalog.pg_proc p
        JOIN mq_duties() d ON d.function_name OPERATOR(pg_catalog.=) p.proname::text
        WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.quote_ident(mq_queue_schema())::regnamespace
          AND d.duty OPERATOR(pg_catalog.=) mq_revoke.duty
    LOOP
        PERFORM mq_run_ddl(pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM %s', fn,
                                             grantee));
        n := n OPERATOR(pg_catalog.+) 1;
    END LOOP;
    RETURN n;
END;
$$;

-- Every function of the queue (every function of its schema named mq_*):
-- a pinned path (pg_catalog, the queue's schema, pg_temp), no EXECUTE for
-- PUBLIC,
-- and the duty functions run as the owner. CREATE OR REPLACE FUNCTION
-- resets the first and the last (not the grants), so a migration that
-- replaces or adds functions ends with SELECT mq_secure().
CREATE OR REPLACE FUNCTION mq_secure()
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    q text := mq_queue_schema();
    f record;
BEGIN
    FOR f IN
        SELECT mq_qualified(p.oid) AS sig,
               EXISTS (SELECT 1 FROM mq_duties() d
                       WHERE d.function_name OPERATOR(pg_catalog.=) p.proname::text) AS definer
        FROM pg_catalog.pg_proc p
        WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.quote_ident(q)::regnamespace
          AND p.proname::text OPERATOR(pg_catalog.~~) 'mq\_%'
          AND p.prokind OPERATOR(pg_catalog.=) 'f'
    LOOP
        PERFORM mq_run_ddl(pg_catalog.format(
            'ALTER FUNCTION %s %s SET search_path = pg_catalog, %I, pg_temp',
            f.sig, CASE WHEN f.definer THEN 'SECURITY DEFINER' ELSE 'SECURITY INVOKER' END, q));
        PERFORM mq_run_ddl(pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f.sig));
    END LOOP;
END;
$$;

SELECT mq_secure();
SELECT mq_regrant();

INSERT INTO mq_schema_migrations (version, name)
VALUES (17, '0017_citus')
ON CONFLICT (version) DO NOTHING;
