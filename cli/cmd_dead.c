/*
 * cmd_dead.c: the dead-letter commands: pqmq dead, retry, skip and purge.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pqmq-tool.h"

/* Fails when a named channel has never had a message. */
static int check_channels(tool *t, char *const *channels, size_t n)
{
    if (n == 0)
        return 0;
    tool_figures *rows;
    size_t count;
    int rc = tool_figures_read(t, channels, n, &rows, &count);
    if (!rc)
        rc = tool_figures_check_named(t, channels, n, rows, count);
    tool_figures_free(rows, count);
    return rc;
}

static int parse_common_only(tool *t, int argc, char **argv, void (*help)(void))
{
    static const struct option opts[] = {TOOL_COMMON_OPTS, {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, TOOL_COMMON_SHORT, opts, NULL)) != -1) {
        if (c == 'h') {
            help();
            return -1;
        } else if (tool_common_opt(t, c, optarg)) {
            return EXIT_USAGE;
        }
    }
    return 0;
}

/* ---- dead ---------------------------------------------------------------- */

static void dead_help(void)
{
    printf("usage: pqmq dead [--json] [-n N] [CHANNEL...]\n\n"
           "Dead messages (out of attempts, never completed), oldest first: id,\n"
           "channel, args, name, deliveries made, whether it still blocks its ordered\n"
           "chain, and the last error. 'pqmq retry' or 'pqmq skip' moves them on;\n"
           "'pqmq show ID' tells one message's story (every failed attempt).\n\n"
           "  -n, --max N         at most N (default 100, at most 10000)\n"
           "      --json          one JSON object, for scripts\n%s",
           tool_common_help);
}

static const char *const dead_heads[] = {"ID",         "CHANNEL",  "ARGS",      "NAME",
                                         "DELIVERIES", "BLOCKING", "LAST_ERROR"};

/* A dead message's text columns, in dead_heads' order (deliveries and
 * blocking apart). */
static void dead_texts(const pqmq_job *j, char ids[37], const char *text[4])
{
    uuid_t id;
    pqmq_job_id(j, id);
    uuid_unparse_lower(id, ids);
    text[0] = pqmq_job_channel(j);
    text[1] = pqmq_job_args(j);
    text[2] = pqmq_job_name(j);
    text[3] = pqmq_job_last_error(j) ? pqmq_job_last_error(j) : "";
}

/* Columns padded to their widest value (as pqmq status prints), the last
 * error last and unpadded: it may be long. */
static void dead_table(FILE *f, pqmq_batch *b)
{
    size_t count = pqmq_batch_count(b), w[3];
    for (int k = 0; k < 3; k++)
        w[k] = strlen(dead_heads[k + 1]);
    for (size_t i = 0; i < count; i++) {
        char ids[37];
        const char *text[4];
        dead_texts(pqmq_batch_job(b, i), ids, text);
        for (int k = 0; k < 3; k++)
            if (out_display_width(text[k]) > w[k])
                w[k] = out_display_width(text[k]);
    }
    fprintf(f, "%-36s %-*s %-*s %-*s %10s %-8s %s\n", dead_heads[0], (int)w[0], dead_heads[1],
            (int)w[1], dead_heads[2], (int)w[2], dead_heads[3], dead_heads[4], dead_heads[5],
            dead_heads[6]);
    for (size_t i = 0; i < count; i++) {
        const pqmq_job *j = pqmq_batch_job(b, i);
        char ids[37];
        const char *text[4];
        dead_texts(j, ids, text);
        fprintf(f, "%s", ids);
        for (int k = 0; k < 3; k++) {
            fputc(' ', f);
            out_display(f, text[k]);
            fprintf(f, "%*s", (int)(w[k] - out_display_width(text[k])), "");
        }
        /* No padding after the last value: no trailing blanks. */
        fprintf(f, " %10d %-*s", pqmq_job_attempt(j), text[3][0] ? 8 : 0,
                pqmq_job_blocking(j) ? "yes" : "no");
        if (text[3][0]) {
            fputc(' ', f);
            out_display(f, text[3]);
        }
        fputc('\n', f);
    }
}

static void dead_json(FILE *f, pqmq_batch *b)
{
    size_t count = pqmq_batch_count(b);
    fputs("{\"dead\": [", f);
    for (size_t i = 0; i < count; i++) {
        const pqmq_job *j = pqmq_batch_job(b, i);
        char ids[37];
        const char *text[4];
        dead_texts(j, ids, text);
        fprintf(f, "%s{\"id\": \"%s\", \"channel\": ", i ? ",\n  " : "\n  ", ids);
        out_json_str(f, text[0], strlen(text[0]));
        fputs(", \"args\": ", f);
        out_json_str(f, text[1], strlen(text[1]));
        fputs(", \"name\": ", f);
        out_json_str(f, text[2], strlen(text[2]));
        fprintf(f,
                ", \"deliveries\": %d, \"blocking\": %s, \"last_error\": ", pqmq_job_attempt(j),
                pqmq_job_blocking(j) ? "true" : "false");
        if (pqmq_job_last_error(j))
            out_json_str(f, text[3], strlen(text[3]));
        else
            fputs("null", f);
        fputc('}', f);
    }
    fprintf(f, "%s], \"count\": %zu}\n", count ? "\n " : "", count);
}

int cmd_dead(tool *t, int argc, char **argv)
{
    static const struct option opts[] = {
        TOOL_COMMON_OPTS,
        {"max", required_argument, NULL, 'n'},
        {"json", no_argument, NULL, 'j'},
        {NULL, 0, NULL, 0},
    };
    long long max = 100;
    int c, json = 0;
    while ((c = getopt_long(argc, argv, TOOL_COMMON_SHORT "n:", opts, NULL)) != -1) {
        if (c == 'h') {
            dead_help();
            return EXIT_OK;
        } else if (c == 'n') {
            if (tool_parse_rows(t, optarg, &max))
                return EXIT_USAGE;
        } else if (c == 'j') {
            json = 1;
        } else if (tool_common_opt(t, c, optarg)) {
            return EXIT_USAGE;
        }
    }
    char **channels = argv + optind;
    size_t n = (size_t)(argc - optind);
    int rc = tool_connect(t, TOOL_MIN_VERSION);
    if (!rc)
        rc = check_channels(t, channels, n);
    if (rc)
        return rc;
    pqmq_batch *b = NULL;
    rc =
        pqmq_dead_letters(t->client, n ? (const char *const *)channels : NULL, n, (int)max, &b);
    if (rc)
        return tool_err(t, "%s", tool_lib_error(pqmq_errmsg(t->client)));
    if (json)
        dead_json(stdout, b);
    else if (pqmq_batch_count(b))
        dead_table(stdout, b);
    else
        fprintf(stderr, "pqmq dead: no dead messages\n");
    pqmq_batch_free(b);
    return EXIT_OK;
}

/* ---- retry --------------------------------------------------------------- */

static void retry_help(void)
{
    printf("usage: pqmq retry [--retries N] ID...\n"
           "       pqmq retry [--retries N] --dead [--channel CHANNEL]\n\n"
           "Gives dead messages N more retries (N + 1 deliveries, default N = 0),\n"
           "ready now; a dead chain head is delivered again in its place. --dead\n"
           "retries every dead message (of CHANNEL only, with --channel).\n\n"
           "      --retries N     retries after the next delivery (default 0)\n"
           "      --dead          every dead message\n"
           "      --channel C     with --dead: only channel C's\n%s",
           tool_common_help);
}

static int retry_all(tool *t, const char *channel, int retries)
{
    const char *chans[1] = {channel};
    size_t total = 0;
    for (;;) {
        pqmq_batch *b = NULL;
        int rc = pqmq_dead_letters(t->client, channel ? chans : NULL, channel ? 1 : 0,
                                   PQMQ_MAX_BATCH, &b);
        if (rc)
            return tool_err(t, "%s", tool_lib_error(pqmq_errmsg(t->client)));
        size_t n = pqmq_batch_count(b);
        uuid_t *ids = calloc(n ? n : 1, sizeof *ids);
        if (!ids) {
            pqmq_batch_free(b);
            return tool_err(t, "out of memory");
        }
        for (size_t i = 0; i < n; i++)
            pqmq_job_id(pqmq_batch_job(b, i), ids[i]);
        pqmq_batch_free(b);
        size_t done = 0;
        rc = n ? pqmq_retry(t->client, ids, n, retries, &done) : 0;
        free(ids);
        if (rc)
            return tool_err(t, "%s", tool_lib_error(pqmq_errmsg(t->client)));
        total += done;
        /* A full page may have more behind it; a short one was the last. */
        if (n < PQMQ_MAX_BATCH || done == 0)
            break;
    }
    printf("retried %zu dead message%s\n", total, total == 1 ? "" : "s");
    return EXIT_OK;
}

int cmd_retry(tool *t, int argc, char **argv)
{
    static const struct option opts[] = {
        TOOL_COMMON_OPTS,
        {"retries", required_argument, NULL, 'r'},
        {"dead", no_argument, NULL, 'D'},
        {"channel", required_argument, NULL, 'c'},
        {NULL, 0, NULL, 0},
    };
    long long retries = 0;
    int all = 0, c;
    const char *channel = NULL;
    while ((c = getopt_long(argc, argv, TOOL_COMMON_SHORT, opts, NULL)) != -1) {
        if (c == 'h') {
            retry_help();
            return EXIT_OK;
        } else if (c == 'r') {
            if (tool_parse_int(t, "--retries", optarg, 2147483646, &retries))
                return EXIT_USAGE;
        } else if (c == 'D') {
            all = 1;
        } else if (c == 'c') {
            channel = optarg;
        } else if (tool_common_opt(t, c, optarg)) {
            return EXIT_USAGE;
        }
    }
    int nids = argc - optind;
    if (all && nids > 0)
        return tool_usage(t, "give either IDs or --dead, not both");
    if (!all && nids == 0)
        return tool_usage(t, "expected ID... or --dead (try 'pqmq retry --help')");
    if (channel && !all)
        return tool_usage(t, "--channel goes with --dead");
    uuid_t *ids = calloc(nids ? (size_t)nids : 1, sizeof *ids);
    if (!ids)
        return tool_err(t, "out of memory");
    int rc = 0;
    for (int i = 0; i < nids && !rc; i++)
        rc = tool_parse_id(t, argv[optind + i], ids[i]);
    if (!rc)
        rc = tool_connect(t, TOOL_MIN_VERSION);
    if (!rc && all) {
        char *names[1] = {(char *)channel};
        rc = check_channels(t, names, channel ? 1 : 0);
        if (!rc)
            rc = retry_all(t, channel, (int)retries);
    }
    /* One id at a time, so that each id that was not dead is named. */
    for (int i = 0; !rc && !all && i < nids; i++) {
        size_t done = 0;
        if (pqmq_retry(t->client, &ids[i], 1, (int)retries, &done)) {
            rc = tool_err(t, "%s", tool_lib_error(pqmq_errmsg(t->client)));
        } else if (done == 0) {
            rc = tool_err(t, "%s: no dead message with this id", argv[optind + i]);
        } else {
            printf("retried %s\n", argv[optind + i]);
        }
    }
    free(ids);
    return rc;
}

/* ---- skip ---------------------------------------------------------------- */

static void skip_help(void)
{
    printf("usage: pqmq skip ID...\n\n"
           "Moves ordered messages out of their chains into the dead letters and\n"
           "releases the next message of each chain: how a chain blocked by a dead\n"
           "head moves on.\n\n%s",
           tool_common_help);
}

int cmd_skip(tool *t, int argc, char **argv)
{
    int rc = parse_common_only(t, argc, argv, skip_help);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    int nids = argc - optind;
    if (nids == 0)
        return tool_usage(t, "expected ID... (try 'pqmq skip --help')");
    uuid_t *ids = calloc((size_t)nids, sizeof *ids);
    if (!ids)
        return tool_err(t, "out of memory");
    for (int i = 0; i < nids && !rc; i++)
        rc = tool_parse_id(t, argv[optind + i], ids[i]);
    if (!rc)
        rc = tool_connect(t, TOOL_MIN_VERSION);
    for (int i = 0; !rc && i < nids; i++) {
        size_t done = 0;
        if (pqmq_skip(t->client, &ids[i], 1, &done))
            rc = tool_err(t, "%s", tool_lib_error(pqmq_errmsg(t->client)));
        else if (done == 0)
            rc =
                tool_err(t, "%s: no ordered message in a chain with this id", argv[optind + i]);
        else
            printf("skipped %s\n", argv[optind + i]);
    }
    free(ids);
    return rc;
}

/* ---- purge --------------------------------------------------------------- */

static void purge_help(void)
{
    printf("usage: pqmq purge --channel CHANNEL [--args ARGS] [--dead-only] [--yes]\n\n"
           "Deletes the messages of CHANNEL (of its chain ARGS only, with --args; its\n"
           "dead ones only, with --dead-only), whatever their state, and prints each\n"
           "one it removed (id, args, name, dead or live). No other channel is\n"
           "touched. On a terminal it asks first; otherwise --yes is required.\n\n"
           "      --channel C     the channel (required)\n"
           "      --args A        only the chain (channel, A)\n"
           "      --dead-only     only dead messages\n"
           "  -y, --yes           do not ask\n%s",
           tool_common_help);
}

static int confirm(const tool *t, const char *channel, const char *args, int dead_only,
                   const tool_figures *f)
{
    long long live = f->ready + f->in_flight + f->scheduled + f->uncommitted + f->waiting;
    fprintf(stderr, "Delete %s messages of channel \"", dead_only ? "the dead" : "all");
    out_display(stderr, channel);
    fputc('"', stderr);
    if (args) {
        fputs(" with args \"", stderr);
        out_display(stderr, args);
        fputc('"', stderr);
    }
    fprintf(stderr, " (the channel holds %lld live and %lld dead)? [y/N] ", live, f->dead);
    char line[64];
    if (!fgets(line, sizeof line, stdin) || (line[0] != 'y' && line[0] != 'Y')) {
        tool_err(t, "nothing deleted");
        return EXIT_ERR;
    }
    return 0;
}

int cmd_purge(tool *t, int argc, char **argv)
{
    static const struct option opts[] = {
        TOOL_COMMON_OPTS,
        {"channel", required_argument, NULL, 'c'},
        {"args", required_argument, NULL, 'a'},
        {"dead-only", no_argument, NULL, 'D'},
        {"yes", no_argument, NULL, 'y'},
        {NULL, 0, NULL, 0},
    };
    const char *channel = NULL, *args = NULL;
    int dead_only = 0, yes = 0, c;
    while ((c = getopt_long(argc, argv, TOOL_COMMON_SHORT "y", opts, NULL)) != -1) {
        if (c == 'h') {
            purge_help();
            return EXIT_OK;
        } else if (c == 'c') {
            channel = optarg;
        } else if (c == 'a') {
            args = optarg;
        } else if (c == 'D') {
            dead_only = 1;
        } else if (c == 'y') {
            yes = 1;
        } else if (tool_common_opt(t, c, optarg)) {
            return EXIT_USAGE;
        }
    }
    if (optind < argc)
        return tool_usage(t, "unexpected argument \"%s\" (the channel goes with --channel)",
                          argv[optind]);
    if (!channel || !*channel)
        return tool_usage(t, "--channel is required (try 'pqmq purge --help')");
    if (!yes && !isatty(STDIN_FILENO))
        return tool_usage(t, "not on a terminal: add --yes to delete without asking");
    int rc = tool_connect(t, TOOL_MIN_VERSION);
    if (rc)
        return rc;
    char *names[1] = {(char *)channel};
    tool_figures *rows;
    size_t count;
    rc = tool_figures_read(t, names, 1, &rows, &count);
    if (!rc)
        rc = tool_figures_check_named(t, names, 1, rows, count);
    if (!rc && !yes)
        rc = confirm(t, channel, args, dead_only, &rows[0]);
    tool_figures_free(rows, count);
    if (rc)
        return rc;
    const char *p[3] = {channel, args, dead_only ? "true" : "false"};
    PGresult *r = tool_query(t,
                             "SELECT id, channel_args, name, was_dead "
                             "FROM mq_purge($1, $2, $3::boolean)",
                             3, p);
    if (!r)
        return EXIT_ERR;
    int n = PQntuples(r);
    for (int i = 0; i < n; i++) {
        printf("%s\t", PQgetvalue(r, i, 0));
        out_display(stdout, PQgetvalue(r, i, 1));
        putchar('\t');
        out_display(stdout, PQgetvalue(r, i, 2));
        printf("\t%s\n", PQgetvalue(r, i, 3)[0] == 't' ? "dead" : "live");
    }
    PQclear(r);
    fprintf(stderr, "pqmq purge: removed %d message%s from channel \"", n, n == 1 ? "" : "s");
    out_display(stderr, channel);
    fputs("\"\n", stderr);
    return EXIT_OK;
}
