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

/* The highest recorded version in the client's current schema, 0 if none.
 * A role with a duty has no rights on the tables: it asks mq_schema_version(),
 * which every duty may run, so a producer's pqmq_migrate on a current queue
 * does nothing and succeeds. */
static int applied_version(pqmq_client *c, int *version)
{
    int rc;
    *version = 0;
    /* Two statements: the second would not even parse without the table. */
    PGresult *r =
        pqmq__exec_text(c,
                        "SELECT CASE WHEN pg_catalog.to_regclass(t) IS NULL THEN 0 "
                        "WHEN pg_catalog.has_table_privilege(t, 'SELECT') THEN 1 ELSE 2 END "
                        "FROM (SELECT pg_catalog.quote_ident(pg_catalog.current_schema()) "
                        "OPERATOR(pg_catalog.||) '.mq_schema_migrations' AS t) x",
                        &rc);
    if (!r)
        return rc;
    int how = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    if (how == 0)
        return 0;
    r = pqmq__exec_text(
        c,
        how == 1 ? "SELECT COALESCE(pg_catalog.max(version), 0) FROM mq_schema_migrations"
                 : "SELECT mq_schema_version()",
        &rc);
    if (!r)
        return rc;
    *version = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return 0;
}

static int run(pqmq_client *c, const char *sql)
{
    int rc;
    PGresult *r = pqmq__exec_text(c, sql, &rc);
    PQclear(r);
    return rc;
}

/* Runs sql with its errors named step ("pqmq_migrate: schema/poll"), which
 * must outlive the call (pqmq__enter). */
static int run_step(pqmq_client *c, const char *step, const char *sql)
{
    const char *call = c->call;
    c->call = step;
    int rc = run(c, sql);
    c->call = call;
    return rc;
}

/* Whether the server has the Citus extension: then it must be the
 * coordinator (a worker refuses to distribute a schema, and says so). */
static int on_citus(pqmq_client *c, int *citus)
{
    int rc;
    PGresult *r = pqmq__exec_text(
        c, "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')",
        &rc);
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
    int rc = run(c, "SET LOCAL citus.propagate_set_commands = 'local'; "
                    "SET LOCAL citus.enable_unsafe_triggers = on");
    if (rc)
        return rc;
    PGresult *r = pqmq__exec_text(
        c,
        "SELECT 'SET LOCAL search_path = ' || quote_ident(current_schema()), "
        "NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_schema d "
        "            WHERE d.schemaid = quote_ident(current_schema())::regnamespace) "
        "AND to_regclass(quote_ident(current_schema()) || '.mq_msgs') IS NULL",
        &rc);
    if (!r)
        return rc;
    char *set_path = strdup(PQgetvalue(r, 0, 0));
    int distribute = PQgetvalue(r, 0, 1)[0] == 't';
    PQclear(r);
    if (!set_path)
        return pqmq__err(c, PQMQ_ENOMEM, "out of memory");
    rc = run(c, set_path);
    free(set_path);
    if (!rc && distribute)
        rc = run_step(
            c, "pqmq_migrate: distributing the queue's schema",
            "SELECT citus_schema_distribute(quote_ident(current_schema())::regnamespace)");
    return rc;
}

/* Settings of the queue's functions on Citus, after every pqmq_migrate (a
 * migration that redefines a function resets them): pqmq.citus = on, which
 * selects the forms of the few statements that Citus plans differently
 * (DESIGN.md, "Citus"), and custom plans for those that pin generic ones for a
 * single server's plan cache: Citus plans a statement with parameters only
 * when it sees their values. A function with a standard SQL body gets none:
 * it reads no setting, and one would keep the planner from inlining it. */
static int citus_settings(pqmq_client *c)
{
    return run_step(
        c, "pqmq_migrate: settings for Citus",
        "DO $$ DECLARE f record; BEGIN "
        "FOR f IN SELECT p.oid::regprocedure AS sig, "
        "'plan_cache_mode=force_generic_plan' = ANY (p.proconfig) AS generic "
        "FROM pg_catalog.pg_proc p "
        "WHERE p.pronamespace = quote_ident(current_schema())::regnamespace "
        "AND p.proname ~ '^_?mq_' AND p.prosqlbody IS NULL LOOP "
        "EXECUTE pg_catalog.format('ALTER FUNCTION %s SET pqmq.citus = on', f.sig); "
        "IF f.generic THEN EXECUTE pg_catalog.format("
        "'ALTER FUNCTION %s SET plan_cache_mode = force_custom_plan', f.sig); "
        "END IF; END LOOP; END $$");
}

/* Runs a migration one statement at a time (Citus). */
static int run_each(pqmq_client *c, const char *sql)
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
            return pqmq__err(c, PQMQ_ENOMEM, "out of memory");
        rc = run(c, one);
        free(one);
    }
    return rc;
}

/* The schema named for this transaction only (set_config(..., true)): a
 * pooled server connection keeps no setting of it. */
static int select_schema(pqmq_client *c, const char *schema)
{
    const char *p[1] = {schema};
    int rc;
    PGresult *r = PQexecParams(
        c->conn,
        "SELECT pg_catalog.set_config('search_path', pg_catalog.quote_ident($1), true)", 1,
        NULL, p, NULL, NULL, 0);
    r = pqmq__result_outcome(c, r, &rc);
    PQclear(r);
    return rc;
}

static int apply_all(pqmq_client *c, const char *schema)
{
    /* Until the path is narrowed below, every name is qualified: the
     * caller's path may put a schema that others create in ahead of
     * pg_catalog. */
    int rc = run(c, "SELECT pg_catalog.pg_advisory_xact_lock(" MIGRATE_LOCK ")");
    if (!rc && schema)
        rc = select_schema(c, schema);
    if (rc)
        return rc;
    PGresult *r = pqmq__exec_text(c, "SELECT pg_catalog.current_schema() IS NULL", &rc);
    if (!r)
        return rc;
    int no_schema = PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    if (no_schema && schema)
        return pqmq__seterr(c, PQMQ_ESCHEMA, "pqmq_migrate: schema \"%s\" does not exist",
                            schema);
    if (no_schema)
        return pqmq__err(c, PQMQ_ESCHEMA,
                         "no schema on the search_path to create the queue in");
    /* Functions pin the search_path they are created under: only the
     * target schema, so pg_catalog comes first for them, for column
     * defaults and for standard SQL bodies. */
    rc = run(c, "SELECT pg_catalog.set_config('search_path', "
                "pg_catalog.quote_ident(pg_catalog.current_schema()), true)");
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
        rc = run(c, "SET LOCAL check_function_bodies = off");
    for (size_t i = 0; !rc && i < pqmq_migration_count; i++) {
        char step[128];
        snprintf(step, sizeof step, "pqmq_migrate: %s", pqmq_migrations[i].name);
        c->call = step; /* the file's errors name it */
        rc = citus ? run_each(c, pqmq_migrations[i].sql) : run(c, pqmq_migrations[i].sql);
        c->call = "pqmq_migrate";
    }
    if (!rc && citus)
        rc = citus_settings(c);
    return rc;
}

static int migrate(pqmq_client *c, const char *schema);

PQMQ_EXPORT int pqmq_migrate(pqmq_client *c)
{
    if (pqmq__enter(c, "pqmq_migrate"))
        return PQMQ_EINVAL;
    return migrate(c, NULL);
}

PQMQ_EXPORT int pqmq_migrate_schema(pqmq_client *c, const char *schema)
{
    if (pqmq__enter(c, "pqmq_migrate_schema"))
        return PQMQ_EINVAL;
    return migrate(c, schema);
}

/* pqmq_migrate and pqmq_migrate_schema, once entered. */
static int migrate(pqmq_client *c, const char *schema)
{
    if (!c)
        return PQMQ_EINVAL;
    int rc = pqmq__ready(c);
    if (rc)
        return rc;
    if (PQtransactionStatus(c->conn) != PQTRANS_IDLE)
        return pqmq__err(c, PQMQ_EINVAL, "must be called outside a transaction");
    rc = run(c, "BEGIN");
    if (rc)
        return rc;
    rc = apply_all(c, schema);
    if (rc) {
        PQclear(PQexec(c->conn, "ROLLBACK"));
        return rc;
    }
    rc = run(c, "COMMIT");
    /* New types may exist now; register them afresh on next use. */
    c->composite_ready = 0;
    return rc;
}
