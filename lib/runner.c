/*
 * runner.c: the worker loop. One control connection LISTENs, polls, keeps
 * in-flight jobs alive and completes finished ones in batches; worker
 * threads (worker.c) run the handlers. Between polls the loop sleeps in
 * poll(2) on the control socket and a self-pipe, with the queue's
 * wait_time as timeout: an idle runner sends no queries.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pqmq-int.h"

#define FOREVER INT64_MAX

int64_t pqmq__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

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
    pthread_mutex_init(&r->lock, NULL);
    /* Monotonic, so that a worker's reconnect backoff ignores clock jumps. */
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&r->work, &attr);
    pthread_condattr_destroy(&attr);
    r->threads = 4;
    r->batch = 100;
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
    free(r->stop_channel);
    free(r->conninfo);
    free(r->done);
    free(r->done_attempts);
    close(r->wake_pipe[0]);
    close(r->wake_pipe[1]);
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->work);
    free(r);
}

PQMQ_EXPORT int pqmq_runner_handle(pqmq_runner *r, const char *name, pqmq_handler fn,
                                   void *arg)
{
    if (!r || !fn)
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
    r->routes[r->nroutes++] = (pqmq__route){copy, fn, arg};
    return 0;
}

PQMQ_EXPORT int pqmq_runner_set_channels(pqmq_runner *r, const char *const *channels,
                                         size_t n)
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

PQMQ_EXPORT const char *pqmq_runner_errmsg(const pqmq_runner *r)
{
    return r ? r->errmsg : "";
}

PQMQ_EXPORT void pqmq_runner_stop(pqmq_runner *r)
{
    if (!r)
        return;
    atomic_store(&r->stop, 1);
    pqmq__runner_wake(r);
}

void pqmq__runner_wake(pqmq_runner *r)
{
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
    out->processed = atomic_load(&r->processed);
    out->failed = atomic_load(&r->failed);
    out->in_flight = atomic_load(&r->in_flight);
    out->polls = atomic_load(&r->polls);
    out->wakeups = atomic_load(&r->wakeups);
    out->reconnects = atomic_load(&r->reconnects);
}

/* ---- the loop --------------------------------------------------------- */

struct loop {
    pqmq_runner *r;
    pqmq_client *ctl;
    int poll_due;      /* something may be ready now */
    int64_t poll_at;   /* or: when the earliest message becomes ready */
    uint64_t settled;  /* processed + failed when the loop last looked */
};

/* LISTENs on what this runner serves: mq_<channel> per channel, or mq
 * (all channels, or a name too long for its own notify channel). */
static int listen_all(struct loop *L)
{
    pqmq_runner *r = L->r;
    PGconn *conn = pqmq_conn(L->ctl);
    int generic = r->nchannels == 0;
    size_t n = r->nchannels + 2;
    for (size_t i = 0; i < n; i++) {
        char name[80];
        const char *ch;
        if (i < r->nchannels) {
            if (strlen(r->channels[i]) > 60) {
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
        char sql[200];
        snprintf(sql, sizeof sql, "LISTEN %s", ident);
        PQfreemem(ident);
        int rc;
        PQclear(pqmq__exec_text(L->ctl, sql, "LISTEN", &rc));
        if (rc)
            return rc;
    }
    return 0;
}

/* Re-establishes the control connection (retrying until it works or a stop
 * is requested), LISTENs again and forces a poll: notifications sent while
 * we were away are lost, the messages are not. */
static void reconnect(struct loop *L)
{
    for (int64_t delay = 50; !atomic_load(&L->r->stop); delay = delay < 2000 ? delay * 2 : delay) {
        if (pqmq__reconnect(L->ctl) == 0 && listen_all(L) == 0) {
            atomic_fetch_add(&L->r->reconnects, 1);
            L->poll_due = 1;
            return;
        }
        struct timespec ts = {(time_t)(delay / 1000), (long)(delay % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* Counts free and queued entries (under the lock). */
static int count_free(pqmq_runner *r, int *queued)
{
    int free_n = 0, q = 0;
    for (int i = 0; i < r->capacity; i++) {
        free_n += r->entries[i].job == NULL;
        q += r->entries[i].job && !r->entries[i].running;
    }
    if (queued)
        *queued = q;
    return free_n;
}

/* Queues the jobs of b in free entries (there are enough: we polled for no
 * more than that) and wakes the workers. */
static void dispatch(pqmq_runner *r, pqmq_batch *b)
{
    size_t n = pqmq_batch_count(b);
    pqmq__held *held = malloc(sizeof *held);
    if (!held) {
        pqmq_batch_free(b); /* the leases run out and the jobs come back */
        return;
    }
    held->batch = b;
    held->refs = (int)n;
    int64_t now = pqmq__now_ms();
    pthread_mutex_lock(&r->lock);
    size_t k = 0;
    for (int i = 0; i < r->capacity && k < n; i++) {
        pqmq__entry *e = &r->entries[i];
        if (e->job)
            continue;
        e->job = pqmq_batch_job(b, k++);
        e->held = held;
        pqmq_job_id(e->job, e->id);
        e->attempt = pqmq_job_attempt(e->job);
        e->lease_ms = pqmq_job_lease_ms(e->job);
        e->extended_at_ms = now;
        e->running = 0;
        e->seq = r->next_seq++;
        atomic_fetch_add(&r->in_flight, 1);
    }
    pthread_cond_broadcast(&r->work);
    pthread_mutex_unlock(&r->lock);
}

/* Frees an entry whose job is settled or released (under the lock). */
void pqmq__entry_release(pqmq_runner *r, pqmq__entry *e)
{
    if (--e->held->refs == 0) {
        pqmq_batch_free(e->held->batch);
        free(e->held);
    }
    e->job = NULL;
    e->held = NULL;
    atomic_fetch_sub(&r->in_flight, 1);
}

/* Whether any worker can reach the server (under the lock): one that
 * cannot takes no job until it reconnects (worker.c). */
static int workers_up(const pqmq_runner *r)
{
    for (int i = 0; i < r->threads; i++)
        if (!r->slots[i].down)
            return 1;
    return 0;
}

static int no_worker_up(pqmq_runner *r)
{
    pthread_mutex_lock(&r->lock);
    int up = workers_up(r);
    pthread_mutex_unlock(&r->lock);
    return !up;
}

/* How many jobs to claim now: 0 while the queue is still well filled
 * (claims go in batches: when the queue ran dry or half of it is free). */
static int claim_room(pqmq_runner *r)
{
    int queued;
    pthread_mutex_lock(&r->lock);
    int free_n = count_free(r, &queued);
    int up = workers_up(r);
    pthread_mutex_unlock(&r->lock);
    if (!up || free_n == 0 || (queued > 0 && free_n < r->capacity / 2))
        return 0;
    return free_n;
}

/* Stopping: hands queued (unstarted) jobs back to the queue at once, so
 * other consumers need not wait for their leases to run out. */
static void release_queued(struct loop *L)
{
    pqmq_runner *r = L->r;
    uuid_t *ids = malloc((size_t)r->capacity * sizeof *ids);
    int *attempts = malloc((size_t)r->capacity * sizeof *attempts);
    size_t n = 0;
    pthread_mutex_lock(&r->lock);
    for (int i = 0; ids && attempts && i < r->capacity; i++) {
        pqmq__entry *e = &r->entries[i];
        if (!e->job || e->running)
            continue;
        memcpy(ids[n], e->id, sizeof(uuid_t));
        attempts[n++] = e->attempt;
        pqmq__entry_release(r, e);
    }
    pthread_mutex_unlock(&r->lock);
    if (n)
        (void)pqmq__release(L->ctl, (const uuid_t *)ids, attempts, n);
    free(ids);
    free(attempts);
}

/* Completes, in one statement, every job whose handler succeeded; fenced
 * by attempt, so a job whose lease ran out and went to another consumer is
 * left to it. */
/* Copies the ids and attempts the workers finished (under the lock); NULLs
 * and n 0 when there are none or memory ran out (then they wait). */
static size_t take_done(pqmq_runner *r, uuid_t **ids, int **attempts)
{
    pthread_mutex_lock(&r->lock);
    size_t n = r->ndone;
    *ids = n ? malloc(n * sizeof **ids) : NULL;
    *attempts = n ? malloc(n * sizeof **attempts) : NULL;
    if (*ids && *attempts) {
        memcpy(*ids, r->done, n * sizeof **ids);
        memcpy(*attempts, r->done_attempts, n * sizeof **attempts);
    } else {
        n = 0;
    }
    pthread_mutex_unlock(&r->lock);
    return n;
}

/* The first n of the done list were sent and settled, done of them
 * completed: drops them (workers may have appended meanwhile). */
static void drop_done(struct loop *L, size_t n, size_t done)
{
    pqmq_runner *r = L->r;
    pthread_mutex_lock(&r->lock);
    memmove(r->done, r->done + n, (r->ndone - n) * sizeof *r->done);
    memmove(r->done_attempts, r->done_attempts + n, (r->ndone - n) * sizeof *r->done_attempts);
    r->ndone -= n;
    pthread_mutex_unlock(&r->lock);
    atomic_fetch_add(&r->processed, done);
    L->settled += done; /* our own completions: no reason to poll again */
}

/* Completes what the workers finished, without polling. */
static void flush_done(struct loop *L)
{
    uuid_t *ids;
    int *attempts;
    size_t n = take_done(L->r, &ids, &attempts), done = 0;
    int rc = n ? pqmq__complete_fenced(L->ctl, (const uuid_t *)ids, attempts, n, &done) : 0;
    if (n && (rc == 0 || rc == PQMQ_ESTALE)) {
        drop_done(L, n, done);
        L->poll_due = 1; /* completing chain heads may have readied more */
    } else if (rc == PQMQ_ECONN) {
        reconnect(L); /* keep the ids; completing twice is harmless */
    }
    free(ids);
    free(attempts);
}

/* Claims up to want jobs into *b, completing what the workers finished in
 * the same statement: one round trip and one commit for both. Returns 0
 * (stale completions belong to their new owner) or the error. */
static int complete_and_claim(struct loop *L, int want, pqmq_batch **b)
{
    pqmq_runner *r = L->r;
    uuid_t *ids;
    int *attempts;
    size_t n = take_done(r, &ids, &attempts), done = 0;
    atomic_fetch_add(&r->polls, 1);
    int rc = pqmq__complete_poll(L->ctl, (const uuid_t *)ids, attempts, n,
                                 (const char *const *)r->channels, r->nchannels, want,
                                 "pqmq_runner", b, &done);
    free(ids);
    free(attempts);
    if (rc == PQMQ_ESTALE)
        rc = 0;
    if (!rc && n)
        drop_done(L, n, done);
    return rc; /* on error the completions stay, to be sent again */
}

static void poll_once(struct loop *L)
{
    pqmq_runner *r = L->r;
    int free_n = claim_room(r);
    if (!free_n) {
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
    dispatch(r, b);
}

/* The keep-alive period of a job: the configured one, or a third of its
 * lease. */
static int64_t period_of(const pqmq_runner *r, const pqmq__entry *e)
{
    if (r->keep_alive_ms > 0)
        return r->keep_alive_ms;
    return e->lease_ms / 3 > 10 ? e->lease_ms / 3 : 10;
}

/* When the next keep-alive is due (FOREVER with nothing in flight). */
static int64_t keep_alive_at(pqmq_runner *r)
{
    int64_t at = FOREVER;
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < r->capacity; i++) {
        pqmq__entry *e = &r->entries[i];
        if (e->job && e->extended_at_ms + period_of(r, e) < at)
            at = e->extended_at_ms + period_of(r, e);
    }
    pthread_mutex_unlock(&r->lock);
    return at;
}

/* Extends every in-flight lease (queued or running) in one statement, by
 * the longest lease in flight (or three configured periods). */
static void keep_alive(struct loop *L)
{
    pqmq_runner *r = L->r;
    uuid_t *ids = malloc((size_t)r->capacity * sizeof *ids);
    if (!ids)
        return;
    size_t n = 0;
    int64_t duration = 3 * r->keep_alive_ms;
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < r->capacity; i++) {
        pqmq__entry *e = &r->entries[i];
        if (!e->job)
            continue;
        memcpy(ids[n++], e->id, sizeof(uuid_t));
        if (!r->keep_alive_ms && e->lease_ms > duration)
            duration = e->lease_ms;
    }
    pthread_mutex_unlock(&r->lock);
    /* Other clients may lease for longer than the C API accepts. */
    if (duration > PQMQ_MAX_DURATION_MS)
        duration = PQMQ_MAX_DURATION_MS;
    int64_t sent_at = pqmq__now_ms();
    int rc = n ? pqmq_keep_alive(L->ctl, (const uuid_t *)ids, n, duration, NULL) : 0;
    if (rc == PQMQ_ECONN)
        reconnect(L);
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < r->capacity; i++) {
        pqmq__entry *e = &r->entries[i];
        for (size_t k = 0; rc == 0 && e->job && k < n; k++)
            if (!memcmp(e->id, ids[k], sizeof(uuid_t))) {
                e->extended_at_ms = sent_at;
                if (duration > e->lease_ms)
                    e->lease_ms = duration;
            }
    }
    pthread_mutex_unlock(&r->lock);
    free(ids);
}

/* Handles the notifications libpq has already read; a stop-channel one
 * requests a stop. Returns how many there were. */
static int handle_notifications(struct loop *L)
{
    PGnotify *n;
    int count = 0;
    while ((n = PQnotifies(pqmq_conn(L->ctl))) != NULL) {
        if (L->r->stop_channel && !strcmp(n->relname, L->r->stop_channel))
            atomic_store(&L->r->stop, 1);
        else
            L->poll_due = 1;
        atomic_fetch_add(&L->r->wakeups, 1);
        PQfreemem(n);
        count++;
    }
    return count;
}

/* Reads what the socket holds, then handles the notifications in it. */
static void take_notifications(struct loop *L)
{
    if (!PQconsumeInput(pqmq_conn(L->ctl))) {
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
    struct pollfd fds[2] = {{PQsocket(pqmq_conn(L->ctl)), POLLIN, 0},
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
    else if (PQstatus(pqmq_conn(L->ctl)) != CONNECTION_OK)
        reconnect(L);
}

/* Jobs claimed and not yet settled (queued or running). */
static int busy(pqmq_runner *r)
{
    pthread_mutex_lock(&r->lock);
    int n = r->capacity - count_free(r, NULL);
    pthread_mutex_unlock(&r->lock);
    return n;
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
        uint64_t settled = atomic_load(&r->processed) + atomic_load(&r->failed);
        if (settled != L->settled) {
            L->settled = settled;
            L->poll_due = 1;
        }
        int stopping = atomic_load(&r->stop);
        if (stopping) {
            flush_done(L);
            release_queued(L);
            if (!busy(r))
                break;
        } else {
            /* No worker can run them: other consumers may. */
            if (no_worker_up(r))
                release_queued(L);
            if (!L->poll_due && pqmq__now_ms() >= L->poll_at)
                L->poll_due = 1;
            if (L->poll_due)
                poll_once(L); /* also completes what is done */
            else
                flush_done(L);
        }
        int64_t deadline = keep_alive_at(r);
        if (deadline <= pqmq__now_ms()) {
            keep_alive(L);
            deadline = keep_alive_at(r);
        }
        if (!stopping && !L->poll_due && L->poll_at < deadline)
            deadline = L->poll_at;
        if (!stopping && L->poll_due && claim_room(r))
            deadline = pqmq__now_ms(); /* more to claim right away */
        wait_events(L, deadline);
    }
    flush_done(L);
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
    struct loop L = {r, NULL, 1, 0, 0};
    int rc = pqmq_connect(r->conninfo, &L.ctl);
    if (!rc)
        rc = listen_all(&L);
    if (rc) {
        snprintf(r->errmsg, sizeof r->errmsg, "pqmq_runner_run: %s",
                 L.ctl ? pqmq_errmsg(L.ctl) : pqmq_strerror(rc));
        pqmq_client_free(L.ctl);
        return rc;
    }
    r->capacity = r->batch > r->threads ? r->batch : r->threads;
    r->entries = calloc((size_t)r->capacity, sizeof *r->entries);
    if (!r->entries) {
        snprintf(r->errmsg, sizeof r->errmsg, "pqmq_runner_run: out of memory");
        pqmq_client_free(L.ctl);
        return PQMQ_ENOMEM;
    }
    if ((rc = pqmq__workers_start(r))) {
        free(r->entries);
        r->entries = NULL;
        pqmq_client_free(L.ctl);
        return rc;
    }
    loop_run(&L);
    pqmq__workers_join(r);
    flush_done(&L); /* results of the last handlers */
    pqmq_client_free(L.ctl);
    free(r->entries);
    r->entries = NULL;
    return 0;
}
