/* harness.c: see harness.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "harness.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <time.h>

#include <sys/wait.h>
#include <unistd.h>

int t_failed_checks;
static int t_failed_funcs, t_ran_funcs, t_fn_failed;
static char t_schema_name[64];
static const char *t_dsn_value;
/* Pooled mode (PQMQ_TEST_POOLED=1, tests/test_pgbouncer.sh): the DSN as
 * given; t_dsn_value then adds user=<a role of this test>. */
static const char *t_dsn_given;
static char *t_dsn_pooled;

void t_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stdout, "    FAIL %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    fflush(stdout);
    t_failed_checks++;
    t_fn_failed = 1;
}

void t_run(const char *name, void (*fn)(void))
{
    int64_t t0 = t_now_ms();
    t_fn_failed = 0;
    fn();
    t_ran_funcs++;
    if (t_fn_failed)
        t_failed_funcs++;
    printf("%s - %s (%lld ms)\n", t_fn_failed ? "not ok" : "ok", name,
           (long long)(t_now_ms() - t0));
    fflush(stdout);
}

const char *t_dsn(void)
{
    return t_dsn_value;
}
const char *t_schema(void)
{
    return t_schema_name;
}

static PGconn *t_connect_raw(const char *schema)
{
    char options[160];
    snprintf(options, sizeof options, "-c search_path=%s -c client_min_messages=warning",
             schema ? schema : "public");
    const char *keys[] = {"dbname", "options", NULL};
    const char *vals[] = {t_dsn_value, options, NULL};
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "cannot connect to %s: %s", t_dsn_value, PQerrorMessage(c));
        exit(1);
    }
    return c;
}

PGconn *t_pg(void)
{
    return t_connect_raw(t_schema_name);
}

char *t_conninfo(const char *base, const char *path, const char *app)
{
    char *s = NULL;
    if (asprintf(&s, "%s options='-c search_path=%s -c client_min_messages=warning'%s%s",
                 base ? base : t_dsn_value, path ? path : t_schema_name,
                 app ? " application_name=" : "", app ? app : "") < 0)
        abort();
    return s;
}

pqmq_runner *t_runner_app(const char *app)
{
    char *ci = t_conninfo(NULL, NULL, app);
    pqmq_runner *r = pqmq_runner_new(ci);
    free(ci);
    /* Behind a pooler (tests/test_pgbouncer.sh): LISTEN straight to the
     * server. */
    const char *listen = getenv("PQMQ_TEST_LISTEN_DSN");
    if (!r || (listen && pqmq_runner_set_listen_dsn(r, listen) != 0))
        abort();
    return r;
}

pqmq_runner *t_runner(void)
{
    return t_runner_app(NULL);
}

static void *t_runner_main(void *arg)
{
    t_bg *b = arg;
    b->rc = pqmq_runner_run(b->r);
    return NULL;
}

void t_runner_start(t_bg *b, pqmq_runner *r)
{
    b->r = r;
    b->rc = 99;
    if (pthread_create(&b->thread, NULL, t_runner_main, b) != 0)
        abort();
}

void t_runner_stop(t_bg *b)
{
    pqmq_runner_stop(b->r);
    t_runner_join(b, 15000);
    CHECK_INT(b->rc, 0);
}

int t_runner_join(t_bg *b, int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    if (pthread_timedjoin_np(b->thread, NULL, &ts) == 0)
        return 0;
    t_fail(__FILE__, __LINE__, "pqmq_runner_run did not return within %lld ms", (long long)ms);
    pqmq_runner_stop(b->r);
    pthread_join(b->thread, NULL);
    return -1;
}

void t_runner_process(pqmq_runner *r, uint64_t n, int64_t ms)
{
    t_bg b;
    t_runner_start(&b, r);
    WAIT_UNTIL(t_stats(r).processed >= n, ms);
    t_runner_stop(&b);
}

pqmq_runner_stats_t t_stats(const pqmq_runner *r)
{
    pqmq_runner_stats_t s;
    pqmq_runner_stats(r, &s);
    return s;
}

void t_listen(PGconn *l, const char *chan)
{
    char *ident = PQescapeIdentifier(l, chan, strlen(chan));
    CHECK(ident != NULL);
    if (ident)
        t_exec(l, "LISTEN %s", ident);
    PQfreemem(ident);
}

int t_collect_notes(PGconn *l, int pid, const char *marker, int64_t ms, t_note_fn fn, void *arg)
{
    int64_t end = t_now_ms() + ms;
    for (;;) {
        if (!PQconsumeInput(l)) {
            t_fail(__FILE__, __LINE__, "listener: %s", PQerrorMessage(l));
            return -1;
        }
        PGnotify *nt;
        while ((nt = PQnotifies(l)) != NULL) {
            int done = !strcmp(nt->relname, marker);
            if (!done && nt->be_pid == pid)
                fn(nt, arg);
            PQfreemem(nt);
            if (done)
                return 0;
        }
        int64_t left = end - t_now_ms();
        if (left <= 0)
            return -2;
        struct pollfd p = {PQsocket(l), POLLIN, 0};
        if (poll(&p, 1, (int)left) < 0 && errno != EINTR)
            return -2;
    }
}

int t_pooled(void)
{
    return t_dsn_pooled != NULL;
}

int t_citus(void)
{
    const char *v = getenv("PQMQ_TEST_CITUS");
    return v && !strcmp(v, "1");
}

int t_citus_skip(const char *why)
{
    if (!t_citus())
        return 0;
    printf("    skipped on Citus: %s\n", why);
    return 1;
}

PGconn *t_listener(void)
{
    const char *direct = getenv("PQMQ_TEST_LISTEN_DSN");
    if (!t_pooled() || !direct || !*direct)
        return t_pg();
    PGconn *c = PQconnectdb(direct);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "cannot connect to %s: %s", direct, PQerrorMessage(c));
        exit(1);
    }
    return c;
}

pqmq_client *t_client(void)
{
    /* PQMQ_TEST_DSN is a key=value conninfo, so options can be appended. */
    char *conninfo = t_conninfo(NULL, NULL, NULL);
    pqmq_client *c = NULL;
    if (pqmq_connect(conninfo, &c) != 0) {
        fprintf(stderr, "pqmq_connect failed: %s\n", pqmq_errmsg(c));
        exit(1);
    }
    free(conninfo);
    return c;
}

/* On Citus a test's UPDATE or DELETE through mq_msgs goes to mq_rows:
 * Citus refuses to modify a view over its tables (docs/citus.md), and there
 * mq_rows holds every message (no batch is logged on Citus). */
static void t_citus_view_write(char *sql)
{
    static const char *const views[][2] = {
        {"UPDATE mq_msgs ", "UPDATE mq_rows "},
        {"DELETE FROM mq_msgs", "DELETE FROM mq_rows"},
    };
    if (!t_citus())
        return;
    char *p = sql + strspn(sql, " \t\n");
    for (size_t i = 0; i < sizeof views / sizeof views[0]; i++) {
        size_t n = strlen(views[i][0]);
        if (!strncmp(p, views[i][0], n)) {
            memcpy(p, views[i][1], n); /* (names of one length) */
            return;
        }
    }
}

static PGresult *t_vsql(PGconn *conn, const char *fmt, va_list ap)
{
    char *sql = NULL;
    if (vasprintf(&sql, fmt, ap) < 0)
        abort();
    t_citus_view_write(sql);
    PGresult *r = PQexec(conn, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
        t_fail(__FILE__, __LINE__, "SQL failed: %s\n      %s", sql, PQerrorMessage(conn));
        PQclear(r);
        r = NULL;
    }
    free(sql);
    return r;
}

PGresult *t_sql(PGconn *conn, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PGresult *r = t_vsql(conn, fmt, ap);
    va_end(ap);
    return r;
}

void t_exec(PGconn *conn, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PQclear(t_vsql(conn, fmt, ap));
    va_end(ap);
}

long long t_sql_int(PGconn *conn, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PGresult *r = t_vsql(conn, fmt, ap);
    va_end(ap);
    long long v = -1;
    if (r && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
        v = atoll(PQgetvalue(r, 0, 0));
    else
        t_fail(__FILE__, __LINE__, "expected one non-NULL value");
    PQclear(r);
    return v;
}

void t_init(const char *test_name)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    t_dsn_value = getenv("PQMQ_TEST_DSN");
    if (!t_dsn_value || !*t_dsn_value) {
        printf("SKIP: PQMQ_TEST_DSN is not set (tests/run-tests.sh sets it)\n");
        exit(77);
    }
    snprintf(t_schema_name, sizeof t_schema_name, "t_%.30s_%ld", test_name, (long)getpid());
    t_dsn_given = t_dsn_value;
    PGconn *c = t_connect_raw(NULL);
    t_exec(c, "DROP SCHEMA IF EXISTS %s CASCADE", t_schema_name);
    t_exec(c, "CREATE SCHEMA %s", t_schema_name);
    const char *pooled = getenv("PQMQ_TEST_POOLED");
    if (pooled && !strcmp(pooled, "1")) {
        /* Behind a pooler in transaction mode nothing set per session
         * lasts (the options above are ignored): the schema comes from a
         * role of this test whose default search_path it is, the one way
         * a pooled deployment gets it too. */
        t_exec(c, "DROP ROLE IF EXISTS %s", t_schema_name);
        t_exec(c, "CREATE ROLE %s LOGIN SUPERUSER", t_schema_name);
        t_exec(c, "ALTER ROLE %s SET search_path = %s", t_schema_name, t_schema_name);
        t_exec(c, "ALTER ROLE %s SET client_min_messages = warning", t_schema_name);
        if (asprintf(&t_dsn_pooled, "%s user=%s", t_dsn_given, t_schema_name) < 0)
            abort();
        t_dsn_value = t_dsn_pooled;
    }
    PQfinish(c);
    pqmq_client *q = t_client();
    if (pqmq_migrate(q) != 0) {
        fprintf(stderr, "pqmq_migrate failed: %s\n", pqmq_errmsg(q));
        exit(1);
    }
    pqmq_client_free(q);
}

int t_done(void)
{
    t_dsn_value = t_dsn_given; /* a role cannot drop itself */
    PGconn *c = t_connect_raw(NULL);
    PQclear(PQexec(c, "SET client_min_messages = warning"));
    t_exec(c, "DROP SCHEMA IF EXISTS %s CASCADE", t_schema_name);
    if (t_dsn_pooled) {
        t_exec(c, "DROP ROLE IF EXISTS %s", t_schema_name);
        free(t_dsn_pooled);
        t_dsn_pooled = NULL;
    }
    PQfinish(c);
    printf("%d passed, %d failed\n", t_ran_funcs - t_failed_funcs, t_failed_funcs);
    return t_failed_funcs ? 1 : 0;
}

void t_truncate(void)
{
    PGconn *c = t_pg();
    t_exec(c, "TRUNCATE mq_rows, mq_chains, mq_keys, mq_log, mq_cursors, mq_cursor_keys, "
              "mq_receipts, mq_done, mq_log_gone, mq_cursors_retired, mq_cursors_wanted, "
              "mq_paused");
    PQfinish(c);
}

int64_t t_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void t_sleep_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

void t_await_log_sweep(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    t_sleep_ms(1000 - now.tv_nsec / 1000000 + 20);
}

pqmq_msg *t_msg(const char *channel, const char *args, const char *name, const char *json,
                int ordered)
{
    pqmq_msg *m = pqmq_msg_new();
    if (!m || pqmq_msg_set_channel(m, channel, args) || pqmq_msg_set_name(m, name) ||
        pqmq_msg_set_json(m, json) || pqmq_msg_set_ordered(m, ordered))
        abort();
    return m;
}

void t_msgs_free(pqmq_msg **msgs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        pqmq_msg_free(msgs[i]);
}

void t_insert_spread(pqmq_client *q, int n, const char *channel, const char *name,
                     const char *json, int ordered, int retries, int64_t backoff_ms)
{
    for (int i = 0; i < n; i += 100) {
        pqmq_msg *msgs[100];
        int k = n - i < 100 ? n - i : 100;
        for (int j = 0; j < k; j++) {
            char ch[16];
            snprintf(ch, sizeof ch, "c%d", (i + j) % 5);
            msgs[j] =
                t_msg(channel ? channel : ch, ordered ? "chain" : NULL, name, json, ordered);
            pqmq_msg_set_retries(msgs[j], retries);
            pqmq_msg_set_backoff(msgs[j], backoff_ms);
        }
        CHECK_OK(q, pqmq_insert(q, msgs, (size_t)k));
        t_msgs_free(msgs, (size_t)k);
    }
}

/* Runs the pqmq command on the test schema; returns its stdout (caller
 * frees) and sets *status to its exit status. */
char *t_run_pqmq(const char *args, int *status)
{
    const char *dir = getenv("PQMQ_TEST_BUILDDIR");
    char *cmd = NULL, *out = NULL;
    size_t len = 0;
    if (asprintf(&cmd, "'%s/cli/pqmq' -d \"$PQMQ_TEST_DSN\" --schema %s %s", dir ? dir : ".",
                 t_schema(), args) < 0)
        return NULL;
    FILE *p = popen(cmd, "r");
    free(cmd);
    if (!p)
        return NULL;
    FILE *m = open_memstream(&out, &len);
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, p)) > 0)
        fwrite(buf, 1, k, m);
    fclose(m);
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}
