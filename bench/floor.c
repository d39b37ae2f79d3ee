/*
 * floor.c: the SQL floor. The cheapest SQL that moves the same messages
 * with the same clients and batch sizes: a plain table with a time index,
 * one prepared multi-row INSERT per batch, and a prepared
 *   DELETE ... WHERE id = ANY (ARRAY(SELECT ... ORDER BY created_at
 *                                    LIMIT batch FOR UPDATE SKIP LOCKED))
 *   RETURNING ...
 * per batch. No ordering, retries, leases, fairness or wake-ups: whatever
 * pqmq costs beyond this is the price of those.
 *
 * That DELETE is the floor, but its plan depends on the table's
 * size: up to a few ten thousand rows PostgreSQL hash-joins the batch
 * against a sequential scan of the whole table (O(n) per batch). The
 * ctid form, WHERE ctid = ANY (ARRAY(SELECT ctid ... FOR UPDATE SKIP
 * LOCKED)), is a TID scan at any size: the true floor, reported beside it.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "floor.h"
#include "load_ops.h"
#include "options.h"
#include "progress.h"
#include "util.h"

void floor_setup(PGconn *admin)
{
    bench_sql(admin, "DROP TABLE IF EXISTS floor_msgs");
    bench_sql(admin, "CREATE TABLE floor_msgs ("
                     " id uuid PRIMARY KEY,"
                     " channel text NOT NULL,"
                     " payload jsonb,"
                     " created_at timestamptz NOT NULL DEFAULT now())");
    bench_sql(admin, "CREATE INDEX floor_msgs_created_at ON floor_msgs (created_at)");
}

static void prepare(PGconn *conn, const char *name, const char *sql)
{
    PGresult *r = PQprepare(conn, name, sql, 0, NULL);
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        die("floor: prepare %s: %s", name, PQerrorMessage(conn));
    PQclear(r);
}

/* Prepares "INSERT ... VALUES ($1,$2,$3), ... " for k rows as name. */
static void prepare_insert(PGconn *conn, const char *name, int k)
{
    char *sql = malloc((size_t)k * 32 + 64), *w = sql;
    if (!sql)
        die("out of memory");
    w += sprintf(w, "INSERT INTO floor_msgs (id, channel, payload) VALUES ");
    for (int i = 0; i < k; i++)
        w += sprintf(w, "%s($%d,$%d,$%d)", i ? "," : "", 3 * i + 1, 3 * i + 2, 3 * i + 3);
    prepare(conn, name, sql);
    free(sql);
}

struct floor_worker {
    const struct opts *o;
    pthread_barrier_t *start;
    atomic_long *next_batch, *done;
    long nbatches;
};

/* A producer's connection with its INSERT prepared for a full batch (and
 * for a shorter last one: tail rows), and buffers for group batches. */
struct floor_inserter {
    const struct opts *o;
    PGconn *conn;
    size_t cap, row;
    char *buf;
    const char **vals;
};

static void inserter_open(struct floor_inserter *f, const struct opts *o, int tail, int group)
{
    f->o = o;
    f->conn = bench_connect(o);
    f->cap = bench_payload_cap(o->payload_bytes);
    f->row = 40 + 24 + f->cap;
    f->buf = malloc((size_t)group * (size_t)o->batch * f->row);
    f->vals = malloc(3 * (size_t)group * (size_t)o->batch * sizeof *f->vals);
    if (!f->buf || !f->vals)
        die("out of memory");
    prepare_insert(f->conn, "ins_full", o->batch);
    if (tail)
        prepare_insert(f->conn, "ins_tail", tail);
}

/* Fills slot's parameters with messages seq first .. first + k - 1; returns
 * them. */
static const char **fill_rows(struct floor_inserter *f, int slot, long first, int k)
{
    size_t base = (size_t)slot * (size_t)f->o->batch;
    for (int i = 0; i < k; i++) {
        long seq = first + i;
        char *id = f->buf + (base + (size_t)i) * f->row, *ch = id + 40, *json = ch + 24;
        uuid_t u;
        pqmq_uuid_generate(u); /* the same time-ordered ids pqmq uses */
        uuid_unparse_lower(u, id);
        snprintf(ch, 24, "c%ld", seq % f->o->channels);
        bench_payload(json, f->cap, seq, 0, f->o->payload_bytes);
        f->vals[3 * (base + (size_t)i)] = id;
        f->vals[3 * (base + (size_t)i) + 1] = ch;
        f->vals[3 * (base + (size_t)i) + 2] = json;
    }
    return f->vals + 3 * base;
}

/* Inserts messages seq first .. first + k - 1 (k: the batch or the tail). */
static void insert_batch(struct floor_inserter *f, long first, int k)
{
    const char **vals = fill_rows(f, 0, first, k);
    PGresult *r = PQexecPrepared(f->conn, k == f->o->batch ? "ins_full" : "ins_tail", 3 * k,
                                 vals, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        die("floor insert: %s", PQerrorMessage(f->conn));
    PQclear(r);
}

/* Inserts batches b .. b + nb - 1 in one round trip, each its own
 * transaction (a sync each), as pqmq_insert_batches does. */
static long insert_batches(struct floor_inserter *f, long b, int nb)
{
    const struct opts *o = f->o;
    long total = 0;
    if (!PQenterPipelineMode(f->conn))
        die("floor insert: %s", PQerrorMessage(f->conn));
    for (int j = 0; j < nb; j++) {
        long first = (b + j) * o->batch;
        int k = o->messages - first < o->batch ? (int)(o->messages - first) : o->batch;
        const char **vals = fill_rows(f, j, first, k);
        if (!PQsendQueryPrepared(f->conn, k == o->batch ? "ins_full" : "ins_tail", 3 * k, vals,
                                 NULL, NULL, 0) ||
            !PQpipelineSync(f->conn))
            die("floor insert: %s", PQerrorMessage(f->conn));
        total += k;
    }
    for (int j = 0; j < nb; j++) {
        PGresult *r;
        while ((r = PQgetResult(f->conn)) != NULL) {
            if (PQresultStatus(r) != PGRES_COMMAND_OK)
                die("floor insert: %s", PQerrorMessage(f->conn));
            PQclear(r);
        }
        r = PQgetResult(f->conn);
        if (PQresultStatus(r) != PGRES_PIPELINE_SYNC)
            die("floor insert: no sync: %s", PQerrorMessage(f->conn));
        PQclear(r);
    }
    PQexitPipelineMode(f->conn);
    return total;
}

static void inserter_close(struct floor_inserter *f)
{
    free(f->vals);
    free(f->buf);
    PQfinish(f->conn);
}

static void *inserter_main(void *arg)
{
    struct floor_worker *p = arg;
    const struct opts *o = p->o;
    struct floor_inserter f;
    inserter_open(&f, o, o->messages % o->batch, 1);
    pthread_barrier_wait(p->start);
    for (;;) {
        long b = atomic_fetch_add(p->next_batch, 1);
        if (b >= p->nbatches)
            break;
        long first = b * o->batch;
        int k = o->messages - first < o->batch ? (int)(o->messages - first) : o->batch;
        insert_batch(&f, first, k);
        atomic_fetch_add(p->done, k);
    }
    inserter_close(&f);
    return NULL;
}

static void *pipelined_inserter_main(void *arg)
{
    struct floor_worker *p = arg;
    const struct opts *o = p->o;
    struct floor_inserter f;
    inserter_open(&f, o, o->messages % o->batch, BENCH_PIPELINE);
    pthread_barrier_wait(p->start);
    for (;;) {
        long b = atomic_fetch_add(p->next_batch, BENCH_PIPELINE);
        if (b >= p->nbatches)
            break;
        long left = p->nbatches - b;
        atomic_fetch_add(
            p->done, insert_batches(&f, b, left < BENCH_PIPELINE ? (int)left : BENCH_PIPELINE));
    }
    inserter_close(&f);
    return NULL;
}

static void drainer(struct floor_worker *p, const char *sql)
{
    const struct opts *o = p->o;
    PGconn *conn = bench_connect(o);
    prepare(conn, "drain", sql);
    char lim[16];
    snprintf(lim, sizeof lim, "%d", o->batch);
    const char *vals[1] = {lim};
    pthread_barrier_wait(p->start);
    for (;;) {
        PGresult *r = PQexecPrepared(conn, "drain", 1, vals, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK)
            die("floor drain: %s", PQerrorMessage(conn));
        int n = PQntuples(r);
        PQclear(r);
        if (n == 0)
            break; /* empty, or the rest is locked by drainers deleting it */
        atomic_fetch_add(p->done, n);
    }
    PQfinish(conn);
}

/* id = ANY (ARRAY(...)), not id IN (...): the IN form's generic plan, made
 * while the table looked empty, turned into a join that read the whole
 * table for every batch under steady load (a 30 s DELETE). */
const char floor_drain_sql[] = "DELETE FROM floor_msgs WHERE id = ANY (ARRAY("
                               " SELECT id FROM floor_msgs ORDER BY created_at LIMIT $1"
                               " FOR UPDATE SKIP LOCKED))"
                               " RETURNING id, channel, payload";

static void *drainer_in(void *arg)
{
    drainer(arg, floor_drain_sql);
    return NULL;
}

static void *drainer_ctid(void *arg)
{
    drainer(arg, "DELETE FROM floor_msgs WHERE ctid = ANY (ARRAY("
                 " SELECT ctid FROM floor_msgs ORDER BY created_at LIMIT $1"
                 " FOR UPDATE SKIP LOCKED))"
                 " RETURNING id, channel, payload");
    return NULL;
}

static double run_workers(const struct opts *o, int n, void *(*fn)(void *), const char *label)
{
    struct floor_worker *ws = calloc((size_t)n, sizeof *ws);
    pthread_barrier_t start;
    atomic_long next_batch = 0, done = 0;
    if (!ws)
        die("out of memory");
    pthread_barrier_init(&start, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++)
        ws[i] = (struct floor_worker){o, &start, &next_batch, &done,
                                      (o->messages + o->batch - 1) / o->batch};
    double t = bench_timed_threads(n, fn, ws, sizeof *ws, &start, label, o->messages, &done);
    pthread_barrier_destroy(&start);
    free(ws);
    return t;
}

double floor_insert(const struct opts *o, PGconn *admin)
{
    bench_sql(admin, "TRUNCATE floor_msgs");
    return run_workers(o, o->producers, inserter_main, "floor: insert");
}

double floor_insert_pipelined(const struct opts *o, PGconn *admin)
{
    bench_sql(admin, "TRUNCATE floor_msgs");
    return run_workers(o, o->producers, pipelined_inserter_main, "floor: insert, pipelined");
}

double floor_drain(const struct opts *o, PGconn *admin, int by_ctid)
{
    double t = run_workers(o, o->consumers, by_ctid ? drainer_ctid : drainer_in,
                           by_ctid ? "floor: drain (ctid)" : "floor: drain");
    long left = bench_scalar(admin, "SELECT count(*) FROM floor_msgs");
    if (left)
        die("floor drain left %ld rows", left);
    return t;
}

/* ---- under load (load.c) ----------------------------------------------- */

static void load_reset(PGconn *admin)
{
    bench_sql(admin, "TRUNCATE floor_msgs");
}

static void *load_producer_new(const struct opts *o, const struct shape *s)
{
    (void)s; /* the floor has no order */
    struct floor_inserter *f = malloc(sizeof *f);
    if (!f)
        die("out of memory");
    inserter_open(f, o, 0, 1);
    return f;
}

static void load_produce(void *arg, long first, int k)
{
    insert_batch(arg, first, k);
}

static void load_producer_free(void *arg)
{
    inserter_close(arg);
    free(arg);
}

struct floor_consumer {
    PGconn *conn;
    char lim[16];
};

static void *load_consumer_new(const struct opts *o)
{
    struct floor_consumer *fc = malloc(sizeof *fc);
    if (!fc)
        die("out of memory");
    fc->conn = bench_connect(o);
    prepare(fc->conn, "drain", floor_drain_sql);
    snprintf(fc->lim, sizeof fc->lim, "%d", o->batch);
    return fc;
}

/* The DELETE claims and completes at once: what it returns is done. */
static int load_consume(void *arg, long *completed)
{
    struct floor_consumer *fc = arg;
    const char *vals[1] = {fc->lim};
    PGresult *r = PQexecPrepared(fc->conn, "drain", 1, vals, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        die("floor drain: %s", PQerrorMessage(fc->conn));
    int n = PQntuples(r);
    PQclear(r);
    *completed += n;
    return n;
}

static void load_consumer_free(void *arg, long *completed)
{
    (void)completed; /* it holds nothing */
    struct floor_consumer *fc = arg;
    PQfinish(fc->conn);
    free(fc);
}

const struct load_ops floor_load_ops = {
    .name = "floor",
    .tables = {"floor_msgs", NULL},
    .reset = load_reset,
    .producer_new = load_producer_new,
    .produce = load_produce,
    .producer_free = load_producer_free,
    .consumer_new = load_consumer_new,
    .consume = load_consume,
    .consumer_free = load_consumer_free,
};
