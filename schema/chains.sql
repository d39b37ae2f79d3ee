-- schema/chains.sql: ordered chains: the producers' locks. A chain is its
-- members in chain_seq order (schema/tables.sql); members leave it by being
-- deleted or skipped, which needs no repair.

-- Serializes producers per chain: the advisory locks of the chains the batch
-- appends to, in key order against deadlock. A producer takes its places
-- (mq_chain_seq) after these locks, so a later producer of a chain gets
-- later places and its rows become visible after the earlier one's.
CREATE OR REPLACE FUNCTION _mq_lock_new_chains(new_messages mq_new_t[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
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
