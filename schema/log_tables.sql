-- schema/log_tables.sql: the tables of the queue's log (DESIGN.md,
-- Storage), applied right after tables.sql.

-- The log (DESIGN.md, Storage): a message that needs nothing but its
-- first delivery (unordered, priority 0, no delay, committed, no unique
-- key) is one row here, written once and never updated. A channel's
-- cursor says how far its log has been handed out; a claim moves cursors
-- and writes one receipt row a channel; a completion writes one row a
-- receipt. Anything else that happens to a logged message (a retry, a
-- keep-alive, a checkpoint, a lease that ran out, a hand edit) moves it to
-- mq_rows, the queue's table of exceptions, first.
CREATE SEQUENCE IF NOT EXISTS mq_log_place INCREMENT BY 16384;

CREATE TABLE IF NOT EXISTS mq_log (
    -- The message's place: one nextval a batch plus its position in the
    -- batch (at most 10000 messages, _mq_limits), so places increase in a
    -- producer's order; a channel's cursor moves through them in order.
    place         bigint NOT NULL,
    channel_key   bigint NOT NULL,
    id            uuid NOT NULL,
    created_at    timestamptz NOT NULL,
    attempts      int NOT NULL,
    retry_backoff interval NOT NULL,
    channel_name  text NOT NULL,
    channel_args  text NOT NULL,
    name          text NOT NULL,
    payload_json  jsonb,
    payload_bytes bytea,
    PRIMARY KEY (channel_key, place)
);
CREATE UNIQUE INDEX IF NOT EXISTS mq_log_id ON mq_log (id);

-- One row a channel that ever had a logged message: place, the last place
-- handed out (everything of the channel's log after it is waiting);
-- settled, the place up to which every message is known to have been
-- handed out (a producer that commits late can put a message below the
-- cursor: _mq_log_settle finds it); reclaimed, up to where the channel's
-- finished rows are deleted. Claims read only past place, so what lies
-- below (finished rows, and their dead versions while vacuum waits) is
-- never stepped over.
CREATE TABLE IF NOT EXISTS mq_cursors (
    channel_key  bigint PRIMARY KEY,
    place        bigint NOT NULL DEFAULT 0,
    settled      bigint NOT NULL DEFAULT 0,
    -- Every log row of the channel up to here is deleted (_mq_log_reclaim).
    reclaimed    bigint NOT NULL DEFAULT 0,
    channel_name text NOT NULL,
    channel_args text NOT NULL
) WITH (fillfactor = 50);
-- When the sweep first found the channel drained, at place drained_place
-- (_mq_log_retire deletes a cursor drained at the same place for ten
-- minutes).
ALTER TABLE mq_cursors ADD COLUMN IF NOT EXISTS drained_at timestamptz;
ALTER TABLE mq_cursors ADD COLUMN IF NOT EXISTS drained_place bigint;

-- The keys of the channels that have a cursor, one row each, written when
-- the cursor is added and deleted with it (the foreign key), never updated:
-- a producer probes here whether its channel has a cursor. The cursor's
-- own row takes a version at every claim, and a held snapshot keeps them
-- all, so a probe of mq_cursors would read each of them.
CREATE TABLE IF NOT EXISTS mq_cursor_keys (
    channel_key bigint PRIMARY KEY REFERENCES mq_cursors ON DELETE CASCADE
);
INSERT INTO mq_cursor_keys (channel_key)
SELECT c.channel_key FROM mq_cursors c
ON CONFLICT DO NOTHING;

-- The cursors of drained channels that the log's sweep deleted
-- (_mq_log_retire), so that polls do not walk past every channel ever
-- used: place, the deleted cursor's; horizon, set by the first sweep after
-- the deletion committed. A producer that found the cursor just before it
-- went commits its message with no cursor over it; once every transaction
-- older than horizon has ended, the sweep gives such a channel its cursor
-- back (at place) or forgets the row.
CREATE TABLE IF NOT EXISTS mq_cursors_retired (
    channel_key  bigint PRIMARY KEY,
    place        bigint NOT NULL,
    horizon      xid8
);

-- Channels whose cursor a producer could not add because another open
-- transaction was adding it (_mq_log_add_cursors): if that transaction
-- rolls back, the sweep adds the cursor.
CREATE TABLE IF NOT EXISTS mq_cursors_wanted (
    channel_key  bigint NOT NULL,
    channel_name text NOT NULL,
    channel_args text NOT NULL
);
CREATE INDEX IF NOT EXISTS mq_cursors_wanted_key ON mq_cursors_wanted (channel_key);

-- What one claim took from one channel's log: its places (lo the first),
-- when, the earliest lease among them (lease_until; 'infinity' once no
-- member is in flight), the claim's horizon (no transaction that could
-- still add a place below hi was running after it: _mq_log_settle) and
-- its lane (0: leased; 1: held by the claimer's transaction, the locked
-- lane). A channel's receipts cover disjoint ranges of places.
CREATE TABLE IF NOT EXISTS mq_receipts (
    channel_key bigint NOT NULL,
    lo          bigint NOT NULL,
    hi          bigint NOT NULL,
    places      bigint[] NOT NULL,
    claimed_at  timestamptz NOT NULL,
    lease_until timestamptz NOT NULL,
    horizon     xid8 NOT NULL,
    lane        smallint NOT NULL,
    -- Members moved to mq_rows (_mq_log_move): written under the receipt's
    -- row lock, so that a completion waiting for that lock sees the move.
    moved       bigint[] NOT NULL DEFAULT '{}',
    -- Members whose leases keep-alives extended, all to kept_until (the
    -- latest asked for: a lease is never shortened).
    kept        bigint[] NOT NULL DEFAULT '{}',
    kept_until  timestamptz,
    -- The locked lane's claimer (its transaction's id): its receipt is not
    -- handed back while that transaction runs.
    holder      xid8,
    PRIMARY KEY (channel_key, lo)
);
CREATE INDEX IF NOT EXISTS mq_receipts_open ON mq_receipts (lease_until)
    WHERE lease_until < 'infinity'::timestamptz;

-- Members of a receipt that were completed: one row a completion and
-- receipt (a completion never waits for another's).
CREATE TABLE IF NOT EXISTS mq_done (
    channel_key bigint NOT NULL,
    lo          bigint NOT NULL,
    places      bigint[] NOT NULL
);
CREATE INDEX IF NOT EXISTS mq_done_receipt ON mq_done (channel_key, lo);

-- Logged messages taken out before any claim delivered them (deleted, or
-- moved to mq_rows after their producer committed late): a claim steps
-- over them.
CREATE TABLE IF NOT EXISTS mq_log_gone (
    channel_key bigint NOT NULL,
    place       bigint NOT NULL,
    PRIMARY KEY (channel_key, place)
);
