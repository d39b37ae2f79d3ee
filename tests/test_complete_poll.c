/* test_complete_poll.c: pqmq_complete_and_poll and mq_complete_poll, the
 * consumer's loop in one statement: completes the last batch, then polls. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* asprintf */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

/* Inserts n messages on channel ch (ordered or not), 3 retries, lease
 * backoff_ms. */
static void insert(const char *ch, int n, int ordered, int64_t backoff_ms)
{
    pqmq_msg **msgs = calloc((size_t)n, sizeof *msgs);
    for (int i = 0; i < n; i++) {
        char json[32];
        snprintf(json, sizeof json, "{\"seq\": %d}", i);
        msgs[i] = t_msg(ch, NULL, "job", json, ordered);
        pqmq_msg_set_retries(msgs[i], 3);
        pqmq_msg_set_backoff(msgs[i], backoff_ms);
    }
    CHECK_OK(q, pqmq_insert(q, msgs, (size_t)n));
    t_msgs_free(msgs, (size_t)n);
    free(msgs);
}

static long long rows(void)
{
    return t_sql_int(pg, "SELECT count(*) FROM mq_msgs");
}

/* The ids of a batch, as a SQL array literal (for checks). */
static char *id_list(const pqmq_batch *b)
{
    size_t n = pqmq_batch_count(b);
    char *s = calloc(n * 40 + 8, 1);
    strcat(s, "{");
    for (size_t i = 0; i < n; i++) {
        uuid_t id;
        char text[37];
        pqmq_job_id(pqmq_batch_job(b, i), id);
        uuid_unparse_lower(id, text);
        if (i)
            strcat(s, ",");
        strcat(s, text);
    }
    strcat(s, "}");
    return s;
}

static long long present(const pqmq_batch *b)
{
    char *ids = id_list(b);
    long long n =
        t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE id = ANY ('%s'::uuid[])", ids);
    free(ids);
    return n;
}

static void test_completes_then_polls(void)
{
    t_truncate();
    insert("a", 5, 0, 60000);
    pqmq_batch *first = NULL, *second = NULL, *third = NULL;
    CHECK_OK(q, pqmq_complete_and_poll(q, NULL, NULL, 0, 3, &first)); /* a plain poll */
    CHECK_INT(pqmq_batch_count(first), 3);
    CHECK_OK(q, pqmq_complete_and_poll(q, first, NULL, 0, 3, &second));
    CHECK_INT(present(first), 0); /* completed */
    CHECK_INT(pqmq_batch_count(second), 2);
    CHECK_INT(present(second), 2); /* claimed, not completed */
    CHECK_INT(rows(), 2);
    CHECK_OK(q, pqmq_complete_and_poll(q, second, NULL, 0, 3, &third));
    CHECK_INT(pqmq_batch_count(third), 0);
    CHECK_INT(rows(), 0);
    CHECK(pqmq_batch_wait_ms(third) == -1); /* nothing scheduled at all */
    pqmq_batch_free(first);
    pqmq_batch_free(second);
    pqmq_batch_free(third);
}

/* Completion comes first: a chain head completed in the call releases its
 * successor to the same call's poll. */
static void test_completed_head_releases_successor_to_same_call(void)
{
    t_truncate();
    insert("chain", 3, 1, 60000);
    pqmq_batch *b1 = NULL, *b2 = NULL, *b3 = NULL;
    CHECK_OK(q, pqmq_complete_and_poll(q, NULL, NULL, 0, 10, &b1));
    CHECK_INT(pqmq_batch_count(b1), 1);
    CHECK_STR(pqmq_job_json(pqmq_batch_job(b1, 0)), "{\"seq\": 0}");
    CHECK_OK(q, pqmq_complete_and_poll(q, b1, NULL, 0, 10, &b2));
    CHECK_INT(pqmq_batch_count(b2), 1);
    CHECK_STR(pqmq_job_json(pqmq_batch_job(b2, 0)), "{\"seq\": 1}");
    CHECK_OK(q, pqmq_complete_and_poll(q, b2, NULL, 0, 10, &b3));
    CHECK_INT(pqmq_batch_count(b3), 1);
    CHECK_STR(pqmq_job_json(pqmq_batch_job(b3, 0)), "{\"seq\": 2}");
    CHECK_OK(q, pqmq_complete_batch(q, b3));
    CHECK_INT(rows(), 0);
    pqmq_batch_free(b1);
    pqmq_batch_free(b2);
    pqmq_batch_free(b3);
}

/* A late consumer's stale jobs are left to their new owner; its poll still
 * runs and its batch is returned. */
static void test_stale_completion_is_fenced_and_poll_still_runs(void)
{
    t_truncate();
    pqmq_client *late = t_client(), *other = t_client();
    insert("s", 1, 0, 150);
    pqmq_batch *first = NULL, *again = NULL, *next = NULL;
    CHECK_OK(late, pqmq_poll(late, NULL, 0, 1, &first));
    CHECK_INT(pqmq_batch_count(first), 1);
    t_sleep_ms(300); /* the lease runs out */
    CHECK_OK(other, pqmq_poll(other, NULL, 0, 1, &again));
    CHECK_INT(pqmq_job_attempt(pqmq_batch_job(again, 0)), 2);
    uuid_t held;
    pqmq_job_id(pqmq_batch_job(again, 0), held);
    /* The new owner's lease must outlast a slow machine's pauses. */
    CHECK_OK(other, pqmq_keep_alive(other, (const uuid_t *)&held, 1, 60000, NULL));
    insert("s", 1, 0, 60000);
    CHECK_ERR(late, pqmq_complete_and_poll(late, first, NULL, 0, 5, &next), PQMQ_ESTALE,
              "delivered again");
    CHECK(next != NULL);
    CHECK_INT(pqmq_batch_count(next), 1); /* the new message */
    CHECK_INT(present(again), 1);         /* the other owner's delivery stays */
    CHECK_OK(other, pqmq_complete_batch(other, again));
    CHECK_OK(late, pqmq_complete_batch(late, next));
    CHECK_INT(rows(), 0);
    pqmq_batch_free(first);
    pqmq_batch_free(again);
    pqmq_batch_free(next);
    pqmq_client_free(late);
    pqmq_client_free(other);
}

/* One statement, one transaction: when the poll fails, the completion is
 * undone with it. */
static void test_failed_poll_undoes_completion(void)
{
    t_truncate();
    insert("f", 2, 0, 60000);
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 2, &b));
    char *ids = id_list(b), *sql = NULL;
    if (asprintf(&sql, "SELECT * FROM mq_complete_poll('%s'::uuid[], '{1,1}', NULL, 0)", ids) <
        0)
        abort();
    PGresult *r = PQexec(pg, sql); /* batch_size 0: the poll refuses */
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22023");
    PQclear(r);
    free(sql);
    CHECK_INT(present(b), 2);
    r = t_sql(pg, "SELECT completed FROM mq_complete_poll('%s'::uuid[], '{1,1}', NULL, 5)",
              ids);
    CHECK(r && PQntuples(r) == 1); /* nothing left: the one row carries wait_time */
    CHECK_STR(r ? PQgetvalue(r, 0, 0) : NULL, "2");
    PQclear(r);
    CHECK_INT(rows(), 0);
    free(ids);
    pqmq_batch_free(b);
}

/* Bad arguments are refused before anything is sent: nothing completed. */
static void test_bad_arguments_complete_nothing(void)
{
    t_truncate();
    insert("x", 1, 0, 60000);
    pqmq_batch *b = NULL, *out = (pqmq_batch *)1;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 1, &b));
    CHECK_ERR(q, pqmq_complete_and_poll(q, b, NULL, 0, 0, &out), PQMQ_EINVAL,
              "batch_size 0 is outside");
    CHECK(out == NULL);
    CHECK_ERR(q, pqmq_complete_and_poll(q, b, (const char *[]){NULL}, 1, 5, &out), PQMQ_EINVAL,
              "channels[0] is NULL");
    CHECK_ERR(q, pqmq_complete_and_poll(q, b, NULL, 0, 5, NULL), PQMQ_EINVAL, "out is NULL");
    CHECK_INT(pqmq_complete_and_poll(NULL, b, NULL, 0, 5, &out), PQMQ_EINVAL);
    CHECK_INT(present(b), 1);
    pqmq_batch_free(b);
}

/* The channel filter applies to the poll, not to what is completed. */
static void test_channel_filter(void)
{
    t_truncate();
    insert("left", 1, 0, 60000);
    insert("right", 1, 0, 60000);
    pqmq_batch *l = NULL, *r = NULL;
    CHECK_OK(q, pqmq_poll(q, (const char *[]){"left"}, 1, 5, &l));
    CHECK_INT(pqmq_batch_count(l), 1);
    CHECK_OK(q, pqmq_complete_and_poll(q, l, (const char *[]){"right"}, 1, 5, &r));
    CHECK_INT(present(l), 0);
    CHECK_INT(pqmq_batch_count(r), 1);
    CHECK_STR(pqmq_job_channel(pqmq_batch_job(r, 0)), "right");
    CHECK_OK(q, pqmq_complete_batch(q, r));
    pqmq_batch_free(l);
    pqmq_batch_free(r);
}

int main(void)
{
    t_init("complete_poll");
    q = t_client();
    pg = t_pg();
    T_RUN(test_completes_then_polls);
    T_RUN(test_completed_head_releases_successor_to_same_call);
    T_RUN(test_stale_completion_is_fenced_and_poll_still_runs);
    T_RUN(test_failed_poll_undoes_completion);
    T_RUN(test_bad_arguments_complete_nothing);
    T_RUN(test_channel_filter);
    pqmq_client_free(q);
    PQfinish(pg);
    return t_done();
}
