/*
 * consume.c: the consumer's calls: poll a batch, then complete, fail, keep
 * alive or checkpoint its jobs (and, for the runner, release unstarted
 * ones). Statements are built with params.c; rows are read by job.c.
 */
#include <stdlib.h>
#include <string.h>

#include "pqmq-int.h"

int pqmq__poll(pqmq_client *c, const char *const *channels, size_t nchannels, int batch_size,
               int left, pqmq_batch **out)
{
    /* mq_claim_lane straight away, as the locked poll below: mq_claim and
     * mq_claim_locked are wrappers for SQL callers. */
    return pqmq__query_jobs(c,
                            left ? "SELECT * FROM mq_claim_lane($1, $2, 2)"
                                 : "SELECT * FROM mq_claim_lane($1, $2, 0)",
                            channels, nchannels, "batch_size", batch_size, out);
}

PQMQ_EXPORT int pqmq_poll(pqmq_client *c, const char *const *channels, size_t nchannels,
                          int batch_size, pqmq_batch **out)
{
    int rc = pqmq__begin_batch(c, "pqmq_poll", out);
    return rc ? rc : pqmq__poll(c, channels, nchannels, batch_size, 0, out);
}

PQMQ_EXPORT int pqmq_poll_locked(pqmq_client *c, const char *const *channels, size_t nchannels,
                                 int batch_size, pqmq_batch **out)
{
    int rc = pqmq__begin_batch(c, "pqmq_poll_locked", out);
    if (rc)
        return rc;
    PGTransactionStatusType st = PQtransactionStatus(pqmq_conn(c));
    if (st != PQTRANS_IDLE && st != PQTRANS_INTRANS)
        return pqmq__err(c, PQMQ_EINVAL, "the connection's transaction %s (ROLLBACK first)",
                         st == PQTRANS_INERROR ? "has failed" : "is busy or unknown");
    PGparam *param;
    rc = pqmq__begin(c, &param);
    if (!rc)
        rc = pqmq__put_channels_count(c, param, channels, nchannels, "batch_size", batch_size);
    PGresult *res = NULL;
    /* The jobs live as long as the transaction's locks: open one (in the
     * same round trip) when none is. */
    if (!rc)
        res = pqmq__exec_piped(c, st == PQTRANS_IDLE ? "BEGIN" : NULL, param,
                               "SELECT * FROM mq_claim_lane($1, $2, 1)", NULL, &rc);
    PQparamClear(param);
    if (!rc)
        rc = pqmq__batch_from(c, res, out);
    if (rc && st == PQTRANS_IDLE && PQtransactionStatus(pqmq_conn(c)) != PQTRANS_IDLE)
        PQclear(PQexec(pqmq_conn(c), "ROLLBACK")); /* ours: leave none behind */
    if (!rc)
        pqmq__batch_set_locked(*out);
    return rc;
}

int pqmq__complete_commit(pqmq_client *c, const pqmq__delivery *d, size_t n)
{
    int rc = 0;
    if (n == 0) {
        PQclear(pqmq__exec_text(c, "COMMIT", &rc));
        return rc;
    }
    PGparam *param = NULL;
    rc = pqmq__begin_deliveries(c, d, n, &param);
    /* All or nothing: mq_complete_all fails on a job that is no longer
     * ours, so the COMMIT behind it in the pipeline does not run. */
    if (!rc)
        PQclear(
            pqmq__exec_piped(c, NULL, param, "SELECT mq_complete_all($1, $2)", "COMMIT", &rc));
    PQparamClear(param);
    if (rc && PQtransactionStatus(pqmq_conn(c)) != PQTRANS_IDLE)
        PQclear(PQexec(pqmq_conn(c), "ROLLBACK"));
    return rc;
}

PQMQ_EXPORT int pqmq_complete_commit(pqmq_client *c, const pqmq_batch *b)
{
    if (pqmq__enter(c, "pqmq_complete_commit"))
        return PQMQ_EINVAL;
    if (PQtransactionStatus(pqmq_conn(c)) != PQTRANS_INTRANS)
        return pqmq__err(c, PQMQ_EINVAL, "no transaction is open on the connection");
    pqmq__delivery *d = NULL;
    int rc = pqmq__batch_deliveries(c, b, &d);
    if (!rc)
        rc = pqmq__complete_commit(c, d, pqmq_batch_count(b));
    free(d);
    return rc;
}

int pqmq__stale_check(pqmq_client *c, size_t done, size_t n)
{
    if (done >= n)
        return 0;
    return pqmq__err(c, PQMQ_ESTALE,
                     "%zu of %zu jobs were delivered again (or completed) since "
                     "this delivery; they were left to their new owner",
                     n - done, n);
}

/* Runs sql, taking deliveries as $1 (ids) and $2 (attempts), and returns
 * the function's count in *count. */
static int deliveries_call(pqmq_client *c, const char *sql, const pqmq__delivery *d, size_t n,
                           int *count)
{
    *count = 0;
    PGparam *param;
    int rc = pqmq__begin_deliveries(c, d, n, &param);
    if (!rc)
        rc = pqmq__exec_scalar(c, param, sql, "%int4", count);
    PQparamClear(param);
    return rc;
}

int pqmq__complete(pqmq_client *c, const pqmq__delivery *d, size_t n, size_t *done)
{
    int count;
    int rc = deliveries_call(c, "SELECT mq_complete($1, $2)", d, n, &count);
    *done = rc ? 0 : (size_t)count;
    return rc ? rc : pqmq__stale_check(c, *done, n);
}

int pqmq__release(pqmq_client *c, const pqmq__delivery *d, size_t n)
{
    int count;
    pqmq__enter(c, "pqmq_runner: release");
    return deliveries_call(c, "SELECT mq_release($1, $2)", d, n, &count);
}

PQMQ_EXPORT int pqmq_complete(pqmq_client *c, const uuid_t *ids, size_t n)
{
    return pqmq__ids_call(c, "pqmq_complete", "SELECT mq_complete($1)", ids, n, NULL, NULL);
}

PQMQ_EXPORT int pqmq_complete_batch(pqmq_client *c, const pqmq_batch *b)
{
    if (pqmq__enter(c, "pqmq_complete_batch"))
        return PQMQ_EINVAL;
    if (!b)
        return pqmq__err(c, PQMQ_EINVAL, "batch is NULL");
    size_t n = pqmq_batch_count(b), done;
    if (n == 0)
        return 0;
    pqmq__delivery *d;
    int rc = pqmq__batch_deliveries(c, b, &d);
    if (!rc)
        rc = pqmq__complete(c, d, n, &done);
    free(d);
    return rc;
}

PQMQ_EXPORT int pqmq_keep_alive(pqmq_client *c, const uuid_t *ids, size_t n,
                                int64_t duration_ms, size_t *extended)
{
    if (extended)
        *extended = 0;
    if (pqmq__enter(c, "pqmq_keep_alive"))
        return PQMQ_EINVAL;
    PGparam *param;
    int count = 0;
    int rc = pqmq__begin_ids(c, ids, n, &param);
    if (!rc)
        rc = pqmq__put_duration(c, param, duration_ms, "duration");
    if (!rc)
        rc = pqmq__exec_scalar(c, param, "SELECT mq_keep_alive_count($1, $2)", "%int4", &count);
    PQparamClear(param);
    if (!rc && extended)
        *extended = (size_t)count;
    return rc;
}

PQMQ_EXPORT int pqmq_fail(pqmq_client *c, const uuid_t id, const char *error)
{
    return pqmq__fail(c, id, 0, error);
}

int pqmq__fail(pqmq_client *c, const uuid_t id, int attempt, const char *error)
{
    if (pqmq__enter(c, "pqmq_fail"))
        return PQMQ_EINVAL;
    PGparam *param;
    int held = 0;
    int rc = pqmq__begin_id(c, id, &param);
    if (!rc && !PQputf(param, "%text* %int4", error, attempt))
        rc = pqmq__err(c, PQMQ_ENOMEM, "%s", PQgeterror());
    /* Attempt 0 means "whichever delivery holds the lease". */
    if (!rc)
        rc = pqmq__exec_scalar(c, param, "SELECT mq_fail($1, $2, NULLIF($3, 0))", "%bool",
                               &held);
    PQparamClear(param);
    if (!rc && !held)
        rc = pqmq__err(c, PQMQ_ENOTHELD, "message is gone or its lease ran out");
    return rc;
}

/* The checkpoint's own arguments, checked as the server would. */
static int check_progress(pqmq_client *c, const char *json, const void *bytes, size_t len,
                          int extra_retries)
{
    if (extra_retries < 0)
        return pqmq__err(c, PQMQ_EINVAL, "extra_retries is negative (%d)", extra_retries);
    size_t jlen = json ? strlen(json) : 0;
    if (jlen > PQMQ_MAX_PAYLOAD || (bytes && len > PQMQ_MAX_PAYLOAD))
        return pqmq__err(c, PQMQ_ETOOBIG, "payload is over %d bytes", PQMQ_MAX_PAYLOAD);
    size_t at = json ? pqmq_json_check(json, jlen) : 0;
    if (at)
        return pqmq__err(c, PQMQ_EINVAL, "payload is not valid JSON (at byte %zu)", at);
    return 0;
}

PQMQ_EXPORT int pqmq_checkpoint(pqmq_client *c, const uuid_t id, int64_t duration_ms,
                                const char *json, const void *bytes, size_t len,
                                int extra_retries)
{
    return pqmq__checkpoint(c, id, 0, duration_ms, json, bytes, len, extra_retries);
}

int pqmq__checkpoint(pqmq_client *c, const uuid_t id, int attempt, int64_t duration_ms,
                     const char *json, const void *bytes, size_t len, int extra_retries)
{
    if (pqmq__enter(c, "pqmq_checkpoint"))
        return PQMQ_EINVAL;
    PGparam *param;
    int found = 0;
    int rc = pqmq__begin_id(c, id, &param);
    if (!rc)
        rc = pqmq__put_duration(c, param, duration_ms, "duration");
    if (!rc)
        rc = check_progress(c, json, bytes, len, extra_retries);
    PGbytea b = {(int)len, (char *)bytes};
    if (!rc && !PQputf(param, "%text* %bytea* %int4 %int4", json, bytes ? &b : NULL,
                       extra_retries, attempt))
        rc = pqmq__err(c, PQMQ_ENOMEM, "%s", PQgeterror());
    /* Attempt 0 means "whichever delivery holds the lease". */
    if (!rc)
        rc = pqmq__exec_scalar(c, param,
                               "SELECT mq_checkpoint_found($1, $2, $3, $4, $5, NULLIF($6, 0))",
                               "%bool", &found);
    PQparamClear(param);
    if (!rc && !found)
        rc = pqmq__err(c, PQMQ_ENOTHELD, "message is gone or its lease ran out");
    return rc;
}
