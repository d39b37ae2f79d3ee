-- pqmq schema, version 19: hardening, second round (issue 31).
--
-- * The install refuses a queue schema whose owner is not trusted (the
--   installing role or a superuser), here and before anything else in
--   0000 (the first file every route applies).
-- * Schedules belong to the role that first evaluated them (mq_schedules.
--   owner); only it, a role with its rights or the queue's owner evaluates
--   one; keys 'schedule:...' are the schedules' alone; bit sets are checked;
--   a backfill goes in batches (at most 10,000 slots an evaluation);
--   mq_schedule is the produce duty's, mq_cron_slots produce's and
--   administer's (no longer consume's).
-- * Unique keys: consumers take keys' locks in key order before chains'
--   (mq_lock_keys), as producers do, so they never deadlock; 2-D arrays,
--   negative retention parts, duplicate ids and bad JSON are named.
-- * A waiting chain member with a successor is not replaced.
-- * A poll names at most 1000 channels.

-- UPGRADE STEP: the schedules' owners (NULL: the next caller's).
ALTER TABLE mq_schedules ADD COLUMN IF NOT EXISTS owner oid;

-- Refuse a queue schema whose owner is not trusted, before anything is
-- created in it: a schema's owner may drop what is in it and plant
-- functions and operators there that the queue's callers would run (a role
-- with CREATE on the database makes a schema named like the installing
-- superuser, on its default path "$user", public). Trusted: the installing
-- role itself, or a superuser (for a schema owned by pg_database_owner,
-- public on PostgreSQL 15, the database's owner).
DO $$
DECLARE
    nsp   oid := COALESCE(
        (SELECT c.relnamespace FROM pg_catalog.pg_class c
         WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('mq_msgs')),
        (SELECT n.oid FROM pg_catalog.pg_namespace n
         WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()));
    owner oid := (SELECT n.nspowner FROM pg_catalog.pg_namespace n
                  WHERE n.oid OPERATOR(pg_catalog.=) nsp);
    eff   oid;
BEGIN
    IF owner IS NULL THEN
        RETURN; -- no schema: creating the first object says so
    END IF;
    eff := CASE WHEN owner OPERATOR(pg_catalog.=) (SELECT r.oid FROM pg_catalog.pg_roles r
                                                  WHERE r.rolname OPERATOR(pg_catalog.=) 'pg_database_owner')
                THEN (SELECT d.datdba FROM pg_catalog.pg_database d
                      WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                ELSE owner END;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r
                   WHERE r.oid OPERATOR(pg_catalog.=) eff
                     AND (r.rolsuper OR r.rolname OPERATOR(pg_catalog.=) CURRENT_USER)) THEN
        RAISE EXCEPTION 'pqmq: the queue schema % is owned by role %, which is neither the installing role (%) nor a superuser',
            nsp::regnamespace, owner::regrole, CURRENT_USER
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'The owner of a schema can drop the queue''s objects in it and put functions there that the queue''s callers would run with their rights.',
                  HINT = 'Install into a schema that the installing role owns (CREATE SCHEMA ... AUTHORIZATION), as that role; check the search_path: the queue goes into its first schema that exists.';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION mq_insert_check(new_messages mq_new_t[], priorities int[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    dup record;
BEGIN
    IF array_ndims(new_messages) > 1 OR array_ndims(priorities) > 1 THEN
        RAISE EXCEPTION 'mq_insert: % is a %-dimensional array, not a list',
            CASE WHEN array_ndims(new_messages) > 1 THEN 'new_messages' ELSE 'priorities' END,
            GREATEST(array_ndims(new_messages), array_ndims(priorities))
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT t.id, min(t.o) AS first, (array_agg(t.o ORDER BY t.o))[2] AS second INTO dup
    FROM unnest(new_messages) WITH ORDINALITY AS t(id, delay, retries, retry_backoff,
                                                 channel_name, channel_args, commit_interval,
                                                 ordered, name, payload_json, payload_bytes, o)
    WHERE t.id IS NOT NULL
    GROUP BY t.id HAVING count(*) > 1
    ORDER BY 3 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'mq_insert: message % of the batch: id % is message %''s too',
            dup.second, dup.id, dup.first
            USING ERRCODE = 'unique_violation';
    END IF;
END;
$$;

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
    -- Shapes and duplicate ids, named (mq_insert_check, called only when
    -- there is something to name: a call costs more than this test).
    IF array_ndims(new_messages) > 1 OR array_ndims(priorities) > 1
       OR (cardinality(new_messages) > 1
           AND (SELECT count(DISTINCT t.id) FROM unnest(new_messages) AS t)
               < cardinality(new_messages)) THEN
        PERFORM mq_insert_check(new_messages, priorities);
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

CREATE OR REPLACE FUNCTION mq_check_json(new_messages mq_new_t[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    i int;
BEGIN
    BEGIN
        PERFORM count(t.payload_json::jsonb) FROM unnest(new_messages) AS t;
        RETURN;
    EXCEPTION WHEN invalid_text_representation OR untranslatable_character THEN
        NULL;
    END;
    FOR i IN 1 .. cardinality(new_messages) LOOP
        BEGIN
            PERFORM (new_messages[i]).payload_json::jsonb;
        EXCEPTION WHEN invalid_text_representation OR untranslatable_character THEN
            RAISE EXCEPTION 'mq_insert_unique: message % of the batch: payload_json is not JSON (%)',
                i, SQLERRM
                USING ERRCODE = 'invalid_text_representation';
        END;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION mq_lock_keys(msg_ids uuid[])
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
    cn text[];
    uk text[];
    r  record;
BEGIN
    SELECT array_agg(m.channel_name), array_agg(m.unique_key) INTO cn, uk
    FROM mq_msgs m
    WHERE m.id = ANY (msg_ids) AND m.unique_key IS NOT NULL;
    IF cn IS NULL THEN
        RETURN;
    END IF;
    -- A probe per key, in key order (one statement each: on Citus each
    -- is a router query).
    FOR r IN SELECT DISTINCT u.cn, u.uk FROM unnest(cn, uk) AS u(cn, uk) ORDER BY 1, 2 LOOP
        PERFORM 1 FROM mq_keys k
        WHERE k.channel_name = r.cn AND k.unique_key = r.uk
        FOR UPDATE;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION mq_insert_keyed(new_messages mq_new_t[], unique_keys text[],
                                           mode text, retention interval, priorities int[])
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
    -- (One subscript of a 2-D array reads NULL: every key would be "none".)
    IF array_ndims(unique_keys) > 1 OR array_ndims(priorities) > 1
       OR array_ndims(new_messages) > 1 THEN
        RAISE EXCEPTION 'mq_insert_unique: % is a %-dimensional array, not a list',
            CASE WHEN array_ndims(unique_keys) > 1 THEN 'unique_keys'
                 WHEN array_ndims(priorities) > 1 THEN 'priorities'
                 ELSE 'new_messages' END,
            GREATEST(array_ndims(unique_keys), array_ndims(priorities),
                     array_ndims(new_messages))
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
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
    -- A window is a length: a negative part ('-1 month +31 days') is a
    -- mistake, whatever the sum.
    IF date_part('month', retention) < 0 OR date_part('day', retention) < 0
       OR date_part('year', retention) < 0 THEN
        RAISE EXCEPTION 'mq_insert_unique: retention % has a negative part', retention
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
    PERFORM mq_check_json(new_messages);

    ids := ARRAY(SELECT (new_messages[t.o]).id FROM generate_subscripts(new_messages, 1) AS t(o) ORDER BY t.o);
    outs := array_fill('inserted'::text, ARRAY[n]);
    take := array_fill(true, ARRAY[n]);
    eff := new_messages;
    prio := priorities;

    -- Each key once (the first message of the batch with it, "first"), in
    -- key order so that producers racing on the same keys cannot deadlock
    -- (consumers take them in the same order, mq_lock_keys, before any
    -- chain's lock; so do producers: mq_insert_rows comes after).
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
                    -- (the locked lane's claim is a row lock); and unordered,
                    -- or alone in its chain: a chain's other messages were
                    -- inserted before this one and must not run after its
                    -- payload, and a waiting member is relinked by
                    -- completions, under the chain's lock, which producers
                    -- take after their keys' (this row's lock would close a
                    -- circle).
                    SELECT m.ctid INTO got FROM mq_msgs m
                    WHERE m.id = holder AND m.deliveries = 0 AND m.dead_since IS NULL
                      AND (m.after_message_id IS NULL
                           OR (m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid
                               AND NOT EXISTS (SELECT 1 FROM mq_msgs s
                                               WHERE s.after_message_id = holder
                                                 AND s.after_message_id <> '00000000-0000-0000-0000-000000000000'::uuid)))
                    FOR NO KEY UPDATE OF m SKIP LOCKED;
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

    -- Forget a few keys whose window has passed (those who keep keys pay):
    -- after this batch's own keys, so that no key is held out of order.
    DELETE FROM mq_keys k WHERE k.ctid = ANY (ARRAY(
        SELECT e.ctid FROM mq_keys e WHERE e.expires_at <= ts
        ORDER BY e.expires_at LIMIT 2 * n + 16 FOR UPDATE SKIP LOCKED));

    PERFORM mq_insert_rows(eff, unique_keys, retention, take, prio);
    RETURN QUERY SELECT ids[i], outs[i] FROM generate_series(1, n) AS i ORDER BY i;
END;
$$;

CREATE OR REPLACE FUNCTION mq_insert_unique(new_messages mq_new_t[], unique_keys text[],
                                            mode text DEFAULT 'keep',
                                            retention interval DEFAULT NULL,
                                            priorities int[] DEFAULT NULL)
RETURNS TABLE(id uuid, outcome text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    bad int;
BEGIN
    SELECT min(k.o) INTO bad FROM unnest(unique_keys) WITH ORDINALITY AS k(key, o)
    WHERE left(k.key, 9) = 'schedule:';
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'mq_insert_unique: message % of the batch: unique key % is reserved',
            bad, quote_literal(left(unique_keys[bad], 100))
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'Keys that start with ''schedule:'' are the recurring messages''.';
    END IF;
    RETURN QUERY SELECT * FROM mq_insert_keyed(new_messages, unique_keys, mode, retention,
                                               priorities);
END;
$$;

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
    k       int;
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
    -- Unordered messages without a key need no lock: they go first, and
    -- usually that is all there is. The others take their keys' locks (in
    -- key order) and then their chains' (as producers do: mq_lock_keys).
    -- Rows are found by id = ANY (an index condition whatever the
    -- statistics say; a join with the array could become a scan of the
    -- whole primary key after ANALYZE saw an empty table).
    WITH gone AS (
        DELETE FROM mq_msgs m
        WHERE m.id = ANY (msg_ids)
          AND m.after_message_id IS NULL
          AND m.unique_key IS NULL
          AND (msg_attempts IS NULL OR m.deliveries = att[width_bucket(m.id, by_id)])
        RETURNING m.id
    )
    SELECT count(*) INTO n FROM gone;
    IF n = cardinality(msg_ids) THEN
        RETURN n;
    END IF;

    PERFORM mq_lock_keys(msg_ids);
    PERFORM mq_lock_chains(msg_ids);
    WITH gone AS (
        DELETE FROM mq_msgs m
        WHERE m.id = ANY (msg_ids)
          AND (m.after_message_id IS NOT NULL OR m.unique_key IS NOT NULL)
          AND (msg_attempts IS NULL OR m.deliveries = att[width_bucket(m.id, by_id)])
        RETURNING m.id, m.after_message_id, m.channel_name, m.channel_args
    )
    SELECT count(*),
           array_agg(g.id) FILTER (WHERE g.after_message_id IS NOT NULL),
           array_agg(g.after_message_id) FILTER (WHERE g.after_message_id IS NOT NULL),
           array_agg(g.channel_name) FILTER (WHERE g.after_message_id IS NOT NULL),
           array_agg(g.channel_args) FILTER (WHERE g.after_message_id IS NOT NULL)
    INTO k, g_id, g_after, g_name, g_args
    FROM gone g;

    IF g_id IS NOT NULL THEN
        PERFORM mq_wake(mq_unlink(g_id, g_after, g_name, g_args));
    END IF;
    RETURN n + k;
END;
$$;

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

CREATE OR REPLACE FUNCTION mq_cron_check(fn text, minutes bigint, hours int, doms bigint,
                                         months int, dows int, dom_any boolean,
                                         dow_any boolean, tz text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    field text;
BEGIN
    field := CASE
        WHEN minutes IS NULL OR minutes & 1152921504606846975 = 0 THEN 'minutes (0-59)'
        WHEN hours IS NULL OR hours & 16777215 = 0 THEN 'hours (0-23)'
        WHEN doms IS NULL OR doms & 4294967294 = 0 THEN 'doms (days of the month, 1-31)'
        WHEN months IS NULL OR months & 8190 = 0 THEN 'months (1-12)'
        WHEN dows IS NULL OR dows & 127 = 0 THEN 'dows (weekdays, 0-6)'
        WHEN dom_any IS NULL THEN 'dom_any'
        WHEN dow_any IS NULL THEN 'dow_any'
        WHEN tz IS NULL THEN 'tz'
        END;
    IF field IS NOT NULL THEN
        RAISE EXCEPTION '%: % is NULL or has no bit in its range', fn, field
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION mq_cron_slots(minutes bigint, hours int, doms bigint, months int,
                                         dows int, dom_any boolean, dow_any boolean,
                                         tz text, after timestamptz, until timestamptz)
RETURNS TABLE(slot timestamp, due timestamptz)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM mq_cron_check('mq_cron_slots', minutes, hours, doms, months, dows, dom_any,
                          dow_any, tz);
    IF after IS NULL OR until IS NULL OR until - after > interval '31 days' THEN
        RAISE EXCEPTION 'mq_cron_slots: after and until must be given and at most 31 days apart (% to %)',
            after, until
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH walk AS (
        -- Three hours before `after` too, so that a repeated hour already
        -- seen (fall back) is known as seen.
        SELECT g AS utc, g AT TIME ZONE tz AS loc
        FROM generate_series(date_trunc('minute', after) - interval '3 hours',
                             until, interval '1 minute') AS g
    ),
    seen AS (
        SELECT w.utc, w.loc,
               max(w.loc) OVER (ORDER BY w.utc ROWS BETWEEN UNBOUNDED PRECEDING
                                                        AND 1 PRECEDING) AS high
        FROM walk w
    )
    SELECT l.m, s.utc
    FROM seen s,
         LATERAL generate_series(COALESCE(s.high + interval '1 minute', s.loc), s.loc,
                                 interval '1 minute') AS l(m)
    WHERE s.utc > after
      AND (minutes >> extract(minute FROM l.m)::int) & 1 = 1
      AND (hours >> extract(hour FROM l.m)::int) & 1 = 1
      AND (months >> extract(month FROM l.m)::int) & 1 = 1
      AND CASE WHEN dom_any AND dow_any THEN true
               WHEN dom_any THEN (dows >> extract(dow FROM l.m)::int) & 1 = 1
               WHEN dow_any THEN (doms >> extract(day FROM l.m)::int) & 1 = 1
               ELSE (dows >> extract(dow FROM l.m)::int) & 1 = 1
                    OR (doms >> extract(day FROM l.m)::int) & 1 = 1 END
    ORDER BY s.utc, l.m;
END;
$$;

CREATE OR REPLACE FUNCTION mq_caller()
RETURNS oid
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT r.oid FROM pg_catalog.pg_roles r
    WHERE r.rolname OPERATOR(pg_catalog.=) CASE
        WHEN pg_catalog.current_setting('role') OPERATOR(pg_catalog.=) 'none'
        THEN SESSION_USER::text
        ELSE pg_catalog.current_setting('role') END
$$;

CREATE OR REPLACE FUNCTION mq_schedule(sched_name text, minutes bigint, hours int, doms bigint,
                                       months int, dows int, dom_any boolean,
                                       dow_any boolean, tz text, backfill text,
                                       channel_name text, msg_name text, payload_json text,
                                       payload_bytes bytea, retries int,
                                       retry_backoff interval)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts    timestamptz := date_trunc('minute', clock_timestamp());
    last  timestamptz;
    upto  timestamptz;
    slots timestamp[];
    dues  timestamptz[];
    n     int := 0;
    k     int;
    who   oid := mq_caller();
    owner oid;
    heir  boolean;
BEGIN
    IF sched_name IS NULL OR channel_name IS NULL THEN
        RAISE EXCEPTION 'mq_schedule: sched_name and channel_name must not be NULL'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Its slots' keys, 'schedule:NAME:YYYY-MM-DDTHH:MI', fit in 1024 bytes.
    IF sched_name = '' OR octet_length(sched_name) > 998 THEN
        RAISE EXCEPTION 'mq_schedule: sched_name must be 1 to 998 bytes, not %',
            octet_length(sched_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM mq_cron_check('mq_schedule', minutes, hours, doms, months, dows, dom_any,
                          dow_any, tz);
    IF backfill IS NULL OR backfill NOT IN ('all', 'latest') THEN
        RAISE EXCEPTION 'mq_schedule: backfill % is not all or latest',
            COALESCE(quote_literal(backfill), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM ts AT TIME ZONE tz; -- names an unknown time zone
    INSERT INTO mq_schedules AS s (name, last_slot, owner) VALUES (sched_name, ts, who)
    ON CONFLICT (name) DO NOTHING;
    -- (A schedule from before owners were recorded goes to its next caller.)
    UPDATE mq_schedules s SET owner = who WHERE s.name = sched_name AND s.owner IS NULL;
    SELECT s.last_slot, s.owner INTO last, owner FROM mq_schedules s
    WHERE s.name = sched_name FOR UPDATE;
    -- (A dropped owner's schedule is the queue owner's to evaluate.)
    heir := EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = owner)
            AND pg_has_role(who, owner, 'USAGE');
    IF owner IS DISTINCT FROM who AND NOT heir
       AND NOT pg_has_role(who, (SELECT c.relowner FROM pg_class c
                                 WHERE c.oid = 'mq_msgs'::regclass), 'USAGE') THEN
        RAISE EXCEPTION 'mq_schedule: schedule % belongs to role %, not to %',
            quote_literal(left(sched_name, 100)),
            COALESCE((SELECT r.rolname::text FROM pg_roles r WHERE r.oid = owner),
                     'oid ' || owner),
            (SELECT r.rolname FROM pg_roles r WHERE r.oid = who)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Run the schedule as that role (or one with its rights), or give it another name.';
    END IF;
    IF last >= ts THEN
        RETURN 0;
    END IF;
    -- In batches of at most 1,000 slots, oldest first, at most 10 per
    -- evaluation.
    last := GREATEST(last, ts - interval '31 days');
    FOR b IN 1 .. 10 LOOP
        SELECT array_agg(c.slot ORDER BY c.due, c.slot), array_agg(c.due ORDER BY c.due, c.slot)
        INTO slots, dues
        FROM (SELECT c.slot, c.due
              FROM mq_cron_slots(minutes, hours, doms, months, dows, dom_any, dow_any, tz,
                                 last, ts) c
              ORDER BY c.due, c.slot
              LIMIT CASE WHEN backfill = 'latest' THEN NULL ELSE 1001 END) c;
        upto := ts;
        IF backfill = 'all' AND cardinality(slots) > 1000 THEN
            -- A batch ends before the minute due of its 1001st slot, whose
            -- slots (several after a clock's jump) the next batch takes whole.
            SELECT max(d.due) INTO upto FROM unnest(dues) AS d(due)
            WHERE d.due < dues[cardinality(dues)];
            slots := ARRAY(SELECT x.slot FROM unnest(slots, dues) WITH ORDINALITY AS x(slot, due, o)
                           WHERE x.due <= upto ORDER BY x.o);
        END IF;
        IF backfill = 'latest' AND cardinality(slots) > 1 THEN
            slots := slots[cardinality(slots):];
        END IF;
        IF cardinality(slots) > 0 THEN
            SELECT count(*) FILTER (WHERE u.outcome = 'inserted') INTO k
            FROM mq_insert_keyed(
                ARRAY(SELECT ROW(gen_random_uuid(), NULL, retries, retry_backoff, channel_name,
                                 '', NULL, false, msg_name,
                                 CASE WHEN jsonb_typeof(payload_json::jsonb) = 'object'
                                      THEN (payload_json::jsonb
                                            || jsonb_build_object('_slot', to_char(s.slot,
                                                   'YYYY-MM-DD"T"HH24:MI')))::text
                                      ELSE payload_json END,
                                 payload_bytes)::mq_new_t
                      FROM unnest(slots) WITH ORDINALITY AS s(slot, o) ORDER BY s.o),
                ARRAY(SELECT 'schedule:' || sched_name || ':'
                             || to_char(s.slot, 'YYYY-MM-DD"T"HH24:MI')
                      FROM unnest(slots) WITH ORDINALITY AS s(slot, o) ORDER BY s.o),
                'keep', interval '1 day', NULL) u;
            n := n + k;
        END IF;
        last := upto;
        EXIT WHEN upto >= ts;
    END LOOP;
    UPDATE mq_schedules s SET last_slot = GREATEST(s.last_slot, last) WHERE s.name = sched_name;
    RETURN n;
END;
$$;

CREATE OR REPLACE FUNCTION mq_duties()
RETURNS TABLE(duty text, function_name text)
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$
    VALUES ('produce', 'mq_insert'), ('produce', 'mq_insert_unique'), ('produce', 'mq_commit'),
           -- A schedule inserts messages: producing (a runner that
           -- carries schedules needs it); operators list slots.
           ('produce', 'mq_schedule'), ('produce', 'mq_cron_slots'),
           ('administer', 'mq_cron_slots'),
           ('consume', 'mq_claim'), ('consume', 'mq_claim_locked'),
           ('consume', 'mq_claim_lane'),
           ('consume', 'mq_complete_claim'),
           ('consume', 'mq_poll'), ('consume', 'mq_poll_jobs'),
           ('consume', 'mq_complete'), ('consume', 'mq_complete_all'),
           ('consume', 'mq_complete_poll'),
           ('consume', 'mq_delete'), ('consume', 'mq_fail'),
           ('consume', 'mq_keep_alive'), ('consume', 'mq_keep_alive_count'),
           ('consume', 'mq_checkpoint'), ('consume', 'mq_checkpoint_found'),
           ('consume', 'mq_release'),
           ('administer', 'mq_dead_jobs'), ('administer', 'mq_dead_letters'),
           ('administer', 'mq_retry'),
           ('administer', 'mq_skip'), ('administer', 'mq_delete'),
           ('administer', 'mq_clear'), ('administer', 'mq_clear_all'),
           ('administer', 'mq_clear_count'),
           ('administer', 'mq_stats'), ('administer', 'mq_reap_dead'),
           ('administer', 'mq_metrics'), ('administer', 'mq_peek'),
           ('administer', 'mq_purge')
$$;

SELECT mq_secure();

-- UPGRADE STEP: consumers lose mq_schedule and mq_cron_slots (every grant
-- of them is revoked; mq_regrant gives them back to producers and
-- administrators).
DO $$
DECLARE
    f record;
BEGIN
    FOR f IN
        SELECT mq_qualified(p.oid) AS sig, acl.grantee::regrole AS grantee
        FROM pg_catalog.pg_proc p
        CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) acl
        WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.quote_ident(mq_queue_schema())::regnamespace
          AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['mq_schedule', 'mq_cron_slots']::name[])
          AND acl.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
          AND acl.grantee OPERATOR(pg_catalog.<>) p.proowner
          AND acl.grantee OPERATOR(pg_catalog.<>) 0::oid
    LOOP
        PERFORM mq_run_ddl(pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM %s',
                                             f.sig, f.grantee));
    END LOOP;
END
$$;
SELECT mq_regrant();

INSERT INTO mq_schema_migrations (version, name)
VALUES (19, '0019_hardening_two')
ON CONFLICT (version) DO NOTHING;
