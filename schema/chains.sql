-- schema/chains.sql: ordered chains: their locks, their recorded tails, and repair after members leave.

-- Serializes producers (and mq_complete, mq_skip) per chain: the advisory
-- locks of the chains the batch appends to, in key order against deadlock.
CREATE OR REPLACE FUNCTION mq_lock_new_chains(new_messages mq_new_t[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(k.a, k.b)
    FROM (
        SELECT DISTINCT hashtext(t.channel_name) AS a,
                        hashtext(COALESCE(t.channel_args, '')) AS b
        FROM unnest(new_messages) AS t
        WHERE t.ordered
        ORDER BY 1, 2
    ) k;
END;
$$;

-- Records each touched chain's new tail: the batch's last message on it.
-- Called by mq_insert under the chains' locks. Each chain's row is found
-- by a probe of its key (a LATERAL index scan per chain) and then updated
-- by TID: a join of the batch's chains with mq_chains was a nested loop,
-- n² per batch.
CREATE OR REPLACE FUNCTION mq_record_tails(new_messages mq_new_t[])
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
    at_tid  tid[];  -- the chains' rows, sorted, and each one's new tail
    at_id   uuid[];
    new_n   text[]; -- chains with no row yet
    new_a   text[];
    new_id  uuid[];
BEGIN
    WITH last AS (
        SELECT DISTINCT ON (t.channel_name, COALESCE(t.channel_args, ''))
               t.channel_name, COALESCE(t.channel_args, '') AS args, t.id
        FROM unnest(new_messages) WITH ORDINALITY AS t
        WHERE t.ordered
        ORDER BY t.channel_name, COALESCE(t.channel_args, ''), t.ordinality DESC
    ),
    found AS (
        SELECT l.channel_name, l.args, l.id, c.ctid AS at
        FROM last l
        LEFT JOIN LATERAL (
            SELECT c.ctid FROM mq_chains c
            WHERE c.channel_key = ((hashtext(l.channel_name)::bigint << 32)
                                   | (hashtext(l.args)::bigint & 4294967295))
              AND c.channel_name = l.channel_name
              AND c.channel_args = l.args
            OFFSET 0 -- a probe per chain: never flattened into a join
        ) c ON true
    )
    SELECT array_agg(f.at ORDER BY f.at) FILTER (WHERE f.at IS NOT NULL),
           array_agg(f.id ORDER BY f.at) FILTER (WHERE f.at IS NOT NULL),
           array_agg(f.channel_name) FILTER (WHERE f.at IS NULL),
           array_agg(f.args) FILTER (WHERE f.at IS NULL),
           array_agg(f.id) FILTER (WHERE f.at IS NULL)
    INTO at_tid, at_id, new_n, new_a, new_id
    FROM found f;

    IF at_tid IS NOT NULL THEN
        UPDATE mq_chains c SET tail_id = COALESCE(at_id[width_bucket(c.ctid, at_tid)]) -- (see mq_unlink)
        WHERE c.ctid = ANY (at_tid);
    END IF;
    IF new_id IS NOT NULL THEN
        INSERT INTO mq_chains (channel_name, channel_args, tail_id)
        SELECT * FROM unnest(new_n, new_a, new_id);
    END IF;
END;
$$;

-- Takes the advisory locks of the chains the given messages belong to, in
-- key order (as mq_insert does): chain structure changes only under them.
CREATE OR REPLACE FUNCTION mq_lock_chains(msg_ids uuid[])
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
    a int[];
    b int[];
BEGIN
    -- Read first, locked after: on Citus a statement that reads the queue's
    -- tables runs on the worker that holds them, and these locks must be
    -- taken where mq_lock_new_chains takes them (where this function runs).
    SELECT array_agg(k.a ORDER BY k.a, k.b), array_agg(k.b ORDER BY k.a, k.b) INTO a, b
    FROM (
        SELECT DISTINCT hashtext(m.channel_name) AS a, hashtext(m.channel_args) AS b
        FROM mq_msgs m
        WHERE m.id = ANY (msg_ids) AND m.after_message_id IS NOT NULL
    ) k;
    PERFORM pg_advisory_xact_lock(k.a, k.b)
    FROM unnest(a, b) WITH ORDINALITY AS k(a, b, o)
    ORDER BY k.o;
END;
$$;

-- Repairs chains after members left them (deleted, or detached by mq_skip):
-- each successor is linked to its nearest predecessor that stayed, and a
-- chain's recorded tail moves back the same way (an emptied chain is
-- forgotten). Arrays: the members that left, with their old predecessor,
-- channel and args. Returns the channels whose chain got a new head.
-- Callers hold the chains' locks (mq_lock_chains).
CREATE OR REPLACE FUNCTION mq_unlink(g_id uuid[], g_after uuid[], g_name text[],
                                     g_args text[])
RETURNS text[]
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Index probes whatever ANALYZE last saw, and no JIT (DESIGN.md, Plans).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    r_id    uuid[];
    r_pred  uuid[];
    r_name  text[];
    r_args  text[];
    chans   text[];
    -- The members that left sorted by id, with their predecessors; then
    -- the same for what walk found: rows are matched to them by binary
    -- search (width_bucket), since joining the arrays was a nested loop,
    -- n² per batch.
    s_id    uuid[];
    s_after uuid[];
    o_id    uuid[];
    o_pred  uuid[];
    h_tid    tid[];  -- chain rows whose tail left: sorted, with the new tail
    h_pred   uuid[];
    gone_tid tid[];  -- chain rows of chains now empty
    nil      uuid := '00000000-0000-0000-0000-000000000000';
    ts       timestamptz;
BEGIN
    SELECT array_agg(u.id ORDER BY u.id), array_agg(u.after ORDER BY u.id)
    INTO s_id, s_after
    FROM unnest(g_id, g_after) AS u(id, after);

    -- Each member that left walks back over the members that left with it
    -- to the nearest predecessor that stayed.
    WITH RECURSIVE walk(id, pred, cn, ca) AS (
        SELECT u.id, u.after, u.cn, u.ca
        FROM unnest(g_id, g_after, g_name, g_args) AS u(id, after, cn, ca)
        UNION ALL
        SELECT w.id, s_after[width_bucket(w.pred, s_id)], w.cn, w.ca
        FROM walk w
        WHERE s_id[width_bucket(w.pred, s_id)] = w.pred
    )
    SELECT array_agg(w.id), array_agg(w.pred), array_agg(w.cn), array_agg(w.ca)
    INTO r_id, r_pred, r_name, r_args
    FROM walk w
    WHERE s_id[width_bucket(w.pred, s_id)] IS DISTINCT FROM w.pred;

    SELECT array_agg(u.id ORDER BY u.id), array_agg(u.pred ORDER BY u.id)
    INTO o_id, o_pred
    FROM unnest(r_id, r_pred) AS u(id, pred);

    ts := clock_timestamp(); -- a value, not a call in the statement (Citus)
    WITH moved AS (
        -- (COALESCE of one value: Citus's deparser takes an array element
        -- at the top of a SET inside WITH for an element assignment, and
        -- crashes.)
        UPDATE mq_msgs s SET after_message_id = COALESCE(o_pred[width_bucket(s.after_message_id,
                                                                             o_id)]),
            -- A new head joins the ready indexes no earlier than now, so
            -- never behind a poll's low-water mark (mq_low_mark).
            ready_at = CASE WHEN o_pred[width_bucket(s.after_message_id, o_id)]
                                 = '00000000-0000-0000-0000-000000000000'::uuid
                            THEN GREATEST(s.ready_at, ts)
                            ELSE s.ready_at END
        -- Found by after_message_id = ANY: an index condition on
        -- mq_msgs_successor, whose predicate follows.
        WHERE s.after_message_id = ANY (o_id)
          AND s.after_message_id IS NOT NULL
          AND s.after_message_id <> '00000000-0000-0000-0000-000000000000'::uuid
        RETURNING s.channel_name, s.after_message_id AS pred
    )
    SELECT array_agg(DISTINCT mv.channel_name) INTO chans
    FROM moved mv
    WHERE mv.pred = '00000000-0000-0000-0000-000000000000'::uuid;

    -- Chains whose recorded tail left: found by a probe of each chain's
    -- key, then handed back to the nearest predecessor that stayed, or
    -- forgotten when the chain emptied (by TID, as in mq_record_tails).
    SELECT array_agg(c.at ORDER BY c.at) FILTER (WHERE u.pred <> nil),
           array_agg(u.pred ORDER BY c.at) FILTER (WHERE u.pred <> nil),
           array_agg(c.at) FILTER (WHERE u.pred = nil)
    INTO h_tid, h_pred, gone_tid
    FROM unnest(r_id, r_pred, r_name, r_args) AS u(id, pred, cn, ca),
    LATERAL (
        SELECT c.ctid AS at FROM mq_chains c
        WHERE c.channel_key = ((hashtext(u.cn)::bigint << 32)
                               | (hashtext(u.ca)::bigint & 4294967295))
          AND c.channel_name = u.cn
          AND c.channel_args = u.ca
          AND c.tail_id = u.id
        OFFSET 0 -- a probe per chain: never flattened into a join
    ) c;
    IF h_tid IS NOT NULL THEN
        UPDATE mq_chains c SET tail_id = COALESCE(h_pred[width_bucket(c.ctid, h_tid)]) -- (above)
        WHERE c.ctid = ANY (h_tid);
    END IF;
    IF gone_tid IS NOT NULL THEN
        DELETE FROM mq_chains c WHERE c.ctid = ANY (gone_tid);
    END IF;
    RETURN chans;
END;
$$;
