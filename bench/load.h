/*
 * load.h: --rate and --held-xmin: offered load, a held snapshot, phases.
 */
#ifndef PQMQ_BENCH_LOAD_H
#define PQMQ_BENCH_LOAD_H

#include <libpq-fe.h>

#include "options.h"

/* --rate and/or --held-xmin: runs pqmq (and with --floor the floor) under
 * load and prints the report. */
void run_load(const struct opts *o, PGconn *admin);

#endif
