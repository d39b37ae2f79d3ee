/*
 * test_hardening.c: answers to hostile and careless callers: intervals
 * with month and day parts, a schema others can create in, helpers PUBLIC
 * cannot call, precise refusals, and a hostile role that plants overloads
 * of built-ins on a privileged caller's path and must gain nothing when
 * that caller runs the whole life cycle.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* asprintf */
#endif
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

static long long count_all(PGconn *c)
{
    return t_sql_int(c, "SELECT (SELECT count(*) FROM mq_msgs) * 1000000 "
                        "+ (SELECT count(*) FROM mq_payloads) * 1000 "
                        "+ (SELECT count(*) FROM mq_chains)");
}

/* Runs sql (trusted test text); returns its SQLSTATE ("" on success). */
static const char *state_of(PGconn *c, const char *sql)
{
    static char st[6];
    PGresult *r = PQexec(c, sql);
    const char *s = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    ExecStatusType es = PQresultStatus(r);
    snprintf(st, sizeof st, "%s",
             es == PGRES_TUPLES_OK || es == PGRES_COMMAND_OK ? ""
             : s                                             ? s
                                                             : "?");
    PQclear(r);
    return st;
}

/* ---- intervals ------------------------------------------------------------ */

/* '-1 month +30 days +1 second' compares as one second; it must also lease
 * for one second, whatever today's month is. */
static void test_month_interval_lease(void)
{
    t_truncate();
    t_exec(pg, "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), NULL, 1, "
               "interval '-1 month +30 days +1 second', 'm', '', NULL, false, 'n', NULL, "
               "NULL)::mq_new_t])");
    CHECK_INT(t_sql_int(pg, "SELECT extract(epoch FROM retry_backoff)::bigint * 1000000 "
                            "FROM mq_msgs"),
              1000000);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_poll_jobs(NULL, 5) "
                            "WHERE id IS NOT NULL AND retry_backoff = interval '1 second'"),
              1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE attempt_at > now()"), 1);
    /* Negative once months and days have a fixed length: refused. */
    long long before = count_all(pg);
    CHECK_STR(state_of(pg, "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), NULL, 1, "
                           "interval '1 month -30 days -1 second', 'm', '', NULL, false, "
                           "'n', NULL, NULL)::mq_new_t])"),
              "22023");
    CHECK_STR(state_of(pg, "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), "
                           "interval '1 day -24 hours -1 microsecond', 1, NULL, 'm', '', "
                           "NULL, false, 'n', NULL, NULL)::mq_new_t])"),
              "22023");
    CHECK_INT(count_all(pg), before);
    /* Keep-alive and checkpoint read durations the same way. */
    CHECK_STR(state_of(pg, "SELECT mq_keep_alive(ARRAY(SELECT id FROM mq_msgs), "
                           "interval '1 month -30 days -1 second')"),
              "22023");
    CHECK_STR(state_of(pg, "SELECT mq_checkpoint((SELECT id FROM mq_msgs), "
                           "interval '1 day -24 hours -1 second', NULL, NULL, 0)"),
              "22023");
    /* A day is 24 hours even across a daylight-saving change. */
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM generate_series(0, 400) AS k, "
                        "LATERAL (SELECT timestamptz '2026-01-01 00:30 America/New_York' "
                        "  + k * interval '23 hours' AS ts) t "
                        "WHERE t.ts + _mq_fixed_length(interval '1 day -24 hours +1 second') "
                        "      - t.ts <> interval '1 second'"),
              0);
}

/* Months, years and days in any of a message's three intervals, on any
 * message of a batch, are given their fixed length (a month 30 days, a day
 * 24 hours) before anything is computed or stored: a year of delay is 360
 * days, whatever the calendar says, and a stored backoff keeps no day or
 * month field. Each interval is set on the last of three messages. */
static void test_calendar_fields_fixed_in_every_interval(void)
{
    static const char *const forms[] = {
        /* delay, retry_backoff, commit_interval */
        "interval '1 year', NULL, NULL",
        "NULL, NULL, interval '1 year'",
        "NULL, interval '2 mons 1 day', NULL",
    };
    for (int f = 0; f < 3; f++) {
        t_truncate();
        t_exec(pg,
               "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), NULL, 1, NULL, 'cal', '', NULL, "
               "false, 'n', NULL, NULL)::mq_new_t, ROW(gen_random_uuid(), NULL, 1, "
               "interval '5 seconds', 'cal', '', NULL, false, 'n', NULL, NULL)::mq_new_t, "
               "(SELECT ROW(gen_random_uuid(), x.d, 1, x.b, 'cal', '', x.c, false, 'last', "
               "NULL, NULL)::mq_new_t FROM (SELECT %s) AS x(d, b, c))])",
               forms[f]);
        CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 3);
        if (f < 2)
            CHECK_INT(t_sql_int(pg,
                                "SELECT extract(epoch FROM attempt_at - created_at)::bigint "
                                "FROM mq_msgs WHERE name = 'last'"),
                      360LL * 86400);
        else
            CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE name = 'last' "
                                    "AND date_part('month', retry_backoff) = 0 "
                                    "AND date_part('day', retry_backoff) = 0 "
                                    "AND extract(epoch FROM retry_backoff) = 61 * 86400"),
                      1);
        /* The others are unchanged. */
        CHECK_INT(t_sql_int(pg,
                            "SELECT count(*) FROM mq_msgs WHERE name = 'n' "
                            "AND retry_backoff IN (interval '1 second', interval '5 seconds')"
                            " AND attempt_at = created_at"),
                  2);
    }
}

/* ---- search_path and schema rights --------------------------------------- */

static void test_schema_others_can_create_in_is_refused(void)
{
    char s[80];
    snprintf(s, sizeof s, "%s_open", t_schema());
    t_exec(pg, "DROP SCHEMA IF EXISTS %s CASCADE", s);
    t_exec(pg, "CREATE SCHEMA %s", s);
    t_exec(pg, "GRANT CREATE ON SCHEMA %s TO PUBLIC", s);
    PGconn *c = t_pg();
    t_exec(c, "SET search_path = %s", s);
    pqmq_client *w = NULL;
    CHECK_INT(pqmq_wrap(c, &w), 0);
    CHECK(pqmq_migrate(w) != 0);
    CHECK(strstr(pqmq_errmsg(w), "may create objects in the queue schema") != NULL);
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM pg_class WHERE relnamespace = '%s'::regnamespace",
                        s),
              0);
    /* Revoked: installs. */
    t_exec(pg, "REVOKE CREATE ON SCHEMA %s FROM PUBLIC", s);
    CHECK_OK(w, pqmq_migrate(w));
    pqmq_client_free(w);
    PQfinish(c);
    t_exec(pg, "DROP SCHEMA %s CASCADE", s);
}

/* No function of the queue may be executed by PUBLIC: helpers never, and
 * since the roles migration (0007) the entry points neither (mq_grant gives
 * them to roles by duty, test_roles). Every mq_% function is looked at, so
 * a helper added later is covered too; the named ones must exist. */
static void test_helpers_not_for_public(void)
{
    const char *helpers[] = {
        "_mq_lock_new_chains", "_mq_pick_chains",  "_mq_wake",         "_mq_pick_keys",
        "_mq_pick_set",        "_mq_next_head_at", "_mq_oldest_ready", "_mq_fixed_length",
        "_mq_insert_rows",     "_mq_release_key",  "_mq_retake_keys",  "_mq_low_mark",
        "_mq_pick_urgent",     "_mq_random_start", "_mq_at",           "_mq_xact_id",
        "_mq_qualified",       "_mq_run_ddl",      "_mq_insert_keyed", "_mq_check_json",
        "_mq_lock_keys",       "_mq_insert_check", "_mq_cron_check",   "_mq_caller",
        "_mq_chain_heads",     "_mq_sweep_keys",   "mq_insert",        "_mq_lane_admits",
        "_mq_claimable",       "_mq_in_channel",   "_mq_walk_next"};
    for (size_t i = 0; i < sizeof helpers / sizeof *helpers; i++)
        if (t_sql_int(pg,
                      "SELECT count(*) FROM pg_proc p WHERE p.proname = '%s' "
                      "AND p.pronamespace = '%s'::regnamespace",
                      helpers[i], t_schema()) == 0)
            t_fail(__FILE__, __LINE__, "no function %s", helpers[i]);
    PGresult *r = t_sql(pg,
                        "SELECT string_agg(p.oid::regprocedure::text, ', ') FROM pg_proc p "
                        "WHERE p.pronamespace = '%s'::regnamespace "
                        "AND p.proname ~ '^_?mq_' "
                        "AND (p.proacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a "
                        "     WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'))",
                        t_schema());
    if (!r || PQntuples(r) != 1 || !PQgetisnull(r, 0, 0))
        t_fail(__FILE__, __LINE__, "PUBLIC may execute %s",
               r && PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "(query failed)");
    PQclear(r);
}

/* ---- precise refusals ------------------------------------------------------ */

static void test_bad_shapes_refused(void)
{
    t_truncate();
    t_exec(pg, "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), NULL, 1, NULL, 'c', '', NULL, "
               "false, 'n', NULL, NULL)::mq_new_t])");
    PGresult *r = t_sql(pg, "SELECT id, attempt FROM mq_poll_jobs(NULL, 1)");
    char id[40] = "";
    if (r && PQntuples(r) == 1)
        snprintf(id, sizeof id, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    long long before = count_all(pg);
    char *sql = NULL;
    /* A 1025-byte channel name. */
    CHECK_STR(state_of(pg, "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), NULL, 1, NULL, "
                           "repeat('x', 1025), '', NULL, false, 'n', NULL, NULL)::mq_new_t])"),
              "22023");
    /* NULL attempt number: would have completed without the check. */
    if (asprintf(&sql, "SELECT mq_complete(ARRAY['%s'::uuid], ARRAY[NULL::int])", id) < 0)
        abort();
    CHECK_STR(state_of(pg, sql), "22023");
    free(sql);
    /* Two ids, one attempt number: nothing released. */
    if (asprintf(&sql, "SELECT mq_release(ARRAY['%s'::uuid, gen_random_uuid()], ARRAY[1])",
                 id) < 0)
        abort();
    CHECK_STR(state_of(pg, sql), "22023");
    free(sql);
    if (asprintf(&sql, "SELECT mq_release(ARRAY['%s'::uuid], ARRAY[NULL::int])", id) < 0)
        abort();
    CHECK_STR(state_of(pg, sql), "22023");
    free(sql);
    CHECK_INT(count_all(pg), before);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE attempt_at > now()"), 1);
    /* 1024 bytes is a channel. */
    CHECK_STR(state_of(pg, "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), NULL, 1, NULL, "
                           "repeat('x', 1024), '', NULL, false, 'n', NULL, NULL)::mq_new_t])"),
              "");
}

/* ---- a handler's long error text ------------------------------------------ */

static int fail_long(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)job;
    char text[700] = "";
    for (int i = 0; i < 300; i++) /* 600 bytes of two-byte characters */
        strcat(text, "\xc3\xa9");
    pqmq_ctx_error(ctx, "%s", text);
    pqmq_runner_stop(arg);
    return 1;
}

static void *run_runner(void *r)
{
    pqmq_runner_run(r);
    return NULL;
}

/* Cut to the buffer mid-character, the text used to be refused by the
 * server and the failure went unrecorded. */
static void test_long_error_text_recorded(void)
{
    t_truncate();
    pqmq_msg *m = t_msg("long", NULL, "fails", NULL, 0);
    pqmq_msg_set_backoff(m, 60000);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    pqmq_msg_free(m);
    char *conninfo = NULL;
    if (asprintf(&conninfo, "%s options='-c search_path=%s'", t_dsn(), t_schema()) < 0)
        abort();
    pqmq_runner *r = pqmq_runner_new(conninfo);
    free(conninfo);
    CHECK_INT(pqmq_runner_handle(r, "fails", fail_long, r), 0);
    pthread_t th;
    pthread_create(&th, NULL, run_runner, r);
    pthread_join(th, NULL);
    pqmq_runner_free(r);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_payloads WHERE last_error IS NOT NULL "
                            "AND octet_length(last_error) BETWEEN 500 AND 511 "
                            "AND last_error ~ '^(\xc3\xa9)+$'"),
              1);
}

/* ---- a hostile role -------------------------------------------------------- */

static char hostile[64], qs[80];

static PGconn *connect_as(const char *user, const char *path)
{
    const char *keys[] = {"dbname", "user", "options", NULL};
    const char *vals[] = {t_dsn(), user, "-c client_min_messages=warning", NULL};
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    if (PQstatus(c) != CONNECTION_OK) {
        t_fail(__FILE__, __LINE__, "cannot connect as %s: %s", user, PQerrorMessage(c));
        PQfinish(c);
        return NULL;
    }
    t_exec(c, "SET search_path = %s", path);
    return c;
}

/* Applies the install script (pqmq.sql, named by $PQMQ_INSTALL_SQL, which
 * make check sets) as psql -1 would under the default path: the whole file
 * in one transaction, the queue schema current. */
static int apply_files(PGconn *c)
{
    const char *path = getenv("PQMQ_INSTALL_SQL");
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) {
        t_fail(__FILE__, __LINE__, "cannot read %s (set PQMQ_INSTALL_SQL)", path ? path : "");
        return 0;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *sql = calloc(1, (size_t)n + 1);
    int ok = sql && fread(sql, 1, (size_t)n, f) == (size_t)n;
    fclose(f);
    if (ok) {
        PQclear(PQexec(c, "BEGIN"));
        PGresult *r = PQexec(c, sql);
        if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
            t_fail(__FILE__, __LINE__, "%s: %s", path, PQerrorMessage(c));
            ok = 0;
        }
        PQclear(r);
        PQclear(PQexec(c, ok ? "COMMIT" : "ROLLBACK"));
    }
    free(sql);
    return ok;
}

/* The traps: exact-type overloads of the built-ins the queue's functions
 * call, each logging who ran it and trying to make the hostile role a
 * superuser. Planted by the hostile role in every schema it may create in
 * that is on a caller's default path: public and one named after the
 * privileged caller ("$user"). */
static const char *trap_functions[] = {
    "cardinality(uuid[]) RETURNS int",
    "cardinality(text[]) RETURNS int",
    "cardinality(int[]) RETURNS int",
    "cardinality(@Q.mq_new_t[]) RETURNS int",
    "unnest(uuid[]) RETURNS SETOF uuid",
    "unnest(text[]) RETURNS SETOF text",
    "unnest(int[]) RETURNS SETOF int",
    "array_position(int[], int) RETURNS int",
    "hashtext(text) RETURNS int",
    "octet_length(text) RETURNS int",
    "left(text, int) RETURNS text",
    "pg_notify(text, text) RETURNS void",
    "clock_timestamp() RETURNS timestamptz",
    "random() RETURNS float8",
    "pg_advisory_xact_lock(int, int) RETURNS void",
    "format(text, text) RETURNS text",
    "_mq_limits() RETURNS int",
    "make_interval(int, int, int, int) RETURNS interval",
    "date_part(text, interval) RETURNS float8",
    "now() RETURNS timestamptz",
};
static const char *trap_operators[] = {
    "||:uuid[]:uuid[]", "*:interval:int",         "*:float8:numeric",
    "/:interval:int",   "+:timestamptz:interval", "-:timestamptz:timestamptz",
    "=:uuid:uuid",      "<:interval:interval",
};

static void plant(PGconn *h, const char *schema)
{
    t_exec(h, "CREATE TABLE IF NOT EXISTS %s.trap_log (who text, what text)", schema);
    t_exec(h, "GRANT INSERT ON %s.trap_log TO PUBLIC", schema);
    /* One trap body, returning NULL of any type. */
    t_exec(h,
           "CREATE OR REPLACE FUNCTION %s.trap(what text) RETURNS void LANGUAGE plpgsql AS $t$ "
           "BEGIN INSERT INTO %s.trap_log VALUES (current_user, what); "
           "BEGIN EXECUTE 'ALTER ROLE %s SUPERUSER'; EXCEPTION WHEN others THEN NULL; END; "
           "END $t$",
           schema, schema, hostile);
    for (size_t i = 0; i < sizeof trap_functions / sizeof *trap_functions; i++) {
        char *sig = NULL, *p;
        if (asprintf(&sig, "%s", trap_functions[i]) < 0)
            abort();
        while ((p = strstr(sig, "@Q"))) { /* the queue schema's type */
            char *s2 = NULL;
            *p = 0;
            if (asprintf(&s2, "%s%s%s", sig, qs, p + 2) < 0)
                abort();
            free(sig);
            sig = s2;
        }
        int setof = strstr(sig, "SETOF") != NULL;
        int isvoid = strstr(sig, "RETURNS void") != NULL;
        t_exec(h,
               "CREATE OR REPLACE FUNCTION %s.%s LANGUAGE plpgsql AS $t$ "
               "BEGIN PERFORM %s.trap(%s); %s END $t$",
               schema, sig, schema, "'fn'", setof || isvoid ? "RETURN;" : "RETURN NULL;");
        free(sig);
    }
    for (size_t i = 0; i < sizeof trap_operators / sizeof *trap_operators; i++) {
        char op[8], l[32], r[32];
        if (sscanf(trap_operators[i], "%7[^:]:%31[^:]:%31s", op, l, r) != 3)
            continue;
        t_exec(h,
               "CREATE OR REPLACE FUNCTION %s.trap_op_%zu(%s, %s) RETURNS %s LANGUAGE plpgsql "
               "AS $t$ BEGIN PERFORM %s.trap('op'); RETURN NULL; END $t$",
               schema, i, l, r, !strcmp(op, "=") || !strcmp(op, "<") ? "boolean" : l, schema);
        t_exec(h,
               "CREATE OPERATOR %s.%s (FUNCTION = %s.trap_op_%zu, LEFTARG = %s, RIGHTARG = %s)",
               schema, op, schema, i, l, r);
    }
    /* Aggregates too. */
    t_exec(h,
           "CREATE OR REPLACE FUNCTION %s.trap_sfunc(uuid[], uuid) RETURNS uuid[] "
           "LANGUAGE plpgsql AS $t$ BEGIN PERFORM %s.trap('agg'); RETURN $1; END $t$",
           schema, schema);
    t_exec(h, "CREATE AGGREGATE %s.array_agg(uuid) (SFUNC = %s.trap_sfunc, STYPE = uuid[])",
           schema, schema);
    t_exec(h, "CREATE AGGREGATE %s.count(uuid) (SFUNC = %s.trap_sfunc, STYPE = uuid[])", schema,
           schema);
}

/* Everything a privileged caller does with the queue: C API and SQL. */
static void life_cycle(PGconn *conn)
{
    pqmq_client *c = NULL;
    CHECK_INT(pqmq_wrap(conn, &c), 0);
    pqmq_msg *m[3] = {t_msg("h", "a", "n", "{\"k\": 1}", 1), t_msg("h", "a", "n", NULL, 1),
                      t_msg("", NULL, "n", NULL, 0)};
    pqmq_msg_set_commit_interval(m[2], 60000);
    uuid_t pending;
    pqmq_msg_id(m[2], pending);
    CHECK_OK(c, pqmq_insert(c, m, 3));
    t_msgs_free(m, 3);
    CHECK_OK(c, pqmq_commit(c, &pending, 1));
    for (int round = 0; round < 4; round++) {
        pqmq_batch *b = NULL;
        CHECK_OK(c, pqmq_poll(c, NULL, 0, 10, &b));
        for (size_t i = 0; i < pqmq_batch_count(b); i++) {
            uuid_t id;
            pqmq_job_id(pqmq_batch_job(b, i), id);
            CHECK_OK(c, pqmq_keep_alive(c, (const uuid_t *)&id, 1, 5000, NULL));
            if (round == 0)
                CHECK_OK(c, pqmq_fail(c, id, "once"));
        }
        if (round == 0)
            t_exec(conn, "UPDATE mq_msgs SET attempt_at = now()");
        else
            CHECK_OK(c, pqmq_complete_batch(c, b));
        pqmq_batch_free(b);
    }
    CHECK_INT(t_sql_int(conn, "SELECT count(*) FROM mq_msgs"), 0);
    t_exec(conn,
           "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), interval '1 month', 2, "
           "interval '1 day', 'h', 'b', interval '1 hour', true, 'n', '{}', NULL)::mq_new_t])");
    t_exec(conn, "SELECT mq_commit(ARRAY(SELECT id FROM mq_msgs))");
    t_exec(conn, "SELECT mq_keep_alive(ARRAY(SELECT id FROM mq_msgs), interval '1 hour')");
    t_exec(conn, "UPDATE mq_msgs SET attempt_at = now()");
    t_exec(conn, "SELECT * FROM mq_poll(ARRAY['h'], 5)");
    t_exec(conn, "SELECT mq_checkpoint((SELECT id FROM mq_msgs LIMIT 1), interval '1 hour', "
                 "'{}', NULL, 1)");
    t_exec(conn, "SELECT mq_release(ARRAY(SELECT id FROM mq_msgs), "
                 "ARRAY(SELECT deliveries FROM mq_msgs))");
    t_exec(conn, "SELECT * FROM mq_complete_poll('{}', '{}', NULL, 5)");
    t_exec(conn, "SELECT mq_fail((SELECT id FROM mq_msgs LIMIT 1), 'x', NULL)");
    t_exec(conn, "UPDATE mq_msgs SET attempts = 0, attempt_at = now()");
    t_exec(conn, "SELECT * FROM mq_dead_letters(NULL)");
    t_exec(conn, "SELECT mq_retry(ARRAY(SELECT id FROM mq_msgs), 1)");
    t_exec(conn, "SELECT mq_skip(ARRAY(SELECT id FROM mq_msgs))");
    t_exec(conn, "SELECT * FROM mq_stats()");
    t_exec(conn, "SELECT mq_delete(ARRAY(SELECT id FROM mq_msgs))");
    t_exec(conn, "SELECT mq_clear(ARRAY['h'])");
    t_exec(conn, "SELECT mq_clear_all()");
    t_exec(conn, "SELECT mq_reap_dead()");
    pqmq_client_free(c);
}

static void test_hostile_role_gains_nothing(void)
{
    PGresult *r = t_sql(pg, "SELECT current_user, current_database()");
    if (!r || PQntuples(r) != 1) {
        PQclear(r);
        return;
    }
    char me[64], db[64];
    snprintf(me, sizeof me, "%s", PQgetvalue(r, 0, 0));
    snprintf(db, sizeof db, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    snprintf(hostile, sizeof hostile, "pqmq_hostile_%ld", (long)getpid());
    snprintf(qs, sizeof qs, "%s_q", t_schema());
    t_exec(pg, "DROP SCHEMA IF EXISTS %s CASCADE", qs);
    t_exec(pg, "DROP SCHEMA IF EXISTS \"%s\" CASCADE", me);
    t_exec(pg, "CREATE ROLE %s LOGIN NOSUPERUSER", hostile);
    /* It may create schemas, and in public. */
    t_exec(pg, "GRANT CREATE ON DATABASE \"%s\" TO %s", db, hostile);
    t_exec(pg, "GRANT CREATE ON SCHEMA public TO %s", hostile);

    /* The queue installed as the README's psql route does: the caller's
     * default path, the queue's schema current. */
    t_exec(pg, "CREATE SCHEMA %s", qs);
    PGconn *inst = connect_as(me, "\"$user\", public");
    if (!inst)
        return;
    t_exec(inst, "SET search_path = \"$user\", %s", qs);
    CHECK(apply_files(inst));
    PQfinish(inst);
    t_exec(pg, "GRANT USAGE ON SCHEMA %s TO %s", qs, hostile);

    PGconn *h = connect_as(hostile, "public");
    if (!h)
        return;
    t_exec(h, "CREATE SCHEMA \"%s\"", me); /* named after the privileged caller */
    char quoted[80];
    snprintf(quoted, sizeof quoted, "\"%s\"", me);
    plant(h, quoted);
    plant(h, "public");
    PQfinish(h);

    /* The privileged caller: the queue first on its path, then its default
     * path, where the traps are. */
    char *path = NULL;
    if (asprintf(&path, "%s, \"$user\", public", qs) < 0)
        abort();
    PGconn *priv = connect_as(me, path);
    free(path);
    if (priv) {
        life_cycle(priv);
        PQfinish(priv);
    }
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM public.trap_log WHERE who <> '%s'", hostile),
              0);
    CHECK_INT(
        t_sql_int(pg, "SELECT count(*) FROM \"%s\".trap_log WHERE who <> '%s'", me, hostile),
        0);
    CHECK_INT(t_sql_int(pg, "SELECT rolsuper::int FROM pg_roles WHERE rolname = '%s'", hostile),
              0);
    /* The traps work: called directly, they log. */
    t_exec(pg, "SET search_path = public");
    t_exec(pg, "SELECT public.cardinality(ARRAY[gen_random_uuid()])");
    CHECK(t_sql_int(pg, "SELECT count(*) FROM public.trap_log") > 0);
    t_exec(pg, "SET search_path = %s", t_schema());

    t_exec(pg, "DROP SCHEMA \"%s\" CASCADE", me);
    t_exec(pg, "DROP SCHEMA %s CASCADE", qs);
    t_exec(pg, "DROP OWNED BY %s CASCADE", hostile);
    t_exec(pg, "REVOKE CREATE ON DATABASE \"%s\" FROM %s", db, hostile);
    t_exec(pg, "DROP ROLE %s", hostile);
    (void)q;
}

int main(void)
{
    t_init("hardening");
    q = t_client();
    pg = t_pg();
    T_RUN(test_month_interval_lease);
    T_RUN(test_calendar_fields_fixed_in_every_interval);
    T_RUN(test_schema_others_can_create_in_is_refused);
    T_RUN(test_helpers_not_for_public);
    T_RUN(test_bad_shapes_refused);
    T_RUN(test_long_error_text_recorded);
    T_RUN(test_hostile_role_gains_nothing);
    PQfinish(pg);
    pqmq_client_free(q);
    return t_done();
}
