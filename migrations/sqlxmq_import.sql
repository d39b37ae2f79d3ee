-- migrations/sqlxmq_import.sql: adopting a database made by the original
-- (sqlxmq) schema, part 2 of 2 (see sqlxmq_set_aside.sql). Runs after
-- schema/ and does nothing unless the original's tables were set aside.
--
-- Every message moves into this release's mq_rows, payload included, with
-- the same id, channel, timing, attempts, backoff, commit interval and
-- chain link: queued, delayed, uncommitted (two-phase) and ordered messages
-- keep their meaning, since the original and pqmq encode them alike. What
-- changes, and why:
--   * the original's sentinel row (the nil UUID) is not moved: pqmq reads
--     the nil UUID in after_message_id as "head of its chain" without a row
--     behind it;
--   * a message the original delivered for the last time (no attempt_at and
--     no attempt left: it lingered forever) becomes a dead letter, listed by
--     mq_dead_letters and retried with mq_retry; one with attempts left but
--     no attempt_at (its mq_insert got a NULL delay, so the original never
--     delivered it) is ready at once, with no delivery counted;
--   * chains keep their order by place (chain_seq) instead of links;
--   * the grants others had on the original's tables pass to mq_rows and
--     the mq_payloads view.
DO $$
DECLARE
    nil constant uuid := '00000000-0000-0000-0000-000000000000';
    g record;
    base bigint;
    n    bigint;
BEGIN
    IF pg_catalog.to_regclass('mq_sqlxmq_msgs') IS NULL THEN
        RETURN;
    END IF;
    -- A chain's members get places (chain_seq) in their link order, heads
    -- (after the nil UUID) first; a member whose predecessor is gone follows
    -- its chain's linked ones, oldest first.
    base := pg_catalog.nextval('mq_chain_seq');
    WITH RECURSIVE walk(id, depth) AS (
        SELECT m.id, 0::bigint FROM mq_sqlxmq_msgs m
        WHERE m.after_message_id = nil AND m.id <> nil
        UNION ALL
        SELECT s.id, w.depth + 1 FROM walk w
        JOIN mq_sqlxmq_msgs s ON s.after_message_id = w.id
    ),
    moved AS (
        INSERT INTO mq_rows (id, created_at, attempt_at, attempts, retry_backoff, channel_name,
                             channel_args, commit_interval, after_message_id, deliveries,
                             dead_since, ready_at, name, payload_json, payload_bytes, chain_seq,
                             channel_key)
        SELECT m.id, COALESCE(m.created_at, pg_catalog.now()),
               COALESCE(m.attempt_at, pg_catalog.now()), m.attempts, m.retry_backoff,
               m.channel_name, COALESCE(m.channel_args, ''), m.commit_interval,
               CASE WHEN m.after_message_id IS NOT NULL THEN nil END,
               CASE WHEN m.attempt_at IS NULL AND m.attempts = 0 THEN 1 ELSE 0 END,
               CASE WHEN m.attempt_at IS NULL AND m.attempts = 0 THEN pg_catalog.now() END,
               COALESCE(m.attempt_at, pg_catalog.now()),
               COALESCE(p.name, ''), p.payload_json, p.payload_bytes,
               CASE WHEN m.after_message_id IS NOT NULL THEN base + pg_catalog.row_number() OVER (
                   ORDER BY m.channel_name, COALESCE(m.channel_args, ''), w.depth IS NULL,
                            w.depth, m.created_at, m.id) END,
               (pg_catalog.hashtext(m.channel_name)::bigint << 32)
               | (pg_catalog.hashtext(COALESCE(m.channel_args, ''))::bigint & 4294967295)
        FROM mq_sqlxmq_msgs m
        LEFT JOIN mq_sqlxmq_payloads p ON p.id = m.id
        LEFT JOIN walk w ON w.id = m.id
        WHERE m.id <> nil
        RETURNING 1
    )
    SELECT count(*) INTO n FROM moved;
    PERFORM pg_catalog.setval('mq_chain_seq', base + n + 1);

    -- The original mq_msgs' rights go to mq_rows and to the mq_msgs view
    -- (those a view takes), mq_payloads' to the mq_payloads view.
    FOR g IN
        SELECT t.target, a.privilege_type,
               CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
                   AS grantee
        FROM pg_catalog.pg_class c
        CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) a
        JOIN (VALUES ('mq_sqlxmq_msgs', 'mq_rows'), ('mq_sqlxmq_msgs', 'mq_msgs'),
                     ('mq_sqlxmq_payloads', 'mq_payloads')) AS t(source, target)
          ON t.source = c.relname
        WHERE c.oid IN (pg_catalog.to_regclass('mq_sqlxmq_msgs'),
                        pg_catalog.to_regclass('mq_sqlxmq_payloads'))
          AND a.grantee <> c.relowner
          AND (t.target <> 'mq_msgs'
               OR a.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE'))
    LOOP
        EXECUTE pg_catalog.format('GRANT %s ON %I TO %s', g.privilege_type, g.target, g.grantee);
    END LOOP;

    DROP TABLE mq_sqlxmq_payloads;
    DROP TABLE mq_sqlxmq_msgs;
END
$$;
