/*
 * cmd_metrics.c: pqmq metrics, the status figures in the Prometheus text
 * exposition format (version 0.0.4), for a textfile collector, a cron job or
 * an exporter's scrape; pqmq serve answers GET /metrics with the same text.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "pqmq-tool.h"

static void help(void)
{
    printf("usage: pqmq metrics [CHANNEL...]\n\n"
           "The figures of 'pqmq status' and the alert counters in the Prometheus text\n"
           "format:\n"
           "  pqmq_messages{channel,state}            gauge (state: ready, in_flight,\n"
           "                                          scheduled, uncommitted, waiting, dead)\n"
           "  pqmq_blocked_chains{channel}            gauge\n"
           "  pqmq_oldest_ready_age_seconds{channel}  gauge (0: nothing ready)\n"
           "  pqmq_removed_total{channel}             counter (completed or purged)\n"
           "  pqmq_channel_paused{channel}            gauge (1: paused, pqmq pause)\n"
           "  pqmq_failed_attempts_total{channel}     counter\n"
           "  pqmq_retries_total{channel}             counter (retries scheduled)\n"
           "  pqmq_dead_total{channel}                counter (messages gone dead)\n"
           "  pqmq_time_in_queue_seconds{channel}     histogram (insert to completion)\n"
           "  pqmq_last_completion_timestamp_seconds{channel}\n"
           "                                          gauge (only after a completion)\n"
           "  pqmq_workers{state}                     gauge (state: live, gone)\n\n"
           "On a terminal, control characters in channel names are shown as \\xHH\n"
           "(not the format's); written to a file or a pipe, the text is exact.\n\n%s",
           tool_common_help);
}

static void family(FILE *f, const char *name, const char *type, const char *helptext)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, helptext, name, type);
}

/* A channel label's value: exact for a file or a pipe, control characters
 * as \xHH on a terminal. */
static void channel_value(FILE *f, const char *channel, int tty)
{
    if (tty)
        out_display(f, channel);
    else
        out_prom_label(f, channel);
}

static void sample(FILE *f, const char *name, const char *channel, const char *state, int tty)
{
    fprintf(f, "%s{channel=\"", name);
    channel_value(f, channel, tty);
    if (state)
        fprintf(f, "\",state=\"%s", state);
    fputs("\"} ", f);
}

void tool_metrics_print(FILE *f, const tool_figures *rows, size_t n, int tty)
{
    static const char *const states[] = {"ready",       "in_flight", "scheduled",
                                         "uncommitted", "waiting",   "dead"};
    family(f, "pqmq_messages", "gauge", "Messages in the queue by channel and state.");
    for (size_t i = 0; i < n; i++) {
        const tool_figures *x = &rows[i];
        const long long v[] = {x->ready,       x->in_flight, x->scheduled,
                               x->uncommitted, x->waiting,   x->dead};
        for (int s = 0; s < 6; s++) {
            sample(f, "pqmq_messages", x->channel, states[s], tty);
            fprintf(f, "%lld\n", v[s]);
        }
    }
    family(f, "pqmq_blocked_chains", "gauge", "Ordered chains whose head is dead.");
    for (size_t i = 0; i < n; i++) {
        sample(f, "pqmq_blocked_chains", rows[i].channel, NULL, tty);
        fprintf(f, "%lld\n", rows[i].blocked);
    }
    family(f, "pqmq_oldest_ready_age_seconds", "gauge",
           "Seconds the oldest ready message has been ready (0 when none is).");
    for (size_t i = 0; i < n; i++) {
        sample(f, "pqmq_oldest_ready_age_seconds", rows[i].channel, NULL, tty);
        fprintf(f, "%.3f\n", rows[i].oldest_ready_age);
    }
    family(f, "pqmq_removed_total", "counter",
           "Messages deleted from the channel (completed or purged).");
    for (size_t i = 0; i < n; i++) {
        sample(f, "pqmq_removed_total", rows[i].channel, NULL, tty);
        fprintf(f, "%lld\n", rows[i].removed);
    }
    family(f, "pqmq_channel_paused", "gauge",
           "1 while the channel is paused (no poll delivers its messages), else 0.");
    for (size_t i = 0; i < n; i++) {
        sample(f, "pqmq_channel_paused", rows[i].channel, NULL, tty);
        fprintf(f, "%d\n", rows[i].paused);
    }
}

int tool_alerts_read(tool *t, char *const *channels, size_t n, tool_alerts **out, size_t *count)
{
    *out = NULL;
    *count = 0;
    char *arr = tool_text_array(channels, n);
    if (n && !arr)
        return tool_err(t, "out of memory");
    const char *p[1] = {arr};
    PGresult *r = tool_query(t,
                             "SELECT channel_name, failed, retried, dead, completed, wait_sum,"
                             " cardinality(wait_le), array_to_string(wait_le, ' '),"
                             " array_to_string(wait_buckets, ' '),"
                             " COALESCE(date_part('epoch', last_completed_at), 0)"
                             " FROM mq_alert_metrics($1::text[])",
                             1, p);
    free(arr);
    if (!r)
        return EXIT_ERR;
    size_t rows = (size_t)PQntuples(r);
    tool_alerts *a = calloc(rows ? rows : 1, sizeof *a);
    if (!a) {
        PQclear(r);
        return tool_err(t, "out of memory");
    }
    for (size_t i = 0; i < rows; i++) {
        int row = (int)i;
        a[i].channel = strdup(PQgetvalue(r, row, 0));
        if (!a[i].channel) {
            PQclear(r);
            tool_alerts_free(a, i);
            return tool_err(t, "out of memory");
        }
        a[i].failed = atoll(PQgetvalue(r, row, 1));
        a[i].retried = atoll(PQgetvalue(r, row, 2));
        a[i].dead = atoll(PQgetvalue(r, row, 3));
        a[i].completed = atoll(PQgetvalue(r, row, 4));
        a[i].wait_sum = atof(PQgetvalue(r, row, 5));
        long nb = atol(PQgetvalue(r, row, 6));
        a[i].nbuckets = nb > 0 && nb <= TOOL_WAIT_BUCKETS_MAX ? (size_t)nb : 0;
        const char *le = PQgetvalue(r, row, 7), *b = PQgetvalue(r, row, 8);
        for (size_t k = 0; k < a[i].nbuckets; k++) {
            char *end;
            a[i].le[k] = strtod(le, &end);
            le = end;
            a[i].buckets[k] = strtoll(b, &end, 10);
            b = end;
        }
        a[i].last_completed = atof(PQgetvalue(r, row, 9));
    }
    PQclear(r);
    *out = a;
    *count = rows;
    return 0;
}

void tool_alerts_free(tool_alerts *a, size_t count)
{
    for (size_t i = 0; a && i < count; i++)
        free(a[i].channel);
    free(a);
}

/* A counter family of the alert rows: field is the offset of its value. */
static void alert_counter(FILE *f, const tool_alerts *rows, size_t n, const char *name,
                          const char *helptext, size_t field, int tty)
{
    family(f, name, "counter", helptext);
    for (size_t i = 0; i < n; i++) {
        sample(f, name, rows[i].channel, NULL, tty);
        fprintf(f, "%lld\n", *(const long long *)((const char *)&rows[i] + field));
    }
}

void tool_alerts_print(FILE *f, const tool_alerts *rows, size_t n, int tty)
{
    alert_counter(f, rows, n, "pqmq_failed_attempts_total",
                  "Attempts that failed (pqmq_fail, or a final lease that ran out).",
                  offsetof(tool_alerts, failed), tty);
    alert_counter(f, rows, n, "pqmq_retries_total",
                  "Failed attempts after which a retry was scheduled.",
                  offsetof(tool_alerts, retried), tty);
    alert_counter(f, rows, n, "pqmq_dead_total", "Messages that went dead (no attempt left).",
                  offsetof(tool_alerts, dead), tty);
    family(f, "pqmq_time_in_queue_seconds", "histogram",
           "Seconds from insert to completion of the completed messages.");
    for (size_t i = 0; i < n; i++) {
        const tool_alerts *x = &rows[i];
        for (size_t k = 0; k <= x->nbuckets; k++) {
            fputs("pqmq_time_in_queue_seconds_bucket{channel=\"", f);
            channel_value(f, x->channel, tty);
            if (k < x->nbuckets)
                fprintf(f, "\",le=\"%g\"} %lld\n", x->le[k], x->buckets[k]);
            else
                fprintf(f, "\",le=\"+Inf\"} %lld\n", x->completed);
        }
        sample(f, "pqmq_time_in_queue_seconds_sum", x->channel, NULL, tty);
        fprintf(f, "%.6f\n", x->wait_sum);
        sample(f, "pqmq_time_in_queue_seconds_count", x->channel, NULL, tty);
        fprintf(f, "%lld\n", x->completed);
    }
    /* No sample before a channel's first completion: a 0 would read as a
     * completion in 1970 to an alert on the time since. */
    family(f, "pqmq_last_completion_timestamp_seconds", "gauge",
           "Unix time of the channel's last completion.");
    for (size_t i = 0; i < n; i++) {
        if (rows[i].last_completed <= 0)
            continue;
        sample(f, "pqmq_last_completion_timestamp_seconds", rows[i].channel, NULL, tty);
        fprintf(f, "%.3f\n", rows[i].last_completed);
    }
}

int cmd_metrics(tool *t, int argc, char **argv)
{
    static const struct option opts[] = {TOOL_COMMON_OPTS, {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, TOOL_COMMON_SHORT, opts, NULL)) != -1) {
        if (c == 'h') {
            help();
            return EXIT_OK;
        } else if (tool_common_opt(t, c, optarg)) {
            return EXIT_USAGE;
        }
    }
    int rc = tool_connect(t, TOOL_MIN_VERSION);
    if (rc)
        return rc;
    tool_figures *rows;
    size_t count;
    rc = tool_figures_read(t, argv + optind, (size_t)(argc - optind), &rows, &count);
    if (rc)
        return rc;
    tool_alerts *alerts = NULL;
    size_t nalerts = 0;
    tool_worker *workers = NULL;
    size_t nworkers = 0;
    rc = tool_alerts_read(t, argv + optind, (size_t)(argc - optind), &alerts, &nalerts);
    if (!rc)
        rc = tool_workers_read(t, 0, &workers, &nworkers);
    if (!rc) {
        tool_metrics_print(stdout, rows, count, out_is_tty(stdout));
        tool_alerts_print(stdout, alerts, nalerts, out_is_tty(stdout));
        tool_workers_metrics(stdout, workers, nworkers);
    }
    tool_figures_free(rows, count);
    tool_alerts_free(alerts, nalerts);
    tool_workers_free(workers, nworkers);
    return rc;
}
