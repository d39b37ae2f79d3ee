-- schema/pick_walks.sql: the three loose index scans of a pick
-- (_mq_pick_set, schema/pick.sql): a channel's plain messages
-- (_mq_pick_keys), its urgent ones (_mq_pick_urgent) and the heads of its
-- chains (_mq_pick_chains). Each walks chain keys one probe at a time and
-- differs in the index it walks and the order it takes a key's rows in.


-- One visit of the channels whose chain key lies in [lo, hi], starting at
-- key start (_mq_pick_set chooses it) and wrapping around once: takes up to per_key ready messages
-- of priority 0 from each channel (fewer by what the channel gave this poll
-- already: none after _mq_pick_urgent took its allowance, as a channel may
-- have urgent messages left then), up to `want` in all, visiting at most
-- `budget` channels per direction, from the place mark on (_mq_low_mark: the
-- probes pass the entries of deleted messages before it without visiting
-- the heap). Locks what it returns (FOR NO KEY UPDATE SKIP LOCKED), so
-- concurrent pollers skip each other's rows instead of waiting. Appends the
-- ids to ids, the locked row versions' ctids to tids and their chain keys
-- to keys (ids also says what not to take again), and lowers low to the
-- place (ready_at) of the first claimable message of the channels it took
-- from. lane: as in _mq_pick_set. paused: whether any channel is paused
-- (mq_claim_lane's probe of mq_paused): the walk passes a paused channel's
-- name in one step, all its keys at once (a name whose hash equals a paused
-- one's shares its range of keys, and is passed with it by the walks of an
-- unfiltered poll while the pause lasts: one pair of names in 2^32).
--
CREATE OR REPLACE FUNCTION _mq_pick_keys(only_name text, lo bigint, hi bigint,
                                         start bigint, per_key int, want int, budget int,
                                         ts timestamptz, lane int, mark timestamptz,
                                         INOUT ids uuid[], INOUT tids tid[],
                                         INOUT keys bigint[], INOUT low timestamptz,
                                         paused boolean DEFAULT false)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    -- (as in _mq_pick_set)
    me    bigint := CASE WHEN lane <> 0 THEN _mq_xact_id() END;
    me_lo bigint := me & 4294967295;
BEGIN
    -- Each probe finds the next chain key that has a claimable message, and
    -- where in the key that message is (at): the messages in flight and the
    -- dead entries before it are stepped over once, by the probe, and the
    -- key's scan starts at it. A key with nothing claimable is passed by.
    SELECT ids || COALESCE(array_agg(j.id), '{}'), tids || COALESCE(array_agg(j.ctid), '{}'),
           keys || COALESCE(array_agg(j.k), '{}'), LEAST(low, min(j.at))
    INTO ids, tids, keys, low FROM (
        -- The walk: the keys from start up to hi, then from lo up to start,
        -- at most budget keys in each direction (d); a step is one probe
        -- from the key after the last one found, and a probe that finds
        -- nothing ends the direction. (_mq_pick_chains and _mq_pick_urgent
        -- walk the same way.)
        SELECT r.id, r.ctid, ks.k, ks.at
        FROM (SELECT u.k, u.at,
                     GREATEST(0, per_key - cardinality(array_positions(keys, u.k))) AS lim
              FROM (VALUES (start, hi), (lo, CASE WHEN start > lo THEN start - 1 END)) d(a, b),
              LATERAL (
                  -- (skip: the key's channel is paused, only looked up when
                  -- some channel is: the walk is not taken from and the next
                  -- probe starts past the name's range of keys, one step
                  -- for all of its args.)
                  WITH RECURSIVE walk(k, at, skip, n) AS (
                      SELECT NULL::bigint, NULL::timestamptz, false, 0
                      UNION ALL
                      SELECT f.k, f.at,
                             paused AND EXISTS (SELECT 1 FROM mq_paused p
                                                WHERE p.channel_name = f.nm),
                             w.n + 1
                      FROM walk w, LATERAL (
                          SELECT m.channel_key AS k, m.ready_at AS at, m.channel_name AS nm
                          FROM mq_rows m
                          WHERE m.priority <= 0 -- mq_msgs_ready_plain
                            AND _mq_claimable(m.dead_since, m.after_message_id, m.ready_at,
                                             m.attempt_at, m.attempts, m.id,
                                             m.channel_name, mark, ts, only_name, ids)
                            AND m.channel_key >= _mq_walk_next(
                                    CASE WHEN w.skip THEN w.k | 4294967295 ELSE w.k END,
                                    d.a, d.b)
                            AND m.channel_key <= d.b
                          ORDER BY m.channel_key, m.ready_at LIMIT 1) f
                      WHERE w.n < budget
                  )
                  SELECT w.k, w.at FROM walk w WHERE w.k IS NOT NULL AND NOT w.skip) u) ks,
        LATERAL (
            SELECT m.id, m.ctid FROM mq_rows m
            WHERE m.channel_key = ks.k
              AND m.priority <= 0
              -- Steps over the messages in flight (see ready_at).
              AND _mq_claimable(m.dead_since, m.after_message_id, m.ready_at, m.attempt_at,
                               m.attempts, m.id, m.channel_name, ks.at, ts, only_name, ids)
              -- The locked lane: first deliveries not left by a dead locker.
              AND _mq_lane_admits(lane, m.deliveries, m.xmax, me, me_lo)
            ORDER BY m.ready_at
            LIMIT ks.lim
            FOR NO KEY UPDATE SKIP LOCKED
        ) r
        LIMIT want - cardinality(ids)
    ) j;
END;
$$;

-- The chains whose key lies in [lo, hi], visited as _mq_pick_keys visits
-- channels (from start, wrapping around once, at most budget keys per
-- direction, a loose index scan of mq_msgs_chain): from each, its head, if
-- a poll of this lane may claim it and its channel has allowance left
-- (per_key, less what it gave this poll already). The head is the key's
-- first live entry and nothing else of the chain is ever looked at: when
-- the head cannot be claimed (in flight, delayed, uncommitted, dead, or
-- locked by another transaction, the locked lane's or a completion's) the
-- chain gives nothing. So the head is read first and then locked by its
-- TID (SKIP LOCKED): a lock that fails, or finds the row changed since,
-- takes nothing; a scan that locked as it went would step to the second
-- member. With urgent (some channel has urgent messages) a head is taken
-- only if no claimable urgent message of its channel has a higher priority
-- (_mq_pick_set calls this again after _mq_pick_urgent). Appends as
-- _mq_pick_keys does. Under a held snapshot the entries of deleted members
-- before a head are visited in the heap by each probe (the low-water mark
-- covers the ready indexes only).
CREATE OR REPLACE FUNCTION _mq_pick_chains(only_name text, lo bigint, hi bigint,
                                           start bigint, per_key int, want int, budget int,
                                           ts timestamptz, lane int, urgent boolean,
                                           mark timestamptz, INOUT ids uuid[],
                                           INOUT tids tid[], INOUT keys bigint[],
                                           paused boolean DEFAULT false)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    -- (as in _mq_pick_set)
    me      bigint := CASE WHEN lane <> 0 THEN _mq_xact_id() END;
    me_lo   bigint := me & 4294967295;
BEGIN
    IF cardinality(ids) >= want THEN
        RETURN;
    END IF;
    SELECT ids || COALESCE(array_agg(j.id), '{}'), tids || COALESCE(array_agg(j.ctid), '{}'),
           keys || COALESCE(array_agg(j.k), '{}')
    INTO ids, tids, keys FROM (
        SELECT r.id, r.ctid, ks.k
        FROM (VALUES (start, hi), (lo, CASE WHEN start > lo THEN start - 1 END)) d(a, b),
        LATERAL ( -- (the walk of _mq_pick_keys)
            -- The probe has no upper bound: every entry of mq_msgs_chain
            -- qualifies, so it stops at the first one whatever the bounds,
            -- but PostgreSQL 15 tests each entry left on the index page
            -- against each bound, once a chain, so a bound it does not need
            -- costs every pick. The key found past the range ends the walk
            -- and is not taken.
            -- A paused channel's chains are passed as _mq_pick_keys passes
            -- its keys (skip): each keeps its head, so its order holds.
            WITH RECURSIVE walk(k, at, skip, n) AS (
                SELECT NULL::bigint, NULL::tid, false, 0 WHERE d.a <= d.b
                UNION ALL
                SELECT f.k, f.at,
                       paused AND EXISTS (SELECT 1 FROM mq_paused p WHERE p.channel_name = f.nm),
                       w.n + 1
                FROM walk w, LATERAL (
                    SELECT m.channel_key AS k, m.ctid AS at, m.channel_name AS nm FROM mq_rows m
                    WHERE m.chain_seq IS NOT NULL -- mq_msgs_chain
                      AND m.channel_key >= _mq_walk_next(
                              CASE WHEN w.skip THEN w.k | 4294967295 ELSE w.k END, d.a, d.b)
                    ORDER BY m.channel_key, m.chain_seq LIMIT 1) f
                WHERE w.n < budget
            )
            SELECT w.k, w.at FROM walk w WHERE w.k <= d.b AND NOT w.skip) ks,
        LATERAL (
            -- The head's row version as this statement sees it, by TID.
            SELECT m.id, m.ctid FROM mq_rows m
            WHERE m.ctid = ks.at
              AND m.dead_since IS NULL
              AND m.attempt_at <= ts
              AND m.attempts > 0
              AND (only_name IS NULL OR m.channel_name = only_name)
              AND m.id <> ALL (ids)
              AND (cardinality(keys) = 0 -- (the first pick of a poll: nothing to count)
                   OR per_key > cardinality(array_positions(keys, ks.k)))
              -- The locked lane: first deliveries not left by a dead locker.
              AND _mq_lane_admits(lane, m.deliveries, m.xmax, me, me_lo)
              AND (NOT urgent OR NOT EXISTS (
                    SELECT 1 FROM mq_rows u
                    WHERE u.channel_key = ks.k
                      AND u.priority > 0 -- mq_msgs_ready_urgent
                      AND u.priority > m.priority
                      AND _mq_claimable(u.dead_since, u.after_message_id, u.ready_at,
                                       u.attempt_at, u.attempts, u.id, u.channel_name,
                                       mark, ts, NULL, ids)))
            FOR NO KEY UPDATE SKIP LOCKED
        ) r
        LIMIT want - cardinality(ids)
    ) j;
END;
$$;

-- _mq_pick_keys for the urgent messages (priority above 0, in
-- mq_msgs_ready_urgent): from each channel visited, up to per_key ready
-- messages (fewer by what it gave this poll already), highest priority
-- first and, within a priority, in the order of their places. Appends to
-- full_keys the channels that gave all they were allowed to, which may
-- hold more urgent messages (_mq_pick_set visits them again).
CREATE OR REPLACE FUNCTION _mq_pick_urgent(only_name text, lo bigint, hi bigint,
                                           start bigint, per_key int, want int, budget int,
                                           ts timestamptz, lane int, mark timestamptz,
                                           INOUT ids uuid[], INOUT tids tid[],
                                           INOUT keys bigint[], INOUT low timestamptz,
                                           INOUT full_keys bigint[],
                                           paused boolean DEFAULT false)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    got_key bigint[]; -- the keys taken from, and their allowances (full_keys)
    got_lim int[];
    -- (as in _mq_pick_set)
    me    bigint := CASE WHEN lane <> 0 THEN _mq_xact_id() END;
    me_lo bigint := me & 4294967295;
BEGIN
    -- As in _mq_pick_keys, where the index has the priority (negated, so
    -- that the highest comes first) between the chain key and the place:
    -- a probe finds a key's first claimable message in that order, and the
    -- key's scan starts at its (priority, place). Within a key the scan
    -- does not stop at now: it passes the entries of urgent messages not
    -- ready yet in the index, without visiting the heap.
    SELECT ids || COALESCE(array_agg(j.id), '{}'), tids || COALESCE(array_agg(j.ctid), '{}'),
           LEAST(low, min(j.at)), array_agg(j.k), array_agg(j.lim)
    INTO ids, tids, low, got_key, got_lim FROM (
        SELECT r.id, r.ctid, ks.k, ks.lim, ks.at
        FROM (SELECT u.k, u.np, u.at,
                     GREATEST(0, per_key - cardinality(array_positions(keys, u.k))) AS lim
              FROM (VALUES (start, hi), (lo, CASE WHEN start > lo THEN start - 1 END)) d(a, b),
              LATERAL ( -- (the walk of _mq_pick_keys)
                  WITH RECURSIVE walk(k, np, at, skip, n) AS (
                      SELECT NULL::bigint, NULL::smallint, NULL::timestamptz, false, 0
                      UNION ALL
                      SELECT f.k, f.np, f.at,
                             paused AND EXISTS (SELECT 1 FROM mq_paused p
                                                WHERE p.channel_name = f.nm),
                             w.n + 1
                      FROM walk w, LATERAL (
                          SELECT m.channel_key AS k, -m.priority AS np, m.ready_at AS at,
                                 m.channel_name AS nm
                          FROM mq_rows m
                          WHERE m.priority > 0 -- mq_msgs_ready_urgent
                            AND _mq_claimable(m.dead_since, m.after_message_id, m.ready_at,
                                             m.attempt_at, m.attempts, m.id,
                                             m.channel_name, mark, ts, only_name, ids)
                            AND m.channel_key >= _mq_walk_next(
                                    CASE WHEN w.skip THEN w.k | 4294967295 ELSE w.k END,
                                    d.a, d.b)
                            AND m.channel_key <= d.b
                          ORDER BY m.channel_key, -m.priority, m.ready_at LIMIT 1) f
                      WHERE w.n < budget
                  )
                  SELECT w.k, w.np, w.at FROM walk w
                  WHERE w.k IS NOT NULL AND NOT w.skip) u) ks, -- (skip: as in _mq_pick_keys)
        LATERAL (
            SELECT m.id, m.ctid FROM mq_rows m
            WHERE m.channel_key = ks.k
              AND m.priority > 0
              AND (-m.priority, m.ready_at) >= (ks.np, ks.at)
              -- Steps over the messages in flight (see ready_at).
              AND _mq_claimable(m.dead_since, m.after_message_id, m.ready_at, m.attempt_at,
                               m.attempts, m.id, m.channel_name, mark, ts, only_name, ids)
              -- The locked lane: first deliveries not left by a dead locker.
              AND _mq_lane_admits(lane, m.deliveries, m.xmax, me, me_lo)
            ORDER BY -m.priority, m.ready_at
            LIMIT ks.lim
            FOR NO KEY UPDATE SKIP LOCKED
        ) r
        LIMIT want - cardinality(ids)
    ) j;
    keys := keys || COALESCE(got_key, '{}');
    -- A key that gave its whole allowance may have more.
    full_keys := full_keys || ARRAY(
        SELECT g.k FROM unnest(got_key, got_lim) AS g(k, l)
        GROUP BY g.k, g.l HAVING count(*) >= g.l);
END;
$$;
