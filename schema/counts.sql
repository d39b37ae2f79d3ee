-- schema/counts.sql: the per-channel counters of mq_metrics (mq_counts):
-- the deltas that writers append, their folding into mq_counts, and the
-- triggers of mq_rows that count what leaves it (schema/stats.sql reads
-- them; the log counts its own in _mq_log_complete and _mq_log_count_gone).

-- Moves the deltas into mq_counts. One folder at a time (the others return
-- at once), and only in READ COMMITTED: a snapshot transaction could fail
-- on a delta another folder deleted since its snapshot.
CREATE OR REPLACE FUNCTION _mq_count_fold()
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed'
       OR NOT pg_catalog.pg_try_advisory_xact_lock(1886482797, 4) THEN
        RETURN;
    END IF;
    WITH d AS (
        DELETE FROM mq_count_deltas d RETURNING d.channel_name, d.total, d.waiting, d.removed
    ), b AS (
        DELETE FROM mq_count_batches b RETURNING b.sign, b.names, b.totals, b.waits
    ), x AS (
        SELECT d.channel_name, d.total, d.waiting, d.removed FROM d
        UNION ALL
        -- (Functions in the select list: stepped together, with no scan
        -- of a function per row as unnest in FROM takes, which cost
        -- more than twice as much.)
        SELECT e.n, e.sign * e.t, e.sign * e.w, CASE WHEN e.sign < 0 THEN e.t ELSE 0 END
        FROM (SELECT b.sign, pg_catalog.unnest(b.names) AS n, pg_catalog.unnest(b.totals) AS t,
                     pg_catalog.unnest(b.waits) AS w
              FROM b) e
    )
    INSERT INTO mq_counts AS c (channel_name, total, waiting, removed)
    SELECT x.channel_name, pg_catalog.sum(x.total), pg_catalog.sum(x.waiting),
           pg_catalog.sum(x.removed)
    FROM x
    GROUP BY x.channel_name
    ORDER BY x.channel_name
    ON CONFLICT (channel_name) DO UPDATE SET
        total = c.total OPERATOR(pg_catalog.+) excluded.total,
        waiting = c.waiting OPERATOR(pg_catalog.+) excluded.waiting,
        removed = c.removed OPERATOR(pg_catalog.+) excluded.removed;
END;
$$;

-- Appends a statement's counter deltas (mq_count_batches): sign 1 for the
-- messages it inserted, -1 for those it deleted; totals[i] messages of
-- channel names[i], waits[i] of them ordered. About one call in 250 also
-- folds. Producers call it for a batch on several channels
-- (_mq_insert_rows), the delete trigger for a statement that deleted
-- several channels' messages; for one channel both do its work inline.
DO $$
BEGIN
    IF pg_catalog.to_regprocedure('_mq_count_add(text[], bigint[], bigint[], bigint[])')
       IS NOT NULL THEN
        DROP FUNCTION _mq_count_add(text[], bigint[], bigint[], bigint[]);
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION _mq_count_batch(sign int, names text[], totals int[], waits int[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO mq_count_batches (sign, names, totals, waits)
    VALUES (sign, names, totals, waits);
    IF pg_catalog.random() < 0.004 THEN
        PERFORM _mq_count_fold();
    END IF;
END;
$$;

-- Deletes: one row per statement (mq_count_batches), one element when the
-- statement deleted messages of one channel, else one per message. A
-- statement that deletes more than a batch (_mq_limits) of several channels
-- writes a row per channel instead (mq_count_deltas), as arrays of its rows
-- could outgrow what a value may hold. (The transition table is read into
-- values first: Citus ships an INSERT to the shard as text, where the
-- transition table is unknown.)
CREATE OR REPLACE FUNCTION _mq_count_deleted()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    n       bigint;
    w       bigint;
    first_name text;
    last_name  text;
    names   text[];
    ordered int[];
    totals  bigint[];
    waits   bigint[];
BEGIN
    SELECT pg_catalog.count(*), pg_catalog.count(*) FILTER (WHERE o.chain_seq IS NOT NULL),
           pg_catalog.min(o.channel_name COLLATE "C"), pg_catalog.max(o.channel_name COLLATE "C")
    INTO n, w, first_name, last_name
    FROM mq_old_rows o;
    IF n = 0 THEN
        RETURN NULL;
    ELSIF first_name = last_name AND n <= 2147483647 THEN
        -- (_mq_count_batch's work, without the cost of calling it: see
        -- _mq_insert_rows)
        INSERT INTO mq_count_batches (sign, names, totals, waits)
        VALUES (-1, ARRAY[first_name], ARRAY[n::int], ARRAY[w::int]);
        IF pg_catalog.random() < 0.004 THEN
            PERFORM _mq_count_fold();
        END IF;
        RETURN NULL;
    ELSIF n <= (_mq_limits()).max_batch THEN
        SELECT pg_catalog.array_agg(o.channel_name),
               pg_catalog.array_agg((o.chain_seq IS NOT NULL)::int)
        INTO names, ordered
        FROM mq_old_rows o;
        PERFORM _mq_count_batch(-1, names, array_fill(1, ARRAY[n::int]), ordered);
        RETURN NULL;
    END IF;
    SELECT pg_catalog.array_agg(d.channel_name), pg_catalog.array_agg(d.total),
           pg_catalog.array_agg(d.waiting)
    INTO names, totals, waits
    FROM (SELECT o.channel_name, pg_catalog.count(*) AS total,
                 pg_catalog.count(*) FILTER (WHERE o.chain_seq IS NOT NULL) AS waiting
          FROM mq_old_rows o
          GROUP BY o.channel_name) d;
    INSERT INTO mq_count_deltas (channel_name, total, waiting, removed)
    SELECT u.n, - u.t, - u.w, u.t FROM unnest(names, totals, waits) AS u(n, t, w);
    RETURN NULL;
END;
$$;

-- A chain member skipped (mq_skip) leaves its chain. Row level, because
-- transition tables cannot go with a column list: this fires only for the
-- statements that take members out of chains, never for polls.
CREATE OR REPLACE FUNCTION _mq_count_unchained()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO mq_count_deltas (channel_name, total, waiting, removed)
    VALUES (NEW.channel_name, 0,
            (NEW.chain_seq IS NOT NULL)::int OPERATOR(pg_catalog.-)
            (OLD.chain_seq IS NOT NULL)::int, 0);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION _mq_count_truncated()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM mq_count_deltas;
    DELETE FROM mq_count_batches;
    UPDATE mq_counts SET total = 0, waiting = 0;
    RETURN NULL;
END;
$$;

-- Inserts are counted by the functions that write them (_mq_insert_rows),
-- and rows written by hand by the table's own trigger (_mq_fill_row):
-- a statement trigger here copied every inserted row into a transition table.
DO $$
BEGIN
    IF pg_catalog.to_regprocedure('_mq_count_inserted()') IS NOT NULL THEN
        DROP TRIGGER IF EXISTS _mq_count_inserted ON mq_rows;
        DROP FUNCTION _mq_count_inserted();
    END IF;
END
$$;

-- Created once, with the counts of what is already queued: CREATE TRIGGER
-- locks out writers until this migration commits, so none is missed.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                   WHERE t.tgrelid = 'mq_rows'::regclass
                     AND t.tgname = '_mq_count_deleted') THEN
        CREATE TRIGGER _mq_count_deleted AFTER DELETE ON mq_rows
            REFERENCING OLD TABLE AS mq_old_rows
            FOR EACH STATEMENT EXECUTE FUNCTION _mq_count_deleted();
        CREATE TRIGGER _mq_count_unchained AFTER UPDATE OF chain_seq ON mq_rows
            FOR EACH ROW
            WHEN ((OLD.chain_seq IS NULL) IS DISTINCT FROM (NEW.chain_seq IS NULL))
            EXECUTE FUNCTION _mq_count_unchained();
        CREATE TRIGGER _mq_count_truncated AFTER TRUNCATE ON mq_rows
            FOR EACH STATEMENT EXECUTE FUNCTION _mq_count_truncated();
        DELETE FROM mq_count_deltas;
        DELETE FROM mq_count_batches;
        DELETE FROM mq_counts;
        INSERT INTO mq_counts (channel_name, total, waiting)
        SELECT m.channel_name, pg_catalog.count(*),
               pg_catalog.count(*) FILTER (WHERE m.chain_seq IS NOT NULL)
        FROM mq_rows m
        GROUP BY m.channel_name;
    END IF;
END
$$;
