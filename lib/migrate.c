/*
 * migrate.c: installs or upgrades the queue's schema: the embedded files
 * (lib/migrations.c, generated from migrations/ and schema/) in one
 * transaction under an advisory lock. The SQL decides what each file does
 * to the database at hand (a step of migrations/ does nothing but on the
 * version it upgrades; schema/ refuses any version but its own), so psql
 * applying the same files in the same order does the same.
 * On a Citus coordinator the queue's schema becomes a distributed schema
 * (its tables on one node, chosen by Citus) and each statement is sent on
 * its own, under a search_path that Citus passes on to the workers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pqmq-int.h"

/* Any constant works; this one spells "pqmq" and is shared by all versions. */
#define MIGRATE_LOCK "1886482797"

PQMQ_EXPORT int pqmq_schema_version(void)
{
    return pqmq_schema_release;
}

/* The highest recorded version in the client's current schema, 0 if none. */
static int applied_version(pqmq_client *c, int *version)
{
    int rc;
    *version = 0;
    /* Two statements: the second would not even parse without the table. */
    PGresult *r = pqmq__exec_text(
        c,
        "SELECT to_regclass(quote_ident(current_schema()) || '.mq_schema_migrations') "
        "IS NOT NULL",
        "pqmq_migrate", &rc);
    if (!r)
        return rc;
    int exists = PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    if (!exists)
        return 0;
    r = pqmq__exec_text(c, "SELECT COALESCE(max(version), 0) FROM mq_schema_migrations",
                        "pqmq_migrate", &rc);
    if (!r)
        return rc;
    *version = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return 0;
}

static int run(pqmq_client *c, const char *sql, const char *what)
{
    int rc;
    PGresult *r = pqmq__exec_text(c, sql, what, &rc);
    PQclear(r);
    return rc;
}

/* Whether the server has the Citus extension: then it must be the
 * coordinator (a worker refuses to distribute a schema, and says so). */
static int on_citus(pqmq_client *c, int *citus)
{
    int rc;
    PGresult *r = pqmq__exec_text(
        c, "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')",
        "pqmq_migrate", &rc);
    if (!r)
        return rc;
    *citus = PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    return 0;
}

/* Citus: the schema is distributed before its first table, and the
 * workers resolve the names in forwarded statements (GRANT ... ON FUNCTION
 * mq_insert(mq_new_t[])) under the search_path set here: Citus passes SET
 * LOCAL on to them. */
static int citus_prepare(pqmq_client *c)
{
    /* The queue's triggers touch only tables of its own schema, which
     * Citus keeps on one node: none of the risks this setting warns of. */
    int rc = run(c,
                 "SET LOCAL citus.propagate_set_commands = 'local'; "
                 "SET LOCAL citus.enable_unsafe_triggers = on",
                 "pqmq_migrate");
    if (rc)
        return rc;
    PGresult *r = pqmq__exec_text(
        c,
        "SELECT 'SET LOCAL search_path = ' || quote_ident(current_schema()), "
        "NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_schema d "
        "            WHERE d.schemaid = quote_ident(current_schema())::regnamespace) "
        "AND to_regclass(quote_ident(current_schema()) || '.mq_msgs') IS NULL",
        "pqmq_migrate", &rc);
    if (!r)
        return rc;
    char *set_path = strdup(PQgetvalue(r, 0, 0));
    int distribute = PQgetvalue(r, 0, 1)[0] == 't';
    PQclear(r);
    if (!set_path)
        return pqmq__seterr(c, PQMQ_ENOMEM, "pqmq_migrate: out of memory");
    rc = run(c, set_path, "pqmq_migrate");
    free(set_path);
    if (!rc && distribute)
        rc = run(c,
                 "SELECT citus_schema_distribute(quote_ident(current_schema())::regnamespace)",
                 "pqmq_migrate: distributing the queue's schema");
    return rc;
}

/* Settings of the queue's functions on Citus, after every pqmq_migrate (a
 * migration that redefines a function resets them): pqmq.citus = on, which
 * selects the forms of the few statements that Citus plans differently
 * (migration 0017; DESIGN.md, "Citus"), and custom plans for those that pin generic ones for a
 * single server's plan cache: Citus plans a statement with parameters only
 * when it sees their values. A function with a standard SQL body gets none:
 * it reads no setting, and one would keep the planner from inlining it. */
static int citus_settings(pqmq_client *c)
{
    return run(c,
               "DO $$ DECLARE f record; BEGIN "
               "FOR f IN SELECT p.oid::regprocedure AS sig, "
               "'plan_cache_mode=force_generic_plan' = ANY (p.proconfig) AS generic "
               "FROM pg_catalog.pg_proc p "
               "WHERE p.pronamespace = quote_ident(current_schema())::regnamespace "
               "AND p.proname LIKE 'mq\\_%' AND p.prosqlbody IS NULL LOOP "
               "EXECUTE pg_catalog.format('ALTER FUNCTION %s SET pqmq.citus = on', f.sig); "
               "IF f.generic THEN EXECUTE pg_catalog.format("
               "'ALTER FUNCTION %s SET plan_cache_mode = force_custom_plan', f.sig); "
               "END IF; END LOOP; END $$",
               "pqmq_migrate: settings for Citus");
}

/* Runs a migration one statement at a time (Citus). */
static int run_each(pqmq_client *c, const char *sql, const char *what)
{
    size_t pos = 0, start, len, n = strlen(sql);
    int rc = 0;
    while (!rc && pos < n) {
        start = pos;
        pos = pqmq__sql_next(sql, n, &start, &len);
        if (!len)
            break;
        char *one = strndup(sql + start, len);
        if (!one)
            return pqmq__seterr(c, PQMQ_ENOMEM, "%s: out of memory", what);
        rc = run(c, one, what);
        free(one);
    }
    return rc;
}

static int apply_all(pqmq_client *c)
{
    /* Until the path is narrowed below, every name is qualified: the
     * caller's path may put a schema that others create in ahead of
     * pg_catalog. */
    int rc =
        run(c, "SELECT pg_catalog.pg_advisory_xact_lock(" MIGRATE_LOCK ")", "pqmq_migrate");
    if (rc)
        return rc;
    PGresult *r =
        pqmq__exec_text(c, "SELECT pg_catalog.current_schema() IS NULL", "pqmq_migrate", &rc);
    if (!r)
        return rc;
    int no_schema = PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    if (no_schema)
        return pqmq__seterr(
            c, PQMQ_ESCHEMA,
            "pqmq_migrate: no schema on the search_path to create the queue in");
    /* Functions pin the search_path they are created under: only the
     * target schema, so pg_catalog comes first for them, for column
     * defaults and for standard SQL bodies. */
    rc = run(c,
             "SELECT pg_catalog.set_config('search_path', "
             "pg_catalog.quote_ident(pg_catalog.current_schema()), true)",
             "pqmq_migrate");
    int citus = 0;
    if (!rc)
        rc = on_citus(c, &citus);
    if (!rc && citus)
        rc = citus_prepare(c);
    int have = 0;
    if (!rc)
        rc = applied_version(c, &have);
    if (!rc && have == pqmq_schema_release)
        return 0; /* current: nothing to do */
    /* Function bodies name functions of files applied later. */
    if (!rc)
        rc = run(c, "SET LOCAL check_function_bodies = off", "pqmq_migrate");
    for (size_t i = 0; !rc && i < pqmq_migration_count; i++) {
        char what[128];
        snprintf(what, sizeof what, "pqmq_migrate: %s", pqmq_migrations[i].name);
        rc = citus ? run_each(c, pqmq_migrations[i].sql, what)
                   : run(c, pqmq_migrations[i].sql, what);
    }
    if (!rc && citus)
        rc = citus_settings(c);
    return rc;
}

PQMQ_EXPORT int pqmq_migrate(pqmq_client *c)
{
    if (!c)
        return PQMQ_EINVAL;
    pqmq__clearerr(c);
    int rc = pqmq__ready(c);
    if (rc)
        return rc;
    if (PQtransactionStatus(c->conn) != PQTRANS_IDLE)
        return pqmq__seterr(c, PQMQ_EINVAL,
                            "pqmq_migrate: must be called outside a transaction");
    rc = run(c, "BEGIN", "pqmq_migrate");
    if (rc)
        return rc;
    rc = apply_all(c);
    if (rc) {
        PQclear(PQexec(c->conn, "ROLLBACK"));
        return rc;
    }
    rc = run(c, "COMMIT", "pqmq_migrate");
    /* New types may exist now; register them afresh on next use. */
    c->composite_ready = 0;
    return rc;
}
