/*
 * test_runner_log.c: the log functions (pqmq_set_log, pqmq_runner_set_log).
 * A runner whose backends are terminated logs the loss (its channels, the
 * server's words, "reconnecting") and the reconnection ("reconnected after
 * N ms"), prints nothing on stderr, and while the server refuses it logs
 * each failed attempt with its error and the delay before the next. A
 * client's notices go to its log function, one line each, at their level.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

static PGconn *pg;
static pqmq_client *q;

/* ---- a log that keeps its lines ---------------------------------------- */

enum { MAX_LINES = 512 };
typedef struct {
    pthread_mutex_t lock;
    int n;
    int levels[MAX_LINES];
    char *lines[MAX_LINES];
    atomic_int inside; /* calls under way: the runner's must never overlap */
    atomic_int overlapped;
} t_log;

static void log_fn(void *ctx, int level, const char *msg)
{
    t_log *l = ctx;
    if (atomic_fetch_add(&l->inside, 1))
        atomic_store(&l->overlapped, 1);
    pthread_mutex_lock(&l->lock);
    if (l->n < MAX_LINES) {
        l->levels[l->n] = level;
        l->lines[l->n++] = strdup(msg);
    }
    pthread_mutex_unlock(&l->lock);
    atomic_fetch_sub(&l->inside, 1);
}

static void log_init(t_log *l)
{
    memset(l, 0, sizeof *l);
    pthread_mutex_init(&l->lock, NULL);
}

static void log_free(t_log *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->lines[i]);
    pthread_mutex_destroy(&l->lock);
}

/* How many lines at level (-1: any) hold every one of the needles (up to
 * three; NULL ends them). */
static int log_count(t_log *l, int level, const char *a, const char *b, const char *c)
{
    int count = 0;
    pthread_mutex_lock(&l->lock);
    for (int i = 0; i < l->n; i++) {
        const char *s = l->lines[i];
        if ((level < 0 || l->levels[i] == level) && (!a || strstr(s, a)) &&
            (!b || strstr(s, b)) && (!c || strstr(s, c)))
            count++;
    }
    pthread_mutex_unlock(&l->lock);
    return count;
}

static void log_print(t_log *l)
{
    pthread_mutex_lock(&l->lock);
    for (int i = 0; i < l->n; i++)
        printf("    [%s] %s\n", pqmq_log_level_name(l->levels[i]), l->lines[i]);
    pthread_mutex_unlock(&l->lock);
}

/* No line holds a line break. */
static int log_one_line_each(t_log *l)
{
    int ok = 1;
    pthread_mutex_lock(&l->lock);
    for (int i = 0; i < l->n; i++)
        ok &= strpbrk(l->lines[i], "\r\n") == NULL;
    pthread_mutex_unlock(&l->lock);
    return ok;
}

/* ---- stderr, captured ------------------------------------------------ */

static int saved_stderr = -1;
static FILE *captured;

static void capture_stderr(void)
{
    fflush(stderr);
    captured = tmpfile();
    if (!captured)
        abort();
    saved_stderr = dup(2);
    dup2(fileno(captured), 2);
}

/* Restores stderr; returns what was written to it meanwhile (caller frees). */
static char *release_stderr(void)
{
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    long size = ftell(captured);
    char *text = calloc(1, (size_t)(size > 0 ? size : 0) + 1);
    if (!text)
        abort();
    rewind(captured);
    if (size > 0 && fread(text, 1, (size_t)size, captured) != (size_t)size)
        text[0] = '\0';
    fclose(captured);
    return text;
}

/* ---- the runner ------------------------------------------------------ */

static int h_ok(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)ctx, (void)job, (void)arg;
    return 0;
}

static long long terminate_app(const char *app)
{
    return t_sql_int(pg,
                     "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                     "WHERE application_name = '%s'",
                     app);
}

static void put(const char *channel)
{
    pqmq_msg *m = t_msg(channel, "", "job", "{}", 0);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    pqmq_msg_free(m);
}

/* The runner's role: its own, so that the server can refuse it alone. */
static char role[64];

static void set_login(int on)
{
    t_exec(pg, "ALTER ROLE %s %s", role, on ? "LOGIN" : "NOLOGIN");
}

static void test_runner_logs_a_lost_connection(void)
{
    if (t_pooled()) {
        /* It finds the runner's backends by application_name, which a
         * pooler's server connections do not carry. */
        printf("    skipped behind a pooler\n");
        return;
    }
    t_truncate();
    t_log l;
    log_init(&l);
    char app[64];
    snprintf(app, sizeof app, "pqmq_tlog_%ld", (long)getpid());
    snprintf(role, sizeof role, "pqmq_tlog_%ld", (long)getpid());
    PGresult *made = PQexec(pg, "SELECT 1 FROM pg_roles WHERE rolname = current_user AND "
                                "rolsuper AND rolcreaterole");
    int can = PQntuples(made) == 1;
    PQclear(made);
    if (!can) {
        printf("    skipped: needs a superuser to make the runner's role\n");
        log_free(&l);
        return;
    }
    t_exec(pg, "CREATE ROLE %s LOGIN SUPERUSER", role);
    char *base = t_conninfo(NULL, NULL, app), *ci = NULL;
    if (asprintf(&ci, "%s user=%s", base, role) < 0)
        abort();
    free(base);
    pqmq_runner *r = pqmq_runner_new(ci);
    free(ci);
    const char *channels[] = {"log_a", "log_b"};
    CHECK_INT(pqmq_runner_set_channels(r, channels, 2), 0);
    CHECK_INT(pqmq_runner_set_concurrency(r, 2), 0);
    CHECK_INT(pqmq_runner_handle(r, NULL, h_ok, NULL), 0);
    CHECK_INT(pqmq_runner_set_log(r, log_fn, &l), 0);
    capture_stderr();
    t_bg b;
    t_runner_start(&b, r);
    WAIT_UNTIL(log_count(&l, PQMQ_LOG_INFO, "started", NULL, NULL) == 1, 10000);
    CHECK_INT(log_count(&l, PQMQ_LOG_INFO, "pqmq_runner (channels: log_a, log_b): started",
                        NULL, NULL),
              1);

    /* Every backend dies while the runner is idle; a message makes the
     * workers look at their connections. */
    long long killed = terminate_app(app);
    CHECK_INT(killed, 3); /* 1 control + 2 workers */
    t_sleep_ms(200);
    put("log_a");
    WAIT_UNTIL(t_stats(r).processed >= 1 && t_stats(r).reconnects >= 3, 20000);
    CHECK_INT(t_stats(r).processed, 1);
    /* The control connection's loss: which runner, which connection, the
     * server's words (libpq would have printed them on stderr). */
    CHECK_INT(log_count(&l, PQMQ_LOG_WARN,
                        "pqmq_runner (channels: log_a, log_b): lost connection",
                        "(control connection)", "terminating connection"),
              1);
    CHECK_INT(log_count(&l, PQMQ_LOG_INFO,
                        "pqmq_runner (channels: log_a, log_b): reconnected after ",
                        " ms (control connection, 1 attempt)", NULL),
              1);
    /* The worker that ran it (the other notices when it next needs its
     * connection). */
    CHECK(log_count(&l, PQMQ_LOG_WARN, "lost connection (worker ", "terminating connection",
                    NULL) >= 1);
    CHECK(log_count(&l, PQMQ_LOG_INFO, "reconnected after ", " ms (worker ", ", 1 attempt)") >=
          1);
    CHECK_INT(log_count(&l, -1, "CONTEXT", NULL, NULL), 0); /* terse: no statement quoted */

    /* The server refuses new connections: each failed attempt of the
     * control connection says why and when the next comes. */
    set_login(0);
    CHECK(terminate_app(app) >= 1); /* the control connection, and workers that came back */
    WAIT_UNTIL(log_count(&l, PQMQ_LOG_WARN, "reconnect attempt 2 failed (control connection)",
                         NULL, NULL) == 1,
               10000);
    set_login(1);
    WAIT_UNTIL(log_count(&l, PQMQ_LOG_INFO, "reconnected after ", NULL, NULL) >= 4, 10000);
    CHECK_INT(log_count(&l, PQMQ_LOG_WARN, "reconnect attempt 1 failed (control connection)",
                        "not permitted to log in", "; next attempt in 50 ms"),
              1);
    CHECK_INT(log_count(&l, PQMQ_LOG_WARN, "reconnect attempt 2 failed (control connection)",
                        "; next attempt in 100 ms", NULL),
              1);
    CHECK_INT(log_count(&l, PQMQ_LOG_INFO, "reconnected after ", " attempts)", NULL), 1);
    /* The workers catch up when they next need their connections. */
    put("log_b");
    WAIT_UNTIL(t_stats(r).processed >= 2, 20000);
    CHECK_INT(t_stats(r).processed, 2);

    t_runner_stop(&b);
    char *err = release_stderr();
    CHECK_INT(log_count(&l, PQMQ_LOG_INFO, "stopped: 2 processed, 0 failed", NULL, NULL), 1);
    CHECK(log_one_line_each(&l));
    CHECK_INT(atomic_load(&l.overlapped), 0);
    /* The library printed nothing itself. */
    if (err[0])
        printf("    stderr: %s\n", err);
    CHECK_STR(err, "");
    free(err);
    if (t_failed_checks)
        log_print(&l);
    pqmq_runner_free(r);
    log_free(&l);
    t_exec(pg, "DROP ROLE %s", role);
}

/* Without a log function the runner prints nothing either. */
static void test_runner_without_log_is_quiet(void)
{
    if (t_pooled()) {
        printf("    skipped behind a pooler\n");
        return;
    }
    t_truncate();
    char app[64];
    snprintf(app, sizeof app, "pqmq_tlog2_%ld", (long)getpid());
    pqmq_runner *r = t_runner_app(app);
    CHECK_INT(pqmq_runner_set_concurrency(r, 1), 0);
    CHECK_INT(pqmq_runner_handle(r, NULL, h_ok, NULL), 0);
    capture_stderr();
    t_bg b;
    t_runner_start(&b, r);
    WAIT_UNTIL(t_stats(r).polls >= 1, 10000);
    t_sleep_ms(100);
    CHECK_INT(terminate_app(app), 2); /* 1 control + 1 worker */
    t_sleep_ms(200);
    put("quiet");
    WAIT_UNTIL(t_stats(r).processed >= 1 && t_stats(r).reconnects >= 2, 20000);
    CHECK_INT(t_stats(r).processed, 1);
    t_runner_stop(&b);
    char *err = release_stderr();
    if (err[0])
        printf("    stderr: %s\n", err);
    CHECK_STR(err, "");
    free(err);
    pqmq_runner_free(r);
}

/* ---- a client --------------------------------------------------------- */

static void test_client_notices_go_to_its_log(void)
{
    t_log l;
    log_init(&l);
    pqmq_client *c = t_client();
    CHECK_INT(pqmq_set_log(NULL, log_fn, &l), PQMQ_EINVAL);
    CHECK_INT(pqmq_set_log(c, log_fn, &l), 0);
    PGresult *res = PQexec(pqmq_conn(c), "DO $$ BEGIN RAISE WARNING 'pqmq log test'; "
                                         "RAISE WARNING E'two\\nlines'; END $$");
    CHECK(PQresultStatus(res) == PGRES_COMMAND_OK);
    PQclear(res);
    CHECK_INT(log_count(&l, PQMQ_LOG_WARN, "WARNING:", "pqmq log test", NULL), 1);
    CHECK_INT(log_count(&l, PQMQ_LOG_WARN, "two; lines", NULL, NULL), 1);
    CHECK(log_one_line_each(&l));
    /* Back to libpq's receiver: the log hears no more. */
    CHECK_INT(pqmq_set_log(c, NULL, NULL), 0);
    capture_stderr();
    res = PQexec(pqmq_conn(c), "DO $$ BEGIN RAISE WARNING 'to stderr'; END $$");
    PQclear(res);
    char *err = release_stderr();
    CHECK(strstr(err, "to stderr") != NULL);
    free(err);
    CHECK_INT(l.n, 2);
    pqmq_client_free(c);
    log_free(&l);
}

static void test_level_names(void)
{
    CHECK_STR(pqmq_log_level_name(PQMQ_LOG_ERROR), "error");
    CHECK_STR(pqmq_log_level_name(PQMQ_LOG_WARN), "warn");
    CHECK_STR(pqmq_log_level_name(PQMQ_LOG_INFO), "info");
    CHECK_STR(pqmq_log_level_name(PQMQ_LOG_DEBUG), "debug");
    CHECK_STR(pqmq_log_level_name(42), "unknown");
    CHECK_INT(pqmq_runner_set_log(NULL, log_fn, NULL), PQMQ_EINVAL);
}

int main(void)
{
    t_init("test_runner_log");
    pg = t_pg();
    q = t_client();
    T_RUN(test_level_names);
    T_RUN(test_client_notices_go_to_its_log);
    T_RUN(test_runner_logs_a_lost_connection);
    T_RUN(test_runner_without_log_is_quiet);
    pqmq_client_free(q);
    PQfinish(pg);
    return t_done();
}
