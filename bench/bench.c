/*
 * pqmq-bench: measures the queue on a real PostgreSQL, against the cheapest
 * SQL that does the same work (the "floor"), in one run.
 *
 *   pqmq-bench [--dsn CONNINFO] [--messages N] [--producers N] [--consumers N]
 *              [--batch N] [--channels N] [--ordered FRACTION]
 *              [--payload-bytes N] [--floor] [--json]
 *              [--sweep consumers=1,2,4,8 | --sweep batch=10,100,1000]
 *              [--backlog] [--profile]   (--help lists every option)
 *   pqmq-bench [--rate N [--duration S]] [--held-xmin S] [--floor] ...
 *   pqmq-bench --steady [--duration S] [--held-xmin S] [--floor] ...
 *   pqmq-bench --floor --repeat N ...
 *
 * The default run, in order (every phase starts its clock once all its
 * clients are connected):
 *   1. enqueue: --producers threads, each with its own client, insert
 *      --messages messages in batches of --batch (pqmq_insert), spread over
 *      --channels channels (chains, for the --ordered fraction);
 *   2. processing with the runner: --consumers pqmq_runners, each with
 *      --runner-threads workers (default: 8, fewer if the server lacks free
 *      connections) and a handler that does nothing;
 *   3. with --floor: the floor's insert and drain of the same messages with
 *      the same clients and batch size, twice: drained with
 *      DELETE ... WHERE id = ANY (ARRAY(SELECT ... SKIP LOCKED)), and by ctid (see
 *      floor.c); the ratios
 *      are against the first, the second is printed beside them;
 *   4. enqueue again, then processing with the polling API: --consumers
 *      threads, each pqmq_complete_and_poll(last batch, --batch) in a loop;
 *   4b. with --floor: exactly-once processing, pqmq's and the floor's: each
 *      batch's result rows commit with its completion (see once.c);
 *   4c. with --priorities N (10 unless 0): steps 1-4 again, message i with
 *      priority i % N, reported against the main rates;
 *   5. the same (enqueue, runner, poll API) with every message on one of
 *      --chains ordered chains;
 *   6. latency: single messages every --latency-gap-ms ms into an idle
 *      runner, insert to handler start, unordered and on one ordered chain,
 *      each also split at pqmq_insert's return (the producer's insert and
 *      commit; the runner's notification, claim and handoff).
 * The enqueue rate covers both enqueue runs of steps 1 and 4 (the floor's
 * insert rate its two runs). With --rounds N, steps 1-5 run N times in
 * turn (main, priorities, chains, main, ...) and each figure, the floor's
 * too, is the median of its N values (rounds.c); 4b runs once, after them.
 *
 * --profile prints, per phase, the server's time in each SQL function and
 * this process's CPU time (see profile.c).
 * --sweep NAME=V1,V2,... repeats steps 1-4 for each value of consumers,
 * producers, batch or runner-threads (with --rounds N, every value in each
 * of N rounds, each figure the median of its rounds), writes
 * bench-sweep.csv and (with gnuplot) a plot, bench-sweep.png. --backlog runs the poll-cost
 * scaling check instead. --rate and --held-xmin run the queue under steady load instead (see
 * load.c), and with --floor the floor after it; --steady first measures the burn-down rate and
 * offers half of it (steady.c). --repeat N runs steps 1-6 N times and judges each target on
 * its median (repeat.c). Each report ends with the targets beside their figures (targets.c).
 *
 * Peak memory (maxrss) must stay flat in --messages: nothing here or in the
 * library may buffer more than a batch per client.
 * Everything runs in schema pqmq_bench, dropped and created anew first.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backlog.h"
#include "floor.h"
#include "load.h"
#include "once.h"
#include "options.h"
#include "physical.h"
#include "profile.h"
#include "queue.h"
#include "repeat.h"
#include "report.h"
#include "results.h"
#include "rounds.h"
#include "steady.h"
#include "util.h"

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [options]\n"
            "  --dsn CONNINFO        the server (default: libpq's environment)\n"
            "  --listen-dsn CONNINFO runners LISTEN there (behind PgBouncer in\n"
            "                        transaction mode: straight to the server)\n"
            "  --messages N          messages per phase (20000; --steady: 300000)\n"
            "  --producers N         producer threads, one client each (2)\n"
            "  --consumers N         runners / poll-API consumer threads (2)\n"
            "  --batch N             insert and poll batch size (100)\n"
            "  --channels N          channels = chains of the main scenario (100)\n"
            "  --ordered FRACTION    share of messages on ordered chains, 0..1 (0)\n"
            "  --chains N            chains of the all-ordered phase (1000)\n"
            "  --priorities N        the priorities phase: the main shape, message i of\n"
            "                        priority i %% N; its rates beside the main ones;\n"
            "                        and --backlog's priorities case (10; 0: neither)\n"
            "  --payload-bytes N     JSON payload size, about (32)\n"
            "  --runner-threads N    worker threads per runner (default: 8,\n"
            "                        fewer if the server lacks free connections)\n"
            "  --latency-samples N   single messages timed per latency figure (200)\n"
            "  --latency-gap-ms N    pause between them (5)\n"
            "  --floor               also measure the SQL floor and print ratios\n"
            "  --rounds N            run the rate phases (steps 1-5, or each value\n"
            "                        of --sweep) N times, interleaved, and print\n"
            "                        each figure's median\n"
            "                        (1; at most 9): one burst of a noisy machine\n"
            "                        then moves no figure or ratio\n"
            "  --exactly-once        only the exactly-once phases of --floor (poll API,\n"
            "                        locked lane, runners, their floor), and their ratios\n"
            "  --json                print one JSON object with every figure\n"
            "  --sweep NAME=V,V,...  NAME: consumers, producers, batch or\n"
            "                        runner-threads; writes\n"
            "                        bench-sweep.csv and bench-sweep.png\n"
            "  --sweep-out PREFIX    file names of the sweep (bench-sweep)\n"
            "  --backlog             poll cost over a 5,000 vs a 300,000 backlog\n"
            "  --profile             per phase, print SQL function times (server) and\n"
            "                        this process's CPU time (client) to stderr;\n"
            "                        needs a superuser (track_functions)\n"
            "  --split-complete      poll API consumers complete with their own\n"
            "                        statement (pqmq_poll + pqmq_complete_batch)\n"
            "                        instead of pqmq_complete_and_poll\n"
            "  --rate N              steady load instead of the phases: producers offer\n"
            "                        N messages/s in all, poll-API consumers keep up or\n"
            "                        not; a line a second on stderr (with --floor, the\n"
            "                        floor runs the same load after pqmq)\n"
            "  --duration S          seconds of a --rate run (60; --steady: 300)\n"
            "  --steady              measure the burn-down rate of --messages queued\n"
            "                        messages (poll API), then offer half of it for\n"
            "                        --duration s: kept up, poll p99 against targets\n"
            "  --held-xmin S         load (--rate, or saturated without it) for S seconds\n"
            "                        before, during and after a held REPEATABLE READ\n"
            "                        snapshot: rates, poll times, dead rows, sizes\n"
            "  --repeat N            the whole default run N times (1..9): each run's\n"
            "                        report, then each target's figure as the range\n"
            "                        of the runs, judged on their median\n",
            argv0);
}

static int int_arg(const char *name, const char *s, int lo, int hi)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "pqmq-bench: --%s must be an integer in %d..%d\n", name, lo, hi);
        exit(2);
    }
    return (int)v;
}

static void analyze_queue(PGconn *admin)
{
    bench_sql(admin, "ANALYZE mq_rows, mq_log, mq_cursors, mq_receipts");
}

static void expect_empty(PGconn *admin, const char *after)
{
    long left = bench_scalar(admin, "SELECT count(*) FROM mq_msgs");
    if (left)
        die("%s left %ld messages in the queue", after, left);
}

/* Steps 1-4 of the header comment for one shape; the floor too if asked
 * (floor_out non-NULL: insert, drain, drain by ctid). */
static void run_rates(const struct opts *o, PGconn *admin, const struct shape *s, int threads,
                      const char *tag, struct rates *out, double *floor_out)
{
    char label[96];
    queue_reset(admin);
    snprintf(label, sizeof label, "%s: enqueue", tag);
    profile_begin(o, admin);
    double t_in = queue_enqueue(o, s, label);
    profile_end(o, admin, label, o->messages);
    analyze_queue(admin);
    snprintf(label, sizeof label, "%s: runner", tag);
    profile_begin(o, admin);
    out->runner = o->messages / queue_drain_runner(o, threads, label);
    profile_end(o, admin, label, o->messages);
    expect_empty(admin, label);

    queue_reset(admin);
    snprintf(label, sizeof label, "%s: enqueue", tag);
    queue_enqueue(o, s, label);
    analyze_queue(admin);
    snprintf(label, sizeof label, "%s: runner, locked lane", tag);
    profile_begin(o, admin);
    out->runner_locked = o->messages / queue_drain_runner_with(o, threads, label, 1, 0);
    profile_end(o, admin, label, o->messages);
    expect_empty(admin, label);

    if (floor_out) {
        /* Twice, like the enqueue: drained by id (the floor), then by
         * ctid. */
        double t_fl = 0;
        for (int by_ctid = 0; by_ctid < 2; by_ctid++) {
            profile_begin(o, admin);
            t_fl += floor_insert(o, admin);
            profile_end(o, admin, "floor: insert", o->messages);
            bench_sql(admin, "ANALYZE floor_msgs");
            profile_begin(o, admin);
            floor_out[1 + by_ctid] = o->messages / floor_drain(o, admin, by_ctid);
            profile_end(o, admin, by_ctid ? "floor: drain (ctid)" : "floor: drain",
                        o->messages);
        }
        floor_out[0] = 2.0 * o->messages / t_fl;
        /* Many batches a call, each its own transaction (not timed as
         * part of the enqueue above). */
        profile_begin(o, admin);
        floor_out[3] = o->messages / floor_insert_pipelined(o, admin);
        profile_end(o, admin, "floor: insert, pipelined", o->messages);
        bench_sql(admin, "TRUNCATE floor_msgs");
        queue_reset(admin);
        snprintf(label, sizeof label, "%s: enqueue, pipelined", tag);
        profile_begin(o, admin);
        out->enqueue_pipelined = o->messages / queue_enqueue_pipelined(o, s, label);
        profile_end(o, admin, label, o->messages);
    }

    queue_reset(admin);
    snprintf(label, sizeof label, "%s: enqueue", tag);
    profile_begin(o, admin);
    t_in += queue_enqueue(o, s, label);
    profile_end(o, admin, label, o->messages);
    analyze_queue(admin);
    snprintf(label, sizeof label, "%s: poll API", tag);
    struct phys_snap ps;
    physical_begin(admin, &ps);
    profile_begin(o, admin);
    out->poll = o->messages / queue_drain_poll(o, label);
    profile_end(o, admin, label, o->messages);
    physical_end(admin, &ps, o->messages, &out->poll_cost);
    expect_empty(admin, label);
    out->enqueue = 2.0 * o->messages / t_in;

    /* The locked lane drains the same enqueue again (not timed as one). */
    queue_reset(admin);
    snprintf(label, sizeof label, "%s: enqueue", tag);
    queue_enqueue(o, s, label);
    analyze_queue(admin);
    snprintf(label, sizeof label, "%s: locked lane", tag);
    profile_begin(o, admin);
    out->locked = o->messages / queue_drain_locked(o, label);
    profile_end(o, admin, label, o->messages);
    expect_empty(admin, label);
}

static int threads_for(const struct opts *o, PGconn *admin)
{
    return o->runner_threads ? o->runner_threads
                             : derive_runner_threads(admin, o->consumers, o->batch);
}

/* A phase's tag: the shape's, and with --rounds which round it is. */
static void round_tag(const struct opts *o, int i, const char *shape, char *tag, size_t size)
{
    if (o->rounds > 1)
        snprintf(tag, size, "%s (round %d of %d)", shape, i + 1, o->rounds);
    else
        snprintf(tag, size, "%s", shape);
}

/* Steps 1-5: the rates of every shape, --rounds times interleaved, each
 * figure the median of its rounds (rounds.c). */
static void run_rounds(const struct opts *o, PGconn *admin, struct results *r)
{
    /* Zeroed: a figure a run does not measure (the pipelined enqueue
     * without --floor) reads as 0, "not measured", never as stack garbage. */
    struct rates mains[BENCH_MAX_ROUNDS] = {0}, prios[BENCH_MAX_ROUNDS] = {0},
                 ordered[BENCH_MAX_ROUNDS] = {0};
    double fl[4][BENCH_MAX_ROUNDS] = {{0}};
    struct shape main_shape = {o->channels, o->ordered, 0};
    struct shape prio = {o->channels, o->ordered, o->priorities};
    struct shape chains = {o->chains, 1.0, 0};
    char shape[64], tag[96];
    for (int i = 0; i < o->rounds; i++) {
        double f[4] = {0, 0, 0, 0};
        round_tag(o, i, "main", tag, sizeof tag);
        run_rates(o, admin, &main_shape, r->runner_threads, tag, &mains[i],
                  o->floor ? f : NULL);
        for (int k = 0; k < 4; k++)
            fl[k][i] = f[k];
        if (o->priorities > 0) {
            snprintf(shape, sizeof shape, "%d priorities", o->priorities);
            round_tag(o, i, shape, tag, sizeof tag);
            run_rates(o, admin, &prio, r->runner_threads, tag, &prios[i], NULL);
        }
        snprintf(shape, sizeof shape, "%d ordered chains", o->chains);
        round_tag(o, i, shape, tag, sizeof tag);
        run_rates(o, admin, &chains, r->runner_threads, tag, &ordered[i], NULL);
    }
    rates_median(mains, o->rounds, &r->main);
    if (o->priorities > 0)
        rates_median(prios, o->rounds, &r->prio);
    rates_median(ordered, o->rounds, &r->ordered);
    r->floor_insert = median_of(fl[0], o->rounds);
    r->floor_drain = median_of(fl[1], o->rounds);
    r->floor_drain_ctid = median_of(fl[2], o->rounds);
    r->floor_insert_pipelined = median_of(fl[3], o->rounds);
}

/* Steps 1-6: every figure of a default run. */
static void measure_default(const struct opts *o, PGconn *admin, struct results *r)
{
    memset(r, 0, sizeof *r);
    r->runner_threads = threads_for(o, admin);
    run_rounds(o, admin, r);
    if (o->floor)
        run_once(o, admin, r->runner_threads, r);

    queue_reset(admin);
    profile_begin(o, admin);
    queue_latency(o, 0, &r->idle);
    profile_end(o, admin, "latency, idle runner", o->latency_samples);
    queue_reset(admin);
    profile_begin(o, admin);
    queue_latency(o, 1, &r->idle_ordered);
    profile_end(o, admin, "latency, one ordered chain", o->latency_samples);
    queue_reset(admin);
    r->maxrss_kb = maxrss_kb();
}

static void run_default(const struct opts *o, PGconn *admin)
{
    struct results r;
    measure_default(o, admin, &r);
    if (o->json)
        report_json(o, &r);
    else
        report_text(o, &r);
}

/* --exactly-once: run_once alone, for comparing the runners' exactly-once
 * rows quickly; the ratios are to the poll API's and the floor's
 * exactly-once rates of the same run. */
static void run_once_only(const struct opts *o, PGconn *admin)
{
    struct results r;
    memset(&r, 0, sizeof r);
    r.runner_threads = threads_for(o, admin);
    run_once(o, admin, r.runner_threads, &r);
    printf("{\"process_exactly_once_per_s\": %.0f, \"process_exactly_once_runner_per_s\": %.0f,"
           " \"ratio_exactly_once_runner_to_poll\": %.3f,"
           " \"ratio_exactly_once_runner_locked_to_poll\": %.3f,"
           " \"ratio_exactly_once_to_its_floor\": %.3f}\n",
           r.once, r.once_runner, r.once > 0 ? r.once_runner / r.once : 0,
           r.once > 0 ? r.once_runner_locked / r.once : 0,
           r.floor_once > 0 ? r.once / r.floor_once : 0);
}

/* The rates of each value of a sweep, --rounds times interleaved (every
 * value in each round), each figure the median of its rounds. run is the
 * options with *field set to each value in turn. */
static void sweep_rounds(const struct opts *o, struct opts *run, int *field, const char *param,
                         PGconn *admin, struct sweep_row *rows, int n)
{
    struct sweep_runs {
        struct rates rates[BENCH_MAX_ROUNDS];
        double floor[3][BENCH_MAX_ROUNDS];
    } *runs = calloc((size_t)n, sizeof *runs);
    if (!runs)
        die("out of memory");
    for (int i = 0; i < o->rounds; i++)
        for (int j = 0; j < n; j++) {
            char shape[64], tag[96];
            *field = rows[j].value;
            snprintf(shape, sizeof shape, "%s = %d", param, rows[j].value);
            round_tag(o, i, shape, tag, sizeof tag);
            if (!o->json)
                fprintf(stderr, "sweep: %s\n", tag);
            struct shape s = {run->channels, run->ordered, 0};
            double fl[4] = {0, 0, 0, 0};
            run_rates(run, admin, &s, rows[j].runner_threads, tag, &runs[j].rates[i],
                      o->floor ? fl : NULL);
            for (int k = 0; k < 3; k++)
                runs[j].floor[k][i] = fl[k];
        }
    for (int j = 0; j < n; j++) {
        rates_median(runs[j].rates, o->rounds, &rows[j].rates);
        rows[j].floor_insert = median_of(runs[j].floor[0], o->rounds);
        rows[j].floor_drain = median_of(runs[j].floor[1], o->rounds);
        rows[j].floor_drain_ctid = median_of(runs[j].floor[2], o->rounds);
    }
    free(runs);
}

static void run_sweep(const struct opts *o, PGconn *admin)
{
    char param[32];
    const char *eq = strchr(o->sweep, '=');
    size_t plen = eq ? (size_t)(eq - o->sweep) : 0;
    if (!eq || plen >= sizeof param) {
        fprintf(stderr, "pqmq-bench: --sweep wants NAME=V1,V2,... (e.g. consumers=1,2,4,8)\n");
        exit(2);
    }
    memcpy(param, o->sweep, plen);
    param[plen] = '\0';
    int *field, lo = 1, hi = 256;
    struct opts run = *o;
    if (!strcmp(param, "consumers"))
        field = &run.consumers;
    else if (!strcmp(param, "producers"))
        field = &run.producers;
    else if (!strcmp(param, "batch"))
        field = &run.batch, hi = PQMQ_MAX_BATCH;
    else if (!strcmp(param, "runner-threads"))
        field = &run.runner_threads;
    else {
        fprintf(stderr, "pqmq-bench: --sweep: NAME is consumers, producers, batch or "
                        "runner-threads\n");
        exit(2);
    }

    char *values = strdup(eq + 1);
    if (!values)
        die("out of memory");
    int n = 0, cap = 0;
    struct sweep_row *rows = NULL;
    for (char *save = NULL, *v = strtok_r(values, ",", &save); v;
         v = strtok_r(NULL, ",", &save)) {
        *field = int_arg("sweep", v, lo, hi);
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            rows = realloc(rows, (size_t)cap * sizeof *rows);
            if (!rows)
                die("out of memory");
        }
        struct sweep_row *w = &rows[n++];
        memset(w, 0, sizeof *w);
        w->value = *field;
        w->runner_threads = threads_for(&run, admin);
    }
    free(values);
    if (n == 0) {
        fprintf(stderr, "pqmq-bench: --sweep %s: no values\n", o->sweep);
        exit(2);
    }
    sweep_rounds(o, &run, field, param, admin, rows, n);
    queue_reset(admin);
    report_sweep(o, param, rows, n, maxrss_kb());
    free(rows);
}

/* --steady sets the rate itself; --repeat repeats the default run only. */
static int check_modes(const struct opts *o)
{
    if (o->steady && o->rate) {
        fprintf(stderr, "pqmq-bench: --steady offers half its burn-down rate: no --rate\n");
        return 0;
    }
    if (o->repeat > 1 &&
        (o->steady || o->rate || o->held_xmin || o->sweep || o->backlog || o->once_only)) {
        fprintf(stderr, "pqmq-bench: --repeat repeats the default run: no --steady, --rate,\n"
                        "  --held-xmin, --sweep, --backlog or --exactly-once\n");
        return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    struct opts o = {
        .dsn = getenv("PQMQ_BENCH_DSN"),
        .messages = 0, /* 20,000; --steady: 300,000 */
        .producers = 2,
        .consumers = 2,
        .batch = 100,
        .channels = 100,
        .chains = 1000,
        .priorities = 10,
        .ordered = 0,
        .payload_bytes = 32,
        .latency_samples = 200,
        .latency_gap_ms = 5,
        .sweep_out = "bench-sweep",
        .rounds = 1,
        .repeat = 1,
    };
    enum {
        O_DSN = 256,
        O_MESSAGES,
        O_PRODUCERS,
        O_CONSUMERS,
        O_BATCH,
        O_CHANNELS,
        O_CHAINS,
        O_PRIORITIES,
        O_ORDERED,
        O_PAYLOAD,
        O_THREADS,
        O_SAMPLES,
        O_GAP,
        O_FLOOR,
        O_ONCE,
        O_JSON,
        O_SWEEP,
        O_SWEEP_OUT,
        O_BACKLOG,
        O_PROFILE,
        O_SPLIT,
        O_LISTEN,
        O_RATE,
        O_DURATION,
        O_HELD,
        O_ROUNDS,
        O_STEADY,
        O_REPEAT,
        O_HELP
    };
    static const struct option longs[] = {{"dsn", required_argument, 0, O_DSN},
                                          {"listen-dsn", required_argument, 0, O_LISTEN},
                                          {"messages", required_argument, 0, O_MESSAGES},
                                          {"producers", required_argument, 0, O_PRODUCERS},
                                          {"consumers", required_argument, 0, O_CONSUMERS},
                                          {"batch", required_argument, 0, O_BATCH},
                                          {"channels", required_argument, 0, O_CHANNELS},
                                          {"chains", required_argument, 0, O_CHAINS},
                                          {"priorities", required_argument, 0, O_PRIORITIES},
                                          {"ordered", required_argument, 0, O_ORDERED},
                                          {"payload-bytes", required_argument, 0, O_PAYLOAD},
                                          {"runner-threads", required_argument, 0, O_THREADS},
                                          {"latency-samples", required_argument, 0, O_SAMPLES},
                                          {"latency-gap-ms", required_argument, 0, O_GAP},
                                          {"floor", no_argument, 0, O_FLOOR},
                                          {"exactly-once", no_argument, 0, O_ONCE},
                                          {"json", no_argument, 0, O_JSON},
                                          {"sweep", required_argument, 0, O_SWEEP},
                                          {"sweep-out", required_argument, 0, O_SWEEP_OUT},
                                          {"backlog", no_argument, 0, O_BACKLOG},
                                          {"profile", no_argument, 0, O_PROFILE},
                                          {"split-complete", no_argument, 0, O_SPLIT},
                                          {"rate", required_argument, 0, O_RATE},
                                          {"duration", required_argument, 0, O_DURATION},
                                          {"held-xmin", required_argument, 0, O_HELD},
                                          {"rounds", required_argument, 0, O_ROUNDS},
                                          {"steady", no_argument, 0, O_STEADY},
                                          {"repeat", required_argument, 0, O_REPEAT},
                                          {"help", no_argument, 0, O_HELP},
                                          {0, 0, 0, 0}};
    int ch;
    char *end;
    while ((ch = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (ch) {
        case O_DSN: o.dsn = optarg; break;
        case O_LISTEN: o.listen_dsn = optarg; break;
        case O_MESSAGES: o.messages = int_arg("messages", optarg, 1, 1000000000); break;
        case O_PRODUCERS: o.producers = int_arg("producers", optarg, 1, 256); break;
        case O_CONSUMERS: o.consumers = int_arg("consumers", optarg, 1, 256); break;
        case O_BATCH: o.batch = int_arg("batch", optarg, 1, PQMQ_MAX_BATCH); break;
        case O_CHANNELS: o.channels = int_arg("channels", optarg, 1, 100000000); break;
        case O_CHAINS: o.chains = int_arg("chains", optarg, 1, 100000000); break;
        case O_PRIORITIES:
            o.priorities = int_arg("priorities", optarg, 0, PQMQ_MAX_PRIORITY + 1);
            break;
        case O_ORDERED:
            o.ordered = strtod(optarg, &end);
            if (*optarg == '\0' || *end != '\0' || !(o.ordered >= 0 && o.ordered <= 1)) {
                fprintf(stderr, "pqmq-bench: --ordered must be a fraction in 0..1\n");
                return 2;
            }
            break;
        case O_PAYLOAD: o.payload_bytes = int_arg("payload-bytes", optarg, 0, 1 << 24); break;
        case O_THREADS: o.runner_threads = int_arg("runner-threads", optarg, 1, 256); break;
        case O_SAMPLES:
            o.latency_samples = int_arg("latency-samples", optarg, 1, 100000);
            break;
        case O_GAP: o.latency_gap_ms = int_arg("latency-gap-ms", optarg, 0, 10000); break;
        case O_FLOOR: o.floor = 1; break;
        case O_ONCE: o.once_only = o.floor = 1; break;
        case O_JSON: o.json = 1; break;
        case O_SWEEP: o.sweep = optarg; break;
        case O_SWEEP_OUT: o.sweep_out = optarg; break;
        case O_BACKLOG: o.backlog = 1; break;
        case O_PROFILE: o.profile = 1; break;
        case O_SPLIT: o.split_complete = 1; break;
        case O_RATE: o.rate = int_arg("rate", optarg, 1, 100000000); break;
        case O_DURATION: o.duration = int_arg("duration", optarg, 1, 86400); break;
        case O_HELD: o.held_xmin = int_arg("held-xmin", optarg, 1, 86400); break;
        case O_ROUNDS: o.rounds = int_arg("rounds", optarg, 1, BENCH_MAX_ROUNDS); break;
        case O_STEADY: o.steady = 1; break;
        case O_REPEAT: o.repeat = int_arg("repeat", optarg, 1, BENCH_MAX_ROUNDS); break;
        case O_HELP: usage(stdout, argv[0]); return 0;
        default: usage(stderr, argv[0]); return 2;
        }
    }
    if (optind < argc) {
        usage(stderr, argv[0]);
        return 2;
    }
    if (!check_modes(&o))
        return 2;
    if (!o.duration)
        o.duration = o.steady ? 300 : 60;
    if (!o.messages)
        o.messages = o.steady ? STEADY_BURN_MESSAGES : 20000;

    o.conninfo = bench_conninfo(o.dsn, o.profile);
    PGconn *admin = bench_connect(&o);
    queue_setup(admin, &o);
    if (o.floor)
        floor_setup(admin);
    if (o.backlog) {
        run_backlog(&o, admin);
    } else if (o.steady) {
        run_steady(&o, admin);
    } else if (o.rate || o.held_xmin) {
        run_load(&o, admin);
    } else {
        if (o.floor)
            once_setup(admin);
        if (o.once_only)
            run_once_only(&o, admin);
        else if (o.sweep)
            run_sweep(&o, admin);
        else if (o.repeat > 1)
            run_repeat(&o, admin, measure_default);
        else
            run_default(&o, admin);
    }
    PQfinish(admin);
    free(o.conninfo);
    return 0;
}
