/*
 * complete_poll.c: completing the last batch and polling the next in one
 * statement (mq_complete_poll): one round trip and one commit per batch
 * where pqmq_complete_batch + pqmq_poll take two of each.
 */
#include <stdlib.h>

#include "pqmq-int.h"

/* The completed count every row of mq_complete_poll carries (column 13). */
static int completed_of(pqmq_client *c, PGresult *res, const char *what, size_t *done)
{
    int count = 0;
    if (PQntuples(res) < 1 || PQnfields(res) < 14 ||
        !PQgetf(res, 0, pqmq__spec(c, PQMQ__SPEC_INT4), 13, &count) || count < 0)
        return pqmq__seterr(c, PQMQ_ESERVER, "%s: no completed count in the result", what);
    *done = (size_t)count;
    return 0;
}

int pqmq__complete_poll(pqmq_client *c, const uuid_t *ids, const int *attempts, size_t n,
                        const char *const *channels, size_t nchannels, int batch_size,
                        const char *what, pqmq_batch **out, size_t *done)
{
    *out = NULL;
    *done = 0;
    if (n == 0) /* nothing to complete: a plain poll */
        return pqmq_poll(c, channels, nchannels, batch_size, out);
    PGparam *param;
    int rc = pqmq__begin_ids(c, ids, n, what, &param);
    if (!rc)
        rc = pqmq__put_attempts(c, param, attempts, n, what);
    if (!rc)
        rc = pqmq__put_poll_args(c, param, channels, nchannels, batch_size, what);
    PGresult *res = NULL;
    if (!rc)
        res = pqmq__exec(c, param,
                         "SELECT (c.job).*, c.completed "
                         "FROM mq_complete_claim($1, $2, $3, $4) c",
                         what, &rc);
    PQparamClear(param);
    if (!rc)
        rc = completed_of(c, res, what, done);
    if (rc) {
        PQclear(res);
        return rc;
    }
    rc = pqmq__batch_from(c, res, out);
    return rc ? rc : pqmq__stale_check(c, what, *done, n);
}

PQMQ_EXPORT int pqmq_complete_and_poll(pqmq_client *c, const pqmq_batch *done_batch,
                                       const char *const *channels, size_t nchannels,
                                       int batch_size, pqmq_batch **out)
{
    const char *what = "pqmq_complete_and_poll";
    if (out)
        *out = NULL;
    if (!c)
        return PQMQ_EINVAL;
    pqmq__clearerr(c);
    if (!out)
        return pqmq__seterr(c, PQMQ_EINVAL, "%s: out is NULL", what);
    uuid_t *ids = NULL;
    int *attempts = NULL;
    size_t n = pqmq_batch_count(done_batch), done = 0;
    int rc = n ? pqmq__batch_deliveries(c, done_batch, &ids, &attempts, what) : 0;
    if (!rc)
        rc = pqmq__complete_poll(c, (const uuid_t *)ids, attempts, n, channels, nchannels,
                                 batch_size, what, out, &done);
    free(ids);
    free(attempts);
    return rc;
}
