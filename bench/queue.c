/*
 * queue.c: the pqmq side of the benchmark. Producers insert batches with
 * pqmq_insert; consumers drain them either with pqmq_runner (a trivial
 * handler) or with the polling API (pqmq_complete_and_poll: each call completes the last batch
 * and polls the next); an idle runner receives single messages for the latency figures.
 *
 * Every phase connects first and starts its clock only when all its
 * clients are connected. Nothing here keeps per-message state beyond one
 * batch (the latency samples are bounded by --latency-samples).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "load_ops.h"
#include "options.h"
#include "progress.h"
#include "queue.h"
#include "results.h"
#include "util.h"

#define STALL_S 60.0 /* a phase that makes no progress this long is broken */

void queue_setup(PGconn *admin, const struct opts *o)
{
    bench_sql(admin, "DROP SCHEMA IF EXISTS " BENCH_SCHEMA " CASCADE");
    bench_sql(admin, "CREATE SCHEMA " BENCH_SCHEMA);
    pqmq_client *c = bench_client(o);
    if (pqmq_migrate(c))
        die("migrate: %s", pqmq_errmsg(c));
    pqmq_client_free(c);
}

void queue_reset(PGconn *admin)
{
    bench_sql(admin, "TRUNCATE mq_rows, mq_chains, mq_log, mq_cursors, mq_cursor_keys, "
                     "mq_receipts, mq_done, mq_log_gone");
}

/* ---- enqueue ----------------------------------------------------------- */

struct producer {
    const struct opts *o;
    const struct shape *s;
    pthread_barrier_t *start;
    atomic_long *next_batch, *done;
    long nbatches;
    int group; /* batches per call: 1, pqmq_insert; more, pqmq_insert_batches */
};

void queue_fill_batch(const struct opts *o, const struct shape *s, long first, int k,
                      pqmq_msg **msgs, char *json)
{
    size_t cap = bench_payload_cap(o->payload_bytes);
    for (int i = 0; i < k; i++) {
        long seq = first + i;
        char args[24];
        snprintf(args, sizeof args, "c%ld", seq % s->channels);
        bench_payload(json, cap, seq, 0, o->payload_bytes);
        pqmq_msg *m = msgs[i] = pqmq_msg_new();
        if (!m || pqmq_msg_set_channel(m, BENCH_CHANNEL, args) ||
            pqmq_msg_set_name(m, "work") || pqmq_msg_set_json(m, json) ||
            pqmq_msg_set_backoff(m, 600000) || /* no redelivery mid-run */
            pqmq_msg_set_ordered(m, shape_ordered(s, seq)) ||
            (s->priorities > 0 && pqmq_msg_set_priority(m, (int)(seq % s->priorities))))
            die("out of memory");
    }
}

static void *producer_main(void *arg)
{
    struct producer *p = arg;
    const struct opts *o = p->o;
    pqmq_client *c = bench_client(o);
    size_t per = (size_t)o->batch, g = (size_t)p->group;
    pqmq_msg **msgs = calloc(g * per, sizeof *msgs);
    pqmq_msg *const **batches = calloc(g, sizeof *batches);
    size_t *counts = calloc(g, sizeof *counts);
    char *json = malloc(bench_payload_cap(o->payload_bytes));
    if (!msgs || !batches || !counts || !json)
        die("out of memory");
    pthread_barrier_wait(p->start);
    for (;;) {
        long b = atomic_fetch_add(p->next_batch, p->group);
        if (b >= p->nbatches)
            break;
        size_t nb = 0, total = 0;
        for (; nb < g && b + (long)nb < p->nbatches; nb++) {
            long first = (b + (long)nb) * o->batch;
            int k = o->messages - first < o->batch ? (int)(o->messages - first) : o->batch;
            queue_fill_batch(o, p->s, first, k, msgs + nb * per, json);
            batches[nb] = msgs + nb * per;
            counts[nb] = (size_t)k;
            total += (size_t)k;
        }
        int rc = g == 1 ? pqmq_insert(c, msgs, counts[0])
                        : pqmq_insert_batches(c, batches, counts, nb, NULL);
        if (rc)
            die("pqmq_insert: %s", pqmq_errmsg(c));
        for (size_t k = 0; k < nb; k++)
            for (size_t i = 0; i < counts[k]; i++)
                pqmq_msg_free(msgs[k * per + i]);
        atomic_fetch_add(p->done, (long)total);
    }
    free(json);
    free(counts);
    free(batches);
    free(msgs);
    pqmq_client_free(c);
    return NULL;
}

static double enqueue_with(const struct opts *o, const struct shape *s, const char *label,
                           int group)
{
    int n = o->producers;
    struct producer *ps = calloc((size_t)n, sizeof *ps);
    pthread_barrier_t start;
    atomic_long next_batch = 0, done = 0;
    if (!ps)
        die("out of memory");
    pthread_barrier_init(&start, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++)
        ps[i] = (struct producer){
            o, s, &start, &next_batch, &done, (o->messages + o->batch - 1) / o->batch, group};
    double t = bench_timed_threads(n, producer_main, ps, sizeof *ps, &start, label, o->messages,
                                   &done);
    pthread_barrier_destroy(&start);
    free(ps);
    return t;
}

double queue_enqueue(const struct opts *o, const struct shape *s, const char *label)
{
    return enqueue_with(o, s, label, 1);
}

double queue_enqueue_pipelined(const struct opts *o, const struct shape *s, const char *label)
{
    return enqueue_with(o, s, label, BENCH_PIPELINE);
}

/* ---- processing with the runner ---------------------------------------- */

/* Handlers wait here until every runner has connected, so the clock starts
 * with all consumers ready. */
struct drain {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    atomic_int open;
    atomic_long handled;
    int record; /* exactly-once: a bench_results row in the job's transaction */
};

/* The backend on which this worker thread's connection prepared the
 * effect's INSERT (a reconnect is a new backend, which prepares it again). */
static _Thread_local int prepared_on;

/* The exactly-once handler's effect (see once.c): its row, in the job's
 * transaction, which the runner commits with the completion. Prepared
 * once per connection, as the poll API's consumers do in once.c, and sent
 * with pqmq_ctx_exec_prepared: the job's savepoint (or BEGIN) goes out in
 * the same round trip. */
static int record_effect(pqmq_ctx *ctx, const pqmq_job *job)
{
    PGconn *conn = pqmq_ctx_conn(ctx);
    if (prepared_on != PQbackendPID(conn)) {
        PGresult *p =
            PQprepare(conn, "record_one",
                      "INSERT INTO bench_results (id, channel) VALUES ($1, $2)", 2, NULL);
        int ok = PQresultStatus(p) == PGRES_COMMAND_OK;
        PQclear(p);
        if (!ok)
            return -1;
        prepared_on = PQbackendPID(conn);
    }
    uuid_t id;
    char text[37];
    pqmq_job_id(job, id);
    uuid_unparse_lower(id, text);
    const char *v[2] = {text, pqmq_job_args(job)};
    PGresult *r = pqmq_ctx_exec_prepared(ctx, "record_one", 2, v);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    return ok ? 0 : -1;
}

static void wait_open(struct drain *d)
{
    if (!atomic_load(&d->open)) {
        pthread_mutex_lock(&d->lock);
        while (!atomic_load(&d->open))
            pthread_cond_wait(&d->cond, &d->lock);
        pthread_mutex_unlock(&d->lock);
    }
}

static int drain_handler(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    struct drain *d = arg;
    wait_open(d);
    atomic_fetch_add(&d->handled, 1);
    return d->record ? record_effect(ctx, job) : 0;
}

/* The exactly-once runner's group handler (commit batches): the rows of
 * all its jobs in one statement, as the poll API's consumer writes its
 * batch's (once.c), in their savepoint of the batch's transaction. */
static int drain_group(pqmq_ctx *ctx, const pqmq_job *const *jobs, size_t n, void *arg)
{
    struct drain *d = arg;
    wait_open(d);
    atomic_fetch_add(&d->handled, (long)n);
    /* Elements are uuids and "c<n>": nothing to escape. */
    size_t cap = n * 40 + 4;
    char *ids = malloc(cap), *chans = malloc(cap);
    size_t ni = 0, nc = 0;
    int ok = ids && chans;
    for (size_t i = 0; ok && i < n; i++) {
        uuid_t id;
        char text[37];
        pqmq_job_id(jobs[i], id);
        uuid_unparse_lower(id, text);
        ni += (size_t)snprintf(ids + ni, cap - ni, "%s%s", i ? "," : "{", text);
        nc += (size_t)snprintf(chans + nc, cap - nc, "%s\"%s\"", i ? "," : "{",
                               pqmq_job_args(jobs[i]));
        ok = ni + 2 < cap && nc + 2 < cap;
    }
    if (ok) {
        strcpy(ids + ni, "}");
        strcpy(chans + nc, "}");
        const char *v[2] = {ids, chans};
        PGresult *r = pqmq_ctx_exec_params(ctx,
                                           "INSERT INTO bench_results (id, channel)"
                                           " SELECT * FROM unnest($1::uuid[], $2::text[])",
                                           2, v);
        ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
    }
    free(ids);
    free(chans);
    return ok ? 0 : -1;
}

struct runner_thread {
    pqmq_runner *r;
    pthread_t thread;
};

static void *runner_main(void *arg)
{
    struct runner_thread *t = arg;
    if (pqmq_runner_run(t->r))
        die("%s (lower --runner-threads?)", pqmq_runner_errmsg(t->r));
    return NULL;
}

/* commit: commit batches (pqmq_runner_set_commit_batch, its defaults), with
 * a group handler (drain_group) instead of fn. */
static void start_runner(struct runner_thread *t, const struct opts *o, int threads, int batch,
                         int locked, int commit, pqmq_handler fn, void *arg)
{
    t->r = pqmq_runner_new(o->conninfo);
    if (!t->r ||
        (commit ? pqmq_runner_handle_group(t->r, NULL, drain_group, arg)
                : pqmq_runner_handle(t->r, NULL, fn, arg)) ||
        pqmq_runner_set_listen_dsn(t->r, o->listen_dsn))
        die("out of memory");
    if (threads && pqmq_runner_set_concurrency(t->r, threads))
        die("runner threads %d out of range", threads);
    if (batch && pqmq_runner_set_batch(t->r, batch))
        die("batch %d out of range", batch);
    if (pqmq_runner_set_locked(t->r, locked))
        die("pqmq_runner_set_locked failed");
    if (commit && pqmq_runner_set_commit_batch(t->r, 0, 0))
        die("%s", pqmq_runner_errmsg(t->r));
    if (pthread_create(&t->thread, NULL, runner_main, t))
        die("cannot start a thread");
}

/* Waits until the runner has connected its workers and polled once. */
static void wait_started(struct runner_thread *t)
{
    double t0 = now_s();
    pqmq_runner_stats_t st;
    for (;;) {
        pqmq_runner_stats(t->r, &st);
        if (st.polls > 0)
            return;
        if (now_s() - t0 > STALL_S)
            die("a runner did not start within %.0f s", STALL_S);
        sleep_s(0.001);
    }
}

static void stop_runner(struct runner_thread *t)
{
    pqmq_runner_stop(t->r);
    pthread_join(t->thread, NULL);
    pqmq_runner_free(t->r);
}

double queue_drain_runner(const struct opts *o, int threads, const char *label)
{
    return queue_drain_runner_with(o, threads, label, 0, 0);
}

double queue_drain_runner_with(const struct opts *o, int threads, const char *label, int locked,
                               int record)
{
    int n = o->consumers;
    struct drain d = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, record};
    struct runner_thread *ts = calloc((size_t)n, sizeof *ts);
    if (!ts)
        die("out of memory");
    for (int i = 0; i < n; i++)
        start_runner(&ts[i], o, threads, o->batch, locked, record && !locked, drain_handler,
                     &d);
    for (int i = 0; i < n; i++)
        wait_started(&ts[i]);
    PGconn *admin = bench_connect(o); /* (connected before the clock starts) */

    pthread_mutex_lock(&d.lock);
    double t0 = now_s();
    atomic_store(&d.open, 1);
    pthread_cond_broadcast(&d.cond);
    pthread_mutex_unlock(&d.lock);

    /* Done when the completions (not just the handlers) have reached the
     * server: the runner counts a job processed after its mq_complete. */
    atomic_long processed = 0;
    progress_begin(label, o->messages, &processed);
    double last_change = t0;
    long last = 0;
    while (atomic_load(&processed) < o->messages) {
        sleep_s(0.0005);
        long sum = 0, failed = 0;
        for (int i = 0; i < n; i++) {
            pqmq_runner_stats_t st;
            pqmq_runner_stats(ts[i].r, &st);
            sum += (long)st.processed;
            failed += (long)st.failed;
        }
        if (failed)
            die("%s: %ld jobs failed", label, failed);
        atomic_store(&processed, sum);
        double now = now_s();
        if (sum != last) {
            last = sum;
            last_change = now;
        } else if (now - last_change > STALL_S) {
            die("%s: stalled at %ld of %d messages", label, sum, o->messages);
        }
    }
    queue_reclaim_log(admin);
    double t = now_s() - t0;
    progress_end();
    PQfinish(admin);
    for (int i = 0; i < n; i++)
        stop_runner(&ts[i]);
    free(ts);
    return t;
}

void queue_reclaim_log(PGconn *conn)
{
    /* (At most 256 channels a call: until no cursor has work left.) */
    for (int round = 0; round < 1000; round++) {
        PGresult *r = PQexec(conn, "SELECT _mq_log_settle(clock_timestamp(), NULL), "
                                   "(SELECT count(*) FROM mq_cursors c "
                                   " WHERE c.settled < c.place)");
        int left = PQresultStatus(r) == PGRES_TUPLES_OK ? atoi(PQgetvalue(r, 0, 1)) : -1;
        PQclear(r);
        r = PQexec(conn, "SELECT _mq_log_reclaim(NULL), "
                         "(SELECT count(*) FROM mq_cursors c WHERE c.reclaimed < c.settled)");
        if (PQresultStatus(r) != PGRES_TUPLES_OK)
            die("reclaiming the log: %s", PQerrorMessage(conn));
        left += atoi(PQgetvalue(r, 0, 1));
        PQclear(r);
        if (left <= 0)
            return;
    }
}

/* ---- processing with the polling API ----------------------------------- */

struct poller {
    const struct opts *o;
    pthread_barrier_t *start;
    atomic_long *done;
};

static void *poller_main(void *arg)
{
    struct poller *p = arg;
    const struct opts *o = p->o;
    pqmq_client *c = bench_client(o);
    pthread_barrier_wait(p->start);
    double last = now_s();
    pqmq_batch *prev = NULL; /* handled, to be completed with the next poll */
    while (atomic_load(p->done) < o->messages) {
        pqmq_batch *b = NULL;
        int rc;
        if (o->split_complete) {
            rc = pqmq_batch_count(prev) ? pqmq_complete_batch(c, prev) : 0;
            if (rc == 0 || rc == PQMQ_ESTALE)
                rc = pqmq_poll(c, NULL, 0, o->batch, &b);
        } else {
            rc = pqmq_complete_and_poll(c, prev, NULL, 0, o->batch, &b);
        }
        if (rc && rc != PQMQ_ESTALE)
            die("poll API: %s", pqmq_errmsg(c));
        if (pqmq_batch_count(prev))
            atomic_fetch_add(p->done, (long)pqmq_batch_count(prev));
        pqmq_batch_free(prev);
        prev = b;
        if (pqmq_batch_count(b)) {
            last = now_s();
        } else if (now_s() - last > STALL_S) {
            die("poll API drain stalled at %ld of %d messages", atomic_load(p->done),
                o->messages);
        } else {
            sleep_s(0.0005); /* the rest is in flight on other consumers */
        }
    }
    if (pqmq_batch_count(prev) && pqmq_complete_batch(c, prev))
        die("pqmq_complete_batch: %s", pqmq_errmsg(c));
    pqmq_batch_free(prev);
    queue_reclaim_log(pqmq_conn(c));
    pqmq_client_free(c);
    return NULL;
}

/* The locked lane: per batch pqmq_poll_locked (BEGIN and the poll) and
 * pqmq_complete_commit (the completion and COMMIT): two round trips. */
static void *locked_main(void *arg)
{
    struct poller *p = arg;
    const struct opts *o = p->o;
    pqmq_client *c = bench_client(o);
    pthread_barrier_wait(p->start);
    double last = now_s();
    while (atomic_load(p->done) < o->messages) {
        pqmq_batch *b = NULL;
        if (pqmq_poll_locked(c, NULL, 0, o->batch, &b)) /* BEGIN and the poll */
            die("locked lane: %s", pqmq_errmsg(c));
        size_t n = pqmq_batch_count(b);
        if (pqmq_complete_commit(c, b)) /* the completion and COMMIT */
            die("locked lane: %s", pqmq_errmsg(c));
        pqmq_batch_free(b);
        if (n) {
            atomic_fetch_add(p->done, (long)n);
            last = now_s();
        } else if (now_s() - last > STALL_S) {
            die("locked lane drain stalled at %ld of %d messages", atomic_load(p->done),
                o->messages);
        } else {
            sleep_s(0.0005); /* the rest is held by other consumers */
        }
    }
    queue_reclaim_log(pqmq_conn(c));
    pqmq_client_free(c);
    return NULL;
}

static double drain_with(const struct opts *o, void *(*fn)(void *), const char *label)
{
    int n = o->consumers;
    struct poller *ps = calloc((size_t)n, sizeof *ps);
    pthread_barrier_t start;
    atomic_long done = 0;
    if (!ps)
        die("out of memory");
    pthread_barrier_init(&start, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++)
        ps[i] = (struct poller){o, &start, &done};
    double t = bench_timed_threads(n, fn, ps, sizeof *ps, &start, label, o->messages, &done);
    pthread_barrier_destroy(&start);
    free(ps);
    return t;
}

double queue_drain_poll(const struct opts *o, const char *label)
{
    return drain_with(o, poller_main, label);
}

double queue_drain_locked(const struct opts *o, const char *label)
{
    return drain_with(o, locked_main, label);
}

/* ---- under load (load.c) ----------------------------------------------- */

struct load_producer {
    const struct opts *o;
    const struct shape *s;
    pqmq_client *c;
    pqmq_msg **msgs;
    char *json;
};

static void *load_producer_new(const struct opts *o, const struct shape *s)
{
    struct load_producer *p = calloc(1, sizeof *p);
    if (!p)
        die("out of memory");
    *p = (struct load_producer){o, s, bench_client(o), calloc((size_t)o->batch, sizeof(void *)),
                                malloc(bench_payload_cap(o->payload_bytes))};
    if (!p->msgs || !p->json)
        die("out of memory");
    return p;
}

static void load_produce(void *arg, long first, int k)
{
    struct load_producer *p = arg;
    queue_fill_batch(p->o, p->s, first, k, p->msgs, p->json);
    if (pqmq_insert(p->c, p->msgs, (size_t)k))
        die("pqmq_insert: %s", pqmq_errmsg(p->c));
    for (int i = 0; i < k; i++)
        pqmq_msg_free(p->msgs[i]);
}

static void load_producer_free(void *arg)
{
    struct load_producer *p = arg;
    pqmq_client_free(p->c);
    free(p->msgs);
    free(p->json);
    free(p);
}

struct load_consumer {
    pqmq_client *c;
    int batch;
    pqmq_batch *held; /* claimed, to be completed with the next poll */
};

static void *load_consumer_new(const struct opts *o)
{
    struct load_consumer *lc = calloc(1, sizeof *lc);
    if (!lc)
        die("out of memory");
    lc->c = bench_client(o);
    lc->batch = o->batch;
    return lc;
}

/* The poll API's loop, as the poll phase runs it: complete what is held
 * and claim the next batch in one call. */
static int load_consume(void *arg, long *completed)
{
    struct load_consumer *lc = arg;
    pqmq_batch *b = NULL;
    int rc = pqmq_complete_and_poll(lc->c, lc->held, NULL, 0, lc->batch, &b);
    if (rc && rc != PQMQ_ESTALE)
        die("pqmq_complete_and_poll: %s", pqmq_errmsg(lc->c));
    *completed += (long)pqmq_batch_count(lc->held);
    pqmq_batch_free(lc->held);
    lc->held = b;
    return (int)pqmq_batch_count(b);
}

static void load_consumer_free(void *arg, long *completed)
{
    struct load_consumer *lc = arg;
    if (pqmq_batch_count(lc->held)) {
        if (pqmq_complete_batch(lc->c, lc->held))
            die("pqmq_complete_batch: %s", pqmq_errmsg(lc->c));
        *completed += (long)pqmq_batch_count(lc->held);
    }
    pqmq_batch_free(lc->held);
    pqmq_client_free(lc->c);
    free(lc);
}

const struct load_ops queue_load_ops = {
    .name = "pqmq",
    /* mq_rows: the exceptions (layout a's row); the log with the tables
     * that deliver and complete its messages. */
    .tables = {"mq_rows", "log tables"},
    .relnames = {NULL, "mq_log mq_cursors mq_receipts mq_done mq_log_gone"},
    .reset = queue_reset,
    .producer_new = load_producer_new,
    .produce = load_produce,
    .producer_free = load_producer_free,
    .consumer_new = load_consumer_new,
    .consume = load_consume,
    .consumer_free = load_consumer_free,
};

/* ---- latency ----------------------------------------------------------- */

struct lat {
    double *ms; /* [n]: insert-to-handler time of message seq */
    /* [n]: CLOCK_REALTIME (us) at which message seq was sent, at which
     * pqmq_insert returned (its commit acknowledged), its handler started */
    int64_t *sent, *returned, *started;
    int n;
    atomic_long got; /* measured messages handled */
    atomic_int warm; /* warm-up messages handled */
};

/* The integer after "key": in json (jsonb renders it as "key": value, in
 * its own key order). */
static int json_int(const char *json, const char *key, long long *out)
{
    const char *p = strstr(json, key);
    if (!p)
        return -1;
    p += strlen(key);
    char *end;
    *out = strtoll(p, &end, 10);
    return end == p ? -1 : 0;
}

static int latency_handler(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    int64_t now = realtime_us();
    (void)ctx;
    struct lat *l = arg;
    const char *json = pqmq_job_json(job);
    long long seq, ts;
    if (!json || json_int(json, "\"seq\":", &seq) || json_int(json, "\"ts\":", &ts))
        return -1;
    if (seq < 0) {
        atomic_fetch_add(&l->warm, 1);
    } else if (seq < l->n) {
        l->ms[seq] = (double)(now - ts) / 1000.0;
        l->started[seq] = now;
        atomic_fetch_add(&l->got, 1);
    }
    return 0;
}

/* Inserts message seq; *sent and *returned: CLOCK_REALTIME (us) before the
 * call (the time the payload carries) and after it returned. */
static void send_one(pqmq_client *c, const struct opts *o, int ordered, long seq, char *json,
                     size_t cap, int64_t *sent, int64_t *returned)
{
    char args[24];
    if (ordered)
        snprintf(args, sizeof args, "latency-chain");
    else
        snprintf(args, sizeof args, "c%ld", (seq < 0 ? -seq : seq) % o->channels);
    pqmq_msg *m = pqmq_msg_new();
    int64_t ts = realtime_us();
    bench_payload(json, cap, seq, ts, o->payload_bytes);
    if (!m || pqmq_msg_set_channel(m, BENCH_CHANNEL, args) || pqmq_msg_set_name(m, "latency") ||
        pqmq_msg_set_json(m, json) || pqmq_msg_set_backoff(m, 600000) ||
        pqmq_msg_set_ordered(m, ordered))
        die("out of memory");
    if (pqmq_insert(c, &m, 1))
        die("pqmq_insert: %s", pqmq_errmsg(c));
    *returned = realtime_us();
    *sent = ts;
    pqmq_msg_free(m);
}

/* out's split of each message's time at pqmq_insert's return: the
 * producer's insert and commit, then the runner's part. */
static void latency_split(const struct lat *l, struct latency *out)
{
    double *ins = malloc((size_t)l->n * sizeof *ins), *run = malloc((size_t)l->n * sizeof *run);
    if (!ins || !run)
        die("out of memory");
    for (int i = 0; i < l->n; i++) {
        ins[i] = (double)(l->returned[i] - l->sent[i]) / 1000.0;
        /* The runner hears of the commit when the producer does: its
         * handler may start before pqmq_insert has returned (then 0). */
        run[i] = l->started[i] > l->returned[i]
                     ? (double)(l->started[i] - l->returned[i]) / 1000.0
                     : 0;
    }
    struct latency part;
    latency_summary(ins, l->n, &part);
    out->insert_p50 = part.p50;
    out->insert_p99 = part.p99;
    latency_summary(run, l->n, &part);
    out->runner_p50 = part.p50;
    out->runner_p99 = part.p99;
    free(ins);
    free(run);
}

static void wait_count(atomic_long *count, long want, const char *what)
{
    double t0 = now_s();
    while (atomic_load(count) < want) {
        if (now_s() - t0 > STALL_S)
            die("%s: %ld of %ld messages arrived", what, atomic_load(count), want);
        sleep_s(0.001);
    }
}

/*
 * Single messages, one every --latency-gap ms, into one idle runner with
 * default settings; each carries its insert time (CLOCK_REALTIME) and the
 * handler subtracts it from its own start time. ordered: every message is
 * on one ordered chain, so each also waits for its predecessor's completion
 * to reach the server.
 */
void queue_latency(const struct opts *o, int ordered, struct latency *out)
{
    size_t n = (size_t)o->latency_samples;
    struct lat l = {calloc(n, sizeof(double)),
                    calloc(n, sizeof(int64_t)),
                    calloc(n, sizeof(int64_t)),
                    calloc(n, sizeof(int64_t)),
                    o->latency_samples,
                    0,
                    0};
    size_t cap = bench_payload_cap(o->payload_bytes);
    char *json = malloc(cap);
    if (!l.ms || !l.sent || !l.returned || !l.started || !json)
        die("out of memory");
    int64_t warm_sent, warm_returned;
    struct runner_thread t;
    start_runner(&t, o, 0, 0, 0, 0, latency_handler, &l);
    wait_started(&t);
    pqmq_client *c = bench_client(o);
    sleep_s(0.05); /* let the runner settle into its idle wait */

    for (int i = 0; i < BENCH_LATENCY_WARMUP; i++) {
        send_one(c, o, ordered, -1 - i, json, cap, &warm_sent, &warm_returned);
        sleep_s(o->latency_gap_ms / 1000.0);
    }
    double t0 = now_s();
    while (atomic_load(&l.warm) < BENCH_LATENCY_WARMUP) {
        if (now_s() - t0 > STALL_S)
            die("latency warm-up messages did not arrive");
        sleep_s(0.001);
    }
    sleep_s(0.05);

    const char *label = ordered ? "latency, one ordered chain" : "latency, idle runner";
    progress_begin(label, l.n, &l.got);
    t0 = now_s();
    for (long i = 0; i < l.n; i++) {
        send_one(c, o, ordered, i, json, cap, &l.sent[i], &l.returned[i]);
        sleep_s(t0 + (double)(i + 1) * o->latency_gap_ms / 1000.0 - now_s());
    }
    wait_count(&l.got, l.n, label);
    progress_end();
    stop_runner(&t);
    pqmq_client_free(c);
    latency_summary(l.ms, l.n, out);
    latency_split(&l, out);
    free(json);
    free(l.ms);
    free(l.sent);
    free(l.returned);
    free(l.started);
}
