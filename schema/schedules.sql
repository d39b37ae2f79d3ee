-- schema/schedules.sql: recurring messages: the slots of a cron schedule in
-- a time zone, and inserting each slot once however many runners carry it. The cron expression itself
-- is parsed by the client (lib/cron.c) into the bit sets taken here: bit v
-- of minutes, hours, doms, months, dows is value v (weekday 0 is Sunday);
-- dom_any / dow_any say the day field starts with '*' ('*', '*/2'). As
-- cronie and vixie cron match days: when neither does, a day matches
-- either field; when one does, it must match both (the bits of a bare '*'
-- are all set, those of '*/2' every other day).

-- The local wall-clock minutes of the schedule that come due in (after,
-- until], and the minute (UTC) each comes due at. Minutes are walked in UTC
-- and each local minute fires once, the first time the local clock reaches
-- it: a minute the clock skips (spring forward) fires at the first minute
-- after the gap, and a minute it repeats (fall back) fires once. The span
-- is at most 31 days (as pqmq_cron_slots'); every bit set must have a bit
-- in its field's range (_mq_cron_check).
-- Parameters: the schedule's fields as bit sets, tz, and the span (after,
--   until].
-- Returns: one row per slot: local time and when it is due. Duty: produce,
--   administer.
CREATE OR REPLACE FUNCTION mq_cron_slots(minutes bigint, hours int, doms bigint, months int,
                                         dows int, dom_any boolean, dow_any boolean,
                                         tz text, after timestamptz, until timestamptz)
RETURNS TABLE(slot timestamp, due timestamptz)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    bounded boolean;
BEGIN
    PERFORM _mq_cron_check('mq_cron_slots', minutes, hours, doms, months, dows, dom_any,
                          dow_any, tz);
    -- Not until - after, which wraps around past 292,000 years: an end
    -- that is infinite or out of range is as refused as a span over 31
    -- days, with the same message.
    BEGIN
        bounded := isfinite(after) AND isfinite(until)
                   AND until <= after + interval '31 days';
    EXCEPTION WHEN datetime_field_overflow THEN
        bounded := false;
    END;
    IF after IS NULL OR until IS NULL OR NOT bounded THEN
        RAISE EXCEPTION 'mq_cron_slots: after and until must be given and at most 31 days apart (% to %)',
            after, until
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH walk AS (
        -- Three hours before `after` too, so that a repeated hour already
        -- seen (fall back) is known as seen.
        SELECT g AS utc, g AT TIME ZONE tz AS loc
        FROM generate_series(date_trunc('minute', after) - interval '3 hours',
                             until, interval '1 minute') AS g
    ),
    seen AS (
        SELECT w.utc, w.loc,
               max(w.loc) OVER (ORDER BY w.utc ROWS BETWEEN UNBOUNDED PRECEDING
                                                        AND 1 PRECEDING) AS high
        FROM walk w
    )
    SELECT l.m, s.utc
    FROM seen s,
         LATERAL generate_series(COALESCE(s.high + interval '1 minute', s.loc), s.loc,
                                 interval '1 minute') AS l(m)
    WHERE s.utc > after
      AND (minutes >> extract(minute FROM l.m)::int) & 1 = 1
      AND (hours >> extract(hour FROM l.m)::int) & 1 = 1
      AND (months >> extract(month FROM l.m)::int) & 1 = 1
      AND CASE WHEN dom_any OR dow_any
               THEN (dows >> extract(dow FROM l.m)::int) & 1 = 1
                    AND (doms >> extract(day FROM l.m)::int) & 1 = 1
               ELSE (dows >> extract(dow FROM l.m)::int) & 1 = 1
                    OR (doms >> extract(day FROM l.m)::int) & 1 = 1 END
    ORDER BY s.utc, l.m;
END;
$$;

-- Refuses a schedule's bit sets (for fn, which is named) when one is NULL
-- or has no bit in its field's range (minutes 0-59, hours 0-23, days of
-- the month 1-31, months 1-12, weekdays 0-6), naming the field: such a
-- schedule never fires, and its slots would pass unseen.
CREATE OR REPLACE FUNCTION _mq_cron_check(fn text, minutes bigint, hours int, doms bigint,
                                          months int, dows int, dom_any boolean,
                                          dow_any boolean, tz text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    field text;
BEGIN
    field := CASE
        WHEN minutes IS NULL OR minutes & 1152921504606846975 = 0 THEN 'minutes (0-59)'
        WHEN hours IS NULL OR hours & 16777215 = 0 THEN 'hours (0-23)'
        WHEN doms IS NULL OR doms & 4294967294 = 0 THEN 'doms (days of the month, 1-31)'
        WHEN months IS NULL OR months & 8190 = 0 THEN 'months (1-12)'
        WHEN dows IS NULL OR dows & 127 = 0 THEN 'dows (weekdays, 0-6)'
        WHEN dom_any IS NULL THEN 'dom_any'
        WHEN dow_any IS NULL THEN 'dow_any'
        WHEN tz IS NULL THEN 'tz'
        END;
    IF field IS NOT NULL THEN
        RAISE EXCEPTION '%: % is NULL or has no bit in its range', fn, field
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;

-- Who calls: the role this session acts as (SET ROLE's, else the session's
-- user). Inside a SECURITY DEFINER function current_user is the definer;
-- the setting role is not, and only a member of a role may set it.
CREATE OR REPLACE FUNCTION _mq_caller()
RETURNS oid
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT r.oid FROM pg_catalog.pg_roles r
    WHERE r.rolname OPERATOR(pg_catalog.=) CASE
        WHEN pg_catalog.current_setting('role') OPERATOR(pg_catalog.=) 'none'
        THEN SESSION_USER::text
        ELSE pg_catalog.current_setting('role') END
$$;

-- Evaluates schedule sched_name up to now: inserts a message for each slot
-- that came due since the last evaluation (any runner's), or only the
-- latest of them (backfill 'latest'), on channel_name with the given name
-- and payload (a JSON object payload gets "_slot": the local slot time).
-- Each slot's message carries the unique key 'schedule:NAME:SLOT', kept a
-- day after completion, so runners racing on a slot insert it once. A
-- schedule seen for the first time starts now; slots more than 31 days old
-- are not inserted; one evaluation inserts at most 10,000 slots (the
-- oldest, in batches of 1,000) and the next goes on from there. A schedule
-- belongs to the role that first evaluated it (_mq_caller): only that role,
-- a role with its rights, or the queue's owner (or a superuser) may
-- evaluate it. Returns how many messages it inserted.
-- Parameters: sched_name; the schedule's fields and tz; backfill: 'all' or
--   'latest'; the message's channel, name, payload, retries and backoff.
-- Returns: how many messages it inserted. Duty: produce.
CREATE OR REPLACE FUNCTION mq_schedule(sched_name text, minutes bigint, hours int, doms bigint,
                                       months int, dows int, dom_any boolean,
                                       dow_any boolean, tz text, backfill text,
                                       channel_name text, msg_name text, payload_json text,
                                       payload_bytes bytea, retries int,
                                       retry_backoff interval)
RETURNS int
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    ts    timestamptz := date_trunc('minute', clock_timestamp());
    last  timestamptz;
    upto  timestamptz;
    slots timestamp[];
    dues  timestamptz[];
    n     int := 0;
    k     int;
    who   oid := _mq_caller();
    owner oid;
    heir  boolean;
BEGIN
    IF sched_name IS NULL OR channel_name IS NULL THEN
        RAISE EXCEPTION 'mq_schedule: sched_name and channel_name must not be NULL'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Its slots' keys, 'schedule:NAME:YYYY-MM-DDTHH:MI', fit in 1024 bytes.
    IF sched_name = '' OR octet_length(sched_name) > 998 THEN
        RAISE EXCEPTION 'mq_schedule: sched_name must be 1 to 998 bytes, not %',
            octet_length(sched_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Refused now, as every slot's insert would refuse them.
    IF octet_length(channel_name) > (_mq_limits()).max_text
       OR octet_length(msg_name) > (_mq_limits()).max_text THEN
        RAISE EXCEPTION 'mq_schedule: schedule %: % is over % bytes',
            quote_literal(left(sched_name, 100)),
            CASE WHEN octet_length(channel_name) > (_mq_limits()).max_text
                 THEN 'channel_name' ELSE 'msg_name' END, (_mq_limits()).max_text
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM _mq_cron_check('mq_schedule', minutes, hours, doms, months, dows, dom_any,
                          dow_any, tz);
    IF backfill IS NULL OR backfill NOT IN ('all', 'latest') THEN
        RAISE EXCEPTION 'mq_schedule: backfill % is not all or latest',
            COALESCE(quote_literal(backfill), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM ts AT TIME ZONE tz; -- names an unknown time zone
    -- Refused before any slot comes due, naming the schedule.
    IF payload_json IS NOT NULL THEN
        BEGIN
            PERFORM payload_json::jsonb;
        EXCEPTION WHEN invalid_text_representation OR untranslatable_character THEN
            RAISE EXCEPTION 'mq_schedule: schedule %: payload is not valid JSON',
                quote_literal(left(sched_name, 100))
                USING ERRCODE = 'invalid_text_representation', DETAIL = SQLERRM;
        END;
    END IF;
    INSERT INTO mq_schedules AS s (name, last_slot, owner) VALUES (sched_name, ts, who)
    ON CONFLICT (name) DO NOTHING;
    -- (A schedule from before owners were recorded goes to its next caller.)
    UPDATE mq_schedules s SET owner = who WHERE s.name = sched_name AND s.owner IS NULL;
    SELECT s.last_slot, s.owner INTO last, owner FROM mq_schedules s
    WHERE s.name = sched_name FOR UPDATE;
    -- (A dropped owner's schedule is the queue owner's to evaluate.)
    heir := EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = owner)
            AND pg_has_role(who, owner, 'USAGE');
    IF owner IS DISTINCT FROM who AND NOT heir
       AND NOT pg_has_role(who, (SELECT c.relowner FROM pg_class c
                                 WHERE c.oid = 'mq_rows'::regclass), 'USAGE') THEN
        RAISE EXCEPTION 'mq_schedule: schedule % belongs to role %, not to %',
            quote_literal(left(sched_name, 100)),
            COALESCE((SELECT r.rolname::text FROM pg_roles r WHERE r.oid = owner),
                     'oid ' || owner),
            (SELECT r.rolname FROM pg_roles r WHERE r.oid = who)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Run the schedule as that role (or one with its rights), or give it another name.';
    END IF;
    IF last >= ts THEN
        RETURN 0;
    END IF;
    -- In batches of at most 1,000 slots, oldest first, at most 10 per
    -- evaluation.
    last := GREATEST(last, ts - interval '31 days');
    FOR b IN 1 .. 10 LOOP
        SELECT array_agg(c.slot ORDER BY c.due, c.slot), array_agg(c.due ORDER BY c.due, c.slot)
        INTO slots, dues
        FROM (SELECT c.slot, c.due
              FROM mq_cron_slots(minutes, hours, doms, months, dows, dom_any, dow_any, tz,
                                 last, ts) c
              ORDER BY c.due, c.slot
              LIMIT CASE WHEN backfill = 'latest' THEN NULL ELSE 1001 END) c;
        upto := ts;
        IF backfill = 'all' AND cardinality(slots) > 1000 THEN
            -- A batch ends before the minute due of its 1001st slot, whose
            -- slots (several after a clock's jump) the next batch takes whole.
            SELECT max(d.due) INTO upto FROM unnest(dues) AS d(due)
            WHERE d.due < dues[cardinality(dues)];
            slots := ARRAY(SELECT x.slot FROM unnest(slots, dues) WITH ORDINALITY AS x(slot, due, o)
                           WHERE x.due <= upto ORDER BY x.o);
        END IF;
        IF backfill = 'latest' AND cardinality(slots) > 1 THEN
            slots := slots[cardinality(slots):];
        END IF;
        IF cardinality(slots) > 0 THEN
            SELECT count(*) FILTER (WHERE u.outcome = 'inserted') INTO k
            FROM _mq_insert_keyed(
                ARRAY(SELECT ROW(gen_random_uuid(), NULL, retries, retry_backoff, channel_name,
                                 '', NULL, false, msg_name,
                                 CASE WHEN jsonb_typeof(payload_json::jsonb) = 'object'
                                      THEN (payload_json::jsonb
                                            || jsonb_build_object('_slot', to_char(s.slot,
                                                   'YYYY-MM-DD"T"HH24:MI')))::text
                                      ELSE payload_json END,
                                 payload_bytes)::mq_new_t
                      FROM unnest(slots) WITH ORDINALITY AS s(slot, o) ORDER BY s.o),
                ARRAY(SELECT 'schedule:' || sched_name || ':'
                             || to_char(s.slot, 'YYYY-MM-DD"T"HH24:MI')
                      FROM unnest(slots) WITH ORDINALITY AS s(slot, o) ORDER BY s.o),
                'keep', interval '1 day', NULL) u;
            n := n + k;
        END IF;
        last := upto;
        EXIT WHEN upto >= ts;
    END LOOP;
    UPDATE mq_schedules s SET last_slot = GREATEST(s.last_slot, last) WHERE s.name = sched_name;
    RETURN n;
END;
$$;
