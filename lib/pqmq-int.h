/*
 * pqmq-int.h: declarations shared by the files of lib/ and nothing else,
 * grouped by the file that defines them. Internal functions carry the
 * pqmq__ prefix and hidden visibility. The runner's own files have narrower
 * headers: claims.h (the claim queue) and workers.h (the worker threads).
 */
#ifndef PQMQ_INT_H
#define PQMQ_INT_H

#include <pthread.h>

#include <libpqtypes.h>

#include "pqmq.h"

/* One delivery of a message: its id and the attempt number it was claimed
 * on. Completions, failures and releases are fenced by it, so a consumer
 * whose lease ran out cannot settle the message for its next owner. */
typedef struct {
    uuid_t id; /* first: types.c reads ids and deliveries' ids alike */
    int attempt;
} pqmq__delivery;

/* ---- log.c: the log function ------------------------------------------ */

/* Where a client's or a runner's log lines go. */
typedef struct {
    pqmq_log_fn fn; /* NULL: nowhere */
    void *ctx;
    /* Held around each call, so that a runner's threads call fn one at a
     * time; NULL for a client's own log (one thread uses a client). */
    pthread_mutex_t *lock;
} pqmq__logger;

/* Formats a line and passes it to log->fn (nothing when log or fn is
 * NULL), as one line (pqmq__one_line). */
void pqmq__log(const pqmq__logger *log, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* s as one line into out (outlen > 0): runs of white space holding a line
 * break become "; ", trailing ones go. */
void pqmq__one_line(const char *s, char *out, size_t outlen);
/* Why connection c failed, as one line into out: the server's last words
 * when it sent any (c->last_words), then libpq's message for a broken
 * connection or the call's error, without CONTEXT lines. */
void pqmq__conn_error(pqmq_client *c, char *out, size_t len);
/* Sends c's notices to log (even when log->fn is NULL: then nowhere);
 * label (NULL: none, copied) starts each of their lines. */
void pqmq__client_set_log(pqmq_client *c, const pqmq__logger *log, const char *label);

/* ---- client.c: the connection ----------------------------------------- */

struct pqmq_client {
    PGconn *conn;
    int owns_conn;        /* pqmq_connect opened conn: free closes it */
    PGconn *typed_conn;   /* the conn libpqtypes was set up on */
    int composite_ready;  /* mq_new_t registered on typed_conn */
    unsigned specs_ready; /* bit per pqmq__spec prepared on typed_conn */
    char *errmsg;         /* "" or malloc'd; reset by each API call */
    /* The public call under way, which its errors are named after
     * ("pqmq_poll"), or the runner's step ("pqmq_runner: complete"); set by
     * pqmq__enter, and must outlive the call (a string literal). */
    const char *call;
    char sqlstate[6];
    /* A commit of this call's whose outcome the server does not know (a
     * Citus worker lost while committing warns and still reports success):
     * the warning's text, "" for none; reset by each API call. Watched on
     * connections pqmq_connect opened (their notice receiver is ours). */
    char doubt[160];
    PQnoticeReceiver prev_notice; /* the receiver ours passes every notice on to */
    /* Where the server's notices go instead of prev_notice, when
     * notices_to_log is set (pqmq_set_log with a function; a runner's
     * connections always: to the runner's log, which may be nowhere). */
    int notices_to_log;
    pqmq__logger log;
    char log_label[160];
    /* A runner's connection: the server's FATAL or PANIC notice (its last
     * words before it closes the connection) is kept in last_words for the
     * runner's "lost connection" line instead of being logged alone. */
    int keep_last_words;
    char last_words[256];
};

/* Checks that the connection is usable and libpqtypes is set up on it;
 * returns 0 or PQMQ_ECONN with the error set. */
int pqmq__ready(pqmq_client *c);
/* Re-establishes an owned connection (PQreset); 0 or PQMQ_ECONN. */
int pqmq__reset_conn(pqmq_client *c);

/* ---- error.c: the call's error ----------------------------------------- */

/* Starts public call `call` on c (the runner: one of its steps): records
 * its name for the errors and clears the error. PQMQ_EINVAL when c is
 * NULL. */
int pqmq__enter(pqmq_client *c, const char *call);
/* Clears the client's error (and its SQLSTATE), keeping the call's name. */
void pqmq__clearerr(pqmq_client *c);
/* Sets the client's error to code and a formatted message; returns code. */
int pqmq__seterr(pqmq_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* pqmq__seterr with the message prefixed by the call's name: "call: ...". */
int pqmq__err(pqmq_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Records the server's SQLSTATE of the error (NULL: none). */
void pqmq__set_sqlstate(pqmq_client *c, const char *state);

/* ---- types.c: libpqtypes: set-up, formats, arrays --------------------- */

/* Sets libpqtypes up on c's connection when it is new to it: types,
 * prepared formats (pqmq__ready). */
void pqmq__types_ready(pqmq_client *c);
/* Forgets the set-up of a connection that was reset (PQreset drops it). */
void pqmq__types_forget(pqmq_client *c);
/* Registers mq_new_t with libpqtypes (once per connection). */
int pqmq__need_composite(pqmq_client *c);

/* Formats used once per array element or result row. libpqtypes parses a
 * format and looks each type up by name on every call; prepared once per
 * connection (PQspecPrepare), they cost nothing to parse. Only built-in
 * types: a prepared spec outlives PQreset, mq_new_t's registration does not.
 * libpqtypes 1.5.1 overruns its buffers preparing a spec of more than 8
 * types, and misbehaves removing one, so long formats come in parts and
 * specs are never removed. */
enum pqmq__spec {
    PQMQ__SPEC_UUID,   /* "%uuid" */
    PQMQ__SPEC_INT4,   /* "%int4" */
    PQMQ__SPEC_UUID8,  /* eight of "%uuid" */
    PQMQ__SPEC_INT4_8, /* eight of "%int4" */
    PQMQ__NSPECS
};
/* "@name" when the spec is prepared on the connection, else its format:
 * for PGparams and PGresults made after pqmq__ready. */
const char *pqmq__spec(const pqmq_client *c, enum pqmq__spec s);

/* Array elements put in one PQputf: every PQputf clears libpqtypes' 18 KB
 * error state (new_msg.c), and a prepared spec holds at most 8 types. */
#define PQMQ__GROUP 8
/* How many groups n elements make. */
static inline size_t pqmq__groups(size_t n)
{
    return (n + PQMQ__GROUP - 1) / PQMQ__GROUP;
}

/* A new PGparam for c's connection, or NULL with PQMQ_ENOMEM set. */
PGparam *pqmq__param(pqmq_client *c);
/* Puts element i of items into an array's param; 0 on failure. */
typedef int (*pqmq__put_element)(pqmq_client *c, PGparam *array, const void *items, size_t i);
/* Puts n elements of items as one array parameter (array_format: "%uuid[]"). */
int pqmq__put_array(pqmq_client *c, PGparam *param, const char *array_format, const void *items,
                    size_t n, pqmq__put_element put);
/* Puts ids as one uuid[] parameter. */
int pqmq__put_ids(pqmq_client *c, PGparam *param, const uuid_t *ids, size_t n);
/* Puts deliveries as two parameters: their ids (uuid[]), their attempts
 * (int[]). */
int pqmq__put_deliveries(pqmq_client *c, PGparam *param, const pqmq__delivery *d, size_t n);
/* Puts the batch as an mq_new_t[] parameter and, when keys is non-zero,
 * its unique keys as a text[] parameter. */
int pqmq__put_batch(pqmq_client *c, PGparam *param, pqmq_msg *const *msgs, size_t n, int keys);
/* When some message has a priority above 0 (*put set to 1), puts the
 * batch's priorities as an int4[] parameter; else puts nothing (*put 0):
 * a batch without priorities sends no such parameter. */
int pqmq__put_priorities_if_any(pqmq_client *c, PGparam *param, pqmq_msg *const *msgs, size_t n,
                                int *put);

/* ---- stmt.c: running statements ---------------------------------------- */

/* A statement's last result: returns it when it succeeded, else clears it,
 * sets the error and returns NULL with *rc set. */
PGresult *pqmq__result_outcome(pqmq_client *c, PGresult *r, int *rc);
/* Runs sql (as pqmq__exec) between the parameterless statements before and
 * after (either may be NULL; e.g. "BEGIN", "COMMIT"), in one round trip
 * (pipeline mode). Returns sql's result; on failure NULL, with the error of
 * the first statement that failed (those after it did not run). */
PGresult *pqmq__exec_piped(pqmq_client *c, const char *before, PGparam *param, const char *sql,
                           const char *after, int *rc);
/* Runs a parameterised statement with binary results. On failure sets the
 * client's error from the server or the connection and returns NULL; *rc
 * receives the error code. */
PGresult *pqmq__exec(pqmq_client *c, PGparam *param, const char *sql, int *rc);
/* Like pqmq__exec for plain SQL text without parameters (text results). */
PGresult *pqmq__exec_text(pqmq_client *c, const char *sql, int *rc);
/* The next statement of a script of n bytes: from *start (a position in
 * sql), sets *start and *len to the statement's extent (its ';' included;
 * *len 0 when only blanks and comments are left) and returns where the
 * following one may begin (lib/sqlsplit.c). */
size_t pqmq__sql_next(const char *sql, size_t n, size_t *start, size_t *len);
/* Runs sql and returns the single value of its single row as an int
 * (booleans as 0/1) in *value; spec NULL ignores the result. */
int pqmq__exec_scalar(pqmq_client *c, PGparam *param, const char *sql, const char *spec,
                      int *value);

/* ---- params.c: parameters and prologues ------------------------------- */

/* Puts channels (NULL: all) as one text[] parameter. */
int pqmq__put_channels(pqmq_client *c, PGparam *param, const char *const *channels, size_t n);
/* Puts a count in 1..PQMQ_MAX_BATCH (named arg in errors) as an int. */
int pqmq__put_count(pqmq_client *c, PGparam *param, const char *arg, int value);
/* Puts channels, then a count: the arguments of the calls that claim jobs. */
int pqmq__put_channels_count(pqmq_client *c, PGparam *param, const char *const *channels,
                             size_t nchannels, const char *arg, int value);
/* Puts ms (checked: 0..PQMQ_MAX_DURATION_MS; errors name arg, NULL: the
 * call itself) as an interval. */
int pqmq__put_duration(pqmq_client *c, PGparam *param, int64_t ms, const char *arg);

/* The prologues of statements: clear the error, check the connection, and
 * make *param (the caller clears it, also on error), with $1 (and $2) put.
 * The public call has been entered (pqmq__enter). */
int pqmq__begin(pqmq_client *c, PGparam **param);
int pqmq__begin_ids(pqmq_client *c, const uuid_t *ids, size_t n, PGparam **param);
int pqmq__begin_deliveries(pqmq_client *c, const pqmq__delivery *d, size_t n, PGparam **param);
int pqmq__begin_id(pqmq_client *c, const uuid_t id, PGparam **param);
/* The body of pqmq_complete, pqmq_commit, pqmq_retry and pqmq_skip: enters
 * call, runs `sql` taking ids as $1 (and *extra, when not NULL, as $2); its
 * int result goes to *count when count is not NULL. */
int pqmq__ids_call(pqmq_client *c, const char *call, const char *sql, const uuid_t *ids,
                   size_t n, const int *extra, size_t *count);
/* Checks an id array argument: non-NULL, 1 <= n <= PQMQ_MAX_BATCH. */
int pqmq__check_ids(pqmq_client *c, const void *ids, size_t n);

/* Milliseconds as a libpqtypes interval. */
void pqmq__ms_to_interval(int64_t ms, PGinterval *iv);
/* Checks 0 <= ms <= PQMQ_MAX_DURATION_MS; sets the error naming the value
 * as fmt formats it, which happens only for an error (a batch checks three
 * durations a message). */
int pqmq__check_ms(pqmq_client *c, int64_t ms, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- job.c: batches of mq_job_t rows ---------------------------------- */

/* The prologue of public calls that make a batch: *out = NULL, call
 * entered (pqmq__enter), PQMQ_EINVAL when c or out is NULL. */
int pqmq__begin_batch(pqmq_client *c, const char *call, pqmq_batch **out);
/* Runs sql taking channels (NULL: all) as $1 and a count (named arg) as $2,
 * whose rows are mq_job_t, into a new *out: pqmq_poll, pqmq_dead_letters. */
int pqmq__query_jobs(pqmq_client *c, const char *sql, const char *const *channels,
                     size_t nchannels, const char *arg, int value, pqmq_batch **out);
/* Wraps a result of mq_job_t rows in a new batch (takes res). */
int pqmq__batch_from(pqmq_client *c, PGresult *res, pqmq_batch **out);
/* The deliveries of a batch's jobs, malloc'd into *out (NULL when none). */
int pqmq__batch_deliveries(pqmq_client *c, const pqmq_batch *b, pqmq__delivery **out);
/* Marks the jobs of b as held by row locks (mq_claim_lane's lane 1): their
 * deliveries then carry the attempt number the row still has, which is what
 * completions and failures are fenced by. */
void pqmq__batch_set_locked(pqmq_batch *b);
/* The delivery a job came with; borrowed from the job. */
const pqmq__delivery *pqmq__job_delivery(const pqmq_job *j);

/* ---- consume.c: the consumer's statements ----------------------------- */

/* pqmq_poll's statement; left: only what a runner's locked workers leave,
 * retries and messages whose locked delivery died (mq_claim_lane's lane
 * 2). */
int pqmq__poll(pqmq_client *c, const char *const *channels, size_t nchannels, int batch_size,
               int left, pqmq_batch **out);
/* Completes all n deliveries (each still on its attempt) and commits the
 * open transaction, in one round trip; on any failure (PQMQ_ESTALE: one was
 * no longer ours) rolls it back. n 0: just commits. */
int pqmq__complete_commit(pqmq_client *c, const pqmq__delivery *d, size_t n);
/* Completes deliveries still on their attempts; *done = how many. Returns
 * PQMQ_ESTALE when fewer than n were. The one way jobs are completed. */
int pqmq__complete(pqmq_client *c, const pqmq__delivery *d, size_t n, size_t *done);
/* PQMQ_ESTALE with its message when done < n, else 0. */
int pqmq__stale_check(pqmq_client *c, size_t done, size_t n);
/* Hands claimed jobs back unstarted (mq_release); enters the runner's step
 * "pqmq_runner: release". */
int pqmq__release(pqmq_client *c, const pqmq__delivery *d, size_t n);
/* pqmq_fail fenced by attempt (0: unfenced); enters "pqmq_fail". */
int pqmq__fail(pqmq_client *c, const uuid_t id, int attempt, const char *error);
/* pqmq_checkpoint fenced by attempt (0: whichever delivery holds the
 * lease), as the runner's pqmq_ctx_checkpoint calls it. */
int pqmq__checkpoint(pqmq_client *c, const uuid_t id, int attempt, int64_t duration_ms,
                     const char *json, const void *bytes, size_t len, int extra_retries);

/* ---- complete_poll.c -------------------------------------------------- */

/* mq_complete_claim: completes deliveries (n may be 0), then polls; *done =
 * how many were completed. *out is set when the poll ran (0 or ESTALE). */
int pqmq__complete_poll(pqmq_client *c, const pqmq__delivery *d, size_t n,
                        const char *const *channels, size_t nchannels, int batch_size,
                        pqmq_batch **out, size_t *done);

/* ---- new_msg.c -------------------------------------------------------- */

/* The built-in types the client writes and reads in binary (pg_type.dat):
 * mq_new_t's fields here, mq_job_t's columns in job.c. The server checks a
 * record's field types against its type's (record_recv). */
enum {
    PQMQ__OID_BOOL = 16,
    PQMQ__OID_BYTEA = 17,
    PQMQ__OID_INT4 = 23,
    PQMQ__OID_TEXT = 25,
    PQMQ__OID_INTERVAL = 1186,
    PQMQ__OID_UUID = 2950,
};

/* libpqtypes' put handler of mq_new_t (registered by pqmq__need_composite):
 * PQputf(param, "%mq_new_t", const pqmq_msg *) puts the message as one
 * element; the message must have passed pqmq__check_batch. */
int pqmq__put_new_msg(PGtypeArgs *args);

/* ---- msg.c: the message a producer builds (produce.c reads it) -------- */

struct pqmq_msg {
    uuid_t id;
    char *channel;
    char *args;  /* NULL means "" */
    char *name;  /* NULL means "" */
    char *json;  /* NULL: no JSON payload */
    void *bytes; /* NULL: no binary payload */
    size_t bytes_len;
    int64_t delay_ms;
    int64_t backoff_ms;
    int64_t commit_interval_ms; /* -1: not two-phase */
    int retries;
    int ordered;
    char *unique_key; /* NULL: none */
    int priority;     /* 0..PQMQ_MAX_PRIORITY, 0 the lowest */
};

/* ---- produce.c: shared with unique.c ------------------------------------ */

/* Checks a batch as pqmq_insert does; names the bad message. */
int pqmq__check_batch(pqmq_client *c, pqmq_msg *const *msgs, size_t n);
/* Does any message of the batch carry a unique key? */
int pqmq__has_keys(pqmq_msg *const *msgs, size_t n);
/* An insert's prologue: checks the client and the batch and puts it in a
 * new *param (caller clears; NULL on error), with its keys when force_keys
 * or any message has one (*keys says which). */
int pqmq__begin_insert(pqmq_client *c, pqmq_msg *const *msgs, size_t n, int force_keys,
                       PGparam **param, int *keys);

/* ---- cron.c ------------------------------------------------------------ */

/* A cron expression as bit sets: bit v of each is value v (minute 0..59,
 * hour 0..23, day of month 1..31, month 1..12, weekday 0..6, Sunday 0);
 * dom_any / dow_any: the day field starts with '*'. */
typedef struct {
    uint64_t minutes, hours, doms, months, dows;
    int dom_any, dow_any;
} pqmq__cron;

/* Parses expr; on error returns -1 with a message naming the field in err. */
int pqmq__cron_parse(const char *expr, pqmq__cron *out, char *err, size_t errlen);

/* ---- json.c ----------------------------------------------------------- */

/* Is the NUL-terminated s valid UTF-8 (no overlongs, surrogates or code
 * points above U+10FFFF)? */
int pqmq__utf8_ok(const char *s);

/* ---- migrations.c (generated from migrations/ and schema/) ------------ */

/* One file of the schema, as pqmq_migrate applies it: "schema/poll",
 * "migrations/0.1.0_to_1.0.0". */
typedef struct {
    const char *name;
    const char *sql;
} pqmq_migration;

/* The files in the order they are applied, and the version they record. */
extern const pqmq_migration pqmq_migrations[];
extern const size_t pqmq_migration_count;
extern const int pqmq_schema_release;

#endif
