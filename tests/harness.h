/*
 * harness.h: the tiny test framework of pqmq's tests.
 *
 * Every test program gets its own schema in the database named by
 * PQMQ_TEST_DSN (tests/run-tests.sh provides one), migrated with
 * pqmq_migrate, and dropped at the end. Checks never stop a test function;
 * T_RUN prints "ok"/"not ok" per function and t_done() the exit status.
 */
#ifndef PQMQ_TEST_HARNESS_H
#define PQMQ_TEST_HARNESS_H

#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "pqmq.h"

extern int t_failed_checks;

void t_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond))                                                                           \
            t_fail(__FILE__, __LINE__, "CHECK(%s)", #cond);                                    \
    } while (0)
#define CHECK_INT(a, b)                                                                        \
    do {                                                                                       \
        long long a_ = (long long)(a), b_ = (long long)(b);                                    \
        if (a_ != b_)                                                                          \
            t_fail(__FILE__, __LINE__, "%s == %lld, expected %s == %lld", #a, a_, #b, b_);     \
    } while (0)
#define CHECK_STR(a, b)                                                                        \
    do {                                                                                       \
        const char *a_ = (a), *b_ = (b);                                                       \
        if (!a_ || !b_ || strcmp(a_, b_) != 0)                                                 \
            t_fail(__FILE__, __LINE__, "%s == \"%s\", expected \"%s\"", #a,                    \
                   a_ ? a_ : "(null)", b_ ? b_ : "(null)");                                    \
    } while (0)
/* expr must return 0 on client; on failure prints pqmq_errmsg(client). */
#define CHECK_OK(client, expr)                                                                 \
    do {                                                                                       \
        int rc_ = (expr);                                                                      \
        if (rc_ != 0)                                                                          \
            t_fail(__FILE__, __LINE__, "%s returned %d: %s", #expr, rc_, pqmq_errmsg(client)); \
    } while (0)
/* expr must fail with code; the message must contain needle (may be NULL). */
#define CHECK_ERR(client, expr, code, needle)                                                  \
    do {                                                                                       \
        int rc_ = (expr);                                                                      \
        const char *m_ = pqmq_errmsg(client), *n_ = (needle);                                  \
        if (rc_ != (code))                                                                     \
            t_fail(__FILE__, __LINE__, "%s returned %d, expected %s (%d); msg: %s", #expr,     \
                   rc_, #code, (code), m_);                                                    \
        else if (n_ && !strstr(m_, n_))                                                        \
            t_fail(__FILE__, __LINE__, "%s: message \"%s\" lacks \"%s\"", #expr, m_, n_);      \
    } while (0)

#define T_RUN(fn) t_run(#fn, fn)
void t_run(const char *name, void (*fn)(void));

/* Initialises the harness: creates and migrates this program's schema.
 * Exits 77 (skip) only when PQMQ_TEST_DSN is unset. */
void t_init(const char *test_name);
/* Drops the schema; returns the process exit status. */
int t_done(void);

/* The connection string parts tests share. */
const char *t_dsn(void);
const char *t_schema(void);

/* base (NULL: t_dsn()) with options setting the search_path to path
 * (NULL: the test schema) and client_min_messages to warning, plus
 * application_name=app unless app is NULL. Caller frees. */
char *t_conninfo(const char *base, const char *path, const char *app);

/* A new client on the test schema; aborts the test program on failure.
 * Caller owns; free with pqmq_client_free. */
pqmq_client *t_client(void);
/* A new raw libpq connection on the test schema. Caller owns; PQfinish. */
PGconn *t_pg(void);
/* A connection for LISTEN: straight to the server ($PQMQ_TEST_LISTEN_DSN)
 * when the tests run behind a pooler, else t_pg(). Caller owns; PQfinish. */
PGconn *t_listener(void);
/* 1 when the tests run behind a pooler in transaction mode
 * (PQMQ_TEST_POOLED=1, tests/test_pgbouncer.sh). */
int t_pooled(void);
/* 1 when the tests run through a Citus coordinator (PQMQ_TEST_CITUS=1). */
int t_citus(void);
/* 1, after saying why, when the tests run through a Citus coordinator
 * (PQMQ_TEST_CITUS=1, tests/citus/check.sh): for the checks of what only a
 * single server shows (its statistics counters, plans and index sizes), or
 * of what tests build around the queue on that server (triggers of their
 * own on its tables). */
int t_citus_skip(const char *why);

/* Runs SQL (printf-formatted; only for trusted test text) and fails the
 * check on error. Returns the result (caller PQclear's) or NULL. */
PGresult *t_sql(PGconn *conn, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Runs SQL returning one value; returns it as a long long (-1 on NULL or
 * error, which also fails the check). */
long long t_sql_int(PGconn *conn, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Runs the pqmq command ($PQMQ_TEST_BUILDDIR/cli/pqmq) on the test schema with
 * args; returns its stdout (caller frees) and sets *status to its exit status. */
char *t_run_pqmq(const char *args, int *status);
/* Runs a statement expected to succeed, discarding its result. */
void t_exec(PGconn *conn, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* LISTENs on chan (any text: quoted as an identifier) on l. */
void t_listen(PGconn *l, const char *chan);
/* What t_collect_notes hands each notification other than the marker. */
typedef void (*t_note_fn)(const PGnotify *nt, void *arg);
/* Passes to fn, in arrival order, the notifications l receives from the
 * backend pid until one on channel marker comes (the caller sends it after
 * what it waits for: notifications arrive in commit order); other backends'
 * (other tests on the same database) are ignored. Returns 0; -1 when l
 * failed (which fails the check); -2 when the marker did not come within ms
 * or the wait failed. */
int t_collect_notes(PGconn *l, int pid, const char *marker, int64_t ms, t_note_fn fn,
                    void *arg);

/* Empties the queue tables of the test schema. */
void t_truncate(void);

/* Monotonic milliseconds. */
int64_t t_now_ms(void);
void t_sleep_ms(int64_t ms);

/* Waits for the clock's next second: a poll that finds nothing then sweeps
 * every channel of the log (_mq_log_upkeep sweeps at most once a second a
 * session), whichever server session a pooler hands it. */
void t_await_log_sweep(void);

/* A runner on the test schema (notices quiet), LISTENing straight to the
 * server behind a pooler ($PQMQ_TEST_LISTEN_DSN); aborts on failure.
 * Caller owns; pqmq_runner_free. */
pqmq_runner *t_runner(void);
/* t_runner with application_name=app (NULL: none), to find its backends. */
pqmq_runner *t_runner_app(const char *app);
/* A runner running on a thread of its own: t_runner_start runs r there,
 * t_runner_stop stops it, waits for it (15 s at most, as t_runner_join)
 * and fails the check unless pqmq_runner_run returned 0. t_runner_join
 * waits at most ms for run to return (after a stop the caller sent); 0, or
 * -1 after failing the check and stopping and joining it anyway.
 * t_runner_process runs r (t_runner_start) until it has processed n jobs,
 * waiting at most ms, then stops it (t_runner_stop). */
typedef struct {
    pqmq_runner *r;
    pthread_t thread;
    int rc; /* what pqmq_runner_run returned (99 until it does) */
} t_bg;
void t_runner_start(t_bg *b, pqmq_runner *r);
void t_runner_stop(t_bg *b);
int t_runner_join(t_bg *b, int64_t ms);
void t_runner_process(pqmq_runner *r, uint64_t n, int64_t ms);
/* The runner's statistics, by value. */
pqmq_runner_stats_t t_stats(const pqmq_runner *r);

/* Waits up to ms for cond, looking every 5 ms. */
#define WAIT_UNTIL(cond, ms)                                                                   \
    do {                                                                                       \
        int64_t end_ = t_now_ms() + (ms);                                                      \
        while (!(cond) && t_now_ms() < end_)                                                   \
            t_sleep_ms(5);                                                                     \
    } while (0)

/* Builds a message; aborts on OOM. Caller owns; pqmq_msg_free. */
pqmq_msg *t_msg(const char *channel, const char *args, const char *name, const char *json,
                int ordered);
/* Frees n messages. */
void t_msgs_free(pqmq_msg **msgs, size_t n);
/* Inserts n messages named name on channel (NULL: c0..c4 in turn), 100 a
 * call, with this payload, retries and backoff; ordered: all on the chain
 * of args "chain". */
void t_insert_spread(pqmq_client *q, int n, const char *channel, const char *name,
                     const char *json, int ordered, int retries, int64_t backoff_ms);

#endif
