/*
 * pqmq-int.h: declarations shared by the files of lib/ and nothing else.
 * Internal functions carry the pqmq__ prefix and hidden visibility.
 */
#ifndef PQMQ_INT_H
#define PQMQ_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include <libpqtypes.h>

#include "pqmq.h"

struct pqmq_client {
    PGconn *conn;
    int owns_conn;       /* pqmq_connect opened conn: free closes it */
    PGconn *typed_conn;  /* the conn libpqtypes was set up on */
    int composite_ready; /* mq_new_t registered on typed_conn */
    unsigned specs_ready; /* bit per pqmq__spec prepared on typed_conn */
    char *errmsg;        /* "" or malloc'd; reset by each API call */
    char sqlstate[6];
};

struct pqmq_msg {
    uuid_t id;
    char *channel;
    char *args;   /* NULL means "" */
    char *name;   /* NULL means "" */
    char *json;   /* NULL: no JSON payload */
    void *bytes;  /* NULL: no binary payload */
    size_t bytes_len;
    int64_t delay_ms;
    int64_t backoff_ms;
    int64_t commit_interval_ms; /* -1: not two-phase */
    int retries;
    int ordered;
};

typedef struct {
    int version;
    const char *name;
    const char *sql;
} pqmq_migration;

extern const pqmq_migration pqmq_migrations[];
extern const size_t pqmq_migration_count;

/* ---- runner internals (runner.c, worker.c) ---- */

typedef struct {
    char *name; /* NULL: the fallback */
    pqmq_handler fn;
    void *arg;
} pqmq__route;

/* A poll result shared by the workers handling its jobs. */
typedef struct {
    pqmq_batch *batch;
    int refs; /* under the runner's lock */
} pqmq__held;

/* A claimed job: queued for a worker, or running. */
typedef struct {
    const pqmq_job *job;     /* NULL: the entry is free */
    pqmq__held *held;
    uuid_t id;
    int attempt;
    int running;             /* 0: queued */
    uint64_t seq;            /* claim order: workers take the oldest */
    int64_t lease_ms;
    int64_t extended_at_ms;  /* when its lease was last set (claim or keep-alive) */
} pqmq__entry;

/* One worker thread. */
typedef struct {
    pqmq_runner *runner;
    pthread_t thread;
    pqmq_client *client;     /* the worker's own connection */
    pqmq__entry *entry;      /* the job it runs (set under the lock) */
    /* Reconnect backoff, kept across jobs so that a server refusing us sees
     * a few attempts a second at most, not one burst per job. */
    int down;                /* under the lock: takes no job until reconnected */
    int64_t retry_at_ms;     /* monotonic: no attempt before this */
    int64_t retry_delay_ms;  /* 0 after a success; doubles up to a cap */
} pqmq__slot;

struct pqmq_runner {
    char *conninfo;
    pqmq__route *routes;
    size_t nroutes;
    char **channels; /* NULL: all */
    size_t nchannels;
    int threads, batch;
    int64_t keep_alive_ms;
    char *stop_channel;
    char errmsg[512];

    atomic_int stop;
    int wake_pipe[2];        /* workers and pqmq_runner_stop write one byte */
    atomic_int wake_pending; /* a byte is in the pipe: writers need not add one */
    pthread_mutex_t lock;
    pthread_cond_t work;     /* a job was queued, or shutdown */
    int shutdown;            /* under lock: workers exit */
    pqmq__slot *slots;       /* threads of them */
    pqmq__entry *entries;    /* capacity of them: batch, at least threads */
    int capacity;
    uint64_t next_seq;
    uuid_t *done;            /* under lock: ids whose handler succeeded */
    int *done_attempts;      /* and the attempt each was on */
    size_t ndone, done_cap;

    atomic_uint_fast64_t processed, failed, in_flight, polls, wakeups, reconnects;
};

/* worker.c: starts/stops the worker threads; the runner's lock is free. */
int pqmq__workers_start(pqmq_runner *r);
void pqmq__workers_join(pqmq_runner *r);
/* runner.c: frees an entry whose job is settled (under the lock). */
void pqmq__entry_release(pqmq_runner *r, pqmq__entry *e);
/* consume.c: hands claimed jobs back unstarted (mq_release). */
int pqmq__release(pqmq_client *c, const uuid_t *ids, const int *attempts, size_t n);
/* runner.c: wakes the main loop (async-signal-safe). */
void pqmq__runner_wake(pqmq_runner *r);
/* runner.c: CLOCK_MONOTONIC in milliseconds. */
int64_t pqmq__now_ms(void);
/* client.c: re-establishes an owned connection; 0 or PQMQ_ECONN. */
int pqmq__reconnect(pqmq_client *c);

/* Starts an API call: clears the client's error. */
void pqmq__clearerr(pqmq_client *c);
/* Sets the client's error to code and a formatted message; returns code. */
int pqmq__seterr(pqmq_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Checks that the connection is usable and libpqtypes is set up on it;
 * returns 0 or PQMQ_ECONN/PQMQ_ENOMEM with the error set. */
int pqmq__ready(pqmq_client *c);
/* Formats used once per array element or result row. libpqtypes parses a
 * format and looks each type up by name on every call; prepared once per
 * connection (PQspecPrepare), they cost nothing to parse. Only built-in
 * types: a prepared spec outlives PQreset, mq_new_t's registration does not.
 * libpqtypes 1.5.1 overruns its buffers preparing a spec of more than 8
 * types, and misbehaves removing one, so long formats come in parts and
 * specs are never removed. */
enum pqmq__spec {
    PQMQ__SPEC_UUID, /* "%uuid" */
    PQMQ__SPEC_INT4, /* "%int4" */
    PQMQ__SPEC_MSG1, /* a message's mq_new_t fields 0-5 (produce.c) */
    PQMQ__SPEC_MSG2, /* and 6-10 */
    PQMQ__SPEC_JOB1, /* columns 0-6 of an mq_poll_jobs row (consume.c) */
    PQMQ__SPEC_JOB2, /* and 7-12 */
    PQMQ__NSPECS
};
/* "@name" when the spec is prepared on the connection, else its format:
 * for PGparams and PGresults made after pqmq__ready. */
const char *pqmq__spec(const pqmq_client *c, enum pqmq__spec s);

/* Registers mq_new_t with libpqtypes (once per connection). */
int pqmq__need_composite(pqmq_client *c);
/*
 * Runs a parameterised statement through libpqtypes with binary results.
 * On failure sets the client's error (prefixed with what) from the server
 * or the connection and returns NULL; *rc receives the error code.
 */
PGresult *pqmq__exec(pqmq_client *c, PGparam *param, const char *sql,
                     const char *what, int *rc);
/* Like pqmq__exec for plain SQL text without parameters (text results). */
PGresult *pqmq__exec_text(pqmq_client *c, const char *sql, const char *what,
                          int *rc);

/* Puts ids as one uuid[] parameter. Returns 0 or sets the error. */
int pqmq__put_uuids(pqmq_client *c, PGparam *param, const uuid_t *ids, size_t n,
                    const char *what);
/* A new PGparam for c's connection, or NULL with PQMQ_ENOMEM set. */
PGparam *pqmq__param(pqmq_client *c);
/* Checks an id array argument: ids non-NULL, 1 <= n <= PQMQ_MAX_BATCH. */
int pqmq__check_ids(pqmq_client *c, const uuid_t *ids, size_t n, const char *what);
/* json.c: is the NUL-terminated s valid UTF-8 (no overlongs, surrogates or
 * code points above U+10FFFF)? */
int pqmq__utf8_ok(const char *s);

/* consume.c: puts channels (NULL: all) as one text[] parameter. */
int pqmq__put_channels(pqmq_client *c, PGparam *param, const char *const *channels,
                       size_t n, const char *what);
/* consume.c: runs sql, taking channels (NULL: all) as $1 and a count in
 * 1..PQMQ_MAX_BATCH (named arg in errors) as $2, whose rows are shaped like
 * a poll's, into a new *out. The frame of pqmq_poll and pqmq_dead_letters. */
int pqmq__channels_query(pqmq_client *c, const char *what, const char *sql,
                         const char *const *channels, size_t nchannels, const char *arg,
                         int value, pqmq_batch **out);
/* consume.c: checks batch_size and puts channels and batch_size as the
 * next two parameters of a poll. */
int pqmq__put_poll_args(pqmq_client *c, PGparam *param, const char *const *channels,
                        size_t nchannels, int batch_size, const char *what);
/* consume.c: puts attempts as one int[] parameter. */
int pqmq__put_attempts(pqmq_client *c, PGparam *param, const int *attempts, size_t n,
                       const char *what);
/* consume.c: the ids and attempt numbers of a batch's jobs, malloc'd (the
 * caller frees both, also on error). */
int pqmq__batch_deliveries(pqmq_client *c, const pqmq_batch *b, uuid_t **ids,
                           int **attempts, const char *what);
/* consume.c: PQMQ_ESTALE with its message when done < n, else 0. */
int pqmq__stale_check(pqmq_client *c, const char *what, size_t done, size_t n);
/* complete_poll.c: mq_complete_poll: completes ids on their attempts (n may
 * be 0), then polls; *done = how many were completed. *out is set when the
 * poll ran (0 or PQMQ_ESTALE). */
int pqmq__complete_poll(pqmq_client *c, const uuid_t *ids, const int *attempts, size_t n,
                        const char *const *channels, size_t nchannels, int batch_size,
                        const char *what, pqmq_batch **out, size_t *done);
/* consume.c: wraps a result shaped like pqmq_poll's in a batch (takes res). */
int pqmq__batch_from(pqmq_client *c, PGresult *res, pqmq_batch **out);
/* consume.c: completes ids still on the given attempts; *done = how many.
 * Returns PQMQ_ESTALE when fewer than n were. */
int pqmq__complete_fenced(pqmq_client *c, const uuid_t *ids, const int *attempts, size_t n,
                          size_t *done);

/* consume.c: starts a call that takes ids: clears the error, checks the
 * arguments, and puts the ids as $1 of a new *param (caller clears it). */
int pqmq__begin_ids(pqmq_client *c, const uuid_t *ids, size_t n, const char *what,
                    PGparam **param);
/* consume.c: runs sql and returns the single value of its single row as an
 * int (booleans as 0/1) in *value; spec NULL ignores the result. */
int pqmq__exec_scalar(pqmq_client *c, PGparam *param, const char *sql, const char *what,
                      const char *spec, int *value);
/* consume.c: pqmq_fail fenced by attempt (0: unfenced). */
int pqmq__fail(pqmq_client *c, const uuid_t id, int attempt, const char *error);

/* Milliseconds <-> libpqtypes intervals (30-day months, as PostgreSQL). */
void pqmq__ms_to_interval(int64_t ms, PGinterval *iv);
int64_t pqmq__interval_to_ms(const PGinterval *iv);
/* Checks 0 <= ms <= PQMQ_MAX_DURATION_MS; sets the error naming what. */
int pqmq__check_ms(pqmq_client *c, int64_t ms, const char *what);

#endif
