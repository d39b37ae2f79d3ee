/*
 * results.h: what a run measures: rates, latencies, physical cost per message.
 */
#ifndef PQMQ_BENCH_RESULTS_H
#define PQMQ_BENCH_RESULTS_H

struct latency {
    int n;                /* samples; 0: not measured */
    double p50, p99, max; /* milliseconds */
    /* The same messages' time split at the producer's return from
     * pqmq_insert (its insert and commit), the rest being the runner's
     * (notification, claim and its commit, handoff): p50 and p99 of each
     * part, 0 when not measured (the percentiles of the parts need not add
     * up to the whole's). */
    double insert_p50, insert_p99, runner_p50, runner_p99;
};

/* Physical cost per processed message (physical.c): WAL bytes and records,
 * updates of the queue's tables and the share of them that were HOT. */
struct physical {
    double wal_bytes, wal_records, updates, hot;
};

struct phys_snap {
    double wal_bytes, wal_records, updates, hot_updates;
};

/* One scenario's rates in messages/s (0: not measured). */
struct rates {
    double enqueue, runner, poll;
    struct physical poll_cost;    /* of the poll API's drain */
    double enqueue_pipelined;     /* pqmq_insert_batches, BENCH_PIPELINE at a time */
    double locked, runner_locked; /* the locked lane: poll API, runner */
};

struct results {
    int runner_threads;
    struct rates main, ordered; /* ordered: every message on --chains chains */
    struct rates prio;          /* the main shape with --priorities priorities */
    double floor_insert, floor_drain, floor_drain_ctid;
    double floor_insert_pipelined;
    double once, floor_once;                /* exactly-once processing: pqmq, the floor's */
    double once_locked;                     /* exactly-once processing with the locked lane */
    double once_runner, once_runner_locked; /* the same with runners */
    struct latency idle, idle_ordered;
    long maxrss_kb;
};

#endif
