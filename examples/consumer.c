/*
 * consumer.c: poll batches, do the work, complete them; exit when idle.
 *
 *   consumer [CONNINFO]
 *
 * Completes in batches (one round trip per batch) and reports failures with
 * pqmq_fail so they are retried after the backoff. Without CONNINFO, the
 * server is $PQMQ_DSN, else $DATABASE_URL, else libpq's PG* variables;
 * $PQMQ_SCHEMA names the queue's schema. Copy freely, with example_env.h.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep and setenv under -std=c11 */

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <pqmq.h>

#include "example_env.h"

static int handle(const pqmq_job *job)
{
    /* Your work goes here. The payload and strings live until the batch is
     * freed. Return 0 on success. */
    printf("%s/%s %s attempt %d: %s\n", pqmq_job_channel(job), pqmq_job_args(job),
           pqmq_job_name(job), pqmq_job_attempt(job),
           pqmq_job_json(job) ? pqmq_job_json(job) : "(no JSON)");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 2) {
        fprintf(stderr, "usage: %s [CONNINFO]\n", argv[0]);
        return 2;
    }
    if (schema_from_env() != 0) {
        fprintf(stderr, "PQMQ_SCHEMA is too long\n");
        return 2;
    }
    pqmq_client *client = NULL;
    if (pqmq_connect(conninfo_from(argc > 1 ? argv[1] : NULL), &client) != PQMQ_OK) {
        fprintf(stderr, "connect: %s\n", pqmq_errmsg(client));
        pqmq_client_free(client);
        return 1;
    }

    const char *channels[] = {"orders"};
    for (;;) {
        pqmq_batch *batch = NULL;
        if (pqmq_poll(client, channels, 1, 50, &batch) != PQMQ_OK) {
            fprintf(stderr, "poll: %s\n", pqmq_errmsg(client));
            break;
        }
        size_t n = pqmq_batch_count(batch);
        if (n == 0) {
            /* Nothing ready: wait_ms says when something will be (-1: never).
             * Idle is nothing due within a second: a delayed message waits
             * for the next run. A real worker sleeps on LISTEN instead (see
             * the runner). */
            int64_t wait = pqmq_batch_wait_ms(batch);
            pqmq_batch_free(batch);
            if (wait < 0 || wait > 1000)
                break;
            struct timespec ts = {(time_t)(wait / 1000), (long)(wait % 1000) * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        uuid_t done[50];
        size_t ndone = 0;
        for (size_t i = 0; i < n; i++) {
            const pqmq_job *job = pqmq_batch_job(batch, i);
            uuid_t id;
            pqmq_job_id(job, id);
            if (handle(job) == 0)
                uuid_copy(done[ndone++], id);
            else if (pqmq_fail(client, id, "handler failed") != PQMQ_OK)
                fprintf(stderr, "fail: %s\n", pqmq_errmsg(client));
        }
        /* One round trip completes the whole batch; ordered chains move on. */
        if (ndone && pqmq_complete(client, (const uuid_t *)done, ndone) != PQMQ_OK)
            fprintf(stderr, "complete: %s\n", pqmq_errmsg(client));
        pqmq_batch_free(batch);
    }
    pqmq_client_free(client);
    return 0;
}
