-- schema/clear.sql: deleting whole channels (the original schema's mq_clear
-- and mq_clear_all).

-- Deletes every message of the given channels (all_channels: of every
-- channel), whatever its state: ready, delayed, uncommitted, held by a
-- consumer (whose completion then finds nothing: mq_complete counts 0), or
-- dead. Chains need no repair: a message a concurrent producer appends
-- (not yet visible here) stays, and heads what is left of its chain. The
-- nil UUID is never a message (the original kept a row for it; pqmq needs
-- none). Returns how many it deleted.
-- Parameters: channel_names: the channels to empty; all_channels: every
--   channel instead.
-- Returns: how many messages it deleted. Duty: administer.
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
        DELETE FROM mq_rows m
        WHERE (all_channels OR m.channel_name = ANY (channel_names))
          AND m.id <> '00000000-0000-0000-0000-000000000000'::uuid
        RETURNING m.id
    )
    SELECT pg_catalog.count(*) INTO n FROM gone;
    RETURN n + _mq_log_clear(channel_names, all_channels);
END;
$$;

-- The original's mq_clear: deletes the messages of the given channels.
-- Parameters: channel_names: the channels to empty.
-- Returns: nothing. Duty: administer.
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
-- Parameters: none.
-- Returns: nothing. Duty: administer.
CREATE OR REPLACE FUNCTION mq_clear_all()
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM mq_clear_count(NULL, true);
END;
$$;
