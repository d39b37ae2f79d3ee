/*
 * targets.h: the targets a run is judged against, each beside its figure.
 */
#ifndef PQMQ_BENCH_TARGETS_H
#define PQMQ_BENCH_TARGETS_H

#include "load_ops.h"
#include "options.h"
#include "results.h"

/* 1.0's targets (2-core machine, server on the same box): each a bound on
 * the ratio to the reference named beside it, or on the value itself. */
#define TARGET_ENQUEUE 0.75         /* enqueue / floor insert */
#define TARGET_PROCESS 0.55         /* runner processing / floor drain */
#define TARGET_POLL 0.6             /* processing with the poll API / floor drain */
#define TARGET_LOCKED 0.65          /* processing on the locked lane / floor drain */
#define TARGET_ORDERED 0.8          /* ordered processing / unordered, in every lane */
#define TARGET_ORDERED_ENQUEUE 0.85 /* ordered enqueue / unordered */
#define TARGET_ORDERED_PHYSICAL 1.5 /* ordered WAL per message / unordered, at most */
#define TARGET_ONCE 0.5             /* exactly-once processing / floor drain */
#define WAL_REFERENCE_BYTES 262.0   /* the WAL target's reference, bytes a message */
#define TARGET_WAL 0.8              /* WAL bytes / WAL_REFERENCE_BYTES, at most */
#define TARGET_IDLE_P50_MS 1.5      /* idle runner latency, insert to handler start */
#define TARGET_IDLE_P99_MS 5.0
/* Under load (--rate, --steady, --held-xmin). */
#define TARGET_KEPT_UP_S 1.0       /* backlog at the end, in seconds of offered load, below */
#define TARGET_POLL_P99_MS 20      /* steady load: poll call p99, at most */
#define TARGET_HOLD_BACKLOG_S 10.0 /* backlog at the hold's end, s of offered load, below */
#define TARGET_HOLD_RATIO 0.5      /* saturated: processed during the hold / before, at least */

enum target_op { AT_LEAST, AT_MOST, BELOW };

/* One target: a figure's value, its reference (0: none, and the target is
 * on the value itself) and the bound on their ratio. */
struct target {
    char figure[64];
    const char *unit; /* of value and reference: "msg/s", "B", "ms", "s", "" */
    double value, reference, limit;
    enum target_op op;
};

/* A target over one or more runs: the ranges of its value, reference and
 * ratio, judged on the median of the runs' ratios (values, without a
 * reference). */
struct target_span {
    struct target t; /* the first run's, for figure, unit, limit and op */
    int runs;
    double value_lo, value_hi, ref_lo, ref_hi, ratio_lo, ratio_hi;
    double judged;
};

#define TARGETS_MAX 16

/* The ratio to the reference, or the value when there is none. */
double target_measure(const struct target *t);
int target_met(enum target_op op, double x, double limit);
/* The targets a default run measured (a figure of 0 has none); returns
 * how many, at most TARGETS_MAX. */
int targets_of_results(const struct opts *o, const struct results *r, struct target *out);
/* The targets of pqmq under load: kept up, poll p99 (--steady), the held
 * snapshot's backlog or rate; returns how many. */
int targets_of_load(const struct opts *o, const struct load_result *r, struct target *out);
/* Spans of n targets over runs: runs[i][k] is target k of run i (each run
 * has the same n in the same order). */
void targets_span(const struct target (*runs)[TARGETS_MAX], int nruns, int n,
                  struct target_span *out);

#endif
