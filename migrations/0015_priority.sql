-- pqmq schema, version 15: priorities.
--
-- A message may carry a priority (0..32767, default 0, the lowest): among
-- the ready messages of a channel, higher priorities are delivered first,
-- then the order of before; fairness between channels is unchanged and a
-- chain is never reordered. Messages of priority 0 keep the channel index
-- they had (now mq_msgs_ready_plain, with priority <= 0 in its predicate);
-- the others have one of their own, keyed by priority within the channel
-- (mq_msgs_ready_urgent), which a poll probes first. A queue that never
-- sets a priority pays one probe of an empty index per poll, and no more
-- index entries per message. Producers set priorities through
-- mq_insert(new_messages, priorities) or mq_insert_unique's priorities;
-- mq_new_t keeps its eleven attributes.
--
-- Rebuilds the channel index: on a large queue this blocks inserts and
-- polls while it runs (see the README, The SQL contract).

ALTER TABLE mq_msgs ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 0;

-- Polls walk these indexes channel by channel (loose index scan on
-- channel_key) and take each channel's oldest ready rows: the messages of
-- priority 0 (most, and all when no producer sets one; below 0 only by
-- hand) in mq_msgs_ready_plain, the others, highest first, in
-- mq_msgs_ready_urgent. Each candidate has an entry in one of them. No index keys on attempt_at,
-- attempts, deliveries or retry_backoff: those are what a claim writes.
CREATE INDEX IF NOT EXISTS mq_msgs_ready_plain
    ON mq_msgs (channel_key, ready_at)
    WHERE dead_since IS NULL
      AND (after_message_id IS NULL
           OR after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
      AND priority <= 0;

CREATE INDEX IF NOT EXISTS mq_msgs_ready_urgent
    ON mq_msgs (channel_key, (- priority), ready_at)
    WHERE dead_since IS NULL
      AND (after_message_id IS NULL
           OR after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
      AND priority > 0;

DROP INDEX IF EXISTS mq_msgs_ready_by_channel;

-- Signatures that change: the pick gains the urgent pass's arguments, the
-- inserts their priorities.
DROP FUNCTION IF EXISTS mq_pick_keys(text, bigint, bigint, int, int, int, timestamptz, int,
                                     timestamptz, uuid[], tid[], timestamptz);
DROP FUNCTION IF EXISTS mq_insert_rows(mq_new_t[], text[], interval, boolean[]);
DROP FUNCTION IF EXISTS mq_insert_unique(mq_new_t[], text[], text, interval);

-- Inserts a batch in one statement: all of it, or (on any error) none of it.
CREATE OR REPLACE FUNCTION mq_insert(new_messages mq_new_t[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM mq_insert_rows(new_messages, NULL, NULL, NULL, NULL);
END;
$$;

-- mq_insert where message i has priority priorities[i] (NULL, or a NULL
-- element: 0): among the ready messages of a channel, higher priorities
-- are delivered first. 0 to 32767; 0, the default, is the lowest. A chain
-- is never reordered: its messages become ready one at a time.
CREATE OR REPLACE FUNCTION mq_insert(new_messages mq_new_t[], priorities int[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM mq_insert_rows(new_messages, NULL, NULL, NULL, priorities);
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

    IF NOT has_ordered THEN
        -- No chains to extend: a plain insert.
        INSERT INTO mq_msgs (id, created_at, attempt_at, attempts, retry_backoff,
                             channel_name, channel_args, commit_interval, ready_at,
                             name, payload_json, payload_bytes, unique_key, key_retention,
                             priority)
        SELECT t.id, ts,
               ts + COALESCE(t.delay, interval '0')
                  + COALESCE(t.commit_interval, interval '0'),
               LEAST(COALESCE(t.retries, 4)::bigint + 1, 2147483647)::int,
               COALESCE(t.retry_backoff, interval '1 second'),
               t.channel_name, COALESCE(t.channel_args, ''), t.commit_interval,
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
                    UPDATE mq_msgs m SET
                        name = COALESCE(src.name, ''),
                        payload_json = src.payload_json::jsonb,
                        payload_bytes = src.payload_bytes,
                        attempt_at = CASE WHEN mode = 'replace'
                            THEN ts + COALESCE(mq_fixed_length(src.delay), interval '0')
                                    + COALESCE(m.commit_interval, interval '0')
                            ELSE m.attempt_at END,
                        ready_at = CASE WHEN mode = 'replace'
                            THEN ts + COALESCE(mq_fixed_length(src.delay), interval '0')
                                    + COALESCE(m.commit_interval, interval '0')
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
            UPDATE mq_keys k SET message_id = ids[g.first], expires_at = NULL
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
                                    per_key, batch_size, budget, ts, lane, mark, ids, tids,
                                    keys, low, full_keys) p;
            END IF;
            IF cardinality(ids) < batch_size THEN
                SELECT p.ids, p.tids, p.keys, p.low INTO ids, tids, keys, low
                FROM mq_pick_keys(NULL, -9223372036854775808, 9223372036854775807,
                                  per_key, batch_size, budget, ts, lane, mark, ids, tids,
                                  keys, low) p;
            END IF;
            IF cardinality(ids) < batch_size AND cardinality(full_keys) > 0 THEN
                SELECT p.ids, p.tids, p.keys, p.low, p.full_keys
                INTO ids, tids, keys, low, full_keys
                FROM mq_pick_urgent(NULL, -9223372036854775808, 9223372036854775807,
                                    batch_size, batch_size, budget, ts, lane, mark, ids,
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
                    IF urgent THEN
                        SELECT p.ids, p.tids, p.keys, p.low, p.full_keys
                        INTO ids, tids, keys, low, full_keys
                        FROM mq_pick_urgent(nm, lo, hi,
                                            CASE WHEN round = 1 THEN per_key ELSE batch_size END,
                                            batch_size, budget, ts, lane, mark, ids, tids,
                                            keys, low, full_keys) p;
                    END IF;
                    CONTINUE WHEN cardinality(ids) >= batch_size;
                    SELECT p.ids, p.tids, p.keys, p.low INTO ids, tids, keys, low
                    FROM mq_pick_keys(nm, lo, hi,
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
        -- the scan's budget left unvisited, for a later poll from another
        -- random point. (A channel with urgent messages left gave all it
        -- was allowed to, so the batch is full: the time index, which would
        -- take its older messages of priority 0 first, is not read.)
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
        -- Each channel index (plain and urgent) for its range of chain keys.
        SELECT min(LEAST(
            (SELECT m.ready_at FROM mq_msgs m
             WHERE m.dead_since IS NULL
               AND (m.after_message_id IS NULL
                    OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
               AND m.priority <= 0 -- mq_msgs_ready_plain
               AND m.channel_key BETWEEN hashtext(c.n)::bigint << 32
                                     AND (hashtext(c.n)::bigint << 32) | 4294967295
               AND m.ready_at > ts AND m.ready_at < 'infinity'::timestamptz
               AND m.channel_name = c.n
             ORDER BY m.ready_at LIMIT 1),
            (SELECT min(m.attempt_at) FROM mq_msgs m
             WHERE m.dead_since IS NULL
               AND (m.after_message_id IS NULL
                    OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
               AND m.priority <= 0
               AND m.channel_key BETWEEN hashtext(c.n)::bigint << 32
                                     AND (hashtext(c.n)::bigint << 32) | 4294967295
               AND m.ready_at >= mark AND m.ready_at <= ts
               AND m.attempts > 0
               AND m.channel_name = c.n),
            (SELECT m.ready_at FROM mq_msgs m
             WHERE m.dead_since IS NULL
               AND (m.after_message_id IS NULL
                    OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
               AND m.priority > 0 -- mq_msgs_ready_urgent
               AND m.channel_key BETWEEN hashtext(c.n)::bigint << 32
                                     AND (hashtext(c.n)::bigint << 32) | 4294967295
               AND m.ready_at > ts AND m.ready_at < 'infinity'::timestamptz
               AND m.channel_name = c.n
             ORDER BY m.ready_at LIMIT 1),
            (SELECT min(m.attempt_at) FROM mq_msgs m
             WHERE m.dead_since IS NULL
               AND (m.after_message_id IS NULL
                    OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
               AND m.priority > 0
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

-- One visit of the channels whose chain key lies in [lo, hi], starting at a
-- random key and wrapping around once: takes up to per_key ready messages
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
                                        per_key int, want int, budget int,
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
    start bigint := LEAST(hi::numeric, lo::numeric
                          + floor(random() * (hi::numeric - lo::numeric + 1)))::bigint;
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
                                          per_key int, want int, budget int,
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
    start bigint := LEAST(hi::numeric, lo::numeric
                          + floor(random() * (hi::numeric - lo::numeric + 1)))::bigint;
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
-- ready): a loose index scan over the channel's chain keys, one probe each,
-- in mq_msgs_ready_plain; the channel's urgent messages are read whole.
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
                  AND m.priority <= 0
                  AND m.channel_key >= (pg_catalog.hashtext(channel)::bigint << 32)
                  AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32)
                                        | 4294967295)
                ORDER BY m.channel_key LIMIT 1)
        UNION ALL
        SELECT (SELECT m.channel_key FROM mq_msgs m
                WHERE m.dead_since IS NULL
                  AND (m.after_message_id IS NULL
                       OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                  AND m.priority <= 0
                  AND m.channel_key > keys.k
                  AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32)
                                        | 4294967295)
                ORDER BY m.channel_key LIMIT 1)
        FROM keys WHERE keys.k IS NOT NULL
    )
    SELECT LEAST(
        (SELECT pg_catalog.min(f.at)
         FROM keys,
         LATERAL (
             SELECT m.attempt_at AS at FROM mq_msgs m
             WHERE m.channel_key = keys.k
               AND m.dead_since IS NULL
               AND (m.after_message_id IS NULL
                    OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
               AND m.priority <= 0
               AND m.ready_at <= ts
               AND m.attempt_at <= ts
               AND m.attempts > 0
               AND m.channel_name = channel
             ORDER BY m.ready_at
             LIMIT 1
         ) f
         WHERE keys.k IS NOT NULL AND f.at <= ts),
        -- The urgent messages: few, read whole.
        (SELECT pg_catalog.min(m.attempt_at) FROM mq_msgs m
         WHERE m.dead_since IS NULL
           AND (m.after_message_id IS NULL
                OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
           AND m.priority > 0
           AND m.channel_key >= (pg_catalog.hashtext(channel)::bigint << 32)
           AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32) | 4294967295)
           AND m.ready_at <= ts
           AND m.attempt_at <= ts
           AND m.attempts > 0
           AND m.channel_name = channel))
$$;

-- The next max_rows messages of a channel (and of one chain when
-- channel_args is not NULL) in the order polls would deliver them, without
-- claiming or locking anything (args NULL: all chains): first the chain heads and unordered
-- messages, highest priority first and then by the time they become ready, then the ordered messages behind
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
        -- Candidates: the channel indexes (plain and urgent), one key range.
        (SELECT m.id, m.channel_args, m.attempt_at, m.deliveries, m.attempts,
                m.commit_interval, m.after_message_id, m.priority
         FROM mq_msgs m
         WHERE m.dead_since IS NULL
           AND m.attempts > 0
           AND (m.after_message_id IS NULL
                OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
           AND m.priority <= 0
           AND m.channel_key >= (pg_catalog.hashtext(channel)::bigint << 32)
           AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32)
                                 | 4294967295)
           AND m.channel_name = channel
           AND (args IS NULL OR m.channel_args = args)
         ORDER BY m.attempt_at, m.id
         LIMIT max_rows)
        UNION ALL
        (SELECT m.id, m.channel_args, m.attempt_at, m.deliveries, m.attempts,
                m.commit_interval, m.after_message_id, m.priority
         FROM mq_msgs m
         WHERE m.dead_since IS NULL
           AND m.attempts > 0
           AND (m.after_message_id IS NULL
                OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
           AND m.priority > 0
           AND m.channel_key >= (pg_catalog.hashtext(channel)::bigint << 32)
           AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32)
                                 | 4294967295)
           AND m.channel_name = channel
           AND (args IS NULL OR m.channel_args = args)
         ORDER BY m.priority DESC, m.attempt_at, m.id
         LIMIT max_rows)
    ),
    -- Followers, through the successor index, at most max_rows deep.
    chain(id, channel_args, attempt_at, deliveries, attempts, commit_interval,
          after_message_id, head_k0, head_at, head_id, depth) AS (
        SELECT h.id, h.channel_args, h.attempt_at, h.deliveries, h.attempts,
               h.commit_interval, h.after_message_id, -h.priority, h.attempt_at, h.id, 0
        FROM heads h
        WHERE h.after_message_id IS NOT NULL
        UNION ALL
        SELECT s.id, s.channel_args, s.attempt_at, s.deliveries, s.attempts,
               s.commit_interval, s.after_message_id, c.head_k0, c.head_at, c.head_id,
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
               false AS behind, -h.priority AS k0, h.attempt_at AS k1, h.id AS k2,
               0 AS k3
        FROM heads h
        UNION ALL
        SELECT c.id, c.channel_args, c.attempt_at, c.deliveries, c.attempts,
               c.commit_interval, true, true, c.head_k0, c.head_at, c.head_id, c.depth
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
    ORDER BY p.behind, p.k0, p.k1, p.k2, p.k3
    LIMIT max_rows;
END;
$$;

SELECT mq_secure();
SELECT mq_regrant();

INSERT INTO mq_schema_migrations (version, name)
VALUES (15, '0015_priority')
ON CONFLICT (version) DO NOTHING;
