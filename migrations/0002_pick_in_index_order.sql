-- pqmq schema, version 2: polls read each channel in index order.
--
-- mq_pick takes a channel's oldest ready rows with ORDER BY attempt_at LIMIT n
-- over the (channel_key, attempt_at) index. Its generic plan misjudged how
-- many rows pass the filters and chose a bitmap scan, which reads and sorts
-- every row of the channel to return n of them: 0.8 ms per poll of 100 with
-- 200 messages per channel, against 0.25 ms for the ordered index scan that
-- stops after n. Without bitmap scans the index scan is the only fit.
-- ALTER FUNCTION sets the same value however often it runs.

ALTER FUNCTION mq_pick(text, bigint, bigint, int, int, int, uuid[], timestamptz)
    SET enable_bitmapscan = off;

INSERT INTO mq_schema_migrations (version, name)
VALUES (2, '0002_pick_in_index_order')
ON CONFLICT (version) DO NOTHING;
