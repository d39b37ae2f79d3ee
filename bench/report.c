/*
 * report.c: what pqmq-bench prints. A small aligned table (figure, value,
 * floor, ratio, target) and the targets beside their figures
 * (report_targets.c), or with --json exactly one JSON object; for
 * --sweep a CSV file and, when gnuplot is installed, a PNG plot of it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "floor.h"
#include "load_ops.h"
#include "options.h"
#include "report.h"
#include "report_targets.h"
#include "results.h"
#include "targets.h"
#include "util.h"

/* 1234567.8 -> "1,234,568"; "-" for 0 (not measured). */
const char *grouped(double v, char *buf)
{
    if (v <= 0)
        return "-";
    char digits[32];
    snprintf(digits, sizeof digits, "%.0f", v);
    size_t n = strlen(digits), w = 0;
    for (size_t i = 0; i < n; i++) {
        if (i && (n - i) % 3 == 0)
            buf[w++] = ',';
        buf[w++] = digits[i];
    }
    buf[w] = '\0';
    return buf;
}

static double ratio(double a, double b)
{
    return a > 0 && b > 0 ? a / b : 0;
}

/* One row of rates: value, reference, their ratio and the target; only the
 * value without a reference (with_ref 0). A figure not measured (0) has no
 * row. */
static void rate_row(const char *figure, double v, double ref, double target, int with_ref)
{
    char a[32], b[32], r[16] = "-", t[24] = "";
    if (v <= 0)
        return;
    if (!with_ref) {
        printf("%-42s %12s\n", figure, grouped(v, a));
        return;
    }
    double q = ratio(v, ref);
    if (q > 0)
        snprintf(r, sizeof r, "%.2f", q);
    if (target > 0 && q > 0)
        snprintf(t, sizeof t, ">= %.2f  %s", target, q >= target ? "ok" : "MISSED");
    printf("%-42s %12s %12s %7s  %s\n", figure, grouped(v, a), grouped(ref, b), r, t);
}

/* The physical cost of a processed message (poll API drain), unordered and
 * on ordered chains. */
static void physical_row(const char *figure, const struct physical *p)
{
    printf("%-42s %8.0f B %6.2f rec %5.2f upd %4.0f%% HOT\n", figure, p->wal_bytes,
           p->wal_records, p->updates, 100 * p->hot);
}

static void physical_rows(const struct opts *o, const struct results *r)
{
    if (r->main.poll_cost.wal_records <= 0)
        return;
    printf("\nper processed message (poll API: WAL bytes, records, updates of the queue "
           "tables):\n");
    physical_row("  main scenario", &r->main.poll_cost);
    if (r->ordered.poll_cost.wal_records > 0) {
        char f[64];
        snprintf(f, sizeof f, "  %d ordered chains", o->chains);
        physical_row(f, &r->ordered.poll_cost);
        double q = ratio(r->ordered.poll_cost.wal_bytes, r->main.poll_cost.wal_bytes);
        printf("%-42s %8.2f x       <= %.2f  %s\n", "  ordered WAL bytes / main", q,
               TARGET_ORDERED_PHYSICAL, q <= TARGET_ORDERED_PHYSICAL ? "ok" : "MISSED");
    }
    printf("\n");
}

/* The latencies, measured, not judged: the README's figures are of other
 * settings (its Performance table says which). */
static void latency_rows(const struct results *r)
{
    if (!r->idle.n && !r->idle_ordered.n)
        return;
    printf("\n%-42s %12s %12s %7s\n", "latency (ms)", "p50", "p99", "max");
    const struct latency *l[2] = {&r->idle, &r->idle_ordered};
    const char *what[2] = {"  idle runner", "  one ordered chain"};
    for (int i = 0; i < 2; i++) {
        if (!l[i]->n)
            continue;
        printf("%-42s %12.2f %12.2f %7.2f\n", what[i], l[i]->p50, l[i]->p99, l[i]->max);
        /* Where the time went: the producer's pqmq_insert (insert and
         * commit), then the runner (notification, claim and commit,
         * handoff). */
        printf("%-42s %12.2f %12.2f\n", "    insert+commit", l[i]->insert_p50,
               l[i]->insert_p99);
        printf("%-42s %12.2f %12.2f\n", "    runner", l[i]->runner_p50, l[i]->runner_p99);
    }
}

/* A run's targets beside their figures, as spans of one run; returns how
 * many. */
static int run_targets(const struct opts *o, const struct results *r, struct target_span *s)
{
    struct target t[1][TARGETS_MAX];
    int n = targets_of_results(o, r, t[0]);
    targets_span(t, 1, n, s);
    return n;
}

void report_text(const struct opts *o, const struct results *r)
{
    char m[32];
    printf("pqmq-bench: %s messages, batch %d, %d producer%s, %d consumer%s "
           "(runners of %d threads), %d channels, %.0f%% ordered, ~%d-byte JSON payloads\n\n",
           grouped(o->messages, m), o->batch, o->producers, o->producers == 1 ? "" : "s",
           o->consumers, o->consumers == 1 ? "" : "s", r->runner_threads, o->channels,
           o->ordered * 100, o->payload_bytes);
    if (o->rounds > 1)
        printf("rates: the median of %d interleaved rounds; a ratio is of two medians\n\n",
               o->rounds);
    /* The floor, ratio and target columns only when --floor measured the
     * floor; a row only for a figure this run measured. */
    int f = o->floor;
    if (f)
        printf("%-42s %12s %12s %7s  %s\n", "figure", "messages/s", "floor", "ratio", "target");
    else
        printf("%-42s %12s\n", "figure", "messages/s");
    rate_row("enqueue", r->main.enqueue, r->floor_insert, TARGET_ENQUEUE, f);
    rate_row("enqueue, 10 batches a call (pipelined)", r->main.enqueue_pipelined,
             r->floor_insert_pipelined, 0, f);
    rate_row("processing, runner", r->main.runner, r->floor_drain, TARGET_PROCESS, f);
    rate_row("processing, runner, locked lane", r->main.runner_locked, r->floor_drain,
             TARGET_PROCESS, f);
    rate_row("processing, poll API", r->main.poll, r->floor_drain, TARGET_POLL, f);
    rate_row("processing, locked lane", r->main.locked, r->floor_drain, TARGET_LOCKED, f);
    if (r->floor_drain_ctid > 0) {
        rate_row("processing, runner, vs ctid floor", r->main.runner, r->floor_drain_ctid, 0,
                 f);
        rate_row("processing, poll API, vs ctid floor", r->main.poll, r->floor_drain_ctid, 0,
                 f);
        rate_row("processing, locked lane, vs ctid floor", r->main.locked, r->floor_drain_ctid,
                 0, f);
    }
    if (r->once > 0) {
        rate_row("exactly-once, poll API", r->once, r->floor_drain, TARGET_ONCE, f);
        rate_row("exactly-once, locked lane", r->once_locked, r->floor_drain, TARGET_ONCE, f);
        rate_row("exactly-once, runner", r->once_runner, r->floor_drain, TARGET_ONCE, f);
        rate_row("exactly-once, runner, locked lane", r->once_runner_locked, r->floor_drain,
                 TARGET_ONCE, f);
        rate_row("exactly-once, runner, vs poll API", r->once_runner, r->once, 0, f);
        rate_row("exactly-once, vs exactly-once floor", r->once, r->floor_once, 0, f);
        rate_row("exactly-once, locked, vs its floor", r->once_locked, r->floor_once, 0, f);
    }
    /* Variants of the main scenario: their reference column is its rate. */
    if (r->prio.runner > 0 || r->ordered.runner > 0)
        printf("\n%-42s %12s %12s %7s  %s\n", "vs the main scenario", "messages/s", "main",
               "ratio", "target");
    if (r->prio.runner > 0) {
        char g[64];
        snprintf(g, sizeof g, "%d priorities: enqueue", o->priorities);
        rate_row(g, r->prio.enqueue, r->main.enqueue, 0, 1);
        snprintf(g, sizeof g, "%d priorities: runner", o->priorities);
        rate_row(g, r->prio.runner, r->main.runner, 0, 1);
        snprintf(g, sizeof g, "%d priorities: poll API", o->priorities);
        rate_row(g, r->prio.poll, r->main.poll, 0, 1);
        snprintf(g, sizeof g, "%d priorities: locked lane", o->priorities);
        rate_row(g, r->prio.locked, r->main.locked, 0, 1);
    }
    if (r->ordered.runner > 0) {
        char g[64];
        snprintf(g, sizeof g, "%d ordered chains: enqueue", o->chains);
        rate_row(g, r->ordered.enqueue, r->main.enqueue, TARGET_ORDERED_ENQUEUE, 1);
        snprintf(g, sizeof g, "%d ordered chains: runner", o->chains);
        rate_row(g, r->ordered.runner, r->main.runner, TARGET_ORDERED, 1);
        snprintf(g, sizeof g, "%d ordered chains: poll API", o->chains);
        rate_row(g, r->ordered.poll, r->main.poll, TARGET_ORDERED, 1);
        snprintf(g, sizeof g, "%d ordered chains: locked lane", o->chains);
        rate_row(g, r->ordered.locked, r->main.locked, TARGET_ORDERED, 1);
        snprintf(g, sizeof g, "%d ordered chains: runner, locked lane", o->chains);
        rate_row(g, r->ordered.runner_locked, r->main.runner_locked, TARGET_ORDERED, 1);
    }
    physical_rows(o, r);
    latency_rows(r);
    printf("%-42s %12ld\n", "peak memory, maxrss (kB)", r->maxrss_kb);
    struct target_span ts[TARGETS_MAX];
    targets_text(ts, run_targets(o, r, ts));
    if (r->floor_drain_ctid > 0)
        printf(
            "\nfloor: the cheapest SQL that moves the same messages with the same clients:"
            "\n  a plain INSERT of each batch into one table indexed by id, and\n"
            "  DELETE ... WHERE id = ANY (ARRAY(SELECT id ... LIMIT batch\n"
            "    FOR UPDATE SKIP LOCKED))"
            "\n  in batches (no lease, no retry, no order, no fairness).\n"
            "pipelined: each producer sends 10 batches per round trip (pqmq_insert_batches;\n"
            "  the floor likewise), each batch its own transaction.\n"
            "ctid floor: the same DELETE matched by ctid (a TID scan at any table size):"
            "\n  faster still, the limit of a delete-based queue.\n");
    if (r->once > 0)
        printf("exactly-once: per batch, one row per message into a results table and the\n"
               "  completion, committed together (BEGIN, INSERT, pqmq_complete_and_poll,\n"
               "  COMMIT; the locked lane: pqmq_poll_locked (BEGIN and the poll), INSERT,\n"
               "  pqmq_complete_commit (completion and COMMIT); runner: commit batches and\n"
               "  a group handler, one INSERT for a worker's jobs (2 workers a runner);\n"
               "  runner, locked lane: a row per job in its savepoint); its floor: BEGIN,\n"
               "  the floor's DELETE, the same INSERT, COMMIT.\n");
    if (r->ordered.runner > 0 || r->prio.runner > 0) {
        /* Only the rows that were measured are explained. */
        printf("%svs the main scenario:", r->floor_drain_ctid > 0 ? "" : "\n");
        if (r->prio.runner > 0)
            printf(" priorities rows: the main scenario with message i of priority i %% %d;\n ",
                   o->priorities);
        if (r->ordered.runner > 0)
            printf(" ordered rows: every message on an ordered chain;");
        printf(" the main column holds\n  the main scenario's rate and the ratio is against "
               "it.\n");
    }
    if (!o->floor)
        printf("\nRun with --floor for the SQL floor and the ratios.\n");
}

/* A number, or null when it was not measured. */
static void jnum(const char *key, double v, const char *fmt, int last)
{
    printf("\"%s\": ", key);
    if (v > 0)
        printf(fmt, v);
    else
        printf("null");
    printf("%s", last ? "" : ", ");
}

static void jlatency(const char *key, const struct latency *l, int last)
{
    printf("\"%s\": ", key);
    if (l->n)
        printf("{\"p50\": %.3f, \"p99\": %.3f, \"max\": %.3f, \"samples\": %d, "
               "\"insert_p50\": %.3f, \"insert_p99\": %.3f, \"runner_p50\": %.3f, "
               "\"runner_p99\": %.3f}",
               l->p50, l->p99, l->max, l->n, l->insert_p50, l->insert_p99, l->runner_p50,
               l->runner_p99);
    else
        printf("null");
    printf("%s", last ? "" : ", ");
}

static void jparams(const struct opts *o, int runner_threads)
{
    printf("\"parameters\": {\"messages\": %d, \"producers\": %d, \"consumers\": %d, "
           "\"batch\": %d, \"channels\": %d, \"ordered\": %g, \"payload_bytes\": %d, "
           "\"runner_threads\": %d, \"chains\": %d, \"latency_samples\": %d, "
           "\"latency_gap_ms\": %d, \"floor\": %s, \"rounds\": %d, \"repeat\": %d, "
           "\"steady\": %s}, ",
           o->messages, o->producers, o->consumers, o->batch, o->channels, o->ordered,
           o->payload_bytes, runner_threads, o->chains, o->latency_samples, o->latency_gap_ms,
           o->floor ? "true" : "false", o->rounds, o->repeat, o->steady ? "true" : "false");
}

/* A scenario's rates, the floor's and the ratios, as JSON members. */
static void jrates(const struct rates *x, double floor_insert, double floor_drain)
{
    jnum("enqueue_per_s", x->enqueue, "%.0f", 0);
    jnum("process_runner_per_s", x->runner, "%.0f", 0);
    jnum("process_poll_per_s", x->poll, "%.0f", 0);
    jnum("process_locked_per_s", x->locked, "%.0f", 0);
    jnum("process_runner_locked_per_s", x->runner_locked, "%.0f", 0);
    jnum("floor_insert_per_s", floor_insert, "%.0f", 0);
    jnum("enqueue_pipelined_per_s", x->enqueue_pipelined, "%.0f", 0);
    jnum("floor_drain_per_s", floor_drain, "%.0f", 0);
    jnum("ratio_enqueue", ratio(x->enqueue, floor_insert), "%.3f", 0);
    jnum("ratio_process_runner", ratio(x->runner, floor_drain), "%.3f", 0);
    jnum("ratio_process_poll", ratio(x->poll, floor_drain), "%.3f", 0);
    jnum("ratio_process_locked", ratio(x->locked, floor_drain), "%.3f", 0);
    jnum("ratio_process_runner_locked", ratio(x->runner_locked, floor_drain), "%.3f", 0);
}

void report_json(const struct opts *o, const struct results *r)
{
    printf("{");
    jparams(o, r->runner_threads);
    jrates(&r->main, r->floor_insert, r->floor_drain);
    jnum("floor_drain_ctid_per_s", r->floor_drain_ctid, "%.0f", 0);
    jnum("floor_insert_pipelined_per_s", r->floor_insert_pipelined, "%.0f", 0);
    jnum("ratio_enqueue_pipelined", ratio(r->main.enqueue_pipelined, r->floor_insert_pipelined),
         "%.3f", 0);
    jnum("ratio_process_runner_ctid", ratio(r->main.runner, r->floor_drain_ctid), "%.3f", 0);
    jnum("ratio_process_poll_ctid", ratio(r->main.poll, r->floor_drain_ctid), "%.3f", 0);
    jnum("process_exactly_once_per_s", r->once, "%.0f", 0);
    jnum("floor_exactly_once_per_s", r->floor_once, "%.0f", 0);
    jnum("ratio_exactly_once", ratio(r->once, r->floor_drain), "%.3f", 0);
    jnum("ratio_exactly_once_to_its_floor", ratio(r->once, r->floor_once), "%.3f", 0);
    jnum("process_exactly_once_locked_per_s", r->once_locked, "%.0f", 0);
    jnum("ratio_exactly_once_locked", ratio(r->once_locked, r->floor_drain), "%.3f", 0);
    jnum("process_exactly_once_runner_per_s", r->once_runner, "%.0f", 0);
    jnum("ratio_exactly_once_runner", ratio(r->once_runner, r->floor_drain), "%.3f", 0);
    jnum("ratio_exactly_once_runner_to_poll", ratio(r->once_runner, r->once), "%.3f", 0);
    jnum("process_exactly_once_runner_locked_per_s", r->once_runner_locked, "%.0f", 0);
    jnum("ratio_exactly_once_runner_locked", ratio(r->once_runner_locked, r->floor_drain),
         "%.3f", 0);
    printf("\"priorities\": ");
    if (r->prio.runner > 0) {
        printf("{\"levels\": %d, ", o->priorities);
        jnum("enqueue_per_s", r->prio.enqueue, "%.0f", 0);
        jnum("process_runner_per_s", r->prio.runner, "%.0f", 0);
        jnum("process_poll_per_s", r->prio.poll, "%.0f", 0);
        jnum("process_locked_per_s", r->prio.locked, "%.0f", 0);
        jnum("ratio_enqueue_to_main", ratio(r->prio.enqueue, r->main.enqueue), "%.3f", 0);
        jnum("ratio_runner_to_main", ratio(r->prio.runner, r->main.runner), "%.3f", 0);
        jnum("ratio_poll_to_main", ratio(r->prio.poll, r->main.poll), "%.3f", 1);
        printf("}, ");
    } else {
        printf("null, ");
    }
    printf("\"ordered\": ");
    if (r->ordered.runner > 0) {
        printf("{\"chains\": %d, ", o->chains);
        jnum("enqueue_per_s", r->ordered.enqueue, "%.0f", 0);
        jnum("process_runner_per_s", r->ordered.runner, "%.0f", 0);
        jnum("process_poll_per_s", r->ordered.poll, "%.0f", 0);
        jnum("process_locked_per_s", r->ordered.locked, "%.0f", 0);
        jnum("ratio_runner_to_main", ratio(r->ordered.runner, r->main.runner), "%.3f", 0);
        jnum("ratio_poll_to_main", ratio(r->ordered.poll, r->main.poll), "%.3f", 0);
        jnum("wal_bytes_per_msg", r->ordered.poll_cost.wal_bytes, "%.1f", 0);
        jnum("wal_records_per_msg", r->ordered.poll_cost.wal_records, "%.2f", 0);
        jnum("hot_fraction", r->ordered.poll_cost.hot, "%.3f", 1);
        printf("}, ");
    } else {
        printf("null, ");
    }
    printf("\"main_physical\": {");
    jnum("wal_bytes_per_msg", r->main.poll_cost.wal_bytes, "%.1f", 0);
    jnum("wal_records_per_msg", r->main.poll_cost.wal_records, "%.2f", 0);
    jnum("hot_fraction", r->main.poll_cost.hot, "%.3f", 1);
    printf("}, ");
    printf("\"latency_ms\": {");
    jlatency("idle", &r->idle, 0);
    jlatency("ordered", &r->idle_ordered, 1);
    printf("}, ");
    struct target_span ts[TARGETS_MAX];
    targets_json(ts, run_targets(o, r, ts), 0);
    printf("\"maxrss_kb\": %ld}\n", r->maxrss_kb);
}

/* ---- --repeat ---------------------------------------------------------- */

void report_repeat(const struct opts *o, const struct target_span *s, int n)
{
    if (o->json) {
        printf("{");
        jparams(o, 0);
        targets_json(s, n, 0);
        printf("\"maxrss_kb\": %ld}\n", maxrss_kb());
        return;
    }
    printf("pqmq-bench --repeat %d: each figure the range (min-max) of %d whole runs; each\n"
           "target judged on the median of the runs' ratios (of their values, for a row\n"
           "without a reference), which the median column shows\n",
           o->repeat, o->repeat);
    targets_text(s, n);
}

/* ---- --sweep ----------------------------------------------------------- */

static int have_gnuplot(void)
{
    return system("command -v gnuplot >/dev/null 2>&1") == 0;
}

static void plot(const char *csv, const char *png, const char *param, int with_floor)
{
    if (!have_gnuplot()) {
        fprintf(stderr,
                "pqmq-bench: gnuplot is not installed, so no %s "
                "(Debian: apt-get install gnuplot-nox); the figures are in %s\n",
                png, csv);
        return;
    }
    FILE *gp = popen("gnuplot", "w");
    if (!gp) {
        fprintf(stderr, "pqmq-bench: cannot run gnuplot; the figures are in %s\n", csv);
        return;
    }
    fprintf(gp,
            "set datafile separator ','\n"
            "set terminal pngcairo size 900,%d font ',10'\n"
            "set output '%s'\n"
            "set key outside right top\n"
            "set grid\n"
            "set logscale x 2\n"
            "set xlabel '%s'\n",
            with_floor ? 900 : 520, png, param);
    if (with_floor)
        fprintf(gp, "set multiplot layout 2,1\n");
    fprintf(gp,
            "set title 'pqmq-bench: rates by %s'\n"
            "set ylabel 'messages/s'\n"
            "set yrange [0:*]\n"
            "plot '%s' using 1:3 skip 1 with linespoints title 'enqueue', \\\n"
            "     '' using 1:4 skip 1 with linespoints title 'runner', \\\n"
            "     '' using 1:5 skip 1 with linespoints title 'poll API'",
            param, csv);
    if (with_floor)
        fprintf(
            gp,
            ", \\\n     '' using 1:6 skip 1 with linespoints dt 2 title 'floor insert', \\\n"
            "     '' using 1:7 skip 1 with linespoints dt 2 title 'floor drain'\n"
            "set title 'ratio to the SQL floor'\n"
            "set ylabel 'pqmq / floor'\n"
            "plot '%s' using 1:8 skip 1 with linespoints title 'enqueue / insert', \\\n"
            "     '' using 1:9 skip 1 with linespoints title 'runner / drain', \\\n"
            "     '' using 1:10 skip 1 with linespoints title 'poll API / drain'\n"
            "unset multiplot\n",
            csv);
    else
        fprintf(gp, "\n");
    int rc = pclose(gp);
    if (rc != 0)
        fprintf(stderr, "pqmq-bench: gnuplot failed; the figures are in %s\n", csv);
}

void report_sweep(const struct opts *o, const char *param, const struct sweep_row *rows, int n,
                  long maxrss)
{
    char csv[512], png[512];
    snprintf(csv, sizeof csv, "%s.csv", o->sweep_out);
    snprintf(png, sizeof png, "%s.png", o->sweep_out);
    FILE *f = fopen(csv, "w");
    if (!f)
        die("cannot write %s", csv);
    fprintf(f,
            "%s,runner_threads,enqueue_per_s,process_runner_per_s,process_poll_per_s,"
            "floor_insert_per_s,floor_drain_per_s,ratio_enqueue,ratio_process_runner,"
            "ratio_process_poll,floor_drain_ctid_per_s\n",
            param);
    for (int i = 0; i < n; i++) {
        const struct sweep_row *w = &rows[i];
        fprintf(f, "%d,%d,%.0f,%.0f,%.0f,%.0f,%.0f,%.3f,%.3f,%.3f,%.0f\n", w->value,
                w->runner_threads, w->rates.enqueue, w->rates.runner, w->rates.poll,
                w->floor_insert, w->floor_drain, ratio(w->rates.enqueue, w->floor_insert),
                ratio(w->rates.runner, w->floor_drain), ratio(w->rates.poll, w->floor_drain),
                w->floor_drain_ctid);
    }
    if (fclose(f))
        die("cannot write %s", csv);
    plot(csv, png, param, o->floor);

    if (o->json) {
        printf("{");
        jparams(o, 0);
        printf("\"sweep\": {\"parameter\": \"%s\", \"csv\": \"%s\", \"rows\": [", param, csv);
        for (int i = 0; i < n; i++) {
            const struct sweep_row *w = &rows[i];
            printf("%s{\"%s\": %d, \"runner_threads\": %d, ", i ? ", " : "", param, w->value,
                   w->runner_threads);
            jrates(&w->rates, w->floor_insert, w->floor_drain);
            jnum("floor_drain_ctid_per_s", w->floor_drain_ctid, "%.0f", 1);
            printf("}");
        }
        printf("]}, \"maxrss_kb\": %ld}\n", maxrss);
        return;
    }
    char m[32], fixed[160] = "";
    size_t at = 0;
    if (strcmp(param, "batch"))
        at += (size_t)snprintf(fixed + at, sizeof fixed - at, ", batch %d", o->batch);
    if (strcmp(param, "producers"))
        at += (size_t)snprintf(fixed + at, sizeof fixed - at, ", %d producers", o->producers);
    if (strcmp(param, "consumers"))
        at += (size_t)snprintf(fixed + at, sizeof fixed - at, ", %d consumers", o->consumers);
    printf("pqmq-bench --sweep %s: %s messages%s, %d channels, %.0f%% ordered "
           "(messages/s)\n\n",
           o->sweep, grouped(o->messages, m), fixed, o->channels, o->ordered * 100);
    if (o->rounds > 1)
        printf("rates: the median of %d interleaved rounds; a ratio is of two medians\n\n",
               o->rounds);
    int pw = (int)strlen(param) > 8 ? (int)strlen(param) : 8;
    printf("%*s %8s %10s %10s %10s %10s %10s %10s %7s %7s %7s\n", pw, param, "threads",
           "enqueue", "runner", "poll API", "fl.insert", "fl.drain", "fl.ctid", "enq/fl",
           "run/fl", "poll/fl");
    for (int i = 0; i < n; i++) {
        const struct sweep_row *w = &rows[i];
        char a[32], b[32], c[32], d[32], e[32], g[32], q[3][16];
        double qs[3] = {ratio(w->rates.enqueue, w->floor_insert),
                        ratio(w->rates.runner, w->floor_drain),
                        ratio(w->rates.poll, w->floor_drain)};
        for (int k = 0; k < 3; k++)
            snprintf(q[k], sizeof q[k], qs[k] > 0 ? "%.2f" : "-", qs[k]);
        printf("%*d %8d %10s %10s %10s %10s %10s %10s %7s %7s %7s\n", pw, w->value,
               w->runner_threads, grouped(w->rates.enqueue, a), grouped(w->rates.runner, b),
               grouped(w->rates.poll, c), grouped(w->floor_insert, d),
               grouped(w->floor_drain, e), grouped(w->floor_drain_ctid, g), q[0], q[1], q[2]);
    }
    printf("\nwrote %s%s%s; peak memory %ld kB\n", csv, have_gnuplot() ? " and " : "",
           have_gnuplot() ? png : "", maxrss);
}

/* ---- --rate, --held-xmin ----------------------------------------------- */

/* A count: like grouped, but 0 is a measured 0. */
static const char *count(double v, char *buf)
{
    return v > 0 ? grouped(v, buf) : "0";
}

static double per_s(long n, double seconds)
{
    return seconds > 0 ? n / seconds : 0;
}

/* Kept up: the last phase ended with less than a second of offered load
 * waiting. -1: saturated producers, nothing was offered. */
static int kept_up(const struct opts *o, const struct load_result *r)
{
    if (!o->rate)
        return -1;
    return r->ph[r->nphases - 1].backlog_end < TARGET_KEPT_UP_S * o->rate;
}

static void load_title(const struct opts *o)
{
    char a[32], b[32], c[32];
    if (o->burn_down > 0)
        printf("pqmq-bench --steady: %s queued messages burnt down at %s messages/s;\n"
               "  offered half of it, %s messages/s",
               grouped(o->messages, a), grouped(o->burn_down, b), grouped(o->rate, c));
    else if (o->rate)
        printf("pqmq-bench: offered %s messages/s", grouped(o->rate, a));
    else
        printf("pqmq-bench: saturated producers");
    if (o->held_xmin)
        printf(", %d s before, during and after a held snapshot", o->held_xmin);
    else
        printf(" for %d s", o->duration);
    printf(", batch %d, %d producer%s, %d poll-API consumer%s, %d channels\n\n", o->batch,
           o->producers, o->producers == 1 ? "" : "s", o->consumers,
           o->consumers == 1 ? "" : "s", o->channels);
}

static void load_rows(const struct load_result *r)
{
    for (int i = 0; i < r->nphases; i++) {
        const struct load_phase *p = &r->ph[i];
        char a[32], b[32], c[32], d[32];
        printf("%-6s %-7s %12s %12s %10s %10s %8.2f %8.2f %8.2f\n", r->target, p->name,
               count(per_s(p->inserted, p->seconds), a),
               count(per_s(p->processed, p->seconds), b), count(p->backlog_end, c),
               count(p->backlog_max, d), p->poll.p50, p->poll.p99, p->poll.max);
    }
}

static void load_table_rows(const struct load_result *r)
{
    for (int i = 0; i < r->nphases; i++)
        for (int t = 0; t < 2 && r->tables[t]; t++) {
            const struct table_stats *s = &r->ph[i].stats[t];
            char a[32], b[32], c[32], v[48];
            snprintf(v, sizeof v, "%ld / %ld", s->autovacuums, s->autoanalyzes);
            printf("%-6s %-7s %-12s %12s %12s %12s %10s\n", r->target, r->ph[i].name,
                   r->tables[t], count(s->live, a), count(s->dead, b),
                   count(s->bytes / 1024.0, c), v);
        }
}

static void load_summary(const struct opts *o, const struct load_result *r)
{
    char a[32];
    long max = 0;
    for (int i = 0; i < r->nphases; i++)
        if (r->ph[i].backlog_max > max)
            max = r->ph[i].backlog_max;
    int k = kept_up(o, r);
    printf("%s: kept up: %s", r->target, k < 0 ? "n/a (saturated)" : k ? "yes" : "no");
    printf(" (backlog at the end %s", count(r->ph[r->nphases - 1].backlog_end, a));
    if (o->rate)
        printf(", at most %.1f s of offered load", (double)max / o->rate);
    printf(")\n");
    if (r->nphases == 3) {
        double before = per_s(r->ph[0].processed, r->ph[0].seconds);
        printf("%s: processed during / before the held snapshot: %.2f, after / before: %.2f\n",
               r->target, ratio(per_s(r->ph[1].processed, r->ph[1].seconds), before),
               ratio(per_s(r->ph[2].processed, r->ph[2].seconds), before));
    }
}

/* pqmq's targets under load (the floor's run is its reference, not
 * judged), as spans of one run; returns how many. */
static int load_targets(const struct opts *o, const struct load_result *r,
                        struct target_span *s)
{
    struct target t[1][TARGETS_MAX];
    int n = targets_of_load(o, r, t[0]);
    targets_span(t, 1, n, s);
    return n;
}

static void load_text(const struct opts *o, const struct load_result *r, int n)
{
    load_title(o);
    printf("%-6s %-7s %12s %12s %10s %10s %8s %8s %8s\n", "queue", "phase", "inserted/s",
           "processed/s", "backlog", "max", "poll p50", "p99", "max ms");
    for (int i = 0; i < n; i++)
        load_rows(&r[i]);
    printf("\n%-6s %-7s %-12s %12s %12s %12s %10s\n", "queue", "end of", "table", "n_live_tup",
           "n_dead_tup", "size (kB)", "autovac.");
    for (int i = 0; i < n; i++)
        load_table_rows(&r[i]);
    printf("\n");
    for (int i = 0; i < n; i++)
        load_summary(o, &r[i]);
    struct target_span ts[TARGETS_MAX];
    targets_text(ts, load_targets(o, &r[0], ts));
    printf(
        "\nbacklog: inserted minus completed (at the phase's end, and its maximum); "
        "poll:\n  each poll call's time; tables: pg_stat_user_tables and "
        "pg_total_relation_size;\n  log tables: mq_log, mq_cursors, mq_receipts, mq_done and "
        "mq_log_gone, summed;\n  autovac.: autovacuums / autoanalyzes since the "
        "start (their counts include\n  what they found, so n_*_tup jump when one "
        "runs).\n");
}

static void jphase(const struct load_result *r, const struct load_phase *p, int last)
{
    printf("{\"phase\": \"%s\", \"seconds\": %.2f, ", p->name, p->seconds);
    printf("\"inserted_per_s\": %.0f, \"processed_per_s\": %.0f, ",
           per_s(p->inserted, p->seconds), per_s(p->processed, p->seconds));
    printf("\"backlog_end\": %ld, \"backlog_max\": %ld, ", p->backlog_end, p->backlog_max);
    jlatency("poll_ms", &p->poll, 0);
    printf("\"tables\": {");
    for (int t = 0; t < 2 && r->tables[t]; t++)
        printf("%s\"%s\": {\"n_live_tup\": %ld, \"n_dead_tup\": %ld, \"bytes\": %ld, "
               "\"autovacuums\": %ld, \"autoanalyzes\": %ld}",
               t ? ", " : "", r->tables[t], p->stats[t].live, p->stats[t].dead,
               p->stats[t].bytes, p->stats[t].autovacuums, p->stats[t].autoanalyzes);
    printf("}}%s", last ? "" : ", ");
}

static void load_json(const struct opts *o, const struct load_result *r, int n)
{
    printf("{");
    jparams(o, 0);
    printf("\"load\": {");
    jnum("offered_per_s", o->rate, "%.0f", 0);
    jnum("duration_s", o->held_xmin ? 0 : o->duration, "%.0f", 0);
    jnum("held_xmin_s", o->held_xmin, "%.0f", 0);
    jnum("burn_down_per_s", o->burn_down, "%.0f", 0);
    struct target_span ts[TARGETS_MAX];
    targets_json(ts, load_targets(o, &r[0], ts), 0);
    printf("\"queues\": [");
    for (int i = 0; i < n; i++) {
        printf("%s{\"queue\": \"%s\", \"phases\": [", i ? ", " : "", r[i].target);
        for (int k = 0; k < r[i].nphases; k++)
            jphase(&r[i], &r[i].ph[k], k == r[i].nphases - 1);
        int up = kept_up(o, &r[i]);
        printf("], \"kept_up\": %s, ", up < 0 ? "null" : up ? "true" : "false");
        double before = per_s(r[i].ph[0].processed, r[i].ph[0].seconds);
        jnum("ratio_during_before",
             r[i].nphases == 3 ? ratio(per_s(r[i].ph[1].processed, r[i].ph[1].seconds), before)
                               : 0,
             "%.3f", 1);
        printf("}");
    }
    printf("]}, \"maxrss_kb\": %ld}\n", maxrss_kb());
}

void report_load(const struct opts *o, const struct load_result *r, int n)
{
    if (o->json)
        load_json(o, r, n);
    else
        load_text(o, r, n);
}
