/*
 * hist.c: a latency histogram that many threads add to without a lock and
 * that a monitor reads while they run. Memory is fixed whatever the run's
 * length (the load scenarios time every poll for minutes).
 *
 * Buckets are logarithmic in microseconds: below HIST_SUB one per
 * microsecond, above it HIST_SUB per power of two, so a percentile is
 * within about 3% of the true value.
 */
#include <string.h>

#include "hist.h"
#include "results.h"

static int bucket_of(long us)
{
    if (us < HIST_SUB)
        return us < 0 ? 0 : (int)us;
    int e = 63 - __builtin_clzl((unsigned long)us); /* us >= 2^e, e >= 5 */
    int b = HIST_SUB + (e - 5) * HIST_SUB + (int)((us >> (e - 5)) & (HIST_SUB - 1));
    return b < HIST_BUCKETS ? b : HIST_BUCKETS - 1;
}

/* The middle of bucket b, in milliseconds. */
static double bucket_ms(int b)
{
    if (b < HIST_SUB)
        return b / 1000.0;
    int e = (b - HIST_SUB) / HIST_SUB + 5, sub = (b - HIST_SUB) % HIST_SUB;
    double lo = (double)((long)(HIST_SUB + sub) << (e - 5)), width = (double)(1L << (e - 5));
    return (lo + width / 2) / 1000.0;
}

void hist_add(struct hist *h, double ms)
{
    long us = (long)(ms * 1000.0);
    atomic_fetch_add_explicit(&h->count[bucket_of(us)], 1, memory_order_relaxed);
    long max = atomic_load_explicit(&h->max_us, memory_order_relaxed);
    while (us > max && !atomic_compare_exchange_weak(&h->max_us, &max, us))
        ;
}

double hist_take_max(struct hist *h)
{
    return atomic_exchange(&h->max_us, 0) / 1000.0;
}

void hist_snap(struct hist *h, long *out)
{
    for (int i = 0; i < HIST_BUCKETS; i++)
        out[i] = atomic_load_explicit(&h->count[i], memory_order_relaxed);
}

/* Nearest rank over the bucket counts of now minus before. */
static double rank_ms(const long *now, const long *before, long rank)
{
    long seen = 0;
    for (int i = 0; i < HIST_BUCKETS; i++) {
        seen += now[i] - (before ? before[i] : 0);
        if (seen >= rank)
            return bucket_ms(i);
    }
    return bucket_ms(HIST_BUCKETS - 1);
}

void hist_summary(const long *now, const long *before, double max_ms, struct latency *out)
{
    memset(out, 0, sizeof *out);
    long n = 0;
    for (int i = 0; i < HIST_BUCKETS; i++)
        n += now[i] - (before ? before[i] : 0);
    if (n <= 0)
        return;
    out->n = n > 0x7fffffff ? 0x7fffffff : (int)n;
    out->p50 = rank_ms(now, before, (n * 50 + 99) / 100);
    out->p99 = rank_ms(now, before, (n * 99 + 99) / 100);
    out->max = max_ms;
    /* A bucket's middle can pass the exact maximum. */
    if (out->p50 > max_ms)
        out->p50 = max_ms;
    if (out->p99 > max_ms)
        out->p99 = max_ms;
}
