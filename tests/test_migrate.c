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
#include <unistd.h>

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
 * definitions (SET clauses included), types, triggers, and the newest
 * recorded version (an upgraded queue also keeps the rows of the versions
 * it went through). Columns carry their positions, except mq_rows' when
 * !positions: an upgraded queue's mq_rows keeps its columns where they were
 * and has those added since at its end. Caller frees.
 */
static char *fingerprint_of(const char *schema, int positions)
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
            "  SELECT 'col ' || c.relname || '.' || a.attname "
            "         || CASE WHEN %d = 0 AND c.relname = 'mq_rows' THEN '' "
            "                 ELSE ' #' || a.attnum END || ' ' "
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
            schema, positions) < 0)
        abort();
    char *objects = sql_text(cat, sql);
    free(sql);
    if (asprintf(
            &sql,
            "SELECT COALESCE((SELECT version || ' ' || name FROM \"%s\".mq_schema_migrations "
            "                 ORDER BY version DESC LIMIT 1), '')",
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

static char *fingerprint(const char *schema)
{
    return fingerprint_of(schema, 1);
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
                     "%s -X -q -1 -v ON_ERROR_STOP=1 -d %s -f %s >/dev/null",
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

/* The generated install script (pqmq.sql, which make check names in
 * $PQMQ_INSTALL_SQL), applied with psql into schema in one transaction. */
static int psql_apply(const char *psql, const char *schema)
{
    const char *file = getenv("PQMQ_INSTALL_SQL");
    if (!file || !*file) {
        t_fail(__FILE__, __LINE__, "PQMQ_INSTALL_SQL is not set (make check sets it)");
        return -1;
    }
    char *files[] = {(char *)file};
    return psql_apply_files(psql, schema, files, 1, "");
}

/* Release 0.1.0's schema (tests/fixtures/pqmq-0.1.0.sql.gz: the SQL its
 * pqmq_migrate applied), applied with psql into schema. */
static int psql_apply_0_1_0(const char *psql, const char *schema)
{
    char gz[4300], *sql = NULL;
    snprintf(gz, sizeof gz, "%s/../tests/fixtures/pqmq-0.1.0.sql.gz", migrations_dir());
    if (asprintf(&sql, "%s/tmp-pqmq-0.1.0-%d.sql", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
                 (int)getpid()) < 0)
        abort();
    char *qgz = sh_quote(gz), *qsql = sh_quote(sql), *cmd = NULL;
    if (asprintf(&cmd, "gzip -dc %s > %s", qgz, qsql) < 0)
        abort();
    int status = system(cmd);
    if (status != 0)
        t_fail(__FILE__, __LINE__, "%s exited with status %d", cmd, status);
    else
        status = psql_apply_files(psql, schema, &sql, 1, "");
    unlink(sql);
    free(cmd);
    free(qgz);
    free(qsql);
    free(sql);
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

/* A new queue records one version, this release's; the library embeds
 * every file of migrations/ and schema/ (an unlisted file would never run),
 * the steps from older queues before the tables and the duties last. */
static void test_one_version_recorded(void)
{
    CHECK_INT(pqmq_schema_version(), 100);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_schema_migrations"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_schema_migrations "
                            "WHERE version = 100 AND name = '1.0.0'"),
              1);
    const char *want[] = {"migrations/sqlxmq_set_aside",
                          "migrations/0.1.0_to_1.0.0",
                          "schema/tables",
                          "schema/log_tables",
                          "schema/views",
                          "migrations/sqlxmq_import"};
    const char *name = NULL;
    int v = 0;
    size_t n = 0;
    for (; pqmq_migration_info(n, &v, &name, NULL) == PQMQ_OK; n++) {
        CHECK_INT(v, 100);
        if (n < sizeof want / sizeof *want)
            CHECK_STR(name, want[n]);
    }
    CHECK(n > 10);
    CHECK(pqmq_migration_info(n - 1, NULL, &name, NULL) == PQMQ_OK);
    CHECK_STR(name, "schema/roles");
    CHECK_INT(pqmq_migration_info(n, NULL, NULL, NULL), PQMQ_EINVAL);
    /* Every .sql file of both directories is among them. */
    static char sdir[4096];
    source_dir("PQMQ_SCHEMA_DIR", "schema", sdir, sizeof sdir);
    const char *dirs[] = {migrations_dir(), sdir};
    for (int d = 0; d < 2; d++) {
        char pattern[4200];
        snprintf(pattern, sizeof pattern, "%s/*.sql", dirs[d]);
        glob_t g;
        memset(&g, 0, sizeof g);
        CHECK(glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc >= 3);
        for (size_t i = 0; i < g.gl_pathc; i++) {
            char file[256];
            const char *base = strrchr(g.gl_pathv[i], '/') + 1;
            snprintf(file, sizeof file, "%s/%.*s", d ? "schema" : "migrations",
                     (int)(strlen(base) - 4), base);
            int found = 0;
            for (size_t k = 0; pqmq_migration_info(k, NULL, &name, NULL) == PQMQ_OK; k++)
                found |= !strcmp(name, file);
            if (!found)
                t_fail(__FILE__, __LINE__, "%s is not embedded", file);
        }
        globfree(&g);
    }
}

/* ---- idempotence ------------------------------------------------------- */

static void test_migrate_again_changes_nothing(void)
{
    char *before = fingerprint(t_schema());
    /* Not a vacuous fingerprint: it sees the queue's objects. */
    CHECK(strstr(before, "fn CREATE OR REPLACE FUNCTION @S.mq_insert(") != NULL);
    /* The messages' table (mq_rows keeps mq_msgs' index names), the log,
     * and the view mq_msgs over both. */
    CHECK(strstr(before, "idx CREATE UNIQUE INDEX mq_msgs_pkey ON @S.mq_rows") != NULL);
    CHECK(strstr(before, "col mq_rows.id #1 uuid not null") != NULL);
    CHECK(strstr(before, "rel mq_log r") != NULL);
    CHECK(strstr(before, "rel mq_msgs v") != NULL);
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

static void test_reapplying_every_file_is_harmless(void)
{
    /* Forget the version, so that pqmq_migrate runs every file again over
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
        CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM %s.mq_schema_migrations", schema), 1);
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

/* ---- upgrades ----------------------------------------------------------- */

#define UP_C1 "00000000-0000-7000-8000-0000000000c1"
#define UP_U1 "00000000-0000-7000-8000-0000000000e1"
#define UP_U3 "00000000-0000-7000-8000-0000000000e3"

/* Live messages of every kind in schema s: a chain of three on up/x, an
 * unordered one with bytes, a delayed one, an uncommitted two-phase one;
 * then the chain's head and the unordered one are claimed (in flight). */
static void fill_live_queue(const char *s)
{
    t_exec(
        pg,
        "SELECT %1$s.mq_insert(ARRAY["
        "ROW('" UP_C1 "', NULL, 3, '1 hour', 'up', 'x', NULL, true, 'c', '{\"n\": 1}', NULL),"
        "ROW('00000000-0000-7000-8000-0000000000c2', NULL, 3, '1 hour', 'up', 'x', NULL, true,"
        "    'c', '{\"n\": 2}', NULL),"
        "ROW('00000000-0000-7000-8000-0000000000c3', NULL, 3, '1 hour', 'up', 'x', NULL, true,"
        "    'c', '{\"n\": 3}', NULL),"
        "ROW('" UP_U1 "', NULL, 3, '1 hour', 'up', '', NULL, false, 'u', NULL, '\\x0102'),"
        "ROW('00000000-0000-7000-8000-0000000000e2', '1 hour', 3, '1 hour', 'up', '', NULL,"
        "    false, 'later', '{}', NULL),"
        "ROW('" UP_U3 "', NULL, 3, '1 hour', 'up', '', '1 hour', false, 'pending', '{}', NULL)"
        "]::%1$s.mq_new_t[])",
        s);
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM %s.mq_claim(ARRAY['up'], 10) "
                        "WHERE id IS NOT NULL",
                        s),
              2);
}

/* Every message's identity, timing, attempts and payload, as one text. */
static char *queue_content(const char *s)
{
    char *sql = NULL;
    if (asprintf(&sql,
                 "SELECT string_agg(concat_ws('|', id, channel_name, channel_args, name, "
                 "payload_json, payload_bytes, attempt_at, attempts, retry_backoff, "
                 "commit_interval, deliveries, dead_since), E'\\n' ORDER BY id) "
                 "FROM \"%s\".mq_msgs",
                 s) < 0)
        abort();
    char *text = sql_text(pg, sql);
    free(sql);
    return text;
}

/* The next job of channel up in schema s (its name and payload), completed;
 * "" when none is ready. Caller frees. */
static char *take_one(pqmq_client *c)
{
    const char *ch[] = {"up"};
    pqmq_batch *b = NULL;
    CHECK_OK(c, pqmq_poll(c, ch, 1, 1, &b));
    char *got = strdup("");
    if (b && pqmq_batch_count(b) == 1) {
        const pqmq_job *j = pqmq_batch_job(b, 0);
        free(got);
        if (asprintf(&got, "%s %s", pqmq_job_name(j),
                     pqmq_job_json(j) ? pqmq_job_json(j) : "") < 0)
            abort();
        CHECK_OK(c, pqmq_complete_batch(c, b));
    }
    pqmq_batch_free(b);
    return got;
}

/* Fills s (size bytes) with the name of a new schema made by release
 * 0.1.0's script; returns the psql that applied it, or NULL when the test
 * does not run (no psql; Citus). */
static const char *schema_0_1_0(char *s, size_t size, const char *tag)
{
    const char *psql = find_psql();
    if (!psql || t_citus_skip("release 0.1.0's script is applied with psql"))
        return NULL;
    fresh_schema(s, size, tag);
    CHECK_INT(psql_apply_0_1_0(psql, s), 0);
    return psql;
}

/* Schema s, upgraded, has the catalog of a new install (mq_rows' columns
 * in any order) and still holds before, its queue's content before the
 * upgrade. */
static void check_upgraded(const char *s, const char *before)
{
    char *want = fingerprint_of(t_schema(), 0);
    char *got = fingerprint_of(s, 0);
    CHECK_SAME_FP(want, got);
    char *after = queue_content(s);
    CHECK_STR(after, before);
    free(want);
    free(got);
    free(after);
}

/* A queue made by release 0.1.0, with messages of every kind live (a chain
 * in flight among them) and a role holding a duty, upgraded by
 * pqmq_migrate: the same catalog as a new install, every message as it was,
 * the role's duty kept, and the chain goes on in order. */
static void test_upgrade_from_0_1_0_loses_nothing(void)
{
    const char *psql = find_psql();
    if (!psql) {
        printf("    note: psql is not installed; skipping the upgrade from 0.1.0\n");
        return;
    }
    if (t_citus_skip("release 0.1.0's script is applied with psql"))
        return;
    char s[96];
    fresh_schema(s, sizeof s, "v010");
    CHECK_INT(psql_apply_0_1_0(psql, s), 0);
    CHECK_INT(t_sql_int(pg, "SELECT max(version) FROM %s.mq_schema_migrations", s), 17);
    fill_live_queue(s);
    t_exec(pg, "DO $$ BEGIN CREATE ROLE pqmq_t_up NOLOGIN; "
               "EXCEPTION WHEN duplicate_object THEN NULL; END $$");
    t_exec(pg, "SELECT %s.mq_grant('consume', 'pqmq_t_up')", s);
    t_exec(pg, "SELECT mq_grant('consume', 'pqmq_t_up')"); /* the fresh one, to compare */
    char *before = queue_content(s);
    CHECK(strstr(before, UP_C1 "|up|x|c|{\"n\": 1}") != NULL);

    pqmq_client *c = client_path(s);
    CHECK_OK(c, pqmq_migrate(c));
    CHECK_INT(t_sql_int(pg, "SELECT max(version) FROM %s.mq_schema_migrations", s), 100);
    check_upgraded(s, before);
    /* The duty's holder may call every function of the duty, old or new. */
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM pg_proc p JOIN %1$s.mq_duties() d "
                        "ON d.function_name = p.proname AND d.duty = 'consume' "
                        "WHERE p.pronamespace = '%1$s'::regnamespace "
                        "AND NOT has_function_privilege('pqmq_t_up', p.oid, 'EXECUTE')",
                        s),
              0);
    CHECK(t_sql_int(pg,
                    "SELECT count(*) FROM pg_proc p JOIN %1$s.mq_duties() d "
                    "ON d.function_name = p.proname AND d.duty = 'consume' "
                    "WHERE p.pronamespace = '%1$s'::regnamespace",
                    s) > 10);

    /* The chain's head is in flight: nothing of the chain is ready. Once it
     * completes, the rest comes in order; the two-phase one once committed. */
    char *next = take_one(c);
    CHECK_STR(next, "");
    free(next);
    t_exec(pg, "SELECT %s.mq_delete(ARRAY['" UP_C1 "'::uuid])", s);
    next = take_one(c);
    CHECK_STR(next, "c {\"n\": 2}");
    free(next);
    next = take_one(c);
    CHECK_STR(next, "c {\"n\": 3}");
    free(next);
    t_exec(pg, "SELECT %s.mq_commit(ARRAY['" UP_U3 "'::uuid])", s);
    next = take_one(c);
    CHECK_STR(next, "pending {}");
    free(next);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM %s.mq_msgs", s), 2); /* in flight, delayed */

    t_exec(pg, "SELECT mq_revoke('consume', 'pqmq_t_up')");
    pqmq_client_free(c);
    free(before);
    drop_schema(s);
    t_exec(pg, "DROP OWNED BY pqmq_t_up");
    t_exec(pg, "DROP ROLE pqmq_t_up");
}

/* The same upgrade by psql with the install script gives the same catalog,
 * and the library then finds nothing to do. */
static void test_upgrade_from_0_1_0_with_psql(void)
{
    char s[96];
    const char *psql = schema_0_1_0(s, sizeof s, "v010p");
    if (!psql)
        return;
    fill_live_queue(s);
    char *before = queue_content(s);
    CHECK_INT(psql_apply(psql, s), 0);
    check_upgraded(s, before);
    free(before);
    drop_schema(s);
}

/* A role that read 0.1.0's table mq_msgs reads the view of that name
 * after the upgrade (and mq_rows, the table, keeps its grant). */
static void test_upgrade_keeps_readers_of_mq_msgs(void)
{
    char s[96];
    const char *psql = schema_0_1_0(s, sizeof s, "v010g");
    if (!psql)
        return;
    fill_live_queue(s);
    t_exec(pg, "DO $$ BEGIN CREATE ROLE pqmq_t_rd NOLOGIN; "
               "EXCEPTION WHEN duplicate_object THEN NULL; END $$");
    t_exec(pg, "GRANT USAGE ON SCHEMA %s TO pqmq_t_rd", s);
    t_exec(pg, "GRANT SELECT ON %s.mq_msgs TO pqmq_t_rd", s);
    int live = t_sql_int(pg, "SELECT count(*) FROM %s.mq_msgs", s);
    CHECK(live > 0);
    CHECK_INT(psql_apply(psql, s), 0);
    CHECK_INT(
        t_sql_int(
            pg, "SELECT (relkind = 'v')::int FROM pg_class WHERE oid = '%s.mq_msgs'::regclass",
            s),
        1);
    t_exec(pg, "SET ROLE pqmq_t_rd");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM %s.mq_msgs", s), live);
    t_exec(pg, "RESET ROLE");
    CHECK_INT(t_sql_int(pg,
                        "SELECT has_table_privilege('pqmq_t_rd', '%s.mq_rows', 'SELECT')::int",
                        s),
              1);
    drop_schema(s);
    t_exec(pg, "DROP OWNED BY pqmq_t_rd");
    t_exec(pg, "DROP ROLE pqmq_t_rd");
}

/* Versions 1 to 16 were never released and a newer version is not this
 * release's to touch: each is refused, naming the version, and nothing
 * changes. */
static void test_other_versions_refused(void)
{
    char s[96];
    if (!schema_0_1_0(s, sizeof s, "vdev"))
        return;
    t_exec(pg, "DELETE FROM %s.mq_schema_migrations WHERE version > 12", s);
    char *before = fingerprint(s);
    pqmq_client *c = client_path(s);
    CHECK_ERR(c, pqmq_migrate(c), PQMQ_ESERVER, "is at version 12, which release 1.0.0");
    char *after = fingerprint(s);
    CHECK_SAME_FP(before, after);
    /* A newer queue, likewise. */
    pqmq_client_free(c);
    drop_schema(s);
    fresh_schema(s, sizeof s, "vnew");
    c = client_path(s);
    CHECK_OK(c, pqmq_migrate(c));
    t_exec(pg, "INSERT INTO %s.mq_schema_migrations (version, name) VALUES (101, 'next')", s);
    CHECK_ERR(c, pqmq_migrate(c), PQMQ_ESERVER, "is at version 101");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM %s.mq_schema_migrations", s), 2);
    pqmq_client_free(c);
    free(before);
    free(after);
    drop_schema(s);
}

/* ---- pinned search_path ------------------------------------------------ */

/* The queue's schema, then pg_temp: written last, a caller's temporary
 * table cannot stand in for a queue table. */
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
            "AND p.prosqlbody IS NULL "
            "AND NOT COALESCE('search_path=pg_catalog, %s, pg_temp' = ANY (p.proconfig), "
            "false)",
            t_schema(), t_schema()) < 0)
        abort();
    char *unpinned = sql_text(cat, sql);
    free(sql);
    CHECK_STR(unpinned, ""); /* lists each function lacking SET search_path */
    free(unpinned);
    /* The exceptions: standard SQL bodies, whose names were resolved when
     * they were created, for the planner to inline (it never inlines a
     * function with settings; test_locked and test_plans check that it
     * does), or, _mq_at, to spare each call the settings. _mq_locker_died
     * is inlined into the claims, as _mq_lane_admits and _mq_rows_share
     * into the polls; _mq_log_given is
     * called once per place a scan tests, as _mq_at; _mq_log_lease and
     * _mq_log_lease_end are IMMUTABLE arithmetic on their arguments. They
     * have no settings at all, and PUBLIC may not call them. */
    PGresult *r = t_sql(cat,
                        "SELECT string_agg(p.proname || ' ' || COALESCE(p.proconfig::text, "
                        "'(none)') || ' ' || has_function_privilege('public', p.oid, "
                        "'EXECUTE')::text, '; ' ORDER BY p.proname) "
                        "FROM pg_proc p WHERE p.pronamespace = '%s'::regnamespace "
                        "AND p.prosqlbody IS NOT NULL",
                        t_schema());
    CHECK_STR(PQgetvalue(r, 0, 0),
              "_mq_at (none) false; _mq_claimable (none) false; _mq_in (none) false; "
              "_mq_in_channel (none) false; _mq_lane_admits (none) false; "
              "_mq_locker_died (none) false; "
              "_mq_log_given (none) false; _mq_log_lease (none) false; "
              "_mq_log_lease_end (none) false; _mq_rows_share (none) false; "
              "_mq_walk_next (none) false");
    PQclear(r);
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
            "AND p.prosqlbody IS NULL "
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
    /* DESIGN.md section 3: these signatures must not change. */
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
     * (tables, _mq_limits, _mq_pick_keys, _mq_wake, ...) comes from the pinned path. */
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
                        "AND p.prosqlbody IS NULL "
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
    T_RUN(test_one_version_recorded);
    T_RUN(test_migrate_again_changes_nothing);
    T_RUN(test_reapplying_every_file_is_harmless);
    T_RUN(test_concurrent_migrate);
    T_RUN(test_psql_applies_the_same_schema);
    T_RUN(test_upgrade_from_0_1_0_loses_nothing);
    T_RUN(test_upgrade_from_0_1_0_with_psql);
    T_RUN(test_upgrade_keeps_readers_of_mq_msgs);
    T_RUN(test_other_versions_refused);
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
