-- schema/clear.sql: deleting whole channels (the original schema's mq_clear
-- and mq_clear_all).

-- Deletes every message of the given channels (all_channels: of every
-- channel), whatever its state: ready, delayed, uncommitted, held by a
-- consumer (whose completion then finds nothing: mq_complete counts 0), or
-- dead. Ordered chains go whole, so no chain is left with a gap; their
-- bookkeeping in mq_chains goes with them, and a message inserted afterwards
-- heads a new chain. Chain structure changes only under the chains'
-- advisory locks (as in mq_insert and mq_complete): those of every chain of
-- the channels are taken first, in key order, and a chain that appears after
-- that (a concurrent insert) is left alone. The nil UUID is never a message
-- (the original kept a row for it; pqmq needs none), so nothing here can
-- remove what a later ordered insert relies on. Returns how many it deleted.
CREATE OR REPLACE FUNCTION mq_clear_count(channel_names text[],
                                          all_channels boolean DEFAULT false)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    la int[];
    lb int[];
    n  int;
BEGIN
    all_channels := COALESCE(all_channels, false);
    IF NOT all_channels
       AND (channel_names IS NULL OR pg_catalog.cardinality(channel_names) = 0) THEN
        RETURN 0;
    END IF;
    SELECT pg_catalog.array_agg(k.a ORDER BY k.a, k.b),
           pg_catalog.array_agg(k.b ORDER BY k.a, k.b)
    INTO la, lb
    FROM (
        SELECT DISTINCT pg_catalog.hashtext(c.channel_name) AS a,
                        pg_catalog.hashtext(c.channel_args) AS b
        FROM (SELECT h.channel_name, h.channel_args FROM mq_chains h
              WHERE all_channels OR h.channel_name = ANY (channel_names)
              UNION
              SELECT m.channel_name, m.channel_args FROM mq_msgs m
              WHERE m.after_message_id IS NOT NULL
                AND (all_channels OR m.channel_name = ANY (channel_names))) c
    ) k;
    PERFORM pg_catalog.pg_advisory_xact_lock(u.a, u.b)
    FROM unnest(la, lb) WITH ORDINALITY AS u(a, b, o)
    ORDER BY u.o;

    WITH locked AS (
        SELECT u.a, u.b FROM unnest(la, lb) AS u(a, b)
    ),
    gone AS (
        DELETE FROM mq_msgs m
        WHERE (all_channels OR m.channel_name = ANY (channel_names))
          AND m.id <> '00000000-0000-0000-0000-000000000000'::uuid
          AND (m.after_message_id IS NULL
               OR EXISTS (SELECT 1 FROM locked l
                          WHERE l.a = pg_catalog.hashtext(m.channel_name)
                            AND l.b = pg_catalog.hashtext(m.channel_args)))
        RETURNING m.id
    ),
    chains AS (
        DELETE FROM mq_chains c
        WHERE (all_channels OR c.channel_name = ANY (channel_names))
          AND EXISTS (SELECT 1 FROM locked l
                      WHERE l.a = pg_catalog.hashtext(c.channel_name)
                        AND l.b = pg_catalog.hashtext(c.channel_args))
    )
    SELECT pg_catalog.count(*) INTO n FROM gone;
    RETURN n;
END;
$$;

-- The original's mq_clear: deletes the messages of the given channels.
CREATE OR REPLACE FUNCTION mq_clear(channel_names text[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM mq_clear_count(channel_names, false);
END;
$$;

-- The original's mq_clear_all: deletes every message.
CREATE OR REPLACE FUNCTION mq_clear_all()
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM mq_clear_count(NULL, true);
END;
$$;
