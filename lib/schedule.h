/*
 * schedule.h: recurring messages (schedule.c). The runner keeps a list of
 * schedules and evaluates them on its control connection once a minute.
 */
#ifndef PQMQ_SCHEDULE_H
#define PQMQ_SCHEDULE_H

#include "pqmq-int.h"

typedef struct pqmq__schedule pqmq__schedule;

/* A new schedule: copies what it keeps of msg (channel, name, payload,
 * retries, backoff). 0, or PQMQ_EINVAL with why in err (a bad cron
 * expression names its field), or PQMQ_ENOMEM. */
int pqmq__schedule_new(const char *name, const char *cron, const char *time_zone,
                       const pqmq_msg *msg, pqmq_backfill backfill, pqmq__schedule **out,
                       char *err, size_t errlen);
void pqmq__schedule_free(pqmq__schedule *s);
/* The schedule's name. Borrowed. */
const char *pqmq__schedule_name(const pqmq__schedule *s);

/* Evaluates the schedule up to now on c (mq_schedule): inserts what came
 * due. 0 or a negative code (pqmq_errmsg(c) says why, naming the schedule). */
int pqmq__schedule_tick(pqmq_client *c, const pqmq__schedule *s);

#endif
