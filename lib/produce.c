/*
 * produce.c: inserting a batch in one round trip (an mq_new_t[] sent in
 * binary through libpqtypes) and committing two-phase messages.
 */
#include <stdio.h>
#include <string.h>

#include "pqmq-int.h"

/* Largest request we build: well under PostgreSQL's 1 GB message limit.
 * The server refuses the same (_mq_limits' max_batch_payload). */
#define MAX_BATCH_BYTES ((size_t)256 * 1024 * 1024)
/* Bytes in a channel name, channel args, message name or unique key
 * (_mq_limits' max_text). */
#define MAX_TEXT 1024

/* A batch's checks are pqmq_insert's whichever call makes them
 * (pqmq_insert_unique; pqmq_insert_batches names the batch before them):
 * their errors say so. */
#define CHECKS "pqmq_insert: "

static int is_utf8_client(pqmq_client *c)
{
    return strcmp(pg_encoding_to_char(PQclientEncoding(c->conn)), "UTF8") == 0;
}

static int check_text(pqmq_client *c, size_t i, const char *field, const char *s, int utf8)
{
    if (s && strlen(s) > MAX_TEXT)
        return pqmq__seterr(c, PQMQ_EINVAL, CHECKS "msgs[%zu]: %s is over %d bytes", i, field,
                            MAX_TEXT);
    if (s && utf8 && !pqmq__utf8_ok(s))
        return pqmq__seterr(c, PQMQ_EINVAL, CHECKS "msgs[%zu]: %s is not valid UTF-8", i,
                            field);
    return 0;
}

/* Names the first thing wrong with message i, as the server would. */
static int check_msg(pqmq_client *c, size_t i, const pqmq_msg *m, int utf8)
{
    if (!m)
        return pqmq__seterr(c, PQMQ_EINVAL, CHECKS "msgs[%zu] is NULL", i);
    /* "" is a channel like any other (sqlxmq's default). */
    if (!m->channel)
        return pqmq__seterr(c, PQMQ_EINVAL, CHECKS "msgs[%zu]: channel is NULL", i);
    int rc = check_text(c, i, "channel", m->channel, utf8);
    if (!rc)
        rc = check_text(c, i, "channel args", m->args, utf8);
    if (!rc)
        rc = check_text(c, i, "name", m->name, utf8);
    if (rc)
        return rc;
    if (m->retries < 0)
        return pqmq__seterr(c, PQMQ_EINVAL, CHECKS "msgs[%zu]: retries is negative (%d)", i,
                            m->retries);
    if ((rc = pqmq__check_ms(c, m->delay_ms, CHECKS "msgs[%zu]: delay", i)) ||
        (rc = pqmq__check_ms(c, m->backoff_ms, CHECKS "msgs[%zu]: backoff", i)))
        return rc;
    if (m->commit_interval_ms >= 0 &&
        (rc = pqmq__check_ms(c, m->commit_interval_ms, CHECKS "msgs[%zu]: commit interval", i)))
        return rc;
    if (m->json) {
        size_t len = strlen(m->json);
        if (len > PQMQ_MAX_PAYLOAD)
            return pqmq__seterr(c, PQMQ_ETOOBIG,
                                CHECKS "msgs[%zu]: JSON payload of %zu bytes is over "
                                       "the limit of %d",
                                i, len, PQMQ_MAX_PAYLOAD);
        size_t at = pqmq_json_check(m->json, len);
        if (at)
            return pqmq__seterr(c, PQMQ_EINVAL,
                                CHECKS "msgs[%zu]: payload is not valid JSON "
                                       "(at byte %zu)",
                                i, at);
    }
    if (m->unique_key && !*m->unique_key)
        return pqmq__seterr(c, PQMQ_EINVAL,
                            CHECKS "msgs[%zu]: unique key is empty (NULL means none)", i);
    if ((rc = check_text(c, i, "unique key", m->unique_key, utf8)))
        return rc;
    if (m->priority < 0 || m->priority > PQMQ_MAX_PRIORITY)
        return pqmq__seterr(c, PQMQ_EINVAL, CHECKS "msgs[%zu]: priority %d is outside 0..%d", i,
                            m->priority, PQMQ_MAX_PRIORITY);
    if (m->bytes && m->bytes_len > PQMQ_MAX_PAYLOAD)
        return pqmq__seterr(c, PQMQ_ETOOBIG,
                            CHECKS "msgs[%zu]: binary payload of %zu bytes is over "
                                   "the limit of %d",
                            i, m->bytes_len, PQMQ_MAX_PAYLOAD);
    return 0;
}

int pqmq__check_batch(pqmq_client *c, pqmq_msg *const *msgs, size_t n)
{
    if (!msgs || n == 0)
        return pqmq__seterr(c, PQMQ_EINVAL, CHECKS "empty batch (msgs %s, n %zu)",
                            msgs ? "set" : "NULL", n);
    if (n > PQMQ_MAX_BATCH)
        return pqmq__seterr(c, PQMQ_ETOOBIG,
                            CHECKS "batch of %zu messages is over the limit of %d", n,
                            PQMQ_MAX_BATCH);
    int utf8 = is_utf8_client(c);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = check_msg(c, i, msgs[i], utf8);
        if (rc)
            return rc;
        total += (msgs[i]->json ? strlen(msgs[i]->json) : 0) + msgs[i]->bytes_len;
        if (total > MAX_BATCH_BYTES)
            return pqmq__seterr(c, PQMQ_ETOOBIG,
                                CHECKS "batch payloads exceed %zu MiB in all; "
                                       "split the batch",
                                MAX_BATCH_BYTES >> 20);
    }
    return 0;
}

int pqmq__has_keys(pqmq_msg *const *msgs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (msgs[i]->unique_key)
            return 1;
    return 0;
}

/* The statement that inserts a batch: keys, when any message has one, go
 * through mq_insert_unique (keeping what a live key holds); priorities,
 * when any is above 0, are the last parameter. */
static const char *insert_sql(int keys, int prio)
{
    if (keys)
        return prio ? "SELECT count(*) FROM mq_insert_unique($1, $2, priorities => $3)"
                    : "SELECT count(*) FROM mq_insert_unique($1, $2)";
    return prio ? "SELECT mq_insert($1, $2)" : "SELECT mq_insert($1)";
}

/* The batch as insert_sql's parameters, in a new PGparam (*out; caller
 * clears); *keys: whether they include the keys. */
static int batch_param(pqmq_client *c, pqmq_msg *const *msgs, size_t n, int force_keys,
                       PGparam **out, int *keys)
{
    *keys = force_keys || pqmq__has_keys(msgs, n);
    *out = pqmq__param(c);
    return *out ? pqmq__put_batch(c, *out, msgs, n, *keys) : PQMQ_ENOMEM;
}

int pqmq__begin_insert(pqmq_client *c, pqmq_msg *const *msgs, size_t n, int force_keys,
                       PGparam **param, int *keys)
{
    *param = NULL;
    int rc = pqmq__ready(c);
    if (!rc)
        rc = pqmq__check_batch(c, msgs, n);
    if (!rc)
        rc = pqmq__need_composite(c);
    return rc ? rc : batch_param(c, msgs, n, force_keys, param, keys);
}

PQMQ_EXPORT int pqmq_insert(pqmq_client *c, pqmq_msg *const *msgs, size_t n)
{
    if (pqmq__enter(c, "pqmq_insert"))
        return PQMQ_EINVAL;
    PGparam *param;
    int keys;
    int rc = pqmq__begin_insert(c, msgs, n, 0, &param, &keys);
    int prio = 0;
    if (!rc)
        rc = pqmq__put_priorities_if_any(c, param, msgs, n, &prio);
    if (!rc)
        PQclear(pqmq__exec(c, param, insert_sql(keys, prio), &rc));
    PQparamClear(param);
    return rc;
}

/* ---- many batches in one round trip ------------------------------------ */

/* Checks every batch before anything is sent; names the bad one. */
static int check_batches(pqmq_client *c, pqmq_msg *const *const *batches, const size_t *counts,
                         size_t nbatches)
{
    if (!batches || !counts || nbatches == 0 || nbatches > PQMQ_MAX_BATCH)
        return pqmq__err(c, PQMQ_EINVAL, "nbatches is %zu (1..%d, with batches and counts)",
                         nbatches, PQMQ_MAX_BATCH);
    if (PQtransactionStatus(pqmq_conn(c)) != PQTRANS_IDLE)
        return pqmq__err(c, PQMQ_EINVAL,
                         "a transaction is open; each batch commits on its own "
                         "(pqmq_insert joins an open transaction)");
    for (size_t k = 0; k < nbatches; k++) {
        int rc = pqmq__check_batch(c, batches[k], counts[k]);
        if (rc) {
            char why[512];
            snprintf(why, sizeof why, "%s", pqmq_errmsg(c));
            return pqmq__err(c, rc, "batch %zu: %s", k, why);
        }
    }
    return 0;
}

/* Sends one batch's insert into the pipeline. */
static int send_batch(pqmq_client *c, pqmq_msg *const *msgs, size_t n)
{
    PGparam *param = NULL;
    int keys;
    int rc = batch_param(c, msgs, n, 0, &param, &keys);
    int prio = 0;
    if (!rc)
        rc = pqmq__put_priorities_if_any(c, param, msgs, n, &prio);
    if (!rc && !PQparamSendQuery(pqmq_conn(c), param, insert_sql(keys, prio), 1))
        rc = pqmq__err(c, PQMQ_ECONN, "sending: %s", PQerrorMessage(pqmq_conn(c)));
    PQparamClear(param);
    return rc;
}

static int send_plain(PGconn *conn, const char *sql)
{
    return PQsendQueryParams(conn, sql, 0, NULL, NULL, NULL, NULL, 0);
}

/* Sends batches [from, n) into the pipeline, each between BEGIN and
 * COMMIT (its own transaction), behind one sync: a pooler in transaction
 * mode (PgBouncer) may give the server connection to another client at
 * any sync that finds no transaction open, even with more of the pipeline
 * on its way. Returns where sending stopped (n: all sent). */
static size_t send_round(pqmq_client *c, pqmq_msg *const *const *batches, const size_t *counts,
                         size_t from, size_t n)
{
    PGconn *conn = pqmq_conn(c);
    size_t k = from;
    while (k < n && send_plain(conn, "BEGIN") && send_batch(c, batches[k], counts[k]) == 0 &&
           send_plain(conn, "COMMIT"))
        k++;
    if (!PQpipelineSync(conn))
        return from; /* nothing reached the server whole */
    return k;
}

/* The outcome of the pipeline's next statement: 0, a negative code (the
 * client's error says why), or 1: skipped, as an earlier statement of the
 * round failed. */
static int next_outcome(pqmq_client *c)
{
    PGresult *r = NULL, *more;
    while ((more = PQgetResult(pqmq_conn(c))) != NULL) {
        PQclear(r);
        r = more;
    }
    if (r && PQresultStatus(r) == PGRES_PIPELINE_ABORTED) {
        PQclear(r);
        return 1;
    }
    int rc = 0;
    PQclear(pqmq__result_outcome(c, r, &rc));
    return rc;
}

/* Per batch: 0 committed, or why not; and the first failure, for the
 * call's own error. */
typedef struct {
    int *rcs;
    int first;
    char why[512];
} outcomes;

static void note(outcomes *o, pqmq_client *c, size_t k, int rc)
{
    if (o->rcs)
        o->rcs[k] = rc;
    if (rc && !o->first) {
        o->first = rc;
        snprintf(o->why, sizeof o->why, "batch %zu: %s", k, pqmq_errmsg(c));
    }
}

/* Reads the round of batches [from, sent): returns where the next round
 * starts, the first batch the server skipped after one failed (sent: none
 * was). */
static size_t read_round(pqmq_client *c, outcomes *o, size_t from, size_t sent)
{
    size_t again = sent;
    for (size_t k = from; k < sent; k++) {
        int rc = 0;
        for (int st = 0; st < 3; st++) { /* BEGIN, the insert, COMMIT */
            int r = next_outcome(c);
            rc = rc ? rc : r;
        }
        if (rc == 1 && again == sent)
            again = k;
        if (rc != 1)
            note(o, c, k, rc);
    }
    PGresult *sync = PQgetResult(pqmq_conn(c));
    int synced = PQresultStatus(sync) == PGRES_PIPELINE_SYNC;
    PQclear(sync);
    return synced ? again : sent; /* connection lost: no next round */
}

PQMQ_EXPORT int pqmq_insert_batches(pqmq_client *c, pqmq_msg *const *const *batches,
                                    const size_t *counts, size_t nbatches, int *rcs)
{
    if (pqmq__enter(c, "pqmq_insert_batches"))
        return PQMQ_EINVAL;
    int rc = pqmq__ready(c);
    if (!rc)
        rc = check_batches(c, batches, counts, nbatches);
    if (!rc)
        rc = pqmq__need_composite(c);
    if (rc) {
        for (size_t k = 0; rcs && k < nbatches; k++)
            rcs[k] = rc;
        return rc;
    }
    PGconn *conn = pqmq_conn(c);
    outcomes o = {rcs, 0, ""};
    size_t from = 0;
    /* One round trip when every batch commits; a failed batch's round
     * skipped those after it, which go again in the next. */
    while (from < nbatches) {
        size_t sent =
            PQenterPipelineMode(conn) ? send_round(c, batches, counts, from, nbatches) : from;
        size_t again = read_round(c, &o, from, sent);
        PQexitPipelineMode(conn);
        if (PQtransactionStatus(conn) == PQTRANS_INERROR ||
            PQtransactionStatus(conn) == PQTRANS_INTRANS)
            PQclear(PQexec(conn, "ROLLBACK")); /* the failed batch's transaction */
        if (again == from || (again == sent && sent < nbatches)) {
            pqmq__err(c, PQMQ_ECONN, "sending: %s", PQerrorMessage(conn));
            for (size_t k = again; k < nbatches; k++)
                note(&o, c, k, PQMQ_ECONN);
            break;
        }
        from = again;
    }
    if (o.first)
        pqmq__err(c, o.first, "%s", o.why);
    return o.first;
}

PQMQ_EXPORT int pqmq_commit(pqmq_client *c, const uuid_t *ids, size_t n)
{
    return pqmq__ids_call(c, "pqmq_commit", "SELECT mq_commit($1)", ids, n, NULL, NULL);
}
