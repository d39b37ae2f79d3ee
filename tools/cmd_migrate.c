/*
 * cmd_migrate.c: pqmq migrate: apply the migrations this pqmq embeds, list
 * them (--status) or print the SQL that would run (--sql), for people who
 * apply migrations with their own tooling.
 */
#include <stdlib.h>
#include <string.h>

#include "pqmq-tool.h"

static void help(void)
{
    printf("usage: pqmq migrate [--status | --sql]\n\n"
           "Creates or upgrades the queue's schema (safe to repeat and to run\n"
           "concurrently).\n\n"
           "      --status        list the migrations: applied (when) or pending\n"
           "      --sql           print the SQL of the pending migrations instead of\n"
           "                      running it (apply with: psql -1 -f FILE)\n%s",
           tool_common_help);
}

/* Applied versions and their times, or none when the schema has no queue. */
static PGresult *applied(tool *t)
{
    PGresult *r = tool_query(
        t,
        "SELECT pg_catalog.to_regclass(pg_catalog.quote_ident(pg_catalog.current_schema())"
        " OPERATOR(pg_catalog.||) '.mq_schema_migrations') IS NOT NULL",
        0, NULL);
    if (!r)
        return NULL;
    int exists = PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    return tool_query(t,
                      exists ? "SELECT version, name, applied_at FROM mq_schema_migrations "
                               "ORDER BY version"
                             : "SELECT 0, '', now() WHERE false",
                      0, NULL);
}

static const char *applied_at(PGresult *r, int version)
{
    for (int i = 0; i < PQntuples(r); i++)
        if (atoi(PQgetvalue(r, i, 0)) == version)
            return PQgetvalue(r, i, 2);
    return NULL;
}

/* The newest applied version, 0 when none is recorded. */
static int newest(PGresult *r)
{
    int have = 0;
    for (int i = 0; i < PQntuples(r); i++)
        if (atoi(PQgetvalue(r, i, 0)) > have)
            have = atoi(PQgetvalue(r, i, 0));
    return have;
}

/* As pqmq_migrate decides: once a version is recorded, everything up to it
 * counts as applied (version 0 records nothing when it has nothing to do). */
static int is_pending(int version, int have)
{
    return !(have > 0 && version <= have);
}

static int status(PGresult *r, const char *schema)
{
    int v, have = newest(r);
    const char *name;
    printf("schema \"%s\"\n", schema);
    for (size_t i = 0; pqmq_migration_info(i, &v, &name, NULL) == PQMQ_OK; i++) {
        const char *at = applied_at(r, v);
        if (at)
            printf("  %-32s applied %s\n", name, at);
        else
            printf("  %-32s %s\n", name,
                   is_pending(v, have) ? "pending" : "not recorded (the schema is past it)");
    }
    for (int i = 0; i < PQntuples(r); i++)
        if (atoi(PQgetvalue(r, i, 0)) > pqmq_schema_version())
            printf("  %-32s applied %s (newer than this pqmq)\n", PQgetvalue(r, i, 1),
                   PQgetvalue(r, i, 2));
    return EXIT_OK;
}

static int print_sql(tool *t, PGresult *r, const char *schema)
{
    int have = newest(r), v;
    const char *name, *sql;
    char *ident = PQescapeIdentifier(t->conn, schema, strlen(schema));
    char *lit = ident ? PQescapeLiteral(t->conn, ident, strlen(ident)) : NULL;
    if (!lit) {
        PQfreemem(ident);
        return tool_err(t, "out of memory");
    }
    int pending = 0;
    for (size_t i = 0; pqmq_migration_info(i, &v, &name, &sql) == PQMQ_OK; i++) {
        if (!is_pending(v, have))
            continue;
        if (!pending++)
            printf("-- pqmq migrations for schema %s; apply in one transaction\n"
                   "-- (psql -1 -f FILE). The functions pin the search_path set here.\n"
                   "SELECT pg_catalog.pg_advisory_xact_lock(1886482797);\n"
                   "SELECT pg_catalog.set_config('search_path', %s, true);\n",
                   ident, lit);
        printf("\n-- %s\n%s", name, sql);
    }
    PQfreemem(ident);
    PQfreemem(lit);
    if (!pending)
        fprintf(stderr, "pqmq migrate: schema \"%s\" is up to date (version %d)\n", schema,
                have);
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
    PGresult *r = mode ? applied(t) : NULL;
    if (mode && !r) {
        free(schema);
        return EXIT_ERR;
    }
    if (mode == 's') {
        rc = status(r, schema);
    } else if (mode == 'q') {
        rc = print_sql(t, r, schema);
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
