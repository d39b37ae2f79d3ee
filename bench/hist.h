/*
 * hist.h: a lock-free latency histogram of fixed size.
 */
#ifndef PQMQ_BENCH_HIST_H
#define PQMQ_BENCH_HIST_H

#include <stdatomic.h>

#include "results.h"

#define HIST_SUB 32
#define HIST_BUCKETS (HIST_SUB + 40 * HIST_SUB)

struct hist {
    atomic_long count[HIST_BUCKETS];
    atomic_long max_us; /* since the last hist_take_max */
};

/* h starts zeroed. Any thread may add; one monitor snaps and takes max. */
void hist_add(struct hist *h, double ms);
double hist_take_max(struct hist *h); /* ms; resets it to 0 */
void hist_snap(struct hist *h, long *out /* [HIST_BUCKETS] */);
/* p50/p99 of the samples in now minus before (before NULL: none), max as
 * given. */
void hist_summary(const long *now, const long *before, double max_ms, struct latency *out);

#endif
