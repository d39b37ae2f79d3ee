/* test_citus.c: what only a Citus cluster shows (make check-citus,
 * tests/citus/check.sh): a queue lives whole on one worker, two queues on
 * two workers are independent, and a worker stopped at once while producers
 * and runners of both queues are busy costs the other queue nothing and its
 * own queue nothing either, once it is back: no message lost, no chain out
 * of order, and no call that hangs while it is down.
 *
 * Needs PQMQ_TEST_DSN (the coordinator), PQMQ_CITUS_WORKER_PORT (worker 0's
 * port) and PQMQ_CITUS_WORKER_STOP / _START (shell commands that stop it at
 * once and start it again); skips (77) without them. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define CHAINS 8
#define PER_BATCH 16
#define MAX_SEQ 200000

static const char *worker_port;

/* The port of the node that holds a queue's messages (-1: not found): its
 * table mq_rows (mq_msgs is a view, with no shard). */
static long long node_of(PGconn *pg, const char *schema)
{
    return t_sql_int(pg,
                     "SELECT min(nodeport) FROM citus_shards "
                     "WHERE table_name = '%s.mq_rows'::regclass",
                     schema);
}

/* The conninfo of a client of this schema, with more server options
 * (may be ""). Caller frees. */
static char *conninfo(const char *schema, const char *more)
{
    char *ci = NULL;
    if (asprintf(&ci, "%s options='-c search_path=%s -c client_min_messages=warning%s'",
                 t_dsn(), schema, more) < 0)
        abort();
    return ci;
}

/* A second queue, B, beside the harness's, A. Caller frees both. */
static char *make_queue(PGconn *pg, const char *name, pqmq_client **out)
{
    char *schema = NULL, *ci = NULL;
    if (asprintf(&schema, "%s_%s", t_schema(), name) < 0)
        abort();
    t_exec(pg, "DROP SCHEMA IF EXISTS %s CASCADE", schema);
    t_exec(pg, "CREATE SCHEMA %s", schema);
    ci = conninfo(schema, "");
    *out = NULL;
    CHECK_INT(pqmq_connect(ci, out), 0);
    free(ci);
    if (*out)
        CHECK_OK(*out, pqmq_migrate(*out));
    return schema;
}

/* Puts a queue's schema on the worker with this port (or the other one). */
static void place(PGconn *pg, const char *schema, const char *port, int on_it)
{
    long long at = node_of(pg, schema);
    if ((at == atoll(port)) == on_it)
        return;
    t_exec(pg,
           "SELECT citus_schema_move('%s', '127.0.0.1', "
           "(SELECT node_port FROM citus_get_active_worker_nodes() "
           " WHERE (node_port = %s) = %s)::int, shard_transfer_mode => 'block_writes')",
           schema, port, on_it ? "true" : "false");
}

/* ---- 1. a queue lives on one worker ------------------------------------- */

static void test_a_queue_lives_on_one_worker(void)
{
    PGconn *pg = t_pg();
    /* Its schema is distributed: every table on one node, a worker. */
    CHECK_INT(
        t_sql_int(pg, "SELECT count(*) FROM pg_dist_schema WHERE schemaid = '%s'::regnamespace",
                  t_schema()),
        1);
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(DISTINCT s.nodeport) FROM citus_shards s "
                        "JOIN pg_class c ON c.oid = s.table_name "
                        "WHERE c.relnamespace = '%s'::regnamespace",
                        t_schema()),
              1);
    CHECK(
        t_sql_int(pg,
                  "SELECT count(*) FROM citus_shards s JOIN pg_class c ON c.oid = s.table_name "
                  "WHERE c.relnamespace = '%s'::regnamespace",
                  t_schema()) >= 6);
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM citus_get_active_worker_nodes() "
                        "WHERE node_port = %lld",
                        node_of(pg, t_schema())),
              1);
    /* Applied twice: nothing changes. */
    pqmq_client *q = t_client();
    long long tables = t_sql_int(pg, "SELECT count(*) FROM pg_dist_partition");
    CHECK_OK(q, pqmq_migrate(q));
    CHECK_INT(t_sql_int(pg, "SELECT max(version) FROM mq_schema_migrations"),
              pqmq_schema_version());
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM pg_dist_partition"), tables);
    pqmq_client_free(q);
    PQfinish(pg);
}

/* Two clients migrate one new schema at once: both succeed, one queue. */
static void *migrate_one(void *arg)
{
    pqmq_client *q = NULL;
    if (pqmq_connect(arg, &q) == 0 && pqmq_migrate(q) == 0) {
        pqmq_client_free(q);
        return (void *)1;
    }
    if (q)
        fprintf(stderr, "    pqmq_migrate: %s\n", pqmq_errmsg(q));
    pqmq_client_free(q);
    return NULL;
}

static void test_concurrent_migrations_make_one_queue(void)
{
    PGconn *pg = t_pg();
    char *schema = NULL;
    if (asprintf(&schema, "%s_twice", t_schema()) < 0)
        abort();
    char *ci = conninfo(schema, "");
    t_exec(pg, "DROP SCHEMA IF EXISTS %s CASCADE", schema);
    t_exec(pg, "CREATE SCHEMA %s", schema);
    pthread_t th[2];
    void *ok[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, migrate_one, ci);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], &ok[i]);
    CHECK(ok[0] && ok[1]);
    CHECK_INT(t_sql_int(pg, "SELECT max(version) FROM %s.mq_schema_migrations", schema),
              pqmq_schema_version());
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM %s.mq_schema_migrations", schema),
              t_sql_int(pg, "SELECT count(*) FROM mq_schema_migrations"));
    CHECK_INT(
        t_sql_int(pg, "SELECT count(*) FROM pg_dist_schema WHERE schemaid = '%s'::regnamespace",
                  schema),
        1);
    t_exec(pg, "DROP SCHEMA %s CASCADE", schema);
    free(schema);
    free(ci);
    PQfinish(pg);
}

/* ---- 2. every statement is a router query ------------------------------ */

/* With citus.multi_task_query_log_level = error, Citus refuses any query
 * that would run on more than one shard: each call below must run, every
 * statement in it on the queue's one worker (so FOR UPDATE SKIP LOCKED
 * means what it means on one server). */
static void test_every_statement_is_a_router_query(void)
{
    /* Citus refuses any query on more than one shard. */
    char *ci = conninfo(t_schema(), " -c citus.multi_task_query_log_level=error");
    pqmq_client *q = NULL;
    CHECK_INT(pqmq_connect(ci, &q), 0);
    free(ci);
    if (!q)
        return;
    pqmq_msg *m[4];
    for (int i = 0; i < 4; i++)
        m[i] = t_msg(i < 2 ? "r1" : "r2", i == 1 ? "x" : "", "job", "{}", i >= 2);
    pqmq_msg_set_retries(m[3], 0);
    CHECK_OK(q, pqmq_insert(q, m, 4));
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 3); /* the second of chain r2 waits */
    uuid_t id;
    pqmq_job_id(pqmq_batch_job(b, 0), id);
    CHECK_OK(q, pqmq_keep_alive(q, (const uuid_t *)&id, 1, 60000, NULL));
    CHECK_OK(q, pqmq_complete_batch(q, b));
    pqmq_batch_free(b);
    b = NULL;
    CHECK_OK(q, pqmq_poll(q, (const char *const[]){"r2"}, 1, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    if (pqmq_batch_count(b) == 1) {
        pqmq_job_id(pqmq_batch_job(b, 0), id);
        CHECK_OK(q, pqmq_fail(q, id, "no retries: dead"));
    }
    pqmq_batch_free(b);
    pqmq_batch *dead = NULL;
    CHECK_OK(q, pqmq_dead_letters(q, NULL, 0, 10, &dead));
    CHECK_INT(pqmq_batch_count(dead), 1);
    pqmq_batch_free(dead);
    size_t revived = 0;
    CHECK_OK(q, pqmq_retry(q, (const uuid_t *)&id, 1, 0, &revived));
    CHECK_INT(revived, 1);
    PGresult *r = PQexec(pqmq_conn(q), "SELECT count(*) FROM mq_metrics()");
    CHECK(PQresultStatus(r) == PGRES_TUPLES_OK);
    PQclear(r);
    t_msgs_free(m, 4);
    pqmq_client_free(q);
}

/* ---- 3. a worker stops while both queues are busy ----------------------- */

struct queue {
    const char *label;
    char *schema;
    char *conninfo;
    /* Producer: inserts ordered batches; acked[c] messages of chain c are
     * known to be in the queue. */
    atomic_int acked[CHAINS];
    atomic_int stop_producing;
    atomic_int insert_errors;
    atomic_llong longest_call_ms; /* the longest failed insert, while down */
    char last_error[256];
    pthread_mutex_t lock;
    /* Runner: what its handler saw, per chain. */
    unsigned char *seen[CHAINS];
    int last[CHAINS];
    atomic_int processed; /* first deliveries */
    atomic_int out_of_order;
    pqmq_runner *runner;
    pthread_t producer, running;
};

static int on_job(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)ctx;
    struct queue *Q = arg;
    int c = atoi(pqmq_job_args(job)), seq = atoi(pqmq_job_json(job));
    if (c < 0 || c >= CHAINS || seq < 0 || seq >= MAX_SEQ)
        return 0;
    pthread_mutex_lock(&Q->lock);
    /* A chain's messages come in order: the next one, or the last one
     * again (a delivery whose completion was lost with the worker). */
    if (seq != Q->last[c] + 1 && seq != Q->last[c])
        atomic_fetch_add(&Q->out_of_order, 1);
    if (seq > Q->last[c])
        Q->last[c] = seq;
    if (!Q->seen[c][seq]) {
        Q->seen[c][seq] = 1;
        atomic_fetch_add(&Q->processed, 1);
    }
    pthread_mutex_unlock(&Q->lock);
    return 0;
}

static void *produce(void *arg)
{
    struct queue *Q = arg;
    pqmq_client *q = NULL;
    if (pqmq_connect(Q->conninfo, &q) != 0)
        return NULL;
    int next[CHAINS] = {0};
    pqmq_msg *m[PER_BATCH];
    for (int round = 0; !atomic_load(&Q->stop_producing); round++) {
        int c = round % CHAINS;
        char args[16], json[16];
        snprintf(args, sizeof args, "%d", c);
        for (int i = 0; i < PER_BATCH; i++) {
            snprintf(json, sizeof json, "%d", next[c] + i);
            m[i] = t_msg("cit", args, "job", json, 1);
        }
        /* Until it is known in the queue: the same ids again (an insert
         * whose outcome was lost may have committed: then they are taken). */
        for (;;) {
            int64_t t0 = t_now_ms();
            int rc = pqmq_insert(q, m, PER_BATCH);
            int64_t took = t_now_ms() - t0;
            if (rc == 0 || (pqmq_sqlstate(q) && !strcmp(pqmq_sqlstate(q), "23505")))
                break;
            atomic_fetch_add(&Q->insert_errors, 1);
            if (took > atomic_load(&Q->longest_call_ms))
                atomic_store(&Q->longest_call_ms, took);
            pthread_mutex_lock(&Q->lock);
            snprintf(Q->last_error, sizeof Q->last_error, "%s", pqmq_errmsg(q));
            pthread_mutex_unlock(&Q->lock);
            if (rc == PQMQ_ECONN)
                (void)pqmq_reconnect(q);
            t_sleep_ms(100);
        }
        t_msgs_free(m, PER_BATCH);
        next[c] += PER_BATCH;
        atomic_store(&Q->acked[c], next[c]);
        t_sleep_ms(5);
    }
    pqmq_client_free(q);
    return NULL;
}

static void *run(void *arg)
{
    struct queue *Q = arg;
    (void)pqmq_runner_run(Q->runner);
    return NULL;
}

static void start(struct queue *Q, const char *label, char *schema)
{
    memset(Q, 0, sizeof *Q);
    Q->label = label;
    Q->schema = schema;
    pthread_mutex_init(&Q->lock, NULL);
    for (int c = 0; c < CHAINS; c++) {
        Q->seen[c] = calloc(MAX_SEQ, 1);
        Q->last[c] = -1;
    }
    Q->conninfo = conninfo(schema, "");
    Q->runner = pqmq_runner_new(Q->conninfo);
    CHECK(Q->runner != NULL);
    CHECK_INT(pqmq_runner_handle(Q->runner, NULL, on_job, Q), 0);
    CHECK_INT(pqmq_runner_set_concurrency(Q->runner, 4), 0);
    pthread_create(&Q->running, NULL, run, Q);
    pthread_create(&Q->producer, NULL, produce, Q);
}

static int all_processed(struct queue *Q)
{
    int want = 0;
    for (int c = 0; c < CHAINS; c++)
        want += atomic_load(&Q->acked[c]);
    return atomic_load(&Q->processed) >= want;
}

static void finish(struct queue *Q)
{
    /* Until all is handled, or nothing was for 30 s (a loaded machine
     * drains slowly; a lost message stalls for good). */
    int64_t stalled_since = t_now_ms();
    int last = atomic_load(&Q->processed);
    while (!all_processed(Q) && t_now_ms() - stalled_since < 30000) {
        t_sleep_ms(100);
        int now = atomic_load(&Q->processed);
        if (now != last) {
            last = now;
            stalled_since = t_now_ms();
        }
    }
    pqmq_runner_stop(Q->runner);
    pthread_join(Q->running, NULL);
    /* Every message known to be in the queue was handled, and in order. */
    for (int c = 0; c < CHAINS; c++) {
        int acked = atomic_load(&Q->acked[c]), missing = 0;
        for (int s = 0; s < acked; s++)
            missing += !Q->seen[c][s];
        if (missing)
            t_fail(__FILE__, __LINE__, "queue %s, chain %d: %d of %d messages never handled",
                   Q->label, c, missing, acked);
    }
    CHECK_INT(atomic_load(&Q->out_of_order), 0);
    printf(
        "    queue %s: %d messages handled, %d failed inserts while down (longest %lld ms)\n",
        Q->label, atomic_load(&Q->processed), atomic_load(&Q->insert_errors),
        (long long)atomic_load(&Q->longest_call_ms));
    pqmq_runner_free(Q->runner);
    for (int c = 0; c < CHAINS; c++)
        free(Q->seen[c]);
    free(Q->conninfo);
    pthread_mutex_destroy(&Q->lock);
}

static void test_a_worker_stops_while_both_queues_are_busy(void)
{
    const char *stop = getenv("PQMQ_CITUS_WORKER_STOP");
    const char *start_cmd = getenv("PQMQ_CITUS_WORKER_START");
    PGconn *pg = t_pg();
    pqmq_client *qb = NULL;
    char *schema_a = strdup(t_schema());
    char *schema_b = make_queue(pg, "b", &qb);
    /* A on worker 0 (the one that stops), B on the other. */
    place(pg, schema_a, worker_port, 1);
    place(pg, schema_b, worker_port, 0);
    CHECK_INT(node_of(pg, schema_a), atoll(worker_port));
    CHECK(node_of(pg, schema_b) != atoll(worker_port) && node_of(pg, schema_b) > 0);
    PQfinish(pg);

    static struct queue A, B;
    start(&A, "A", schema_a);
    start(&B, "B", schema_b);
    t_sleep_ms(1500);
    CHECK(atomic_load(&A.processed) > 0);
    CHECK(atomic_load(&B.processed) > 0);

    /* Worker 0 stops at once: B goes on. */
    CHECK_INT(system(stop), 0);
    t_sleep_ms(500); /* what was on its way when it stopped */
    int b_before = atomic_load(&B.processed), a_errors = atomic_load(&A.insert_errors);
    t_sleep_ms(3000);
    int b_during = atomic_load(&B.processed) - b_before;
    printf("    while worker 0 was down (3 s): queue B handled %d messages\n", b_during);
    CHECK(b_during > 0);
    /* A's producer fails, promptly and clearly: the message names the node. */
    CHECK(atomic_load(&A.insert_errors) > a_errors);
    CHECK(atomic_load(&A.longest_call_ms) < 10000);
    pthread_mutex_lock(&A.lock);
    printf("    queue A's producer was told: %s\n", A.last_error);
    CHECK(strstr(A.last_error, worker_port) != NULL);
    pthread_mutex_unlock(&A.lock);

    /* Back: everything it held is handled, in order. */
    CHECK_INT(system(start_cmd), 0);
    t_sleep_ms(2000);
    atomic_store(&A.stop_producing, 1);
    atomic_store(&B.stop_producing, 1);
    pthread_join(A.producer, NULL);
    pthread_join(B.producer, NULL);
    finish(&A);
    finish(&B);

    PGconn *pg2 = t_pg();
    t_exec(pg2, "DROP SCHEMA IF EXISTS %s CASCADE", schema_b);
    PQfinish(pg2);
    pqmq_client_free(qb);
    free(schema_a);
    free(schema_b);
}

int main(void)
{
    worker_port = getenv("PQMQ_CITUS_WORKER_PORT");
    if (!worker_port || !getenv("PQMQ_CITUS_WORKER_STOP") ||
        !getenv("PQMQ_CITUS_WORKER_START")) {
        printf("SKIP: not on the cluster of tests/citus/check.sh\n");
        return 77;
    }
    t_init("citus");
    T_RUN(test_a_queue_lives_on_one_worker);
    T_RUN(test_concurrent_migrations_make_one_queue);
    T_RUN(test_every_statement_is_a_router_query);
    T_RUN(test_a_worker_stops_while_both_queues_are_busy);
    return t_done();
}
