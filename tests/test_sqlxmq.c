/*
 * test_sqlxmq.c: clients of the original (sqlxmq) schema share the queue.
 *
 * The "crate" below speaks only the original client's SQL: each statement
 * as the sqlxmq crate sends it, prepared with the parameter types it binds
 * (uuid, interval, int4, text, bytea, uuid[], text[]), rows read by column
 * name, and its runner's logic: delete the uncommitted rows a poll returns,
 * sleep the poll's wait_time, keep a job alive with a doubling interval,
 * retry statements on the error codes it treats as transient. It runs next
 * to C consumers on the same channels, and on a database created by the
 * original schema and adopted in place by pqmq's migrations. The crate's
 * statements that write mq_payloads (a view of mq_msgs) run alone and from
 * several sessions at once, some of its consumers completing through the
 * view.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* asprintf */
#endif
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <uuid/uuid.h>

#include "harness.h"

#define OID_BOOL 16
#define OID_BYTEA 17
#define OID_INT4 23
#define OID_TEXT 25
#define OID_TEXT_ARRAY 1009
#define OID_INTERVAL 1186
#define OID_UUID 2950
#define OID_UUID_ARRAY 2951

#define NIL_UUID "00000000-0000-0000-0000-000000000000"

static pqmq_client *q;
static PGconn *pg;

/* ---- the crate's statements --------------------------------------------- */

static const struct {
    const char *name, *sql;
    int n;
    Oid types[11];
} crate_sql[] = {
    {"spawn",
     "SELECT mq_insert(ARRAY[($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)::mq_new_t])",
     11,
     {OID_UUID, OID_INTERVAL, OID_INT4, OID_INTERVAL, OID_TEXT, OID_TEXT, OID_INTERVAL,
      OID_BOOL, OID_TEXT, OID_TEXT, OID_BYTEA}},
    {"commit", "SELECT mq_commit($1)", 1, {OID_UUID_ARRAY}},
    {"poll", "SELECT * FROM mq_poll($1, $2)", 2, {OID_TEXT_ARRAY, OID_INT4}},
    {"delete_many", "SELECT mq_delete($1)", 1, {OID_UUID_ARRAY}},
    {"delete_one", "SELECT mq_delete(ARRAY[$1])", 1, {OID_UUID}},
    {"keep_alive", "SELECT mq_keep_alive(ARRAY[$1], $2)", 2, {OID_UUID, OID_INTERVAL}},
    {"checkpoint",
     "SELECT mq_checkpoint($1, $2, $3, $4, $5)",
     5,
     {OID_UUID, OID_INTERVAL, OID_TEXT, OID_BYTEA, OID_INT4}},
    {"clear", "SELECT mq_clear($1)", 1, {OID_TEXT_ARRAY}},
    {"clear_all", "SELECT mq_clear_all()", 0, {0}},
    {"exists", "SELECT EXISTS(SELECT id FROM mq_msgs WHERE id = $1)", 1, {OID_UUID}},
    /* The statements of the crate that name mq_payloads. None is sent by
     * its runner (spawn, poll, delete, keep-alive, checkpoint, clear and
     * clear_all call the functions above, which pqmq defines); they are the
     * bodies of the crate's own SQL functions, which SQL written after its
     * migrations repeats, and its test suite's reset. Each is written as in
     * the crate, its function parameters numbered ($n). */
    /* mq_delete's second statement, the crate's 20210316025847_setup.up.sql
     * (Diggsey/sqlxmq, every version; msg_ids). */
    {"payload_delete", "DELETE FROM mq_payloads WHERE id = ANY($1)", 1, {OID_UUID_ARRAY}},
    /* mq_checkpoint's second statement, same file (new_payload_json,
     * new_payload_bytes, msg_id). */
    {"payload_update",
     "UPDATE mq_payloads SET payload_json = COALESCE($1::JSONB, payload_json), "
     "payload_bytes = COALESCE($2, payload_bytes) WHERE id = $3",
     3,
     {OID_TEXT, OID_BYTEA, OID_UUID}},
    /* mq_clear and mq_clear_all, the crate's clear migration (channel_names;
     * later versions add "AND id != uuid_nil()" to the inner DELETE). */
    {"payload_clear",
     "WITH deleted_ids AS (DELETE FROM mq_msgs WHERE channel_name = ANY($1) RETURNING id) "
     "DELETE FROM mq_payloads WHERE id IN (SELECT id FROM deleted_ids)",
     1,
     {OID_TEXT_ARRAY}},
    {"payload_clear_all",
     "WITH deleted_ids AS (DELETE FROM mq_msgs RETURNING id) "
     "DELETE FROM mq_payloads WHERE id IN (SELECT id FROM deleted_ids)",
     0,
     {0}},
    /* The reset of the crate's tests (src/lib.rs, tests::test_pool, every
     * version): PostgreSQL truncates only tables, so this is refused. */
    {"payload_truncate", "TRUNCATE TABLE mq_payloads", 0, {0}},
};

/* mq_insert's first statement, the crate's 20210316025847_setup.up.sql and
 * 20220204230312_locks.up.sql (new_messages, an mq_new_t[]: its type's oid
 * depends on the schema, so it is prepared apart). */
static const char payload_insert_sql[] =
    "INSERT INTO mq_payloads (id, name, payload_json, payload_bytes) "
    "SELECT id, name, payload_json::JSONB, payload_bytes FROM UNNEST($1)";

/* A connection of the crate on schema (NULL: the test schema), its
 * statements prepared. Caller owns; PQfinish. */
static PGconn *crate_connect(const char *schema)
{
    char *opts = NULL;
    if (asprintf(&opts, "-c search_path=%s -c client_min_messages=warning",
                 schema ? schema : t_schema()) < 0)
        abort();
    const char *keys[] = {"dbname", "options", NULL};
    const char *vals[] = {t_dsn(), opts, NULL};
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    free(opts);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "cannot connect: %s", PQerrorMessage(c));
        exit(1);
    }
    return c;
}

static int crate_prepare(PGconn *c)
{
    int ok = 1;
    for (size_t i = 0; i < sizeof crate_sql / sizeof crate_sql[0]; i++) {
        PGresult *r = PQprepare(c, crate_sql[i].name, crate_sql[i].sql, crate_sql[i].n,
                                crate_sql[i].types);
        if (PQresultStatus(r) != PGRES_COMMAND_OK) {
            fprintf(stderr, "prepare %s: %s", crate_sql[i].name, PQerrorMessage(c));
            ok = 0;
        }
        PQclear(r);
    }
    PGresult *r = PQexec(c, "SELECT 'mq_new_t[]'::regtype::oid");
    Oid t =
        PQresultStatus(r) == PGRES_TUPLES_OK ? (Oid)strtoul(PQgetvalue(r, 0, 0), NULL, 10) : 0;
    PQclear(r);
    r = PQprepare(c, "payload_insert", payload_insert_sql, 1, &t);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        fprintf(stderr, "prepare payload_insert: %s", PQerrorMessage(c));
        ok = 0;
    }
    PQclear(r);
    return ok;
}

/* An empty queue and a crate connection on the test schema, prepared. */
static PGconn *fresh_crate(void)
{
    t_truncate();
    PGconn *c = crate_connect(NULL);
    CHECK(crate_prepare(c));
    return c;
}

/* sqlxmq::should_retry: the codes the crate treats as transient. */
static int transient(const PGresult *r)
{
    const char *st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    const char *con = PQresultErrorField(r, PG_DIAG_CONSTRAINT_NAME);
    if (!st)
        return 0;
    return !strcmp(st, "40001") || !strcmp(st, "40P01") ||
           (!strcmp(st, "23505") && con &&
            !strcmp(con, "mq_msgs_channel_name_channel_args_after_message_id_idx"));
}

/* Runs a prepared statement, again while it fails transiently. Caller
 * PQclear's. */
static PGresult *crate_exec(PGconn *c, const char *stmt, int n, const char *const *vals)
{
    for (;;) {
        PGresult *r = PQexecPrepared(c, stmt, n, vals, NULL, NULL, 0);
        if (!transient(r))
            return r;
        PQclear(r);
    }
}

static int ok(const PGresult *r)
{
    ExecStatusType s = PQresultStatus(r);
    return s == PGRES_TUPLES_OK || s == PGRES_COMMAND_OK;
}

/* An interval parameter as sqlx binds a Duration: microseconds only. */
static void micros(char *buf, size_t len, long long us)
{
    snprintf(buf, len, "%lld microseconds", us);
}

typedef struct {
    const char *channel, *args, *name, *json;
    long long delay_us, backoff_us, commit_us; /* commit_us < 0: NULL */
    int retries, ordered;
} spawn_t;

/* JobBuilder::new(name): the crate's defaults. */
static spawn_t job(const char *name)
{
    return (spawn_t){.channel = "",
                     .args = "",
                     .name = name,
                     .json = NULL,
                     .delay_us = 0,
                     .backoff_us = 1000000,
                     .commit_us = -1,
                     .retries = 4,
                     .ordered = 0};
}

static void new_id(char out[37])
{
    uuid_t u;
    uuid_generate_random(u);
    uuid_unparse_lower(u, out);
}

/* JobBuilder::spawn; id gets the new id. Returns the result's SQLSTATE
 * ("" on success) in state (at least 6 bytes). */
static void spawn_state(PGconn *c, const spawn_t *s, char id[37], char *state)
{
    char delay[40], backoff[40], commit[40], retries[16];
    new_id(id);
    micros(delay, sizeof delay, s->delay_us);
    micros(backoff, sizeof backoff, s->backoff_us);
    micros(commit, sizeof commit, s->commit_us);
    snprintf(retries, sizeof retries, "%d", s->retries);
    const char *vals[11] = {id,
                            delay,
                            retries,
                            backoff,
                            s->channel,
                            s->args,
                            s->commit_us < 0 ? NULL : commit,
                            s->ordered ? "t" : "f",
                            s->name,
                            s->json,
                            NULL};
    PGresult *r = crate_exec(c, "spawn", 11, vals);
    const char *st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    snprintf(state, 6, "%s", ok(r) ? "" : st ? st : "?");
    if (!ok(r))
        fprintf(stderr, "    spawn: %s", PQerrorMessage(c));
    PQclear(r);
}

static void spawn(PGconn *c, const spawn_t *s, char id[37])
{
    char st[6];
    spawn_state(c, s, id, st);
    CHECK_STR(st, "");
}

static void crate_ids(PGconn *c, const char *stmt, const char *array)
{
    PGresult *r = crate_exec(c, stmt, 1, &array);
    if (!ok(r))
        t_fail(__FILE__, __LINE__, "%s: %s", stmt, PQerrorMessage(c));
    PQclear(r);
}

/* Parses an interval in the postgres output style into microseconds (days
 * and months as the crate's to_duration reads them: 30-day months). */
static long long interval_us(const char *s)
{
    long long total = 0;
    while (s && *s) {
        while (*s == ' ')
            s++;
        char *end;
        long long v = strtoll(s, &end, 10);
        if (*end == ':') { /* [-]HH:MM:SS[.ffffff] */
            int neg = *s == '-';
            long long h = llabs(v), m = 0;
            double sec = 0;
            sscanf(end + 1, "%lld:%lf", &m, &sec);
            long long us = (h * 3600 + m * 60) * 1000000LL + (long long)(sec * 1e6 + 0.5);
            total += neg ? -us : us;
            break;
        }
        s = end;
        while (*s == ' ')
            s++;
        if (!strncmp(s, "year", 4))
            total += v * 360 * 86400000000LL;
        else if (!strncmp(s, "mon", 3))
            total += v * 30 * 86400000000LL;
        else if (!strncmp(s, "day", 3))
            total += v * 86400000000LL;
        while (*s && *s != ' ')
            s++;
    }
    return total;
}

/* One row of mq_poll, read by column name. */
typedef struct {
    char id[37];
    int has_id, committed;
    char name[64];
    char json[256];
    long long lease_us, wait_us; /* -1: NULL */
} polled_t;

static const char *col(const PGresult *r, int row, const char *name)
{
    int f = PQfnumber(r, name);
    if (f < 0 || PQgetisnull(r, row, f))
        return NULL;
    return PQgetvalue(r, row, f);
}

/* mq_poll(channels, batch): channels is a text[] literal or NULL. Returns
 * the row count (-1 on error); rows go to out (at most max). */
static int crate_poll(PGconn *c, const char *channels, int batch, polled_t *out, int max)
{
    char n[16];
    snprintf(n, sizeof n, "%d", batch);
    const char *vals[2] = {channels, n};
    PGresult *r = crate_exec(c, "poll", 2, vals);
    if (!ok(r)) {
        fprintf(stderr, "    poll: %s", PQerrorMessage(c));
        PQclear(r);
        return -1;
    }
    int rows = PQntuples(r) < max ? PQntuples(r) : max;
    for (int i = 0; i < rows; i++) {
        polled_t *p = &out[i];
        memset(p, 0, sizeof *p);
        const char *v = col(r, i, "id");
        p->has_id = v != NULL;
        snprintf(p->id, sizeof p->id, "%s", v ? v : "");
        v = col(r, i, "is_committed");
        p->committed = v ? v[0] == 't' : -1;
        v = col(r, i, "name");
        snprintf(p->name, sizeof p->name, "%s", v ? v : "");
        v = col(r, i, "payload_json");
        snprintf(p->json, sizeof p->json, "%.255s", v ? v : "");
        v = col(r, i, "retry_backoff");
        p->lease_us = v ? interval_us(v) : -1;
        v = col(r, i, "wait_time");
        p->wait_us = v ? interval_us(v) : -1;
    }
    PQclear(r);
    return rows;
}

/* Runs a prepared statement; returns its SQLSTATE ("" on success) in state
 * (at least 6 bytes) and the rows it affected. */
static long crate_state(PGconn *c, const char *stmt, int n, const char *const *vals,
                        char *state)
{
    PGresult *r = crate_exec(c, stmt, n, vals);
    const char *st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    snprintf(state, 6, "%s", ok(r) ? "" : st ? st : "?");
    long rows = ok(r) ? atol(PQcmdTuples(r)) : -1;
    PQclear(r);
    return rows;
}

/* A one-element mq_new_t[] literal: id, name and a JSON payload. */
static void new_t_array(char *out, size_t len, const char *id, const char *name)
{
    snprintf(out, len, "{\"(%s,,,,,,,,%s,{},)\"}", id, name);
}

/* ---- consumers, both kinds, on the same channels ------------------------ */

#define MAX_DELIVERIES 4096

/* Every delivery, in the order the consumers got them. */
static struct {
    pthread_mutex_t lock;
    int n;
    char id[MAX_DELIVERIES][37];
    char json[MAX_DELIVERIES][96];
    int by[MAX_DELIVERIES];
    int errors;
    int stop;
} seen = {PTHREAD_MUTEX_INITIALIZER, 0, {{0}}, {{0}}, {0}, 0, 0};

static void seen_reset(void)
{
    pthread_mutex_lock(&seen.lock);
    seen.n = 0;
    seen.errors = 0;
    seen.stop = 0;
    pthread_mutex_unlock(&seen.lock);
}

static void seen_add(const char *id, const char *json, int by)
{
    pthread_mutex_lock(&seen.lock);
    if (seen.n < MAX_DELIVERIES) {
        snprintf(seen.id[seen.n], 37, "%s", id);
        snprintf(seen.json[seen.n], 96, "%.95s", json ? json : "");
        seen.by[seen.n] = by;
        seen.n++;
    }
    pthread_mutex_unlock(&seen.lock);
}

static void seen_error(const char *what, const char *msg)
{
    fprintf(stderr, "    consumer: %s: %s", what, msg);
    pthread_mutex_lock(&seen.lock);
    seen.errors++;
    pthread_mutex_unlock(&seen.lock);
}

static int stopping(void)
{
    pthread_mutex_lock(&seen.lock);
    int s = seen.stop;
    pthread_mutex_unlock(&seen.lock);
    return s;
}

typedef struct {
    const char *schema;
    const char *channels; /* text[] literal, NULL: all */
    int index;
    /* A crate consumer that checkpoints and completes with the statements
     * of the crate's mq_checkpoint and mq_delete on mq_payloads, a batch
     * in one transaction, again after a deadlock or serialization failure
     * (sqlxmq::should_retry) like SQL written after the crate would. */
    int via_view;
} consumer_arg;

/* Transactions complete_via_view ran again after a deadlock or a
 * serialization failure. */
static atomic_int view_retries;

/* Completes the committed rows of a poll as the crate's mq_delete did, in
 * the handler's transaction with its work. Returns 0, or -1 after an error
 * (reported). */
static int complete_via_view(PGconn *c, const polled_t *rows, int n)
{
    char ids[8 * 38 + 3] = "{";
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!rows[i].has_id || rows[i].committed != 1)
            continue;
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%.36s", k ? "," : "",
                 rows[i].id);
        k++;
    }
    strcat(ids, "}");
    if (!k)
        return 0;
    for (;;) {
        PQclear(PQexec(c, "BEGIN"));
        int failed = 0;
        PGresult *r = NULL;
        for (int i = 0; i < n && !failed; i++) {
            if (!rows[i].has_id || rows[i].committed != 1)
                continue;
            const char *vals[2] = {rows[i].id, "view"};
            r = PQexecParams(c, "INSERT INTO app_done (id, by) VALUES ($1, $2)", 2, NULL, vals,
                             NULL, NULL, 0);
            failed = !ok(r);
            if (!failed)
                PQclear(r);
        }
        if (!failed) {
            const char *v = ids;
            r = PQexecPrepared(c, "payload_delete", 1, &v, NULL, NULL, 0);
            failed = !ok(r);
            if (!failed && atoi(PQcmdTuples(r)) != k) {
                seen_error("payload_delete", "a message was gone before its completion\n");
                PQclear(r);
                PQclear(PQexec(c, "ROLLBACK"));
                return -1;
            }
            if (!failed) {
                PQclear(r);
                r = PQexec(c, "COMMIT");
                failed = !ok(r);
            }
        }
        if (!failed) {
            PQclear(r);
            return 0;
        }
        int again = transient(r);
        if (!again)
            seen_error("complete through mq_payloads", PQerrorMessage(c));
        PQclear(r);
        PQclear(PQexec(c, "ROLLBACK"));
        if (!again)
            return -1;
        atomic_fetch_add(&view_retries, 1);
    }
}

/* A session's crate connection on schema, prepared; NULL (the failure
 * recorded) when it could not prepare. Caller owns; PQfinish. */
static PGconn *session_crate(const char *schema)
{
    PGconn *c = crate_connect(schema);
    if (crate_prepare(c))
        return c;
    seen_error("prepare", "");
    PQfinish(c);
    return NULL;
}

/* The crate's runner: poll, delete what is uncommitted, keep each job alive
 * once (as its loop does after half a lease, with twice the lease), complete
 * it inside the handler's own transaction, which also records the work. */
static void *crate_consumer(void *p)
{
    const consumer_arg *a = p;
    PGconn *c = session_crate(a->schema);
    if (!c)
        return NULL;
    polled_t rows[8];
    while (!stopping()) {
        int n = crate_poll(c, a->channels, 8, rows, 8);
        if (n < 0) {
            seen_error("poll", PQerrorMessage(c));
            break;
        }
        long long wait_us = 60000000; /* MAX_WAIT */
        int got = 0;
        for (int i = 0; i < n; i++) {
            if (rows[i].wait_us >= 0 && rows[i].wait_us < wait_us)
                wait_us = rows[i].wait_us;
            if (rows[i].has_id && rows[i].committed == 0) {
                char arr[64];
                snprintf(arr, sizeof arr, "{%.36s}", rows[i].id);
                const char *v = arr;
                PQclear(crate_exec(c, "delete_many", 1, &v));
            }
        }
        for (int i = 0; i < n; i++) {
            if (!rows[i].has_id || rows[i].committed != 1)
                continue;
            got++;
            char dur[40];
            micros(dur, sizeof dur, 2 * rows[i].lease_us);
            const char *ka[2] = {rows[i].id, dur};
            PGresult *r = crate_exec(c, "keep_alive", 2, ka);
            if (!ok(r))
                seen_error("keep_alive", PQerrorMessage(c));
            PQclear(r);
            seen_add(rows[i].id, rows[i].json, a->index);
            if (a->via_view) {
                /* A checkpoint's new payload for a retry (which never
                 * comes): the JSON kept, bytes added. */
                const char *up[3] = {NULL, "\\x01", rows[i].id};
                r = crate_exec(c, "payload_update", 3, up);
                if (!ok(r) || atoi(PQcmdTuples(r)) != 1)
                    seen_error("payload_update", PQerrorMessage(c));
                PQclear(r);
                continue;
            }
            /* complete_with_transaction */
            PQclear(PQexec(c, "BEGIN"));
            const char *vals[2] = {rows[i].id, "crate"};
            r = PQexecParams(c, "INSERT INTO app_done (id, by) VALUES ($1, $2)", 2, NULL, vals,
                             NULL, NULL, 0);
            if (!ok(r))
                seen_error("app insert", PQerrorMessage(c));
            PQclear(r);
            const char *one = rows[i].id;
            r = crate_exec(c, "delete_one", 1, &one);
            if (!ok(r))
                seen_error("delete", PQerrorMessage(c));
            PQclear(r);
            r = PQexec(c, "COMMIT");
            if (!ok(r))
                seen_error("commit", PQerrorMessage(c));
            PQclear(r);
        }
        if (a->via_view && complete_via_view(c, rows, n) != 0)
            break;
        if (!got) /* the crate sleeps wait_time; a test need not wait long */
            t_sleep_ms(wait_us / 1000 < 20 ? wait_us / 1000 : 20);
    }
    PQfinish(c);
    return NULL;
}

/* A C consumer: pqmq_poll, records the work and completes in its own
 * transaction. */
static void *c_consumer(void *p)
{
    const consumer_arg *a = p;
    PGconn *conn = crate_connect(a->schema);
    pqmq_client *c = NULL;
    if (pqmq_wrap(conn, &c) != 0) {
        seen_error("wrap", "");
        PQfinish(conn);
        return NULL;
    }
    const char *chans[] = {"", "alpha", "beta", "jobs"};
    while (!stopping()) {
        pqmq_batch *b = NULL;
        int rc = pqmq_poll(c, a->channels ? chans : NULL, a->channels ? 4 : 0, 8, &b);
        if (rc) {
            seen_error("pqmq_poll", pqmq_errmsg(c));
            break;
        }
        size_t n = pqmq_batch_count(b);
        if (n) {
            PQclear(PQexec(conn, "BEGIN"));
            for (size_t i = 0; i < n; i++) {
                const pqmq_job *j = pqmq_batch_job(b, i);
                uuid_t u;
                char id[37];
                pqmq_job_id(j, u);
                uuid_unparse_lower(u, id);
                seen_add(id, pqmq_job_json(j), a->index);
                const char *vals[2] = {id, "c"};
                PGresult *r =
                    PQexecParams(conn, "INSERT INTO app_done (id, by) VALUES ($1, $2)", 2, NULL,
                                 vals, NULL, NULL, 0);
                if (!ok(r))
                    seen_error("app insert", PQerrorMessage(conn));
                PQclear(r);
            }
            if (pqmq_complete_batch(c, b) != 0)
                seen_error("complete", pqmq_errmsg(c));
            PGresult *r = PQexec(conn, "COMMIT");
            if (!ok(r))
                seen_error("commit", PQerrorMessage(conn));
            PQclear(r);
        } else {
            t_sleep_ms(10);
        }
        pqmq_batch_free(b);
    }
    pqmq_client_free(c);
    PQfinish(conn); /* borrowed by the client */
    return NULL;
}

/* The sessions of a run: consumers of either kind, and a writer that
 * sends the rest of the crate's statements on mq_payloads meanwhile. */
typedef enum { CRATE, C_API, WRITER } kind_t;

typedef struct {
    kind_t kind;
    consumer_arg arg;
} session_t;

static struct {
    pthread_mutex_t lock;
    int inserts_refused, truncates_refused, clears;
} writer = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0};

/* Next to the consumers: spawns to the channel scratch, which they do not
 * serve, and clears it with the crate's mq_clear statement; sends mq_insert's
 * INSERT for a message the consumers may be completing (23505, or 23503
 * once it is gone) and for no message (23503), and the TRUNCATE (42809). */
static void *payload_writer(void *p)
{
    const consumer_arg *a = p;
    PGconn *c = session_crate(a->schema);
    if (!c)
        return NULL;
    for (int round = 0; !stopping(); round++) {
        spawn_t s = job("scratch");
        s.channel = "scratch";
        s.ordered = round % 2;
        char id[37], st[6], arr[200];
        spawn(c, &s, id);
        PGresult *r =
            PQexec(c, "SELECT id FROM mq_msgs WHERE channel_name <> 'scratch' LIMIT 1");
        const char *live = ok(r) && PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : id;
        new_t_array(arr, sizeof arr, live, "again");
        PQclear(r);
        const char *v = arr;
        crate_state(c, "payload_insert", 1, &v, st);
        int refused = !strcmp(st, "23505") || !strcmp(st, "23503");
        new_id(id);
        new_t_array(arr, sizeof arr, id, "orphan");
        crate_state(c, "payload_insert", 1, &v, st);
        refused += !strcmp(st, "23503");
        if (refused != 2)
            seen_error("payload_insert", "not refused\n");
        crate_state(c, "payload_truncate", 0, NULL, st);
        int truncate_refused = !strcmp(st, "42809");
        if (!truncate_refused)
            seen_error("payload_truncate", "not refused\n");
        const char *chans = "{scratch}";
        crate_state(c, "payload_clear", 1, &chans, st);
        if (st[0])
            seen_error("payload_clear", PQerrorMessage(c));
        pthread_mutex_lock(&writer.lock);
        writer.inserts_refused += refused;
        writer.truncates_refused += truncate_refused;
        writer.clears += !st[0];
        pthread_mutex_unlock(&writer.lock);
        t_sleep_ms(5);
    }
    PQfinish(c);
    return NULL;
}

/* Starts the sessions, waits until want deliveries or the safety limit,
 * stops them. Returns the delivery count. */
static int run_sessions(session_t *ss, int n, int want)
{
    pthread_t th[8];
    for (int i = 0; i < n; i++)
        pthread_create(&th[i], NULL,
                       ss[i].kind == CRATE   ? crate_consumer
                       : ss[i].kind == C_API ? c_consumer
                                             : payload_writer,
                       &ss[i].arg);
    int64_t until = t_now_ms() + 60000;
    int got = 0;
    while (t_now_ms() < until) {
        pthread_mutex_lock(&seen.lock);
        got = seen.n;
        int errs = seen.errors;
        pthread_mutex_unlock(&seen.lock);
        if (got >= want || errs)
            break;
        t_sleep_ms(20);
    }
    t_sleep_ms(200); /* a duplicate would show up now */
    pthread_mutex_lock(&seen.lock);
    seen.stop = 1;
    pthread_mutex_unlock(&seen.lock);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    return seen.n;
}

/* Two crate consumers (one serving named channels, one all, which
 * completes through mq_payloads) and two C consumers (the same), in ss. */
static void four_consumers(const char *schema, session_t ss[4])
{
    /* (A Citus coordinator refuses writes through views, 0A000: there the
     * second crate consumer completes with mq_delete.) */
    ss[0] = (session_t){CRATE, {schema, "{\"\",alpha,beta,jobs}", 0, 0}};
    ss[1] = (session_t){CRATE, {schema, NULL, 1, !t_citus()}};
    ss[2] = (session_t){C_API, {schema, "named", 2, 0}};
    ss[3] = (session_t){C_API, {schema, NULL, 3, 0}};
}

/* four_consumers, run until they have delivered want messages. */
static int run_consumers(const char *schema, int want)
{
    session_t ss[4];
    four_consumers(schema, ss);
    return run_sessions(ss, 4, want);
}

/* Nothing twice; every chain (json {"chain": name, "seq": k}) in order. */
static void check_deliveries(int want)
{
    CHECK_INT(seen.errors, 0);
    CHECK_INT(seen.n, want);
    for (int i = 0; i < seen.n; i++)
        for (int k = i + 1; k < seen.n; k++)
            if (!strcmp(seen.id[i], seen.id[k]))
                t_fail(__FILE__, __LINE__, "%s delivered twice", seen.id[i]);
    for (int i = 0; i < seen.n; i++) {
        char chain[32];
        int seq;
        if (sscanf(seen.json[i], "{\"seq\": %d, \"chain\": \"%31[^\"]\"}", &seq, chain) != 2)
            continue;
        int before = 0;
        for (int k = 0; k < i; k++) {
            char c2[32];
            int s2;
            if (sscanf(seen.json[k], "{\"seq\": %d, \"chain\": \"%31[^\"]\"}", &s2, c2) == 2 &&
                !strcmp(c2, chain))
                before++;
        }
        if (before != seq)
            t_fail(__FILE__, __LINE__, "chain %s: seq %d delivered as number %d", chain, seq,
                   before);
    }
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM app_done"), want);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE dead_since IS NULL"), 0);
}

/* ---- the crate's defaults and the empty channel ------------------------- */

static void test_default_channel_and_listen(void)
{
    PGconn *c = fresh_crate();
    PGconn *l = crate_connect(NULL);
    t_exec(l, "LISTEN \"mq_\"");
    t_exec(l, "LISTEN mq");

    spawn_t s = job("plain"); /* JobBuilder::new("plain").spawn(&pool) */
    char id[37];
    spawn(c, &s, id);
    int on_empty = 0, on_all = 0;
    /* Delivered after the commit, so wait for them (a safety limit only). */
    for (int64_t until = t_now_ms() + 10000; (!on_empty || !on_all) && t_now_ms() < until;) {
        struct pollfd pfd = {.fd = PQsocket(l), .events = POLLIN};
        poll(&pfd, 1, 100);
        PQconsumeInput(l);
        PGnotify *n;
        while ((n = PQnotifies(l))) {
            on_empty += !strcmp(n->relname, "mq_");
            on_all += !strcmp(n->relname, "mq");
            PQfreemem(n);
        }
    }
    CHECK_INT(on_empty, 1);
    CHECK_INT(on_all, 1);

    /* A runner serving only the channel "" gets it, by column name. */
    polled_t rows[4];
    CHECK_INT(crate_poll(c, "{\"\"}", 4, rows, 4), 1);
    CHECK_STR(rows[0].id, id);
    CHECK_INT(rows[0].committed, 1);
    CHECK_STR(rows[0].name, "plain");
    CHECK(rows[0].lease_us == 1000000); /* the default backoff, as the lease */
    CHECK(rows[0].wait_us == 0);
    crate_ids(c, "delete_one", id);

    /* And a C runner's channel filter and producer accept "" too. */
    pqmq_msg *m = t_msg("", NULL, "from-c", "{}", 0);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    pqmq_msg_free(m);
    const char *chans[] = {""};
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, chans, 1, 4, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    if (pqmq_batch_count(b))
        CHECK_STR(pqmq_job_channel(pqmq_batch_job(b, 0)), "");
    CHECK_OK(q, pqmq_complete_batch(q, b));
    pqmq_batch_free(b);
    pqmq_runner *rn = pqmq_runner_new(t_dsn());
    CHECK_INT(pqmq_runner_set_channels(rn, chans, 1), 0);
    pqmq_runner_free(rn);

    /* Nothing is waiting now: wait_time is NULL, never negative. */
    CHECK_INT(crate_poll(c, NULL, 4, rows, 4), 1);
    CHECK(!rows[0].has_id);
    CHECK(rows[0].wait_us == -1);
    PQfinish(l);
    PQfinish(c);
}

/* set_retry_backoff(Duration::ZERO): accepted; a failure retries at once,
 * and a running delivery is still leased (one second), so it is not handed
 * to another consumer meanwhile. */
static void test_zero_backoff(void)
{
    PGconn *c = fresh_crate();
    spawn_t s = job("zero");
    s.backoff_us = 0;
    s.retries = 3;
    char id[37];
    spawn(c, &s, id);

    polled_t rows[4];
    CHECK_INT(crate_poll(c, NULL, 4, rows, 4), 1);
    CHECK_STR(rows[0].id, id);
    CHECK(rows[0].lease_us == 1000000);
    CHECK_INT(crate_poll(c, NULL, 4, rows, 4), 1);
    CHECK(!rows[0].has_id); /* held: not delivered twice */
    CHECK(rows[0].wait_us > 0);

    /* A C consumer's failure report brings it back at once. */
    uuid_t u;
    uuid_parse(id, u);
    t_exec(pg, "SELECT mq_fail('%s', 'boom')", id);
    CHECK_INT(crate_poll(c, NULL, 4, rows, 4), 1);
    CHECK_STR(rows[0].id, id);
    (void)u;
    /* A job dropped without a word comes back when its lease runs out. */
    t_exec(pg, "UPDATE mq_msgs SET attempt_at = now() WHERE id = '%s'", id);
    CHECK_INT(crate_poll(c, NULL, 4, rows, 4), 1);
    CHECK_STR(rows[0].id, id);
    crate_ids(c, "delete_one", id);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);

    /* The C API takes a zero backoff too. */
    pqmq_msg *m = t_msg("c", NULL, "zero", NULL, 0);
    CHECK_OK(q, pqmq_msg_set_backoff(m, 0));
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    pqmq_msg_free(m);
    PQfinish(c);
}

/* Durations the original accepts are accepted; the crate's doubling
 * keep-alive never fails however long the job runs; only what would carry
 * a timestamp out of PostgreSQL's range is refused. */
static void test_long_durations(void)
{
    PGconn *c = fresh_crate();
    spawn_t s = job("long");
    s.channel = "long";
    s.delay_us = 5000LL * 86400000000LL;   /* 5000 days */
    s.backoff_us = 4000LL * 86400000000LL; /* 4000 days */
    char id[37];
    spawn(c, &s, id);
    s.delay_us = 0;
    s.commit_us = 9000LL * 86400000000LL;
    char id2[37];
    spawn(c, &s, id2);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 2);

    /* Too far: refused by name, nothing written. */
    s.commit_us = -1;
    s.delay_us = 40000000LL * 86400000000LL;
    char id3[37], st[6];
    spawn_state(c, &s, id3, st);
    CHECK_STR(st, "22023");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 2);

    /* A delivered job kept alive the crate's way: the interval doubles
     * after every sleep, up to what a Duration can hold. Every call
     * succeeds and the lease only grows. */
    t_exec(pg, "UPDATE mq_msgs SET attempt_at = now() WHERE id = '%s'", id);
    polled_t rows[2];
    CHECK_INT(crate_poll(c, "{long}", 1, rows, 2), 1);
    CHECK_STR(rows[0].id, id);
    long long interval = rows[0].lease_us;
    CHECK(interval == 4000LL * 86400000000LL);
    char prev[64] = "";
    for (int k = 0; k < 16 && interval < (1LL << 62); k++) {
        interval *= 2;
        char dur[40];
        micros(dur, sizeof dur, interval);
        const char *vals[2] = {id, dur};
        PGresult *r = crate_exec(c, "keep_alive", 2, vals);
        if (!ok(r))
            t_fail(__FILE__, __LINE__, "keep_alive(%s): %s", dur, PQerrorMessage(c));
        PQclear(r);
        PGresult *at = t_sql(pg, "SELECT attempt_at::text FROM mq_msgs WHERE id = '%s'", id);
        if (at && PQntuples(at) == 1) {
            CHECK(t_sql_int(pg,
                            "SELECT (attempt_at >= '%s'::timestamptz OR '%s' = '')::int "
                            "FROM mq_msgs WHERE id = '%s'",
                            prev[0] ? prev : "-infinity", prev, id) == 1);
            snprintf(prev, sizeof prev, "%s", PQgetvalue(at, 0, 0));
        }
        PQclear(at);
    }
    /* Cut to the limit, not refused; and a checkpoint the same way. */
    CHECK_INT(t_sql_int(pg,
                        "SELECT (attempt_at <= now() + interval '36500001 days')::int "
                        "FROM mq_msgs WHERE id = '%s'",
                        id),
              1);
    char big[40];
    micros(big, sizeof big, 1LL << 62);
    const char *cp[5] = {id, big, "{\"step\": 2}", NULL, "1"};
    PGresult *r = crate_exec(c, "checkpoint", 5, cp);
    CHECK(ok(r));
    PQclear(r);
    PQfinish(c);
}

/* ---- clear --------------------------------------------------------------- */

static void test_clear(void)
{
    PGconn *c = fresh_crate();
    const char *chans[] = {"foo", "foo", "bar", "bar", "baz", "baz"};
    char ids[6][37];
    for (int i = 0; i < 6; i++) {
        spawn_t s = job("x");
        s.channel = chans[i];
        s.ordered = i % 2; /* each channel: one unordered, one chain head */
        spawn(c, &s, ids[i]);
    }
    /* A held message of foo (its lease running) and a dead one of baz. */
    polled_t rows[8];
    CHECK_INT(crate_poll(c, "{foo}", 1, rows, 8), 1);
    char held[37];
    snprintf(held, sizeof held, "%s", rows[0].id);
    t_exec(pg, "UPDATE mq_msgs SET attempts = 0, dead_since = now() WHERE id = '%s'", ids[4]);

    crate_ids(c, "clear", "{foo,baz}"); /* sqlxmq::clear(&pool, &["foo", "baz"]) */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 2);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE channel_name = 'bar'"), 2);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_payloads"), 2);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_chains WHERE channel_name <> 'bar'"), 0);
    /* The holder of a cleared message completes nothing, and no error. */
    crate_ids(c, "delete_one", held);
    uuid_t u;
    uuid_parse(held, u);
    int n = -1;
    n = t_sql_int(pg, "SELECT mq_complete(ARRAY['%s'::uuid])", held);
    CHECK_INT(n, 0);
    /* A chain of a cleared channel starts again at the head. */
    spawn_t s = job("again");
    s.channel = "foo";
    s.ordered = 1;
    char again[37];
    spawn(c, &s, again);
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM mq_msgs WHERE id = '%s' "
                        "AND after_message_id = '" NIL_UUID "'",
                        again),
              1);
    /* mq_clear of NULL or of no channel clears nothing. */
    crate_ids(c, "clear", "{}");
    CHECK_INT(t_sql_int(pg, "SELECT mq_clear_count(NULL)"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 3);

    /* Ordered chains go whole; another channel's chain is untouched. */
    for (int i = 0; i < 3; i++) {
        s = job("o");
        s.channel = i < 2 ? "bar" : "keep";
        s.args = "a";
        s.ordered = 1;
        char tmp[37];
        spawn(c, &s, tmp);
    }
    crate_ids(c, "clear", "{bar}");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE channel_name = 'bar'"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE channel_name = 'keep' "
                            "AND chain_seq IS NOT NULL"),
              1);

    /* clear_all: nothing left, not even chain records; the nil UUID stays
     * what it was (a chain's head marker), so ordered inserts go on. */
    PGresult *r = crate_exec(c, "clear_all", 0, NULL);
    CHECK(ok(r));
    PQclear(r);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_payloads"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_chains"), 0);
    char first[37], second[37];
    s = job("1");
    s.ordered = 1;
    spawn(c, &s, first);
    s.name = "2";
    spawn(c, &s, second);
    CHECK_INT(crate_poll(c, NULL, 4, rows, 8), 1);
    CHECK_STR(rows[0].id, first);
    crate_ids(c, "delete_one", first);
    CHECK_INT(crate_poll(c, NULL, 4, rows, 8), 1);
    CHECK_STR(rows[0].id, second);
    crate_ids(c, "delete_one", second);
    PQfinish(c);
}

/* ---- the whole life cycle, one step at a time --------------------------- */

static void test_life_cycle(void)
{
    PGconn *c = fresh_crate();
    polled_t rows[8];

    /* Two-phase: invisible until committed, then ready. */
    spawn_t s = job("tp");
    s.channel = "life";
    s.commit_us = 3600000000LL;
    char tp[37];
    spawn(c, &s, tp);
    CHECK_INT(crate_poll(c, "{life}", 4, rows, 8), 1);
    CHECK(!rows[0].has_id);
    CHECK(rows[0].wait_us > 3000000000LL); /* an hour away */
    char arr[64];
    snprintf(arr, sizeof arr, "{%s}", tp);
    crate_ids(c, "commit", arr);
    CHECK_INT(crate_poll(c, "{life}", 4, rows, 8), 1);
    CHECK_STR(rows[0].id, tp);
    CHECK_INT(rows[0].committed, 1);

    /* Checkpoint: a new payload and an extra retry for the next attempt. */
    const char *cp[5] = {tp, "1000000 microseconds", "{\"step\": 2}", NULL, "1"};
    PGresult *r = crate_exec(c, "checkpoint", 5, cp);
    CHECK(ok(r));
    PQclear(r);
    CHECK_INT(t_sql_int(pg, "SELECT attempts FROM mq_msgs WHERE id = '%s'", tp), 5);
    /* The handler fails silently: its lease runs out, the retry sees the
     * checkpoint. */
    t_exec(pg, "UPDATE mq_msgs SET attempt_at = now() WHERE id = '%s'", tp);
    CHECK_INT(crate_poll(c, "{life}", 4, rows, 8), 1);
    CHECK_STR(rows[0].id, tp);
    CHECK_STR(rows[0].json, "{\"step\": 2}");
    CHECK(rows[0].lease_us == 2000000); /* the backoff doubled */

    /* Completion inside the handler's transaction: rolled back, the job
     * stays; committed, the job and the work go together. */
    PQclear(PQexec(c, "BEGIN"));
    t_exec(c, "INSERT INTO app_done (id, by) VALUES ('%s', 'rollback')", tp);
    crate_ids(c, "delete_one", tp);
    PQclear(PQexec(c, "ROLLBACK"));
    const char *one = tp;
    r = crate_exec(c, "exists", 1, &one);
    CHECK(ok(r) && PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't');
    PQclear(r);
    PQclear(PQexec(c, "BEGIN"));
    t_exec(c, "INSERT INTO app_done (id, by) VALUES ('%s', 'commit')", tp);
    crate_ids(c, "delete_one", tp);
    PQclear(PQexec(c, "COMMIT"));
    r = crate_exec(c, "exists", 1, &one);
    CHECK(ok(r) && PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 'f');
    PQclear(r);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM app_done WHERE id = '%s'", tp), 1);

    /* A commit interval that runs out uncommitted: the poll hands it over
     * as not committed and the crate deletes it. */
    s = job("lapsed");
    s.channel = "life";
    s.commit_us = 0;
    char lapsed[37];
    spawn(c, &s, lapsed);
    CHECK_INT(crate_poll(c, "{life}", 4, rows, 8), 1);
    CHECK_STR(rows[0].id, lapsed);
    CHECK_INT(rows[0].committed, 0);
    snprintf(arr, sizeof arr, "{%s}", lapsed);
    crate_ids(c, "delete_many", arr);

    /* Delay: not before its time; wait_time says how long. */
    s = job("later");
    s.channel = "life";
    s.delay_us = 30000000;
    char later[37];
    spawn(c, &s, later);
    CHECK_INT(crate_poll(c, "{life}", 4, rows, 8), 1);
    CHECK(!rows[0].has_id);
    CHECK(rows[0].wait_us > 20000000 && rows[0].wait_us <= 30000000);

    /* Retries: a job that keeps failing silently ends as a dead letter
     * instead of lingering. */
    t_exec(pg, "UPDATE mq_msgs SET attempt_at = now() WHERE id = '%s'", later);
    for (int i = 0; i < 5; i++) {
        CHECK_INT(crate_poll(c, "{life}", 4, rows, 8), 1);
        CHECK_STR(rows[0].id, later);
        t_exec(pg, "UPDATE mq_msgs SET attempt_at = now() WHERE id = '%s'", later);
    }
    CHECK_INT(crate_poll(c, "{life}", 4, rows, 8), 1);
    CHECK(!rows[0].has_id);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_dead_letters(ARRAY['life'])"), 1);
    PQfinish(c);
}

/* ---- the crate's statements that name mq_payloads ------------------------ */

/* Each statement alone: what it does to a message and its chain. */
static void test_payload_statements(void)
{
    if (t_citus_skip("a Citus coordinator refuses writes through views (0A000: cannot modify "
                     "views when the query contains citus tables)"))
        return;
    PGconn *c = fresh_crate();
    char st[6], arr[200];
    /* A chain of four of (pay, k) and an unordered message of pay. */
    char chain[4][37], loose[37];
    for (int i = 0; i < 4; i++) {
        spawn_t s = job("link");
        s.channel = "pay";
        s.args = "k";
        s.ordered = 1;
        s.backoff_us = 60000000;
        char json[64];
        snprintf(json, sizeof json, "{\"seq\": %d}", i);
        s.json = json;
        spawn(c, &s, chain[i]);
    }
    spawn_t s = job("loose");
    s.channel = "pay";
    s.json = "{\"v\": 1}";
    s.backoff_us = 60000000; /* held while the test runs */
    spawn(c, &s, loose);

    /* mq_checkpoint's UPDATE: a new JSON payload, bytes kept; then new
     * bytes, JSON kept. The next delivery carries them. */
    const char *up1[3] = {"{\"v\": 2}", NULL, loose};
    CHECK_INT(crate_state(c, "payload_update", 3, up1, st), 1);
    CHECK_STR(st, "");
    const char *up2[3] = {NULL, "\\x0102", loose};
    CHECK_INT(crate_state(c, "payload_update", 3, up2, st), 1);
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM mq_msgs WHERE id = '%s' AND payload_json = "
                        "'{\"v\": 2}' AND payload_bytes = '\\x0102'::bytea",
                        loose),
              1);

    /* mq_insert's INSERT: a message has its payload already (the
     * original's primary key), an id that is no message has nothing to
     * carry it; nothing is written either way. */
    new_t_array(arr, sizeof arr, loose, "again");
    const char *v = arr;
    crate_state(c, "payload_insert", 1, &v, st);
    CHECK_STR(st, "23505");
    char fresh[37];
    new_id(fresh);
    new_t_array(arr, sizeof arr, fresh, "orphan");
    crate_state(c, "payload_insert", 1, &v, st);
    CHECK_STR(st, "23503");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 5);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_payloads WHERE name <> 'link'"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_payloads WHERE name = 'loose'"), 1);

    /* mq_delete's DELETE completes: the head of the chain, and then the
     * second and fourth in one statement, leave the third at the head. */
    snprintf(arr, sizeof arr, "{%s}", chain[0]);
    CHECK_INT(crate_state(c, "payload_delete", 1, &v, st), 1);
    CHECK_STR(st, "");
    polled_t rows[8];
    CHECK_INT(crate_poll(c, "{pay}", 8, rows, 8), 2);
    int saw_second = 0;
    for (int i = 0; i < 2; i++)
        saw_second += !strcmp(rows[i].id, chain[1]);
    CHECK_INT(saw_second, 1);
    snprintf(arr, sizeof arr, "{%s,%s}", chain[1], chain[3]);
    CHECK_INT(crate_state(c, "payload_delete", 1, &v, st), 2);
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM mq_msgs WHERE id = '%s' AND after_message_id = "
                        "'" NIL_UUID "'",
                        chain[2]),
              1);
    /* ... which is now its chain's first member, and its last. */
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM mq_msgs WHERE channel_name = 'pay' "
                        "AND chain_seq IS NOT NULL AND id <> '%s'",
                        chain[2]),
              0);
    /* A locked message's row (a chain member is a row of mq_rows: the
     * views, a UNION, lock no row) is passed by a poll until the lock
     * goes. */
    t_exec(pg, "BEGIN");
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM (SELECT name FROM mq_rows WHERE id = '%s' "
                        "FOR UPDATE) l",
                        chain[2]),
              1);
    CHECK_INT(crate_poll(c, "{pay}", 8, rows, 8), 1);
    CHECK(!rows[0].has_id);
    t_exec(pg, "COMMIT");
    CHECK_INT(crate_poll(c, "{pay}", 8, rows, 8), 1);
    CHECK_STR(rows[0].id, chain[2]);
    CHECK_STR(rows[0].json, "{\"seq\": 2}");
    /* Again, or a message already gone: nothing, and not counted. */
    CHECK_INT(crate_state(c, "payload_delete", 1, &v, st), 0);
    CHECK_STR(st, "");
    snprintf(arr, sizeof arr, "{%s,%s}", chain[2], loose);
    CHECK_INT(crate_state(c, "payload_delete", 1, &v, st), 2);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_chains"), 0);

    /* mq_clear's and mq_clear_all's statement: the channels' messages go,
     * others stay; a cleared chain starts again at its head. */
    for (int i = 0; i < 3; i++) {
        s = job("c");
        s.channel = i ? "keep" : "gone";
        s.ordered = 1;
        char tmp[37];
        spawn(c, &s, tmp);
    }
    const char *gone = "{gone}";
    crate_state(c, "payload_clear", 1, &gone, st);
    CHECK_STR(st, "");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_payloads"), 2);
    s = job("back");
    s.channel = "gone";
    s.ordered = 1;
    char back[37];
    spawn(c, &s, back);
    CHECK_INT(crate_poll(c, "{gone}", 8, rows, 8), 1);
    CHECK_STR(rows[0].id, back);
    crate_state(c, "payload_clear_all", 0, NULL, st);
    CHECK_STR(st, "");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);

    /* The test suite's TRUNCATE: refused, nothing changed (mq_clear_all()
     * is what a reset calls). */
    spawn(c, &s, back);
    crate_state(c, "payload_truncate", 0, NULL, st);
    CHECK_STR(st, "42809");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_payloads"), 1);
    PQfinish(c);
}

/* ---- both kinds of consumer at once ------------------------------------- */

/* An empty queue, ledger (app_done) and record of deliveries, and a crate
 * connection, prepared. Caller owns; PQfinish. */
static PGconn *fresh_shared(void)
{
    t_truncate();
    t_exec(pg, "TRUNCATE app_done");
    seen_reset();
    PGconn *c = crate_connect(NULL);
    CHECK(crate_prepare(c));
    return c;
}

/* Sends rounds rounds of jobs on the first nch of "", alpha, beta, jobs:
 * ordered jobs on the chains of args "", x and y, from the crate's SQL and
 * the C API by turns (the turn also alternates by channel when
 * by_channel), and one unordered crate job a channel. Returns how many. */
static int produce_shared(PGconn *c, int nch, int rounds, int by_channel)
{
    const char *channels[] = {"", "alpha", "beta", "jobs"};
    const char *chain_args[] = {"", "x", "y"};
    int want = 0, seq[4][3] = {{0}};
    for (int round = 0; round < rounds; round++) {
        for (int ch = 0; ch < nch; ch++) {
            for (int a = 0; a < 3; a++) {
                char json[96], tmp[37];
                snprintf(json, sizeof json, "{\"seq\": %d, \"chain\": \"%s/%s\"}", seq[ch][a]++,
                         channels[ch][0] ? channels[ch] : "-", chain_args[a]);
                if ((round + a + (by_channel ? ch : 0)) % 2) {
                    spawn_t s = job("shared");
                    s.channel = channels[ch];
                    s.args = chain_args[a];
                    s.ordered = 1;
                    s.json = json;
                    s.backoff_us = 60000000;
                    spawn(c, &s, tmp);
                } else {
                    pqmq_msg *m = t_msg(channels[ch], chain_args[a], "shared", json, 1);
                    pqmq_msg_set_backoff(m, 60000);
                    CHECK_OK(q, pqmq_insert(q, &m, 1));
                    pqmq_msg_free(m);
                }
                want++;
            }
            spawn_t u = job("unordered");
            u.channel = channels[ch];
            u.backoff_us = 60000000;
            char tmp[37];
            spawn(c, &u, tmp);
            want++;
        }
    }
    return want;
}

/* The set-up and run of the tests of concurrent sessions: a fresh queue
 * (fresh_shared), rounds of jobs on nch channels (produce_shared), sent
 * while nothing consumes yet, then the n sessions ss until they have
 * delivered them all; by[i] counts session i's deliveries. Returns how
 * many were sent; *crate: the crate connection (caller owns; PQfinish). */
static int run_shared(int nch, int rounds, int by_channel, session_t *ss, int n, int *by,
                      PGconn **crate)
{
    *crate = fresh_shared();
    int want = produce_shared(*crate, nch, rounds, by_channel);
    CHECK_INT(run_sessions(ss, n, want), want);
    for (int i = 0; i < seen.n; i++)
        by[seen.by[i]]++;
    return want;
}

static void test_shared_channels(void)
{
    /* Producers alternate: the crate's SQL and the C API, on the same
     * chains, while nothing consumes yet (then all at once). */
    session_t ss[4];
    four_consumers(NULL, ss);
    int by[4] = {0};
    PGconn *c;
    int want = run_shared(3, 20, 0, ss, 4, by, &c);
    check_deliveries(want);
    printf("# deliveries by consumer: crate %d + %d, C %d + %d\n", by[0], by[1], by[2], by[3]);
    CHECK(by[0] + by[1] > 0);
    CHECK(by[2] + by[3] > 0);
    PQfinish(c);
}

/* The crate's statements on mq_payloads from several sessions at once:
 * crate consumers completing through the view share ordered chains with
 * crate consumers calling mq_delete and C consumers, while a writer sends
 * the INSERT, the TRUNCATE and the clear. Nothing lost, nothing twice,
 * every chain in order, no chain record left. */
static void test_payload_writes_concurrently(void)
{
    if (t_citus_skip("a Citus coordinator refuses writes through views (0A000: cannot modify "
                     "views when the query contains citus tables)"))
        return;
    const char *named = "{\"\",alpha,beta,jobs}";
    session_t ss[6] = {{CRATE, {NULL, named, 0, 1}}, {CRATE, {NULL, named, 1, 1}},
                       {CRATE, {NULL, named, 2, 0}}, {C_API, {NULL, named, 3, 0}},
                       {C_API, {NULL, named, 4, 0}}, {WRITER, {NULL, NULL, 5, 0}}};
    writer.inserts_refused = writer.truncates_refused = writer.clears = 0;
    int by[6] = {0};
    PGconn *c;
    int want = run_shared(4, 12, 1, ss, 6, by, &c);
    /* What the writer left on its own channel. */
    const char *scratch = "{scratch}";
    char st[6];
    crate_state(c, "payload_clear", 1, &scratch, st);
    CHECK_STR(st, "");
    check_deliveries(want);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_chains WHERE channel_name <> 'scratch'"),
              0);
    printf("# deliveries: crate through mq_payloads %d + %d (%d transactions again), "
           "crate %d, C %d + %d; writer: %d inserts and %d truncates refused, %d clears\n",
           by[0], by[1], atomic_load(&view_retries), by[2], by[3], by[4],
           writer.inserts_refused, writer.truncates_refused, writer.clears);
    CHECK(by[0] + by[1] > 0);
    CHECK(by[3] + by[4] > 0);
    CHECK(writer.clears > 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM app_done WHERE by = 'view'"), by[0] + by[1]);
    PQfinish(c);
}

/* ---- a database created by the original schema, adopted in place -------- */

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = 0;
    fclose(f);
    return s;
}

static void test_adopt_original_database(void)
{
    if (t_citus_skip("the original schema's script is one multi-statement string, which a "
                     "coordinator cannot forward"))
        return;
    const char *dir = getenv("PQMQ_MIGRATIONS_DIR");
    char *path = NULL;
    if (asprintf(&path, "%s/../tests/fixtures/sqlxmq_original.sql", dir ? dir : "migrations") <
        0)
        abort();
    char *fixture = read_file(path);
    if (!fixture) {
        t_fail(__FILE__, __LINE__, "cannot read %s (set PQMQ_MIGRATIONS_DIR)", path);
        free(path);
        return;
    }
    free(path);
    char schema[80];
    snprintf(schema, sizeof schema, "%s_orig", t_schema());
    t_exec(pg, "DROP SCHEMA IF EXISTS %s CASCADE", schema);
    t_exec(pg, "CREATE SCHEMA %s", schema);
    PGconn *orig = crate_connect(schema);
    t_exec(orig, "%s", fixture);
    free(fixture);
    CHECK_INT(t_sql_int(orig, "SELECT count(*) FROM mq_msgs"), 11);
    /* A message the original's mq_insert got a NULL delay for: no
     * attempt_at, but every attempt left (never delivered). */
    t_exec(orig, "INSERT INTO mq_msgs (id, attempt_at, attempts, channel_name, channel_args) "
                 "VALUES ('f0000000-0000-4000-8000-000000000001', NULL, 5, 'later', '')");
    t_exec(orig, "INSERT INTO mq_payloads (id, name, payload_json) "
                 "VALUES ('f0000000-0000-4000-8000-000000000001', 'f1', '{}')");

    /* A reader of the original's table reads the view of that name. */
    t_exec(pg, "DO $$ BEGIN CREATE ROLE pqmq_t_sxr NOLOGIN; "
               "EXCEPTION WHEN duplicate_object THEN NULL; END $$");
    t_exec(orig, "GRANT SELECT ON mq_msgs TO pqmq_t_sxr");

    pqmq_client *mc = NULL;
    CHECK_INT(pqmq_wrap(orig, &mc), 0);
    CHECK_OK(mc, pqmq_migrate(mc));
    CHECK_INT(t_sql_int(pg,
                        "SELECT (c.relkind = 'v' AND has_table_privilege('pqmq_t_sxr', c.oid, "
                        "'SELECT'))::int FROM pg_class c WHERE c.oid = '%s.mq_msgs'::regclass",
                        schema),
              1);
    CHECK_INT(t_sql_int(pg, "SELECT max(version) FROM %s.mq_schema_migrations", schema),
              pqmq_schema_version());
    /* The sentinel row is gone; the last-attempt message is a dead letter;
     * each chain's links became places (three chains, none linked now). */
    CHECK_INT(t_sql_int(orig, "SELECT count(*) FROM mq_msgs"), 11);
    CHECK_INT(t_sql_int(orig, "SELECT count(*) FROM mq_dead_letters(NULL)"), 1);
    /* The NULL-delay message is ready, with no delivery counted. */
    CHECK_INT(t_sql_int(orig, "SELECT count(*) FROM mq_msgs WHERE id = "
                              "'f0000000-0000-4000-8000-000000000001' AND deliveries = 0 "
                              "AND attempts = 5 AND dead_since IS NULL "
                              "AND attempt_at <= now() AND ready_at <= now()"),
              1);
    CHECK_INT(t_sql_int(orig, "SELECT mq_complete('{f0000000-0000-4000-8000-000000000001}')"),
              1);
    CHECK_INT(t_sql_int(orig, "SELECT count(*) FROM mq_msgs"), 10);
    CHECK_INT(t_sql_int(orig, "SELECT count(DISTINCT channel_key) FROM mq_msgs "
                              "WHERE chain_seq IS NOT NULL"),
              3);
    CHECK_INT(t_sql_int(orig, "SELECT count(*) FROM mq_msgs WHERE after_message_id <> "
                              "'" NIL_UUID "'"),
              0);
    CHECK_OK(mc, pqmq_migrate(mc)); /* again: nothing to do */

    /* The crate goes on where it was: a new ordered job joins the end of
     * its chain, and the reserved (uncommitted) head is committed. */
    PGconn *c = crate_connect(schema);
    CHECK(crate_prepare(c));
    spawn_t s = job("b4");
    s.channel = "jobs";
    s.args = "acct-1";
    s.ordered = 1;
    s.json = "{\"seq\": 3, \"chain\": \"jobs/acct-1\"}";
    char b4[37];
    spawn(c, &s, b4);
    CHECK_INT(t_sql_int(orig,
                        "SELECT count(*) FROM mq_msgs WHERE id = '%s' AND "
                        "chain_seq > (SELECT chain_seq FROM mq_msgs "
                        "WHERE id = 'b0000000-0000-4000-8000-000000000003')",
                        b4),
              1);
    crate_ids(c, "commit", "{d0000000-0000-4000-8000-000000000001}");
    t_exec(orig, "CREATE TABLE app_done (id uuid PRIMARY KEY, by text NOT NULL)");
    /* The delayed one is due in two seconds; both kinds of consumer take
     * everything. */
    seen_reset();
    PGconn *saved = pg;
    pg = orig;
    int got = run_consumers(schema, 10);
    CHECK_INT(got, 10);
    check_deliveries(10);
    pg = saved;
    CHECK_INT(t_sql_int(orig, "SELECT count(*) FROM mq_dead_letters(NULL)"), 1);
    PQfinish(c);
    pqmq_client_free(mc);
    PQfinish(orig);
    t_exec(pg, "DROP SCHEMA %s CASCADE", schema);
    t_exec(pg, "DROP OWNED BY pqmq_t_sxr");
    t_exec(pg, "DROP ROLE pqmq_t_sxr");
}

int main(void)
{
    t_init("sqlxmq");
    q = t_client();
    pg = t_pg();
    t_exec(pg, "CREATE TABLE app_done (id uuid PRIMARY KEY, by text NOT NULL)");
    T_RUN(test_default_channel_and_listen);
    T_RUN(test_zero_backoff);
    T_RUN(test_long_durations);
    T_RUN(test_clear);
    T_RUN(test_life_cycle);
    T_RUN(test_shared_channels);
    T_RUN(test_payload_statements);
    T_RUN(test_payload_writes_concurrently);
    T_RUN(test_adopt_original_database);
    PQfinish(pg);
    pqmq_client_free(q);
    return t_done();
}
