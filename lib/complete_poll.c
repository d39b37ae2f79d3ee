/*
 * complete_poll.c: completing the last batch and polling the next in one
 * statement (mq_complete_claim): one round trip and one commit per batch
 * where pqmq_complete_batch + pqmq_poll take two of each.
 */
#include <stdlib.h>

#include "pqmq-int.h"

/* The completed count every row of mq_complete_claim carries. */
static int completed_of(pqmq_client *c, PGresult *res, size_t *done)
{
    int col = PQfnumber(res, "completed"), count = 0;
    if (PQntuples(res) < 1 || col < 0 ||
        !PQgetf(res, 0, pqmq__spec(c, PQMQ__SPEC_INT4), col, &count) || count < 0)
        return pqmq__err(c, PQMQ_ESERVER, "no completed count in the result");
    *done = (size_t)count;
    return 0;
}

int pqmq__complete_poll(pqmq_client *c, const pqmq__delivery *d, size_t n,
                        const char *const *channels, size_t nchannels, int batch_size,
                        pqmq_batch **out, size_t *done)
{
    *out = NULL;
    *done = 0;
    if (n == 0) /* nothing to complete: a plain poll */
        return pqmq__poll(c, channels, nchannels, batch_size, 0, out);
    PGparam *param;
    int rc = pqmq__begin_deliveries(c, d, n, &param);
    if (!rc)
        rc = pqmq__put_channels_count(c, param, channels, nchannels, "batch_size", batch_size);
    PGresult *res = NULL;
    if (!rc)
        res = pqmq__exec(c, param,
                         "SELECT (c.job).*, c.completed "
                         "FROM mq_complete_claim($1, $2, $3, $4) c",
                         &rc);
    PQparamClear(param);
    if (!rc)
        rc = completed_of(c, res, done);
    if (rc) {
        PQclear(res);
        return rc;
    }
    rc = pqmq__batch_from(c, res, out);
    return rc ? rc : pqmq__stale_check(c, *done, n);
}

PQMQ_EXPORT int pqmq_complete_and_poll(pqmq_client *c, const pqmq_batch *done_batch,
                                       const char *const *channels, size_t nchannels,
                                       int batch_size, pqmq_batch **out)
{
    int rc = pqmq__begin_batch(c, "pqmq_complete_and_poll", out);
    if (rc)
        return rc;
    pqmq__delivery *d = NULL;
    size_t done = 0;
    rc = pqmq__batch_deliveries(c, done_batch, &d);
    if (!rc)
        rc = pqmq__complete_poll(c, d, pqmq_batch_count(done_batch), channels, nchannels,
                                 batch_size, out, &done);
    free(d);
    return rc;
}
