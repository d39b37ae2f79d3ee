/*
 * test_runner_group.c: group handlers (pqmq_runner_handle_group). With
 * commit batches a worker hands a group handler the queued jobs of its
 * name together, in one savepoint, so one statement writes the effects of
 * them all, and they commit with their completions; a group that fails is
 * undone whole and each of its jobs fails and is retried alone; a group
 * holds one name only; checkpoints need a group of one; without commit
 * batches a group is one job.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdatomic.h>
#include <stdlib.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

/* What the group handler saw: calls, jobs, the largest group, a group
 * with two names in it, checkpoint's answer in a group of several. */
static atomic_int calls, jobs_seen, largest, mixed, checkpoint_rc;

static void reset(void)
{
    t_truncate();
    atomic_store(&calls, 0);
    atomic_store(&jobs_seen, 0);
    atomic_store(&largest, 0);
    atomic_store(&mixed, 0);
    atomic_store(&checkpoint_rc, 1);
    t_exec(pg,
           "CREATE TABLE IF NOT EXISTS rg_ledger (id uuid PRIMARY KEY, attempt int NOT NULL,"
           " tx bigint NOT NULL DEFAULT txid_current())");
    t_exec(pg, "TRUNCATE rg_ledger");
}

/* n messages named name on five channels, retried after backoff_ms. */
static void insert_named(const char *name, int n, const char *json, int64_t backoff_ms)
{
    t_insert_spread(q, n, NULL, name, json, 0, 3, backoff_ms);
}

/* "{id,id,...}" and "{attempt,...}" of jobs[0..n), malloc'd. */
static void arrays_of(const pqmq_job *const *jobs, size_t n, char **ids, char **attempts)
{
    *ids = malloc(n * 38 + 3);
    *attempts = malloc(n * 12 + 3);
    size_t ni = 0, na = 0;
    for (size_t i = 0; i < n; i++) {
        uuid_t id;
        char text[37];
        pqmq_job_id(jobs[i], id);
        uuid_unparse_lower(id, text);
        ni += (size_t)sprintf(*ids + ni, "%s%s", i ? "," : "{", text);
        na += (size_t)sprintf(*attempts + na, "%s%d", i ? "," : "{", pqmq_job_attempt(jobs[i]));
    }
    strcpy(*ids + ni, "}");
    strcpy(*attempts + na, "}");
}

/* The ledger rows of jobs[0..n), in one statement; 1 if it succeeded. */
static int write_rows(pqmq_ctx *ctx, const pqmq_job *const *jobs, size_t n)
{
    char *ids, *attempts;
    arrays_of(jobs, n, &ids, &attempts);
    const char *v[2] = {ids, attempts};
    PGresult *r = pqmq_ctx_exec_params(ctx,
                                       "INSERT INTO rg_ledger (id, attempt)"
                                       " SELECT * FROM unnest($1::uuid[], $2::int[])",
                                       2, v);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    free(ids);
    free(attempts);
    return ok;
}

/* Has the test's client take job over as another consumer would: delivered
 * again (its lease ran out) and completed by its new owner, in statements
 * that never leave it ready, or the runner's own next claim could take it
 * first (q is the test thread's, which only waits meanwhile). */
static void steal(const pqmq_job *job)
{
    uuid_t id;
    char text[37];
    pqmq_job_id(job, id);
    uuid_unparse_lower(id, text);
    t_exec(pqmq_conn(q), "UPDATE mq_msgs SET deliveries = deliveries + 1 WHERE id = '%s'",
           text);
    CHECK_OK(q, pqmq_complete(q, (const uuid_t *)&id, 1));
}

static atomic_int stolen;

/* Writes every job's ledger row in one statement; a group holding a "fail"
 * job on its first attempt fails after writing; a "steal" job is taken
 * over by another consumer, once, while its group runs. */
static int record_group(pqmq_ctx *ctx, const pqmq_job *const *jobs, size_t n, void *arg)
{
    (void)arg;
    atomic_fetch_add(&calls, 1);
    atomic_fetch_add(&jobs_seen, (int)n);
    int seen = atomic_load(&largest);
    while ((int)n > seen && !atomic_compare_exchange_weak(&largest, &seen, (int)n))
        ;
    int fail = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(pqmq_job_name(jobs[i]), pqmq_job_name(jobs[0])) != 0)
            atomic_store(&mixed, 1);
        fail |= strstr(pqmq_job_json(jobs[i]), "fail") && pqmq_job_attempt(jobs[i]) == 1;
    }
    if (n > 1)
        atomic_store(&checkpoint_rc, pqmq_ctx_checkpoint(ctx, "{}", NULL, 0, 0));
    int ok = write_rows(ctx, jobs, n);
    for (size_t i = 0; i < n; i++)
        if (strstr(pqmq_job_json(jobs[i]), "steal") && !atomic_exchange(&stolen, 1))
            steal(jobs[i]);
    if (ok && fail)
        pqmq_ctx_error(ctx, "a first attempt of its group fails");
    return ok && !fail ? 0 : -1;
}

static atomic_int others;

/* The handler of the other name: its own effect, one job at a time. */
static int record_one(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)arg;
    atomic_fetch_add(&others, 1);
    const pqmq_job *one[1] = {job};
    int ok = write_rows(ctx, one, 1);
    return ok ? 0 : -1;
}

/* Runs a runner of threads workers (commit batches of jobs jobs; -1: none)
 * until n jobs are processed; returns its stats. */
static pqmq_runner_stats_t run_all(int threads, int jobs, uint64_t n)
{
    pqmq_runner *r = t_runner();
    CHECK_INT(pqmq_runner_set_concurrency(r, threads), 0);
    if (jobs >= 0)
        CHECK_INT(pqmq_runner_set_commit_batch(r, jobs, 0), 0);
    CHECK_INT(pqmq_runner_handle_group(r, "job", record_group, NULL), 0);
    CHECK_INT(pqmq_runner_handle(r, "other", record_one, NULL), 0);
    t_runner_process(r, n, 30000);
    pqmq_runner_stats_t s = t_stats(r);
    pqmq_runner_free(r);
    return s;
}

/* 600 jobs reach the group handler in groups (far fewer calls than jobs,
 * up to the claim size of 100, past max_jobs); every effect commits once;
 * checkpoint refuses a group of several. */
static void test_a_group_writes_its_jobs_in_one_statement(void)
{
    reset();
    insert_named("job", 600, "{\"x\": 1}", 60000);
    pqmq_runner_stats_t s = run_all(2, 0, 600);
    CHECK_INT(s.processed, 600);
    CHECK_INT(s.failed, 0);
    CHECK_INT(atomic_load(&jobs_seen), 600);
    printf("    600 jobs in %d calls, the largest group %d\n", atomic_load(&calls),
           atomic_load(&largest));
    CHECK(atomic_load(&calls) <= 60);
    /* Up to the claim size (100), past max_jobs (64): one savepoint. */
    CHECK(atomic_load(&largest) > 64 && atomic_load(&largest) <= 100);
    CHECK_INT(atomic_load(&checkpoint_rc), PQMQ_EINVAL);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rg_ledger WHERE attempt = 1"), 600);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    CHECK(t_sql_int(pg, "SELECT count(DISTINCT tx) FROM rg_ledger") <= 60);
}

/* A group whose handler fails is undone whole: none of its first attempts
 * left an effect, each of its jobs failed (the failure recorded) and ran
 * again, and the other groups' effects committed once. */
static void test_a_failing_group_is_undone_whole(void)
{
    reset();
    insert_named("job", 150, "{\"x\": 1}", 500);
    insert_named("job", 1, "{\"fail\": 1}", 500);
    insert_named("job", 149, "{\"x\": 1}", 500);
    pqmq_runner_stats_t s = run_all(1, 0, 300);
    CHECK_INT(s.processed, 300);
    CHECK(s.failed >= 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rg_ledger"), 300);
    /* The group that failed is what ran a second time, all of it. */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rg_ledger WHERE attempt = 2"),
              (long)s.failed);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rg_ledger r JOIN mq_msgs m USING (id)"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
}

/* A group holding a job that another consumer took over and completed
 * cannot commit: the fence rolls its batch back, the others run again, and
 * no effect of the stolen job is written; each other effect once. */
static void test_a_stale_job_rolls_its_group_back(void)
{
    reset();
    atomic_store(&stolen, 0);
    insert_named("job", 10, "{\"x\": 1}", 60000);
    t_insert_spread(q, 1, "steal", "job", "{\"steal\": 1}", 0, 3, 60000);
    insert_named("job", 10, "{\"x\": 1}", 60000);
    pqmq_runner_stats_t s = run_all(1, 0, 20);
    CHECK_INT(atomic_load(&stolen), 1);
    CHECK_INT(s.processed, 20);
    CHECK_INT(s.failed, 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rg_ledger"), 20);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rg_ledger WHERE attempt = 1"), 20);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
}

/* Jobs of another name go to their own handler, never into a group. */
static void test_a_group_holds_one_name(void)
{
    reset();
    atomic_store(&others, 0);
    for (int i = 0; i < 4; i++) {
        insert_named("job", 50, "{\"x\": 1}", 60000);
        insert_named("other", 25, "{\"x\": 1}", 60000);
    }
    pqmq_runner_stats_t s = run_all(2, 0, 300);
    CHECK_INT(s.processed, 300);
    CHECK_INT(atomic_load(&mixed), 0);
    CHECK_INT(atomic_load(&jobs_seen), 200);
    CHECK_INT(atomic_load(&others), 100);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM rg_ledger"), 300);
}

/* Without commit batches a group is one job, in a transaction of its own. */
static void test_without_commit_batches_a_group_is_one_job(void)
{
    reset();
    insert_named("job", 40, "{\"x\": 1}", 60000);
    pqmq_runner_stats_t s = run_all(2, -1, 40);
    CHECK_INT(s.processed, 40);
    CHECK_INT(atomic_load(&largest), 1);
    CHECK_INT(atomic_load(&calls), 40);
    CHECK_INT(t_sql_int(pg, "SELECT count(DISTINCT tx) FROM rg_ledger"), 40);
}

static void test_bad_arguments_are_refused(void)
{
    pqmq_runner *r = pqmq_runner_new("dbname=unused");
    CHECK(r != NULL);
    CHECK_INT(pqmq_runner_handle_group(NULL, "job", record_group, NULL), PQMQ_EINVAL);
    CHECK_INT(pqmq_runner_handle_group(r, "job", NULL, NULL), PQMQ_EINVAL);
    pqmq_runner_free(r);
}

int main(void)
{
    t_init("test_runner_group");
    q = t_client();
    pg = t_pg();
    T_RUN(test_bad_arguments_are_refused);
    T_RUN(test_a_group_writes_its_jobs_in_one_statement);
    T_RUN(test_a_failing_group_is_undone_whole);
    T_RUN(test_a_stale_job_rolls_its_group_back);
    T_RUN(test_a_group_holds_one_name);
    T_RUN(test_without_commit_batches_a_group_is_one_job);
    PQfinish(pg);
    pqmq_client_free(q);
    return t_done();
}
