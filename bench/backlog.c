/*
 * backlog.c: --backlog, the poll-cost scaling check. Measures poll+complete
 * cost per message over a 5,000-message backlog on 50 channels and over a
 * 300,000-message backlog on 20,000 channels, in one run, and prints the
 * ratio (the design target is below 2). One producer, one consumer.
 */
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

/* Inserts n messages round-robin over `channels` channels, in batches. */
static void fill(pqmq_client *c, int n, int batch, int channels, const char *prefix)
{
    pqmq_msg **msgs = calloc((size_t)batch, sizeof *msgs);
    if (!msgs)
        die("out of memory");
    for (int done = 0; done < n;) {
        int k = n - done < batch ? n - done : batch;
        for (int i = 0; i < k; i++) {
            char args[32], json[48];
            snprintf(args, sizeof args, "%s%d", prefix, (done + i) % channels);
            snprintf(json, sizeof json, "{\"seq\": %d}", done + i);
            msgs[i] = pqmq_msg_new();
            if (!msgs[i] || pqmq_msg_set_channel(msgs[i], BENCH_CHANNEL, args) ||
                pqmq_msg_set_name(msgs[i], "work") || pqmq_msg_set_json(msgs[i], json) ||
                pqmq_msg_set_backoff(msgs[i], 600000))
                die("out of memory");
        }
        if (pqmq_insert(c, msgs, (size_t)k))
            die("pqmq_insert: %s", pqmq_errmsg(c));
        for (int i = 0; i < k; i++)
            pqmq_msg_free(msgs[i]);
        done += k;
    }
    free(msgs);
}

/* Polls and completes up to `limit` messages; returns seconds, sets *got. */
static double drain(pqmq_client *c, int limit, int batch, int *got)
{
    *got = 0;
    double t0 = now_s();
    while (*got < limit) {
        pqmq_batch *b = NULL;
        int want = limit - *got < batch ? limit - *got : batch;
        if (pqmq_poll(c, NULL, 0, want, &b))
            die("pqmq_poll: %s", pqmq_errmsg(c));
        size_t n = pqmq_batch_count(b);
        if (n && pqmq_complete_batch(c, b))
            die("pqmq_complete_batch: %s", pqmq_errmsg(c));
        pqmq_batch_free(b);
        if (!n)
            break;
        *got += (int)n;
    }
    return now_s() - t0;
}

static void reset(PGconn *admin)
{
    queue_reset(admin);
    bench_sql(admin, "VACUUM ANALYZE mq_msgs");
}

/* Cost per message (µs) of poll+complete over `measure` messages drawn from
 * a backlog of `backlog` messages on `channels` channels. */
static double cost_us(pqmq_client *c, PGconn *admin, int backlog, int channels, int measure,
                      int batch)
{
    reset(admin);
    fill(c, backlog, 1000, channels, "k");
    bench_sql(admin, "ANALYZE mq_msgs");
    int got = 0;
    drain(c, 200, batch, &got); /* warm plans and caches */
    double t = drain(c, measure, batch, &got);
    return t * 1e6 / got;
}

void run_backlog(const struct opts *o, PGconn *admin)
{
    enum { ROUNDS = 3, MEASURE = 5000 };
    double small[ROUNDS], large[ROUNDS];
    pqmq_client *c = bench_client(o);
    /* Interleaved rounds, so machine noise hits both sides alike. */
    for (int r = 0; r < ROUNDS; r++) {
        small[r] = cost_us(c, admin, 5000 + 200, 50, MEASURE, o->batch);
        large[r] = cost_us(c, admin, 300000, 20000, MEASURE, o->batch);
        if (!o->json)
            printf("  round %d: %.1f us/message (5,000 on 50 channels), "
                   "%.1f us/message (300,000 on 20,000 channels)\n",
                   r + 1, small[r], large[r]);
    }
    double s = small[0], l = large[0];
    for (int r = 1; r < ROUNDS; r++) {
        s = small[r] < s ? small[r] : s;
        l = large[r] < l ? large[r] : l;
    }
    reset(admin);
    pqmq_client_free(c);
    if (o->json)
        printf("{\"small_us_per_msg\": %.2f, \"large_us_per_msg\": %.2f, \"ratio\": %.2f}\n", s,
               l, l / s);
    else
        printf("poll+complete cost, best of %d (batch %d): %.1f us vs %.1f us per message: "
               "ratio %.2f (target < 2)\n",
               ROUNDS, o->batch, s, l, l / s);
}
