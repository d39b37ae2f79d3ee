/*
 * load.c: the queue under steady load instead of a burn-down.
 *
 * --rate N: --producers threads insert batches of --batch at N messages/s
 * in total, paced by the clock; a producer that falls behind sends at most
 * one batch early to catch up, then keeps its pace (the rest of the debt
 * is dropped: the offered load never bursts). Without --rate the producers
 * insert as fast as they can (saturated). --consumers threads loop on one
 * poll call each (pqmq_complete_and_poll for pqmq, as the poll phase does);
 * one whose poll comes back empty sleeps EMPTY_SLEEP_S. Every poll call is
 * timed. A line per second goes to stderr.
 *
 * --held-xmin S: three phases of S seconds, before, during and after a
 * REPEATABLE READ transaction on a connection of its own that has read a
 * row (its snapshot holds back the xmin horizon, so no dead row of the
 * queue can be removed) and commits at the end of the middle phase.
 * Without it, one phase of --duration seconds.
 *
 * Autovacuum runs at the server's settings; the bench never vacuums or
 * analyzes during a load run. With --floor the same run follows against
 * the floor (floor.c). The backlog is inserted minus completed, as counted
 * by the clients.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "floor.h"
#include "hist.h"
#include "load.h"
#include "load_ops.h"
#include "options.h"
#include "queue.h"
#include "report.h"
#include "results.h"
#include "util.h"

#define EMPTY_SLEEP_S 0.002 /* a consumer's pause after an empty poll */
#define TICK_S 0.1          /* the monitor samples the backlog this often */

struct load_run {
    const struct opts *o;
    const struct load_ops *ops;
    struct shape shape;
    double interval; /* seconds between one producer's batches; 0: saturated */
    atomic_int stop;
    atomic_long next_seq, inserted, processed;
    struct hist polls;
    pthread_barrier_t start;
    struct table_stats base[2]; /* at the start: the autovacuum counts */
};

/* ---- the clients --------------------------------------------------------- */

struct client_arg {
    struct load_run *run;
    int index;
};

/* Sleeps until t (monotonic seconds) unless the run stops first. */
static int wait_until(struct load_run *run, double t)
{
    for (;;) {
        if (atomic_load(&run->stop))
            return -1;
        double left = t - now_s();
        if (left <= 0)
            return 0;
        sleep_s(left < 0.05 ? left : 0.05);
    }
}

static void *producer_main(void *arg)
{
    struct client_arg *a = arg;
    struct load_run *run = a->run;
    int batch = run->o->batch;
    void *p = run->ops->producer_new(run->o, &run->shape);
    pthread_barrier_wait(&run->start);
    /* Producers start a fraction of an interval apart, so the offered load
     * is spread over each interval. */
    double next = now_s() + run->interval * a->index / run->o->producers;
    while (run->interval == 0 || wait_until(run, next) == 0) {
        if (atomic_load(&run->stop))
            break;
        run->ops->produce(p, atomic_fetch_add(&run->next_seq, batch), batch);
        atomic_fetch_add(&run->inserted, batch);
        next += run->interval;
        double now = now_s();
        if (next < now - run->interval)
            next = now - run->interval; /* at most one batch of debt */
    }
    run->ops->producer_free(p);
    return NULL;
}

static void *consumer_main(void *arg)
{
    struct client_arg *a = arg;
    struct load_run *run = a->run;
    void *c = run->ops->consumer_new(run->o);
    pthread_barrier_wait(&run->start);
    while (!atomic_load(&run->stop)) {
        long done = 0;
        double t0 = now_s();
        int got = run->ops->consume(c, &done);
        hist_add(&run->polls, (now_s() - t0) * 1000.0);
        atomic_fetch_add(&run->processed, done);
        if (!got)
            sleep_s(EMPTY_SLEEP_S);
    }
    long done = 0;
    run->ops->consumer_free(c, &done);
    atomic_fetch_add(&run->processed, done);
    return NULL;
}

/* ---- the held snapshot -------------------------------------------------- */

static PGconn *hold_xmin(const struct opts *o, PGconn *admin)
{
    PGconn *conn = bench_connect(o);
    bench_sql(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ");
    bench_sql(conn, "SELECT relname FROM pg_class LIMIT 1"); /* takes the snapshot */
    char sql[128];
    snprintf(
        sql, sizeof sql,
        "SELECT count(*) FROM pg_stat_activity WHERE pid = %d AND backend_xmin IS NOT NULL",
        PQbackendPID(conn));
    if (bench_scalar(admin, sql) != 1)
        die("held-xmin: the snapshot holds no xmin");
    return conn;
}

static void release_xmin(PGconn *conn)
{
    bench_sql(conn, "COMMIT");
    PQfinish(conn);
}

/* ---- the monitor ---------------------------------------------------------- */

/* The statistics of the target's table i: summed over the tables its
 * relnames[i] lists, or of tables[i] alone. */
static void table_stats(PGconn *admin, const struct load_ops *ops, int i,
                        struct table_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!ops->tables[i])
        return;
    const char *vals[1] = {ops->relnames[i] ? ops->relnames[i] : ops->tables[i]};
    PGresult *r =
        PQexecParams(admin,
                     "SELECT coalesce(sum(n_live_tup), 0), coalesce(sum(n_dead_tup), 0),"
                     " coalesce(sum(pg_total_relation_size(relid)), 0),"
                     " coalesce(sum(autovacuum_count), 0), coalesce(sum(autoanalyze_count), 0)"
                     " FROM pg_stat_user_tables WHERE schemaname = '" BENCH_SCHEMA "'"
                     " AND relname = ANY (string_to_array($1, ' '))",
                     1, NULL, vals, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        die("table statistics: %s", PQerrorMessage(admin));
    out->live = atol(PQgetvalue(r, 0, 0));
    out->dead = atol(PQgetvalue(r, 0, 1));
    out->bytes = atol(PQgetvalue(r, 0, 2));
    out->autovacuums = atol(PQgetvalue(r, 0, 3));
    out->autoanalyzes = atol(PQgetvalue(r, 0, 4));
    PQclear(r);
}

/* What the monitor remembers between its lines and phases. */
struct mark {
    double t;
    long inserted, processed;
    long hist[HIST_BUCKETS];
};

static void mark_now(struct load_run *run, struct mark *m)
{
    m->t = now_s();
    m->inserted = atomic_load(&run->inserted);
    m->processed = atomic_load(&run->processed);
    hist_snap(&run->polls, m->hist);
}

static void second_line(const struct load_run *run, const struct mark *a, const struct mark *b,
                        double since, double max_ms, const char *phase)
{
    struct latency l;
    hist_summary(b->hist, a->hist, max_ms, &l);
    double dt = b->t - a->t;
    fprintf(stderr,
            "  %-5s %-6s %4.0fs  inserted %7.0f/s  processed %7.0f/s  backlog %8ld  "
            "poll p50 %6.2f p99 %7.2f max %7.2f ms, %d polls\n",
            run->ops->name, phase, b->t - since, (b->inserted - a->inserted) / dt,
            (b->processed - a->processed) / dt, b->inserted - b->processed, l.p50, l.p99, l.max,
            l.n);
}

/* Samples the backlog every tick for `seconds` from `from`, with a line
 * a second; returns the polls' longest time (ms). */
static double watch(struct load_run *run, const struct mark *from, double seconds,
                    struct load_phase *ph, double run_t0)
{
    struct mark *sec = malloc(sizeof *sec), *now = malloc(sizeof *now);
    if (!sec || !now)
        die("out of memory");
    *sec = *from;
    double max_ms = 0;
    int per_second = (int)(1 / TICK_S + 0.5);
    for (int tick = 1; tick * TICK_S <= seconds + 1e-9; tick++) {
        sleep_s(from->t + tick * TICK_S - now_s());
        long backlog = atomic_load(&run->inserted) - atomic_load(&run->processed);
        if (backlog > ph->backlog_max)
            ph->backlog_max = backlog;
        if (tick % per_second)
            continue;
        mark_now(run, now);
        double m = hist_take_max(&run->polls);
        if (m > max_ms)
            max_ms = m;
        second_line(run, sec, now, run_t0, m, ph->name);
        *sec = *now;
    }
    free(sec);
    free(now);
    return max_ms;
}

/* One phase of `seconds`: its rates, backlog, poll times and, at its end,
 * the target's table statistics. */
static void run_phase(struct load_run *run, PGconn *admin, double seconds,
                      struct load_phase *ph, double run_t0)
{
    struct mark *start = malloc(sizeof *start), *end = malloc(sizeof *end);
    if (!start || !end)
        die("out of memory");
    hist_take_max(&run->polls);
    mark_now(run, start);
    double max_ms = watch(run, start, seconds, ph, run_t0);
    mark_now(run, end);
    double m = hist_take_max(&run->polls);
    ph->seconds = end->t - start->t;
    ph->inserted = end->inserted - start->inserted;
    ph->processed = end->processed - start->processed;
    ph->backlog_end = end->inserted - end->processed;
    hist_summary(end->hist, start->hist, m > max_ms ? m : max_ms, &ph->poll);
    for (int i = 0; i < 2; i++) {
        table_stats(admin, run->ops, i, &ph->stats[i]);
        ph->stats[i].autovacuums -= run->base[i].autovacuums;
        ph->stats[i].autoanalyzes -= run->base[i].autoanalyzes;
    }
    free(start);
    free(end);
}

/* ---- a run ---------------------------------------------------------------- */

static pthread_t *start_clients(struct load_run *run, struct client_arg **args_out)
{
    int np = run->o->producers, n = np + run->o->consumers;
    pthread_t *th = calloc((size_t)n, sizeof *th);
    struct client_arg *args = calloc((size_t)n, sizeof *args);
    if (!th || !args)
        die("out of memory");
    pthread_barrier_init(&run->start, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++) {
        args[i] = (struct client_arg){run, i < np ? i : i - np};
        if (pthread_create(&th[i], NULL, i < np ? producer_main : consumer_main, &args[i]))
            die("cannot start a thread");
    }
    pthread_barrier_wait(&run->start);
    *args_out = args;
    return th;
}

static void stop_clients(struct load_run *run, pthread_t *th, struct client_arg *args)
{
    atomic_store(&run->stop, 1);
    for (int i = 0; i < run->o->producers + run->o->consumers; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&run->start);
    free(th);
    free(args);
}

static void run_target(const struct opts *o, PGconn *admin, const struct load_ops *ops,
                       struct load_result *out)
{
    static const char *const held_names[3] = {"before", "during", "after"};
    struct load_run *run = calloc(1, sizeof *run);
    if (!run)
        die("out of memory");
    run->o = o;
    run->ops = ops;
    run->shape = (struct shape){o->channels, o->ordered, 0};
    run->interval = o->rate ? (double)o->batch * o->producers / o->rate : 0;
    memset(out, 0, sizeof *out);
    out->target = ops->name;
    out->tables[0] = ops->tables[0];
    out->tables[1] = ops->tables[1];
    out->nphases = o->held_xmin ? 3 : 1;
    double seconds = o->held_xmin ? o->held_xmin : o->duration;

    ops->reset(admin);
    /* A TRUNCATE zeroes the table's n_live_tup and n_dead_tup when its
     * backend flushes its statistics, which an idle backend may put off
     * until its next statement: the end of the first phase. Flush now. */
    bench_sql(admin, "SELECT pg_stat_force_next_flush()");
    for (int i = 0; i < 2; i++)
        table_stats(admin, ops, i, &run->base[i]);
    struct client_arg *args;
    pthread_t *th = start_clients(run, &args);
    double t0 = now_s();
    for (int i = 0; i < out->nphases; i++) {
        struct load_phase *ph = &out->ph[i];
        ph->name = o->held_xmin ? held_names[i] : "run";
        PGconn *held = o->held_xmin && i == 1 ? hold_xmin(o, admin) : NULL;
        run_phase(run, admin, seconds, ph, t0);
        if (held)
            release_xmin(held);
    }
    stop_clients(run, th, args);
    ops->reset(admin); /* the backlog goes */
    free(run);
}

void run_load(const struct opts *o, PGconn *admin)
{
    struct load_result r[2];
    int n = 0;
    run_target(o, admin, &queue_load_ops, &r[n++]);
    if (o->floor)
        run_target(o, admin, &floor_load_ops, &r[n++]);
    report_load(o, r, n);
}
