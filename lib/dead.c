/*
 * dead.c: dead letters. Messages that ran out of attempts are kept; these
 * calls list them, give them new attempts, or move them out of their
 * ordered chains so that the chain moves on.
 */
#include "pqmq-int.h"

PQMQ_EXPORT int pqmq_dead_letters(pqmq_client *c, const char *const *channels, size_t nchannels,
                                  int max, pqmq_batch **out)
{
    int rc = pqmq__begin_batch(c, "pqmq_dead_letters", out);
    return rc ? rc
              : pqmq__query_jobs(c, "SELECT * FROM mq_dead_jobs($1, $2)", channels, nchannels,
                                 "max", max, out);
}

PQMQ_EXPORT int pqmq_retry(pqmq_client *c, const uuid_t *ids, size_t n, int retries,
                           size_t *count)
{
    if (c && retries < 0) {
        pqmq__enter(c, "pqmq_retry");
        return pqmq__err(c, PQMQ_EINVAL, "retries is negative (%d)", retries);
    }
    return pqmq__ids_call(c, "pqmq_retry", "SELECT mq_retry($1, $2)", ids, n, &retries, count);
}

PQMQ_EXPORT int pqmq_skip(pqmq_client *c, const uuid_t *ids, size_t n, size_t *count)
{
    return pqmq__ids_call(c, "pqmq_skip", "SELECT mq_skip($1)", ids, n, NULL, count);
}
