-- pqmq schema, version 3: complete the last batch and poll the next at once.
--
-- A consumer's loop is poll, work, complete. Each of mq_complete and
-- mq_poll_jobs is its own transaction, and each commit waits for its WAL
-- flush: two per batch. mq_complete_poll does both in one statement, so
-- one round trip and one commit per batch. Completion comes first, so that
-- a completed chain head's successor can be claimed by the same poll.
-- If the statement fails, neither takes effect, and the caller sends the
-- completions again (completing twice is harmless).
--
-- Arguments: as mq_complete(msg_ids, msg_attempts) then as
-- mq_poll_jobs(channel_names, batch_size); msg_ids may be empty. Rows: as
-- mq_poll_jobs, plus completed (how many of msg_ids were completed, the
-- same on every row; mq_poll_jobs always returns at least one row).

CREATE OR REPLACE FUNCTION mq_complete_poll(msg_ids uuid[], msg_attempts int[],
                                            channel_names text[], batch_size int)
RETURNS TABLE(id uuid, is_committed boolean, name text, payload_json text,
              payload_bytes bytea, retry_backoff interval, wait_time interval,
              channel_name text, channel_args text, attempt int,
              attempts_left int, completed int)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    n int := 0;
BEGIN
    IF cardinality(msg_ids) > 0 THEN
        n := mq_complete(msg_ids, msg_attempts);
    END IF;
    RETURN QUERY SELECT p.id, p.is_committed, p.name, p.payload_json,
                        p.payload_bytes, p.retry_backoff, p.wait_time,
                        p.channel_name, p.channel_args, p.attempt,
                        p.attempts_left, n
                 FROM mq_poll_jobs(channel_names, batch_size) p;
END;
$$;

INSERT INTO mq_schema_migrations (version, name)
VALUES (3, '0003_complete_and_poll')
ON CONFLICT (version) DO NOTHING;
