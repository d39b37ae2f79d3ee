-- schema/tables.sql: the queue's tables, indexes and types.
--
-- schema/ is the one definition of every object pqmq creates, one file per
-- concern; pqmq_migrate (and psql, through `pqmq migrate --sql`) applies its
-- files in the order INSTALL_SQL in Makefile.am gives: this one first,
-- roles.sql last. A fresh install applies them and records version 100
-- (release 1.0.0); an older queue is first brought to this release's tables
-- by a step in migrations/, which records the version it reaches. Every
-- statement here is safe to apply again.
--
-- Objects are created in the first schema of the current search_path, and every
-- function pins that path (SET search_path FROM CURRENT), so a client only needs
-- the queue's schema on its own search_path to call them unqualified.
--
-- Vocabulary used below:
--   candidate  a row a poll may claim: attempts left, and unordered
--              (after_message_id NULL: in the ready indexes) or the head of
--              its chain (its first live entry in mq_msgs_chain)
--   lease      attempt_at of a claimed message: it is redelivered after it
--   place      ready_at: where a row sits in the ready indexes. It equals
--              attempt_at except while the message is in flight: a claim
--              leaves it where it was, so that the claim changes no indexed
--              column and is a HOT update (no index entry written). Polls
--              therefore step over in-flight rows; keep-alives and failures,
--              which are rare, move a row to its new attempt_at, and a
--              final attempt moves to 'infinity' (out of the polls' way,
--              where mq_reap_dead finds it). Always ready_at <= attempt_at,
--              or 'infinity'.
--   chain      the ordered messages of one (channel_name, channel_args), in
--              the order of chain_seq (after_message_id is the nil UUID for
--              every one of them, the seed's mark of an ordered message)
--   chain key  (hashtext(channel_name) << 32) | hashtext(channel_args): groups a
--              channel's rows together in an index, and a name's channels in
--              one range of keys (a poll that names channels visits that
--              range; see _mq_pick_set for where polls start)

-- Refuse a queue schema whose owner is not trusted, before anything is
-- created in it: a schema's owner may drop what is in it and plant
-- functions and operators there that the queue's callers would run (a role
-- with CREATE on the database makes a schema named like the installing
-- superuser, on its default path "$user", public). Trusted: the installing
-- role itself, or a superuser (for a schema owned by pg_database_owner,
-- public on PostgreSQL 15, the database's owner).
DO $$
DECLARE
    nsp   oid := COALESCE(
        (SELECT c.relnamespace FROM pg_catalog.pg_class c
         WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('mq_msgs')),
        (SELECT n.oid FROM pg_catalog.pg_namespace n
         WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()));
    owner oid := (SELECT n.nspowner FROM pg_catalog.pg_namespace n
                  WHERE n.oid OPERATOR(pg_catalog.=) nsp);
    eff   oid;
BEGIN
    IF owner IS NULL THEN
        RETURN; -- no schema: creating the first object says so
    END IF;
    eff := CASE WHEN owner OPERATOR(pg_catalog.=) (SELECT r.oid FROM pg_catalog.pg_roles r
                                                  WHERE r.rolname OPERATOR(pg_catalog.=) 'pg_database_owner')
                THEN (SELECT d.datdba FROM pg_catalog.pg_database d
                      WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                ELSE owner END;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r
                   WHERE r.oid OPERATOR(pg_catalog.=) eff
                     AND (r.rolsuper OR r.rolname OPERATOR(pg_catalog.=) CURRENT_USER)) THEN
        RAISE EXCEPTION 'pqmq: the queue schema % is owned by role %, which is neither the installing role (%) nor a superuser',
            nsp::regnamespace, owner::regrole, CURRENT_USER
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'The owner of a schema can drop the queue''s objects in it and put functions there that the queue''s callers would run with their rights.',
                  HINT = 'Install into a schema that the installing role owns (CREATE SCHEMA ... AUTHORIZATION), as that role; check the search_path: the queue goes into its first schema that exists.';
    END IF;
END
$$;

-- Only over a new schema or one at this release's version: an older queue
-- needs its step of migrations/ first (which pqmq_migrate and `pqmq migrate
-- --sql` apply before this file), a newer one a newer pqmq.
DO $$
DECLARE
    v int;
BEGIN
    IF pg_catalog.to_regclass('mq_schema_migrations') IS NULL THEN
        IF pg_catalog.to_regclass('mq_msgs') IS NOT NULL THEN
            RAISE EXCEPTION 'pqmq: schema % has an mq_msgs table that no pqmq release made',
                pg_catalog.current_schema()
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Install the queue into a schema of its own.';
        END IF;
        RETURN;
    END IF;
    SELECT max(m.version) INTO v FROM mq_schema_migrations m;
    IF v IS NULL OR v = 100 THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'pqmq: the queue in schema % is at version %, which release 1.0.0 '
                    '(version 100) cannot upgrade', pg_catalog.current_schema(), v
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = CASE WHEN v > 100 THEN 'A newer pqmq made it: use that release.'
                          ELSE 'Versions 1 to 16 were development steps before release '
                               '0.1.0 (version 17) and were never released: upgrade it '
                               'to 0.1.0 with the pqmq that made it first.' END;
END
$$;

CREATE TABLE IF NOT EXISTS mq_schema_migrations (
    version    int PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);

DO $$
BEGIN
    CREATE TYPE mq_new_t AS (
        id               uuid,
        delay            interval,
        retries          int,
        retry_backoff    interval,
        channel_name     text,
        channel_args     text,
        commit_interval  interval,
        ordered          boolean,
        name             text,
        payload_json     text,
        payload_bytes    bytea
    );
EXCEPTION WHEN duplicate_object THEN
    NULL;
END
$$;

-- The row a consumer gets for a job (mq_claim, mq_complete_claim, mq_dead_jobs);
-- lib/job.c reads it.
DO $$
BEGIN
    CREATE TYPE mq_job_t AS (
        id               uuid,
        is_committed     boolean,
        name             text,
        payload_json     text,
        payload_bytes    bytea,
        retry_backoff    interval,
        wait_time        interval,
        channel_name     text,
        channel_args     text,
        attempt          int,
        attempts_left    int,
        last_error       text,
        blocking         boolean
    );
EXCEPTION WHEN duplicate_object THEN
    NULL;
END
$$;

-- One row per message: what a poll reads and writes, and the payload, which
-- is written once and read once per delivery. mq_payloads is a view of these
-- columns: a table of its own would cost a second row and index entry per
-- message on insert, a second probe per claim and a second delete per
-- completion.
-- The messages the log does not hold (DESIGN.md, Storage): ordered,
-- delayed, two-phase, prioritized and keyed messages from their insert,
-- and logged ones once anything but their completion happened to them
-- (retries, keep-alives, checkpoints, leases that ran out, dead letters).
-- A 0.1.0 queue's mq_msgs table is this table, renamed; mq_msgs is the
-- view of every live message (below).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_class c
               WHERE c.oid = pg_catalog.to_regclass('mq_msgs') AND c.relkind = 'r') THEN
        ALTER TABLE mq_msgs RENAME TO mq_rows;
    END IF;
END
$$;

CREATE TABLE IF NOT EXISTS mq_rows (
    id               uuid CONSTRAINT mq_msgs_pkey PRIMARY KEY,
    created_at       timestamptz NOT NULL DEFAULT pg_catalog.now(),
    attempt_at       timestamptz NOT NULL DEFAULT pg_catalog.now(),
    attempts         int NOT NULL DEFAULT 5,
    retry_backoff    interval NOT NULL DEFAULT interval '1 second',
    channel_name     text NOT NULL,
    channel_args     text NOT NULL DEFAULT '',
    commit_interval  interval,
    after_message_id uuid,
    -- How many times the message has been claimed: the attempt number a
    -- consumer sees, and what lets mq_commit tell "pending" from "delivered".
    deliveries       int NOT NULL DEFAULT 0,
    -- When the message was first delivered by a lease (a claim, or a logged
    -- message's receipt), for the time-in-queue histogram (schema/alerts.sql);
    -- NULL until then. Written by the claim's own update of the row, and
    -- placed among the columns that update writes: a HOT update's WAL
    -- record carries the row from the first changed column to the last, so
    -- a column after the payload would carry the payload with every claim.
    first_claimed_at timestamptz,
    -- When the message ran out of attempts (set by mq_fail or mq_reap_dead);
    -- NULL while it may still be delivered.
    dead_since       timestamptz,
    -- The chain key (above), written by _mq_insert_rows, or for a row
    -- written by hand without one by _mq_fill_row (below).
    channel_key      bigint NOT NULL,
    ready_at         timestamptz NOT NULL DEFAULT pg_catalog.now(),
    name             text NOT NULL,
    payload_json     jsonb,
    payload_bytes    bytea,
    last_error       text,
    -- The message's unique key in its channel (mq_insert_unique), NULL for
    -- none, and how long the key outlives the message's deletion.
    unique_key       text,
    key_retention    interval,
    -- Among the ready messages of a channel, higher first (mq_insert with
    -- priorities); 0, the default, is the lowest. The functions take
    -- 0..32767; a message written below 0 by hand counts as 0 (a CHECK
    -- constraint cost every insert and claim more than that is worth).
    priority         smallint NOT NULL DEFAULT 0,
    -- An ordered message's place in its chain (mq_msgs_chain), NULL for
    -- the others: from mq_chain_seq, taken under the chain's advisory lock,
    -- so later producers of a chain get later places. A chain's head is its
    -- first live entry: completing it deletes one row and writes nothing
    -- to its successor.
    chain_seq        bigint
);

-- Until 1.0.0 channel_key was a stored generated column, which formed
-- every inserted row twice; its values stay. (Only then: Citus refuses
-- DROP EXPRESSION on its tables.)
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
               WHERE a.attrelid = 'mq_rows'::regclass AND a.attname = 'channel_key'
                 AND a.attgenerated <> '') THEN
        ALTER TABLE mq_rows ALTER COLUMN channel_key DROP EXPRESSION;
        ALTER TABLE mq_rows ALTER COLUMN channel_key SET NOT NULL;
    END IF;
END
$$;

-- The last five failed attempts, oldest first: [{"attempt", "at", "error"}]
-- (schema/story.sql). Written by the failure paths only, NULL until one.
ALTER TABLE mq_rows ADD COLUMN IF NOT EXISTS history jsonb;
-- first_claimed_at (above) for a queue whose mq_rows was made without it:
-- at the end of the row there. (Tested first: ADD COLUMN IF NOT EXISTS
-- would tell every fresh install that it skipped the column.)
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                   WHERE a.attrelid = 'mq_rows'::regclass
                     AND a.attname = 'first_claimed_at' AND NOT a.attisdropped) THEN
        ALTER TABLE mq_rows ADD COLUMN first_claimed_at timestamptz;
    END IF;
END
$$;

-- Places in chains: one call per batch (_mq_insert_rows), the batch's
-- members at that value plus their position in the array (a batch holds at
-- most 10000 messages, _mq_limits).
CREATE SEQUENCE IF NOT EXISTS mq_chain_seq INCREMENT BY 16384;

-- Polls walk these indexes channel by channel (loose index scan on
-- channel_key) and take each channel's oldest ready rows: the messages of
-- priority 0 (most, and all when no producer sets one; below 0 only by
-- hand) in mq_msgs_ready_plain, the others, highest first, in
-- mq_msgs_ready_urgent. Each candidate has an entry in one of them. No index keys on attempt_at,
-- attempts, deliveries or retry_backoff: those are what a claim writes.
CREATE INDEX IF NOT EXISTS mq_msgs_ready_plain
    ON mq_rows (channel_key, ready_at)
    WHERE dead_since IS NULL
      AND after_message_id IS NULL
      AND priority <= 0;

CREATE INDEX IF NOT EXISTS mq_msgs_ready_urgent
    ON mq_rows (channel_key, (- priority), ready_at)
    WHERE dead_since IS NULL
      AND after_message_id IS NULL
      AND priority > 0;

-- The unordered ready set in time order: fills a batch and answers
-- wait_time; its 'infinity' end holds the final attempts in flight, chain
-- heads' included (mq_reap_dead). Only a query that says
-- ready_at > '-infinity' (always true) can use it: a poll of one channel
-- must walk the channel indexes, and a plan that took this index and
-- filtered by channel read the whole ready backlog for every channel once
-- statistics said the table was small.
CREATE INDEX IF NOT EXISTS mq_msgs_ready_by_time
    ON mq_rows (ready_at)
    WHERE dead_since IS NULL
      AND (after_message_id IS NULL OR ready_at = 'infinity'::timestamptz)
      AND ready_at > '-infinity'::timestamptz;

-- The chains: each chain key's entries in chain order, dead members
-- included (a dead head blocks its chain until mq_retry or mq_skip). A
-- poll visits the keys (a loose index scan) and looks at each one's first
-- live entry only: the head. Nothing a claim writes is in it, and
-- completing a head writes nothing here: the next entry is the new head.
CREATE INDEX IF NOT EXISTS mq_msgs_chain
    ON mq_rows (channel_key, chain_seq)
    WHERE chain_seq IS NOT NULL;

-- Dead letters, oldest first.
CREATE INDEX IF NOT EXISTS mq_msgs_dead
    ON mq_rows (dead_since)
    WHERE dead_since IS NOT NULL;

-- A queue table churns: vacuum it early and without throttling.
ALTER TABLE mq_rows SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0,
    -- Room on every page for the row version a claim writes, so the claim
    -- can stay on its page (HOT).
    fillfactor = 50
);


-- Until migration 20, the last message appended to each non-empty chain;
-- no longer written or read (chains are kept by chain_seq), kept for
-- databases and tools that name it.
CREATE TABLE IF NOT EXISTS mq_chains (
    channel_name text NOT NULL,
    channel_args text NOT NULL,
    tail_id      uuid NOT NULL,
    channel_key  bigint GENERATED ALWAYS AS (
        (pg_catalog.hashtext(channel_name)::bigint << 32)
        | (pg_catalog.hashtext(channel_args)::bigint & 4294967295)
    ) STORED
);

CREATE INDEX IF NOT EXISTS mq_chains_key ON mq_chains (channel_key);

-- Unique keys (mq_insert_unique, schema/keys.sql): who holds each key of a
-- channel. A row is written when a message with a key is inserted, and its
-- primary key is what decides between racing producers. While expires_at is
-- NULL the key is held by message_id if that message is live (not dead);
-- when the message is deleted the row goes, or, with a retention window,
-- stays until expires_at. Untouched by messages without a key.
CREATE TABLE IF NOT EXISTS mq_keys (
    channel_name text NOT NULL,
    unique_key   text NOT NULL,
    message_id   uuid NOT NULL,
    expires_at   timestamptz,
    PRIMARY KEY (channel_name, unique_key)
);

CREATE INDEX IF NOT EXISTS mq_keys_expired ON mq_keys (expires_at)
    WHERE expires_at IS NOT NULL;

-- Recurring messages (schema/schedules.sql): the last minute (UTC) each
-- schedule was evaluated up to. Runners carrying the same schedule share it;
-- the unique key of each slot, not this row, decides who inserts a slot.
-- owner: the role the schedule belongs to (the first to evaluate it).
CREATE TABLE IF NOT EXISTS mq_schedules (
    name      text PRIMARY KEY,
    last_slot timestamptz NOT NULL,
    owner     oid
);

-- Counters, so that status never reads the ready backlog or the messages
-- waiting in chains: per channel, messages in all (total), ordered messages
-- (waiting: mq_metrics subtracts the chains' heads) and messages deleted so far
-- (removed: completed or purged; only grows). Writers never update a shared
-- row: they append deltas (so concurrent producers and consumers neither
-- wait for each other nor deadlock), a row per statement in
-- mq_count_batches, or a row per channel and statement in mq_count_deltas
-- (rows written by hand, chains left, deletes of more than a batch on
-- several channels), and _mq_count_fold moves them into mq_counts now and
-- then.
CREATE TABLE IF NOT EXISTS mq_counts (
    channel_name text PRIMARY KEY,
    total        bigint NOT NULL DEFAULT 0,
    waiting      bigint NOT NULL DEFAULT 0,
    removed      bigint NOT NULL DEFAULT 0
);

CREATE TABLE IF NOT EXISTS mq_count_deltas (
    channel_name text NOT NULL,
    total        bigint NOT NULL,
    waiting      bigint NOT NULL,
    removed      bigint NOT NULL
);

ALTER TABLE mq_count_deltas SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_cost_delay = 0
);

-- The deltas of the hot writers, a row per statement: an insert's batch
-- (sign 1, _mq_insert_rows) or a delete's rows (sign -1, the delete
-- trigger). Element i: totals[i] messages of channel names[i], waits[i] of
-- them ordered (waiting in a chain), each counting sign in total, sign in
-- waiting when ordered and, deleted, 1 in removed. A statement on one
-- channel, as most are, writes one element; one on several writes an
-- element per message, ungrouped. (Grouping the batch by channel and
-- writing a delta row per channel costs more server instructions, most on
-- many channels.)
CREATE TABLE IF NOT EXISTS mq_count_batches (
    sign   int NOT NULL,
    names  text[] NOT NULL,
    totals int[] NOT NULL,
    waits  int[] NOT NULL
);

ALTER TABLE mq_count_batches SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_cost_delay = 0
);

-- A row written into mq_rows by hand (an operator's INSERT, a tool's copy)
-- gets its chain key and its place (ready_at no later than attempt_at; see
-- _mq_keep_place) here, and is counted (mq_counts) as _mq_insert_rows counts
-- its own batches. The queue's functions write both themselves: for them
-- the trigger's WHEN is false, and this one trigger's test is all an insert
-- pays. A change of a row's channel moves its key and its count.
CREATE OR REPLACE FUNCTION _mq_fill_row()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.attempt_at < NEW.ready_at AND NEW.ready_at <> 'infinity'::timestamptz THEN
            NEW.ready_at := GREATEST(NEW.attempt_at, pg_catalog.clock_timestamp());
        END IF;
        IF NEW.channel_key IS NOT NULL THEN
            RETURN NEW; -- keyed, so written as the functions write (and count) rows
        END IF;
    ELSE
        INSERT INTO mq_count_deltas (channel_name, total, waiting, removed)
        VALUES (OLD.channel_name, -1, - (OLD.chain_seq IS NOT NULL)::int, 0);
    END IF;
    NEW.channel_key := (pg_catalog.hashtext(NEW.channel_name)::bigint << 32)
                       | (pg_catalog.hashtext(NEW.channel_args)::bigint & 4294967295);
    INSERT INTO mq_count_deltas (channel_name, total, waiting, removed)
    VALUES (NEW.channel_name, 1, (NEW.chain_seq IS NOT NULL)::int, 0);
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER mq_msgs_fill_row
    BEFORE INSERT ON mq_rows
    FOR EACH ROW
    WHEN (NEW.channel_key IS NULL
          OR (NEW.attempt_at < NEW.ready_at AND NEW.ready_at <> 'infinity'::timestamptz))
    EXECUTE FUNCTION _mq_fill_row();

CREATE OR REPLACE TRIGGER mq_msgs_move_row
    BEFORE UPDATE OF channel_name, channel_args ON mq_rows
    FOR EACH ROW
    WHEN (OLD.channel_name IS DISTINCT FROM NEW.channel_name
          OR OLD.channel_args IS DISTINCT FROM NEW.channel_args)
    EXECUTE FUNCTION _mq_fill_row();

-- Alert counters (schema/alerts.sql), per channel, counted since the
-- install and never reset: attempts that failed (mq_fail, or a final lease
-- that ran out), retries scheduled, messages that went dead; and of the
-- messages completed, how many, their seconds from insert to completion
-- (sum, and cumulative counts at the bounds of _mq_wait_bounds()) and when
-- the last one was. As for mq_counts, writers append deltas and
-- _mq_event_fold moves them into mq_events now and then: a row per failure,
-- and per channel of a completing statement a row with the statement's
-- time and its messages' insert times (what a completion pays for the
-- histogram: the fold computes it).
CREATE TABLE IF NOT EXISTS mq_events (
    channel_name      text PRIMARY KEY,
    failed            bigint NOT NULL DEFAULT 0,
    retried           bigint NOT NULL DEFAULT 0,
    dead              bigint NOT NULL DEFAULT 0,
    completed         bigint NOT NULL DEFAULT 0,
    wait_sum          double precision NOT NULL DEFAULT 0,
    wait_buckets      bigint[] NOT NULL DEFAULT '{}',
    last_completed_at timestamptz
);

CREATE TABLE IF NOT EXISTS mq_event_deltas (
    channel_name text NOT NULL,
    failed       int NOT NULL,
    retried      int NOT NULL,
    dead         int NOT NULL,
    completed_at timestamptz,
    created      timestamptz[] NOT NULL
);

ALTER TABLE mq_event_deltas SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_cost_delay = 0
);

-- The runners (schema/workers.sql, pqmq workers): one row per running
-- pqmq_runner, written when it starts, its last_seen and figures updated by
-- its heartbeat (only id is indexed, and pages keep room: the heartbeat is
-- a HOT update), deleted when it stops. A row whose heartbeat stopped is
-- shown as gone, and deleted later.
CREATE TABLE IF NOT EXISTS mq_workers (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    host        text NOT NULL,
    pid         int NOT NULL,
    version     text NOT NULL,
    channels    text[],
    threads     int NOT NULL,
    in_flight   int NOT NULL DEFAULT 0,
    jobs_done   bigint NOT NULL DEFAULT 0,
    jobs_failed bigint NOT NULL DEFAULT 0,
    started_at  timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    last_seen   timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
);

ALTER TABLE mq_workers SET (fillfactor = 50);

-- Paused channels (schema/pause.sql, pqmq pause): one row per channel name,
-- which covers every args of that name. No poll lane delivers a message of
-- a paused channel; what is in flight can still be completed, failed or kept
-- alive. Polls probe this table once (any row at all?) before they filter
-- by it, so an empty table costs a poll that probe only.
CREATE TABLE IF NOT EXISTS mq_paused (
    channel_name text PRIMARY KEY,
    paused_at    timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    paused_by    name NOT NULL DEFAULT session_user,
    reason       text
);
