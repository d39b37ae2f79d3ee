/*
 * cmd_peek.c: pqmq peek, the next messages of a channel in delivery order
 * (mq_peek), without claiming them.
 */
#include <stdlib.h>
#include <string.h>

#include "pqmq-tool.h"

static void help(void)
{
    printf("usage: pqmq peek [-n N] CHANNEL [ARGS]\n\n"
           "The next N messages of CHANNEL (of its chain ARGS when given) in the order\n"
           "polls would deliver them, without claiming them: ready and scheduled chain\n"
           "heads and unordered messages first, then the ordered messages behind them.\n"
           "Payloads: JSON pretty-printed, msgpack decoded to JSON, other bytes as hex.\n"
           "Dead messages are not shown (see pqmq dead).\n\n"
           "  -n, --max N         how many (default 10, at most 10000)\n%s",
           tool_common_help);
}

/* Exists the channel at all? Prints the error when not. */
static int known_channel(tool *t, const char *channel)
{
    char *names[1] = {(char *)channel};
    tool_figures *rows;
    size_t count;
    int rc = tool_figures_read(t, names, 1, &rows, &count);
    if (!rc)
        rc = tool_figures_check_named(t, names, 1, rows, count);
    tool_figures_free(rows, count);
    return rc;
}

static void print_row(PGresult *r, int i)
{
    printf("%s  %s  %s", PQgetvalue(r, i, 0), PQgetvalue(r, i, 3),
           PQgetisnull(r, i, 2) ? "" : "name ");
    if (!PQgetisnull(r, i, 2))
        out_display(stdout, PQgetvalue(r, i, 2));
    printf("  args ");
    out_display(stdout, PQgetvalue(r, i, 1));
    if (!*PQgetvalue(r, i, 1))
        printf("\"\"");
    printf("\n    deliveries %s, %s more possible%s", PQgetvalue(r, i, 5), PQgetvalue(r, i, 6),
           PQgetvalue(r, i, 7)[0] == 't' ? ", ordered" : "");
    if (strcmp(PQgetvalue(r, i, 3), "ready") != 0 && strcmp(PQgetvalue(r, i, 3), "waiting"))
        printf(", ready in %s", PQgetvalue(r, i, 4));
    putchar('\n');
    if (!PQgetisnull(r, i, 10)) {
        printf("    last error: ");
        out_display(stdout, PQgetvalue(r, i, 10));
        putchar('\n');
    }
    size_t len = 0;
    unsigned char *bytes = NULL;
    if (!PQgetisnull(r, i, 9))
        bytes = PQunescapeBytea((const unsigned char *)PQgetvalue(r, i, 9), &len);
    out_payload(stdout, PQgetisnull(r, i, 8) ? NULL : PQgetvalue(r, i, 8), bytes ? bytes : NULL,
                len, 4);
    PQfreemem(bytes);
}

int cmd_peek(tool *t, int argc, char **argv)
{
    static const struct option opts[] = {
        TOOL_COMMON_OPTS,
        {"max", required_argument, NULL, 'n'},
        {NULL, 0, NULL, 0},
    };
    long long max = 10;
    int c;
    while ((c = getopt_long(argc, argv, TOOL_COMMON_SHORT "n:", opts, NULL)) != -1) {
        if (c == 'h') {
            help();
            return EXIT_OK;
        } else if (c == 'n') {
            if (tool_parse_rows(t, optarg, &max))
                return EXIT_USAGE;
        } else if (tool_common_opt(t, c, optarg)) {
            return EXIT_USAGE;
        }
    }
    int npos = argc - optind;
    if (npos < 1 || npos > 2)
        return tool_usage(t, "expected CHANNEL [ARGS] (try 'pqmq peek --help')");
    const char *channel = argv[optind];
    const char *args = npos == 2 ? argv[optind + 1] : NULL;
    int rc = tool_connect(t, TOOL_MIN_VERSION);
    if (rc)
        return rc;
    rc = known_channel(t, channel);
    if (rc)
        return rc;
    char maxs[32];
    snprintf(maxs, sizeof maxs, "%lld", max);
    const char *p[3] = {channel, args, maxs};
    PGresult *r = tool_query(
        t,
        "SELECT p.id, p.channel_args, p.name, p.state, "
        "date_trunc('milliseconds', p.ready_in), p.attempt, p.attempts_left, p.is_ordered, "
        "pg_catalog.jsonb_pretty(p.payload_json::jsonb), p.payload_bytes, p.last_error "
        "FROM mq_peek($1, $2, $3::int) p",
        3, p);
    if (!r)
        return EXIT_ERR;
    for (int i = 0; i < PQntuples(r); i++)
        print_row(r, i);
    if (PQntuples(r) == 0)
        fprintf(stderr, "pqmq peek: no message to deliver on this channel%s\n",
                args ? " and chain" : "");
    PQclear(r);
    return EXIT_OK;
}
