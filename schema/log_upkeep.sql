-- schema/log_upkeep.sql: the log's upkeep: finding messages whose
-- producers committed after a cursor passed them (_mq_log_settle), deleting
-- each channel's finished part (_mq_log_reclaim), the session's schedule of
-- both (_mq_log_upkeep), and clearing or reading a channel's live logged
-- messages (mq_clear, mq_purge). (DESIGN.md, Storage.)

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
    -- (On Citus nothing is logged: every message is a row of mq_rows.)
    IF current_setting('pqmq.citus', true) = 'on' THEN
        RETURN;
    END IF;
    IF keys IS NULL THEN
        keys := ARRAY(SELECT x.channel_key FROM mq_cursors x
                      WHERE x.channel_key >= '-9223372036854775808'::bigint -- (a probe)
                        AND x.settled < x.place
                      ORDER BY x.channel_key LIMIT 256);
    END IF;
    -- (Only the channels with a final range, whose first receipt past the
    -- settled place is: a claim passes a cursor held, and this holds each
    -- it visits until the poll's transaction ends.)
    FOR c IN SELECT x.channel_key, x.settled FROM mq_cursors x
             WHERE x.channel_key = ANY (keys)
               AND x.settled < x.place
               AND (SELECT r.horizon FROM mq_receipts r
                    WHERE r.channel_key = x.channel_key AND r.lo > x.settled
                    ORDER BY r.lo LIMIT 1) <= oldest
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
          -- (the channel's marks in the range: a hashed plan reads only those)
          AND (NOT gone OR NOT EXISTS (SELECT 1 FROM mq_log_gone g
                                       WHERE g.channel_key = l.channel_key
                                         AND g.place = l.place
                                         AND g.channel_key = c.channel_key
                                         AND g.place > c.settled AND g.place <= top));
        IF seen > given THEN
            -- The range's places less those its receipts gave and those
            -- marked gone: one hashed set difference, where a probe of the
            -- receipts for each place cost more than the rest of the upkeep.
            SELECT array_agg(x.place ORDER BY x.place) INTO late
            FROM (SELECT l.place FROM mq_log l
                  WHERE l.channel_key = c.channel_key AND l.place > c.settled
                    AND l.place <= top
                  EXCEPT
                  SELECT p.place FROM mq_receipts r, unnest(r.places) AS p(place)
                  WHERE r.channel_key = c.channel_key AND r.lo > c.settled
                    AND r.lo <= top
                  EXCEPT
                  SELECT g.place FROM mq_log_gone g
                  WHERE g.channel_key = c.channel_key AND g.place > c.settled
                    AND g.place <= top) x;
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
    -- (On Citus nothing is logged: every message is a row of mq_rows.)
    IF current_setting('pqmq.citus', true) = 'on' THEN
        RETURN 0;
    END IF;
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
    -- (On Citus nothing is logged: every message is a row of mq_rows.)
    IF current_setting('pqmq.citus', true) = 'on' THEN
        RETURN;
    END IF;
    IF keys IS NULL THEN
        keys := ARRAY(SELECT x.channel_key FROM mq_cursors x
                      WHERE x.channel_key >= '-9223372036854775808'::bigint -- (a probe)
                        AND x.reclaimed < x.settled
                      ORDER BY x.channel_key LIMIT 256);
    END IF;
    -- Only the channels with something to delete: a claim passes a cursor
    -- held, and this holds each it visits until the poll's transaction
    -- ends. What is deleted ends at the settled place, short of the
    -- channel's first open receipt: read from its own receipts in place
    -- order (the primary key), not the open ones of every channel, whose
    -- index also holds the entries of every receipt finished since vacuum;
    -- and from the reclaimed place, past the entries of those deleted.
    FOR c IN SELECT x.channel_key, x.reclaimed, y.top FROM mq_cursors x,
             LATERAL (SELECT COALESCE((SELECT LEAST(x.settled, r.lo - 1) FROM mq_receipts r
                                       WHERE r.channel_key = x.channel_key
                                         AND r.lo > x.reclaimed
                                         AND r.lease_until < 'infinity'::timestamptz
                                       ORDER BY r.lo LIMIT 1), x.settled) AS top) y
             WHERE x.channel_key = ANY (keys)
               AND x.reclaimed < x.settled
               AND y.top > x.reclaimed
             ORDER BY x.channel_key
             LIMIT 256
             FOR NO KEY UPDATE OF x SKIP LOCKED LOOP
        top := c.top;
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

-- Adds the cursors of channels (keys, with names and args) that have none.
-- A cursor another open transaction is adding is not waited for (the lock
-- timeout): the channel is recorded in mq_cursors_wanted instead, for the
-- sweep to add it should that transaction roll back. So a producer that
-- adds a channel in a long transaction holds up none of its other
-- producers; their messages are delivered once its cursor is there.
CREATE OR REPLACE FUNCTION _mq_log_add_cursors(keys bigint[], names text[], args text[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET lock_timeout = '5ms'
AS $$
BEGIN
    FOR i IN 1 .. cardinality(keys) LOOP
        BEGIN
            INSERT INTO mq_cursors (channel_key, channel_name, channel_args)
            VALUES (keys[i], names[i], args[i])
            ON CONFLICT DO NOTHING;
            INSERT INTO mq_cursor_keys (channel_key) VALUES (keys[i])
            ON CONFLICT DO NOTHING;
        EXCEPTION WHEN lock_not_available THEN
            INSERT INTO mq_cursors_wanted (channel_key, channel_name, channel_args)
            VALUES (keys[i], names[i], args[i]);
        END;
    END LOOP;
END;
$$;

-- Deletes the cursors of channels drained for ten minutes (nothing in the
-- log, no receipt, everything settled and reclaimed, the same place since
-- a sweep first saw them so), at most 10,000 a call, so that the walks
-- of polls pass only channels with a log; a channel's next producer adds
-- its cursor again (at place 0: every place it takes is later). A producer
-- that found a cursor before its deletion committed adds none: its message
-- has no cursor until every transaction that was running when the deletion
-- committed has ended (the horizon the next sweep writes); then the cursor
-- comes back at its old place, or the row is forgotten. Called by the sweep
-- of every channel (_mq_log_upkeep with keys NULL).
CREATE OR REPLACE FUNCTION _mq_log_retire(ts timestamptz)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    keys  bigint[];
    names text[];
    args  text[];
BEGIN
    -- Channels whose cursor a producer could not add (its adder was open):
    -- added now, unless they have one or nothing in the log.
    WITH t AS (
        DELETE FROM mq_cursors_wanted t
        WHERE t.channel_key >= '-9223372036854775808'::bigint -- (a probe)
        RETURNING t.channel_key, t.channel_name, t.channel_args)
    SELECT array_agg(w.channel_key), array_agg(w.channel_name), array_agg(w.channel_args)
    INTO keys, names, args
    FROM (SELECT DISTINCT ON (t.channel_key) t.channel_key, t.channel_name, t.channel_args
          FROM t ORDER BY t.channel_key) w
    WHERE (SELECT c.channel_key FROM mq_cursors c WHERE c.channel_key = w.channel_key) IS NULL
      AND (SELECT l.place FROM mq_log l WHERE l.channel_key = w.channel_key LIMIT 1) IS NOT NULL;
    IF keys IS NOT NULL THEN
        PERFORM _mq_log_add_cursors(keys, names, args);
    END IF;
    -- Deletions that committed before this statement: producers that saw
    -- those cursors have xids below this snapshot's xmax.
    UPDATE mq_cursors_retired t SET horizon = pg_snapshot_xmax(pg_current_snapshot())
    WHERE t.horizon IS NULL
      AND t.channel_key >= '-9223372036854775808'::bigint; -- (a probe)
    WITH done AS (
        DELETE FROM mq_cursors_retired t
        WHERE t.horizon <= pg_snapshot_xmin(pg_current_snapshot())
          AND t.channel_key >= '-9223372036854775808'::bigint
        RETURNING t.channel_key, t.place),
    back AS (
        INSERT INTO mq_cursors (channel_key, place, settled, reclaimed, channel_name,
                                channel_args)
        SELECT d.channel_key, d.place, d.place, d.place, f.channel_name, f.channel_args
        FROM done d
        CROSS JOIN LATERAL (SELECT l.channel_name, l.channel_args FROM mq_log l
                            WHERE l.channel_key = d.channel_key AND l.place > d.place
                            ORDER BY l.place LIMIT 1) f
        ON CONFLICT DO NOTHING
        RETURNING channel_key)
    INSERT INTO mq_cursor_keys (channel_key)
    SELECT b.channel_key FROM back b
    ON CONFLICT DO NOTHING;
    -- The drained channels not yet seen so at their place, or seen so for
    -- ten minutes: read first, without a lock (a lock is a write, and an
    -- empty poll, which comes here, writes nothing else), then locked and
    -- tested again. (Probes a cursor whatever ANALYZE saw: scalar
    -- subqueries. A channel's rows and receipts up to its reclaimed place
    -- are deleted: the probes start past it, not at the entries of those
    -- deleted since vacuum.)
    keys := ARRAY(
        SELECT x.channel_key FROM mq_cursors x
        WHERE x.channel_key >= '-9223372036854775808'::bigint -- (a probe)
          AND x.reclaimed = x.place AND x.settled = x.place
          AND (x.drained_place IS DISTINCT FROM x.place
               OR x.drained_at <= ts - interval '10 minutes')
          AND (SELECT l.place FROM mq_log l WHERE l.channel_key = x.channel_key
                 AND l.place > x.reclaimed LIMIT 1) IS NULL
          AND (SELECT r.lo FROM mq_receipts r WHERE r.channel_key = x.channel_key
                 AND r.lo > x.reclaimed LIMIT 1) IS NULL
        ORDER BY x.channel_key
        LIMIT 10000);
    IF cardinality(keys) = 0 THEN
        RETURN;
    END IF;
    keys := ARRAY(
        SELECT x.channel_key FROM mq_cursors x
        WHERE x.channel_key = ANY (keys)
          AND x.reclaimed = x.place AND x.settled = x.place
          AND (SELECT l.place FROM mq_log l WHERE l.channel_key = x.channel_key
                 AND l.place > x.reclaimed LIMIT 1) IS NULL
          AND (SELECT r.lo FROM mq_receipts r WHERE r.channel_key = x.channel_key
                 AND r.lo > x.reclaimed LIMIT 1) IS NULL
        ORDER BY x.channel_key
        FOR UPDATE SKIP LOCKED);
    UPDATE mq_cursors x SET drained_at = ts, drained_place = x.place
    WHERE x.channel_key = ANY (keys) AND x.drained_place IS DISTINCT FROM x.place;
    keys := ARRAY(SELECT x.channel_key FROM mq_cursors x
                  WHERE x.channel_key = ANY (keys) AND x.drained_place = x.place
                    AND x.drained_at <= ts - interval '10 minutes');
    IF cardinality(keys) = 0 THEN
        RETURN;
    END IF;
    WITH gone AS (
        DELETE FROM mq_cursors c WHERE c.channel_key = ANY (keys)
        RETURNING c.channel_key, c.place)
    INSERT INTO mq_cursors_retired (channel_key, place)
    SELECT g.channel_key, g.place FROM gone g
    ON CONFLICT (channel_key) DO UPDATE SET place = EXCLUDED.place, horizon = NULL;
END;
$$;

-- What a poll does for the log for the channels it took from (keys, whose
-- cursors it holds): look for late producers' messages (_mq_log_settle)
-- and delete finished rows (_mq_log_reclaim), for each channel whose first
-- receipt past its settled place is a second old, so about once a second
-- a busy channel, whichever sessions poll it (the queue's tables keep the
-- time). A poll that finds nothing (keys NULL) sweeps: does both for the
-- channels whose first receipt past the settled place is a second old, or
-- that have none and something to reclaim (at most 256 each), once a
-- second a session at most; a busy session does so every ten seconds too
-- (from ten seconds after its first upkeep: a session setting, which a
-- pooler that resets sessions clears, leaving the empty polls), so that a
-- late message of a channel no poll takes from again is found (semantic
-- 21).
CREATE OR REPLACE FUNCTION _mq_log_upkeep(ts timestamptz, keys bigint[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    sec   bigint := floor(extract(epoch FROM ts))::bigint;
    swept text := current_setting('pqmq.log_swept', true);
BEGIN
    -- (On Citus nothing is logged: every message is a row of mq_rows.)
    IF current_setting('pqmq.citus', true) = 'on' THEN
        RETURN;
    END IF;
    IF swept IS NULL OR swept !~ '^[0-9]{1,12}$' THEN
        PERFORM set_config('pqmq.log_swept', sec::text, false);
    ELSIF keys IS NULL AND sec = swept::bigint THEN
        -- (A poll that finds nothing sweeps at most once a second a
        -- session: under a light load most polls find nothing, and a
        -- sweep each cost more than all the rest of the work.)
        RETURN;
    ELSIF keys IS NULL OR sec - swept::bigint >= 10 THEN
        keys := NULL; -- (the sweep of every channel)
        PERFORM set_config('pqmq.log_swept', sec::text, false);
    END IF;
    IF keys IS NOT NULL THEN
        -- (one probe of mq_receipts' primary key a channel)
        keys := ARRAY(SELECT c.channel_key FROM mq_cursors c
                      WHERE c.channel_key = ANY (keys)
                        AND (SELECT r.claimed_at FROM mq_receipts r
                             WHERE r.channel_key = c.channel_key AND r.lo > c.settled
                             ORDER BY r.lo LIMIT 1) <= ts - interval '1 second');
        IF cardinality(keys) > 0 THEN
            PERFORM _mq_log_settle(ts, keys);
            PERFORM _mq_log_reclaim(keys);
        END IF;
        RETURN;
    END IF;
    -- The sweep takes the channels whose work no poll's upkeep took up:
    -- by the same rule, the first receipt past the settled place a second
    -- old, or none. Not the busy channels that their polls keep: the sweep
    -- holds each cursor it visits (a claim passes a held cursor) until
    -- this poll's transaction ends, and a sweep of every busy channel
    -- would keep claims from all of them meanwhile.
    PERFORM _mq_log_settle(ts, ARRAY(
        SELECT x.channel_key FROM mq_cursors x
        WHERE x.channel_key >= '-9223372036854775808'::bigint -- (a probe)
          AND x.settled < x.place
          AND (SELECT r.claimed_at FROM mq_receipts r
               WHERE r.channel_key = x.channel_key AND r.lo > x.settled
               ORDER BY r.lo LIMIT 1) <= ts - interval '1 second'
        ORDER BY x.channel_key LIMIT 256));
    PERFORM _mq_log_reclaim(ARRAY(
        SELECT x.channel_key FROM mq_cursors x
        WHERE x.channel_key >= '-9223372036854775808'::bigint -- (a probe)
          AND x.reclaimed < x.settled
          AND COALESCE((SELECT r.claimed_at FROM mq_receipts r
                        WHERE r.channel_key = x.channel_key AND r.lo > x.settled
                        ORDER BY r.lo LIMIT 1) <= ts - interval '1 second', true)
        ORDER BY x.channel_key LIMIT 256));
    PERFORM _mq_log_retire(ts);
END;
$$;
