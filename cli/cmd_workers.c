/*
 * cmd_workers.c: pqmq workers, the runners that consume the queue
 * (mq_workers: each pqmq_runner registers when it starts, heartbeats every
 * few seconds and leaves when it stops), and their gauge for pqmq metrics
 * and serve.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pqmq-tool.h"

int tool_workers_read(tool *t, int stale_after, tool_worker **out, size_t *count)
{
    *out = NULL;
    *count = 0;
    char stale[16];
    snprintf(stale, sizeof stale, "%d", stale_after > 0 ? stale_after : 30);
    const char *p[1] = {stale};
    PGresult *r = tool_query(t,
                             "SELECT id, host, pid, version, array_to_string(channels, ', '),"
                             " COALESCE(array_to_json(channels)::text, 'null'), threads,"
                             " in_flight, jobs_done, jobs_failed,"
                             " date_part('epoch', started_at), date_part('epoch', last_seen),"
                             " seen_ago, live"
                             " FROM mq_workers(make_interval(secs => $1::int))",
                             1, p);
    if (!r)
        return EXIT_ERR;
    size_t rows = (size_t)PQntuples(r);
    tool_worker *w = calloc(rows ? rows : 1, sizeof *w);
    if (!w) {
        PQclear(r);
        return tool_err(t, "out of memory");
    }
    for (size_t i = 0; i < rows; i++) {
        int row = (int)i;
        w[i].id = atoll(PQgetvalue(r, row, 0));
        w[i].host = strdup(PQgetvalue(r, row, 1));
        w[i].pid = atoi(PQgetvalue(r, row, 2));
        w[i].version = strdup(PQgetvalue(r, row, 3));
        w[i].channels = PQgetisnull(r, row, 4) ? NULL : strdup(PQgetvalue(r, row, 4));
        w[i].channels_json = strdup(PQgetvalue(r, row, 5));
        w[i].threads = atoi(PQgetvalue(r, row, 6));
        w[i].in_flight = atoi(PQgetvalue(r, row, 7));
        w[i].jobs_done = atoll(PQgetvalue(r, row, 8));
        w[i].jobs_failed = atoll(PQgetvalue(r, row, 9));
        w[i].started_at = atof(PQgetvalue(r, row, 10));
        w[i].last_seen = atof(PQgetvalue(r, row, 11));
        w[i].seen_ago = atof(PQgetvalue(r, row, 12));
        w[i].live = PQgetvalue(r, row, 13)[0] == 't';
        if (!w[i].host || !w[i].version || !w[i].channels_json ||
            (!PQgetisnull(r, row, 4) && !w[i].channels)) {
            PQclear(r);
            tool_workers_free(w, i + 1);
            return tool_err(t, "out of memory");
        }
    }
    PQclear(r);
    *out = w;
    *count = rows;
    return 0;
}

void tool_workers_free(tool_worker *w, size_t count)
{
    for (size_t i = 0; w && i < count; i++) {
        free(w[i].host);
        free(w[i].version);
        free(w[i].channels);
        free(w[i].channels_json);
    }
    free(w);
}

void tool_workers_json(FILE *f, const tool_worker *w, size_t n)
{
    fputs("[", f);
    for (size_t i = 0; i < n; i++) {
        const tool_worker *x = &w[i];
        fprintf(f, "%s\n  {\"id\": %lld, \"host\": ", i ? "," : "", x->id);
        out_json_str(f, x->host, strlen(x->host));
        fprintf(f, ", \"pid\": %d, \"version\": ", x->pid);
        out_json_str(f, x->version, strlen(x->version));
        /* (channels_json is the server's array_to_json: JSON already) */
        fprintf(f,
                ", \"channels\": %s, \"threads\": %d, \"in_flight\": %d, \"jobs_done\": %lld,"
                " \"jobs_failed\": %lld, \"started_at\": %.3f, \"last_seen\": %.3f,"
                " \"seen_ago_seconds\": %.3f, \"state\": \"%s\"}",
                x->channels_json, x->threads, x->in_flight, x->jobs_done, x->jobs_failed,
                x->started_at, x->last_seen, x->seen_ago, x->live ? "live" : "gone");
    }
    fputs(n ? "\n]\n" : "]\n", f);
}

void tool_workers_metrics(FILE *f, const tool_worker *w, size_t n)
{
    long long live = 0;
    for (size_t i = 0; i < n; i++)
        live += w[i].live;
    fputs("# HELP pqmq_workers Runners registered, by state (gone: no heartbeat lately).\n"
          "# TYPE pqmq_workers gauge\n",
          f);
    fprintf(f, "pqmq_workers{state=\"live\"} %lld\npqmq_workers{state=\"gone\"} %lld\n", live,
            (long long)n - live);
}

static void fmt_time(char *buf, size_t size, double at)
{
    time_t s = (time_t)at;
    struct tm tm;
    if (!gmtime_r(&s, &tm) || !strftime(buf, size, "%Y-%m-%d %H:%M:%SZ", &tm))
        snprintf(buf, size, "-");
}

static void table(FILE *f, const tool_worker *w, size_t n)
{
    size_t wh = strlen("HOST");
    for (size_t i = 0; i < n; i++)
        if (out_display_width(w[i].host) > wh)
            wh = out_display_width(w[i].host);
    fprintf(f, "%6s %-*s %8s %-5s %-20s %9s %10s %8s %9s %7s %-9s %s\n", "ID", (int)wh, "HOST",
            "PID", "STATE", "STARTED", "LAST_SEEN", "JOBS_DONE", "FAILED", "IN_FLIGHT",
            "THREADS", "VERSION", "CHANNELS");
    for (size_t i = 0; i < n; i++) {
        const tool_worker *x = &w[i];
        char started[32], seen[32];
        fmt_time(started, sizeof started, x->started_at);
        snprintf(seen, sizeof seen, "%.0fs ago", x->seen_ago);
        fprintf(f, "%6lld ", x->id);
        out_display(f, x->host);
        fprintf(f, "%*s %8d %-5s %-20s %9s %10lld %8lld %9d %7d ",
                (int)(wh - out_display_width(x->host)), "", x->pid, x->live ? "live" : "gone",
                started, seen, x->jobs_done, x->jobs_failed, x->in_flight, x->threads);
        out_display(f, x->version);
        fprintf(
            f, "%*s ",
            (int)(9 > out_display_width(x->version) ? 9 - out_display_width(x->version) : 0),
            "");
        if (x->channels)
            out_display(f, x->channels);
        else
            fputs("(all)", f);
        fputc('\n', f);
    }
}

static void help(void)
{
    printf("usage: pqmq workers [--json] [--stale SECONDS]\n\n"
           "The runners consuming the queue (pqmq_runner registers when it starts,\n"
           "heartbeats every 5 seconds and leaves when it stops): host, pid, state,\n"
           "when it started and was last seen, jobs done and failed, jobs in flight,\n"
           "threads, pqmq version and channels. A runner whose last heartbeat is older\n"
           "than --stale (default 30) seconds is gone (killed, or cut off from the\n"
           "database); its entry is deleted an hour after its last heartbeat.\n\n"
           "  --json              a JSON array, for scripts\n"
           "  --stale SECONDS     when a silent runner counts as gone (1..86400)\n%s",
           tool_common_help);
}

int cmd_workers(tool *t, int argc, char **argv)
{
    static const struct option opts[] = {
        TOOL_COMMON_OPTS,
        {"json", no_argument, NULL, 'j'},
        {"stale", required_argument, NULL, 's'},
        {NULL, 0, NULL, 0},
    };
    int c, json = 0;
    long long stale = 30;
    while ((c = getopt_long(argc, argv, TOOL_COMMON_SHORT, opts, NULL)) != -1) {
        if (c == 'h') {
            help();
            return EXIT_OK;
        } else if (c == 'j') {
            json = 1;
        } else if (c == 's') {
            if (tool_parse_int(t, "--stale", optarg, 86400, &stale))
                return EXIT_USAGE;
            if (stale == 0)
                return tool_usage(t, "--stale: must be at least 1");
        } else if (tool_common_opt(t, c, optarg)) {
            return EXIT_USAGE;
        }
    }
    if (optind < argc)
        return tool_usage(t, "unexpected argument \"%s\"", argv[optind]);
    int rc = tool_connect(t, TOOL_MIN_VERSION);
    if (rc)
        return rc;
    tool_worker *w;
    size_t n;
    rc = tool_workers_read(t, (int)stale, &w, &n);
    if (rc)
        return rc;
    if (json)
        tool_workers_json(stdout, w, n);
    else
        table(stdout, w, n);
    tool_workers_free(w, n);
    return EXIT_OK;
}
