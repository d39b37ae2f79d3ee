/*
 * consume.c: the consumer's calls: poll a batch, then complete, fail, keep
 * alive or checkpoint its jobs (and, for the runner, release unstarted
 * ones). Statements are built with stmt.c; rows are read by job.c.
 */
#include <stdlib.h>
#include <string.h>

#include "pqmq-int.h"

int pqmq__poll(pqmq_client *c, const char *const *channels, size_t nchannels, int batch_size,
               int left, const char *what, pqmq_batch **out)
{
    /* mq_claim_lane straight away: mq_claim is a wrapper for SQL callers. */
    return pqmq__query_jobs(c, what,
                            left ? "SELECT * FROM mq_claim_lane($1, $2, 2)"
                                 : "SELECT * FROM mq_claim_lane($1, $2, 0)",
                            channels, nchannels, "batch_size", batch_size, out);
}

PQMQ_EXPORT int pqmq_poll(pqmq_client *c, const char *const *channels, size_t nchannels,
                          int batch_size, pqmq_batch **out)
{
    return pqmq__poll(c, channels, nchannels, batch_size, 0, "pqmq_poll", out);
}

PQMQ_EXPORT int pqmq_poll_locked(pqmq_client *c, const char *const *channels, size_t nchannels,
                                 int batch_size, pqmq_batch **out)
{
    const char *what = "pqmq_poll_locked";
    int rc = pqmq__begin_batch(c, out, what);
    if (rc)
        return rc;
    PGTransactionStatusType st = PQtransactionStatus(pqmq_conn(c));
    if (st != PQTRANS_IDLE && st != PQTRANS_INTRANS)
        return pqmq__seterr(c, PQMQ_EINVAL,
                            "%s: the connection's transaction %s (ROLLBACK first)", what,
                            st == PQTRANS_INERROR ? "has failed" : "is busy or unknown");
    PGparam *param;
    rc = pqmq__begin(c, &param);
    if (!rc)
        rc = pqmq__put_channels_count(c, param, channels, nchannels, "batch_size", batch_size,
                                      what);
    PGresult *res = NULL;
    /* The jobs live as long as the transaction's locks: open one (in the
     * same round trip) when none is. */
    if (!rc)
        res = pqmq__exec_piped(c, st == PQTRANS_IDLE ? "BEGIN" : NULL, param,
                               "SELECT * FROM mq_claim_locked($1, $2)", NULL, what, &rc);
    PQparamClear(param);
    if (!rc)
        rc = pqmq__batch_from(c, res, what, out);
    if (rc && st == PQTRANS_IDLE && PQtransactionStatus(pqmq_conn(c)) != PQTRANS_IDLE)
        PQclear(PQexec(pqmq_conn(c), "ROLLBACK")); /* ours: leave none behind */
    if (!rc)
        pqmq__batch_set_locked(*out);
    return rc;
}

int pqmq__complete_commit(pqmq_client *c, const pqmq__delivery *d, size_t n, const char *what)
{
    int rc = 0;
    if (n == 0) {
        PQclear(pqmq__exec_text(c, "COMMIT", what, &rc));
        return rc;
    }
    PGparam *param = NULL;
    rc = pqmq__begin_deliveries(c, d, n, what, &param);
    /* All or nothing: mq_complete_all fails on a job that is no longer
     * ours, so the COMMIT behind it in the pipeline does not run. */
    if (!rc)
        PQclear(pqmq__exec_piped(c, NULL, param, "SELECT mq_complete_all($1, $2)", "COMMIT",
                                 what, &rc));
    PQparamClear(param);
    if (rc && PQtransactionStatus(pqmq_conn(c)) != PQTRANS_IDLE)
        PQclear(PQexec(pqmq_conn(c), "ROLLBACK"));
    return rc;
}

PQMQ_EXPORT int pqmq_complete_commit(pqmq_client *c, const pqmq_batch *b)
{
    const char *what = "pqmq_complete_commit";
    if (!c)
        return PQMQ_EINVAL;
    pqmq__clearerr(c);
    if (PQtransactionStatus(pqmq_conn(c)) != PQTRANS_INTRANS)
        return pqmq__seterr(c, PQMQ_EINVAL, "%s: no transaction is open on the connection",
                            what);
    pqmq__delivery *d = NULL;
    int rc = pqmq__batch_deliveries(c, b, &d, what);
    if (!rc)
        rc = pqmq__complete_commit(c, d, pqmq_batch_count(b), what);
    free(d);
    return rc;
}

int pqmq__stale_check(pqmq_client *c, const char *what, size_t done, size_t n)
{
    if (done >= n)
        return 0;
    return pqmq__seterr(c, PQMQ_ESTALE,
                        "%s: %zu of %zu jobs were delivered again (or completed) since "
                        "this delivery; they were left to their new owner",
                        what, n - done, n);
}

/* Runs sql, taking deliveries as $1 (ids) and $2 (attempts), and returns
 * the function's count in *count. */
static int deliveries_call(pqmq_client *c, const char *what, const char *sql,
                           const pqmq__delivery *d, size_t n, int *count)
{
    *count = 0;
    PGparam *param;
    int rc = pqmq__begin_deliveries(c, d, n, what, &param);
    if (!rc)
        rc = pqmq__exec_scalar(c, param, sql, what, "%int4", count);
    PQparamClear(param);
    return rc;
}

int pqmq__complete(pqmq_client *c, const pqmq__delivery *d, size_t n, const char *what,
                   size_t *done)
{
    int count;
    int rc = deliveries_call(c, what, "SELECT mq_complete($1, $2)", d, n, &count);
    *done = rc ? 0 : (size_t)count;
    return rc ? rc : pqmq__stale_check(c, what, *done, n);
}

int pqmq__release(pqmq_client *c, const pqmq__delivery *d, size_t n)
{
    int count;
    return deliveries_call(c, "pqmq_runner: release", "SELECT mq_release($1, $2)", d, n,
                           &count);
}

PQMQ_EXPORT int pqmq_complete(pqmq_client *c, const uuid_t *ids, size_t n)
{
    return pqmq__ids_call(c, "pqmq_complete", "SELECT mq_complete($1)", ids, n, NULL, NULL);
}

PQMQ_EXPORT int pqmq_complete_batch(pqmq_client *c, const pqmq_batch *b)
{
    const char *what = "pqmq_complete_batch";
    if (!c)
        return PQMQ_EINVAL;
    pqmq__clearerr(c);
    if (!b)
        return pqmq__seterr(c, PQMQ_EINVAL, "%s: batch is NULL", what);
    size_t n = pqmq_batch_count(b), done;
    if (n == 0)
        return 0;
    pqmq__delivery *d;
    int rc = pqmq__batch_deliveries(c, b, &d, what);
    if (!rc)
        rc = pqmq__complete(c, d, n, what, &done);
    free(d);
    return rc;
}

PQMQ_EXPORT int pqmq_keep_alive(pqmq_client *c, const uuid_t *ids, size_t n,
                                int64_t duration_ms, size_t *extended)
{
    const char *what = "pqmq_keep_alive";
    if (extended)
        *extended = 0;
    if (!c)
        return PQMQ_EINVAL;
    PGparam *param;
    int count = 0;
    int rc = pqmq__begin_ids(c, ids, n, what, &param);
    if (!rc)
        rc = pqmq__put_duration(c, param, duration_ms, "pqmq_keep_alive: duration");
    if (!rc)
        rc = pqmq__exec_scalar(c, param, "SELECT mq_keep_alive_count($1, $2)", what, "%int4",
                               &count);
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
    const char *what = "pqmq_fail";
    if (!c)
        return PQMQ_EINVAL;
    PGparam *param;
    int held = 0;
    int rc = pqmq__begin_id(c, id, what, &param);
    if (!rc && !PQputf(param, "%text* %int4", error, attempt))
        rc = pqmq__seterr(c, PQMQ_ENOMEM, "%s: %s", what, PQgeterror());
    /* Attempt 0 means "whichever delivery holds the lease". */
    if (!rc)
        rc = pqmq__exec_scalar(c, param, "SELECT mq_fail($1, $2, NULLIF($3, 0))", what, "%bool",
                               &held);
    PQparamClear(param);
    if (!rc && !held)
        rc = pqmq__seterr(c, PQMQ_ENOTHELD, "%s: message is gone or its lease ran out", what);
    return rc;
}

/* The checkpoint's own arguments, checked as the server would. */
static int check_progress(pqmq_client *c, const char *json, const void *bytes, size_t len,
                          int extra_retries)
{
    if (extra_retries < 0)
        return pqmq__seterr(c, PQMQ_EINVAL, "pqmq_checkpoint: extra_retries is negative (%d)",
                            extra_retries);
    size_t jlen = json ? strlen(json) : 0;
    if (jlen > PQMQ_MAX_PAYLOAD || (bytes && len > PQMQ_MAX_PAYLOAD))
        return pqmq__seterr(c, PQMQ_ETOOBIG, "pqmq_checkpoint: payload is over %d bytes",
                            PQMQ_MAX_PAYLOAD);
    size_t at = json ? pqmq_json_check(json, jlen) : 0;
    if (at)
        return pqmq__seterr(c, PQMQ_EINVAL,
                            "pqmq_checkpoint: payload is not valid JSON (at byte %zu)", at);
    return 0;
}

PQMQ_EXPORT int pqmq_checkpoint(pqmq_client *c, const uuid_t id, int64_t duration_ms,
                                const char *json, const void *bytes, size_t len,
                                int extra_retries)
{
    const char *what = "pqmq_checkpoint";
    if (!c)
        return PQMQ_EINVAL;
    PGparam *param;
    int found = 0;
    int rc = pqmq__begin_id(c, id, what, &param);
    if (!rc)
        rc = pqmq__put_duration(c, param, duration_ms, "pqmq_checkpoint: duration");
    if (!rc)
        rc = check_progress(c, json, bytes, len, extra_retries);
    PGbytea b = {(int)len, (char *)bytes};
    if (!rc && !PQputf(param, "%text* %bytea* %int4", json, bytes ? &b : NULL, extra_retries))
        rc = pqmq__seterr(c, PQMQ_ENOMEM, "%s: %s", what, PQgeterror());
    if (!rc)
        rc = pqmq__exec_scalar(c, param, "SELECT mq_checkpoint_found($1, $2, $3, $4, $5)", what,
                               "%bool", &found);
    PQparamClear(param);
    if (!rc && !found)
        rc = pqmq__seterr(c, PQMQ_ENOTHELD, "%s: message is gone or its lease ran out", what);
    return rc;
}
