-- schema/schedules.sql: recurring messages: the slots of a cron schedule in
-- a time zone, and inserting each slot once however many runners carry it. The cron expression itself
-- is parsed by the client (lib/cron.c) into the bit sets taken here: bit v
-- of minutes, hours, doms, months, dows is value v (weekday 0 is Sunday);
-- dom_any / dow_any say the day field was '*' (when both day fields are
-- restricted, either may match, as in every cron).

-- The local wall-clock minutes of the schedule that come due in (after,
-- until], and the minute (UTC) each comes due at. Minutes are walked in UTC
-- and each local minute fires once, the first time the local clock reaches
-- it: a minute the clock skips (spring forward) fires at the first minute
-- after the gap, and a minute it repeats (fall back) fires once.
CREATE OR REPLACE FUNCTION mq_cron_slots(minutes bigint, hours int, doms bigint, months int,
                                         dows int, dom_any boolean, dow_any boolean,
                                         tz text, after timestamptz, until timestamptz)
RETURNS TABLE(slot timestamp, due timestamptz)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
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
      AND CASE WHEN dom_any AND dow_any THEN true
               WHEN dom_any THEN (dows >> extract(dow FROM l.m)::int) & 1 = 1
               WHEN dow_any THEN (doms >> extract(day FROM l.m)::int) & 1 = 1
               ELSE (dows >> extract(dow FROM l.m)::int) & 1 = 1
                    OR (doms >> extract(day FROM l.m)::int) & 1 = 1 END
    ORDER BY s.utc, l.m
$$;

-- Evaluates schedule sched_name up to now: inserts a message for each slot
-- that came due since the last evaluation (any runner's), or only the
-- latest of them (backfill 'latest'), on channel_name with the given name
-- and payload (a JSON object payload gets "_slot": the local slot time).
-- Each slot's message carries the unique key 'schedule:NAME:SLOT', kept a
-- day after completion, so runners racing on a slot insert it once. A
-- schedule seen for the first time starts now; slots more than 31 days old
-- are not inserted. Returns how many messages it inserted.
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
    slots timestamp[];
    n     int;
BEGIN
    IF sched_name IS NULL OR tz IS NULL OR channel_name IS NULL THEN
        RAISE EXCEPTION 'mq_schedule: sched_name, tz and channel_name must not be NULL'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF backfill IS NULL OR backfill NOT IN ('all', 'latest') THEN
        RAISE EXCEPTION 'mq_schedule: backfill % is not all or latest',
            COALESCE(quote_literal(backfill), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM ts AT TIME ZONE tz; -- names an unknown time zone
    INSERT INTO mq_schedules AS s (name, last_slot) VALUES (sched_name, ts)
    ON CONFLICT (name) DO NOTHING;
    SELECT s.last_slot INTO last FROM mq_schedules s WHERE s.name = sched_name;
    IF last >= ts THEN
        RETURN 0;
    END IF;
    slots := ARRAY(SELECT c.slot FROM mq_cron_slots(minutes, hours, doms, months, dows,
                                                   dom_any, dow_any, tz,
                                                   GREATEST(last, ts - interval '31 days'),
                                                   ts) c
                   ORDER BY c.due, c.slot);
    IF backfill = 'latest' AND cardinality(slots) > 1 THEN
        slots := slots[cardinality(slots):];
    END IF;
    n := 0;
    IF cardinality(slots) > 0 THEN
        SELECT count(*) FILTER (WHERE u.outcome = 'inserted') INTO n
        FROM mq_insert_unique(
            ARRAY(SELECT ROW(gen_random_uuid(), NULL, retries, retry_backoff, channel_name,
                             '', NULL, false, msg_name,
                             CASE WHEN jsonb_typeof(payload_json::jsonb) = 'object'
                                  THEN (payload_json::jsonb
                                        || jsonb_build_object('_slot', to_char(s.slot,
                                               'YYYY-MM-DD"T"HH24:MI')))::text
                                  ELSE payload_json END,
                             payload_bytes)::mq_new_t
                  FROM unnest(slots) WITH ORDINALITY AS s(slot, o) ORDER BY s.o),
            ARRAY(SELECT 'schedule:' || sched_name || ':' || to_char(s.slot, 'YYYY-MM-DD"T"HH24:MI')
                  FROM unnest(slots) WITH ORDINALITY AS s(slot, o) ORDER BY s.o),
            'keep', interval '1 day') u;
    END IF;
    UPDATE mq_schedules s SET last_slot = GREATEST(s.last_slot, ts) WHERE s.name = sched_name;
    RETURN n;
END;
$$;
