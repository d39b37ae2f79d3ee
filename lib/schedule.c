/*
 * schedule.c: recurring messages. A schedule is a parsed cron expression,
 * a time zone and the message to insert; the server (mq_schedule) finds
 * the slots that came due and inserts each once, under a unique key per
 * slot, however many runners carry the same schedule.
 */
#include <stdlib.h>
#include <string.h>

#include "schedule.h"

struct pqmq__schedule {
    char *name, *tz, *channel, *msg_name, *json;
    void *bytes;
    size_t bytes_len;
    int retries;
    int64_t backoff_ms;
    pqmq_backfill backfill;
    pqmq__cron cron;
};

void pqmq__schedule_free(pqmq__schedule *s)
{
    if (!s)
        return;
    free(s->name);
    free(s->tz);
    free(s->channel);
    free(s->msg_name);
    free(s->json);
    free(s->bytes);
    free(s);
}

const char *pqmq__schedule_name(const pqmq__schedule *s)
{
    return s->name;
}

static char *dup_or_null(const char *s, int *oom)
{
    char *d = s ? strdup(s) : NULL;
    if (s && !d)
        *oom = 1;
    return d;
}

/* Copies what the schedule keeps of msg into s. */
static int copy_msg(pqmq__schedule *s, const pqmq_msg *m)
{
    int oom = 0;
    s->channel = dup_or_null(m->channel, &oom);
    s->msg_name = dup_or_null(m->name ? m->name : "", &oom);
    s->json = dup_or_null(m->json, &oom);
    if (m->bytes && (s->bytes = malloc(m->bytes_len ? m->bytes_len : 1)))
        memcpy(s->bytes, m->bytes, m->bytes_len);
    else if (m->bytes)
        oom = 1;
    s->bytes_len = m->bytes_len;
    s->retries = m->retries;
    s->backoff_ms = m->backoff_ms;
    return oom ? PQMQ_ENOMEM : 0;
}

#define PQMQ__SCHEDULE_NAME_MAX 998

int pqmq__schedule_new(const char *name, const char *cron, const char *time_zone,
                       const pqmq_msg *msg, pqmq_backfill backfill, pqmq__schedule **out,
                       char *err, size_t errlen)
{
    *out = NULL;
    if (!name || !*name || !msg || !msg->channel)
        return snprintf(err, errlen, "pqmq_runner_schedule: %s",
                        !name || !*name ? "name is NULL or empty"
                                        : "msg is NULL or has no channel"),
               PQMQ_EINVAL;
    /* Its slots' keys, "schedule:NAME:YYYY-MM-DDTHH:MM", fit in 1024 bytes
     * (mq_schedule refuses the same). */
    if (strlen(name) > PQMQ__SCHEDULE_NAME_MAX)
        return snprintf(err, errlen, "pqmq_runner_schedule: name is over %d bytes",
                        PQMQ__SCHEDULE_NAME_MAX),
               PQMQ_EINVAL;
    /* Refused here, not at the first slot: a bad payload would otherwise
     * let the runner start and fail each evaluation. */
    size_t at = msg->json ? pqmq_json_check(msg->json, strlen(msg->json)) : 0;
    if (at)
        return snprintf(err, errlen,
                        "pqmq_runner_schedule: %s: payload is not valid JSON (at byte %zu)",
                        name, at),
               PQMQ_EINVAL;
    if (backfill != PQMQ_BACKFILL_ALL && backfill != PQMQ_BACKFILL_LATEST)
        return snprintf(err, errlen, "pqmq_runner_schedule: backfill %d is not a pqmq_backfill",
                        (int)backfill),
               PQMQ_EINVAL;
    pqmq__schedule *s = calloc(1, sizeof *s);
    if (!s)
        return PQMQ_ENOMEM;
    char why[256];
    if (pqmq__cron_parse(cron, &s->cron, why, sizeof why)) {
        free(s);
        return snprintf(err, errlen, "pqmq_runner_schedule: %s: %s", name, why), PQMQ_EINVAL;
    }
    s->backfill = backfill;
    s->name = strdup(name);
    s->tz = strdup(time_zone ? time_zone : "UTC");
    if (!s->name || !s->tz || copy_msg(s, msg)) {
        pqmq__schedule_free(s);
        return PQMQ_ENOMEM;
    }
    *out = s;
    return 0;
}

/* The parsed expression as mq_schedule's and mq_cron_slots' bit sets. */
static int put_cron(PGparam *p, const pqmq__cron *c)
{
    return PQputf(p, "%int8 %int4 %int8 %int4 %int4 %bool %bool", (PGint8)c->minutes,
                  (PGint4)c->hours, (PGint8)c->doms, (PGint4)c->months, (PGint4)c->dows,
                  (PGbool)c->dom_any, (PGbool)c->dow_any);
}

int pqmq__schedule_tick(pqmq_client *c, const pqmq__schedule *s)
{
    pqmq__enter(c, "pqmq_runner: schedule");
    PGparam *p = NULL;
    int rc = pqmq__begin(c, &p);
    if (rc)
        return rc;
    PGinterval backoff;
    pqmq__ms_to_interval(s->backoff_ms, &backoff);
    PGbytea bytes = {(int)s->bytes_len, s->bytes};
    if (!PQputf(p, "%text", s->name) || !put_cron(p, &s->cron) ||
        !PQputf(p, "%text %text %text %text %text* %bytea* %int4 %interval", s->tz,
                s->backfill == PQMQ_BACKFILL_LATEST ? "latest" : "all", s->channel, s->msg_name,
                s->json, s->bytes ? &bytes : NULL, s->retries, &backoff))
        rc = pqmq__seterr(c, PQMQ_ENOMEM, "schedule %s: %s", s->name, PQgeterror());
    int inserted = 0;
    if (!rc)
        rc = pqmq__exec_scalar(c, p,
                               "SELECT mq_schedule($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, "
                               "$11, $12, $13, $14, $15, $16)",
                               "%int4", &inserted);
    PQparamClear(p);
    return rc;
}

/* Reads the slots of mq_cron_slots' result as text into a new array. */
static int read_slots(pqmq_client *c, PGresult *r, char ***out, size_t *n)
{
    int rows = PQntuples(r);
    char **slots = calloc(rows ? (size_t)rows : 1, sizeof *slots);
    if (!slots)
        return pqmq__err(c, PQMQ_ENOMEM, "out of memory");
    for (int i = 0; i < rows; i++) {
        PGtext t = NULL;
        if (!PQgetf(r, i, "%text", 0, &t) || !t || !(slots[i] = strdup(t))) {
            pqmq_cron_slots_free(slots, (size_t)i);
            return pqmq__err(c, PQMQ_ESERVER, "unexpected result");
        }
    }
    *out = slots;
    *n = (size_t)rows;
    return 0;
}

PQMQ_EXPORT int pqmq_cron_slots(pqmq_client *c, const char *cron, const char *time_zone,
                                int64_t after_ms, int64_t until_ms, char ***slots, size_t *n)
{
    if (!c || !slots || !n)
        return PQMQ_EINVAL;
    *slots = NULL;
    *n = 0;
    pqmq__enter(c, "pqmq_cron_slots");
    pqmq__cron parsed;
    char why[256];
    if (pqmq__cron_parse(cron, &parsed, why, sizeof why))
        return pqmq__err(c, PQMQ_EINVAL, "%s", why);
    if (until_ms < after_ms || until_ms - after_ms > 31LL * 24 * 3600 * 1000)
        return pqmq__err(c, PQMQ_EINVAL, "until_ms must follow after_ms by at most 31 days");
    PGparam *p = NULL;
    int rc = pqmq__begin(c, &p);
    if (rc)
        return rc;
    if (!put_cron(p, &parsed) || !PQputf(p, "%text %int8 %int8", time_zone ? time_zone : "UTC",
                                         (PGint8)after_ms, (PGint8)until_ms))
        rc = pqmq__err(c, PQMQ_ENOMEM, "%s", PQgeterror());
    PGresult *r = NULL;
    if (!rc)
        r = pqmq__exec(c, p,
                       "SELECT to_char(slot, 'YYYY-MM-DD\"T\"HH24:MI') FROM mq_cron_slots("
                       "$1, $2, $3, $4, $5, $6, $7, $8, to_timestamp($9 / 1000.0), "
                       "to_timestamp($10 / 1000.0))",
                       &rc);
    PQparamClear(p);
    if (!rc)
        rc = read_slots(c, r, slots, n);
    PQclear(r);
    return rc;
}

PQMQ_EXPORT void pqmq_cron_slots_free(char **slots, size_t n)
{
    for (size_t i = 0; slots && i < n; i++)
        free(slots[i]);
    free(slots);
}
