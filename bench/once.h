/*
 * once.h: exactly-once processing: a result row committed with each completion.
 */
#ifndef PQMQ_BENCH_ONCE_H
#define PQMQ_BENCH_ONCE_H

#include <libpq-fe.h>

#include "options.h"
#include "results.h"

/* With --floor, after the poll-API phase: pqmq's and the floor's rate of
 * exactly-once processing (messages/s). */
void once_setup(PGconn *admin);
void run_once(const struct opts *o, PGconn *admin, int threads, struct results *r);

#endif
