/* test_poll.c: claiming (semantic 3), cost (6), fairness (7), wait_time (8). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

static void insert_n(const char *ch, const char *args, int n, int retries, int64_t backoff)
{
    pqmq_msg **msgs = calloc((size_t)n, sizeof *msgs);
    for (int i = 0; i < n; i++) {
        msgs[i] = t_msg(ch, args, "job", "{\"k\": 1}", 0);
        pqmq_msg_set_retries(msgs[i], retries);
        pqmq_msg_set_backoff(msgs[i], backoff);
    }
    CHECK_OK(q, pqmq_insert(q, msgs, (size_t)n));
    t_msgs_free(msgs, (size_t)n);
    free(msgs);
}

/* As insert_n, at priority 1: messages that live in mq_rows, not the log. */
static void insert_rows_n(const char *ch, int n, int retries, int64_t backoff)
{
    pqmq_msg **msgs = calloc((size_t)n, sizeof *msgs);
    for (int i = 0; i < n; i++) {
        msgs[i] = t_msg(ch, NULL, "job", "{\"k\": 1}", 0);
        pqmq_msg_set_retries(msgs[i], retries);
        pqmq_msg_set_backoff(msgs[i], backoff);
        CHECK_OK(q, pqmq_msg_set_priority(msgs[i], 1));
    }
    CHECK_OK(q, pqmq_insert(q, msgs, (size_t)n));
    t_msgs_free(msgs, (size_t)n);
    free(msgs);
}

static void test_claim_sets_lease_attempts_backoff(void)
{
    t_truncate();
    insert_n("c", "a1", 1, 2, 1500);
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 5, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    const pqmq_job *j = pqmq_batch_job(b, 0);
    CHECK_STR(pqmq_job_channel(j), "c");
    CHECK_STR(pqmq_job_args(j), "a1");
    CHECK_STR(pqmq_job_name(j), "job");
    CHECK_STR(pqmq_job_json(j), "{\"k\": 1}");
    size_t len = 99;
    CHECK(pqmq_job_bytes(j, &len) == NULL && len == 0);
    CHECK_INT(pqmq_job_is_committed(j), 1);
    CHECK_INT(pqmq_job_attempt(j), 1);
    CHECK_INT(pqmq_job_retries_left(j), 2);
    CHECK_INT(pqmq_job_lease_ms(j), 1500);
    CHECK(pqmq_batch_job(b, 1) == NULL);
    pqmq_batch_free(b);
    /* The lease is attempt_at = now + backoff; the backoff doubled. */
    CHECK_INT(t_sql_int(pg, "SELECT attempts FROM mq_msgs"), 2);
    CHECK_INT(t_sql_int(pg, "SELECT extract(epoch FROM retry_backoff) * 1000 FROM mq_msgs"),
              3000);
    long long lease = t_sql_int(
        pg, "SELECT extract(epoch FROM attempt_at - clock_timestamp()) * 1000 FROM mq_msgs");
    CHECK(lease > 1000 && lease <= 1500);
}

static void test_exhausted_message_is_not_claimed_again(void)
{
    t_truncate();
    insert_n("c", NULL, 1, 0, 100); /* one delivery only */
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 5, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_INT(pqmq_job_retries_left(pqmq_batch_job(b, 0)), 0);
    pqmq_batch_free(b);
    t_sleep_ms(150);
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 5, &b));
    CHECK_INT(pqmq_batch_count(b), 0);
    CHECK_INT(pqmq_batch_wait_ms(b), -1); /* nothing will ever be ready */
    pqmq_batch_free(b);
    /* It is kept (a dead letter), not dropped, and never went negative. */
    CHECK_INT(t_sql_int(pg, "SELECT attempts FROM mq_msgs"), 0);
}

static void test_retries_are_exact(void)
{
    t_truncate();
    insert_n("c", NULL, 1, 3, 20);
    /* Leases of 20, 40, 80 and 160 ms: all four deliveries fit in a second. */
    int deliveries = 0;
    for (int64_t end = t_now_ms() + 1000; t_now_ms() < end; t_sleep_ms(10)) {
        pqmq_batch *b = NULL;
        CHECK_OK(q, pqmq_poll(q, NULL, 0, 5, &b));
        deliveries += (int)pqmq_batch_count(b);
        pqmq_batch_free(b);
    }
    CHECK_INT(deliveries, 4); /* first delivery + 3 retries */
}

static void test_wait_time(void)
{
    t_truncate();
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 5, &b));
    CHECK_INT(pqmq_batch_count(b), 0);
    CHECK_INT(pqmq_batch_wait_ms(b), -1);
    pqmq_batch_free(b);

    pqmq_msg *m = t_msg("later", NULL, "n", NULL, 0);
    pqmq_msg_set_delay(m, 2000);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    pqmq_msg_free(m);
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 5, &b));
    CHECK_INT(pqmq_batch_count(b), 0);
    CHECK(pqmq_batch_wait_ms(b) > 1500 && pqmq_batch_wait_ms(b) <= 2000);
    pqmq_batch_free(b);

    const char *mine[] = {"later"}, *other[] = {"elsewhere"};
    CHECK_OK(q, pqmq_poll(q, mine, 1, 5, &b));
    CHECK(pqmq_batch_wait_ms(b) > 1500 && pqmq_batch_wait_ms(b) <= 2000);
    pqmq_batch_free(b);
    CHECK_OK(q, pqmq_poll(q, other, 1, 5, &b));
    CHECK_INT(pqmq_batch_wait_ms(b), -1);
    pqmq_batch_free(b);

    /* The SQL contract: one row, NULL id, wait_time set. */
    PGresult *r =
        t_sql(pg, "SELECT id IS NULL, wait_time > interval '1 s' FROM mq_poll(NULL, 3)");
    CHECK(r && PQntuples(r) == 1);
    if (r && PQntuples(r) == 1) {
        CHECK_STR(PQgetvalue(r, 0, 0), "t");
        CHECK_STR(PQgetvalue(r, 0, 1), "t");
    }
    PQclear(r);
}

static void test_channel_filter(void)
{
    t_truncate();
    insert_n("x", "1", 3, 1, 1000);
    insert_n("y", "1", 3, 1, 1000);
    const char *only_x[] = {"x"};
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, only_x, 1, 100, &b));
    CHECK_INT(pqmq_batch_count(b), 3);
    for (size_t i = 0; i < pqmq_batch_count(b); i++)
        CHECK_STR(pqmq_job_channel(pqmq_batch_job(b, i)), "x");
    pqmq_batch_free(b);
}

static void test_busy_channel_does_not_starve_quiet_one(void)
{
    t_truncate();
    insert_n("busy", NULL, 5000, 1, 60000);
    insert_n("quiet", NULL, 1, 1, 60000);
    const char *both[] = {"busy", "quiet"};
    for (int filtered = 0; filtered < 2; filtered++) {
        t_exec(pg, "UPDATE mq_msgs SET attempt_at = created_at, attempts = 2");
        int polls = 0, found = 0;
        while (!found && polls < 3) {
            pqmq_batch *b = NULL;
            CHECK_OK(q, pqmq_poll(q, filtered ? both : NULL, filtered ? 2 : 0, 10, &b));
            polls++;
            for (size_t i = 0; i < pqmq_batch_count(b); i++)
                found |= !strcmp(pqmq_job_channel(pqmq_batch_job(b, i)), "quiet");
            pqmq_batch_free(b);
        }
        /* By global age it would wait behind 5,000 messages: 500 polls. */
        CHECK(found);
        CHECK_INT(polls, 1);
    }
}

/* 40 channels of one name, 200 messages each. */
static void one_name_backlog(void)
{
    t_truncate();
    for (int c = 0; c < 40; c++) {
        char args[16];
        snprintf(args, sizeof args, "a%d", c);
        insert_n("one", args, 200, 1, 60000);
    }
}

/* The channels of one name sit in one narrow range of chain keys (the
 * name's hash, then the args'): unfiltered polls must still go round all of
 * them. Each poll of 100 takes 25 from 4 channels, so 10 polls serve all 40.
 * A poll that started at a random key of the whole space would almost
 * always fall outside the name's range, hence start at its first channel:
 * 10 polls would serve 4 to 8. Behind a pooler that resets sessions
 * there is no turn to keep: see the next test. */
static void test_channels_of_one_name_are_served_in_turn(void)
{
    one_name_backlog();
    int served[40] = {0};
    for (int poll = 0; poll < 10; poll++) {
        pqmq_batch *b = NULL;
        CHECK_OK(q, pqmq_poll(q, NULL, 0, 100, &b));
        CHECK_INT((long long)pqmq_batch_count(b), 100);
        for (size_t i = 0; i < pqmq_batch_count(b); i++)
            served[atoi(pqmq_job_args(pqmq_batch_job(b, i)) + 1)]++;
        CHECK_OK(q, pqmq_complete_batch(q, b));
        pqmq_batch_free(b);
    }
    int channels = 0;
    for (int c = 0; c < 40; c++)
        channels += served[c] > 0;
    printf("    channels served by 10 polls of 100: %d of 40\n", channels);
    if (t_pooled())
        CHECK(channels >= 12);
    else
        CHECK_INT(channels, 40);
}

/* A session without a turn (its first poll, or every poll behind a pooler
 * that resets sessions) starts at a random channel of a name present, not at
 * the name's first one: 10 such polls of 100 (25 from each of 4 channels
 * in a row, from the start) serve about 26 of the 40 channels (fewer than
 * 12 once in a million runs); starting at the first channel, 4. */
static void test_without_a_turn_polls_start_within_the_name(void)
{
    one_name_backlog();
    PGconn *c = t_pg();
    int served[40] = {0}, got = 0;
    for (int poll = 0; poll < 10; poll++) {
        /* One transaction: behind a pooler the reset and the poll share it. */
        PGresult *r = PQexec(c, "SELECT set_config('pqmq.next_' || 'mq_msgs'::regclass::oid, "
                                "'', false); SELECT channel_args FROM mq_poll_jobs(NULL, 100)");
        CHECK_INT(PQresultStatus(r), PGRES_TUPLES_OK);
        for (int i = 0; i < PQntuples(r); i++, got++)
            served[atoi(PQgetvalue(r, i, 0) + 1) % 40]++;
        PQclear(r);
    }
    CHECK_INT(got, 1000);
    int channels = 0;
    for (int k = 0; k < 40; k++)
        channels += served[k] > 0;
    printf("    channels served by 10 polls of 100 without a turn: %d of 40\n", channels);
    CHECK(channels >= 12);
    PQfinish(c);
}

/* The place of the next poll is a session setting, so a session may set it
 * by hand: anything but a key counts as unset, and any key is a valid place
 * to start (every channel is still visited, wrapping around). */
static void test_turn_set_by_hand(void)
{
    t_truncate();
    insert_n("one", "a", 4, 1, 60000);
    insert_n("one", "b", 3, 1, 60000);
    PGconn *c = t_pg();
    const char *set =
        "SELECT set_config('pqmq.next_' || 'mq_msgs'::regclass::oid, '%s', false)";
    const char *any = "SELECT count(*) FROM mq_poll_jobs(NULL, 1) WHERE id IS NOT NULL";
    const char *values[] = {
        "not a key",        "-5", "12345678901234567", "", "7fffffffffffffff",
        "ffffffffffffffff", "0"};
    for (size_t i = 0; i < sizeof values / sizeof *values; i++) {
        t_exec(c, set, values[i]);
        CHECK_INT(t_sql_int(c, "%s", any), 1);
    }
    /* Each poll left its turn: the key after its channel's, in hex (behind a
     * pooler that resets sessions, gone with the transaction). */
    if (!t_pooled())
        CHECK_INT(t_sql_int(c, "SELECT (current_setting('pqmq.next_' || "
                               "'mq_msgs'::regclass::oid, true) ~ '^[0-9a-f]{1,16}$')::int"),
                  1);
    /* Seven messages, one a poll: the polls above left none behind. */
    CHECK_INT(t_sql_int(c, "%s", any), 0);
    PQfinish(c);
}

/* Index and heap tuples the server read for one poll of batch_size, from
 * the statistics of this test's tables. */
/* A backend flushes its counters before it reports idle, when forced: so
 * after this the statistics pg reads hold every earlier statement of q's
 * connection, of conn and of pg. */
static void flush_stats(PGconn *conn)
{
    t_exec(pqmq_conn(q), "SELECT pg_stat_force_next_flush()");
    t_exec(conn, "SELECT pg_stat_force_next_flush()");
    t_exec(pg, "SELECT pg_stat_force_next_flush()");
    t_exec(pg, "SELECT pg_stat_clear_snapshot()");
}

/* Rows of mq_msgs read by one mq_poll_jobs(NULL, batch_size) on conn. */
static long long tuples_read_by_poll_on(PGconn *conn, int batch_size)
{
    flush_stats(conn);
    const char *sql =
        "SELECT COALESCE(sum(COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0)), 0) "
        "FROM pg_stat_user_tables WHERE schemaname = current_schema() "
        "AND relname IN ('mq_rows', 'mq_log', 'mq_cursors', 'mq_receipts', 'mq_done', "
        "'mq_log_gone')";
    /* The poll alone, not the sweep of every channel's late producers that
     * a session's upkeep adds every ten seconds (_mq_log_upkeep). */
    t_exec(conn, "SELECT set_config('pqmq.log_swept', "
                 "floor(extract(epoch FROM clock_timestamp()))::bigint::text, false)");
    long long before = t_sql_int(pg, "%s", sql);
    PGresult *r = t_sql(conn, "SELECT count(*) FROM mq_poll_jobs(NULL, %d)", batch_size);
    PQclear(r);
    flush_stats(conn);
    return t_sql_int(pg, "%s", sql) - before;
}

static long long tuples_read_by_poll_of(int batch_size)
{
    return tuples_read_by_poll_on(pg, batch_size);
}

static long long tuples_read_by_poll(void)
{
    return tuples_read_by_poll_of(10);
}

/* Replaces the queue with per_chain messages on each of nchains chains:
 * channels "<prefix>N", or with args, args "<prefix>N" of channel "big". */
static void backlog(const char *prefix, int nchains, int per_chain, int as_args)
{
    t_exec(pg, "SET stats_fetch_consistency = none");
    t_truncate();
    for (int c = 0; c < nchains; c++) {
        char key[16];
        snprintf(key, sizeof key, "%s%d", prefix, c);
        insert_n(as_args ? "big" : key, as_args ? key : NULL, per_chain, 1, 60000);
    }
    t_exec(pg, "ANALYZE mq_rows, mq_log, mq_cursors, mq_receipts");
}

static void test_poll_cost_does_not_grow_with_backlog(void)
{
    if (t_citus_skip("the statistics counters read are the worker's"))
        return;
    backlog("s", 10, 10, 0);
    long long small = tuples_read_by_poll();
    backlog("a", 2000, 10, 1);
    long long big = tuples_read_by_poll();
    printf("    tuples read per poll: %lld with 100 messages, %lld with 20,000\n", small, big);
    CHECK(small > 0);
    /* Grouping the backlog (the seed's way) reads all 20,000 rows. */
    CHECK(big < 400);
    CHECK(big < 4 * small + 100);
}

/* A poll takes each channel's oldest ready rows in index order and stops
 * there: it must not read (and sort) a whole channel to return a few of its
 * rows, whatever plan the statistics suggest. */
static void test_poll_reads_channels_in_index_order(void)
{
    if (t_citus_skip("the statistics counters read are the worker's"))
        return;
    backlog("d", 100, 200, 0);
    long long read = tuples_read_by_poll_of(100);
    printf("    tuples read by a poll of 100 from 100 channels of 200: %lld\n", read);
    /* 4 channels of 25 each, plus the probes; a whole-channel read is 800. */
    CHECK(read >= 100);
    CHECK(read < 400);
}

/* Calls of the log's claim step (_mq_log_claim) made by a poll of
 * batch_size of every channel on a connection of its own: what its walks
 * cost. Sets *n to the jobs it got. Returns -1 when the calls cannot be
 * counted (counting needs track_functions, which only a superuser sets, on
 * the server session that polls: not behind a pooler). */
static long long claim_steps_of_poll(int batch_size, long long *n)
{
    PGconn *c = t_pg();
    PGresult *r = PQexec(c, "SET track_functions = 'pl'");
    int counted = PQresultStatus(r) == PGRES_COMMAND_OK && !t_pooled();
    PQclear(r);
    const char *calls = "SELECT COALESCE(sum(calls), 0) FROM pg_stat_user_functions "
                        "WHERE schemaname = current_schema() AND funcname = '_mq_log_claim'";
    flush_stats(c);
    long long before = t_sql_int(pg, "%s", calls);
    *n = t_sql_int(c, "SELECT count(*) FROM mq_poll_jobs(NULL, %d)", batch_size);
    flush_stats(c);
    long long steps = t_sql_int(pg, "%s", calls) - before;
    PQfinish(c);
    return counted ? steps : -1;
}

/* A thin backlog (a message a channel) fills a poll in a step or two of
 * the log's walk: after a step whose channels gave less than their share,
 * the next visits as many channels as the rest needs at that density,
 * where steps of want / per_key channels each took 25 claims here. */
static void test_thin_channels_fill_a_poll_in_few_steps(void)
{
    if (t_citus_skip("nothing is logged on Citus"))
        return;
    backlog("t", 100, 1, 0);
    long long n = 0, steps = claim_steps_of_poll(100, &n);
    CHECK_INT(n, 100);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_receipts"), 100);
    if (steps >= 0) {
        printf("    steps of the walk for a poll of 100 from 100 channels of 1: %lld\n", steps);
        CHECK(steps >= 1 && steps <= 3);
    } else {
        printf("    not a superuser, or pooled: the walk's steps not counted\n");
    }
}

/* A poll whose first round of the log came back short with every channel
 * it took from drained walks the log once: a second round could only find
 * what committed since. One channel that gave its whole share still gets a
 * second round, which fills the batch from it. */
static void test_drained_first_round_walks_once(void)
{
    if (t_citus_skip("nothing is logged on Citus"))
        return;
    backlog("s", 3, 1, 0);
    long long n = 0, steps = claim_steps_of_poll(10, &n);
    CHECK_INT(n, 3);
    if (steps >= 0) {
        printf("    steps for a poll of 10 from 3 channels of 1: %lld\n", steps);
        CHECK_INT(steps, 1);
    }
    /* One deep channel beside three thin ones: its first share is a quarter
     * of the batch, and the second round takes the rest from it. */
    backlog("s", 3, 1, 0);
    insert_n("deep", NULL, 20, 1, 60000);
    steps = claim_steps_of_poll(10, &n);
    CHECK_INT(n, 10);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_log l JOIN mq_cursors c "
                            "ON c.channel_key = l.channel_key "
                            "WHERE c.channel_name = 'deep' AND l.place <= c.place"),
              7);
    if (steps >= 0)
        CHECK(steps >= 2);
}

/* Messages in flight keep their place among the ready ones (a claim is a
 * HOT update), so a poll steps over them: once, not once per pass. Here
 * 800 of one channel's 1,000 messages are in flight at the head of the
 * channel; an unfiltered poll of 100 takes 25 from the channel's scan and
 * tops up from the time index, which starts where the first claimable
 * message is instead of at the head again (a top-up from the head would
 * step over the 800 a second time: about 1,700 rows). */
static void test_in_flight_are_stepped_over_once(void)
{
    if (t_citus_skip("the statistics counters read are the worker's"))
        return;
    t_exec(pg, "SET stats_fetch_consistency = none");
    t_truncate();
    for (int i = 0; i < 10; i++) /* batches of 100: one place (ready_at) each */
        insert_n("inflight", NULL, 100, 1, 60000);
    for (int i = 0; i < 8; i++) {
        pqmq_batch *b = NULL;
        CHECK_OK(q, pqmq_poll(q, (const char *[]){"inflight"}, 1, 100, &b));
        CHECK_INT(pqmq_batch_count(b), 100);
        pqmq_batch_free(b);
    }
    t_exec(pg, "ANALYZE mq_rows, mq_log, mq_cursors, mq_receipts");
    long long read = tuples_read_by_poll_of(100);
    printf("    tuples read by a poll of 100 behind 800 in flight on its channel: %lld\n",
           read);
    /* A logged message in flight is below its channel's cursor: a poll never
     * reads it (layout a's poll stepped over the 800 once: about 1,000). */
    CHECK(read >= 100);
    CHECK(read < 300);
}

/* What the queue's tables counted so far: [0] rows inserted into the log
 * and mq_rows, [1] their rows updated, [2] receipts inserted, [3] cursor
 * updates, [4] of them HOT. */
static void write_counts(long long out[5])
{
    t_exec(pg, "SELECT pg_stat_force_next_flush()");
    t_exec(pqmq_conn(q), "SELECT pg_stat_force_next_flush()");
    const char *sum = "SELECT COALESCE(sum(%s), 0) FROM pg_stat_user_tables "
                      "WHERE schemaname = current_schema() AND relname IN (%s)";
    out[0] = t_sql_int(pg, sum, "n_tup_ins", "'mq_log', 'mq_rows'");
    out[1] = t_sql_int(pg, sum, "n_tup_upd", "'mq_log', 'mq_rows'");
    out[2] = t_sql_int(pg, sum, "n_tup_ins", "'mq_receipts'");
    out[3] = t_sql_int(pg, sum, "n_tup_upd", "'mq_cursors'");
    out[4] = t_sql_int(pg, sum, "n_tup_hot_upd", "'mq_cursors'");
}

/* A claim writes nothing per message (semantic 3): no message row is
 * written or updated, and no index entry; it moves each channel's cursor (a
 * HOT update) and writes one receipt a channel it took from. */
static void test_claim_writes_no_index_entry(void)
{
    if (t_citus_skip("the statistics counters read are the worker's"))
        return;
    t_exec(pg, "SET stats_fetch_consistency = none");
    t_truncate();
    for (int c = 0; c < 3; c++) {
        char ch[8];
        snprintf(ch, sizeof ch, "h%d", c);
        insert_n(ch, NULL, 100, 3, 60000);
    }
    long long before[5], after[5];
    write_counts(before);
    size_t claimed = 0;
    for (int i = 0; i < 3; i++) {
        pqmq_batch *b = NULL;
        CHECK_OK(q, pqmq_poll(q, NULL, 0, 100, &b));
        claimed += pqmq_batch_count(b);
        pqmq_batch_free(b);
    }
    write_counts(after);
    CHECK_INT(claimed, 300);
    printf("    claims of 300: %lld message rows written, %lld receipts, %lld cursor "
           "updates (%lld HOT)\n",
           after[0] - before[0] + after[1] - before[1], after[2] - before[2],
           after[3] - before[3], after[4] - before[4]);
    CHECK_INT(after[0] - before[0], 0);
    CHECK_INT(after[1] - before[1], 0);
    CHECK(after[2] - before[2] >= 3 && after[2] - before[2] <= 12);
    /* A claim's move of each cursor it took from, and at most one upkeep
     * of each channel (its settled and reclaimed places): per channel and
     * poll, never per message. */
    CHECK(after[3] - before[3] >= 3 && after[3] - before[3] <= 12 + 2 * 3);
    CHECK_INT(after[4] - before[4], after[3] - before[3]);
    /* The messages in flight are not claimed again. */
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 100, &b));
    CHECK_INT(pqmq_batch_count(b), 0);
    pqmq_batch_free(b);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE ready_at < attempt_at"), 300);
}

/* Where a message sits in the ready order (ready_at) moves only when its
 * lease does by more than a claim: a failure moves it to the new attempt_at
 * and a keep-alive a microsecond before it (out of the polls' way, and
 * still told apart as leased: schema/lease.sql), a final attempt moves to
 * 'infinity', where mq_reap_dead finds it once its lease has run out. */
static void test_place_moves_with_keep_alive_and_failure(void)
{
    t_truncate();
    insert_n("place", "a", 1, 3, 60000); /* kept alive */
    insert_n("place", "b", 1, 3, 60000); /* fails */
    insert_n("place", "c", 1, 0, 100);   /* final attempt, lease 0.1 s */
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 3);
    for (size_t i = 0; i < pqmq_batch_count(b); i++) {
        const pqmq_job *j = pqmq_batch_job(b, i);
        uuid_t id;
        pqmq_job_id(j, id);
        if (strcmp(pqmq_job_args(j), "a") == 0)
            CHECK_OK(q, pqmq_keep_alive(q, (const uuid_t *)&id, 1, 120000, NULL));
        else if (strcmp(pqmq_job_args(j), "b") == 0)
            CHECK_OK(q, pqmq_fail(q, id, "no"));
    }
    pqmq_batch_free(b);
    const char *where = "FROM mq_msgs WHERE channel_args = '%s'";
    char sql[128];
    snprintf(sql, sizeof sql,
             "SELECT (ready_at = attempt_at - interval '1 microsecond')::int %s", where);
    CHECK_INT(t_sql_int(pg, sql, "a"), 1);
    snprintf(sql, sizeof sql, "SELECT (ready_at = attempt_at)::int %s", where);
    CHECK_INT(t_sql_int(pg, sql, "b"), 1);
    snprintf(sql, sizeof sql, "SELECT (ready_at = 'infinity')::int %s", where);
    CHECK_INT(t_sql_int(pg, sql, "c"), 1);
    t_sleep_ms(150);
    CHECK_INT(t_sql_int(pg, "SELECT mq_reap_dead()"), 1);
    snprintf(sql, sizeof sql, "SELECT (dead_since IS NOT NULL)::int %s", where);
    CHECK_INT(t_sql_int(pg, sql, "c"), 1);
}

/* Statistics lag a queue: ANALYZE saw it empty, then 20,000 messages came.
 * A plan made then (a new session's) must still walk each channel's range
 * of the channel index: a plan that took the time index and filtered by
 * channel read the whole ready backlog for every channel it visited, and
 * a steady load fell to a tenth of its rate. */
static void test_poll_cost_with_stale_statistics(void)
{
    if (t_citus_skip("the statistics counters read are the worker's"))
        return;
    t_exec(pg, "SET stats_fetch_consistency = none");
    t_truncate();
    insert_n("stale", NULL, 20, 1, 60000);
    t_exec(pg, "DELETE FROM mq_msgs");
    t_exec(pg, "VACUUM ANALYZE mq_rows, mq_log, mq_cursors, mq_receipts");
    /* A consumer starts while the queue is empty: its plans are made now. */
    PGconn *early = t_pg();
    PQclear(t_sql(early, "SELECT count(*) FROM mq_poll_jobs(NULL, 100)"));
    for (int c = 0; c < 100; c++) {
        char ch[16];
        snprintf(ch, sizeof ch, "stale%d", c);
        insert_n(ch, NULL, 200, 1, 60000);
    }
    long long read = tuples_read_by_poll_on(early, 100);
    PQfinish(early);
    printf("    tuples read by a poll of 100 from 20,000 the statistics never saw: %lld\n",
           read);
    CHECK(read >= 100);
    CHECK(read < 1000);
}

static void test_poll_bad_inputs(void)
{
    pqmq_batch *b = (pqmq_batch *)1;
    CHECK_ERR(q, pqmq_poll(q, NULL, 0, 0, &b), PQMQ_EINVAL, "batch_size 0 is outside");
    CHECK(b == NULL);
    CHECK_ERR(q, pqmq_poll(q, NULL, 0, -5, &b), PQMQ_EINVAL, "batch_size -5");
    CHECK_ERR(q, pqmq_poll(q, NULL, 0, PQMQ_MAX_BATCH + 1, &b), PQMQ_EINVAL,
              "outside 1..10000");
    const char *chans[] = {"a", NULL};
    CHECK_ERR(q, pqmq_poll(q, chans, 2, 1, &b), PQMQ_EINVAL, "channels[1] is NULL");
    CHECK_ERR(q, pqmq_poll(q, chans, 0, 1, &b), PQMQ_EINVAL, "nchannels is 0");
    CHECK_INT(pqmq_poll(q, NULL, 0, 1, NULL), PQMQ_EINVAL);
    /* The SQL function checks too. */
    PGresult *r = PQexec(pg, "SELECT * FROM mq_poll(NULL, 0)");
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22023");
    PQclear(r);
}

/* mq_claim_lane knows lanes 0, 1 and 2: another (or NULL) is refused by
 * name, before anything is claimed. */
static void test_claim_lane_refuses_a_bad_lane(void)
{
    t_truncate();
    insert_n("badlane", NULL, 1, 1, 60000);
    const char *bad[] = {"SELECT * FROM mq_claim_lane(NULL, 1, 3)",
                         "SELECT * FROM mq_claim_lane(NULL, 1, -1)",
                         "SELECT * FROM mq_claim_lane(NULL, 1, NULL)"};
    const char *said[] = {"lane 3 is not 0, 1 or 2", "lane -1 is not 0, 1 or 2",
                          "lane <NULL> is not 0, 1 or 2"};
    for (int i = 0; i < 3; i++) {
        PGresult *r = PQexec(pg, bad[i]);
        CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22023");
        const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
        CHECK(msg && strstr(msg, said[i]));
        PQclear(r);
    }
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_claim_lane(NULL, 1, 0) "
                            "WHERE id IS NOT NULL"),
              1);
}

/* A result that is not the job row (a schema whose claim, mq_claim_lane,
 * returns other columns or other types, as a foreign schema might) is
 * refused, not misread. */
static void test_foreign_row_is_refused(void)
{
    char schema[96];
    snprintf(schema, sizeof schema, "%s_foreign", t_schema());
    t_exec(pg, "DROP SCHEMA IF EXISTS %s CASCADE", schema);
    t_exec(pg, "CREATE SCHEMA %s", schema);
    t_exec(
        pg,
        "CREATE FUNCTION %s.mq_claim_lane(text[], int, int) RETURNS TABLE(id uuid, name text) "
        "LANGUAGE sql AS $$ SELECT gen_random_uuid(), 'x' $$",
        schema);
    /* The path for one transaction: also right behind a transaction pooler. */
    PGconn *conn = t_pg();
    t_exec(conn, "BEGIN");
    t_exec(conn, "SET LOCAL search_path TO %s", schema);
    pqmq_client *c = NULL;
    CHECK_INT(pqmq_wrap(conn, &c), 0);
    pqmq_batch *b = NULL;
    CHECK_ERR(c, pqmq_poll(c, NULL, 0, 10, &b), PQMQ_ESCHEMA, "not a job row");
    CHECK(b == NULL);
    /* The job row's names with a column of another type (the row is read
     * field by field in binary, job.c): refused too. */
    t_exec(conn, "DROP FUNCTION %s.mq_claim_lane(text[], int, int)", schema);
    t_exec(conn,
           "CREATE FUNCTION %s.mq_claim_lane(text[], int, int) RETURNS TABLE(id uuid, "
           "is_committed boolean, name text, payload_json text, payload_bytes bytea, "
           "retry_backoff interval, wait_time interval, channel_name text, channel_args text, "
           "attempt bigint, attempts_left int, last_error text, blocking boolean) "
           "LANGUAGE sql AS $$ SELECT gen_random_uuid(), true, 'x', NULL, NULL::bytea, "
           "interval '1 second', NULL::interval, 'c', '', 1::bigint, 3, NULL, false $$",
           schema);
    CHECK_ERR(c, pqmq_poll(c, NULL, 0, 10, &b), PQMQ_ESCHEMA, "not a job row");
    CHECK(b == NULL);
    pqmq_client_free(c);
    t_exec(conn, "ROLLBACK");
    PQfinish(conn);
    t_exec(pg, "DROP SCHEMA %s CASCADE", schema);
}

/* ---- the low-water mark ---------------------------------------------------- */

/* While another transaction holds back the xmin horizon, deleted messages
 * stay in the indexes and their row versions in the heap. A poll starts
 * where live rows start (_mq_low_mark), so it passes those entries in the
 * index instead of fetching each from the heap. */
static void test_held_snapshot_dead_entries_are_passed(void)
{
    if (t_citus_skip("the statistics counters read are the worker's"))
        return;
    if (t_pooled()) {
        /* The mark is per server connection, which a pooler changes. */
        printf("    skipped behind a pooler\n");
        return;
    }
    t_exec(pg, "SET stats_fetch_consistency = none");
    t_truncate();
    PGconn *holder = t_pg(), *c = t_pg();
    t_exec(holder, "BEGIN ISOLATION LEVEL REPEATABLE READ");
    CHECK_INT(t_sql_int(holder, "SELECT count(*) FROM mq_msgs"), 0);
    /* 100 batches of one message per channel: a channel's rows lie on
     * 100 heap pages, so stepping over them visits each page. */
    char ch[20][16];
    for (int i = 0; i < 20; i++)
        snprintf(ch[i], sizeof ch[i], "held%d", i);
    for (int b = 0; b < 100; b++) {
        pqmq_msg *m[20];
        for (int i = 0; i < 20; i++)
            m[i] = t_msg(ch[i], NULL, "job", "{}", 0);
        CHECK_OK(q, pqmq_insert(q, m, 20));
        t_msgs_free(m, 20);
    }
    t_sleep_ms(1200);                  /* the mark is never later than a second ago */
    t_exec(pg, "DELETE FROM mq_msgs"); /* 2,000 dead rows the holder keeps */
    for (int i = 0; i < 20; i++)
        insert_n(ch[i], NULL, 5, 1, 60000);
    /* c's first poll finds the mark, stepping over the dead rows once. */
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM mq_poll_jobs(NULL, 1)"), 1);
    /* Heap pages visited (buffer hits and reads): the statistics count
     * only the rows an index scan returns, not the dead ones it passes. */
    flush_stats(c);
    const char *sql =
        "SELECT sum(heap_blks_hit + heap_blks_read) FROM pg_statio_user_tables "
        "WHERE schemaname = current_schema() AND relname IN ('mq_rows', 'mq_log', "
        "'mq_cursors', 'mq_receipts', 'mq_done', 'mq_log_gone')";
    long long before = t_sql_int(pg, "%s", sql);
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM mq_poll_jobs(NULL, 100)"), 99);
    flush_stats(c);
    long long visits = t_sql_int(pg, "%s", sql) - before;
    printf("    heap pages visited by a poll of 100 behind 2,000 dead rows held by a "
           "snapshot: %lld\n",
           visits);
    /* The 99 rows taken, read and updated, and the probes' rows; from each
     * channel's head it would be each of the 2,000 dead rows as well. */
    CHECK(visits >= 99);
    CHECK(visits < 1000);
    t_exec(holder, "ROLLBACK");
    PQfinish(holder);
    PQfinish(c);
}

/* Rows and index entries of table the server read (sequential scans,
 * index scans and bitmaps alike), from the statistics. */
static long long table_reads(PGconn *c, const char *table)
{
    flush_stats(c);
    return t_sql_int(pg,
                     "SELECT COALESCE(t.seq_tup_read, 0) + ("
                     "SELECT COALESCE(sum(i.idx_tup_read), 0) FROM pg_stat_user_indexes i "
                     "WHERE i.relid = t.relid) "
                     "FROM pg_stat_user_tables t "
                     "WHERE t.schemaname = current_schema() AND t.relname = '%s'",
                     table);
}

static long long receipt_reads(PGconn *c)
{
    return table_reads(c, "mq_receipts");
}

/* How many messages one poll of batch_size claimed (left in flight). */
static size_t claimed_by_poll(int batch_size)
{
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, batch_size, &b));
    size_t n = b ? pqmq_batch_count(b) : 0;
    pqmq_batch_free(b);
    return n;
}

/* Rounds of per_round channels, one message each, polled and completed
 * within their ten-minute leases: finished receipts, whose entries stay in
 * the open receipts' index until vacuum. */
static void finish_receipts(int rounds, int per_round)
{
    for (int round = 0; round < rounds; round++) {
        for (int i = 0; i < per_round; i++) {
            char ch[16];
            snprintf(ch, sizeof ch, "fin%d", i);
            insert_n(ch, NULL, 1, 1, 600000);
        }
        pqmq_batch *b = NULL;
        CHECK_OK(q, pqmq_poll(q, NULL, 0, per_round, &b));
        CHECK_INT(pqmq_batch_count(b), per_round);
        CHECK_OK(q, pqmq_complete_batch(q, b));
        pqmq_batch_free(b);
    }
}

/* Semantic 8 beside a message in flight: an empty poll's wait time is
 * when its lease runs out, or 5 s when that is later, and the poll reads
 * few of the entries that the receipts finished since the last vacuum
 * leave in the open receipts' index (a held snapshot keeps every one). */
static void test_wait_time_beside_finished_receipts(void)
{
    if (t_citus_skip("nothing is logged on Citus, and the counters read are the worker's"))
        return;
    t_exec(pg, "SET stats_fetch_consistency = none");
    t_truncate();
    PGconn *holder = t_pg();
    t_exec(holder, "BEGIN ISOLATION LEVEL REPEATABLE READ");
    CHECK_INT(t_sql_int(holder, "SELECT count(*) FROM mq_msgs"), 0);
    finish_receipts(3, 300);
    /* None open. (The upkeep may have deleted the first rounds' receipts
     * when the rounds took over a second: their old entries stay in the
     * open receipts' index all the same, under the held snapshot.) */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_receipts WHERE lease_until < 'infinity'"),
              0);
    /* One in flight for ten minutes: the poll looks again in 5 s. */
    insert_n("live", NULL, 1, 1, 600000);
    CHECK_INT(claimed_by_poll(1), 1);
    /* The poll alone, not the sweep of the log's channels that a session
     * makes once a second (_mq_log_upkeep). */
    t_exec(pqmq_conn(q), "SELECT set_config('pqmq.log_swept', "
                         "floor(extract(epoch FROM clock_timestamp()))::bigint::text, false)");
    long long before = receipt_reads(pqmq_conn(q));
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 0);
    CHECK(pqmq_batch_wait_ms(b) > 4000 && pqmq_batch_wait_ms(b) <= 5000);
    pqmq_batch_free(b);
    long long read = receipt_reads(pqmq_conn(q)) - before;
    printf("    receipts' rows and index entries read by an empty poll beside 900 finished "
           "receipts: %lld\n",
           read);
    /* (Behind a pooler the session's sweep runs as well: the setting that
     * holds it back lasts one transaction.) */
    if (!t_pooled()) {
        CHECK(read >= 1); /* the one in flight */
        CHECK(read < 100);
    }
    /* One in flight for two seconds: the poll says when it runs out. */
    t_exec(pg, "DELETE FROM mq_msgs WHERE channel_name = 'live'");
    insert_n("soon", NULL, 1, 1, 2000);
    CHECK_INT(claimed_by_poll(1), 1);
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 0);
    CHECK(pqmq_batch_wait_ms(b) > 1000 && pqmq_batch_wait_ms(b) <= 2000);
    pqmq_batch_free(b);
    /* Nothing in flight: nothing can become ready. */
    t_exec(pg, "DELETE FROM mq_msgs");
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 0);
    CHECK_INT(pqmq_batch_wait_ms(b), -1);
    pqmq_batch_free(b);
    t_exec(holder, "ROLLBACK");
    PQfinish(holder);
}

/* Reclaim deletes a channel's finished part only up to its first message
 * in flight: below it, not past it, and the rest once it is completed. */
static void test_reclaim_stops_short_of_a_message_in_flight(void)
{
    if (t_citus_skip("the log's cursors: nothing is logged on Citus"))
        return;
    t_truncate();
    insert_n("rc", NULL, 3, 1, 60000);
    const char *one = "SELECT id FROM mq_claim(ARRAY['rc'], 1) WHERE id IS NOT NULL";
    t_exec(pg, "SELECT mq_complete(ARRAY(%s))", one);
    PGresult *r = t_sql(pg, "%s", one);
    CHECK(r && PQntuples(r) == 1);
    char held[64] = "";
    if (r && PQntuples(r) == 1)
        snprintf(held, sizeof held, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    t_exec(pg, "SELECT mq_complete(ARRAY(%s))", one);
    int settled = 0;
    for (int i = 0; i < 50 && !settled; i++) {
        t_exec(pg, "SELECT _mq_log_settle(clock_timestamp(), NULL)");
        settled = t_sql_int(pg, "SELECT count(*) FROM mq_cursors WHERE settled = place") == 1;
        if (!settled)
            t_sleep_ms(100);
    }
    CHECK(settled);
    t_exec(pg, "SELECT _mq_log_reclaim(NULL)");
    /* The first is gone; the one in flight and the one after it stay. */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_log"), 2);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_log WHERE id = '%s'", held), 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_receipts"), 2);
    CHECK_INT(t_sql_int(pg, "SELECT mq_complete(ARRAY['%s'::uuid])", held), 1);
    t_exec(pg, "SELECT _mq_log_reclaim(NULL)");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_log"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_receipts"), 0);
}

/* The sweep's look for drained channels to retire probes each drained
 * channel's log and receipts past its reclaimed place, not at the entries
 * of the rows and receipts deleted up to it (a held snapshot keeps every
 * one until it ends). */
static void test_retire_probes_pass_what_was_reclaimed(void)
{
    if (t_citus_skip("nothing is logged on Citus, and the counters read are the worker's"))
        return;
    t_exec(pg, "SET stats_fetch_consistency = none");
    t_truncate();
    for (int round = 0; round < 30; round++) {
        insert_n("drain", NULL, 10, 1, 60000);
        t_exec(pg, "SELECT mq_complete(array_agg(id)) FROM mq_claim(ARRAY['drain'], 100)");
    }
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_receipts"), 30);
    PGconn *holder = t_pg();
    int settled = 0;
    for (int i = 0; i < 50 && !settled; i++) {
        t_exec(pg, "SELECT _mq_log_settle(clock_timestamp(), NULL)");
        settled = t_sql_int(pg, "SELECT count(*) FROM mq_cursors WHERE settled = place") == 1;
        if (!settled)
            t_sleep_ms(100);
    }
    CHECK(settled);
    t_exec(holder, "BEGIN ISOLATION LEVEL REPEATABLE READ");
    CHECK_INT(t_sql_int(holder, "SELECT count(*) FROM mq_cursors"), 1);
    t_exec(pg, "SELECT _mq_log_reclaim(NULL)");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_cursors WHERE reclaimed = place"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_log"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_receipts"), 0);
    /* The plans of a large queue, whose probes read the index by channel
     * (on tables this small a plan may read the heap, which counts only
     * the rows it returns). */
    t_exec(pg, "SET enable_seqscan = off");
    long long log0 = table_reads(pg, "mq_log"), rec0 = table_reads(pg, "mq_receipts");
    t_exec(pg, "SELECT _mq_log_retire(clock_timestamp())");
    t_exec(pg, "RESET enable_seqscan");
    long long log = table_reads(pg, "mq_log") - log0;
    long long rec = table_reads(pg, "mq_receipts") - rec0;
    printf("    a drained channel's probes past 300 rows and 30 receipts deleted: "
           "%lld log and %lld receipt entries read\n",
           log, rec);
    /* Behind a pooler the setting lasts one transaction, and the counters
     * flushed between the two reads may be another server connection's. */
    if (!t_pooled()) {
        CHECK(log < 10);
        CHECK(rec < 10);
    }
    /* Seen drained: retired ten minutes later. */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_cursors WHERE drained_at IS NOT NULL"), 1);
    t_exec(holder, "ROLLBACK");
    PQfinish(holder);
}

/* An empty poll with nothing in flight, beside receipts finished since the
 * last vacuum (their old entries stay in the open receipts' index): the
 * poll's look for a lease that ends later reads the index from the top
 * down, marks the entries it passes dead, and the next poll skips them,
 * whatever the planner would rather do: under load the statistics count few
 * open receipts and a bitmap, which reads every entry each time, looks
 * cheap; here the session's enable_indexscan = off stands for that. */
static void test_wait_time_nothing_in_flight(void)
{
    if (t_citus_skip("nothing is logged on Citus, and the counters read are the worker's"))
        return;
    t_exec(pg, "SET stats_fetch_consistency = none");
    t_truncate();
    finish_receipts(2, 150);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_receipts WHERE lease_until < 'infinity'"),
              0);
    t_exec(pqmq_conn(q), "SET enable_indexscan = off");
    long long first = 0, second = 0;
    for (int i = 0; i < 2; i++) {
        /* The poll alone, not the session's sweep (_mq_log_upkeep). */
        t_exec(pqmq_conn(q),
               "SELECT set_config('pqmq.log_swept', "
               "floor(extract(epoch FROM clock_timestamp()))::bigint::text, false)");
        long long before = receipt_reads(pqmq_conn(q));
        pqmq_batch *b = NULL;
        CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
        CHECK_INT(pqmq_batch_count(b), 0);
        CHECK_INT(pqmq_batch_wait_ms(b), -1);
        pqmq_batch_free(b);
        *(i ? &second : &first) = receipt_reads(pqmq_conn(q)) - before;
    }
    t_exec(pqmq_conn(q), "RESET enable_indexscan");
    printf("    receipts' rows and index entries read by two empty polls beside 300 finished "
           "receipts: %lld, then %lld\n",
           first, second);
    if (!t_pooled())
        CHECK(second < 30);
}

/* Polls c with sql (a count of the message looked for) until it counts
 * one or limit_ms pass, inserting two messages on channel busy (NULL:
 * none) before each poll, so that no poll comes up empty; prints and
 * returns the wait in ms, or -1 when it never came. */
static int64_t poll_until_found(PGconn *c, const char *sql, int64_t limit_ms, const char *busy)
{
    int64_t start = t_now_ms();
    while (t_now_ms() - start < limit_ms) {
        if (busy)
            insert_n(busy, NULL, 2, 1, 60000);
        if (t_sql_int(c, "%s", sql) == 1) {
            int64_t waited = t_now_ms() - start;
            if (busy)
                printf("    found after %lld ms, channel \"%s\" kept busy\n", (long long)waited,
                       busy);
            else
                printf("    found after %lld ms\n", (long long)waited);
            return waited;
        }
        t_sleep_ms(busy ? 50 : 100);
    }
    printf("    not found in %lld ms\n", (long long)limit_ms);
    return -1;
}

/* A producer commits a message (channel "late") 1.5 s after inserting it,
 * once the poller returned has a mark past its place. Caller PQfinish'es. */
static PGconn *late_commit_behind_mark(void)
{
    PGconn *producer = t_pg(), *c = t_pg();
    t_exec(producer, "BEGIN");
    t_exec(producer, "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), NULL, 0, NULL, 'late', "
                     "NULL, NULL, false, 'job', '{}', NULL)::mq_new_t])");
    t_sleep_ms(1500);
    insert_n("early", NULL, 3, 1, 60000);
    /* c's mark: past the late message's place, which c cannot see yet. */
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM mq_poll_jobs(NULL, 1)"), 1);
    t_exec(producer, "COMMIT");
    PQfinish(producer);
    return c;
}

static const char late_found[] = "SELECT count(*) FROM mq_poll_jobs(NULL, %d) "
                                 "WHERE channel_name = 'late'";

/* A producer that commits long after its insert puts its message behind a
 * mark; the next poll that finds nothing else looks afresh. */
static void test_late_commit_is_found(void)
{
    t_truncate();
    PGconn *c = late_commit_behind_mark();
    char sql[128];
    snprintf(sql, sizeof sql, late_found, 10);
    int64_t waited = poll_until_found(c, sql, 5000, NULL);
    CHECK(waited >= 0);
    /* Within the empty polls' second, not at the ten-second refresh. */
    CHECK(waited < 3000);
    PQfinish(c);
}

/* Under continuous load no poll comes up empty, so such a message waits
 * for the mark to be found afresh: ten seconds at most (docs/sql-contract.md). */
static void test_late_commit_under_load_waits_ten_seconds_at_most(void)
{
    if (t_pooled()) {
        /* The mark is per server connection, which a pooler changes. */
        printf("    skipped behind a pooler\n");
        return;
    }
    t_truncate();
    PGconn *c = late_commit_behind_mark();
    char sql[128];
    snprintf(sql, sizeof sql, late_found, 1);
    int64_t waited = poll_until_found(c, sql, 15000, "busy");
    CHECK(waited >= 0);
    CHECK(waited < 12000);
    PQfinish(c);
}

/* A logged message whose producer commits after a claim took a later
 * message of its channel: the channel's cursor is past its place, so only
 * the log's upkeep (_mq_log_settle) finds it. Returns the consumer's
 * connection (the caller PQfinish'es), which took the later message. */
static PGconn *late_behind_cursor(void)
{
    PGconn *producer = t_pg(), *c = t_pg();
    /* The channel first (a producer that adds a channel holds its new
     * cursor, and so the channel's other producers, until it ends). */
    insert_n("lx", NULL, 1, 1, 60000);
    t_exec(producer, "BEGIN");
    t_exec(producer, "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), NULL, 0, NULL, 'lx', "
                     "NULL, NULL, false, 'lost', '{}', NULL)::mq_new_t])");
    insert_n("lx", NULL, 1, 1, 60000);
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM mq_poll_jobs(ARRAY['lx'], 10)"), 2);
    t_exec(producer, "COMMIT");
    PQfinish(producer);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_log WHERE name = 'lost' "
                            "AND place < (SELECT place FROM mq_cursors "
                            "WHERE channel_name = 'lx')"),
              1);
    return c;
}

static const char lost_found[] =
    "SELECT count(*) FROM mq_poll_jobs(NULL, %d) WHERE name = 'lost'";

/* Eight channels of 50 plain messages: enough for round 1 of the log (a
 * quarter of the batch a channel) to fill any batch of 4 on its own. */
static void deep_backlog(void)
{
    for (int i = 0; i < 8; i++) {
        char args[8];
        snprintf(args, sizeof args, "d%d", i);
        insert_n("deep", args, 50, 1, 60000);
    }
}

/* A channel's messages kept in mq_rows (a chain here; retries and late
 * producers' messages too) get their share of each poll though the log
 * could fill every batch (semantic 7). */
static void test_rows_are_not_starved_by_the_log(void)
{
    if (t_citus_skip("the log's share of a poll: nothing is logged on Citus"))
        return;
    t_truncate();
    deep_backlog();
    pqmq_msg *chain[3];
    for (int i = 0; i < 3; i++)
        chain[i] = t_msg("chained", "k", "job", "{\"k\": 1}", 1);
    CHECK_OK(q, pqmq_insert(q, chain, 3));
    t_msgs_free(chain, 3);
    /* Batches of 4: a chain's head in each of the first polls. */
    for (int i = 0; i < 3; i++) {
        CHECK_INT(t_sql_int(pg, "SELECT count(*) FILTER (WHERE channel_name = 'chained') "
                                "FROM mq_poll_jobs(NULL, 4)"),
                  1);
        t_exec(pg, "SELECT mq_complete(array_agg(id)) FROM mq_msgs "
                   "WHERE channel_name = 'chained' AND attempt_at > now()");
    }
    /* Batches of one: mq_rows' turn every other poll or so (at random). */
    t_exec(pg, "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), NULL, 0, NULL, 'later', NULL, "
               "NULL, true, 'job', '{}', NULL)::mq_new_t])");
    int polls = 0;
    while (polls < 40 && t_sql_int(pg, "SELECT count(*) FILTER (WHERE channel_name = 'later') "
                                       "FROM mq_poll_jobs(NULL, 1)") == 0)
        polls++;
    printf("    a chain's message in a poll of one after %d polls of the log\n", polls);
    CHECK(polls < 40);
}

/* How many polls of batch_size (limit at most) come before one that takes
 * a message of channel. */
static int polls_before(const char *channel, int batch_size, int limit)
{
    int polls = 0;
    while (polls < limit && t_sql_int(pg,
                                      "SELECT count(*) FILTER (WHERE channel_name = '%s') "
                                      "FROM mq_poll_jobs(NULL, %d)",
                                      channel, batch_size) == 0)
        polls++;
    return polls;
}

/* Waits until channel's one message is a row of mq_rows, ready, delivered
 * deliveries times before. */
static void wait_ready_row(const char *channel, int deliveries)
{
    const char *sql = "SELECT count(*) FROM mq_rows WHERE channel_name = '%s' "
                      "AND deliveries = %d AND dead_since IS NULL "
                      "AND ready_at <= clock_timestamp()";
    WAIT_UNTIL(t_sql_int(pg, sql, channel, deliveries) == 1, 5000);
    CHECK_INT(t_sql_int(pg, sql, channel, deliveries), 1);
}

/* A retry of a plain message on channel: logged, delivered and failed in
 * one statement (within its lease of 100 ms), then ready again in mq_rows
 * 100 ms later. */
static void make_retry(const char *channel)
{
    insert_n(channel, NULL, 1, 2, 100);
    /* Logged: no row of mq_rows yet. */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_rows WHERE channel_name = '%s'", channel),
              0);
    CHECK_INT(t_sql_int(pg,
                        "SELECT count(*) FROM mq_claim(ARRAY['%s'], 1) c "
                        "WHERE mq_fail(c.id, 'boom', c.attempt)",
                        channel),
              1);
    wait_ready_row(channel, 1);
}

/* A plain message on channel delayed by 100 ms (a row of mq_rows), once
 * its delay has passed. */
static void make_delayed(const char *channel)
{
    pqmq_msg *m = t_msg(channel, NULL, "job", "{\"k\": 1}", 0);
    pqmq_msg_set_delay(m, 100);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    pqmq_msg_free(m);
    wait_ready_row(channel, 0);
}

/* README, "Fairness": "Ordered channels, retries and delayed messages get
 * their share beside a deep backlog of plain messages". make puts one
 * message of channel, ready, in mq_rows; beside a log that could fill every
 * batch, the first poll of 4 takes it, and a poll of one within 40 (every
 * other poll or so, at random). */
static void check_row_share(const char *channel, void (*make)(const char *channel))
{
    t_truncate();
    deep_backlog();
    make(channel);
    CHECK_INT(polls_before(channel, 4, 3), 0);
    /* Cancelled, taken or not, so that the next check stands on its own. */
    t_exec(pg, "SELECT mq_delete(array_agg(id)) FROM mq_msgs WHERE channel_name = '%s'",
           channel);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE channel_name = '%s'", channel),
              0);
    make(channel);
    int polls = polls_before(channel, 1, 40);
    printf("    \"%s\" in a poll of one after %d polls of the log\n", channel, polls);
    CHECK(polls < 40);
}

/* README, "Fairness": retries get their share beside a deep backlog. */
static void test_retries_are_not_starved_by_the_log(void)
{
    if (t_citus_skip("the log's share of a poll: nothing is logged on Citus"))
        return;
    check_row_share("retried", make_retry);
}

/* README, "Fairness": delayed messages get their share beside a deep
 * backlog. */
static void test_delayed_are_not_starved_by_the_log(void)
{
    if (t_citus_skip("the log's share of a poll: nothing is logged on Citus"))
        return;
    check_row_share("delayed", make_delayed);
}

static const char got_any[] =
    "SELECT count(*) FROM mq_poll_jobs(NULL, 100) WHERE id IS NOT NULL";

/* Polls that find nothing delete the cursors of channels drained for ten
 * minutes, so a poll's walk does not grow with every channel ever used;
 * such a channel's next message makes its cursor again. */
static void test_drained_cursors_are_retired(void)
{
    if (t_citus_skip("the log's cursors: nothing is logged on Citus"))
        return;
    t_truncate();
    for (int i = 0; i < 300; i++) {
        char args[16];
        snprintf(args, sizeof args, "e%d", i);
        insert_n("ent", args, 1, 1, 60000);
    }
    t_exec(pg, "SELECT mq_complete(array_agg(id)) FROM mq_claim(NULL, 1000)");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_cursors"), 300);
    /* Drained for less than ten minutes: kept (a channel that drains and
     * fills again keeps its cursor). */
    /* (A sweep settles and reclaims at most 256 channels with work.) */
    for (int i = 0; i < 3; i++) {
        t_await_log_sweep();
        CHECK_INT(t_sql_int(pg, got_any), 0);
    }
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_cursors WHERE drained_at IS NOT NULL"),
              300);
    int polls = 0;
    while (polls < 20 && t_sql_int(pg, "SELECT count(*) FROM mq_cursors") > 0) {
        t_exec(pg, "UPDATE mq_cursors SET drained_at = drained_at - interval '11 minutes'");
        t_await_log_sweep();
        CHECK_INT(t_sql_int(pg, got_any), 0);
        polls++;
    }
    printf("    300 cursors drained ten minutes deleted by %d empty polls\n", polls);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_cursors"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_cursor_keys"), 0); /* gone with them */
    insert_n("ent", "e7", 1, 1, 60000);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_cursors"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_cursor_keys"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_poll_jobs(ARRAY['ent'], 10) "
                            "WHERE channel_args = 'e7'"),
              1);
}

/* A producer that found a channel's cursor just before a sweep deleted it
 * commits its message with no cursor over it: a later sweep, once that
 * producer has ended, gives the channel its cursor back, and the message is
 * delivered once. */
static void test_message_behind_a_retired_cursor_is_delivered(void)
{
    if (t_citus_skip("the log's cursors: nothing is logged on Citus"))
        return;
    t_truncate();
    insert_n("orph", NULL, 1, 1, 60000);
    t_exec(pg, "SELECT mq_complete(array_agg(id)) FROM mq_claim(ARRAY['orph'], 10)");
    PGconn *producer = t_pg();
    t_exec(producer, "BEGIN");
    t_exec(producer, "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), NULL, 0, NULL, 'orph', "
                     "NULL, NULL, false, 'orphan', '{}', NULL)::mq_new_t])");
    int polls = 0;
    while (polls < 20 && t_sql_int(pg, "SELECT count(*) FROM mq_cursors") > 0) {
        t_exec(pg, "UPDATE mq_cursors SET drained_at = drained_at - interval '11 minutes'");
        t_await_log_sweep();
        CHECK_INT(t_sql_int(pg, got_any), 0);
        polls++;
    }
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_cursors"), 0);
    t_exec(producer, "COMMIT");
    PQfinish(producer);
    /* Committed, with no cursor over it: no poll can see it yet. */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_cursors_retired WHERE place > 0"), 1);
    int found = 0;
    for (polls = 0; polls < 10 && !found; polls++) {
        t_await_log_sweep();
        found = (int)t_sql_int(pg, "SELECT count(*) FROM mq_poll_jobs(NULL, 10) "
                                   "WHERE name = 'orphan'");
    }
    printf("    the message behind a deleted cursor delivered at poll %d\n", polls);
    CHECK_INT(found, 1);
    CHECK_INT(t_sql_int(pg, got_any), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_cursors_retired"), 0);
    /* The cursor came back with its key: the channel's next producer adds
     * none, and its message is delivered. */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_cursors c JOIN mq_cursor_keys k "
                            "USING (channel_key)"),
              1);
    insert_n("orph", NULL, 1, 1, 60000);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_poll_jobs(ARRAY['orph'], 10) "
                            "WHERE id IS NOT NULL"),
              1);
}

/* README, "Producers in long transactions": the next poll that finds
 * nothing settles every channel. */
static void test_late_producer_found_by_an_empty_poll(void)
{
    if (t_citus_skip("the log's cursors: nothing is logged on Citus"))
        return;
    t_truncate();
    PGconn *c = late_behind_cursor();
    char sql[128];
    snprintf(sql, sizeof sql, lost_found, 10);
    int64_t waited = poll_until_found(c, sql, 5000, NULL);
    CHECK(waited >= 0 && waited < 3000);
    /* Delivered once: nothing of it is left to claim. */
    CHECK_INT(t_sql_int(c, "%s", sql), 0);
    PQfinish(c);
}

/* Late messages of two producers among delivered ones, and one of them
 * deleted before the upkeep found it: the upkeep delivers exactly the late
 * ones still there, once each, and none of those a claim gave. */
static void test_late_producers_among_delivered(void)
{
    if (t_citus_skip("the log's cursors: nothing is logged on Citus"))
        return;
    t_truncate();
    PGconn *a = t_pg(), *b = t_pg(), *c = t_pg();
    static const char late_msg[] =
        "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), NULL, 0, NULL, 'lm', NULL, NULL, "
        "false, '%s', '{}', NULL)::mq_new_t])";
    insert_n("lm", NULL, 1, 1, 60000);
    t_exec(a, "BEGIN");
    t_exec(a, late_msg, "lost");
    insert_n("lm", NULL, 2, 1, 60000);
    t_exec(b, "BEGIN");
    t_exec(b, late_msg, "lost");
    t_exec(b, late_msg, "dropped");
    insert_n("lm", NULL, 2, 1, 60000);
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM mq_poll_jobs(ARRAY['lm'], 10)"), 5);
    t_exec(a, "COMMIT");
    t_exec(b, "COMMIT");
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM mq_log WHERE name = 'dropped'"), 1);
    t_exec(c, "SELECT mq_delete(ARRAY(SELECT id FROM mq_log WHERE name = 'dropped'))");
    int lost = 0, other = 0;
    int64_t start = t_now_ms();
    while (t_now_ms() - start < 10000 && lost < 2) {
        PGresult *r = t_sql(c, "SELECT name FROM mq_poll_jobs(NULL, 10) WHERE id IS NOT NULL");
        for (int i = 0; r && i < PQntuples(r); i++) {
            if (strcmp(PQgetvalue(r, i, 0), "lost") == 0)
                lost++;
            else
                other++;
        }
        PQclear(r);
        t_sleep_ms(100);
    }
    t_sleep_ms(1200); /* another upkeep: nothing more comes */
    other += t_sql_int(c, "SELECT count(*) FROM mq_poll_jobs(NULL, 10) WHERE id IS NOT NULL");
    CHECK_INT(lost, 2);
    CHECK_INT(other, 0);
    PQfinish(a);
    PQfinish(b);
    PQfinish(c);
}

/* ... by the upkeep of the polls that take from its channel (about once a
 * second a channel), though none comes up empty. */
static void test_late_producer_found_by_its_channels_polls(void)
{
    if (t_citus_skip("the log's cursors: nothing is logged on Citus"))
        return;
    t_truncate();
    PGconn *c = late_behind_cursor();
    char sql[128];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM mq_poll_jobs(ARRAY['lx'], 1) "
             "WHERE name = 'lost'");
    int64_t waited = poll_until_found(c, sql, 8000, "lx");
    CHECK(waited >= 0 && waited < 5000);
    PQfinish(c);
}

/* The sweep leaves the busy channels to their polls' upkeep: it holds each
 * cursor it visits until its poll's transaction ends, and a claim passes a
 * held cursor, so a sweep of a channel claimed from a moment ago would keep
 * the channel's messages from every other consumer meanwhile. */
static void test_sweep_leaves_busy_channels_to_their_polls(void)
{
    if (t_citus_skip("the log's cursors: nothing is logged on Citus"))
        return;
    if (t_pooled()) {
        /* The sweep's transaction is held open across statements. */
        printf("    skipped behind a pooler\n");
        return;
    }
    t_truncate();
    insert_n("hot", NULL, 5, 1, 60000);
    PGconn *sweeper = t_pg(), *c = t_pg();
    CHECK_INT(
        t_sql_int(c, "SELECT count(*) FROM mq_claim(ARRAY['hot'], 2) WHERE id IS NOT NULL"), 2);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_cursors WHERE settled < place"), 1);
    t_exec(sweeper, "BEGIN");
    t_exec(sweeper, "SELECT _mq_log_upkeep(clock_timestamp(), NULL)"); /* its first: a sweep */
    CHECK_INT(
        t_sql_int(c, "SELECT count(*) FROM mq_claim(ARRAY['hot'], 10) WHERE id IS NOT NULL"),
        3);
    t_exec(sweeper, "ROLLBACK");
    /* Nor a channel claimed from a second ago whose range is not final yet
     * (a transaction older than its claim still runs): nothing to settle. */
    PGconn *writer = t_pg();
    t_exec(writer, "BEGIN");
    t_exec(writer, "SELECT pg_current_xact_id()");
    insert_n("warm", NULL, 5, 1, 60000);
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM mq_claim(ARRAY['warm'], 2) "
                           "WHERE id IS NOT NULL"),
              2);
    t_sleep_ms(1100);
    PQfinish(sweeper);
    sweeper = t_pg();
    t_exec(sweeper, "BEGIN");
    t_exec(sweeper, "SELECT _mq_log_upkeep(clock_timestamp(), NULL)");
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM mq_claim(ARRAY['warm'], 10) "
                           "WHERE id IS NOT NULL"),
              3);
    t_exec(sweeper, "ROLLBACK");
    t_exec(writer, "ROLLBACK");
    PQfinish(writer);
    PQfinish(sweeper);
    PQfinish(c);
}

/* ... and by a busy session's sweep of every channel (every ten seconds),
 * when no poll takes from its channel again and none comes up empty. */
static void test_late_producer_found_by_a_busy_sessions_sweep(void)
{
    if (t_citus_skip("the log's cursors: nothing is logged on Citus"))
        return;
    if (t_pooled()) {
        /* The sweep's clock is a session setting, which a pooler changes. */
        printf("    skipped behind a pooler\n");
        return;
    }
    t_truncate();
    PGconn *c = late_behind_cursor();
    char sql[128];
    snprintf(sql, sizeof sql, lost_found, 1);
    int64_t waited = poll_until_found(c, sql, 15000, "busy");
    CHECK(waited >= 0 && waited < 12000);
    PQfinish(c);
}

/* The mark is a session setting a client can write: garbage is ignored,
 * and a mark set ahead of the live rows hides them from that session's
 * polls for ten seconds at most (docs/sql-contract.md). */
static void test_mark_set_by_hand(void)
{
    if (t_pooled()) {
        printf("    skipped behind a pooler\n");
        return;
    }
    t_truncate();
    PGconn *c = t_pg();
    const char *set = "SELECT set_config('pqmq.low_' || 'mq_msgs'::regclass::oid, %s, false)";
    const char *any = "SELECT count(*) FROM mq_poll_jobs(NULL, 10) WHERE id IS NOT NULL";
    const char *marked = "SELECT (current_setting('pqmq.low_' || 'mq_msgs'::regclass::oid) "
                         "~ '^[0-9]+,[0-9]+,[0-9]+$')::int";
    /* The mark is mq_rows' (the log needs none): messages of priority 1. */
    insert_rows_n("hand", 1, 1, 60000);
    t_exec(c, set, "'not a mark'");
    CHECK_INT(t_sql_int(c, "%s", any), 1);
    /* The poll put its mark there (docs/sql-contract.md: read it with current_setting). */
    CHECK_INT(t_sql_int(c, "%s", marked), 1);
    /* Near misses of "digits,digits,digits" (1 to 17 each) are garbage too:
     * each poll ignores the value, fails on none, and writes a mark of its
     * own. */
    const char *near[] = {"'1,2,3,'",
                          "',1,2'",
                          "'1,,2'",
                          "'1,2'",
                          "'1,2,3,4'",
                          "' 1,2,3'",
                          "'123456789012345678,1,1'",
                          "'1,2,3x'",
                          "'-1,2,3'",
                          "''"};
    for (size_t i = 0; i < sizeof near / sizeof *near; i++) {
        t_exec(c, set, near[i]);
        CHECK_INT(t_sql_int(c, "%s", any), 0);
        CHECK_INT(t_sql_int(c, "%s", marked), 1);
    }
    insert_rows_n("hand", 2, 1, 60000);
    t_sleep_ms(1200);
    /* A day ahead, moved on and found afresh just now. */
    t_exec(c, set,
           "(extract(epoch FROM now() + interval '1 day') * 1000000)::bigint || ',' "
           "|| (extract(epoch FROM clock_timestamp()) * 1000000)::bigint || ',' "
           "|| (extract(epoch FROM clock_timestamp()) * 1000000)::bigint");
    /* Another session is not misled. */
    PGconn *d = t_pg();
    CHECK_INT(t_sql_int(d, "SELECT count(*) FROM mq_poll_jobs(NULL, 1) WHERE id IS NOT NULL"),
              1);
    PQfinish(d);
    int64_t waited = poll_until_found(c, any, 15000, NULL);
    CHECK(waited >= 0);
    CHECK(waited < 12000);
    PQfinish(c);
}

/* Polls of c that leave other messages ready (so c never looks afresh)
 * after c's mark has passed now - 1.2 s. */
static PGconn *marked_poller(void)
{
    PGconn *c = t_pg();
    t_sleep_ms(1200);
    insert_n("busy", NULL, 5, 1, 60000);
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM mq_poll_jobs(NULL, 1)"), 1);
    return c;
}

/* A two-phase message committed after its insert time is placed now, so a
 * poll whose mark passed its insert time still takes it. */
static void test_commit_places_the_message_now(void)
{
    t_truncate();
    pqmq_msg *m = t_msg("pending", NULL, "job", "{}", 0);
    pqmq_msg_set_commit_interval(m, 60000);
    uuid_t id;
    pqmq_msg_id(m, id);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    pqmq_msg_free(m);
    PGconn *c = marked_poller();
    CHECK_OK(q, pqmq_commit(q, (const uuid_t *)&id, 1));
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM mq_poll_jobs(NULL, 100) "
                           "WHERE channel_name = 'pending'"),
              1);
    PQfinish(c);
}

/* A chain's new head joins the ready indexes placed now. */
static void test_new_head_is_placed_now(void)
{
    t_truncate();
    pqmq_msg *m[2] = {t_msg("chain", NULL, "first", "{}", 1),
                      t_msg("chain", NULL, "second", "{}", 1)};
    pqmq_msg_set_delay(m[0], 60000);
    uuid_t first;
    pqmq_msg_id(m[0], first);
    CHECK_OK(q, pqmq_insert(q, m, 2));
    t_msgs_free(m, 2);
    PGconn *c = marked_poller();
    char text[37];
    uuid_unparse_lower(first, text);
    t_exec(pg, "SELECT mq_delete(ARRAY['%s']::uuid[])", text);
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM mq_poll_jobs(NULL, 100) "
                           "WHERE channel_name = 'chain' AND name = 'second'"),
              1);
    PQfinish(c);
}

/* A poll visits every channel whatever key it starts at: from its start up
 * to the end of the key range, then around from the beginning. Each pass
 * of the visit (priority 0, urgent, chain heads) on twelve channels, from
 * each channel's key and the key after it, and from random keys (a poll
 * of the name), in both lanes: the locked lane first, committed (a rolled-back locker would
 * leave its rows to lane 2), then the lease lane, rolled back. */
static void test_visit_wraps_around_from_any_start(void)
{
    const char *rows = "ARRAY(SELECT ROW(gen_random_uuid(), NULL, 3, interval '1 second', %s,"
                       " NULL, %s, 'n', '{}', NULL)::mq_new_t FROM generate_series(1, 12) g)";
    const char *names[] = {"w", "u", "wc"};
    const char *polls[] = {
        "SELECT count(*) FROM mq_claim_locked(NULL, 12) WHERE id IS NOT NULL",
        "SELECT count(*) FROM mq_poll_jobs(NULL, 12) WHERE id IS NOT NULL"};
    const char *ends[] = {"COMMIT", "ROLLBACK"};
    for (int pass = 0; pass < 3; pass++) {
        t_truncate();
        char ins[512];
        char chan[32];
        snprintf(chan, sizeof chan, "'%s', 'a' || g", names[pass]);
        snprintf(ins, sizeof ins, rows, chan, pass == 2 ? "true" : "false");
        if (pass == 1)
            t_exec(
                pg,
                "SELECT mq_insert(%s, ARRAY(SELECT 1 + g %% 3 FROM generate_series(1, 12) g))",
                ins);
        else
            t_exec(pg, "SELECT mq_insert(%s)", ins);
        PGresult *r = t_sql(pg, "SELECT to_hex(channel_key), to_hex(CASE WHEN channel_key < "
                                "9223372036854775807 THEN channel_key + 1 ELSE channel_key END)"
                                " FROM mq_msgs");
        CHECK_INT(PQntuples(r), 12);
        PGconn *c = t_pg();
        for (int lane = 0; lane < 2; lane++) {
            /* A poll of the name starts at a random key of its range (and
             * has no top-up from the time index, which would hide a visit
             * that does not wrap around). */
            for (int i = 0; i < 20; i++) {
                t_exec(c, "BEGIN");
                if (t_sql_int(c,
                              "SELECT count(*) FROM %s(ARRAY['%s'], 12) WHERE id IS NOT NULL",
                              lane ? "mq_poll_jobs" : "mq_claim_locked", names[pass]) != 12)
                    t_fail(__FILE__, __LINE__,
                           "pass %d, %s, a poll of the name: not every channel", pass,
                           lane ? "lease lane" : "locked lane");
                t_exec(c, "%s", ends[lane]);
            }
            for (int i = 0; i < PQntuples(r); i++)
                for (int col = 0; col < 2; col++) {
                    t_exec(c, "BEGIN");
                    t_exec(c,
                           "SELECT set_config('pqmq.next_' || 'mq_msgs'::regclass::oid, '%s',"
                           " false)",
                           PQgetvalue(r, i, col));
                    if (t_sql_int(c, "%s", polls[lane]) != 12)
                        t_fail(__FILE__, __LINE__, "pass %d, %s, start %s: not every channel",
                               pass, lane ? "lease lane" : "locked lane",
                               PQgetvalue(r, i, col));
                    t_exec(c, "%s", ends[lane]);
                }
        }
        PQclear(r);
        PQfinish(c);
    }
}

int main(void)
{
    t_init("poll");
    q = t_client();
    pg = t_pg();
    T_RUN(test_claim_sets_lease_attempts_backoff);
    T_RUN(test_exhausted_message_is_not_claimed_again);
    T_RUN(test_retries_are_exact);
    T_RUN(test_wait_time);
    T_RUN(test_channel_filter);
    T_RUN(test_busy_channel_does_not_starve_quiet_one);
    T_RUN(test_channels_of_one_name_are_served_in_turn);
    T_RUN(test_without_a_turn_polls_start_within_the_name);
    T_RUN(test_turn_set_by_hand);
    T_RUN(test_poll_cost_does_not_grow_with_backlog);
    T_RUN(test_poll_reads_channels_in_index_order);
    T_RUN(test_thin_channels_fill_a_poll_in_few_steps);
    T_RUN(test_drained_first_round_walks_once);
    T_RUN(test_in_flight_are_stepped_over_once);
    T_RUN(test_claim_writes_no_index_entry);
    T_RUN(test_place_moves_with_keep_alive_and_failure);
    T_RUN(test_poll_cost_with_stale_statistics);
    T_RUN(test_poll_bad_inputs);
    T_RUN(test_claim_lane_refuses_a_bad_lane);
    T_RUN(test_foreign_row_is_refused);
    T_RUN(test_held_snapshot_dead_entries_are_passed);
    T_RUN(test_wait_time_beside_finished_receipts);
    T_RUN(test_wait_time_nothing_in_flight);
    T_RUN(test_late_commit_is_found);
    T_RUN(test_late_commit_under_load_waits_ten_seconds_at_most);
    T_RUN(test_rows_are_not_starved_by_the_log);
    T_RUN(test_retries_are_not_starved_by_the_log);
    T_RUN(test_delayed_are_not_starved_by_the_log);
    T_RUN(test_drained_cursors_are_retired);
    T_RUN(test_reclaim_stops_short_of_a_message_in_flight);
    T_RUN(test_retire_probes_pass_what_was_reclaimed);
    T_RUN(test_message_behind_a_retired_cursor_is_delivered);
    T_RUN(test_late_producer_found_by_an_empty_poll);
    T_RUN(test_late_producer_found_by_its_channels_polls);
    T_RUN(test_late_producers_among_delivered);
    T_RUN(test_late_producer_found_by_a_busy_sessions_sweep);
    T_RUN(test_sweep_leaves_busy_channels_to_their_polls);
    T_RUN(test_mark_set_by_hand);
    T_RUN(test_commit_places_the_message_now);
    T_RUN(test_new_head_is_placed_now);
    T_RUN(test_visit_wraps_around_from_any_start);
    pqmq_client_free(q);
    PQfinish(pg);
    return t_done();
}
