-- schema/log.sql: the log's claims: a poll's walk of the channels' cursors
-- (_mq_log_pick) and the claim of a step (_mq_log_claim), which moves the
-- cursors and writes one receipt a channel; the leases they give. What acts
-- on a delivered message is schema/log_receipts.sql; settling and reclaiming
-- are schema/log_upkeep.sql. (Producers append in _mq_insert_rows; the
-- tables are in tables.sql; DESIGN.md, Storage.)

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
-- an equal share of want each); it may visit want / per_key channels with
-- messages, or reach when that is more (channels the caller found thin),
-- and leases them (lane 0) or holds them for
-- the caller's transaction (lane 1: the cursor's row lock holds them; the
-- receipt, committed with that transaction, hands back whatever it did not
-- complete: _mq_log_reap). A channel whose cursor another claim holds is
-- passed (SKIP LOCKED); so is one whose last locked delivery died (its
-- cursor's locker aborted), in lane 1 only: lane 2 takes those, with
-- leases; and one with an urgent message ready in mq_rows (urgent: whether
-- any may be); and, when paused (some channel is: the poll's probe of
-- mq_paused), one of a paused channel (schema/pause.sql).
-- Returns one row: the jobs (mq_job_t, in place order) and how many, spent
-- (the walk found every channel with messages it could reach: another call
-- finds none), the key of the last channel the walk took from, and the keys
-- of all it took from.
DO $$
BEGIN
    IF pg_catalog.to_regprocedure('_mq_log_claim(bigint, bigint, bigint, bigint, integer, '
                                  'integer, timestamp with time zone, integer, boolean, '
                                  'boolean)') IS NOT NULL THEN
        DROP FUNCTION _mq_log_claim(bigint, bigint, bigint, bigint, integer, integer,
                                    timestamptz, integer, boolean, boolean);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_proc p
               WHERE p.oid = pg_catalog.to_regprocedure(
                         '_mq_log_claim(bigint, bigint, bigint, bigint, integer, integer, '
                         'timestamp with time zone, integer, boolean, boolean, integer)')
                 AND NOT 'more' = ANY (p.proargnames)) THEN
        DROP FUNCTION _mq_log_claim(bigint, bigint, bigint, bigint, integer, integer,
                                    timestamptz, integer, boolean, boolean, integer);
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION _mq_log_claim(lo bigint, hi bigint, start bigint, fence bigint,
                                         per_key int, want int, ts timestamptz, lane int,
                                         urgent boolean, paused boolean DEFAULT false,
                                         reach int DEFAULT 0)
RETURNS TABLE(jobs mq_job_t[], n int, spent boolean, last_key bigint, keys bigint[],
              more boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    -- (always true: an index condition, so that the plan is a probe)
    gone    boolean := EXISTS (SELECT 1 FROM mq_log_gone g
                               WHERE g.channel_key >= '-9223372036854775808'::bigint);
    horizon xid8 := pg_snapshot_xmax(pg_current_snapshot());
    visits  int := GREATEST(1, (want + per_key - 1) / per_key, reach);
    me      bigint := CASE WHEN lane <> 0 THEN _mq_xact_id() END;
    me_lo   bigint := me & 4294967295;
    wrap    boolean := start >= fence;
    locked  bigint[];
BEGIN
    IF want < 1 THEN
        RETURN;
    END IF;
    -- The cursors, locked in a statement of their own: the claim below then
    -- reads them under a snapshot that sees what they hold (a cursor moved
    -- by a claim that committed meanwhile is locked at its new place, and
    -- an UPDATE in the claim's own statement would have to follow it).
    locked := ARRAY(
        SELECT v.channel_key
        -- The one or two ranges of keys, in the walk's order and inclusive:
        -- from start up to the range's end (or up to fence - 1), then,
        -- after the wrap, from lo up to fence - 1 (none when fence <= lo).
        -- Each is a locking scan of its own, in key order under the LIMIT:
        -- the second runs only when the first gives too few, and neither
        -- locks a cursor the LIMIT does not take.
        FROM (VALUES (start, CASE WHEN wrap THEN hi ELSE LEAST(hi, fence - 1) END),
                     (lo, CASE WHEN wrap AND fence > lo THEN fence - 1 END)) r(a, b)
        CROSS JOIN LATERAL (
            SELECT c.channel_key FROM mq_cursors c
            -- The first place past the cursor: a probe a cursor, never a
            -- join that reads the log's index whole (tested again below, so
            -- that a cursor another claim moved past it meanwhile is passed).
            CROSS JOIN LATERAL (SELECT l.place FROM mq_log l
                                WHERE l.channel_key = c.channel_key AND l.place > c.place
                                ORDER BY l.place LIMIT 1) e
            WHERE c.channel_key >= r.a AND c.channel_key <= r.b
              AND e.place > c.place
              -- A cursor whose last locker died: not for the locked lane,
              -- and the only cursors lane 2 takes.
              AND (lane = 0 OR (lane = 2) = _mq_locker_died(c.xmax, me, me_lo))
              AND (NOT paused OR NOT EXISTS (SELECT 1 FROM mq_paused p
                                             WHERE p.channel_name = c.channel_name))
              -- None of a channel's messages while an urgent one of it could
              -- be claimed (mq_rows holds every message of priority above 0).
              AND (NOT urgent OR NOT EXISTS (
                       SELECT 1 FROM mq_rows m
                       WHERE m.channel_key = c.channel_key
                         AND m.dead_since IS NULL AND m.after_message_id IS NULL
                         AND m.priority > 0 -- mq_msgs_ready_urgent
                         AND m.ready_at <= ts AND m.attempt_at <= ts
                         AND m.attempts > 0))
            ORDER BY c.channel_key
            FOR NO KEY UPDATE OF c SKIP LOCKED) v
        WHERE r.b IS NOT NULL
        LIMIT visits);
    IF cardinality(locked) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH cur AS (
        SELECT c.channel_key, c.place,
               CASE WHEN c.channel_key >= start THEN 0 ELSE 1 END AS o -- (after the wrap: 1)
        FROM mq_cursors c
        WHERE c.channel_key = ANY (locked)),
    share AS (
        SELECT cardinality(locked) < visits AS spent,
               CASE WHEN cardinality(locked) < visits
                    THEN GREATEST(per_key, (want + cardinality(locked) - 1) / cardinality(locked))
                    ELSE per_key END AS n),
    took AS MATERIALIZED (
        SELECT t.*, cur.o FROM cur, LATERAL (
            SELECT l.place, l.channel_key, l.id, l.created_at, l.attempts, l.retry_backoff,
                   l.channel_name, l.channel_args, l.name, l.payload_json, l.payload_bytes
            FROM mq_log l
            WHERE l.channel_key = cur.channel_key AND l.place > cur.place
              -- (deleted before delivery: passed, not counted; the marks of
              -- the channel past its cursor: a hashed plan reads only those)
              AND (NOT gone OR NOT EXISTS (SELECT 1 FROM mq_log_gone g
                                           WHERE g.channel_key = l.channel_key
                                             AND g.place = l.place
                                             AND g.channel_key = cur.channel_key
                                             AND g.place > cur.place))
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
        RETURNING cardinality(places) AS k)
    SELECT array_agg(ROW(t.id, true, t.name, t.payload_json::text, t.payload_bytes,
                         CASE WHEN lane = 1 THEN interval '0'
                              ELSE _mq_log_lease(t.retry_backoff) END,
                         interval '0', t.channel_name, t.channel_args, 1, t.attempts - 1,
                         NULL::text, false)::mq_job_t ORDER BY t.place),
           count(*)::int, (SELECT share.spent FROM share),
           -- (the walk's last channel: the greatest after the wrap, if any)
           COALESCE(max(t.channel_key) FILTER (WHERE t.o = 1), max(t.channel_key)),
           array_agg(DISTINCT t.channel_key),
           -- (a channel that gave its whole share may have more)
           (SELECT max(r.k) FROM receipts r) >= (SELECT share.n FROM share)
    FROM took t;
END;
$$;

-- The log's part of a poll: up to want messages of channel_names (NULL:
-- every channel), visited in turn as _mq_pick_set visits mq_rows: an
-- unfiltered poll from after the channel this session's previous one took
-- from last, a named one from a random point of each name's range, each
-- walk around its range once. Round 1 takes at most a quarter of the batch
-- from each channel; round 2 (a later call, after mq_rows' pick) visits the
-- same channels again, from the same start, for the rest. paused: as in
-- _mq_log_claim.
CREATE OR REPLACE FUNCTION _mq_log_pick(channel_names text[], batch_size int, want int,
                                        ts timestamptz, lane int, round int,
                                        paused boolean DEFAULT false)
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
    reach    int := 0;          -- channels the next step may visit (_mq_log_claim)
    urgent   boolean;
    more     boolean := false; -- a channel taken from may have more
    step     boolean;
BEGIN
    -- (On Citus nothing is logged: every message is a row of mq_rows.)
    IF current_setting('pqmq.citus', true) = 'on' THEN
        RETURN;
    END IF;
    IF want < 1 THEN
        RETURN;
    END IF;
    -- One probe of an index that is empty unless priorities are used.
    urgent := EXISTS (SELECT 1 FROM mq_rows m
                      WHERE m.dead_since IS NULL AND m.after_message_id IS NULL
                        AND m.priority > 0 -- mq_msgs_ready_urgent
                        AND m.ready_at <= ts);
    -- (round 1 passes a channel with an urgent message, which mq_rows'
    -- pick may take before round 2)
    more := urgent;
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
                            WHERE c.channel_key >= '-9223372036854775808'::bigint -- (a probe)
                            ORDER BY c.channel_key LIMIT 1), s0);
            s0 := ((s0 >> 32) << 32) + floor(random() * 4294967296)::bigint;
        END IF;
        IF round = 1 THEN
            -- (round 2 runs in the same transaction: nothing of it stays in
            -- the session)
            PERFORM set_config(began, to_hex(s0), true);
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
            SELECT c.jobs, c.n, c.spent, c.last_key, c.keys, c.more
            INTO taken, n, spent, last, ks, step
            FROM _mq_log_claim(rg.lo, rg.hi, start, rg.s, per_key, want - got, ts, lane,
                               urgent, paused, reach) c;
            EXIT WHEN COALESCE(n, 0) = 0;
            RETURN QUERY SELECT * FROM unnest(taken);
            got := got + n;
            more := more OR COALESCE(step, true);
            -- Channels that gave less than their share: the next step visits
            -- as many as the rest needs at the density seen (not want /
            -- per_key again, a step per few messages of a thin backlog).
            -- Not in the locked lane, which holds every cursor it locks until
            -- its transaction ends, those it then takes nothing from too.
            IF lane <> 1 AND n < cardinality(ks) * per_key THEN
                reach := LEAST(want - got, ceil((want - got)::numeric * cardinality(ks) / n)::int);
            END IF;
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
    IF round = 1 THEN
        PERFORM set_config('pqmq.log_more', CASE WHEN more THEN 'on' ELSE 'off' END, true);
    END IF;
    IF cardinality(keys) > 0 THEN
        PERFORM _mq_log_upkeep(ts, keys);
    END IF;
END;
$$;

-- The latest lease of a receipt in flight that ends at or after `after`,
-- in the key range lo..hi (whole: every key), for an empty poll's wait
-- time (_mq_wait_time): read from the top of mq_receipts_open down. The
-- receipts in flight are the latest claims', and the entries that the
-- receipts finished since the last vacuum left in the index lie below
-- them; an index scan marks those it passes dead, and later scans skip
-- them. A bitmap would read every entry of the range each time, and mark
-- none: the settings keep the plan to the index scan whatever the
-- statistics (they count few open receipts, and a bitmap looks cheap) or
-- the session's settings say. PL/pgSQL, which keeps its plan for the
-- session: a SQL function with settings is planned again at every call.
CREATE OR REPLACE FUNCTION _mq_latest_lease(after timestamptz, lo bigint, hi bigint,
                                            whole boolean)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET enable_indexscan = on
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
BEGIN
    RETURN (SELECT r.lease_until FROM mq_receipts r
            WHERE r.lease_until < 'infinity'::timestamptz -- mq_receipts_open
              AND r.lease_until >= _mq_latest_lease.after
              AND (_mq_latest_lease.whole
                   OR r.channel_key >= _mq_latest_lease.lo
                      AND r.channel_key <= _mq_latest_lease.hi)
              AND (r.holder IS NULL
                   OR r.holder IS DISTINCT FROM pg_current_xact_id_if_assigned())
            ORDER BY r.lease_until DESC LIMIT 1);
END;
$$;
