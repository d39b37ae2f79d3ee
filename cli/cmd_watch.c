/*
 * cmd_watch.c: pqmq watch, the status table redrawn when the queue changes.
 *
 * It LISTENs on "mq" (new ready messages: inserts, commits, retries,
 * released chains) and "mq_dead" and sleeps in poll(2) on the connection's
 * socket, so an idle queue costs nothing. A burst of notifications is one
 * redraw (at most one per --min-gap), and a redraw also happens every
 * --interval seconds, because completions, leases running out and delays
 * ending send no notification.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pqmq-tool.h"

static void help(void)
{
    printf("usage: pqmq watch [--interval SECONDS] [--count N] [CHANNEL...]\n\n"
           "The table of 'pqmq status', redrawn when the queue notifies a change (and\n"
           "every --interval seconds), with REMOVED/S: messages completed or purged\n"
           "per second since the previous redraw. Stop it with Ctrl-C.\n\n"
           "      --interval S    redraw at least every S seconds (default 5)\n"
           "      --count N       stop after N redraws, N >= 1 (default: never)\n%s",
           tool_common_help);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Waits until a notification arrives or deadline passes; drains them all.
 * Returns 1 notified, 0 timed out, -1 connection error. */
static int wait_notify(PGconn *conn, double deadline)
{
    for (;;) {
        if (!PQconsumeInput(conn))
            return -1;
        int got = 0;
        PGnotify *n;
        while ((n = PQnotifies(conn)) != NULL) {
            got = 1;
            PQfreemem(n);
        }
        if (got)
            return 1;
        double left = deadline - now_s();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = PQsocket(conn), .events = POLLIN};
        int rc = poll(&p, 1, (int)(left * 1000) + 1);
        if (rc < 0 && errno != EINTR)
            return -1;
    }
}

static int draw(tool *t, char **channels, size_t n, tool_figures **prev, size_t *prev_n,
                double *prev_at)
{
    tool_figures *rows;
    size_t count;
    int rc = tool_figures_read(t, channels, n, &rows, &count);
    if (rc)
        return rc;
    double at = now_s();
    double *rates = calloc(count ? count : 1, sizeof *rates);
    if (!rates) {
        tool_figures_free(rows, count);
        return tool_err(t, "out of memory");
    }
    for (size_t i = 0; i < count && *prev; i++)
        for (size_t j = 0; j < *prev_n; j++)
            if (strcmp((*prev)[j].channel, rows[i].channel) == 0 && at > *prev_at)
                rates[i] = (double)(rows[i].removed - (*prev)[j].removed) / (at - *prev_at);
    if (out_is_tty(stdout))
        fputs("\033[H\033[2J", stdout);
    time_t wall = time(NULL);
    char stamp[64];
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", localtime(&wall));
    printf("pqmq watch, %s\n", stamp);
    tool_figures_table(stdout, rows, count, rates);
    fflush(stdout);
    free(rates);
    tool_figures_free(*prev, *prev_n);
    *prev = rows;
    *prev_n = count;
    *prev_at = at;
    return 0;
}

int cmd_watch(tool *t, int argc, char **argv)
{
    static const struct option opts[] = {
        TOOL_COMMON_OPTS,
        {"interval", required_argument, NULL, 'i'},
        {"count", required_argument, NULL, 'c'},
        {NULL, 0, NULL, 0},
    };
    long long interval = 5, count = 0;
    int c;
    while ((c = getopt_long(argc, argv, TOOL_COMMON_SHORT, opts, NULL)) != -1) {
        if (c == 'h') {
            help();
            return EXIT_OK;
        } else if (c == 'i') {
            if (tool_parse_range(t, "--interval", optarg, 1, 86400, &interval))
                return EXIT_USAGE;
        } else if (c == 'c') {
            if (tool_parse_int(t, "--count", optarg, 1000000000, &count))
                return EXIT_USAGE;
            /* 0 would mean the default, never stop: not what it says. */
            if (count == 0)
                return tool_usage(t,
                                  "--count: must be at least 1 (leave it out to never stop)");
        } else if (tool_common_opt(t, c, optarg)) {
            return EXIT_USAGE;
        }
    }
    char **channels = argv + optind;
    size_t n = (size_t)(argc - optind);
    int rc = tool_connect(t, TOOL_MIN_VERSION);
    if (rc)
        return rc;
    PGresult *r = tool_query(t, "LISTEN mq", 0, NULL);
    PQclear(r);
    if (!r)
        return EXIT_ERR;
    r = tool_query(t, "LISTEN mq_dead", 0, NULL);
    PQclear(r);
    if (!r)
        return EXIT_ERR;

    tool_figures *prev = NULL;
    size_t prev_n = 0;
    double prev_at = 0;
    const double min_gap = 0.25; /* a burst of notifications: one redraw */
    for (long long done = 0; count == 0 || done < count; done++) {
        if (done > 0) {
            /* Notifications come between transactions, and a pooled server
             * connection must not wait inside one (tool_begin). */
            if ((rc = tool_commit(t)) != 0)
                break;
            int w = wait_notify(t->conn, now_s() + (double)interval);
            if (w < 0) {
                rc = tool_err(t, "lost the connection to the server: %s",
                              tool_first_line(PQerrorMessage(t->conn)));
                break;
            }
            if (w > 0) { /* let the burst finish, then drain what came meanwhile */
                struct timespec gap = {0, (long)(min_gap * 1e9)};
                nanosleep(&gap, NULL);
                wait_notify(t->conn, 0);
            }
        }
        if (done > 0 && (rc = tool_begin(t)) != 0)
            break;
        rc = draw(t, channels, n, &prev, &prev_n, &prev_at);
        if (rc)
            break;
        if (ferror(stdout) && tool_output_closed())
            break; /* nobody reads: stop, as if the last redraw was counted */
    }
    tool_figures_free(prev, prev_n);
    return rc;
}
