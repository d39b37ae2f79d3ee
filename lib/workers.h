/*
 * workers.h: the runner's worker threads (worker.c). Each has its own
 * connection, takes jobs from the claim queue, runs their handlers and
 * settles them. runner.c starts and joins them; they call nothing of it.
 */
#ifndef PQMQ_WORKERS_H
#define PQMQ_WORKERS_H

#include <stdatomic.h>

#include "claims.h"

/* A handler registered by name (NULL: the fallback): fn, or group. */
typedef struct {
    char *name;
    pqmq_handler fn;
    pqmq_group_handler group;
    void *arg;
} pqmq__route;

/* The runner's counters (pqmq_runner_stats). */
typedef struct {
    atomic_uint_fast64_t processed, failed, in_flight, polls, wakeups, reconnects;
} pqmq__counters;

/* What the workers need of the runner; borrowed until pqmq__workers_join. */
typedef struct {
    const char *conninfo;
    const pqmq__route *routes;
    size_t nroutes;
    const atomic_int *stop; /* a stop was requested (pqmq_ctx_stopping) */
    pqmq__counters *counters;
    pqmq__claims *claims;
    /* The locked lane (pqmq_runner_set_locked): each worker's own poll, at
     * most locked_batch jobs (0: off), of these channels (NULL: all). */
    int locked_batch;
    const char *const *channels;
    size_t nchannels;
    /* Commit batches (pqmq_runner_set_commit_batch): up to commit_jobs
     * handlers' transactions commit as one, open at most commit_open_ms
     * (commit_jobs 1: each job commits alone). */
    int commit_jobs;
    int64_t commit_open_ms;
    /* Most jobs a group handler takes at once (in one savepoint), and so
     * most jobs a commit batch holds: commit_jobs, or the claim size if
     * larger. */
    int group_most;
    /* The runner's log (pqmq_runner_set_log) and the label that starts its
     * lines ("pqmq_runner (channels: a)"). */
    const pqmq__logger *log;
    const char *label;
} pqmq__worker_env;

typedef struct pqmq__workers pqmq__workers;

/* Connects and starts n workers into *out; 0, or the error code with why
 * in err (then *out is NULL and nothing is left running). */
int pqmq__workers_start(const pqmq__worker_env *env, int n, pqmq__workers **out, char *err,
                        size_t errlen);
/* Shuts the claim queue down, joins the workers and frees them. */
void pqmq__workers_join(pqmq__workers *w);

#endif
