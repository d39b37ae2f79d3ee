/* test_client.c: connecting and wrapping, errors and their messages, broken
 * connections, a missing schema, NULL arguments, and the message builder. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <limits.h>
#include <stdlib.h>
#include <time.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

/* t_dsn() plus options setting the search_path to schema (caller frees). */
static char *dsn_with_path(const char *schema)
{
    char *s = NULL;
    if (asprintf(&s, "%s options='-c search_path=%s -c client_min_messages=warning'", t_dsn(),
                 schema) < 0)
        abort();
    return s;
}

static long long count_rows(void)
{
    return t_sql_int(
        pg, "SELECT (SELECT count(*) FROM mq_msgs) + (SELECT count(*) FROM mq_payloads)");
}

static void uuid_str(const uuid_t id, char out[37])
{
    uuid_unparse_lower(id, out);
}

/* ---- connect ----------------------------------------------------------- */

static void test_connect_success(void)
{
    char *dsn = dsn_with_path(t_schema());
    pqmq_client *c = NULL;
    int rc = pqmq_connect(dsn, &c);
    free(dsn);
    CHECK_INT(rc, 0);
    CHECK(c != NULL);
    if (!c)
        return;
    if (rc)
        printf("    connect: %s\n", pqmq_errmsg(c));
    CHECK(pqmq_conn(c) != NULL);
    CHECK(PQstatus(pqmq_conn(c)) == CONNECTION_OK);
    CHECK_STR(pqmq_errmsg(c), "");
    CHECK_STR(pqmq_sqlstate(c), "");
    /* The connection is on the schema we asked for and usable. */
    CHECK_INT(t_sql_int(pqmq_conn(c), "SELECT count(*) FROM mq_msgs WHERE false"), 0);
    pqmq_client_free(c);
}

static void test_connect_failure_reports_why(void)
{
    pqmq_client *c = NULL;
    CHECK_ERR(c, pqmq_connect("host=/nonexistent port=1", &c), PQMQ_ECONN, "connection");
    CHECK(c != NULL); /* set even on failure, so that errmsg can say why */
    if (c) {
        CHECK(strlen(pqmq_errmsg(c)) > 0);
        CHECK(strstr(pqmq_errmsg(c), "/nonexistent") != NULL);
        CHECK(PQstatus(pqmq_conn(c)) == CONNECTION_BAD);
        /* Every later call fails the same way, without crashing. */
        pqmq_batch *b = NULL;
        CHECK_ERR(c, pqmq_poll(c, NULL, 0, 1, &b), PQMQ_ECONN, "connection");
        CHECK(b == NULL);
        CHECK_ERR(c, pqmq_migrate(c), PQMQ_ECONN, "connection");
    }
    pqmq_client_free(c);

    /* A conninfo that does not even parse. */
    c = NULL;
    CHECK_INT(pqmq_connect("this is not a conninfo", &c), PQMQ_ECONN);
    CHECK(c != NULL && *pqmq_errmsg(c));
    pqmq_client_free(c);
}

static void test_connect_null_out(void)
{
    char *dsn = dsn_with_path(t_schema());
    CHECK_INT(pqmq_connect(dsn, NULL), PQMQ_EINVAL);
    free(dsn);
}

/* ---- wrap -------------------------------------------------------------- */

static void test_wrap_borrows_connection(void)
{
    t_truncate();
    PGconn *conn = t_pg();
    pqmq_client *w = NULL;
    CHECK_OK(w, pqmq_wrap(conn, &w));
    CHECK(w != NULL);
    CHECK(pqmq_conn(w) == conn);
    pqmq_msg *m = t_msg("wrap", NULL, "n", "{}", 0);
    CHECK_OK(w, pqmq_insert(w, &m, 1));
    pqmq_client_free(w);
    /* The client is gone; the caller's connection is not. */
    CHECK(PQstatus(conn) == CONNECTION_OK);
    CHECK_INT(t_sql_int(conn, "SELECT count(*) FROM mq_msgs WHERE channel_name = 'wrap'"), 1);

    /* Wrapping the same connection again (one client per transaction is a
     * natural pattern) works, including the type set-up for inserts. */
    w = NULL;
    CHECK_OK(w, pqmq_wrap(conn, &w));
    CHECK_ERR(w, pqmq_insert(w, &m, 1), PQMQ_ESERVER, "23505"); /* same id again */
    CHECK_STR(pqmq_sqlstate(w), "23505");
    uuid_t fresh;
    pqmq_uuid_generate(fresh);
    CHECK_OK(w, pqmq_msg_set_id(m, fresh));
    CHECK_OK(w, pqmq_insert(w, &m, 1));
    pqmq_client_free(w);
    CHECK_INT(t_sql_int(conn, "SELECT count(*) FROM mq_msgs WHERE channel_name = 'wrap'"), 2);
    CHECK(PQstatus(conn) == CONNECTION_OK);
    pqmq_msg_free(m);
    PQfinish(conn);
}

static void test_wrap_bad_arguments(void)
{
    pqmq_client *w = (pqmq_client *)&w;
    CHECK_INT(pqmq_wrap(NULL, &w), PQMQ_EINVAL);
    CHECK(w == NULL);
    CHECK_INT(pqmq_wrap(pg, NULL), PQMQ_EINVAL);
}

static void test_wrap_rollback_leaves_nothing(void)
{
    t_truncate();
    PGconn *conn = t_pg();
    pqmq_client *w = NULL;
    CHECK_OK(w, pqmq_wrap(conn, &w));
    t_exec(conn, "BEGIN");
    pqmq_msg *msgs[2] = {t_msg("rb", NULL, "n", "{}", 1), t_msg("rb", NULL, "n", "{}", 0)};
    CHECK_OK(w, pqmq_insert(w, msgs, 2));
    /* It ran inside the caller's transaction: visible there only. */
    CHECK(PQtransactionStatus(conn) == PQTRANS_INTRANS);
    CHECK_INT(t_sql_int(conn, "SELECT count(*) FROM mq_msgs"), 2);
    CHECK_INT(count_rows(), 0);
    t_exec(conn, "ROLLBACK");
    CHECK_INT(t_sql_int(conn, "SELECT count(*) FROM mq_msgs"), 0);
    CHECK_INT(count_rows(), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_chains"), 0);
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 0);
    pqmq_batch_free(b);
    t_msgs_free(msgs, 2);
    pqmq_client_free(w);
    PQfinish(conn);
}

/* ---- errors ------------------------------------------------------------ */

static void test_errmsg_after_server_error_and_cleared(void)
{
    t_truncate();
    /* Empty after a success. */
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 1, &b));
    pqmq_batch_free(b);
    CHECK_STR(pqmq_errmsg(q), "");
    CHECK_STR(pqmq_sqlstate(q), "");

    /* A unique violation: the server's SQLSTATE, in the message too. */
    pqmq_msg *m = t_msg("dup", NULL, "n", "{}", 0);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    CHECK_ERR(q, pqmq_insert(q, &m, 1), PQMQ_ESERVER, "SQLSTATE");
    CHECK_STR(pqmq_sqlstate(q), "23505");
    CHECK(strstr(pqmq_errmsg(q), "23505") != NULL);
    CHECK(strstr(pqmq_errmsg(q), "pqmq_insert") != NULL);
    /* The message stays until the next call ... */
    CHECK(strstr(pqmq_errmsg(q), "SQLSTATE") != NULL);
    CHECK_STR(pqmq_sqlstate(q), "23505");
    /* ... which clears it when it succeeds. */
    b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 1, &b));
    pqmq_batch_free(b);
    CHECK_STR(pqmq_errmsg(q), "");
    CHECK_STR(pqmq_sqlstate(q), "");

    /* A client-side error replaces a server error and has no SQLSTATE. */
    CHECK_ERR(q, pqmq_insert(q, &m, 1), PQMQ_ESERVER, "23505");
    CHECK_ERR(q, pqmq_poll(q, NULL, 0, 0, &b), PQMQ_EINVAL, "batch_size");
    CHECK_STR(pqmq_sqlstate(q), "");
    CHECK(strstr(pqmq_errmsg(q), "23505") == NULL);
    pqmq_msg_free(m);
}

static void test_error_in_failed_transaction(void)
{
    PGconn *conn = t_pg();
    pqmq_client *w = NULL;
    CHECK_OK(w, pqmq_wrap(conn, &w));
    t_exec(conn, "BEGIN");
    PGresult *r = PQexec(conn, "SELECT 1/0");
    CHECK(PQresultStatus(r) == PGRES_FATAL_ERROR);
    PQclear(r);
    CHECK(PQtransactionStatus(conn) == PQTRANS_INERROR);
    uuid_t id;
    pqmq_uuid_generate(id);
    CHECK_ERR(w, pqmq_complete(w, &id, 1), PQMQ_ESERVER, "SQLSTATE 25P02");
    CHECK_STR(pqmq_sqlstate(w), "25P02");
    CHECK(strstr(pqmq_errmsg(w), "pqmq_complete") != NULL);
    /* The connection itself is fine: after ROLLBACK the next call works and
     * clears the error. */
    t_exec(conn, "ROLLBACK");
    CHECK_OK(w, pqmq_complete(w, &id, 1));
    CHECK_STR(pqmq_errmsg(w), "");
    CHECK_STR(pqmq_sqlstate(w), "");
    pqmq_client_free(w);
    PQfinish(conn);
}

static void test_errmsg_null_client(void)
{
    CHECK(pqmq_errmsg(NULL) != NULL);
    CHECK_STR(pqmq_errmsg(NULL), "");
    CHECK(pqmq_sqlstate(NULL) != NULL);
    CHECK_STR(pqmq_sqlstate(NULL), "");
    CHECK(pqmq_conn(NULL) == NULL);
}

static void test_strerror(void)
{
    static const int codes[] = {PQMQ_OK,      PQMQ_EINVAL,  PQMQ_ENOMEM,   PQMQ_ECONN,
                                PQMQ_ESERVER, PQMQ_ETOOBIG, PQMQ_ENOTHELD, PQMQ_EPAYLOAD,
                                PQMQ_ESCHEMA, PQMQ_ESTALE};
    enum { N = sizeof codes / sizeof *codes };
    for (int i = 0; i < N; i++) {
        const char *s = pqmq_strerror(codes[i]);
        CHECK(s != NULL && *s);
        if (!s)
            continue;
        if (!strcmp(s, "unknown error"))
            t_fail(__FILE__, __LINE__, "code %d has no description", codes[i]);
        for (int k = 0; k < i; k++)
            if (!strcmp(s, pqmq_strerror(codes[k])))
                t_fail(__FILE__, __LINE__, "codes %d and %d share \"%s\"", codes[k], codes[i],
                       s);
    }
    /* The advice is the message's (pqmq_errmsg says "run pqmq_migrate"): a
     * program printing both, as README's does, says it once. */
    CHECK_STR(pqmq_strerror(PQMQ_ESCHEMA), "queue schema missing");
    CHECK_STR(pqmq_strerror(-10), "unknown error");
    CHECK_STR(pqmq_strerror(1), "unknown error");
    CHECK_STR(pqmq_strerror(-1000), "unknown error");
    CHECK_STR(pqmq_strerror(INT_MIN), "unknown error");
    CHECK_STR(pqmq_strerror(INT_MAX), "unknown error");
}

/* ---- broken connection ------------------------------------------------- */

/* Terminates c's server process from another connection and waits for it. */
static void kill_backend(pqmq_client *c)
{
    int pid = PQbackendPID(pqmq_conn(c));
    CHECK(pid > 0);
    CHECK_INT(t_sql_int(pg, "SELECT pg_terminate_backend(%d, 10000)::int", pid), 1);
}

static void test_broken_connection_poll_first(void)
{
    t_truncate();
    pqmq_client *c = t_client();
    pqmq_batch *b = NULL;
    CHECK_OK(c, pqmq_poll(c, NULL, 0, 1, &b)); /* warm: the connection worked */
    pqmq_batch_free(b);
    kill_backend(c);

    b = (pqmq_batch *)&b;
    CHECK_ERR(c, pqmq_poll(c, NULL, 0, 1, &b), PQMQ_ECONN, "connection");
    CHECK(b == NULL);
    CHECK_STR(pqmq_sqlstate(c), "");
    b = NULL;
    CHECK_ERR(c, pqmq_poll(c, NULL, 0, 1, &b), PQMQ_ECONN, "connection");
    CHECK(b == NULL);
    pqmq_msg *m = t_msg("broken", NULL, "n", "{}", 0);
    CHECK_ERR(c, pqmq_insert(c, &m, 1), PQMQ_ECONN, "connection");
    CHECK_ERR(c, pqmq_insert(c, &m, 1), PQMQ_ECONN, "connection");
    uuid_t id;
    pqmq_msg_id(m, id);
    CHECK_ERR(c, pqmq_complete(c, &id, 1), PQMQ_ECONN, "connection");
    CHECK_ERR(c, pqmq_commit(c, &id, 1), PQMQ_ECONN, "connection");
    CHECK_ERR(c, pqmq_keep_alive(c, &id, 1, 1000, NULL), PQMQ_ECONN, "connection");
    CHECK_ERR(c, pqmq_fail(c, id, "x"), PQMQ_ECONN, "connection");
    CHECK_ERR(c, pqmq_checkpoint(c, id, 1000, NULL, NULL, 0, 0), PQMQ_ECONN, "connection");
    CHECK_ERR(c, pqmq_migrate(c), PQMQ_ECONN, "connection");
    pqmq_msg_free(m);
    pqmq_client_free(c);
    CHECK_INT(count_rows(), 0);
}

static void test_broken_connection_insert_first(void)
{
    t_truncate();
    /* A fresh client: the first insert would register mq_new_t. */
    pqmq_client *c = t_client();
    kill_backend(c);
    pqmq_msg *m = t_msg("broken", NULL, "n", "{}", 0);
    CHECK_ERR(c, pqmq_insert(c, &m, 1), PQMQ_ECONN, "connection");
    CHECK_ERR(c, pqmq_insert(c, &m, 1), PQMQ_ECONN, "connection");
    pqmq_client_free(c);

    /* A client that already inserted: the insert itself meets the break. */
    c = t_client();
    CHECK_OK(c, pqmq_insert(c, &m, 1));
    kill_backend(c);
    pqmq_msg *m2 = t_msg("broken", NULL, "n", "{}", 0);
    CHECK_ERR(c, pqmq_insert(c, &m2, 1), PQMQ_ECONN, "connection");
    CHECK_ERR(c, pqmq_insert(c, &m2, 1), PQMQ_ECONN, "connection");
    pqmq_batch *b = NULL;
    CHECK_ERR(c, pqmq_poll(c, NULL, 0, 1, &b), PQMQ_ECONN, "connection");
    CHECK(b == NULL);
    pqmq_client_free(c);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 1);
    pqmq_msg_free(m);
    pqmq_msg_free(m2);
}

/* ---- missing schema ---------------------------------------------------- */

static void test_missing_schema(void)
{
    t_truncate();
    char empty[96];
    snprintf(empty, sizeof empty, "%s_empty", t_schema());
    t_exec(pg, "DROP SCHEMA IF EXISTS %s CASCADE", empty);
    t_exec(pg, "CREATE SCHEMA %s", empty);
    char *dsn = dsn_with_path(empty);
    pqmq_client *c = NULL;
    CHECK_OK(c, pqmq_connect(dsn, &c));
    free(dsn);

    pqmq_msg *m = t_msg("nowhere", NULL, "n", "{}", 0);
    CHECK_ERR(c, pqmq_insert(c, &m, 1), PQMQ_ESCHEMA, "pqmq_migrate");
    CHECK_ERR(c, pqmq_insert(c, &m, 1), PQMQ_ESCHEMA, "pqmq_migrate");
    pqmq_batch *b = (pqmq_batch *)&b;
    CHECK_ERR(c, pqmq_poll(c, NULL, 0, 1, &b), PQMQ_ESCHEMA, "pqmq_migrate");
    CHECK(b == NULL);
    uuid_t id;
    pqmq_msg_id(m, id);
    CHECK_ERR(c, pqmq_complete(c, &id, 1), PQMQ_ESCHEMA, "pqmq_migrate");
    CHECK_ERR(c, pqmq_commit(c, &id, 1), PQMQ_ESCHEMA, "pqmq_migrate");
    CHECK_ERR(c, pqmq_keep_alive(c, &id, 1, 1000, NULL), PQMQ_ESCHEMA, "pqmq_migrate");
    /* Still a usable connection: nothing was created by those calls. */
    CHECK(PQstatus(pqmq_conn(c)) == CONNECTION_OK);
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM pg_class c JOIN pg_namespace n "
                        "ON n.oid = c.relnamespace WHERE n.nspname = '%s'",
                        empty),
              0);

    /* Doing what the message says fixes it, on the same client. */
    CHECK_OK(c, pqmq_migrate(c));
    CHECK_OK(c, pqmq_insert(c, &m, 1));
    b = NULL;
    CHECK_OK(c, pqmq_poll(c, NULL, 0, 1, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    pqmq_batch_free(b);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM %s.mq_msgs", empty), 1);
    CHECK_INT(count_rows(), 0); /* not in the test schema */

    pqmq_msg_free(m);
    pqmq_client_free(c);
    t_exec(pg, "DROP SCHEMA %s CASCADE", empty);
}

/* A refused lookup of the batch type (here: the catalog locked past the
 * session's lock_timeout, as a statement timeout under load would) is the
 * server's refusal, not a missing schema; once the lock is gone the same
 * client inserts. */
static void test_refused_type_lookup_is_not_a_missing_schema(void)
{
    if (t_citus_skip("the coordinator's catalog lock is not what a worker sees"))
        return;
    t_truncate();
    char *dsn = NULL;
    if (asprintf(&dsn, "%s options='-c search_path=%s -c lock_timeout=200ms'", t_dsn(),
                 t_schema()) < 0)
        abort();
    pqmq_client *c = NULL;
    CHECK_OK(c, pqmq_connect(dsn, &c));
    free(dsn);
    PGconn *locker = PQconnectdb(t_dsn());
    CHECK(PQstatus(locker) == CONNECTION_OK);
    t_exec(locker, "BEGIN");
    t_exec(locker, "LOCK TABLE pg_catalog.pg_type IN ACCESS EXCLUSIVE MODE");
    pqmq_msg *m = t_msg("lookup", NULL, "n", "{}", 0);
    int rc = pqmq_insert(c, &m, 1);
    CHECK(rc == PQMQ_ESERVER);
    CHECK(strstr(pqmq_errmsg(c), "run pqmq_migrate") == NULL);
    t_exec(locker, "ROLLBACK");
    PQfinish(locker);
    CHECK_OK(c, pqmq_insert(c, &m, 1));
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 1);
    pqmq_msg_free(m);
    pqmq_client_free(c);
    t_truncate();
}

/* ---- NULL and bad arguments ------------------------------------------- */

static void test_null_client(void)
{
    t_truncate();
    uuid_t id;
    pqmq_uuid_generate(id);
    pqmq_msg *m = t_msg("c", NULL, "n", "{}", 0);
    CHECK_INT(pqmq_insert(NULL, &m, 1), PQMQ_EINVAL);
    CHECK_INT(pqmq_commit(NULL, &id, 1), PQMQ_EINVAL);
    pqmq_batch *b = (pqmq_batch *)&b;
    CHECK_INT(pqmq_poll(NULL, NULL, 0, 1, &b), PQMQ_EINVAL);
    CHECK(b == NULL); /* "*out is then NULL" */
    CHECK_INT(pqmq_poll(NULL, NULL, 0, 1, NULL), PQMQ_EINVAL);
    CHECK_INT(pqmq_complete(NULL, &id, 1), PQMQ_EINVAL);
    CHECK_INT(pqmq_fail(NULL, id, "why"), PQMQ_EINVAL);
    size_t extended = 99;
    CHECK_INT(pqmq_keep_alive(NULL, &id, 1, 1000, &extended), PQMQ_EINVAL);
    CHECK_INT(extended, 0);
    CHECK_INT(pqmq_checkpoint(NULL, id, 1000, "{}", NULL, 0, 0), PQMQ_EINVAL);
    CHECK_INT(pqmq_migrate(NULL), PQMQ_EINVAL);

    /* A batch to pass to complete_batch with a NULL client. */
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 1, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_INT(pqmq_complete_batch(NULL, b), PQMQ_EINVAL);
    CHECK_INT(pqmq_complete_batch(NULL, NULL), PQMQ_EINVAL);
    pqmq_batch_free(b);
    /* None of those touched the message. */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 1);
    pqmq_msg_free(m);
    t_truncate();
}

static void test_null_out_with_client_names_argument(void)
{
    /* EINVAL with a client: "the message names it" (pqmq.h). */
    CHECK_ERR(q, pqmq_poll(q, NULL, 0, 1, NULL), PQMQ_EINVAL, "out");
    CHECK_ERR(q, pqmq_complete_batch(q, NULL), PQMQ_EINVAL, "batch");
    uuid_t id;
    pqmq_uuid_generate(id);
    CHECK_ERR(q, pqmq_fail(q, NULL, "x"), PQMQ_EINVAL, "id");
    CHECK_ERR(q, pqmq_checkpoint(q, NULL, 1000, NULL, NULL, 0, 0), PQMQ_EINVAL, "id");
}

static void test_free_null(void)
{
    pqmq_client_free(NULL);
    pqmq_msg_free(NULL);
    pqmq_batch_free(NULL);
    CHECK_INT(pqmq_batch_count(NULL), 0);
    CHECK(pqmq_batch_job(NULL, 0) == NULL);
}

static void test_id_array_limits(void)
{
    uuid_t one;
    pqmq_uuid_generate(one);
    uuid_t *many = calloc(PQMQ_MAX_BATCH + 1, sizeof *many);
    for (size_t i = 0; i < PQMQ_MAX_BATCH + 1; i++)
        pqmq_uuid_generate(many[i]);
    size_t ext = 7;

    CHECK_ERR(q, pqmq_complete(q, NULL, 1), PQMQ_EINVAL, "pqmq_complete");
    CHECK_ERR(q, pqmq_complete(q, &one, 0), PQMQ_EINVAL, "pqmq_complete");
    CHECK_ERR(q, pqmq_complete(q, many, PQMQ_MAX_BATCH + 1), PQMQ_ETOOBIG, "limit");

    CHECK_ERR(q, pqmq_commit(q, NULL, 1), PQMQ_EINVAL, "pqmq_commit");
    CHECK_ERR(q, pqmq_commit(q, &one, 0), PQMQ_EINVAL, "pqmq_commit");
    CHECK_ERR(q, pqmq_commit(q, many, PQMQ_MAX_BATCH + 1), PQMQ_ETOOBIG, "limit");

    CHECK_ERR(q, pqmq_keep_alive(q, NULL, 1, 1000, &ext), PQMQ_EINVAL, "pqmq_keep_alive");
    CHECK_INT(ext, 0);
    ext = 7;
    CHECK_ERR(q, pqmq_keep_alive(q, &one, 0, 1000, &ext), PQMQ_EINVAL, "pqmq_keep_alive");
    CHECK_INT(ext, 0);
    CHECK_ERR(q, pqmq_keep_alive(q, many, PQMQ_MAX_BATCH + 1, 1000, NULL), PQMQ_ETOOBIG,
              "limit");

    /* Exactly at the limit is accepted (unknown ids are ignored). */
    CHECK_OK(q, pqmq_complete(q, many, PQMQ_MAX_BATCH));
    CHECK_OK(q, pqmq_commit(q, many, PQMQ_MAX_BATCH));
    ext = 7;
    CHECK_OK(q, pqmq_keep_alive(q, many, PQMQ_MAX_BATCH, 1000, &ext));
    CHECK_INT(ext, 0);
    free(many);
}

/* ---- message builder --------------------------------------------------- */

static int64_t uuid_ms(const uuid_t id)
{
    int64_t ms = 0;
    for (int i = 0; i < 6; i++)
        ms = ms << 8 | id[i];
    return ms;
}

static void test_msg_ids_distinct_version7(void)
{
    enum { N = 2000 };
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t before = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    uuid_t prev;
    int bad_version = 0, bad_variant = 0, not_increasing = 0, bad_time = 0;
    for (int i = 0; i < N; i++) {
        pqmq_msg *m = pqmq_msg_new();
        CHECK(m != NULL);
        if (!m)
            return;
        uuid_t id;
        pqmq_msg_id(m, id);
        pqmq_msg_free(m);
        if ((id[6] & 0xf0) != 0x70)
            bad_version++;
        if ((id[8] & 0xc0) != 0x80)
            bad_variant++;
        /* Strictly increasing implies distinct. */
        if (i > 0 && memcmp(prev, id, sizeof id) >= 0)
            not_increasing++;
        if (uuid_ms(id) < before - 1 || uuid_ms(id) > before + 60000)
            bad_time++;
        memcpy(prev, id, sizeof id);
    }
    CHECK_INT(bad_version, 0);
    CHECK_INT(bad_variant, 0);
    CHECK_INT(not_increasing, 0);
    CHECK_INT(bad_time, 0);

    /* PostgreSQL agrees on the version. */
    pqmq_msg *m = pqmq_msg_new();
    uuid_t id;
    char s[37];
    pqmq_msg_id(m, id);
    uuid_str(id, s);
    CHECK_INT(t_sql_int(pg, "SELECT get_byte(uuid_send('%s'), 6) >> 4", s), 7);
    pqmq_msg_free(m);
}

static void test_msg_set_id_round_trip(void)
{
    t_truncate();
    uuid_t want, got;
    CHECK_INT(uuid_parse("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", want), 0);
    pqmq_msg *m = t_msg("ids", NULL, "n", "{}", 0);
    uuid_t generated;
    pqmq_msg_id(m, generated);
    CHECK(memcmp(generated, want, sizeof want) != 0);
    CHECK_OK(q, pqmq_msg_set_id(m, want));
    want[15] ^= 0xff; /* set_id copied: changing the source changes nothing */
    pqmq_msg_id(m, got);
    want[15] ^= 0xff;
    CHECK(memcmp(got, want, sizeof want) == 0);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs "
                            "WHERE id = '0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b'"),
              1);
    CHECK_INT(pqmq_msg_set_id(m, NULL), PQMQ_EINVAL);
    pqmq_msg_id(m, got); /* unchanged by the refused call */
    CHECK(memcmp(got, want, sizeof want) == 0);
    pqmq_msg_free(m);
    t_truncate();
}

static void test_msg_setters_null(void)
{
    uuid_t id;
    pqmq_uuid_generate(id);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    CHECK_INT(pqmq_msg_set_channel(NULL, "c", "a"), PQMQ_EINVAL);
    CHECK_INT(pqmq_msg_set_name(NULL, "n"), PQMQ_EINVAL);
    CHECK_INT(pqmq_msg_set_json(NULL, "{}"), PQMQ_EINVAL);
    CHECK_INT(pqmq_msg_set_bytes(NULL, "ab", 2), PQMQ_EINVAL);
    CHECK_INT(pqmq_msg_set_msgpack(NULL, &sb), PQMQ_EINVAL);
    CHECK_INT(pqmq_msg_set_delay(NULL, 1), PQMQ_EINVAL);
    CHECK_INT(pqmq_msg_set_retries(NULL, 1), PQMQ_EINVAL);
    CHECK_INT(pqmq_msg_set_backoff(NULL, 1), PQMQ_EINVAL);
    CHECK_INT(pqmq_msg_set_commit_interval(NULL, 1), PQMQ_EINVAL);
    CHECK_INT(pqmq_msg_set_ordered(NULL, 1), PQMQ_EINVAL);
    CHECK_INT(pqmq_msg_set_id(NULL, id), PQMQ_EINVAL);
    msgpack_sbuffer_destroy(&sb);

    /* The same setters on a real message succeed. */
    pqmq_msg *m = pqmq_msg_new();
    CHECK_INT(pqmq_msg_set_channel(m, "c", "a"), 0);
    CHECK_INT(pqmq_msg_set_name(m, "n"), 0);
    CHECK_INT(pqmq_msg_set_json(m, "{}"), 0);
    CHECK_INT(pqmq_msg_set_bytes(m, "ab", 2), 0);
    CHECK_INT(pqmq_msg_set_delay(m, 1), 0);
    CHECK_INT(pqmq_msg_set_retries(m, 1), 0);
    CHECK_INT(pqmq_msg_set_backoff(m, 1), 0);
    CHECK_INT(pqmq_msg_set_commit_interval(m, 1), 0);
    CHECK_INT(pqmq_msg_set_ordered(m, 1), 0);
    CHECK_INT(pqmq_msg_set_id(m, id), 0);
    pqmq_msg_free(m);
}

int main(void)
{
    t_init("client");
    q = t_client();
    pg = t_pg();
    T_RUN(test_connect_success);
    T_RUN(test_connect_failure_reports_why);
    T_RUN(test_connect_null_out);
    T_RUN(test_wrap_borrows_connection);
    T_RUN(test_wrap_bad_arguments);
    T_RUN(test_wrap_rollback_leaves_nothing);
    T_RUN(test_errmsg_after_server_error_and_cleared);
    T_RUN(test_error_in_failed_transaction);
    T_RUN(test_errmsg_null_client);
    T_RUN(test_strerror);
    T_RUN(test_broken_connection_poll_first);
    T_RUN(test_broken_connection_insert_first);
    T_RUN(test_missing_schema);
    T_RUN(test_refused_type_lookup_is_not_a_missing_schema);
    T_RUN(test_null_client);
    T_RUN(test_null_out_with_client_names_argument);
    T_RUN(test_free_null);
    T_RUN(test_id_array_limits);
    T_RUN(test_msg_ids_distinct_version7);
    T_RUN(test_msg_set_id_round_trip);
    T_RUN(test_msg_setters_null);
    pqmq_client_free(q);
    PQfinish(pg);
    return t_done();
}
