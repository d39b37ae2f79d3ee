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

#include "workers.h"

/* One worker thread. */
typedef struct {
    const pqmq__worker_env *env;
    int index; /* its number in the claim queue */
    pthread_t thread;
    pqmq_client *client; /* the worker's own connection */
    /* Reconnect backoff, kept across jobs so that a server refusing us sees
     * a few attempts a second at most, not one burst per job. */
    int64_t retry_at_ms;    /* monotonic: no attempt before this */
    int64_t retry_delay_ms; /* 0 after a success; doubles up to a cap */
    /* Locked lane: the savepoint of the batch's last writing handler is
     * still open (released with the next one's, or by the COMMIT). */
    int savepoint_held;
} slot;

struct pqmq__workers {
    pqmq__worker_env env;
    slot *slots;
    int n;
};

struct pqmq_ctx {
    slot *slot;
    const pqmq__work *work;
    int tx_open;   /* locked lane: the job's savepoint is open */
    int tx_broken; /* BEGIN failed: the job cannot complete transactionally */
    int locked;    /* the job belongs to the worker's batch transaction */
    char error[512];
};

static const pqmq__route *route_for(const pqmq__worker_env *env, const char *name)
{
    const pqmq__route *fallback = NULL;
    for (size_t i = 0; i < env->nroutes; i++) {
        if (!env->routes[i].name)
            fallback = &env->routes[i];
        else if (!strcmp(env->routes[i].name, name))
            return &env->routes[i];
    }
    return fallback;
}

/* A pseudo-random number in [0, n), different per worker and per call:
 * spreads the workers' reconnect attempts. */
static int64_t jitter(const slot *s, int64_t n)
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
static int try_reconnect(slot *s)
{
    int64_t now = pqmq__now_ms();
    if (now < s->retry_at_ms)
        return -1;
    if (pqmq__reset_conn(s->client) == 0) {
        atomic_fetch_add(&s->env->counters->reconnects, 1);
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
    if (ctx->locked) {
        /* The batch's transaction is open: a savepoint lets this job's
         * writes be undone alone if it fails. */
        if (!ctx->tx_open && !ctx->tx_broken) {
            /* The last one's release rides along: one round trip a job. */
            PGresult *res = PQexec(conn, ctx->slot->savepoint_held
                                             ? "RELEASE SAVEPOINT pqmq_job; SAVEPOINT pqmq_job"
                                             : "SAVEPOINT pqmq_job");
            ctx->slot->savepoint_held = 0;
            ctx->tx_open = PQresultStatus(res) == PGRES_COMMAND_OK;
            ctx->tx_broken = !ctx->tx_open;
            PQclear(res);
        }
        return ctx->tx_open ? conn : NULL;
    }
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
    return pqmq_checkpoint(ctx->slot->client, ctx->work->delivery.id,
                           pqmq_job_lease_ms(ctx->work->job), json, bytes, len, extra_retries);
}

PQMQ_EXPORT int pqmq_ctx_stopping(const pqmq_ctx *ctx)
{
    return ctx ? atomic_load(ctx->slot->env->stop) : 0;
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
    size_t done = 0;
    /* Fenced by attempt: a redelivered message is not ours to complete. */
    int rc = pqmq__complete(c, &ctx->work->delivery, 1, "pqmq_runner: complete", &done);
    if (rc || done != 1) {
        snprintf(ctx->error, sizeof ctx->error, "%s",
                 rc == PQMQ_ESTALE || !rc ? "lease lost: the message was completed elsewhere"
                                          : pqmq_errmsg(c));
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
        size_t n = p[i] < 0x80             ? 1
                   : (p[i] & 0xE0) == 0xC0 ? 2
                   : (p[i] & 0xF0) == 0xE0 ? 3
                   : (p[i] & 0xF8) == 0xF0 ? 4
                                           : 0;
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
    (void)pqmq__fail(c, ctx->work->delivery.id, ctx->work->delivery.attempt,
                     ctx->error[0] ? ctx->error : "handler failed");
}

/* Runs the handler for w and settles the outcome. Returns 1 when the main
 * loop must complete the job (plain success). */
static int run_job(slot *s, const pqmq__work *w)
{
    const pqmq__worker_env *env = s->env;
    const pqmq_job *job = w->job;
    pqmq_ctx ctx = {s, w, 0, 0, 0, ""};
    const char *name = pqmq_job_name(job);
    const pqmq__route *route = route_for(env, name);
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
            atomic_fetch_add(&env->counters->processed, 1);
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
    atomic_fetch_add(&env->counters->failed, 1);
    return 0;
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
static int connected(slot *s)
{
    notice_hangup(pqmq_conn(s->client));
    return PQstatus(pqmq_conn(s->client)) == CONNECTION_OK || try_reconnect(s) == 0;
}

/* ---- the locked lane --------------------------------------------------- */

/* Runs one job of the worker's batch transaction. Returns 1 (to be
 * completed with the batch), 0 (failed; the failure is recorded in the
 * transaction) or -1 (the transaction is broken: the batch is lost). */
static int run_locked_job(slot *s, const pqmq__work *w, int *failed)
{
    PGconn *conn = pqmq_conn(s->client);
    pqmq_ctx ctx = {s, w, 0, 0, 1, ""};
    const pqmq__route *route = route_for(s->env, pqmq_job_name(w->job));
    int rc = -1;
    if (route)
        rc = route->fn(&ctx, w->job, route->arg);
    else
        snprintf(ctx.error, sizeof ctx.error, "no handler for message name \"%s\"",
                 pqmq_job_name(w->job));
    int healthy = PQtransactionStatus(conn) == PQTRANS_INTRANS;
    if (ctx.tx_open) {
        s->savepoint_held = 1; /* kept: rolled back to now, or released later */
        if (rc == 0 && healthy)
            return 1;
        if (rc == 0)
            snprintf(ctx.error, sizeof ctx.error, "the handler's transaction failed: %s",
                     PQerrorMessage(conn));
        if (!exec_ok(conn, "ROLLBACK TO SAVEPOINT pqmq_job"))
            return -1;
    } else if (!healthy) {
        return -1; /* a failed statement outside a savepoint */
    } else if (rc == 0 && !ctx.tx_broken) {
        return 1;
    }
    utf8_cut(ctx.error);
    if (pqmq__fail(s->client, w->delivery.id, w->delivery.attempt,
                   ctx.error[0] ? ctx.error : "handler failed") != 0 &&
        PQtransactionStatus(conn) != PQTRANS_INTRANS)
        return -1;
    (*failed)++;
    return 0;
}

/* One batch of the locked lane: claims it (opening the transaction), runs
 * its handlers, completes the successes and commits, in one transaction.
 * Returns milliseconds until the next poll is worth making. */
static int64_t run_locked_batch(slot *s)
{
    const pqmq__worker_env *env = s->env;
    pqmq_client *c = s->client;
    pqmq_batch *b = NULL;
    if (pqmq_poll_locked(c, env->channels, env->nchannels, env->locked_batch, &b) != 0)
        return PQstatus(pqmq_conn(c)) == CONNECTION_OK ? 100 : 0; /* 0: reconnect */
    size_t n = pqmq_batch_count(b);
    int64_t wait = 0;
    if (n == 0) {
        exec_ok(pqmq_conn(c), "COMMIT"); /* the poll's transaction */
        /* Notifications kick the workers; the minute is insurance. A
         * message ready now but not for this lane (a retry, a lost locked
         * delivery) waits for the main loop: no spinning on it. */
        wait = pqmq_batch_wait_ms(b);
        wait = wait < 0 || wait > 60000 ? 60000 : wait < 100 ? 100 : wait;
        pqmq_batch_free(b);
        return wait;
    }
    atomic_fetch_add(&env->counters->in_flight, n);
    s->savepoint_held = 0;
    pqmq__delivery *ok = malloc(n * sizeof *ok);
    size_t nok = 0;
    int failed = 0, broken = !ok;
    for (size_t i = 0; i < n && !broken; i++) {
        pqmq__work w = {pqmq_batch_job(b, i), *pqmq__job_delivery(pqmq_batch_job(b, i))};
        int r = run_locked_job(s, &w, &failed);
        if (r == 1)
            ok[nok++] = w.delivery;
        broken = r < 0;
    }
    /* A lost batch rolls back: its messages go to the lease lane (their
     * locked delivery died), where their attempts are counted. */
    if (broken || pqmq__complete_commit(c, ok, nok, "pqmq_runner: complete") != 0) {
        if (PQtransactionStatus(pqmq_conn(c)) != PQTRANS_IDLE)
            exec_ok(pqmq_conn(c), "ROLLBACK");
    } else {
        atomic_fetch_add(&env->counters->processed, nok);
        atomic_fetch_add(&env->counters->failed, (uint64_t)failed);
    }
    atomic_fetch_sub(&env->counters->in_flight, n);
    free(ok);
    pqmq_batch_free(b);
    return 0;
}

/* A worker of the locked lane: polls for itself, and runs what the main
 * loop claims with leases (retries, messages whose locked delivery died)
 * as the other workers do. */
static void locked_worker(slot *s)
{
    pqmq__claims *q = s->env->claims;
    uint64_t seen = 0;
    int64_t poll_at = 0;
    for (;;) {
        /* Down (as in worker_main): no job and no poll until reconnected.
         * Marked up again, or the main loop, which claims only while some
         * worker is up, would never lease what dead deliveries left. */
        if (pqmq__claims_is_down(q, s->index)) {
            if (pqmq__claims_sleep_until(q, s->retry_at_ms))
                break;
            pqmq__claims_set_up(q, s->index, try_reconnect(s) == 0);
            poll_at = 0;
            continue;
        }
        pqmq__work w;
        int index = pqmq__claims_next_or_kick(q, s->index, &w, &seen, poll_at);
        if (index == -1)
            break;
        if (index >= 0) {
            if (!connected(s))
                pqmq__claims_give_back(q, s->index, index); /* marks it down */
            else
                pqmq__claims_finish(q, index, run_job(s, &w));
            continue;
        }
        if (atomic_load(s->env->stop)) {
            poll_at = INT64_MAX; /* no new batch; shutdown ends the wait */
            continue;
        }
        if (!connected(s)) {
            pqmq__claims_set_up(q, s->index, 0);
            continue;
        }
        poll_at = pqmq__now_ms() + run_locked_batch(s);
    }
}

static void *worker_main(void *arg)
{
    slot *s = arg;
    pqmq__claims *q = s->env->claims;
    if (s->env->locked_batch > 0) {
        locked_worker(s);
        return NULL;
    }
    for (;;) {
        /* A worker that cannot reach the server takes no job (another
         * worker, or itself once reconnected, runs it): it waits out its
         * backoff, woken early by shutdown, then tries again. */
        if (pqmq__claims_is_down(q, s->index)) {
            if (pqmq__claims_sleep_until(q, s->retry_at_ms))
                break;
            pqmq__claims_set_up(q, s->index, try_reconnect(s) == 0);
            continue;
        }
        pqmq__work w;
        int index = pqmq__claims_next(q, s->index, &w);
        if (index < 0)
            break;
        if (!connected(s)) {
            /* Back to the queue, untouched; the main loop hands queued
             * jobs back to the server if no worker is up. */
            pqmq__claims_give_back(q, s->index, index);
            continue;
        }
        pqmq__claims_finish(q, index, run_job(s, &w));
    }
    return NULL;
}

int pqmq__workers_start(const pqmq__worker_env *env, int n, pqmq__workers **out, char *err,
                        size_t errlen)
{
    *out = NULL;
    pqmq__workers *w = calloc(1, sizeof *w);
    if (!w || !(w->slots = calloc((size_t)n, sizeof *w->slots))) {
        free(w);
        snprintf(err, errlen, "out of memory");
        return PQMQ_ENOMEM;
    }
    w->env = *env;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        slot *s = &w->slots[i];
        s->env = &w->env;
        s->index = i;
        rc = pqmq_connect(env->conninfo, &s->client);
        if (rc) {
            snprintf(err, errlen, "worker connection: %s", pqmq_errmsg(s->client));
            pqmq_client_free(s->client);
        } else if (pthread_create(&s->thread, NULL, worker_main, s) != 0) {
            snprintf(err, errlen, "cannot start worker thread");
            pqmq_client_free(s->client);
            rc = PQMQ_ENOMEM;
        } else {
            w->n++; /* started: joined by pqmq__workers_join */
        }
    }
    if (rc) {
        pqmq__workers_join(w);
        return rc;
    }
    *out = w;
    return 0;
}

void pqmq__workers_join(pqmq__workers *w)
{
    if (!w)
        return;
    pqmq__claims_shutdown(w->env.claims);
    for (int i = 0; i < w->n; i++) {
        pthread_join(w->slots[i].thread, NULL);
        pqmq_client_free(w->slots[i].client);
    }
    free(w->slots);
    free(w);
}
