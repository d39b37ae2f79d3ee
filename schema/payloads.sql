-- schema/payloads.sql: writes through the mq_payloads view (schema/tables.sql),
-- the seed's payload table, which clients of the original schema still name.
--
-- The view is a plain view of one table, so PostgreSQL updates it and locks
-- it (SELECT ... FOR UPDATE, LOCK TABLE) by itself: an UPDATE changes the
-- message's row, and concurrent updates of one row wait and recheck as on a
-- table. INSERT and DELETE need more than a rewrite onto mq_msgs, so they
-- have INSTEAD OF triggers. Both functions run as the queue's owner
-- (_mq_secure), as the view's own reads and writes of mq_msgs do: the right
-- to write through the view is the view's grant, nothing more.

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
    IF EXISTS (SELECT 1 FROM mq_msgs m WHERE m.id = NEW.id) THEN
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
CREATE OR REPLACE FUNCTION _mq_keep_id()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION 'mq_payloads: the id of message % cannot change', OLD.id
        USING ERRCODE = 'feature_not_supported',
              HINT = 'Complete the message and insert a new one.';
END;
$$;

CREATE OR REPLACE TRIGGER mq_msgs_keep_id
    BEFORE UPDATE OF id ON mq_msgs
    FOR EACH ROW
    WHEN (OLD.id IS DISTINCT FROM NEW.id)
    EXECUTE FUNCTION _mq_keep_id();
