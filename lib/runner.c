/*
 * runner.c: the worker loop. One control connection LISTENs, polls, keeps
 * in-flight jobs alive and completes finished ones in batches; worker
 * threads (worker.c) run the handlers. Between polls the loop sleeps in
 * poll(2) on the control socket and a self-pipe, with the queue's
 * wait_time as timeout: an idle runner sends no queries but its heartbeat
 * (registry.c, every few seconds).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "registry.h"
#include "schedule.h"
#include "workers.h"

#define FOREVER INT64_MAX
/* Completions of finished jobs wait at most this long for the next claim
 * to carry them (ms). */
#define DONE_WAIT_MS 20
/* With the locked lane, the loop's lease claims come at most this often
 * (ms); while they find nothing though messages are ready (first
 * deliveries, the workers'), the gap doubles up to LEFT_POLL_MAX_MS: such
 * a claim reads every ready row of the channels it visits, which with a
 * large backlog takes a good part of a second; claims that close together
 * would take as much of the server as the workers' own claims. */
#define LEFT_POLL_MS 250
#define LEFT_POLL_MAX_MS 4000
/* Commit batches (pqmq_runner_set_commit_batch): the most jobs a batch
 * transaction carries, at most the subtransactions (savepoints of handlers
 * that write) a transaction keeps in shared memory before every snapshot
 * has to look them up on disk; the default, and the default of how long
 * (ms) a batch stays open while more jobs are waiting. */
#define COMMIT_JOBS_MAX 64
#define COMMIT_JOBS_DEFAULT 64
#define COMMIT_OPEN_MS_MAX 60000
#define COMMIT_OPEN_MS_DEFAULT 50
/* Channel names of at most this many bytes (in the server's encoding) have
 * a notify channel of their own, mq_<name> (_mq_wake). */
#define PQMQ_MAX_CHANNEL_NOTIFY 60

struct pqmq_runner {
    char *conninfo;
    pqmq__route *routes;
    size_t nroutes;
    char **channels; /* NULL: all */
    size_t nchannels;
    int threads, batch;
    int locked;      /* pqmq_runner_set_locked */
    int commit_jobs; /* pqmq_runner_set_commit_batch; 1: a commit per job */
    int64_t commit_open_ms;
    int64_t keep_alive_ms;
    char *stop_channel;
    char *listen_conninfo; /* NULL: the control connection LISTENs */
    pqmq__schedule **schedules;
    size_t nschedules;
    char errmsg[512];
    pqmq__logger log; /* pqmq_runner_set_log; its lock is log_lock */
    pthread_mutex_t log_lock;
    char label[160]; /* "pqmq_runner (channels: a, b)": starts each log line */

    atomic_int stop;
    int wake_pipe[2];        /* workers and pqmq_runner_stop write one byte */
    atomic_int wake_pending; /* a byte is in the pipe: writers need not add one */
    pqmq__counters counters;
};

static void wake(void *runner);

/* ---- configuration ---------------------------------------------------- */

PQMQ_EXPORT pqmq_runner *pqmq_runner_new(const char *conninfo)
{
    pqmq_runner *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->conninfo = strdup(conninfo ? conninfo : "");
    if (!r->conninfo || pipe(r->wake_pipe) != 0) {
        free(r->conninfo);
        free(r);
        return NULL;
    }
    for (int i = 0; i < 2; i++) {
        fcntl(r->wake_pipe[i], F_SETFL, O_NONBLOCK);
        fcntl(r->wake_pipe[i], F_SETFD, FD_CLOEXEC);
    }
    r->threads = 4;
    r->batch = 100;
    r->commit_jobs = 1;
    r->commit_open_ms = COMMIT_OPEN_MS_DEFAULT;
    pthread_mutex_init(&r->log_lock, NULL);
    r->log.lock = &r->log_lock;
    return r;
}

PQMQ_EXPORT void pqmq_runner_free(pqmq_runner *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nroutes; i++)
        free(r->routes[i].name);
    free(r->routes);
    for (size_t i = 0; i < r->nchannels; i++)
        free(r->channels[i]);
    free(r->channels);
    for (size_t i = 0; i < r->nschedules; i++)
        pqmq__schedule_free(r->schedules[i]);
    free(r->schedules);
    free(r->stop_channel);
    free(r->listen_conninfo);
    free(r->conninfo);
    close(r->wake_pipe[0]);
    close(r->wake_pipe[1]);
    pthread_mutex_destroy(&r->log_lock);
    free(r);
}

/* Registers fn or group for name. */
static int add_route(pqmq_runner *r, const char *name, pqmq_handler fn,
                     pqmq_group_handler group, void *arg)
{
    if (!r || (!fn && !group))
        return PQMQ_EINVAL;
    char *copy = NULL;
    if (name && !(copy = strdup(name)))
        return PQMQ_ENOMEM;
    pqmq__route *grown = realloc(r->routes, (r->nroutes + 1) * sizeof *grown);
    if (!grown) {
        free(copy);
        return PQMQ_ENOMEM;
    }
    r->routes = grown;
    r->routes[r->nroutes++] = (pqmq__route){copy, fn, group, arg};
    return 0;
}

PQMQ_EXPORT int pqmq_runner_handle(pqmq_runner *r, const char *name, pqmq_handler fn, void *arg)
{
    return add_route(r, name, fn, NULL, arg);
}

PQMQ_EXPORT int pqmq_runner_handle_group(pqmq_runner *r, const char *name,
                                         pqmq_group_handler fn, void *arg)
{
    return add_route(r, name, NULL, fn, arg);
}

PQMQ_EXPORT int pqmq_runner_set_channels(pqmq_runner *r, const char *const *channels, size_t n)
{
    if (!r || (n && !channels))
        return PQMQ_EINVAL;
    char **copy = n ? calloc(n, sizeof *copy) : NULL;
    if (n && !copy)
        return PQMQ_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        if (!channels[i] || !(copy[i] = strdup(channels[i]))) {
            for (size_t k = 0; k < i; k++)
                free(copy[k]);
            free(copy);
            return channels[i] ? PQMQ_ENOMEM : PQMQ_EINVAL;
        }
    }
    for (size_t i = 0; i < r->nchannels; i++)
        free(r->channels[i]);
    free(r->channels);
    r->channels = copy;
    r->nchannels = n;
    return 0;
}

PQMQ_EXPORT int pqmq_runner_set_concurrency(pqmq_runner *r, int threads)
{
    if (!r || threads < 1 || threads > 256)
        return PQMQ_EINVAL;
    r->threads = threads;
    return 0;
}

PQMQ_EXPORT int pqmq_runner_set_batch(pqmq_runner *r, int batch_size)
{
    if (!r || batch_size < 1 || batch_size > PQMQ_MAX_BATCH)
        return PQMQ_EINVAL;
    r->batch = batch_size;
    return 0;
}

PQMQ_EXPORT int pqmq_runner_set_keep_alive(pqmq_runner *r, int64_t period_ms)
{
    if (!r || period_ms < 0 || period_ms > PQMQ_MAX_DURATION_MS / 3)
        return PQMQ_EINVAL;
    r->keep_alive_ms = period_ms;
    return 0;
}

PQMQ_EXPORT int pqmq_runner_set_locked(pqmq_runner *r, int on)
{
    if (!r)
        return PQMQ_EINVAL;
    r->locked = on != 0;
    return 0;
}

PQMQ_EXPORT int pqmq_runner_set_commit_batch(pqmq_runner *r, int max_jobs, int64_t max_open_ms)
{
    if (!r)
        return PQMQ_EINVAL;
    const char *what = "pqmq_runner_set_commit_batch";
    if (max_jobs < 0 || max_jobs > COMMIT_JOBS_MAX) {
        snprintf(r->errmsg, sizeof r->errmsg,
                 "%s: max_jobs %d is outside 0..%d (0: the default, %d; 1: each job commits "
                 "alone)",
                 what, max_jobs, COMMIT_JOBS_MAX, COMMIT_JOBS_DEFAULT);
        return PQMQ_EINVAL;
    }
    if (max_open_ms < 0 || max_open_ms > COMMIT_OPEN_MS_MAX) {
        snprintf(r->errmsg, sizeof r->errmsg,
                 "%s: max_open_ms %lld is outside 0..%d (0: the default, %d)", what,
                 (long long)max_open_ms, COMMIT_OPEN_MS_MAX, COMMIT_OPEN_MS_DEFAULT);
        return PQMQ_EINVAL;
    }
    r->commit_jobs = max_jobs ? max_jobs : COMMIT_JOBS_DEFAULT;
    r->commit_open_ms = max_open_ms ? max_open_ms : COMMIT_OPEN_MS_DEFAULT;
    return 0;
}

PQMQ_EXPORT int pqmq_runner_set_stop_channel(pqmq_runner *r, const char *channel)
{
    /* A notify channel is an identifier: 1..63 bytes. */
    if (!r || (channel && (!*channel || strlen(channel) > 63)))
        return PQMQ_EINVAL;
    char *copy = NULL;
    if (channel && !(copy = strdup(channel)))
        return PQMQ_ENOMEM;
    free(r->stop_channel);
    r->stop_channel = copy;
    return 0;
}

PQMQ_EXPORT int pqmq_runner_set_listen_dsn(pqmq_runner *r, const char *conninfo)
{
    if (!r)
        return PQMQ_EINVAL;
    char *copy = NULL;
    if (conninfo && !(copy = strdup(conninfo)))
        return PQMQ_ENOMEM;
    free(r->listen_conninfo);
    r->listen_conninfo = copy;
    return 0;
}

PQMQ_EXPORT int pqmq_runner_schedule(pqmq_runner *r, const char *name, const char *cron,
                                     const char *time_zone, const pqmq_msg *msg,
                                     pqmq_backfill backfill)
{
    if (!r)
        return PQMQ_EINVAL;
    pqmq__schedule *s = NULL;
    int rc = pqmq__schedule_new(name, cron, time_zone, msg, backfill, &s, r->errmsg,
                                sizeof r->errmsg);
    if (rc)
        return rc;
    pqmq__schedule **grown = realloc(r->schedules, (r->nschedules + 1) * sizeof *grown);
    if (!grown) {
        pqmq__schedule_free(s);
        return PQMQ_ENOMEM;
    }
    r->schedules = grown;
    r->schedules[r->nschedules++] = s;
    return 0;
}

PQMQ_EXPORT int pqmq_runner_set_log(pqmq_runner *r, pqmq_log_fn fn, void *ctx)
{
    if (!r)
        return PQMQ_EINVAL;
    r->log.fn = fn;
    r->log.ctx = ctx;
    return 0;
}

/* Names the runner in its log lines by its channels, "pqmq_runner
 * (channels: a, b)" or "(all channels)", shortened to fit: the operator of
 * several runners greps for the one that lost its connection. */
static void make_label(pqmq_runner *r)
{
    size_t cap = sizeof r->label, n;
    if (!r->nchannels) {
        snprintf(r->label, cap, "pqmq_runner (all channels)");
        return;
    }
    n = (size_t)snprintf(r->label, cap,
                         "pqmq_runner (channel%s: ", r->nchannels > 1 ? "s" : "");
    for (size_t i = 0; i < r->nchannels; i++) {
        char more[48];
        snprintf(more, sizeof more, ", ... %zu in all)", r->nchannels);
        const char *sep = i ? ", " : "";
        size_t need = strlen(sep) + strlen(r->channels[i]) + 1;
        /* Room for this name and, if others follow, the tail "... N in all". */
        if (n + need + (i + 1 < r->nchannels ? strlen(more) : 0) >= cap) {
            snprintf(r->label + n, cap - n, "%s", more + (i ? 0 : 2));
            return;
        }
        n += (size_t)snprintf(r->label + n, cap - n, "%s%s", sep, r->channels[i]);
    }
    snprintf(r->label + n, cap - n, ")");
}

PQMQ_EXPORT const char *pqmq_runner_errmsg(const pqmq_runner *r)
{
    return r ? r->errmsg : "";
}

PQMQ_EXPORT void pqmq_runner_stop(pqmq_runner *r)
{
    if (!r)
        return;
    atomic_store(&r->stop, 1);
    wake(r);
}

/* Wakes the main loop (async-signal-safe). */
static void wake(void *runner)
{
    pqmq_runner *r = runner;
    /* One byte per loop turn is enough; saves a system call per job. */
    if (atomic_exchange(&r->wake_pending, 1))
        return;
    int saved = errno; /* we may be in a signal handler */
    ssize_t ignored = write(r->wake_pipe[1], "x", 1);
    (void)ignored; /* a full pipe already guarantees a wake-up */
    errno = saved;
}

PQMQ_EXPORT void pqmq_runner_stats(const pqmq_runner *r, pqmq_runner_stats_t *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!r)
        return;
    const pqmq__counters *k = &r->counters;
    out->processed = atomic_load(&k->processed);
    out->failed = atomic_load(&k->failed);
    out->in_flight = atomic_load(&k->in_flight);
    out->polls = atomic_load(&k->polls);
    out->wakeups = atomic_load(&k->wakeups);
    out->reconnects = atomic_load(&k->reconnects);
}

/* ---- the loop --------------------------------------------------------- */

struct loop {
    pqmq_runner *r;
    pqmq__claims *q;
    pqmq_client *ctl;
    pqmq_client *lis;   /* LISTENs: ctl, or its own (pqmq_runner_set_listen_dsn) */
    int poll_due;       /* something may be ready now */
    int64_t poll_at;    /* or: when the earliest message becomes ready */
    uint64_t settled;   /* processed + failed when the loop last looked */
    int64_t left_at;    /* locked lane: no lease claim before this */
    int64_t left_gap;   /* locked lane: ms from a lease claim to the next */
    int64_t tick_at;    /* schedules: evaluate them next at this time */
    pqmq__registry reg; /* the runner's entry in mq_workers */
};

/* Whether the server notifies mq_<channel> for this channel (_mq_wake: a
 * name of at most 60 bytes). The server counts bytes in its own encoding,
 * which a client in another encoding cannot: ask it, on the connection
 * that LISTENs (whose encoding the name is in). */
static int own_notify_name(struct loop *L, const char *channel, int *fits)
{
    PGparam *param;
    pqmq__enter(L->lis, "LISTEN");
    int rc = pqmq__begin(L->lis, &param);
    if (!rc && !PQputf(param, "%text", channel))
        rc = pqmq__err(L->lis, PQMQ_ENOMEM, "%s", PQgeterror());
    if (!rc)
        rc = pqmq__exec_scalar(L->lis, param, "SELECT pg_catalog.octet_length($1) <= 60",
                               "%bool", fits);
    PQparamClear(param);
    /* A name the server measures as short is short here too, in any
     * encoding PostgreSQL serves (at most 4 bytes per character). */
    if (!rc && *fits && strlen(channel) > PQMQ_MAX_CHANNEL_NOTIFY * 4)
        *fits = 0;
    return rc;
}

/* LISTENs on what this runner serves: mq_<channel> per channel, or mq
 * (all channels, or a name too long for its own notify channel). */
static int listen_all(struct loop *L)
{
    pqmq_runner *r = L->r;
    PGconn *conn = pqmq_conn(L->lis);
    int generic = r->nchannels == 0;
    size_t n = r->nchannels + 2;
    for (size_t i = 0; i < n; i++) {
        char name[4 + PQMQ_MAX_CHANNEL_NOTIFY * 4];
        const char *ch;
        if (i < r->nchannels) {
            int fits = 0, rc = own_notify_name(L, r->channels[i], &fits);
            if (rc)
                return rc;
            if (!fits) {
                generic = 1;
                continue;
            }
            snprintf(name, sizeof name, "mq_%s", r->channels[i]);
            ch = name;
        } else if (i == r->nchannels) {
            if (!generic)
                continue;
            ch = "mq";
        } else {
            if (!r->stop_channel)
                continue;
            ch = r->stop_channel;
        }
        char *ident = PQescapeIdentifier(conn, ch, strlen(ch));
        if (!ident)
            return PQMQ_ECONN;
        char sql[16 + 2 * sizeof name];
        snprintf(sql, sizeof sql, "LISTEN %s", ident);
        PQfreemem(ident);
        int rc;
        pqmq__enter(L->lis, "LISTEN");
        PQclear(pqmq__exec_text(L->lis, sql, &rc));
        if (rc)
            return rc;
    }
    return 0;
}

/* Re-establishes the control connection (retrying until it works or a stop
 * is requested), LISTENs again and forces a poll: notifications sent while
 * we were away are lost, the messages are not. Logs the loss, each failed
 * attempt and the outcome. */
static void reconnect(struct loop *L)
{
    pqmq_runner *r = L->r;
    pqmq_client *bad =
        L->lis != L->ctl && PQstatus(pqmq_conn(L->lis)) == CONNECTION_BAD ? L->lis : L->ctl;
    char why[800];
    pqmq__conn_error(bad, why, sizeof why);
    pqmq__log(&r->log, PQMQ_LOG_WARN, "%s: lost connection (%s connection): %s; reconnecting",
              r->label, bad == L->ctl ? "control" : "listen", why);
    int64_t since = pqmq__now_ms();
    int attempts = 0;
    for (int64_t delay = 50; !atomic_load(&r->stop); delay = delay < 2000 ? delay * 2 : delay) {
        attempts++;
        int rc = pqmq__reset_conn(L->ctl);
        bad = L->ctl;
        if (!rc && L->lis != L->ctl) {
            rc = pqmq__reset_conn(L->lis);
            bad = L->lis;
        }
        if (!rc) {
            rc = listen_all(L);
            bad = L->lis;
        }
        if (!rc) {
            atomic_fetch_add(&r->counters.reconnects, 1);
            L->poll_due = 1;
            pqmq__log(&r->log, PQMQ_LOG_INFO,
                      "%s: reconnected after %lld ms (control connection, %d attempt%s)",
                      r->label, (long long)(pqmq__now_ms() - since), attempts,
                      attempts == 1 ? "" : "s");
            return;
        }
        pqmq__conn_error(bad, why, sizeof why);
        pqmq__log(&r->log, PQMQ_LOG_WARN,
                  "%s: reconnect attempt %d failed (%s connection): %s; next attempt in %lld "
                  "ms",
                  r->label, attempts, bad == L->ctl ? "control" : "listen", why,
                  (long long)delay);
        struct timespec ts = {(time_t)(delay / 1000), (long)(delay % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    pqmq__log(&r->log, PQMQ_LOG_WARN, "%s: stopping, not reconnected after %lld ms", r->label,
              (long long)(pqmq__now_ms() - since));
}

/* Stopping, or no worker can run them: hands queued (unstarted) jobs back
 * to the queue at once, so other consumers need not wait for their leases
 * to run out. */
static void release_queued(struct loop *L)
{
    pqmq__delivery *d;
    size_t n = pqmq__claims_take_queued(L->q, &d);
    if (n)
        (void)pqmq__release(L->ctl, d, n);
    free(d);
}

/* The first n completions sent were settled, done of them completed. */
static void drop_done(struct loop *L, size_t n, size_t done)
{
    pqmq__claims_drop_done(L->q, n);
    atomic_fetch_add(&L->r->counters.processed, done);
    L->settled += done; /* our own completions: no reason to poll again */
}

/* Completes, in one statement fenced by attempt, every job whose handler
 * succeeded, without polling: a job whose lease ran out and went to another
 * consumer is left to it. */
static void flush_done(struct loop *L)
{
    pqmq__delivery *d;
    size_t n = pqmq__claims_done(L->q, &d), done = 0;
    int rc = 0;
    if (n && !(rc = pqmq__enter(L->ctl, "pqmq_runner: complete")))
        rc = pqmq__complete(L->ctl, d, n, &done);
    if (n && (rc == 0 || rc == PQMQ_ESTALE)) {
        drop_done(L, n, done);
        L->poll_due = 1; /* completing chain heads may have readied more */
    } else if (rc == PQMQ_ECONN) {
        reconnect(L); /* keep them; completing twice is harmless */
    }
    free(d);
}

/* Claims up to want jobs into *b, completing what the workers finished in
 * the same statement: one round trip and one commit for both. Returns 0
 * (stale completions belong to their new owner) or the error. */
static int complete_and_claim(struct loop *L, int want, pqmq_batch **b)
{
    pqmq_runner *r = L->r;
    pqmq__delivery *d;
    size_t n = pqmq__claims_done(L->q, &d), done = 0;
    atomic_fetch_add(&r->counters.polls, 1);
    pqmq__enter(L->ctl, "pqmq_runner: poll");
    int rc = pqmq__complete_poll(L->ctl, d, n, (const char *const *)r->channels, r->nchannels,
                                 want, b, &done);
    free(d);
    if (rc == PQMQ_ESTALE)
        rc = 0;
    if (!rc && n)
        drop_done(L, n, done);
    return rc; /* on error the completions stay, to be sent again */
}

/* The locked lane's workers claim first deliveries for themselves; the
 * loop claims, with leases, what they leave (retries, messages whose
 * locked delivery died), at most every LEFT_POLL_MS: that poll cannot tell
 * when such a message is due from when any is. */
static void poll_left(struct loop *L)
{
    pqmq_runner *r = L->r;
    flush_done(L);
    int64_t now = pqmq__now_ms();
    int want = pqmq__claims_room(L->q);
    if (!want || now < L->left_at) {
        /* Not yet, or no room (queue full, or no worker up): look again
         * then; nothing else need wake us when the workers come back. */
        L->poll_due = 0;
        L->poll_at = want ? L->left_at : now + LEFT_POLL_MS;
        return;
    }
    want = want < r->batch ? want : r->batch;
    pqmq_batch *b = NULL;
    atomic_fetch_add(&r->counters.polls, 1);
    pqmq__enter(L->ctl, "pqmq_runner: poll");
    int rc = pqmq__poll(L->ctl, (const char *const *)r->channels, r->nchannels, want, 1, &b);
    if (rc == PQMQ_ECONN) {
        reconnect(L);
        return;
    }
    size_t got = rc ? 0 : pqmq_batch_count(b);
    L->poll_due = got == (size_t)want;
    int64_t wait = rc ? LEFT_POLL_MS : pqmq_batch_wait_ms(b);
    if (!rc && !got && wait == 0)
        L->left_gap = L->left_gap * 2 < LEFT_POLL_MAX_MS ? L->left_gap * 2 : LEFT_POLL_MAX_MS;
    else
        L->left_gap = LEFT_POLL_MS;
    L->left_at = now + L->left_gap;
    L->poll_at = wait < 0 ? FOREVER : now + (wait > L->left_gap ? wait : L->left_gap);
    if (got)
        pqmq__claims_add(L->q, b);
    else
        pqmq_batch_free(b);
}

static void poll_once(struct loop *L)
{
    pqmq_runner *r = L->r;
    if (r->locked) {
        poll_left(L);
        return;
    }
    int free_n = pqmq__claims_room(L->q);
    if (!free_n) {
        /* Completions ride with the next claim, which comes once half the
         * queue is free: sent alone, each worker's finish cost a statement
         * and a commit. Alone only once one has waited DONE_WAIT_MS. */
        if (pqmq__now_ms() - pqmq__claims_done_since(L->q) >= DONE_WAIT_MS)
            flush_done(L);
        return; /* a finishing worker wakes us; poll_due stays set */
    }
    int want = free_n < r->batch ? free_n : r->batch;
    pqmq_batch *b = NULL;
    int rc = complete_and_claim(L, want, &b);
    if (rc == PQMQ_ECONN) {
        reconnect(L);
        return;
    }
    if (rc) {
        /* A server-side error (e.g. statement_timeout): complete on their
         * own, and poll again soon. */
        flush_done(L);
        L->poll_due = 0;
        L->poll_at = pqmq__now_ms() + 100;
        return;
    }
    size_t got = pqmq_batch_count(b);
    /* A full batch means more may be ready; otherwise wait for a wake-up
     * or for the earliest message to become ready. */
    L->poll_due = got == (size_t)want;
    if (got == 0) {
        int64_t wait = pqmq_batch_wait_ms(b);
        L->poll_at = wait < 0 ? FOREVER : pqmq__now_ms() + (wait > 0 ? wait : 1);
        pqmq_batch_free(b);
        return;
    }
    pqmq__claims_add(L->q, b);
}

/* Extends every held lease (queued or running) in one statement, by the
 * longest lease held (or three configured periods). */
static void keep_alive(struct loop *L)
{
    uuid_t *ids;
    int64_t duration;
    size_t n = pqmq__claims_leases(L->q, L->r->keep_alive_ms, &ids, &duration);
    int64_t sent_at = pqmq__now_ms();
    int rc = n ? pqmq_keep_alive(L->ctl, (const uuid_t *)ids, n, duration, NULL) : 0;
    if (rc == PQMQ_ECONN)
        reconnect(L);
    else if (rc == 0)
        pqmq__claims_extended(L->q, (const uuid_t *)ids, n, sent_at, duration);
    free(ids);
}

/* Handles the notifications libpq has already read; a stop-channel one
 * requests a stop. Returns how many there were. */
static int handle_notifications(struct loop *L)
{
    PGnotify *n;
    int count = 0;
    while ((n = PQnotifies(pqmq_conn(L->lis))) != NULL) {
        if (L->r->stop_channel && !strcmp(n->relname, L->r->stop_channel)) {
            atomic_store(&L->r->stop, 1);
        } else {
            L->poll_due = 1;
            if (L->r->locked)
                pqmq__claims_kick(L->q); /* the workers poll for themselves */
        }
        atomic_fetch_add(&L->r->counters.wakeups, 1);
        PQfreemem(n);
        count++;
    }
    return count;
}

/* Reads what the socket holds, then handles the notifications in it. */
static void take_notifications(struct loop *L)
{
    if (!PQconsumeInput(pqmq_conn(L->lis))) {
        reconnect(L);
        return;
    }
    handle_notifications(L);
}

/* Sleeps until a notification, a worker finishing, a stop, or deadline. */
static void wait_events(struct loop *L, int64_t deadline)
{
    /* A notification that arrived right behind a query's result is already
     * in libpq's buffer, not in the socket: poll(2) would sleep on it. */
    if (handle_notifications(L))
        return;
    struct pollfd fds[2] = {{PQsocket(pqmq_conn(L->lis)), POLLIN, 0},
                            {L->r->wake_pipe[0], POLLIN, 0}};
    int64_t left = deadline == FOREVER ? -1 : deadline - pqmq__now_ms();
    if (deadline != FOREVER && left < 0)
        left = 0;
    int timeout = left > 60000 || left < 0 ? 60000 : (int)left;
    /* A minute at most: cheap insurance against a lost wake-up. */
    if (poll(fds, 2, timeout) < 0)
        return;
    if (fds[1].revents) {
        char buf[64];
        while (read(L->r->wake_pipe[0], buf, sizeof buf) > 0)
            ;
        /* Before the loop looks at the state: a change after this writes a
         * byte again, and one before it is seen by this turn. */
        atomic_store(&L->r->wake_pending, 0);
    }
    if (fds[0].revents)
        take_notifications(L);
    else if (PQstatus(pqmq_conn(L->ctl)) != CONNECTION_OK ||
             PQstatus(pqmq_conn(L->lis)) != CONNECTION_OK)
        reconnect(L);
}

/* Evaluates every schedule, then again a second into the next minute (a
 * slot is a minute). A failure is retried at the next tick: the slots wait
 * for it (mq_schedules remembers how far each schedule got). */
static void tick_schedules(struct loop *L)
{
    pqmq_runner *r = L->r;
    if (!r->nschedules || pqmq__now_ms() < L->tick_at)
        return;
    for (size_t i = 0; i < r->nschedules; i++)
        pqmq__schedule_tick(L->ctl, r->schedules[i]);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t into_minute = (int64_t)(now.tv_sec % 60) * 1000 + now.tv_nsec / 1000000;
    L->tick_at = pqmq__now_ms() + 61000 - into_minute;
}

static void loop_run(struct loop *L)
{
    pqmq_runner *r = L->r;
    for (;;) {
        take_notifications(L); /* also those read during earlier queries */
        /* A job that failed (its retry is due after the backoff) or that
         * completed in its handler's transaction freed a slot without a
         * notification, and poll_at may predate it: poll to learn what is
         * ready and when. */
        uint64_t settled =
            atomic_load(&r->counters.processed) + atomic_load(&r->counters.failed);
        if (settled != L->settled) {
            L->settled = settled;
            L->poll_due = 1;
        }
        int stopping = atomic_load(&r->stop);
        if (stopping) {
            flush_done(L);
            release_queued(L);
            if (!pqmq__claims_busy(L->q))
                break;
        } else {
            /* No worker can run them: other consumers may. */
            if (!pqmq__claims_any_up(L->q))
                release_queued(L);
            if (!L->poll_due && pqmq__now_ms() >= L->poll_at)
                L->poll_due = 1;
            if (L->poll_due)
                poll_once(L); /* also completes what is done */
            else
                flush_done(L);
        }
        if (!stopping) {
            tick_schedules(L);
            pqmq__registry_beat(&L->reg, L->ctl, &r->counters);
        }
        int64_t deadline = pqmq__claims_keep_alive_at(L->q, r->keep_alive_ms);
        if (r->nschedules && !stopping && L->tick_at < deadline)
            deadline = L->tick_at;
        if (!stopping && L->reg.beat_at < deadline)
            deadline = L->reg.beat_at;
        if (deadline <= pqmq__now_ms()) {
            keep_alive(L);
            deadline = pqmq__claims_keep_alive_at(L->q, r->keep_alive_ms);
        }
        if (!stopping && !L->poll_due && L->poll_at < deadline)
            deadline = L->poll_at;
        if (!stopping && L->poll_due && pqmq__claims_room(L->q))
            deadline = pqmq__now_ms(); /* more to claim right away */
        int64_t done_since = pqmq__claims_done_since(L->q);
        if (done_since != INT64_MAX && done_since + DONE_WAIT_MS < deadline)
            deadline = done_since + DONE_WAIT_MS; /* poll_once flushes them */
        wait_events(L, deadline);
    }
    flush_done(L);
}

/* Sends a connection's notices to the runner's log, its FATAL last words
 * to the "lost connection" line (c NULL: no memory, nothing to do). */
static void runner_client_log(pqmq_runner *r, pqmq_client *c, const char *label)
{
    if (!c)
        return;
    pqmq__client_set_log(c, &r->log, label);
    c->keep_last_words = 1;
}

static void loop_close(struct loop *L)
{
    if (L->lis != L->ctl)
        pqmq_client_free(L->lis);
    pqmq_client_free(L->ctl);
}

PQMQ_EXPORT int pqmq_runner_run(pqmq_runner *r)
{
    if (!r)
        return PQMQ_EINVAL;
    r->errmsg[0] = '\0';
    if (r->nroutes == 0) {
        snprintf(r->errmsg, sizeof r->errmsg, "pqmq_runner_run: no handler registered");
        return PQMQ_EINVAL;
    }
    make_label(r);
    struct loop L = {.r = r, .poll_due = 1, .left_gap = LEFT_POLL_MS};
    int rc = pqmq_connect(r->conninfo, &L.ctl);
    L.lis = L.ctl;
    if (!rc && r->listen_conninfo)
        rc = pqmq_connect(r->listen_conninfo, &L.lis);
    char label[sizeof r->label + 32];
    snprintf(label, sizeof label, "%s: control connection", r->label);
    runner_client_log(r, L.ctl, label);
    snprintf(label, sizeof label, "%s: listen connection", r->label);
    if (L.lis != L.ctl)
        runner_client_log(r, L.lis, label);
    if (!rc)
        rc = listen_all(&L);
    /* The first evaluation of each schedule checks its time zone. */
    for (size_t i = 0; !rc && i < r->nschedules; i++) {
        if ((rc = pqmq__schedule_tick(L.ctl, r->schedules[i]))) {
            char why[400];
            snprintf(why, sizeof why, "%s", pqmq_errmsg(L.ctl));
            rc = pqmq__seterr(L.ctl, rc, "schedule %s: %s",
                              pqmq__schedule_name(r->schedules[i]), why);
        }
    }
    if (r->nschedules)
        L.tick_at = pqmq__now_ms() + 1000;
    if (rc) {
        pqmq_client *bad = L.lis != L.ctl ? L.lis : L.ctl; /* NULL: no memory */
        snprintf(r->errmsg, sizeof r->errmsg, "pqmq_runner_run: %s%s",
                 bad == L.ctl ? "" : "listen connection: ",
                 bad ? pqmq_errmsg(bad) : pqmq_strerror(rc));
        loop_close(&L);
        return rc;
    }
    /* Room for two batches: the next full batch is claimed (with the
     * completions of the last) while the workers still run this one. */
    int capacity = 2 * r->batch > r->threads ? 2 * r->batch : r->threads;
    /* Commit batches hold their jobs until they commit: room for those too
     * (a group handler's take up to a claim's worth, in one savepoint). */
    int group_most = r->commit_jobs > r->batch ? r->commit_jobs : r->batch;
    if (!r->locked && r->commit_jobs > 1)
        capacity += r->threads * group_most;
    L.q = pqmq__claims_new(capacity, r->threads, wake, r, &r->counters.in_flight);
    /* Each locked worker's batch: the batch size, at most 64, the
     * subtransactions (savepoints of handlers that write) a transaction
     * keeps in shared memory before every snapshot has to look them up on
     * disk. (A share of the batch made polls too small to pay for
     * themselves: a poll costs about the same for 13 messages as for 64.) */
    int share = r->batch;
    pqmq__worker_env env = {r->conninfo,
                            r->routes,
                            r->nroutes,
                            &r->stop,
                            &r->counters,
                            L.q,
                            r->locked ? (share < 64 ? share : 64) : 0,
                            (const char *const *)r->channels,
                            r->nchannels,
                            r->locked ? 1 : r->commit_jobs,
                            r->commit_open_ms,
                            group_most,
                            &r->log,
                            r->label};
    char why[256] = "out of memory";
    pqmq__workers *workers = NULL;
    rc = L.q ? pqmq__workers_start(&env, r->threads, &workers, why, sizeof why) : PQMQ_ENOMEM;
    if (rc) {
        snprintf(r->errmsg, sizeof r->errmsg, "pqmq_runner_run: %s", why);
        pqmq__claims_free(L.q);
        loop_close(&L);
        return rc;
    }
    pqmq__registry_join(&L.reg, L.ctl, r->channels, r->nchannels, r->threads);
    pqmq__log(&r->log, PQMQ_LOG_INFO, "%s: started: %d worker%s, batch %d%s", r->label,
              r->threads, r->threads == 1 ? "" : "s", r->batch,
              r->locked ? ", locked lane" : "");
    loop_run(&L);
    pqmq__workers_join(workers);
    flush_done(&L); /* results of the last handlers */
    pqmq__registry_leave(&L.reg, L.ctl);
    loop_close(&L);
    pqmq__claims_free(L.q);
    pqmq__log(&r->log, PQMQ_LOG_INFO, "%s: stopped: %llu processed, %llu failed", r->label,
              (unsigned long long)atomic_load(&r->counters.processed),
              (unsigned long long)atomic_load(&r->counters.failed));
    return 0;
}
