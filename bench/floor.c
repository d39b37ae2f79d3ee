/*
 * floor.c: the SQL floor. The cheapest SQL that moves the same messages
 * with the same clients and batch sizes: a plain table with a time index,
 * one prepared multi-row INSERT per batch, and a prepared
 *   DELETE ... WHERE id IN (SELECT ... ORDER BY created_at LIMIT batch
 *                           FOR UPDATE SKIP LOCKED) RETURNING ...
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

#include "bench.h"

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

static void *inserter_main(void *arg)
{
    struct floor_worker *p = arg;
    const struct opts *o = p->o;
    PGconn *conn = bench_connect(o);
    size_t cap = bench_payload_cap(o->payload_bytes), row = 40 + 24 + cap;
    char *buf = malloc((size_t)o->batch * row);
    const char **vals = malloc(3 * (size_t)o->batch * sizeof *vals);
    if (!buf || !vals)
        die("out of memory");
    prepare_insert(conn, "ins_full", o->batch);
    int tail = o->messages % o->batch;
    if (tail)
        prepare_insert(conn, "ins_tail", tail);
    pthread_barrier_wait(p->start);
    for (;;) {
        long b = atomic_fetch_add(p->next_batch, 1);
        if (b >= p->nbatches)
            break;
        long first = b * o->batch;
        int k = o->messages - first < o->batch ? (int)(o->messages - first) : o->batch;
        for (int i = 0; i < k; i++) {
            long seq = first + i;
            char *id = buf + (size_t)i * row, *ch = id + 40, *json = ch + 24;
            uuid_t u;
            pqmq_uuid_generate(u); /* the same time-ordered ids pqmq uses */
            uuid_unparse_lower(u, id);
            snprintf(ch, 24, "c%ld", seq % o->channels);
            bench_payload(json, cap, seq, 0, o->payload_bytes);
            vals[3 * i] = id;
            vals[3 * i + 1] = ch;
            vals[3 * i + 2] = json;
        }
        PGresult *r = PQexecPrepared(conn, k == o->batch ? "ins_full" : "ins_tail", 3 * k, vals,
                                     NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            die("floor insert: %s", PQerrorMessage(conn));
        PQclear(r);
        atomic_fetch_add(p->done, k);
    }
    free(vals);
    free(buf);
    PQfinish(conn);
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

static void *drainer_in(void *arg)
{
    drainer(arg, "DELETE FROM floor_msgs WHERE id IN ("
                 " SELECT id FROM floor_msgs ORDER BY created_at LIMIT $1"
                 " FOR UPDATE SKIP LOCKED)"
                 " RETURNING id, channel, payload");
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

double floor_drain(const struct opts *o, PGconn *admin, int by_ctid)
{
    double t = run_workers(o, o->consumers, by_ctid ? drainer_ctid : drainer_in,
                           by_ctid ? "floor: drain (ctid)" : "floor: drain");
    long left = bench_scalar(admin, "SELECT count(*) FROM floor_msgs");
    if (left)
        die("floor drain left %ld rows", left);
    return t;
}
