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

/* Their types, which a result must have, in binary: the rows
 * are read field by field from libpq. (libpqtypes' PQgetf clears its
 * thread's 18 KB error state at every call, and a row took two: new_msg.c.) */
static const Oid job_types[] = {
    PQMQ__OID_UUID,     PQMQ__OID_BOOL,     PQMQ__OID_TEXT, PQMQ__OID_TEXT, PQMQ__OID_BYTEA,
    PQMQ__OID_INTERVAL, PQMQ__OID_INTERVAL, PQMQ__OID_TEXT, PQMQ__OID_TEXT, PQMQ__OID_INT4,
    PQMQ__OID_INT4,     PQMQ__OID_TEXT,     PQMQ__OID_BOOL};
_Static_assert(sizeof job_types / sizeof *job_types == JOB_COLUMNS, "a type per column");

static int columns_ok(const PGresult *r)
{
    if (PQnfields(r) < JOB_COLUMNS)
        return 0;
    for (int i = 0; i < JOB_COLUMNS; i++)
        if (strcmp(PQfname(r, i), job_columns[i]) != 0 || PQftype(r, i) != job_types[i] ||
            PQfformat(r, i) != 1)
            return 0;
    return 1;
}

/* Field (row, col) as a value of len bytes, or NULL if it is NULL or (a
 * malformed row: *bad set) of another length. */
static const unsigned char *fixed(const PGresult *r, int row, int col, int len, int *bad)
{
    if (PQgetisnull(r, row, col))
        return NULL;
    if (PQgetlength(r, row, col) != len) {
        *bad = 1;
        return NULL;
    }
    return (const unsigned char *)PQgetvalue(r, row, col);
}

static int64_t be_int(const unsigned char *p, int len)
{
    uint64_t v = 0;
    for (int k = 0; k < len; k++)
        v = v << 8 | p[k];
    /* Sign-extended from len bytes. */
    return len < 8 && (v >> (8 * len - 1)) ? (int64_t)(v - ((uint64_t)1 << (8 * len)))
                                           : (int64_t)v;
}

static int get_int4(const PGresult *r, int row, int col, int *bad)
{
    const unsigned char *p = fixed(r, row, col, 4, bad);
    return p ? (int)be_int(p, 4) : 0;
}

static int get_bool(const PGresult *r, int row, int col, int *bad)
{
    const unsigned char *p = fixed(r, row, col, 1, bad);
    return p && *p;
}

/* An interval in ms: its microseconds, days and months (of 30 days, as
 * PostgreSQL counts them). A part of a millisecond rounds up, so that
 * "wait 0.2 ms" never becomes a busy "wait 0 ms". */
static int64_t get_ms(const PGresult *r, int row, int col, int *bad)
{
    const unsigned char *p = fixed(r, row, col, 16, bad);
    if (!p)
        return 0;
    int64_t us = be_int(p, 8), days = be_int(p + 8, 4) + be_int(p + 12, 4) * 30;
    return days * 86400000 + us / 1000 + (us % 1000 > 0);
}

static const char *get_text(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? NULL : PQgetvalue(r, row, col);
}

/* Reads row i into job j; -1 if a field is malformed. */
static int read_job(PGresult *r, int i, pqmq_job *j)
{
    int bad = 0;
    const unsigned char *id = fixed(r, i, 0, sizeof(uuid_t), &bad);
    if (!id)
        return -1;
    memcpy(j->delivery.id, id, sizeof(uuid_t));
    j->committed = get_bool(r, i, 1, &bad);
    j->name = PQgetvalue(r, i, 2); /* "" when NULL */
    j->json = get_text(r, i, 3);
    j->bytes = get_text(r, i, 4);
    j->bytes_len = j->bytes ? (size_t)PQgetlength(r, i, 4) : 0;
    j->lease_ms = get_ms(r, i, 5, &bad);
    j->channel = PQgetvalue(r, i, 7);
    j->args = PQgetvalue(r, i, 8);
    j->delivery.attempt = get_int4(r, i, 9, &bad);
    j->retries_left = get_int4(r, i, 10, &bad);
    j->last_error = get_text(r, i, 11);
    j->blocking = get_bool(r, i, 12, &bad);
    return bad ? -1 : 0;
}

static int fill_batch(pqmq_client *c, pqmq_batch *b)
{
    int rows = PQntuples(b->res);
    b->wait_ms = -1;
    if (!columns_ok(b->res))
        return pqmq__err(c, PQMQ_ESCHEMA,
                         "the result is not a job row (mq_job_t); run pqmq_migrate");
    if (rows == 0 || (rows == 1 && PQgetisnull(b->res, 0, 0))) {
        /* Nothing ready: the one row carries wait_time. */
        int bad = 0;
        if (rows && !PQgetisnull(b->res, 0, COL_WAIT)) {
            b->wait_ms = get_ms(b->res, 0, COL_WAIT, &bad);
            if (bad)
                return pqmq__err(c, PQMQ_ESERVER, "bad wait_time");
        }
        return 0;
    }
    if (!(b->jobs = calloc((size_t)rows, sizeof *b->jobs)))
        return pqmq__err(c, PQMQ_ENOMEM, "out of memory");
    for (int i = 0; i < rows; i++)
        if (read_job(b->res, i, &b->jobs[i]))
            return pqmq__err(c, PQMQ_ESERVER, "bad row %d", i);
    b->n = (size_t)rows;
    b->wait_ms = 0;
    return 0;
}

int pqmq__batch_from(pqmq_client *c, PGresult *res, pqmq_batch **out)
{
    pqmq_batch *b = calloc(1, sizeof *b);
    if (!b) {
        PQclear(res);
        return pqmq__err(c, PQMQ_ENOMEM, "out of memory");
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

int pqmq__begin_batch(pqmq_client *c, const char *call, pqmq_batch **out)
{
    if (out)
        *out = NULL;
    if (pqmq__enter(c, call))
        return PQMQ_EINVAL;
    return out ? 0 : pqmq__err(c, PQMQ_EINVAL, "out is NULL");
}

int pqmq__query_jobs(pqmq_client *c, const char *sql, const char *const *channels,
                     size_t nchannels, const char *arg, int value, pqmq_batch **out)
{
    PGparam *param;
    int rc = pqmq__begin(c, &param);
    if (!rc)
        rc = pqmq__put_channels_count(c, param, channels, nchannels, arg, value);
    PGresult *res = NULL;
    if (!rc)
        res = pqmq__exec(c, param, sql, &rc);
    PQparamClear(param);
    return rc ? rc : pqmq__batch_from(c, res, out);
}

int pqmq__batch_deliveries(pqmq_client *c, const pqmq_batch *b, pqmq__delivery **out)
{
    *out = NULL;
    if (!b || b->n == 0)
        return 0;
    if (!(*out = malloc(b->n * sizeof **out)))
        return pqmq__err(c, PQMQ_ENOMEM, "out of memory");
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
