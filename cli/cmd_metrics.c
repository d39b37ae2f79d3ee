/*
 * cmd_metrics.c: pqmq metrics, the status figures in the Prometheus text
 * exposition format (version 0.0.4), for a textfile collector, a cron job or
 * an exporter's scrape; pqmq serve answers GET /metrics with the same text.
 */
#include <string.h>

#include "pqmq-tool.h"

static void help(void)
{
    printf("usage: pqmq metrics [CHANNEL...]\n\n"
           "The figures of 'pqmq status' in the Prometheus text format:\n"
           "  pqmq_messages{channel,state}            gauge (state: ready, in_flight,\n"
           "                                          scheduled, uncommitted, waiting, dead)\n"
           "  pqmq_blocked_chains{channel}            gauge\n"
           "  pqmq_oldest_ready_age_seconds{channel}  gauge (0: nothing ready)\n"
           "  pqmq_removed_total{channel}             counter (completed or purged)\n\n"
           "On a terminal, control characters in channel names are shown as \\xHH\n"
           "(not the format's); written to a file or a pipe, the text is exact.\n\n%s",
           tool_common_help);
}

static void family(FILE *f, const char *name, const char *type, const char *helptext)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, helptext, name, type);
}

static void sample(FILE *f, const char *name, const char *channel, const char *state, int tty)
{
    fprintf(f, "%s{channel=\"", name);
    if (tty)
        out_display(f, channel);
    else
        out_prom_label(f, channel);
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
    tool_metrics_print(stdout, rows, count, out_is_tty(stdout));
    tool_figures_free(rows, count);
    return EXIT_OK;
}
