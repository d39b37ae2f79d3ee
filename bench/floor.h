/*
 * floor.h: the SQL floor: the cheapest insert and drain of the same work.
 */
#ifndef PQMQ_BENCH_FLOOR_H
#define PQMQ_BENCH_FLOOR_H

#include <libpq-fe.h>

#include "load_ops.h"
#include "options.h"

void floor_setup(PGconn *admin);
double floor_insert(const struct opts *o, PGconn *admin);
/* The same, each producer sending BENCH_PIPELINE batches at a time in one
 * round trip (libpq pipeline mode), each its own transaction. */
double floor_insert_pipelined(const struct opts *o, PGconn *admin);
/* by_ctid 0: the DELETE ... WHERE id IN (...); 1: by ctid. */
double floor_drain(const struct opts *o, PGconn *admin, int by_ctid);
/* The floor's drain by id, as SQL with $1 the batch size. */
extern const char floor_drain_sql[];
extern const struct load_ops floor_load_ops;

#endif
