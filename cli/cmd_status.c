/*
 * cmd_status.c: pqmq status, and reading the figures (mq_metrics) that
 * status, watch and metrics print.
 */
#include <stdlib.h>
#include <string.h>

#include "pqmq-tool.h"

int tool_figures_read(tool *t, char *const *channels, size_t n, tool_figures **out,
                      size_t *count)
{
    *out = NULL;
    *count = 0;
    char *arr = tool_text_array(channels, n);
    if (n && !arr)
        return tool_err(t, "out of memory");
    const char *p[1] = {arr};
    PGresult *r = tool_query(t,
                             "SELECT channel_name, ready, in_flight, scheduled, uncommitted, "
                             "waiting, dead, blocked_chains, oldest_ready_age, removed, paused "
                             "FROM mq_metrics($1::text[])",
                             1, p);
    free(arr);
    if (!r)
        return EXIT_ERR;
    size_t rows = (size_t)PQntuples(r);
    tool_figures *f = calloc(rows ? rows : 1, sizeof *f);
    if (!f) {
        PQclear(r);
        return tool_err(t, "out of memory");
    }
    for (size_t i = 0; i < rows; i++) {
        f[i].channel = strdup(PQgetvalue(r, (int)i, 0));
        long long *v[] = {&f[i].ready,   &f[i].in_flight, &f[i].scheduled, &f[i].uncommitted,
                          &f[i].waiting, &f[i].dead,      &f[i].blocked};
        for (int c = 0; c < 7; c++)
            *v[c] = atoll(PQgetvalue(r, (int)i, c + 1));
        f[i].oldest_ready_age = atof(PQgetvalue(r, (int)i, 8));
        f[i].removed = atoll(PQgetvalue(r, (int)i, 9));
        f[i].paused = !strcmp(PQgetvalue(r, (int)i, 10), "t");
        if (!f[i].channel) {
            PQclear(r);
            tool_figures_free(f, i);
            return tool_err(t, "out of memory");
        }
    }
    PQclear(r);
    *out = f;
    *count = rows;
    return 0;
}

void tool_figures_free(tool_figures *f, size_t count)
{
    for (size_t i = 0; f && i < count; i++)
        free(f[i].channel);
    free(f);
}

int tool_figures_check_named(const tool *t, char *const *channels, size_t n,
                             const tool_figures *rows, size_t count)
{
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < count && strcmp(rows[j].channel, channels[i]) != 0)
            j++;
        if (j == count)
            return tool_err(t, "unknown channel \"%s\" (it has never had a message)",
                            channels[i]);
    }
    return 0;
}

static void fmt_age(char *buf, size_t size, double s)
{
    if (s <= 0)
        snprintf(buf, size, "-");
    else if (s < 120)
        snprintf(buf, size, "%.1fs", s);
    else if (s < 7200)
        snprintf(buf, size, "%.0fm", s / 60);
    else if (s < 172800)
        snprintf(buf, size, "%.1fh", s / 3600);
    else
        snprintf(buf, size, "%.1fd", s / 86400);
}

static const char *const heads[] = {"CHANNEL",      "READY",    "IN_FLIGHT", "SCHEDULED",
                                    "UNCOMMITTED",  "WAITING",  "DEAD",      "BLOCKED",
                                    "OLDEST_READY", "REMOVED/S"};

/* What a paused channel's name is followed by in the table. */
static const char paused_mark[] = " (paused)";

static size_t name_width(const tool_figures *x)
{
    return out_display_width(x->channel) + (x->paused ? strlen(paused_mark) : 0);
}

static void row(FILE *f, size_t w0, const char *name, const tool_figures *x, int has_rate,
                double rate)
{
    char age[32];
    fmt_age(age, sizeof age, x->oldest_ready_age);
    out_display(f, name);
    size_t w = out_display_width(name);
    if (x->paused) {
        fputs(paused_mark, f);
        w += strlen(paused_mark);
    }
    fprintf(f, "%*s", (int)(w0 - w), "");
    fprintf(f, " %9lld %9lld %9lld %11lld %9lld %9lld %7lld %12s", x->ready, x->in_flight,
            x->scheduled, x->uncommitted, x->waiting, x->dead, x->blocked, age);
    if (has_rate)
        fprintf(f, " %9.1f", rate);
    fputc('\n', f);
}

void tool_figures_table(FILE *f, const tool_figures *rows, size_t n, const double *rates)
{
    size_t w0 = strlen("(total)");
    for (size_t i = 0; i < n; i++)
        if (name_width(&rows[i]) > w0)
            w0 = name_width(&rows[i]);
    fprintf(f, "%-*s %9s %9s %9s %11s %9s %9s %7s %12s", (int)w0, heads[0], heads[1], heads[2],
            heads[3], heads[4], heads[5], heads[6], heads[7], heads[8]);
    if (rates)
        fprintf(f, " %9s", heads[9]);
    fputc('\n', f);
    tool_figures total = {0};
    double total_rate = 0;
    for (size_t i = 0; i < n; i++) {
        const tool_figures *x = &rows[i];
        row(f, w0, x->channel, x, rates != NULL, rates ? rates[i] : 0);
        total.ready += x->ready;
        total.in_flight += x->in_flight;
        total.scheduled += x->scheduled;
        total.uncommitted += x->uncommitted;
        total.waiting += x->waiting;
        total.dead += x->dead;
        total.blocked += x->blocked;
        if (x->oldest_ready_age > total.oldest_ready_age)
            total.oldest_ready_age = x->oldest_ready_age;
        total_rate += rates ? rates[i] : 0;
    }
    row(f, w0, "(total)", &total, rates != NULL, total_rate);
}

static void json_row(FILE *f, const tool_figures *x)
{
    fprintf(f,
            "\"ready\": %lld, \"in_flight\": %lld, \"scheduled\": %lld, "
            "\"uncommitted\": %lld, \"waiting\": %lld, \"dead\": %lld, "
            "\"blocked_chains\": %lld, \"oldest_ready_age_seconds\": %.3f",
            x->ready, x->in_flight, x->scheduled, x->uncommitted, x->waiting, x->dead,
            x->blocked, x->oldest_ready_age);
}

void tool_figures_json(FILE *f, const tool_figures *rows, size_t n)
{
    tool_figures total = {0};
    fputs("{\"channels\": [", f);
    for (size_t i = 0; i < n; i++) {
        const tool_figures *x = &rows[i];
        fputs(i ? ",\n  {\"channel\": " : "\n  {\"channel\": ", f);
        out_json_str(f, x->channel, strlen(x->channel));
        fputs(", ", f);
        json_row(f, x);
        fprintf(f, ", \"removed\": %lld, \"paused\": %s}", x->removed,
                x->paused ? "true" : "false");
        total.ready += x->ready;
        total.in_flight += x->in_flight;
        total.scheduled += x->scheduled;
        total.uncommitted += x->uncommitted;
        total.waiting += x->waiting;
        total.dead += x->dead;
        total.blocked += x->blocked;
        total.removed += x->removed;
        if (x->oldest_ready_age > total.oldest_ready_age)
            total.oldest_ready_age = x->oldest_ready_age;
    }
    fputs(n ? "\n ],\n \"total\": {" : "],\n \"total\": {", f);
    json_row(f, &total);
    fprintf(f, ", \"removed\": %lld}}\n", total.removed);
}

static void help(void)
{
    printf("usage: pqmq status [--json] [CHANNEL...]\n\n"
           "Messages per channel (the named ones, else all) and in total, by state:\n"
           "ready, in flight (leased, or waiting for a retry), scheduled (delayed),\n"
           "uncommitted (two-phase), waiting (behind their ordered chain), dead; chains\n"
           "blocked by a dead head; how long the oldest ready message has waited.\n"
           "A paused channel (pqmq pause) is marked \"(paused)\", and listed even\n"
           "with no message.\n\n"
           "  --json              one JSON object, for scripts\n%s",
           tool_common_help);
}

int cmd_status(tool *t, int argc, char **argv)
{
    static const struct option opts[] = {
        TOOL_COMMON_OPTS,
        {"json", no_argument, NULL, 'j'},
        {NULL, 0, NULL, 0},
    };
    int c, json = 0;
    while ((c = getopt_long(argc, argv, TOOL_COMMON_SHORT, opts, NULL)) != -1) {
        if (c == 'h') {
            help();
            return EXIT_OK;
        } else if (c == 'j') {
            json = 1;
        } else if (tool_common_opt(t, c, optarg)) {
            return EXIT_USAGE;
        }
    }
    char **channels = argv + optind;
    size_t n = (size_t)(argc - optind);
    int rc = tool_connect(t, TOOL_MIN_VERSION);
    if (rc)
        return rc;
    tool_figures *rows;
    size_t count;
    rc = tool_figures_read(t, channels, n, &rows, &count);
    if (rc)
        return rc;
    if (json)
        tool_figures_json(stdout, rows, count);
    else
        tool_figures_table(stdout, rows, count, NULL);
    rc = tool_figures_check_named(t, channels, n, rows, count);
    tool_figures_free(rows, count);
    return rc;
}
