/*
 * report.h: text table, JSON, sweep CSV and plot.
 */
#ifndef PQMQ_BENCH_REPORT_H
#define PQMQ_BENCH_REPORT_H

#include "load_ops.h"
#include "options.h"
#include "results.h"

void report_text(const struct opts *o, const struct results *r);
void report_json(const struct opts *o, const struct results *r);
/* The load run's summary of n targets (text or JSON per --json). */
void report_load(const struct opts *o, const struct load_result *r, int n);

struct sweep_row {
    int value;
    int runner_threads;
    struct rates rates;
    double floor_insert, floor_drain, floor_drain_ctid;
};
void report_sweep(const struct opts *o, const char *param, const struct sweep_row *rows, int n,
                  long maxrss);

#endif
