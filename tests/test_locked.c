/*
 * test_locked.c: the locked lane (pqmq_poll_locked, mq_claim_locked). Its
 * jobs are held by the consumer's transaction and nothing is written for
 * them: a completion commits with the consumer's writes, a rollback or a
 * crash makes them ready again at once, a message whose locked delivery died
 * goes to the lease lane (where its attempts are counted), and a poison
 * message that kills its consumer every time still ends dead.
 */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

static void insert_n(pqmq_client *c, const char *ch, int n, int retries, int64_t backoff_ms)
{
    pqmq_msg *msgs[100];
    for (int i = 0; i < n; i++) {
        char json[32];
        snprintf(json, sizeof json, "{\"i\": %d}", i);
        msgs[i] = t_msg(ch, NULL, "job", json, 0);
        pqmq_msg_set_retries(msgs[i], retries);
        pqmq_msg_set_backoff(msgs[i], backoff_ms);
    }
    CHECK_OK(c, pqmq_insert(c, msgs, (size_t)n));
    t_msgs_free(msgs, (size_t)n);
}

static pqmq_batch *poll_locked(pqmq_client *c, const char *ch, int max)
{
    pqmq_batch *b = NULL;
    const char *chans[1] = {ch};
    CHECK_OK(c, pqmq_poll_locked(c, ch ? chans : NULL, ch ? 1 : 0, max, &b));
    return b;
}

static pqmq_batch *poll_leased(pqmq_client *c, const char *ch, int max)
{
    pqmq_batch *b = NULL;
    const char *chans[1] = {ch};
    CHECK_OK(c, pqmq_poll(c, ch ? chans : NULL, ch ? 1 : 0, max, &b));
    return b;
}

/* With no transaction open it opens one; a failed one is refused. */
static void test_opens_a_transaction_when_none_is_open(void)
{
    t_truncate();
    insert_n(q, "lk", 2, 3, 1000);
    PGconn *conn = pqmq_conn(q);
    pqmq_batch *b = poll_locked(q, "lk", 1);
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK(PQtransactionStatus(conn) == PQTRANS_INTRANS);
    CHECK_OK(q, pqmq_complete_commit(q, b));
    CHECK(PQtransactionStatus(conn) == PQTRANS_IDLE);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 1);
    pqmq_batch_free(b);

    t_exec(conn, "BEGIN");
    PQclear(PQexec(conn, "SELECT 1/0"));
    b = (pqmq_batch *)1;
    CHECK_ERR(q, pqmq_poll_locked(q, NULL, 0, 10, &b), PQMQ_EINVAL, "ROLLBACK first");
    CHECK(b == NULL);
    t_exec(conn, "ROLLBACK");
    CHECK_INT(t_sql_int(pg, "SELECT deliveries FROM mq_msgs"), 0);
    CHECK_ERR(q, pqmq_complete_commit(q, NULL), PQMQ_EINVAL, "no transaction");
}

/* pqmq_complete_commit commits all or nothing: a job that went to another
 * consumer rolls back the consumer's writes with it. */
static void test_complete_commit_is_all_or_nothing(void)
{
    t_truncate();
    t_exec(pg, "CREATE TABLE IF NOT EXISTS lk_results (msg text PRIMARY KEY)");
    t_exec(pg, "TRUNCATE lk_results");
    insert_n(q, "lk", 2, 3, 100); /* leases of 100 ms */
    pqmq_batch *b = poll_leased(q, "lk", 10);
    CHECK_INT(pqmq_batch_count(b), 2);
    t_sleep_ms(150);
    pqmq_client *other = t_client();
    pqmq_batch *again = poll_leased(other, "lk", 1); /* one of them, redelivered */
    CHECK_INT(pqmq_batch_count(again), 1);
    PGconn *conn = pqmq_conn(q);
    t_exec(conn, "BEGIN");
    t_exec(conn, "INSERT INTO lk_results VALUES ('effect')");
    CHECK_ERR(q, pqmq_complete_commit(q, b), PQMQ_ESTALE, "delivered again");
    CHECK(PQtransactionStatus(conn) == PQTRANS_IDLE);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM lk_results"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 2);
    CHECK_OK(other, pqmq_complete_batch(other, again));
    pqmq_batch_free(again);
    pqmq_batch_free(b);
    pqmq_client_free(other);
}

/* The handler's writes and the completion commit together; nothing was
 * written for the claim itself (another session sees the row untouched
 * while it is held). */
static void test_completion_commits_with_the_consumers_writes(void)
{
    t_truncate();
    t_exec(pg, "CREATE TABLE IF NOT EXISTS lk_results (msg text PRIMARY KEY)");
    t_exec(pg, "TRUNCATE lk_results");
    insert_n(q, "lk", 5, 3, 60000);
    PGconn *conn = pqmq_conn(q);
    t_exec(conn, "BEGIN");
    pqmq_batch *b = poll_locked(q, "lk", 10);
    CHECK_INT(pqmq_batch_count(b), 5);
    for (size_t i = 0; i < pqmq_batch_count(b); i++) {
        const pqmq_job *j = pqmq_batch_job(b, i);
        CHECK_INT(pqmq_job_attempt(j), 1);
        CHECK_INT(pqmq_job_retries_left(j), 3);
        const char *v[1] = {pqmq_job_json(j)};
        PGresult *r =
            PQexecParams(conn, "INSERT INTO lk_results VALUES ($1)", 1, NULL, v, NULL, NULL, 0);
        CHECK(PQresultStatus(r) == PGRES_COMMAND_OK);
        PQclear(r);
    }
    /* Held, yet unwritten: no lease, no attempt counted. */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE deliveries = 0 "
                            "AND attempts = 4 AND attempt_at <= now()"),
              5);
    /* Held: no other session's poll, of either lane, takes them. */
    t_exec(pg, "BEGIN");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_claim_locked(ARRAY['lk'], 10) "
                            "WHERE id IS NOT NULL"),
              0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_poll_jobs(ARRAY['lk'], 10) "
                            "WHERE id IS NOT NULL"),
              0);
    t_exec(pg, "ROLLBACK");
    CHECK_OK(q, pqmq_complete_batch(q, b));
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM lk_results"), 0); /* not yet */
    t_exec(conn, "COMMIT");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM lk_results"), 5);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_payloads"), 0);
    pqmq_batch_free(b);
}

/* A rollback: ready again at once, no attempt spent; from then on the lease
 * lane delivers it (the locked lane cannot count what dies with it). */
static void test_rollback_makes_them_ready_at_once(void)
{
    t_truncate();
    insert_n(q, "lk", 3, 2, 60000);
    t_exec(pqmq_conn(q), "BEGIN");
    pqmq_batch *b = poll_locked(q, "lk", 10);
    CHECK_INT(pqmq_batch_count(b), 3);
    t_exec(pqmq_conn(q), "ROLLBACK");
    pqmq_batch_free(b);

    t_exec(pqmq_conn(q), "BEGIN");
    b = poll_locked(q, "lk", 10);
    CHECK_INT(pqmq_batch_count(b), 0);
    t_exec(pqmq_conn(q), "COMMIT");
    pqmq_batch_free(b);

    b = poll_leased(q, "lk", 10);
    CHECK_INT(pqmq_batch_count(b), 3);
    for (size_t i = 0; i < pqmq_batch_count(b); i++) {
        CHECK_INT(pqmq_job_attempt(pqmq_batch_job(b, i)), 1);
        CHECK_INT(pqmq_job_retries_left(pqmq_batch_job(b, i)), 2);
    }
    CHECK_OK(q, pqmq_complete_batch(q, b));
    pqmq_batch_free(b);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
}

/* The consumer's backend dies while it holds jobs: they are ready again
 * at once, with no attempt spent. */
static void test_a_dead_consumers_jobs_are_ready_at_once(void)
{
    t_truncate();
    insert_n(q, "lk", 4, 1, 60000);
    pqmq_client *victim = t_client();
    t_exec(pqmq_conn(victim), "BEGIN");
    pqmq_batch *b = poll_locked(victim, "lk", 10);
    CHECK_INT(pqmq_batch_count(b), 4);
    pqmq_batch_free(b);
    int pid = PQbackendPID(pqmq_conn(victim));
    CHECK_INT(t_sql_int(pg, "SELECT pg_terminate_backend(%d)::int", pid), 1);
    for (int i = 0; i < 100 && t_sql_int(pg,
                                         "SELECT count(*) FROM pg_stat_activity "
                                         "WHERE pid = %d",
                                         pid) > 0;
         i++)
        t_sleep_ms(20);
    pqmq_client_free(victim);

    b = poll_leased(q, "lk", 10);
    CHECK_INT(pqmq_batch_count(b), 4);
    for (size_t i = 0; i < pqmq_batch_count(b); i++)
        CHECK_INT(pqmq_job_attempt(pqmq_batch_job(b, i)), 1);
    CHECK_OK(q, pqmq_complete_batch(q, b));
    pqmq_batch_free(b);
}

/* A failure inside the transaction counts the attempt and records the
 * error; the retry comes after the backoff, through the lease lane; with no
 * retries left the message is dead. */
static void test_fail_counts_the_attempt(void)
{
    t_truncate();
    insert_n(q, "lk-retry", 1, 1, 100);
    insert_n(q, "lk-last", 1, 0, 100);
    t_exec(pqmq_conn(q), "BEGIN");
    pqmq_batch *b = poll_locked(q, NULL, 10);
    CHECK_INT(pqmq_batch_count(b), 2);
    for (size_t i = 0; i < pqmq_batch_count(b); i++) {
        uuid_t id;
        pqmq_job_id(pqmq_batch_job(b, i), id);
        CHECK_OK(q, pqmq_fail(q, id, "bad input"));
    }
    t_exec(pqmq_conn(q), "COMMIT");
    pqmq_batch_free(b);

    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs m JOIN mq_payloads p USING (id) "
                            "WHERE m.channel_name = 'lk-retry' AND m.deliveries = 1 "
                            "AND m.attempts = 1 AND m.dead_since IS NULL "
                            "AND m.attempt_at > now() AND m.ready_at = m.attempt_at "
                            "AND p.last_error = 'bad input'"),
              1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE channel_name = 'lk-last' "
                            "AND dead_since IS NOT NULL"),
              1);
    t_sleep_ms(150);
    t_exec(pqmq_conn(q), "BEGIN");
    b = poll_locked(q, NULL, 10);
    CHECK_INT(pqmq_batch_count(b), 0); /* a retry: the lease lane's */
    t_exec(pqmq_conn(q), "COMMIT");
    pqmq_batch_free(b);
    b = poll_leased(q, NULL, 10);
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_INT(pqmq_job_attempt(pqmq_batch_job(b, 0)), 2);
    CHECK_INT(pqmq_job_retries_left(pqmq_batch_job(b, 0)), 0);
    CHECK_OK(q, pqmq_complete_batch(q, b));
    pqmq_batch_free(b);
}

/* Two polls in one transaction never hand out the same message twice
 * (SKIP LOCKED skips other transactions' locks only). */
static void test_two_polls_in_one_transaction_are_disjoint(void)
{
    t_truncate();
    insert_n(q, "lk", 6, 3, 60000);
    t_exec(pqmq_conn(q), "BEGIN");
    pqmq_batch *a = poll_locked(q, "lk", 4);
    pqmq_batch *b = poll_locked(q, "lk", 10);
    CHECK_INT(pqmq_batch_count(a), 4);
    CHECK_INT(pqmq_batch_count(b), 2);
    for (size_t i = 0; i < pqmq_batch_count(a); i++)
        for (size_t k = 0; k < pqmq_batch_count(b); k++) {
            uuid_t x, y;
            pqmq_job_id(pqmq_batch_job(a, i), x);
            pqmq_job_id(pqmq_batch_job(b, k), y);
            CHECK(uuid_compare(x, y) != 0);
        }
    CHECK_OK(q, pqmq_complete_batch(q, a));
    CHECK_OK(q, pqmq_complete_batch(q, b));
    t_exec(pqmq_conn(q), "COMMIT");
    pqmq_batch_free(a);
    pqmq_batch_free(b);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
}

/* A client in another language, with SQL alone: claim in a transaction,
 * complete with the attempt numbers minus one (nothing was counted). */
static void test_sql_clients_use_the_lane(void)
{
    t_truncate();
    insert_n(q, "lk", 5, 3, 60000);
    PGconn *c = t_pg();
    t_exec(c, "BEGIN");
    CHECK_INT(t_sql_int(c, "WITH j AS (SELECT id, attempt FROM mq_claim_locked(NULL, 10) "
                           "WHERE id IS NOT NULL) "
                           "SELECT mq_complete(array_agg(id), array_agg(attempt - 1)) FROM j"),
              5);
    t_exec(c, "COMMIT");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    insert_n(q, "lk", 2, 3, 60000);
    t_exec(c, "BEGIN");
    PGresult *r = PQexec(c, "WITH j AS (SELECT id, attempt FROM mq_claim_locked(NULL, 10) "
                            "WHERE id IS NOT NULL) "
                            "SELECT mq_complete_all(array_agg(id), array_agg(attempt)) FROM j");
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "PQ001"); /* wrong attempts */
    PQclear(r);
    t_exec(c, "ROLLBACK");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 2);
    PQfinish(c);
}

/* The lane test (_mq_lane_admits) runs once per row a locking scan passes,
 * rows other consumers hold included: the planner must inline it into every
 * scan, since a call per row costs many times the inlined test; and the ready
 * test (_mq_claimable) and the walks' next key (_mq_walk_next) too, whose
 * conditions bound the scans. A function the
 * planner inlines is never called, so with track_functions on, the
 * transaction's function statistics count the picks and not them. */
static void test_lane_test_is_inlined(void)
{
    if (t_citus_skip("the scans run on the worker, whose counts this session cannot see"))
        return;
    t_truncate();
    insert_n(q, "lk", 6, 3, 60000); /* _mq_pick_keys, then _mq_pick_set's top-up */
    pqmq_msg *m[3] = {t_msg("lk", "urgent", "job", "{}", 0), t_msg("lk", "a", "job", "{}", 1),
                      t_msg("lk", "a", "job", "{}", 1)};
    pqmq_msg_set_priority(m[0], 5);    /* _mq_pick_urgent */
    CHECK_OK(q, pqmq_insert(q, m, 3)); /* _mq_pick_chains */
    t_msgs_free(m, 3);
    PGconn *c = t_pg();
    t_exec(c, "BEGIN");
    t_exec(c, "SET LOCAL track_functions = 'all'");
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM mq_claim_locked(NULL, 100) "
                           "WHERE id IS NOT NULL"),
              8);
    /* Each scan ran: the statistics count calls. */
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM pg_stat_xact_user_functions "
                           "WHERE schemaname = current_schema() AND calls > 0 "
                           "AND funcname IN ('_mq_pick_set', '_mq_pick_keys', "
                           "'_mq_pick_urgent', '_mq_pick_chains')"),
              4);
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM pg_stat_xact_user_functions "
                           "WHERE schemaname = current_schema() "
                           "AND funcname IN ('_mq_lane_admits', '_mq_claimable', "
                           "'_mq_walk_next')"),
              0);
    t_exec(c, "ROLLBACK");
    PQfinish(c);
}

/* ---- four consumers ---- */

enum { MANY = 2000, CONSUMERS = 4 };
static int seen[MANY];
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;

static void *consume(void *arg)
{
    (void)arg;
    pqmq_client *c = t_client();
    /* A locked poll passes a channel another consumer's transaction holds,
     * so an empty poll ends this consumer only when nothing is left (at
     * most 3000 empty polls: a message that never comes back fails the
     * count below). */
    for (int idle = 0; idle < 3000;) {
        t_exec(pqmq_conn(c), "BEGIN");
        pqmq_batch *b = poll_locked(c, NULL, 25);
        size_t n = pqmq_batch_count(b);
        pthread_mutex_lock(&seen_lock);
        for (size_t i = 0; i < n; i++) {
            int k = atoi(strchr(pqmq_job_json(pqmq_batch_job(b, i)), ':') + 1);
            if (k >= 0 && k < MANY)
                seen[k]++;
        }
        pthread_mutex_unlock(&seen_lock);
        if (n)
            CHECK_OK(c, pqmq_complete_batch(c, b));
        t_exec(pqmq_conn(c), "COMMIT");
        pqmq_batch_free(b);
        idle = n ? 0 : idle + 1;
        if (idle && t_sql_int(pqmq_conn(c), "SELECT count(*) FROM mq_msgs") == 0)
            break;
        if (idle)
            usleep(2000);
    }
    pqmq_client_free(c);
    return NULL;
}

static void test_four_consumers_never_share_a_message(void)
{
    t_truncate();
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < MANY; i += 100) {
        pqmq_msg *msgs[100];
        for (int k = 0; k < 100; k++) {
            char json[32], ch[16];
            snprintf(json, sizeof json, "{\"i\": %d}", i + k);
            snprintf(ch, sizeof ch, "c%d", k % 7);
            msgs[k] = t_msg(ch, NULL, "job", json, 0);
        }
        CHECK_OK(q, pqmq_insert(q, msgs, 100));
        t_msgs_free(msgs, 100);
    }
    pthread_t th[CONSUMERS];
    for (int i = 0; i < CONSUMERS; i++)
        pthread_create(&th[i], NULL, consume, NULL);
    for (int i = 0; i < CONSUMERS; i++)
        pthread_join(th[i], NULL);
    int once = 0, twice = 0;
    for (int i = 0; i < MANY; i++) {
        once += seen[i] == 1;
        twice += seen[i] > 1;
    }
    CHECK_INT(once, MANY);
    CHECK_INT(twice, 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
}

/* ---- a poison message ---- */

/* One consumer process: a locked poll and, with nothing there, a leased
 * one; whatever it gets kills it (abort), as a poison message would. */
static void poisoned_consumer(void)
{
    pqmq_client *c = t_client();
    PQclear(PQexec(pqmq_conn(c), "BEGIN"));
    pqmq_batch *b = NULL;
    if (pqmq_poll_locked(c, NULL, 0, 10, &b) == 0 && pqmq_batch_count(b) > 0)
        abort();
    pqmq_batch_free(b);
    PQclear(PQexec(pqmq_conn(c), "COMMIT"));
    if (pqmq_poll(c, NULL, 0, 10, &b) == 0 && pqmq_batch_count(b) > 0)
        abort();
    _exit(0);
}

static void test_a_poison_message_ends_dead(void)
{
    t_truncate();
    insert_n(q, "poison", 1, 2, 30); /* 3 attempts */
    int locked_deaths = 0, leased_deaths = 0;
    for (int round = 0; round < 60; round++) {
        if (t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE dead_since IS NOT NULL") > 0 ||
            t_sql_int(pg, "SELECT mq_reap_dead()") > 0)
            break;
        long long before = t_sql_int(pg, "SELECT deliveries FROM mq_msgs");
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0)
            poisoned_consumer();
        int status = 0;
        waitpid(pid, &status, 0);
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT) {
            /* The lease lane counted the delivery before the crash. */
            if (t_sql_int(pg, "SELECT deliveries FROM mq_msgs") > before)
                leased_deaths++;
            else
                locked_deaths++;
        } else {
            CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
            t_sleep_ms(40); /* a lease has yet to run out */
        }
    }
    CHECK_INT(locked_deaths, 1);
    CHECK_INT(leased_deaths, 3);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE dead_since IS NOT NULL "
                            "AND deliveries = 3"),
              1);
}

int main(void)
{
    t_init("test_locked");
    q = t_client();
    pg = t_pg();
    T_RUN(test_opens_a_transaction_when_none_is_open);
    T_RUN(test_complete_commit_is_all_or_nothing);
    T_RUN(test_completion_commits_with_the_consumers_writes);
    T_RUN(test_rollback_makes_them_ready_at_once);
    T_RUN(test_a_dead_consumers_jobs_are_ready_at_once);
    T_RUN(test_fail_counts_the_attempt);
    T_RUN(test_two_polls_in_one_transaction_are_disjoint);
    T_RUN(test_sql_clients_use_the_lane);
    T_RUN(test_lane_test_is_inlined);
    T_RUN(test_four_consumers_never_share_a_message);
    T_RUN(test_a_poison_message_ends_dead);
    PQfinish(pg);
    pqmq_client_free(q);
    return t_done();
}
