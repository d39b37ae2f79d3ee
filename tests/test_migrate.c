/* test_migrate.c: the migration contract (semantic 12): versions recorded,
 * idempotent, safe concurrently, identical when applied with psql, every
 * function pinning its search_path, and the refusals of pqmq_migrate. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <glob.h>
#include <libgen.h>
#include <pthread.h>
#include <stdlib.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;  /* search_path: the test schema */
static PGconn *cat; /* search_path: pg_catalog only, so catalog text is qualified */

/* ---- helpers ----------------------------------------------------------- */

/* A libpq connection with search_path set to path. Caller PQfinish'es. */
static PGconn *connect_path(const char *path)
{
    char *dsn = NULL;
    if (asprintf(&dsn, "%s options='-c search_path=%s -c client_min_messages=warning'", t_dsn(),
                 path) < 0)
        abort();
    PGconn *c = PQconnectdb(dsn);
    free(dsn);
    if (PQstatus(c) != CONNECTION_OK) {
        t_fail(__FILE__, __LINE__, "cannot connect: %s", PQerrorMessage(c));
        exit(1);
    }
    return c;
}

static pqmq_client *client_path(const char *path)
{
    char *dsn = NULL;
    if (asprintf(&dsn, "%s options='-c search_path=%s -c client_min_messages=warning'", t_dsn(),
                 path) < 0)
        abort();
    pqmq_client *c = NULL;
    int rc = pqmq_connect(dsn, &c);
    free(dsn);
    if (rc) {
        t_fail(__FILE__, __LINE__, "pqmq_connect: %s", pqmq_errmsg(c));
        exit(1);
    }
    return c;
}

/* A fresh, empty schema named <test schema>_<suffix>, into buf. */
static const char *fresh_schema(char *buf, size_t size, const char *suffix)
{
    snprintf(buf, size, "%s_%s", t_schema(), suffix);
    t_exec(pg, "DROP SCHEMA IF EXISTS %s CASCADE", buf);
    t_exec(pg, "CREATE SCHEMA %s", buf);
    return buf;
}

static void drop_schema(const char *schema)
{
    t_exec(pg, "DROP SCHEMA IF EXISTS \"%s\" CASCADE", schema);
}

/* The text of one SQL value (NULL: ""); caller frees. */
static char *sql_text(PGconn *c, const char *sql)
{
    PGresult *r = t_sql(c, "%s", sql);
    char *s = strdup(r && PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "(no result)");
    PQclear(r);
    return s;
}

/*
 * Everything pqmq_migrate creates in schema, as sorted lines of text with the
 * schema's name replaced by "@S": relations with their options, columns with
 * types, defaults and generation expressions, indexes, constraints, function
 * definitions (SET clauses included), types, triggers, and the recorded
 * migrations. Caller frees.
 */
static char *fingerprint(const char *schema)
{
    char *sql = NULL;
    if (asprintf(
            &sql,
            "WITH ns AS (SELECT oid, nspname FROM pg_namespace WHERE nspname = '%s') "
            "SELECT COALESCE(string_agg(replace(x.line, ns.nspname, '@S'), E'\\n' "
            "                           ORDER BY replace(x.line, ns.nspname, '@S')), '') "
            "FROM ns, LATERAL ("
            "  SELECT 'rel ' || c.relname || ' ' || c.relkind::text || ' ' "
            "         || COALESCE(array_to_string(c.reloptions, ','), '') AS line "
            "  FROM pg_class c WHERE c.relnamespace = ns.oid "
            "  UNION ALL "
            "  SELECT 'col ' || c.relname || '.' || a.attname || ' #' || a.attnum || ' ' "
            "         || format_type(a.atttypid, a.atttypmod) "
            "         || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END "
            "         || ' gen=' || a.attgenerated::text "
            "         || ' default=' || COALESCE(pg_get_expr(d.adbin, d.adrelid), '') "
            "  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid "
            "  LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum "
            "  WHERE c.relnamespace = ns.oid AND a.attnum > 0 AND NOT a.attisdropped "
            "  UNION ALL "
            "  SELECT 'idx ' || i.indexdef FROM pg_indexes i WHERE i.schemaname = ns.nspname "
            "  UNION ALL "
            "  SELECT 'con ' || k.conrelid::regclass::text || ' ' || k.conname || ' ' "
            "         || pg_get_constraintdef(k.oid) "
            "  FROM pg_constraint k WHERE k.connamespace = ns.oid "
            "  UNION ALL "
            "  SELECT 'fn ' || pg_get_functiondef(p.oid) "
            "  FROM pg_proc p WHERE p.pronamespace = ns.oid AND p.prokind IN ('f', 'p', 'w') "
            "  UNION ALL "
            "  SELECT 'acl ' || p.oid::regprocedure::text || ' ' "
            "         || COALESCE(p.proacl::text, '(default)') "
            "  FROM pg_proc p WHERE p.pronamespace = ns.oid "
            "  UNION ALL "
            "  SELECT 'agg ' || p.oid::regprocedure::text "
            "  FROM pg_proc p WHERE p.pronamespace = ns.oid AND p.prokind = 'a' "
            "  UNION ALL "
            "  SELECT 'type ' || format_type(t.oid, NULL) || ' ' || t.typtype::text "
            "  FROM pg_type t WHERE t.typnamespace = ns.oid "
            "  UNION ALL "
            "  SELECT 'trg ' || pg_get_triggerdef(g.oid) "
            "  FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid "
            "  WHERE c.relnamespace = ns.oid AND NOT g.tgisinternal "
            ") x",
            schema) < 0)
        abort();
    char *objects = sql_text(cat, sql);
    free(sql);
    if (asprintf(
            &sql,
            "SELECT COALESCE(string_agg(version || ' ' || name, ', ' ORDER BY version), '') "
            "FROM \"%s\".mq_schema_migrations",
            schema) < 0)
        abort();
    char *versions = sql_text(cat, sql);
    free(sql);
    char *fp = NULL;
    if (asprintf(&fp, "%s\nmigrations %s", objects, versions) < 0)
        abort();
    free(objects);
    free(versions);
    return fp;
}

/* Fails (showing where) unless fingerprints a and b are equal. */
#define CHECK_SAME_FP(a, b) check_same_fp(__LINE__, (a), (b))
static void check_same_fp(int line, const char *a, const char *b)
{
    if (!strcmp(a, b))
        return;
    size_t i = 0;
    while (a[i] && a[i] == b[i])
        i++;
    size_t from = i > 120 ? i - 120 : 0;
    t_fail(__FILE__, line, "fingerprints differ at byte %zu:\n      ...%.240s\n  vs  ...%.240s",
           i, a + from, b + from);
}

/* $env when set, else NAME/ beside this file's tests/ (the source tree). */
static const char *source_dir(const char *env, const char *name, char *dir, size_t size)
{
    const char *value = getenv(env);
    if (value && *value) {
        snprintf(dir, size, "%s", value);
    } else {
        char file[4096];
        snprintf(file, sizeof file, "%s", __FILE__);
        snprintf(dir, size, "%s/../%s", dirname(file), name);
    }
    return dir;
}

static const char *migrations_dir(void)
{
    static char dir[4096];
    return source_dir("PQMQ_MIGRATIONS_DIR", "migrations", dir, sizeof dir);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The migration files, sorted by name; returns how many (caller globfree's). */
static size_t migration_files(glob_t *g)
{
    char pattern[4200];
    snprintf(pattern, sizeof pattern, "%s/*.sql", migrations_dir());
    memset(g, 0, sizeof *g);
    if (glob(pattern, 0, NULL, g) != 0) {
        t_fail(__FILE__, __LINE__, "no migration files match %s (set PQMQ_MIGRATIONS_DIR)",
               pattern);
        return 0;
    }
    qsort(g->gl_pathv, g->gl_pathc, sizeof *g->gl_pathv, cmp_str);
    return g->gl_pathc;
}

/* "0007_foo" from ".../0007_foo.sql", into buf; returns the version (7). */
static int migration_name(const char *path, char *buf, size_t size)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(buf, size, "%.*s", (int)(strlen(base) - 4), base);
    return atoi(base);
}

/* s in single quotes for sh. Caller frees. */
static char *sh_quote(const char *s)
{
    size_t n = 3;
    for (const char *p = s; *p; p++)
        n += *p == '\'' ? 4 : 1;
    char *out = malloc(n), *o = out;
    *o++ = '\'';
    for (const char *p = s; *p; p++) {
        if (*p == '\'') {
            memcpy(o, "'\\''", 4);
            o += 4;
        } else {
            *o++ = *p;
        }
    }
    *o++ = '\'';
    *o = '\0';
    return out;
}

/* Applies the n files with psql into schema, in the order given, with the
 * extra server settings in options (a PGOPTIONS fragment, may be "").
 * Returns the first non-zero exit status, else 0. */
static int psql_apply_files(const char *psql, const char *schema, char *const *files, size_t n,
                            const char *options)
{
    char *dsn = sh_quote(t_dsn());
    int status = n ? 0 : -1;
    for (size_t i = 0; i < n && status == 0; i++) {
        char *file = sh_quote(files[i]);
        char *cmd = NULL;
        if (asprintf(&cmd,
                     "PGOPTIONS='-c search_path=%s -c client_min_messages=warning %s' "
                     "%s -X -q -v ON_ERROR_STOP=1 -d %s -f %s >/dev/null",
                     schema, options, psql, dsn, file) < 0)
            abort();
        status = system(cmd);
        if (status != 0)
            t_fail(__FILE__, __LINE__, "%s exited with status %d", cmd, status);
        free(cmd);
        free(file);
    }
    free(dsn);
    return status;
}

/* Applies every migration file with psql into schema, in name order. */
static int psql_apply(const char *psql, const char *schema)
{
    glob_t g;
    size_t n = migration_files(&g);
    int status = psql_apply_files(psql, schema, g.gl_pathv, n, "");
    globfree(&g);
    return status;
}

/* The psql to use, or NULL when there is none. */
static const char *find_psql(void)
{
    static char path[4096];
    const char *bindir = getenv("PQMQ_PG_BINDIR");
    if (bindir && *bindir) {
        snprintf(path, sizeof path, "%s/psql", bindir);
        char *q = sh_quote(path), *cmd = NULL;
        if (asprintf(&cmd, "test -x %s", q) < 0)
            abort();
        int ok = system(cmd) == 0;
        free(cmd);
        free(q);
        if (ok) {
            char *quoted = sh_quote(path);
            snprintf(path, sizeof path, "%s", quoted);
            free(quoted);
            return path;
        }
    }
    if (system("command -v psql >/dev/null 2>&1") == 0)
        return "psql";
    return NULL;
}

/* ---- versions ---------------------------------------------------------- */

static void test_one_row_per_migration(void)
{
    glob_t g;
    size_t n = migration_files(&g);
    CHECK(n >= 1);
    CHECK(pqmq_schema_version() >= 1);
    int newest = -1; /* 0000 adopts an original sqlxmq schema */
    for (size_t i = 0; i < n; i++) {
        char name[256];
        int v = migration_name(g.gl_pathv[i], name, sizeof name);
        CHECK(v > newest); /* versions grow with the file names */
        newest = v;
        if (t_sql_int(pg,
                      "SELECT count(*) FROM mq_schema_migrations "
                      "WHERE version = %d AND name = '%s'",
                      v, name) != 1)
            t_fail(__FILE__, __LINE__, "migration %s is not recorded once", name);
    }
    globfree(&g);
    CHECK_INT(pqmq_schema_version(), newest);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_schema_migrations"), (long long)n);
    CHECK_INT(t_sql_int(pg, "SELECT max(version) FROM mq_schema_migrations"),
              pqmq_schema_version());
}

/* ---- idempotence ------------------------------------------------------- */

static void test_migrate_again_changes_nothing(void)
{
    char *before = fingerprint(t_schema());
    /* Not a vacuous fingerprint: it sees the queue's objects. */
    CHECK(strstr(before, "fn CREATE OR REPLACE FUNCTION @S.mq_insert(") != NULL);
    CHECK(strstr(before, "idx CREATE UNIQUE INDEX mq_msgs_pkey ON @S.mq_msgs") != NULL);
    CHECK(strstr(before, "col mq_msgs.id #1 uuid not null") != NULL);
    CHECK(strstr(before, "SET search_path TO 'pg_catalog', '@S', 'pg_temp'") != NULL);
    char *stamps = sql_text(pg, "SELECT string_agg(version || '@' || applied_at, ',') "
                                "FROM mq_schema_migrations");
    CHECK_OK(q, pqmq_migrate(q));
    CHECK_STR(pqmq_errmsg(q), "");
    CHECK_OK(q, pqmq_migrate(q));
    char *after = fingerprint(t_schema());
    CHECK_SAME_FP(before, after);
    /* Nothing was even re-applied: the recorded rows are the same ones. */
    char *stamps2 = sql_text(pg, "SELECT string_agg(version || '@' || applied_at, ',') "
                                 "FROM mq_schema_migrations");
    CHECK_STR(stamps2, stamps);
    free(before);
    free(after);
    free(stamps);
    free(stamps2);
}

static void test_reapplying_every_migration_is_harmless(void)
{
    /* Forget the versions, so that pqmq_migrate runs every file again over
     * the existing objects: it must succeed, keep the data, and end with the
     * same schema. */
    t_truncate();
    pqmq_msg *msgs[2] = {t_msg("keep", "a", "n", "{\"x\": 1}", 1),
                         t_msg("keep", "a", "n", "{\"x\": 2}", 1)};
    CHECK_OK(q, pqmq_insert(q, msgs, 2));
    char *before = fingerprint(t_schema());
    t_exec(pg, "DELETE FROM mq_schema_migrations");
    CHECK_OK(q, pqmq_migrate(q));
    char *after = fingerprint(t_schema());
    CHECK_SAME_FP(before, after);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 2);
    CHECK_INT(t_sql_int(pg, "SELECT count(DISTINCT chain_seq) FROM mq_msgs"), 2);
    /* And the queue still works, in order. */
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_STR(pqmq_job_json(pqmq_batch_job(b, 0)), "{\"x\": 1}");
    pqmq_batch_free(b);
    free(before);
    free(after);
    t_msgs_free(msgs, 2);
    t_truncate();
}

/* ---- concurrency ------------------------------------------------------- */

enum { THREADS = 4 };

struct migrator {
    const char *schema;
    pthread_barrier_t *start;
    int rc;
    char msg[512];
};

static void *migrate_thread(void *arg)
{
    struct migrator *m = arg;
    pqmq_client *c = client_path(m->schema);
    pthread_barrier_wait(m->start);
    m->rc = pqmq_migrate(c);
    snprintf(m->msg, sizeof m->msg, "%s", pqmq_errmsg(c));
    pqmq_client_free(c);
    return NULL;
}

static void test_concurrent_migrate(void)
{
    char *want = fingerprint(t_schema());
    glob_t g;
    size_t files = migration_files(&g);
    globfree(&g);
    for (int round = 0; round < 3; round++) {
        char schema[96];
        fresh_schema(schema, sizeof schema, "conc");
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, THREADS);
        struct migrator m[THREADS];
        pthread_t th[THREADS];
        for (int i = 0; i < THREADS; i++) {
            m[i] = (struct migrator){.schema = schema, .start = &start, .rc = -100};
            pthread_create(&th[i], NULL, migrate_thread, &m[i]);
        }
        for (int i = 0; i < THREADS; i++)
            pthread_join(th[i], NULL);
        pthread_barrier_destroy(&start);
        for (int i = 0; i < THREADS; i++)
            if (m[i].rc != 0)
                t_fail(__FILE__, __LINE__, "round %d thread %d: pqmq_migrate returned %d: %s",
                       round, i, m[i].rc, m[i].msg);
        CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM %s.mq_schema_migrations", schema),
                  (long long)files);
        CHECK_INT(t_sql_int(pg, "SELECT count(DISTINCT version) FROM %s.mq_schema_migrations",
                            schema),
                  (long long)files);
        char *got = fingerprint(schema);
        CHECK_SAME_FP(want, got);
        free(got);
        drop_schema(schema);
    }
    free(want);
}

/* ---- plain SQL with psql ----------------------------------------------- */

static void test_psql_applies_the_same_schema(void)
{
    const char *psql = find_psql();
    if (!psql) {
        printf("    note: psql is not installed; skipping the plain-SQL comparison\n");
        return;
    }
    char schema[96];
    fresh_schema(schema, sizeof schema, "psql");
    char *want = fingerprint(t_schema());

    CHECK_INT(psql_apply(psql, schema), 0);
    char *once = fingerprint(schema);
    CHECK_SAME_FP(want, once);

    /* Twice is harmless and changes nothing. */
    CHECK_INT(psql_apply(psql, schema), 0);
    char *twice = fingerprint(schema);
    CHECK_SAME_FP(once, twice);

    /* The library sees that schema as up to date, and it works. */
    pqmq_client *c = client_path(schema);
    CHECK_OK(c, pqmq_migrate(c));
    char *lib = fingerprint(schema);
    CHECK_SAME_FP(once, lib);
    pqmq_msg *m = t_msg("psql", NULL, "n", "{}", 1);
    CHECK_OK(c, pqmq_insert(c, &m, 1));
    pqmq_batch *b = NULL;
    CHECK_OK(c, pqmq_poll(c, NULL, 0, 5, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_OK(c, pqmq_complete_batch(c, b));
    pqmq_batch_free(b);
    pqmq_msg_free(m);
    pqmq_client_free(c);

    free(want);
    free(once);
    free(twice);
    free(lib);
    drop_schema(schema);
}

/* A queue at version 10 keeps two rows per message (mq_msgs, mq_payloads).
 * Migration 0011 moves the payloads into mq_msgs and makes mq_payloads a
 * view: every payload, name and last error survives, read by id as before,
 * a role's grants on the table pass to the view, the queue delivers the
 * same payloads, applying 0011 again changes nothing, and an UPDATE or a
 * DELETE through the view changes or deletes the message. */
static void test_upgrade_to_one_row_keeps_payloads_and_grants(void)
{
    const char *psql = find_psql();
    if (!psql) {
        printf("    note: psql is not installed; skipping the upgrade from version 10\n");
        return;
    }
    glob_t g;
    size_t n = migration_files(&g), upto = 0;
    while (upto < n && !strstr(g.gl_pathv[upto], "/0011_"))
        upto++;
    CHECK(upto < n);
    char s[96];
    fresh_schema(s, sizeof s, "v10");
    CHECK_INT(psql_apply_files(psql, s, g.gl_pathv, upto, ""), 0);
    CHECK_INT(t_sql_int(pg, "SELECT max(version) FROM %s.mq_schema_migrations", s), 10);
    t_exec(pg,
           "SELECT %s.mq_insert(ARRAY["
           "ROW('00000000-0000-7000-8000-0000000000a1', NULL, 3, NULL, 'up', 'x', NULL, "
           "    true, 'first', '{\"n\": 1}', NULL)::%s.mq_new_t, "
           "ROW('00000000-0000-7000-8000-0000000000a2', NULL, 3, NULL, 'up', 'x', NULL, "
           "    true, 'second', NULL, '\\x0102'::bytea)::%s.mq_new_t])",
           s, s, s);
    t_exec(pg,
           "UPDATE %s.mq_payloads SET last_error = 'boom' "
           "WHERE id = '00000000-0000-7000-8000-0000000000a1'",
           s);
    t_exec(pg, "DO $$ BEGIN CREATE ROLE pqmq_t_reader NOLOGIN; "
               "EXCEPTION WHEN duplicate_object THEN NULL; END $$");
    t_exec(pg, "GRANT SELECT ON %s.mq_payloads TO pqmq_t_reader", s);

    CHECK_INT(psql_apply_files(psql, s, &g.gl_pathv[upto], 1, ""), 0);
    char *once = fingerprint(s);
    CHECK_INT(psql_apply_files(psql, s, &g.gl_pathv[upto], 1, ""), 0);
    char *twice = fingerprint(s);
    CHECK_SAME_FP(once, twice);

    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM pg_class WHERE oid = '%s.mq_payloads'::regclass "
                        "AND relkind = 'v'",
                        s),
              1);
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM %s.mq_msgs WHERE "
                        "(name, payload_json::text, payload_bytes, last_error) "
                        "IS NOT DISTINCT FROM ('first', '{\"n\": 1}', NULL, 'boom') "
                        "AND id = '00000000-0000-7000-8000-0000000000a1'",
                        s),
              1);
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM %s.mq_payloads WHERE name = 'second' "
                        "AND payload_bytes = '\\x0102'::bytea "
                        "AND id = '00000000-0000-7000-8000-0000000000a2'",
                        s),
              1);
    CHECK_INT(t_sql_int(pg,
                        "SELECT has_table_privilege('pqmq_t_reader', '%s.mq_payloads', "
                        "'SELECT')::int",
                        s),
              1);
    /* The chain still runs in order, with its payloads. */
    PGresult *r = t_sql(pg,
                        "SELECT name, payload_json FROM %s.mq_claim(NULL, 10) "
                        "WHERE id IS NOT NULL",
                        s);
    CHECK(r && PQntuples(r) == 1);
    if (r && PQntuples(r) == 1) {
        CHECK_STR(PQgetvalue(r, 0, 0), "first");
        CHECK_STR(PQgetvalue(r, 0, 1), "{\"n\": 1}");
    }
    PQclear(r);
    /* Through the view, an UPDATE changes the message and a DELETE deletes it. */
    t_exec(pg,
           "UPDATE %s.mq_payloads SET last_error = 'again' "
           "WHERE id = '00000000-0000-7000-8000-0000000000a2'",
           s);
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM %s.mq_msgs WHERE last_error = 'again' "
                        "AND id = '00000000-0000-7000-8000-0000000000a2'",
                        s),
              1);
    t_exec(pg, "DELETE FROM %s.mq_payloads WHERE id = '00000000-0000-7000-8000-0000000000a2'",
           s);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM %s.mq_msgs", s), 1);
    free(once);
    free(twice);
    globfree(&g);
    drop_schema(s);
    t_exec(pg, "DROP ROLE IF EXISTS pqmq_t_reader");
}

/* ---- schema/: today's definitions, one file per concern ---------------- */

/*
 * schema/tables.sql, then the other schema/ files in name order, applied into
 * a fresh schema, give exactly the catalog the migrations give: a function
 * changed in a migration but not in schema/ (or the reverse) fails here.
 */
static void test_schema_files_match_the_migrations(void)
{
    const char *psql = find_psql();
    if (!psql) {
        printf("    note: psql is not installed; skipping the schema/ comparison\n");
        return;
    }
    static char dir[4096];
    source_dir("PQMQ_SCHEMA_DIR", "schema", dir, sizeof dir);
    char pattern[4200];
    snprintf(pattern, sizeof pattern, "%s/*.sql", dir);
    glob_t g;
    memset(&g, 0, sizeof g);
    if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc < 2) {
        t_fail(__FILE__, __LINE__, "no schema files match %s (set PQMQ_SCHEMA_DIR)", pattern);
        globfree(&g);
        return;
    }
    qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, cmp_str);
    /* Tables and types first: the functions' signatures name them. */
    for (size_t i = 0; i < g.gl_pathc; i++) {
        const char *base = strrchr(g.gl_pathv[i], '/');
        if (base && !strcmp(base, "/tables.sql")) {
            char *t = g.gl_pathv[i];
            memmove(g.gl_pathv + 1, g.gl_pathv, i * sizeof *g.gl_pathv);
            g.gl_pathv[0] = t;
        }
    }
    CHECK(strstr(g.gl_pathv[0], "/tables.sql") != NULL);
    /* Privileges last: roles.sql alters every function the others define. */
    for (size_t i = 0; i + 1 < g.gl_pathc; i++) {
        const char *base = strrchr(g.gl_pathv[i], '/');
        if (base && !strcmp(base, "/roles.sql")) {
            char *t = g.gl_pathv[i];
            memmove(g.gl_pathv + i, g.gl_pathv + i + 1,
                    (g.gl_pathc - 1 - i) * sizeof *g.gl_pathv);
            g.gl_pathv[g.gl_pathc - 1] = t;
            break;
        }
    }
    CHECK(strstr(g.gl_pathv[g.gl_pathc - 1], "/roles.sql") != NULL);

    char schema[96];
    fresh_schema(schema, sizeof schema, "mirror");
    /* Bodies refer to functions of files applied later. */
    CHECK_INT(
        psql_apply_files(psql, schema, g.gl_pathv, g.gl_pathc, "-c check_function_bodies=off"),
        0);
    globfree(&g);
    /* Versions are the migrations' business: copy them over. */
    t_exec(pg, "INSERT INTO \"%s\".mq_schema_migrations SELECT * FROM mq_schema_migrations",
           schema);
    char *want = fingerprint(t_schema());
    char *got = fingerprint(schema);
    CHECK(strstr(got, "fn CREATE OR REPLACE FUNCTION @S.mq_claim(") != NULL);
    CHECK_SAME_FP(want, got);
    free(want);
    free(got);
    drop_schema(schema);
}

/* ---- pinned search_path ------------------------------------------------ */

/* The queue's schema, then pg_temp: written last, a caller's temporary
 * table cannot stand in for a queue table (migration 0004). */
static void test_every_function_pins_search_path(void)
{
    long long n = t_sql_int(cat,
                            "SELECT count(*) FROM pg_proc p "
                            "WHERE p.pronamespace = '%s'::regnamespace",
                            t_schema());
    CHECK(n >= 6);
    char *sql = NULL;
    if (asprintf(
            &sql,
            "SELECT COALESCE(string_agg(p.oid::regprocedure::text || ' ' "
            "                           || COALESCE(p.proconfig::text, '(none)'), '; '), '') "
            "FROM pg_proc p WHERE p.pronamespace = '%s'::regnamespace "
            "AND NOT COALESCE('search_path=pg_catalog, %s, pg_temp' = ANY (p.proconfig), "
            "false)",
            t_schema(), t_schema()) < 0)
        abort();
    char *unpinned = sql_text(cat, sql);
    free(sql);
    CHECK_STR(unpinned, ""); /* lists each function lacking SET search_path */
    free(unpinned);
}

static void test_pin_is_only_the_queue_schema(void)
{
    /* A client whose search_path holds more than the queue's schema: the
     * functions pin the first (current) schema alone, not the caller's
     * whole path, so objects in public can never shadow the queue's. */
    char wide[96];
    fresh_schema(wide, sizeof wide, "wide");
    PGconn *conn = t_pg();
    t_exec(conn, "SET search_path = %s, public, pg_temp", wide);
    pqmq_client *w = NULL;
    CHECK_OK(w, pqmq_wrap(conn, &w));
    CHECK_OK(w, pqmq_migrate(w));
    CHECK(t_sql_int(pg, "SELECT count(*) FROM pg_proc WHERE pronamespace = '%s'::regnamespace",
                    wide) >= 6);
    char *sql = NULL;
    if (asprintf(
            &sql,
            "SELECT COALESCE(string_agg(p.proname || ' ' "
            "                           || COALESCE(p.proconfig::text, '(none)'), '; '), '') "
            "FROM pg_proc p WHERE p.pronamespace = '%s'::regnamespace "
            "AND NOT COALESCE('search_path=pg_catalog, %s, pg_temp' = ANY (p.proconfig), "
            "false)",
            wide, wide) < 0)
        abort();
    char *unpinned = sql_text(cat, sql);
    free(sql);
    CHECK_STR(unpinned, "");
    free(unpinned);
    /* The caller's search_path is as it was. */
    char *path = sql_text(conn, "SHOW search_path");
    char want[160];
    snprintf(want, sizeof want, "%s, public, pg_temp", wide);
    CHECK_STR(path, want);
    free(path);
    pqmq_client_free(w);
    PQfinish(conn);
    drop_schema(wide);
}

static void test_seed_signatures(void)
{
    /* DESIGN.md section 2: these signatures must not change. */
    static const char *const sigs[] = {"mq_insert(@.mq_new_t[])",
                                       "mq_poll(text[], integer)",
                                       "mq_commit(uuid[])",
                                       "mq_delete(uuid[])",
                                       "mq_keep_alive(uuid[], interval)",
                                       "mq_checkpoint(uuid, interval, text, bytea, integer)"};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        char sig[256];
        const char *at = strchr(sigs[i], '@');
        if (at)
            snprintf(sig, sizeof sig, "%.*s%s%s", (int)(at - sigs[i]), sigs[i], t_schema(),
                     at + 1);
        else
            snprintf(sig, sizeof sig, "%s", sigs[i]);
        if (t_sql_int(cat, "SELECT (to_regprocedure('%s.%s') IS NOT NULL)::int", t_schema(),
                      sig) != 1)
            t_fail(__FILE__, __LINE__, "function %s is missing", sig);
    }
    char *poll =
        sql_text(pg, "SELECT pg_get_function_result('mq_poll(text[], integer)'::regprocedure)");
    CHECK_STR(poll, "TABLE(id uuid, is_committed boolean, name text, payload_json text, "
                    "payload_bytes bytea, retry_backoff interval, wait_time interval)");
    free(poll);
    char *fields = sql_text(pg, "SELECT string_agg(attname, ',' ORDER BY attnum) "
                                "FROM pg_attribute WHERE attrelid = 'mq_new_t'::regclass "
                                "AND attnum > 0 AND NOT attisdropped");
    CHECK_STR(fields, "id,delay,retries,retry_backoff,channel_name,channel_args,"
                      "commit_interval,ordered,name,payload_json,payload_bytes");
    free(fields);
}

static void test_qualified_calls_from_another_search_path(void)
{
    t_truncate();
    char other[96];
    fresh_schema(other, sizeof other, "elsewhere");
    PGconn *c = connect_path(other);
    const char *s = t_schema();

    /* The queue's schema really is not on this path. */
    PGresult *r = PQexec(c, "SELECT count(*) FROM mq_msgs");
    CHECK(PQresultStatus(r) == PGRES_FATAL_ERROR);
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "42P01");
    PQclear(r);

    /* Qualified calls work: everything the functions call unqualified
     * (tables, mq_limits, mq_pick_keys, mq_wake, ...) comes from the pinned path. */
    t_exec(c,
           "SELECT %s.mq_insert(ARRAY["
           "('00000000-0000-7000-8000-000000000001', NULL, 2, '10s', 'pin', 'a', NULL, true,"
           "  'first', '{\"n\": 1}', NULL)::%s.mq_new_t,"
           "('00000000-0000-7000-8000-000000000002', NULL, 2, '10s', 'pin', 'a', NULL, true,"
           "  'second', '{\"n\": 2}', NULL)::%s.mq_new_t,"
           "('00000000-0000-7000-8000-000000000003', NULL, 2, '10s', 'pin', 'b', '1h', false,"
           "  'pending', NULL, '\\x0102')::%s.mq_new_t])",
           s, s, s, s);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 3);
    CHECK_INT(t_sql_int(pg, "SELECT count(DISTINCT chain_seq) FROM mq_msgs"), 2);

    r = t_sql(c,
              "SELECT id, name, payload_json FROM %s.mq_poll(NULL, 10) "
              "WHERE id IS NOT NULL",
              s);
    CHECK(r && PQntuples(r) == 1);
    if (r && PQntuples(r) == 1) {
        CHECK_STR(PQgetvalue(r, 0, 0), "00000000-0000-7000-8000-000000000001");
        CHECK_STR(PQgetvalue(r, 0, 1), "first");
    }
    PQclear(r);

    t_exec(c,
           "SELECT %s.mq_keep_alive(ARRAY['00000000-0000-7000-8000-000000000001'::uuid], "
           "'30s')",
           s);
    t_exec(c,
           "SELECT %s.mq_checkpoint('00000000-0000-7000-8000-000000000001', '30s', "
           "'{\"n\": 10}', NULL, 1)",
           s);
    CHECK_INT(t_sql_int(pg, "SELECT (payload_json->>'n')::int FROM mq_payloads "
                            "WHERE id = '00000000-0000-7000-8000-000000000001'"),
              10);
    t_exec(c, "SELECT %s.mq_delete(ARRAY['00000000-0000-7000-8000-000000000001'::uuid])", s);
    t_exec(c, "SELECT %s.mq_commit(ARRAY['00000000-0000-7000-8000-000000000003'::uuid])", s);

    /* Completing the head released the next of the chain; the commit made
     * the two-phase one ready. */
    r = t_sql(c,
              "SELECT string_agg(name, ',' ORDER BY name) FROM %s.mq_poll(NULL, 10) "
              "WHERE id IS NOT NULL",
              s);
    CHECK(r && PQntuples(r) == 1);
    if (r && PQntuples(r) == 1)
        CHECK_STR(PQgetvalue(r, 0, 0), "pending,second");
    PQclear(r);

    /* Nothing leaked into the caller's schema. */
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM pg_class WHERE relnamespace = '%s'::regnamespace",
                        other),
              0);
    PQfinish(c);
    drop_schema(other);
    t_truncate();
}

/* ---- refusals ---------------------------------------------------------- */

static void test_migrate_inside_transaction_refused(void)
{
    PGconn *conn = t_pg();
    pqmq_client *w = NULL;
    CHECK_OK(w, pqmq_wrap(conn, &w));
    t_exec(conn, "BEGIN");
    t_exec(conn, "CREATE TEMP TABLE mine(x int)");
    CHECK_ERR(w, pqmq_migrate(w), PQMQ_EINVAL, "outside a transaction");
    /* The caller's transaction is untouched: still open, still usable. */
    CHECK(PQtransactionStatus(conn) == PQTRANS_INTRANS);
    CHECK_INT(t_sql_int(conn, "SELECT count(*) FROM mine"), 0);

    /* A failed transaction is refused the same way. */
    PQclear(PQexec(conn, "SELECT 1/0"));
    CHECK(PQtransactionStatus(conn) == PQTRANS_INERROR);
    CHECK_ERR(w, pqmq_migrate(w), PQMQ_EINVAL, "outside a transaction");
    CHECK(PQtransactionStatus(conn) == PQTRANS_INERROR);
    t_exec(conn, "ROLLBACK");

    /* Outside a transaction the same client migrates fine. */
    CHECK_OK(w, pqmq_migrate(w));
    CHECK(PQtransactionStatus(conn) == PQTRANS_IDLE);
    pqmq_client_free(w);
    PQfinish(conn);
}

static void test_migrate_without_schema_refused(void)
{
    PGconn *conn = t_pg();
    pqmq_client *w = NULL;
    CHECK_OK(w, pqmq_wrap(conn, &w));
    /* (Other programs may create schemas meanwhile: only look where this
     * session could have created something.) */
    const char *where = "SELECT count(*) FROM pg_class WHERE relname LIKE 'mq%' AND "
                        "relnamespace IN (to_regnamespace('public'), pg_my_temp_schema())";
    long long before = t_sql_int(conn, "%s", where);

    t_exec(conn, "SET search_path = ''");
    CHECK_ERR(w, pqmq_migrate(w), PQMQ_ESCHEMA, "search_path");
    CHECK(PQtransactionStatus(conn) == PQTRANS_IDLE);

    char missing[96];
    snprintf(missing, sizeof missing, "%s_missing", t_schema());
    t_exec(conn, "SET search_path = %s", missing);
    CHECK_ERR(w, pqmq_migrate(w), PQMQ_ESCHEMA, "search_path");
    CHECK(PQtransactionStatus(conn) == PQTRANS_IDLE);

    /* Nothing was created (e.g. in pg_temp or public). */
    t_exec(conn, "RESET search_path");
    CHECK_INT(t_sql_int(conn, "%s", where), before);
    pqmq_client_free(w);
    PQfinish(conn);
}

static void test_schema_name_needing_quotes(void)
{
    char odd[96];
    snprintf(odd, sizeof odd, "%s_Odd \"Name\"", t_schema());
    char ident[128];
    snprintf(ident, sizeof ident, "\"%s_Odd \"\"Name\"\"\"", t_schema());
    t_exec(pg, "DROP SCHEMA IF EXISTS %s CASCADE", ident);
    t_exec(pg, "CREATE SCHEMA %s", ident);
    PGconn *conn = t_pg();
    t_exec(conn, "SET search_path = %s", ident);
    pqmq_client *w = NULL;
    CHECK_OK(w, pqmq_wrap(conn, &w));
    CHECK_OK(w, pqmq_migrate(w));
    pqmq_msg *m = t_msg("odd", NULL, "n", "{}", 1);
    CHECK_OK(w, pqmq_insert(w, &m, 1));
    pqmq_batch *b = NULL;
    CHECK_OK(w, pqmq_poll(w, NULL, 0, 5, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_OK(w, pqmq_complete_batch(w, b));
    pqmq_batch_free(b);
    CHECK_INT(t_sql_int(pg, "SELECT max(version) FROM %s.mq_schema_migrations", ident),
              pqmq_schema_version());
    /* Its functions pin pg_catalog, exactly that schema (quoted) and pg_temp. */
    CHECK(t_sql_int(pg,
                    "SELECT count(*) FROM pg_proc p JOIN pg_namespace n "
                    "ON n.oid = p.pronamespace WHERE n.nspname = '%s'",
                    odd) >= 6);
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM pg_proc p JOIN pg_namespace n "
                        "ON n.oid = p.pronamespace WHERE n.nspname = '%s' "
                        "AND NOT COALESCE(('search_path=pg_catalog, ' "
                        "|| quote_ident(n.nspname) || ', pg_temp') "
                        "= ANY (p.proconfig), false)",
                        odd),
              0);
    pqmq_msg_free(m);
    pqmq_client_free(w);
    PQfinish(conn);
    t_exec(pg, "DROP SCHEMA %s CASCADE", ident);
}

int main(void)
{
    t_init("migrate");
    q = t_client();
    pg = t_pg();
    cat = connect_path("pg_catalog");
    T_RUN(test_one_row_per_migration);
    T_RUN(test_migrate_again_changes_nothing);
    T_RUN(test_reapplying_every_migration_is_harmless);
    T_RUN(test_concurrent_migrate);
    T_RUN(test_psql_applies_the_same_schema);
    T_RUN(test_upgrade_to_one_row_keeps_payloads_and_grants);
    T_RUN(test_schema_files_match_the_migrations);
    T_RUN(test_every_function_pins_search_path);
    T_RUN(test_pin_is_only_the_queue_schema);
    T_RUN(test_seed_signatures);
    T_RUN(test_qualified_calls_from_another_search_path);
    T_RUN(test_migrate_inside_transaction_refused);
    T_RUN(test_migrate_without_schema_refused);
    T_RUN(test_schema_name_needing_quotes);
    pqmq_client_free(q);
    PQfinish(pg);
    PQfinish(cat);
    return t_done();
}
