-- schema/dead.sql: dead letters: messages that ran out of attempts; listing, retrying, skipping.

-- Marks the messages whose final lease ran out as dead and announces them
-- on mq_dead. Cheap (a tiny partial index); polls call it when idle, and
-- mq_dead_letters before listing. Returns how many it marked.
-- Parameters: none.
-- Returns: how many messages it marked dead. Duty: administer.
CREATE OR REPLACE FUNCTION mq_reap_dead()
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    citus   boolean := COALESCE(current_setting('pqmq.citus', true) = 'on', false); -- (no log)
    ts timestamptz := clock_timestamp();
    n  int;
BEGIN
    -- Logged messages whose leases ran out move to mq_rows first (a final
    -- attempt at 'infinity').
    IF NOT citus AND EXISTS (SELECT 1 FROM mq_receipts x
                             WHERE x.lease_until < 'infinity'::timestamptz
                               AND x.lease_until <= ts) THEN
        PERFORM _mq_log_reap(ts);
    END IF;
    -- Final attempts in flight wait at ready_at 'infinity' (mq_claim),
    -- chain heads' too: one range of mq_msgs_ready_by_time.
    -- The attempt joins the history (schema/story.sql); last_error stays
    -- the last error a consumer gave.
    UPDATE mq_rows m SET dead_since = m.attempt_at,
                         history = _mq_history_add(m.history, m.deliveries, m.attempt_at,
                                                   'lease ran out')
    WHERE m.id = ANY (ARRAY(
        SELECT l.id FROM mq_rows l
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
-- Parameters: channel_names (NULL: every channel); max_rows.
-- Returns: the dead messages, oldest first. Duty: administer.
CREATE OR REPLACE FUNCTION mq_dead_letters(channel_names text[], max_rows int DEFAULT 100)
RETURNS TABLE(id uuid, channel_name text, channel_args text, name text,
              attempts int, last_error text, dead_since timestamptz,
              blocking boolean, payload_json text, payload_bytes bytea)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > (_mq_limits()).max_batch THEN
        RAISE EXCEPTION 'mq_dead_letters: max_rows % is outside 1..%',
            max_rows, (_mq_limits()).max_batch
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM mq_reap_dead();
    RETURN QUERY
    SELECT m.id, m.channel_name, m.channel_args, m.name, m.deliveries,
           m.last_error, m.dead_since, m.chain_seq IS NOT NULL,
           m.payload_json::text, m.payload_bytes
    FROM mq_rows m
    WHERE m.dead_since IS NOT NULL
      AND (channel_names IS NULL OR m.channel_name = ANY (channel_names))
    ORDER BY m.dead_since, m.id
    LIMIT max_rows;
END;
$$;

-- Dead letters (mq_dead_letters) as jobs, for readers of mq_job_t: attempt
-- is the number of deliveries made; no lease, no wait.
-- Parameters: channel_names (NULL: every channel); max_rows.
-- Returns: the dead messages as mq_job_t rows. Duty: administer.
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
-- Parameters: msg_ids: dead messages; retries: retries beyond the one
--   delivery.
-- Returns: how many it revived. Duty: administer.
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
        UPDATE mq_rows m SET attempts = retries + 1, attempt_at = ts, dead_since = NULL,
                             ready_at = ts
        WHERE m.id = ANY (msg_ids) AND m.dead_since IS NOT NULL
        RETURNING m.id, m.channel_name, m.unique_key
    )
    SELECT count(*), array_agg(DISTINCT r.channel_name),
           array_agg(r.id) FILTER (WHERE r.unique_key IS NOT NULL)
    INTO n, chans, keyed FROM r;
    -- A live message holds its key again (schema/keys.sql).
    IF keyed IS NOT NULL THEN
        PERFORM _mq_retake_keys(keyed);
    END IF;
    PERFORM _mq_wake(chans);
    RETURN n;
END;
$$;

-- Moves ordered messages out of their chains into the dead letters (kept,
-- never delivered again) and releases the next message of each chain.
-- This is how a chain blocked by a dead head moves on.
-- Parameters: msg_ids: ordered messages.
-- Returns: how many it moved out of their chains. Duty: administer.
CREATE OR REPLACE FUNCTION mq_skip(msg_ids uuid[])
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
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
        UPDATE mq_rows m SET after_message_id = NULL, chain_seq = NULL, attempts = 0,
                             attempt_at = LEAST(m.attempt_at, ts),
                             dead_since = COALESCE(m.dead_since, ts)
        WHERE m.id = ANY (msg_ids) AND m.chain_seq IS NOT NULL
        RETURNING m.channel_name
    )
    SELECT count(*), array_agg(DISTINCT mv.channel_name) INTO n, chans FROM moved mv;
    IF n = 0 THEN
        RETURN 0;
    END IF;
    PERFORM _mq_wake(chans);
    PERFORM pg_notify('mq_dead', '');
    RETURN n;
END;
$$;

-- Deletes the messages of one channel (of one chain when channel_args is
-- not NULL; only dead ones when dead_only), whatever their state, and
-- returns what it deleted. Chains are repaired as by mq_complete (which it
-- calls), so nothing of another channel is touched. A consumer still
-- holding one of them finds it gone when it completes (ignored).
-- Parameters: channel; args: one chain's (NULL: all); dead_only.
-- Returns: one row per message deleted. Duty: administer.
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
    l_ids   uuid[];
    l_args  text[];
    l_names text[];
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
        FROM mq_rows m
        WHERE m.channel_name = channel
          AND (args IS NULL OR m.channel_args = args)
          AND (NOT COALESCE(dead_only, false) OR m.dead_since IS NOT NULL)
        FOR UPDATE OF m
    ) v;
    -- And the channel's live logged messages (mq_complete below completes
    -- or deletes each; none is dead).
    IF NOT COALESCE(dead_only, false) THEN
        SELECT pg_catalog.array_agg(l.id ORDER BY l.channel_args, l.id),
               pg_catalog.array_agg(l.channel_args ORDER BY l.channel_args, l.id),
               pg_catalog.array_agg(l.name ORDER BY l.channel_args, l.id)
        INTO l_ids, l_args, l_names
        FROM _mq_log_live(channel, args) l;
        IF l_ids IS NOT NULL THEN
            ids := COALESCE(ids, '{}') || l_ids;
            argss := COALESCE(argss, '{}') || l_args;
            names := COALESCE(names, '{}') || l_names;
            dead := COALESCE(dead, '{}') || array_fill(false, ARRAY[cardinality(l_ids)]);
        END IF;
    END IF;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    PERFORM mq_complete(ids);
    RETURN QUERY SELECT u.id, u.a, u.n, u.d
                 FROM unnest(ids, argss, names, dead) AS u(id, a, n, d);
END;
$$;
