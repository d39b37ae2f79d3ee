-- schema/insert.sql: producing: inserting a batch, and the second phase of two-phase messages.

-- Inserts a batch in one statement: all of it, or (on any error) none of it.
-- Parameters: new_messages: the batch (mq_new_t); priorities: one per message
--   (this form only).
-- Returns: nothing; an error rolls back the whole batch. Duty: produce.
CREATE OR REPLACE FUNCTION mq_insert(new_messages mq_new_t[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM _mq_insert_rows(new_messages, NULL, NULL, NULL, NULL);
END;
$$;

-- mq_insert where message i has priority priorities[i] (NULL, or a NULL
-- element: 0): among the ready messages of a channel, higher priorities
-- are delivered first. 0 to 32767; 0, the default, is the lowest. A chain
-- is never reordered: its messages become ready one at a time.
-- Parameters: new_messages: the batch (mq_new_t); priorities: one per message
--   (this form only).
-- Returns: nothing; an error rolls back the whole batch. Duty: produce.
CREATE OR REPLACE FUNCTION mq_insert(new_messages mq_new_t[], priorities int[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM _mq_insert_rows(new_messages, NULL, NULL, NULL, priorities);
END;
$$;

-- mq_insert's work, and mq_insert_unique's (schema/keys.sql): checks the
-- whole batch, then inserts the messages that take[i] marks (NULL: all),
-- message i with unique key unique_keys[i] (NULL: none) kept key_retention
-- after it is deleted, with priority priorities[i] (NULL: 0). Ordered
-- messages not taken are not in any chain.
CREATE OR REPLACE FUNCTION _mq_insert_rows(new_messages mq_new_t[], unique_keys text[],
                                           key_retention interval, take boolean[],
                                           priorities int[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts      timestamptz := clock_timestamp();
    lim     record;
    bad     record;
    pass    record; -- what one read of the batch tells (below)
    names   text[]; -- a batch on several channels: message i's
    ords    int[];  -- and 1 if it is ordered
    base    bigint; -- the batch's places in chains (mq_chain_seq)
    new_keys  bigint[]; -- the logged batch's channels without a cursor,
    new_names text[];   -- their names
    new_args  text[];   -- and args
BEGIN
    IF new_messages IS NULL OR cardinality(new_messages) = 0 THEN
        RETURN;
    END IF;
    lim := _mq_limits();
    IF cardinality(new_messages) > lim.max_batch THEN
        RAISE EXCEPTION 'mq_insert: batch of % messages is over the limit of %',
            cardinality(new_messages), lim.max_batch
            USING ERRCODE = 'program_limit_exceeded';
    END IF;

    -- One read of the batch answers every question asked of it: is a
    -- message bad (named below, off the hot path), how many payload bytes
    -- the batch holds, may a payload hold an escaped NUL, are months or days
    -- in an interval, is an id there twice, is any message ordered, and is
    -- the batch on one channel (for the counters and the wake-ups). (A read
    -- per question would unpack every message each time.) The
    -- interval checks hold before and after _mq_fixed_length: interval
    -- comparison already counts months as 30 days and days as 24 hours.
    SELECT pg_catalog.min(t.ordinality) FILTER (WHERE
               t.id IS NULL
               OR t.id = '00000000-0000-0000-0000-000000000000'::uuid
               OR t.channel_name IS NULL
               OR octet_length(t.channel_name) > lim.max_text
               OR octet_length(t.channel_args) > lim.max_text
               OR octet_length(t.name) > lim.max_text
               OR t.retries < 0
               OR t.delay < interval '0' OR t.delay > lim.max_duration
               OR t.retry_backoff < interval '0' OR t.retry_backoff > lim.max_duration
               OR t.commit_interval < interval '0' OR t.commit_interval > lim.max_duration
               OR octet_length(t.payload_json) > lim.max_payload
               OR octet_length(t.payload_bytes) > lim.max_payload) AS bad,
           pg_catalog.sum(COALESCE(octet_length(t.payload_json), 0)
                          + COALESCE(octet_length(t.payload_bytes), 0)) AS bytes,
           -- jsonb refuses "\u0000" without saying which message holds
           -- it: a batch that may hold one is named below (the text is
           -- also in an escaped backslash, "\\u0000", which jsonb takes;
           -- E'': the same text whatever standard_conforming_strings says).
           pg_catalog.min(t.ordinality) FILTER (WHERE
               pg_catalog.strpos(t.payload_json, E'\\u0000') > 0) AS nul,
           -- Whether a month or day field is set: the binary form of an
           -- interval (interval_send) is its time (8 bytes), days (4) and
           -- months (4). Exact, where a comparison is not ('1 day' =
           -- '24 hours'), and cheaper than date_part, which parses its
           -- unit's name at every call.
           pg_catalog.bool_or(
               pg_catalog.substr(pg_catalog.interval_send(t.delay), 9)
                   <> pg_catalog.decode('0000000000000000', 'hex')
               OR pg_catalog.substr(pg_catalog.interval_send(t.retry_backoff), 9)
                   <> pg_catalog.decode('0000000000000000', 'hex')
               OR pg_catalog.substr(pg_catalog.interval_send(t.commit_interval), 9)
                   <> pg_catalog.decode('0000000000000000', 'hex')) AS days,
           pg_catalog.count(DISTINCT t.id) AS ids,
           pg_catalog.bool_or(t.ordered) AS ordered,
           -- For the counters and the wake-ups (below): is the batch on one
           -- channel (byte order: no locale's rules), how many are ordered.
           pg_catalog.min(t.channel_name COLLATE "C") AS first_name,
           pg_catalog.max(t.channel_name COLLATE "C") AS last_name,
           -- (and on one chain key: one cursor for the log)
           pg_catalog.min(COALESCE(t.channel_args, '') COLLATE "C") AS first_args,
           pg_catalog.max(COALESCE(t.channel_args, '') COLLATE "C") AS last_args,
           pg_catalog.count(*) FILTER (WHERE t.ordered) AS waiting,
           -- Whether every message needs only its first delivery: the log
           -- takes the batch (below).
           pg_catalog.bool_and(t.ordered IS NOT TRUE
                               AND COALESCE(t.delay, interval '0') <= interval '0'
                               AND t.commit_interval IS NULL) AS plain
    INTO pass
    FROM unnest(new_messages) WITH ORDINALITY AS t;
    IF pass.bad IS NOT NULL THEN
        PERFORM _mq_insert_refuse(new_messages[pass.bad], pass.bad::int);
    END IF;
    IF pass.bytes > lim.max_batch_payload THEN
        RAISE EXCEPTION 'mq_insert: the batch''s payloads are % bytes in all, over the limit of % (256 MiB): split the batch',
            pass.bytes, lim.max_batch_payload
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF pass.nul IS NOT NULL THEN
        PERFORM _mq_check_json(new_messages);
    END IF;
    -- Shapes and duplicate ids, named (_mq_insert_check).
    IF array_ndims(new_messages) > 1 OR array_ndims(priorities) > 1
       OR pass.ids < cardinality(new_messages) THEN
        PERFORM _mq_insert_check(new_messages, priorities);
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
    -- Months count 30 days and days 24 hours in the timestamps computed
    -- below (see _mq_fixed_length). Only a batch with a month or day field
    -- in it is rewritten: the C library sends none.
    IF pass.days THEN
        new_messages := ARRAY(
            SELECT ROW(t.id, _mq_fixed_length(t.delay), t.retries,
                       _mq_fixed_length(t.retry_backoff), t.channel_name,
                       t.channel_args, _mq_fixed_length(t.commit_interval), t.ordered,
                       t.name, t.payload_json, t.payload_bytes)::mq_new_t
            FROM unnest(new_messages) WITH ORDINALITY AS t
            ORDER BY t.ordinality);
    END IF;

    -- Only what the caller takes (mq_insert_unique: not the messages whose
    -- key another message holds), checked above with the rest.
    IF take IS NOT NULL THEN
        SELECT COALESCE(array_agg(new_messages[t.o] ORDER BY t.o), '{}'),
               COALESCE(array_agg(unique_keys[t.o] ORDER BY t.o), '{}'),
               COALESCE(array_agg(priorities[t.o] ORDER BY t.o), '{}'),
               COALESCE(bool_or(new_messages[t.o].ordered), false),
               min(new_messages[t.o].channel_name COLLATE "C"),
               max(new_messages[t.o].channel_name COLLATE "C"),
               count(*) FILTER (WHERE new_messages[t.o].ordered)
        INTO new_messages, unique_keys, priorities, pass.ordered, pass.first_name,
             pass.last_name, pass.waiting
        FROM generate_subscripts(new_messages, 1) AS t(o)
        WHERE take[t.o];
        IF cardinality(new_messages) = 0 THEN
            RETURN;
        END IF;
    END IF;

    IF pass.ordered THEN
        -- Each ordered message's place in its chain: the chains' locks
        -- first, then the places, so a later producer of a chain gets later
        -- ones; within the batch, array order. Nothing of the chain is read
        -- or written: its head is whatever entry comes first.
        PERFORM _mq_lock_new_chains(new_messages);
        base := nextval('mq_chain_seq');
    END IF;

    -- A batch of messages that need nothing but their first delivery
    -- (unordered, no delay, committed, priority 0, no unique key) is
    -- appended to the log: one row a message, never updated (DESIGN.md,
    -- Storage). Any other batch is written to mq_rows whole.
    IF pass.plain AND unique_keys IS NULL
       AND (priorities IS NULL
            OR NOT EXISTS (SELECT 1 FROM unnest(priorities) AS p WHERE p > 0))
       AND current_setting('pqmq.citus', true) IS DISTINCT FROM 'on' THEN
        base := nextval('mq_log_place');
        -- An id mq_rows holds (the log's unique index covers the log only).
        SELECT m.id INTO bad FROM mq_rows m
        WHERE m.id = ANY (ARRAY(SELECT t.id FROM unnest(new_messages) AS t))
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'duplicate key value violates unique constraint "mq_log_id"'
                USING ERRCODE = 'unique_violation',
                      DETAIL = format('Key (id)=(%s) already exists.', bad.id);
        END IF;
        INSERT INTO mq_log (place, channel_key, id, created_at, attempts, retry_backoff,
                            channel_name, channel_args, name, payload_json, payload_bytes)
        SELECT base + t.ordinality,
               (hashtext(t.channel_name)::bigint << 32)
                   | (hashtext(COALESCE(t.channel_args, ''))::bigint & 4294967295),
               t.id, ts, LEAST(COALESCE(t.retries, 4)::bigint + 1, 2147483647)::int,
               COALESCE(t.retry_backoff, interval '1 second'),
               t.channel_name, COALESCE(t.channel_args, ''), COALESCE(t.name, ''),
               t.payload_json::jsonb, t.payload_bytes
        FROM unnest(new_messages) WITH ORDINALITY AS t;
        -- The batch's channels without a cursor (a probe a channel of
        -- mq_cursor_keys; a new channel, or one whose cursor a sweep
        -- retired) get one.
        IF pass.first_name = pass.last_name
           AND pass.first_args IS NOT DISTINCT FROM pass.last_args THEN
            SELECT ARRAY[k.key], ARRAY[t.channel_name], ARRAY[COALESCE(t.channel_args, '')]
            INTO new_keys, new_names, new_args
            FROM unnest(new_messages[1:1]) AS t
            CROSS JOIN LATERAL (SELECT (hashtext(t.channel_name)::bigint << 32)
                                       | (hashtext(COALESCE(t.channel_args, ''))::bigint
                                          & 4294967295) AS key) k
            -- (a probe whatever ANALYZE saw: a scalar subquery)
            WHERE (SELECT c.channel_key FROM mq_cursor_keys c WHERE c.channel_key = k.key) IS NULL;
        ELSE
            SELECT array_agg(d.key ORDER BY d.key), array_agg(d.channel_name ORDER BY d.key),
                   array_agg(d.args ORDER BY d.key)
            INTO new_keys, new_names, new_args
            FROM (SELECT DISTINCT ON (k.key) k.key, t.channel_name,
                         COALESCE(t.channel_args, '') AS args
                  FROM unnest(new_messages) AS t
                  CROSS JOIN LATERAL (SELECT (hashtext(t.channel_name)::bigint << 32)
                                             | (hashtext(COALESCE(t.channel_args, ''))::bigint
                                                & 4294967295) AS key) k
                  ORDER BY k.key) d
            WHERE (SELECT c.channel_key FROM mq_cursor_keys c WHERE c.channel_key = d.key) IS NULL;
        END IF;
        IF new_keys IS NOT NULL THEN
            PERFORM _mq_log_add_cursors(new_keys, new_names, new_args);
        END IF;
    ELSE
        PERFORM _mq_insert_msgs(new_messages, ts, unique_keys, key_retention, priorities, base);
    END IF;

    IF pass.first_name = pass.last_name THEN
        -- A batch on one channel (the common case) does _mq_count_batch's and
        -- _mq_wake's work here: a call of a function that pins settings costs
        -- more than these statements, a large part of a one-message insert
        -- (bench/insert_instructions.sh). Same statements.
        INSERT INTO mq_count_batches (sign, names, totals, waits)
        VALUES (1, ARRAY[pass.first_name], ARRAY[cardinality(new_messages)],
                ARRAY[pass.waiting::int]);
        IF pg_catalog.random() < 0.004 THEN
            PERFORM _mq_count_fold();
        END IF;
        IF octet_length(pass.first_name) <= 60 THEN
            PERFORM pg_notify('mq_' || pass.first_name, '');
        END IF;
        PERFORM pg_notify('mq', '');
    ELSE
        SELECT array_agg(t.channel_name), array_agg(CASE WHEN t.ordered THEN 1 ELSE 0 END)
        INTO names, ords
        FROM unnest(new_messages) AS t;
        PERFORM _mq_count_batch(1, names, array_fill(1, ARRAY[cardinality(names)]), ords);
        PERFORM _mq_wake(names);
    END IF;
END;
$$;

-- Writes a batch into mq_rows (_mq_insert_rows, for a batch the log does
-- not take): base is the batch's first place in chains (NULL: no ordered
-- message).
CREATE OR REPLACE FUNCTION _mq_insert_msgs(new_messages mq_new_t[], ts timestamptz,
                                           unique_keys text[], key_retention interval,
                                           priorities int[], base bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    bad record;
BEGIN
    IF current_setting('pqmq.citus', true) = 'on' THEN
        -- Citus copies the rows of the insert below to the worker, and a
        -- duplicate id fails there without its SQLSTATE: found here first,
        -- in the queue (the batch's own were named above; a race with
        -- another producer of the same id still fails, as XX000).
        SELECT m.id INTO bad FROM mq_rows m
        WHERE m.id = ANY (ARRAY(SELECT t.id FROM unnest(new_messages) AS t))
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'duplicate key value violates unique constraint "mq_msgs_pkey"'
                USING ERRCODE = 'unique_violation',
                      DETAIL = format('Key (id)=(%s) already exists.', bad.id);
        END IF;
    END IF;
    -- channel_key is written here rather than by the table (a stored
    -- generated column formed every row twice), and so are the counters
    -- (mq_counts): one delta row for the batch (_mq_count_batch), where a
    -- trigger copied every row into a transition table to count it.
    INSERT INTO mq_rows (id, created_at, attempt_at, attempts, retry_backoff,
                         channel_name, channel_args, commit_interval, after_message_id,
                         ready_at, name, payload_json, payload_bytes, unique_key,
                         key_retention, priority, chain_seq, channel_key)
    SELECT t.id, ts, r.at,
           LEAST(COALESCE(t.retries, 4)::bigint + 1, 2147483647)::int,
           COALESCE(t.retry_backoff, interval '1 second'),
           t.channel_name, COALESCE(t.channel_args, ''), t.commit_interval,
           -- The seed's mark of an ordered message (not a link: chains are
           -- kept by place).
           CASE WHEN t.ordered THEN '00000000-0000-0000-0000-000000000000'::uuid END,
           r.at, COALESCE(t.name, ''), t.payload_json::jsonb, t.payload_bytes,
           unique_keys[t.ordinality::int],
           CASE WHEN unique_keys[t.ordinality::int] IS NOT NULL THEN key_retention END,
           COALESCE(priorities[t.ordinality::int], 0),
           CASE WHEN t.ordered THEN base + t.ordinality END,
           (hashtext(t.channel_name)::bigint << 32)
               | (hashtext(COALESCE(t.channel_args, ''))::bigint & 4294967295)
    FROM unnest(new_messages) WITH ORDINALITY AS t,
         LATERAL (SELECT ts + COALESCE(t.delay, interval '0')
                            + COALESCE(t.commit_interval, interval '0')) AS r(at);
    -- An id the log holds (its unique index covers the log only).
    SELECT l.id INTO bad FROM mq_log l
    WHERE l.id = ANY (ARRAY(SELECT t.id FROM unnest(new_messages) AS t))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'duplicate key value violates unique constraint "mq_msgs_pkey"'
            USING ERRCODE = 'unique_violation',
                  DETAIL = format('Key (id)=(%s) already exists.', bad.id);
    END IF;
END;
$$;

-- Second phase of a two-phase insert: the messages become ready at once
-- (or when their delay ends) and listeners are woken.
-- Parameters: msg_ids: messages inserted uncommitted.
-- Returns: nothing. Duty: produce.
CREATE OR REPLACE FUNCTION mq_commit(msg_ids uuid[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
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
        -- never behind a poll's low-water mark (_mq_low_mark).
        UPDATE mq_rows m SET
            -- (_mq_at: see schema/common.sql.)
            attempt_at = CASE WHEN m.deliveries = 0
                              THEN GREATEST(_mq_at(m.attempt_at, - m.commit_interval), ts)
                              ELSE m.attempt_at END,
            ready_at = CASE WHEN m.deliveries = 0
                            THEN GREATEST(_mq_at(m.attempt_at, - m.commit_interval), ts)
                            ELSE m.ready_at END,
            commit_interval = NULL
        WHERE m.id = ANY (msg_ids)
          AND m.commit_interval IS NOT NULL
        RETURNING m.channel_name
    )
    SELECT array_agg(DISTINCT c.channel_name) INTO chans FROM c;
    PERFORM _mq_wake(chans);
END;
$$;

-- Names what is wrong with message ord of a batch (_mq_insert_rows found
-- it bad) and refuses the batch.
CREATE OR REPLACE FUNCTION _mq_insert_refuse(m mq_new_t, ord int)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    lim record := _mq_limits();
BEGIN
    RAISE EXCEPTION 'mq_insert: message % of the batch: %', ord, CASE
        WHEN m.id IS NULL THEN 'id is NULL'
        WHEN m.id = '00000000-0000-0000-0000-000000000000'::uuid
            THEN 'id is the nil UUID'
        WHEN m.channel_name IS NULL THEN 'channel_name is NULL'
        WHEN octet_length(m.channel_name) > lim.max_text
            THEN format('channel_name is over %s bytes', lim.max_text)
        WHEN octet_length(m.channel_args) > lim.max_text
            THEN format('channel_args is over %s bytes', lim.max_text)
        WHEN octet_length(m.name) > lim.max_text
            THEN format('name is over %s bytes', lim.max_text)
        WHEN m.retries < 0 THEN 'retries is negative'
        WHEN m.delay < interval '0' THEN 'delay is negative'
        WHEN m.delay > lim.max_duration THEN 'delay is over 36500000 days'
        WHEN m.retry_backoff < interval '0' THEN 'retry_backoff is negative'
        WHEN m.retry_backoff > lim.max_duration THEN 'retry_backoff is over 36500000 days'
        WHEN m.commit_interval < interval '0' THEN 'commit_interval is negative'
        WHEN m.commit_interval > lim.max_duration
            THEN 'commit_interval is over 36500000 days'
        WHEN octet_length(m.payload_json) > lim.max_payload THEN 'payload_json is over 16 MiB'
        ELSE 'payload_bytes is over 16 MiB' END
        USING ERRCODE = 'invalid_parameter_value';
END;
$$;

-- _mq_insert_rows' checks of a batch's shape: one-dimensional arrays (one
-- subscript of a 2-D array reads NULL: every priority would be 0), and no
-- id twice (which the primary key would report without saying that both
-- are in the batch, or which messages they are).
CREATE OR REPLACE FUNCTION _mq_insert_check(new_messages mq_new_t[], priorities int[])
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
