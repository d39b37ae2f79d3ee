/*
 * worker.c: the runner's worker threads and the pqmq_ctx a handler gets.
 * Each worker owns a connection, used for transactional completion,
 * checkpoints and failures; plain completions go back to the main loop,
 * which sends them in batches. A batch transaction (the locked lane's, or a
 * commit batch's) runs several jobs' handlers, each in a savepoint, and
 * completes them with one commit.
 */
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "workers.h"

/* A job of the open commit batch, settled when the batch ends. */
typedef struct {
    int index; /* its entry in the claim queue */
    pqmq__delivery delivery;
    int ok; /* 1: completed with the batch; 0: failed (why in error) */
    char error[512];
} pending;

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
    int64_t lost_ms;        /* monotonic: when the loss was seen (0: connected) */
    int attempts;           /* reconnect attempts since */
    /* A batch transaction is open on the connection: the locked lane's,
     * or a commit batch's (since opened_ms, monotonic). */
    int tx_open;
    int64_t opened_ms;
    /* Commit batches: the open batch's jobs (room for commit_jobs), and
     * room for their deliveries when it ends. */
    pending *pend;
    pqmq__delivery *ok;
    size_t npend;
    /* A group handler's jobs (room for commit_jobs). */
    pqmq__work *group;
    int *group_index;
    const pqmq_job **group_jobs;
} slot;

struct pqmq__workers {
    pqmq__worker_env env;
    slot *slots;
    int n;     /* started */
    int total; /* allocated */
};

struct pqmq_ctx {
    slot *slot;
    const pqmq__work *work; /* a group handler's: the first of njobs */
    size_t njobs;
    int tx_open;   /* the job's transaction (in a batch: its savepoint) is open */
    int tx_broken; /* BEGIN failed: the job cannot complete transactionally */
    int batched;   /* the job runs in the worker's batch transaction */
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
 * workers do not knock together. Logs the loss, the first failed attempt
 * (later ones at debug level) and the reconnection. Returns 0 when
 * connected. */
static int try_reconnect(slot *s)
{
    const pqmq__worker_env *env = s->env;
    int64_t now = pqmq__now_ms();
    if (now < s->retry_at_ms)
        return -1;
    pqmq_client *c = s->client;
    char why[800];
    if (!s->lost_ms) {
        s->lost_ms = now;
        s->attempts = 0;
        pqmq__conn_error(c, why, sizeof why);
        pqmq__log(env->log, PQMQ_LOG_WARN, "%s: lost connection (worker %d): %s; reconnecting",
                  env->label, s->index + 1, why);
    }
    s->attempts++;
    if (pqmq__reset_conn(c) == 0) {
        atomic_fetch_add(&env->counters->reconnects, 1);
        pqmq__log(env->log, PQMQ_LOG_INFO,
                  "%s: reconnected after %lld ms (worker %d, %d attempt%s)", env->label,
                  (long long)(pqmq__now_ms() - s->lost_ms), s->index + 1, s->attempts,
                  s->attempts == 1 ? "" : "s");
        s->lost_ms = 0;
        s->retry_delay_ms = 0;
        s->retry_at_ms = 0;
        return 0;
    }
    int64_t d = s->retry_delay_ms ? s->retry_delay_ms * 2 : 100;
    s->retry_delay_ms = d < 2000 ? d : 2000;
    int64_t wait = s->retry_delay_ms / 2 + jitter(s, s->retry_delay_ms / 2 + 1);
    s->retry_at_ms = now + wait;
    pqmq__conn_error(c, why, sizeof why);
    pqmq__log(env->log, s->attempts == 1 ? PQMQ_LOG_WARN : PQMQ_LOG_DEBUG,
              "%s: reconnect attempt %d failed (worker %d): %s; next attempt in %lld ms",
              env->label, s->attempts, s->index + 1, why, (long long)wait);
    return -1;
}

/* ---- pqmq_ctx ---------------------------------------------------------- */

/* Records whether the job's transaction (in a batch: its savepoint) opened,
 * and whether that opened the worker's batch transaction. */
static void note_opened(pqmq_ctx *ctx, int ok)
{
    slot *s = ctx->slot;
    ctx->tx_open = ok;
    ctx->tx_broken = !ok;
    if (ctx->batched && !s->tx_open &&
        PQtransactionStatus(pqmq_conn(s->client)) != PQTRANS_IDLE) {
        s->tx_open = 1; /* even half open: the batch's end rolls it back */
        s->opened_ms = pqmq__now_ms();
    }
}

/* Opens the job's savepoint in the worker's batch transaction, so that its
 * writes can be undone alone if it fails. A commit batch's transaction
 * opens with its first job's savepoint. The last job's savepoint is not
 * released: this one nests inside it, a ROLLBACK TO names the innermost
 * savepoint of that name (this job's), and the COMMIT releases them all,
 * so a RELEASE would only cost the server a statement a job. */
static void open_savepoint(pqmq_ctx *ctx)
{
    slot *s = ctx->slot;
    PGconn *conn = pqmq_conn(s->client);
    const char *sql = s->tx_open ? "SAVEPOINT pqmq_job" : "BEGIN; SAVEPOINT pqmq_job";
    PGresult *res = PQexec(conn, sql);
    /* The backend died while no batch was open: nothing is lost, so
     * reconnecting (same PGconn) and retrying is safe. */
    if (!s->tx_open && PQresultStatus(res) != PGRES_COMMAND_OK &&
        PQstatus(conn) == CONNECTION_BAD && try_reconnect(s) == 0) {
        PQclear(res);
        res = PQexec(conn, sql);
    }
    note_opened(ctx, PQresultStatus(res) == PGRES_COMMAND_OK);
    PQclear(res);
}

PQMQ_EXPORT PGconn *pqmq_ctx_begin(pqmq_ctx *ctx)
{
    if (!ctx)
        return NULL;
    PGconn *conn = pqmq_conn(ctx->slot->client);
    if (ctx->batched) {
        if (!ctx->tx_open && !ctx->tx_broken)
            open_savepoint(ctx);
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

/* A handler's statement for pqmq_ctx_exec_*: prepared (name) or not (sql),
 * with text parameters and results. */
typedef struct {
    const char *name, *sql;
    int n;
    const char *const *values;
} ctx_stmt;

static int send_stmt(PGconn *conn, const ctx_stmt *st)
{
    return st->name ? PQsendQueryPrepared(conn, st->name, st->n, st->values, NULL, NULL, 0)
                    : PQsendQueryParams(conn, st->sql, st->n, NULL, st->values, NULL, NULL, 0);
}

static PGresult *exec_stmt(PGconn *conn, const ctx_stmt *st)
{
    return st->name ? PQexecPrepared(conn, st->name, st->n, st->values, NULL, NULL, 0)
                    : PQexecParams(conn, st->sql, st->n, NULL, st->values, NULL, NULL, 0);
}

/* The last result of the pipeline's next statement; NULL if none came. */
static PGresult *take_result(PGconn *conn)
{
    PGresult *r = NULL, *next;
    while ((next = PQgetResult(conn)) != NULL) {
        PQclear(r);
        r = next;
    }
    return r;
}

/* Sends the nopen statements that open the job's transaction and then st,
 * in one pipeline: one round trip. Sets *opened when all of the former
 * succeeded, and then returns st's result (an error result if st failed:
 * the job's transaction is then aborted, as after any failed statement). */
static PGresult *exec_opening(PGconn *conn, const char *const *open, int nopen,
                              const ctx_stmt *st, int *opened)
{
    *opened = 0;
    if (!PQenterPipelineMode(conn))
        return NULL;
    int sent = 1;
    for (int i = 0; i < nopen && sent; i++)
        sent = PQsendQueryParams(conn, open[i], 0, NULL, NULL, NULL, NULL, 0);
    if (!sent || !send_stmt(conn, st) || !PQpipelineSync(conn)) {
        PQexitPipelineMode(conn); /* a broken connection: its reset ends the pipeline */
        return NULL;
    }
    int ok = 1;
    for (int i = 0; i < nopen; i++) {
        PGresult *r = take_result(conn);
        ok = ok && PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
    }
    PGresult *res = take_result(conn);
    PQclear(PQgetResult(conn)); /* the sync; NULL if the connection died */
    PQexitPipelineMode(conn);
    *opened = ok;
    if (!ok) {
        PQclear(res);
        return NULL;
    }
    return res;
}

/* pqmq_ctx_exec_*: the first statement of the job's transaction goes out
 * behind what opens it (BEGIN, and in a batch the job's SAVEPOINT) in the
 * same round trip; later ones as libpq sends them. */
static PGresult *ctx_exec(pqmq_ctx *ctx, const ctx_stmt *st)
{
    if (!ctx || !(st->name ? st->name : st->sql) || st->n < 0 || (st->n && !st->values))
        return NULL;
    slot *s = ctx->slot;
    PGconn *conn = pqmq_conn(s->client);
    if (ctx->tx_open || ctx->tx_broken)
        return ctx->tx_open ? exec_stmt(conn, st) : NULL;
    /* Nothing of a batch open: a reconnect and a retry lose nothing. */
    int fresh = !ctx->batched || !s->tx_open;
    const char *open[2];
    int nopen = 0, opened;
    if (fresh)
        open[nopen++] = "BEGIN";
    if (ctx->batched)
        open[nopen++] = "SAVEPOINT pqmq_job";
    PGresult *res = exec_opening(conn, open, nopen, st, &opened);
    if (!opened && fresh && PQstatus(conn) == CONNECTION_BAD && try_reconnect(s) == 0)
        res = exec_opening(conn, open, nopen, st, &opened);
    note_opened(ctx, opened);
    return res;
}

PQMQ_EXPORT PGresult *pqmq_ctx_exec_params(pqmq_ctx *ctx, const char *sql, int nparams,
                                           const char *const *values)
{
    ctx_stmt st = {NULL, sql, nparams, values};
    return sql ? ctx_exec(ctx, &st) : NULL;
}

PQMQ_EXPORT PGresult *pqmq_ctx_exec_prepared(pqmq_ctx *ctx, const char *name, int nparams,
                                             const char *const *values)
{
    ctx_stmt st = {name, NULL, nparams, values};
    return name ? ctx_exec(ctx, &st) : NULL;
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
    if (!ctx || ctx->njobs != 1)
        return PQMQ_EINVAL;
    /* Fenced by the job's attempt: a lease that ran out and went to another
     * consumer is not this handler's to extend. */
    return pqmq__checkpoint(ctx->slot->client, ctx->work->delivery.id,
                            ctx->work->delivery.attempt, pqmq_job_lease_ms(ctx->work->job),
                            json, bytes, len, extra_retries);
}

PQMQ_EXPORT int pqmq_ctx_stopping(const pqmq_ctx *ctx)
{
    return ctx ? atomic_load(ctx->slot->env->stop) : 0;
}

/* ---- running one job --------------------------------------------------- */

/* Calls the handler of w[0..n) (a group handler's when n > 1), or names
 * the missing one in ctx's error and fails. */
static int call_handler(slot *s, pqmq_ctx *ctx, const pqmq__work *w, size_t n)
{
    const char *name = pqmq_job_name(w[0].job);
    const pqmq__route *route = route_for(s->env, name);
    if (!route) {
        snprintf(ctx->error, sizeof ctx->error, "no handler for message name \"%s\"", name);
        return -1;
    }
    if (!route->group)
        return route->fn(ctx, w[0].job, route->arg);
    const pqmq_job *one = w[0].job;
    const pqmq_job **jobs = n == 1 ? &one : s->group_jobs;
    for (size_t i = 0; i < n; i++)
        jobs[i] = w[i].job;
    return route->group(ctx, jobs, n, route->arg);
}

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
    pqmq__enter(c, "pqmq_runner: complete");
    int rc = pqmq__complete(c, &ctx->work->delivery, 1, &done);
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

/* Records a failure on the worker's connection, outside any transaction;
 * the backoff decides when the job comes back. Errors here only delay that
 * (the lease runs out). */
static void record_failure(slot *s, const pqmq__delivery *d, char *error)
{
    utf8_cut(error);
    if (PQstatus(pqmq_conn(s->client)) != CONNECTION_OK)
        (void)try_reconnect(s);
    (void)pqmq__fail(s->client, d->id, d->attempt, error[0] ? error : "handler failed");
}

/* Runs the handler for w and settles the outcome. Returns 1 when the main
 * loop must complete the job (plain success). */
static int run_job(slot *s, const pqmq__work *w)
{
    const pqmq__worker_env *env = s->env;
    pqmq_ctx ctx = {s, w, 1, 0, 0, 0, ""};
    int rc = call_handler(s, &ctx, w, 1);
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
    record_failure(s, &w->delivery, ctx.error);
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

/* ---- batch transactions ------------------------------------------------ */

/* Runs the handler of w[0..n) (n > 1: a group handler's) in the worker's
 * batch transaction: the locked lane's, or a commit batch's, which the
 * handler's pqmq_ctx_begin opens if none is. Returns 1 (succeeded: complete
 * them with the batch), 0 (failed: the writes were undone to the savepoint)
 * or -1 (a statement failed outside a savepoint: the transaction, and so
 * the batch, is lost); why it did not succeed in error. */
static int run_in_batch(slot *s, const pqmq__work *w, size_t n, char *error, size_t errlen)
{
    PGconn *conn = pqmq_conn(s->client);
    pqmq_ctx ctx = {s, w, n, 0, 0, 1, ""};
    int rc = call_handler(s, &ctx, w, n), result;
    int healthy = !s->tx_open || PQtransactionStatus(conn) == PQTRANS_INTRANS;
    if (ctx.tx_open) {
        if (rc == 0 && !healthy)
            snprintf(ctx.error, sizeof ctx.error, "the handler's transaction failed: %s",
                     PQerrorMessage(conn));
        result = rc == 0 && healthy                                ? 1
                 : exec_ok(conn, "ROLLBACK TO SAVEPOINT pqmq_job") ? 0
                                                                   : -1;
    } else if (!healthy) {
        if (rc == 0 || !ctx.error[0])
            snprintf(ctx.error, sizeof ctx.error,
                     "a statement failed outside the job's savepoint, breaking its batch: %s",
                     PQerrorMessage(conn));
        result = -1;
    } else {
        result = rc == 0 && !ctx.tx_broken;
    }
    if (ctx.tx_broken && !ctx.error[0])
        snprintf(ctx.error, sizeof ctx.error, "could not open the job's transaction");
    snprintf(error, errlen, "%s", ctx.error[0] ? ctx.error : "handler failed");
    utf8_cut(error);
    return result;
}

/* ---- commit batches ----------------------------------------------------- */

/* Whether the open commit batch ends now: it is full, it has been open
 * long enough, or the runner is stopping (the batch in hand commits). */
static int batch_due(const slot *s)
{
    const pqmq__worker_env *env = s->env;
    return s->npend >= (size_t)env->commit_jobs ||
           pqmq__now_ms() - s->opened_ms >= env->commit_open_ms || atomic_load(env->stop);
}

/* The connection was lost with the batch open, so the server rolled it
 * back (or, lost during the COMMIT, perhaps committed it): its jobs go
 * back to the queue to run again, on another worker or on this one once
 * reconnected, and the worker counts as down. Running one whose batch did
 * commit does no harm: its completion is fenced, finds the message gone,
 * and rolls its second effect back. */
static void lose_batch(slot *s)
{
    for (size_t i = 0; i < s->npend; i++)
        pqmq__claims_give_back(s->env->claims, s->index, s->pend[i].index);
    s->npend = 0;
    s->tx_open = 0;
}

/* Completes n deliveries and commits the worker's transaction, its errors
 * named for the runner's step. */
static int complete_commit(pqmq_client *c, const pqmq__delivery *d, size_t n)
{
    pqmq__enter(c, "pqmq_runner: complete");
    return pqmq__complete_commit(c, d, n);
}

/* Ends the open commit batch: completes its successes (fenced by attempt)
 * and commits, in one round trip; then records its failures, outside it
 * (their leases keep them ours meanwhile). A batch that cannot commit (a
 * handler broke it, or a job of it is no longer ours: PQMQ_ESTALE) is
 * rolled back, and its successes are handed back at once (mq_release,
 * fenced, gives their attempts back) to run again. */
static void end_batch(slot *s, int broken)
{
    const pqmq__worker_env *env = s->env;
    pqmq_client *c = s->client;
    size_t nok = 0;
    for (size_t i = 0; i < s->npend; i++)
        if (s->pend[i].ok)
            s->ok[nok++] = s->pend[i].delivery;
    int committed = !broken && complete_commit(c, s->ok, nok) == 0;
    if (PQtransactionStatus(pqmq_conn(c)) != PQTRANS_IDLE)
        exec_ok(pqmq_conn(c), "ROLLBACK"); /* not rolled back already */
    s->tx_open = 0;
    if (PQstatus(pqmq_conn(c)) != CONNECTION_OK) {
        lose_batch(s);
        return;
    }
    if (!committed && nok)
        (void)pqmq__release(c, s->ok, nok);
    uint64_t failed = 0;
    for (size_t i = 0; i < s->npend; i++) {
        if (!s->pend[i].ok) {
            record_failure(s, &s->pend[i].delivery, s->pend[i].error);
            failed++;
        }
        pqmq__claims_finish(env->claims, s->pend[i].index, 0);
    }
    s->npend = 0;
    /* Counted once settled: the main loop polls when these move. */
    if (committed)
        atomic_fetch_add(&env->counters->processed, nok);
    atomic_fetch_add(&env->counters->failed, failed);
}

/* Runs the n jobs of s->group with commit batches (n > 1: a group
 * handler's): in the open batch (or the one the handler's pqmq_ctx_begin
 * opens) they are settled with the batch; jobs whose handler opened none
 * are settled now, as in the default mode. */
static void run_batched(slot *s, size_t n)
{
    const pqmq__worker_env *env = s->env;
    char error[512];
    int r = run_in_batch(s, s->group, n, error, sizeof error);
    for (size_t i = 0; i < n; i++) {
        const pqmq__work *w = &s->group[i];
        if (s->tx_open) {
            pending *p = &s->pend[s->npend++];
            p->index = s->group_index[i];
            p->delivery = w->delivery;
            p->ok = r == 1;
            snprintf(p->error, sizeof p->error, "%s", error);
            continue;
        }
        if (r != 1) {
            char why[512];
            snprintf(why, sizeof why, "%s", error);
            record_failure(s, &w->delivery, why);
            atomic_fetch_add(&env->counters->failed, 1);
        }
        pqmq__claims_finish(env->claims, s->group_index[i], r == 1);
    }
    if (s->tx_open && r < 0)
        end_batch(s, 1);
}

/* Whether a group handler takes job (pqmq__claims_next_group). */
static int is_grouped(const pqmq_job *job, void *env)
{
    const pqmq__route *route = route_for(env, pqmq_job_name(job));
    return route && route->group;
}

/* The next jobs for a worker with commit batches, into s->group: with a
 * batch open, only if queued now (-2: none; the batch ends rather than
 * waits). A group handler's come together, up to group_most in the batch:
 * one savepoint for them all, so they need not share max_jobs' 64 (and
 * other workers woken by the same claim would only split it into more
 * commits). Returns how many, or -1 at shutdown. */
static int next_batched(slot *s)
{
    const pqmq__worker_env *env = s->env;
    return pqmq__claims_next_group(env->claims, s->index, s->npend == 0, is_grouped,
                                   (void *)env, (size_t)env->group_most - s->npend, s->group,
                                   s->group_index);
}

/* ---- the locked lane --------------------------------------------------- */

/* Runs one job of the worker's batch transaction. Returns 1 (to be
 * completed with the batch), 0 (failed; the failure is recorded in the
 * transaction) or -1 (the transaction is broken: the batch is lost). */
static int run_locked_job(slot *s, const pqmq__work *w, int *failed)
{
    char error[512];
    int r = run_in_batch(s, w, 1, error, sizeof error);
    if (r != 0)
        return r;
    if (pqmq__fail(s->client, w->delivery.id, w->delivery.attempt, error) != 0 &&
        PQtransactionStatus(pqmq_conn(s->client)) != PQTRANS_INTRANS)
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
    s->tx_open = 1;
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
    if (broken || complete_commit(c, ok, nok) != 0) {
        if (PQtransactionStatus(pqmq_conn(c)) != PQTRANS_IDLE)
            exec_ok(pqmq_conn(c), "ROLLBACK");
    } else {
        atomic_fetch_add(&env->counters->processed, nok);
        atomic_fetch_add(&env->counters->failed, (uint64_t)failed);
    }
    s->tx_open = 0;
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

/* Hands the n jobs at index back to the queue, untouched. */
static void give_back(slot *s, const int *index, int n)
{
    for (int i = 0; i < n; i++)
        pqmq__claims_give_back(s->env->claims, s->index, index[i]);
}

static void *worker_main(void *arg)
{
    slot *s = arg;
    pqmq__claims *q = s->env->claims;
    if (s->env->locked_batch > 0) {
        locked_worker(s);
        return NULL;
    }
    int batched = s->env->commit_jobs > 1;
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
        if (s->npend && batch_due(s)) {
            end_batch(s, 0);
            continue;
        }
        pqmq__work w;
        int index, n = 1;
        if (batched) {
            n = next_batched(s);
            index = n > 0 ? s->group_index[0] : n;
        } else {
            index = pqmq__claims_next(q, s->index, &w);
        }
        if (index == -2 || (index == -1 && s->npend)) {
            end_batch(s, 0); /* nothing waiting (or shutdown): no batch stays open idle */
            continue;
        }
        if (index < 0)
            break;
        const int *taken = batched ? s->group_index : &index;
        if (s->npend) {
            notice_hangup(pqmq_conn(s->client)); /* before a reconnect hides it */
            if (PQstatus(pqmq_conn(s->client)) != CONNECTION_OK) {
                lose_batch(s); /* down: reconnected above, with its backoff */
                give_back(s, taken, n);
                continue;
            }
        }
        if (!connected(s)) {
            /* Back to the queue, untouched; the main loop hands queued
             * jobs back to the server if no worker is up. */
            give_back(s, taken, n);
            continue;
        }
        if (batched)
            run_batched(s, (size_t)n);
        else
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
    w->total = n;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        slot *s = &w->slots[i];
        s->env = &w->env;
        s->index = i;
        size_t room = (size_t)env->group_most;
        if (env->commit_jobs > 1 && (!(s->pend = calloc(room, sizeof *s->pend)) ||
                                     !(s->ok = calloc(room, sizeof *s->ok)) ||
                                     !(s->group = calloc(room, sizeof *s->group)) ||
                                     !(s->group_index = calloc(room, sizeof *s->group_index)) ||
                                     !(s->group_jobs = calloc(room, sizeof *s->group_jobs)))) {
            snprintf(err, errlen, "out of memory"); /* freed by pqmq__workers_join */
            rc = PQMQ_ENOMEM;
            break;
        }
        rc = pqmq_connect(env->conninfo, &s->client);
        if (s->client) {
            char label[256];
            snprintf(label, sizeof label, "%s: worker %d", env->label ? env->label : "", i + 1);
            pqmq__client_set_log(s->client, env->log, label);
            s->client->keep_last_words = 1;
        }
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
    for (int i = 0; i < w->total; i++) {
        free(w->slots[i].pend);
        free(w->slots[i].ok);
        free(w->slots[i].group);
        free(w->slots[i].group_index);
        free(w->slots[i].group_jobs);
    }
    free(w->slots);
    free(w);
}
