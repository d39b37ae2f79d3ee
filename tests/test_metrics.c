/*
 * test_metrics.c: mq_metrics against a full scan of the
 * queue, its counters across inserts, completions, chains, skips, purges,
 * folds and TRUNCATE, and `pqmq metrics` read back through a parser of the
 * Prometheus text format (not compared as text).
 */
#include <ctype.h>
#include <sys/wait.h>
#include <stdlib.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

/* Channel names are data: these need escaping in every output format. */
static const char *const odd_channel = "q\"uo\\te\nnl";
static const char *const spaced_channel = "sp ace,{x}=\xc3\xbc";

static void insert(const char *ch, const char *args, int n, int ordered, int retries,
                   int64_t backoff, int64_t delay, int64_t commit_interval)
{
    for (int i = 0; i < n; i++) {
        pqmq_msg *m = t_msg(ch, args, "job", "{\"i\": 1}", ordered);
        pqmq_msg_set_retries(m, retries);
        pqmq_msg_set_backoff(m, backoff);
        pqmq_msg_set_delay(m, delay);
        pqmq_msg_set_commit_interval(m, commit_interval);
        CHECK_OK(q, pqmq_insert(q, &m, 1));
        pqmq_msg_free(m);
    }
}

static pqmq_batch *poll_ch(const char *ch, int max)
{
    pqmq_batch *b = NULL;
    const char *chans[1] = {ch};
    CHECK_OK(q, pqmq_poll(q, chans, 1, max, &b));
    return b;
}

/* The states by a full scan, with the definitions of mq_metrics. */
#define BRUTE                                                                                  \
    "SELECT channel_name, count(*) FILTER (WHERE st = 'r') AS ready,"                          \
    " count(*) FILTER (WHERE st = 'f') AS in_flight,"                                          \
    " count(*) FILTER (WHERE st = 's') AS scheduled,"                                          \
    " count(*) FILTER (WHERE st = 'u') AS uncommitted,"                                        \
    " count(*) FILTER (WHERE st = 'w') AS waiting,"                                            \
    " count(*) FILTER (WHERE st = 'd') AS dead,"                                               \
    " count(*) FILTER (WHERE st = 'd' AND head) AS blocked_chains"                             \
    " FROM (SELECT channel_name, COALESCE(chain_seq = min(chain_seq) OVER"                     \
    "   (PARTITION BY channel_key), false) AS head, CASE"                                      \
    "   WHEN dead_since IS NOT NULL OR (attempts = 0 AND attempt_at <= now()) THEN 'd'"        \
    "   WHEN chain_seq <> min(chain_seq) OVER (PARTITION BY channel_key) THEN 'w'"             \
    "   WHEN attempt_at <= now() THEN 'r'"                                                     \
    "   WHEN deliveries > 0 OR attempts = 0 THEN 'f'"                                          \
    "   WHEN commit_interval IS NOT NULL THEN 'u' ELSE 's' END AS st"                          \
    "   FROM mq_msgs) m GROUP BY channel_name"

#define METRICS                                                                                \
    "SELECT channel_name, ready, in_flight, scheduled, uncommitted, waiting, dead,"            \
    " blocked_chains FROM mq_metrics() WHERE ready + in_flight + scheduled"                    \
    " + uncommitted + waiting + dead > 0"

/* Prints the rows of sql (a channel and its seven counts) as who sees them. */
static void print_counts(const char *when, const char *who, const char *sql)
{
    PGresult *r = t_sql(pg, "%s", sql);
    fprintf(stderr, "%s: %s says:\n", when, who);
    for (int i = 0; r && i < PQntuples(r); i++)
        fprintf(stderr, "  %s r%s f%s s%s u%s w%s d%s b%s\n", PQgetvalue(r, i, 0),
                PQgetvalue(r, i, 1), PQgetvalue(r, i, 2), PQgetvalue(r, i, 3),
                PQgetvalue(r, i, 4), PQgetvalue(r, i, 5), PQgetvalue(r, i, 6),
                PQgetvalue(r, i, 7));
    PQclear(r);
}

/* mq_metrics and the full scan agree on every channel and state. */
static void check_against_scan(const char *when)
{
    /* Each read on its own, compared here: on Citus a query that holds
     * both would run mq_metrics on the worker, which cannot. */
    PGresult *b =
        t_sql(pg, "SELECT string_agg(x::text, ';' ORDER BY x::text) FROM (" BRUTE ") x");
    PGresult *m =
        t_sql(pg, "SELECT string_agg(x::text, ';' ORDER BY x::text) FROM (" METRICS ") x");
    long long diff = !b || !m || strcmp(PQgetvalue(b, 0, 0), PQgetvalue(m, 0, 0)) != 0;
    PQclear(b);
    PQclear(m);
    if (diff != 0) {
        print_counts(when, "scan", BRUTE);
        print_counts(when, "mq_metrics", METRICS);
    }
    CHECK_INT(diff, 0);
}

static long long metric(const char *channel, const char *column)
{
    const char *p[1] = {channel};
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT %s FROM mq_metrics(ARRAY[$1])", column);
    PGresult *r = PQexecParams(pg, sql, 1, NULL, p, NULL, NULL, 0);
    long long v = -1;
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
        v = atoll(PQgetvalue(r, 0, 0));
    else
        t_fail(__FILE__, __LINE__, "mq_metrics(%s): %s", channel, PQresultErrorMessage(r));
    PQclear(r);
    return v;
}

/* A queue in every state, on channels whose names need escaping. */
static void build_mixed_queue(void)
{
    t_truncate();
    insert("plain", NULL, 5, 0, 4, 60000, 0, -1);
    pqmq_batch *b = poll_ch("plain", 2); /* 2 in flight, leased for 60 s */
    CHECK_INT(pqmq_batch_count(b), 2);
    pqmq_batch_free(b);
    insert("sched", NULL, 2, 0, 4, 1000, 60000, -1);
    insert("twophase", NULL, 2, 0, 4, 1000, 0, 60000);
    insert(odd_channel, "a", 4, 1, 4, 1000, 0, -1); /* 1 head + 3 waiting */
    insert(odd_channel, "b", 2, 1, 4, 1000, 0, -1);
    insert(spaced_channel, NULL, 1, 0, 4, 1000, 0, -1);
    /* A dead unordered message and a dead chain head with one behind it. */
    insert("deadch", NULL, 1, 0, 0, 60000, 0, -1);
    insert("deadch", "c", 2, 1, 0, 60000, 0, -1);
    b = poll_ch("deadch", 10);
    CHECK_INT(pqmq_batch_count(b), 2);
    for (size_t i = 0; i < pqmq_batch_count(b); i++) {
        uuid_t id;
        pqmq_job_id(pqmq_batch_job(b, i), id);
        CHECK_OK(q, pqmq_fail(q, id, "boom"));
    }
    pqmq_batch_free(b);
    /* Failed with retries left: in flight (waiting for its retry). */
    insert("retrying", NULL, 1, 0, 2, 60000, 0, -1);
    b = poll_ch("retrying", 1);
    CHECK_INT(pqmq_batch_count(b), 1);
    uuid_t id;
    pqmq_job_id(pqmq_batch_job(b, 0), id);
    CHECK_OK(q, pqmq_fail(q, id, "later"));
    pqmq_batch_free(b);
}

static void test_metrics_match_a_full_scan(void)
{
    build_mixed_queue();
    check_against_scan("mixed queue");
    CHECK_INT(metric("plain", "ready"), 3);
    CHECK_INT(metric("plain", "in_flight"), 2);
    CHECK_INT(metric("sched", "scheduled"), 2);
    CHECK_INT(metric("twophase", "uncommitted"), 2);
    CHECK_INT(metric(odd_channel, "waiting"), 4);
    CHECK_INT(metric(odd_channel, "ready"), 2);
    CHECK_INT(metric("deadch", "dead"), 2);
    CHECK_INT(metric("deadch", "blocked_chains"), 1);
    CHECK_INT(metric("deadch", "waiting"), 1);
    CHECK_INT(metric("retrying", "in_flight"), 1);
    CHECK(metric("plain", "oldest_ready_age") >= 0);

    /* Completing a chain head makes its successor the head: one fewer
     * waiting. */
    pqmq_batch *b = poll_ch(odd_channel, 10);
    CHECK_INT(pqmq_batch_count(b), 2);
    CHECK_OK(q, pqmq_complete_batch(q, b));
    pqmq_batch_free(b);
    check_against_scan("after completing two chain heads");
    CHECK_INT(metric(odd_channel, "waiting"), 2);
    CHECK_INT(metric(odd_channel, "removed"), 2);

    /* Skipping the dead head releases the message behind it. */
    PGresult *r = t_sql(pg, "SELECT id FROM mq_msgs WHERE channel_name = 'deadch'"
                            " AND channel_args = 'c' AND dead_since IS NOT NULL");
    uuid_t id;
    CHECK(r && PQntuples(r) == 1 && uuid_parse(PQgetvalue(r, 0, 0), id) == 0);
    PQclear(r);
    size_t n = 0;
    CHECK_OK(q, pqmq_skip(q, &id, 1, &n));
    CHECK_INT(n, 1);
    check_against_scan("after skip");
    CHECK_INT(metric("deadch", "blocked_chains"), 0);
    CHECK_INT(metric("deadch", "waiting"), 0);

    /* Folding the deltas changes no figure, and empties the deltas. */
    t_exec(pg, "SELECT _mq_count_fold()");
    CHECK_INT(t_sql_int(pg, "SELECT (SELECT count(*) FROM mq_count_deltas)"
                            " + (SELECT count(*) FROM mq_count_batches)"),
              0);
    check_against_scan("after a fold");

    /* Purge deletes one channel only, counted as removed. */
    r = t_sql(pg, "SELECT count(*) FROM mq_purge('sched')");
    CHECK(r && atoi(PQgetvalue(r, 0, 0)) == 2);
    PQclear(r);
    CHECK_INT(metric("sched", "scheduled"), 0);
    CHECK_INT(metric("sched", "removed"), 2);
    check_against_scan("after purge");

    /* TRUNCATE (which skips row triggers) resets the counts of messages;
     * removed, a counter, stays. */
    t_truncate();
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_metrics() WHERE ready + in_flight"
                            " + scheduled + uncommitted + waiting + dead > 0"),
              0);
    CHECK_INT(metric("sched", "removed"), 2);
    insert("plain", NULL, 1, 0, 4, 1000, 0, -1);
    CHECK_INT(metric("plain", "ready"), 1);
}

/* A transaction that rolls back leaves the counters as they were. */
static void test_rolled_back_insert_is_not_counted(void)
{
    t_truncate();
    insert("rb", NULL, 1, 0, 4, 1000, 0, -1);
    t_exec(pg, "BEGIN");
    pqmq_client *w = NULL;
    CHECK_OK(w, pqmq_wrap(pg, &w));
    pqmq_msg *m = t_msg("rb", NULL, "job", NULL, 0);
    CHECK_OK(w, pqmq_insert(w, &m, 1));
    pqmq_msg_free(m);
    pqmq_client_free(w);
    t_exec(pg, "ROLLBACK");
    CHECK_INT(metric("rb", "ready"), 1);
    check_against_scan("after a rollback");
}

/* Runs sql (a printf format) in a REPEATABLE READ transaction, where no
 * fold runs (_mq_count_fold), and checks the deltas that are there then:
 * rows in mq_count_batches and their elements, rows in mq_count_deltas.
 * Then compares the figures with a full scan (mq_metrics folds them). */
static void counted(long long batches, long long elements, long long rows, const char *sql,
                    int a, int b)
{
    t_exec(pg, "BEGIN ISOLATION LEVEL REPEATABLE READ");
    t_exec(pg, sql, a, b);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_count_batches"), batches);
    CHECK_INT(
        t_sql_int(pg, "SELECT COALESCE(sum(cardinality(names)), 0) FROM mq_count_batches"),
        elements);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_count_deltas"), rows);
    t_exec(pg, "COMMIT");
    check_against_scan(sql);
}

/* b messages on channel names prefix || (g % a), every third ordered
 * (args 'a' || g % 2: two chains a name at most). */
#define INSERT_MANY(prefix)                                                                    \
    "SELECT mq_insert(ARRAY(SELECT ROW(gen_random_uuid(), NULL, 1, NULL,"                      \
    " '" prefix "' || g %% %d, 'a' || g %% 2, NULL, g %% 3 = 0, 'n', NULL, NULL)::mq_new_t"    \
    " FROM generate_series(1, %d) g))"

/* A statement counts in one row: an insert or a delete on one channel as
 * one element, on several as an element per message, and a delete of more
 * than a batch (_mq_limits) on several as a row per channel in
 * mq_count_deltas, as an array of its rows could outgrow a value. (A batch
 * with ordered messages is written to mq_rows, the table these DELETEs
 * name; one through the mq_msgs view is a statement a row.) The figures
 * stay those of a full scan throughout. */
static void test_counters_take_a_row_a_statement(void)
{
    t_truncate();
    t_exec(pg, "SELECT _mq_count_fold()");
    /* 60 messages on 30 channel names, then 40 on one. */
    counted(1, 60, 0, INSERT_MANY("many"), 30, 60);
    counted(1, 1, 0, INSERT_MANY("solo"), 1, 40);
    CHECK_INT(metric("solo0", "ready") + metric("solo0", "waiting"), 40);
    CHECK_INT(metric("solo0", "waiting"), 11); /* 13 ordered on two chains */
    /* Deleted: 3 names' 6 messages, then 10 of the one name's. */
    counted(1, 6, 0, "DELETE FROM mq_rows WHERE channel_name IN ('many%d', 'many%d', 'many3')",
            1, 2);
    counted(1, 1, 0,
            "DELETE FROM mq_rows WHERE id IN (SELECT id FROM mq_rows"
            " WHERE channel_name = 'solo%d' AND channel_args = 'a1' LIMIT %d)",
            0, 10);
    CHECK_INT(metric("many1", "removed"), 2);
    CHECK_INT(metric("solo0", "removed"), 10);

    /* 18,000 on 3 names, 12,000 of them deleted in one statement. */
    t_truncate();
    for (int i = 0; i < 2; i++)
        t_exec(pg, INSERT_MANY("big"), 3, 9000);
    check_against_scan("after 18,000 inserts");
    t_exec(pg, "SELECT _mq_count_fold()");
    counted(0, 0, 2, "DELETE FROM mq_rows WHERE channel_name <> 'big%d' AND %d = 1", 0, 1);
    CHECK_INT(metric("big1", "removed"), 6000);
    CHECK_INT(metric("big0", "ready") + metric("big0", "waiting"), 6000);
    /* On one channel, any number is one element. */
    t_exec(pg, INSERT_MANY("big"), 1, 9000);
    t_exec(pg, "SELECT _mq_count_fold()");
    counted(1, 1, 0, "DELETE FROM mq_rows WHERE channel_name = 'big%d' AND %d = 1", 0, 1);
    CHECK_INT(metric("big0", "removed"), 15000);
}

/* removed is a counter: a channel drained by completions stays in
 * mq_metrics() (every channel, not only named ones) with its count, which
 * only grows, through folds and refills. */
static void test_drained_channel_keeps_its_counter(void)
{
    t_truncate();
    const char *all = "SELECT COALESCE((SELECT removed FROM mq_metrics()"
                      " WHERE channel_name = 'drains'), -1)";
    insert("drains", NULL, 4, 0, 4, 60000, 0, -1);
    pqmq_batch *b = poll_ch("drains", 10);
    CHECK_INT(pqmq_batch_count(b), 4);
    CHECK_OK(q, pqmq_complete_batch(q, b));
    pqmq_batch_free(b);
    CHECK_INT(t_sql_int(pg, "%s", all), 4);
    t_exec(pg, "SELECT _mq_count_fold()");
    CHECK_INT(t_sql_int(pg, "%s", all), 4);
    CHECK_INT(t_sql_int(pg, "SELECT ready + in_flight + scheduled + waiting + dead"
                            " FROM mq_metrics() WHERE channel_name = 'drains'"),
              0);
    /* A refill and a second drain add to it. */
    insert("drains", NULL, 2, 0, 4, 60000, 0, -1);
    CHECK_INT(t_sql_int(pg, "%s", all), 4);
    b = poll_ch("drains", 10);
    CHECK_OK(q, pqmq_complete_batch(q, b));
    pqmq_batch_free(b);
    CHECK_INT(t_sql_int(pg, "%s", all), 6);
}

/* A row written into mq_msgs by hand gets its chain key (polls find it)
 * and is counted; moving it to another channel moves both. */
static void test_rows_written_by_hand_are_keyed_and_counted(void)
{
    t_truncate();
    insert("byhand", NULL, 1, 0, 4, 1000, 0, -1);
    t_exec(pg, "INSERT INTO mq_msgs (id, channel_name, name, payload_json) VALUES"
               " ('00000000-0000-4000-8000-0000000000a1', 'byhand', 'job', '{}'),"
               " ('00000000-0000-4000-8000-0000000000a2', 'byhand', 'job', '{}')");
    CHECK_INT(metric("byhand", "ready"), 3);
    check_against_scan("after an INSERT by hand");
    t_exec(pg, "UPDATE mq_msgs SET channel_name = 'moved'"
               " WHERE id = '00000000-0000-4000-8000-0000000000a2'");
    CHECK_INT(metric("byhand", "ready"), 2);
    CHECK_INT(metric("moved", "ready"), 1);
    check_against_scan("after moving a row");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE channel_key <>"
                            " ((hashtext(channel_name)::bigint << 32)"
                            " | (hashtext(channel_args)::bigint & 4294967295))"),
              0);
    pqmq_batch *b = poll_ch("byhand", 10);
    CHECK_INT(pqmq_batch_count(b), 2);
    pqmq_batch_free(b);
    b = poll_ch("moved", 10);
    CHECK_INT(pqmq_batch_count(b), 1);
    pqmq_batch_free(b);
}

/* ---- alert counters (mq_alert_metrics) ---------------------------------- */

static long long alert(const char *channel, const char *column)
{
    return t_sql_int(pg, "SELECT COALESCE((SELECT %s FROM mq_alert_metrics(ARRAY['%s'])), -1)",
                     column, channel);
}

/* Failed attempts, retries and dead messages are counted where they
 * happen (mq_fail with and without an attempt left, a final lease that
 * ran out), not for a skip or a retry by an operator, and survive a drain
 * and folds. */
static void test_failures_are_counted(void)
{
    t_truncate();
    /* Two attempts each, no backoff. */
    insert("alerts", NULL, 2, 0, 1, 0, 0, -1);
    pqmq_batch *b = poll_ch("alerts", 10);
    CHECK_INT(pqmq_batch_count(b), 2);
    uuid_t id0, id1;
    pqmq_job_id(pqmq_batch_job(b, 0), id0);
    pqmq_job_id(pqmq_batch_job(b, 1), id1);
    CHECK_OK(q, pqmq_fail(q, id0, "first"));
    CHECK_OK(q, pqmq_fail(q, id1, "first"));
    pqmq_batch_free(b);
    CHECK_INT(alert("alerts", "failed"), 2);
    CHECK_INT(alert("alerts", "retried"), 2);
    CHECK_INT(alert("alerts", "dead"), 0);
    /* Their second and last attempt fails: dead. */
    b = poll_ch("alerts", 10);
    CHECK_INT(pqmq_batch_count(b), 2);
    pqmq_job_id(pqmq_batch_job(b, 0), id0);
    CHECK_OK(q, pqmq_fail(q, id0, "second"));
    pqmq_batch_free(b);
    CHECK_INT(alert("alerts", "failed"), 3);
    CHECK_INT(alert("alerts", "retried"), 2);
    CHECK_INT(alert("alerts", "dead"), 1);
    /* The other's final lease runs out: reaped, a failure and dead. */
    t_exec(pg, "UPDATE mq_msgs SET attempt_at = now() - interval '1 second'"
               " WHERE channel_name = 'alerts' AND dead_since IS NULL AND attempts = 0");
    CHECK_INT(t_sql_int(pg, "SELECT mq_reap_dead()"), 1);
    CHECK_INT(alert("alerts", "failed"), 4);
    CHECK_INT(alert("alerts", "dead"), 2);
    /* An operator's retry and a skip of a chain member count nothing. */
    CHECK_INT(t_sql_int(pg, "SELECT mq_retry(ARRAY(SELECT id FROM mq_msgs"
                            " WHERE channel_name = 'alerts' AND dead_since IS NOT NULL))"),
              2);
    insert("alerts", "chain", 2, 1, 3, 1000, 0, -1);
    CHECK_INT(t_sql_int(pg, "SELECT mq_skip(ARRAY(SELECT id FROM mq_msgs"
                            " WHERE channel_name = 'alerts' AND chain_seq IS NOT NULL))"),
              2);
    CHECK_INT(alert("alerts", "failed"), 4);
    CHECK_INT(alert("alerts", "retried"), 2);
    CHECK_INT(alert("alerts", "dead"), 2);
    /* A drain, a fold and a TRUNCATE keep them. */
    t_exec(pg, "SELECT count(*) FROM mq_purge('alerts')");
    t_exec(pg, "SELECT _mq_event_fold()");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_event_deltas"), 0);
    t_truncate();
    CHECK_INT(alert("alerts", "failed"), 4);
    CHECK_INT(alert("alerts", "dead"), 2);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_alert_metrics() WHERE channel_name ="
                            " 'alerts'"),
              1);
}

/* Completions feed the time-in-queue histogram (insert to first delivery,
 * cumulative buckets) and the last completion's time; a producer's
 * cancellation of a delayed message and a dead message purged do not. */
static void test_time_in_queue_histogram(void)
{
    t_truncate();
    insert("waits", NULL, 4, 0, 4, 60000, 0, -1);
    /* Inserted 2, 2, 20 and 2000 seconds ago (by hand; one statement a row
     * with constants: Citus refuses a stable function of a column). */
    static const int ages[] = {2, 2, 20, 2000};
    PGresult *ids =
        t_sql(pg, "SELECT id FROM mq_msgs WHERE channel_name = 'waits' ORDER BY id");
    CHECK_INT(ids ? PQntuples(ids) : -1, 4);
    for (int i = 0; ids && i < PQntuples(ids) && i < 4; i++)
        t_exec(pg,
               "UPDATE mq_msgs SET created_at = now() - interval '%d seconds' WHERE id = '%s'",
               ages[i], PQgetvalue(ids, i, 0));
    PQclear(ids);
    CHECK_INT(t_sql_int(pg, "SELECT (last_completed_at IS NULL)::int"
                            " FROM mq_alert_metrics(ARRAY['waits'])"),
              1);
    pqmq_batch *b = poll_ch("waits", 10);
    CHECK_INT(pqmq_batch_count(b), 4);
    CHECK_OK(q, pqmq_complete_batch(q, b));
    pqmq_batch_free(b);
    /* Cancelled before delivery, and purged dead: not completions. */
    insert("waits", NULL, 1, 0, 4, 60000, 3600000, -1);
    t_exec(pg, "SELECT mq_delete(ARRAY(SELECT id FROM mq_msgs WHERE channel_name = 'waits'))");
    insert("waits", NULL, 1, 0, 0, 60000, 0, -1);
    b = poll_ch("waits", 10);
    uuid_t id;
    pqmq_job_id(pqmq_batch_job(b, 0), id);
    CHECK_OK(q, pqmq_fail(q, id, "no"));
    pqmq_batch_free(b);
    t_exec(pg, "SELECT count(*) FROM mq_purge('waits')");

    CHECK_INT(alert("waits", "completed"), 4);
    PGresult *r = t_sql(pg, "SELECT array_to_string(wait_le, ' '),"
                            " array_to_string(wait_buckets, ' '), wait_sum,"
                            " extract(epoch FROM now() - last_completed_at)"
                            " FROM mq_alert_metrics(ARRAY['waits'])");
    CHECK(r && PQntuples(r) == 1);
    if (r && PQntuples(r) == 1) {
        CHECK_STR(PQgetvalue(r, 0, 0), "0.01 0.05 0.1 0.5 1 5 10 30 60 300 900 3600");
        CHECK_STR(PQgetvalue(r, 0, 1), "0 0 0 0 0 2 2 3 3 3 3 4");
        double sum = atof(PQgetvalue(r, 0, 2));
        CHECK(sum >= 2024 && sum < 2030);
        double ago = atof(PQgetvalue(r, 0, 3));
        CHECK(ago >= 0 && ago < 60);
    }
    PQclear(r);
}

/* Time in queue ends at the first delivery, not at the completion: a
 * message claimed at once and completed 1.2 s later counts under 0.5 s,
 * logged (plain) or a row of mq_rows (priority 1); a retried one's first
 * delivery stays its first. */
static void test_time_in_queue_ends_at_first_delivery(void)
{
    t_truncate();
    insert("firsts", NULL, 1, 0, 4, 60000, 0, -1);
    pqmq_msg *m = t_msg("firsts", NULL, "job", "{}", 0);
    CHECK_OK(q, pqmq_msg_set_priority(m, 1));
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    pqmq_msg_free(m);
    pqmq_batch *b = poll_ch("firsts", 10);
    CHECK_INT(pqmq_batch_count(b), 2);
    t_sleep_ms(1200);
    CHECK_OK(q, pqmq_complete_batch(q, b));
    pqmq_batch_free(b);
    /* Claimed at once, failed, retried after its backoff, completed. */
    insert("firsts", NULL, 1, 0, 4, 2000, 0, -1); /* a lease of 2 s, a retry 2 s later */
    b = poll_ch("firsts", 10);
    uuid_t id;
    pqmq_job_id(pqmq_batch_job(b, 0), id);
    pqmq_batch_free(b);
    t_sleep_ms(1200);
    CHECK_OK(q, pqmq_fail(q, id, "again"));
    t_sleep_ms(2100);
    b = poll_ch("firsts", 10);
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_OK(q, pqmq_complete_batch(q, b));
    pqmq_batch_free(b);
    CHECK_INT(alert("firsts", "completed"), 3);
    /* (wait_le[4] = 0.5 s, wait_le[5] = 1 s) */
    CHECK_INT(alert("firsts", "wait_buckets[4]"), 3);
    CHECK(t_sql_int(pg, "SELECT (wait_sum * 1000)::bigint FROM mq_alert_metrics("
                        "ARRAY['firsts'])") < 1500);
}

/* A claim of a row of mq_rows writes the first delivery's time in the row
 * it updates anyway, among the columns that update writes: a HOT update's
 * WAL record carries the row from its first changed column to its last,
 * so that column placed after the payload would carry the payload with
 * every claim (docs/performance.md, a chain member's WAL). */
static void test_first_delivery_time_adds_no_payload_to_wal(void)
{
    if (t_citus_skip("a claim's WAL is written on the workers"))
        return;
    t_truncate();
    char json[1800];
    int len = snprintf(json, sizeof json, "{\"p\": \"");
    for (int i = 0; i < 1700; i++)
        json[len++] = (char)('a' + (i * 7) % 26);
    snprintf(json + len, sizeof json - (size_t)len, "\"}");
    long long least = -1;
    for (int round = 0; round < 3; round++) {
        pqmq_msg *m = t_msg("walw", NULL, "job", json, 0);
        CHECK_OK(q, pqmq_msg_set_priority(m, 1)); /* a row of mq_rows */
        CHECK_OK(q, pqmq_insert(q, &m, 1));
        pqmq_msg_free(m);
        long long before = t_sql_int(pg, "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn");
        CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_claim(ARRAY['walw'], 1) "
                                "WHERE id IS NOT NULL"),
                  1);
        long long wal =
            t_sql_int(pg, "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn") - before;
        CHECK_INT(
            t_sql_int(pg, "SELECT count(*) FROM mq_rows WHERE first_claimed_at IS NOT NULL"),
            1);
        t_exec(pg, "SELECT mq_complete(array_agg(id)) FROM mq_rows");
        if (least < 0 || wal < least)
            least = wal;
    }
    printf("    WAL of the claim of a row with a 1,700-byte payload: %lld B\n", least);
    CHECK(least > 0 && least < 1000);
}

/* ---- a parser of the Prometheus text exposition format ------------------ */

typedef struct {
    char name[64];
    char channel[128];
    char state[32];
    char le[32];
    double value;
} sample;

typedef struct {
    sample s[1024];
    int n;
    char types[16][64]; /* families with a TYPE line */
    int ntypes;
    int errors;
} exposition;

static int is_name_char(int c, int first)
{
    return isalpha(c) || c == '_' || c == ':' || (!first && isdigit(c));
}

/* Reads a quoted label value at *p (after the opening quote) into out. */
static int parse_label_value(const char **p, char *out, size_t size)
{
    size_t n = 0;
    const char *s = *p;
    for (; *s && *s != '"'; s++) {
        char c = *s;
        if (c == '\n')
            return -1; /* a raw newline inside a value: not the format */
        if (c == '\\') {
            s++;
            if (*s == 'n')
                c = '\n';
            else if (*s == '\\' || *s == '"')
                c = *s;
            else
                return -1; /* no other escapes exist */
        }
        if (n + 1 >= size)
            return -1;
        out[n++] = c;
    }
    if (*s != '"')
        return -1;
    out[n] = '\0';
    *p = s + 1;
    return 0;
}

static int parse_sample(const char *line, sample *out)
{
    const char *p = line;
    size_t n = 0;
    memset(out, 0, sizeof *out);
    if (!is_name_char((unsigned char)*p, 1))
        return -1;
    while (is_name_char((unsigned char)*p, 0) && n + 1 < sizeof out->name)
        out->name[n++] = *p++;
    if (*p == '{') {
        p++;
        while (*p != '}') {
            char label[64], value[128];
            size_t k = 0;
            if (!is_name_char((unsigned char)*p, 1))
                return -1;
            while (is_name_char((unsigned char)*p, 0) && k + 1 < sizeof label)
                label[k++] = *p++;
            label[k] = '\0';
            if (*p++ != '=' || *p++ != '"' || parse_label_value(&p, value, sizeof value))
                return -1;
            if (!strcmp(label, "channel"))
                strcpy(out->channel, value);
            else if (!strcmp(label, "state") && strlen(value) < sizeof out->state)
                strcpy(out->state, value);
            else if (!strcmp(label, "le") && strlen(value) < sizeof out->le)
                strcpy(out->le, value);
            else
                return -1; /* a label this test does not expect */
            if (*p == ',')
                p++;
            else if (*p != '}')
                return -1;
        }
        p++;
    }
    if (*p++ != ' ')
        return -1;
    char *end;
    out->value = strtod(p, &end);
    if (end == p || (*end && *end != ' '))
        return -1;
    return 0;
}

static void parse_exposition(const char *text, exposition *e)
{
    memset(e, 0, sizeof *e);
    const char *line = text;
    while (*line) {
        const char *nl = strchr(line, '\n');
        if (!nl) {
            e->errors++; /* every line ends with a newline */
            break;
        }
        char buf[512];
        size_t len = (size_t)(nl - line);
        if (len >= sizeof buf) {
            e->errors++;
            break;
        }
        memcpy(buf, line, len);
        buf[len] = '\0';
        line = nl + 1;
        if (!strncmp(buf, "# TYPE ", 7)) {
            char name[64], type[32];
            if (sscanf(buf + 7, "%63s %31s", name, type) != 2 ||
                (strcmp(type, "gauge") && strcmp(type, "counter") &&
                 strcmp(type, "histogram")) ||
                e->ntypes == 16)
                e->errors++;
            else
                strcpy(e->types[e->ntypes++], name);
        } else if (!strncmp(buf, "# HELP ", 7) || buf[0] == '\0') {
            continue;
        } else if (buf[0] == '#') {
            continue;
        } else if (e->n < 1024 && parse_sample(buf, &e->s[e->n]) == 0) {
            int declared = 0;
            const char *nm = e->s[e->n].name;
            for (int i = 0; i < e->ntypes; i++) {
                size_t k = strlen(e->types[i]);
                /* (a histogram's samples: NAME_bucket, NAME_sum, NAME_count) */
                declared |= !strncmp(e->types[i], nm, k) &&
                            (!nm[k] || !strcmp(nm + k, "_bucket") || !strcmp(nm + k, "_sum") ||
                             !strcmp(nm + k, "_count"));
            }
            if (!declared)
                e->errors++; /* a sample before its family's TYPE line */
            e->n++;
        } else {
            fprintf(stderr, "unparsable line: %s\n", buf);
            e->errors++;
        }
    }
}

static const sample *find(const exposition *e, const char *name, const char *channel,
                          const char *state)
{
    for (int i = 0; i < e->n; i++)
        if (!strcmp(e->s[i].name, name) && !strcmp(e->s[i].channel, channel) &&
            !strcmp(e->s[i].state, state ? state : ""))
            return &e->s[i];
    return NULL;
}

static const sample *find_le(const exposition *e, const char *channel, const char *le)
{
    for (int i = 0; i < e->n; i++)
        if (!strcmp(e->s[i].name, "pqmq_time_in_queue_seconds_bucket") &&
            !strcmp(e->s[i].channel, channel) && !strcmp(e->s[i].le, le))
            return &e->s[i];
    return NULL;
}

/* Rows of mq_msgs fetched so far, with every connection's counters in. */
static long long rows_fetched(void)
{
    t_exec(pqmq_conn(q), "SELECT pg_stat_force_next_flush()");
    t_exec(pg, "SELECT pg_stat_force_next_flush()");
    t_exec(pg, "SELECT pg_stat_clear_snapshot()");
    return t_sql_int(pg, "SELECT COALESCE(sum(COALESCE(seq_tup_read, 0) "
                         "+ COALESCE(idx_tup_fetch, 0)), 0) "
                         "FROM pg_stat_user_tables WHERE schemaname = current_schema() "
                         "AND relname IN ('mq_rows', 'mq_log', 'mq_cursors', 'mq_receipts', "
                         "'mq_done', 'mq_log_gone')");
}

/* Named channels: only their messages are read to tell the ones in flight
 * from the ready ones, not the ready backlog of every channel. */
static void test_named_channels_read_only_their_messages(void)
{
    t_exec(pg, "SET stats_fetch_consistency = none");
    t_truncate();
    t_exec(pg, "SELECT mq_insert(ARRAY(SELECT ROW(gen_random_uuid(), NULL, 3, "
               "interval '1 hour', 'other', '', NULL, false, 'n', '{}', NULL)::mq_new_t "
               "FROM generate_series(1, 5000)))");
    insert("mine", NULL, 3, 0, 4, 60000, 0, -1);
    pqmq_batch *b = poll_ch("mine", 1);
    CHECK_INT(pqmq_batch_count(b), 1);
    pqmq_batch_free(b);
    /* else the dead letters are found by a seq scan */
    t_exec(pg, "ANALYZE mq_rows, mq_log, mq_cursors, mq_receipts");
    long long before = rows_fetched();
    CHECK_INT(metric("mine", "in_flight"), 1);
    CHECK_INT(metric("mine", "ready"), 2);
    long long read = rows_fetched() - before;
    printf("    rows of mq_msgs read by two mq_metrics(ARRAY['mine']): %lld\n", read);
    /* Reading the ready backlog of every channel is over 10,000. */
    if (!t_citus_skip("the rows read are counted by the worker"))
        CHECK(read < 500);
}

/* The channel test of named-channel reads (_mq_in_channel) bounds their
 * index scans only if the planner inlines it: a function it inlines is
 * never called, so with track_functions on, the transaction's function
 * statistics count the readers and not it. */
static void test_channel_test_is_inlined(void)
{
    if (t_citus_skip("the scans run on the worker, whose counts this session cannot see"))
        return;
    t_truncate();
    insert("ic", NULL, 3, 0, 4, 60000, 0, -1);
    t_exec(pg, "BEGIN");
    t_exec(pg, "SET LOCAL track_functions = 'all'");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_metrics(ARRAY['ic'])"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_peek('ic')"), 3);
    /* An idle poll of a named channel: its wait time. */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_claim(ARRAY['none'], 1) "
                            "WHERE id IS NULL"),
              1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM pg_stat_xact_user_functions "
                            "WHERE schemaname = current_schema() AND calls > 0 "
                            "AND funcname IN ('mq_metrics', '_mq_oldest_ready', 'mq_peek', "
                            "'_mq_wait_time')"),
              4);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM pg_stat_xact_user_functions "
                            "WHERE schemaname = current_schema() "
                            "AND funcname IN ('_mq_in_channel', '_mq_claimable')"),
              0);
    t_exec(pg, "ROLLBACK");
}

static void test_pqmq_metrics_parses_and_matches(void)
{
    build_mixed_queue();
    int st = -1;
    char *text = t_run_pqmq("metrics", &st);
    CHECK_INT(st, 0);
    CHECK(text != NULL);
    if (!text)
        return;
    exposition e;
    parse_exposition(text, &e);
    CHECK_INT(e.errors, 0);
    /* 5 families of status, 5 of alerts, the workers' gauge */
    CHECK_INT(e.ntypes, 11);

    static const char *const states[] = {"ready",       "in_flight", "scheduled",
                                         "uncommitted", "waiting",   "dead"};
    PGresult *r =
        t_sql(pg, "SELECT channel_name, ready, in_flight, scheduled, uncommitted,"
                  " waiting, dead, blocked_chains, removed, paused FROM mq_metrics()");
    int channels = r ? PQntuples(r) : 0;
    /* The mixed queue's 7, and the drained channels of the earlier tests. */
    CHECK(channels >= 7);
    int saw_odd = 0;
    for (int i = 0; i < channels; i++) {
        const char *ch = PQgetvalue(r, i, 0);
        saw_odd |= !strcmp(ch, odd_channel);
        for (int s = 0; s < 6; s++) {
            const sample *x = find(&e, "pqmq_messages", ch, states[s]);
            CHECK(x != NULL);
            if (x && x->value != atof(PQgetvalue(r, i, s + 1)))
                t_fail(__FILE__, __LINE__, "%s/%s: %g, mq_metrics %s", ch, states[s], x->value,
                       PQgetvalue(r, i, s + 1));
        }
        const sample *b = find(&e, "pqmq_blocked_chains", ch, NULL);
        CHECK(b && b->value == atof(PQgetvalue(r, i, 7)));
        const sample *rm = find(&e, "pqmq_removed_total", ch, NULL);
        CHECK(rm && rm->value == atof(PQgetvalue(r, i, 8)));
        const sample *pz = find(&e, "pqmq_channel_paused", ch, NULL);
        CHECK(pz && pz->value == (PQgetvalue(r, i, 9)[0] == 't'));
        CHECK(find(&e, "pqmq_oldest_ready_age_seconds", ch, NULL) != NULL);
    }
    CHECK(saw_odd);
    PQclear(r);
    /* The alert families match mq_alert_metrics, channel by channel. */
    r = t_sql(pg, "SELECT channel_name, failed, retried, dead, completed,"
                  " wait_buckets[5], last_completed_at IS NOT NULL FROM mq_alert_metrics()");
    int arows = r ? PQntuples(r) : 0, completed_channels = 0;
    /* (and channels with failures whose messages went with a TRUNCATE) */
    CHECK(arows >= channels);
    static const char *const counters[] = {"pqmq_failed_attempts_total", "pqmq_retries_total",
                                           "pqmq_dead_total",
                                           "pqmq_time_in_queue_seconds_count"};
    for (int i = 0; i < arows; i++) {
        const char *ch = PQgetvalue(r, i, 0);
        for (int k = 0; k < 4; k++) {
            const sample *x = find(&e, counters[k], ch, NULL);
            if (!x || x->value != atof(PQgetvalue(r, i, k + 1)))
                t_fail(__FILE__, __LINE__, "%s{%s}: %g, mq_alert_metrics %s", counters[k], ch,
                       x ? x->value : -1, PQgetvalue(r, i, k + 1));
        }
        const sample *b = find_le(&e, ch, "1");
        CHECK(b && b->value == atof(PQgetvalue(r, i, 5)));
        b = find_le(&e, ch, "+Inf");
        CHECK(b && b->value == atof(PQgetvalue(r, i, 4)));
        int done = PQgetvalue(r, i, 6)[0] == 't';
        completed_channels += done;
        CHECK((find(&e, "pqmq_last_completion_timestamp_seconds", ch, NULL) != NULL) == done);
    }
    PQclear(r);
    CHECK(completed_channels > 0);
    /* Per channel: 10 of status; 3 counters, 13 buckets, sum and count;
     * the last completion where there was one; the workers' 2. */
    CHECK_INT(e.n, channels * 10 + arows * 18 + completed_channels + 2);
    CHECK(find(&e, "pqmq_workers", "", "live") != NULL);
    const sample *x = find(&e, "pqmq_messages", odd_channel, "waiting");
    CHECK(x && x->value == 4);
    x = find(&e, "pqmq_messages", spaced_channel, "ready");
    CHECK(x && x->value == 1);
    free(text);

    /* Only the named channels. */
    text = t_run_pqmq("metrics plain", &st);
    CHECK_INT(st, 0);
    parse_exposition(text ? text : "", &e);
    CHECK_INT(e.errors, 0);
    CHECK_INT(e.n, 10 + 18 +
                       (int)t_sql_int(pg, "SELECT count(*) FROM mq_alert_metrics("
                                          "ARRAY['plain']) WHERE last_completed_at"
                                          " IS NOT NULL") +
                       2);
    CHECK(find(&e, "pqmq_failed_attempts_total", "plain", NULL) != NULL);
    x = find(&e, "pqmq_messages", "plain", "in_flight");
    CHECK(x && x->value == 2);
    free(text);
}

/* The parser itself rejects what the format forbids (so it can fail). */
static void test_parser_rejects_bad_escapes(void)
{
    exposition e;
    parse_exposition("# TYPE pqmq_messages gauge\n"
                     "pqmq_messages{channel=\"a\\qb\",state=\"ready\"} 1\n",
                     &e);
    CHECK_INT(e.errors, 1);
    parse_exposition("pqmq_messages{channel=\"a\",state=\"ready\"} 1\n", &e);
    CHECK_INT(e.errors, 1); /* no TYPE line */
    parse_exposition("# TYPE m gauge\nm{channel=\"a\"b\"} 1\n", &e);
    CHECK_INT(e.errors, 1);
    parse_exposition("# TYPE m gauge\nm{channel=\"a\\\"b\\\\c\\nd\"} 2\n", &e);
    CHECK_INT(e.errors, 0);
    CHECK(e.n == 1 && !strcmp(e.s[0].channel, "a\"b\\c\nd") && e.s[0].value == 2);
}

int main(void)
{
    t_init("metrics");
    q = t_client();
    pg = t_pg();
    T_RUN(test_parser_rejects_bad_escapes);
    T_RUN(test_metrics_match_a_full_scan);
    T_RUN(test_rolled_back_insert_is_not_counted);
    T_RUN(test_counters_take_a_row_a_statement);
    T_RUN(test_drained_channel_keeps_its_counter);
    T_RUN(test_rows_written_by_hand_are_keyed_and_counted);
    T_RUN(test_failures_are_counted);
    T_RUN(test_time_in_queue_histogram);
    T_RUN(test_time_in_queue_ends_at_first_delivery);
    T_RUN(test_first_delivery_time_adds_no_payload_to_wal);
    T_RUN(test_named_channels_read_only_their_messages);
    T_RUN(test_channel_test_is_inlined);
    T_RUN(test_pqmq_metrics_parses_and_matches);
    PQfinish(pg);
    pqmq_client_free(q);
    return t_done();
}
