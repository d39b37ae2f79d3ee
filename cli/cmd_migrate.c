/*
 * cmd_migrate.c: pqmq migrate: install or upgrade the queue's schema, say
 * where it stands (--status) or print the SQL that would run (--sql), for
 * people who apply SQL with their own tooling.
 */
#include <stdlib.h>
#include <string.h>

#include "pqmq-tool.h"

static void help(void)
{
    printf("usage: pqmq migrate [--status | --sql]\n\n"
           "Creates or upgrades the queue's schema (safe to repeat and to run\n"
           "concurrently).\n\n"
           "      --status        the schema's recorded version, and what migrate would do\n"
           "      --sql           print the SQL that migrate would run instead of\n"
           "                      running it (apply with: psql -1 -f FILE)\n%s",
           tool_common_help);
}

/* The newest recorded version and when it was applied (0 and NULL when the
 * schema has no queue). Caller PQclear's *r. */
static int recorded(tool *t, PGresult **r, int *version, const char **at)
{
    *r = tool_query(
        t,
        "SELECT pg_catalog.to_regclass(pg_catalog.quote_ident(pg_catalog.current_schema())"
        " OPERATOR(pg_catalog.||) '.mq_schema_migrations') IS NOT NULL",
        0, NULL);
    if (!*r)
        return EXIT_ERR;
    int exists = PQgetvalue(*r, 0, 0)[0] == 't';
    PQclear(*r);
    *r = tool_query(t,
                    exists ? "SELECT version, applied_at FROM mq_schema_migrations "
                             "ORDER BY version DESC LIMIT 1"
                           : "SELECT 0, NULL::timestamptz",
                    0, NULL);
    if (!*r)
        return EXIT_ERR;
    *version = PQntuples(*r) ? atoi(PQgetvalue(*r, 0, 0)) : 0;
    *at = PQntuples(*r) && !PQgetisnull(*r, 0, 1) ? PQgetvalue(*r, 0, 1) : NULL;
    return EXIT_OK;
}

static int status(int have, const char *at, const char *schema)
{
    int want = pqmq_schema_version();
    printf("schema \"%s\"\n", schema);
    if (have == want)
        printf("  version %d (pqmq %s), applied %s: up to date\n", have, PACKAGE_VERSION,
               at ? at : "?");
    else if (have > want)
        printf("  version %d, applied %s: newer than this pqmq (version %d)\n", have,
               at ? at : "?", want);
    else if (have)
        printf("  version %d, applied %s: pending upgrade to version %d (pqmq %s)\n", have,
               at ? at : "?", want, PACKAGE_VERSION);
    else
        printf("  no queue: pending install of version %d (pqmq %s)\n", want, PACKAGE_VERSION);
    return EXIT_OK;
}

static int print_sql(tool *t, int have, const char *schema)
{
    if (have == pqmq_schema_version()) {
        fprintf(stderr, "pqmq migrate: schema \"%s\" is up to date (version %d)\n", schema,
                have);
        return EXIT_OK;
    }
    char *ident = PQescapeIdentifier(t->conn, schema, strlen(schema));
    char *lit = ident ? PQescapeLiteral(t->conn, ident, strlen(ident)) : NULL;
    if (!lit) {
        PQfreemem(ident);
        return tool_err(t, "out of memory");
    }
    printf("-- pqmq %s (schema version %d) for schema %s; apply in one transaction\n"
           "-- (psql -1 -f FILE). The functions pin the search_path set here.\n"
           "SELECT pg_catalog.pg_advisory_xact_lock(1886482797);\n"
           "SELECT pg_catalog.set_config('search_path', %s, true);\n"
           "-- Function bodies name functions of files further down.\n"
           "SET LOCAL check_function_bodies = off;\n",
           PACKAGE_VERSION, pqmq_schema_version(), ident, lit);
    const char *name, *sql;
    for (size_t i = 0; pqmq_migration_info(i, NULL, &name, &sql) == PQMQ_OK; i++)
        printf("\n-- %s\n%s", name, sql);
    PQfreemem(ident);
    PQfreemem(lit);
    return EXIT_OK;
}

int cmd_migrate(tool *t, int argc, char **argv)
{
    static const struct option opts[] = {
        TOOL_COMMON_OPTS,
        {"status", no_argument, NULL, 's'},
        {"sql", no_argument, NULL, 'q'},
        {NULL, 0, NULL, 0},
    };
    int mode = 0, c;
    while ((c = getopt_long(argc, argv, TOOL_COMMON_SHORT, opts, NULL)) != -1) {
        if (c == 'h') {
            help();
            return EXIT_OK;
        } else if (c == 's' || c == 'q') {
            if (mode && mode != c)
                return tool_usage(t, "--status and --sql do not go together");
            mode = c;
        } else if (tool_common_opt(t, c, optarg)) {
            return EXIT_USAGE;
        }
    }
    if (optind < argc)
        return tool_usage(t, "unexpected argument \"%s\"", argv[optind]);
    /* A schema without a queue is what migrate is for: no check. */
    int rc = tool_connect(t, -1);
    if (rc)
        return rc;
    char *schema = tool_current_schema(t);
    if (!schema)
        return t->schema ? tool_err(t, "schema \"%s\" does not exist", t->schema)
                         : tool_err(t, "no schema on the search_path (use --schema)");
    PGresult *r = NULL;
    int have = 0;
    const char *at = NULL;
    if (mode && recorded(t, &r, &have, &at) != EXIT_OK) {
        PQclear(r);
        free(schema);
        return EXIT_ERR;
    }
    if (mode == 's') {
        rc = status(have, at, schema);
    } else if (mode == 'q') {
        rc = print_sql(t, have, schema);
    } else if (pqmq_migrate(t->client) != PQMQ_OK) {
        rc = tool_err(t, "%s", tool_first_line(pqmq_errmsg(t->client)));
    } else {
        printf("schema \"%s\" is at version %d\n", schema, pqmq_schema_version());
        rc = EXIT_OK;
    }
    PQclear(r);
    free(schema);
    return rc;
}
