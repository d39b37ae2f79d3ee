/* test_priority.c: priorities (pqmq_msg_set_priority, mq_insert(messages,
 * priorities)): higher first within a channel, fair between channels, no
 * chain reordered. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

/* Inserts n messages (g = 1..n) on channel ch in one statement, message g
 * with priority prio (an SQL expression of g) and name "<priority>:<g>"
 * prefixed by tag. */
static void insert_sql(const char *ch, int n, const char *prio, const char *tag)
{
    t_exec(pg,
           "SELECT mq_insert(ARRAY(SELECT ROW(gen_random_uuid(), NULL, NULL, NULL, '%s', '', "
           "NULL, false, '%s' || (%s) || ':' || g, '{}', NULL)::mq_new_t "
           "FROM generate_series(1, %d) g ORDER BY g), "
           "ARRAY(SELECT (%s) FROM generate_series(1, %d) g ORDER BY g))",
           ch, tag, prio, n, prio, n);
}

/* The priority a message's name starts with (after the tag's letters). */
static int prio_of(const char *name)
{
    while (*name && (*name < '0' || *name > '9'))
        name++;
    return atoi(name);
}

/* Polls (channel NULL: all) up to batch and completes; sets the lowest and
 * highest priority of what came (names' prefixes) and returns how many. */
static int poll_prios(const char *channel, int batch, int *lo, int *hi)
{
    pqmq_batch *b = NULL;
    const char *chans[1] = {channel};
    CHECK_OK(q, pqmq_poll(q, channel ? chans : NULL, channel ? 1 : 0, batch, &b));
    int n = (int)pqmq_batch_count(b);
    *lo = 1 << 30;
    *hi = -1;
    for (int i = 0; i < n; i++) {
        int p = prio_of(pqmq_job_name(pqmq_batch_job(b, i)));
        *lo = p < *lo ? p : *lo;
        *hi = p > *hi ? p : *hi;
    }
    if (n)
        CHECK_OK(q, pqmq_complete_batch(q, b));
    pqmq_batch_free(b);
    return n;
}

/* Polls one job (checked: exactly one) and completes it; returns its name
 * (valid until the next call), or NULL when no single job came. */
static const char *take_one(void)
{
    static char name[64];
    const char *got = NULL;
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 1, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    if (pqmq_batch_count(b) == 1) {
        snprintf(name, sizeof name, "%s", pqmq_job_name(pqmq_batch_job(b, 0)));
        got = name;
        CHECK_OK(q, pqmq_complete_batch(q, b));
    }
    pqmq_batch_free(b);
    return got;
}

/* Drains channel (NULL: all) in polls of batch; checks that no poll took a
 * message of a priority above one an earlier poll left (a batch's own
 * order is by place). Returns how many came. */
static int drain_in_order(const char *channel, int batch)
{
    int got = 0, n, lo, hi, floor = 1 << 30, polls = 0;
    while ((n = poll_prios(channel, batch, &lo, &hi)) > 0) {
        if (hi > floor)
            t_fail(__FILE__, __LINE__, "batch %d: poll %d took priority %d after one of %d",
                   batch, polls, hi, floor);
        floor = lo < floor ? lo : floor;
        got += n;
        polls++;
    }
    return got;
}

static void test_higher_priority_first(void)
{
    /* Small batches take a channel's allowance, then more of its urgent
     * messages; a batch of 100 is larger than the channel's quarter. */
    const int batches[] = {1, 10, 100};
    for (size_t k = 0; k < sizeof batches / sizeof *batches; k++) {
        t_truncate();
        insert_sql("pr", 50, "0", "");       /* the oldest: priority 0 */
        insert_sql("pr", 200, "g % 10", ""); /* 20 more of 0, 20 of each 1..9 */
        CHECK_INT(drain_in_order("pr", batches[k]), 250);
        /* The same through a poll of all channels. */
        insert_sql("pr", 50, "0", "");
        insert_sql("pr", 200, "g % 10", "");
        CHECK_INT(drain_in_order(NULL, batches[k]), 250);
    }
}

static void test_one_priority_in_order_of_readiness(void)
{
    t_truncate();
    insert_sql("pr", 5, "3", "a");
    insert_sql("pr", 5, "0", "z");
    insert_sql("pr", 5, "3", "b");
    insert_sql("pr", 5, "3", "c");
    const char *want = "aaaaabbbbbccccczzzzz";
    for (int i = 0; want[i]; i++) {
        const char *name = take_one();
        if (name)
            CHECK_INT(name[0], want[i]);
    }
}

/* A channel full of urgent messages does not starve a quiet one. */
static void test_channels_stay_fair(void)
{
    t_truncate();
    insert_sql("busy", 400, "9", "");
    insert_sql("quiet", 10, "0", "");
    int quiet = 0;
    for (int poll = 0; poll < 2; poll++) {
        pqmq_batch *b = NULL;
        CHECK_OK(q, pqmq_poll(q, NULL, 0, 20, &b));
        CHECK_INT(pqmq_batch_count(b), 20);
        for (size_t i = 0; i < pqmq_batch_count(b); i++)
            quiet += !strcmp(pqmq_job_channel(pqmq_batch_job(b, i)), "quiet");
        CHECK_OK(q, pqmq_complete_batch(q, b));
        pqmq_batch_free(b);
    }
    /* A quarter of each batch is the quiet channel's. */
    CHECK_INT(quiet, 10);
}

/* An ordered chain keeps its order whatever its messages' priorities; its
 * head competes by its own priority with the channel's other messages. */
static void test_chain_never_reordered(void)
{
    t_truncate();
    const int prios[] = {0, 5, 9, 1};
    pqmq_msg *m[5];
    for (int i = 0; i < 4; i++) {
        char name[16];
        snprintf(name, sizeof name, "c%d", i);
        m[i] = t_msg("ch", "x", name, "{}", 1);
        CHECK_INT(pqmq_msg_set_priority(m[i], prios[i]), 0);
    }
    m[4] = t_msg("ch", "x", "u", "{}", 0);
    CHECK_INT(pqmq_msg_set_priority(m[4], 3), 0);
    CHECK_OK(q, pqmq_insert(q, m, 5));
    t_msgs_free(m, 5);
    /* u (3) before the head c0 (0); then the chain in its order: c1 (5),
     * alone in the channel, c2 and c3 after it. */
    const char *want[] = {"u", "c0", "c1", "c2", "c3"};
    for (int i = 0; i < 5; i++) {
        const char *name = take_one();
        if (name)
            CHECK_STR(name, want[i]);
    }
}

/* Priorities hold in the locked lane, in polls that name channels, and
 * for a retry, which keeps its priority. */
static void test_every_lane_and_retries(void)
{
    t_truncate();
    insert_sql("pl", 30, "0", "");
    insert_sql("pl", 30, "g % 3", "");
    const char *chans[] = {"pl", "other"};
    t_exec(pqmq_conn(q), "BEGIN");
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll_locked(q, chans, 2, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 10);
    for (size_t i = 0; i < pqmq_batch_count(b); i++)
        CHECK_INT(prio_of(pqmq_job_name(pqmq_batch_job(b, i))), 2);
    pqmq_batch_free(b);
    t_exec(pqmq_conn(q), "ROLLBACK");
    CHECK_INT(drain_in_order("pl", 7), 60);

    /* A failed urgent message, retried at once, comes before priority 0. */
    insert_sql("pl", 1, "7", "r");
    insert_sql("pl", 20, "0", "");
    t_exec(pg, "UPDATE mq_msgs SET retry_backoff = interval '0' WHERE name LIKE 'r%%'");
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 1, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    uuid_t id;
    pqmq_job_id(pqmq_batch_job(b, 0), id);
    CHECK_STR(pqmq_job_name(pqmq_batch_job(b, 0)), "r7:1");
    pqmq_batch_free(b);
    CHECK_OK(q, pqmq_fail(q, id, "again"));
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 5, &b));
    CHECK_INT(pqmq_batch_count(b), 5);
    int retried = 0;
    for (size_t i = 0; i < pqmq_batch_count(b); i++)
        if (!strcmp(pqmq_job_name(pqmq_batch_job(b, i)), "r7:1")) {
            retried++;
            CHECK_INT(pqmq_job_attempt(pqmq_batch_job(b, i)), 2);
        }
    CHECK_INT(retried, 1);
    pqmq_batch_free(b);
}

/* A delayed urgent message waits for its time and holds nothing up. */
static void test_delayed_urgent_message_waits(void)
{
    t_truncate();
    pqmq_msg *m[2] = {t_msg("pd", NULL, "later", "{}", 0), t_msg("pd", NULL, "now", "{}", 0)};
    CHECK_INT(pqmq_msg_set_priority(m[0], 100), 0);
    CHECK_INT(pqmq_msg_set_delay(m[0], 60000), 0);
    CHECK_OK(q, pqmq_insert(q, m, 2));
    t_msgs_free(m, 2);
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_STR(pqmq_job_name(pqmq_batch_job(b, 0)), "now");
    CHECK_OK(q, pqmq_complete_batch(q, b));
    pqmq_batch_free(b);
    /* The next poll says when the delayed one is due. */
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 0);
    CHECK(pqmq_batch_wait_ms(b) > 50000);
    pqmq_batch_free(b);
    const char *chans[] = {"pd"};
    CHECK_OK(q, pqmq_poll(q, chans, 1, 10, &b));
    CHECK(pqmq_batch_wait_ms(b) > 50000);
    pqmq_batch_free(b);
}

/* A queue that never sets a priority writes nothing to the urgent index. */
static void test_no_priorities_no_urgent_entries(void)
{
    t_truncate();
    t_exec(pg, "VACUUM mq_rows");
    long long pages = t_sql_int(pg, "SELECT pg_relation_size('mq_msgs_ready_urgent') / 8192");
    insert_sql("np", 2000, "0", "");
    pqmq_msg *m = t_msg("np", NULL, "c", "{}", 0);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    pqmq_msg_free(m);
    CHECK_INT(t_sql_int(pg, "SELECT pg_relation_size('mq_msgs_ready_urgent') / 8192"), pages);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE priority > 0"), 0);
}

/* An urgent message has its entry in the urgent index only: the channel
 * index of priority 0 does not grow. */
static void test_urgent_messages_one_index_entry(void)
{
    if (t_citus_skip("index sizes are the worker's"))
        return;
    t_truncate();
    t_exec(pg, "VACUUM mq_rows");
    const char *size = "SELECT pg_relation_size('%s') / 8192";
    long long plain = t_sql_int(pg, size, "mq_msgs_ready_plain");
    long long urgent = t_sql_int(pg, size, "mq_msgs_ready_urgent");
    insert_sql("ue", 2000, "1 + g % 9", "");
    CHECK_INT(t_sql_int(pg, size, "mq_msgs_ready_plain"), plain);
    CHECK(t_sql_int(pg, size, "mq_msgs_ready_urgent") > urgent);
}

/* A poll stays flat with a backlog spread over priorities. */
static void test_poll_cost_over_priorities(void)
{
    if (t_citus_skip("the statistics counters read are the worker's"))
        return;
    t_truncate();
    for (int c = 0; c < 20; c++) {
        char ch[16];
        snprintf(ch, sizeof ch, "pc%d", c);
        insert_sql(ch, 1000, "g % 10", "");
    }
    t_exec(pg, "ANALYZE mq_rows, mq_log, mq_cursors, mq_receipts");
    t_exec(pg, "SET stats_fetch_consistency = none");
    t_exec(pqmq_conn(q), "SELECT pg_stat_force_next_flush()");
    t_exec(pg, "SELECT pg_stat_force_next_flush()");
    const char *sql =
        "SELECT COALESCE(sum(COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0)), 0) "
        "FROM pg_stat_user_tables WHERE schemaname = current_schema() AND relname IN "
        "('mq_rows', 'mq_log', 'mq_cursors', 'mq_receipts', 'mq_done', 'mq_log_gone')";
    long long before = t_sql_int(pg, "%s", sql);
    PQclear(t_sql(pg, "SELECT count(*) FROM mq_poll_jobs(NULL, 100)"));
    t_exec(pg, "SELECT pg_stat_force_next_flush()");
    long long read = t_sql_int(pg, "%s", sql) - before;
    printf("    tuples read by a poll of 100 from 20,000 over 10 priorities: %lld\n", read);
    CHECK(read >= 100);
    CHECK(read < 1000);
}

static void test_sql_interface_and_bad_input(void)
{
    t_truncate();
    /* A NULL element is priority 0; NULL priorities are all 0. */
    t_exec(pg, "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), NULL, NULL, NULL, 's', '', NULL, "
               "false, 'a', '{}', NULL), ROW(gen_random_uuid(), NULL, NULL, NULL, 's', '', "
               "NULL, false, 'b', '{}', NULL)]::mq_new_t[], ARRAY[NULL, 4])");
    t_exec(pg, "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), NULL, NULL, NULL, 's', '', NULL, "
               "false, 'c', '{}', NULL)]::mq_new_t[], NULL)");
    CHECK_INT(t_sql_int(pg, "SELECT sum(priority) FROM mq_msgs"), 4);
    /* Rejected whole, naming the message. */
    PGresult *r = PQexec(pg, "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), NULL, NULL, NULL, "
                             "'s', '', NULL, false, 'd', '{}', NULL), ROW(gen_random_uuid(), "
                             "NULL, NULL, NULL, 's', '', NULL, false, 'e', '{}', NULL)]"
                             "::mq_new_t[], ARRAY[1, 40000])");
    CHECK(strstr(PQresultErrorMessage(r), "message 2 of the batch: priority 40000 is outside "
                                          "0..32767") != NULL);
    PQclear(r);
    r = PQexec(pg, "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), NULL, NULL, NULL, 's', '', "
                   "NULL, false, 'd', '{}', NULL)]::mq_new_t[], ARRAY[1, 2])");
    CHECK(strstr(PQresultErrorMessage(r), "1 messages but 2 priorities") != NULL);
    PQclear(r);
    /* The C API checks before sending. */
    pqmq_msg *m[2] = {t_msg("s", NULL, "f", "{}", 0), t_msg("s", NULL, "g", "{}", 0)};
    CHECK_INT(pqmq_msg_set_priority(m[1], -1), 0);
    CHECK_ERR(q, pqmq_insert(q, m, 2), PQMQ_EINVAL, "msgs[1]: priority -1 is outside 0..32767");
    CHECK_INT(pqmq_msg_set_priority(m[1], PQMQ_MAX_PRIORITY + 1), 0);
    CHECK_ERR(q, pqmq_insert(q, m, 2), PQMQ_EINVAL, "priority 32768");
    CHECK_INT(pqmq_msg_set_priority(NULL, 1), PQMQ_EINVAL);
    t_msgs_free(m, 2);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 3);
    /* A priority below 0, written by hand, counts as 0: the message is not
     * lost from the polls. */
    t_exec(pg, "UPDATE mq_msgs SET priority = -1 WHERE name = 'a'");
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 3);
    int found = 0;
    for (size_t i = 0; i < pqmq_batch_count(b); i++)
        found += !strcmp(pqmq_job_name(pqmq_batch_job(b, i)), "a");
    CHECK_INT(found, 1);
    pqmq_batch_free(b);
}

/* Inserts k (unique key "key") in mode: the outcome must be outcome, and
 * the key's message must then have priority priority. */
static void insert_key(pqmq_msg *k, pqmq_key_mode mode, int outcome, int priority)
{
    pqmq_insert_result res;
    CHECK_OK(q, pqmq_insert_unique(q, &k, 1, mode, 0, &res));
    CHECK_INT(res.outcome, outcome);
    CHECK_INT(t_sql_int(pg, "SELECT priority FROM mq_msgs WHERE unique_key = 'key'"), priority);
}

/* Priorities through pqmq_insert_batches and with unique keys ('replace'
 * gives the holder the new priority, 'keep' leaves it). */
static void test_batches_and_unique_keys(void)
{
    t_truncate();
    pqmq_msg *a[1] = {t_msg("pk", NULL, "a", "{}", 0)};
    pqmq_msg *b[1] = {t_msg("pk", NULL, "b", "{}", 0)};
    CHECK_INT(pqmq_msg_set_priority(b[0], 6), 0);
    pqmq_msg *const *batches[2] = {a, b};
    size_t counts[2] = {1, 1};
    CHECK_OK(q, pqmq_insert_batches(q, batches, counts, 2, NULL));
    CHECK_INT(t_sql_int(pg, "SELECT priority FROM mq_msgs WHERE name = 'b'"), 6);
    t_msgs_free(a, 1);
    t_msgs_free(b, 1);

    pqmq_msg *k = t_msg("pk", NULL, "k1", "{}", 0);
    CHECK_INT(pqmq_msg_set_unique_key(k, "key"), 0);
    CHECK_INT(pqmq_msg_set_priority(k, 2), 0);
    insert_key(k, PQMQ_KEY_KEEP, PQMQ_INSERTED, 2);
    CHECK_INT(pqmq_msg_set_priority(k, 8), 0);
    insert_key(k, PQMQ_KEY_KEEP, PQMQ_KEPT, 2);
    insert_key(k, PQMQ_KEY_REPLACE, PQMQ_REPLACED, 8);
    CHECK_INT(pqmq_msg_set_priority(k, 1), 0);
    insert_key(k, PQMQ_KEY_REPLACE_PAYLOAD, PQMQ_REPLACED, 8);
    /* pqmq_insert with a key and a priority. */
    pqmq_msg_free(k);
    k = t_msg("pk", NULL, "k2", "{}", 0);
    CHECK_INT(pqmq_msg_set_unique_key(k, "key2"), 0);
    CHECK_INT(pqmq_msg_set_priority(k, 3), 0);
    CHECK_OK(q, pqmq_insert(q, &k, 1));
    pqmq_msg_free(k);
    CHECK_INT(t_sql_int(pg, "SELECT priority FROM mq_msgs WHERE unique_key = 'key2'"), 3);
}

/* Status sees urgent messages like the others: the oldest ready one, one in
 * flight (named channels read the channel indexes), and peek lists them in
 * the order polls take them. */
static void test_metrics_and_peek_see_priorities(void)
{
    t_truncate();
    insert_sql("pm", 1, "4", "u");
    t_sleep_ms(200);
    const char *m = "SELECT %s FROM mq_metrics(ARRAY['pm'])";
    CHECK_INT(t_sql_int(pg, m, "ready"), 1);
    CHECK(t_sql_int(pg, m, "(oldest_ready_age * 1000)::bigint") >= 150);
    insert_sql("pm", 1, "0", "z");
    /* Peek lists the urgent message before an older one of priority 0. */
    insert_sql("pp", 1, "0", "z");
    insert_sql("pp", 1, "4", "u");
    PGresult *r = t_sql(pg, "SELECT name FROM mq_peek('pp')");
    CHECK_INT(PQntuples(r), 2);
    if (PQntuples(r) == 2)
        CHECK_STR(PQgetvalue(r, 0, 0), "u4:1");
    PQclear(r);
    const char *chans[] = {"pm"};
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, chans, 1, 1, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    pqmq_batch_free(b);
    CHECK_INT(t_sql_int(pg, m, "in_flight"), 1);
    CHECK_INT(t_sql_int(pg, m, "ready"), 1);
}

int main(void)
{
    t_init("priority");
    q = t_client();
    pg = t_pg();
    T_RUN(test_higher_priority_first);
    T_RUN(test_one_priority_in_order_of_readiness);
    T_RUN(test_channels_stay_fair);
    T_RUN(test_chain_never_reordered);
    T_RUN(test_every_lane_and_retries);
    T_RUN(test_delayed_urgent_message_waits);
    T_RUN(test_no_priorities_no_urgent_entries);
    T_RUN(test_urgent_messages_one_index_entry);
    T_RUN(test_poll_cost_over_priorities);
    T_RUN(test_sql_interface_and_bad_input);
    T_RUN(test_batches_and_unique_keys);
    T_RUN(test_metrics_and_peek_see_priorities);
    pqmq_client_free(q);
    PQfinish(pg);
    return t_done();
}
