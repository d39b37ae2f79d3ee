/*
 * profile.h: --profile: SQL function times and client CPU per phase.
 */
#ifndef PQMQ_BENCH_PROFILE_H
#define PQMQ_BENCH_PROFILE_H

#include <libpq-fe.h>

#include "options.h"

/* With --profile: per-phase SQL function times and the bench's CPU time,
 * printed to stderr by profile_end. No-ops otherwise. */
void profile_begin(const struct opts *o, PGconn *admin);
/* messages: how many the phase moved (0: no per-message cost). */
void profile_end(const struct opts *o, PGconn *admin, const char *label, long messages);

#endif
