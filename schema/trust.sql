-- schema/trust.sql: what every function trusts and who may call what.
-- Applied after the other schema/ files but roles.sql.

-- Every function pins pg_catalog, the queue's schema and pg_temp, by name
-- (but for one with a standard SQL body, whose names were resolved when it
-- was created);
-- internal helpers are not for PUBLIC. The functions on the hot path run
-- with the planner settings that keep their plans to index probes, whatever
-- ANALYZE last saw of a table that swings between empty and huge, and
-- without JIT (DESIGN.md, Plans); set here, once for all of them, rather
-- than in each header. Those that take arrays of ids use the generic plan
-- (a new session's first five calls made custom plans that hash-joined the
-- whole table); the picks have no bitmap scans (the ordered index scan stops
-- after a channel's share; a bitmap plan read and sorted whole channels).
DO $$
DECLARE
    nsp oid := (SELECT c.relnamespace FROM pg_catalog.pg_class c
                WHERE c.oid = pg_catalog.to_regclass('mq_rows'));
    nm  text := (SELECT n.nspname FROM pg_catalog.pg_namespace n WHERE n.oid = nsp);
    f   record;
    owner oid := (SELECT n.nspowner FROM pg_catalog.pg_namespace n WHERE n.oid = nsp);
    who text;
BEGIN
    -- A schema others can create in is refused, before anything changes.
    SELECT r.rolname INTO who
    FROM pg_catalog.pg_roles r
    WHERE NOT r.rolsuper
      AND NOT pg_catalog.pg_has_role(r.oid, owner, 'USAGE')
      AND pg_catalog.has_schema_privilege(r.oid, nsp, 'CREATE')
    ORDER BY r.rolname
    LIMIT 1;
    IF who IS NOT NULL THEN
        RAISE EXCEPTION 'pqmq: role % may create objects in the queue schema %',
            who, nsp::regnamespace
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Revoke CREATE on that schema from every role but its owner '
                         '(REVOKE CREATE ON SCHEMA ... FROM PUBLIC), or install into '
                         'a schema of its own.';
    END IF;
    FOR f IN
        SELECT p.oid::regprocedure AS fn,
               p.proname = ANY (ARRAY['_mq_lock_new_chains', '_mq_wake', 'mq_pick',
                                      '_mq_fixed_length']) AS internal,
               p.proname = ANY (ARRAY[
                   '_mq_lock_new_chains', 'mq_complete', 'mq_release', 'mq_reap_dead', 'mq_skip',
                   '_mq_insert_rows', 'mq_commit', '_mq_insert_keyed', '_mq_lock_keys',
                   'mq_keep_alive_count', 'mq_checkpoint_found', 'mq_fail', '_mq_pick_set',
                   '_mq_random_start', '_mq_wait_time', 'mq_claim_lane', '_mq_pick_keys',
                   '_mq_pick_chains', '_mq_pick_urgent', '_mq_log_claim', '_mq_log_pick',
                   '_mq_log_held', '_mq_log_complete', '_mq_log_forget', '_mq_log_to_msgs',
                   '_mq_log_move', '_mq_log_reap', '_mq_log_settle', '_mq_log_reclaim',
                   '_mq_log_keep_alive', '_mq_log_clear']) AS hot,
               p.proname = ANY (ARRAY['mq_complete', '_mq_insert_rows', '_mq_insert_keyed',
                                      '_mq_pick_set', 'mq_claim_lane', '_mq_log_held',
                                      '_mq_log_complete', '_mq_log_forget', '_mq_log_move',
                                      '_mq_log_keep_alive', '_mq_log_to_msgs'])
                   AS generic,
               p.proname = ANY (ARRAY['_mq_random_start', '_mq_pick_keys', '_mq_pick_chains',
                                      '_mq_pick_urgent', '_mq_log_claim']) AS no_bitmap,
               p.prosqlbody IS NOT NULL AS parsed
        FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = nsp AND p.proname ~ '^_?mq_'
    LOOP
        -- A standard SQL body (_mq_lane_admits, ...) gets no settings: its names
        -- were resolved when it was created, and a setting would keep the
        -- planner from inlining it.
        IF f.parsed THEN
            CONTINUE;
        END IF;
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                                  f.fn, nm);
        IF f.internal THEN
            EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f.fn);
        END IF;
        IF f.hot THEN
            EXECUTE pg_catalog.format(
                'ALTER FUNCTION %s SET enable_seqscan = off SET enable_hashjoin = off '
                'SET enable_mergejoin = off SET jit = off', f.fn);
        END IF;
        IF f.generic THEN
            EXECUTE pg_catalog.format('ALTER FUNCTION %s SET plan_cache_mode = force_generic_plan',
                                      f.fn);
        END IF;
        IF f.no_bitmap THEN
            EXECUTE pg_catalog.format('ALTER FUNCTION %s SET enable_bitmapscan = off', f.fn);
        END IF;
    END LOOP;
END
$$;
