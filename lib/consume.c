/*
 * consume.c: polling a batch and what a consumer does with its jobs:
 * complete, fail, keep alive, checkpoint.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pqmq-int.h"

struct pqmq_job {
    uuid_t id;
    const char *name;    /* these point into the batch's PGresult */
    const char *channel;
    const char *args;
    const char *json;    /* NULL: none */
    const void *bytes;   /* NULL: none */
    size_t bytes_len;
    const char *last_error; /* NULL: none */
    int committed;
    int attempt;
    int retries_left;
    int blocking;
    int64_t lease_ms;
};

struct pqmq_batch {
    PGresult *res;
    pqmq_job *jobs;
    size_t n;
    int64_t wait_ms;
};

PQMQ_EXPORT void pqmq_batch_free(pqmq_batch *b)
{
    if (!b)
        return;
    PQclear(b->res);
    free(b->jobs);
    free(b);
}

int pqmq__put_channels(pqmq_client *c, PGparam *param, const char *const *channels,
                       size_t n, const char *what)
{
    if (!channels)
        return PQputf(param, "%text[]", NULL) ? 0
               : pqmq__seterr(c, PQMQ_ENOMEM, "%s: %s", what, PQgeterror());
    if (n == 0)
        return pqmq__seterr(c, PQMQ_EINVAL,
                            "%s: nchannels is 0 (pass channels NULL for all)", what);
    PGarray arr;
    memset(&arr, 0, sizeof arr);
    arr.param = pqmq__param(c);
    if (!arr.param)
        return PQMQ_ENOMEM;
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        if (!channels[i]) /* "" is a channel like any other */
            rc = pqmq__seterr(c, PQMQ_EINVAL, "%s: channels[%zu] is NULL", what, i);
        else if (!PQputf(arr.param, "%text*", channels[i]))
            rc = pqmq__seterr(c, PQMQ_ENOMEM, "%s: %s", what, PQgeterror());
    }
    if (!rc && !PQputf(param, "%text[]", &arr))
        rc = pqmq__seterr(c, PQMQ_ENOMEM, "%s: %s", what, PQgeterror());
    PQparamClear(arr.param);
    return rc;
}

/* Reads row i of the poll result into job j. */
static int read_job(const pqmq_client *c, PGresult *r, int i, pqmq_job *j)
{
    PGuuid id = NULL;
    PGbool committed = 0;
    PGtext name = NULL, json = NULL, chan = NULL, args = NULL;
    PGbytea bytes = {0, NULL};
    PGinterval lease, wait;
    PGint4 attempt = 0, left = 0;
    PGtext last_error = NULL;
    PGbool blocking = 0;
    memset(&lease, 0, sizeof lease);
    if (!PQgetf(r, i, pqmq__spec(c, PQMQ__SPEC_JOB1), 0, &id, 1, &committed, 2, &name, 3,
                &json, 4, &bytes, 5, &lease, 6, &wait) ||
        !PQgetf(r, i, pqmq__spec(c, PQMQ__SPEC_JOB2), 7, &chan, 8, &args, 9, &attempt, 10,
                &left, 11, &last_error, 12, &blocking))
        return -1;
    j->last_error = PQgetisnull(r, i, 11) ? NULL : last_error;
    j->blocking = blocking;
    memcpy(j->id, id, sizeof(uuid_t));
    j->committed = committed;
    j->name = name ? name : "";
    j->channel = chan ? chan : "";
    j->args = args ? args : "";
    j->json = PQgetisnull(r, i, 3) ? NULL : json;
    j->bytes = PQgetisnull(r, i, 4) ? NULL : bytes.data;
    j->bytes_len = j->bytes ? (size_t)bytes.len : 0;
    j->attempt = attempt;
    j->retries_left = left;
    j->lease_ms = pqmq__interval_to_ms(&lease);
    return 0;
}

static int fill_batch(pqmq_client *c, pqmq_batch *b)
{
    int rows = PQntuples(b->res);
    b->wait_ms = -1;
    if (rows == 0 || (rows == 1 && PQgetisnull(b->res, 0, 0))) {
        /* Nothing ready: the one row carries wait_time. */
        PGinterval wait;
        if (rows && !PQgetisnull(b->res, 0, 6)) {
            if (!PQgetf(b->res, 0, "%interval", 6, &wait))
                return pqmq__seterr(c, PQMQ_ESERVER, "pqmq_poll: bad wait_time: %s",
                                    PQgeterror());
            b->wait_ms = pqmq__interval_to_ms(&wait);
        }
        return 0;
    }
    b->jobs = calloc(rows ? (size_t)rows : 1, sizeof *b->jobs);
    if (!b->jobs)
        return pqmq__seterr(c, PQMQ_ENOMEM, "pqmq_poll: out of memory");
    for (int i = 0; i < rows; i++)
        if (read_job(c, b->res, i, &b->jobs[i]))
            return pqmq__seterr(c, PQMQ_ESERVER, "pqmq_poll: bad row %d: %s", i,
                                PQgeterror());
    b->n = (size_t)rows;
    b->wait_ms = 0;
    return 0;
}

/* Puts channels and a count limited to 1..PQMQ_MAX_BATCH (named arg in the
 * error) as the next two parameters. */
static int put_channels_limit(pqmq_client *c, PGparam *param, const char *const *channels,
                              size_t nchannels, const char *arg, int value, const char *what)
{
    if (value < 1 || value > PQMQ_MAX_BATCH)
        return pqmq__seterr(c, PQMQ_EINVAL, "%s: %s %d is outside 1..%d", what, arg, value,
                            PQMQ_MAX_BATCH);
    int rc = pqmq__put_channels(c, param, channels, nchannels, what);
    if (!rc && !PQputf(param, pqmq__spec(c, PQMQ__SPEC_INT4), value))
        rc = pqmq__seterr(c, PQMQ_ENOMEM, "%s: %s", what, PQgeterror());
    return rc;
}

int pqmq__put_poll_args(pqmq_client *c, PGparam *param, const char *const *channels,
                        size_t nchannels, int batch_size, const char *what)
{
    return put_channels_limit(c, param, channels, nchannels, "batch_size", batch_size, what);
}

int pqmq__channels_query(pqmq_client *c, const char *what, const char *sql,
                         const char *const *channels, size_t nchannels, const char *arg,
                         int value, pqmq_batch **out)
{
    if (out)
        *out = NULL;
    if (!c)
        return PQMQ_EINVAL;
    pqmq__clearerr(c);
    if (!out)
        return pqmq__seterr(c, PQMQ_EINVAL, "%s: out is NULL", what);
    int rc = pqmq__ready(c);
    if (rc)
        return rc;
    PGparam *param = pqmq__param(c);
    if (!param)
        return PQMQ_ENOMEM;
    rc = put_channels_limit(c, param, channels, nchannels, arg, value, what);
    PGresult *res = NULL;
    if (!rc)
        res = pqmq__exec(c, param, sql, what, &rc);
    PQparamClear(param);
    return rc ? rc : pqmq__batch_from(c, res, out);
}

PQMQ_EXPORT int pqmq_poll(pqmq_client *c, const char *const *channels, size_t nchannels,
                          int batch_size, pqmq_batch **out)
{
    return pqmq__channels_query(c, "pqmq_poll",
                                "SELECT " PQMQ__POLL_COLUMNS " FROM mq_poll_jobs($1, $2)",
                                channels, nchannels, "batch_size", batch_size, out);
}

int pqmq__batch_from(pqmq_client *c, PGresult *res, pqmq_batch **out)
{
    pqmq_batch *b = calloc(1, sizeof *b);
    if (!b) {
        PQclear(res);
        return pqmq__seterr(c, PQMQ_ENOMEM, "out of memory");
    }
    b->res = res;
    int rc = fill_batch(c, b);
    if (rc) {
        pqmq_batch_free(b);
        return rc;
    }
    *out = b;
    return 0;
}

PQMQ_EXPORT size_t pqmq_batch_count(const pqmq_batch *b) { return b ? b->n : 0; }

PQMQ_EXPORT const pqmq_job *pqmq_batch_job(const pqmq_batch *b, size_t i)
{
    return b && i < b->n ? &b->jobs[i] : NULL;
}

PQMQ_EXPORT int64_t pqmq_batch_wait_ms(const pqmq_batch *b) { return b ? b->wait_ms : -1; }

PQMQ_EXPORT void pqmq_job_id(const pqmq_job *j, uuid_t out)
{
    if (j)
        memcpy(out, j->id, sizeof(uuid_t));
    else
        uuid_clear(out);
}

PQMQ_EXPORT const char *pqmq_job_name(const pqmq_job *j) { return j ? j->name : NULL; }
PQMQ_EXPORT const char *pqmq_job_channel(const pqmq_job *j) { return j ? j->channel : NULL; }
PQMQ_EXPORT const char *pqmq_job_args(const pqmq_job *j) { return j ? j->args : NULL; }
PQMQ_EXPORT const char *pqmq_job_json(const pqmq_job *j) { return j ? j->json : NULL; }

PQMQ_EXPORT const void *pqmq_job_bytes(const pqmq_job *j, size_t *len)
{
    if (len)
        *len = j ? j->bytes_len : 0;
    return j ? j->bytes : NULL;
}

PQMQ_EXPORT int pqmq_job_is_committed(const pqmq_job *j) { return j ? j->committed : 0; }
PQMQ_EXPORT int pqmq_job_attempt(const pqmq_job *j) { return j ? j->attempt : 0; }
PQMQ_EXPORT int pqmq_job_retries_left(const pqmq_job *j) { return j ? j->retries_left : 0; }
PQMQ_EXPORT int64_t pqmq_job_lease_ms(const pqmq_job *j) { return j ? j->lease_ms : 0; }
PQMQ_EXPORT const char *pqmq_job_last_error(const pqmq_job *j) { return j ? j->last_error : NULL; }
PQMQ_EXPORT int pqmq_job_blocking(const pqmq_job *j) { return j ? j->blocking : 0; }

int pqmq__begin_ids(pqmq_client *c, const uuid_t *ids, size_t n, const char *what,
                     PGparam **param)
{
    *param = NULL;
    pqmq__clearerr(c);
    int rc = pqmq__ready(c);
    if (!rc)
        rc = pqmq__check_ids(c, ids, n, what);
    if (!rc && !(*param = pqmq__param(c)))
        rc = PQMQ_ENOMEM;
    if (!rc)
        rc = pqmq__put_uuids(c, *param, ids, n, what);
    return rc;
}

int pqmq__exec_scalar(pqmq_client *c, PGparam *param, const char *sql, const char *what,
                       const char *spec, int *value)
{
    int rc;
    PGresult *r = pqmq__exec(c, param, sql, what, &rc);
    if (!r)
        return rc;
    *value = 0;
    if (spec && !PQgetf(r, 0, spec, 0, value))
        rc = pqmq__seterr(c, PQMQ_ESERVER, "%s: unexpected result: %s", what, PQgeterror());
    PQclear(r);
    return rc;
}

PQMQ_EXPORT int pqmq_complete(pqmq_client *c, const uuid_t *ids, size_t n)
{
    if (!c)
        return PQMQ_EINVAL;
    PGparam *param;
    int rc = pqmq__begin_ids(c, ids, n, "pqmq_complete", &param);
    if (!rc)
        rc = pqmq__exec_scalar(c, param, "SELECT mq_complete($1)", "pqmq_complete", NULL, &(int){0});
    PQparamClear(param);
    return rc;
}

PQMQ_EXPORT int pqmq_complete_batch(pqmq_client *c, const pqmq_batch *b)
{
    if (!c)
        return PQMQ_EINVAL;
    pqmq__clearerr(c);
    if (!b)
        return pqmq__seterr(c, PQMQ_EINVAL, "pqmq_complete_batch: batch is NULL");
    if (b->n == 0)
        return 0;
    uuid_t *ids;
    int *attempts;
    int rc = pqmq__batch_deliveries(c, b, &ids, &attempts, "pqmq_complete_batch");
    size_t done = 0;
    if (!rc)
        rc = pqmq__complete_fenced(c, (const uuid_t *)ids, attempts, b->n, &done);
    free(ids);
    free(attempts);
    return rc;
}

int pqmq__batch_deliveries(pqmq_client *c, const pqmq_batch *b, uuid_t **ids,
                           int **attempts, const char *what)
{
    *ids = b->n ? malloc(b->n * sizeof **ids) : NULL;
    *attempts = b->n ? malloc(b->n * sizeof **attempts) : NULL;
    if (b->n && (!*ids || !*attempts))
        return pqmq__seterr(c, PQMQ_ENOMEM, "%s: out of memory", what);
    for (size_t i = 0; i < b->n; i++) {
        memcpy((*ids)[i], b->jobs[i].id, sizeof(uuid_t));
        (*attempts)[i] = b->jobs[i].attempt;
    }
    return 0;
}

int pqmq__put_attempts(pqmq_client *c, PGparam *param, const int *attempts, size_t n,
                       const char *what)
{
    PGarray arr;
    memset(&arr, 0, sizeof arr);
    if (!(arr.param = pqmq__param(c)))
        return PQMQ_ENOMEM;
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++)
        if (!PQputf(arr.param, pqmq__spec(c, PQMQ__SPEC_INT4), attempts[i]))
            rc = pqmq__seterr(c, PQMQ_ENOMEM, "%s: %s", what, PQgeterror());
    if (!rc && !PQputf(param, "%int4[]", &arr))
        rc = pqmq__seterr(c, PQMQ_ENOMEM, "%s: %s", what, PQgeterror());
    PQparamClear(arr.param);
    return rc;
}

/* Runs sql (taking a uuid[] $1 and an int[] $2) on ids and attempts and
 * returns the function's count in *count. */
static int ids_attempts_call(pqmq_client *c, const char *what, const char *sql,
                             const uuid_t *ids, const int *attempts, size_t n, int *count)
{
    *count = 0;
    PGparam *param;
    int rc = pqmq__begin_ids(c, ids, n, what, &param);
    if (!rc)
        rc = pqmq__put_attempts(c, param, attempts, n, what);
    if (!rc)
        rc = pqmq__exec_scalar(c, param, sql, what, "%int4", count);
    PQparamClear(param);
    return rc;
}

int pqmq__complete_fenced(pqmq_client *c, const uuid_t *ids, const int *attempts, size_t n,
                          size_t *done)
{
    const char *what = "pqmq_complete_batch";
    int count;
    int rc = ids_attempts_call(c, what, "SELECT mq_complete($1, $2)", ids, attempts, n,
                               &count);
    *done = rc ? 0 : (size_t)count;
    return rc ? rc : pqmq__stale_check(c, what, (size_t)count, n);
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

int pqmq__release(pqmq_client *c, const uuid_t *ids, const int *attempts, size_t n)
{
    int count;
    return ids_attempts_call(c, "release", "SELECT mq_release($1, $2)", ids, attempts, n,
                             &count);
}

PQMQ_EXPORT int pqmq_keep_alive(pqmq_client *c, const uuid_t *ids, size_t n,
                                int64_t duration_ms, size_t *extended)
{
    if (extended)
        *extended = 0;
    if (!c)
        return PQMQ_EINVAL;
    PGparam *param;
    int rc = pqmq__begin_ids(c, ids, n, "pqmq_keep_alive", &param);
    if (!rc)
        rc = pqmq__check_ms(c, duration_ms, "pqmq_keep_alive: duration");
    PGinterval iv;
    pqmq__ms_to_interval(duration_ms, &iv);
    if (!rc && !PQputf(param, "%interval", &iv))
        rc = pqmq__seterr(c, PQMQ_ENOMEM, "pqmq_keep_alive: %s", PQgeterror());
    int count = 0;
    if (!rc)
        rc = pqmq__exec_scalar(c, param, "SELECT mq_keep_alive_count($1, $2)", "pqmq_keep_alive",
                         "%int4", &count);
    if (!rc && extended)
        *extended = (size_t)count;
    PQparamClear(param);
    return rc;
}

/* Starts a call about one message: clears the error, checks the
 * connection and the id. */
static int begin_id_call(pqmq_client *c, const uuid_t id, const char *what)
{
    pqmq__clearerr(c);
    int rc = pqmq__ready(c);
    if (!rc && !id)
        rc = pqmq__seterr(c, PQMQ_EINVAL, "%s: id is NULL", what);
    return rc;
}

PQMQ_EXPORT int pqmq_fail(pqmq_client *c, const uuid_t id, const char *error)
{
    return pqmq__fail(c, id, 0, error);
}

int pqmq__fail(pqmq_client *c, const uuid_t id, int attempt, const char *error)
{
    if (!c)
        return PQMQ_EINVAL;
    int rc = begin_id_call(c, id, "pqmq_fail");
    if (rc)
        return rc;
    PGparam *param = pqmq__param(c);
    if (!param)
        return PQMQ_ENOMEM;
    int held = 0;
    if (!PQputf(param, "%uuid %text* %int4", (PGuuid)id, error, attempt))
        rc = pqmq__seterr(c, PQMQ_ENOMEM, "pqmq_fail: %s", PQgeterror());
    /* Attempt 0 means "whichever delivery holds the lease". */
    if (!rc)
        rc = pqmq__exec_scalar(c, param, "SELECT mq_fail($1, $2, NULLIF($3, 0))", "pqmq_fail",
                         "%bool", &held);
    PQparamClear(param);
    if (!rc && !held)
        rc = pqmq__seterr(c, PQMQ_ENOTHELD,
                          "pqmq_fail: message is gone or its lease ran out");
    return rc;
}

PQMQ_EXPORT int pqmq_checkpoint(pqmq_client *c, const uuid_t id, int64_t duration_ms,
                                const char *json, const void *bytes, size_t len,
                                int extra_retries)
{
    if (!c)
        return PQMQ_EINVAL;
    int rc = begin_id_call(c, id, "pqmq_checkpoint");
    if (rc)
        return rc;
    if ((rc = pqmq__check_ms(c, duration_ms, "pqmq_checkpoint: duration")))
        return rc;
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
    PGparam *param = pqmq__param(c);
    if (!param)
        return PQMQ_ENOMEM;
    PGinterval iv;
    pqmq__ms_to_interval(duration_ms, &iv);
    PGbytea b = {(int)len, (char *)bytes};
    int found = 0;
    if (!PQputf(param, "%uuid %interval %text* %bytea* %int4", (PGuuid)id, &iv, json,
                bytes ? &b : NULL, extra_retries))
        rc = pqmq__seterr(c, PQMQ_ENOMEM, "pqmq_checkpoint: %s", PQgeterror());
    if (!rc)
        rc = pqmq__exec_scalar(c, param, "SELECT mq_checkpoint_found($1, $2, $3, $4, $5)",
                         "pqmq_checkpoint", "%bool", &found);
    PQparamClear(param);
    if (!rc && !found)
        rc = pqmq__seterr(c, PQMQ_ENOTHELD,
                          "pqmq_checkpoint: message is gone or its lease ran out");
    return rc;
}
