/*
 * pqmq-bench: measures the queue on a real PostgreSQL.
 *
 *   pqmq-bench [--dsn CONNINFO] [--messages N] [--batch N] [--channels N]
 *              [--backlog] [--json]
 *
 * Default run: inserts N messages in batches over the given channels, then
 * drains them with pqmq_poll + pqmq_complete, and prints both rates.
 * --backlog: the poll-cost scaling check. Measures poll+complete cost per
 * message over a 5,000-message backlog on 50 channels and over a
 * 300,000-message backlog on 20,000 channels, in one run, and prints the
 * ratio (the design target is below 2).
 * Everything runs in schema pqmq_bench, emptied first.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pqmq.h>

struct opts {
    const char *dsn;
    int messages, batch, channels, backlog, json;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(pqmq_client *c, const char *what)
{
    fprintf(stderr, "pqmq-bench: %s: %s\n", what, c ? pqmq_errmsg(c) : "failed");
    exit(1);
}

static PGconn *connect_bench(const char *dsn)
{
    const char *keys[] = {"dbname", "options", NULL};
    const char *vals[] = {dsn ? dsn : "", "-c search_path=pqmq_bench -c client_min_messages=warning",
                          NULL};
    PGconn *conn = PQconnectdbParams(keys, vals, 1);
    if (PQstatus(conn) != CONNECTION_OK) {
        fprintf(stderr, "pqmq-bench: cannot connect: %s", PQerrorMessage(conn));
        exit(1);
    }
    return conn;
}

static void sql(PGconn *conn, const char *text)
{
    PGresult *r = PQexec(conn, text);
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
        fprintf(stderr, "pqmq-bench: %s: %s", text, PQerrorMessage(conn));
        exit(1);
    }
    PQclear(r);
}

/* Inserts n messages round-robin over `channels` channels, in batches. */
static double enqueue(pqmq_client *c, int n, int batch, int channels, const char *prefix)
{
    pqmq_msg **msgs = calloc((size_t)batch, sizeof *msgs);
    double t0 = now_s();
    for (int done = 0; done < n;) {
        int k = n - done < batch ? n - done : batch;
        for (int i = 0; i < k; i++) {
            char args[32], json[48];
            snprintf(args, sizeof args, "%s%d", prefix, (done + i) % channels);
            snprintf(json, sizeof json, "{\"seq\": %d}", done + i);
            msgs[i] = pqmq_msg_new();
            pqmq_msg_set_channel(msgs[i], "bench", args);
            pqmq_msg_set_name(msgs[i], "work");
            pqmq_msg_set_json(msgs[i], json);
            pqmq_msg_set_backoff(msgs[i], 600000); /* no redelivery mid-run */
        }
        if (pqmq_insert(c, msgs, (size_t)k))
            die(c, "insert");
        for (int i = 0; i < k; i++)
            pqmq_msg_free(msgs[i]);
        done += k;
    }
    free(msgs);
    return now_s() - t0;
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
            die(c, "poll");
        size_t n = pqmq_batch_count(b);
        if (n && pqmq_complete_batch(c, b))
            die(c, "complete");
        pqmq_batch_free(b);
        if (!n)
            break;
        *got += (int)n;
    }
    return now_s() - t0;
}

static void reset(PGconn *conn)
{
    sql(conn, "TRUNCATE mq_msgs, mq_payloads, mq_chains");
    sql(conn, "VACUUM ANALYZE mq_msgs");
    sql(conn, "VACUUM ANALYZE mq_payloads");
}

static void run_default(pqmq_client *c, PGconn *admin, const struct opts *o)
{
    reset(admin);
    double t_in = enqueue(c, o->messages, o->batch, o->channels, "c");
    int got = 0;
    double t_out = drain(c, o->messages, o->batch, &got);
    if (got != o->messages) {
        fprintf(stderr, "pqmq-bench: drained %d of %d messages\n", got, o->messages);
        exit(1);
    }
    double in_rate = o->messages / t_in, out_rate = got / t_out;
    if (o->json)
        printf("{\"messages\": %d, \"batch\": %d, \"channels\": %d, "
               "\"enqueue_per_s\": %.0f, \"drain_per_s\": %.0f}\n",
               o->messages, o->batch, o->channels, in_rate, out_rate);
    else
        printf("messages %d, batch %d, channels %d, 1 producer, 1 consumer\n"
               "  enqueue: %10.0f messages/s\n"
               "  drain:   %10.0f messages/s (poll + complete)\n",
               o->messages, o->batch, o->channels, in_rate, out_rate);
}

/* Cost per message (µs) of poll+complete over `measure` messages drawn from
 * a backlog of `backlog` messages on `channels` channels. */
static double cost_us(pqmq_client *c, PGconn *admin, int backlog, int channels,
                      int measure, int batch)
{
    reset(admin);
    enqueue(c, backlog, 1000, channels, "k");
    sql(admin, "ANALYZE mq_msgs");
    int got = 0;
    drain(c, 200, batch, &got); /* warm plans and caches */
    double t = drain(c, measure, batch, &got);
    return t * 1e6 / got;
}

static void run_backlog(pqmq_client *c, PGconn *admin, const struct opts *o)
{
    enum { ROUNDS = 3, MEASURE = 5000 };
    double small[ROUNDS], large[ROUNDS];
    /* Interleaved rounds, so machine noise hits both sides alike. */
    for (int r = 0; r < ROUNDS; r++) {
        small[r] = cost_us(c, admin, 5000 + 200, 50, MEASURE, o->batch);
        large[r] = cost_us(c, admin, 300000, 20000, MEASURE, o->batch);
        if (!o->json)
            printf("  round %d: %.1f us/message (5,000 on 50 channels), "
                   "%.1f us/message (300,000 on 20,000 channels)\n", r + 1, small[r], large[r]);
    }
    double s = small[0], l = large[0];
    for (int r = 1; r < ROUNDS; r++) {
        s = small[r] < s ? small[r] : s;
        l = large[r] < l ? large[r] : l;
    }
    reset(admin);
    if (o->json)
        printf("{\"small_us_per_msg\": %.2f, \"large_us_per_msg\": %.2f, \"ratio\": %.2f}\n",
               s, l, l / s);
    else
        printf("poll+complete cost, best of %d (batch %d): %.1f us vs %.1f us per message: "
               "ratio %.2f (target < 2)\n", ROUNDS, o->batch, s, l, l / s);
}

int main(int argc, char **argv)
{
    struct opts o = {getenv("PQMQ_BENCH_DSN"), 20000, 100, 100, 0, 0};
    static const struct option longs[] = {
        {"dsn", required_argument, 0, 'd'},      {"messages", required_argument, 0, 'm'},
        {"batch", required_argument, 0, 'b'},    {"channels", required_argument, 0, 'c'},
        {"backlog", no_argument, 0, 'B'},        {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (ch) {
        case 'd': o.dsn = optarg; break;
        case 'm': o.messages = atoi(optarg); break;
        case 'b': o.batch = atoi(optarg); break;
        case 'c': o.channels = atoi(optarg); break;
        case 'B': o.backlog = 1; break;
        case 'j': o.json = 1; break;
        default:
            fprintf(stderr, "usage: %s [--dsn CONNINFO] [--messages N] [--batch N] "
                            "[--channels N] [--backlog] [--json]\n", argv[0]);
            return ch == 'h' ? 0 : 2;
        }
    }
    if (o.messages < 1 || o.batch < 1 || o.batch > PQMQ_MAX_BATCH || o.channels < 1) {
        fprintf(stderr, "pqmq-bench: --messages, --channels >= 1; --batch 1..%d\n",
                PQMQ_MAX_BATCH);
        return 2;
    }
    PGconn *admin = connect_bench(o.dsn);
    sql(admin, "CREATE SCHEMA IF NOT EXISTS pqmq_bench");
    pqmq_client *c = NULL;
    if (pqmq_wrap(connect_bench(o.dsn), &c))
        die(c, "wrap");
    if (pqmq_migrate(c))
        die(c, "migrate");
    if (o.backlog)
        run_backlog(c, admin, &o);
    else
        run_default(c, admin, &o);
    PGconn *own = pqmq_conn(c);
    pqmq_client_free(c);
    PQfinish(own);
    PQfinish(admin);
    return 0;
}
