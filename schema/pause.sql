-- schema/pause.sql: pausing a channel (the mq_paused table in
-- schema/tables.sql). A pause names a channel (every args of that name);
-- while it lasts no poll lane delivers the channel's messages: the lease
-- lane and lane 2 (mq_claim_lane), the locked lane (mq_claim_locked), the
-- log's claim (_mq_log_claim), mq_rows' pick (_mq_pick_set and its walks)
-- and what an empty poll answers (_mq_wait_time). Inserts, completions,
-- failures and keep-alives go on as usual.

-- A channel name given to mq_pause or mq_resume: neither NULL nor empty.
CREATE OR REPLACE FUNCTION _mq_pause_name(fn text, channel_name text)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF channel_name IS NULL OR channel_name = '' THEN
        RAISE EXCEPTION '%: the channel name is NULL or empty', fn
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A pause names one channel (every args of it).';
    END IF;
END;
$$;

-- Pauses a channel: no poll delivers its messages until mq_resume. A name
-- with no message yet may be paused (its first messages then wait). Pausing
-- a paused channel keeps its first pause (time, role and reason).
-- Parameters: channel_name; reason (NULL: none), shown by pqmq status.
-- Returns: whether the channel was not paused before. Duty: administer.
CREATE OR REPLACE FUNCTION mq_pause(channel_name text, reason text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    n int;
BEGIN
    PERFORM _mq_pause_name('mq_pause', channel_name);
    INSERT INTO mq_paused AS p (channel_name, paused_at, paused_by, reason)
    VALUES (mq_pause.channel_name, clock_timestamp(), session_user, mq_pause.reason)
    ON CONFLICT ON CONSTRAINT mq_paused_pkey DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n > 0;
END;
$$;

-- Resumes a paused channel, and wakes its listeners as an insert does
-- (_mq_wake), so that sleeping runners poll at once.
-- Parameters: channel_name.
-- Returns: whether the channel was paused. Duty: administer.
CREATE OR REPLACE FUNCTION mq_resume(channel_name text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    n int;
BEGIN
    PERFORM _mq_pause_name('mq_resume', channel_name);
    DELETE FROM mq_paused p WHERE p.channel_name = mq_resume.channel_name;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM _mq_wake(ARRAY[mq_resume.channel_name]);
    END IF;
    RETURN n > 0;
END;
$$;

-- The paused channels, for the dashboard and pqmq status.
-- Parameters: none.
-- Returns: one row per paused channel name: when, by whom, why.
--   Duty: administer.
CREATE OR REPLACE FUNCTION mq_paused_channels()
RETURNS TABLE(channel_name text, paused_at timestamptz, paused_by name, reason text)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    SELECT p.channel_name, p.paused_at, p.paused_by, p.reason
    FROM mq_paused p
    ORDER BY p.channel_name;
$$;
