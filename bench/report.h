/*
 * report.h: text table, JSON, sweep CSV and plot.
 */
#ifndef PQMQ_BENCH_REPORT_H
#define PQMQ_BENCH_REPORT_H

#include "load_ops.h"
#include "options.h"
#include "results.h"
#include "targets.h"

/* 1234567.8 -> "1,234,568" in buf (32 bytes); "-" for 0 (not measured). */
const char *grouped(double v, char *buf);
void report_text(const struct opts *o, const struct results *r);
void report_json(const struct opts *o, const struct results *r);
/* --repeat: the targets over the runs, as ranges judged on medians. */
void report_repeat(const struct opts *o, const struct target_span *s, int n);
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
