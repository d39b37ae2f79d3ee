/*
 * producer.c: insert a batch of messages in one round trip.
 *
 *   producer [CONNINFO [COUNT]]
 *
 * Each message goes to channel "orders", chain "customer-<n % 3>", ordered,
 * with a JSON payload. Without CONNINFO (or with ""), the server is
 * $PQMQ_DSN, else $DATABASE_URL, else libpq's PG* variables; $PQMQ_SCHEMA
 * names the queue's schema. Copy freely.
 */
#define _POSIX_C_SOURCE 200809L /* setenv under -std=c11 */

#include <stdio.h>
#include <stdlib.h>

#include <pqmq.h>

/* The server, as pqmq(1) chooses it: the command line's CONNINFO, else
 * $PQMQ_DSN, else $DATABASE_URL, else "" (libpq's PG* variables and
 * service file); an empty value counts as unset. */
static const char *conninfo_from(const char *arg)
{
    const char *v = arg && *arg ? arg : getenv("PQMQ_DSN");
    if (!v || !*v)
        v = getenv("DATABASE_URL");
    return v && *v ? v : "";
}

/* $PQMQ_SCHEMA, when set, is the queue's schema: it goes first on the
 * search_path of every connection this process opens, through libpq's
 * PGOPTIONS (it works with URIs and keyword strings alike, and reaches
 * the runner's connections too). Behind a pooler in transaction mode, set
 * the role's search_path instead (docs/pgbouncer.md). 0, or -1 if the
 * name does not fit. */
static int schema_from_env(void)
{
    const char *schema = getenv("PQMQ_SCHEMA"), *old = getenv("PGOPTIONS");
    if (!schema || !*schema)
        return 0;
    char opts[1024];
    size_t n = (size_t)snprintf(opts, sizeof opts, "%s%s-c search_path=\"", old ? old : "",
                                old && *old ? " " : "");
    for (const char *p = schema; *p && n + 4 < sizeof opts; p++) {
        if (*p == ' ' || *p == '\\')
            opts[n++] = '\\'; /* the server splits options at spaces */
        else if (*p == '"')
            opts[n++] = '"'; /* a quoted identifier doubles its quotes */
        opts[n++] = *p;
    }
    if (n + 2 > sizeof opts)
        return -1;
    opts[n++] = '"';
    opts[n] = '\0';
    return setenv("PGOPTIONS", opts, 1);
}

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
