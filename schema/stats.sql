-- schema/stats.sql: statistics for monitoring.

-- Per channel: messages in all, ready now, waiting (delayed, leased,
-- retrying, uncommitted or behind their chain), dead, and chains blocked by
-- a dead head. Reads the whole table: for monitoring, not for hot paths.
-- Parameters: channel_names (NULL: every channel).
-- Returns: one row per channel. Duty: administer.
CREATE OR REPLACE FUNCTION mq_stats(channel_names text[] DEFAULT NULL)
RETURNS TABLE(channel_name text, total bigint, ready bigint, waiting bigint,
              dead bigint, blocked_chains bigint)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    WITH c AS (
        SELECT m.channel_name, m.attempts, m.attempt_at,
               -- A chain's head: its first member (whole table read anyway).
               m.chain_seq = pg_catalog.min(m.chain_seq) OVER (PARTITION BY m.channel_key)
                 AS is_head,
               m.chain_seq IS NULL AS unordered
        FROM mq_msgs m
        WHERE channel_names IS NULL OR m.channel_name = ANY (channel_names)
    ),
    m AS (
        SELECT c.channel_name,
               c.attempts = 0 AND c.attempt_at <= clock_timestamp() AS is_dead,
               c.attempts > 0 AND c.attempt_at <= clock_timestamp()
                 AND (c.unordered OR c.is_head) AS is_ready,
               COALESCE(c.is_head, false) AS is_head
        FROM c
    )
    SELECT m.channel_name, count(*), count(*) FILTER (WHERE m.is_ready),
           count(*) FILTER (WHERE NOT m.is_ready AND NOT m.is_dead),
           count(*) FILTER (WHERE m.is_dead),
           count(*) FILTER (WHERE m.is_dead AND m.is_head)
    FROM m
    GROUP BY m.channel_name
    ORDER BY m.channel_name
$$;

-- An mq_metrics without the paused column has another result type: a DROP first.
DO $$
DECLARE
    was regprocedure := pg_catalog.to_regprocedure('mq_metrics(text[])');
BEGIN
    IF was IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM pg_catalog.pg_proc p
           WHERE p.oid OPERATOR(pg_catalog.=) was
             AND 'paused' OPERATOR(pg_catalog.=) ANY (p.proargnames)) THEN
        DROP FUNCTION mq_metrics(text[]);
    END IF;
END
$$;

-- One row per channel with messages (only the named ones when channel_names
-- is not NULL), each message counted in exactly one state:
--   dead         ran out of attempts (dead_since set, or final lease over)
--   waiting      ordered, behind an earlier message of its chain
--   uncommitted  two-phase, not yet committed, commit interval running
--   in_flight    delivered and leased, or failed and waiting for its retry
--   scheduled    not delivered yet, delay running
--   ready        a poll would take it now
-- blocked_chains: dead chain heads (their chain waits for retry or skip).
-- oldest_ready_age: seconds since the oldest ready message became ready.
-- removed: messages of the channel deleted so far (completed or purged), a
-- counter: a channel drained of its messages keeps its row.
-- paused: the channel is paused (mq_pause); a paused channel has a row even
-- with no message.
--
-- Cost: what it reads never includes the waiting messages. total and
-- waiting come from the counters; dead, scheduled and uncommitted messages
-- and final attempts are read through the partial indexes that hold them
-- (mq_msgs_dead and the part of mq_msgs_ready_by_time later than now);
-- messages in flight are told from ready ones by reading the ready range
-- of mq_msgs_ready_by_time (the price of claims that write no index
-- entry); ready is what remains. The oldest ready message is a probe of
-- mq_msgs_ready_plain per chain key of the channel (and a read of the
-- channel's urgent messages) and one of mq_msgs_chain per chain.
-- Parameters: channel_names (NULL: every channel).
-- Returns: one row per channel. Duty: administer.
CREATE OR REPLACE FUNCTION mq_metrics(channel_names text[] DEFAULT NULL)
RETURNS TABLE(channel_name text, ready bigint, in_flight bigint, scheduled bigint,
              uncommitted bigint, waiting bigint, dead bigint,
              blocked_chains bigint, oldest_ready_age double precision,
              removed bigint, paused boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts     timestamptz := pg_catalog.clock_timestamp();
    r      record;
    h_cn   text[] := '{}';
    h_at   timestamptz[] := '{}';
    h_dl   int[] := '{}';
    h_dead boolean[] := '{}';
    h_ci   boolean[] := '{}';
    h_ra   timestamptz[] := '{}';
BEGIN
    PERFORM _mq_count_fold();
    -- The chains' heads (of the named channels' key ranges, or of all), in
    -- a statement that reads no table (_mq_chain_heads).
    SELECT pg_catalog.array_agg(h.head_name), pg_catalog.array_agg(h.head_at),
           pg_catalog.array_agg(h.head_deliveries), pg_catalog.array_agg(h.head_dead),
           pg_catalog.array_agg(h.head_uncommitted), pg_catalog.array_agg(h.head_ready_at)
    INTO h_cn, h_at, h_dl, h_dead, h_ci, h_ra
    FROM (SELECT '-9223372036854775808'::bigint AS lo, 9223372036854775807::bigint AS hi,
                 NULL::text AS nm
          WHERE channel_names IS NULL
          UNION ALL
          SELECT pg_catalog.hashtext(c.n)::bigint << 32,
                 (pg_catalog.hashtext(c.n)::bigint << 32) | 4294967295, c.n
          FROM (SELECT DISTINCT n FROM pg_catalog.unnest(channel_names) AS n) c
          WHERE channel_names IS NOT NULL) rg,
         LATERAL _mq_chain_heads(rg.lo, rg.hi, rg.nm, NULL, NULL) h;
    FOR r IN
    WITH counts AS (
        SELECT x.channel_name, pg_catalog.sum(x.total)::bigint AS total,
               pg_catalog.sum(x.waiting)::bigint AS waiting,
               pg_catalog.sum(x.removed)::bigint AS removed
        FROM (SELECT c.channel_name, c.total, c.waiting, c.removed FROM mq_counts c
              UNION ALL
              SELECT d.channel_name, d.total, d.waiting, d.removed
              FROM mq_count_deltas d
              UNION ALL -- (as in _mq_count_fold)
              SELECT e.n, e.sign * e.t, e.sign * e.w, CASE WHEN e.sign < 0 THEN e.t ELSE 0 END
              FROM (SELECT b.sign, pg_catalog.unnest(b.names) AS n,
                           pg_catalog.unnest(b.totals) AS t, pg_catalog.unnest(b.waits) AS w
                    FROM mq_count_batches b) e
              UNION ALL -- (a paused channel with no message has a row)
              SELECT p.channel_name, 0, 0, 0 FROM mq_paused p) x
        WHERE channel_names IS NULL
           OR x.channel_name OPERATOR(pg_catalog.=) ANY (channel_names)
        GROUP BY x.channel_name
    ),
    -- The chains' heads, found above.
    hd(cn, at, dl, dead, ci, ra) AS (
        SELECT * FROM unnest(h_cn, h_at, h_dl, h_dead, h_ci, h_ra) -- (ROWS FROM: unqualified)
    ),
    -- Not ready and not waiting. Messages not ready yet and final attempts
    -- are ranges of mq_msgs_ready_by_time past now; messages in flight
    -- that were not kept alive sit among the ready ones (a claim leaves
    -- ready_at where it was), so that part reads the ready range.
    later AS (
        SELECT m.channel_name,
               CASE WHEN m.deliveries > 0 THEN 'f'
                    WHEN m.commit_interval IS NOT NULL THEN 'u'
                    ELSE 's' END AS st, false AS head
        FROM mq_rows m
        WHERE m.dead_since IS NULL
          AND m.after_message_id IS NULL
          AND m.ready_at > '-infinity'::timestamptz -- mq_msgs_ready_by_time
          AND m.ready_at > ts AND m.ready_at < 'infinity'::timestamptz
          AND m.attempts > 0
        UNION ALL
        -- (all channels: the whole ready range of the time index)
        SELECT m.channel_name, 'f', false FROM mq_rows m
        WHERE channel_names IS NULL
          AND m.dead_since IS NULL
          AND m.after_message_id IS NULL
          AND m.ready_at > '-infinity'::timestamptz
          AND m.ready_at <= ts
          AND m.attempt_at > ts
          AND m.attempts > 0
        UNION ALL
        -- (named channels: only their ranges of the channel indexes, plain
        -- and urgent)
        SELECT m.channel_name, 'f', false
        FROM (SELECT DISTINCT n FROM pg_catalog.unnest(channel_names) AS n) c,
        LATERAL (
            SELECT m.channel_name FROM mq_rows m
            WHERE m.priority <= 0
              AND _mq_in_channel(m.dead_since, m.after_message_id, m.channel_key,
                                m.channel_name, c.n)
              AND m.ready_at <= ts AND m.attempt_at > ts AND m.attempts > 0
            UNION ALL
            SELECT m.channel_name FROM mq_rows m
            WHERE m.priority > 0
              AND _mq_in_channel(m.dead_since, m.after_message_id, m.channel_key,
                                m.channel_name, c.n)
              AND m.ready_at <= ts AND m.attempt_at > ts AND m.attempts > 0
        ) m
        WHERE channel_names IS NOT NULL
        UNION ALL
        SELECT m.channel_name,
               CASE WHEN m.attempt_at > ts THEN 'f' ELSE 'd' END,
               m.attempt_at <= ts AND m.chain_seq IS NOT NULL
        FROM mq_rows m
        WHERE m.dead_since IS NULL
          AND m.ready_at > '-infinity'::timestamptz
          AND m.ready_at = 'infinity'::timestamptz
          AND m.attempts = 0
        UNION ALL
        SELECT m.channel_name, 'd', m.chain_seq IS NOT NULL
        FROM mq_rows m
        WHERE m.dead_since IS NOT NULL
        UNION ALL
        -- Logged messages in flight: the members of open receipts of the
        -- lease lane neither completed nor moved whose leases run.
        SELECT l.channel_name, 'f', false
        FROM mq_receipts x
        CROSS JOIN LATERAL pg_catalog.unnest(x.places) AS p(place)
        JOIN mq_log l ON l.channel_key = x.channel_key AND l.place = p.place
        WHERE x.lease_until < 'infinity'::timestamptz AND x.lane = 0
          AND p.place <> ALL (x.moved)
          AND _mq_log_lease_end(x.claimed_at, l.retry_backoff, p.place, x.kept,
                                x.kept_until) > ts
          AND (channel_names IS NULL OR l.channel_name = ANY (channel_names))
          AND NOT EXISTS (SELECT 1 FROM mq_done d
                          WHERE d.channel_key = x.channel_key AND d.lo = x.lo
                            AND _mq_in(p.place, d.places))
        UNION ALL
        -- Chain heads: every one counts once as 'h' (counts.waiting has all
        -- ordered messages); those neither ready, dead nor on a final
        -- attempt (above) by their state.
        SELECT h.cn, 'h', false FROM hd h
        UNION ALL
        SELECT h.cn, CASE WHEN h.dl > 0 THEN 'f' WHEN h.ci THEN 'u' ELSE 's' END, false
        FROM hd h
        WHERE NOT h.dead AND h.ra < 'infinity'::timestamptz AND h.at > ts
    ),
    by_state AS (
        SELECT l.channel_name,
               pg_catalog.count(*) FILTER (WHERE l.st = 'f') AS f,
               pg_catalog.count(*) FILTER (WHERE l.st = 's') AS s,
               pg_catalog.count(*) FILTER (WHERE l.st = 'u') AS u,
               pg_catalog.count(*) FILTER (WHERE l.st = 'd') AS d,
               pg_catalog.count(*) FILTER (WHERE l.st = 'd' AND l.head) AS b,
               pg_catalog.count(*) FILTER (WHERE l.st = 'h') AS h
        FROM later l
        GROUP BY l.channel_name
    )
    SELECT c.channel_name AS ch,
           c.total - (c.waiting - COALESCE(b.h, 0)) - COALESCE(b.f + b.s + b.u + b.d, 0) AS rdy,
           COALESCE(b.f, 0) AS f, COALESCE(b.s, 0) AS s, COALESCE(b.u, 0) AS u,
           c.waiting - COALESCE(b.h, 0) AS w, COALESCE(b.d, 0) AS d, COALESCE(b.b, 0) AS bl, c.removed AS rm,
           pz.channel_name IS NOT NULL AS pz
    FROM counts c
    LEFT JOIN by_state b ON b.channel_name = c.channel_name
    LEFT JOIN mq_paused pz ON pz.channel_name = c.channel_name
    -- A drained channel stays, with its removed count: a counter that
    -- vanished would read as a reset to whoever takes its rate.
    WHERE c.total > 0 OR c.removed > 0 OR pz.channel_name IS NOT NULL
       OR (channel_names IS NOT NULL AND c.channel_name = ANY (channel_names))
    ORDER BY c.channel_name
    LOOP
        -- Each channel's oldest ready message is found here, not in the
        -- statement above: on Citus that statement runs on the worker that
        -- holds the queue, where a function that reads its tables cannot.
        channel_name := r.ch;
        ready := r.rdy;
        in_flight := r.f;
        scheduled := r.s;
        uncommitted := r.u;
        waiting := r.w;
        dead := r.d;
        blocked_chains := r.bl;
        oldest_ready_age := COALESCE(pg_catalog.date_part(
            'epoch', ts OPERATOR(pg_catalog.-) _mq_oldest_ready(r.ch, ts)), 0);
        removed := r.rm;
        paused := r.pz;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- When the oldest ready message of a channel became ready (NULL: none is
-- ready): a loose index scan over the channel's chain keys, one probe each,
-- in mq_msgs_ready_plain; the channel's urgent messages are read whole; and
-- the heads of its chains (_mq_chain_heads, in a statement of its own).
CREATE OR REPLACE FUNCTION _mq_oldest_ready(channel text, ts timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    head_at timestamptz := (
        SELECT pg_catalog.min(h.head_at)
        FROM _mq_chain_heads(pg_catalog.hashtext(channel)::bigint << 32,
                            (pg_catalog.hashtext(channel)::bigint << 32) | 4294967295,
                            channel, NULL, NULL) h
        WHERE NOT h.head_dead AND h.head_attempts > 0 AND h.head_at <= ts);
    -- The first message past each of the channel's cursors in the log.
    log_at  timestamptz := (
        SELECT pg_catalog.min(f.created_at)
        FROM mq_cursors c
        CROSS JOIN LATERAL (
            SELECT l.created_at FROM mq_log l
            WHERE l.channel_key = c.channel_key AND l.place > c.place
            ORDER BY l.place LIMIT 1) f
        WHERE c.channel_key >= (pg_catalog.hashtext(channel)::bigint << 32)
          AND c.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32) | 4294967295)
          AND c.channel_name = channel);
BEGIN
    RETURN LEAST(head_at, log_at, (
    WITH RECURSIVE keys(k) AS (
        SELECT (SELECT m.channel_key FROM mq_rows m
                WHERE m.dead_since IS NULL
                  AND m.after_message_id IS NULL
                  AND m.priority <= 0
                  AND m.channel_key >= (pg_catalog.hashtext(channel)::bigint << 32)
                  AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32)
                                        | 4294967295)
                ORDER BY m.channel_key LIMIT 1)
        UNION ALL
        SELECT (SELECT m.channel_key FROM mq_rows m
                WHERE m.dead_since IS NULL
                  AND m.after_message_id IS NULL
                  AND m.priority <= 0
                  AND m.channel_key > keys.k
                  AND m.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32)
                                        | 4294967295)
                ORDER BY m.channel_key LIMIT 1)
        FROM keys WHERE keys.k IS NOT NULL
    )
    SELECT LEAST(
        (SELECT pg_catalog.min(f.at)
         FROM keys,
         LATERAL (
             SELECT m.attempt_at AS at FROM mq_rows m
             WHERE m.channel_key = keys.k
               AND m.dead_since IS NULL
               AND m.after_message_id IS NULL
               AND m.priority <= 0
               AND m.ready_at <= ts
               AND m.attempt_at <= ts
               AND m.attempts > 0
               AND m.channel_name = channel
             ORDER BY m.ready_at
             LIMIT 1
         ) f
         WHERE keys.k IS NOT NULL AND f.at <= ts),
        -- The urgent messages: few, read whole.
        (SELECT pg_catalog.min(m.attempt_at) FROM mq_rows m
         WHERE m.priority > 0
           AND _mq_in_channel(m.dead_since, m.after_message_id, m.channel_key,
                             m.channel_name, channel)
           AND m.ready_at <= ts AND m.attempt_at <= ts AND m.attempts > 0))));
END;
$$;

-- The next max_rows messages of a channel (and of one chain when
-- channel_args is not NULL) in the order polls would deliver them, without
-- claiming or locking anything (args NULL: all chains): first the chain heads and unordered
-- messages, highest priority first and then by the time they become ready, then the ordered messages behind
-- them, chain by chain, each in chain order. Dead messages are left out
-- (pqmq dead lists them). state is as in mq_metrics.
-- Parameters: channel; args: one chain's (NULL: all); max_rows.
-- Returns: the next messages in delivery order. Duty: administer.
CREATE OR REPLACE FUNCTION mq_peek(channel text, args text DEFAULT NULL,
                                   max_rows int DEFAULT 10)
RETURNS TABLE(id uuid, channel_args text, name text, state text,
              ready_in interval, attempt int, attempts_left int,
              is_ordered boolean, payload_json text, payload_bytes bytea,
              last_error text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts timestamptz := pg_catalog.clock_timestamp();
    head_ids uuid[];
BEGIN
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > (_mq_limits()).max_batch THEN
        RAISE EXCEPTION 'mq_peek: max_rows % is outside 1..%',
            max_rows, (_mq_limits()).max_batch
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The live heads of the channel's chains, in a statement of its own
    -- (_mq_chain_heads).
    SELECT pg_catalog.array_agg(h.head_id) INTO head_ids
    FROM _mq_chain_heads(pg_catalog.hashtext(channel)::bigint << 32,
                        (pg_catalog.hashtext(channel)::bigint << 32) | 4294967295,
                        channel, NULL, NULL) h
    WHERE NOT h.head_dead AND h.head_attempts > 0;
    RETURN QUERY
    WITH heads AS (
        -- Candidates: the channel indexes (plain and urgent), one key range,
        -- and the live heads of the channel's chains.
        (SELECT m.id, m.channel_args, m.attempt_at, m.deliveries, m.attempts,
                m.commit_interval, m.chain_seq, m.channel_key, m.priority
         FROM mq_rows m
         WHERE m.priority <= 0
           AND _mq_in_channel(m.dead_since, m.after_message_id, m.channel_key,
                             m.channel_name, channel)
           AND m.attempts > 0 AND (args IS NULL OR m.channel_args = args)
         ORDER BY m.attempt_at, m.id
         LIMIT max_rows)
        UNION ALL
        (SELECT m.id, m.channel_args, m.attempt_at, m.deliveries, m.attempts,
                m.commit_interval, m.chain_seq, m.channel_key, m.priority
         FROM mq_rows m
         WHERE m.priority > 0
           AND _mq_in_channel(m.dead_since, m.after_message_id, m.channel_key,
                             m.channel_name, channel)
           AND m.attempts > 0 AND (args IS NULL OR m.channel_args = args)
         ORDER BY m.priority DESC, m.attempt_at, m.id
         LIMIT max_rows)
        UNION ALL
        -- The log: each of the channel's cursors' next messages.
        (SELECT l.id, l.channel_args, l.created_at, 0, l.attempts, NULL::interval,
                NULL::bigint, l.channel_key, 0::smallint
         FROM mq_cursors c
         CROSS JOIN LATERAL (
             SELECT q.id, q.channel_args, q.created_at, q.attempts, q.channel_key
             FROM mq_log q
             WHERE q.channel_key = c.channel_key AND q.place > c.place
               AND NOT EXISTS (SELECT 1 FROM mq_log_gone g
                               WHERE g.channel_key = q.channel_key AND g.place = q.place)
             ORDER BY q.place LIMIT max_rows) l
         WHERE c.channel_key >= (pg_catalog.hashtext(channel)::bigint << 32)
           AND c.channel_key <= ((pg_catalog.hashtext(channel)::bigint << 32) | 4294967295)
           AND c.channel_name = channel AND (args IS NULL OR c.channel_args = args)
         ORDER BY l.created_at, l.id
         LIMIT max_rows)
        UNION ALL
        SELECT m.id, m.channel_args, m.attempt_at, m.deliveries, m.attempts,
               m.commit_interval, m.chain_seq, m.channel_key, m.priority
        FROM unnest(head_ids) AS h(id) -- (ROWS FROM: unqualified)
        JOIN LATERAL (SELECT q.* FROM mq_rows q WHERE q.id = h.id LIMIT 1) m ON true
        WHERE args IS NULL OR m.channel_args = args
    ),
    -- Followers: each chain's next members in chain order, at most max_rows.
    picked AS (
        SELECT h.id, h.channel_args, h.attempt_at, h.deliveries, h.attempts,
               h.commit_interval, h.chain_seq IS NOT NULL AS ordered,
               false AS behind, -h.priority AS k0, h.attempt_at AS k1, h.id AS k2,
               0::bigint AS k3
        FROM heads h
        UNION ALL
        SELECT s.id, s.channel_args, s.attempt_at, s.deliveries, s.attempts,
               s.commit_interval, true, true, -h.priority, h.attempt_at, h.id, s.chain_seq
        FROM heads h, LATERAL (
            SELECT f.id, f.channel_args, f.attempt_at, f.deliveries, f.attempts,
                   f.commit_interval, f.chain_seq
            FROM mq_rows f
            WHERE f.chain_seq IS NOT NULL -- mq_msgs_chain
              AND f.channel_key = h.channel_key
              AND f.chain_seq > h.chain_seq
            ORDER BY f.chain_seq
            LIMIT max_rows) s
        WHERE h.chain_seq IS NOT NULL
    )
    SELECT p.id, p.channel_args, m.name,
           CASE WHEN p.behind THEN 'waiting'
                WHEN p.attempt_at <= ts THEN 'ready'
                WHEN p.deliveries > 0 THEN 'in_flight'
                WHEN p.commit_interval IS NOT NULL THEN 'uncommitted'
                ELSE 'scheduled' END,
           GREATEST(p.attempt_at - ts, interval '0'),
           p.deliveries, p.attempts, p.ordered,
           m.payload_json::text, m.payload_bytes, m.last_error
    FROM picked p
    LEFT JOIN LATERAL (
        SELECT q.name, q.payload_json, q.payload_bytes, q.last_error
        FROM mq_msgs q WHERE q.id = p.id LIMIT 1
    ) m ON true
    ORDER BY p.behind, p.k0, p.k1, p.k2, p.k3
    LIMIT max_rows;
END;
$$;
