/*
 * claims.c: the runner's claim queue. The main loop claims jobs into it in
 * batches and collects what finished; workers take the oldest queued job
 * and settle it. One mutex guards all of it and is taken only here.
 */
#include <stdlib.h>
#include <string.h>

#include "claims.h"

/* A poll result shared by the jobs claimed from it. */
typedef struct {
    pqmq_batch *batch;
    int refs;
} held;

/* A claimed job: queued for a worker, or running. */
typedef struct {
    const pqmq_job *job; /* NULL: the entry is free */
    held *from;
    pqmq__delivery delivery;
    int running;  /* 0: queued */
    uint64_t seq; /* claim order: workers take the oldest */
    int64_t lease_ms;
    int64_t extended_at_ms; /* when its lease was last set (claim or keep-alive) */
} entry;

struct pqmq__claims {
    pthread_mutex_t lock;
    pthread_cond_t work; /* a job was queued, or shutdown */
    /* Down workers wait out their backoff here, not on work: a claim wakes
     * one worker, which must be one that takes jobs. */
    pthread_cond_t rest;
    int shutdown;
    entry *entries;
    int capacity;
    uint64_t next_seq;
    pqmq__delivery *done; /* handlers that succeeded, to be completed */
    size_t ndone, done_cap;
    int64_t done_since_ms; /* when the oldest of them finished (monotonic) */
    uint64_t kicks;        /* wake-ups passed on to locked workers */
    int *down;             /* per worker: cannot reach the server, takes no job */
    int workers;
    void (*wake)(void *);
    void *wake_arg;
    atomic_uint_fast64_t *in_flight;
};

pqmq__claims *pqmq__claims_new(int capacity, int workers, void (*wake)(void *), void *arg,
                               atomic_uint_fast64_t *in_flight)
{
    pqmq__claims *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->entries = calloc((size_t)capacity, sizeof *q->entries);
    q->down = calloc((size_t)workers, sizeof *q->down);
    if (!q->entries || !q->down) {
        free(q->entries);
        free(q->down);
        free(q);
        return NULL;
    }
    q->capacity = capacity;
    q->workers = workers;
    q->wake = wake;
    q->wake_arg = arg;
    q->in_flight = in_flight;
    pthread_mutex_init(&q->lock, NULL);
    /* Monotonic, so that a worker's reconnect backoff ignores clock jumps. */
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&q->work, &attr);
    pthread_cond_init(&q->rest, &attr);
    pthread_condattr_destroy(&attr);
    return q;
}

/* Frees an entry whose job is settled or handed back (under the lock). */
static void release(pqmq__claims *q, entry *e)
{
    if (--e->from->refs == 0) {
        pqmq_batch_free(e->from->batch);
        free(e->from);
    }
    e->job = NULL;
    e->from = NULL;
    atomic_fetch_sub(q->in_flight, 1);
}

void pqmq__claims_free(pqmq__claims *q)
{
    if (!q)
        return;
    for (int i = 0; i < q->capacity; i++)
        if (q->entries[i].job)
            release(q, &q->entries[i]);
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->work);
    pthread_cond_destroy(&q->rest);
    free(q->entries);
    free(q->down);
    free(q->done);
    free(q);
}

/* ---- the main loop's side ---------------------------------------------- */

/* Free entries, and queued ones in *queued (under the lock). */
static int count_free(const pqmq__claims *q, int *queued)
{
    int free_n = 0, n = 0;
    for (int i = 0; i < q->capacity; i++) {
        free_n += q->entries[i].job == NULL;
        n += q->entries[i].job && !q->entries[i].running;
    }
    if (queued)
        *queued = n;
    return free_n;
}

static int any_up(const pqmq__claims *q)
{
    for (int i = 0; i < q->workers; i++)
        if (!q->down[i])
            return 1;
    return 0;
}

int pqmq__claims_room(pqmq__claims *q)
{
    int queued;
    pthread_mutex_lock(&q->lock);
    int free_n = count_free(q, &queued);
    int up = any_up(q);
    pthread_mutex_unlock(&q->lock);
    if (!up || free_n == 0 || (queued > 0 && free_n < q->capacity / 2))
        return 0;
    return free_n;
}

void pqmq__claims_add(pqmq__claims *q, pqmq_batch *b)
{
    size_t n = pqmq_batch_count(b);
    held *h = malloc(sizeof *h);
    if (!h) {
        pqmq_batch_free(b); /* the leases run out and the jobs come back */
        return;
    }
    h->batch = b;
    h->refs = (int)n;
    int64_t now = pqmq__now_ms();
    pthread_mutex_lock(&q->lock);
    size_t k = 0;
    for (int i = 0; i < q->capacity && k < n; i++) {
        entry *e = &q->entries[i];
        if (e->job)
            continue;
        e->job = pqmq_batch_job(b, k++);
        e->from = h;
        e->delivery = *pqmq__job_delivery(e->job);
        e->lease_ms = pqmq_job_lease_ms(e->job);
        e->extended_at_ms = now;
        e->running = 0;
        e->seq = q->next_seq++;
        atomic_fetch_add(q->in_flight, 1);
    }
    /* One worker: it passes the word on if it leaves jobs queued (a group
     * handler's worker takes them all, and the others need not wake). */
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->lock);
}

size_t pqmq__claims_done(pqmq__claims *q, pqmq__delivery **out)
{
    pthread_mutex_lock(&q->lock);
    size_t n = q->ndone;
    *out = n ? malloc(n * sizeof **out) : NULL;
    if (*out)
        memcpy(*out, q->done, n * sizeof **out);
    else
        n = 0;
    pthread_mutex_unlock(&q->lock);
    return n;
}

void pqmq__claims_drop_done(pqmq__claims *q, size_t n)
{
    pthread_mutex_lock(&q->lock);
    /* Workers may have appended meanwhile: keep those. */
    memmove(q->done, q->done + n, (q->ndone - n) * sizeof *q->done);
    q->ndone -= n;
    if (q->ndone)
        q->done_since_ms = pqmq__now_ms(); /* close enough: they are newer */
    pthread_mutex_unlock(&q->lock);
}

int64_t pqmq__claims_done_since(pqmq__claims *q)
{
    pthread_mutex_lock(&q->lock);
    int64_t since = q->ndone ? q->done_since_ms : INT64_MAX;
    pthread_mutex_unlock(&q->lock);
    return since;
}

size_t pqmq__claims_take_queued(pqmq__claims *q, pqmq__delivery **out)
{
    size_t n = 0;
    *out = malloc((size_t)q->capacity * sizeof **out);
    pthread_mutex_lock(&q->lock);
    for (int i = 0; *out && i < q->capacity; i++) {
        entry *e = &q->entries[i];
        if (!e->job || e->running)
            continue;
        (*out)[n++] = e->delivery;
        release(q, e);
    }
    pthread_mutex_unlock(&q->lock);
    return n;
}

int pqmq__claims_busy(pqmq__claims *q)
{
    pthread_mutex_lock(&q->lock);
    int n = q->capacity - count_free(q, NULL);
    pthread_mutex_unlock(&q->lock);
    return n;
}

int pqmq__claims_any_up(pqmq__claims *q)
{
    pthread_mutex_lock(&q->lock);
    int up = any_up(q);
    pthread_mutex_unlock(&q->lock);
    return up;
}

static int64_t period_of(const entry *e, int64_t period_ms)
{
    if (period_ms > 0)
        return period_ms;
    return e->lease_ms / 3 > 10 ? e->lease_ms / 3 : 10;
}

int64_t pqmq__claims_keep_alive_at(pqmq__claims *q, int64_t period_ms)
{
    int64_t at = INT64_MAX;
    pthread_mutex_lock(&q->lock);
    for (int i = 0; i < q->capacity; i++) {
        const entry *e = &q->entries[i];
        if (e->job && e->extended_at_ms + period_of(e, period_ms) < at)
            at = e->extended_at_ms + period_of(e, period_ms);
    }
    pthread_mutex_unlock(&q->lock);
    return at;
}

size_t pqmq__claims_leases(pqmq__claims *q, int64_t period_ms, uuid_t **ids,
                           int64_t *duration_ms)
{
    size_t n = 0;
    int64_t duration = 3 * period_ms;
    if (!(*ids = malloc((size_t)q->capacity * sizeof **ids)))
        return 0;
    pthread_mutex_lock(&q->lock);
    for (int i = 0; i < q->capacity; i++) {
        const entry *e = &q->entries[i];
        if (!e->job)
            continue;
        memcpy((*ids)[n++], e->delivery.id, sizeof(uuid_t));
        if (!period_ms && e->lease_ms > duration)
            duration = e->lease_ms;
    }
    pthread_mutex_unlock(&q->lock);
    /* Other clients may lease for longer than the C API accepts. */
    if (duration > PQMQ_MAX_DURATION_MS)
        duration = PQMQ_MAX_DURATION_MS;
    *duration_ms = duration;
    return n;
}

void pqmq__claims_extended(pqmq__claims *q, const uuid_t *ids, size_t n, int64_t sent_at,
                           int64_t duration_ms)
{
    pthread_mutex_lock(&q->lock);
    for (int i = 0; i < q->capacity; i++) {
        entry *e = &q->entries[i];
        for (size_t k = 0; e->job && k < n; k++)
            if (!memcmp(e->delivery.id, ids[k], sizeof(uuid_t))) {
                e->extended_at_ms = sent_at;
                if (duration_ms > e->lease_ms)
                    e->lease_ms = duration_ms;
            }
    }
    pthread_mutex_unlock(&q->lock);
}

void pqmq__claims_shutdown(pqmq__claims *q)
{
    pthread_mutex_lock(&q->lock);
    q->shutdown = 1;
    pthread_cond_broadcast(&q->work);
    pthread_cond_broadcast(&q->rest);
    pthread_mutex_unlock(&q->lock);
}

/* ---- a worker's side --------------------------------------------------- */

/* The oldest queued entry, or NULL (under the lock). */
static entry *next_queued(pqmq__claims *q)
{
    entry *best = NULL;
    for (int i = 0; i < q->capacity; i++) {
        entry *e = &q->entries[i];
        if (e->job && !e->running && (!best || e->seq < best->seq))
            best = e;
    }
    return best;
}

/* A worker took jobs (under the lock): if it left some queued, it wakes
 * one more worker for them (pqmq__claims_add wakes only one). */
static void pass_on(pqmq__claims *q)
{
    if (next_queued(q))
        pthread_cond_signal(&q->work);
}

int pqmq__claims_next(pqmq__claims *q, int worker, pqmq__work *w)
{
    (void)worker;
    entry *e;
    pthread_mutex_lock(&q->lock);
    while (!(e = next_queued(q)) && !q->shutdown)
        pthread_cond_wait(&q->work, &q->lock);
    if (e && !q->shutdown) {
        e->running = 1;
        w->job = e->job;
        w->delivery = e->delivery;
        pass_on(q);
    }
    pthread_mutex_unlock(&q->lock);
    /* At shutdown, queued jobs are left for the loop to hand back. */
    return e && !q->shutdown ? (int)(e - q->entries) : -1;
}

int pqmq__claims_next_or_kick(pqmq__claims *q, int worker, pqmq__work *w, uint64_t *seen,
                              int64_t at_ms)
{
    (void)worker;
    struct timespec ts = {(time_t)(at_ms / 1000), (long)(at_ms % 1000) * 1000000L};
    entry *e = NULL;
    int rc = -2;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        if (q->shutdown) {
            rc = -1;
            break;
        }
        if ((e = next_queued(q)) != NULL) {
            e->running = 1;
            w->job = e->job;
            w->delivery = e->delivery;
            rc = (int)(e - q->entries);
            pass_on(q);
            break;
        }
        if (q->kicks != *seen || pqmq__now_ms() >= at_ms ||
            pthread_cond_timedwait(&q->work, &q->lock, &ts) != 0)
            break; /* -2: time to poll */
    }
    *seen = q->kicks;
    pthread_mutex_unlock(&q->lock);
    return rc;
}

/* Marks up to max queued jobs named name running, the oldest first, into
 * w and index (under the lock); returns how many. One pass, keeping the
 * oldest matches in claim order (max is at most a commit batch: 64). */
static size_t take_named(pqmq__claims *q, const char *name, pqmq__work *w, int *index,
                         size_t max)
{
    size_t n = 0;
    for (int i = 0; i < q->capacity; i++) {
        entry *e = &q->entries[i];
        if (!e->job || e->running || strcmp(pqmq_job_name(e->job), name) != 0)
            continue;
        size_t at = n < max ? n++ : max;
        while (at > 0 && q->entries[index[at - 1]].seq > e->seq) {
            if (at < max)
                index[at] = index[at - 1];
            at--;
        }
        if (at < max)
            index[at] = i;
    }
    for (size_t k = 0; k < n; k++) {
        entry *e = &q->entries[index[k]];
        e->running = 1;
        w[k].job = e->job;
        w[k].delivery = e->delivery;
    }
    return n;
}

int pqmq__claims_next_group(pqmq__claims *q, int worker, int wait,
                            int (*grouped)(const pqmq_job *job, void *arg), void *arg,
                            size_t max, pqmq__work *w, int *index)
{
    (void)worker;
    entry *e;
    pthread_mutex_lock(&q->lock);
    while (!(e = next_queued(q)) && !q->shutdown && wait)
        pthread_cond_wait(&q->work, &q->lock);
    int n = q->shutdown ? -1 : !e ? -2 : 1;
    if (n == 1) {
        e->running = 1;
        w[0].job = e->job;
        w[0].delivery = e->delivery;
        index[0] = (int)(e - q->entries);
        if (max > 1 && grouped(e->job, arg))
            n += (int)take_named(q, pqmq_job_name(e->job), w + 1, index + 1, max - 1);
        pass_on(q);
    }
    pthread_mutex_unlock(&q->lock);
    return n;
}

void pqmq__claims_kick(pqmq__claims *q)
{
    pthread_mutex_lock(&q->lock);
    q->kicks++;
    pthread_cond_broadcast(&q->work);
    pthread_mutex_unlock(&q->lock);
}

/* Appends a delivery to the completion list (under the lock). */
static void push_done(pqmq__claims *q, const pqmq__delivery *d)
{
    if (q->ndone == q->done_cap) {
        size_t cap = q->done_cap ? 2 * q->done_cap : 64;
        pqmq__delivery *grown = realloc(q->done, cap * sizeof *grown);
        if (!grown)
            return; /* not completed now: the lease runs out, it comes back */
        q->done = grown;
        q->done_cap = cap;
    }
    if (q->ndone == 0)
        q->done_since_ms = pqmq__now_ms();
    q->done[q->ndone++] = *d;
}

void pqmq__claims_finish(pqmq__claims *q, int index, int complete)
{
    pthread_mutex_lock(&q->lock);
    entry *e = &q->entries[index];
    if (complete)
        push_done(q, &e->delivery);
    release(q, e);
    pthread_mutex_unlock(&q->lock);
    q->wake(q->wake_arg);
}

void pqmq__claims_give_back(pqmq__claims *q, int worker, int index)
{
    pthread_mutex_lock(&q->lock);
    q->entries[index].running = 0;
    q->down[worker] = 1;
    pthread_cond_broadcast(&q->work); /* another worker may take it */
    pthread_mutex_unlock(&q->lock);
    q->wake(q->wake_arg); /* if none is up, the loop hands it back */
}

int pqmq__claims_is_down(pqmq__claims *q, int worker)
{
    pthread_mutex_lock(&q->lock);
    int down = q->down[worker];
    pthread_mutex_unlock(&q->lock);
    return down;
}

void pqmq__claims_set_up(pqmq__claims *q, int worker, int up)
{
    pthread_mutex_lock(&q->lock);
    q->down[worker] = !up;
    pthread_mutex_unlock(&q->lock);
    if (up)
        q->wake(q->wake_arg); /* it may claim again */
}

int pqmq__claims_sleep_until(pqmq__claims *q, int64_t at_ms)
{
    struct timespec ts = {(time_t)(at_ms / 1000), (long)(at_ms % 1000) * 1000000L};
    pthread_mutex_lock(&q->lock);
    while (!q->shutdown && pqmq__now_ms() < at_ms)
        if (pthread_cond_timedwait(&q->rest, &q->lock, &ts) != 0)
            break;
    int shutdown = q->shutdown;
    pthread_mutex_unlock(&q->lock);
    return shutdown;
}
