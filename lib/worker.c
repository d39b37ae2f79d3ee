/*
 * worker.c: the runner's worker threads and the pqmq_ctx a handler gets.
 * Each worker owns a connection, used for transactional completion,
 * checkpoints and failures; plain completions go back to the main loop,
 * which sends them in batches.
 */
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pqmq-int.h"

struct pqmq_ctx {
    pqmq__slot *slot;
    const pqmq_job *job;
    int tx_open;
    int tx_broken; /* BEGIN failed: the job cannot complete transactionally */
    char error[512];
};

static const pqmq__route *route_for(const pqmq_runner *r, const char *name)
{
    const pqmq__route *fallback = NULL;
    for (size_t i = 0; i < r->nroutes; i++) {
        if (!r->routes[i].name)
            fallback = &r->routes[i];
        else if (!strcmp(r->routes[i].name, name))
            return &r->routes[i];
    }
    return fallback;
}

/* A pseudo-random number in [0, n), different per worker and per call:
 * spreads the workers' reconnect attempts. */
static int64_t jitter(const pqmq__slot *s, int64_t n)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)(uintptr_t)s >> 4);
    x *= 0x9E3779B97F4A7C15ull;
    return (int64_t)((x >> 33) % (uint64_t)n);
}

/* Tries to re-establish the worker's lost connection, unless its backoff
 * says not yet: the first attempt is immediate (a terminated backend, a
 * server that is up), then 100 ms, doubling to 2 s, with jitter so that the
 * workers do not knock together. Returns 0 when connected. */
static int try_reconnect(pqmq__slot *s)
{
    int64_t now = pqmq__now_ms();
    if (now < s->retry_at_ms)
        return -1;
    if (pqmq__reconnect(s->client) == 0) {
        atomic_fetch_add(&s->runner->reconnects, 1);
        s->retry_delay_ms = 0;
        s->retry_at_ms = 0;
        return 0;
    }
    int64_t d = s->retry_delay_ms ? s->retry_delay_ms * 2 : 100;
    s->retry_delay_ms = d < 2000 ? d : 2000;
    s->retry_at_ms = now + s->retry_delay_ms / 2 + jitter(s, s->retry_delay_ms / 2 + 1);
    return -1;
}

/* ---- pqmq_ctx ---------------------------------------------------------- */

PQMQ_EXPORT PGconn *pqmq_ctx_begin(pqmq_ctx *ctx)
{
    if (!ctx)
        return NULL;
    PGconn *conn = pqmq_conn(ctx->slot->client);
    if (!ctx->tx_open && !ctx->tx_broken) {
        PGresult *res = PQexec(conn, "BEGIN");
        /* The backend died since the job started: nothing was done in the
         * transaction yet, so reconnecting (same PGconn) and retrying is safe. */
        if (PQresultStatus(res) != PGRES_COMMAND_OK && PQstatus(conn) == CONNECTION_BAD &&
            try_reconnect(ctx->slot) == 0) {
            PQclear(res);
            res = PQexec(conn, "BEGIN");
        }
        if (PQresultStatus(res) == PGRES_COMMAND_OK)
            ctx->tx_open = 1;
        else
            ctx->tx_broken = 1;
        PQclear(res);
    }
    return ctx->tx_open ? conn : NULL;
}

PQMQ_EXPORT PGconn *pqmq_ctx_conn(pqmq_ctx *ctx)
{
    return ctx ? pqmq_conn(ctx->slot->client) : NULL;
}

PQMQ_EXPORT void pqmq_ctx_error(pqmq_ctx *ctx, const char *fmt, ...)
{
    if (!ctx || !fmt)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
    va_end(ap);
}

PQMQ_EXPORT int pqmq_ctx_checkpoint(pqmq_ctx *ctx, const char *json, const void *bytes,
                                    size_t len, int extra_retries)
{
    if (!ctx)
        return PQMQ_EINVAL;
    return pqmq_checkpoint(ctx->slot->client, ctx->slot->entry->id, pqmq_job_lease_ms(ctx->job), json,
                           bytes, len, extra_retries);
}

PQMQ_EXPORT int pqmq_ctx_stopping(const pqmq_ctx *ctx)
{
    return ctx ? atomic_load(&ctx->slot->runner->stop) : 0;
}

/* ---- running one job --------------------------------------------------- */

static int exec_ok(PGconn *conn, const char *sql)
{
    PGresult *res = PQexec(conn, sql);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    PQclear(res);
    return ok;
}

/* Completes the job inside the handler's transaction and commits. Fails
 * (and rolls back) if the job is no longer there: another consumer took
 * it over after our lease ran out, and its effect must not happen twice. */
static int commit_with_completion(pqmq_ctx *ctx)
{
    pqmq_client *c = ctx->slot->client;
    PGparam *param = pqmq__param(c);
    int rc = param ? pqmq__put_uuids(c, param, (const uuid_t *)ctx->slot->entry->id, 1,
                                     "complete") : PQMQ_ENOMEM;
    if (!rc && !PQputf(param, "%int4", ctx->slot->entry->attempt))
        rc = PQMQ_ENOMEM;
    /* Fenced by attempt: a redelivered message is not ours to complete. */
    PGresult *res = rc ? NULL : pqmq__exec(c, param, "SELECT mq_complete($1, ARRAY[$2])",
                                           "complete", &rc);
    PQparamClear(param);
    int deleted = 0;
    if (res && !PQgetf(res, 0, "%int4", 0, &deleted))
        deleted = 0;
    PQclear(res);
    if (rc || deleted != 1) {
        snprintf(ctx->error, sizeof ctx->error, "%s",
                 rc ? pqmq_errmsg(c) : "lease lost: the message was completed elsewhere");
        exec_ok(pqmq_conn(c), "ROLLBACK");
        return -1;
    }
    if (!exec_ok(pqmq_conn(c), "COMMIT")) {
        snprintf(ctx->error, sizeof ctx->error, "COMMIT failed: %s",
                 PQerrorMessage(pqmq_conn(c)));
        return -1;
    }
    return 0;
}

/* Cuts s at its first byte that does not continue valid UTF-8: the error
 * buffer truncates mid-character, and the server refuses invalid text, which
 * would leave the failure unrecorded. */
static void utf8_cut(char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (p[i]) {
        size_t n = p[i] < 0x80 ? 1 : (p[i] & 0xE0) == 0xC0 ? 2 : (p[i] & 0xF0) == 0xE0 ? 3
                 : (p[i] & 0xF8) == 0xF0 ? 4 : 0;
        size_t k = 1;
        while (n && k < n && (p[i + k] & 0xC0) == 0x80)
            k++;
        if (!n || k < n)
            break;
        i += n;
    }
    s[i] = 0;
}

/* Records a failure on the worker's connection; the backoff decides when
 * the job comes back. Errors here only delay that (the lease runs out). */
static void record_failure(pqmq_ctx *ctx)
{
    pqmq_client *c = ctx->slot->client;
    utf8_cut(ctx->error);
    if (PQstatus(pqmq_conn(c)) != CONNECTION_OK)
        (void)try_reconnect(ctx->slot);
    (void)pqmq__fail(c, ctx->slot->entry->id, ctx->slot->entry->attempt,
                     ctx->error[0] ? ctx->error : "handler failed");
}

/* Runs the handler for the slot's job and settles the outcome. Returns 1
 * when the main loop must complete the job (plain success). */
static int run_job(pqmq__slot *s)
{
    pqmq_runner *r = s->runner;
    const pqmq_job *job = s->entry->job;
    pqmq_ctx ctx = {s, job, 0, 0, ""};
    const char *name = pqmq_job_name(job);
    const pqmq__route *route = route_for(r, name);
    int rc;
    if (route) {
        rc = route->fn(&ctx, job, route->arg);
    } else {
        snprintf(ctx.error, sizeof ctx.error, "no handler for message name \"%s\"", name);
        rc = -1;
    }
    if (ctx.tx_open) {
        if (rc == 0 && PQtransactionStatus(pqmq_conn(s->client)) != PQTRANS_INTRANS) {
            snprintf(ctx.error, sizeof ctx.error, "the handler's transaction failed: %s",
                     PQerrorMessage(pqmq_conn(s->client)));
            rc = -1;
        }
        if (rc == 0 && commit_with_completion(&ctx) == 0) {
            atomic_fetch_add(&r->processed, 1);
            return 0;
        }
        if (PQtransactionStatus(pqmq_conn(s->client)) != PQTRANS_IDLE)
            exec_ok(pqmq_conn(s->client), "ROLLBACK"); /* not already rolled back */
        rc = -1;
    } else if (rc == 0 && !ctx.tx_broken) {
        return 1;
    }
    if (ctx.tx_broken && !ctx.error[0])
        snprintf(ctx.error, sizeof ctx.error, "could not open the job's transaction");
    record_failure(&ctx);
    /* Counted once recorded: the main loop polls when this moves, and
     * whoever reads the counter then also sees last_error. */
    atomic_fetch_add(&r->failed, 1);
    return 0;
}

/* Appends an id to the runner's completion list (under the lock). */
static void push_done(pqmq_runner *r, const uuid_t id, int attempt)
{
    if (r->ndone == r->done_cap) {
        size_t cap = r->done_cap ? 2 * r->done_cap : 64;
        uuid_t *ids = realloc(r->done, cap * sizeof *ids);
        if (ids)
            r->done = ids;
        int *attempts = ids ? realloc(r->done_attempts, cap * sizeof *attempts) : NULL;
        if (attempts)
            r->done_attempts = attempts;
        if (!ids || !attempts)
            return; /* not completed now: the lease runs out, it comes back */
        r->done_cap = cap;
    }
    memcpy(r->done[r->ndone], id, sizeof(uuid_t));
    r->done_attempts[r->ndone++] = attempt;
}

/* A backend terminated while its worker was idle has sent its last words
 * and closed the socket, but libpq notices only when it reads: read what is
 * pending, without blocking, so that PQstatus tells the truth. */
static void notice_hangup(PGconn *conn)
{
    for (int i = 0; i < 2 && PQstatus(conn) == CONNECTION_OK; i++) {
        struct pollfd p = {PQsocket(conn), POLLIN, 0};
        if (poll(&p, 1, 0) <= 0 || !PQconsumeInput(conn))
            return;
        PGnotify *n;
        while ((n = PQnotifies(conn)) != NULL) /* also parses what was read */
            PQfreemem(n);
    }
}

/* Whether the worker's connection works, reconnecting if the backoff
 * allows. Called with no lock held. */
static int connected(pqmq__slot *s)
{
    notice_hangup(pqmq_conn(s->client));
    return PQstatus(pqmq_conn(s->client)) == CONNECTION_OK || try_reconnect(s) == 0;
}

/* A worker that cannot reach the server takes no job (another worker, or
 * itself once reconnected, runs it): waits out its backoff, woken early by
 * shutdown, then tries again (under the lock). */
static void wait_reconnect(pqmq__slot *s)
{
    pqmq_runner *r = s->runner;
    int64_t at = s->retry_at_ms;
    struct timespec ts = {(time_t)(at / 1000), (long)(at % 1000) * 1000000L};
    while (!r->shutdown && pqmq__now_ms() < at)
        if (pthread_cond_timedwait(&r->work, &r->lock, &ts) != 0)
            break;
    if (r->shutdown)
        return;
    pthread_mutex_unlock(&r->lock);
    int ok = try_reconnect(s) == 0;
    pthread_mutex_lock(&r->lock);
    s->down = !ok;
    if (ok)
        pqmq__runner_wake(r); /* it may claim again */
}

/* The oldest queued entry, or NULL (under the lock). */
static pqmq__entry *next_queued(pqmq_runner *r)
{
    pqmq__entry *best = NULL;
    for (int i = 0; i < r->capacity; i++) {
        pqmq__entry *e = &r->entries[i];
        if (e->job && !e->running && (!best || e->seq < best->seq))
            best = e;
    }
    return best;
}

static void *worker_main(void *arg)
{
    pqmq__slot *s = arg;
    pqmq_runner *r = s->runner;
    pthread_mutex_lock(&r->lock);
    for (;;) {
        if (s->down && !r->shutdown) {
            wait_reconnect(s);
            continue;
        }
        pqmq__entry *e;
        while (!(e = next_queued(r)) && !r->shutdown)
            pthread_cond_wait(&r->work, &r->lock);
        if (!e || (s->down && r->shutdown))
            break;
        e->running = 1;
        s->entry = e;
        pthread_mutex_unlock(&r->lock);
        int up = connected(s);
        pthread_mutex_lock(&r->lock);
        if (!up) {
            /* Hand the job back to the queue, untouched; the main loop
             * hands queued jobs back to the server if no worker is up. */
            e->running = 0;
            s->entry = NULL;
            s->down = 1;
            pthread_cond_broadcast(&r->work);
            pqmq__runner_wake(r);
            continue;
        }
        pthread_mutex_unlock(&r->lock);
        int complete = run_job(s);
        pthread_mutex_lock(&r->lock);
        if (complete)
            push_done(r, e->id, e->attempt);
        s->entry = NULL;
        pqmq__entry_release(r, e);
        pqmq__runner_wake(r);
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

int pqmq__workers_start(pqmq_runner *r)
{
    r->shutdown = 0;
    r->slots = calloc((size_t)r->threads, sizeof *r->slots);
    if (!r->slots)
        return PQMQ_ENOMEM;
    int started = 0, rc = 0;
    for (int i = 0; i < r->threads && !rc; i++) {
        pqmq__slot *s = &r->slots[i];
        s->runner = r;
        rc = pqmq_connect(r->conninfo, &s->client);
        if (rc) {
            snprintf(r->errmsg, sizeof r->errmsg, "worker connection: %s",
                     pqmq_errmsg(s->client));
            break;
        }
        if (pthread_create(&s->thread, NULL, worker_main, s) != 0) {
            snprintf(r->errmsg, sizeof r->errmsg, "cannot start worker thread");
            rc = PQMQ_ENOMEM;
            break;
        }
        started++;
    }
    if (rc) {
        /* The slot that failed has no thread; the others are joined. */
        pqmq_client_free(r->slots[started].client);
        int configured = r->threads;
        r->threads = started;
        pqmq__workers_join(r);
        r->threads = configured;
    }
    return rc;
}

void pqmq__workers_join(pqmq_runner *r)
{
    if (!r->slots)
        return;
    pthread_mutex_lock(&r->lock);
    r->shutdown = 1;
    pthread_cond_broadcast(&r->work);
    pthread_mutex_unlock(&r->lock);
    for (int i = 0; i < r->threads; i++) {
        pthread_join(r->slots[i].thread, NULL);
        pqmq_client_free(r->slots[i].client);
    }
    free(r->slots);
    r->slots = NULL;
}
