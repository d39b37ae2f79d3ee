/*
 * job.c: batches and jobs. A batch holds the rows of one result of type
 * mq_job_t (schema/tables.sql: mq_claim, mq_complete_claim, mq_dead_jobs);
 * this is the one place that reads that row, and the accessors of pqmq.h
 * read what it stored.
 */
#include <stdlib.h>
#include <string.h>

#include "pqmq-int.h"

struct pqmq_job {
    pqmq__delivery delivery; /* id and attempt */
    const char *name;        /* these point into the batch's PGresult */
    const char *channel;
    const char *args;
    const char *json;  /* NULL: none */
    const void *bytes; /* NULL: none */
    size_t bytes_len;
    const char *last_error; /* NULL: none */
    int committed;
    int retries_left;
    int blocking;
    int locked; /* locked lane: delivery.attempt is the row's deliveries */
    int64_t lease_ms;
};

struct pqmq_batch {
    PGresult *res;
    pqmq_job *jobs;
    size_t n;
    int64_t wait_ms;
};

/* mq_job_t's attributes, in order. A result whose first columns are not
 * these is refused (a schema older than the library), not misread. */
static const char *const job_columns[] = {"id",           "is_committed",  "name",
                                          "payload_json", "payload_bytes", "retry_backoff",
                                          "wait_time",    "channel_name",  "channel_args",
                                          "attempt",      "attempts_left", "last_error",
                                          "blocking"};
enum { JOB_COLUMNS = sizeof job_columns / sizeof *job_columns, COL_WAIT = 6 };

/* Their types, as two libpqtypes formats of at most 8 (client.c prepares
 * them once per connection). */
const char pqmq__job_format1[] = "%uuid %bool %text %text %bytea %interval %interval";
const char pqmq__job_format2[] = "%text %text %int4 %int4 %text %bool";

static int columns_ok(const PGresult *r)
{
    if (PQnfields(r) < JOB_COLUMNS)
        return 0;
    for (int i = 0; i < JOB_COLUMNS; i++)
        if (strcmp(PQfname(r, i), job_columns[i]) != 0)
            return 0;
    return 1;
}

/* Reads row i into job j. */
static int read_job(const pqmq_client *c, PGresult *r, int i, pqmq_job *j)
{
    PGuuid id = NULL;
    PGbool committed = 0, blocking = 0;
    PGtext name = NULL, json = NULL, chan = NULL, args = NULL, last_error = NULL;
    PGbytea bytes = {0, NULL};
    PGinterval lease, wait;
    PGint4 attempt = 0, left = 0;
    memset(&lease, 0, sizeof lease);
    if (!PQgetf(r, i, pqmq__spec(c, PQMQ__SPEC_JOB1), 0, &id, 1, &committed, 2, &name, 3, &json,
                4, &bytes, 5, &lease, 6, &wait) ||
        !PQgetf(r, i, pqmq__spec(c, PQMQ__SPEC_JOB2), 7, &chan, 8, &args, 9, &attempt, 10,
                &left, 11, &last_error, 12, &blocking))
        return -1;
    memcpy(j->delivery.id, id, sizeof(uuid_t));
    j->delivery.attempt = attempt;
    j->committed = committed;
    j->name = name ? name : "";
    j->channel = chan ? chan : "";
    j->args = args ? args : "";
    j->json = PQgetisnull(r, i, 3) ? NULL : json;
    j->bytes = PQgetisnull(r, i, 4) ? NULL : bytes.data;
    j->bytes_len = j->bytes ? (size_t)bytes.len : 0;
    j->last_error = PQgetisnull(r, i, 11) ? NULL : last_error;
    j->blocking = blocking;
    j->retries_left = left;
    j->lease_ms = pqmq__interval_to_ms(&lease);
    return 0;
}

static int fill_batch(pqmq_client *c, pqmq_batch *b, const char *what)
{
    int rows = PQntuples(b->res);
    b->wait_ms = -1;
    if (!columns_ok(b->res))
        return pqmq__seterr(c, PQMQ_ESCHEMA,
                            "%s: the result is not a job row (mq_job_t); run pqmq_migrate",
                            what);
    if (rows == 0 || (rows == 1 && PQgetisnull(b->res, 0, 0))) {
        /* Nothing ready: the one row carries wait_time. */
        PGinterval wait;
        if (rows && !PQgetisnull(b->res, 0, COL_WAIT)) {
            if (!PQgetf(b->res, 0, "%interval", COL_WAIT, &wait))
                return pqmq__seterr(c, PQMQ_ESERVER, "%s: bad wait_time: %s", what,
                                    PQgeterror());
            b->wait_ms = pqmq__interval_to_ms(&wait);
        }
        return 0;
    }
    if (!(b->jobs = calloc((size_t)rows, sizeof *b->jobs)))
        return pqmq__seterr(c, PQMQ_ENOMEM, "%s: out of memory", what);
    for (int i = 0; i < rows; i++)
        if (read_job(c, b->res, i, &b->jobs[i]))
            return pqmq__seterr(c, PQMQ_ESERVER, "%s: bad row %d: %s", what, i, PQgeterror());
    b->n = (size_t)rows;
    b->wait_ms = 0;
    return 0;
}

int pqmq__batch_from(pqmq_client *c, PGresult *res, const char *what, pqmq_batch **out)
{
    pqmq_batch *b = calloc(1, sizeof *b);
    if (!b) {
        PQclear(res);
        return pqmq__seterr(c, PQMQ_ENOMEM, "%s: out of memory", what);
    }
    b->res = res;
    int rc = fill_batch(c, b, what);
    if (rc) {
        pqmq_batch_free(b);
        return rc;
    }
    *out = b;
    return 0;
}

int pqmq__begin_batch(pqmq_client *c, pqmq_batch **out, const char *what)
{
    if (out)
        *out = NULL;
    if (!c)
        return PQMQ_EINVAL;
    pqmq__clearerr(c);
    return out ? 0 : pqmq__seterr(c, PQMQ_EINVAL, "%s: out is NULL", what);
}

int pqmq__query_jobs(pqmq_client *c, const char *what, const char *sql,
                     const char *const *channels, size_t nchannels, const char *arg, int value,
                     pqmq_batch **out)
{
    int rc = pqmq__begin_batch(c, out, what);
    if (rc)
        return rc;
    PGparam *param;
    rc = pqmq__begin(c, &param);
    if (!rc)
        rc = pqmq__put_channels_count(c, param, channels, nchannels, arg, value, what);
    PGresult *res = NULL;
    if (!rc)
        res = pqmq__exec(c, param, sql, what, &rc);
    PQparamClear(param);
    return rc ? rc : pqmq__batch_from(c, res, what, out);
}

int pqmq__batch_deliveries(pqmq_client *c, const pqmq_batch *b, pqmq__delivery **out,
                           const char *what)
{
    *out = NULL;
    if (!b || b->n == 0)
        return 0;
    if (!(*out = malloc(b->n * sizeof **out)))
        return pqmq__seterr(c, PQMQ_ENOMEM, "%s: out of memory", what);
    for (size_t i = 0; i < b->n; i++)
        (*out)[i] = b->jobs[i].delivery;
    return 0;
}

void pqmq__batch_set_locked(pqmq_batch *b)
{
    for (size_t i = 0; b && i < b->n; i++) {
        b->jobs[i].locked = 1;
        b->jobs[i].delivery.attempt -= 1; /* nothing counted it yet */
    }
}

const pqmq__delivery *pqmq__job_delivery(const pqmq_job *j)
{
    return &j->delivery;
}

PQMQ_EXPORT void pqmq_batch_free(pqmq_batch *b)
{
    if (!b)
        return;
    PQclear(b->res);
    free(b->jobs);
    free(b);
}

PQMQ_EXPORT size_t pqmq_batch_count(const pqmq_batch *b)
{
    return b ? b->n : 0;
}

PQMQ_EXPORT const pqmq_job *pqmq_batch_job(const pqmq_batch *b, size_t i)
{
    return b && i < b->n ? &b->jobs[i] : NULL;
}

PQMQ_EXPORT int64_t pqmq_batch_wait_ms(const pqmq_batch *b)
{
    return b ? b->wait_ms : -1;
}

PQMQ_EXPORT void pqmq_job_id(const pqmq_job *j, uuid_t out)
{
    if (j)
        memcpy(out, j->delivery.id, sizeof(uuid_t));
    else
        uuid_clear(out);
}

PQMQ_EXPORT const char *pqmq_job_name(const pqmq_job *j)
{
    return j ? j->name : NULL;
}
PQMQ_EXPORT const char *pqmq_job_channel(const pqmq_job *j)
{
    return j ? j->channel : NULL;
}
PQMQ_EXPORT const char *pqmq_job_args(const pqmq_job *j)
{
    return j ? j->args : NULL;
}
PQMQ_EXPORT const char *pqmq_job_json(const pqmq_job *j)
{
    return j ? j->json : NULL;
}

PQMQ_EXPORT const void *pqmq_job_bytes(const pqmq_job *j, size_t *len)
{
    if (len)
        *len = j ? j->bytes_len : 0;
    return j ? j->bytes : NULL;
}

PQMQ_EXPORT int pqmq_job_is_committed(const pqmq_job *j)
{
    return j ? j->committed : 0;
}
PQMQ_EXPORT int pqmq_job_attempt(const pqmq_job *j)
{
    return j ? j->delivery.attempt + j->locked : 0;
}
PQMQ_EXPORT int pqmq_job_retries_left(const pqmq_job *j)
{
    return j ? j->retries_left : 0;
}
PQMQ_EXPORT int64_t pqmq_job_lease_ms(const pqmq_job *j)
{
    return j ? j->lease_ms : 0;
}
PQMQ_EXPORT const char *pqmq_job_last_error(const pqmq_job *j)
{
    return j ? j->last_error : NULL;
}
PQMQ_EXPORT int pqmq_job_blocking(const pqmq_job *j)
{
    return j ? j->blocking : 0;
}
