-- schema/payloads.sql: writes through the seed's views mq_msgs and mq_payloads
-- (schema/tables.sql), which clients of the original schema still name.
--
-- The view reads mq_msgs, itself a view of mq_rows and the log, so every
-- write through it has an INSTEAD OF trigger. They run as the queue's
-- owner (_mq_secure): the right to write through the view is the view's
-- grant, nothing more.

-- A message's payload is written with it, by mq_insert; a payload cannot
-- exist without its message or twice for one. So an INSERT is refused with
-- the error the original schema's constraints give in the same state: an
-- id that is a message has its payload already (unique_violation, the
-- original's primary key), an id that is none has no message to carry it
-- (foreign_key_violation). Nothing is written, so no message is ever half
-- written.
CREATE OR REPLACE FUNCTION _mq_payloads_insert()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NEW.id IS NULL OR NEW.name IS NULL THEN
        RAISE EXCEPTION 'mq_payloads: % must not be NULL',
            CASE WHEN NEW.id IS NULL THEN 'id' ELSE 'name' END
            USING ERRCODE = 'not_null_violation',
                  COLUMN = CASE WHEN NEW.id IS NULL THEN 'id' ELSE 'name' END;
    END IF;
    IF EXISTS (SELECT 1 FROM mq_rows m WHERE m.id = NEW.id) THEN
        RAISE EXCEPTION 'mq_payloads: message % has its payload already', NEW.id
            USING ERRCODE = 'unique_violation',
                  HINT = 'UPDATE mq_payloads replaces a message''s payload.';
    END IF;
    RAISE EXCEPTION 'mq_payloads: no message %', NEW.id
        USING ERRCODE = 'foreign_key_violation',
              HINT = 'mq_insert writes a message with its payload.';
END;
$$;

-- A payload goes with its message: deleting one through the view completes
-- the message as mq_delete does (the original's mq_delete deleted both), so
-- a chain's next message moves up instead of waiting forever on a deleted
-- predecessor. A row the statement saw but that is gone by now (completed
-- meanwhile, or deleted by the same statement's WITH) is not counted.
-- Each row takes its own chain's lock: a DELETE of many rows of different
-- chains takes them in the order it finds the rows, so two such DELETEs
-- at once can deadlock (40P01, which the crate retries); mq_delete takes
-- them in key order and never does.
CREATE OR REPLACE FUNCTION _mq_payloads_delete()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF mq_complete(ARRAY[OLD.id]) = 0 THEN
        RETURN NULL;
    END IF;
    RETURN OLD;
END;
$$;

CREATE OR REPLACE TRIGGER _mq_payloads_insert INSTEAD OF INSERT ON mq_payloads
    FOR EACH ROW EXECUTE FUNCTION _mq_payloads_insert();
CREATE OR REPLACE TRIGGER _mq_payloads_delete INSTEAD OF DELETE ON mq_payloads
    FOR EACH ROW EXECUTE FUNCTION _mq_payloads_delete();

-- A message's id is what its unique key's row, its chain and every fence of
-- a delivery name, so it never changes. The view writes every column it
-- shows, id included, for a role with UPDATE on it; the table refuses a new
-- id (the queue's own statements never set one, so they never fire this).
CREATE OR REPLACE FUNCTION _mq_keep_id_refuse(msg_id uuid)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION 'mq_payloads: the id of message % cannot change', msg_id
        USING ERRCODE = 'feature_not_supported',
              HINT = 'Complete the message and insert a new one.';
END;
$$;

CREATE OR REPLACE FUNCTION _mq_keep_id()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM _mq_keep_id_refuse(OLD.id);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER mq_msgs_keep_id
    BEFORE UPDATE OF id ON mq_rows
    FOR EACH ROW
    WHEN (OLD.id IS DISTINCT FROM NEW.id)
    EXECUTE FUNCTION _mq_keep_id();

-- The seed's mq_msgs, a view of every live message (schema/tables.sql),
-- takes the writes a table would: an INSERT writes a row into mq_rows (as
-- a client of the original schema wrote one); an UPDATE changes the
-- columns it changes, of a logged message once it is moved to mq_rows in
-- its delivery's state; a DELETE deletes the row or completes the logged
-- message. Run as the queue's owner (_mq_secure), as mq_payloads' are.
CREATE OR REPLACE FUNCTION _mq_msgs_insert()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM mq_log l WHERE l.id = NEW.id) THEN
        RAISE EXCEPTION 'duplicate key value violates unique constraint "mq_msgs_pkey"'
            USING ERRCODE = 'unique_violation',
                  DETAIL = format('Key (id)=(%s) already exists.', NEW.id);
    END IF;
    -- (Columns named: mq_rows' order is not the view's.)
    INSERT INTO mq_rows (id, created_at, attempt_at, attempts, retry_backoff, channel_name,
                         channel_args, commit_interval, after_message_id, deliveries,
                         dead_since, channel_key, ready_at, name, payload_json, payload_bytes,
                         last_error, unique_key, key_retention, priority, chain_seq, history)
    SELECT NEW.*;
    RETURN NEW;
END;
$$;

-- A logged message into mq_rows, for a write through the view: a delivered
-- one in its delivery's state (_mq_log_move), one no claim reached as it
-- was inserted (marked gone from the log under its cursor's lock).
CREATE OR REPLACE FUNCTION _mq_log_unlog(msg_id uuid)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts timestamptz := clock_timestamp();
    l  record;
BEGIN
    PERFORM _mq_log_move(ARRAY[msg_id], ts);
    SELECT m.channel_key, m.place INTO l FROM mq_log m WHERE m.id = msg_id;
    IF NOT FOUND OR EXISTS (SELECT 1 FROM mq_rows r WHERE r.id = msg_id) THEN
        RETURN;
    END IF;
    PERFORM 1 FROM mq_cursors c WHERE c.channel_key = l.channel_key FOR NO KEY UPDATE;
    IF NOT _mq_log_given(l.channel_key, l.place) THEN
        INSERT INTO mq_log_gone (channel_key, place) VALUES (l.channel_key, l.place)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            PERFORM _mq_log_to_msgs(l.channel_key, ARRAY[l.place], 2, ts, '{}', NULL, ts);
        END IF;
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION _mq_msgs_update()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    sets text;
    n    int;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM mq_rows r WHERE r.id = OLD.id) THEN
        PERFORM _mq_log_unlog(OLD.id);
    END IF;
    -- Only the columns the statement changed (as a table's UPDATE OF
    -- triggers see them): names from the view's own columns, values as
    -- parameters.
    SELECT string_agg(format('%I = ($1).%I', o.key, o.key), ', ') INTO sets
    FROM jsonb_each(to_jsonb(OLD)) o
    JOIN jsonb_each(to_jsonb(NEW)) w ON w.key = o.key
    WHERE o.value IS DISTINCT FROM w.value;
    IF sets IS NULL THEN
        RETURN CASE WHEN EXISTS (SELECT 1 FROM mq_rows r WHERE r.id = OLD.id)
                    THEN NEW END;
    END IF;
    EXECUTE format('UPDATE mq_rows SET %s WHERE id = ($2).id', sets) USING NEW, OLD;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = 0 THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE FUNCTION _mq_msgs_delete()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM mq_rows r WHERE r.id = OLD.id;
    IF FOUND THEN
        RETURN OLD;
    END IF;
    IF _mq_log_complete(ARRAY[OLD.id], NULL, NULL) + _mq_log_forget(ARRAY[OLD.id]) = 0 THEN
        RETURN NULL;
    END IF;
    RETURN OLD;
END;
$$;

CREATE OR REPLACE TRIGGER _mq_msgs_insert INSTEAD OF INSERT ON mq_msgs
    FOR EACH ROW EXECUTE FUNCTION _mq_msgs_insert();
CREATE OR REPLACE TRIGGER _mq_msgs_update INSTEAD OF UPDATE ON mq_msgs
    FOR EACH ROW EXECUTE FUNCTION _mq_msgs_update();
CREATE OR REPLACE TRIGGER _mq_msgs_delete INSTEAD OF DELETE ON mq_msgs
    FOR EACH ROW EXECUTE FUNCTION _mq_msgs_delete();

-- The defaults of mq_rows' columns, for an INSERT through the view. On a
-- Citus coordinator they are set there only: Citus forwards no view's
-- column defaults to the workers (it refuses the statement), and an INSERT
-- through the view is rewritten, and its trigger run, on the coordinator.
DO $$
DECLARE
    propagate text := current_setting('citus.enable_ddl_propagation', true);
BEGIN
    IF propagate IS NOT NULL THEN
        PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', 'off', true);
    END IF;
    ALTER VIEW mq_msgs ALTER COLUMN created_at SET DEFAULT pg_catalog.now();
    ALTER VIEW mq_msgs ALTER COLUMN attempt_at SET DEFAULT pg_catalog.now();
    ALTER VIEW mq_msgs ALTER COLUMN attempts SET DEFAULT 5;
    ALTER VIEW mq_msgs ALTER COLUMN retry_backoff SET DEFAULT interval '1 second';
    ALTER VIEW mq_msgs ALTER COLUMN channel_args SET DEFAULT '';
    ALTER VIEW mq_msgs ALTER COLUMN deliveries SET DEFAULT 0;
    ALTER VIEW mq_msgs ALTER COLUMN ready_at SET DEFAULT pg_catalog.now();
    ALTER VIEW mq_msgs ALTER COLUMN priority SET DEFAULT 0;
    IF propagate IS NOT NULL THEN
        PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', propagate, true);
    END IF;
END;
$$;

-- An UPDATE through mq_payloads is one through mq_msgs.
CREATE OR REPLACE FUNCTION _mq_payloads_update()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NEW.id IS DISTINCT FROM OLD.id THEN
        PERFORM _mq_keep_id_refuse(OLD.id);
    END IF;
    UPDATE mq_msgs m SET name = NEW.name, payload_json = NEW.payload_json,
                         payload_bytes = NEW.payload_bytes, last_error = NEW.last_error
    WHERE m.id = OLD.id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER _mq_payloads_update INSTEAD OF UPDATE ON mq_payloads
    FOR EACH ROW EXECUTE FUNCTION _mq_payloads_update();
