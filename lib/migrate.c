/*
 * migrate.c: applies the embedded migrations (lib/migrations.c is generated
 * from the files of migrations/) in one transaction under an advisory lock.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pqmq-int.h"

/* Any constant works; this one spells "pqmq" and is shared by all versions. */
#define MIGRATE_LOCK "1886482797"

PQMQ_EXPORT int pqmq_schema_version(void)
{
    return pqmq_migration_count ? pqmq_migrations[pqmq_migration_count - 1].version : 0;
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

static int apply_all(pqmq_client *c)
{
    int rc = run(c, "SELECT pg_advisory_xact_lock(" MIGRATE_LOCK ")", "pqmq_migrate");
    if (rc)
        return rc;
    PGresult *r = pqmq__exec_text(c, "SELECT current_schema() IS NULL", "pqmq_migrate", &rc);
    if (!r)
        return rc;
    int no_schema = PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    if (no_schema)
        return pqmq__seterr(
            c, PQMQ_ESCHEMA,
            "pqmq_migrate: no schema on the search_path to create the queue in");
    /* Functions pin the search_path they are created under: only the
     * target schema. */
    rc = run(c, "SELECT set_config('search_path', quote_ident(current_schema()), true)",
             "pqmq_migrate");
    int have = 0;
    if (!rc)
        rc = applied_version(c, &have);
    for (size_t i = 0; !rc && i < pqmq_migration_count; i++) {
        /* Version 0 adopts an older schema: only before anything else. */
        if (have > 0 && pqmq_migrations[i].version <= have)
            continue;
        char what[128];
        snprintf(what, sizeof what, "pqmq_migrate: %s", pqmq_migrations[i].name);
        rc = run(c, pqmq_migrations[i].sql, what);
    }
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
