-- schema/log_receipts.sql: what acts on a logged message once a claim
-- delivered it: the receipt that holds it (_mq_log_held), completion (one
-- mq_done row a receipt), deletion before delivery, keep-alive, the move to
-- mq_rows in its delivery's state when anything else happens to it, and the
-- reaping of receipts whose leases ran out. (DESIGN.md, Storage.)

-- The receipt that holds each of msg_ids, for the functions that act on a
-- delivery: the logged message's channel, place, receipt (lo), lane and
-- claim time, with its receipt's row locked (FOR KEY SHARE for a
-- completion, which never waits for another; FOR UPDATE, in key order, for
-- a move). Messages not in the log, or that their receipt let go (moved to
-- mq_rows), are not returned: mq_rows answers for them. (A receipt's row is
-- returned as its lock leaves it, so a member moved meanwhile is not
-- returned. A channel's receipts cover disjoint ranges of places, so the
-- one that may hold a place is the last that starts at or before it.)
CREATE OR REPLACE FUNCTION _mq_log_held(msg_ids uuid[], exclusive boolean)
RETURNS TABLE(channel_key bigint, place bigint, lo bigint, lane int, claimed_at timestamptz,
              id uuid, channel_name text, created_at timestamptz)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    -- (On Citus nothing is logged: every message is a row of mq_rows.)
    IF current_setting('pqmq.citus', true) = 'on' THEN
        RETURN;
    END IF;
    IF exclusive THEN
        RETURN QUERY
        WITH l AS MATERIALIZED ( -- (by id: mq_log_id, whatever the statistics)
            SELECT m.channel_key, m.place, m.id, m.channel_name, m.created_at
            FROM mq_log m WHERE m.id = ANY (msg_ids))
        SELECT l.channel_key, l.place, r.lo, r.lane::int, r.claimed_at, l.id, l.channel_name,
               l.created_at
        FROM l
        CROSS JOIN LATERAL (
            SELECT r.lo, r.lane, r.claimed_at, r.places, r.moved, r.lease_until
            FROM mq_receipts r
            WHERE r.channel_key = l.channel_key AND r.lo <= l.place
            ORDER BY r.lo DESC LIMIT 1
            FOR UPDATE) r
        WHERE r.lease_until < 'infinity'::timestamptz
          AND _mq_in(l.place, r.places) AND (cardinality(r.moved) = 0 OR l.place <> ALL (r.moved))
        ORDER BY l.channel_key, r.lo;
    ELSE
        -- Each channel's receipts over its places, locked once each.
        RETURN QUERY
        WITH l AS MATERIALIZED ( -- (by id: mq_log_id, whatever the statistics)
            SELECT m.channel_key, m.place, m.id, m.channel_name, m.created_at
            FROM mq_log m WHERE m.id = ANY (msg_ids)),
        k AS MATERIALIZED (
            SELECT l.channel_key, min(l.place) AS a, max(l.place) AS b
            FROM l GROUP BY l.channel_key),
        r AS MATERIALIZED (
            SELECT r.channel_key, r.lo, r.hi, r.lane, r.claimed_at, r.places, r.moved
            FROM k JOIN mq_receipts r
              ON r.channel_key = k.channel_key AND r.lo <= k.b
             AND r.lo >= COALESCE((SELECT max(x.lo) FROM mq_receipts x
                                   WHERE x.channel_key = k.channel_key AND x.lo <= k.a), k.a)
            WHERE r.lease_until < 'infinity'::timestamptz
            FOR KEY SHARE OF r)
        SELECT l.channel_key, l.place, r.lo, r.lane::int, r.claimed_at, l.id, l.channel_name,
               l.created_at
        FROM l JOIN r ON r.channel_key = l.channel_key AND l.place BETWEEN r.lo AND r.hi
        WHERE _mq_in(l.place, r.places) AND (cardinality(r.moved) = 0 OR l.place <> ALL (r.moved));
    END IF;
END;
$$;

-- Whether a claim delivered the logged message at place of channel key
-- (a channel's receipts cover disjoint ranges: the one that may hold it is
-- the last that starts at or before it). No settings: the standard SQL
-- body resolved its names when it was created, and a SET would cost each
-- call (one per place a scan tests) a change of settings, as _mq_at.
CREATE OR REPLACE FUNCTION _mq_log_given(key bigint, at bigint)
RETURNS boolean
LANGUAGE sql STABLE
RETURN COALESCE((SELECT _mq_in(at, r.places) FROM mq_receipts r
                 WHERE r.channel_key = key AND r.lo <= at
                 ORDER BY r.lo DESC LIMIT 1), false);

-- The counters of logged messages that left the queue (completed, or
-- deleted before delivery): the count rows of mq_counts and the completion
-- events of mq_alert_metrics, as mq_rows' delete triggers write them.
CREATE OR REPLACE FUNCTION _mq_log_count_gone(names text[], created timestamptz[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts timestamptz := clock_timestamp();
BEGIN
    -- One count row for the statement, as mq_rows' delete trigger writes,
    -- and one event row a channel.
    INSERT INTO mq_count_batches (sign, names, totals, waits)
    SELECT -1, array_agg(g.n), array_agg(g.k), array_agg(0)
    FROM (SELECT u.n, count(*)::int AS k FROM unnest(names) AS u(n) GROUP BY u.n) g;
    INSERT INTO mq_event_deltas (channel_name, failed, retried, dead, completed_at, created)
    SELECT u.n, 0, 0, 0, ts, array_agg(u.c)
    FROM unnest(names, created) AS u(n, c) GROUP BY u.n;
    IF pg_catalog.random() < 0.004 THEN
        PERFORM _mq_count_fold();
    END IF;
    IF pg_catalog.random() < 0.004 THEN
        PERFORM _mq_event_fold();
    END IF;
END;
$$;

-- Completes the logged messages among msg_ids that a receipt holds (with
-- by_id, the ids sorted, and att their attempt numbers: only the delivery
-- given, 1 for a leased one, 0 for one held by the locked lane), one
-- mq_done row a receipt. Returns how many.
CREATE OR REPLACE FUNCTION _mq_log_complete(msg_ids uuid[], by_id uuid[], att int[])
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    n    int;
    ts   timestamptz := clock_timestamp();
    keys bigint[]; -- the receipts completed from
    los  bigint[];
BEGIN
    -- (On Citus nothing is logged: every message is a row of mq_rows.)
    IF current_setting('pqmq.citus', true) = 'on' THEN
        RETURN 0;
    END IF;
    WITH held AS MATERIALIZED (
        SELECT h.* FROM _mq_log_held(msg_ids, false) h
        WHERE by_id IS NULL
           OR att[width_bucket(h.id, by_id)] = CASE WHEN h.lane = 1 THEN 0 ELSE 1 END),
    -- What each receipt's earlier completions took, read once a receipt.
    done AS MATERIALIZED (
        SELECT r.channel_key, r.lo, e.places
        FROM (SELECT DISTINCT x.channel_key, x.lo FROM held x) r
        CROSS JOIN LATERAL ( -- (a probe a receipt, whatever ANALYZE saw)
            SELECT array_agg(p ORDER BY p) AS places
            FROM mq_done d CROSS JOIN LATERAL unnest(d.places) AS p
            WHERE d.channel_key = r.channel_key AND d.lo = r.lo) e
        WHERE e.places IS NOT NULL),
    h AS MATERIALIZED (
        SELECT held.* FROM held
        LEFT JOIN done ON done.channel_key = held.channel_key AND done.lo = held.lo
        WHERE done.places IS NULL OR NOT _mq_in(held.place, done.places)),
    ins AS (
        INSERT INTO mq_done (channel_key, lo, places)
        SELECT h.channel_key, h.lo, array_agg(h.place ORDER BY h.place)
        FROM h GROUP BY h.channel_key, h.lo
        RETURNING 1),
    -- The counters, as _mq_log_count_gone writes them, in this statement.
    counted AS (
        INSERT INTO mq_count_batches (sign, names, totals, waits)
        SELECT -1, array_agg(g.n), array_agg(g.k), array_agg(0)
        FROM (SELECT h.channel_name AS n, count(*)::int AS k FROM h
              GROUP BY h.channel_name) g
        HAVING count(*) > 0
        RETURNING 1),
    events AS (
        INSERT INTO mq_event_deltas (channel_name, failed, retried, dead, completed_at, created)
        -- (time in queue: insert to the receipt's claim, _mq_waits)
        SELECT h.channel_name, 0, 0, 0, ts, array_agg(h.created_at + (ts - h.claimed_at))
        FROM h GROUP BY h.channel_name
        RETURNING 1)
    SELECT (SELECT count(*) FROM h),
           (SELECT array_agg(r.channel_key ORDER BY r.channel_key, r.lo)
            FROM (SELECT DISTINCT h.channel_key, h.lo FROM h) r),
           (SELECT array_agg(r.lo ORDER BY r.channel_key, r.lo)
            FROM (SELECT DISTINCT h.channel_key, h.lo FROM h) r)
    INTO n, keys, los;
    -- A receipt all of whose members are now completed or moved is
    -- finished at once (its lease 'infinity'), so that reclaiming need not
    -- wait for its lease to run out and a poll to reap it (in a statement
    -- of its own, which sees this one's completions; in key order).
    IF n > 0 THEN
        UPDATE mq_receipts x SET lease_until = 'infinity'::timestamptz
        FROM unnest(keys, los) AS u(k, l)
        WHERE x.channel_key = u.k AND x.lo = u.l
          AND x.lease_until < 'infinity'::timestamptz
          AND (SELECT count(DISTINCT p) FROM mq_done d CROSS JOIN LATERAL unnest(d.places) AS p
               WHERE d.channel_key = x.channel_key AND d.lo = x.lo)
              + cardinality(x.moved) >= cardinality(x.places);
    END IF;
    IF n > 0 AND pg_catalog.random() < 0.004 THEN
        PERFORM _mq_count_fold();
    END IF;
    IF n > 0 AND pg_catalog.random() < 0.004 THEN
        PERFORM _mq_event_fold();
    END IF;
    RETURN n;
END;
$$;

-- Deletes logged messages among msg_ids that no claim has reached (an
-- unfenced mq_delete: a cancellation or a purge): each is marked gone
-- (mq_log_gone) under its channel's cursor lock, so no claim delivers it.
-- Returns how many.
CREATE OR REPLACE FUNCTION _mq_log_forget(msg_ids uuid[])
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    n       int;
    names   text[];
    created timestamptz[];
    keys    bigint[];
BEGIN
    -- (On Citus nothing is logged: every message is a row of mq_rows.)
    IF current_setting('pqmq.citus', true) = 'on' THEN
        RETURN 0;
    END IF;
    SELECT array_agg(DISTINCT l.channel_key) INTO keys
    FROM mq_log l WHERE l.id = ANY (msg_ids);
    IF keys IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM mq_cursors c
    WHERE c.channel_key = ANY (keys)
    ORDER BY c.channel_key
    FOR NO KEY UPDATE;
    -- (A new statement: it sees every claim that held those cursors.)
    WITH g AS (
        WITH l AS MATERIALIZED ( -- (by id: mq_log_id, whatever the statistics)
            SELECT m.channel_key, m.place FROM mq_log m WHERE m.id = ANY (msg_ids))
        INSERT INTO mq_log_gone (channel_key, place)
        SELECT l.channel_key, l.place FROM l
        JOIN mq_cursors c ON c.channel_key = l.channel_key
        WHERE (l.place > c.place
               OR (l.place > c.settled AND NOT _mq_log_given(l.channel_key, l.place)))
        ON CONFLICT DO NOTHING
        RETURNING channel_key, place)
    SELECT count(*), array_agg(l.channel_name), array_agg(l.created_at)
    INTO n, names, created
    FROM g JOIN mq_log l ON l.channel_key = g.channel_key AND l.place = g.place;
    IF n > 0 THEN
        PERFORM _mq_log_count_gone(names, created);
    END IF;
    RETURN n;
END;
$$;

-- Writes the logged messages at places of channel key into mq_rows, in the
-- state their delivery left them: lane 0, leased at claimed_at (one attempt
-- spent, its backoff doubled, in flight until its lease ends, or ready if
-- that is past; kept, kept_until: as in the receipt); lane 1 or 2, never
-- delivered (ready now). From then
-- on mq_rows holds the message. The caller holds the receipt's row lock and
-- records the move in it.
CREATE OR REPLACE FUNCTION _mq_log_to_msgs(key bigint, places bigint[], lane int,
                                           claimed_at timestamptz, kept bigint[],
                                           kept_until timestamptz, ts timestamptz)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    max_dur interval := (_mq_limits()).max_duration;
    n       int;
BEGIN
    INSERT INTO mq_rows (id, created_at, attempt_at, attempts, retry_backoff, channel_name,
                         channel_args, deliveries, ready_at, name, payload_json,
                         payload_bytes, channel_key, first_claimed_at)
    SELECT l.id, l.created_at,
           CASE WHEN lane = 0
                THEN _mq_log_lease_end(claimed_at, l.retry_backoff, l.place, kept, kept_until)
                ELSE ts END,
           CASE WHEN lane = 0 THEN l.attempts - 1 ELSE l.attempts END,
           CASE WHEN lane <> 0 THEN l.retry_backoff
                WHEN l.retry_backoff * 2 > max_dur THEN l.retry_backoff
                ELSE l.retry_backoff * 2 END,
           l.channel_name, l.channel_args,
           CASE WHEN lane = 0 THEN 1 ELSE 0 END,
           -- (A final attempt in flight waits at 'infinity', as a claim
           -- leaves it: mq_reap_dead.)
           CASE WHEN lane <> 0 THEN ts
                WHEN l.attempts <= 1 THEN 'infinity'::timestamptz
                ELSE LEAST(ts, _mq_log_lease_end(claimed_at, l.retry_backoff, l.place, kept,
                                                 kept_until)) END,
           l.name, l.payload_json, l.payload_bytes, l.channel_key,
           CASE WHEN lane = 0 THEN claimed_at END
    FROM mq_log l
    WHERE l.channel_key = key AND l.place = ANY (places);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;

-- Moves the logged messages among msg_ids that a receipt holds to mq_rows,
-- in their delivery's state (_mq_log_to_msgs), so that mq_rows' functions
-- (checkpoint, failure, release) act on them, as of ts (the caller's
-- time). Completed ones stay completed.
CREATE OR REPLACE FUNCTION _mq_log_move(msg_ids uuid[], ts timestamptz)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    r   record;
    k   record;
    mv  bigint[];
BEGIN
    -- (On Citus nothing is logged: every message is a row of mq_rows.)
    IF current_setting('pqmq.citus', true) = 'on' THEN
        RETURN;
    END IF;
    IF msg_ids IS NULL OR NOT EXISTS (SELECT 1 FROM mq_log l WHERE l.id = ANY (msg_ids)) THEN
        RETURN;
    END IF;
    -- Locks first (key order); what was completed is read after.
    FOR r IN SELECT h.channel_key, h.lo, h.lane, h.claimed_at,
                    array_agg(h.place) AS places
             FROM _mq_log_held(msg_ids, true) h
             GROUP BY h.channel_key, h.lo, h.lane, h.claimed_at
             ORDER BY h.channel_key, h.lo LOOP
        SELECT x.kept, x.kept_until INTO k FROM mq_receipts x
        WHERE x.channel_key = r.channel_key AND x.lo = r.lo;
        SELECT array_agg(p) INTO mv FROM unnest(r.places) AS p
        WHERE NOT EXISTS (SELECT 1 FROM mq_done d
                          WHERE d.channel_key = r.channel_key AND d.lo = r.lo
                            AND _mq_in(p, d.places));
        CONTINUE WHEN mv IS NULL;
        PERFORM _mq_log_to_msgs(r.channel_key, mv, r.lane, r.claimed_at, k.kept, k.kept_until,
                                ts);
        UPDATE mq_receipts x SET moved = x.moved || mv
        WHERE x.channel_key = r.channel_key AND x.lo = r.lo;
    END LOOP;
END;
$$;

-- Hands back what receipts whose leases ran out still hold: each member
-- neither completed nor moved whose own lease ended (every member of a
-- locked-lane receipt, whose transaction committed without completing it)
-- moves to mq_rows (_mq_log_to_msgs: ready at once, or dead-bound after
-- its final attempt); the receipt's lease becomes the earliest left, or
-- 'infinity' when none is. A receipt a completion holds is passed, for the
-- next call. At most 64 receipts a call.
CREATE OR REPLACE FUNCTION _mq_log_reap(ts timestamptz)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    r      record;
    left   bigint[];
    due    bigint[];
    next   timestamptz;
BEGIN
    -- (On Citus nothing is logged: every message is a row of mq_rows.)
    IF current_setting('pqmq.citus', true) = 'on' THEN
        RETURN;
    END IF;
    FOR r IN SELECT x.channel_key, x.lo, x.places, x.moved, x.lane, x.claimed_at, x.kept,
                    x.kept_until
             FROM mq_receipts x
             WHERE x.lease_until < 'infinity'::timestamptz AND x.lease_until <= ts
               -- (not this transaction's own locked-lane claims, still held)
               AND (x.holder IS NULL OR x.holder IS DISTINCT FROM pg_current_xact_id_if_assigned())
             ORDER BY x.lease_until
             LIMIT 64
             FOR UPDATE SKIP LOCKED LOOP
        -- (Statements after the lock: they see every completion that held it.)
        -- Usually every member was completed or moved: counted, not read.
        IF (SELECT count(DISTINCT p) FROM mq_done d, unnest(d.places || r.moved) AS p
            WHERE d.channel_key = r.channel_key AND d.lo = r.lo) >= cardinality(r.places) THEN
            UPDATE mq_receipts x SET lease_until = 'infinity'::timestamptz
            WHERE x.channel_key = r.channel_key AND x.lo = r.lo;
            CONTINUE;
        END IF;
        SELECT array_agg(l.place) FILTER (WHERE r.lane <> 0 OR e.at <= ts),
               min(e.at) FILTER (WHERE r.lane = 0 AND e.at > ts)
        INTO due, next
        FROM mq_log l
        CROSS JOIN LATERAL (SELECT _mq_log_lease_end(r.claimed_at, l.retry_backoff, l.place,
                                                     r.kept, r.kept_until) AS at) e
        WHERE l.channel_key = r.channel_key
          AND _mq_in(l.place, r.places) AND (cardinality(r.moved) = 0 OR l.place <> ALL (r.moved))
          AND NOT EXISTS (SELECT 1 FROM mq_done d
                          WHERE d.channel_key = r.channel_key AND d.lo = r.lo
                            AND _mq_in(l.place, d.places));
        IF due IS NOT NULL THEN
            PERFORM _mq_log_to_msgs(r.channel_key, due, r.lane, r.claimed_at, r.kept,
                                    r.kept_until, ts);
        END IF;
        UPDATE mq_receipts x
        SET moved = x.moved || COALESCE(due, '{}'),
            lease_until = COALESCE(next, 'infinity'::timestamptz)
        WHERE x.channel_key = r.channel_key AND x.lo = r.lo;
    END LOOP;
END;
$$;

-- Extends the leases of the logged messages among msg_ids that a receipt
-- of the lease lane holds, whose leases run and end before until: they
-- join the receipt's kept members. An UPDATE of the receipt's row (no key
-- column) waits for no completion holding it. Returns how many.
CREATE OR REPLACE FUNCTION _mq_log_keep_alive(msg_ids uuid[], until timestamptz,
                                              ts timestamptz)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    n int := 0;
    r record;
BEGIN
    -- (On Citus nothing is logged: every message is a row of mq_rows.)
    IF current_setting('pqmq.citus', true) = 'on' THEN
        RETURN 0;
    END IF;
    FOR r IN WITH l AS MATERIALIZED ( -- (by id: mq_log_id, whatever the statistics)
                 SELECT m.channel_key, m.place, m.retry_backoff FROM mq_log m
                 WHERE m.id = ANY (msg_ids))
             SELECT l.channel_key, g.lo, array_agg(l.place) AS places
             FROM l
             CROSS JOIN LATERAL (
                 SELECT x.lo, x.places, x.moved, x.lane, x.claimed_at, x.kept, x.kept_until,
                        x.lease_until
                 FROM mq_receipts x
                 WHERE x.channel_key = l.channel_key AND x.lo <= l.place
                 ORDER BY x.lo DESC LIMIT 1) g
             WHERE g.lane = 0 AND g.lease_until < 'infinity'::timestamptz
               AND _mq_in(l.place, g.places) AND l.place <> ALL (g.moved)
               AND _mq_log_lease_end(g.claimed_at, l.retry_backoff, l.place, g.kept,
                                     g.kept_until) > ts
               AND _mq_log_lease_end(g.claimed_at, l.retry_backoff, l.place, g.kept,
                                     g.kept_until) < until
               AND NOT EXISTS (SELECT 1 FROM mq_done d
                               WHERE d.channel_key = l.channel_key AND d.lo = g.lo
                                 AND _mq_in(l.place, d.places))
             GROUP BY l.channel_key, g.lo
             ORDER BY l.channel_key, g.lo LOOP
        UPDATE mq_receipts x
        SET kept = x.kept || ARRAY(SELECT p FROM unnest(r.places) AS p WHERE p <> ALL (x.kept)),
            kept_until = GREATEST(x.kept_until, until)
        WHERE x.channel_key = r.channel_key AND x.lo = r.lo
          AND x.lease_until < 'infinity'::timestamptz;
        IF FOUND THEN
            n := n + cardinality(r.places);
        END IF;
    END LOOP;
    RETURN n;
END;
$$;
