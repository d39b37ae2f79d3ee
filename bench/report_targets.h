/*
 * report_targets.h: the targets beside their figures, as text or JSON.
 */
#ifndef PQMQ_BENCH_REPORT_TARGETS_H
#define PQMQ_BENCH_REPORT_TARGETS_H

#include "targets.h"

/* A table: figure, value, reference, ratio, target, ok or MISSED; over
 * several runs each as a range and judged on the median, in a column of
 * its own. Prints nothing for n == 0. */
void targets_text(const struct target_span *s, int n);
/* A JSON member "targets": [...] followed by ", " unless last. */
void targets_json(const struct target_span *s, int n, int last);

#endif
