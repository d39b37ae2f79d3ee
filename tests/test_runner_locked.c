/*
 * test_runner_locked.c: the runner with the locked lane
 * (pqmq_runner_set_locked): each worker claims its own batch in a
 * transaction of its own, runs the handlers in it and commits the
 * successes' completions with their writes, one commit per batch; a failing
 * handler's writes are undone alone and its attempt counted; retries come
 * back through the lease lane; two runners never run a message twice.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

static pqmq_runner *new_runner(int threads, int batch)
{
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_set_locked(r, 1), 0);
    CHECK_INT(pqmq_runner_set_concurrency(r, threads), 0);
    CHECK_INT(pqmq_runner_set_batch(r, batch), 0);
    return r;
}

static uint64_t processed(pqmq_runner *r)
{
    return t_stats(r).processed;
}

/* A locked runner (threads, batch) running fn (with arg) on a thread of its
 * own until it has processed n jobs (waiting at most ms), then stopped.
 * Caller frees. */
static pqmq_runner *run_locked(int threads, int batch, pqmq_handler fn, void *arg, int n,
                               int64_t ms)
{
    pqmq_runner *r = new_runner(threads, batch);
    CHECK_INT(pqmq_runner_handle(r, NULL, fn, arg), 0);
    t_runner_process(r, n, ms);
    return r;
}

static void insert_n(int n, const char *json, int retries, int64_t backoff_ms)
{
    t_insert_spread(q, n, NULL, "job", json, 0, retries, backoff_ms);
}

/* The handler's effect: a ledger row (id primary key: a second effect of
 * a message is an error), with the attempt it saw. A payload with "fail"
 * fails its first attempt after writing. */
static int record(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)arg;
    PGconn *conn = pqmq_ctx_begin(ctx);
    if (!conn)
        return -1;
    uuid_t id;
    char text[37], attempt[16];
    pqmq_job_id(job, id);
    uuid_unparse_lower(id, text);
    snprintf(attempt, sizeof attempt, "%d", pqmq_job_attempt(job));
    const char *v[2] = {text, attempt};
    PGresult *r = PQexecParams(conn, "INSERT INTO rl_ledger (id, attempt) VALUES ($1, $2)", 2,
                               NULL, v, NULL, NULL, 0);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    if (!ok)
        return -1;
    if (strstr(pqmq_job_json(job), "fail") && pqmq_job_attempt(job) == 1) {
        pqmq_ctx_error(ctx, "first attempts fail");
        return -1;
    }
    return 0;
}

static void reset(void)
{
    t_truncate();
    t_exec(pg,
           "CREATE TABLE IF NOT EXISTS rl_ledger (id uuid PRIMARY KEY, attempt int NOT NULL,"
           " tx bigint NOT NULL DEFAULT txid_current())");
    t_exec(pg, "TRUNCATE rl_ledger");
}

/* Every message's effect once, committed with its completion in batches:
 * the ledger's rows share far fewer transactions (txid_current, the top
 * transaction's id even under a savepoint) than there are rows, where a
 * transaction per job would give one each. */
static void test_effects_commit_once_per_batch(void)
{
    reset();
    insert_n(400, "{\"x\": 1}", 3, 60000);
    pqmq_runner *r = run_locked(4, 100, record, NULL, 400, 30000);
    CHECK_INT(processed(r), 400);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rl_ledger"), 400);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rl_ledger WHERE attempt <> 1"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    long long txs = t_sql_int(pg, "SELECT count(DISTINCT tx) FROM rl_ledger");
    CHECK(txs >= 7 && txs <= 100); /* batches of at most 64 */
    pqmq_runner_free(r);
}

/* A failing handler's writes are undone alone (its savepoint), the others
 * of its batch commit, and its attempt is counted: the retry comes through
 * the lease lane and succeeds. */
static void test_a_failed_handler_is_undone_alone(void)
{
    reset();
    insert_n(30, "{\"x\": 1}", 3, 50);
    insert_n(10, "{\"fail\": 1}", 3, 50);
    pqmq_runner *r = run_locked(2, 40, record, NULL, 40, 30000);
    pqmq_runner_stats_t s;
    pqmq_runner_stats(r, &s);
    CHECK_INT(s.processed, 40);
    CHECK_INT(s.failed, 10);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rl_ledger"), 40);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rl_ledger WHERE attempt = 2"), 10);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    pqmq_runner_free(r);
}

/* Handlers that open no transaction complete too. */
static int plain(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)ctx, (void)job;
    atomic_fetch_add((atomic_int *)arg, 1);
    return 0;
}

static void test_plain_handlers_complete(void)
{
    reset();
    insert_n(50, "{\"x\": 1}", 3, 60000);
    atomic_int runs = 0;
    pqmq_runner *r = run_locked(3, 20, plain, &runs, 50, 30000);
    CHECK_INT(atomic_load(&runs), 50);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    pqmq_runner_free(r);
}

/* A message inserted while the workers are idle is picked up on its
 * notification: an idle worker polls again only after a minute. */
static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static void test_a_notification_wakes_the_workers(void)
{
    reset();
    atomic_int runs = 0;
    pqmq_runner *r = new_runner(2, 10);
    CHECK_INT(pqmq_runner_handle(r, NULL, plain, &runs), 0);
    t_bg b;
    t_runner_start(&b, r);
    enum { N = 5 };
    long long took[N];
    for (int i = 0; i < N; i++) {
        t_sleep_ms(300); /* idle: the workers' next poll is a minute away */
        uint64_t before = processed(r);
        int64_t t0 = t_now_ms();
        insert_n(1, "{\"x\": 1}", 3, 60000);
        WAIT_UNTIL(processed(r) > before, 10000);
        took[i] = t_now_ms() - t0;
    }
    t_runner_stop(&b);
    CHECK_INT(processed(r), N);
    qsort(took, N, sizeof *took, cmp_ll);
    printf("    picked up after a notification in %lld ms (median)\n", took[N / 2]);
    CHECK(took[N / 2] < 500);
    pqmq_runner_free(r);
}

/* A handler that counts itself in and holds its worker until go is set. */
typedef struct {
    atomic_int go, entered;
} hold_t;

static int held(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)ctx, (void)job;
    hold_t *h = arg;
    atomic_fetch_add(&h->entered, 1);
    while (!atomic_load(&h->go))
        t_sleep_ms(5);
    return 0;
}

static uint64_t polls(pqmq_runner *r)
{
    pqmq_runner_stats_t s;
    pqmq_runner_stats(r, &s);
    return s.polls;
}

/* While the workers are busy and first deliveries wait (theirs, not the
 * lease lane's), the loop's lease claims find nothing and each reads every
 * ready row of the channels it visits: they back off, 250 ms doubling up to
 * 4 s (in 3 s: at most 5 claims; every 250 ms, 12), and come back to 250 ms
 * once one finds something (the rolled-back delivery below). */
static void test_lease_claims_back_off_while_first_deliveries_wait(void)
{
    reset();
    insert_n(200, "{\"x\": 1}", 3, 60000);
    hold_t h = {0, 0};
    pqmq_runner *r = new_runner(1, 10);
    CHECK_INT(pqmq_runner_handle(r, NULL, held, &h), 0);
    t_bg b;
    t_runner_start(&b, r);
    WAIT_UNTIL(atomic_load(&h.entered) > 0, 30000);
    CHECK(atomic_load(&h.entered) > 0);
    uint64_t before = polls(r);
    t_sleep_ms(3000);
    uint64_t n = polls(r) - before;
    printf("    lease claims in 3 s with first deliveries waiting: %llu\n",
           (unsigned long long)n);
    CHECK(n <= 5);
    /* A delivery that died is still found (lease claims every 4 s at most). */
    pqmq_batch *b0 = NULL;
    CHECK_OK(q, pqmq_poll_locked(q, NULL, 0, 1, &b0));
    CHECK_INT(pqmq_batch_count(b0), 1);
    t_exec(pqmq_conn(q), "ROLLBACK");
    pqmq_batch_free(b0);
    int64_t t0 = t_now_ms();
    atomic_store(&h.go, 1);
    WAIT_UNTIL(processed(r) >= 200, 30000);
    t_runner_stop(&b);
    CHECK_INT(processed(r), 200);
    printf("    all 200 run %lld ms after the handlers were let go\n",
           (long long)(t_now_ms() - t0));
    pqmq_runner_free(r);
}

/* Messages whose locked delivery died (here: a consumer's transaction that
 * rolled back) are run by the runner through the lease lane. */
static void test_what_a_dead_delivery_left_is_run(void)
{
    reset();
    insert_n(5, "{\"x\": 1}", 3, 60000);
    pqmq_batch *b0 = NULL;
    CHECK_OK(q, pqmq_poll_locked(q, NULL, 0, 10, &b0));
    CHECK_INT(pqmq_batch_count(b0), 5);
    t_exec(pqmq_conn(q), "ROLLBACK");
    pqmq_batch_free(b0);
    pqmq_runner *r = run_locked(2, 10, record, NULL, 5, 10000);
    CHECK_INT(processed(r), 5);
    /* Leased: one delivery counted each. */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rl_ledger WHERE attempt = 1"), 5);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    pqmq_runner_free(r);
}

/* Two runners of 4 workers: every message's effect exactly once. */
static void test_two_runners_never_share_a_message(void)
{
    reset();
    insert_n(2000, "{\"x\": 1}", 3, 60000);
    pqmq_runner *r1 = new_runner(4, 40), *r2 = new_runner(4, 40);
    CHECK_INT(pqmq_runner_handle(r1, NULL, record, NULL), 0);
    CHECK_INT(pqmq_runner_handle(r2, NULL, record, NULL), 0);
    t_bg b1, b2;
    t_runner_start(&b1, r1);
    t_runner_start(&b2, r2);
    WAIT_UNTIL(processed(r1) + processed(r2) >= 2000, 60000);
    t_runner_stop(&b1);
    t_runner_stop(&b2);
    CHECK_INT(processed(r1) + processed(r2), 2000);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rl_ledger"), 2000);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    pqmq_runner_free(r1);
    pqmq_runner_free(r2);
}

int main(void)
{
    t_init("test_runner_locked");
    q = t_client();
    pg = t_pg();
    T_RUN(test_effects_commit_once_per_batch);
    T_RUN(test_a_failed_handler_is_undone_alone);
    T_RUN(test_plain_handlers_complete);
    T_RUN(test_a_notification_wakes_the_workers);
    T_RUN(test_what_a_dead_delivery_left_is_run);
    T_RUN(test_lease_claims_back_off_while_first_deliveries_wait);
    T_RUN(test_two_runners_never_share_a_message);
    PQfinish(pg);
    pqmq_client_free(q);
    return t_done();
}
