/*
 * rounds.h: --rounds: the median of each figure over the rounds.
 */
#ifndef PQMQ_BENCH_ROUNDS_H
#define PQMQ_BENCH_ROUNDS_H

#include "results.h"

#define BENCH_MAX_ROUNDS 9
/* The median of v[0..n-1] (n in 1..BENCH_MAX_ROUNDS); v is left as it is. */
double median_of(const double *v, int n);
/* Each figure of out: the median of that figure over in[0..n-1]. */
void rates_median(const struct rates *in, int n, struct rates *out);

#endif
