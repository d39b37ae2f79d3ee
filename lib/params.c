/*
 * params.c: the parameters of statements (channels, counts, durations,
 * checked ids) and the prologues of the calls that take them.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pqmq-int.h"

/* ---- parameters -------------------------------------------------------- */

static int put_text(pqmq_client *c, PGparam *array, const void *items, size_t i)
{
    (void)c;
    const char *const *texts = items;
    return PQputf(array, "%text*", texts[i]);
}

int pqmq__put_channels(pqmq_client *c, PGparam *param, const char *const *channels, size_t n)
{
    if (!channels)
        return PQputf(param, "%text[]", NULL) ? 0
                                              : pqmq__err(c, PQMQ_ENOMEM, "%s", PQgeterror());
    if (n == 0)
        return pqmq__err(c, PQMQ_EINVAL, "nchannels is 0 (pass channels NULL for all)");
    for (size_t i = 0; i < n; i++)
        if (!channels[i]) /* "" is a channel like any other */
            return pqmq__err(c, PQMQ_EINVAL, "channels[%zu] is NULL", i);
    return pqmq__put_array(c, param, "%text[]", channels, n, put_text);
}

int pqmq__put_count(pqmq_client *c, PGparam *param, const char *arg, int value)
{
    if (value < 1 || value > PQMQ_MAX_BATCH)
        return pqmq__err(c, PQMQ_EINVAL, "%s %d is outside 1..%d", arg, value, PQMQ_MAX_BATCH);
    if (!PQputf(param, pqmq__spec(c, PQMQ__SPEC_INT4), value))
        return pqmq__err(c, PQMQ_ENOMEM, "%s", PQgeterror());
    return 0;
}

int pqmq__put_channels_count(pqmq_client *c, PGparam *param, const char *const *channels,
                             size_t nchannels, const char *arg, int value)
{
    int rc = pqmq__put_channels(c, param, channels, nchannels);
    return rc ? rc : pqmq__put_count(c, param, arg, value);
}

int pqmq__put_duration(pqmq_client *c, PGparam *param, int64_t ms, const char *arg)
{
    int rc = arg ? pqmq__check_ms(c, ms, "%s: %s", c->call, arg)
                 : pqmq__check_ms(c, ms, "%s", c->call);
    if (rc)
        return rc;
    PGinterval iv;
    pqmq__ms_to_interval(ms, &iv);
    if (!PQputf(param, "%interval", &iv))
        return pqmq__err(c, PQMQ_ENOMEM, "%s", PQgeterror());
    return 0;
}

/* ---- prologues --------------------------------------------------------- */

int pqmq__check_ids(pqmq_client *c, const void *ids, size_t n)
{
    if (!ids || n == 0)
        return pqmq__err(c, PQMQ_EINVAL, "no ids given (ids %s, n %zu)", ids ? "set" : "NULL",
                         n);
    if (n > PQMQ_MAX_BATCH)
        return pqmq__err(c, PQMQ_ETOOBIG, "%zu ids is over the limit of %d", n, PQMQ_MAX_BATCH);
    return 0;
}

int pqmq__begin(pqmq_client *c, PGparam **param)
{
    *param = NULL;
    pqmq__clearerr(c);
    int rc = pqmq__ready(c);
    if (!rc && !(*param = pqmq__param(c)))
        rc = PQMQ_ENOMEM;
    return rc;
}

int pqmq__begin_ids(pqmq_client *c, const uuid_t *ids, size_t n, PGparam **param)
{
    int rc = pqmq__begin(c, param);
    if (!rc)
        rc = pqmq__check_ids(c, ids, n);
    return rc ? rc : pqmq__put_ids(c, *param, ids, n);
}

int pqmq__begin_deliveries(pqmq_client *c, const pqmq__delivery *d, size_t n, PGparam **param)
{
    int rc = pqmq__begin(c, param);
    if (!rc)
        rc = pqmq__check_ids(c, d, n);
    return rc ? rc : pqmq__put_deliveries(c, *param, d, n);
}

int pqmq__begin_id(pqmq_client *c, const uuid_t id, PGparam **param)
{
    int rc = pqmq__begin(c, param);
    if (!rc && !id)
        rc = pqmq__err(c, PQMQ_EINVAL, "id is NULL");
    if (!rc && !PQputf(*param, pqmq__spec(c, PQMQ__SPEC_UUID), (PGuuid)id))
        rc = pqmq__err(c, PQMQ_ENOMEM, "%s", PQgeterror());
    return rc;
}

int pqmq__ids_call(pqmq_client *c, const char *call, const char *sql, const uuid_t *ids,
                   size_t n, const int *extra, size_t *count)
{
    if (count)
        *count = 0;
    if (pqmq__enter(c, call))
        return PQMQ_EINVAL;
    PGparam *param;
    int rc = pqmq__begin_ids(c, ids, n, &param);
    if (!rc && extra && !PQputf(param, pqmq__spec(c, PQMQ__SPEC_INT4), *extra))
        rc = pqmq__err(c, PQMQ_ENOMEM, "%s", PQgeterror());
    int got = 0;
    if (!rc)
        rc = pqmq__exec_scalar(c, param, sql, count ? "%int4" : NULL, &got);
    PQparamClear(param);
    if (!rc && count)
        *count = (size_t)got;
    return rc;
}

/* ---- durations --------------------------------------------------------- */

void pqmq__ms_to_interval(int64_t ms, PGinterval *iv)
{
    memset(iv, 0, sizeof *iv);
    iv->hours = (int)(ms / 3600000);
    ms %= 3600000;
    iv->mins = (int)(ms / 60000);
    ms %= 60000;
    iv->secs = (int)(ms / 1000);
    iv->usecs = (int)(ms % 1000) * 1000;
}

int pqmq__check_ms(pqmq_client *c, int64_t ms, const char *fmt, ...)
{
    if (ms >= 0 && ms <= PQMQ_MAX_DURATION_MS)
        return 0;
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (ms < 0)
        return pqmq__seterr(c, PQMQ_EINVAL, "%s is negative (%lld ms)", name, (long long)ms);
    return pqmq__seterr(c, PQMQ_EINVAL, "%s of %lld ms is over the limit of 3650 days", name,
                        (long long)ms);
}
