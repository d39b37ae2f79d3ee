/*
 * test_hardening_three.c: the third round of hostile and careless callers
 * (issue 52): an install under a search_path that puts a schema others
 * create in ahead of pg_catalog; ids that the payload view cannot rewrite.
 *
 * The install tests run in a database of their own, whose public schema a
 * hostile role plants functions and operators in; roles and the database
 * are named after this process and dropped at the end. The other tests
 * run in the harness's schema.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* asprintf */
#endif
#include <stdlib.h>
#include <unistd.h>
#include <uuid/uuid.h>

#include "harness.h"

static PGconn *su; /* the harness's (superuser) connection */

/* A connection to database db with this search_path. Caller PQfinish'es. */
static PGconn *connect_db(const char *db, const char *path)
{
    char options[200];
    snprintf(options, sizeof options, "-c search_path=%s -c client_min_messages=warning", path);
    const char *keys[] = {"dbname", "dbname", "options", NULL};
    const char *vals[] = {t_dsn(), db, options, NULL};
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "cannot connect to %s: %s", db, PQerrorMessage(c));
        exit(1);
    }
    return c;
}

/* The whole install script (PQMQ_INSTALL_SQL), or NULL. Caller frees. */
static char *install_sql(void)
{
    const char *path = getenv("PQMQ_INSTALL_SQL");
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f)
        return NULL;
    char *sql = calloc(1, 1 << 21);
    size_t n = sql ? fread(sql, 1, (1 << 21) - 1, f) : 0;
    fclose(f);
    if (!n) {
        free(sql);
        return NULL;
    }
    return sql;
}

/* Runs psql (flags: "-1" or "") with pqmq.sql on database db under the
 * path q, public, pg_catalog; returns its exit status (-1: not run). When
 * needle is given, psql's output must contain it. */
static int psql_install(const char *db, const char *flags, const char *needle)
{
    const char *path = getenv("PQMQ_INSTALL_SQL");
    char *cmd = NULL, out[8192] = "";
    if (!path ||
        asprintf(
            &cmd,
            "PGOPTIONS='-c search_path=q,public,pg_catalog -c client_min_messages=warning' "
            "psql -X -q %s -v ON_ERROR_STOP=1 -d '%s dbname=%s' -f '%s' 2>&1",
            flags, t_dsn(), db, path) < 0)
        return -1;
    FILE *p = popen(cmd, "r");
    free(cmd);
    if (!p)
        return -1;
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    if (needle && !strstr(out, needle))
        t_fail(__FILE__, __LINE__, "psql's output lacks \"%s\": %s", needle, out);
    else if (!needle && st != 0)
        printf("    # psql: %s\n", out);
    return st;
}

/* ---- the install's search path ------------------------------------------ */

/* mallory's plants in public: now(), hashtext() and the comparison
 * operators of the types the queue compares, plus + where it adds. Each
 * records that it ran and, when its caller is a superuser, makes her one. */
static void plant(PGconn *c, const char *mallory)
{
    t_exec(c, "CREATE TABLE public.mallory_log (what text, query text)");
    t_exec(c, "GRANT ALL ON public.mallory_log TO PUBLIC");
    t_exec(c, "GRANT CREATE ON SCHEMA public TO %s", mallory);
    t_exec(c, "SET ROLE %s", mallory);
    t_exec(c,
           "CREATE FUNCTION public.mallory_hit(what text) RETURNS void LANGUAGE plpgsql "
           "SET search_path = pg_catalog AS $$ BEGIN "
           "INSERT INTO public.mallory_log VALUES (what, left(current_query(), 300)); "
           "BEGIN EXECUTE 'ALTER ROLE %s SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END; "
           "END $$",
           mallory);
    t_exec(c, "CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE plpgsql VOLATILE "
              "SET search_path = pg_catalog AS $$ BEGIN PERFORM public.mallory_hit('now'); "
              "RETURN pg_catalog.now(); END $$");
    t_exec(c,
           "CREATE FUNCTION public.hashtext(text) RETURNS int LANGUAGE plpgsql "
           "SET search_path = pg_catalog AS $$ BEGIN PERFORM public.mallory_hit('hashtext'); "
           "RETURN pg_catalog.hashtext($1); END $$");
    t_exec(c, "DO $$ DECLARE t text; o record; BEGIN "
              "FOREACH t IN ARRAY ARRAY['smallint', 'int', 'bigint', 'text', 'uuid', "
              "'timestamptz', 'interval', 'boolean', 'xid'] LOOP "
              "FOR o IN SELECT * FROM (VALUES ('=', 'eq'), ('<>', 'ne'), ('<', 'lt'), "
              "('<=', 'le'), ('>', 'gt'), ('>=', 'ge')) v(op, nm) LOOP "
              "CONTINUE WHEN t = 'xid' AND o.op NOT IN ('=', '<>'); "
              "EXECUTE format('CREATE FUNCTION public.m_%%s_%%s(a %%s, b %%s) RETURNS boolean "
              "LANGUAGE plpgsql SET search_path = pg_catalog AS $b$ BEGIN "
              "PERFORM public.mallory_hit(%%L); RETURN a OPERATOR(pg_catalog.%%s) b; END $b$', "
              "o.nm, t, t, t, t || ' ' || o.op, o.op); "
              "EXECUTE format('CREATE OPERATOR public.%%s (LEFTARG = %%s, RIGHTARG = %%s, "
              "FUNCTION = public.m_%%s_%%s)', o.op, t, t, o.nm, t); "
              "END LOOP; END LOOP; END $$");
    t_exec(c, "CREATE FUNCTION public.m_add(a timestamptz, b interval) RETURNS timestamptz "
              "LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN "
              "PERFORM public.mallory_hit('timestamptz + interval'); "
              "RETURN a OPERATOR(pg_catalog.+) b; END $$");
    t_exec(c, "CREATE OPERATOR public.+ (LEFTARG = timestamptz, RIGHTARG = interval, "
              "FUNCTION = public.m_add)");
    t_exec(c, "RESET ROLE");
}

/* What the queue in schema q of the database of c binds to and runs: no
 * object of its depends on one of public's, no function pins a path with
 * public, mallory is no superuser, and a producer's insert and a consumer's
 * poll (under the installer's path) run none of her functions. */
static void check_install(const char *db, PGconn *c, const char *mallory, const char *route)
{
    printf("    # %s\n", route);
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM public.mallory_log"), 0);
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM pg_depend d WHERE d.classid <> "
                           "'pg_operator'::regclass AND ((d.refclassid = 'pg_proc'::regclass "
                           "AND d.refobjid IN (SELECT oid FROM pg_proc WHERE pronamespace = "
                           "'public'::regnamespace)) OR (d.refclassid = "
                           "'pg_operator'::regclass AND d.refobjid IN (SELECT oid FROM "
                           "pg_operator WHERE oprnamespace = 'public'::regnamespace)))"),
              0);
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM pg_proc p, unnest(p.proconfig) s "
                           "WHERE p.pronamespace = 'q'::regnamespace "
                           "AND s LIKE 'search_path=%%' AND s NOT IN ('search_path=q', "
                           "'search_path=pg_catalog, q, pg_temp')"),
              0);
    /* The defaults name pg_catalog's now(), as a reader whose path puts
     * public first sees them (compared here, not by the server's = under
     * that path). */
    PGconn *rc = connect_db(db, "public,pg_catalog");
    PGresult *r = PQexec(
        rc, "SELECT pg_catalog.pg_get_expr(a.adbin, a.adrelid) FROM "
            "pg_catalog.pg_attrdef a JOIN pg_catalog.pg_attribute t ON "
            "(t.attrelid, t.attnum) OPERATOR(pg_catalog.=) (a.adrelid, a.adnum) "
            "WHERE a.adrelid OPERATOR(pg_catalog.=) 'q.mq_msgs'::pg_catalog.regclass "
            "AND t.attname OPERATOR(pg_catalog.=) ANY ('{created_at,attempt_at,ready_at}')");
    CHECK_INT(PQntuples(r), 3);
    for (int i = 0; i < PQntuples(r); i++)
        CHECK_STR(PQgetvalue(r, i, 0), "pg_catalog.now()");
    PQclear(r);
    PQfinish(rc);

    /* A producer and a consumer whose path names public too (after
     * pg_catalog, which PostgreSQL searches first when the path leaves it
     * out). */
    PGconn *pc = connect_db(db, "q,public");
    pqmq_client *p = NULL;
    CHECK_INT(pqmq_wrap(pc, &p), 0);
    pqmq_msg *m = t_msg("h3", "", "planted", "{\"n\": 1}", 1);
    CHECK_OK(p, pqmq_insert(p, &m, 1));
    pqmq_msg_free(m);
    const char *chan[] = {"h3"};
    pqmq_batch *b = NULL;
    CHECK_OK(p, pqmq_poll(p, chan, 1, 5, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    if (b && pqmq_batch_count(b) == 1)
        CHECK_OK(p, pqmq_complete_batch(p, b));
    pqmq_batch_free(b);
    pqmq_client_free(p);
    PQfinish(pc);
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM public.mallory_log"), 0);
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM pg_roles WHERE rolname = '%s' AND rolsuper",
                        mallory),
              0);
    r = t_sql(c, "SELECT DISTINCT what || ': ' || query FROM public.mallory_log LIMIT 5");
    for (int i = 0; r && i < PQntuples(r); i++)
        printf("    # mallory's %s\n", PQgetvalue(r, i, 0));
    PQclear(r);
}

static void test_install_binds_pg_catalog_whatever_the_path(void)
{
    long pid = (long)getpid();
    char db[64], mallory[64];
    snprintf(db, sizeof db, "t_h3_%ld_db", pid);
    snprintf(mallory, sizeof mallory, "t_h3_%ld_mallory", pid);
    t_exec(su, "DROP DATABASE IF EXISTS %s", db);
    t_exec(su, "DROP ROLE IF EXISTS %s", mallory);
    t_exec(su, "CREATE ROLE %s NOLOGIN", mallory);
    t_exec(su, "CREATE DATABASE %s", db);
    PGconn *c = connect_db(db, "q");
    plant(c, mallory);

    /* The psql route: the script, under the installer's path. */
    t_exec(c, "CREATE SCHEMA q");
    CHECK_INT(psql_install(db, "-1", NULL), 0);
    check_install(db, c, mallory, "psql -1 -f pqmq.sql");
    /* The script, sent as one query string (an implicit transaction), as
     * a client in another language may; its path ends with it. */
    t_exec(c, "DROP SCHEMA q CASCADE");
    t_exec(c, "TRUNCATE public.mallory_log");
    t_exec(c, "CREATE SCHEMA q");
    char *sql = install_sql();
    CHECK(sql != NULL);
    if (sql) {
        PGconn *ic = connect_db(db, "q,public,pg_catalog");
        PGresult *r = PQexec(ic, sql);
        if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
            t_fail(__FILE__, __LINE__, "pqmq.sql: %s", PQresultErrorMessage(r));
        PQclear(r);
        r = PQexec(ic, "SHOW search_path");
        CHECK_STR(PQresultStatus(r) == PGRES_TUPLES_OK ? PQgetvalue(r, 0, 0) : "",
                  "q,public,pg_catalog");
        PQclear(r);
        PQfinish(ic);
        free(sql);
        check_install(db, c, mallory, "pqmq.sql in one query string");
    }
    /* Without -1, the script stops at once: its path would end with its
     * first statement. */
    t_exec(c, "DROP SCHEMA q CASCADE");
    t_exec(c, "TRUNCATE public.mallory_log");
    t_exec(c, "CREATE SCHEMA q");
    CHECK(psql_install(db, "", "must run in one transaction") != 0);
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM pg_class WHERE relnamespace = "
                           "'q'::regnamespace"),
              0);

    /* pqmq_migrate, under the same path. */
    t_exec(c, "DROP SCHEMA q CASCADE");
    t_exec(c, "TRUNCATE public.mallory_log");
    t_exec(c, "CREATE SCHEMA q");
    PGconn *mc = connect_db(db, "q,public,pg_catalog");
    pqmq_client *w = NULL;
    CHECK_INT(pqmq_wrap(mc, &w), 0);
    CHECK_OK(w, pqmq_migrate(w));
    pqmq_client_free(w);
    PQfinish(mc);
    check_install(db, c, mallory, "pqmq_migrate");

    PQfinish(c);
    t_exec(su, "DROP DATABASE %s", db);
    t_exec(su, "DROP ROLE %s", mallory);
}

/* ---- the payload view ---------------------------------------------------- */

/* A role with only UPDATE (and SELECT) on mq_payloads cannot give a message
 * a new id: its key row would keep the old one, and a second live message
 * with the same unique key could then be inserted. */
static void test_payload_view_keeps_ids(void)
{
    char editor[64];
    snprintf(editor, sizeof editor, "t_h3_%ld_editor", (long)getpid());
    t_exec(su, "DROP ROLE IF EXISTS %s", editor);
    t_exec(su, "CREATE ROLE %s NOLOGIN", editor);
    t_exec(su, "GRANT USAGE ON SCHEMA \"%s\" TO %s", t_schema(), editor);
    t_exec(su, "GRANT SELECT, UPDATE ON mq_payloads TO %s", editor);
    pqmq_client *q = t_client();
    pqmq_msg *m = t_msg("h3keys", "", "keyed", "{}", 0);
    pqmq_msg_set_unique_key(m, "k1");
    pqmq_insert_result res;
    CHECK_OK(q, pqmq_insert_unique(q, &m, 1, PQMQ_KEY_KEEP, 0, &res));
    CHECK_INT(res.outcome, PQMQ_INSERTED);
    pqmq_msg_free(m);
    char id[37];
    uuid_unparse_lower(res.id, id);

    PGconn *e = t_pg();
    t_exec(e, "SET ROLE %s", editor);
    PGresult *r = PQexec(e, "UPDATE mq_payloads SET id = gen_random_uuid() "
                            "WHERE name = 'keyed'");
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "0A000");
    CHECK(strstr(PQresultErrorMessage(r), id) != NULL);
    PQclear(r);
    /* The rest of the row stays the view's to write. */
    t_exec(e, "UPDATE mq_payloads SET payload_json = '{\"b\": 2}', id = id "
              "WHERE name = 'keyed'");
    PQfinish(e);
    CHECK_INT(t_sql_int(su,
                        "SELECT count(*) FROM mq_msgs WHERE id = '%s' "
                        "AND payload_json = '{\"b\": 2}'",
                        id),
              1);
    CHECK_INT(t_sql_int(su,
                        "SELECT count(*) FROM mq_keys WHERE unique_key = 'k1' "
                        "AND message_id = '%s'",
                        id),
              1);
    /* The key still holds: a second message with it is not inserted. */
    m = t_msg("h3keys", "", "keyed", "{}", 0);
    pqmq_msg_set_unique_key(m, "k1");
    CHECK_OK(q, pqmq_insert_unique(q, &m, 1, PQMQ_KEY_KEEP, 0, &res));
    CHECK_INT(res.outcome, PQMQ_KEPT);
    pqmq_msg_free(m);
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM mq_msgs WHERE channel_name = 'h3keys'"), 1);
    pqmq_client_free(q);
    t_exec(su, "REVOKE ALL ON mq_payloads FROM %s", editor);
    t_exec(su, "REVOKE ALL ON SCHEMA \"%s\" FROM %s", t_schema(), editor);
    t_exec(su, "DROP ROLE %s", editor);
}

int main(void)
{
    t_init("hardening_three");
    su = t_pg();
    T_RUN(test_install_binds_pg_catalog_whatever_the_path);
    T_RUN(test_payload_view_keeps_ids);
    PQfinish(su);
    return t_done();
}
