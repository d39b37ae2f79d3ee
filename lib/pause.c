/*
 * pause.c: pausing and resuming a channel (schema/pause.sql). While a
 * channel is paused no poll delivers its messages; what is in flight can
 * still be completed, failed or kept alive.
 */
#include "pqmq-int.h"

/* Runs sql ($1 the channel, $2 the reason when with_reason) for call; the
 * boolean it returns is the call's result. */
static int pause_call(pqmq_client *c, const char *call, const char *sql, const char *channel,
                      int with_reason, const char *reason)
{
    if (pqmq__enter(c, call))
        return PQMQ_EINVAL;
    if (!channel || !*channel)
        return pqmq__err(c, PQMQ_EINVAL, "the channel name is NULL or empty");
    PGparam *param;
    int changed = 0;
    int rc = pqmq__begin(c, &param);
    if (!rc && !PQputf(param, "%text*", channel))
        rc = pqmq__err(c, PQMQ_ENOMEM, "%s", PQgeterror());
    if (!rc && with_reason && !PQputf(param, "%text*", reason))
        rc = pqmq__err(c, PQMQ_ENOMEM, "%s", PQgeterror());
    if (!rc)
        rc = pqmq__exec_scalar(c, param, sql, "%bool", &changed);
    PQparamClear(param);
    return rc ? rc : (changed ? 1 : 0);
}

PQMQ_EXPORT int pqmq_pause(pqmq_client *c, const char *channel, const char *reason)
{
    return pause_call(c, "pqmq_pause", "SELECT mq_pause($1, $2)", channel, 1, reason);
}

PQMQ_EXPORT int pqmq_resume(pqmq_client *c, const char *channel)
{
    return pause_call(c, "pqmq_resume", "SELECT mq_resume($1)", channel, 0, NULL);
}
