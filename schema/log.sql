-- schema/log.sql: the log's consumer side: claiming from channels' cursors,
-- completing by receipt, moving a logged message to mq_rows when anything
-- but its completion happens to it, reaping receipts whose leases ran out,
-- and finding messages whose producers committed after a cursor passed
-- their place. (Producers append in _mq_insert_rows; the tables are in
-- tables.sql; DESIGN.md, Storage.)

-- A logged message's lease: its backoff, or one second for a zero backoff
-- (as mq_claim_lane leases).
CREATE OR REPLACE FUNCTION _mq_log_lease(backoff interval)
RETURNS interval
LANGUAGE sql IMMUTABLE
RETURN CASE WHEN backoff > interval '0' THEN backoff ELSE interval '1 second' END;

-- When the lease of a logged message at place ends: its receipt's claim
-- time plus its lease, or kept_until if a keep-alive extended it (kept).
CREATE OR REPLACE FUNCTION _mq_log_lease_end(claimed_at timestamptz, backoff interval,
                                             place bigint, kept bigint[],
                                             kept_until timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE
RETURN CASE WHEN place = ANY (kept) THEN kept_until
            ELSE claimed_at + CASE WHEN backoff > interval '0' THEN backoff
                                   ELSE interval '1 second' END END;

-- Whether x is in sorted (ascending, as receipts and mq_done keep their
-- places): a binary search (width_bucket), where = ANY reads the whole
-- array for each place tested. Inlined: no settings.
CREATE OR REPLACE FUNCTION _mq_in(x bigint, sorted bigint[])
RETURNS boolean
LANGUAGE sql IMMUTABLE
RETURN COALESCE(sorted[width_bucket(x, sorted)] = x, false);

-- Whether a row's locker (xmax) ended without committing: a locked
-- delivery that died (me: this transaction's id, me_lo its low 32 bits;
-- this transaction counts as alive). Inlined, as _mq_lane_admits.
CREATE OR REPLACE FUNCTION _mq_locker_died(locker xid, me bigint, me_lo bigint)
RETURNS boolean
LANGUAGE sql
RETURN CASE
    WHEN locker::text::bigint < 3 OR locker::text::bigint = me_lo THEN false
    WHEN (me_lo - locker::text::bigint + 6442450944) % 4294967296 - 2147483648 < 0 THEN false
    ELSE COALESCE(pg_catalog.pg_xact_status(
                      (me - ((me_lo - locker::text::bigint + 6442450944) % 4294967296
                             - 2147483648))::text::xid8) = 'aborted', false)
    END;

-- Claims up to want logged messages of the channels whose keys are in
-- [lo, hi], visiting cursors in key order from start up to hi and then from
-- lo up to fence - 1 (start < fence: only from start up to fence - 1; a walk
-- that continues after the caller's first call), at most per_key from each
-- (or, when the walk finds fewer channels with messages than it may visit,
-- an equal share of want each), and leases them (lane 0) or holds them for
-- the caller's transaction (lane 1: the cursor's row lock holds them; the
-- receipt, committed with that transaction, hands back whatever it did not
-- complete: _mq_log_reap). A channel whose cursor another claim holds is
-- passed (SKIP LOCKED); so is one whose last locked delivery died (its
-- cursor's locker aborted), in lane 1 only: lane 2 takes those, with
-- leases; and one with an urgent message ready in mq_rows (urgent: whether
-- any may be).
-- Returns the jobs (mq_job_t), each with its channel's key, its place, o
-- (0: found from start up, 1: after the wrap) and spent (the walk found
-- every channel with messages it could reach: another call finds none).
CREATE OR REPLACE FUNCTION _mq_log_claim(lo bigint, hi bigint, start bigint, fence bigint,
                                         per_key int, want int, ts timestamptz, lane int,
                                         urgent boolean)
RETURNS TABLE(job mq_job_t, key bigint, place bigint, o int, spent boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    -- (always true: an index condition, so that the plan is a probe)
    gone    boolean := EXISTS (SELECT 1 FROM mq_log_gone g
                               WHERE g.channel_key >= '-9223372036854775808'::bigint);
    horizon xid8 := pg_snapshot_xmax(pg_current_snapshot());
    visits  int := GREATEST(1, (want + per_key - 1) / per_key);
    me      bigint := CASE WHEN lane <> 0 THEN _mq_xact_id() END;
    me_lo   bigint := me & 4294967295;
    wrap    boolean := start >= fence;
BEGIN
    IF want < 1 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH cur AS (
        SELECT v.channel_key, v.place, v.o FROM (
            SELECT * FROM (
                SELECT c.channel_key, c.place, 0 AS o FROM mq_cursors c
                WHERE c.channel_key >= start AND c.channel_key <= hi
                  AND (wrap OR c.channel_key < fence)
                  AND EXISTS (SELECT 1 FROM mq_log l
                              WHERE l.channel_key = c.channel_key AND l.place > c.place)
                  -- A cursor whose last locker died: not for the locked
                  -- lane, and the only cursors lane 2 takes.
                  AND (lane = 0 OR (lane = 2) = _mq_locker_died(c.xmax, me, me_lo))
                  -- None of a channel's messages while an urgent one of it
                  -- could be claimed (mq_rows holds every message of
                  -- priority above 0).
                  AND (NOT urgent OR NOT EXISTS (
                           SELECT 1 FROM mq_rows m
                           WHERE m.channel_key = c.channel_key
                             AND m.dead_since IS NULL AND m.after_message_id IS NULL
                             AND m.priority > 0 -- mq_msgs_ready_urgent
                             AND m.ready_at <= ts AND m.attempt_at <= ts
                             AND m.attempts > 0))
                ORDER BY c.channel_key
                FOR NO KEY UPDATE SKIP LOCKED) a
            UNION ALL
            SELECT * FROM (
                SELECT c.channel_key, c.place, 1 AS o FROM mq_cursors c
                WHERE wrap AND c.channel_key >= lo AND c.channel_key < fence
                  AND EXISTS (SELECT 1 FROM mq_log l
                              WHERE l.channel_key = c.channel_key AND l.place > c.place)
                  AND (lane = 0 OR (lane = 2) = _mq_locker_died(c.xmax, me, me_lo))
                  AND (NOT urgent OR NOT EXISTS (
                           SELECT 1 FROM mq_rows m
                           WHERE m.channel_key = c.channel_key
                             AND m.dead_since IS NULL AND m.after_message_id IS NULL
                             AND m.priority > 0 -- mq_msgs_ready_urgent
                             AND m.ready_at <= ts AND m.attempt_at <= ts
                             AND m.attempts > 0))
                ORDER BY c.channel_key
                FOR NO KEY UPDATE SKIP LOCKED) b) v
        LIMIT visits),
    share AS (
        SELECT count(*) < visits AS spent,
               CASE WHEN count(*) < visits
                    THEN GREATEST(per_key, (want + count(*)::int - 1) / GREATEST(count(*)::int, 1))
                    ELSE per_key END AS n
        FROM cur),
    took AS MATERIALIZED (
        SELECT t.*, cur.o FROM cur, LATERAL (
            SELECT l.place, l.channel_key, l.id, l.created_at, l.attempts, l.retry_backoff,
                   l.channel_name, l.channel_args, l.name, l.payload_json, l.payload_bytes
            FROM mq_log l
            WHERE l.channel_key = cur.channel_key AND l.place > cur.place
              -- (deleted before delivery: passed, not counted)
              AND (NOT gone OR NOT EXISTS (SELECT 1 FROM mq_log_gone g
                                           WHERE g.channel_key = l.channel_key
                                             AND g.place = l.place))
            ORDER BY l.place
            LIMIT (SELECT share.n FROM share)) t
        ORDER BY cur.o, t.channel_key, t.place
        LIMIT want),
    -- A cursor with nothing but deleted messages past it moves past them.
    passed AS (
        SELECT cur.channel_key, e.top FROM cur, LATERAL (
            SELECT max(l.place) AS top FROM mq_log l
            WHERE l.channel_key = cur.channel_key AND l.place > cur.place) e
        WHERE gone AND NOT EXISTS (SELECT 1 FROM took t WHERE t.channel_key = cur.channel_key)),
    moved AS (
        UPDATE mq_cursors c SET place = r.top
        FROM (SELECT t.channel_key, max(t.place) AS top FROM took t GROUP BY t.channel_key
              UNION ALL
              SELECT p.channel_key, p.top FROM passed p WHERE p.top IS NOT NULL) r
        WHERE c.channel_key = r.channel_key
        RETURNING c.channel_key),
    receipts AS (
        INSERT INTO mq_receipts (channel_key, lo, hi, places, claimed_at, lease_until,
                                 horizon, lane, holder)
        SELECT t.channel_key, min(t.place), max(t.place), array_agg(t.place ORDER BY t.place),
               ts, CASE WHEN lane = 1 THEN ts ELSE ts + min(_mq_log_lease(t.retry_backoff)) END,
               horizon, CASE WHEN lane = 1 THEN 1 ELSE 0 END,
               CASE WHEN lane = 1 THEN pg_current_xact_id() END
        FROM took t
        GROUP BY t.channel_key
        RETURNING 1)
    SELECT ROW(t.id, true, t.name, t.payload_json::text, t.payload_bytes,
               CASE WHEN lane = 1 THEN interval '0' ELSE _mq_log_lease(t.retry_backoff) END,
               interval '0', t.channel_name, t.channel_args, 1, t.attempts - 1,
               NULL::text, false)::mq_job_t,
           t.channel_key, t.place, t.o, (SELECT share.spent FROM share)
    FROM took t
    ORDER BY t.place;
END;
$$;

-- The log's part of a poll: up to want messages of channel_names (NULL:
-- every channel), visited in turn as _mq_pick_set visits mq_rows: an
-- unfiltered poll from after the channel this session's previous one took
-- from last, a named one from a random point of each name's range, each
-- walk around its range once. Round 1 takes at most a quarter of the batch
-- from each channel; round 2 (a later call, after mq_rows' pick) visits the
-- same channels again, from the same start, for the rest.
CREATE OR REPLACE FUNCTION _mq_log_pick(channel_names text[], batch_size int, want int,
                                        ts timestamptz, lane int, round int)
RETURNS SETOF mq_job_t
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    per_key  int := CASE WHEN round = 1 THEN GREATEST(1, (batch_size + 3) / 4) ELSE want END;
    turn     text := 'pqmq.next_' || 'mq_msgs'::regclass::oid; -- (shared with _mq_pick_set)
    began    text := 'pqmq.log_began_' || 'mq_log'::regclass::oid;
    kept     text;
    s0       bigint;
    start    bigint;
    nxt      bigint;
    rg       record;
    got      int := 0;
    n        int;
    spent    boolean;
    last     bigint;
    last_key bigint;
    taken    mq_job_t[];
    ks       bigint[];
    keys     bigint[] := '{}'; -- the channels taken from
    urgent   boolean;
BEGIN
    IF want < 1 THEN
        RETURN;
    END IF;
    -- One probe of an index that is empty unless priorities are used.
    urgent := EXISTS (SELECT 1 FROM mq_rows m
                      WHERE m.dead_since IS NULL AND m.after_message_id IS NULL
                        AND m.priority > 0 -- mq_msgs_ready_urgent
                        AND m.ready_at <= ts);
    IF channel_names IS NULL THEN
        kept := current_setting(CASE WHEN round = 1 THEN turn ELSE began END, true);
        IF length(kept) BETWEEN 1 AND 16 AND btrim(kept, '0123456789abcdef') = '' THEN
            s0 := ('x' || lpad(kept, 16, '0'))::bit(64)::bigint;
        ELSE
            -- No turn (a new session, or one a pooler reset): a random key of
            -- the range of the name of the first channel at or after a random
            -- key (as _mq_random_start: a random key of the whole space
            -- would almost always start at a name's first channel).
            s0 := (floor(random() * 4294967296)::bigint - 2147483648) << 32;
            s0 := COALESCE((SELECT c.channel_key FROM mq_cursors c
                            WHERE c.channel_key >= s0
                            ORDER BY c.channel_key LIMIT 1),
                           (SELECT c.channel_key FROM mq_cursors c
                            ORDER BY c.channel_key LIMIT 1), s0);
            s0 := ((s0 >> 32) << 32) + floor(random() * 4294967296)::bigint;
        END IF;
        IF round = 1 THEN
            PERFORM set_config(began, to_hex(s0), false);
        END IF;
    END IF;
    -- The whole space from the turn, or each name's range from a random key.
    FOR rg IN SELECT (-9223372036854775808)::bigint AS lo, 9223372036854775807::bigint AS hi,
                     s0 AS s, 0::float8 AS o
              WHERE channel_names IS NULL
              UNION ALL
              SELECT r.lo, r.lo | 4294967295, r.lo + floor(random() * 4294967296)::bigint,
                     random()
              FROM (SELECT DISTINCT hashtext(u.n)::bigint << 32 AS lo
                    FROM unnest(channel_names) AS u(n) WHERE u.n IS NOT NULL) r
              ORDER BY o LOOP
        EXIT WHEN got >= want;
        start := rg.s;
        -- Around the range in steps: a step locks only the cursors it can
        -- fill from, and the next starts after the last it took from.
        LOOP
            SELECT array_agg(c.job ORDER BY c.place), count(*), bool_and(c.spent),
                   (array_agg(c.key ORDER BY c.o DESC, c.key DESC))[1],
                   array_agg(DISTINCT c.key)
            INTO taken, n, spent, last, ks
            FROM _mq_log_claim(rg.lo, rg.hi, start, rg.s, per_key, want - got, ts, lane,
                               urgent) c;
            EXIT WHEN n = 0;
            RETURN QUERY SELECT * FROM unnest(taken);
            got := got + n;
            keys := keys || ks;
            last_key := last;
            nxt := CASE WHEN last = rg.hi THEN rg.lo ELSE last + 1 END;
            EXIT WHEN got >= want OR spent OR nxt = rg.s;
            start := nxt;
        END LOOP;
    END LOOP;
    IF channel_names IS NULL AND round = 1 AND last_key IS NOT NULL THEN
        PERFORM set_config(turn, to_hex(CASE WHEN last_key = 9223372036854775807
                                             THEN -9223372036854775808
                                             ELSE last_key + 1 END), false);
    END IF;
    IF cardinality(keys) > 0 THEN
        PERFORM _mq_log_upkeep(ts, keys);
    END IF;
END;
$$;

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
    r  record;
BEGIN
    -- One count row for the statement, as mq_rows' delete trigger writes.
    INSERT INTO mq_count_batches (sign, names, totals, waits)
    SELECT -1, array_agg(g.n), array_agg(g.k), array_agg(0)
    FROM (SELECT u.n, count(*)::int AS k FROM unnest(names) AS u(n) GROUP BY u.n) g;
    FOR r IN SELECT u.n, array_agg(u.c) AS c
             FROM unnest(names, created) AS u(n, c) GROUP BY u.n LOOP
        INSERT INTO mq_event_deltas (channel_name, failed, retried, dead, completed_at, created)
        VALUES (r.n, 0, 0, 0, ts, r.c);
    END LOOP;
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
    n       int;
    names   text[];
    created timestamptz[];
    h_keys  bigint[];
    h_los   bigint[];
    h_place bigint[];
BEGIN
    IF current_setting('pqmq.citus', true) = 'on' THEN
        -- Citus ships a statement that reads the queue's tables whole to
        -- the worker, function calls and all, where _mq_log_held's own
        -- statements may not run: what it holds is read in a statement of
        -- its own first.
        SELECT array_agg(h.channel_key), array_agg(h.lo), array_agg(h.place),
               array_agg(h.channel_name), array_agg(h.created_at)
        INTO h_keys, h_los, h_place, names, created
        FROM _mq_log_held(msg_ids, false) h
        WHERE by_id IS NULL
           OR att[width_bucket(h.id, by_id)] = CASE WHEN h.lane = 1 THEN 0 ELSE 1 END;
        IF h_keys IS NULL THEN
            RETURN 0;
        END IF;
        WITH h AS MATERIALIZED (
            SELECT h.* FROM unnest(h_keys, h_los, h_place, names, created)
                AS h(channel_key, lo, place, channel_name, created_at)
            WHERE NOT EXISTS (SELECT 1 FROM mq_done d
                              WHERE d.channel_key = h.channel_key AND d.lo = h.lo
                                AND _mq_in(h.place, d.places))),
        ins AS (
            INSERT INTO mq_done (channel_key, lo, places)
            SELECT h.channel_key, h.lo, array_agg(h.place ORDER BY h.place) FROM h
            GROUP BY h.channel_key, h.lo
            RETURNING 1)
        SELECT count(*), array_agg(h.channel_name), array_agg(h.created_at)
        INTO n, names, created
        FROM h;
        IF n > 0 THEN
            PERFORM _mq_log_count_gone(names, created);
        END IF;
        RETURN n;
    END IF;
    WITH h AS MATERIALIZED (
        SELECT h.* FROM _mq_log_held(msg_ids, false) h
        WHERE (by_id IS NULL
               OR att[width_bucket(h.id, by_id)] = CASE WHEN h.lane = 1 THEN 0 ELSE 1 END)
          AND NOT EXISTS (SELECT 1 FROM mq_done d
                          WHERE d.channel_key = h.channel_key AND d.lo = h.lo
                            AND _mq_in(h.place, d.places))),
    ins AS (
        INSERT INTO mq_done (channel_key, lo, places)
        SELECT h.channel_key, h.lo, array_agg(h.place ORDER BY h.place) FROM h GROUP BY h.channel_key, h.lo
        RETURNING 1)
    SELECT count(*), array_agg(h.channel_name), array_agg(h.created_at)
    INTO n, names, created
    FROM h;
    IF n > 0 THEN
        PERFORM _mq_log_count_gone(names, created);
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
                         payload_bytes, channel_key)
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
           l.name, l.payload_json, l.payload_bytes, l.channel_key
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

-- Finds logged messages that a cursor passed before their producers
-- committed (a place is taken at insert, and a later producer of the
-- channel may commit first), and moves them to mq_rows, ready. A range of
-- a channel's places is final once every transaction that was running when
-- the claims over it were made has ended (their receipts' horizons are
-- below the oldest running transaction): its places are then checked once,
-- by count, and only a short count looks for the missing ones. Visits the
-- cursors of keys (a poll's, which holds them), or with keys NULL (a poll
-- that found nothing) at most 256 of all.
CREATE OR REPLACE FUNCTION _mq_log_settle(ts timestamptz, keys bigint[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    oldest xid8 := pg_snapshot_xmin(pg_current_snapshot());
    c      record;
    top    bigint;
    given  bigint;
    seen   bigint;
    gone   boolean;
    late   bigint[];
BEGIN
    IF keys IS NULL THEN
        keys := ARRAY(SELECT x.channel_key FROM mq_cursors x
                      WHERE x.channel_key >= '-9223372036854775808'::bigint -- (a probe)
                        AND x.settled < x.place
                      ORDER BY x.channel_key LIMIT 256);
    END IF;
    FOR c IN SELECT x.channel_key, x.settled FROM mq_cursors x
             WHERE x.channel_key = ANY (keys)
               AND x.settled < x.place
             ORDER BY x.channel_key
             LIMIT 256
             FOR NO KEY UPDATE SKIP LOCKED LOOP
        -- The receipts over final ranges, in place order, up to the first
        -- that is not.
        SELECT max(r.hi), sum(cardinality(r.places)) INTO top, given
        FROM mq_receipts r
        WHERE r.channel_key = c.channel_key AND r.lo > c.settled
          AND r.lo < COALESCE((SELECT min(q.lo) FROM mq_receipts q
                               WHERE q.channel_key = c.channel_key AND q.lo > c.settled
                                 AND q.horizon > oldest), 9223372036854775807);
        CONTINUE WHEN top IS NULL;
        -- (tombstones are rare: one probe, then none a place)
        gone := EXISTS (SELECT 1 FROM mq_log_gone g
                        WHERE g.channel_key = c.channel_key
                          AND g.place > c.settled AND g.place <= top);
        SELECT count(*) INTO seen FROM mq_log l
        WHERE l.channel_key = c.channel_key AND l.place > c.settled AND l.place <= top
          AND (NOT gone OR NOT EXISTS (SELECT 1 FROM mq_log_gone g
                                       WHERE g.channel_key = l.channel_key
                                         AND g.place = l.place));
        IF seen > given THEN
            SELECT array_agg(l.place ORDER BY l.place) INTO late
            FROM mq_log l
            WHERE l.channel_key = c.channel_key AND l.place > c.settled AND l.place <= top
              AND NOT EXISTS (SELECT 1 FROM mq_log_gone g
                              WHERE g.channel_key = l.channel_key AND g.place = l.place)
              AND NOT _mq_log_given(l.channel_key, l.place);
            PERFORM _mq_log_to_msgs(c.channel_key, late, 2, ts, '{}', NULL, ts);
            INSERT INTO mq_log_gone (channel_key, place)
            SELECT c.channel_key, p FROM unnest(late) AS p
            ON CONFLICT DO NOTHING;
        END IF;
        UPDATE mq_cursors x SET settled = top WHERE x.channel_key = c.channel_key;
    END LOOP;
END;
$$;

-- Deletes every live logged message of the given channels (all_channels:
-- of every channel), for mq_clear_count: those no claim delivered are
-- marked gone, those a receipt holds are let go by it (moved nowhere), so
-- their consumers' completions find nothing. Returns how many.
CREATE OR REPLACE FUNCTION _mq_log_clear(channel_names text[], all_channels boolean)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    c       record;
    r       record;
    k       int;
    n       int := 0;
    names   text[] := '{}';
    created timestamptz[] := '{}';
    undone  bigint[];
BEGIN
    FOR c IN SELECT x.channel_key, x.settled FROM mq_cursors x
             WHERE all_channels OR x.channel_name = ANY (channel_names)
             ORDER BY x.channel_key
             FOR NO KEY UPDATE LOOP
        WITH g AS (
            INSERT INTO mq_log_gone (channel_key, place)
            SELECT l.channel_key, l.place FROM mq_log l
            WHERE l.channel_key = c.channel_key AND l.place > c.settled
              AND NOT _mq_log_given(l.channel_key, l.place)
            ON CONFLICT DO NOTHING
            RETURNING channel_key, place)
        SELECT count(*), names || COALESCE(array_agg(l.channel_name), '{}'),
               created || COALESCE(array_agg(l.created_at), '{}')
        INTO k, names, created
        FROM g JOIN mq_log l ON l.channel_key = g.channel_key AND l.place = g.place;
        n := n + k;
        FOR r IN SELECT x.lo, x.places, x.moved FROM mq_receipts x
                 WHERE x.channel_key = c.channel_key
                   AND x.lease_until < 'infinity'::timestamptz
                 FOR UPDATE LOOP
            SELECT array_agg(p) INTO undone FROM unnest(r.places) AS p
            WHERE p <> ALL (r.moved)
              AND NOT EXISTS (SELECT 1 FROM mq_done d
                              WHERE d.channel_key = c.channel_key AND d.lo = r.lo
                                AND _mq_in(p, d.places));
            UPDATE mq_receipts x SET moved = x.moved || COALESCE(undone, '{}'),
                                     lease_until = 'infinity'::timestamptz
            WHERE x.channel_key = c.channel_key AND x.lo = r.lo;
            IF undone IS NOT NULL THEN
                SELECT names || array_agg(l.channel_name), created || array_agg(l.created_at)
                INTO names, created
                FROM mq_log l WHERE l.channel_key = c.channel_key AND l.place = ANY (undone);
                n := n + cardinality(undone);
            END IF;
        END LOOP;
    END LOOP;
    IF n > 0 THEN
        PERFORM _mq_log_count_gone(names, created);
    END IF;
    RETURN n;
END;
$$;

-- The live logged messages of channel (of one chain when args is not
-- NULL), for mq_purge: neither completed, moved nor deleted.
CREATE OR REPLACE FUNCTION _mq_log_live(channel text, args text)
RETURNS TABLE(id uuid, channel_args text, name text)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT m.id, m.channel_args, m.name
    FROM mq_log m
    LEFT JOIN LATERAL (
        SELECT x.lo, x.places, x.moved FROM mq_receipts x
        WHERE x.channel_key = m.channel_key AND x.lo <= m.place
        ORDER BY x.lo DESC LIMIT 1) g ON true
    WHERE m.channel_key >= (hashtext(channel)::bigint << 32)
      AND m.channel_key <= ((hashtext(channel)::bigint << 32) | 4294967295)
      AND m.channel_name = channel
      AND (args IS NULL OR m.channel_args = args)
      AND NOT EXISTS (SELECT 1 FROM mq_log_gone o
                      WHERE o.channel_key = m.channel_key AND o.place = m.place)
      AND (g.lo IS NULL OR m.place <> ALL (g.places)
           OR (m.place <> ALL (g.moved)
               AND NOT EXISTS (SELECT 1 FROM mq_done d
                               WHERE d.channel_key = m.channel_key AND d.lo = g.lo
                                 AND _mq_in(m.place, d.places))))
$$;

-- Deletes what the log keeps of finished messages: for each channel, the
-- rows, receipts, completions and marks up to its settled place, short of
-- the first receipt still open (a member in flight). Off the hot path: a
-- claim reads a channel's log only past its cursor, so the deleted rows
-- (dead until vacuum takes them) are never stepped over. Visits the
-- cursors of keys, or with keys NULL at most 256 of all; those another
-- session holds are passed.
CREATE OR REPLACE FUNCTION _mq_log_reclaim(keys bigint[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    c   record;
    top bigint;
BEGIN
    IF keys IS NULL THEN
        keys := ARRAY(SELECT x.channel_key FROM mq_cursors x
                      WHERE x.channel_key >= '-9223372036854775808'::bigint -- (a probe)
                        AND x.reclaimed < x.settled
                      ORDER BY x.channel_key LIMIT 256);
    END IF;
    FOR c IN SELECT x.channel_key, x.settled, x.reclaimed FROM mq_cursors x
             WHERE x.channel_key = ANY (keys)
               AND x.reclaimed < x.settled
             ORDER BY x.channel_key
             LIMIT 256
             FOR NO KEY UPDATE SKIP LOCKED LOOP
        SELECT LEAST(c.settled, min(r.lo) - 1) INTO top
        FROM mq_receipts r
        WHERE r.channel_key = c.channel_key AND r.lease_until < 'infinity'::timestamptz;
        top := COALESCE(top, c.settled);
        CONTINUE WHEN top <= c.reclaimed;
        DELETE FROM mq_done d
        WHERE d.channel_key = c.channel_key AND d.lo > c.reclaimed AND d.lo <= top
          AND EXISTS (SELECT 1 FROM mq_receipts r
                      WHERE r.channel_key = d.channel_key AND r.lo = d.lo AND r.hi <= top);
        DELETE FROM mq_receipts r
        WHERE r.channel_key = c.channel_key AND r.lo > c.reclaimed AND r.hi <= top;
        DELETE FROM mq_log_gone g
        WHERE g.channel_key = c.channel_key AND g.place > c.reclaimed AND g.place <= top;
        -- Every place up to top is final (settled), and every receipt over
        -- one is finished (top is below each live receipt's first place).
        DELETE FROM mq_log l
        WHERE l.channel_key = c.channel_key AND l.place > c.reclaimed AND l.place <= top;
        UPDATE mq_cursors x SET reclaimed = top WHERE x.channel_key = c.channel_key;
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

-- What a session does for the log once a second (a setting keeps the
-- time) for the channels its poll took from (keys, whose cursors it holds):
-- look for late producers' messages (_mq_log_settle) and delete finished
-- rows (_mq_log_reclaim). A poll that finds nothing (keys NULL) does both,
-- for any channel, every time.
CREATE OR REPLACE FUNCTION _mq_log_upkeep(ts timestamptz, keys bigint[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    sec text := (floor(extract(epoch FROM ts)))::bigint::text;
BEGIN
    IF keys IS NULL OR current_setting('pqmq.log_upkeep', true) IS DISTINCT FROM sec THEN
        PERFORM set_config('pqmq.log_upkeep', sec, false);
        PERFORM _mq_log_settle(ts, keys);
        PERFORM _mq_log_reclaim(keys);
    END IF;
END;
$$;
