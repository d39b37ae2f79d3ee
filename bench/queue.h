/*
 * queue.h: pqmq phases: enqueue, runner and poll-API processing, latency.
 */
#ifndef PQMQ_BENCH_QUEUE_H
#define PQMQ_BENCH_QUEUE_H

#include <libpq-fe.h>
#include <pqmq.h>

#include "load_ops.h"
#include "options.h"
#include "results.h"

void queue_setup(PGconn *admin, const struct opts *o);
void queue_reset(PGconn *admin);
double queue_enqueue(const struct opts *o, const struct shape *s, const char *label);
/* The same with pqmq_insert_batches, BENCH_PIPELINE batches a call. */
double queue_enqueue_pipelined(const struct opts *o, const struct shape *s, const char *label);
double queue_drain_runner(const struct opts *o, int threads, const char *label);
/* The same, on the locked lane (pqmq_runner_set_locked) or not, and with
 * record set, each handler writes its bench_results row in the job's
 * transaction (exactly-once, see once.c). */
double queue_drain_runner_with(const struct opts *o, int threads, const char *label, int locked,
                               int record);
/* Settles and deletes what the queue's log keeps of finished messages, all
 * of it, on conn: the work polls do about once a second a channel, which a
 * drain of a second or less would otherwise leave out of its time (the
 * floor's DELETE does it in its own). Each drain ends with it. */
void queue_reclaim_log(PGconn *conn);
double queue_drain_poll(const struct opts *o, const char *label);
/* The same with the locked lane (pqmq_poll_locked, one transaction a batch). */
double queue_drain_locked(const struct opts *o, const char *label);
void queue_latency(const struct opts *o, int ordered, struct latency *out);
/* Fills msgs[0..k) with new messages seq first.. of shape s; json is a
 * buffer of bench_payload_cap bytes. */
void queue_fill_batch(const struct opts *o, const struct shape *s, long first, int k,
                      pqmq_msg **msgs, char *json);
extern const struct load_ops queue_load_ops;

#endif
