/*
 * producer.c: insert a batch of messages in one round trip.
 *
 *   producer [CONNINFO [COUNT]]
 *
 * Each message goes to channel "orders", chain "customer-<n % 3>", ordered,
 * with a JSON payload. Without CONNINFO (or with ""), the server is
 * $PQMQ_DSN, else $DATABASE_URL, else libpq's PG* variables; $PQMQ_SCHEMA
 * names the queue's schema. Copy freely, with example_env.h.
 */
#define _POSIX_C_SOURCE 200809L /* setenv under -std=c11 */

#include <stdio.h>
#include <stdlib.h>

#include <pqmq.h>

#include "example_env.h"

int main(int argc, char **argv)
{
    if (argc > 3) {
        fprintf(stderr, "usage: %s [CONNINFO [COUNT]]\n", argv[0]);
        return 2;
    }
    if (schema_from_env() != 0) {
        fprintf(stderr, "PQMQ_SCHEMA is too long\n");
        return 2;
    }
    int count = argc > 2 ? atoi(argv[2]) : 10;
    if (count < 1 || count > PQMQ_MAX_BATCH) {
        fprintf(stderr, "COUNT must be 1..%d\n", PQMQ_MAX_BATCH);
        return 2;
    }

    /* The client owns its connection; free it with pqmq_client_free. */
    pqmq_client *client = NULL;
    if (pqmq_connect(conninfo_from(argc > 1 ? argv[1] : NULL), &client) != PQMQ_OK) {
        fprintf(stderr, "connect: %s\n", pqmq_errmsg(client));
        pqmq_client_free(client);
        return 1;
    }
    /* Creates or upgrades the queue tables; cheap when already done, and
     * then all it needs is a duty (mq_grant), no rights on the tables. */
    if (pqmq_migrate(client) != PQMQ_OK) {
        fprintf(stderr, "migrate: %s\n", pqmq_errmsg(client));
        pqmq_client_free(client);
        return 1;
    }

    pqmq_msg **msgs = calloc((size_t)count, sizeof *msgs);
    for (int i = 0; i < count && msgs; i++) {
        char chain[32], json[64];
        snprintf(chain, sizeof chain, "customer-%d", i % 3);
        snprintf(json, sizeof json, "{\"seq\": %d}", i);
        msgs[i] = pqmq_msg_new();
        pqmq_msg_set_channel(msgs[i], "orders", chain); /* channel + args */
        pqmq_msg_set_name(msgs[i], "ship");             /* what the consumer does */
        pqmq_msg_set_json(msgs[i], json);
        pqmq_msg_set_ordered(msgs[i], 1);    /* per chain, in this array's order */
        pqmq_msg_set_retries(msgs[i], 5);    /* up to 6 deliveries */
        pqmq_msg_set_backoff(msgs[i], 2000); /* 2 s lease, doubling per retry */
    }

    /* All or nothing, one round trip. Validation errors name the message. */
    int rc = msgs ? pqmq_insert(client, msgs, (size_t)count) : PQMQ_ENOMEM;
    if (rc != PQMQ_OK)
        fprintf(stderr, "insert: %s (%s)\n", pqmq_errmsg(client), pqmq_strerror(rc));
    else
        printf("inserted %d messages\n", count);

    for (int i = 0; i < count && msgs; i++)
        pqmq_msg_free(msgs[i]);
    free(msgs);
    pqmq_client_free(client);
    return rc == PQMQ_OK ? 0 : 1;
}
