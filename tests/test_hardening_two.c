/*
 * test_hardening_two.c: the second round of hostile and careless callers
 * (issue 31): schedules owned by the role that first
 * evaluated them, the schedules' key namespace, checked bit sets, bounded
 * backfill and slot spans; an install refused in a schema whose owner is not
 * trusted; producers with unique keys racing consumers without deadlock; and
 * the shapes of a batch (2-D arrays, duplicate ids, bad JSON, negative
 * retention, a replaced chain member, too many channel names), each named.
 *
 * Roles are NOLOGIN and used with SET ROLE (as in test_roles), named after
 * this process and dropped at the end.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* asprintf */
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

static PGconn *su; /* the harness's (superuser) connection: the queue's owner */
static char prod[64], prod2[64], cons[64], adm[64];

/* Runs sql; returns its SQLSTATE ("" on success) and, in msg (may be NULL),
 * its error message. Static buffers. */
static const char *run(PGconn *c, const char *sql, const char **msg)
{
    static char st[8], text[1024];
    PGresult *r = PQexec(c, sql);
    ExecStatusType es = PQresultStatus(r);
    const char *s = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    snprintf(st, sizeof st, "%s",
             es == PGRES_TUPLES_OK || es == PGRES_COMMAND_OK ? ""
             : s                                             ? s
                                                             : "?");
    snprintf(text, sizeof text, "%s", PQresultErrorMessage(r));
    PQclear(r);
    if (msg)
        *msg = text;
    return st;
}

/* sql must fail with state and a message containing needle. */
#define REFUSED(c, sql, state, needle) refused(__LINE__, (c), (sql), (state), (needle))
static void refused(int line, PGconn *c, const char *sql, const char *state, const char *needle)
{
    const char *msg = NULL;
    const char *st = run(c, sql, &msg);
    if (strcmp(st, state) != 0)
        t_fail(__FILE__, line, "%s: SQLSTATE \"%s\", expected %s; %s", sql, st, state, msg);
    else if (needle && !strstr(msg, needle))
        t_fail(__FILE__, line, "%s: message \"%s\" lacks \"%s\"", sql, msg, needle);
}

static PGconn *as_role(const char *role)
{
    PGconn *c = t_pg();
    t_exec(c, "SET ROLE %s", role);
    return c;
}

/* mq_schedule every minute (UTC) of name sched on channel 'sched'. */
static char *schedule_sql(const char *sched, const char *bits)
{
    char *sql = NULL;
    if (asprintf(&sql,
                 "SELECT mq_schedule('%s', %s, 'UTC', 'all', 'sched', 'tick', "
                 "'{\"a\": 1}', NULL, 3, interval '1 second')",
                 sched,
                 bits ? bits
                      : "1152921504606846975, 16777215, 4294967294, 8190, 127, "
                        "true, true") < 0)
        abort();
    return sql;
}

static long long tick_as(PGconn *c, const char *sched)
{
    char *sql = schedule_sql(sched, NULL);
    long long n = t_sql_int(c, "%s", sql);
    free(sql);
    return n;
}

static void back(const char *sched, const char *by)
{
    t_exec(su,
           "UPDATE mq_schedules SET last_slot = _mq_at(last_slot, - interval '%s') "
           "WHERE name = '%s'",
           by, sched);
}

/* ---- duties ------------------------------------------------------------- */

/* Consumers neither evaluate schedules nor list slots; producers do both,
 * administrators list slots. */
static void test_schedule_duties(void)
{
    const char *fns[] = {"mq_schedule(text, bigint, int, bigint, int, int, boolean, boolean, "
                         "text, text, text, text, text, bytea, int, interval)",
                         "mq_cron_slots(bigint, int, bigint, int, int, boolean, boolean, text, "
                         "timestamptz, timestamptz)"};
    const char *roles[] = {prod, cons, adm};
    const int want[2][3] = {{1, 0, 0}, {1, 0, 1}};
    for (int f = 0; f < 2; f++)
        for (int r = 0; r < 3; r++)
            if (t_sql_int(su, "SELECT has_function_privilege('%s', '%s', 'EXECUTE')::int",
                          roles[r], fns[f]) != want[f][r])
                t_fail(__FILE__, __LINE__, "%s may%s execute %s", roles[r],
                       want[f][r] ? " not" : "", fns[f]);
    t_exec(su, "DELETE FROM mq_schedules");
    t_truncate();
    PGconn *c = as_role(cons);
    char *sql = schedule_sql("theirs", NULL);
    REFUSED(c, sql, "42501", "permission denied");
    free(sql);
    PQfinish(c);
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM mq_schedules"), 0);
}

/* ---- a schedule is its owner's --------------------------------------------- */

static void test_schedule_belongs_to_its_first_caller(void)
{
    t_exec(su, "DELETE FROM mq_schedules");
    t_truncate();
    PGconn *a = as_role(prod), *b = as_role(prod2);
    CHECK_INT(tick_as(a, "nightly"), 0);
    back("nightly", "10 minutes");
    /* Another producer can neither evaluate it (inserting its messages)
     * nor make its slots pass (evaluating it with empty or other bits). */
    char *sql = schedule_sql("nightly", NULL);
    REFUSED(b, sql, "42501", "belongs to role");
    free(sql);
    sql = schedule_sql("nightly", "1, 1, 2, 2, 1, false, false");
    REFUSED(b, sql, "42501", prod);
    free(sql);
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM mq_msgs"), 0);
    /* Its owner gets every slot. */
    CHECK_INT(tick_as(a, "nightly"), 10);
    /* The queue's owner may evaluate any schedule. */
    back("nightly", "13 minutes"); /* 3 slots not taken yet (4 if a minute turned) */
    long long n = tick_as(su, "nightly");
    CHECK(n >= 3 && n <= 4);
    CHECK_INT(t_sql_int(su,
                        "SELECT count(*) FROM mq_schedules s JOIN pg_roles r "
                        "ON r.oid = s.owner WHERE r.rolname = '%s'",
                        prod),
              1);
    PQfinish(a);
    PQfinish(b);
}

/* A producer cannot take a slot's key before the schedule does. */
static void test_schedule_keys_are_reserved(void)
{
    t_truncate();
    PGconn *p = as_role(prod);
    REFUSED(
        p,
        "SELECT * FROM mq_insert_unique(ARRAY[ROW(gen_random_uuid(), NULL, 1, NULL, 'sched', "
        "'', NULL, false, 'n', '{}', NULL)::mq_new_t, ROW(gen_random_uuid(), NULL, 1, NULL, "
        "'sched', '', NULL, false, 'n', '{}', NULL)::mq_new_t], "
        "ARRAY['mine', 'schedule:nightly:2030-01-01T00:00'])",
        "22023", "message 2 of the batch: unique key 'schedule:nightly");
    PQfinish(p);
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM mq_keys"), 0);
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM mq_msgs"), 0);
}

/* Empty or NULL bit sets are refused naming the field, and the schedule's
 * due slots stay due. */
static void test_bit_sets_are_checked(void)
{
    t_exec(su, "DELETE FROM mq_schedules");
    t_truncate();
    CHECK_INT(tick_as(su, "bits"), 0);
    back("bits", "10 minutes");
    const char *bad[][2] = {
        {"0, 16777215, 4294967294, 8190, 127, true, true", "minutes"},
        {"NULL, 16777215, 4294967294, 8190, 127, true, true", "minutes"},
        {"1152921504606846976, 16777215, 4294967294, 8190, 127, true, true", "minutes"},
        {"1, NULL, 4294967294, 8190, 127, true, true", "hours"},
        {"1, 16777216, 4294967294, 8190, 127, true, true", "hours"},
        {"1, 1, 1, 8190, 127, true, true", "doms"},
        {"1, 1, 2, 1, 127, true, true", "months"},
        {"1, 1, 2, 2, NULL, true, true", "dows"},
        {"1, 1, 2, 2, 1, NULL, true", "dom_any"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *sql = schedule_sql("bits", bad[i][0]);
        REFUSED(su, sql, "22023", bad[i][1]);
        free(sql);
    }
    REFUSED(su,
            "SELECT * FROM mq_cron_slots(NULL, 1, 2, 2, 1, true, true, 'UTC', now(), "
            "now() + interval '1 hour')",
            "22023", "minutes");
    CHECK_INT(tick_as(su, "bits"), 10);
}

/* A name whose slot keys would not fit a key (1024 bytes) is refused at
 * once, not at each evaluation after the first. */
static void test_schedule_name_fits_its_keys(void)
{
    t_exec(su, "DELETE FROM mq_schedules");
    t_truncate();
    char name[1000];
    memset(name, 'n', 999);
    name[999] = 0;
    char *sql = schedule_sql(name, NULL);
    REFUSED(su, sql, "22023", "1 to 998 bytes");
    free(sql);
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM mq_schedules"), 0);
    /* The C API says so before it connects. */
    char ci[1024];
    snprintf(ci, sizeof ci, "%s options='-c search_path=%s'", t_dsn(), t_schema());
    pqmq_runner *r = pqmq_runner_new(ci);
    pqmq_msg *m = t_msg("sched", NULL, "tick", "{}", 0);
    CHECK_INT(pqmq_runner_schedule(r, name, "* * * * *", NULL, m, PQMQ_BACKFILL_ALL),
              PQMQ_EINVAL);
    CHECK(strstr(pqmq_runner_errmsg(r), "over 998 bytes") != NULL);
    name[998] = 0;
    CHECK_INT(pqmq_runner_schedule(r, name, "* * * * *", NULL, m, PQMQ_BACKFILL_ALL), 0);
    pqmq_msg_free(m);
    pqmq_runner_free(r);
    CHECK_INT(tick_as(su, name), 0);
    back(name, "2 minutes");
    CHECK_INT(tick_as(su, name), 2);
}

/* mq_cron_slots spans at most 31 days, as pqmq_cron_slots does. */
static void test_cron_slots_span_is_bounded(void)
{
    t_exec(su, "SET statement_timeout = '5s'");
    REFUSED(su,
            "SELECT count(*) FROM mq_cron_slots(1152921504606846975, 16777215, 4294967294, "
            "8190, 127, true, true, 'UTC', now(), now() + interval '20 years')",
            "22023", "31 days");
    /* Spans no interval holds, and infinite ends: the same answer, not a
     * raw 22008. */
    REFUSED(su,
            "SELECT count(*) FROM mq_cron_slots(1, 1, 4294967294, 8190, 127, true, true, "
            "'UTC', '4713-01-01 BC', '294276-12-31')",
            "22023", "31 days");
    REFUSED(su,
            "SELECT count(*) FROM mq_cron_slots(1, 1, 4294967294, 8190, 127, true, true, "
            "'UTC', '-infinity', 'infinity')",
            "22023", "31 days");
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM mq_cron_slots(1, 1, 4294967294, 8190, 127, "
                            "true, true, 'UTC', '2026-01-01', '2026-02-01')"),
              31);
    t_exec(su, "RESET statement_timeout");
}

/* Every minute, down for 7 days: 10,080 slots, more than one batch
 * (10,000) takes. The schedule fires again: the oldest slots first, the
 * rest at the next evaluation, each once. */
static void test_long_backfill_goes_in_batches(void)
{
    t_exec(su, "DELETE FROM mq_schedules");
    t_truncate();
    CHECK_INT(tick_as(su, "week"), 0);
    back("week", "7 days");
    long long first = tick_as(su, "week");
    CHECK_INT(first, 10000);
    long long second = tick_as(su, "week");
    CHECK(second >= 80 && second <= 82); /* a minute may turn meanwhile */
    CHECK_INT(tick_as(su, "week"), 0);
    CHECK_INT(t_sql_int(su, "SELECT count(DISTINCT payload_json->>'_slot') FROM mq_msgs"),
              first + second);
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM mq_msgs"), first + second);
}

/* ---- the install path -------------------------------------------------------- */

/* A role with CREATE on the database makes a schema named like the
 * installing superuser: the default search_path ("$user", public) would
 * put the queue there, in a schema that role owns. Both routes refuse,
 * naming the schema and its owner, and create nothing. */
static void test_install_refuses_a_schema_of_an_untrusted_owner(void)
{
    PGresult *r = t_sql(su, "SELECT current_user, current_database()");
    if (!r || PQntuples(r) != 1) {
        PQclear(r);
        return;
    }
    char me[64], db[64], hostile[64];
    snprintf(me, sizeof me, "%s", PQgetvalue(r, 0, 0));
    snprintf(db, sizeof db, "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    snprintf(hostile, sizeof hostile, "t_h2_%ld_hostile", (long)getpid());
    t_exec(su, "DROP SCHEMA IF EXISTS \"%s\" CASCADE", me);
    t_exec(su, "CREATE ROLE %s NOLOGIN", hostile);
    t_exec(su, "GRANT CREATE ON DATABASE \"%s\" TO %s", db, hostile);
    PGconn *h = as_role(hostile);
    t_exec(h, "CREATE SCHEMA \"%s\"", me);
    PQfinish(h);

    /* pqmq_migrate under the default path. */
    PGconn *c = t_pg();
    t_exec(c, "SET search_path = \"$user\", public");
    pqmq_client *w = NULL;
    CHECK_INT(pqmq_wrap(c, &w), 0);
    CHECK(pqmq_migrate(w) != 0);
    const char *msg = pqmq_errmsg(w);
    CHECK(strstr(msg, "queue schema") != NULL);
    CHECK(strstr(msg, hostile) != NULL);
    CHECK(strstr(msg, "neither the installing role") != NULL);
    /* The psql route: the install script (pqmq.sql) refuses, creating nothing. */
    const char *path = getenv("PQMQ_INSTALL_SQL");
    FILE *f = path ? fopen(path, "rb") : NULL;
    CHECK(f != NULL);
    if (f) {
        char *sql = calloc(1, 1 << 20);
        size_t n = sql ? fread(sql, 1, (1 << 20) - 1, f) : 0;
        fclose(f);
        CHECK(n > 0);
        const char *text = NULL;
        CHECK_STR(run(c, sql, &text), "42501");
        CHECK(strstr(text, "HINT") != NULL || strstr(text, "neither") != NULL);
        free(sql);
    }
    CHECK_INT(
        t_sql_int(su,
                  "SELECT count(*) FROM pg_class WHERE relnamespace = '\"%s\"'::regnamespace",
                  me),
        0);
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM pg_class WHERE relnamespace = "
                            "'public'::regnamespace AND relname LIKE 'mq\\_%%'"),
              0);
    /* The schema's owner made trusted (the installer): installs. */
    t_exec(su, "ALTER SCHEMA \"%s\" OWNER TO \"%s\"", me, me);
    CHECK_OK(w, pqmq_migrate(w));
    pqmq_client_free(w);
    PQfinish(c);
    t_exec(su, "DROP SCHEMA \"%s\" CASCADE", me);
    t_exec(su, "REVOKE CREATE ON DATABASE \"%s\" FROM %s", db, hostile);
    t_exec(su, "DROP ROLE %s", hostile);
}

/* ---- producers with unique keys racing consumers ------------------------- */

static atomic_int stop_race, deadlocks, other_errors, done_work;

static void count_error(PGresult *r)
{
    const char *st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    if (st && !strcmp(st, "40P01")) {
        if (atomic_fetch_add(&deadlocks, 1) < 2)
            fprintf(stderr, "    race: %s", PQresultErrorMessage(r));
    } else {
        if (atomic_fetch_add(&other_errors, 1) < 3)
            fprintf(stderr, "    race: %s", PQresultErrorMessage(r));
    }
}

/* Batches of 6 keyed messages, keys from a pool of 24 in random order, some
 * ordered (two chains), with and without retention, keep or replace. */
static void *producer(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 7919u + 1;
    PGconn *c = t_pg();
    while (!atomic_load(&stop_race)) {
        char sql[4096];
        int n = snprintf(sql, sizeof sql, "SELECT count(*) FROM mq_insert_unique(ARRAY[");
        for (int i = 0; i < 6; i++)
            n +=
                snprintf(sql + n, sizeof sql - (size_t)n,
                         "%sROW(gen_random_uuid(), NULL, 3, interval '1 minute', 'race', '%s', "
                         "NULL, %s, 'n', '{}', NULL)::mq_new_t",
                         i ? ", " : "", rand_r(&seed) % 2 ? "a" : "b",
                         rand_r(&seed) % 3 == 0 ? "true" : "false");
        n += snprintf(sql + n, sizeof sql - (size_t)n, "], ARRAY[");
        for (int i = 0; i < 6; i++)
            n += snprintf(sql + n, sizeof sql - (size_t)n, "%s'k%02u'", i ? ", " : "",
                          rand_r(&seed) % 24);
        snprintf(sql + n, sizeof sql - (size_t)n, "], '%s', %s)",
                 rand_r(&seed) % 2 ? "keep" : "replace",
                 rand_r(&seed) % 2 ? "interval '50 milliseconds'" : "NULL");
        PGresult *r = PQexec(c, sql);
        if (PQresultStatus(r) != PGRES_TUPLES_OK)
            count_error(r);
        PQclear(r);
    }
    PQfinish(c);
    return NULL;
}

static void *consumer(void *arg)
{
    (void)arg;
    PGconn *c = t_pg();
    /* Claims, then completes what it claimed (in random order) in a
     * transaction of its own, as a consumer does. */
    t_exec(c, "CREATE TEMP TABLE held (id uuid)");
    while (!atomic_load(&stop_race)) {
        PGresult *r = PQexec(c, "INSERT INTO held SELECT id FROM mq_claim(NULL, 12) "
                                "WHERE id IS NOT NULL");
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            count_error(r);
        PQclear(r);
        r = PQexec(c, "SELECT mq_complete(ARRAY(SELECT id FROM held ORDER BY random()), NULL)");
        if (PQresultStatus(r) != PGRES_TUPLES_OK)
            count_error(r);
        else
            atomic_fetch_add(&done_work, atoi(PQgetvalue(r, 0, 0)));
        PQclear(r);
        PQclear(PQexec(c, "DELETE FROM held"));
    }
    PQfinish(c);
    return NULL;
}

/* Six producers and two consumers for 12 seconds: no deadlock (40P01). */
static void test_keyed_producers_and_consumers_never_deadlock(void)
{
    t_truncate();
    atomic_store(&stop_race, 0);
    atomic_store(&deadlocks, 0);
    atomic_store(&other_errors, 0);
    atomic_store(&done_work, 0);
    pthread_t th[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&th[i], NULL, i < 6 ? producer : consumer, (void *)(uintptr_t)i);
    t_sleep_ms(12000);
    atomic_store(&stop_race, 1);
    for (int i = 0; i < 8; i++)
        pthread_join(th[i], NULL);
    printf("    %d completed, %d deadlocks, %d other errors\n", atomic_load(&done_work),
           atomic_load(&deadlocks), atomic_load(&other_errors));
    CHECK_INT(atomic_load(&deadlocks), 0);
    CHECK_INT(atomic_load(&other_errors), 0);
    CHECK(atomic_load(&done_work) > 50);
    /* Still one live message per key. */
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM (SELECT unique_key FROM mq_msgs "
                            "WHERE dead_since IS NULL AND unique_key IS NOT NULL "
                            "GROUP BY channel_name, unique_key HAVING count(*) > 1) d"),
              0);
}

/* ---- the shapes of a batch ---------------------------------------------------- */

#define MSG(id, args, ordered, json)                                                           \
    "ROW(" id ", NULL, 1, NULL, 'shape', '" args "', NULL, " ordered ", 'n', " json            \
    ", NULL)::mq_new_t"

static void test_batch_shapes_are_named(void)
{
    t_truncate();
    /* 2-D keys: were read as "no keys". */
    REFUSED(su,
            "SELECT * FROM mq_insert_unique(ARRAY[" MSG(
                "gen_random_uuid()", "", "false",
                "'{}'") ", " MSG("gen_random_uuid()", "", "false",
                                 "'{}'") "], ARRAY[['a'], ['b']])",
            "22023", "unique_keys is a 2-dimensional array");
    /* 2-D priorities: were stored as 0. */
    REFUSED(su,
            "SELECT mq_insert(ARRAY[" MSG("gen_random_uuid()", "", "false", "'{}'") ", " MSG(
                "gen_random_uuid()", "", "false", "'{}'") "], ARRAY[[5], [6]])",
            "22023", "priorities is a 2-dimensional array");
    REFUSED(su,
            "SELECT * FROM mq_insert_unique(ARRAY[" MSG(
                "gen_random_uuid()", "", "false",
                "'{}'") ", " MSG("gen_random_uuid()", "", "false",
                                 "'{}'") "], ARRAY['a', 'b'], "
                                         "priorities => ARRAY[[5], [6]])",
            "22023", "priorities is a 2-dimensional array");
    /* A retention with a negative part. */
    REFUSED(su,
            "SELECT * FROM mq_insert_unique(ARRAY[" MSG(
                "gen_random_uuid()", "", "false",
                "'{}'") "], ARRAY['a'], 'keep', interval '-1 month +31 days')",
            "22023", "retention");
    /* Bad JSON in message 2 of a keyed batch. */
    REFUSED(su,
            "SELECT * FROM mq_insert_unique(ARRAY[" MSG(
                "gen_random_uuid()", "", "false",
                "'{}'") ", " MSG("gen_random_uuid()", "", "false",
                                 "'{oops'") ", " MSG("gen_random_uuid()", "", "false",
                                                     "'[]'") "], ARRAY['a', 'b', 'c'])",
            "22P02", "message 2 of the batch: payload_json is not JSON");
    /* The same id twice in one batch. */
    REFUSED(
        su,
        "SELECT mq_insert(ARRAY[" MSG(
            "'00000000-0000-4000-8000-000000000001'", "", "false",
            "'{}'") ", " MSG("gen_random_uuid()", "", "false",
                             "'{}'") ", " MSG("'00000000-0000-4000-8000-000000000001'", "",
                                              "false", "'{}'") "])",
        "23505",
        "message 3 of the batch: id 00000000-0000-4000-8000-000000000001 is message 1's too");
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM mq_msgs"), 0);
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM mq_keys"), 0);
}

/* Replacing the key of a chain member would run the new payload ahead of
 * messages inserted before it: kept instead. An ordered message alone in its chain
 * may be replaced (it is where the new message would go). */
static void test_replace_keeps_a_chain_in_order(void)
{
    t_truncate();
    t_exec(su,
           "SELECT * FROM mq_insert_unique(ARRAY["
           "ROW('00000000-0000-4000-8000-0000000000a1', NULL, 1, NULL, 'ch', 'x', NULL, true, "
           "'first', '{\"v\": 1}', NULL)::mq_new_t, "
           "ROW('00000000-0000-4000-8000-0000000000a2', NULL, 1, NULL, 'ch', 'x', NULL, true, "
           "'second', '{\"v\": 2}', NULL)::mq_new_t, "
           "ROW('00000000-0000-4000-8000-0000000000a3', NULL, 1, NULL, 'ch', 'x', NULL, true, "
           "'third', '{\"v\": 3}', NULL)::mq_new_t, "
           "ROW('00000000-0000-4000-8000-0000000000a4', NULL, 1, NULL, 'ch', 'y', NULL, true, "
           "'alone', '{\"v\": 4}', NULL)::mq_new_t], ARRAY['k1', 'k2', 'k3', 'k4'])");
    const char *keys[] = {"k1", "k2", "k3", "k4"};
    const char *want[] = {"kept", "kept", "kept", "replaced"};
    for (int i = 0; i < 4; i++) {
        PGresult *r = t_sql(su,
                            "SELECT outcome FROM mq_insert_unique(ARRAY["
                            "ROW(gen_random_uuid(), NULL, 1, NULL, 'ch', 'x', NULL, true, "
                            "'late', '{\"v\": %d}', NULL)::mq_new_t], ARRAY['%s'], 'replace')",
                            10 + i, keys[i]);
        if (!r || PQntuples(r) != 1 || strcmp(PQgetvalue(r, 0, 0), want[i]))
            t_fail(__FILE__, __LINE__, "replacing %s: %s, expected %s", keys[i],
                   r && PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "?", want[i]);
        PQclear(r);
    }
    /* The chain is delivered in order, unchanged; the lone one replaced. */
    int order[] = {1, 2, 3};
    for (int i = 0; i < 3; i++) {
        CHECK_INT(t_sql_int(su,
                            "SELECT (payload_json::jsonb->>'v')::int FROM mq_claim('{ch}', 5) "
                            "WHERE id IS NOT NULL AND channel_args = 'x'"),
                  order[i]);
        t_exec(su, "SELECT mq_complete(ARRAY(SELECT id FROM mq_msgs WHERE deliveries > 0 "
                   "AND channel_args = 'x'))");
    }
    CHECK_INT(t_sql_int(su, "SELECT (payload_json->>'v')::int FROM mq_msgs "
                            "WHERE id = '00000000-0000-4000-8000-0000000000a4'"),
              13);
}

/* A poll names at most 1000 channels: each is visited, and probed for its
 * wait time when nothing is ready. */
static void test_poll_names_at_most_1000_channels(void)
{
    t_truncate();
    REFUSED(su,
            "SELECT * FROM mq_claim(ARRAY(SELECT 'c' || g FROM generate_series(1, 1001) g), 5)",
            "54000", "1001 channel names are over the limit of 1000");
    t_exec(su,
           "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), NULL, 1, NULL, 'c1000', '', NULL, "
           "false, 'n', '{}', NULL)::mq_new_t])");
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM mq_claim(ARRAY(SELECT 'c' || g FROM "
                            "generate_series(1, 1000) g), 5) j WHERE (j).id IS NOT NULL"),
              1);
}

static void drop_roles(void)
{
    const char *all[] = {prod, prod2, cons, adm};
    for (size_t i = 0; i < 4; i++)
        t_exec(su,
               "DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '%s') THEN "
               "DROP OWNED BY %s CASCADE; DROP ROLE %s; END IF; END $$",
               all[i], all[i], all[i]);
}

int main(void)
{
    t_init("hardening_two");
    su = t_pg();
    long pid = (long)getpid();
    snprintf(prod, sizeof prod, "t_h2_%ld_producer", pid);
    snprintf(prod2, sizeof prod2, "t_h2_%ld_producer2", pid);
    snprintf(cons, sizeof cons, "t_h2_%ld_consumer", pid);
    snprintf(adm, sizeof adm, "t_h2_%ld_admin", pid);
    drop_roles();
    const char *duty[] = {"produce", "produce", "consume", "administer"};
    const char *role[] = {prod, prod2, cons, adm};
    for (int i = 0; i < 4; i++) {
        t_exec(su, "CREATE ROLE %s NOLOGIN", role[i]);
        PQclear(t_sql(su, "SELECT mq_grant('%s', '%s')", duty[i], role[i]));
    }
    T_RUN(test_schedule_duties);
    T_RUN(test_schedule_belongs_to_its_first_caller);
    T_RUN(test_schedule_keys_are_reserved);
    T_RUN(test_bit_sets_are_checked);
    T_RUN(test_schedule_name_fits_its_keys);
    T_RUN(test_cron_slots_span_is_bounded);
    T_RUN(test_long_backfill_goes_in_batches);
    T_RUN(test_install_refuses_a_schema_of_an_untrusted_owner);
    T_RUN(test_keyed_producers_and_consumers_never_deadlock);
    T_RUN(test_batch_shapes_are_named);
    T_RUN(test_replace_keeps_a_chain_in_order);
    T_RUN(test_poll_names_at_most_1000_channels);
    drop_roles();
    PQfinish(su);
    return t_done();
}
