/*
 * once.c: exactly-once processing, measured with --floor after the poll-API
 * phase. Every consumer's "handler" records one row per message in
 * bench_results (the message's id as primary key, so a second effect of a
 * message is an error, not a count) and the completion commits in the same
 * transaction, as examples/exactly_once.c does with the runner.
 *
 * pqmq: poll API consumers on a connection of their own wrapped with
 * pqmq_wrap; per batch BEGIN, the INSERT of the batch's rows,
 * pqmq_complete_and_poll (completes this batch, claims the next, inside
 * the transaction), COMMIT.
 * pqmq's locked lane: per batch pqmq_poll_locked (BEGIN and the poll in one
 * round trip), the INSERT, pqmq_complete_commit (the completion and COMMIT
 * in one): three round trips, one commit.
 * The floor: per batch BEGIN, the floor's DELETE ... RETURNING, the same
 * INSERT of the rows it returned, COMMIT.
 * Both make four round trips and one commit per batch, and insert a
 * batch's rows with one statement.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "floor.h"
#include "once.h"
#include "options.h"
#include "profile.h"
#include "progress.h"
#include "queue.h"
#include "results.h"
#include "util.h"

#define STALL_S 60.0 /* a phase that makes no progress this long is broken */

static const char record_sql[] = "INSERT INTO bench_results (id, channel)"
                                 " SELECT * FROM unnest($1::uuid[], $2::text[])";

void once_setup(PGconn *admin)
{
    bench_sql(admin, "DROP TABLE IF EXISTS bench_results");
    bench_sql(admin, "CREATE TABLE bench_results ("
                     " id uuid PRIMARY KEY,"
                     " channel text NOT NULL,"
                     " done_at timestamptz NOT NULL DEFAULT now())");
}

struct once_worker {
    const struct opts *o;
    pthread_barrier_t *start;
    atomic_long *done;
};

static void exec_ok(PGconn *conn, const char *sql)
{
    PGresult *r = PQexec(conn, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        die("exactly-once: %s: %s", sql, PQerrorMessage(conn));
    PQclear(r);
}

static void prepare(PGconn *conn, const char *name, const char *sql)
{
    PGresult *r = PQprepare(conn, name, sql, 0, NULL);
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        die("exactly-once: prepare %s: %s", name, PQerrorMessage(conn));
    PQclear(r);
}

/* Two array literals, ids and channels, grown one element at a time. The
 * elements are uuids and "c<n>": nothing to escape. */
struct rows {
    char *ids, *channels;
    size_t nid, nch, cap;
};

static void rows_init(struct rows *w, int batch)
{
    w->cap = (size_t)batch * 40 + 4;
    w->ids = malloc(w->cap);
    w->channels = malloc(w->cap);
    if (!w->ids || !w->channels)
        die("out of memory");
}

static void rows_reset(struct rows *w)
{
    w->nid = w->nch = 0;
}

static void put(char *buf, size_t *n, size_t cap, const char *elem)
{
    int k = snprintf(buf + *n, cap - *n, "%s\"%s\"", *n ? "," : "{", elem);
    if (k < 0 || (size_t)k + 2 > cap - *n) /* room left for "}" and NUL */
        die("exactly-once: row buffer too small");
    *n += (size_t)k;
}

static void rows_add(struct rows *w, const char *id, const char *channel)
{
    put(w->ids, &w->nid, w->cap, id);
    put(w->channels, &w->nch, w->cap, channel);
}

/* The handler's effect: one row per message, in the open transaction. */
static void rows_record(struct rows *w, PGconn *conn)
{
    strcpy(w->ids + w->nid, "}");
    strcpy(w->channels + w->nch, "}");
    const char *vals[2] = {w->ids, w->channels};
    PGresult *r = PQexecPrepared(conn, "record", 2, vals, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        die("exactly-once: record: %s", PQerrorMessage(conn));
    PQclear(r);
}

static void rows_free(struct rows *w)
{
    free(w->ids);
    free(w->channels);
}

/* ---- pqmq: the poll API in the caller's transaction -------------------- */

/* Records held's messages and completes them in one transaction; the same
 * call claims the next batch, returned. */
static pqmq_batch *record_and_complete(pqmq_client *c, PGconn *conn, struct rows *w,
                                       const pqmq_batch *held, int batch)
{
    rows_reset(w);
    for (size_t i = 0; i < pqmq_batch_count(held); i++) {
        const pqmq_job *job = pqmq_batch_job(held, i);
        uuid_t id;
        char text[37];
        pqmq_job_id(job, id);
        uuid_unparse_lower(id, text);
        rows_add(w, text, pqmq_job_args(job));
    }
    exec_ok(conn, "BEGIN");
    rows_record(w, conn);
    pqmq_batch *next = NULL;
    /* Stale would mean a message recorded here and completed elsewhere: the
     * leases are long (600 s), so it is a failure of the run. */
    if (pqmq_complete_and_poll(c, held, NULL, 0, batch, &next))
        die("exactly-once: pqmq_complete_and_poll: %s", pqmq_errmsg(c));
    exec_ok(conn, "COMMIT");
    return next;
}

static void *pqmq_main(void *arg)
{
    struct once_worker *p = arg;
    const struct opts *o = p->o;
    PGconn *conn = bench_connect(o);
    pqmq_client *c = NULL;
    if (pqmq_wrap(conn, &c))
        die("pqmq_wrap: %s", pqmq_errmsg(c));
    prepare(conn, "record", record_sql);
    struct rows w;
    rows_init(&w, o->batch);
    pthread_barrier_wait(p->start);
    pqmq_batch *held = NULL;
    double last = now_s();
    while (atomic_load(p->done) < o->messages) {
        size_t n = pqmq_batch_count(held);
        pqmq_batch *next = NULL;
        if (n) {
            next = record_and_complete(c, conn, &w, held, o->batch);
            atomic_fetch_add(p->done, (long)n);
            last = now_s();
        } else if (pqmq_poll(c, NULL, 0, o->batch, &next)) {
            die("exactly-once: pqmq_poll: %s", pqmq_errmsg(c));
        } else if (!pqmq_batch_count(next)) {
            if (now_s() - last > STALL_S)
                die("exactly-once: stalled at %ld of %d", atomic_load(p->done), o->messages);
            sleep_s(0.0005); /* the rest is in flight on other consumers */
        }
        pqmq_batch_free(held);
        held = next;
    }
    if (pqmq_batch_count(held))
        die("exactly-once: a batch claimed after the last message was done");
    pqmq_batch_free(held);
    queue_reclaim_log(conn);
    rows_free(&w);
    pqmq_client_free(c);
    PQfinish(conn);
    return NULL;
}

/* ---- pqmq: the locked lane ---------------------------------------------- */

/* One batch: pqmq_poll_locked (BEGIN and the poll), the INSERT of its rows,
 * pqmq_complete_commit (the completion and COMMIT): three round trips.
 * Returns how many messages it recorded. */
static size_t locked_batch(pqmq_client *c, PGconn *conn, struct rows *w, int batch)
{
    pqmq_batch *b = NULL;
    if (pqmq_poll_locked(c, NULL, 0, batch, &b))
        die("exactly-once: pqmq_poll_locked: %s", pqmq_errmsg(c));
    size_t n = pqmq_batch_count(b);
    rows_reset(w);
    for (size_t i = 0; i < n; i++) {
        const pqmq_job *job = pqmq_batch_job(b, i);
        uuid_t id;
        char text[37];
        pqmq_job_id(job, id);
        uuid_unparse_lower(id, text);
        rows_add(w, text, pqmq_job_args(job));
    }
    if (n)
        rows_record(w, conn);
    if (pqmq_complete_commit(c, b))
        die("exactly-once: pqmq_complete_commit: %s", pqmq_errmsg(c));
    pqmq_batch_free(b);
    return n;
}

static void *locked_main(void *arg)
{
    struct once_worker *p = arg;
    const struct opts *o = p->o;
    PGconn *conn = bench_connect(o);
    pqmq_client *c = NULL;
    if (pqmq_wrap(conn, &c))
        die("pqmq_wrap: %s", pqmq_errmsg(c));
    prepare(conn, "record", record_sql);
    struct rows w;
    rows_init(&w, o->batch);
    pthread_barrier_wait(p->start);
    double last = now_s();
    while (atomic_load(p->done) < o->messages) {
        size_t n = locked_batch(c, conn, &w, o->batch);
        if (n) {
            atomic_fetch_add(p->done, (long)n);
            last = now_s();
        } else if (now_s() - last > STALL_S) {
            die("exactly-once: stalled at %ld of %d", atomic_load(p->done), o->messages);
        } else {
            sleep_s(0.0005); /* the rest is held by other consumers */
        }
    }
    queue_reclaim_log(conn);
    rows_free(&w);
    pqmq_client_free(c);
    PQfinish(conn);
    return NULL;
}

/* ---- the floor: the same transaction around its DELETE ----------------- */

/* One batch: returns how many messages it recorded and deleted. */
static int floor_batch(PGconn *conn, struct rows *w, const char *lim)
{
    exec_ok(conn, "BEGIN");
    const char *vals[1] = {lim};
    PGresult *r = PQexecPrepared(conn, "drain", 1, vals, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        die("exactly-once floor: drain: %s", PQerrorMessage(conn));
    int n = PQntuples(r);
    rows_reset(w);
    for (int i = 0; i < n; i++)
        rows_add(w, PQgetvalue(r, i, 0), PQgetvalue(r, i, 1));
    PQclear(r);
    if (n)
        rows_record(w, conn);
    exec_ok(conn, "COMMIT");
    return n;
}

static void *floor_main(void *arg)
{
    struct once_worker *p = arg;
    const struct opts *o = p->o;
    PGconn *conn = bench_connect(o);
    prepare(conn, "drain", floor_drain_sql);
    prepare(conn, "record", record_sql);
    char lim[16];
    snprintf(lim, sizeof lim, "%d", o->batch);
    struct rows w;
    rows_init(&w, o->batch);
    pthread_barrier_wait(p->start);
    int n;
    /* 0: empty, or the rest is locked by drainers deleting it */
    while ((n = floor_batch(conn, &w, lim)) > 0)
        atomic_fetch_add(p->done, n);
    rows_free(&w);
    PQfinish(conn);
    return NULL;
}

/* ---- the phase ---------------------------------------------------------- */

static double timed(const struct opts *o, void *(*fn)(void *), const char *label)
{
    int n = o->consumers;
    struct once_worker *ws = calloc((size_t)n, sizeof *ws);
    pthread_barrier_t start;
    atomic_long done = 0;
    if (!ws)
        die("out of memory");
    pthread_barrier_init(&start, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++)
        ws[i] = (struct once_worker){o, &start, &done};
    double t = bench_timed_threads(n, fn, ws, sizeof *ws, &start, label, o->messages, &done);
    pthread_barrier_destroy(&start);
    free(ws);
    return t;
}

/* Every message recorded once and gone from its queue. */
static void check(const struct opts *o, PGconn *admin, const char *label, const char *left_sql)
{
    long rows = bench_scalar(admin, "SELECT count(*) FROM bench_results");
    long left = bench_scalar(admin, left_sql);
    if (rows != o->messages || left)
        die("%s: %ld result rows for %d messages, %ld left in the queue", label, rows,
            o->messages, left);
}

void run_once(const struct opts *o, PGconn *admin, int threads, struct results *res)
{
    double *pqmq_rate = &res->once, *locked_rate = &res->once_locked,
           *floor_rate = &res->floor_once;
    struct shape s = {o->channels, o->ordered, 0};
    const char *label = "exactly-once: poll API";
    queue_reset(admin);
    queue_enqueue(o, &s, "exactly-once: enqueue");
    bench_sql(admin, "ANALYZE mq_rows, mq_log, mq_cursors, mq_receipts");
    bench_sql(admin, "TRUNCATE bench_results");
    profile_begin(o, admin);
    *pqmq_rate = o->messages / timed(o, pqmq_main, label);
    profile_end(o, admin, label, o->messages);
    check(o, admin, label, "SELECT count(*) FROM mq_msgs");

    label = "exactly-once: locked lane";
    queue_reset(admin);
    queue_enqueue(o, &s, "exactly-once: enqueue");
    bench_sql(admin, "ANALYZE mq_rows, mq_log, mq_cursors, mq_receipts");
    bench_sql(admin, "TRUNCATE bench_results");
    profile_begin(o, admin);
    *locked_rate = o->messages / timed(o, locked_main, label);
    profile_end(o, admin, label, o->messages);
    check(o, admin, label, "SELECT count(*) FROM mq_msgs");

    /* Runners whose handlers write the rows in the jobs' transaction, which
     * commits with a batch of the worker's jobs: on the lease lane, commit
     * batches (pqmq_runner_set_commit_batch) with a group handler, which
     * writes a claim's worth of rows in one statement; or the locked lane,
     * a row per job. A group handler's worker takes a whole claim, so two
     * workers a runner keep one group running while the next claim comes
     * (unless --runner-threads says otherwise): more only add concurrent
     * transactions on the same cores. */
    for (int locked = 0; locked < 2; locked++) {
        int workers = locked || o->runner_threads ? threads : 2;
        label = locked ? "exactly-once: runner, locked lane" : "exactly-once: runner";
        queue_reset(admin);
        queue_enqueue(o, &s, "exactly-once: enqueue");
        bench_sql(admin, "ANALYZE mq_rows, mq_log, mq_cursors, mq_receipts");
        bench_sql(admin, "TRUNCATE bench_results");
        profile_begin(o, admin);
        double rate = o->messages / queue_drain_runner_with(o, workers, label, locked, 1);
        *(locked ? &res->once_runner_locked : &res->once_runner) = rate;
        profile_end(o, admin, label, o->messages);
        check(o, admin, label, "SELECT count(*) FROM mq_msgs");
    }

    label = "exactly-once: floor";
    floor_insert(o, admin);
    bench_sql(admin, "ANALYZE floor_msgs");
    bench_sql(admin, "TRUNCATE bench_results");
    profile_begin(o, admin);
    *floor_rate = o->messages / timed(o, floor_main, label);
    profile_end(o, admin, label, o->messages);
    check(o, admin, label, "SELECT count(*) FROM floor_msgs");
}
