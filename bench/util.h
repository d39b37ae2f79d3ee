/*
 * util.h: clock, errors, connections, payloads, percentiles, memory.
 */
#ifndef PQMQ_BENCH_UTIL_H
#define PQMQ_BENCH_UTIL_H

#include <stdint.h>

#include <libpq-fe.h>
#include <pqmq.h>

#include "options.h"
#include "results.h"

double now_s(void);        /* monotonic seconds */
int64_t realtime_us(void); /* CLOCK_REALTIME microseconds */
void sleep_s(double s);
_Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* fn runs first when die is called (the progress bar clears its line). */
void die_first(void (*fn)(void));
/* dsn as key=value with our search_path (and, for --profile,
 * track_functions) added to its options. Caller frees. */
char *bench_conninfo(const char *dsn, int profile);
PGconn *bench_connect(const struct opts *o);
pqmq_client *bench_client(const struct opts *o);

void bench_sql(PGconn *conn, const char *sql);
long bench_scalar(PGconn *conn, const char *sql);
/* Is message seq on an ordered chain? Spreads the fraction evenly. */
int shape_ordered(const struct shape *s, long seq);
/* Writes a JSON object {"seq":..,"ts":..,"pad":".."} of about `bytes`
 * bytes (at least what seq and ts need) into buf; returns its length. */
int bench_payload(char *buf, size_t cap, long seq, int64_t ts, int bytes);
size_t bench_payload_cap(int bytes);
/* Sorts v[0..n) and fills p50/p99/max (inputs and outputs in ms). */
void latency_summary(double *v, int n, struct latency *out);
long maxrss_kb(void);
/* The worker threads per runner that the server's free connections allow
 * for `consumers` runners, at most batch. */
int derive_runner_threads(PGconn *admin, int consumers, int batch);

#endif
