-- schema/chains.sql: ordered chains: their locks, their recorded tails, and repair after members leave.
-- Today's definitions; the migrations that created them must carry the same
-- text (tests/test_migrate.c compares the two). See schema/tables.sql.

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
-- Called by mq_insert under the chains' locks.
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
BEGIN
    WITH last AS (
        SELECT DISTINCT ON (t.channel_name, COALESCE(t.channel_args, ''))
               t.channel_name, COALESCE(t.channel_args, '') AS args, t.id
        FROM unnest(new_messages) WITH ORDINALITY AS t
        WHERE t.ordered
        ORDER BY t.channel_name, COALESCE(t.channel_args, ''), t.ordinality DESC
    ),
    moved AS (
        UPDATE mq_chains c SET tail_id = l.id
        FROM last l
        -- The keys as an array: an index condition in any join order.
        WHERE c.channel_key = ANY (ARRAY(
                  SELECT (hashtext(k.channel_name)::bigint << 32)
                         | (hashtext(k.args)::bigint & 4294967295) FROM last k))
          AND c.channel_key = ((hashtext(l.channel_name)::bigint << 32)
                               | (hashtext(l.args)::bigint & 4294967295))
          AND c.channel_name = l.channel_name
          AND c.channel_args = l.args
        RETURNING c.channel_name, c.channel_args
    )
    INSERT INTO mq_chains (channel_name, channel_args, tail_id)
    SELECT l.channel_name, l.args, l.id
    FROM last l
    WHERE NOT EXISTS (SELECT 1 FROM moved mv
                      WHERE mv.channel_name = l.channel_name
                        AND mv.channel_args = l.args);
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
BEGIN
    PERFORM pg_advisory_xact_lock(k.a, k.b)
    FROM (
        SELECT DISTINCT hashtext(m.channel_name) AS a, hashtext(m.channel_args) AS b
        FROM mq_msgs m
        WHERE m.id = ANY (msg_ids) AND m.after_message_id IS NOT NULL
        ORDER BY 1, 2
    ) k;
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
BEGIN
    WITH RECURSIVE g AS (
        SELECT * FROM unnest(g_id, g_after, g_name, g_args) AS u(id, after, cn, ca)
    ),
    walk(id, pred, cn, ca) AS (
        SELECT g.id, g.after, g.cn, g.ca FROM g
        UNION ALL
        SELECT w.id, g.after, w.cn, w.ca FROM walk w JOIN g ON g.id = w.pred
    )
    SELECT array_agg(w.id), array_agg(w.pred), array_agg(w.cn), array_agg(w.ca)
    INTO r_id, r_pred, r_name, r_args
    FROM walk w
    WHERE NOT (w.pred = ANY (g_id));

    WITH moved AS (
        UPDATE mq_msgs s SET after_message_id = r.pred
        FROM unnest(r_id, r_pred) AS r(id, pred)
        WHERE s.after_message_id = r.id
          -- (the predicate of mq_msgs_successor, so that index is used)
          AND s.after_message_id IS NOT NULL
          AND s.after_message_id <> '00000000-0000-0000-0000-000000000000'::uuid
        RETURNING s.channel_name, r.pred
    )
    SELECT array_agg(DISTINCT mv.channel_name) INTO chans
    FROM moved mv
    WHERE mv.pred = '00000000-0000-0000-0000-000000000000'::uuid;

    WITH r AS (
        SELECT * FROM unnest(r_id, r_pred, r_name, r_args) AS u(id, pred, cn, ca)
    ),
    keys AS (
        SELECT array_agg((hashtext(r.cn)::bigint << 32)
                         | (hashtext(r.ca)::bigint & 4294967295)) AS k
        FROM r
    ),
    handed AS (
        UPDATE mq_chains c SET tail_id = r.pred
        FROM r
        -- The keys as an array: an index condition in any join order.
        WHERE c.channel_key = ANY ((SELECT keys.k FROM keys)::bigint[])
          AND c.channel_key = ((hashtext(r.cn)::bigint << 32)
                               | (hashtext(r.ca)::bigint & 4294967295))
          AND c.channel_name = r.cn
          AND c.channel_args = r.ca
          AND c.tail_id = r.id
          AND r.pred <> '00000000-0000-0000-0000-000000000000'::uuid
    )
    DELETE FROM mq_chains c
    USING r
    WHERE c.channel_key = ANY ((SELECT keys.k FROM keys)::bigint[])
      AND c.channel_key = ((hashtext(r.cn)::bigint << 32)
                           | (hashtext(r.ca)::bigint & 4294967295))
      AND c.channel_name = r.cn
      AND c.channel_args = r.ca
      AND c.tail_id = r.id
      AND r.pred = '00000000-0000-0000-0000-000000000000'::uuid;
    RETURN chans;
END;
$$;
