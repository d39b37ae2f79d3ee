/*
 * cmd_show.c: pqmq show, one message's story (mq_message, schema/story.sql):
 * its state, channel and chain, its attempts and their errors, and a
 * preview of its payload (mq_message_payload). pqmq serve's message page
 * reads the same JSON (tool_message_json).
 */
#include <stdlib.h>
#include <string.h>

#include "pqmq-tool.h"

static void help(void)
{
    printf("usage: pqmq show [--json] [--max-bytes N] [--no-payload] ID\n\n"
           "One message's story: its state (ready, in_flight, delayed, waiting in its\n"
           "chain, dead, uncommitted), channel and args, its place in its chain, when it\n"
           "was created and is ready, the attempts used and left, the last five failed\n"
           "attempts with their times and errors, and the start of its payload.\n"
           "A message that is completed or deleted is no longer there.\n\n"
           "      --json          one JSON object, for scripts\n"
           "      --max-bytes N   payload preview: at most N bytes (default 1024,\n"
           "                      at most 1048576)\n"
           "      --no-payload    no payload preview\n%s",
           tool_common_help);
}

const char tool_message_sql[] =
    "SELECT (pg_catalog.jsonb_build_object("
    "'id', m.id, 'state', m.state, 'channel', m.channel_name, 'args', m.channel_args, "
    "'name', m.name, 'ordered', m.ordered, 'chain_ahead', m.chain_ahead, "
    "'chain_head', m.chain_head, 'priority', m.priority, 'created_at', m.created_at, "
    "'ready_at', m.ready_at, 'dead_since', m.dead_since, "
    "'attempts_used', m.attempts_used, 'attempts_left', m.attempts_left, "
    "'last_error', m.last_error, 'history', COALESCE(m.history, '[]'::jsonb), "
    "'logged', m.logged) "
    "OPERATOR(pg_catalog.||) CASE WHEN $2::boolean THEN pg_catalog.jsonb_build_object("
    "'payload', (SELECT pg_catalog.to_jsonb(p) OPERATOR(pg_catalog.-) 'id' "
    "FROM mq_message_payload(m.id, $3::int) p)) ELSE '{}'::jsonb END)::text "
    "FROM mq_message($1::uuid) m";

int tool_message_json(tool *t, const char *id, int max_bytes, int with_payload, char **out)
{
    char maxs[16];
    snprintf(maxs, sizeof maxs, "%d", max_bytes);
    const char *p[3] = {id, with_payload ? "t" : "f", maxs};
    *out = NULL;
    PGresult *r = tool_query(t, tool_message_sql, 3, p);
    if (!r)
        return EXIT_ERR;
    if (PQntuples(r) == 1) {
        *out = strdup(PQgetvalue(r, 0, 0));
        if (!*out) {
            PQclear(r);
            return tool_err(t, "out of memory");
        }
    }
    PQclear(r);
    return EXIT_OK;
}

/* A value of r's row 0 for people ("-" for NULL). */
static void put_value(PGresult *r, int col)
{
    if (PQgetisnull(r, 0, col))
        fputs("-", stdout);
    else
        out_display(stdout, PQgetvalue(r, 0, col));
}

static int show_text(tool *t, const char *id, int max_bytes, int with_payload)
{
    const char *p[1] = {id};
    PGresult *r = tool_query(
        t,
        "SELECT m.id, m.state, m.channel_name, m.channel_args, m.name, m.ordered, "
        "m.chain_ahead, m.chain_head, m.priority, "
        "pg_catalog.date_trunc('milliseconds', m.created_at), "
        "pg_catalog.date_trunc('milliseconds', m.ready_at), "
        "pg_catalog.date_trunc('milliseconds', m.dead_since), m.attempts_used, "
        "m.attempts_left, m.last_error, m.logged, "
        "(SELECT pg_catalog.string_agg(pg_catalog.format('  attempt %s  %s  %s', "
        "e.v OPERATOR(pg_catalog.->>) 'attempt', "
        "pg_catalog.date_trunc('milliseconds', (e.v OPERATOR(pg_catalog.->>) "
        "'at')::timestamptz), "
        "e.v OPERATOR(pg_catalog.->>) 'error'), E'\\n' ORDER BY e.i) "
        "FROM pg_catalog.jsonb_array_elements(m.history) WITH ORDINALITY AS e(v, i)) "
        "FROM mq_message($1::uuid) m",
        1, p);
    if (!r)
        return EXIT_ERR;
    if (PQntuples(r) == 0) {
        PQclear(r);
        return tool_err(t, "no message %s (completed, deleted or never inserted)", id);
    }
    printf("message  %s\nstate    %s\nchannel  ", PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1));
    out_display(stdout, PQgetvalue(r, 0, 2));
    printf("\nargs     ");
    out_display(stdout, PQgetvalue(r, 0, 3));
    if (!*PQgetvalue(r, 0, 3))
        printf("\"\"");
    printf("\nname     ");
    put_value(r, 4);
    if (PQgetvalue(r, 0, 5)[0] == 't') {
        long ahead = strtol(PQgetvalue(r, 0, 6), NULL, 10);
        if (ahead == 0)
            printf("\nchain    ordered: the head of its chain");
        else
            printf("\nchain    ordered: %ld ahead of it, the head is %s", ahead,
                   PQgetvalue(r, 0, 7));
    } else {
        printf("\nchain    unordered");
    }
    printf("\npriority %s\ncreated  ", PQgetvalue(r, 0, 8));
    put_value(r, 9);
    printf("\nready at ");
    put_value(r, 10);
    if (!PQgetisnull(r, 0, 11)) {
        printf("\ndead     since ");
        put_value(r, 11);
    }
    printf("\nattempts %s used, %s left\nstored   %s\n", PQgetvalue(r, 0, 12),
           PQgetvalue(r, 0, 13), PQgetvalue(r, 0, 15)[0] == 't' ? "the log" : "mq_rows");
    if (!PQgetisnull(r, 0, 14)) {
        printf("last error: ");
        out_display(stdout, PQgetvalue(r, 0, 14));
        putchar('\n');
    }
    if (!PQgetisnull(r, 0, 16)) {
        /* One line per attempt: out_display would escape the newlines. */
        printf("failed attempts (the last five, oldest first):\n");
        char *lines = strdup(PQgetvalue(r, 0, 16));
        for (char *s = lines, *nl; s && *s; s = nl ? nl + 1 : NULL) {
            nl = strchr(s, '\n');
            if (nl)
                *nl = '\0';
            out_display(stdout, s);
            putchar('\n');
        }
        free(lines);
    }
    PQclear(r);
    if (!with_payload)
        return EXIT_OK;
    char maxs[16];
    snprintf(maxs, sizeof maxs, "%d", max_bytes);
    const char *pp[2] = {id, maxs};
    r = tool_query(t,
                   "SELECT p.json_bytes, p.json_preview, p.binary_bytes, p.binary_preview_hex, "
                   "p.truncated FROM mq_message_payload($1::uuid, $2::int) p",
                   2, pp);
    if (!r)
        return EXIT_ERR;
    if (PQntuples(r) == 1) {
        if (!PQgetisnull(r, 0, 0)) {
            printf("payload (JSON, %s bytes%s):\n    ", PQgetvalue(r, 0, 0),
                   strtol(PQgetvalue(r, 0, 0), NULL, 10) > max_bytes ? ", the start" : "");
            out_display(stdout, PQgetvalue(r, 0, 1));
            putchar('\n');
        }
        if (!PQgetisnull(r, 0, 2)) {
            printf("payload (%s bytes%s, as hex):\n    %s\n", PQgetvalue(r, 0, 2),
                   strtol(PQgetvalue(r, 0, 2), NULL, 10) > max_bytes ? ", the start" : "",
                   PQgetvalue(r, 0, 3));
        }
    }
    PQclear(r);
    return EXIT_OK;
}

int cmd_show(tool *t, int argc, char **argv)
{
    static const struct option opts[] = {
        TOOL_COMMON_OPTS,
        {"json", no_argument, NULL, 'j'},
        {"max-bytes", required_argument, NULL, 'm'},
        {"no-payload", no_argument, NULL, 'P'},
        {NULL, 0, NULL, 0},
    };
    long long max = 1024;
    int c, json = 0, payload = 1;
    while ((c = getopt_long(argc, argv, TOOL_COMMON_SHORT, opts, NULL)) != -1) {
        if (c == 'h') {
            help();
            return EXIT_OK;
        } else if (c == 'j') {
            json = 1;
        } else if (c == 'm') {
            if (tool_parse_range(t, "--max-bytes", optarg, 1, 1048576, &max))
                return EXIT_USAGE;
        } else if (c == 'P') {
            payload = 0;
        } else if (tool_common_opt(t, c, optarg)) {
            return EXIT_USAGE;
        }
    }
    if (argc - optind != 1)
        return tool_usage(t, "expected one message ID (try 'pqmq show --help')");
    uuid_t u;
    if (tool_parse_id(t, argv[optind], u))
        return EXIT_USAGE;
    char id[37];
    uuid_unparse_lower(u, id);
    int rc = tool_connect(t, TOOL_MIN_VERSION);
    if (rc)
        return rc;
    if (!json)
        return show_text(t, id, (int)max, payload);
    char *doc = NULL;
    rc = tool_message_json(t, id, (int)max, payload, &doc);
    if (rc)
        return rc;
    if (!doc)
        return tool_err(t, "no message %s (completed, deleted or never inserted)", id);
    printf("%s\n", doc);
    free(doc);
    return EXIT_OK;
}
