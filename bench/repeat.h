/*
 * repeat.h: --repeat N: the whole default run N times, its targets as ranges.
 */
#ifndef PQMQ_BENCH_REPEAT_H
#define PQMQ_BENCH_REPEAT_H

#include <libpq-fe.h>

#include "options.h"
#include "results.h"

/* One whole run: fills r (bench.c's default run). */
typedef void measure_fn(const struct opts *o, PGconn *admin, struct results *r);

/* Runs measure o->repeat times; without --json prints each run's report;
 * then the targets, each figure as the range of the runs, judged on the
 * median. */
void run_repeat(const struct opts *o, PGconn *admin, measure_fn *measure);

#endif
