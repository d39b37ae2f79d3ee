-- schema/keys.sql: unique keys: a message that carries a key is the only
-- live message with that key in its channel (see mq_keys in tables.sql).

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
-- Keys that start with 'schedule:' are the schedules' (mq_schedule) and
-- refused here: a producer could take a slot's key before its schedule does.
-- Parameters: new_messages; unique_keys: one per message; mode: 'keep',
--   'replace' or 'replace_payload'; retention; priorities.
-- Returns: per message, the id it stands for and its outcome. Duty: produce.
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
    RETURN QUERY SELECT * FROM _mq_insert_keyed(new_messages, unique_keys, mode, retention,
                                               priorities);
END;
$$;

-- mq_insert_unique's work, for it and for mq_schedule (whose keys start
-- with 'schedule:'). Not for callers: no duty has it.
CREATE OR REPLACE FUNCTION _mq_insert_keyed(new_messages mq_new_t[], unique_keys text[],
                                            mode text, retention interval, priorities int[])
RETURNS TABLE(id uuid, outcome text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
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
    lim := _mq_limits();
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
    retention := NULLIF(_mq_fixed_length(retention), interval '0');
    SELECT min(k.o) INTO bad FROM unnest(unique_keys) WITH ORDINALITY AS k(key, o)
    WHERE k.key = '' OR octet_length(k.key) > lim.max_text;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'mq_insert_unique: message % of the batch: unique key is %', bad,
            CASE WHEN unique_keys[bad] = '' THEN 'empty (NULL means none)'
                 ELSE format('over %s bytes', lim.max_text) END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Every message is checked before any key is taken or any holder changed.
    PERFORM _mq_insert_rows(new_messages, NULL, NULL, array_fill(false, ARRAY[n]), priorities);
    PERFORM _mq_check_json(new_messages);

    ids := ARRAY(SELECT (new_messages[t.o]).id FROM generate_subscripts(new_messages, 1) AS t(o) ORDER BY t.o);
    outs := array_fill('inserted'::text, ARRAY[n]);
    take := array_fill(true, ARRAY[n]);
    eff := new_messages;
    prio := priorities;

    -- Each key once (the first message of the batch with it, "first"), in
    -- key order so that producers racing on the same keys cannot deadlock
    -- (consumers take them in the same order, _mq_lock_keys, before any
    -- chain's lock; so do producers: _mq_insert_rows comes after).
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
            live := EXISTS (SELECT 1 FROM mq_rows m
                            WHERE m.id = holder AND m.dead_since IS NULL);
            IF live OR (expires IS NOT NULL AND expires > ts) THEN
                got := NULL;
                IF live AND mode <> 'keep' THEN
                    -- Not started: never delivered and held by no consumer
                    -- (the locked lane's claim is a row lock); and unordered,
                    -- or alone in its chain: a chain's other messages were
                    -- inserted around this one, and the new payload must not
                    -- run in the old one's place among them.
                    SELECT m.ctid INTO got FROM mq_rows m
                    WHERE m.id = holder AND m.deliveries = 0 AND m.dead_since IS NULL
                      AND (m.chain_seq IS NULL
                           OR NOT EXISTS (SELECT 1 FROM mq_rows s
                                          WHERE s.channel_key = m.channel_key
                                            AND s.chain_seq IS NOT NULL
                                            AND s.id <> m.id
                                            AND s.channel_name = m.channel_name
                                            AND s.channel_args = m.channel_args))
                    FOR NO KEY UPDATE OF m SKIP LOCKED;
                END IF;
                IF got IS NOT NULL THEN
                    -- (A value, and _mq_at, where Citus needs them: see
                    -- schema/common.sql.)
                    at0 := ts + COALESCE(_mq_fixed_length(src.delay), interval '0');
                    UPDATE mq_rows m SET
                        name = COALESCE(src.name, ''),
                        payload_json = src.payload_json::jsonb,
                        payload_bytes = src.payload_bytes,
                        attempt_at = CASE WHEN mode = 'replace'
                            THEN _mq_at(at0, COALESCE(m.commit_interval, interval '0'))
                            ELSE m.attempt_at END,
                        ready_at = CASE WHEN mode = 'replace'
                            THEN _mq_at(at0, COALESCE(m.commit_interval, interval '0'))
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
            UPDATE mq_keys k SET message_id = COALESCE(ids[g.first]), expires_at = NULL -- (COALESCE: Citus, DESIGN.md section 6)
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

    -- Forget a few keys whose window has passed (those who keep keys pay).
    IF EXISTS (SELECT 1 FROM mq_keys e WHERE e.expires_at <= ts) THEN
        PERFORM _mq_sweep_keys(ts, 2 * n + 16);
    END IF;

    PERFORM _mq_insert_rows(eff, unique_keys, retention, take, prio);
    RETURN QUERY SELECT ids[i], outs[i] FROM generate_series(1, n) AS i ORDER BY i;
END;
$$;

-- Deletes up to most keys whose window ended by ts, oldest first, if it can
-- do so without waiting. It runs after a producer's own keys, out of key
-- order, so it must never wait: SKIP LOCKED skips a locked row, but a row
-- whose updater has just committed is followed to its newest version and
-- that lock is waited for, whatever the wait policy (PostgreSQL's
-- heap_lock_updated_tuple). Such a wait could close a circle with a
-- producer waiting for a key swept here; a lock_timeout far below
-- deadlock_timeout ends it first, and the sweep is left to a later batch.
CREATE OR REPLACE FUNCTION _mq_sweep_keys(ts timestamptz, most int)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET lock_timeout = '5ms'
AS $$
BEGIN
    DELETE FROM mq_keys k WHERE k.ctid = ANY (ARRAY(
        SELECT e.ctid FROM mq_keys e WHERE e.expires_at <= ts
        ORDER BY e.expires_at LIMIT most FOR UPDATE SKIP LOCKED));
EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
    NULL;
END;
$$;

-- When a message with a key is deleted (completed, cancelled, purged), its
-- key is kept for the message's retention window, or freed at once; a dead
-- letter's key is freed (a dead message holds no key: the work it stood
-- for did not get done). Only the key row that names this message.
CREATE OR REPLACE FUNCTION _mq_release_key()
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

-- Fires for messages with a key only: the WHEN test costs the others nothing.
CREATE OR REPLACE TRIGGER mq_msgs_release_key
    AFTER DELETE ON mq_rows
    FOR EACH ROW
    WHEN (OLD.unique_key IS NOT NULL)
    EXECUTE FUNCTION _mq_release_key();

-- Takes the keys of dead letters that mq_retry brings back (msg_ids): a
-- key that another message took meanwhile, and still holds or keeps,
-- refuses the retry, naming both.
CREATE OR REPLACE FUNCTION _mq_retake_keys(msg_ids uuid[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    r       record;
    holder  uuid;
    expires timestamptz;
BEGIN
    FOR r IN
        SELECT m.id, m.channel_name, m.unique_key FROM mq_rows m
        WHERE m.id = ANY (msg_ids) AND m.unique_key IS NOT NULL
        ORDER BY m.channel_name, m.unique_key
    LOOP
        INSERT INTO mq_keys AS k (channel_name, unique_key, message_id)
        VALUES (r.channel_name, r.unique_key, r.id)
        ON CONFLICT (channel_name, unique_key) DO UPDATE SET message_id = k.message_id
        RETURNING k.message_id, k.expires_at INTO holder, expires;
        IF holder <> r.id
           AND ((expires IS NOT NULL AND expires > clock_timestamp())
                OR EXISTS (SELECT 1 FROM mq_rows h
                           WHERE h.id = holder AND h.dead_since IS NULL)) THEN
            RAISE EXCEPTION 'mq_retry: message %''s unique key % in channel % is held by message %',
                r.id, quote_literal(r.unique_key), quote_literal(r.channel_name), holder
                USING ERRCODE = 'unique_violation';
        END IF;
        UPDATE mq_keys k SET message_id = r.id, expires_at = NULL
        WHERE k.channel_name = r.channel_name AND k.unique_key = r.unique_key;
    END LOOP;
END;
$$;

-- Fails naming the first message of the batch whose payload_json jsonb
-- refuses (the insert's cast would not say which), with the cast's
-- SQLSTATE. One subtransaction per batch; one per message only when the
-- batch has a bad one. For mq_insert_unique, and for mq_insert when a
-- payload may hold an escaped NUL (_mq_insert_rows).
CREATE OR REPLACE FUNCTION _mq_check_json(new_messages mq_new_t[])
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
            RAISE EXCEPTION 'mq_insert: message % of the batch: payload_json is not JSON (%)',
                i, SQLERRM
                USING ERRCODE = SQLSTATE;
        END;
    END LOOP;
END;
$$;

-- Takes the row locks of the keys that msg_ids hold, in key order, as
-- producers take them (mq_insert_unique): a completion deletes keyed
-- messages only after this, and before any chain's lock, so producers and
-- consumers that share keys never wait for each other in a circle.
CREATE OR REPLACE FUNCTION _mq_lock_keys(msg_ids uuid[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    cn text[];
    uk text[];
    r  record;
BEGIN
    SELECT array_agg(m.channel_name), array_agg(m.unique_key) INTO cn, uk
    FROM mq_rows m
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
