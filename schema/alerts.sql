-- schema/alerts.sql: counters an alert can use (pqmq metrics, serve's
-- /metrics; docs/operating.md): per channel, failed attempts, retries
-- scheduled and messages gone dead, and the completed messages' time in
-- queue, from insert to first delivery, as a histogram, with the time of
-- the last completion. Counted since the install, never reset, kept when a
-- channel drains (mq_events, schema/tables.sql).
--
-- Cost: claims and keep-alives pay nothing (the failure triggers fire only
-- for the statements that set last_error or dead_since); a failure appends
-- one row; a completing statement appends one row per channel it deleted
-- from, with its messages' insert times, each moved forward by the time
-- from its first delivery to the completion (the statement trigger below,
-- beside _mq_count_deleted; a claim writes the delivery's time in the row
-- it updates anyway, or in its receipt). The histogram is computed from
-- those when they are folded (_mq_event_fold, one statement over all) or
-- read before a fold (_mq_waits): per message, a completion pays only for
-- copying its insert time.

-- The upper bounds (seconds) of the time-in-queue histogram's buckets,
-- besides +Inf. _mq_event_completed counts at the same bounds.
CREATE OR REPLACE FUNCTION _mq_wait_bounds()
RETURNS double precision[]
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$
    SELECT '{0.01,0.05,0.1,0.5,1,5,10,30,60,300,900,3600}'::double precision[]
$$;

-- Element-wise sum of two bucket arrays (the shorter padded with zeros).
CREATE OR REPLACE FUNCTION _mq_add_buckets(a bigint[], b bigint[])
RETURNS bigint[]
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$
    SELECT COALESCE(pg_catalog.array_agg(COALESCE(u.x, 0) OPERATOR(pg_catalog.+) COALESCE(u.y, 0)
                                         ORDER BY u.i), '{}')
    FROM unnest(a, b) WITH ORDINALITY AS u(x, y, i)
$$;

-- The histogram of one delta row: how many messages, their seconds from
-- created to done_at summed (created: an insert time moved forward by the
-- time from first delivery to completion, so these are times in queue),
-- and cumulative counts at the bounds of _mq_wait_bounds(). One width_bucket a message, among the
-- times done_at less each bound (ascending: the largest bound first): the
-- messages within bound i of m are those past the (m + 1 - i)th.
CREATE OR REPLACE FUNCTION _mq_waits(done_at timestamptz, created timestamptz[], OUT n bigint,
                                     OUT total double precision, OUT buckets bigint[])
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$
    WITH th AS (
        SELECT pg_catalog.array_agg(done_at OPERATOR(pg_catalog.-)
                                    pg_catalog.make_interval(secs => b.x) ORDER BY b.x DESC) AS a,
               pg_catalog.count(*)::int AS m
        FROM unnest(_mq_wait_bounds()) AS b(x)
    ), w AS (
        SELECT pg_catalog.width_bucket(c, th.a) AS k, pg_catalog.count(*) AS n,
               pg_catalog.sum(done_at OPERATOR(pg_catalog.-) c) AS s
        FROM unnest(created) AS c, th
        GROUP BY 1
    )
    SELECT COALESCE((SELECT pg_catalog.sum(w.n) FROM w), 0)::bigint,
           COALESCE((SELECT pg_catalog.date_part('epoch', pg_catalog.sum(w.s)) FROM w), 0),
           ARRAY(SELECT COALESCE((SELECT pg_catalog.sum(w.n) FROM w
                                  WHERE w.k >= th.m + 1 - i), 0)::bigint
                 FROM th, pg_catalog.generate_series(1, th.m) AS i
                 ORDER BY i)
$$;

-- Moves the deltas into mq_events: as _mq_count_fold, one folder at a
-- time and only in READ COMMITTED.
CREATE OR REPLACE FUNCTION _mq_event_fold()
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed'
       OR NOT pg_catalog.pg_try_advisory_xact_lock(1886482797, 5) THEN
        RETURN;
    END IF;
    -- Set-based over every message of the deltas (a call of _mq_waits a
    -- delta row costs an executor start each): its time in queue t, and k,
    -- how many bounds it is within (width_bucket counts the thresholds at
    -- or below its operand: the bounds negated, ascending, against -t).
    WITH d AS (
        DELETE FROM mq_event_deltas d
        RETURNING d.channel_name, d.failed, d.retried, d.dead, d.completed_at, d.created
    ), th AS (
        SELECT pg_catalog.array_agg(-pg_catalog.make_interval(secs => b.x)
                                    ORDER BY b.x DESC) AS neg,
               pg_catalog.count(*)::int AS m
        FROM unnest(_mq_wait_bounds()) AS b(x)
    ), kc AS (
        SELECT d.channel_name, pg_catalog.width_bucket(-w.t, th.neg) AS k,
               pg_catalog.count(*) AS n, pg_catalog.sum(w.t) AS t
        FROM d CROSS JOIN th
        CROSS JOIN LATERAL (SELECT d.completed_at OPERATOR(pg_catalog.-) c AS t
                            FROM unnest(d.created) AS c) w
        GROUP BY 1, 2
    ), s AS (
        SELECT d.channel_name, pg_catalog.sum(d.failed) AS f, pg_catalog.sum(d.retried) AS r,
               pg_catalog.sum(d.dead) AS dd, pg_catalog.max(d.completed_at) AS lc
        FROM d
        GROUP BY d.channel_name
    ), t AS (
        SELECT kc.channel_name, pg_catalog.sum(kc.n) AS c,
               pg_catalog.date_part('epoch', pg_catalog.sum(kc.t)) AS ws
        FROM kc
        GROUP BY kc.channel_name
    ), b AS (
        -- (cumulative: bound i holds the messages within m + 1 - i bounds or more)
        SELECT x.channel_name, pg_catalog.array_agg(x.v ORDER BY x.i) AS wb
        FROM (SELECT kc.channel_name, g.i,
                     COALESCE(pg_catalog.sum(kc.n) FILTER (WHERE kc.k >= th.m + 1 - g.i),
                              0)::bigint AS v
              FROM kc CROSS JOIN th
              CROSS JOIN LATERAL pg_catalog.generate_series(1, th.m) AS g(i)
              GROUP BY kc.channel_name, g.i) x
        GROUP BY x.channel_name
    )
    INSERT INTO mq_events AS c (channel_name, failed, retried, dead, completed, wait_sum,
                                wait_buckets, last_completed_at)
    SELECT s.channel_name, s.f, s.r, s.dd, COALESCE(t.c, 0), COALESCE(t.ws, 0),
           COALESCE(b.wb, (SELECT pg_catalog.array_fill(0::bigint, ARRAY[th.m]) FROM th)), s.lc
    FROM s
    LEFT JOIN t ON t.channel_name = s.channel_name
    LEFT JOIN b ON b.channel_name = s.channel_name
    ORDER BY s.channel_name
    ON CONFLICT (channel_name) DO UPDATE SET
        failed = c.failed + excluded.failed,
        retried = c.retried + excluded.retried,
        dead = c.dead + excluded.dead,
        completed = c.completed + excluded.completed,
        wait_sum = c.wait_sum + excluded.wait_sum,
        wait_buckets = _mq_add_buckets(c.wait_buckets, excluded.wait_buckets),
        last_completed_at = GREATEST(c.last_completed_at, excluded.last_completed_at);
END;
$$;

-- A failed attempt: mq_fail (which sets last_error) with a retry scheduled,
-- or a message that went dead, by mq_fail on its last attempt or by
-- mq_reap_dead when its final lease ran out (mq_skip, which takes a member
-- out of its chain, is an operator's decision, not counted). A lease that
-- ran out with attempts left is not seen here: the message is simply
-- delivered again.
CREATE OR REPLACE FUNCTION _mq_event_failed()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO mq_event_deltas (channel_name, failed, retried, dead, completed_at, created)
    VALUES (NEW.channel_name, 1, (NEW.dead_since IS NULL)::int,
            (NEW.dead_since IS NOT NULL)::int, NULL, '{}');
    IF pg_catalog.random() < 0.004 THEN
        PERFORM _mq_event_fold();
    END IF;
    RETURN NULL;
END;
$$;

-- The completed messages of a deleting statement, per channel: their
-- insert times and the statement's time. Completed: not dead, and
-- delivered or ready (a lease claim counted its delivery; the locked
-- lane's jobs are ready while held): a producer's cancellation of a pending
-- message is not counted, a purge of ready messages is. The insert time
-- includes any delay the producer asked for. (Rows are read into values
-- first, as in _mq_count_deleted.)
CREATE OR REPLACE FUNCTION _mq_event_completed()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts timestamptz := pg_catalog.clock_timestamp();
    r  record;
BEGIN
    FOR r IN
        -- (time in queue: insert to the first leased delivery, or to now
        -- for a message none delivered, _mq_waits)
        SELECT o.channel_name AS cn,
               pg_catalog.array_agg(o.created_at OPERATOR(pg_catalog.+)
                                    (ts OPERATOR(pg_catalog.-)
                                     COALESCE(o.first_claimed_at, ts))) AS c
        FROM mq_old_rows o
        WHERE o.dead_since IS NULL AND (o.deliveries > 0 OR o.attempt_at <= ts)
        GROUP BY o.channel_name
    LOOP
        INSERT INTO mq_event_deltas (channel_name, failed, retried, dead, completed_at, created)
        VALUES (r.cn, 0, 0, 0, ts, r.c);
    END LOOP;
    IF pg_catalog.random() < 0.004 THEN
        PERFORM _mq_event_fold();
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER _mq_event_retried AFTER UPDATE OF last_error ON mq_rows
    FOR EACH ROW
    WHEN (NEW.dead_since IS NULL)
    EXECUTE FUNCTION _mq_event_failed();
CREATE OR REPLACE TRIGGER _mq_event_dead AFTER UPDATE OF dead_since ON mq_rows
    FOR EACH ROW
    WHEN (OLD.dead_since IS NULL AND NEW.dead_since IS NOT NULL
          AND NEW.chain_seq IS NOT DISTINCT FROM OLD.chain_seq)
    EXECUTE FUNCTION _mq_event_failed();
CREATE OR REPLACE TRIGGER _mq_event_completed AFTER DELETE ON mq_rows
    REFERENCING OLD TABLE AS mq_old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION _mq_event_completed();

-- Per channel (every channel with messages or with messages removed, as in
-- mq_metrics, or only the named ones): counters since the install, which
-- only grow and survive a drain:
--   failed     attempts that failed (mq_fail, or a final lease run out)
--   retried    of them, those after which a retry was scheduled
--   dead       messages that went dead (no attempt left)
--   completed  messages completed, with wait_sum, the sum of their times
--              in queue (seconds from insert to first delivery: to the
--              completion for one the locked lane held in mq_rows or none
--              delivered), and wait_buckets[i], how many took
--              at most wait_le[i] seconds (cumulative, as a Prometheus
--              histogram's buckets; completed is the +Inf bucket)
-- last_completed_at: when the channel's last completion was (NULL: none).
-- Parameters: channel_names (NULL: every channel).
-- Returns: one row per channel. Duty: administer.
CREATE OR REPLACE FUNCTION mq_alert_metrics(channel_names text[] DEFAULT NULL)
RETURNS TABLE(channel_name text, failed bigint, retried bigint, dead bigint,
              completed bigint, wait_sum double precision, wait_le double precision[],
              wait_buckets bigint[], last_completed_at timestamptz)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    bounds double precision[] := _mq_wait_bounds();
BEGIN
    PERFORM _mq_count_fold();
    PERFORM _mq_event_fold();
    RETURN QUERY
    WITH x AS (
        SELECT e.channel_name AS cn, e.failed AS f, e.retried AS r, e.dead AS dd,
               e.completed AS c, e.wait_sum AS ws, e.wait_buckets AS wb,
               e.last_completed_at AS lc
        FROM mq_events e
        UNION ALL
        SELECT d.channel_name, d.failed, d.retried, d.dead, w.n, w.total, w.buckets,
               d.completed_at
        FROM mq_event_deltas d, LATERAL _mq_waits(d.completed_at, d.created) w
    ), xs AS (
        SELECT x.* FROM x
        WHERE channel_names IS NULL OR x.cn OPERATOR(pg_catalog.=) ANY (channel_names)
    ), s AS (
        SELECT xs.cn, pg_catalog.sum(xs.f)::bigint AS f, pg_catalog.sum(xs.r)::bigint AS r,
               pg_catalog.sum(xs.dd)::bigint AS dd, pg_catalog.sum(xs.c)::bigint AS c,
               pg_catalog.sum(xs.ws) AS ws, pg_catalog.max(xs.lc) AS lc
        FROM xs
        GROUP BY xs.cn
    ), b AS (
        SELECT u.cn, u.i, pg_catalog.sum(u.v)::bigint AS v
        FROM (SELECT xs.cn, w.v, w.i
              FROM xs, LATERAL unnest(xs.wb) WITH ORDINALITY AS w(v, i)) u
        GROUP BY u.cn, u.i
    ), ch AS (
        SELECT k.channel_name AS cn FROM mq_counts k
        WHERE (k.total > 0 OR k.removed > 0)
          AND (channel_names IS NULL OR k.channel_name OPERATOR(pg_catalog.=) ANY (channel_names))
        UNION
        SELECT s.cn FROM s
    )
    SELECT ch.cn, COALESCE(s.f, 0), COALESCE(s.r, 0), COALESCE(s.dd, 0), COALESCE(s.c, 0),
           COALESCE(s.ws, 0), bounds,
           (SELECT pg_catalog.array_agg(COALESCE(b.v, 0) ORDER BY g.i)
            FROM pg_catalog.generate_series(1, pg_catalog.cardinality(bounds)) AS g(i)
            LEFT JOIN b ON b.cn OPERATOR(pg_catalog.=) ch.cn AND b.i OPERATOR(pg_catalog.=) g.i),
           s.lc
    FROM ch
    LEFT JOIN s ON s.cn OPERATOR(pg_catalog.=) ch.cn
    ORDER BY ch.cn;
END;
$$;
