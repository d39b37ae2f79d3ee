/* test_unique.c: unique keys (pqmq_insert_unique, mq_insert_unique). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

/* A message on channel "uk" with key (NULL: none), name and JSON. */
static pqmq_msg *keyed(const char *key, const char *name, const char *json)
{
    pqmq_msg *m = t_msg("uk", NULL, name, json, 0);
    CHECK_INT(pqmq_msg_set_unique_key(m, key), 0);
    return m;
}

/* Inserts one keyed message with mode and retention; returns its outcome
 * and its result id in id. */
static pqmq_outcome insert_key(const char *key, const char *name, pqmq_key_mode mode,
                               int64_t retention_ms, uuid_t id)
{
    pqmq_msg *m = keyed(key, name, "{}");
    pqmq_insert_result r = {.outcome = (pqmq_outcome)-1};
    CHECK_OK(q, pqmq_insert_unique(q, &m, 1, mode, retention_ms, &r));
    pqmq_msg_free(m);
    if (id)
        uuid_copy(id, r.id);
    return r.outcome;
}

static long long live_with_key(const char *key)
{
    return t_sql_int(
        pg,
        "SELECT count(*) FROM mq_msgs WHERE unique_key = '%s' AND channel_name = 'uk' "
        "AND dead_since IS NULL",
        key);
}

static void test_second_insert_keeps_the_first(void)
{
    t_truncate();
    uuid_t a, b;
    CHECK_INT(insert_key("k", "first", PQMQ_KEY_KEEP, 0, a), PQMQ_INSERTED);
    CHECK_INT(insert_key("k", "second", PQMQ_KEY_KEEP, 0, b), PQMQ_KEPT);
    CHECK(uuid_compare(a, b) == 0);
    CHECK_INT(live_with_key("k"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE name = 'first'"), 1);
    /* Another channel has keys of its own; no key is no constraint. */
    pqmq_msg *m[3] = {t_msg("other", NULL, "o", "{}", 0), keyed(NULL, "n1", "{}"),
                      keyed(NULL, "n2", "{}")};
    CHECK_INT(pqmq_msg_set_unique_key(m[0], "k"), 0);
    pqmq_insert_result r[3];
    CHECK_OK(q, pqmq_insert_unique(q, m, 3, PQMQ_KEY_KEEP, 0, r));
    for (int i = 0; i < 3; i++)
        CHECK_INT(r[i].outcome, PQMQ_INSERTED);
    t_msgs_free(m, 3);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 4);
    /* pqmq_insert keeps too. */
    pqmq_msg *again = keyed("k", "third", "{}");
    CHECK_OK(q, pqmq_insert(q, &again, 1));
    pqmq_msg_free(again);
    CHECK_INT(live_with_key("k"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE name = 'third'"), 0);
    /* So does pqmq_insert_batches, batch by batch. */
    pqmq_msg *b1[2] = {keyed("k", "fourth", "{}"), keyed("k2", "fifth", "{}")};
    pqmq_msg *b2[1] = {keyed("k2", "sixth", "{}")};
    pqmq_msg *const *batches[2] = {b1, b2};
    size_t counts[2] = {2, 1};
    int rcs[2] = {-1, -1};
    CHECK_OK(q, pqmq_insert_batches(q, batches, counts, 2, rcs));
    CHECK_INT(rcs[0], 0);
    CHECK_INT(rcs[1], 0);
    t_msgs_free(b1, 2);
    t_msgs_free(b2, 1);
    CHECK_INT(live_with_key("k"), 1);
    CHECK_INT(live_with_key("k2"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE name IN ('fourth', 'sixth')"),
              0);
}

static void test_replace_modes(void)
{
    t_truncate();
    uuid_t a, b;
    pqmq_msg *m = keyed("r", "v1", "{\"v\": 1}");
    pqmq_msg_set_delay(m, 3600 * 1000);
    pqmq_insert_result r;
    CHECK_OK(q, pqmq_insert_unique(q, &m, 1, PQMQ_KEY_KEEP, 0, &r));
    uuid_copy(a, r.id);
    pqmq_msg_free(m);
    /* replace_payload: new payload, the schedule stays (an hour away). */
    CHECK_INT(insert_key("r", "v2", PQMQ_KEY_REPLACE_PAYLOAD, 0, b), PQMQ_REPLACED);
    CHECK(uuid_compare(a, b) == 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE name = 'v2' "
                            "AND attempt_at > now() + interval '50 minutes'"),
              1);
    /* replace: payload and schedule (no delay: ready now). */
    CHECK_INT(insert_key("r", "v3", PQMQ_KEY_REPLACE, 0, b), PQMQ_REPLACED);
    CHECK(uuid_compare(a, b) == 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE name = 'v3' "
                            "AND attempt_at <= now() AND ready_at = attempt_at"),
              1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 1);
}

static void test_within_a_batch_in_order(void)
{
    t_truncate();
    /* keep: the first message of the batch with the key is inserted. */
    pqmq_msg *m[3] = {keyed("b", "one", "{}"), keyed("b", "two", "{}"), keyed(NULL, "x", "{}")};
    pqmq_insert_result r[3];
    CHECK_OK(q, pqmq_insert_unique(q, m, 3, PQMQ_KEY_KEEP, 0, r));
    CHECK_INT(r[0].outcome, PQMQ_INSERTED);
    CHECK_INT(r[1].outcome, PQMQ_KEPT);
    CHECK_INT(r[2].outcome, PQMQ_INSERTED);
    CHECK(uuid_compare(r[0].id, r[1].id) == 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE name = 'one'"), 1);
    t_msgs_free(m, 3);
    /* replace: the last one's payload wins, on the first one's id. */
    t_truncate();
    pqmq_msg *n[3] = {keyed("c", "one", "{}"), keyed("c", "two", "{}"),
                      keyed("c", "three", "{}")};
    CHECK_OK(q, pqmq_insert_unique(q, n, 3, PQMQ_KEY_REPLACE, 0, r));
    CHECK_INT(r[0].outcome, PQMQ_INSERTED);
    CHECK_INT(r[1].outcome, PQMQ_REPLACED);
    CHECK_INT(r[2].outcome, PQMQ_REPLACED);
    uuid_t first;
    pqmq_msg_id(n[0], first);
    CHECK(uuid_compare(r[2].id, first) == 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE name = 'three'"), 1);
    t_msgs_free(n, 3);
}

/* An ordered batch whose middle message is kept: the chain is the others,
 * in order. */
static void test_kept_message_is_not_in_the_chain(void)
{
    t_truncate();
    uuid_t a;
    CHECK_INT(insert_key("mid", "old", PQMQ_KEY_KEEP, 0, a), PQMQ_INSERTED);
    pqmq_msg *m[3] = {t_msg("uk", "chain", "c1", "{}", 1), t_msg("uk", "chain", "c2", "{}", 1),
                      t_msg("uk", "chain", "c3", "{}", 1)};
    CHECK_INT(pqmq_msg_set_unique_key(m[1], "mid"), 0);
    pqmq_insert_result r[3];
    CHECK_OK(q, pqmq_insert_unique(q, m, 3, PQMQ_KEY_KEEP, 0, r));
    CHECK_INT(r[1].outcome, PQMQ_KEPT);
    t_msgs_free(m, 3);
    const char *order[] = {"c1", "c3"};
    for (int i = 0; i < 2; i++) {
        pqmq_batch *b = NULL;
        const char *ch = "uk";
        CHECK_OK(q, pqmq_poll(q, &ch, 1, 10, &b));
        /* "old" (unordered) and the chain's head may come together. */
        int found = 0;
        for (size_t j = 0; j < pqmq_batch_count(b); j++) {
            const char *nm = pqmq_job_name(pqmq_batch_job(b, j));
            if (strcmp(nm, "old") != 0) {
                CHECK_STR(nm, order[i]);
                found = 1;
            }
        }
        CHECK(found);
        CHECK_OK(q, pqmq_complete_batch(q, b));
        pqmq_batch_free(b);
    }
}

/* Producers racing on the same keys leave one live message per key, and
 * exactly one of them inserted it. */
#define RACERS 4
#define KEYS 50
struct racer {
    int index;
    int inserted;
    int rc;
};

static void *race(void *arg)
{
    struct racer *me = arg;
    pqmq_client *c = t_client();
    for (int round = 0; round < 3 && !me->rc; round++) {
        pqmq_msg *m[KEYS];
        for (int k = 0; k < KEYS; k++) {
            char key[16];
            /* Each producer goes through the keys in its own order. */
            snprintf(key, sizeof key, "r%d", (k * 7 + me->index * 13) % KEYS);
            m[k] = keyed(key, "race", "{}");
        }
        pqmq_insert_result r[KEYS];
        me->rc = pqmq_insert_unique(c, m, KEYS, PQMQ_KEY_KEEP, 0, r);
        for (int k = 0; !me->rc && k < KEYS; k++)
            me->inserted += r[k].outcome == PQMQ_INSERTED;
        t_msgs_free(m, KEYS);
    }
    pqmq_client_free(c);
    return NULL;
}

static void test_racing_producers_one_live_message_per_key(void)
{
    t_truncate();
    pthread_t th[RACERS];
    struct racer rs[RACERS];
    memset(rs, 0, sizeof rs);
    for (int i = 0; i < RACERS; i++) {
        rs[i].index = i;
        CHECK_INT(pthread_create(&th[i], NULL, race, &rs[i]), 0);
    }
    int inserted = 0;
    for (int i = 0; i < RACERS; i++) {
        pthread_join(th[i], NULL);
        CHECK_INT(rs[i].rc, 0);
        inserted += rs[i].inserted;
    }
    CHECK_INT(inserted, KEYS);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), KEYS);
    CHECK_INT(t_sql_int(pg, "SELECT count(DISTINCT unique_key) FROM mq_msgs"), KEYS);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_keys k JOIN mq_msgs m "
                            "ON m.id = k.message_id AND m.unique_key = k.unique_key"),
              KEYS);
}

/* Replace never changes a message a consumer holds: leased, or held by the
 * locked lane's open transaction. */
static void test_replace_never_touches_a_held_message(void)
{
    t_truncate();
    uuid_t a, b;
    CHECK_INT(insert_key("held", "v1", PQMQ_KEY_KEEP, 0, a), PQMQ_INSERTED);
    pqmq_client *consumer = t_client();
    pqmq_batch *batch = NULL;
    CHECK_OK(consumer, pqmq_poll_locked(consumer, NULL, 0, 10, &batch));
    CHECK_INT((int)pqmq_batch_count(batch), 1);
    CHECK_INT(insert_key("held", "v2", PQMQ_KEY_REPLACE, 0, b), PQMQ_KEPT);
    CHECK(uuid_compare(a, b) == 0);
    CHECK_OK(consumer, pqmq_complete_commit(consumer, batch));
    pqmq_batch_free(batch);
    /* Completed without a window: the key is free again. */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_keys"), 0);

    CHECK_INT(insert_key("held", "v3", PQMQ_KEY_KEEP, 0, a), PQMQ_INSERTED);
    CHECK_OK(consumer, pqmq_poll(consumer, NULL, 0, 10, &batch));
    CHECK_INT((int)pqmq_batch_count(batch), 1);
    CHECK_INT(insert_key("held", "v4", PQMQ_KEY_REPLACE_PAYLOAD, 0, b), PQMQ_KEPT);
    CHECK(uuid_compare(a, b) == 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE name = 'v3'"), 1);
    CHECK_STR(pqmq_job_name(pqmq_batch_job(batch, 0)), "v3");
    pqmq_batch_free(batch);
    pqmq_client_free(consumer);
}

static void test_retention_survives_completion(void)
{
    t_truncate();
    uuid_t a, b;
    CHECK_INT(insert_key("idem", "work", PQMQ_KEY_KEEP, 3600 * 1000, a), PQMQ_INSERTED);
    CHECK_OK(q, pqmq_complete(q, (const uuid_t *)&a, 1));
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    /* A retried producer gets the completed message's id, and no work. */
    CHECK_INT(insert_key("idem", "work", PQMQ_KEY_REPLACE, 3600 * 1000, b), PQMQ_KEPT);
    CHECK(uuid_compare(a, b) == 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    /* A short window runs out; then the key makes a new message. */
    CHECK_INT(insert_key("short", "w", PQMQ_KEY_KEEP, 200, a), PQMQ_INSERTED);
    CHECK_OK(q, pqmq_complete(q, (const uuid_t *)&a, 1));
    CHECK_INT(insert_key("short", "w", PQMQ_KEY_KEEP, 200, b), PQMQ_KEPT);
    t_sleep_ms(300);
    CHECK_INT(insert_key("short", "w", PQMQ_KEY_KEEP, 200, b), PQMQ_INSERTED);
    CHECK(uuid_compare(a, b) != 0);
    /* Without a window, completion frees the key at once. */
    CHECK_INT(insert_key("none", "w", PQMQ_KEY_KEEP, 0, a), PQMQ_INSERTED);
    CHECK_OK(q, pqmq_complete(q, (const uuid_t *)&a, 1));
    CHECK_INT(insert_key("none", "w", PQMQ_KEY_KEEP, 0, b), PQMQ_INSERTED);
}

/* A dead letter holds no key; retrying it while another message holds the
 * key is refused, naming both. */
static void test_dead_letters_hold_no_key(void)
{
    t_truncate();
    uuid_t dead, b;
    pqmq_msg *m = keyed("d", "dies", "{}");
    pqmq_msg_set_retries(m, 0);
    pqmq_insert_result r;
    CHECK_OK(q, pqmq_insert_unique(q, &m, 1, PQMQ_KEY_KEEP, 0, &r));
    pqmq_msg_free(m);
    uuid_copy(dead, r.id);
    pqmq_batch *batch = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 1, &batch));
    CHECK_INT((int)pqmq_batch_count(batch), 1);
    pqmq_batch_free(batch);
    CHECK_OK(q, pqmq_fail(q, dead, "boom"));
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE dead_since IS NOT NULL"), 1);
    CHECK_INT(insert_key("d", "new", PQMQ_KEY_KEEP, 0, b), PQMQ_INSERTED);
    CHECK(uuid_compare(dead, b) != 0);
    size_t n = 0;
    char dead_s[37], b_s[37];
    uuid_unparse_lower(dead, dead_s);
    uuid_unparse_lower(b, b_s);
    CHECK_ERR(q, pqmq_retry(q, (const uuid_t *)&dead, 1, 1, &n), PQMQ_ESERVER, "is held by");
    /* Naming both messages. */
    CHECK(strstr(pqmq_errmsg(q), dead_s) != NULL);
    CHECK(strstr(pqmq_errmsg(q), b_s) != NULL);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE dead_since IS NOT NULL"), 1);
    /* Once the new one is done, the dead letter takes its key back. */
    CHECK_OK(q, pqmq_complete(q, (const uuid_t *)&b, 1));
    CHECK_OK(q, pqmq_retry(q, (const uuid_t *)&dead, 1, 1, &n));
    CHECK_INT((int)n, 1);
    CHECK_INT(insert_key("d", "third", PQMQ_KEY_KEEP, 0, b), PQMQ_KEPT);
    CHECK(uuid_compare(dead, b) == 0);
}

/* Messages without a key never read or write mq_keys: they go in and out
 * while another transaction holds it locked, where a keyed one cannot. */
static void test_unkeyed_messages_do_not_touch_the_keys(void)
{
    t_truncate();
    PGconn *locker = t_pg(), *c = t_pg();
    t_exec(locker, "BEGIN");
    t_exec(locker, "LOCK TABLE mq_keys IN ACCESS EXCLUSIVE MODE");
    t_exec(c, "SET lock_timeout = '2s'");
    t_exec(c, "SELECT mq_insert(ARRAY[ROW(gen_random_uuid(), NULL, 1, NULL, 'uk', '', NULL, "
              "false, 'a', '{}', NULL)]::mq_new_t[])");
    t_exec(c, "SELECT mq_complete(ARRAY(SELECT id FROM mq_msgs))");
    CHECK_INT(t_sql_int(c, "SELECT count(*) FROM mq_msgs"), 0);
    PGresult *r = PQexec(c, "SELECT * FROM mq_insert_unique(ARRAY[ROW(gen_random_uuid(), NULL, "
                            "1, NULL, 'uk', '', NULL, false, 'a', '{}', NULL)]::mq_new_t[], "
                            "ARRAY['x'])");
    CHECK(strstr(PQresultErrorMessage(r), "lock timeout") != NULL);
    PQclear(r);
    t_exec(locker, "ROLLBACK");
    PQfinish(locker);
    PQfinish(c);
}

static void test_bad_input_leaves_no_trace(void)
{
    t_truncate();
    pqmq_msg *m[2] = {keyed("ok", "a", "{}"), keyed("", "b", "{}")};
    CHECK_ERR(q, pqmq_insert_unique(q, m, 2, PQMQ_KEY_KEEP, 0, NULL), PQMQ_EINVAL,
              "msgs[1]: unique key is empty");
    CHECK_INT(pqmq_msg_set_unique_key(m[1], "fine"), 0);
    CHECK_ERR(q, pqmq_insert_unique(q, m, 2, (pqmq_key_mode)7, 0, NULL), PQMQ_EINVAL, "mode 7");
    CHECK_ERR(q, pqmq_insert_unique(q, m, 2, PQMQ_KEY_KEEP, -1, NULL), PQMQ_EINVAL,
              "retention_ms is negative");
    t_msgs_free(m, 2);
    /* The server checks too, and a refused batch takes no key. */
    t_exec(pg, "DO $$ BEGIN PERFORM mq_insert_unique(ARRAY["
               "ROW(gen_random_uuid(), NULL, 1, NULL, 'uk', '', NULL, false, 'a', '{}', NULL),"
               "ROW(gen_random_uuid(), NULL, -1, NULL, 'uk', '', NULL, false, 'b', '{}', NULL)"
               "]::mq_new_t[], ARRAY['x', 'y']); "
               "EXCEPTION WHEN invalid_parameter_value THEN NULL; END $$");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_keys"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    PGresult *r =
        PQexec(pg, "SELECT * FROM mq_insert_unique(ARRAY[ROW(gen_random_uuid(), "
                   "NULL, 1, NULL, 'uk', '', NULL, false, 'a', '{}', NULL)]::mq_new_t[],"
                   " ARRAY['x', 'y'])");
    CHECK(strstr(PQresultErrorMessage(r), "1 messages but 2 unique keys") != NULL);
    PQclear(r);
    r = PQexec(pg, "SELECT * FROM mq_insert_unique(ARRAY[ROW(gen_random_uuid(), "
                   "NULL, 1, NULL, 'uk', '', NULL, false, 'a', '{}', NULL)]::mq_new_t[],"
                   " ARRAY['x'], 'merge')");
    CHECK(strstr(PQresultErrorMessage(r), "mode 'merge' is not keep") != NULL);
    PQclear(r);
}

int main(void)
{
    t_init("unique");
    q = t_client();
    pg = t_pg();
    T_RUN(test_second_insert_keeps_the_first);
    T_RUN(test_replace_modes);
    T_RUN(test_within_a_batch_in_order);
    T_RUN(test_kept_message_is_not_in_the_chain);
    T_RUN(test_racing_producers_one_live_message_per_key);
    T_RUN(test_replace_never_touches_a_held_message);
    T_RUN(test_retention_survives_completion);
    T_RUN(test_dead_letters_hold_no_key);
    T_RUN(test_unkeyed_messages_do_not_touch_the_keys);
    T_RUN(test_bad_input_leaves_no_trace);
    pqmq_client_free(q);
    PQfinish(pg);
    return t_done();
}
