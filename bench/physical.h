/*
 * physical.h: WAL and updates per processed message, from the server's counters.
 */
#ifndef PQMQ_BENCH_PHYSICAL_H
#define PQMQ_BENCH_PHYSICAL_H

#include <libpq-fe.h>

#include "results.h"

void physical_begin(PGconn *admin, struct phys_snap *s);
void physical_end(PGconn *admin, const struct phys_snap *s, long messages,
                  struct physical *out);

#endif
