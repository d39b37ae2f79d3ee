/*
 * test_workers.c: the runners' registry (mq_workers, schema/workers.sql;
 * lib/registry.c): a runner appears when it starts, heartbeats, and
 * disappears when it stops; a killed runner goes stale, then is pruned;
 * the functions a runner calls need only the consume duty; `pqmq workers`
 * lists them (text and --json) and `pqmq metrics` counts them.
 */
#include <signal.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

static int done_handler(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)ctx;
    (void)job;
    (void)arg;
    return 0;
}

static long long rows_of(long pid)
{
    return t_sql_int(pg, "SELECT count(*) FROM mq_workers() WHERE pid = %ld", pid);
}

/* A runner registers with what it is, heartbeats with its figures every
 * few seconds, and deletes its entry when it stops. */
static void test_runner_appears_beats_and_leaves(void)
{
    t_truncate();
    t_exec(pg, "DELETE FROM mq_workers");
    pqmq_runner *r = t_runner();
    const char *chans[] = {"wk1", "wk2"};
    CHECK_INT(pqmq_runner_set_channels(r, chans, 2), 0);
    CHECK_INT(pqmq_runner_set_concurrency(r, 3), 0);
    CHECK_INT(pqmq_runner_handle(r, NULL, done_handler, NULL), 0);
    t_bg b;
    t_runner_start(&b, r);
    long me = (long)getpid();
    WAIT_UNTIL(rows_of(me) == 1, 5000);
    CHECK_INT(rows_of(me), 1);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    PGresult *x = t_sql(pg,
                        "SELECT host, version, array_to_string(channels, ','), threads,"
                        " live, jobs_done FROM mq_workers() WHERE pid = %ld",
                        me);
    if (x && PQntuples(x) == 1) {
        CHECK_STR(PQgetvalue(x, 0, 0), host);
        CHECK_STR(PQgetvalue(x, 0, 1), PACKAGE_VERSION);
        CHECK_STR(PQgetvalue(x, 0, 2), "wk1,wk2");
        CHECK_STR(PQgetvalue(x, 0, 3), "3");
        CHECK_STR(PQgetvalue(x, 0, 4), "t");
        CHECK_STR(PQgetvalue(x, 0, 5), "0");
    }
    PQclear(x);
    /* While it runs, pqmq metrics counts it live. */
    int st = -1;
    char *text = t_run_pqmq("metrics", &st);
    CHECK_INT(st, 0);
    CHECK(text && strstr(text, "\npqmq_workers{state=\"live\"} 1\n"));
    CHECK(text && strstr(text, "# TYPE pqmq_workers gauge\n"));
    free(text);
    /* Jobs done reach the registry with the next heartbeat (5 s). */
    for (int i = 0; i < 3; i++) {
        pqmq_msg *m = t_msg("wk1", NULL, "job", "{}", 0);
        CHECK_OK(q, pqmq_insert(q, &m, 1));
        pqmq_msg_free(m);
    }
    WAIT_UNTIL(t_stats(r).processed == 3, 5000);
    WAIT_UNTIL(t_sql_int(pg, "SELECT jobs_done FROM mq_workers() WHERE pid = %ld", me) == 3,
               8000);
    CHECK_INT(t_sql_int(pg, "SELECT jobs_done FROM mq_workers() WHERE pid = %ld", me), 3);
    CHECK_INT(t_sql_int(pg,
                        "SELECT (last_seen > started_at)::int FROM mq_workers()"
                        " WHERE pid = %ld",
                        me),
              1);
    t_runner_stop(&b);
    CHECK_INT(rows_of(me), 0);
    pqmq_runner_free(r);
}

/* A runner killed without stopping leaves its entry, which goes stale
 * (gone) once its heartbeat is older than stale_after, and is deleted an
 * hour after its last heartbeat. */
static void test_killed_runner_goes_stale(void)
{
    t_exec(pg, "DELETE FROM mq_workers");
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        pqmq_runner *r = t_runner();
        const char *chans[] = {"killed"};
        if (pqmq_runner_set_channels(r, chans, 1) ||
            pqmq_runner_handle(r, NULL, done_handler, NULL))
            _exit(3);
        pqmq_runner_run(r);
        _exit(0);
    }
    CHECK(child > 0);
    WAIT_UNTIL(rows_of((long)child) == 1, 5000);
    CHECK_INT(rows_of((long)child), 1);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    CHECK_INT(t_sql_int(pg, "SELECT live::int FROM mq_workers() WHERE pid = %ld", (long)child),
              1);
    t_sleep_ms(1500);
    CHECK_INT(t_sql_int(pg,
                        "SELECT live::int FROM mq_workers(interval '1 second')"
                        " WHERE pid = %ld",
                        (long)child),
              0);

    int st = -1;
    char *text = t_run_pqmq("workers --stale 1", &st);
    CHECK_INT(st, 0);
    char want[64];
    snprintf(want, sizeof want, " %ld gone ", (long)child);
    CHECK(text && strstr(text, "HOST") && strstr(text, "STATE") && strstr(text, want));
    CHECK(text && strstr(text, " killed\n"));
    free(text);
    text = t_run_pqmq("workers --stale 1 --json", &st);
    CHECK_INT(st, 0);
    snprintf(want, sizeof want, "\"pid\": %ld,", (long)child);
    CHECK(text && strstr(text, want) && strstr(text, "\"state\": \"gone\"") &&
          strstr(text, "\"channels\": [\"killed\"]"));
    free(text);
    text = t_run_pqmq("workers --stale 0", &st);
    CHECK_INT(st, 2);
    free(text);

    /* An hour without a heartbeat: deleted. */
    t_exec(pg, "UPDATE mq_workers SET last_seen = now() - interval '61 minutes'");
    CHECK_INT(rows_of((long)child), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_workers"), 0);
    text = t_run_pqmq("workers --json", &st);
    CHECK_INT(st, 0);
    CHECK(text && !strcmp(text, "[]\n"));
    free(text);
}

/* The heartbeat is a HOT update (no index entry written). */
static void test_heartbeat_is_hot(void)
{
    t_exec(pg, "DELETE FROM mq_workers");
    long long id = t_sql_int(pg, "SELECT mq_worker_register('h', 1, 'v', NULL, 1)");
    t_exec(pg, "SELECT pg_stat_force_next_flush()");
    long long hot0 = t_sql_int(pg, "SELECT n_tup_hot_upd FROM pg_stat_xact_user_tables"
                                   " WHERE relid = 'mq_workers'::regclass");
    t_exec(pg, "BEGIN");
    for (int i = 0; i < 5; i++)
        CHECK_INT(t_sql_int(pg, "SELECT mq_worker_beat(%lld, %d, 0, 1)::int", id, i), 1);
    CHECK_INT(t_sql_int(pg, "SELECT n_tup_hot_upd FROM pg_stat_xact_user_tables"
                            " WHERE relid = 'mq_workers'::regclass") -
                  hot0,
              5);
    t_exec(pg, "COMMIT");
    CHECK_INT(t_sql_int(pg, "SELECT mq_worker_leave(%lld)::int", id), 1);
    CHECK_INT(t_sql_int(pg, "SELECT mq_worker_beat(%lld, 1, 0, 0)::int", id), 0);
}

/* Registering, beating and leaving need only the consume duty; listing is
 * administer's. */
static void test_consume_duty_registers(void)
{
    if (t_citus_skip("roles are per node"))
        return;
    char role[64];
    snprintf(role, sizeof role, "t_workers_%ld_consumer", (long)getpid());
    t_exec(pg, "DROP ROLE IF EXISTS %s", role);
    t_exec(pg, "CREATE ROLE %s NOLOGIN", role);
    t_exec(pg, "SELECT mq_grant('consume', '%s')", role);
    t_exec(pg, "BEGIN");
    t_exec(pg, "SET LOCAL ROLE %s", role);
    long long id = t_sql_int(pg, "SELECT mq_worker_register('h', 2, 'v', '{a}', 1)");
    CHECK(id > 0);
    CHECK_INT(t_sql_int(pg, "SELECT mq_worker_beat(%lld, 1, 0, 0)::int", id), 1);
    CHECK_INT(t_sql_int(pg, "SELECT mq_worker_leave(%lld)::int", id), 1);
    PGresult *r = PQexec(pg, "SELECT count(*) FROM mq_workers()");
    CHECK(PQresultStatus(r) == PGRES_FATAL_ERROR);
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "42501");
    PQclear(r);
    t_exec(pg, "ROLLBACK");
    t_exec(pg, "SELECT mq_revoke('consume', '%s')", role);
    t_exec(pg, "REVOKE USAGE ON SCHEMA %s FROM %s", t_schema(), role);
    t_exec(pg, "DROP ROLE %s", role);
}

int main(void)
{
    t_init("workers");
    q = t_client();
    pg = t_pg();
    T_RUN(test_runner_appears_beats_and_leaves);
    T_RUN(test_killed_runner_goes_stale);
    T_RUN(test_heartbeat_is_hot);
    T_RUN(test_consume_duty_registers);
    PQfinish(pg);
    pqmq_client_free(q);
    return t_done();
}
