/*
 * claims.h: the runner's claim queue (claims.c), shared by the main loop
 * (runner.c) and the worker threads (worker.c). Everything in it is behind
 * one lock that only claims.c takes: callers never hold it, and get copies
 * or indexes, never pointers into the queue.
 */
#ifndef PQMQ_CLAIMS_H
#define PQMQ_CLAIMS_H

#include <stdatomic.h>
#include <time.h>

#include "pqmq-int.h"

typedef struct pqmq__claims pqmq__claims;

/* CLOCK_MONOTONIC in milliseconds: deadlines that ignore clock jumps. */
static inline int64_t pqmq__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A queue for capacity jobs and the given number of workers. wake(arg) is
 * called (without the lock) whenever the loop should look again: a job
 * finished, a worker gave one back or came back up. in_flight counts the
 * jobs held. NULL when out of memory. */
pqmq__claims *pqmq__claims_new(int capacity, int workers, void (*wake)(void *), void *arg,
                               atomic_uint_fast64_t *in_flight);
/* Frees the queue and the batches it still holds. */
void pqmq__claims_free(pqmq__claims *q);

/* ---- the main loop's side ---- */

/* How many jobs to claim now: 0 while the queue is well filled (claims go
 * in batches: when it ran dry or half of it is free) or no worker is up. */
int pqmq__claims_room(pqmq__claims *q);
/* Queues the jobs of b (the caller claimed at most pqmq__claims_room) and
 * wakes the workers. Takes b. */
void pqmq__claims_add(pqmq__claims *q, pqmq_batch *b);
/* A copy of the deliveries whose handlers succeeded, in order (malloc'd,
 * caller frees); 0 and NULL when none (or out of memory: they wait). */
size_t pqmq__claims_done(pqmq__claims *q, pqmq__delivery **out);
/* When the oldest of those finished (monotonic ms); INT64_MAX: none. */
int64_t pqmq__claims_done_since(pqmq__claims *q);
/* The first n of those were settled: forgets them. */
void pqmq__claims_drop_done(pqmq__claims *q, size_t n);
/* Takes the queued (unstarted) jobs out, for handing back to the server;
 * their deliveries in *out (malloc'd, caller frees). */
size_t pqmq__claims_take_queued(pqmq__claims *q, pqmq__delivery **out);
/* Jobs held: queued or running. */
int pqmq__claims_busy(pqmq__claims *q);
/* Whether any worker can reach the server. */
int pqmq__claims_any_up(pqmq__claims *q);
/* When the next keep-alive is due (INT64_MAX with nothing held): each job
 * every period_ms, or (period_ms 0) every third of its lease. */
int64_t pqmq__claims_keep_alive_at(pqmq__claims *q, int64_t period_ms);
/* The ids of every held job (malloc'd, caller frees) and the duration to
 * extend them by: 3 * period_ms, or (period_ms 0) the longest lease. */
size_t pqmq__claims_leases(pqmq__claims *q, int64_t period_ms, uuid_t **ids,
                           int64_t *duration_ms);
/* Those n leases were extended by duration_ms at sent_at (monotonic ms). */
void pqmq__claims_extended(pqmq__claims *q, const uuid_t *ids, size_t n, int64_t sent_at,
                           int64_t duration_ms);
/* Workers are to exit: pqmq__claims_next returns -1 from now on. */
void pqmq__claims_shutdown(pqmq__claims *q);

/* ---- a worker's side (worker is its number, 0..workers-1) ---- */

/* What a worker runs: borrowed until it calls pqmq__claims_finish. */
typedef struct {
    const pqmq_job *job;
    pqmq__delivery delivery;
} pqmq__work;

/* Waits for the oldest queued job, marks it running and returns its index
 * (w describes it); -1 at shutdown. */
int pqmq__claims_next(pqmq__claims *q, int worker, pqmq__work *w);
/* For a worker of the locked lane, which polls for itself: like
 * pqmq__claims_next, but also returns -2 once the loop kicked the workers
 * (a kick after *seen, which it updates) or at at_ms (monotonic), whichever
 * comes first: time to poll. */
int pqmq__claims_next_or_kick(pqmq__claims *q, int worker, pqmq__work *w, uint64_t *seen,
                              int64_t at_ms);
/* For a worker with commit batches: the oldest queued job, waiting for one
 * if wait (else -2 when none is queued now); -1 at shutdown. If
 * grouped(its job, arg), a group handler's, up to max - 1 more queued jobs
 * of its name come with it, oldest first, in the same step (workers woken
 * together would split the group). Describes them in w[0..n) and their
 * indexes in index[0..n); returns n. */
int pqmq__claims_next_group(pqmq__claims *q, int worker, int wait,
                            int (*grouped)(const pqmq_job *job, void *arg), void *arg,
                            size_t max, pqmq__work *w, int *index);
/* Wakes the locked workers to poll (a notification said messages came). */
void pqmq__claims_kick(pqmq__claims *q);
/* The job at index is settled; complete: the loop must complete it. */
void pqmq__claims_finish(pqmq__claims *q, int index, int complete);
/* The worker cannot reach the server: the job at index goes back to the
 * queue untouched, and the worker counts as down. */
void pqmq__claims_give_back(pqmq__claims *q, int worker, int index);
/* Whether the worker counts as down; pqmq__claims_set_up records an
 * attempt to reconnect (up: it succeeded). */
int pqmq__claims_is_down(pqmq__claims *q, int worker);
void pqmq__claims_set_up(pqmq__claims *q, int worker, int up);
/* Sleeps until at_ms (monotonic) or shutdown; returns 1 at shutdown. */
int pqmq__claims_sleep_until(pqmq__claims *q, int64_t at_ms);

#endif
