-- schema/story.sql: one message's story, for operators (pqmq show, the
-- dashboard's message page): its state, channel and chain, its place in the
-- chain, its attempts and their errors, and a preview of its payload.
--
-- The history of failed attempts is a column of mq_rows (history,
-- schema/tables.sql): the failure paths append to it (mq_fail, and
-- mq_reap_dead when a final lease ran out); nothing on the claim or the
-- completion path writes it. A logged message that fails moves to mq_rows
-- first (_mq_log_move), so its history starts there. A lease that ran out
-- with attempts left is not an entry: the message is simply delivered
-- again, by a claim, which writes nothing more.

-- h, a history, with one more failed attempt (its number, time and error, the
-- error cut to 2000 characters), keeping the last five, oldest first. A
-- history that is not an array (written by hand) starts again. The time is
-- written in UTC ("...Z"), so the answer depends on the arguments only:
-- IMMUTABLE, which Citus requires of a function of a row's columns in an
-- UPDATE it ships to a worker.
CREATE OR REPLACE FUNCTION _mq_history_add(h jsonb, att int, at_ts timestamptz, err text)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$
    SELECT pg_catalog.jsonb_agg(e.v ORDER BY e.i)
    FROM (SELECT x.v, x.i
          FROM pg_catalog.jsonb_array_elements(
                   CASE WHEN pg_catalog.jsonb_typeof(h) = 'array' THEN h ELSE '[]'::jsonb END
                   || pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
                          'attempt', att,
                          'at', (pg_catalog.to_jsonb(at_ts AT TIME ZONE 'UTC') #>> '{}') || 'Z',
                          'error', pg_catalog.left(err, 2000))))
               WITH ORDINALITY AS x(v, i)
          ORDER BY x.i DESC
          LIMIT 5) e
$$;

-- One message's story, as of now. state is one of
--   ready        may be delivered now (a job the locked lane holds in an
--                open transaction shows as ready too)
--   in_flight    delivered, its lease running (until ready_at)
--   delayed      waiting for its delay or its retry's backoff (until ready_at)
--   waiting      an ordered message behind others of its chain
--                (chain_ahead of them, the first being chain_head)
--   dead         out of attempts (or skipped out of its chain) since dead_since
--   uncommitted  a two-phase message not yet committed (mq_commit)
-- ordered: a member of the chain (channel_name, channel_args), chain_ahead
-- the live members before it (0: its head), chain_head the first of them
-- (itself when it is the head); NULL for an unordered message.
-- attempts_used: deliveries made; attempts_left: deliveries it may still
-- get. history: the last five failed attempts, oldest first, each
-- {"attempt", "at", "error"} (NULL: none failed). logged: held by the log
-- (never failed, moved or delayed: DESIGN.md, Storage).
-- Parameters: msg_id.
-- Returns: one row, or none when no such message is live (completed,
--   deleted or never inserted). Duty: administer.
CREATE OR REPLACE FUNCTION mq_message(msg_id uuid)
RETURNS TABLE(id uuid, state text, channel_name text, channel_args text, name text,
              ordered boolean, chain_ahead int, chain_head uuid, priority int,
              created_at timestamptz, ready_at timestamptz, dead_since timestamptz,
              attempts_used int, attempts_left int, last_error text, history jsonb,
              logged boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts    timestamptz;
    m     record;
    ahead int;
    head  uuid;
    st    text;
BEGIN
    IF msg_id IS NULL THEN
        RAISE EXCEPTION 'mq_message: msg_id is NULL'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A final lease that ran out is dead, as mq_dead_letters lists it.
    PERFORM mq_reap_dead();
    ts := clock_timestamp();
    SELECT v.*, NOT EXISTS (SELECT 1 FROM mq_rows r WHERE r.id = msg_id) AS in_log
    INTO m FROM mq_msgs v WHERE v.id = msg_id LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF m.chain_seq IS NOT NULL THEN
        -- mq_msgs_chain: the chain's entries before this one, dead ones
        -- included (a dead head blocks its chain).
        SELECT count(*)::int, (array_agg(f.id ORDER BY f.chain_seq))[1] INTO ahead, head
        FROM mq_rows f
        WHERE f.chain_seq IS NOT NULL
          AND f.channel_key = m.channel_key
          AND f.chain_seq < m.chain_seq
          AND f.channel_name = m.channel_name
          AND f.channel_args = m.channel_args;
        head := COALESCE(head, m.id);
    END IF;
    st := CASE
        WHEN m.dead_since IS NOT NULL THEN 'dead'
        WHEN m.deliveries = 0 AND m.commit_interval IS NOT NULL THEN 'uncommitted'
        WHEN ahead > 0 THEN 'waiting'
        WHEN m.attempt_at <= ts THEN 'ready'
        WHEN m.deliveries > 0
             AND (m.ready_at < m.attempt_at OR m.ready_at = 'infinity'::timestamptz)
            THEN 'in_flight'
        ELSE 'delayed' END;
    RETURN QUERY SELECT
        m.id, st, m.channel_name, m.channel_args, m.name, m.chain_seq IS NOT NULL, ahead, head,
        m.priority::int, m.created_at,
        CASE WHEN st IN ('dead', 'uncommitted') THEN NULL ELSE m.attempt_at END,
        m.dead_since, m.deliveries, m.attempts, m.last_error, m.history, m.in_log;
END;
$$;

-- The start of a message's payload, for an operator to look at: the JSON
-- payload's text and the binary payload's bytes (as hex), each cut to at
-- most max_bytes bytes (the JSON at a character's end), with their whole
-- sizes. Payloads may hold what only administrators should see: this
-- function belongs to that duty alone.
-- Parameters: msg_id; max_bytes: 1..1048576.
-- Returns: one row, or none when no such message is live. Duty: administer.
CREATE OR REPLACE FUNCTION mq_message_payload(msg_id uuid, max_bytes int DEFAULT 1024)
RETURNS TABLE(id uuid, json_bytes int, json_preview text, binary_bytes int,
              binary_preview_hex text, truncated boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    j text;
    b bytea;
    p text;
    n int;
BEGIN
    IF msg_id IS NULL OR max_bytes IS NULL OR max_bytes < 1 OR max_bytes > 1048576 THEN
        RAISE EXCEPTION 'mq_message_payload: msg_id is NULL or max_bytes % is outside 1..1048576',
            max_bytes
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT v.payload_json::text, v.payload_bytes INTO j, b
    FROM mq_msgs v WHERE v.id = msg_id LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- Whole characters only: drop characters until the bytes fit.
    n := max_bytes;
    p := left(j, n);
    WHILE octet_length(p) > max_bytes LOOP
        n := n - GREATEST(1, (octet_length(p) - max_bytes) / 4);
        p := left(j, n);
    END LOOP;
    RETURN QUERY SELECT
        msg_id, octet_length(j), p, length(b), encode(substring(b FROM 1 FOR max_bytes), 'hex'),
        COALESCE(octet_length(j) > max_bytes, false) OR COALESCE(length(b) > max_bytes, false);
END;
$$;

-- The messages of channel waiting in their chains behind others (a chain
-- blocked by a dead head first, then by chain args and place): each with
-- how many members are ahead of it, its chain's head and whether that head
-- is dead. The dashboard lists them; mq_skip moves one on.
-- Parameters: channel; max_rows: 1..10000.
-- Returns: the waiting members, at most max_rows. Duty: administer.
CREATE OR REPLACE FUNCTION mq_waiting(channel text, max_rows int DEFAULT 100)
RETURNS TABLE(id uuid, channel_args text, name text, chain_ahead int, chain_head uuid,
              head_dead boolean, created_at timestamptz)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > (_mq_limits()).max_batch THEN
        RAISE EXCEPTION 'mq_waiting: max_rows % is outside 1..%',
            max_rows, (_mq_limits()).max_batch
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    SELECT w.id, w.channel_args, w.name, w.ahead::int, w.head, w.head_dead, w.created_at
    FROM (
        -- mq_msgs_chain: the channel's range of chain keys.
        SELECT m.id, m.channel_args, m.name, m.created_at, m.chain_seq,
               pg_catalog.row_number() OVER k - 1 AS ahead,
               pg_catalog.first_value(m.id) OVER k AS head,
               pg_catalog.first_value(m.dead_since IS NOT NULL) OVER k AS head_dead
        FROM mq_rows m
        WHERE m.chain_seq IS NOT NULL
          AND m.channel_key >= (pg_catalog.hashtext(channel)::bigint << 32)
          AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32) | 4294967295)
          AND m.channel_name = channel
        WINDOW k AS (PARTITION BY m.channel_key, m.channel_args ORDER BY m.chain_seq)) w
    WHERE w.ahead > 0
    ORDER BY w.head_dead DESC, w.channel_args, w.chain_seq
    LIMIT max_rows;
END;
$$;
