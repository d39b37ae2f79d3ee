/* test_lifecycle.c: keep-alive and checkpoint (semantic 10), fail, complete. */
#include <stdlib.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

/* Inserts one message; its id goes to id. */
static void insert_one(int retries, int64_t backoff_ms, const char *json, const void *bytes,
                       size_t len, uuid_t id)
{
    pqmq_msg *m = t_msg("life", NULL, "job", json, 0);
    pqmq_msg_set_retries(m, retries);
    pqmq_msg_set_backoff(m, backoff_ms);
    if (bytes)
        pqmq_msg_set_bytes(m, bytes, len);
    pqmq_msg_id(m, id);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    pqmq_msg_free(m);
}

/* Polls once (batch 10); returns the batch (caller frees). */
static pqmq_batch *poll_batch(void)
{
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
    return b;
}

/* Polls once and returns how many jobs came. */
static int poll_count(void)
{
    pqmq_batch *b = poll_batch();
    int n = (int)pqmq_batch_count(b);
    pqmq_batch_free(b);
    return n;
}

/* Polls for period_ms, counting deliveries of everything. */
static int deliveries_during(int64_t period_ms)
{
    int n = 0;
    for (int64_t end = t_now_ms() + period_ms; t_now_ms() < end; t_sleep_ms(10))
        n += poll_count();
    return n;
}

/* The value of one column of the single row of mq_msgs (or mq_payloads), as
 * text ("?" when there is not exactly one row, which fails the check). */
static void msgs_col(const char *sql, char *out, size_t size)
{
    PGresult *r = t_sql(pg, "%s", sql);
    CHECK(r && PQntuples(r) == 1);
    snprintf(out, size, "%s",
             r && PQntuples(r) == 1 ? (PQgetisnull(r, 0, 0) ? "(null)" : PQgetvalue(r, 0, 0))
                                    : "?");
    PQclear(r);
}

/* Milliseconds from now until the single message's attempt_at. */
static long long lease_left_ms(void)
{
    return t_sql_int(pg, "SELECT round(extract(epoch FROM attempt_at - clock_timestamp()) "
                         "* 1000) FROM mq_msgs");
}

/* ---- keep-alive ---- */

static void test_keep_alive_extends_lease(void)
{
    t_truncate();
    uuid_t id;
    insert_one(3, 300, "{}", NULL, 0, id);
    CHECK_INT(poll_count(), 1);
    size_t ext = 99;
    CHECK_OK(q, pqmq_keep_alive(q, (const uuid_t *)&id, 1, 2000, &ext));
    CHECK_INT(ext, 1);
    t_sleep_ms(500);
    CHECK_INT(poll_count(), 0); /* the 300 ms lease would have run out */
    long long left = lease_left_ms();
    CHECK(left > 500 && left <= 2000);
    /* A keep-alive costs no attempt. */
    CHECK_INT(t_sql_int(pg, "SELECT attempts FROM mq_msgs"), 3);
    /* NULL extended is allowed. */
    CHECK_OK(q, pqmq_keep_alive(q, (const uuid_t *)&id, 1, 2000, NULL));
}

static void test_keep_alive_never_shortens(void)
{
    t_truncate();
    uuid_t id;
    insert_one(3, 60000, "{}", NULL, 0, id);
    CHECK_INT(poll_count(), 1);
    char before[64], after[64];
    msgs_col("SELECT attempt_at FROM mq_msgs", before, sizeof before);
    size_t ext = 99;
    CHECK_OK(q, pqmq_keep_alive(q, (const uuid_t *)&id, 1, 10, &ext));
    CHECK_INT(ext, 0);
    msgs_col("SELECT attempt_at FROM mq_msgs", after, sizeof after);
    CHECK_STR(after, before);
    t_sleep_ms(50);
    CHECK_INT(poll_count(), 0);
}

static void test_keep_alive_after_lease_ran_out(void)
{
    t_truncate();
    uuid_t id;
    insert_one(3, 100, "{}", NULL, 0, id);
    CHECK_INT(poll_count(), 1);
    t_sleep_ms(250);
    size_t ext = 99;
    CHECK_OK(q, pqmq_keep_alive(q, (const uuid_t *)&id, 1, 5000, &ext));
    CHECK_INT(ext, 0);
    pqmq_batch *b = poll_batch();
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_INT(pqmq_job_attempt(pqmq_batch_job(b, 0)), 2);
    pqmq_batch_free(b);
}

static void test_keep_alive_counts_what_it_extended(void)
{
    t_truncate();
    uuid_t ids[4];
    insert_one(3, 60000, "{}", NULL, 0, ids[0]); /* held */
    insert_one(3, 60000, "{}", NULL, 0, ids[1]); /* held */
    CHECK_INT(poll_count(), 2);
    insert_one(3, 100, "{}", NULL, 0, ids[2]); /* its lease runs out */
    CHECK_INT(poll_count(), 1);
    t_sleep_ms(250);
    pqmq_uuid_generate(ids[3]); /* unknown */
    size_t ext = 0;
    CHECK_OK(q, pqmq_keep_alive(q, (const uuid_t *)ids, 4, 120000, &ext));
    CHECK_INT(ext, 2);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs "
                            "WHERE attempt_at > clock_timestamp() + interval '90 s'"),
              2);
}

static void test_keep_alive_bad_duration(void)
{
    t_truncate();
    uuid_t id;
    insert_one(3, 60000, "{}", NULL, 0, id);
    CHECK_INT(poll_count(), 1);
    size_t ext = 99;
    CHECK_ERR(q, pqmq_keep_alive(q, (const uuid_t *)&id, 1, -1, &ext), PQMQ_EINVAL, "negative");
    CHECK_INT(ext, 0);
    CHECK_ERR(q, pqmq_keep_alive(q, (const uuid_t *)&id, 1, PQMQ_MAX_DURATION_MS + 1, NULL),
              PQMQ_EINVAL, "3650 days");
    CHECK_ERR(q, pqmq_keep_alive(q, NULL, 0, 1000, NULL), PQMQ_EINVAL, "no ids");
    /* The SQL functions check too. */
    PGresult *r = PQexec(pg, "SELECT mq_keep_alive(ARRAY[gen_random_uuid()], interval '-1 s')");
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22023");
    PQclear(r);
    r = PQexec(pg, "SELECT mq_keep_alive(ARRAY[gen_random_uuid()], NULL)");
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22023");
    PQclear(r);
    /* Longer than the limit is cut to it, not refused (test_sqlxmq). */
    r = PQexec(pg, "SELECT mq_keep_alive(ARRAY[gen_random_uuid()], interval '3651 days')");
    CHECK_INT(PQresultStatus(r), PGRES_TUPLES_OK);
    PQclear(r);
}

/* ---- checkpoint ---- */

static void test_checkpoint_replaces_payload(void)
{
    t_truncate();
    uuid_t id;
    /* Leases of 200, 400 and 800 ms: room for a slow client (valgrind). */
    insert_one(5, 200, "{\"step\": 0}", "abc", 3, id);
    CHECK_INT(poll_count(), 1);
    /* JSON only: the bytes stay. */
    CHECK_OK(q, pqmq_checkpoint(q, id, 0, "{\"step\": 1}", NULL, 0, 0));
    t_sleep_ms(250);
    pqmq_batch *b = poll_batch();
    CHECK_INT(pqmq_batch_count(b), 1);
    size_t len = 0;
    const pqmq_job *j = pqmq_batch_job(b, 0);
    CHECK_STR(pqmq_job_json(j), "{\"step\": 1}");
    const void *bytes = pqmq_job_bytes(j, &len);
    CHECK(bytes && len == 3 && !memcmp(bytes, "abc", 3));
    pqmq_batch_free(b);
    /* Bytes only (with a NUL inside): the JSON stays. */
    CHECK_OK(q, pqmq_checkpoint(q, id, 0, NULL, "x\0yz", 4, 0));
    t_sleep_ms(450);
    b = poll_batch();
    CHECK_INT(pqmq_batch_count(b), 1);
    j = pqmq_batch_job(b, 0);
    CHECK_STR(pqmq_job_json(j), "{\"step\": 1}");
    bytes = pqmq_job_bytes(j, &len);
    CHECK(bytes && len == 4 && !memcmp(bytes, "x\0yz", 4));
    pqmq_batch_free(b);
    /* Both at once, and the lease is extended like a keep-alive. */
    CHECK_OK(q, pqmq_checkpoint(q, id, 5000, "[1, 2]", "", 0, 0));
    t_sleep_ms(500);
    CHECK_INT(poll_count(), 0);
    char v[64];
    msgs_col("SELECT payload_json::text || '|' || octet_length(payload_bytes) FROM mq_payloads",
             v, sizeof v);
    CHECK_STR(v, "[1, 2]|0");
    long long left = lease_left_ms();
    CHECK(left > 2500 && left <= 5000);
}

static void test_checkpoint_extra_retries_are_exact(void)
{
    t_truncate();
    uuid_t id;
    insert_one(0, 50, "{}", NULL, 0, id); /* one delivery only */
    pqmq_batch *b = poll_batch();
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_INT(pqmq_job_retries_left(pqmq_batch_job(b, 0)), 0);
    pqmq_batch_free(b);
    CHECK_OK(q, pqmq_checkpoint(q, id, 0, NULL, NULL, 0, 2));
    CHECK_INT(t_sql_int(pg, "SELECT attempts FROM mq_msgs"), 2);
    /* Leases of 50, 100 and 200 ms: everything fits in 1.5 s. */
    int more = 0, attempt = 0, left = -1;
    for (int64_t end = t_now_ms() + 1500; t_now_ms() < end; t_sleep_ms(10)) {
        b = poll_batch();
        if (pqmq_batch_count(b)) {
            more++;
            attempt = pqmq_job_attempt(pqmq_batch_job(b, 0));
            left = pqmq_job_retries_left(pqmq_batch_job(b, 0));
        }
        pqmq_batch_free(b);
    }
    CHECK_INT(more, 2);
    CHECK_INT(attempt, 3);
    CHECK_INT(left, 0);
    CHECK_INT(t_sql_int(pg, "SELECT attempts FROM mq_msgs"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE attempts < 0"), 0);

    /* Without a checkpoint, the final attempt is final. */
    t_truncate();
    insert_one(0, 50, "{}", NULL, 0, id);
    CHECK_INT(deliveries_during(400), 1);
    CHECK_INT(t_sql_int(pg, "SELECT attempts FROM mq_msgs"), 0);
}

static void test_checkpoint_does_not_revive_dead_message(void)
{
    t_truncate();
    uuid_t id;
    insert_one(0, 100, "{\"old\": true}", NULL, 0, id);
    CHECK_INT(poll_count(), 1);
    t_sleep_ms(250); /* the lease of the final attempt ran out */
    CHECK_ERR(q, pqmq_checkpoint(q, id, 5000, "{\"new\": true}", NULL, 0, 5), PQMQ_ENOTHELD,
              "lease ran out");
    CHECK_INT(t_sql_int(pg, "SELECT attempts FROM mq_msgs"), 0);
    char v[64];
    msgs_col("SELECT payload_json::text FROM mq_payloads", v, sizeof v);
    CHECK_STR(v, "{\"old\": true}");
    CHECK_INT(deliveries_during(300), 0);

    /* A lease that ran out with attempts left: not held either, unchanged. */
    t_truncate();
    insert_one(2, 100, "{}", NULL, 0, id);
    CHECK_INT(poll_count(), 1);
    t_sleep_ms(250);
    CHECK_ERR(q, pqmq_checkpoint(q, id, 5000, NULL, NULL, 0, 5), PQMQ_ENOTHELD,
              "lease ran out");
    CHECK_INT(t_sql_int(pg, "SELECT attempts FROM mq_msgs"), 2);
    CHECK_INT(poll_count(), 1);
}

static void test_checkpoint_bad_arguments(void)
{
    t_truncate();
    uuid_t id, unknown;
    insert_one(1, 60000, "{\"k\": 1}", NULL, 0, id);
    CHECK_INT(poll_count(), 1);
    pqmq_uuid_generate(unknown);
    CHECK_ERR(q, pqmq_checkpoint(q, unknown, 1000, NULL, NULL, 0, 0), PQMQ_ENOTHELD,
              "lease ran out");
    CHECK_ERR(q, pqmq_checkpoint(q, id, 1000, NULL, NULL, 0, -1), PQMQ_EINVAL, "extra_retries");
    CHECK_ERR(q, pqmq_checkpoint(q, id, 1000, "{\"k\": ", NULL, 0, 0), PQMQ_EINVAL, "JSON");
    CHECK_ERR(q, pqmq_checkpoint(q, id, 1000, "{} x", NULL, 0, 0), PQMQ_EINVAL, "JSON");
    CHECK_ERR(q, pqmq_checkpoint(q, id, -5, NULL, NULL, 0, 0), PQMQ_EINVAL, "negative");
    /* None of the rejected calls changed anything. */
    CHECK_INT(t_sql_int(pg, "SELECT attempts FROM mq_msgs"), 1);
    char v[64];
    msgs_col("SELECT payload_json::text FROM mq_payloads", v, sizeof v);
    CHECK_STR(v, "{\"k\": 1}");
    /* The SQL function checks too. */
    PGresult *r = PQexec(pg, "SELECT mq_checkpoint(gen_random_uuid(), interval '1 s', "
                             "NULL, NULL, -1)");
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22023");
    PQclear(r);
}

/* ---- fail ---- */

static void test_fail_records_error_and_retries_after_backoff(void)
{
    t_truncate();
    uuid_t id;
    insert_one(2, 200, "{}", NULL, 0, id);
    CHECK_INT(poll_count(), 1);
    CHECK_OK(q, pqmq_fail(q, id, "boom: it's \"broken\""));
    int64_t failed_at = t_now_ms();
    char v[64];
    msgs_col("SELECT last_error FROM mq_payloads", v, sizeof v);
    CHECK_STR(v, "boom: it's \"broken\"");
    /* The retry waits the backoff of the failed attempt (200 ms), not the
     * doubled one (400 ms) and not nothing. */
    pqmq_batch *b = poll_batch();
    CHECK_INT(pqmq_batch_count(b), 0);
    int64_t wait = pqmq_batch_wait_ms(b);
    pqmq_batch_free(b);
    if (t_now_ms() - failed_at < 100)
        CHECK(wait > 50 && wait <= 200);
    t_sleep_ms(600);
    b = poll_batch();
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_INT(pqmq_job_attempt(pqmq_batch_job(b, 0)), 2);
    CHECK_INT(pqmq_job_lease_ms(pqmq_batch_job(b, 0)), 400);
    pqmq_batch_free(b);
    /* A NULL error is fine too. */
    CHECK_OK(q, pqmq_fail(q, id, NULL));
}

static void test_fail_on_final_attempt_is_dead(void)
{
    t_truncate();
    uuid_t id;
    /* A lease of a second: pqmq_fail must come while it is held, and 100 ms
     * ran out first once on a loaded machine. */
    insert_one(0, 1000, "{}", NULL, 0, id);
    CHECK_INT(poll_count(), 1);
    CHECK_OK(q, pqmq_fail(q, id, "fatal"));
    pqmq_batch *b = poll_batch();
    CHECK_INT(pqmq_batch_count(b), 0);
    CHECK_INT(pqmq_batch_wait_ms(b), -1); /* nothing will ever be ready */
    pqmq_batch_free(b);
    CHECK_INT(deliveries_during(300), 0);
    CHECK_INT(t_sql_int(pg, "SELECT attempts FROM mq_msgs"), 0);
    char v[64];
    msgs_col("SELECT last_error FROM mq_payloads", v, sizeof v);
    CHECK_STR(v, "fatal");
    /* Dead is dead: it is not held any more. */
    CHECK_ERR(q, pqmq_fail(q, id, "again"), PQMQ_ENOTHELD, "lease ran out");
    CHECK_ERR(q, pqmq_checkpoint(q, id, 1000, NULL, NULL, 0, 3), PQMQ_ENOTHELD,
              "lease ran out");
    CHECK_INT(t_sql_int(pg, "SELECT attempts FROM mq_msgs"), 0);
}

static void test_fail_when_not_held(void)
{
    t_truncate();
    uuid_t id, unknown;
    insert_one(2, 100, "{}", NULL, 0, id);
    CHECK_INT(poll_count(), 1);
    t_sleep_ms(250);
    CHECK_ERR(q, pqmq_fail(q, id, "late"), PQMQ_ENOTHELD, "lease ran out");
    char v[64];
    msgs_col("SELECT last_error FROM mq_payloads", v, sizeof v);
    CHECK_STR(v, "(null)");
    CHECK_INT(poll_count(), 1); /* redelivered as usual */

    pqmq_uuid_generate(unknown);
    CHECK_ERR(q, pqmq_fail(q, unknown, "who"), PQMQ_ENOTHELD, "lease ran out");

    /* A message nobody polled yet is not held by anyone. */
    t_truncate();
    pqmq_msg *m = t_msg("life", NULL, "job", NULL, 0);
    pqmq_msg_set_delay(m, 60000);
    pqmq_msg_id(m, id);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    pqmq_msg_free(m);
    CHECK_ERR(q, pqmq_fail(q, id, "early"), PQMQ_ENOTHELD, "lease ran out");
    CHECK(lease_left_ms() > 50000);
}

/* ---- complete ---- */

static void test_complete_many(void)
{
    t_truncate();
    enum { N = 50 };
    pqmq_msg *msgs[N];
    uuid_t ids[N + 3];
    for (int i = 0; i < N; i++) {
        msgs[i] = t_msg(i % 2 ? "life" : "other", NULL, "job", "{}", i % 3 == 0);
        pqmq_msg_id(msgs[i], ids[i]);
    }
    CHECK_OK(q, pqmq_insert(q, msgs, N));
    t_msgs_free(msgs, N);
    pqmq_uuid_generate(ids[N]);     /* unknown */
    uuid_copy(ids[N + 1], ids[0]);  /* twice in one call */
    pqmq_uuid_generate(ids[N + 2]); /* unknown */
    CHECK_OK(q, pqmq_complete(q, (const uuid_t *)ids, N + 3));
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_payloads"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_chains"), 0);
    /* Completing again is harmless. */
    CHECK_OK(q, pqmq_complete(q, (const uuid_t *)ids, 1));

    /* Completing only some leaves the others whole. */
    insert_one(1, 60000, "{\"a\": 1}", NULL, 0, ids[0]);
    insert_one(1, 60000, "{\"b\": 2}", NULL, 0, ids[1]);
    pqmq_batch *b = poll_batch();
    CHECK_INT(pqmq_batch_count(b), 2);
    pqmq_batch_free(b);
    CHECK_OK(q, pqmq_complete(q, (const uuid_t *)ids, 1));
    CHECK_OK(q, pqmq_complete(q, (const uuid_t *)ids, 1));
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 1);
    char v[64];
    msgs_col("SELECT payload_json::text FROM mq_payloads", v, sizeof v);
    CHECK_STR(v, "{\"b\": 2}");
    CHECK_ERR(q, pqmq_complete(q, NULL, 0), PQMQ_EINVAL, "no ids");
}

/* A completion sends its ids and attempt numbers eight a call (stmt.c):
 * for every batch size up to three groups and a part, each job is fenced
 * by its own attempt number (all different). One job, chosen in turn, was delivered again
 * meanwhile (its deliveries bumped): it alone is left, and the call says
 * one was stale. */
static void test_complete_every_batch_size(void)
{
    for (int n = 1; n <= 25; n++) {
        t_truncate();
        t_insert_spread(q, n, "sizes", "job", "{}", 0, 3, 60000);
        /* Each job gets an attempt number of its own (an earlier delivery
         * count), so one sent beside another's id would not match. */
        t_exec(pg, "UPDATE mq_msgs m SET deliveries = s.r FROM "
                   "(SELECT id, row_number() OVER (ORDER BY id) AS r FROM mq_msgs) s "
                   "WHERE m.id = s.id");
        pqmq_batch *b = NULL;
        CHECK_OK(q, pqmq_poll(q, NULL, 0, n, &b));
        CHECK_INT((long long)pqmq_batch_count(b), n);
        size_t stale = (size_t)(n * 5 / 7);
        uuid_t id;
        char ids[37];
        pqmq_job_id(pqmq_batch_job(b, stale), id);
        uuid_unparse_lower(id, ids);
        t_exec(pg, "UPDATE mq_msgs SET deliveries = deliveries + 1 WHERE id = '%s'", ids);
        CHECK_INT(pqmq_complete_batch(q, b), PQMQ_ESTALE);
        CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 1);
        CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE id = '%s'", ids), 1);
        pqmq_batch_free(b);
    }
}

/* Keep-alive never waits for a consumer that completes in its own open
 * transaction: neither for the message's row (a message of mq_rows, locked
 * by that transaction) nor for its claim's receipt (a logged message whose
 * batch-mate that transaction completed), which it extends. */
static void test_keep_alive_skips_locked_rows(void)
{
    t_truncate();
    pqmq_client *c = t_client();
    pqmq_msg *ms[2] = {t_msg("locked", NULL, "n", "{}", 0),
                       t_msg("locked", NULL, "n", "{}", 0)};
    for (int i = 0; i < 2; i++)
        pqmq_msg_set_backoff(ms[i], 60000);
    CHECK_OK(c, pqmq_insert(c, ms, 2));
    for (int i = 0; i < 2; i++)
        pqmq_msg_free(ms[i]);
    pqmq_batch *b = NULL;
    CHECK_OK(c, pqmq_poll(c, NULL, 0, 2, &b));
    CHECK_INT(pqmq_batch_count(b), 2);
    uuid_t id, mate;
    char mate_text[37];
    pqmq_job_id(pqmq_batch_job(b, 0), id);
    pqmq_job_id(pqmq_batch_job(b, 1), mate);
    uuid_unparse_lower(mate, mate_text);
    PGconn *holder = t_pg();
    t_exec(holder, "BEGIN");
    CHECK_INT(t_sql_int(holder, "SELECT mq_complete(ARRAY['%s']::uuid[], ARRAY[1])", mate_text),
              1);
    /* A guard: were it to wait, the statement would fail after 3 s. */
    t_exec(pqmq_conn(c), "SET statement_timeout = '3s'");
    size_t extended = 99;
    int64_t t0 = t_now_ms();
    CHECK_OK(c, pqmq_keep_alive(c, (const uuid_t *)id, 1, 120000, &extended));
    CHECK(t_now_ms() - t0 < 2000);
    CHECK_INT(extended, 1);
    t_exec(holder, "ROLLBACK");

    pqmq_batch_free(b);

    /* A message mq_rows holds (an ordered one): a row lock is skipped. */
    t_truncate();
    pqmq_msg *m = t_msg("locked", NULL, "n", "{}", 1);
    pqmq_msg_set_backoff(m, 60000);
    CHECK_OK(c, pqmq_insert(c, &m, 1));
    pqmq_msg_free(m);
    b = NULL;
    CHECK_OK(c, pqmq_poll(c, NULL, 0, 1, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    pqmq_job_id(pqmq_batch_job(b, 0), id);
    t_exec(holder, "BEGIN");
    t_exec(holder, "SELECT 1 FROM mq_rows FOR UPDATE");
    t0 = t_now_ms();
    CHECK_OK(c, pqmq_keep_alive(c, (const uuid_t *)id, 1, 120000, &extended));
    CHECK(t_now_ms() - t0 < 2000);
    CHECK_INT(extended, 0);
    t_exec(holder, "ROLLBACK");
    CHECK_OK(c, pqmq_keep_alive(c, (const uuid_t *)id, 1, 120000, &extended));
    CHECK_INT(extended, 1);
    PQfinish(holder);
    pqmq_batch_free(b);
    pqmq_client_free(c);
}

int main(void)
{
    t_init("lifecycle");
    q = t_client();
    pg = t_pg();
    T_RUN(test_keep_alive_extends_lease);
    T_RUN(test_keep_alive_never_shortens);
    T_RUN(test_keep_alive_after_lease_ran_out);
    T_RUN(test_keep_alive_counts_what_it_extended);
    T_RUN(test_keep_alive_bad_duration);
    T_RUN(test_checkpoint_replaces_payload);
    T_RUN(test_checkpoint_extra_retries_are_exact);
    T_RUN(test_checkpoint_does_not_revive_dead_message);
    T_RUN(test_checkpoint_bad_arguments);
    T_RUN(test_fail_records_error_and_retries_after_backoff);
    T_RUN(test_fail_on_final_attempt_is_dead);
    T_RUN(test_fail_when_not_held);
    T_RUN(test_complete_many);
    T_RUN(test_complete_every_batch_size);
    T_RUN(test_keep_alive_skips_locked_rows);
    pqmq_client_free(q);
    PQfinish(pg);
    return t_done();
}
