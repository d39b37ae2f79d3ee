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
    printf("usage: pqmq migrate [--status | --sql | --create-schema]\n\n"
           "Creates or upgrades the queue's schema (safe to repeat and to run\n"
           "concurrently; says so when there was nothing to do).\n\n"
           "      --status        the schema's recorded version, and what migrate would do\n"
           "      --sql           print the SQL that migrate would run instead of\n"
           "                      running it (apply with: psql -1 -f FILE)\n"
           "      --create-schema create the --schema first when it does not exist\n"
           "                      (owned by the connecting role)\n%s",
           tool_common_help);
}

/* The newest recorded version and when it was applied (0 and NULL when the
 * schema has no queue; NULL when the role has a duty and no rights on the
 * table, and reads the version through mq_schema_version()). Caller
 * PQclear's *r. */
static int recorded(tool *t, PGresult **r, int *version, const char **at)
{
    *r = tool_query(t,
                    "SELECT CASE WHEN pg_catalog.to_regclass(x.t) IS NULL THEN 0"
                    " WHEN pg_catalog.has_table_privilege(x.t, 'SELECT') THEN 1 ELSE 2 END "
                    "FROM (SELECT pg_catalog.quote_ident(pg_catalog.current_schema())"
                    " OPERATOR(pg_catalog.||) '.mq_schema_migrations' AS t) x",
                    0, NULL);
    if (!*r)
        return EXIT_ERR;
    int how = atoi(PQgetvalue(*r, 0, 0));
    PQclear(*r);
    *r = tool_query(t,
                    how == 1   ? "SELECT version, applied_at FROM mq_schema_migrations "
                                 "ORDER BY version DESC LIMIT 1"
                    : how == 2 ? "SELECT mq_schema_version(), NULL::timestamptz"
                               : "SELECT 0, NULL::timestamptz",
                    0, NULL);
    if (!*r)
        return EXIT_ERR;
    *version = PQntuples(*r) ? atoi(PQgetvalue(*r, 0, 0)) : 0;
    *at = PQntuples(*r) && !PQgetisnull(*r, 0, 1) ? PQgetvalue(*r, 0, 1) : NULL;
    return EXIT_OK;
}

/* --create-schema: CREATE SCHEMA IF NOT EXISTS, the name quoted by the
 * server's format('%I'), never spliced by hand. */
static int create_schema(tool *t)
{
    const char *p[1] = {t->schema};
    PGresult *r = tool_query(
        t, "SELECT pg_catalog.format('CREATE SCHEMA IF NOT EXISTS %I', $1::text)", 1, p);
    if (!r)
        return EXIT_ERR;
    PGresult *done = tool_query(t, PQgetvalue(r, 0, 0), 0, NULL);
    PQclear(r);
    if (!done)
        return EXIT_ERR;
    PQclear(done);
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
        fprintf(stderr, "pqmq migrate: schema \"");
        out_display(stderr, schema);
        fprintf(stderr, "\" is up to date (version %d)\n", have);
        return EXIT_OK;
    }
    char *ident = PQescapeIdentifier(t->conn, schema, strlen(schema));
    char *lit = ident ? PQescapeLiteral(t->conn, ident, strlen(ident)) : NULL;
    if (!lit) {
        PQfreemem(ident);
        return tool_err(t, "out of memory");
    }
    /* The name in the comment is escaped: a newline in it would end the
     * comment and make the rest of the name SQL. */
    printf("-- pqmq %s (schema version %d) for schema ", PACKAGE_VERSION,
           pqmq_schema_version());
    out_display(stdout, ident);
    printf("; apply in one transaction\n"
           "-- (psql -1 -f FILE). The functions pin the search_path set here.\n"
           "SELECT pg_catalog.pg_advisory_xact_lock(1886482797);\n"
           "SELECT pg_catalog.set_config('search_path', %s, true);\n"
           "-- Function bodies name functions of files further down.\n"
           "SET LOCAL check_function_bodies = off;\n",
           lit);
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
        {"create-schema", no_argument, NULL, 'C'},
        {NULL, 0, NULL, 0},
    };
    int mode = 0, create = 0, c;
    while ((c = getopt_long(argc, argv, TOOL_COMMON_SHORT, opts, NULL)) != -1) {
        if (c == 'h') {
            help();
            return EXIT_OK;
        } else if (c == 's' || c == 'q') {
            if (mode && mode != c)
                return tool_usage(t, "--status and --sql do not go together");
            mode = c;
        } else if (c == 'C') {
            create = 1;
        } else if (tool_common_opt(t, c, optarg)) {
            return EXIT_USAGE;
        }
    }
    if (optind < argc)
        return tool_usage(t, "unexpected argument \"%s\"", argv[optind]);
    if (create && mode)
        return tool_usage(t, "--create-schema goes with neither --status nor --sql");
    if (create && !t->schema)
        return tool_usage(t, "--create-schema needs --schema NAME");
    /* A schema without a queue is what migrate is for: no check. */
    int rc = tool_connect(t, -1);
    if (!rc && create) {
        rc = create_schema(t);
        /* Then the schema is on the path of the transaction. */
        if (!rc && !(rc = tool_commit(t)))
            rc = tool_begin(t);
    }
    if (rc)
        return rc;
    char *name = tool_current_schema(t);
    if (!name)
        return t->schema ? tool_schema_unusable(t, ": add --create-schema, or create it as "
                                                   "the role that will own the queue")
                         : tool_err(t, "no schema on the search_path (use --schema)");
    /* The messages show the name with its control characters escaped;
     * the SQL gets it as it is. */
    char *schema = NULL;
    size_t schema_len = 0;
    FILE *f = open_memstream(&schema, &schema_len);
    if (!f) {
        free(name);
        return tool_err(t, "out of memory");
    }
    out_display(f, name);
    fclose(f);
    PGresult *r = NULL;
    int have = 0;
    const char *at = NULL;
    if (!schema || recorded(t, &r, &have, &at) != EXIT_OK) {
        PQclear(r);
        free(schema);
        free(name);
        return schema ? EXIT_ERR : tool_err(t, "out of memory");
    }
    if (mode == 's') {
        rc = status(have, at, schema);
    } else if (mode == 'q') {
        rc = print_sql(t, have, name);
    } else if (have == pqmq_schema_version()) {
        printf("schema \"%s\" is at version %d already: nothing to do\n", schema, have);
    } else if ((rc = tool_commit(t)) != EXIT_OK) {
        /* pqmq_migrate runs its own transaction (selecting --schema in it). */
    } else if (pqmq_migrate_schema(t->client, t->schema) != PQMQ_OK) {
        rc = tool_err(t, "%s", tool_lib_error(pqmq_errmsg(t->client)));
    } else if (have) {
        printf("schema \"%s\" upgraded from version %d to %d\n", schema, have,
               pqmq_schema_version());
    } else {
        printf("schema \"%s\": queue installed at version %d\n", schema, pqmq_schema_version());
    }
    PQclear(r);
    free(schema);
    free(name);
    return rc;
}
