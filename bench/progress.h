/*
 * progress.h: the progress bar on a terminal, and timed threads that show it.
 */
#ifndef PQMQ_BENCH_PROGRESS_H
#define PQMQ_BENCH_PROGRESS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

/* Shows label and done/total on stderr until progress_end (only when stderr
 * is a terminal). done is read, never written. */
void progress_begin(const char *label, long total, const atomic_long *done);
void progress_end(void);
/* Runs fn on each of the n argument structs at args (arg_size bytes apart)
 * in a thread of its own. Each thread connects, then waits on start, a
 * barrier for n + 1; the clock starts when all have arrived and stops when
 * all have returned. Shows progress of *done out of total under label.
 * Returns the seconds. */
double bench_timed_threads(int n, void *(*fn)(void *), void *args, size_t arg_size,
                           pthread_barrier_t *start, const char *label, long total,
                           const atomic_long *done);

#endif
