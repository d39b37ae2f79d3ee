/*
 * test_runner_commit.c: the runner's commit batches
 * (pqmq_runner_set_commit_batch): the jobs whose handlers open the job's
 * transaction share one per worker, each in a savepoint, and their effects
 * and completions commit together; a failing handler's writes are undone
 * alone; a batch holding a job that is no longer the runner's, broken by a
 * handler, or cut off with its connection, commits nothing and runs again;
 * a stop commits the batch in hand; leases of a batch's jobs are kept
 * alive; the settings are checked. Handlers that write with
 * pqmq_ctx_exec_params (the savepoint pipelined with their first
 * statement) keep the same guarantees, a failing first statement included.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdatomic.h>
#include <stdlib.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

/* A runner with commit batches of at most jobs (0: the default). */
static pqmq_runner *new_runner(int threads, int jobs)
{
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_set_commit_batch(r, jobs, 0), 0);
    CHECK_INT(pqmq_runner_set_concurrency(r, threads), 0);
    return r;
}

static uint64_t processed(pqmq_runner *r)
{
    return t_stats(r).processed;
}

/* n messages on channel (NULL: five channels), ordered on one chain if
 * ordered, with this payload, retries and backoff. */
static void insert_on(const char *channel, int n, const char *json, int ordered,
                      int64_t backoff_ms)
{
    t_insert_spread(q, n, channel, "job", json, ordered, 3, backoff_ms);
}

static void insert_n(int n, const char *json, int64_t backoff_ms)
{
    insert_on(NULL, n, json, 0, backoff_ms);
}

/* The effect of a message: a ledger row (id primary key: a second effect
 * of a message is an error) with the attempt it saw, its transaction and
 * a sequence number (the order effects were written in). */
typedef struct {
    char id[37], attempt[16];
    const char *v[3]; /* $1 id, $2 attempt, $3 the payload */
} effect_params;

static void effect_params_of(const pqmq_job *job, effect_params *p)
{
    uuid_t id;
    pqmq_job_id(job, id);
    uuid_unparse_lower(id, p->id);
    snprintf(p->attempt, sizeof p->attempt, "%d", pqmq_job_attempt(job));
    p->v[0] = p->id;
    p->v[1] = p->attempt;
    p->v[2] = pqmq_job_json(job);
}

static int write_effect(PGconn *conn, const pqmq_job *job)
{
    effect_params p;
    effect_params_of(job, &p);
    const char *const *v = p.v;
    PGresult *r = PQexecParams(conn,
                               "INSERT INTO rc_ledger (id, attempt, seq)"
                               " VALUES ($1, $2, ($3::jsonb ->> 'seq')::int)",
                               3, NULL, v, NULL, NULL, 0);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    return ok ? 0 : -1;
}

/* What the handlers do besides their effect, by payload:
 *   "fail"   fails its first attempt after writing its effect;
 *   "break"  on its first attempt, runs a failing statement outside the
 *            job's savepoint (breaking the batch's transaction);
 *   "steal"  once, has the test's client take the message over (delivered
 *            again and completed), as another consumer would;
 *   "hold"   once, waits until the test lets it go (hold_t);
 *   "kill"   once, has its backend terminated from another connection. */
typedef struct {
    atomic_int entered, go, stolen, killed, broke;
} hold_t;

static hold_t hold;

static void steal(const pqmq_job *job)
{
    uuid_t id;
    char text[37];
    pqmq_job_id(job, id);
    uuid_unparse_lower(id, text);
    /* Delivered again (its lease ran out) and completed by its new owner,
     * in statements that never leave it ready: the runner's own next claim
     * would take it first. q is the test thread's, which only waits. */
    t_exec(pqmq_conn(q), "UPDATE mq_msgs SET deliveries = deliveries + 1 WHERE id = '%s'",
           text);
    CHECK_OK(q, pqmq_complete(q, (const uuid_t *)&id, 1));
}

static void kill_backend(PGconn *conn)
{
    PGconn *other = t_pg();
    t_exec(other, "SELECT pg_terminate_backend(%d)", PQbackendPID(conn));
    PQfinish(other);
}

/* Handlers write their effect with pqmq_ctx_exec_params (set: the job's
 * transaction or savepoint opens in the same round trip) rather than
 * pqmq_ctx_begin and PQexecParams; calls counts the handlers run. */
static atomic_int piped, calls;

/* write_effect through pqmq_ctx_exec_params, the job's first statement;
 * "badfirst" makes that statement fail on the first attempt. */
static int write_effect_piped(pqmq_ctx *ctx, const pqmq_job *job)
{
    effect_params p;
    effect_params_of(job, &p);
    const char *const *v = p.v;
    int bad = strstr(pqmq_job_json(job), "badfirst") && pqmq_job_attempt(job) == 1;
    PGresult *r = pqmq_ctx_exec_params(ctx,
                                       bad ? "INSERT INTO rc_ledger (id, attempt, seq)"
                                             " VALUES ($1, $2, 1 / (length($3) * 0))"
                                           : "INSERT INTO rc_ledger (id, attempt, seq)"
                                             " VALUES ($1, $2, ($3::jsonb ->> 'seq')::int)",
                                       3, v);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    return ok ? 0 : -1;
}

static int record(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)arg;
    const char *json = pqmq_job_json(job);
    int first = pqmq_job_attempt(job) == 1;
    atomic_fetch_add(&calls, 1);
    if (strstr(json, "break") && first) {
        /* Outside the job's savepoint: the batch's transaction fails. */
        PGconn *conn = pqmq_ctx_conn(ctx);
        if (PQtransactionStatus(conn) == PQTRANS_INTRANS)
            atomic_store(&hold.broke, 1);
        PQclear(PQexec(conn, "SELECT 1/0"));
        return -1;
    }
    if (atomic_load(&piped) && write_effect_piped(ctx, job) != 0)
        return -1;
    PGconn *conn = pqmq_ctx_begin(ctx); /* piped: the transaction is open already */
    if (!conn || (!atomic_load(&piped) && write_effect(conn, job) != 0))
        return -1;
    if (strstr(json, "fail") && first) {
        pqmq_ctx_error(ctx, "first attempts fail");
        return -1;
    }
    if (strstr(json, "steal") && !atomic_exchange(&hold.stolen, 1))
        steal(job);
    if (strstr(json, "kill") && !atomic_exchange(&hold.killed, 1))
        kill_backend(conn);
    if (strstr(json, "hold") && !atomic_exchange(&hold.entered, 1))
        while (!atomic_load(&hold.go))
            t_sleep_ms(5);
    if (strstr(json, "slow"))
        t_sleep_ms(3000); /* three leases */
    return 0;
}

static void reset(void)
{
    t_truncate();
    memset(&hold, 0, sizeof hold);
    atomic_store(&calls, 0);
    t_exec(pg,
           "CREATE TABLE IF NOT EXISTS rc_ledger (id uuid PRIMARY KEY, attempt int NOT NULL,"
           " seq int, tx bigint NOT NULL DEFAULT txid_current(), n bigserial)");
    t_exec(pg, "TRUNCATE rc_ledger");
}

/* Runs n messages' handlers on a runner of threads workers with batches of
 * at most jobs; returns its stats. */
static pqmq_runner_stats_t run_all(int threads, int jobs, uint64_t n)
{
    pqmq_runner *r = new_runner(threads, jobs);
    CHECK_INT(pqmq_runner_handle(r, NULL, record, NULL), 0);
    t_runner_process(r, n, 30000);
    pqmq_runner_stats_t s = t_stats(r);
    pqmq_runner_free(r);
    return s;
}

/* Every effect commits in the transaction that completed its message
 * (triggers note the completing transaction), and a transaction carries a
 * batch: far fewer transactions than messages, none over the limit. */
static void test_effects_and_completions_commit_together(void)
{
    reset();
    int triggered = !t_citus_skip("triggers of the test's own on mq_rows and mq_done");
    if (triggered) {
        t_exec(pg, "CREATE TABLE IF NOT EXISTS rc_deleted (id uuid PRIMARY KEY, tx bigint)");
        t_exec(pg, "TRUNCATE rc_deleted");
        t_exec(pg, "CREATE OR REPLACE FUNCTION rc_note() RETURNS trigger LANGUAGE plpgsql AS"
                   " $$BEGIN INSERT INTO rc_deleted VALUES (OLD.id, txid_current());"
                   " RETURN OLD; END$$");
        t_exec(pg, "CREATE TRIGGER rc_note AFTER DELETE ON mq_rows"
                   " FOR EACH ROW EXECUTE FUNCTION rc_note()");
        /* A logged message's completion is an mq_done row naming its place. */
        t_exec(pg,
               "CREATE OR REPLACE FUNCTION rc_note_done() RETURNS trigger LANGUAGE plpgsql"
               " AS $$BEGIN INSERT INTO rc_deleted SELECT l.id, txid_current() FROM mq_log l"
               " WHERE l.channel_key = NEW.channel_key AND l.place = ANY (NEW.places);"
               " RETURN NEW; END$$");
        t_exec(pg, "CREATE TRIGGER rc_note_done AFTER INSERT ON mq_done"
                   " FOR EACH ROW EXECUTE FUNCTION rc_note_done()");
    }
    insert_n(400, "{\"x\": 1}", 60000);
    pqmq_runner_stats_t s = run_all(4, 16, 400);
    if (triggered) {
        t_exec(pg, "DROP TRIGGER rc_note ON mq_rows");
        t_exec(pg, "DROP TRIGGER rc_note_done ON mq_done");
    }
    CHECK_INT(s.processed, 400);
    CHECK_INT(s.failed, 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rc_ledger WHERE attempt = 1"), 400);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    if (triggered)
        CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rc_ledger l JOIN rc_deleted d"
                                " ON d.id = l.id AND d.tx = l.tx"),
                  400);
    long long txs = t_sql_int(pg, "SELECT count(DISTINCT tx) FROM rc_ledger");
    printf("    400 effects in %lld transactions\n", txs);
    CHECK(txs >= 25 && txs < 200);
    CHECK(t_sql_int(pg, "SELECT max(n) FROM (SELECT count(*) AS n FROM rc_ledger"
                        " GROUP BY tx) t") <= 16);
}

/* max_jobs 1: each job commits alone, as without commit batches. */
static void test_one_job_a_batch_commits_each_alone(void)
{
    reset();
    insert_n(40, "{\"x\": 1}", 60000);
    pqmq_runner_stats_t s = run_all(2, 1, 40);
    CHECK_INT(s.processed, 40);
    CHECK_INT(t_sql_int(pg, "SELECT count(DISTINCT tx) FROM rc_ledger"), 40);
}

/* A failing handler's writes are undone (its savepoint) while the others
 * of its batch commit: no first attempt of a failing message left an
 * effect, the others' first attempts share transactions; its failure is
 * recorded and its retry succeeds. */
static void test_a_failed_handler_is_undone_alone(void)
{
    reset();
    for (int i = 0; i < 10; i++) {
        insert_n(3, "{\"x\": 1}", 1000);
        insert_n(1, "{\"fail\": 1}", 1000);
    }
    pqmq_runner_stats_t s = run_all(1, 0, 40);
    CHECK_INT(s.processed, 40);
    CHECK_INT(s.failed, 10);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rc_ledger"), 40);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rc_ledger WHERE attempt = 2"), 10);
    CHECK(t_sql_int(pg, "SELECT count(DISTINCT tx) FROM rc_ledger WHERE attempt = 1") < 30);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
}

/* A handler that breaks the batch's transaction outside its savepoint:
 * nothing of the batch commits; its batch-mates are handed back and run
 * again (attempt 1 still: the release gives the attempt back), it fails.
 * (One channel: a poll returns its messages in insertion order, so a
 * batch is open when the breaking one runs.) */
static void test_a_broken_batch_runs_again(void)
{
    reset();
    insert_on("b", 10, "{\"x\": 1}", 0, 1000);
    insert_on("b", 1, "{\"break\": 1}", 0, 1000);
    insert_on("b", 10, "{\"x\": 1}", 0, 1000);
    pqmq_runner_stats_t s = run_all(1, 0, 21);
    CHECK_INT(atomic_load(&hold.broke), 1);
    CHECK_INT(s.processed, 21);
    CHECK_INT(s.failed, 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rc_ledger WHERE attempt = 1"), 20);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rc_ledger WHERE attempt = 2"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
}

/* The fence: a job of the batch that another consumer took over (its lease
 * had run out) makes the completion fail, so the whole batch rolls back,
 * its effect included; the others run again and commit. */
static void test_a_stale_job_rolls_its_batch_back(void)
{
    reset();
    insert_n(5, "{\"x\": 1}", 60000);
    insert_on("steal", 1, "{\"steal\": 1}", 0, 60000);
    insert_n(5, "{\"x\": 1}", 60000);
    pqmq_runner_stats_t s = run_all(1, 0, 10);
    CHECK_INT(atomic_load(&hold.stolen), 1);
    CHECK_INT(s.processed, 10);
    CHECK_INT(s.failed, 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rc_ledger"), 10);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rc_ledger l JOIN mq_msgs m ON m.id = l.id"),
              0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
}

/* A worker whose connection is cut mid-batch: the server rolled the batch
 * back; its jobs run again, each effect once. */
static void test_a_lost_connection_runs_the_batch_again(void)
{
    reset();
    insert_n(10, "{\"x\": 1}", 60000);
    insert_n(1, "{\"kill\": 1}", 60000);
    insert_n(10, "{\"x\": 1}", 60000);
    pqmq_runner_stats_t s = run_all(1, 0, 21);
    CHECK_INT(atomic_load(&hold.killed), 1);
    CHECK_INT(s.processed, 21);
    CHECK(s.reconnects >= 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rc_ledger"), 21);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
}

/* A stop while a handler runs: the batch in hand commits (its jobs' effects
 * and completions: none was visible before), the jobs not started are
 * handed back, ready at once. */
static void test_a_stop_commits_the_batch_in_hand(void)
{
    reset();
    insert_on("a", 3, "{\"x\": 1}", 0, 60000);
    insert_on("a", 1, "{\"hold\": 1}", 0, 60000);
    insert_on("a", 16, "{\"x\": 1}", 0, 60000);
    insert_n(20, "{\"x\": 1}", 60000);
    pqmq_runner *r = new_runner(1, 0);
    CHECK_INT(pqmq_runner_handle(r, NULL, record, NULL), 0);
    t_bg b;
    t_runner_start(&b, r);
    WAIT_UNTIL(atomic_load(&hold.entered), 30000);
    CHECK_INT(atomic_load(&hold.entered), 1);
    long long before = t_sql_int(pg, "SELECT count(*) FROM rc_ledger");
    pqmq_runner_stop(r);
    t_sleep_ms(100);
    atomic_store(&hold.go, 1);
    t_runner_stop(&b);
    long long done = (long long)processed(r);
    printf("    %lld effects visible while the batch was open, %lld committed at the stop\n",
           before, done);
    CHECK(done > before); /* the held job's batch committed at the stop */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rc_ledger l JOIN mq_msgs m ON m.id = l.id"),
              0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rc_ledger"), done);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 40 - done);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE attempt_at > now()"), 0);
    pqmq_runner_free(r);
}

/* A slow handler in a batch: the leases of its batch-mates (shorter than
 * it runs) are kept alive, so another consumer takes none of them and the
 * batch commits. */
static void test_leases_of_a_batch_are_kept_alive(void)
{
    reset();
    insert_on("k", 4, "{\"x\": 1}", 0, 1000);
    insert_on("k", 1, "{\"slow\": 1}", 0, 1000);
    pqmq_runner *r = new_runner(1, 0);
    CHECK_INT(pqmq_runner_handle(r, NULL, record, NULL), 0);
    t_bg b;
    t_runner_start(&b, r);
    WAIT_UNTIL(t_stats(r).in_flight == 5, 10000);
    int taken = 0;
    for (int64_t end = t_now_ms() + 2500; t_now_ms() < end && processed(r) < 5;) {
        pqmq_batch *got = NULL;
        CHECK_OK(q, pqmq_poll(q, (const char *[]){"k"}, 1, 10, &got));
        taken += (int)pqmq_batch_count(got);
        pqmq_batch_free(got);
        t_sleep_ms(50);
    }
    WAIT_UNTIL(processed(r) >= 5, 10000);
    t_runner_stop(&b);
    CHECK_INT(taken, 0);
    CHECK_INT(processed(r), 5);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rc_ledger WHERE attempt = 1"), 5);
    pqmq_runner_free(r);
}

/* A chain's next message is ready only once its predecessor's batch
 * committed: effects in chain order, each once. */
static void test_chains_keep_their_order(void)
{
    reset();
    for (int i = 0; i < 30; i++) {
        char json[32];
        snprintf(json, sizeof json, "{\"seq\": %d}", i);
        insert_on("o", 1, json, 1, 60000);
    }
    insert_n(60, "{\"x\": 1}", 60000); /* batch-mates */
    pqmq_runner_stats_t s = run_all(3, 0, 90);
    CHECK_INT(s.processed, 90);
    /* the order effects were written in (n) follows the chain's (seq) */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM (SELECT n, lag(n) OVER (ORDER BY seq) AS p"
                            " FROM rc_ledger WHERE seq IS NOT NULL) t WHERE p > n"),
              0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rc_ledger WHERE seq IS NOT NULL"), 30);
}

/* pqmq_ctx_exec_params sends the job's SAVEPOINT (or BEGIN and SAVEPOINT)
 * with its statement. A first statement that fails is undone alone: its
 * batch-mates, before and after it in the batch, commit and run once each
 * (a batch broken by the failure would run them again), it fails and its
 * retry succeeds. */
static void test_a_failing_first_statement_is_undone_alone(void)
{
    reset();
    atomic_store(&piped, 1);
    for (int i = 0; i < 10; i++) {
        insert_on("p", 3, "{\"x\": 1}", 0, 1000);
        insert_on("p", 1, "{\"badfirst\": 1}", 0, 1000);
    }
    pqmq_runner_stats_t s = run_all(1, 0, 40);
    atomic_store(&piped, 0);
    CHECK_INT(s.processed, 40);
    CHECK_INT(s.failed, 10);
    CHECK_INT(atomic_load(&calls), 50);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rc_ledger WHERE attempt = 1"), 30);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rc_ledger WHERE attempt = 2"), 10);
    CHECK(t_sql_int(pg, "SELECT count(DISTINCT tx) FROM rc_ledger WHERE attempt = 1") < 30);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
}

/* The guarantees of the tests above, with the effect written through
 * pqmq_ctx_exec_params: a handler failing after its write, the fence, a
 * lost connection, and without batches a transaction per job. */
static void test_piped_effects_keep_the_guarantees(void)
{
    atomic_store(&piped, 1);
    test_one_job_a_batch_commits_each_alone();
    test_a_failed_handler_is_undone_alone();
    test_a_stale_job_rolls_its_batch_back();
    test_a_lost_connection_runs_the_batch_again();
    atomic_store(&piped, 0);
}

/* Bad settings are refused, naming the value and its range. */
static void test_settings_are_checked(void)
{
    pqmq_runner *r = pqmq_runner_new("dbname=unused");
    CHECK(r != NULL);
    CHECK_INT(pqmq_runner_set_commit_batch(NULL, 0, 0), PQMQ_EINVAL);
    struct {
        int jobs;
        int64_t ms;
        const char *says;
    } bad[] = {{-1, 0, "max_jobs -1 is outside 0..64"},
               {65, 0, "max_jobs 65 is outside 0..64"},
               {0, -1, "max_open_ms -1 is outside 0..60000"},
               {64, 60001, "max_open_ms 60001 is outside 0..60000"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_INT(pqmq_runner_set_commit_batch(r, bad[i].jobs, bad[i].ms), PQMQ_EINVAL);
        if (!strstr(pqmq_runner_errmsg(r), bad[i].says))
            t_fail(__FILE__, __LINE__, "errmsg \"%s\" lacks \"%s\"", pqmq_runner_errmsg(r),
                   bad[i].says);
    }
    CHECK_INT(pqmq_runner_set_commit_batch(r, 64, 60000), 0);
    CHECK_INT(pqmq_runner_set_commit_batch(r, 1, 1), 0);
    CHECK_INT(pqmq_runner_set_commit_batch(r, 0, 0), 0);
    pqmq_runner_free(r);
}

int main(void)
{
    t_init("test_runner_commit");
    q = t_client();
    pg = t_pg();
    T_RUN(test_settings_are_checked);
    T_RUN(test_effects_and_completions_commit_together);
    T_RUN(test_one_job_a_batch_commits_each_alone);
    T_RUN(test_a_failed_handler_is_undone_alone);
    T_RUN(test_a_broken_batch_runs_again);
    T_RUN(test_a_stale_job_rolls_its_batch_back);
    T_RUN(test_a_lost_connection_runs_the_batch_again);
    T_RUN(test_a_stop_commits_the_batch_in_hand);
    T_RUN(test_leases_of_a_batch_are_kept_alive);
    T_RUN(test_chains_keep_their_order);
    T_RUN(test_a_failing_first_statement_is_undone_alone);
    T_RUN(test_piped_effects_keep_the_guarantees);
    PQfinish(pg);
    pqmq_client_free(q);
    return t_done();
}
