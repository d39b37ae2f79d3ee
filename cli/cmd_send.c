/*
 * cmd_send.c: pqmq send, one message from the command line, for scripts
 * and smoke tests.
 */
#include <stdlib.h>
#include <string.h>

#include "pqmq-tool.h"

static void help(void)
{
    printf("usage: pqmq send [OPTION...] CHANNEL NAME [JSON|-]\n\n"
           "Inserts one message named NAME on CHANNEL with the JSON payload given\n"
           "(or read from standard input for '-'; none when left out) and prints its id.\n\n"
           "  -a, --args ARGS     the channel's arguments (its chain, when ordered)\n"
           "      --ordered       delivered after the earlier ordered messages of the chain\n"
           "      --delay MS      not before MS milliseconds from now\n"
           "      --retries N     deliveries after the first that a failure may cause\n"
           "                      (default 4)\n"
           "      --backoff MS    the first lease and retry delay (default 1000)\n"
           "  -p, --priority N    0..32767 (default 0, the lowest): among a channel's ready\n"
           "                      messages, higher priorities are delivered first\n"
           "      --key KEY       a unique key: while a live message of CHANNEL holds it,\n"
           "                      none is inserted and its id is printed (\"kept\" on stderr)\n"
           "      --replace       with --key: give a holder that has not started this\n"
           "                      payload and delay (\"replaced\" on stderr)\n%s",
           tool_common_help);
}

/* All of standard input, NUL-terminated; NULL if memory ran out. */
static char *read_all(FILE *f)
{
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        len += fread(buf + len, 1, cap - len - 1, f);
        if (len < cap - 1)
            break;
        char *more = realloc(buf, cap * 2);
        if (!more) {
            free(buf);
            return NULL;
        }
        buf = more;
        cap *= 2;
    }
    if (buf)
        buf[len] = '\0';
    return buf;
}

int cmd_send(tool *t, int argc, char **argv)
{
    static const struct option opts[] = {
        TOOL_COMMON_OPTS,
        {"args", required_argument, NULL, 'a'},
        {"ordered", no_argument, NULL, 'o'},
        {"delay", required_argument, NULL, 'D'},
        {"retries", required_argument, NULL, 'r'},
        {"backoff", required_argument, NULL, 'b'},
        {"key", required_argument, NULL, 'k'},
        {"replace", no_argument, NULL, 'R'},
        {"priority", required_argument, NULL, 'p'},
        {NULL, 0, NULL, 0},
    };
    const char *args = NULL, *key = NULL;
    long long delay = 0, retries = 4, backoff = 1000, priority = 0;
    int ordered = 0, replace = 0, c;
    while ((c = getopt_long(argc, argv, TOOL_COMMON_SHORT "a:p:", opts, NULL)) != -1) {
        int bad = 0;
        if (c == 'h') {
            help();
            return EXIT_OK;
        } else if (c == 'a') {
            args = optarg;
        } else if (c == 'o') {
            ordered = 1;
        } else if (c == 'k') {
            key = optarg;
        } else if (c == 'R') {
            replace = 1;
        } else if (c == 'D') {
            bad = tool_parse_int(t, "--delay", optarg, PQMQ_MAX_DURATION_MS, &delay);
        } else if (c == 'r') {
            bad = tool_parse_int(t, "--retries", optarg, 2147483646, &retries);
        } else if (c == 'b') {
            bad = tool_parse_range(t, "--backoff", optarg, 1, PQMQ_MAX_DURATION_MS, &backoff);
        } else if (c == 'p') {
            bad = tool_parse_int(t, "--priority", optarg, PQMQ_MAX_PRIORITY, &priority);
        } else {
            bad = tool_common_opt(t, c, optarg);
        }
        if (bad)
            return EXIT_USAGE;
    }
    int npos = argc - optind;
    if (npos < 2 || npos > 3)
        return tool_usage(t, "expected CHANNEL NAME [JSON|-] (try 'pqmq send --help')");
    const char *channel = argv[optind], *name = argv[optind + 1];
    if (!*channel)
        return tool_usage(t, "the channel name is empty");
    if (replace && !key)
        return tool_usage(t, "--replace needs --key");
    char *json = NULL;
    if (npos == 3) {
        json = strcmp(argv[optind + 2], "-") == 0 ? read_all(stdin) : strdup(argv[optind + 2]);
        if (!json)
            return tool_err(t, "out of memory");
    }
    /* Unique keys came with schema version 12. */
    int rc = tool_connect(t, TOOL_MIN_VERSION);
    pqmq_msg *m = rc ? NULL : pqmq_msg_new();
    if (!rc && !m)
        rc = tool_err(t, "out of memory");
    if (!rc) {
        int e = pqmq_msg_set_channel(m, channel, args);
        e = e ? e : pqmq_msg_set_name(m, name);
        e = e ? e : pqmq_msg_set_json(m, json);
        e = e ? e : pqmq_msg_set_ordered(m, ordered);
        e = e ? e : pqmq_msg_set_delay(m, delay);
        e = e ? e : pqmq_msg_set_retries(m, (int)retries);
        e = e ? e : pqmq_msg_set_backoff(m, backoff);
        e = e ? e : pqmq_msg_set_unique_key(m, key);
        e = e ? e : pqmq_msg_set_priority(m, (int)priority);
        if (e)
            rc = tool_err(t, "out of memory");
    }
    pqmq_insert_result res = {PQMQ_INSERTED, {0}};
    if (!rc && !key)
        pqmq_msg_id(m, res.id);
    if (!rc && (key ? pqmq_insert_unique(t->client, &m, 1,
                                         replace ? PQMQ_KEY_REPLACE : PQMQ_KEY_KEEP, 0, &res)
                    : pqmq_insert(t->client, &m, 1)) != PQMQ_OK)
        rc = tool_err(t, "%s", tool_lib_error(pqmq_errmsg(t->client)));
    if (!rc) {
        char ids[37];
        uuid_unparse_lower(res.id, ids);
        printf("%s\n", ids);
        /* The id is the holder's: say so where scripts do not parse. */
        if (res.outcome != PQMQ_INSERTED) {
            fprintf(stderr, "pqmq send: %s: key \"",
                    res.outcome == PQMQ_KEPT ? "kept" : "replaced");
            out_display(stderr, key);
            fprintf(stderr, "\" is held by %s\n", ids);
        }
    }
    pqmq_msg_free(m);
    free(json);
    return rc;
}
