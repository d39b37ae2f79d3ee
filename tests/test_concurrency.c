/* test_concurrency.c: concurrent consumers (semantics 4 and 5). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "harness.h"

enum { CONSUMERS = 4, MESSAGES = 2000, CHAINS = 8, PER_CHAIN = 60 };

static pqmq_client *q;
static PGconn *pg;

static atomic_int seen[MESSAGES];    /* deliveries per message seq */
static atomic_int in_flight[CHAINS]; /* jobs of a chain being processed now */
static atomic_int max_in_flight[CHAINS];
static atomic_int errors, done_count;
static int order[CHAINS][PER_CHAIN]; /* completion order per chain */
static int order_len[CHAINS];
static pthread_mutex_t order_lock = PTHREAD_MUTEX_INITIALIZER;

static int json_int(const char *json, const char *key)
{
    char pat[32];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *s = json ? strstr(json, pat) : NULL;
    return s ? atoi(s + strlen(pat)) : -1;
}

/* The end of a consumer's round of n jobs: counts them done, frees b and
 * naps when there were none. Returns the new count of idle rounds. */
static int round_done(pqmq_batch *b, size_t n, int idle)
{
    atomic_fetch_add(&done_count, (int)n);
    pqmq_batch_free(b);
    if (!n)
        t_sleep_ms(1);
    return n ? 0 : idle + 1;
}

static void *unordered_consumer(void *arg)
{
    (void)arg;
    pqmq_client *c = t_client();
    int idle = 0;
    while (atomic_load(&done_count) < MESSAGES && idle < 2000) {
        pqmq_batch *b = NULL;
        if (pqmq_poll(c, NULL, 0, 25, &b)) {
            fprintf(stderr, "poll: %s\n", pqmq_errmsg(c));
            atomic_fetch_add(&errors, 1);
            break;
        }
        size_t n = pqmq_batch_count(b);
        for (size_t i = 0; i < n; i++) {
            int seq = json_int(pqmq_job_json(pqmq_batch_job(b, i)), "seq");
            if (seq >= 0 && seq < MESSAGES)
                atomic_fetch_add(&seen[seq], 1);
        }
        if (n && pqmq_complete_batch(c, b)) {
            fprintf(stderr, "complete: %s\n", pqmq_errmsg(c));
            atomic_fetch_add(&errors, 1);
        }
        idle = round_done(b, n, idle);
    }
    pqmq_client_free(c);
    return NULL;
}

static void run_threads(void *(*fn)(void *))
{
    pthread_t th[CONSUMERS];
    for (int i = 0; i < CONSUMERS; i++)
        pthread_create(&th[i], NULL, fn, NULL);
    for (int i = 0; i < CONSUMERS; i++)
        pthread_join(th[i], NULL);
}

static void test_four_consumers_each_message_once(void)
{
    t_truncate();
    pqmq_msg **msgs = calloc(MESSAGES, sizeof *msgs);
    for (int i = 0; i < MESSAGES; i++) {
        char json[32];
        snprintf(json, sizeof json, "{\"seq\": %d}", i);
        char ch[8];
        snprintf(ch, sizeof ch, "c%d", i % 7);
        msgs[i] = t_msg(ch, NULL, "n", json, 0);
        pqmq_msg_set_backoff(msgs[i], 60000); /* no redelivery during the test */
    }
    CHECK_OK(q, pqmq_insert(q, msgs, MESSAGES));
    t_msgs_free(msgs, MESSAGES);
    free(msgs);
    run_threads(unordered_consumer);
    CHECK_INT(atomic_load(&errors), 0); /* a deadlock would surface as an error */
    int missing = 0, dup = 0;
    for (int i = 0; i < MESSAGES; i++) {
        missing += atomic_load(&seen[i]) == 0;
        dup += atomic_load(&seen[i]) > 1;
    }
    CHECK_INT(missing, 0);
    CHECK_INT(dup, 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
}

static void *ordered_consumer(void *arg)
{
    (void)arg;
    pqmq_client *c = t_client();
    int idle = 0;
    while (atomic_load(&done_count) < CHAINS * PER_CHAIN && idle < 3000) {
        pqmq_batch *b = NULL;
        if (pqmq_poll(c, NULL, 0, 4, &b)) {
            atomic_fetch_add(&errors, 1);
            break;
        }
        size_t n = pqmq_batch_count(b);
        int chains[64];
        for (size_t i = 0; i < n; i++) {
            const char *json = pqmq_job_json(pqmq_batch_job(b, i));
            int ch = json_int(json, "chain");
            chains[i] = ch;
            int now = atomic_fetch_add(&in_flight[ch], 1) + 1;
            int prev = atomic_load(&max_in_flight[ch]);
            while (now > prev && !atomic_compare_exchange_weak(&max_in_flight[ch], &prev, now))
                ;
        }
        if (n)
            t_sleep_ms(2); /* "work", so overlaps would show */
        pthread_mutex_lock(&order_lock);
        for (size_t i = 0; i < n; i++) {
            int ch = chains[i];
            if (order_len[ch] < PER_CHAIN)
                order[ch][order_len[ch]++] =
                    json_int(pqmq_job_json(pqmq_batch_job(b, i)), "seq");
            atomic_fetch_sub(&in_flight[ch], 1);
        }
        /* Completing under the lock makes "completion order" well defined. */
        if (n && pqmq_complete_batch(c, b))
            atomic_fetch_add(&errors, 1);
        pthread_mutex_unlock(&order_lock);
        idle = round_done(b, n, idle);
    }
    pqmq_client_free(c);
    return NULL;
}

static void test_ordered_chains_with_four_consumers(void)
{
    t_truncate();
    atomic_store(&done_count, 0);
    atomic_store(&errors, 0);
    /* Chains interleaved in one batch, plus a second batch appending. */
    for (int half = 0; half < 2; half++) {
        pqmq_msg *msgs[CHAINS * PER_CHAIN / 2];
        int k = 0;
        for (int s = half * PER_CHAIN / 2; s < (half + 1) * PER_CHAIN / 2; s++)
            for (int ch = 0; ch < CHAINS; ch++) {
                char json[48], args[16];
                snprintf(json, sizeof json, "{\"chain\": %d, \"seq\": %d}", ch, s);
                snprintf(args, sizeof args, "chain-%d", ch);
                msgs[k] = t_msg("ordered", args, "n", json, 1);
                pqmq_msg_set_backoff(msgs[k], 60000);
                k++;
            }
        CHECK_OK(q, pqmq_insert(q, msgs, (size_t)k));
        t_msgs_free(msgs, (size_t)k);
    }
    run_threads(ordered_consumer);
    CHECK_INT(atomic_load(&errors), 0);
    for (int ch = 0; ch < CHAINS; ch++) {
        CHECK_INT(order_len[ch], PER_CHAIN);
        CHECK_INT(atomic_load(&max_in_flight[ch]), 1);
        for (int s = 0; s < order_len[ch]; s++)
            if (order[ch][s] != s) {
                t_fail(__FILE__, __LINE__, "chain %d: position %d holds seq %d", ch, s,
                       order[ch][s]);
                break;
            }
    }
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
}

int main(void)
{
    t_init("concurrency");
    q = t_client();
    pg = t_pg();
    T_RUN(test_four_consumers_each_message_once);
    T_RUN(test_ordered_chains_with_four_consumers);
    pqmq_client_free(q);
    PQfinish(pg);
    return t_done();
}
