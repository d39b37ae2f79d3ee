-- schema/views.sql: the seed's tables mq_msgs and mq_payloads, as views of
-- every live message (mq_rows and the log, schema/tables.sql); the writes
-- through them are schema/payloads.sql's triggers.

-- The seed's table of messages, as a view of every live one: mq_rows'
-- rows, and the logged messages neither completed, moved nor deleted, with
-- the columns their delivery gives them (waiting: as inserted; leased: one
-- attempt spent, in flight until the lease ends; held by the locked lane:
-- as waiting; no failed attempt, so no history). Writes through it go to
-- the message wherever it is (schema/payloads.sql). For tools and people:
-- the queue's functions read the tables.
CREATE OR REPLACE VIEW mq_msgs AS
    SELECT r.id, r.created_at, r.attempt_at, r.attempts, r.retry_backoff, r.channel_name,
           r.channel_args, r.commit_interval, r.after_message_id, r.deliveries, r.dead_since,
           r.channel_key, r.ready_at, r.name, r.payload_json, r.payload_bytes, r.last_error,
           r.unique_key, r.key_retention, r.priority, r.chain_seq, r.history
    FROM mq_rows r
    UNION ALL
    SELECT l.id, l.created_at,
           CASE WHEN l.lane = 0 THEN l.lease_end ELSE l.created_at END,
           CASE WHEN l.lane = 0 THEN l.attempts - 1 ELSE l.attempts END,
           CASE WHEN l.lane = 0 THEN l.retry_backoff * 2 ELSE l.retry_backoff END,
           l.channel_name, l.channel_args, NULL::interval, NULL::uuid,
           CASE WHEN l.lane = 0 THEN 1 ELSE 0 END, NULL::timestamptz, l.channel_key,
           -- (as a claim leaves a row of mq_rows: a final attempt at
           -- 'infinity', one kept alive just before its lease's end)
           CASE WHEN l.lane = 0 AND l.attempts <= 1 THEN 'infinity'::timestamptz
                WHEN l.lane = 0 AND l.kept THEN l.lease_end - interval '1 microsecond'
                ELSE l.created_at END,
           l.name, l.payload_json, l.payload_bytes, NULL::text, NULL::text, NULL::interval,
           0::smallint, NULL::bigint, NULL::jsonb
    FROM (
        -- Each logged message with the receipt that delivered it (lane and
        -- claimed_at NULL: none did). A channel's receipts cover disjoint
        -- ranges: the one that may hold a place is the last that starts at
        -- or before it.
        -- (given: a binary search of the receipt's sorted places; the view
        -- calls no function of the queue, which its readers may not run)
        SELECT m.id, m.created_at, m.attempts, m.retry_backoff, m.channel_name,
               m.channel_args, m.channel_key, m.name, m.payload_json, m.payload_bytes,
               CASE WHEN m.given THEN m.g_lane END AS lane,
               CASE WHEN m.given AND m.place = ANY (m.g_kept) THEN m.g_kept_until
                    WHEN m.given
                    THEN m.g_claimed_at + CASE WHEN m.retry_backoff > interval '0'
                                               THEN m.retry_backoff
                                               ELSE interval '1 second' END END AS lease_end,
               m.given AND m.place = ANY (m.g_kept) AS kept,
               m.given
                   AND (m.place = ANY (m.g_moved)
                        OR EXISTS (SELECT 1 FROM mq_done d
                                   WHERE d.channel_key = m.channel_key AND d.lo = m.g_lo
                                     AND d.places[width_bucket(m.place, d.places)]
                                         = m.place)) AS finished
        FROM (
            SELECT m.id, m.created_at, m.attempts, m.retry_backoff, m.channel_name,
                   m.channel_args, m.channel_key, m.name, m.payload_json, m.payload_bytes,
                   m.place, g.lane AS g_lane, g.claimed_at AS g_claimed_at,
                   g.moved AS g_moved, g.lo AS g_lo, g.kept AS g_kept,
                   g.kept_until AS g_kept_until,
                   COALESCE(g.places[width_bucket(m.place, g.places)] = m.place, false) AS given
            FROM mq_log m
            LEFT JOIN LATERAL (
                SELECT x.lane, x.claimed_at, x.moved, x.lo, x.places, x.kept, x.kept_until
                FROM mq_receipts x
                WHERE x.channel_key = m.channel_key AND x.lo <= m.place
                ORDER BY x.lo DESC LIMIT 1) g ON true
            WHERE NOT EXISTS (SELECT 1 FROM mq_log_gone o
                              WHERE o.channel_key = m.channel_key AND o.place = m.place)) m) l
    WHERE l.finished IS NOT TRUE;

-- The seed's payload table, as a view of mq_msgs: readable by id as
-- before; an UPDATE through it changes the message, a DELETE completes it
-- and an INSERT is refused (schema/payloads.sql).
CREATE OR REPLACE VIEW mq_payloads AS
    SELECT m.id, m.name, m.payload_json, m.payload_bytes, m.last_error
    FROM mq_msgs m;

-- A view mq_msgs that was never granted takes the rights the grantees of
-- mq_rows have on it (a queue upgraded from 0.1.0, whose table mq_msgs
-- became mq_rows with its grants): what they could read or write, they
-- still can under the seed's name.
DO $$
DECLARE
    g record;
BEGIN
    IF (SELECT c.relacl IS NULL FROM pg_catalog.pg_class c
        WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('mq_msgs')) THEN
        FOR g IN
            SELECT a.grantee, a.privilege_type
            FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
            WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('mq_rows')
              AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
              AND a.privilege_type OPERATOR(pg_catalog.=) ANY (ARRAY['SELECT', 'INSERT',
                                                                     'UPDATE', 'DELETE'])
        LOOP
            EXECUTE pg_catalog.format('GRANT %s ON mq_msgs TO %s', g.privilege_type,
                                      CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0
                                           THEN 'PUBLIC'
                                           ELSE g.grantee::regrole::text END);
        END LOOP;
    END IF;
END
$$;
