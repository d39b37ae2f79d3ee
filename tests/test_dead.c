/* test_dead.c: dead letters, blocked chains, retry/skip, stale completion. */
#include <poll.h>
#include <stdlib.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

static pqmq_msg *one(const char *ch, const char *args, const char *json, int ordered,
                     int retries, int64_t backoff)
{
    pqmq_msg *m = t_msg(ch, args, "n", json, ordered);
    pqmq_msg_set_retries(m, retries);
    pqmq_msg_set_backoff(m, backoff);
    return m;
}

static void insert(pqmq_msg **msgs, size_t n)
{
    CHECK_OK(q, pqmq_insert(q, msgs, n));
    t_msgs_free(msgs, n);
}

/* Polls once; returns the batch (caller frees). */
static pqmq_batch *poll_all(pqmq_client *c, int max)
{
    pqmq_batch *b = NULL;
    CHECK_OK(c, pqmq_poll(c, NULL, 0, max, &b));
    return b;
}

/* Waits up to ms for a notification on mq_dead on listener l. */
static int got_dead_notice(PGconn *l, int ms)
{
    for (int64_t end = t_now_ms() + ms; t_now_ms() < end;) {
        PQconsumeInput(l);
        PGnotify *n;
        int seen = 0;
        while ((n = PQnotifies(l)) != NULL) {
            seen |= !strcmp(n->relname, "mq_dead");
            PQfreemem(n);
        }
        if (seen)
            return 1;
        struct pollfd fd = {PQsocket(l), POLLIN, 0};
        poll(&fd, 1, 50);
    }
    return 0;
}

static void test_failed_final_attempt_is_a_dead_letter(void)
{
    t_truncate();
    PGconn *l = t_listener();
    t_exec(l, "LISTEN mq_dead");
    pqmq_msg *m[] = {one("d", NULL, "{\"x\": 1}", 0, 0, 60000)};
    insert(m, 1);
    pqmq_batch *b = poll_all(q, 10);
    CHECK_INT(pqmq_batch_count(b), 1);
    uuid_t id;
    pqmq_job_id(pqmq_batch_job(b, 0), id);
    CHECK_OK(q, pqmq_fail(q, id, "disk full"));
    pqmq_batch_free(b);
    CHECK(got_dead_notice(l, 2000));

    b = poll_all(q, 10);
    CHECK_INT(pqmq_batch_count(b), 0); /* never delivered again */
    pqmq_batch_free(b);

    CHECK_OK(q, pqmq_dead_letters(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    const pqmq_job *j = pqmq_batch_job(b, 0);
    CHECK_STR(pqmq_job_last_error(j), "disk full");
    CHECK_STR(pqmq_job_json(j), "{\"x\": 1}");
    CHECK_STR(pqmq_job_channel(j), "d");
    CHECK_INT(pqmq_job_attempt(j), 1);
    CHECK_INT(pqmq_job_blocking(j), 0);
    pqmq_batch_free(b);
    /* The SQL listing agrees, and a channel filter applies. */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_dead_letters(ARRAY['d'], 10)"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_dead_letters(ARRAY['other'], 10)"), 0);
    PQfinish(l);
}

static void test_expired_final_lease_is_announced(void)
{
    t_truncate();
    PGconn *l = t_listener();
    t_exec(l, "LISTEN mq_dead");
    pqmq_msg *m[] = {one("d", NULL, "{}", 0, 1, 100)};
    insert(m, 1);
    for (int i = 0; i < 2; i++) { /* two deliveries, never completed */
        pqmq_batch *b = poll_all(q, 10);
        CHECK_INT(pqmq_batch_count(b), 1);
        pqmq_batch_free(b);
        t_sleep_ms(250);
    }
    pqmq_batch *b = poll_all(q, 10); /* an idle poll notices the death */
    CHECK_INT(pqmq_batch_count(b), 0);
    pqmq_batch_free(b);
    CHECK(got_dead_notice(l, 2000));
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE dead_since IS NOT NULL"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT attempts FROM mq_dead_letters(NULL, 10)"), 2);
    PQfinish(l);
}

/* Inserts chain k: seq 0..n-1, head with no retries. */
static void insert_chain(int n)
{
    pqmq_msg *msgs[8];
    for (int i = 0; i < n; i++) {
        char json[32];
        snprintf(json, sizeof json, "{\"seq\": %d}", i);
        msgs[i] = one("c", "k", json, 1, i == 0 ? 0 : 3, 60000);
    }
    insert(msgs, (size_t)n);
}

/* Kills the head: deliver it once and fail it. Returns its id in id. */
static void kill_head(uuid_t id)
{
    pqmq_batch *b = poll_all(q, 10);
    CHECK_INT(pqmq_batch_count(b), 1);
    pqmq_job_id(pqmq_batch_job(b, 0), id);
    CHECK_STR(pqmq_job_json(pqmq_batch_job(b, 0)), "{\"seq\": 0}");
    CHECK_OK(q, pqmq_fail(q, id, "poison"));
    pqmq_batch_free(b);
}

static void test_dead_head_blocks_its_chain_only(void)
{
    t_truncate();
    insert_chain(3);
    uuid_t id;
    kill_head(id);
    pqmq_msg *free_one[] = {one("c", "k", "{\"free\": 1}", 0, 1, 60000)};
    insert(free_one, 1);
    pqmq_batch *b = poll_all(q, 10);
    /* Only the unordered message: the chain waits behind its dead head. */
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_STR(pqmq_job_json(pqmq_batch_job(b, 0)), "{\"free\": 1}");
    pqmq_batch_free(b);
    CHECK_INT(t_sql_int(pg, "SELECT blocked_chains FROM mq_stats(ARRAY['c'])"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT dead FROM mq_stats(ARRAY['c'])"), 1);
    CHECK_OK(q, pqmq_dead_letters(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_job_blocking(pqmq_batch_job(b, 0)), 1);
    pqmq_batch_free(b);
}

static void test_retry_revives_head_in_order(void)
{
    t_truncate();
    insert_chain(3);
    uuid_t id;
    kill_head(id);
    size_t n = 99;
    CHECK_OK(q, pqmq_retry(q, (const uuid_t *)id, 1, 2, &n));
    CHECK_INT(n, 1);
    for (int seq = 0; seq < 3; seq++) {
        pqmq_batch *b = poll_all(q, 10);
        CHECK_INT(pqmq_batch_count(b), 1);
        char want[32];
        snprintf(want, sizeof want, "{\"seq\": %d}", seq);
        CHECK_STR(pqmq_job_json(pqmq_batch_job(b, 0)), want);
        CHECK_OK(q, pqmq_complete_batch(q, b));
        pqmq_batch_free(b);
    }
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    /* Retrying what is not dead does nothing. */
    CHECK_OK(q, pqmq_retry(q, (const uuid_t *)id, 1, 0, &n));
    CHECK_INT(n, 0);
    CHECK_ERR(q, pqmq_retry(q, (const uuid_t *)id, 1, -1, &n), PQMQ_EINVAL, "negative");
}

static void test_skip_moves_head_to_dead_letters_and_releases_next(void)
{
    t_truncate();
    insert_chain(3);
    uuid_t id;
    kill_head(id);
    size_t n = 0;
    CHECK_OK(q, pqmq_skip(q, (const uuid_t *)id, 1, &n));
    CHECK_INT(n, 1);
    pqmq_batch *b = poll_all(q, 10);
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_STR(pqmq_job_json(pqmq_batch_job(b, 0)), "{\"seq\": 1}");
    CHECK_OK(q, pqmq_complete_batch(q, b));
    pqmq_batch_free(b);
    b = poll_all(q, 10);
    CHECK_STR(pqmq_job_json(pqmq_batch_job(b, 0)), "{\"seq\": 2}");
    CHECK_OK(q, pqmq_complete_batch(q, b));
    pqmq_batch_free(b);
    /* The skipped head is kept as a dead letter that blocks nothing. */
    CHECK_OK(q, pqmq_dead_letters(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_INT(pqmq_job_blocking(pqmq_batch_job(b, 0)), 0);
    CHECK_STR(pqmq_job_last_error(pqmq_batch_job(b, 0)), "poison");
    pqmq_batch_free(b);
    CHECK_INT(t_sql_int(pg, "SELECT blocked_chains FROM mq_stats(ARRAY['c'])"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_chains"), 0);
    /* New messages on the chain start a fresh one. */
    insert_chain(1);
    b = poll_all(q, 10);
    CHECK_INT(pqmq_batch_count(b), 1);
    pqmq_batch_free(b);
}

static void test_stale_completion_is_fenced(void)
{
    t_truncate();
    pqmq_client *a = t_client(), *bcl = t_client();
    pqmq_msg *m[] = {one("s", NULL, "{}", 0, 3, 150)};
    insert(m, 1);
    pqmq_batch *first = poll_all(a, 1);
    CHECK_INT(pqmq_batch_count(first), 1);
    t_sleep_ms(300); /* A's lease runs out */
    pqmq_batch *second = poll_all(bcl, 1);
    CHECK_INT(pqmq_batch_count(second), 1);
    CHECK_INT(pqmq_job_attempt(pqmq_batch_job(second, 0)), 2);
    /* A, late, must not complete B's delivery. */
    CHECK_ERR(a, pqmq_complete_batch(a, first), PQMQ_ESTALE, "delivered again");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 1);
    CHECK_OK(bcl, pqmq_complete_batch(bcl, second));
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    pqmq_batch_free(first);
    pqmq_batch_free(second);
    pqmq_client_free(a);
    pqmq_client_free(bcl);
}

static void test_dead_letter_bad_inputs(void)
{
    pqmq_batch *b = NULL;
    CHECK_ERR(q, pqmq_dead_letters(q, NULL, 0, 0, &b), PQMQ_EINVAL, "max 0");
    CHECK_ERR(q, pqmq_dead_letters(q, NULL, 0, 10, NULL), PQMQ_EINVAL, "out is NULL");
    CHECK_ERR(q, pqmq_skip(q, NULL, 0, NULL), PQMQ_EINVAL, "no ids");
    CHECK_INT(pqmq_retry(NULL, NULL, 0, 0, NULL), PQMQ_EINVAL);
}

int main(void)
{
    t_init("dead");
    q = t_client();
    pg = t_pg();
    T_RUN(test_failed_final_attempt_is_a_dead_letter);
    T_RUN(test_expired_final_lease_is_announced);
    T_RUN(test_dead_head_blocks_its_chain_only);
    T_RUN(test_retry_revives_head_in_order);
    T_RUN(test_skip_moves_head_to_dead_letters_and_releases_next);
    T_RUN(test_stale_completion_is_fenced);
    T_RUN(test_dead_letter_bad_inputs);
    pqmq_client_free(q);
    PQfinish(pg);
    return t_done();
}
