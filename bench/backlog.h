/*
 * backlog.h: --backlog: poll cost over a small and a large backlog.
 */
#ifndef PQMQ_BENCH_BACKLOG_H
#define PQMQ_BENCH_BACKLOG_H

#include <libpq-fe.h>

#include "options.h"

void run_backlog(const struct opts *o, PGconn *admin);

#endif
