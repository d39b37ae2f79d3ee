/*
 * load_ops.h: a queue under load (pqmq or the floor): the operations load.c drives
 * and what a load run measures.
 */
#ifndef PQMQ_BENCH_LOAD_OPS_H
#define PQMQ_BENCH_LOAD_OPS_H

#include <libpq-fe.h>

#include "options.h"
#include "results.h"

/* A table's statistics, or a group's summed over its tables (see load.c). */
struct table_stats {
    long live, dead, bytes;
    long autovacuums, autoanalyzes; /* since the run started */
};

struct load_phase {
    const char *name; /* "run", or "before", "during", "after" the held snapshot */
    double seconds;
    long inserted, processed; /* in the phase */
    long backlog_end, backlog_max;
    struct latency poll;         /* every poll call; n: how many */
    struct table_stats stats[2]; /* the target's tables at the phase's end */
};

struct load_result {
    const char *target;    /* "pqmq" or "floor" */
    const char *tables[2]; /* names of stats[0] and stats[1]; NULL: none */
    int nphases;
    struct load_phase ph[3];
};

/*
 * One queue under load, for load.c: pqmq (queue.c) or the floor (floor.c).
 * Each producer and consumer thread opens its own state. produce inserts
 * the k messages seq first.. in one batch; consume makes one poll call and
 * returns how many messages it claimed (0: none ready), adding to
 * *completed those whose completion it committed; consumer_free settles
 * what the consumer still holds, likewise.
 */
struct load_ops {
    const char *name;
    const char *tables[2]; /* a table, or the label of a group of tables */
    /* The tables whose statistics are summed under tables[i], separated by
     * spaces; NULL: tables[i] itself. */
    const char *relnames[2];
    void (*reset)(PGconn *admin);
    void *(*producer_new)(const struct opts *o, const struct shape *s);
    void (*produce)(void *p, long first, int k);
    void (*producer_free)(void *p);
    void *(*consumer_new)(const struct opts *o);
    int (*consume)(void *c, long *completed);
    void (*consumer_free)(void *c, long *completed);
};

#endif
