/*
 * backlog.c: --backlog, the poll-cost scaling check. Measures poll+complete
 * cost per message over a 5,000-message backlog on 50 channels and over a
 * 300,000-message backlog on 20,000 channels, in one run, and prints the
 * ratio (the design target is below 2). With --priorities N (10 unless 0),
 * also 100,000 messages on 50 channels of one priority against the same
 * over N priorities (message i of priority i % N; target below 2 too).
 * One producer, one consumer.
 */
#include <stdio.h>
#include <stdlib.h>

#include "backlog.h"
#include "options.h"
#include "queue.h"
#include "util.h"

/* Inserts n messages round-robin over `channels` channels, in batches,
 * message i of priority i % levels (levels 0: all 0). */
static void fill(pqmq_client *c, int n, int batch, int channels, const char *prefix, int levels)
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
                pqmq_msg_set_backoff(msgs[i], 600000) ||
                (levels > 0 && pqmq_msg_set_priority(msgs[i], (done + i) % levels)))
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
    bench_sql(admin, "VACUUM ANALYZE mq_rows, mq_log, mq_cursors, mq_receipts");
}

/* Cost per message (µs) of poll+complete over `measure` messages drawn from
 * a backlog of `backlog` messages on `channels` channels, of `levels`
 * priorities (see fill). */
static double cost_us(pqmq_client *c, PGconn *admin, int backlog, int channels, int measure,
                      int batch, int levels)
{
    reset(admin);
    fill(c, backlog, 1000, channels, "k", levels);
    bench_sql(admin, "ANALYZE mq_rows, mq_log, mq_cursors, mq_receipts");
    int got = 0;
    drain(c, 200, batch, &got); /* warm plans and caches */
    double t = drain(c, measure, batch, &got);
    return t * 1e6 / got;
}

static double best(const double *v, int n)
{
    double b = v[0];
    for (int i = 1; i < n; i++)
        b = v[i] < b ? v[i] : b;
    return b;
}

void run_backlog(const struct opts *o, PGconn *admin)
{
    enum { ROUNDS = 3, MEASURE = 5000, QUEUED = 100000 };
    double small[ROUNDS], large[ROUNDS], one[ROUNDS], many[ROUNDS];
    int levels = o->priorities;
    pqmq_client *c = bench_client(o);
    /* Interleaved rounds, so machine noise hits both sides alike. */
    for (int r = 0; r < ROUNDS; r++) {
        small[r] = cost_us(c, admin, 5000 + 200, 50, MEASURE, o->batch, 0);
        large[r] = cost_us(c, admin, 300000, 20000, MEASURE, o->batch, 0);
        if (!o->json)
            printf("  round %d: %.1f us/message (5,000 on 50 channels), "
                   "%.1f us/message (300,000 on 20,000 channels)\n",
                   r + 1, small[r], large[r]);
        if (levels <= 0)
            continue;
        one[r] = cost_us(c, admin, QUEUED, 50, MEASURE, o->batch, 0);
        many[r] = cost_us(c, admin, QUEUED, 50, MEASURE, o->batch, levels);
        if (!o->json)
            printf("           %.1f us/message (100,000 on 50 channels, one priority), "
                   "%.1f us/message (over %d priorities)\n",
                   one[r], many[r], levels);
    }
    double s = best(small, ROUNDS), l = best(large, ROUNDS);
    double p1 = levels > 0 ? best(one, ROUNDS) : 0, pn = levels > 0 ? best(many, ROUNDS) : 0;
    reset(admin);
    pqmq_client_free(c);
    if (o->json) {
        printf("{\"small_us_per_msg\": %.2f, \"large_us_per_msg\": %.2f, \"ratio\": %.2f", s, l,
               l / s);
        if (levels > 0)
            printf(", \"one_priority_us_per_msg\": %.2f, \"priorities_us_per_msg\": %.2f, "
                   "\"priorities\": %d, \"priorities_ratio\": %.2f",
                   p1, pn, levels, pn / p1);
        printf("}\n");
        return;
    }
    printf("poll+complete cost, best of %d (batch %d): %.1f us vs %.1f us per message: "
           "ratio %.2f (target < 2)\n",
           ROUNDS, o->batch, s, l, l / s);
    if (levels > 0)
        printf("100,000 queued over %d priorities against one: %.1f us vs %.1f us per "
               "message: ratio %.2f (target < 2)\n",
               levels, pn, p1, pn / p1);
}
