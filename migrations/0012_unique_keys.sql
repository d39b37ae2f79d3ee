-- pqmq schema, version 12: unique keys.
--
-- A message may carry a key, unique in its channel while a message with it
-- is live (mq_insert_unique); a second insert of a live key keeps the
-- holder or replaces its payload (and schedule) if it has not started, and
-- a retention window keeps a key after its message completes. mq_keys says
-- who holds each key, and its primary key decides between racing
-- producers. mq_insert's work moves into mq_insert_rows, which both inserts
-- share; messages without a key write nothing more than before.

ALTER TABLE mq_msgs
    ADD COLUMN IF NOT EXISTS unique_key text,
    ADD COLUMN IF NOT EXISTS key_retention interval;

CREATE TABLE IF NOT EXISTS mq_keys (
    channel_name text NOT NULL,
    unique_key   text NOT NULL,
    message_id   uuid NOT NULL,
    expires_at   timestamptz,
    PRIMARY KEY (channel_name, unique_key)
);

CREATE INDEX IF NOT EXISTS mq_keys_expired ON mq_keys (expires_at)
    WHERE expires_at IS NOT NULL;

-- Inserts a batch in one statement: all of it, or (on any error) none of it.
CREATE OR REPLACE FUNCTION mq_insert(new_messages mq_new_t[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM mq_insert_rows(new_messages, NULL, NULL, NULL);
END;
$$;

-- mq_insert's work, and mq_insert_unique's (schema/keys.sql): checks the
-- whole batch, then inserts the messages that take[i] marks (NULL: all),
-- message i with unique key unique_keys[i] (NULL: none) kept key_retention
-- after it is deleted. Ordered messages not taken are not in any chain.
CREATE OR REPLACE FUNCTION mq_insert_rows(new_messages mq_new_t[], unique_keys text[],
                                          key_retention interval, take boolean[])
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

    -- Only what the caller takes (mq_insert_unique: not the messages whose
    -- key another message holds), checked above with the rest.
    IF take IS NOT NULL THEN
        SELECT COALESCE(array_agg(new_messages[t.o] ORDER BY t.o), '{}'),
               COALESCE(array_agg(unique_keys[t.o] ORDER BY t.o), '{}')
        INTO new_messages, unique_keys
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
                             name, payload_json, payload_bytes, unique_key, key_retention)
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
               CASE WHEN unique_keys[t.ordinality::int] IS NOT NULL THEN key_retention END
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
                             payload_bytes, unique_key, key_retention)
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
               CASE WHEN unique_keys[b.ord::int] IS NOT NULL THEN key_retention END
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
-- outlives the completion of its message (NULL: not at all).
-- Returns, in batch order, the id each message stands for (its own, or the
-- holder's) and what happened: 'inserted', 'kept' or 'replaced'.
CREATE OR REPLACE FUNCTION mq_insert_unique(new_messages mq_new_t[], unique_keys text[],
                                            mode text DEFAULT 'keep',
                                            retention interval DEFAULT NULL)
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
    PERFORM mq_insert_rows(new_messages, NULL, NULL, array_fill(false, ARRAY[n]));

    -- Forget a few keys whose window has passed (those who keep keys pay).
    DELETE FROM mq_keys k WHERE k.ctid = ANY (ARRAY(
        SELECT e.ctid FROM mq_keys e WHERE e.expires_at <= ts
        ORDER BY e.expires_at LIMIT 2 * n + 16 FOR UPDATE SKIP LOCKED));

    ids := ARRAY(SELECT (new_messages[t.o]).id FROM generate_subscripts(new_messages, 1) AS t(o) ORDER BY t.o);
    outs := array_fill('inserted'::text, ARRAY[n]);
    take := array_fill(true, ARRAY[n]);
    eff := new_messages;

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
                            ELSE m.ready_at END
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
        FOR i IN 2 .. cardinality(g.members) LOOP
            ids[g.members[i]] := ids[g.first];
            outs[g.members[i]] := CASE WHEN mode = 'keep' THEN 'kept' ELSE 'replaced' END;
            take[g.members[i]] := false;
        END LOOP;
    END LOOP;

    PERFORM mq_insert_rows(eff, unique_keys, retention, take);
    RETURN QUERY SELECT ids[i], outs[i] FROM generate_series(1, n) AS i ORDER BY i;
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
BEGIN
    IF OLD.dead_since IS NULL AND OLD.key_retention IS NOT NULL THEN
        UPDATE mq_keys k SET expires_at = clock_timestamp() + OLD.key_retention
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
    AFTER DELETE ON mq_msgs
    FOR EACH ROW
    WHEN (OLD.unique_key IS NOT NULL)
    EXECUTE FUNCTION mq_release_key();

-- Takes the keys of dead letters that mq_retry brings back (msg_ids): a
-- key that another message took meanwhile, and still holds or keeps,
-- refuses the retry, naming both.
CREATE OR REPLACE FUNCTION mq_retake_keys(msg_ids uuid[])
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
        SELECT m.id, m.channel_name, m.unique_key FROM mq_msgs m
        WHERE m.id = ANY (msg_ids) AND m.unique_key IS NOT NULL
        ORDER BY m.channel_name, m.unique_key
    LOOP
        INSERT INTO mq_keys AS k (channel_name, unique_key, message_id)
        VALUES (r.channel_name, r.unique_key, r.id)
        ON CONFLICT (channel_name, unique_key) DO UPDATE SET message_id = k.message_id
        RETURNING k.message_id, k.expires_at INTO holder, expires;
        IF holder <> r.id
           AND ((expires IS NOT NULL AND expires > clock_timestamp())
                OR EXISTS (SELECT 1 FROM mq_msgs h
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

-- Which function belongs to which duty. Later migrations that add a
-- function to a duty replace this and call mq_regrant().
CREATE OR REPLACE FUNCTION mq_duties()
RETURNS TABLE(duty text, function_name text)
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$
    VALUES ('produce', 'mq_insert'), ('produce', 'mq_insert_unique'), ('produce', 'mq_commit'),
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

-- CREATE OR REPLACE FUNCTION undid the pinned path and the grants;
-- mq_insert_unique joins the produce duty.
SELECT mq_secure();
SELECT mq_regrant();

INSERT INTO mq_schema_migrations (version, name)
VALUES (12, '0012_unique_keys')
ON CONFLICT (version) DO NOTHING;
