/*
 * --rounds: the rate phases run N times, interleaved (main, priorities,
 * chains, then again), and each figure is the median of its rounds. On a
 * shared machine a single phase of a second or two can land in another
 * tenant's burst; a ratio of two such phases then says more about the
 * burst than about the queue. The median of interleaved rounds lets one
 * burst move neither side.
 */
#include <stdlib.h>
#include <string.h>

#include "results.h"
#include "rounds.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double median_of(const double *v, int n)
{
    double s[BENCH_MAX_ROUNDS];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/* The median of one field over the rounds. */
#define MEDIAN_FIELD(in, n, out, field)                                                        \
    do {                                                                                       \
        double v_[BENCH_MAX_ROUNDS] = {0};                                                     \
        for (int i_ = 0; i_ < (n); i_++)                                                       \
            v_[i_] = (in)[i_].field;                                                           \
        (out)->field = median_of(v_, (n));                                                     \
    } while (0)

void rates_median(const struct rates *in, int n, struct rates *out)
{
    MEDIAN_FIELD(in, n, out, enqueue);
    MEDIAN_FIELD(in, n, out, runner);
    MEDIAN_FIELD(in, n, out, poll);
    MEDIAN_FIELD(in, n, out, enqueue_pipelined);
    MEDIAN_FIELD(in, n, out, locked);
    MEDIAN_FIELD(in, n, out, runner_locked);
    MEDIAN_FIELD(in, n, out, poll_cost.wal_bytes);
    MEDIAN_FIELD(in, n, out, poll_cost.wal_records);
    MEDIAN_FIELD(in, n, out, poll_cost.updates);
    MEDIAN_FIELD(in, n, out, poll_cost.hot);
}
