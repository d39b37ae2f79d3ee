-- schema/stats.sql: statistics for monitoring.
-- Today's definitions; the migrations that created them must carry the same
-- text (tests/test_migrate.c compares the two). See schema/tables.sql.

-- Per channel: messages in all, ready now, waiting (delayed, leased,
-- retrying, uncommitted or behind their chain), dead, and chains blocked by
-- a dead head. Reads the whole table: for monitoring, not for hot paths.
CREATE OR REPLACE FUNCTION mq_stats(channel_names text[] DEFAULT NULL)
RETURNS TABLE(channel_name text, total bigint, ready bigint, waiting bigint,
              dead bigint, blocked_chains bigint)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    WITH m AS (
        SELECT m.channel_name,
               m.attempts = 0 AND m.attempt_at <= clock_timestamp() AS is_dead,
               m.attempts > 0 AND m.attempt_at <= clock_timestamp()
                 AND (m.after_message_id IS NULL
                      OR m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid)
                 AS is_ready,
               m.after_message_id = '00000000-0000-0000-0000-000000000000'::uuid AS is_head
        FROM mq_msgs m
        WHERE channel_names IS NULL OR m.channel_name = ANY (channel_names)
    )
    SELECT m.channel_name, count(*), count(*) FILTER (WHERE m.is_ready),
           count(*) FILTER (WHERE NOT m.is_ready AND NOT m.is_dead),
           count(*) FILTER (WHERE m.is_dead),
           count(*) FILTER (WHERE m.is_dead AND m.is_head)
    FROM m
    GROUP BY m.channel_name
    ORDER BY m.channel_name
$$;
