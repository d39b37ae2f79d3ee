/*
 * steady.h: --steady: half the queue's own burn-down rate, offered for a while.
 */
#ifndef PQMQ_BENCH_STEADY_H
#define PQMQ_BENCH_STEADY_H

#include <libpq-fe.h>

#include "options.h"

/* --steady's messages burnt down unless --messages says: several seconds
 * of this machine's work, so the rate includes the log's upkeep. */
#define STEADY_BURN_MESSAGES 300000

/* Measures the burn-down rate, then runs the load run (load.c) at half of
 * it and prints its report, targets included. */
void run_steady(const struct opts *o, PGconn *admin);

#endif
