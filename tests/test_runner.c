/*
 * test_runner.c: the runner (DESIGN.md section 4): dispatch by name,
 * concurrency, LISTEN/NOTIFY wake-ups, keep-alive, transactional
 * completion, failures and retries, graceful stop (call, signal,
 * notification), reconnecting, statistics and bad arguments.
 *
 * Each runner runs on its own thread (pqmq_runner_run blocks); the test
 * thread inserts, watches the tables and the runner's statistics, and stops
 * it. Waits are generous (a noisy 2-core machine); the only tight bound is
 * the wake-up latency, which is the point of LISTEN/NOTIFY.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static pqmq_client *q; /* the test's producer */
static PGconn *pg;     /* the test's SQL connection */

/* ---- helpers ------------------------------------------------------------ */

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Waits until the runner has polled once (it LISTENs before that) and then
 * lets it settle into its idle wait. */
static void settle(pqmq_runner *r, int64_t ms)
{
    WAIT_UNTIL(t_stats(r).polls >= 1, 10000);
    CHECK(t_stats(r).polls >= 1);
    t_sleep_ms(ms);
}

/* Inserts one message; backoff_ms 0 keeps the default. */
static void put(const char *channel, const char *name, const char *json, int64_t backoff_ms,
                uuid_t id_out)
{
    pqmq_msg *m = t_msg(channel, NULL, name, json, 0);
    if (backoff_ms > 0)
        pqmq_msg_set_backoff(m, backoff_ms);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    if (id_out)
        pqmq_msg_id(m, id_out);
    pqmq_msg_free(m);
}

/* Inserts n messages in one batch; ids_out (may be NULL) receives their ids. */
static void put_n(const char *channel, const char *name, int n, int64_t backoff_ms,
                  uuid_t *ids_out)
{
    pqmq_msg **msgs = calloc((size_t)n, sizeof *msgs);
    if (!msgs)
        abort();
    for (int i = 0; i < n; i++) {
        char json[32];
        snprintf(json, sizeof json, "{\"i\": %d}", i);
        msgs[i] = t_msg(channel, NULL, name, json, 0);
        if (backoff_ms > 0)
            pqmq_msg_set_backoff(msgs[i], backoff_ms);
        if (ids_out)
            pqmq_msg_id(msgs[i], ids_out[i]);
    }
    CHECK_OK(q, pqmq_insert(q, msgs, (size_t)n));
    t_msgs_free(msgs, (size_t)n);
    free(msgs);
}

static long long msgs_left(void)
{
    return t_sql_int(pg, "SELECT count(*) FROM mq_msgs");
}

/* mq_payloads.last_error of a message (empty when NULL or gone). */
static void last_error_of(const uuid_t id, char *out, size_t len)
{
    char text[37];
    uuid_unparse_lower(id, text);
    const char *params[1] = {text};
    PGresult *r = PQexecParams(pg, "SELECT last_error FROM mq_payloads WHERE id = $1::uuid", 1,
                               NULL, params, NULL, NULL, 0);
    out[0] = '\0';
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
        snprintf(out, len, "%s", PQgetvalue(r, 0, 0));
    else if (PQresultStatus(r) != PGRES_TUPLES_OK)
        t_fail(__FILE__, __LINE__, "last_error query: %s", PQerrorMessage(pg));
    PQclear(r);
}

/* A channel name no other test program in this database uses, so that a
 * runner serving only it gets no foreign notifications. */
static const char *own_channel(const char *suffix)
{
    static char buf[8][64];
    static int next;
    char *b = buf[next++ % 8];
    snprintf(b, 64, "%s_%s", t_schema(), suffix);
    return b;
}

/* ---- a log of handler calls -------------------------------------------- */

typedef struct {
    uuid_t id;
    char name[32];
    const char *route; /* the handler's arg */
    int attempt;
    int64_t start_us;
} call_t;

#define MAX_CALLS 4096
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static call_t calls[MAX_CALLS];
static int ncalls;

static void log_reset(void)
{
    pthread_mutex_lock(&log_lock);
    ncalls = 0;
    pthread_mutex_unlock(&log_lock);
}

static int log_call(const char *route, const pqmq_job *job)
{
    int64_t start = now_us();
    pthread_mutex_lock(&log_lock);
    int i = ncalls < MAX_CALLS ? ncalls++ : -1;
    if (i >= 0) {
        pqmq_job_id(job, calls[i].id);
        snprintf(calls[i].name, sizeof calls[i].name, "%s", pqmq_job_name(job));
        calls[i].route = route;
        calls[i].attempt = pqmq_job_attempt(job);
        calls[i].start_us = start;
    }
    pthread_mutex_unlock(&log_lock);
    return i;
}

static int log_count(void)
{
    pthread_mutex_lock(&log_lock);
    int n = ncalls;
    pthread_mutex_unlock(&log_lock);
    return n;
}

/* How many calls the log holds for id. */
static int calls_for(const uuid_t id)
{
    int n = 0;
    pthread_mutex_lock(&log_lock);
    for (int i = 0; i < ncalls; i++)
        n += !uuid_compare(calls[i].id, id);
    pthread_mutex_unlock(&log_lock);
    return n;
}

static int h_record(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)ctx;
    log_call(arg, job);
    return 0;
}

/* ---- 1. dispatch by message name ---------------------------------------- */

static void test_dispatch_by_name(void)
{
    t_truncate();
    log_reset();
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_handle(r, "a", h_record, "a"), 0);
    CHECK_INT(pqmq_runner_handle(r, "b", h_record, "b"), 0);
    CHECK_INT(pqmq_runner_handle(r, NULL, h_record, "*"), 0);
    const char *names[] = {"a", "b", "c", "a", "", "b", "a", "c"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        put("disp", names[i], NULL, 0, NULL);
    t_runner_process(r, 8, 15000);
    CHECK_INT(t_stats(r).processed, 8);
    CHECK_INT(t_stats(r).failed, 0);
    CHECK_INT(log_count(), 8);
    int na = 0, nb = 0, nf = 0;
    for (int i = 0; i < log_count(); i++) {
        const call_t *c = &calls[i];
        if (!strcmp(c->route, "a")) {
            CHECK_STR(c->name, "a");
            na++;
        } else if (!strcmp(c->route, "b")) {
            CHECK_STR(c->name, "b");
            nb++;
        } else {
            CHECK(strcmp(c->name, "a") != 0 && strcmp(c->name, "b") != 0);
            nf++;
        }
    }
    CHECK_INT(na, 3);
    CHECK_INT(nb, 2);
    CHECK_INT(nf, 3); /* "c", "" and "c" */
    CHECK_INT(msgs_left(), 0);
    pqmq_runner_free(r);

    /* Without a fallback, an unknown name fails with "no handler". */
    t_truncate();
    log_reset();
    r = t_runner();
    CHECK_INT(pqmq_runner_handle(r, "a", h_record, "a"), 0);
    uuid_t id;
    put("disp", "zzz", NULL, 60000, id);
    t_bg b;
    t_runner_start(&b, r);
    WAIT_UNTIL(t_stats(r).failed >= 1, 15000);
    t_runner_stop(&b);
    CHECK_INT(t_stats(r).failed, 1);
    CHECK_INT(t_stats(r).processed, 0);
    CHECK_INT(log_count(), 0);
    char err[256];
    last_error_of(id, err, sizeof err);
    if (!strstr(err, "no handler"))
        t_fail(__FILE__, __LINE__, "last_error \"%s\" lacks \"no handler\"", err);
    CHECK_INT(msgs_left(), 1); /* failed, not completed */
    pqmq_runner_free(r);
}

/* ---- 2. concurrency limit ----------------------------------------------- */

static atomic_int conc_now, conc_max;

static int h_concurrent(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)ctx, (void)job, (void)arg;
    int now = atomic_fetch_add(&conc_now, 1) + 1;
    int seen = atomic_load(&conc_max);
    while (now > seen && !atomic_compare_exchange_weak(&conc_max, &seen, now))
        ;
    t_sleep_ms(50);
    atomic_fetch_sub(&conc_now, 1);
    return 0;
}

static void test_concurrency_limit(void)
{
    t_truncate();
    atomic_store(&conc_now, 0);
    atomic_store(&conc_max, 0);
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_set_concurrency(r, 3), 0);
    CHECK_INT(pqmq_runner_handle(r, NULL, h_concurrent, NULL), 0);
    put_n("conc", "w", 30, 10000, NULL);
    t_bg b;
    int64_t t0 = t_now_ms();
    t_runner_start(&b, r);
    WAIT_UNTIL(t_stats(r).processed >= 30, 30000);
    int64_t took = t_now_ms() - t0;
    t_runner_stop(&b);
    printf("    30 jobs of 50 ms at concurrency 3: %lld ms, max in flight %d\n",
           (long long)took, atomic_load(&conc_max));
    CHECK_INT(t_stats(r).processed, 30);
    CHECK_INT(atomic_load(&conc_max), 3);
    CHECK_INT(msgs_left(), 0);
    pqmq_runner_free(r);
}

/* ---- 3. wake-up latency; an idle runner is silent ------------------------ */

static atomic_llong lat_start_us;

static int h_latency(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)ctx, (void)job, (void)arg;
    atomic_store(&lat_start_us, (long long)now_us());
    return 0;
}

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static void test_wakeup_latency_and_idle(void)
{
    t_truncate();
    const char *ch = own_channel("lat");
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_set_channels(r, &ch, 1), 0);
    CHECK_INT(pqmq_runner_handle(r, NULL, h_latency, NULL), 0);
    t_bg b;
    t_runner_start(&b, r);
    settle(r, 300);

    /* Idle: no queries, no wake-ups. */
    pqmq_runner_stats_t s0 = t_stats(r);
    t_sleep_ms(1000);
    pqmq_runner_stats_t s1 = t_stats(r);
    printf("    idle for 1 s: %llu polls, %llu wake-ups (before: %llu, %llu)\n",
           (unsigned long long)s1.polls, (unsigned long long)s1.wakeups,
           (unsigned long long)s0.polls, (unsigned long long)s0.wakeups);
    CHECK_INT(s1.polls, s0.polls);
    CHECK_INT(s1.wakeups, s0.wakeups);

    /* A message inserted by another client starts within milliseconds. */
    enum { N = 5 };
    long long lat[N];
    for (int i = 0; i < N; i++) {
        atomic_store(&lat_start_us, 0);
        uint64_t done = t_stats(r).processed;
        put(ch, "ping", NULL, 0, NULL);
        int64_t inserted = now_us();
        WAIT_UNTIL(atomic_load(&lat_start_us) != 0, 10000);
        CHECK(atomic_load(&lat_start_us) != 0);
        lat[i] = atomic_load(&lat_start_us) - inserted;
        WAIT_UNTIL(t_stats(r).processed > done, 10000);
        t_sleep_ms(200); /* idle again */
    }
    pqmq_runner_stats_t s2 = t_stats(r);
    printf("    wake-up latency (handler start - insert return), us:");
    for (int i = 0; i < N; i++)
        printf(" %lld", lat[i]);
    long long sorted[N];
    memcpy(sorted, lat, sizeof lat);
    qsort(sorted, N, sizeof *sorted, cmp_ll);
    printf("; median %.2f ms\n", sorted[N / 2] / 1000.0);
    CHECK(sorted[N / 2] < 100000);
    CHECK(s2.wakeups >= s1.wakeups + N);
    CHECK_INT(s2.processed, N);
    t_runner_stop(&b);
    pqmq_runner_free(r);
}

/* ---- 4. keep-alive ------------------------------------------------------ */

static atomic_int ka_calls, ka_attempt;

static int h_long(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)ctx, (void)arg;
    atomic_store(&ka_attempt, pqmq_job_attempt(job));
    atomic_fetch_add(&ka_calls, 1);
    t_sleep_ms(3000);
    return 0;
}

static void test_keep_alive(void)
{
    t_truncate();
    atomic_store(&ka_calls, 0);
    atomic_store(&ka_attempt, 0);
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_handle(r, NULL, h_long, NULL), 0);
    put("ka", "long", NULL, 1000, NULL); /* a 1 s lease for 3 s of work */
    t_bg b;
    t_runner_start(&b, r);
    WAIT_UNTIL(atomic_load(&ka_calls) >= 1, 10000);
    CHECK_INT(atomic_load(&ka_calls), 1);

    /* Another consumer polls all the while: the job is never claimable. */
    pqmq_client *other = t_client();
    int polls = 0, stolen = 0;
    for (int64_t end = t_now_ms() + 3000; t_now_ms() < end; t_sleep_ms(100)) {
        pqmq_batch *batch = NULL;
        CHECK_OK(other, pqmq_poll(other, NULL, 0, 10, &batch));
        stolen += (int)pqmq_batch_count(batch);
        polls++;
        pqmq_batch_free(batch);
    }
    pqmq_client_free(other);
    WAIT_UNTIL(t_stats(r).processed >= 1, 10000);
    t_runner_stop(&b);
    printf("    a second consumer polled %d times during the job, claimed %d\n", polls, stolen);
    CHECK_INT(stolen, 0);
    CHECK_INT(atomic_load(&ka_calls), 1);
    CHECK_INT(atomic_load(&ka_attempt), 1);
    CHECK_INT(t_stats(r).processed, 1);
    CHECK_INT(t_stats(r).failed, 0);
    CHECK_INT(msgs_left(), 0);
    pqmq_runner_free(r);
}

/* ---- 5. transactional completion ---------------------------------------- */

static struct {
    atomic_int result;   /* what the handler returns */
    atomic_int sleep_ms; /* after its write */
    atomic_int started;  /* its write is done */
    atomic_int ok;       /* the write succeeded */
} txh;

static int h_tx(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)arg;
    PGconn *conn = pqmq_ctx_begin(ctx);
    if (!conn) {
        pqmq_ctx_error(ctx, "pqmq_ctx_begin returned NULL");
        atomic_store(&txh.started, 1);
        return -1;
    }
    uuid_t id;
    char text[37];
    pqmq_job_id(job, id);
    uuid_unparse_lower(id, text);
    const char *params[1] = {text};
    PGresult *res = PQexecParams(conn, "INSERT INTO rt_effects (msg_id) VALUES ($1::uuid)", 1,
                                 NULL, params, NULL, NULL, 0);
    atomic_store(&txh.ok, PQresultStatus(res) == PGRES_COMMAND_OK);
    PQclear(res);
    atomic_store(&txh.started, 1);
    t_sleep_ms(atomic_load(&txh.sleep_ms));
    int rc = atomic_load(&txh.result);
    if (rc)
        pqmq_ctx_error(ctx, "rolled back on purpose");
    return rc;
}

static long long effects_of(const uuid_t id)
{
    char text[37];
    uuid_unparse_lower(id, text);
    return t_sql_int(pg, "SELECT count(*) FROM rt_effects WHERE msg_id = '%s'", text);
}

static long long msg_exists(const uuid_t id)
{
    char text[37];
    uuid_unparse_lower(id, text);
    return t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE id = '%s'", text);
}

static void test_transactional_completion(void)
{
    if (t_citus_skip("it records completions with triggers of its own on mq_rows and mq_done, "
                     "which would run on the worker"))
        return;
    t_truncate();
    t_exec(pg, "CREATE TABLE rt_effects (msg_id uuid PRIMARY KEY, "
               "tx bigint NOT NULL DEFAULT txid_current())");
    /* Which transaction deleted each message: to prove "the same commit". */
    t_exec(pg, "CREATE TABLE rt_deleted (msg_id uuid, tx bigint)");
    /* A completion deletes a message of mq_rows, or adds an mq_done row
     * naming the places of logged ones: both note the transaction. */
    t_exec(pg,
           "CREATE FUNCTION rt_log_delete() RETURNS trigger LANGUAGE plpgsql AS $$ "
           "BEGIN INSERT INTO rt_deleted VALUES (OLD.id, txid_current()); RETURN OLD; END $$");
    t_exec(pg, "CREATE TRIGGER rt_log_delete AFTER DELETE ON mq_rows "
               "FOR EACH ROW EXECUTE FUNCTION rt_log_delete()");
    t_exec(pg, "CREATE FUNCTION rt_log_done() RETURNS trigger LANGUAGE plpgsql AS $$ "
               "BEGIN INSERT INTO rt_deleted SELECT l.id, txid_current() FROM mq_log l "
               "WHERE l.channel_key = NEW.channel_key AND l.place = ANY (NEW.places); "
               "RETURN NEW; END $$");
    t_exec(pg, "CREATE TRIGGER rt_log_done AFTER INSERT ON mq_done "
               "FOR EACH ROW EXECUTE FUNCTION rt_log_done()");

    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_handle(r, NULL, h_tx, NULL), 0);
    t_bg b;
    t_runner_start(&b, r);
    settle(r, 0);

    /* A failing handler: its write is rolled back, the message stays. */
    atomic_store(&txh.result, 1);
    atomic_store(&txh.sleep_ms, 0);
    atomic_store(&txh.started, 0);
    uuid_t failed_id;
    put("tx", "t", NULL, 60000, failed_id);
    WAIT_UNTIL(t_stats(r).failed >= 1, 10000);
    CHECK_INT(t_stats(r).failed, 1);
    CHECK_INT(atomic_load(&txh.ok), 1);
    CHECK_INT(effects_of(failed_id), 0);
    CHECK_INT(msg_exists(failed_id), 1);
    char err[256];
    last_error_of(failed_id, err, sizeof err);
    CHECK_STR(err, "rolled back on purpose");
    CHECK_INT(t_stats(r).processed, 0);

    /* A succeeding handler: nothing is visible until the one commit that
     * holds both the write and the completion. */
    atomic_store(&txh.result, 0);
    atomic_store(&txh.sleep_ms, 1000); /* room to look while it runs */
    atomic_store(&txh.started, 0);
    uuid_t ok_id;
    put("tx", "t", NULL, 60000, ok_id);
    WAIT_UNTIL(atomic_load(&txh.started), 10000);
    CHECK(atomic_load(&txh.started));
    CHECK_INT(effects_of(ok_id), 0); /* not committed yet */
    CHECK_INT(msg_exists(ok_id), 1);
    WAIT_UNTIL(t_stats(r).processed >= 1, 10000);
    CHECK_INT(t_stats(r).processed, 1);
    CHECK_INT(effects_of(ok_id), 1);
    CHECK_INT(msg_exists(ok_id), 0);
    char text[37];
    uuid_unparse_lower(ok_id, text);
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM rt_effects e JOIN rt_deleted d "
                        "USING (msg_id) WHERE msg_id = '%s' AND e.tx = d.tx",
                        text),
              1);

    /* Completed elsewhere while the handler ran: the handler's write must
     * not happen (its effect would otherwise be done by two consumers). */
    atomic_store(&txh.result, 0);
    atomic_store(&txh.sleep_ms, 1000); /* room to delete it meanwhile */
    atomic_store(&txh.started, 0);
    uint64_t failed_before = t_stats(r).failed;
    uuid_t lost_id;
    put("tx", "t", NULL, 60000, lost_id);
    WAIT_UNTIL(atomic_load(&txh.started), 10000);
    CHECK(atomic_load(&txh.started));
    uuid_unparse_lower(lost_id, text);
    t_exec(pg, "SELECT mq_delete(ARRAY['%s'::uuid])", text);
    WAIT_UNTIL(t_stats(r).failed > failed_before, 10000);
    CHECK_INT(t_stats(r).failed, failed_before + 1);
    CHECK_INT(t_stats(r).processed, 1);
    CHECK_INT(effects_of(lost_id), 0);

    t_runner_stop(&b);
    pqmq_runner_free(r);
    t_exec(pg, "DROP TRIGGER rt_log_delete ON mq_rows");
    t_exec(pg, "DROP TRIGGER rt_log_done ON mq_done");
    t_exec(pg, "DROP FUNCTION rt_log_delete(), rt_log_done()");
    t_exec(pg, "DROP TABLE rt_effects, rt_deleted");
}

/* ---- 6. failure and retry ------------------------------------------------ */

static char boom_seen[256]; /* last_error as the retry saw it */

static int h_boom(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    log_call(arg, job);
    if (pqmq_job_attempt(job) == 1) {
        pqmq_ctx_error(ctx, "boom %d", 7);
        return -1;
    }
    uuid_t id;
    char text[37];
    pqmq_job_id(job, id);
    uuid_unparse_lower(id, text);
    const char *params[1] = {text};
    PGresult *res = PQexecParams(pqmq_ctx_conn(ctx),
                                 "SELECT last_error FROM mq_payloads WHERE id = $1::uuid", 1,
                                 NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
        snprintf(boom_seen, sizeof boom_seen, "%s", PQgetvalue(res, 0, 0));
    PQclear(res);
    return 0;
}

static void test_failure_is_retried(void)
{
    t_truncate();
    log_reset();
    boom_seen[0] = '\0';
    /* Its own channel: no other program's inserts wake this runner, so
     * only the runner itself can bring the retry about. */
    const char *ch = own_channel("fail");
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_set_channels(r, &ch, 1), 0);
    CHECK_INT(pqmq_runner_handle(r, NULL, h_boom, "boom"), 0);
    t_bg b;
    t_runner_start(&b, r);
    settle(r, 300); /* idle: only the insert's notification wakes it */
    uuid_t id;
    put(ch, "f", NULL, 1000, id);
    WAIT_UNTIL(t_stats(r).failed >= 1, 10000);
    CHECK_INT(t_stats(r).failed, 1);
    char err[256];
    last_error_of(id, err, sizeof err);
    if (err[0]) /* else the retry already completed it */
        CHECK_STR(err, "boom 7");
    /* Retried after its 1 s backoff (not only after some later wake-up). */
    WAIT_UNTIL(t_stats(r).processed >= 1, 10000);
    t_runner_stop(&b);
    CHECK_INT(t_stats(r).processed, 1);
    CHECK_INT(log_count(), 2);
    if (log_count() == 2) {
        CHECK_INT(calls[0].attempt, 1);
        CHECK_INT(calls[1].attempt, 2);
        long long gap = (calls[1].start_us - calls[0].start_us) / 1000;
        printf("    retried %lld ms after the failure (backoff 1000 ms)\n", gap);
        CHECK(gap >= 800);
        CHECK(gap < 5000);
    }
    CHECK_STR(boom_seen, "boom 7");
    CHECK_INT(msgs_left(), 0);
    pqmq_runner_free(r);
}

/* ---- 7. graceful stop ----------------------------------------------------- */

static atomic_int gs_started, gs_finished, gs_stopping;

static int h_graceful(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    log_call(arg, job);
    atomic_fetch_add(&gs_started, 1);
    t_sleep_ms(500);
    atomic_fetch_add(&gs_stopping, pqmq_ctx_stopping(ctx) != 0);
    atomic_fetch_add(&gs_finished, 1);
    return 0;
}

static pqmq_runner *volatile g_runner; /* for the signal handler */

static void on_sigusr1(int sig)
{
    (void)sig;
    pqmq_runner_stop(g_runner);
}

static void test_graceful_stop(void)
{
    t_truncate();
    log_reset();
    atomic_store(&gs_started, 0);
    atomic_store(&gs_finished, 0);
    atomic_store(&gs_stopping, 0);
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_set_concurrency(r, 4), 0);
    CHECK_INT(pqmq_runner_handle(r, NULL, h_graceful, "g"), 0);
    put_n("stop", "g", 4, 10000, NULL);
    t_bg b;
    t_runner_start(&b, r);
    WAIT_UNTIL(atomic_load(&gs_started) == 4, 10000);
    CHECK_INT(atomic_load(&gs_started), 4);
    CHECK_INT(t_stats(r).in_flight, 4);
    pqmq_runner_stop(r);
    put_n("stop", "g", 2, 10000, NULL); /* after the stop: not picked up */
    t_runner_join(&b, 15000);
    int finished_at_return = atomic_load(&gs_finished);
    CHECK_INT(b.rc, 0);
    CHECK_INT(finished_at_return, 4);
    CHECK_INT(atomic_load(&gs_stopping), 4);
    CHECK_INT(log_count(), 4);
    CHECK_INT(t_stats(r).processed, 4);
    CHECK_INT(t_stats(r).in_flight, 0);
    CHECK_INT(msgs_left(), 2); /* only the two inserted after the stop */
    pqmq_runner_free(r);

    /* A signal handler may stop a runner: to its thread and to another. */
    t_truncate();
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigusr1;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, &old);
    for (int to_runner = 1; to_runner >= 0; to_runner--) {
        r = t_runner();
        CHECK_INT(pqmq_runner_handle(r, NULL, h_record, "s"), 0);
        g_runner = r;
        t_runner_start(&b, r);
        settle(r, 200);
        if (to_runner)
            pthread_kill(b.thread, SIGUSR1);
        else
            raise(SIGUSR1);
        if (t_runner_join(&b, 10000) == 0)
            CHECK_INT(b.rc, 0);
        g_runner = NULL;
        pqmq_runner_free(r);
    }
    sigaction(SIGUSR1, &old, NULL);
}

/* ---- 8. stop notification ------------------------------------------------- */

static void test_stop_notification(void)
{
    t_truncate();
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_handle(r, NULL, h_record, "n"), 0);
    /* Notification channels are per database: a name of its own, so that a
     * test program running beside this one cannot stop it. */
    const char *stop = own_channel("stop_here");
    CHECK_INT(pqmq_runner_set_stop_channel(r, stop), 0);
    t_bg b;
    t_runner_start(&b, r);
    settle(r, 200);
    PGconn *other = t_pg();
    int64_t t0 = t_now_ms();
    t_exec(other, "SELECT pg_notify('%s', '')", stop);
    PQfinish(other);
    if (t_runner_join(&b, 10000) == 0) {
        printf("    stopped %lld ms after the notification\n", (long long)(t_now_ms() - t0));
        CHECK_INT(b.rc, 0);
    }
    CHECK(t_stats(r).wakeups >= 1);
    pqmq_runner_free(r);
}

/* ---- 9. reconnect ---------------------------------------------------------- */

static atomic_int rc_sleep_ms, rc_started, rc_tx;

/* Plain (rc_tx 0): sleeps. Transactional: writes its effect in the job's
 * transaction, then sleeps (so a kill can land inside the transaction). */
static int h_reconn(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    log_call(arg, job);
    atomic_fetch_add(&rc_started, 1);
    if (atomic_load(&rc_tx)) {
        PGconn *conn = pqmq_ctx_begin(ctx);
        if (!conn) {
            pqmq_ctx_error(ctx, "pqmq_ctx_begin returned NULL");
            return -1;
        }
        uuid_t id;
        char text[37];
        pqmq_job_id(job, id);
        uuid_unparse_lower(id, text);
        const char *params[1] = {text};
        PGresult *res = PQexecParams(conn, "INSERT INTO rt_once (msg_id) VALUES ($1::uuid)", 1,
                                     NULL, params, NULL, NULL, 0);
        int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
        if (!ok)
            pqmq_ctx_error(ctx, "insert: %s", PQerrorMessage(conn));
        PQclear(res);
        if (!ok)
            return -1;
    }
    t_sleep_ms(atomic_load(&rc_sleep_ms));
    return 0;
}

static long long terminate_app(const char *app)
{
    return t_sql_int(pg,
                     "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                     "WHERE application_name = '%s'",
                     app);
}

/* Waits until every one of ids was handled and the queue is empty; returns
 * how many were never handled, and counts redeliveries in *dups. */
static int wait_all_handled(const uuid_t *ids, int n, int *dups)
{
    int lost = n;
    for (int64_t end = t_now_ms() + 30000; t_now_ms() < end; t_sleep_ms(50)) {
        lost = 0;
        for (int i = 0; i < n; i++)
            lost += calls_for(ids[i]) == 0;
        if (!lost && msgs_left() == 0)
            break;
    }
    *dups = 0;
    for (int i = 0; i < n; i++)
        *dups += calls_for(ids[i]) > 1 ? calls_for(ids[i]) - 1 : 0;
    return lost;
}

static void test_reconnect(void)
{
    if (t_pooled()) {
        /* It finds the runner's backends by application_name, which a
         * pooler's server connections do not carry. */
        printf("    skipped behind a pooler\n");
        return;
    }
    t_truncate();
    log_reset();
    t_exec(pg, "CREATE TABLE rt_once (msg_id uuid PRIMARY KEY)");
    char app[64];
    snprintf(app, sizeof app, "pqmq_trun_%ld", (long)getpid());
    pqmq_runner *r = t_runner_app(app);
    CHECK_INT(pqmq_runner_set_concurrency(r, 4), 0);
    CHECK_INT(pqmq_runner_handle(r, NULL, h_reconn, "r"), 0);
    atomic_store(&rc_sleep_ms, 0);
    atomic_store(&rc_tx, 0);
    t_bg b;
    t_runner_start(&b, r);
    settle(r, 300);

    /* Every backend dies while the runner is idle. */
    long long killed = terminate_app(app);
    printf("    terminated %lld idle backends (1 control + 4 workers)\n", killed);
    CHECK_INT(killed, 5);
    t_sleep_ms(300);
    enum { N = 20 };
    uuid_t ids[N];
    put_n("re", "r", N, 0, ids);
    WAIT_UNTIL(t_stats(r).processed >= N, 20000);
    CHECK_INT(t_stats(r).processed, N);
    for (int i = 0; i < N; i++)
        CHECK_INT(calls_for(ids[i]), 1);
    CHECK_INT(msgs_left(), 0);
    pqmq_runner_stats_t s = t_stats(r);
    printf("    after the idle kill: %llu reconnects\n", (unsigned long long)s.reconnects);
    CHECK(s.reconnects > 0);
    CHECK_INT(s.failed, 0);

    /* Again, with transactional handlers: a worker whose backend died while
     * it was idle must not fail its next job for it. */
    log_reset();
    atomic_store(&rc_tx, 1);
    t_sleep_ms(200);
    killed = terminate_app(app);
    CHECK(killed >= 1);
    t_sleep_ms(300);
    put_n("re", "r", N, 0, ids);
    WAIT_UNTIL(t_stats(r).processed >= 2 * N, 20000);
    s = t_stats(r);
    printf("    transactional after the idle kill: processed %llu, failed %llu\n",
           (unsigned long long)s.processed - N, (unsigned long long)s.failed);
    CHECK_INT(s.processed, 2 * N);
    CHECK_INT(s.failed, 0);
    for (int i = 0; i < N; i++)
        CHECK_INT(calls_for(ids[i]), 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rt_once"), N);
    CHECK_INT(msgs_left(), 0);

    /* Every backend dies while handlers run: plain, then transactional. */
    for (int tx = 0; tx <= 1; tx++) {
        log_reset();
        t_exec(pg, "TRUNCATE rt_once");
        atomic_store(&rc_tx, tx);
        atomic_store(&rc_sleep_ms, 200);
        atomic_store(&rc_started, 0);
        uint64_t reconnects = t_stats(r).reconnects;
        put_n("re", "r", N, 0, ids);
        WAIT_UNTIL(atomic_load(&rc_started) >= 1, 10000);
        t_sleep_ms(50);
        killed = terminate_app(app);
        int dups = 0;
        int lost = wait_all_handled(ids, N, &dups);
        s = t_stats(r);
        printf("    %s handlers, killed %lld busy backends: %d lost, %d redelivered, "
               "%llu reconnects\n",
               tx ? "transactional" : "plain", killed, lost, dups,
               (unsigned long long)(s.reconnects - reconnects));
        CHECK_INT(killed, 5);
        CHECK_INT(lost, 0);
        CHECK_INT(msgs_left(), 0);
        CHECK(s.reconnects > reconnects);
        if (tx) /* each effect exactly once, whatever was redelivered */
            CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rt_once"), N);
    }
    t_runner_stop(&b);
    CHECK_INT(t_stats(r).in_flight, 0);
    pqmq_runner_free(r);
    t_exec(pg, "DROP TABLE rt_once");
}

/* ---- 10. statistics --------------------------------------------------------- */

static int h_stats(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)ctx, (void)arg;
    if (!strcmp(pqmq_job_name(job), "slow"))
        t_sleep_ms(400);
    return strcmp(pqmq_job_name(job), "bad") ? 0 : -1;
}

static void test_stats(void)
{
    t_truncate();
    const char *ch = own_channel("stats");
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_set_channels(r, &ch, 1), 0);
    CHECK_INT(pqmq_runner_handle(r, NULL, h_stats, NULL), 0);
    pqmq_runner_stats_t s = t_stats(r);
    CHECK(s.processed == 0 && s.failed == 0 && s.in_flight == 0 && s.polls == 0 &&
          s.wakeups == 0 && s.reconnects == 0);
    t_bg b;
    t_runner_start(&b, r);
    settle(r, 200);
    s = t_stats(r);
    CHECK_INT(s.wakeups, 0);
    CHECK_INT(s.processed, 0);
    uint64_t polls0 = s.polls;

    put(ch, "slow", NULL, 60000, NULL);
    WAIT_UNTIL(t_stats(r).in_flight == 1, 10000);
    CHECK_INT(t_stats(r).in_flight, 1);
    WAIT_UNTIL(t_stats(r).processed == 1, 10000);
    put_n(ch, "good", 5, 60000, NULL);
    put_n(ch, "bad", 2, 60000, NULL);
    WAIT_UNTIL(t_stats(r).processed == 6 && t_stats(r).failed == 2, 10000);
    t_runner_stop(&b);
    s = t_stats(r);
    printf("    processed %llu, failed %llu, polls %llu, wake-ups %llu, reconnects %llu\n",
           (unsigned long long)s.processed, (unsigned long long)s.failed,
           (unsigned long long)s.polls, (unsigned long long)s.wakeups,
           (unsigned long long)s.reconnects);
    CHECK_INT(s.processed, 6);
    CHECK_INT(s.failed, 2);
    CHECK_INT(s.in_flight, 0);
    CHECK(s.polls > polls0);
    CHECK(s.wakeups >= 3); /* one per insert statement at least */
    CHECK_INT(s.reconnects, 0);
    CHECK_INT(msgs_left(), 2); /* the failed ones wait for their retry */
    pqmq_runner_free(r);
}

/* ---- 11. bad arguments --------------------------------------------------------- */

static void test_bad_arguments(void)
{
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_run(r), PQMQ_EINVAL);
    if (!strstr(pqmq_runner_errmsg(r), "no handler"))
        t_fail(__FILE__, __LINE__, "errmsg \"%s\" lacks \"no handler\"", pqmq_runner_errmsg(r));

    CHECK_INT(pqmq_runner_set_concurrency(r, 0), PQMQ_EINVAL);
    CHECK_INT(pqmq_runner_set_concurrency(r, 257), PQMQ_EINVAL);
    CHECK_INT(pqmq_runner_set_concurrency(r, 256), 0);
    CHECK_INT(pqmq_runner_set_concurrency(r, 1), 0);
    CHECK_INT(pqmq_runner_set_batch(r, 0), PQMQ_EINVAL);
    CHECK_INT(pqmq_runner_set_batch(r, PQMQ_MAX_BATCH + 1), PQMQ_EINVAL);
    CHECK_INT(pqmq_runner_set_batch(r, PQMQ_MAX_BATCH), 0);
    CHECK_INT(pqmq_runner_set_keep_alive(r, -1), PQMQ_EINVAL);
    CHECK_INT(pqmq_runner_set_stop_channel(r, ""), PQMQ_EINVAL);
    CHECK_INT(pqmq_runner_set_stop_channel(r, "a_stop_channel_name_that_is_longer_than_"
                                              "the_63_bytes_postgres_allows"),
              PQMQ_EINVAL);
    CHECK_INT(pqmq_runner_set_keep_alive(r, 0), 0);
    CHECK_INT(pqmq_runner_handle(r, "x", NULL, NULL), PQMQ_EINVAL);
    const char *null_name[] = {NULL};
    CHECK_INT(pqmq_runner_set_channels(r, null_name, 1), PQMQ_EINVAL);
    CHECK_INT(pqmq_runner_set_channels(r, NULL, 1), PQMQ_EINVAL);
    CHECK_INT(pqmq_runner_set_concurrency(NULL, 4), PQMQ_EINVAL);
    CHECK_INT(pqmq_runner_run(NULL), PQMQ_EINVAL);
    pqmq_runner_stop(NULL);
    pqmq_runner_free(NULL);
    pqmq_runner_free(r);

    /* A server that is not there. */
    r = pqmq_runner_new("host=/nonexistent-pqmq-socket-dir port=1 connect_timeout=2");
    CHECK(r != NULL);
    CHECK_INT(pqmq_runner_handle(r, NULL, h_record, NULL), 0);
    CHECK_INT(pqmq_runner_run(r), PQMQ_ECONN);
    CHECK(pqmq_runner_errmsg(r)[0] != '\0');
    printf("    bad conninfo: %s\n", pqmq_runner_errmsg(r));
    pqmq_runner_free(r);
}

/* ---- 12. checkpoint from a handler, batch size ------------------------- */

static atomic_int cp_calls;
static char cp_second_json[64];

/* First attempt: saves progress and one extra retry, then fails. The retry
 * must see the saved payload. */
static int h_checkpoint(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)arg;
    if (atomic_fetch_add(&cp_calls, 1) == 0) {
        if (pqmq_ctx_checkpoint(ctx, "{\"step\": 1}", NULL, 0, 1) != 0)
            return -1;
        pqmq_ctx_error(ctx, "stopped after step 0");
        return -1;
    }
    snprintf(cp_second_json, sizeof cp_second_json, "%s",
             pqmq_job_json(job) ? pqmq_job_json(job) : "(none)");
    return 0;
}

static void test_checkpoint_from_handler(void)
{
    t_truncate();
    atomic_store(&cp_calls, 0);
    const char *ch = own_channel("cp");
    pqmq_msg *m = t_msg(ch, NULL, "cp", "{\"step\": 0}", 0);
    pqmq_msg_set_retries(m, 0); /* one delivery, unless a checkpoint adds */
    pqmq_msg_set_backoff(m, 200);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    pqmq_msg_free(m);
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_handle(r, "cp", h_checkpoint, NULL), 0);
    CHECK_INT(pqmq_runner_set_channels(r, &ch, 1), 0);
    t_runner_process(r, 1, 15000);
    CHECK_INT(atomic_load(&cp_calls), 2);
    CHECK_STR(cp_second_json, "{\"step\": 1}");
    CHECK_INT(msgs_left(), 0);
    pqmq_runner_free(r);
}

static void test_batch_size_bounds_claims(void)
{
    t_truncate();
    const char *ch = own_channel("batch");
    put_n(ch, "n", 24, 60000, NULL);
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_handle(r, NULL, h_record, "*"), 0);
    CHECK_INT(pqmq_runner_set_channels(r, &ch, 1), 0);
    CHECK_INT(pqmq_runner_set_concurrency(r, 8), 0);
    CHECK_INT(pqmq_runner_set_batch(r, 2), 0);
    t_runner_process(r, 24, 15000);
    CHECK_INT(t_stats(r).processed, 24);
    /* At most two claimed per poll: at least twelve polls. */
    CHECK(t_stats(r).polls >= 12);
    pqmq_runner_free(r);
}

/* ---- 13. stopping releases queued jobs ---------------------------------- */

static atomic_int rel_started;

static int h_slow_one(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)ctx, (void)job, (void)arg;
    atomic_fetch_add(&rel_started, 1);
    t_sleep_ms(300);
    return 0;
}

static void test_stop_releases_queued_jobs(void)
{
    t_truncate();
    atomic_store(&rel_started, 0);
    const char *ch = own_channel("rel");
    put_n(ch, "n", 5, 60000, NULL); /* leases far longer than the test */
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_handle(r, NULL, h_slow_one, NULL), 0);
    CHECK_INT(pqmq_runner_set_channels(r, &ch, 1), 0);
    CHECK_INT(pqmq_runner_set_concurrency(r, 1), 0);
    CHECK_INT(pqmq_runner_set_batch(r, 10), 0); /* claims all 5, runs one */
    t_bg b;
    t_runner_start(&b, r);
    WAIT_UNTIL(atomic_load(&rel_started) >= 1, 10000);
    t_runner_stop(&b);
    CHECK_INT(atomic_load(&rel_started), 1);
    CHECK_INT(msgs_left(), 4);
    /* The four never started are ready now, their attempt refunded. */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE deliveries = 0 "
                            "AND attempt_at <= clock_timestamp()"),
              4);
    pqmq_batch *got = NULL;
    CHECK_OK(q, pqmq_poll(q, &ch, 1, 10, &got));
    CHECK_INT(pqmq_batch_count(got), 4);
    CHECK_INT(pqmq_job_attempt(pqmq_batch_job(got, 0)), 1);
    pqmq_batch_free(got);
    pqmq_runner_free(r);
}

/* ---- 14. completions are batched ---------------------------------------- */

/* Calls of the queue schema's function fn, over all sessions. */
static long long function_calls(const char *fn)
{
    t_exec(pg, "SELECT pg_stat_clear_snapshot()");
    return t_sql_int(pg,
                     "SELECT COALESCE(sum(calls), 0) FROM pg_stat_user_functions "
                     "WHERE schemaname = current_schema() AND funcname = '%s'",
                     fn);
}

/* More jobs than a batch: after the first full poll, what the workers
 * finished is completed in the statement of the next poll. */
static void test_completions_are_batched(void)
{
    enum { JOBS = 250 };
    if (t_pooled()) {
        /* It counts calls with track_functions, set in the startup
         * options, which a pooler drops. */
        printf("    skipped behind a pooler\n");
        return;
    }
    t_truncate();
    const char *ch = own_channel("batched");
    put_n(ch, "n", JOBS, 60000, NULL);
    /* The runner's sessions count their function calls (superuser GUC). */
    char *ci = NULL;
    if (asprintf(&ci,
                 "%s options='-c search_path=%s -c client_min_messages=warning "
                 "-c track_functions=pl'",
                 t_dsn(), t_schema()) < 0)
        abort();
    pqmq_runner *r = pqmq_runner_new(ci);
    free(ci);
    CHECK_INT(pqmq_runner_handle(r, NULL, h_record, "*"), 0);
    CHECK_INT(pqmq_runner_set_channels(r, &ch, 1), 0);
    long long before = function_calls("mq_complete"); /* earlier tests' sessions */
    long long before_cp = function_calls("mq_complete_claim");
    t_runner_process(r, JOBS, 15000); /* its sessions end and flush their counters */
    CHECK_INT(t_stats(r).processed, JOBS);
    long long calls = 0, with_poll = 0;
    for (int64_t end = t_now_ms() + 5000; t_now_ms() < end && calls == 0; t_sleep_ms(50)) {
        calls = function_calls("mq_complete") - before;
        with_poll = function_calls("mq_complete_claim") - before_cp;
    }
    printf("    %d jobs completed in %lld mq_complete calls, %lld of them in a poll's "
           "statement\n",
           JOBS, calls, with_poll);
    CHECK(calls >= 1);
    CHECK(calls < JOBS / 4); /* one statement per loop turn, not one per job */
    CHECK(with_poll >= 1);
    pqmq_runner_free(r);
}

/* A finished job's completion rides with the next claim, but does not wait
 * for it long: with the queue full of slow jobs (no room to claim), the
 * fast one is completed within DONE_WAIT_MS (20 ms), not when room comes. */
static int h_fast_or_slow(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)ctx, (void)arg;
    /* The fast one finishes once all four are claimed and the queue is full. */
    t_sleep_ms(strcmp(pqmq_job_name(job), "slow") ? 300 : 3000);
    return 0;
}

static void test_completion_waits_briefly_for_a_claim(void)
{
    t_truncate();
    const char *ch = own_channel("donewait");
    uuid_t fast;
    put(ch, "fast", NULL, 60000, fast);
    for (int i = 0; i < 3; i++)
        put(ch, "slow", NULL, 60000, NULL);
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_handle(r, NULL, h_fast_or_slow, NULL), 0);
    CHECK_INT(pqmq_runner_set_channels(r, &ch, 1), 0);
    CHECK_INT(pqmq_runner_set_concurrency(r, 1), 0);
    CHECK_INT(pqmq_runner_set_batch(r, 2), 0); /* room for 4: all claimed, none free */
    t_bg b;
    t_runner_start(&b, r);
    char id[37];
    uuid_unparse_lower(fast, id);
    int64_t t0 = t_now_ms();
    WAIT_UNTIL(t_stats(r).processed >= 1, 2500);
    int64_t took = t_now_ms() - t0;
    CHECK_INT(t_stats(r).processed, 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE id = '%s'", id), 0);
    printf("    the fast job was completed after %lld ms, the slow ones still run\n",
           (long long)took);
    CHECK(took < 2500); /* the first slow job ends at 3 s */
    t_runner_stop(&b);
    pqmq_runner_free(r);
}

/* ---- a client encoding other than the server's ------------------------- */

/* A channel name that fits a notify channel in LATIN1 (1 byte per "é") but
 * not in the server's UTF-8 (2 bytes each): the server notifies only "mq"
 * for it, so a LATIN1 runner must listen there, or it sleeps through the
 * insert until its one-minute safety poll. */
static void test_non_utf8_client_is_woken(void)
{
    t_truncate();
    char utf8[128], latin1[128];
    int n = snprintf(utf8, sizeof utf8, "%s", own_channel("x"));
    snprintf(latin1, sizeof latin1, "%s", utf8);
    int m = n;
    while (n < 80) { /* 2 bytes per character in UTF-8, 1 in LATIN1 */
        utf8[n++] = (char)0xc3;
        utf8[n++] = (char)0xa9;
        latin1[m++] = (char)0xe9;
    }
    utf8[n] = latin1[m] = '\0';
    CHECK(m <= 60);
    char *ci = t_conninfo(NULL, NULL, NULL), *latin = NULL;
    if (asprintf(&latin, "%s client_encoding=LATIN1", ci) < 0)
        abort();
    free(ci);
    pqmq_runner *r = pqmq_runner_new(latin);
    free(latin);
    /* Behind a pooler the runner LISTENs on a direct connection: in the
     * same encoding. */
    const char *listen = getenv("PQMQ_TEST_LISTEN_DSN");
    if (listen) {
        char *direct = NULL;
        if (asprintf(&direct, "%s client_encoding=LATIN1", listen) < 0)
            abort();
        CHECK_INT(pqmq_runner_set_listen_dsn(r, direct), 0);
        free(direct);
    }
    const char *filter = latin1;
    CHECK_INT(pqmq_runner_set_channels(r, &filter, 1), 0);
    CHECK_INT(pqmq_runner_handle(r, NULL, h_record, "*"), 0);
    t_bg b;
    t_runner_start(&b, r);
    settle(r, 300);
    put(utf8, "n", NULL, 0, NULL); /* inserted by a UTF-8 client */
    WAIT_UNTIL(t_stats(r).processed >= 1, 5000);
    CHECK_INT(t_stats(r).processed, 1);
    CHECK(t_stats(r).wakeups >= 1);
    t_runner_stop(&b);
    pqmq_runner_free(r);
    CHECK_INT(msgs_left(), 0);
}

/* ---- 16. queued jobs are kept alive too ---------------------------------- */

/* One thread, two 3-second jobs on 1-second leases: the second waits 3 s in
 * the runner's queue, and its lease must not run out meanwhile. */
static void test_keep_alive_covers_queued_jobs(void)
{
    t_truncate();
    atomic_store(&ka_calls, 0);
    atomic_store(&ka_attempt, 0);
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_handle(r, NULL, h_long, NULL), 0);
    CHECK_INT(pqmq_runner_set_concurrency(r, 1), 0);
    put("kq", "long", NULL, 1000, NULL);
    put("kq", "long", NULL, 1000, NULL);
    t_bg b;
    t_runner_start(&b, r);
    WAIT_UNTIL(atomic_load(&ka_calls) >= 1, 10000);
    CHECK_INT(t_stats(r).in_flight, 2); /* one running, one queued */
    pqmq_client *other = t_client();
    int stolen = 0;
    for (int64_t end = t_now_ms() + 2500; t_now_ms() < end; t_sleep_ms(100)) {
        pqmq_batch *batch = NULL;
        CHECK_OK(other, pqmq_poll(other, NULL, 0, 10, &batch));
        stolen += (int)pqmq_batch_count(batch);
        pqmq_batch_free(batch);
    }
    pqmq_client_free(other);
    WAIT_UNTIL(t_stats(r).processed >= 2, 10000);
    t_runner_stop(&b);
    CHECK_INT(stolen, 0);
    CHECK_INT(atomic_load(&ka_calls), 2);
    CHECK_INT(atomic_load(&ka_attempt), 1); /* the queued one: first delivery */
    CHECK_INT(t_stats(r).processed, 2);
    CHECK_INT(msgs_left(), 0);
    pqmq_runner_free(r);
}

/* ---- 15. a notification that arrives with a query's result ------------- */

/* A notification sent while the runner's statement runs reaches libpq with
 * that statement's result, not on its own: poll(2) on the socket would not
 * see it (the runner would sleep up to a minute). Its first poll is held on
 * a lock while the stop notification is sent; it must stop at once. */
static void test_notification_behind_a_result_is_not_slept_on(void)
{
    t_truncate();
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_handle(r, NULL, h_record, "n"), 0);
    const char *stop = own_channel("stop_behind");
    CHECK_INT(pqmq_runner_set_stop_channel(r, stop), 0);
    PGconn *locker = t_pg();
    t_exec(locker, "BEGIN");
    t_exec(locker, "LOCK TABLE mq_msgs IN ACCESS EXCLUSIVE MODE");
    t_bg b;
    t_runner_start(&b, r);
    /* A lock on the view mq_msgs locks the tables beneath it, which a poll
     * reads. */
    const char *waiting = "SELECT count(*) FROM pg_locks "
                          "WHERE NOT granted AND relation IN ('mq_rows'::regclass, "
                          "'mq_log'::regclass, 'mq_receipts'::regclass, 'mq_done'::regclass, "
                          "'mq_log_gone'::regclass)";
    WAIT_UNTIL(t_sql_int(pg, "%s", waiting) > 0, 10000);
    CHECK(t_sql_int(pg, "%s", waiting) > 0); /* its poll waits for the lock */
    t_exec(pg, "SELECT pg_notify('%s', '')", stop);
    int64_t t0 = t_now_ms();
    t_exec(locker, "COMMIT"); /* the poll ends; the notification rides with it */
    if (t_runner_join(&b, 10000) == 0) {
        printf("    stopped %lld ms after its poll returned\n", (long long)(t_now_ms() - t0));
        CHECK_INT(b.rc, 0);
    }
    PQfinish(locker);
    pqmq_runner_free(r);
}

int main(void)
{
    t_init("runner");
    q = t_client();
    pg = t_pg();
    T_RUN(test_dispatch_by_name);
    T_RUN(test_concurrency_limit);
    T_RUN(test_wakeup_latency_and_idle);
    T_RUN(test_keep_alive);
    T_RUN(test_transactional_completion);
    T_RUN(test_failure_is_retried);
    T_RUN(test_graceful_stop);
    T_RUN(test_stop_notification);
    T_RUN(test_reconnect);
    T_RUN(test_stats);
    T_RUN(test_bad_arguments);
    T_RUN(test_checkpoint_from_handler);
    T_RUN(test_batch_size_bounds_claims);
    T_RUN(test_stop_releases_queued_jobs);
    T_RUN(test_completions_are_batched);
    T_RUN(test_completion_waits_briefly_for_a_claim);
    T_RUN(test_notification_behind_a_result_is_not_slept_on);
    T_RUN(test_keep_alive_covers_queued_jobs);
    T_RUN(test_non_utf8_client_is_woken);
    pqmq_client_free(q);
    PQfinish(pg);
    return t_done();
}
