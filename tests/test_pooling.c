/*
 * test_pooling.c: what a pooler in transaction mode (PgBouncer) needs from
 * the library. A client's session keeps nothing between transactions (no
 * prepared statements, no LISTEN, no session settings, no advisory locks),
 * and a runner can LISTEN on a connection of its own
 * (pqmq_runner_set_listen_dsn) while everything else goes through the
 * pooler. tests/test_pgbouncer.sh runs the other tests through a real one.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

/* Everything a session could keep, as one line (empty: nothing). */
static char *session_state(PGconn *conn)
{
    PGresult *r = t_sql(
        conn,
        "SELECT concat_ws(' ', "
        " (SELECT 'prepared:' || string_agg(name, ',') FROM pg_prepared_statements), "
        " (SELECT 'listening:' || string_agg(c, ',') FROM pg_listening_channels() c), "
        " (SELECT 'locks:' || count(*) FROM pg_locks "
        "  WHERE locktype = 'advisory' AND pid = pg_backend_pid() HAVING count(*) > 0), "
        " (SELECT 'set:' || string_agg(name, ',') FROM pg_settings WHERE source = 'session'))");
    char *s = strdup(r && PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "(query failed)");
    PQclear(r);
    return s;
}

static void test_client_leaves_no_session_state(void)
{
    if (t_pooled()) {
        printf("    skipped behind a pooler (the session is not the client's)\n");
        return;
    }
    t_truncate();
    pqmq_client *c = t_client();
    CHECK_OK(c, pqmq_migrate(c));
    pqmq_msg *m[] = {t_msg("st", "a", "n", "{}", 1), t_msg("st", "a", "n", "{}", 1),
                     t_msg("st", NULL, "n", "{}", 0)};
    pqmq_msg_set_retries(m[2], 0);
    pqmq_msg_set_commit_interval(m[1], 60000);
    uuid_t pending;
    pqmq_msg_id(m[1], pending);
    CHECK_OK(c, pqmq_insert(c, m, 3));
    t_msgs_free(m, 3);
    CHECK_OK(c, pqmq_commit(c, (const uuid_t *)&pending, 1));
    pqmq_batch *b = NULL, *next = NULL;
    CHECK_OK(c, pqmq_poll(c, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 2);
    for (size_t i = 0; i < pqmq_batch_count(b); i++) {
        uuid_t id;
        pqmq_job_id(pqmq_batch_job(b, i), id);
        CHECK_OK(c, pqmq_keep_alive(c, (const uuid_t *)&id, 1, 60000, NULL));
        CHECK_OK(c, pqmq_checkpoint(c, id, 60000, "{\"p\": 1}", NULL, 0, 0));
        if (!strcmp(pqmq_job_args(pqmq_batch_job(b, i)), ""))
            CHECK_OK(c, pqmq_fail(c, id, "dies"));
    }
    int rc = pqmq_complete_and_poll(c, b, NULL, 0, 10, &next);
    CHECK(rc == PQMQ_OK || rc == PQMQ_ESTALE);
    pqmq_batch *dead = NULL;
    CHECK_OK(c, pqmq_dead_letters(c, NULL, 0, 10, &dead));
    pqmq_batch_free(dead);
    pqmq_batch_free(b);
    pqmq_batch_free(next);
    char *state = session_state(pqmq_conn(c));
    CHECK_STR(state, "");
    free(state);
    /* The check sees such state when there is some. */
    t_exec(pqmq_conn(c), "LISTEN st_probe");
    t_exec(pqmq_conn(c), "SET work_mem = '5MB'");
    state = session_state(pqmq_conn(c));
    CHECK_STR(state, "listening:st_probe set:work_mem");
    free(state);
    pqmq_client_free(c);
}

/* ---- the runner's own LISTEN connection --------------------------------- */

static atomic_int handled;

static int h_count(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)ctx, (void)job, (void)arg;
    atomic_fetch_add(&handled, 1);
    return 0;
}

static void put(const char *ch)
{
    pqmq_client *c = t_client();
    pqmq_msg *m[] = {t_msg(ch, NULL, "n", "{}", 0)};
    CHECK_OK(c, pqmq_insert(c, m, 1));
    t_msgs_free(m, 1);
    pqmq_client_free(c);
}

static void test_runner_listens_on_its_own_connection(void)
{
    t_truncate();
    char ctl_app[48], lis_app[48];
    snprintf(ctl_app, sizeof ctl_app, "pqmq_ctl_%ld", (long)getpid());
    snprintf(lis_app, sizeof lis_app, "pqmq_lis_%ld", (long)getpid());
    const char *direct = getenv("PQMQ_TEST_LISTEN_DSN");
    char *ci = t_conninfo(NULL, NULL, ctl_app);
    char *li = t_conninfo(t_pooled() && direct ? direct : NULL, NULL, lis_app);
    pqmq_runner *r = pqmq_runner_new(ci);
    const char *ch = "pool_ch";
    CHECK_INT(pqmq_runner_set_listen_dsn(r, li), 0);
    CHECK_INT(pqmq_runner_set_channels(r, &ch, 1), 0);
    CHECK_INT(pqmq_runner_handle(r, NULL, h_count, NULL), 0);
    CHECK_INT(pqmq_runner_set_concurrency(r, 1), 0);
    atomic_store(&handled, 0);
    t_bg b;
    t_runner_start(&b, r);
    WAIT_UNTIL(t_stats(r).polls >= 1, 10000);
    t_sleep_ms(200);

    /* The LISTEN lives on the second connection. */
    PGconn *pg = t_listener();
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = '%s'",
                        lis_app),
              1);
    /* An idle runner is woken through it. */
    uint64_t polls = t_stats(r).polls;
    put(ch);
    WAIT_UNTIL(atomic_load(&handled) == 1, 10000);
    CHECK_INT(atomic_load(&handled), 1);
    CHECK(t_stats(r).wakeups >= 1);
    CHECK(t_stats(r).polls > polls);

    /* It is re-established when lost, and LISTENs again. */
    t_sleep_ms(200);
    uint64_t wakeups = t_stats(r).wakeups;
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE application_name = '%s'",
                        lis_app),
              1);
    WAIT_UNTIL(t_stats(r).reconnects >= 1, 10000);
    CHECK(t_stats(r).reconnects >= 1);
    WAIT_UNTIL(t_sql_int(pg,
                         "SELECT count(*) FROM pg_stat_activity "
                         "WHERE application_name = '%s'",
                         lis_app) == 1,
               10000);
    t_sleep_ms(300);
    put(ch);
    WAIT_UNTIL(atomic_load(&handled) == 2, 10000);
    CHECK_INT(atomic_load(&handled), 2);
    CHECK(t_stats(r).wakeups > wakeups);

    t_runner_stop(&b);
    PQfinish(pg);
    pqmq_runner_free(r);
    free(ci);
    free(li);
}

static void test_bad_listen_dsn(void)
{
    CHECK_INT(pqmq_runner_set_listen_dsn(NULL, "dbname=x"), PQMQ_EINVAL);
    pqmq_runner *r = pqmq_runner_new(t_dsn());
    CHECK_INT(pqmq_runner_handle(r, NULL, h_count, NULL), 0);
    CHECK_INT(pqmq_runner_set_listen_dsn(r, "host=/nonexistent-pqmq-dir port=1"), 0);
    CHECK_INT(pqmq_runner_run(r), PQMQ_ECONN);
    CHECK(strstr(pqmq_runner_errmsg(r), "listen connection") != NULL);
    printf("    %s\n", pqmq_runner_errmsg(r));
    /* NULL: back to LISTEN on the control connection (replaces the copy). */
    CHECK_INT(pqmq_runner_set_listen_dsn(r, "dbname=other"), 0);
    CHECK_INT(pqmq_runner_set_listen_dsn(r, NULL), 0);
    pqmq_runner_free(r);
}

int main(void)
{
    t_init("pooling");
    T_RUN(test_client_leaves_no_session_state);
    T_RUN(test_runner_listens_on_its_own_connection);
    T_RUN(test_bad_listen_dsn);
    return t_done();
}
