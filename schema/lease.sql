-- schema/lease.sql: leases of messages in flight: keep-alive, checkpoint, failure.
--
-- A lease holder is told from a failed message waiting for its retry (both
-- have attempt_at in the future) by the message's place: a claim leaves
-- ready_at where it was, at or before the claim, and a keep-alive or
-- checkpoint puts it a microsecond before the new attempt_at (a final
-- attempt stays at 'infinity'); a failure puts it at attempt_at, as does
-- an insert's delay. So a message is leased when attempt_at is in the future
-- and ready_at < attempt_at or ready_at = 'infinity' (and it has been
-- delivered): nothing is written for it on the hot path.

-- Where a lease given now (ts) for duration ends: months count 30 days and
-- days 24 hours (_mq_fixed_length), and a client that doubles its keep-alive
-- (sqlxmq's runner does) reaches any limit in time, so longer durations are
-- cut to the longest lease, not refused. A NULL or negative duration is
-- refused in the name of the caller (fn).
CREATE OR REPLACE FUNCTION _mq_lease_end(fn text, ts timestamptz, duration interval)
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    duration := _mq_fixed_length(duration);
    IF duration IS NULL OR duration < interval '0' THEN
        RAISE EXCEPTION '%: duration % is NULL or negative', fn, duration
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN ts + LEAST(duration, (_mq_limits()).max_duration);
END;
$$;

-- Pushes the lease of in-flight messages (or the commit deadline of pending
-- two-phase messages) to now + duration. Never shortens a lease, and never
-- touches a message whose lease already ran out: that one belongs to the
-- next poll (or, with no attempts left, is dead and stays dead).
-- Parameters: msg_ids; duration: the new lease, from now.
-- Returns: nothing. Duty: consume.
CREATE OR REPLACE FUNCTION mq_keep_alive(msg_ids uuid[], duration interval)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM mq_keep_alive_count(msg_ids, duration);
END;
$$;

-- mq_keep_alive that reports how many messages it extended.
-- Parameters: msg_ids; duration: the new lease, from now.
-- Returns: how many it extended. Duty: consume.
CREATE OR REPLACE FUNCTION mq_keep_alive_count(msg_ids uuid[], duration interval)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts    timestamptz := clock_timestamp();
    n     int;
    k     int;
    until timestamptz;
BEGIN
    -- Computed once, outside the statement (which Citus then ships whole).
    until := _mq_lease_end('mq_keep_alive', ts, duration);
    -- Logged messages: their receipts keep them (_mq_log_keep_alive).
    n := _mq_log_keep_alive(msg_ids, until, ts);
    IF n = cardinality(msg_ids) THEN
        RETURN n;
    END IF;
    -- SKIP LOCKED: a row locked by a consumer's open transaction is not
    -- waited for (pollers skip it too, so it cannot be redelivered meanwhile).
    -- A kept-alive message is a long one: it moves out of the polls' way
    -- (ready_at, just before the lease's end: still leased, see the top of
    -- this file), a final attempt stays at 'infinity'. A message waiting
    -- for its retry or its delay is not leased, and is left alone.
    UPDATE mq_rows m SET
        attempt_at = until,
        commit_interval = CASE WHEN m.deliveries = 0 AND m.commit_interval IS NOT NULL
                               THEN m.commit_interval + (until - m.attempt_at)
                               ELSE m.commit_interval END,
        ready_at = CASE WHEN m.ready_at = 'infinity'::timestamptz THEN m.ready_at
                        ELSE _mq_at(until, interval '-1 microsecond') END
    WHERE m.id = ANY (ARRAY(SELECT l.id FROM mq_rows l
                            WHERE l.id = ANY (msg_ids)
                              AND l.attempt_at > ts
                              AND l.attempt_at < until
                              AND (l.ready_at < l.attempt_at
                                   OR l.ready_at = 'infinity'::timestamptz
                                   OR (l.deliveries = 0 AND l.commit_interval IS NOT NULL))
                            FOR NO KEY UPDATE SKIP LOCKED));
    GET DIAGNOSTICS k = ROW_COUNT;
    RETURN n + k;
END;
$$;

-- Keep-alive plus progress: replaces the payload where a new one is given and
-- grants extra_retries more deliveries. Only a delivered message whose lease
-- is still running is touched, so a dead message is never revived, and a
-- failed one waiting for its retry is left as it is. The seed's form: the
-- sqlxmq crate calls it.
-- Parameters: msg_id; duration: the new lease; new_payload_json /
--   new_payload_bytes (NULL: keep); extra_retries.
-- Returns: nothing. Duty: consume.
CREATE OR REPLACE FUNCTION mq_checkpoint(msg_id uuid, duration interval,
                                         new_payload_json text,
                                         new_payload_bytes bytea,
                                         extra_retries int)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM mq_checkpoint_found(msg_id, duration, new_payload_json,
                                new_payload_bytes, extra_retries);
END;
$$;

-- The form before the attempt number: a call with five arguments would
-- match it and the one below.
DO $$
BEGIN
    IF pg_catalog.to_regprocedure(
           pg_catalog.quote_ident(pg_catalog.current_schema())
           OPERATOR(pg_catalog.||) '.mq_checkpoint_found(uuid, interval, text, bytea, integer)')
       IS NOT NULL THEN
        DROP FUNCTION mq_checkpoint_found(uuid, interval, text, bytea, int);
    END IF;
END
$$;

-- mq_checkpoint that reports whether the message was found holding a lease.
-- With an attempt number, only that delivery may checkpoint the message, as
-- only it may complete or fail it.
-- Parameters: as mq_checkpoint; msg_attempt: the delivery that holds the
--   lease (NULL: any).
-- Returns: whether the message held a lease. Duty: consume.
CREATE OR REPLACE FUNCTION mq_checkpoint_found(msg_id uuid, duration interval,
                                               new_payload_json text,
                                               new_payload_bytes bytea,
                                               extra_retries int,
                                               msg_attempt int DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts    timestamptz := clock_timestamp();
    until timestamptz;
BEGIN
    -- A logged message moves to mq_rows first, in its delivery's state.
    PERFORM _mq_log_move(ARRAY[msg_id], ts);
    until := _mq_lease_end('mq_checkpoint', ts, duration);
    IF extra_retries < 0 THEN
        RAISE EXCEPTION 'mq_checkpoint: extra_retries % is negative', extra_retries
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(new_payload_json) > (_mq_limits()).max_payload
       OR octet_length(new_payload_bytes) > (_mq_limits()).max_payload THEN
        RAISE EXCEPTION 'mq_checkpoint: payload is over 16 MiB'
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    UPDATE mq_rows m SET
        attempt_at = GREATEST(m.attempt_at, until),
        attempts = LEAST(m.attempts::bigint + COALESCE(extra_retries, 0),
                         2147483647)::int,
        -- Moves with the lease (just before its end: still leased), or
        -- stays at 'infinity' while no attempt is left.
        ready_at = CASE WHEN m.attempts::bigint + COALESCE(extra_retries, 0) = 0
                        THEN 'infinity'::timestamptz
                        ELSE _mq_at(GREATEST(m.attempt_at, until), interval '-1 microsecond') END,
        payload_json = COALESCE(new_payload_json::jsonb, m.payload_json),
        payload_bytes = COALESCE(new_payload_bytes, m.payload_bytes)
    WHERE m.id = msg_id
      AND m.deliveries > 0
      AND m.attempt_at > ts
      AND (m.ready_at < m.attempt_at OR m.ready_at = 'infinity'::timestamptz)
      AND (msg_attempt IS NULL OR m.deliveries = msg_attempt);
    RETURN FOUND;
END;
$$;

-- Records why an attempt failed and schedules the retry one backoff from now
-- (the backoff of the attempt that failed). With no attempts left the
-- message is dead at once: kept, never delivered again, announced on mq_dead.
-- Only a lease holder may fail it (a message waiting for its retry is left
-- as it is), and with an attempt number, only that delivery. A job of the
-- locked lane fails inside the transaction that holds it.
-- Parameters: msg_id; error: recorded as last_error and in the history (the
--   last five attempts, schema/story.sql); msg_attempt: the attempt that
--   failed (NULL: any).
-- Returns: whether a message was failed. Duty: consume.
CREATE OR REPLACE FUNCTION mq_fail(msg_id uuid, error text, msg_attempt int DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts   timestamptz := clock_timestamp();
    dead boolean;
    mine xid;
    -- Held by a locked-lane receipt: the move below writes it into mq_rows
    -- under the current subtransaction's xid (a savepoint's), not mine.
    held boolean := EXISTS (SELECT 1 FROM _mq_log_held(ARRAY[msg_id], false) h
                            WHERE h.lane = 1);
BEGIN
    -- A logged message moves to mq_rows first, in its delivery's state.
    PERFORM _mq_log_move(ARRAY[msg_id], ts);
    -- (_mq_at: see schema/common.sql.)
    UPDATE mq_rows m SET
        attempt_at = CASE WHEN m.attempts > 0
                          THEN _mq_at(ts, m.retry_backoff / 2)
                          ELSE ts END,
        dead_since = CASE WHEN m.attempts > 0 THEN NULL ELSE ts END,
        ready_at = CASE WHEN m.attempts > 0
                        THEN _mq_at(ts, m.retry_backoff / 2)
                        ELSE m.ready_at END,
        last_error = left(error, 10000),
        history = _mq_history_add(m.history, m.deliveries, ts, error)
    WHERE m.id = msg_id
      AND m.deliveries > 0
      AND m.attempt_at > ts
      AND (m.ready_at < m.attempt_at OR m.ready_at = 'infinity'::timestamptz)
      AND (msg_attempt IS NULL OR m.deliveries = msg_attempt)
    RETURNING m.attempts = 0 INTO dead;
    IF NOT FOUND THEN
        -- A locked delivery (mq_claim_locked) held by this transaction:
        -- its attempt is counted here, as a lease would have counted it.
        mine := (_mq_xact_id() & 4294967295)::text::xid;
        UPDATE mq_rows m SET
            attempts = m.attempts - 1,
            deliveries = m.deliveries + 1,
            first_claimed_at = COALESCE(m.first_claimed_at, ts),
            retry_backoff = CASE WHEN m.retry_backoff * 2 > (_mq_limits()).max_duration
                                 THEN m.retry_backoff ELSE m.retry_backoff * 2 END,
            attempt_at = CASE WHEN m.attempts > 1 THEN _mq_at(ts, m.retry_backoff) ELSE ts END,
            dead_since = CASE WHEN m.attempts > 1 THEN NULL ELSE ts END,
            ready_at = CASE WHEN m.attempts > 1 THEN _mq_at(ts, m.retry_backoff)
                            ELSE m.ready_at END,
            last_error = left(error, 10000),
            history = _mq_history_add(m.history, m.deliveries + 1, ts, error)
        WHERE m.id = msg_id
          AND m.attempt_at <= ts
          AND m.dead_since IS NULL
          AND m.attempts > 0
          AND (msg_attempt IS NULL OR m.deliveries = msg_attempt)
          -- (held by its row lock, or moved from the log's locked lane
          -- by this call: _mq_log_move)
          AND (m.xmax = mine OR (held AND m.deliveries = 0))
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
