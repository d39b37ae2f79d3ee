-- schema/complete.sql: completing: deleting finished messages (fenced by attempt), completing and
-- claiming in one statement, and handing claimed messages back unstarted.

-- mq_delete that returns how many messages it deleted. With msg_attempts
-- (one per id: the attempt number the consumer got) a message is deleted
-- only if it is still on that attempt: a consumer whose lease ran out and
-- whose message was delivered again cannot complete it for the new owner.
-- A consumer completing inside its own transaction rolls back on a short
-- count.
-- Parameters: msg_ids; msg_attempts: each id's attempt number (NULL: any
--   attempt).
-- Returns: how many it deleted. Duty: consume.
CREATE OR REPLACE FUNCTION mq_complete(msg_ids uuid[], msg_attempts int[] DEFAULT NULL)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    n       int;
    k       int;
    chans   text[];
    more    text[];
    by_id   uuid[]; -- msg_ids sorted, and their attempt numbers
    att     int[];
    logged  boolean;
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
    -- Logged messages (one mq_done row a receipt) are looked for first when
    -- the batch's first message is one: a batch is usually all in one
    -- table, and each table's search costs a probe an id.
    logged := current_setting('pqmq.citus', true) IS DISTINCT FROM 'on'
              AND EXISTS (SELECT 1 FROM mq_log l WHERE l.id = msg_ids[1]);
    n := CASE WHEN logged THEN _mq_log_complete(msg_ids, by_id, att) ELSE 0 END;
    -- Rows of mq_rows are found by id = ANY (an index condition whatever
    -- the statistics say; a join with the array could become a scan of the
    -- whole primary key after ANALYZE saw an empty table). A chain member
    -- needs nothing more: the next entry of its chain is the new head, and
    -- a poll that still sees this row (its snapshot is older, or this
    -- transaction has not committed) finds it in flight or locked and
    -- takes nothing of the chain. Messages without a key need no lock and
    -- go first; usually that is all there is.
    IF n < cardinality(msg_ids) THEN
        WITH gone AS (
            DELETE FROM mq_rows m
            WHERE m.id = ANY (msg_ids)
              AND m.unique_key IS NULL
              AND (msg_attempts IS NULL OR m.deliveries = att[width_bucket(m.id, by_id)])
            RETURNING m.chain_seq IS NOT NULL AS ordered, m.channel_name
        )
        SELECT count(*), array_agg(DISTINCT g.channel_name) FILTER (WHERE g.ordered)
        INTO k, chans
        FROM gone g;
        n := n + k;
    END IF;
    IF n < cardinality(msg_ids) AND NOT logged THEN
        n := n + _mq_log_complete(msg_ids, by_id, att);
    END IF;
    IF n < cardinality(msg_ids) THEN
        -- Keyed messages release their keys: take the keys' locks in key
        -- order first, as producers do (_mq_lock_keys), against deadlock.
        PERFORM _mq_lock_keys(msg_ids);
        WITH gone AS (
            DELETE FROM mq_rows m
            WHERE m.id = ANY (msg_ids)
              AND m.unique_key IS NOT NULL
              AND (msg_attempts IS NULL OR m.deliveries = att[width_bucket(m.id, by_id)])
            RETURNING m.chain_seq IS NOT NULL AS ordered, m.channel_name
        )
        SELECT count(*), array_agg(DISTINCT g.channel_name) FILTER (WHERE g.ordered)
        INTO k, more
        FROM gone g;
        n := n + k;
        chans := chans || more;
    END IF;
    -- A logged message no claim has reached: deleted unfenced (a producer's
    -- cancellation, an operator's purge).
    IF n < cardinality(msg_ids) AND msg_attempts IS NULL THEN
        n := n + _mq_log_forget(msg_ids);
    END IF;
    -- A chain moved on: its next member may be ready now.
    IF chans IS NOT NULL THEN
        PERFORM _mq_wake(chans);
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
-- Parameters: msg_ids; msg_attempts: each id's attempt number.
-- Returns: how many it completed, or SQLSTATE PQ001. Duty: consume.
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
-- Parameters: msg_ids.
-- Returns: nothing. Duty: consume, administer.
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
-- Parameters: msg_ids, msg_attempts: as mq_complete; channel_names (NULL:
--   every channel), batch_size: as mq_claim.
-- Returns: mq_claim's rows, each with how many were completed. Duty: consume.
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
-- Parameters: as mq_complete_claim.
-- Returns: mq_complete_claim's rows as flat columns. Duty: consume.
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
-- Parameters: msg_ids; msg_attempts: each id's attempt number.
-- Returns: how many it released. Duty: consume.
CREATE OR REPLACE FUNCTION mq_release(msg_ids uuid[], msg_attempts int[])
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts    timestamptz := clock_timestamp();
    n     int;
    chans text[];
    by_id uuid[]; -- as in mq_complete
    att   int[];
BEGIN
    -- A logged message moves to mq_rows first, in its delivery's state.
    PERFORM _mq_log_move(msg_ids, ts);
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
        UPDATE mq_rows m SET
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
    PERFORM _mq_wake(chans);
    RETURN n;
END;
$$;
