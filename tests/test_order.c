/* test_order.c: ordered chains (semantics 2 and 5). */
#include <pthread.h>
#include <stdlib.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

/* Inserts ordered messages {"seq": first..first+n-1} on chain (ch, args). */
static void insert_seq(pqmq_client *c, const char *ch, const char *args, int first, int n)
{
    pqmq_msg **msgs = calloc((size_t)n, sizeof *msgs);
    for (int i = 0; i < n; i++) {
        char json[64];
        snprintf(json, sizeof json, "{\"seq\": %d}", first + i);
        msgs[i] = t_msg(ch, args, "step", json, 1);
    }
    CHECK_OK(c, pqmq_insert(c, msgs, (size_t)n));
    t_msgs_free(msgs, (size_t)n);
    free(msgs);
}

static int job_seq(const pqmq_job *j)
{
    const char *s = strstr(pqmq_job_json(j), "\"seq\": ");
    return s ? atoi(s + 7) : -1;
}

/* Drains the given channel one poll at a time, recording seqs in order. */
static int drain(const char *ch, int *out, int cap)
{
    int n = 0;
    for (int polls = 0; polls < 10 * cap + 10; polls++) {
        pqmq_batch *b = NULL;
        const char *chans[] = {ch};
        CHECK_OK(q, pqmq_poll(q, chans, 1, 100, &b));
        size_t k = pqmq_batch_count(b);
        for (size_t i = 0; i < k && n < cap; i++)
            out[n++] = job_seq(pqmq_batch_job(b, i));
        if (k)
            CHECK_OK(q, pqmq_complete_batch(q, b));
        pqmq_batch_free(b);
        if (!k) {
            if (t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE channel_name = '%s'", ch) ==
                0)
                break;
            t_sleep_ms(5);
        }
    }
    return n;
}

static void test_batch_order_is_array_order_not_id_order(void)
{
    t_truncate();
    enum { N = 20 };
    pqmq_msg *msgs[N];
    for (int i = 0; i < N; i++) {
        char json[32];
        snprintf(json, sizeof json, "{\"seq\": %d}", i);
        msgs[i] = t_msg("ord", "k", "step", json, 1);
        /* ids descending: id order is the reverse of array order */
        uuid_t id = {0};
        id[0] = (unsigned char)(0xf0 - i);
        id[15] = 1;
        pqmq_msg_set_id(msgs[i], id);
    }
    CHECK_OK(q, pqmq_insert(q, msgs, N));
    t_msgs_free(msgs, N);
    int seqs[N];
    CHECK_INT(drain("ord", seqs, N), N);
    for (int i = 0; i < N; i++)
        CHECK_INT(seqs[i], i);
}

static void test_order_across_batches_and_interleaved_chains(void)
{
    t_truncate();
    insert_seq(q, "ord", "a", 0, 5);
    insert_seq(q, "ord", "b", 100, 3);
    insert_seq(q, "ord", "a", 5, 5);
    int seqs[13], a = 0, b = 100;
    CHECK_INT(drain("ord", seqs, 13), 13);
    for (int i = 0; i < 13; i++) {
        if (seqs[i] >= 100)
            CHECK_INT(seqs[i], b++);
        else
            CHECK_INT(seqs[i], a++);
    }
    CHECK_INT(a, 10);
    CHECK_INT(b, 103);
}

static void test_one_in_flight_per_chain(void)
{
    t_truncate();
    insert_seq(q, "ord", "k", 0, 10);
    t_exec(pg, "UPDATE mq_msgs SET retry_backoff = '300 ms'");
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 100, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_INT(job_seq(pqmq_batch_job(b, 0)), 0);
    pqmq_batch_free(b);
    /* While the head is leased nothing else of the chain is ready. */
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 100, &b));
    CHECK_INT(pqmq_batch_count(b), 0);
    CHECK(pqmq_batch_wait_ms(b) > 0 && pqmq_batch_wait_ms(b) <= 300);
    pqmq_batch_free(b);
    /* After the lease runs out the same head comes back, not its successor. */
    t_sleep_ms(350);
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 100, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_INT(job_seq(pqmq_batch_job(b, 0)), 0);
    CHECK_INT(pqmq_job_attempt(pqmq_batch_job(b, 0)), 2);
    CHECK_OK(q, pqmq_complete_batch(q, b));
    pqmq_batch_free(b);
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 100, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_INT(job_seq(pqmq_batch_job(b, 0)), 1);
    pqmq_batch_free(b);
}

/* Deletes the pending messages with these seqs of channel "ord". */
static void cancel(const char *seqs)
{
    t_exec(pg,
           "SELECT mq_delete(array(SELECT id FROM mq_payloads "
           "WHERE (payload_json->>'seq')::int IN (%s)))",
           seqs);
}

static void test_cancel_anywhere_keeps_order(void)
{
    t_truncate();
    insert_seq(q, "ord", "k", 0, 10);
    cancel("0");                      /* the head, before delivery */
    cancel("4");                      /* the middle */
    cancel("6, 7");                   /* two neighbours in one call */
    cancel("9");                      /* the tail */
    insert_seq(q, "ord", "k", 10, 2); /* appends after the new tail, 8 */
    /* Every member has its own place; none was rewritten by the deletes. */
    CHECK_INT(t_sql_int(pg, "SELECT count(DISTINCT chain_seq) FROM mq_msgs"), 7);
    int seqs[7];
    static const int want[] = {1, 2, 3, 5, 8, 10, 11};
    CHECK_INT(drain("ord", seqs, 7), 7);
    for (int i = 0; i < 7; i++)
        CHECK_INT(seqs[i], want[i]);
}

static void test_cancel_whole_chain_then_restart(void)
{
    t_truncate();
    insert_seq(q, "ord", "k", 0, 4);
    cancel("0, 1, 2, 3");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    insert_seq(q, "ord", "k", 4, 2);
    int seqs[2];
    CHECK_INT(drain("ord", seqs, 2), 2);
    CHECK_INT(seqs[0], 4);
    CHECK_INT(seqs[1], 5);
}

enum { PRODUCERS = 4, BATCHES = 30, PER_BATCH = 5 };

static void *producer(void *arg)
{
    int p = (int)(intptr_t)arg;
    pqmq_client *c = t_client();
    for (int b = 0; b < BATCHES; b++)
        insert_seq(c, "ord", "shared", p * 100000 + b * PER_BATCH, PER_BATCH);
    pqmq_client_free(c);
    return NULL;
}

static void test_concurrent_producers_on_one_chain(void)
{
    t_truncate();
    pthread_t th[PRODUCERS];
    for (int p = 0; p < PRODUCERS; p++)
        pthread_create(&th[p], NULL, producer, (void *)(intptr_t)p);
    for (int p = 0; p < PRODUCERS; p++)
        pthread_join(th[p], NULL);
    enum { TOTAL = PRODUCERS * BATCHES * PER_BATCH };
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), TOTAL);
    /* One chain: every message has its own place in it. */
    CHECK_INT(t_sql_int(pg, "SELECT count(DISTINCT chain_seq) FROM mq_msgs"), TOTAL);
    int *seqs = calloc(TOTAL, sizeof *seqs);
    CHECK_INT(drain("ord", seqs, TOTAL), TOTAL);
    int last[PRODUCERS];
    for (int p = 0; p < PRODUCERS; p++)
        last[p] = -1;
    for (int i = 0; i < TOTAL; i++) {
        int p = seqs[i] / 100000, s = seqs[i] % 100000;
        CHECK(p >= 0 && p < PRODUCERS);
        if (p >= 0 && p < PRODUCERS) {
            CHECK_INT(s, last[p] + 1); /* each producer's order is kept */
            last[p] = s;
        }
    }
    free(seqs);
}

static void test_unordered_does_not_wait_for_chain(void)
{
    t_truncate();
    insert_seq(q, "mixed", "k", 0, 3);
    pqmq_msg *u = t_msg("mixed", "k", "free", "{\"seq\": 99}", 0);
    CHECK_OK(q, pqmq_insert(q, &u, 1));
    pqmq_msg_free(u);
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 2); /* the chain's head and the free one */
    pqmq_batch_free(b);
}

/* A poll's chain walk goes from its turn up to the end of the key space,
 * then from the start up to the turn: each chain head is taken once, also
 * when the second part runs past its end into the first (its probe has no
 * upper bound). The picks lock and write nothing, and each commits, so the
 * turn moves from poll to poll. */
static void test_each_head_is_picked_once(void)
{
    t_truncate();
    insert_seq(q, "ord", "a", 0, 2);
    insert_seq(q, "ord", "b", 0, 2);
    insert_seq(q, "ord", "c", 0, 2);
    PGconn *a = t_pg();
    for (int i = 0; i < 12; i++) {
        PGresult *r = t_sql(a, "SELECT cardinality(p.ids), (SELECT count(DISTINCT x) FROM "
                               "unnest(p.ids) AS x) FROM _mq_pick_set(NULL, 10, "
                               "clock_timestamp(), 0) p");
        CHECK_STR(PQgetvalue(r, 0, 0), "3");
        CHECK_STR(PQgetvalue(r, 0, 1), "3");
        PQclear(r);
    }
    PQfinish(a);
}

/* The seq of the message one SQL claim of conn returns (lane: mq_claim or
 * mq_claim_locked), -1 for none. */
static int claim_seq(PGconn *conn, const char *fn)
{
    return (int)t_sql_int(conn,
                          "SELECT COALESCE((SELECT (j.payload_json::jsonb->>'seq')::int "
                          "FROM %s(NULL, 10) j WHERE j.id IS NOT NULL "
                          "ORDER BY (j.payload_json::jsonb->>'seq')::int LIMIT 1), -1)",
                          fn);
}

/* How many messages one claim of conn takes (its rows with an id). */
static int claim_count(PGconn *conn, const char *fn)
{
    return (int)t_sql_int(conn, "SELECT count(j.id) FROM %s(NULL, 10) j", fn);
}

/* A head held by another transaction (the locked lane's delivery, or a
 * completion or a delete not yet committed) gives nothing of its chain:
 * never its successor. A rollback leaves the head, first again. */
static void test_held_head_gives_nothing(void)
{
    t_truncate();
    insert_seq(q, "ord", "k", 0, 4);
    PGconn *a = t_pg();
    /* The locked lane holds the head. */
    t_exec(a, "BEGIN");
    CHECK_INT(claim_seq(a, "mq_claim_locked"), 0);
    CHECK_INT(claim_count(pg, "mq_claim"), 0);
    CHECK_INT(claim_count(pg, "mq_claim_locked"), 0);
    /* Its completion, not committed yet: still nothing. */
    t_exec(a, "SELECT mq_complete(array(SELECT id FROM mq_payloads "
              "WHERE (payload_json->>'seq')::int = 0), '{0}')");
    CHECK_INT(claim_count(pg, "mq_claim"), 0);
    CHECK_INT(claim_count(pg, "mq_claim_locked"), 0);
    /* Committed: the next member is the head. */
    t_exec(a, "COMMIT");
    CHECK_INT(claim_seq(pg, "mq_claim_locked"), 1);
    /* A delete of the head not committed yet: nothing. */
    t_exec(a, "BEGIN");
    t_exec(a, "SELECT mq_delete(array(SELECT id FROM mq_payloads "
              "WHERE (payload_json->>'seq')::int = 1))");
    CHECK_INT(claim_count(pg, "mq_claim"), 0);
    /* Rolled back (as a crash would): the same head, not the next. */
    t_exec(a, "ROLLBACK");
    CHECK_INT(claim_seq(pg, "mq_claim"), 1);
    PQfinish(a);
}

/* Sets the attempt_at of the head of the k-th chain in key order (0-based)
 * to now plus the interval `in`. (Two statements: on Citus an UPDATE may
 * call no volatile function, and _mq_chain_heads runs in a statement of its
 * own.) */
static void head_due_in(int k, const char *in)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT h.head_id FROM _mq_chain_heads(-9223372036854775808, "
             "9223372036854775807, NULL, NULL, NULL) h ORDER BY h.head_key OFFSET %d LIMIT 1",
             k);
    PGresult *r = PQexec(pg, sql);
    int found = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
    CHECK(found);
    if (found)
        t_exec(pg, "UPDATE mq_msgs SET attempt_at = now() + interval '%s' WHERE id = '%s'", in,
               PQgetvalue(r, 0, 0));
    PQclear(r);
}

/* How many heads a visit of every chain reads when it may stop at the first
 * head due now. */
static int heads_read_to_due(void)
{
    return (int)t_sql_int(pg, "SELECT count(*) FROM _mq_chain_heads(-9223372036854775808, "
                              "9223372036854775807, NULL, NULL, clock_timestamp())");
}

/* How long _mq_wait_time says until a message is due (ms), -1 for never;
 * told the queue has chains, as _mq_pick_set's probe tells a poll here. */
static long long wait_ms(void)
{
    return t_sql_int(pg, "SELECT COALESCE((extract(epoch FROM _mq_wait_time(NULL, "
                         "clock_timestamp(), true)) * 1000)::bigint, -1)");
}

/* The wait for chain heads stops at the first head due now: an empty poll
 * of the locked lane, whose workers hold most heads, read every chain. A
 * head due later never ends the visit, so the wait is the earliest's. */
static void test_wait_stops_at_a_due_head(void)
{
    t_truncate();
    insert_seq(q, "ord", "a", 0, 2);
    insert_seq(q, "ord", "b", 0, 2);
    insert_seq(q, "ord", "c", 0, 2);
    CHECK_INT(heads_read_to_due(), 1); /* all three due: the first answers */
    head_due_in(0, "2 hours");
    head_due_in(1, "1 hour");
    head_due_in(2, "3 hours");
    CHECK_INT(heads_read_to_due(), 3);
    long long w = wait_ms();
    CHECK(w > 3590000 && w <= 3600000); /* the second chain's, an hour */
    head_due_in(1, "-1 second");
    CHECK_INT(heads_read_to_due(), 2);
    CHECK_INT(wait_ms(), 0);
    head_due_in(1, "1 hour");
    head_due_in(2, "-1 second");
    CHECK_INT(heads_read_to_due(), 3);
    CHECK_INT(wait_ms(), 0);
}

/* Polls a chain's head, the one job claimable, and fails it with why. */
static void fail_head(const char *why)
{
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    uuid_t id;
    pqmq_job_id(pqmq_batch_job(b, 0), id);
    CHECK_OK(q, pqmq_fail(q, id, why));
    pqmq_batch_free(b);
}

/* A failed head keeps its place: nothing of the chain until its retry,
 * then the head again, and only then the rest. */
static void test_retry_keeps_place(void)
{
    t_truncate();
    insert_seq(q, "ord", "k", 0, 3);
    t_exec(pg, "UPDATE mq_msgs SET retry_backoff = '200 ms'");
    fail_head("try again");
    CHECK_INT(claim_count(pg, "mq_claim"), 0);
    t_sleep_ms(900);
    CHECK_INT(claim_seq(pg, "mq_claim"), 0);
}

/* A two-phase head not committed yet holds its chain back, even when the
 * members behind it are committed; mq_commit releases it first. */
static void test_uncommitted_head_blocks_chain(void)
{
    t_truncate();
    pqmq_msg *m = t_msg("ord", "k", "step", "{\"seq\": 0}", 1);
    CHECK_INT(pqmq_msg_set_commit_interval(m, 3600 * 1000), 0);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    pqmq_msg_free(m);
    insert_seq(q, "ord", "k", 1, 2);
    CHECK_INT(claim_count(pg, "mq_claim"), 0);
    t_exec(pg, "SELECT mq_commit(array(SELECT id FROM mq_payloads "
               "WHERE (payload_json->>'seq')::int = 0))");
    int seqs[3];
    CHECK_INT(drain("ord", seqs, 3), 3);
    for (int i = 0; i < 3; i++)
        CHECK_INT(seqs[i], i);
}

/* A dead head blocks its chain (listed as blocking) until it is skipped;
 * the rest follows in order. */
static void test_dead_head_blocks_until_skipped(void)
{
    t_truncate();
    insert_seq(q, "ord", "k", 0, 3);
    t_exec(pg, "UPDATE mq_msgs SET attempts = 1");
    fail_head("poison");
    CHECK_INT(claim_count(pg, "mq_claim"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_dead_letters(NULL) WHERE blocking"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT blocked_chains FROM mq_metrics(ARRAY['ord'])"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT waiting FROM mq_metrics(ARRAY['ord'])"), 2);
    CHECK_INT(t_sql_int(pg, "SELECT mq_skip(array(SELECT id FROM mq_msgs "
                            "WHERE dead_since IS NOT NULL))"),
              1);
    int seqs[2];
    CHECK_INT(drain("ord", seqs, 2), 2);
    CHECK_INT(seqs[0], 1);
    CHECK_INT(seqs[1], 2);
}

/* A queue upgraded from 0.1.0 with chains in flight (links, as 0.1.0 kept them)
 * keeps every chain's order and every message. */
static void test_upgrade_converts_linked_chains(void)
{
    if (t_citus_skip("rewrites the schema's version table by hand"))
        return;
    t_truncate();
    insert_seq(q, "ord", "a", 0, 3);
    /* Claim a's head: in flight across the upgrade. */
    CHECK_INT(claim_seq(pg, "mq_claim"), 0);
    insert_seq(q, "ord", "b", 100, 2);
    /* The old layout: links, reversed places, no chain_seq. */
    t_exec(pg, "WITH o AS (SELECT id, channel_args, lag(id) OVER (PARTITION BY channel_args "
               "ORDER BY chain_seq) AS pred FROM mq_msgs) "
               "UPDATE mq_msgs m SET chain_seq = NULL, after_message_id = "
               "COALESCE(o.pred, '00000000-0000-0000-0000-000000000000') FROM o "
               "WHERE m.id = o.id");
    t_exec(pg, "UPDATE mq_schema_migrations SET version = 17, name = '0017_citus'");
    CHECK_OK(q, pqmq_migrate(q));
    CHECK_INT(t_sql_int(pg, "SELECT count(DISTINCT chain_seq) FROM mq_msgs"), 5);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE after_message_id <> "
                            "'00000000-0000-0000-0000-000000000000'"),
              0);
    /* a's head is still in flight; b's head is ready. */
    CHECK_INT(claim_seq(pg, "mq_claim"), 100);
    t_exec(pg, "UPDATE mq_msgs SET attempt_at = now() WHERE deliveries > 0");
    int seqs[5], a = 0, b = 100;
    CHECK_INT(drain("ord", seqs, 5), 5);
    for (int i = 0; i < 5; i++) {
        if (seqs[i] >= 100)
            CHECK_INT(seqs[i], b++);
        else
            CHECK_INT(seqs[i], a++);
    }
}

int main(void)
{
    t_init("order");
    q = t_client();
    pg = t_pg();
    T_RUN(test_batch_order_is_array_order_not_id_order);
    T_RUN(test_order_across_batches_and_interleaved_chains);
    T_RUN(test_one_in_flight_per_chain);
    T_RUN(test_cancel_anywhere_keeps_order);
    T_RUN(test_cancel_whole_chain_then_restart);
    T_RUN(test_concurrent_producers_on_one_chain);
    T_RUN(test_unordered_does_not_wait_for_chain);
    T_RUN(test_each_head_is_picked_once);
    T_RUN(test_held_head_gives_nothing);
    T_RUN(test_wait_stops_at_a_due_head);
    T_RUN(test_retry_keeps_place);
    T_RUN(test_uncommitted_head_blocks_chain);
    T_RUN(test_dead_head_blocks_until_skipped);
    T_RUN(test_upgrade_converts_linked_chains);
    pqmq_client_free(q);
    PQfinish(pg);
    return t_done();
}
