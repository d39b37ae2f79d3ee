/*
 * report.c: what pqmq-bench prints. A small aligned table (figure, value,
 * floor, ratio, target), or with --json exactly one JSON object; for
 * --sweep a CSV file and, when gnuplot is installed, a PNG plot of it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* The project's targets (2-core machine, server on the same box); the
 * README says which are reached, over several runs. */
#define TARGET_ENQUEUE 0.8 /* enqueue / floor insert */
#define TARGET_PROCESS 0.6 /* runner processing / floor drain */
#define TARGET_ORDERED 0.5 /* ordered runner processing / unordered */
#define TARGET_P50_MS 1.5
#define TARGET_P99_MS 5.0

/* 1234567.8 -> "1,234,568"; "-" for 0 (not measured). */
static const char *grouped(double v, char *buf)
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

/* One row of rates: value, reference, their ratio and the target. */
static void rate_row(const char *figure, double v, double ref, double target)
{
    char a[32], b[32], r[16] = "-", t[24] = "";
    double q = ratio(v, ref);
    if (q > 0)
        snprintf(r, sizeof r, "%.2f", q);
    if (target > 0 && q > 0)
        snprintf(t, sizeof t, ">= %.2f  %s", target, q >= target ? "ok" : "MISSED");
    printf("%-42s %12s %12s %7s  %s\n", figure, grouped(v, a), grouped(ref, b), r, t);
}

static void latency_rows(const char *what, const struct latency *l)
{
    if (!l->n)
        return;
    char figure[64], t[24];
    snprintf(figure, sizeof figure, "latency, %s: p50 (ms)", what);
    snprintf(t, sizeof t, "<= %.1f  %s", TARGET_P50_MS,
             l->p50 <= TARGET_P50_MS ? "ok" : "MISSED");
    printf("%-42s %12.2f %12s %7s  %s\n", figure, l->p50, "", "", t);
    snprintf(figure, sizeof figure, "latency, %s: p99 (ms)", what);
    snprintf(t, sizeof t, "<= %.1f  %s", TARGET_P99_MS,
             l->p99 <= TARGET_P99_MS ? "ok" : "MISSED");
    printf("%-42s %12.2f %12s %7s  %s\n", figure, l->p99, "", "", t);
    snprintf(figure, sizeof figure, "latency, %s: max (ms)", what);
    printf("%-42s %12.2f\n", figure, l->max);
}

void report_text(const struct opts *o, const struct results *r)
{
    char m[32];
    printf("pqmq-bench: %s messages, batch %d, %d producer%s, %d consumer%s "
           "(runners of %d threads), %d channels, %.0f%% ordered, ~%d-byte JSON payloads\n\n",
           grouped(o->messages, m), o->batch, o->producers, o->producers == 1 ? "" : "s",
           o->consumers, o->consumers == 1 ? "" : "s", r->runner_threads, o->channels,
           o->ordered * 100, o->payload_bytes);
    printf("%-42s %12s %12s %7s  %s\n", "figure", "value", "floor", "ratio", "target");
    rate_row("enqueue (messages/s)", r->main.enqueue, r->floor_insert, TARGET_ENQUEUE);
    rate_row("processing, runner (messages/s)", r->main.runner, r->floor_drain, TARGET_PROCESS);
    rate_row("processing, poll API (messages/s)", r->main.poll, r->floor_drain, 0);
    if (r->floor_drain_ctid > 0) {
        rate_row("processing, runner, vs ctid floor", r->main.runner, r->floor_drain_ctid, 0);
        rate_row("processing, poll API, vs ctid floor", r->main.poll, r->floor_drain_ctid, 0);
    }
    if (r->ordered.runner > 0) {
        char f[64];
        snprintf(f, sizeof f, "%d ordered chains: enqueue *", o->chains);
        rate_row(f, r->ordered.enqueue, r->main.enqueue, 0);
        snprintf(f, sizeof f, "%d ordered chains: runner *", o->chains);
        rate_row(f, r->ordered.runner, r->main.runner, TARGET_ORDERED);
        snprintf(f, sizeof f, "%d ordered chains: poll API *", o->chains);
        rate_row(f, r->ordered.poll, r->main.poll, 0);
    }
    latency_rows("idle runner", &r->idle);
    latency_rows("one ordered chain", &r->idle_ordered);
    printf("%-42s %12ld\n", "peak memory, maxrss (kB)", r->maxrss_kb);
    if (r->floor_drain_ctid > 0)
        printf("\nfloor: the cheapest SQL that moves the same messages with the same clients:"
               "\n  a plain INSERT of each batch into one table indexed by id, and\n"
               "  DELETE ... WHERE id IN (SELECT id ... LIMIT batch FOR UPDATE SKIP LOCKED)"
               "\n  in batches (no lease, no retry, no order, no fairness).\n"
               "ctid floor: the same DELETE matched by ctid (a TID scan at any table size):"
               "\n  faster still, the limit of a delete-based queue.\n");
    if (r->ordered.runner > 0)
        printf("%s* ordered rows: every message on an ordered chain; the floor column "
               "holds the\n  main scenario's rate and the ratio is against it.\n",
               r->floor_drain_ctid > 0 ? "" : "\n");
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
        printf("{\"p50\": %.3f, \"p99\": %.3f, \"max\": %.3f, \"samples\": %d}", l->p50, l->p99,
               l->max, l->n);
    else
        printf("null");
    printf("%s", last ? "" : ", ");
}

static void jparams(const struct opts *o, int runner_threads)
{
    printf("\"parameters\": {\"messages\": %d, \"producers\": %d, \"consumers\": %d, "
           "\"batch\": %d, \"channels\": %d, \"ordered\": %g, \"payload_bytes\": %d, "
           "\"runner_threads\": %d, \"chains\": %d, \"latency_samples\": %d, "
           "\"latency_gap_ms\": %d, \"floor\": %s}, ",
           o->messages, o->producers, o->consumers, o->batch, o->channels, o->ordered,
           o->payload_bytes, runner_threads, o->chains, o->latency_samples, o->latency_gap_ms,
           o->floor ? "true" : "false");
}

/* A scenario's rates, the floor's and the ratios, as JSON members. */
static void jrates(const struct rates *x, double floor_insert, double floor_drain)
{
    jnum("enqueue_per_s", x->enqueue, "%.0f", 0);
    jnum("process_runner_per_s", x->runner, "%.0f", 0);
    jnum("process_poll_per_s", x->poll, "%.0f", 0);
    jnum("floor_insert_per_s", floor_insert, "%.0f", 0);
    jnum("floor_drain_per_s", floor_drain, "%.0f", 0);
    jnum("ratio_enqueue", ratio(x->enqueue, floor_insert), "%.3f", 0);
    jnum("ratio_process_runner", ratio(x->runner, floor_drain), "%.3f", 0);
    jnum("ratio_process_poll", ratio(x->poll, floor_drain), "%.3f", 0);
}

void report_json(const struct opts *o, const struct results *r)
{
    printf("{");
    jparams(o, r->runner_threads);
    jrates(&r->main, r->floor_insert, r->floor_drain);
    jnum("floor_drain_ctid_per_s", r->floor_drain_ctid, "%.0f", 0);
    jnum("ratio_process_runner_ctid", ratio(r->main.runner, r->floor_drain_ctid), "%.3f", 0);
    jnum("ratio_process_poll_ctid", ratio(r->main.poll, r->floor_drain_ctid), "%.3f", 0);
    printf("\"ordered\": ");
    if (r->ordered.runner > 0) {
        printf("{\"chains\": %d, ", o->chains);
        jnum("enqueue_per_s", r->ordered.enqueue, "%.0f", 0);
        jnum("process_runner_per_s", r->ordered.runner, "%.0f", 0);
        jnum("process_poll_per_s", r->ordered.poll, "%.0f", 0);
        jnum("ratio_runner_to_main", ratio(r->ordered.runner, r->main.runner), "%.3f", 0);
        jnum("ratio_poll_to_main", ratio(r->ordered.poll, r->main.poll), "%.3f", 1);
        printf("}, ");
    } else {
        printf("null, ");
    }
    printf("\"latency_ms\": {");
    jlatency("idle", &r->idle, 0);
    jlatency("ordered", &r->idle_ordered, 1);
    printf("}, \"maxrss_kb\": %ld}\n", r->maxrss_kb);
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
