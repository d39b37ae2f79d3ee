-- pqmq schema, version 20: chains kept by place (chain_seq), not by links.
--
-- A chain was a linked list: each member named its predecessor
-- (after_message_id), the head had the nil UUID, and the ready indexes held
-- only heads. Completing a head relinked its successor: an update of an
-- indexed column (ready index entries, the successor index), so every
-- processed chain member cost a non-HOT update with an entry in every
-- index, and an ordered insert found and recorded the chain's tail
-- (mq_chains). Now each ordered message has a place in its chain
-- (chain_seq, from mq_chain_seq, taken under the chain's advisory lock),
-- ordered messages are in an index of their own (mq_msgs_chain: chain key,
-- place), and a chain's head is its first live entry there: completing it
-- deletes one row and writes nothing else. Polls visit the chains as they
-- visit channels (mq_pick_chains) and look at each one's head only.
-- after_message_id is the nil UUID for every ordered message (the seed's
-- mark), NULL for the others; mq_chains is no longer used.

-- UPGRADE STEP: the column, the sequence, and the chains of a live queue
-- converted in place: each chain's members get places in their link order,
-- heads first (in flight, dead or delayed, each keeps its state), so every
-- chain keeps its order and nothing is lost. Writers wait for the table's
-- lock; applying this again finds nothing to convert.
ALTER TABLE mq_msgs ADD COLUMN IF NOT EXISTS chain_seq bigint;
CREATE SEQUENCE IF NOT EXISTS mq_chain_seq INCREMENT BY 16384;

-- UPGRADE STEP: the relinking counter goes before the links do.
DROP TRIGGER IF EXISTS mq_count_relinked ON mq_msgs;
DROP FUNCTION IF EXISTS mq_count_relinked();

-- UPGRADE STEP
DO $$
DECLARE
    base bigint;
    n    bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM mq_msgs m
                   WHERE m.after_message_id IS NOT NULL AND m.chain_seq IS NULL) THEN
        RETURN;
    END IF;
    base := nextval('mq_chain_seq');
    WITH RECURSIVE walk(id, k, depth) AS (
        SELECT m.id, m.channel_key, 0::bigint FROM mq_msgs m
        WHERE m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid
          AND m.chain_seq IS NULL
        UNION ALL
        SELECT s.id, w.k, w.depth + 1 FROM walk w
        JOIN mq_msgs s ON s.after_message_id = w.id
                      AND s.after_message_id <> '00000000-0000-0000-0000-000000000000'::uuid
    ),
    -- Members whose predecessor is gone (none, unless written by hand)
    -- follow their chain's linked members, oldest first.
    placed AS (
        SELECT x.id, row_number() OVER (ORDER BY x.k, x.grp, x.depth, x.created_at, x.id) AS n
        FROM (SELECT w.id, w.k, 0 AS grp, w.depth, NULL::timestamptz AS created_at FROM walk w
              UNION ALL
              SELECT m.id, m.channel_key, 1, 0, m.created_at FROM mq_msgs m
              WHERE m.after_message_id IS NOT NULL AND m.chain_seq IS NULL
                AND m.id NOT IN (SELECT w.id FROM walk w)) x
    ),
    done AS (
        UPDATE mq_msgs m SET chain_seq = base + p.n,
                             after_message_id = '00000000-0000-0000-0000-000000000000'::uuid
        FROM placed p
        WHERE m.id = p.id
        RETURNING p.n
    )
    SELECT max(d.n) INTO n FROM done d;
    PERFORM setval('mq_chain_seq', base + COALESCE(n, 0));
END
$$;

-- UPGRADE STEP: the ready indexes hold unordered messages only (and, in
-- the time index, final attempts of chain heads, for mq_reap_dead); the
-- successor index goes; the chain index comes.
DO $$
BEGIN
    IF pg_catalog.pg_get_indexdef(pg_catalog.to_regclass('mq_msgs_ready_plain'))
           LIKE '%00000000-0000-0000-0000-000000000000%' THEN
        DROP INDEX mq_msgs_ready_plain;
        DROP INDEX mq_msgs_ready_urgent;
        DROP INDEX mq_msgs_ready_by_time;
    END IF;
END
$$;
DROP INDEX IF EXISTS mq_msgs_successor;

CREATE INDEX IF NOT EXISTS mq_msgs_ready_plain
    ON mq_msgs (channel_key, ready_at)
    WHERE dead_since IS NULL
      AND after_message_id IS NULL
      AND priority <= 0;

CREATE INDEX IF NOT EXISTS mq_msgs_ready_urgent
    ON mq_msgs (channel_key, (- priority), ready_at)
    WHERE dead_since IS NULL
      AND after_message_id IS NULL
      AND priority > 0;

CREATE INDEX IF NOT EXISTS mq_msgs_ready_by_time
    ON mq_msgs (ready_at)
    WHERE dead_since IS NULL
      AND (after_message_id IS NULL OR ready_at = 'infinity'::timestamptz)
      AND ready_at > '-infinity'::timestamptz;

CREATE INDEX IF NOT EXISTS mq_msgs_chain
    ON mq_msgs (channel_key, chain_seq)
    WHERE chain_seq IS NOT NULL;

-- UPGRADE STEP: the tails are not kept any more.
DELETE FROM mq_chains;
DROP FUNCTION IF EXISTS mq_record_tails(mq_new_t[]);
DROP FUNCTION IF EXISTS mq_lock_chains(uuid[]);
DROP FUNCTION IF EXISTS mq_unlink(uuid[], uuid[], text[], text[]);

-- UPGRADE STEP: counts' waiting is now every ordered message (mq_metrics
-- subtracts the heads), kept by the insert and delete triggers and, for
-- mq_skip, by mq_count_unchained.
CREATE OR REPLACE FUNCTION mq_count_unchained()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO mq_count_deltas (channel_name, total, waiting, removed)
    VALUES (NEW.channel_name, 0,
            (NEW.chain_seq IS NOT NULL)::int OPERATOR(pg_catalog.-)
            (OLD.chain_seq IS NOT NULL)::int, 0);
    RETURN NULL;
END;
$$;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                   WHERE t.tgrelid = 'mq_msgs'::regclass
                     AND t.tgname = 'mq_count_unchained') THEN
        CREATE TRIGGER mq_count_unchained AFTER UPDATE OF chain_seq ON mq_msgs
            FOR EACH ROW
            WHEN ((OLD.chain_seq IS NULL) IS DISTINCT FROM (NEW.chain_seq IS NULL))
            EXECUTE FUNCTION mq_count_unchained();
        WITH d AS (
            DELETE FROM mq_count_deltas d RETURNING d.*
        )
        INSERT INTO mq_counts AS c (channel_name, total, waiting, removed)
        SELECT d.channel_name, pg_catalog.sum(d.total), pg_catalog.sum(d.waiting),
               pg_catalog.sum(d.removed)
        FROM d
        GROUP BY d.channel_name
        ON CONFLICT (channel_name) DO UPDATE SET
            total = c.total OPERATOR(pg_catalog.+) excluded.total,
            removed = c.removed OPERATOR(pg_catalog.+) excluded.removed;
        UPDATE mq_counts c SET waiting = COALESCE((
            SELECT pg_catalog.count(*) FROM mq_msgs m
            WHERE m.channel_name = c.channel_name AND m.chain_seq IS NOT NULL), 0);
    END IF;
END
$$;

-- The definitions (as in schema/).

-- schema/chains.sql: ordered chains: the producers' locks. A chain is its
-- members in chain_seq order (schema/tables.sql); members leave it by being
-- deleted or skipped, which needs no repair.
-- Today's definitions; the migrations that created them must carry the same
-- text (tests/test_migrate.c compares the two). See schema/tables.sql.

-- Serializes producers per chain: the advisory locks of the chains the batch
-- appends to, in key order against deadlock. A producer takes its places
-- (mq_chain_seq) after these locks, so a later producer of a chain gets
-- later places and its rows become visible after the earlier one's.
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

-- schema/insert.sql: producing: inserting a batch, and the second phase of two-phase messages.
-- Today's definitions; the migrations that created them must carry the same
-- text (tests/test_migrate.c compares the two). See schema/tables.sql.

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
    base    bigint; -- the batch's places in chains (mq_chain_seq)
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
        -- Each ordered message's place in its chain: the chains' locks
        -- first, then the places, so a later producer of a chain gets later
        -- ones; within the batch, array order. Nothing of the chain is read
        -- or written: its head is whatever entry comes first.
        PERFORM mq_lock_new_chains(new_messages);
        base := nextval('mq_chain_seq');
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
    INSERT INTO mq_msgs (id, created_at, attempt_at, attempts, retry_backoff,
                         channel_name, channel_args, commit_interval, after_message_id,
                         ready_at, name, payload_json, payload_bytes, unique_key,
                         key_retention, priority, chain_seq)
    SELECT t.id, ts,
           ts + COALESCE(t.delay, interval '0')
              + COALESCE(t.commit_interval, interval '0'),
           LEAST(COALESCE(t.retries, 4)::bigint + 1, 2147483647)::int,
           COALESCE(t.retry_backoff, interval '1 second'),
           t.channel_name, COALESCE(t.channel_args, ''), t.commit_interval,
           -- The seed's mark of an ordered message (no longer a link).
           CASE WHEN t.ordered THEN '00000000-0000-0000-0000-000000000000'::uuid END,
           ts + COALESCE(t.delay, interval '0')
              + COALESCE(t.commit_interval, interval '0'),
           COALESCE(t.name, ''), t.payload_json::jsonb, t.payload_bytes,
           unique_keys[t.ordinality::int],
           CASE WHEN unique_keys[t.ordinality::int] IS NOT NULL THEN key_retention END,
           COALESCE(priorities[t.ordinality::int], 0),
           CASE WHEN t.ordered THEN base + t.ordinality END
    FROM unnest(new_messages) WITH ORDINALITY AS t;

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

-- schema/poll.sql: polling: claiming ready messages fairly across channels (mq_claim), and the
-- older entry points that return subsets of its row.
-- Today's definitions; the migrations that created them must carry the same
-- text (tests/test_migrate.c compares the two). See schema/tables.sql.

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
-- none of priority 0 while it has urgent ones left. A chain's head
-- (mq_pick_chains) is taken by its own priority: before the channel's
-- urgent messages when none of them outranks it, else after them.
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
    chained boolean;     -- the queue has ordered messages (mq_msgs_chain)
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
                WHERE m.dead_since IS NULL
                  AND m.after_message_id IS NULL
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

-- When the earliest head of the chains whose key lies in [lo, hi] (and of
-- only_name's, when not NULL) comes due: its lease or delay ends (a time
-- past: ready now, but held by another transaction). A loose index scan of
-- mq_msgs_chain, one probe per chain, at most 1000 chains: a queue with
-- more may answer later than its earliest head (a poll still finds it).
CREATE OR REPLACE FUNCTION mq_next_head_at(lo bigint, hi bigint, only_name text)
RETURNS timestamptz
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    WITH RECURSIVE heads(k, at, live, nm, n) AS (
        SELECT f.k, f.at, f.live, f.nm, 1 FROM (
            SELECT m.channel_key AS k, m.attempt_at AS at,
                   m.dead_since IS NULL AND m.attempts > 0 AS live, m.channel_name AS nm
            FROM mq_msgs m
            WHERE m.chain_seq IS NOT NULL -- mq_msgs_chain
              AND m.channel_key >= lo AND m.channel_key <= hi
            ORDER BY m.channel_key, m.chain_seq LIMIT 1) f
        UNION ALL
        SELECT f.k, f.at, f.live, f.nm, heads.n + 1 FROM heads, LATERAL (
            SELECT m.channel_key AS k, m.attempt_at AS at,
                   m.dead_since IS NULL AND m.attempts > 0 AS live, m.channel_name AS nm
            FROM mq_msgs m
            WHERE m.chain_seq IS NOT NULL
              AND m.channel_key > heads.k AND m.channel_key <= hi
            ORDER BY m.channel_key, m.chain_seq LIMIT 1) f
        WHERE heads.n < 1000
    )
    SELECT min(h.at) FROM heads h
    WHERE h.live AND (only_name IS NULL OR h.nm = only_name)
$$;

-- How long until the earliest candidate of these channels (NULL: all)
-- becomes ready: a message that is not ready yet (one probe), a lease
-- that runs out (the messages in flight, which the poll just stepped over)
-- or a chain's head that comes due (mq_next_head_at).
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
        next_at := LEAST(next_at, mq_next_head_at(-9223372036854775808,
                                                  9223372036854775807, NULL));
    ELSE
        -- Each channel index (plain and urgent) for its range of chain keys.
        SELECT min(LEAST(
            (SELECT m.ready_at FROM mq_msgs m
             WHERE m.dead_since IS NULL
               AND m.after_message_id IS NULL
               AND m.priority <= 0 -- mq_msgs_ready_plain
               AND m.channel_key BETWEEN hashtext(c.n)::bigint << 32
                                     AND (hashtext(c.n)::bigint << 32) | 4294967295
               AND m.ready_at > ts AND m.ready_at < 'infinity'::timestamptz
               AND m.channel_name = c.n
             ORDER BY m.ready_at LIMIT 1),
            (SELECT min(m.attempt_at) FROM mq_msgs m
             WHERE m.dead_since IS NULL
               AND m.after_message_id IS NULL
               AND m.priority <= 0
               AND m.channel_key BETWEEN hashtext(c.n)::bigint << 32
                                     AND (hashtext(c.n)::bigint << 32) | 4294967295
               AND m.ready_at >= mark AND m.ready_at <= ts
               AND m.attempts > 0
               AND m.channel_name = c.n),
            (SELECT m.ready_at FROM mq_msgs m
             WHERE m.dead_since IS NULL
               AND m.after_message_id IS NULL
               AND m.priority > 0 -- mq_msgs_ready_urgent
               AND m.channel_key BETWEEN hashtext(c.n)::bigint << 32
                                     AND (hashtext(c.n)::bigint << 32) | 4294967295
               AND m.ready_at > ts AND m.ready_at < 'infinity'::timestamptz
               AND m.channel_name = c.n
             ORDER BY m.ready_at LIMIT 1),
            (SELECT min(m.attempt_at) FROM mq_msgs m
             WHERE m.dead_since IS NULL
               AND m.after_message_id IS NULL
               AND m.priority > 0
               AND m.channel_key BETWEEN hashtext(c.n)::bigint << 32
                                     AND (hashtext(c.n)::bigint << 32) | 4294967295
               AND m.ready_at >= mark AND m.ready_at <= ts
               AND m.attempts > 0
               AND m.channel_name = c.n)))
        INTO next_at
        FROM (SELECT DISTINCT n FROM unnest(channel_names) AS n) c;
        -- (As above: a statement that reads no table.)
        next_at := LEAST(next_at, (
            SELECT min(mq_next_head_at(hashtext(c.n)::bigint << 32,
                                       (hashtext(c.n)::bigint << 32) | 4294967295, c.n))
            FROM (SELECT DISTINCT n FROM unnest(channel_names) AS n) c));
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
                  AND m.after_message_id IS NULL
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
                  AND m.after_message_id IS NULL
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
                  AND m.after_message_id IS NULL
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
                  AND m.after_message_id IS NULL
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
              AND m.after_message_id IS NULL
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
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET enable_bitmapscan = off
AS $$
DECLARE
    got     uuid[];
    got_tid tid[];
    got_key bigint[];
    -- This transaction's id, for the test of xmax (lanes 1 and 2).
    me      bigint := CASE WHEN lane <> 0 THEN mq_xact_id() END;
    me_lo   bigint := me & 4294967295;
BEGIN
    IF cardinality(ids) >= want THEN
        RETURN;
    END IF;
    SELECT array_agg(j.id), array_agg(j.ctid), array_agg(j.k)
    INTO got, got_tid, got_key FROM (
        WITH RECURSIVE up(k, at, n) AS (
            SELECT f.k, f.at, 1 FROM (
                SELECT m.channel_key AS k, m.ctid AS at FROM mq_msgs m
                WHERE m.chain_seq IS NOT NULL -- mq_msgs_chain
                  AND m.channel_key >= start AND m.channel_key <= hi
                ORDER BY m.channel_key, m.chain_seq LIMIT 1) f
            UNION ALL
            SELECT f.k, f.at, up.n + 1 FROM up, LATERAL (
                SELECT m.channel_key AS k, m.ctid AS at FROM mq_msgs m
                WHERE m.chain_seq IS NOT NULL
                  AND m.channel_key > up.k AND m.channel_key <= hi
                ORDER BY m.channel_key, m.chain_seq LIMIT 1) f
            WHERE up.n < budget
        ),
        around(k, at, n) AS (
            SELECT f.k, f.at, 1 FROM (
                SELECT m.channel_key AS k, m.ctid AS at FROM mq_msgs m
                WHERE m.chain_seq IS NOT NULL
                  AND m.channel_key >= lo AND m.channel_key < start
                ORDER BY m.channel_key, m.chain_seq LIMIT 1) f
            UNION ALL
            SELECT f.k, f.at, around.n + 1 FROM around, LATERAL (
                SELECT m.channel_key AS k, m.ctid AS at FROM mq_msgs m
                WHERE m.chain_seq IS NOT NULL
                  AND m.channel_key > around.k AND m.channel_key < start
                ORDER BY m.channel_key, m.chain_seq LIMIT 1) f
            WHERE around.n < budget
        )
        SELECT r.id, r.ctid, ks.k
        FROM (SELECT up.k, up.at FROM up
              UNION ALL
              SELECT around.k, around.at FROM around) ks,
        LATERAL (
            -- The head's row version as this statement sees it, by TID.
            SELECT m.id, m.ctid FROM mq_msgs m
            WHERE m.ctid = ks.at
              AND m.dead_since IS NULL
              AND m.attempt_at <= ts
              AND m.attempts > 0
              AND (only_name IS NULL OR m.channel_name = only_name)
              AND m.id <> ALL (ids)
              AND per_key > (SELECT count(*) FROM unnest(keys) AS x WHERE x = ks.k)
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
              AND (NOT urgent OR NOT EXISTS (
                    SELECT 1 FROM mq_msgs u
                    WHERE u.channel_key = ks.k
                      AND u.dead_since IS NULL
                      AND u.after_message_id IS NULL
                      AND u.priority > 0 -- mq_msgs_ready_urgent
                      AND u.priority > m.priority
                      AND u.ready_at >= mark AND u.ready_at <= ts
                      AND u.attempt_at <= ts AND u.attempts > 0
                      AND u.id <> ALL (ids)))
            FOR NO KEY UPDATE SKIP LOCKED
        ) r
        LIMIT want - cardinality(ids)
    ) j;
    ids := ids || COALESCE(got, '{}');
    tids := tids || COALESCE(got_tid, '{}');
    keys := keys || COALESCE(got_key, '{}');
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
                  AND m.after_message_id IS NULL
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
                  AND m.after_message_id IS NULL
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
                  AND m.after_message_id IS NULL
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
                  AND m.after_message_id IS NULL
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
              AND m.after_message_id IS NULL
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

-- The seed's poll, on mq_claim directly.
CREATE OR REPLACE FUNCTION mq_poll(channel_names text[], batch_size int DEFAULT 1)
RETURNS TABLE(id uuid, is_committed boolean, name text, payload_json text,
              payload_bytes bytea, retry_backoff interval, wait_time interval)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT j.id, j.is_committed, j.name, j.payload_json, j.payload_bytes,
           j.retry_backoff, j.wait_time
    FROM mq_claim(channel_names, batch_size) j
$$;

-- Version 1's poll with its columns (the C library used it before mq_claim).
CREATE OR REPLACE FUNCTION mq_poll_jobs(channel_names text[], batch_size int)
RETURNS TABLE(id uuid, is_committed boolean, name text, payload_json text,
              payload_bytes bytea, retry_backoff interval, wait_time interval,
              channel_name text, channel_args text, attempt int,
              attempts_left int)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT j.id, j.is_committed, j.name, j.payload_json, j.payload_bytes,
           j.retry_backoff, j.wait_time, j.channel_name, j.channel_args,
           j.attempt, j.attempts_left
    FROM mq_claim(channel_names, batch_size) j
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

CREATE OR REPLACE TRIGGER mq_msgs_keep_place
    BEFORE INSERT OR UPDATE OF attempt_at ON mq_msgs
    FOR EACH ROW
    WHEN (NEW.attempt_at < NEW.ready_at AND NEW.ready_at <> 'infinity'::timestamptz)
    EXECUTE FUNCTION mq_keep_place();

-- schema/complete.sql: completing: deleting finished messages (fenced by attempt), completing and
-- claiming in one statement, and handing claimed messages back unstarted.
-- Today's definitions; the migrations that created them must carry the same
-- text (tests/test_migrate.c compares the two). See schema/tables.sql.

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
    chans   text[];
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
    -- Rows are found by id = ANY (an index condition whatever the
    -- statistics say; a join with the array could become a scan of the
    -- whole primary key after ANALYZE saw an empty table). A chain member
    -- needs nothing more: the next entry of its chain is the new head, and
    -- a poll that still sees this row (its snapshot is older, or this
    -- transaction has not committed) finds it in flight or locked and
    -- takes nothing of the chain.
    WITH gone AS (
        DELETE FROM mq_msgs m
        WHERE m.id = ANY (msg_ids)
          AND (msg_attempts IS NULL OR m.deliveries = att[width_bucket(m.id, by_id)])
        RETURNING m.chain_seq IS NOT NULL AS ordered, m.channel_name
    )
    SELECT count(*), array_agg(DISTINCT g.channel_name) FILTER (WHERE g.ordered)
    INTO n, chans
    FROM gone g;
    -- A chain moved on: its next member may be ready now.
    IF chans IS NOT NULL THEN
        PERFORM mq_wake(chans);
    END IF;
    RETURN n;
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

-- Deletes messages: completion, or cancellation of pending ones. Deleting any
-- member of a chain leaves the others in their order (chain_seq).
CREATE OR REPLACE FUNCTION mq_delete(msg_ids uuid[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM mq_complete(msg_ids);
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

-- Version 3's completing poll with its columns.
CREATE OR REPLACE FUNCTION mq_complete_poll(msg_ids uuid[], msg_attempts int[],
                                            channel_names text[], batch_size int)
RETURNS TABLE(id uuid, is_committed boolean, name text, payload_json text,
              payload_bytes bytea, retry_backoff interval, wait_time interval,
              channel_name text, channel_args text, attempt int,
              attempts_left int, completed int)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT (c.job).id, (c.job).is_committed, (c.job).name, (c.job).payload_json,
           (c.job).payload_bytes, (c.job).retry_backoff, (c.job).wait_time,
           (c.job).channel_name, (c.job).channel_args, (c.job).attempt,
           (c.job).attempts_left, c.completed
    FROM mq_complete_claim(msg_ids, msg_attempts, channel_names, batch_size) c
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

-- schema/dead.sql: dead letters: messages that ran out of attempts; listing, retrying, skipping.
-- Today's definitions; the migrations that created them must carry the same
-- text (tests/test_migrate.c compares the two). See schema/tables.sql.

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
    -- Final attempts in flight wait at ready_at 'infinity' (mq_claim),
    -- chain heads' too: one range of mq_msgs_ready_by_time.
    UPDATE mq_msgs m SET dead_since = m.attempt_at
    WHERE m.id = ANY (ARRAY(
        SELECT l.id FROM mq_msgs l
        WHERE l.dead_since IS NULL
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
           m.last_error, m.dead_since, m.chain_seq IS NOT NULL,
           m.payload_json::text, m.payload_bytes
    FROM mq_msgs m
    WHERE m.dead_since IS NOT NULL
      AND (channel_names IS NULL OR m.channel_name = ANY (channel_names))
    ORDER BY m.dead_since, m.id
    LIMIT max_rows;
END;
$$;

-- Dead letters (mq_dead_letters) as jobs, for readers of mq_job_t: attempt
-- is the number of deliveries made; no lease, no wait.
CREATE OR REPLACE FUNCTION mq_dead_jobs(channel_names text[], max_rows int)
RETURNS SETOF mq_job_t
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT d.id, true, d.name, d.payload_json, d.payload_bytes, NULL::interval,
           NULL::interval, d.channel_name, d.channel_args, d.attempts, 0,
           d.last_error, d.blocking
    FROM mq_dead_letters(channel_names, max_rows) d
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

-- Moves ordered messages out of their chains into the dead letters (kept,
-- never delivered again) and releases the next message of each chain.
-- This is how a chain blocked by a dead head moves on.
CREATE OR REPLACE FUNCTION mq_skip(msg_ids uuid[])
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
BEGIN
    IF msg_ids IS NULL OR cardinality(msg_ids) = 0 THEN
        RETURN 0;
    END IF;
    -- Out of the chain index (chain_seq NULL): the next entry is the
    -- chain's head. A member held by a consumer is waited for, as a
    -- completion would be.
    WITH moved AS (
        UPDATE mq_msgs m SET after_message_id = NULL, chain_seq = NULL, attempts = 0,
                             attempt_at = LEAST(m.attempt_at, ts),
                             dead_since = COALESCE(m.dead_since, ts)
        WHERE m.id = ANY (msg_ids) AND m.chain_seq IS NOT NULL
        RETURNING m.channel_name
    )
    SELECT count(*), array_agg(DISTINCT mv.channel_name) INTO n, chans FROM moved mv;
    IF n = 0 THEN
        RETURN 0;
    END IF;
    PERFORM mq_wake(chans);
    PERFORM pg_notify('mq_dead', '');
    RETURN n;
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

-- schema/stats.sql: statistics for monitoring.
-- Today's definitions; the migrations that created them must carry the same
-- text (tests/test_migrate.c compares the two). See schema/tables.sql.

-- Per channel: messages in all, ready now, waiting (delayed, leased,
-- retrying, uncommitted or behind their chain), dead, and chains blocked by
-- a dead head. Reads the whole table: for monitoring, not for hot paths.
CREATE OR REPLACE FUNCTION mq_stats(channel_names text[] DEFAULT NULL)
RETURNS TABLE(channel_name text, total bigint, ready bigint, waiting bigint,
              dead bigint, blocked_chains bigint)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    WITH c AS (
        SELECT m.channel_name, m.attempts, m.attempt_at,
               -- A chain's head: its first member (whole table read anyway).
               m.chain_seq = pg_catalog.min(m.chain_seq) OVER (PARTITION BY m.channel_key)
                 AS is_head,
               m.chain_seq IS NULL AS unordered
        FROM mq_msgs m
        WHERE channel_names IS NULL OR m.channel_name = ANY (channel_names)
    ),
    m AS (
        SELECT c.channel_name,
               c.attempts = 0 AND c.attempt_at <= clock_timestamp() AS is_dead,
               c.attempts > 0 AND c.attempt_at <= clock_timestamp()
                 AND (c.unordered OR c.is_head) AS is_ready,
               COALESCE(c.is_head, false) AS is_head
        FROM c
    )
    SELECT m.channel_name, count(*), count(*) FILTER (WHERE m.is_ready),
           count(*) FILTER (WHERE NOT m.is_ready AND NOT m.is_dead),
           count(*) FILTER (WHERE m.is_dead),
           count(*) FILTER (WHERE m.is_dead AND m.is_head)
    FROM m
    GROUP BY m.channel_name
    ORDER BY m.channel_name
$$;

-- Moves the deltas into mq_counts. One folder at a time (the others return
-- at once), and only in READ COMMITTED: a snapshot transaction could fail
-- on a delta another folder deleted since its snapshot.
CREATE OR REPLACE FUNCTION mq_count_fold()
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed'
       OR NOT pg_catalog.pg_try_advisory_xact_lock(1886482797, 4) THEN
        RETURN;
    END IF;
    WITH d AS (
        DELETE FROM mq_count_deltas d RETURNING d.*
    )
    INSERT INTO mq_counts AS c (channel_name, total, waiting, removed)
    SELECT d.channel_name, pg_catalog.sum(d.total), pg_catalog.sum(d.waiting),
           pg_catalog.sum(d.removed)
    FROM d
    GROUP BY d.channel_name
    ORDER BY d.channel_name
    ON CONFLICT (channel_name) DO UPDATE SET
        total = c.total OPERATOR(pg_catalog.+) excluded.total,
        waiting = c.waiting OPERATOR(pg_catalog.+) excluded.waiting,
        removed = c.removed OPERATOR(pg_catalog.+) excluded.removed;
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
                     pg_catalog.count(*) FILTER (WHERE n.chain_seq IS NOT NULL) AS waiting
              FROM mq_new_rows n
              GROUP BY n.channel_name) d;
        INSERT INTO mq_count_deltas (channel_name, total, waiting, removed)
        SELECT u.n, u.t, u.w, 0 FROM unnest(names, totals, waits) AS u(n, t, w);
    ELSE
        INSERT INTO mq_count_deltas (channel_name, total, waiting, removed)
        SELECT n.channel_name, pg_catalog.count(*),
               pg_catalog.count(*) FILTER (WHERE n.chain_seq IS NOT NULL),
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
                     pg_catalog.count(*) FILTER (WHERE o.chain_seq IS NOT NULL) AS waiting
              FROM mq_old_rows o
              GROUP BY o.channel_name) d;
        INSERT INTO mq_count_deltas (channel_name, total, waiting, removed)
        SELECT u.n, -u.t, -u.w, u.t
        FROM unnest(names, totals, waits) AS u(n, t, w);
    ELSE
        INSERT INTO mq_count_deltas (channel_name, total, waiting, removed)
        SELECT o.channel_name, -pg_catalog.count(*),
               -pg_catalog.count(*) FILTER (WHERE o.chain_seq IS NOT NULL),
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

-- A chain member skipped (mq_skip) leaves its chain. Row level, because
-- transition tables cannot go with a column list: this fires only for the
-- statements that take members out of chains, never for polls.
CREATE OR REPLACE FUNCTION mq_count_unchained()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO mq_count_deltas (channel_name, total, waiting, removed)
    VALUES (NEW.channel_name, 0,
            (NEW.chain_seq IS NOT NULL)::int OPERATOR(pg_catalog.-)
            (OLD.chain_seq IS NOT NULL)::int, 0);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION mq_count_truncated()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM mq_count_deltas;
    UPDATE mq_counts SET total = 0, waiting = 0;
    RETURN NULL;
END;
$$;

-- Created once, with the counts of what is already queued: CREATE TRIGGER
-- locks out writers until this migration commits, so none is missed.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                   WHERE t.tgrelid = 'mq_msgs'::regclass
                     AND t.tgname = 'mq_count_inserted') THEN
        CREATE TRIGGER mq_count_inserted AFTER INSERT ON mq_msgs
            REFERENCING NEW TABLE AS mq_new_rows
            FOR EACH STATEMENT EXECUTE FUNCTION mq_count_inserted();
        CREATE TRIGGER mq_count_deleted AFTER DELETE ON mq_msgs
            REFERENCING OLD TABLE AS mq_old_rows
            FOR EACH STATEMENT EXECUTE FUNCTION mq_count_deleted();
        CREATE TRIGGER mq_count_unchained AFTER UPDATE OF chain_seq ON mq_msgs
            FOR EACH ROW
            WHEN ((OLD.chain_seq IS NULL) IS DISTINCT FROM (NEW.chain_seq IS NULL))
            EXECUTE FUNCTION mq_count_unchained();
        CREATE TRIGGER mq_count_truncated AFTER TRUNCATE ON mq_msgs
            FOR EACH STATEMENT EXECUTE FUNCTION mq_count_truncated();
        DELETE FROM mq_count_deltas;
        DELETE FROM mq_counts;
        INSERT INTO mq_counts (channel_name, total, waiting)
        SELECT m.channel_name, pg_catalog.count(*),
               pg_catalog.count(*) FILTER (WHERE m.chain_seq IS NOT NULL)
        FROM mq_msgs m
        GROUP BY m.channel_name;
    END IF;
END
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
-- channel's urgent messages) and one of mq_msgs_chain per chain.
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
    WITH RECURSIVE counts AS (
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
    -- The chains' heads (of the named channels' key ranges, or of all): a
    -- loose index scan of mq_msgs_chain, one probe per chain.
    rng(lo, hi, nm) AS (
        SELECT '-9223372036854775808'::bigint, 9223372036854775807::bigint, NULL::text
        WHERE channel_names IS NULL
        UNION ALL
        SELECT pg_catalog.hashtext(c.n)::bigint << 32,
               (pg_catalog.hashtext(c.n)::bigint << 32) | 4294967295, c.n
        FROM (SELECT DISTINCT n FROM pg_catalog.unnest(channel_names) AS n) c
        WHERE channel_names IS NOT NULL
    ),
    hd(lo, hi, nm, k, at, dl, dead, ci, ra, cn) AS (
        SELECT rg.lo, rg.hi, rg.nm, f.* FROM rng rg, LATERAL (
            SELECT m.channel_key, m.attempt_at, m.deliveries,
                   m.dead_since IS NOT NULL, m.commit_interval IS NOT NULL, m.ready_at,
                   m.channel_name
            FROM mq_msgs m
            WHERE m.chain_seq IS NOT NULL -- mq_msgs_chain
              AND m.channel_key >= rg.lo AND m.channel_key <= rg.hi
            ORDER BY m.channel_key, m.chain_seq LIMIT 1) f
        UNION ALL
        SELECT hd.lo, hd.hi, hd.nm, f.* FROM hd, LATERAL (
            SELECT m.channel_key, m.attempt_at, m.deliveries,
                   m.dead_since IS NOT NULL, m.commit_interval IS NOT NULL, m.ready_at,
                   m.channel_name
            FROM mq_msgs m
            WHERE m.chain_seq IS NOT NULL
              AND m.channel_key > hd.k AND m.channel_key <= hd.hi
            ORDER BY m.channel_key, m.chain_seq LIMIT 1) f
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
          AND m.after_message_id IS NULL
          AND m.ready_at > '-infinity'::timestamptz -- mq_msgs_ready_by_time
          AND m.ready_at > ts AND m.ready_at < 'infinity'::timestamptz
          AND m.attempts > 0
        UNION ALL
        -- (all channels: the whole ready range of the time index)
        SELECT m.channel_name, 'f', false FROM mq_msgs m
        WHERE channel_names IS NULL
          AND m.dead_since IS NULL
          AND m.after_message_id IS NULL
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
              AND m.after_message_id IS NULL
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
              AND m.after_message_id IS NULL
              AND m.priority > 0
              AND m.ready_at <= ts
              AND m.attempt_at > ts
              AND m.attempts > 0
        ) m
        WHERE channel_names IS NOT NULL
        UNION ALL
        SELECT m.channel_name,
               CASE WHEN m.attempt_at > ts THEN 'f' ELSE 'd' END,
               m.attempt_at <= ts AND m.chain_seq IS NOT NULL
        FROM mq_msgs m
        WHERE m.dead_since IS NULL
          AND m.ready_at > '-infinity'::timestamptz
          AND m.ready_at = 'infinity'::timestamptz
          AND m.attempts = 0
        UNION ALL
        SELECT m.channel_name, 'd', m.chain_seq IS NOT NULL
        FROM mq_msgs m
        WHERE m.dead_since IS NOT NULL
        UNION ALL
        -- Chain heads: every one counts once as 'h' (counts.waiting has all
        -- ordered messages); those neither ready, dead nor on a final
        -- attempt (above) by their state.
        SELECT h.cn, 'h', false FROM hd h
        WHERE h.nm IS NULL OR h.cn = h.nm
        UNION ALL
        SELECT h.cn, CASE WHEN h.dl > 0 THEN 'f' WHEN h.ci THEN 'u' ELSE 's' END, false
        FROM hd h
        WHERE (h.nm IS NULL OR h.cn = h.nm)
          AND NOT h.dead AND h.ra < 'infinity'::timestamptz AND h.at > ts
    ),
    by_state AS (
        SELECT l.channel_name,
               pg_catalog.count(*) FILTER (WHERE l.st = 'f') AS f,
               pg_catalog.count(*) FILTER (WHERE l.st = 's') AS s,
               pg_catalog.count(*) FILTER (WHERE l.st = 'u') AS u,
               pg_catalog.count(*) FILTER (WHERE l.st = 'd') AS d,
               pg_catalog.count(*) FILTER (WHERE l.st = 'd' AND l.head) AS b,
               pg_catalog.count(*) FILTER (WHERE l.st = 'h') AS h
        FROM later l
        GROUP BY l.channel_name
    )
    SELECT c.channel_name AS ch,
           c.total - (c.waiting - COALESCE(b.h, 0)) - COALESCE(b.f + b.s + b.u + b.d, 0) AS rdy,
           COALESCE(b.f, 0) AS f, COALESCE(b.s, 0) AS s, COALESCE(b.u, 0) AS u,
           c.waiting - COALESCE(b.h, 0) AS w, COALESCE(b.d, 0) AS d, COALESCE(b.b, 0) AS bl, c.removed AS rm
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

-- When the oldest ready message of a channel became ready (NULL: none is
-- ready): a loose index scan over the channel's chain keys, one probe each,
-- in mq_msgs_ready_plain; the channel's urgent messages are read whole; and
-- the heads of its chains, one probe each in mq_msgs_chain.
CREATE OR REPLACE FUNCTION mq_oldest_ready(channel text, ts timestamptz)
RETURNS timestamptz
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    WITH RECURSIVE keys(k) AS (
        SELECT (SELECT m.channel_key FROM mq_msgs m
                WHERE m.dead_since IS NULL
                  AND m.after_message_id IS NULL
                  AND m.priority <= 0
                  AND m.channel_key >= (pg_catalog.hashtext(channel)::bigint << 32)
                  AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32)
                                        | 4294967295)
                ORDER BY m.channel_key LIMIT 1)
        UNION ALL
        SELECT (SELECT m.channel_key FROM mq_msgs m
                WHERE m.dead_since IS NULL
                  AND m.after_message_id IS NULL
                  AND m.priority <= 0
                  AND m.channel_key > keys.k
                  AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32)
                                        | 4294967295)
                ORDER BY m.channel_key LIMIT 1)
        FROM keys WHERE keys.k IS NOT NULL
    ),
    hd(id, k, seq, at, attempts, dead, cn) AS (
        -- The heads of the channel's chains: the first entry of each chain
        -- key of its name's range (a loose index scan of mq_msgs_chain).
        SELECT f.* FROM (
            SELECT m.id, m.channel_key, m.chain_seq, m.attempt_at, m.attempts,
                   m.dead_since IS NOT NULL, m.channel_name
            FROM mq_msgs m
            WHERE m.chain_seq IS NOT NULL -- mq_msgs_chain
              AND m.channel_key >= (pg_catalog.hashtext(channel)::bigint << 32)
              AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32) | 4294967295)
            ORDER BY m.channel_key, m.chain_seq LIMIT 1) f
        UNION ALL
        SELECT f.* FROM hd, LATERAL (
            SELECT m.id, m.channel_key, m.chain_seq, m.attempt_at, m.attempts,
                   m.dead_since IS NOT NULL, m.channel_name
            FROM mq_msgs m
            WHERE m.chain_seq IS NOT NULL
              AND m.channel_key > hd.k
              AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32) | 4294967295)
            ORDER BY m.channel_key, m.chain_seq LIMIT 1) f
    )
    SELECT LEAST(
        (SELECT pg_catalog.min(f.at)
         FROM keys,
         LATERAL (
             SELECT m.attempt_at AS at FROM mq_msgs m
             WHERE m.channel_key = keys.k
               AND m.dead_since IS NULL
               AND m.after_message_id IS NULL
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
           AND m.after_message_id IS NULL
           AND m.priority > 0
           AND m.channel_key >= (pg_catalog.hashtext(channel)::bigint << 32)
           AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32) | 4294967295)
           AND m.ready_at <= ts
           AND m.attempt_at <= ts
           AND m.attempts > 0
           AND m.channel_name = channel),
        -- The chains' heads that are ready.
        (SELECT pg_catalog.min(h.at) FROM hd h
         WHERE h.cn = channel AND NOT h.dead AND h.attempts > 0 AND h.at <= ts))
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
    WITH RECURSIVE hd(id, k, seq, at, attempts, dead, cn) AS (
        -- The heads of the channel's chains: the first entry of each chain
        -- key of its name's range (a loose index scan of mq_msgs_chain).
        SELECT f.* FROM (
            SELECT m.id, m.channel_key, m.chain_seq, m.attempt_at, m.attempts,
                   m.dead_since IS NOT NULL, m.channel_name
            FROM mq_msgs m
            WHERE m.chain_seq IS NOT NULL -- mq_msgs_chain
              AND m.channel_key >= (pg_catalog.hashtext(channel)::bigint << 32)
              AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32) | 4294967295)
            ORDER BY m.channel_key, m.chain_seq LIMIT 1) f
        UNION ALL
        SELECT f.* FROM hd, LATERAL (
            SELECT m.id, m.channel_key, m.chain_seq, m.attempt_at, m.attempts,
                   m.dead_since IS NOT NULL, m.channel_name
            FROM mq_msgs m
            WHERE m.chain_seq IS NOT NULL
              AND m.channel_key > hd.k
              AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32) | 4294967295)
            ORDER BY m.channel_key, m.chain_seq LIMIT 1) f
    ),
    heads AS (
        -- Candidates: the channel indexes (plain and urgent), one key range,
        -- and the live heads of the channel's chains.
        (SELECT m.id, m.channel_args, m.attempt_at, m.deliveries, m.attempts,
                m.commit_interval, m.chain_seq, m.channel_key, m.priority
         FROM mq_msgs m
         WHERE m.dead_since IS NULL
           AND m.attempts > 0
           AND m.after_message_id IS NULL
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
                m.commit_interval, m.chain_seq, m.channel_key, m.priority
         FROM mq_msgs m
         WHERE m.dead_since IS NULL
           AND m.attempts > 0
           AND m.after_message_id IS NULL
           AND m.priority > 0
           AND m.channel_key >= (pg_catalog.hashtext(channel)::bigint << 32)
           AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32)
                                 | 4294967295)
           AND m.channel_name = channel
           AND (args IS NULL OR m.channel_args = args)
         ORDER BY m.priority DESC, m.attempt_at, m.id
         LIMIT max_rows)
        UNION ALL
        SELECT m.id, m.channel_args, m.attempt_at, m.deliveries, m.attempts,
               m.commit_interval, m.chain_seq, m.channel_key, m.priority
        FROM hd h
        JOIN LATERAL (SELECT q.* FROM mq_msgs q WHERE q.id = h.id LIMIT 1) m ON true
        WHERE h.cn = channel AND NOT h.dead AND h.attempts > 0
          AND (args IS NULL OR m.channel_args = args)
    ),
    -- Followers: each chain's next members in chain order, at most max_rows.
    picked AS (
        SELECT h.id, h.channel_args, h.attempt_at, h.deliveries, h.attempts,
               h.commit_interval, h.chain_seq IS NOT NULL AS ordered,
               false AS behind, -h.priority AS k0, h.attempt_at AS k1, h.id AS k2,
               0::bigint AS k3
        FROM heads h
        UNION ALL
        SELECT s.id, s.channel_args, s.attempt_at, s.deliveries, s.attempts,
               s.commit_interval, true, true, -h.priority, h.attempt_at, h.id, s.chain_seq
        FROM heads h, LATERAL (
            SELECT f.id, f.channel_args, f.attempt_at, f.deliveries, f.attempts,
                   f.commit_interval, f.chain_seq
            FROM mq_msgs f
            WHERE f.chain_seq IS NOT NULL -- mq_msgs_chain
              AND f.channel_key = h.channel_key
              AND f.chain_seq > h.chain_seq
            ORDER BY f.chain_seq
            LIMIT max_rows) s
        WHERE h.chain_seq IS NOT NULL
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

-- schema/clear.sql: deleting whole channels (the original schema's mq_clear
-- and mq_clear_all). Today's definitions; the migrations that created them
-- must carry the same text (tests/test_migrate.c compares the two).

-- Deletes every message of the given channels (all_channels: of every
-- channel), whatever its state: ready, delayed, uncommitted, held by a
-- consumer (whose completion then finds nothing: mq_complete counts 0), or
-- dead. Chains need no repair: a message a concurrent producer appends
-- (not yet visible here) stays, and heads what is left of its chain. The
-- nil UUID is never a message (the original kept a row for it; pqmq needs
-- none). Returns how many it deleted.
CREATE OR REPLACE FUNCTION mq_clear_count(channel_names text[],
                                          all_channels boolean DEFAULT false)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    n  int;
BEGIN
    all_channels := COALESCE(all_channels, false);
    IF NOT all_channels
       AND (channel_names IS NULL OR pg_catalog.cardinality(channel_names) = 0) THEN
        RETURN 0;
    END IF;
    WITH gone AS (
        DELETE FROM mq_msgs m
        WHERE (all_channels OR m.channel_name = ANY (channel_names))
          AND m.id <> '00000000-0000-0000-0000-000000000000'::uuid
        RETURNING m.id
    )
    SELECT pg_catalog.count(*) INTO n FROM gone;
    RETURN n;
END;
$$;

-- The original's mq_clear: deletes the messages of the given channels.
CREATE OR REPLACE FUNCTION mq_clear(channel_names text[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM mq_clear_count(channel_names, false);
END;
$$;

-- The original's mq_clear_all: deletes every message.
CREATE OR REPLACE FUNCTION mq_clear_all()
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM mq_clear_count(NULL, true);
END;
$$;

SELECT mq_secure();
SELECT mq_regrant();

INSERT INTO mq_schema_migrations (version, name)
VALUES (20, '0020_chain_position')
ON CONFLICT (version) DO NOTHING;
