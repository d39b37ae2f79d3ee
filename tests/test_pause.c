/*
 * test_pause.c: pausing a channel (schema/pause.sql, DESIGN.md section 3).
 * No poll lane delivers a paused channel's messages (the lease lane, the
 * locked lane, the runner, SQL mq_poll), whether they are logged (a plain
 * batch) or rows of mq_rows (delayed, ordered, prioritized); another
 * channel's are delivered meanwhile, and resuming delivers the paused ones.
 * Chains keep their order; what is in flight can still be completed; a
 * lease that runs out while paused waits for the resume; the pause is kept
 * in the queue (a new connection sees it); only the administer duty may
 * pause.
 */
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

/* How a message is stored: in the log (a plain batch), or in mq_rows. */
enum kind { PLAIN, PRIORITY, DELAYED, ORDERED };

/* n messages of kind on channel, named "m0".., with backoff ms; args "" or,
 * with spread, "a0", "a1", ... (a chain key each). */
static void put_spread(const char *channel, enum kind kind, int n, int64_t backoff, int spread)
{
    pqmq_msg **m = calloc((size_t)n, sizeof *m);
    for (int i = 0; i < n; i++) {
        char name[16], args[16];
        snprintf(name, sizeof name, "m%d", i);
        snprintf(args, sizeof args, "a%d", i);
        m[i] = t_msg(channel, spread ? args : NULL, name, "{}", kind == ORDERED);
        pqmq_msg_set_backoff(m[i], backoff);
        if (kind == PRIORITY)
            CHECK_OK(q, pqmq_msg_set_priority(m[i], 3));
        if (kind == DELAYED)
            CHECK_OK(q, pqmq_msg_set_delay(m[i], 20));
    }
    CHECK_OK(q, pqmq_insert(q, m, (size_t)n));
    t_msgs_free(m, (size_t)n);
    free(m);
    if (kind == DELAYED)
        t_sleep_ms(40);
}

static void put(const char *channel, enum kind kind, int n, int64_t backoff)
{
    put_spread(channel, kind, n, backoff, 0);
}

/* How many of channel's messages are rows of mq_rows (the rest: logged). */
static long long rows_of(const char *channel)
{
    return t_sql_int(pg, "SELECT count(*) FROM mq_rows WHERE channel_name = '%s'", channel);
}

/* Counts a batch's jobs of channel. */
static int count_of(const pqmq_batch *b, const char *channel)
{
    int n = 0;
    for (size_t i = 0; i < pqmq_batch_count(b); i++)
        n += !strcmp(pqmq_job_channel(pqmq_batch_job(b, i)), channel);
    return n;
}

/* One poll of lane (0: pqmq_poll, 1: pqmq_poll_locked, committed at once,
 * 2: SQL mq_poll) of every channel: returns how many jobs of channel it got,
 * and in *other how many of the others. */
static int poll_lane(int lane, const char *channel, int *other)
{
    int got = 0, all = 0;
    if (lane == 2) {
        /* (Each job completed: a chain gives its next one then. Its
         * channel looked up by a statement of its own: on Citus a poll
         * cannot run inside a query that reads a queue table.) */
        PGresult *r = t_sql(pg, "SELECT p.id FROM mq_poll(NULL, 100) p WHERE p.id IS NOT NULL");
        for (int i = 0; r && i < PQntuples(r); i++) {
            all++;
            PGresult *c = t_sql(pg, "SELECT channel_name FROM mq_msgs WHERE id = '%s'",
                                PQgetvalue(r, i, 0));
            got += c && PQntuples(c) == 1 && !strcmp(PQgetvalue(c, 0, 0), channel);
            PQclear(c);
            t_exec(pg, "SELECT mq_complete(ARRAY['%s']::uuid[])", PQgetvalue(r, i, 0));
        }
        PQclear(r);
    } else {
        pqmq_batch *b = NULL;
        if (lane == 0)
            CHECK_OK(q, pqmq_poll(q, NULL, 0, 100, &b));
        else
            CHECK_OK(q, pqmq_poll_locked(q, NULL, 0, 100, &b));
        if (b) {
            all = (int)pqmq_batch_count(b);
            got = count_of(b, channel);
            if (lane == 1)
                CHECK_OK(q, pqmq_complete_commit(q, b));
            else
                CHECK_OK(q, pqmq_complete_batch(q, b));
            pqmq_batch_free(b);
        }
    }
    if (other)
        *other = all - got;
    return got;
}

/* Each lane and each storage: the paused channel gives nothing while
 * another channel gives all it has; after the resume it gives its own. */
static void test_every_lane_skips_a_paused_channel(void)
{
    static const char *lanes[] = {"pqmq_poll", "pqmq_poll_locked", "SQL mq_poll"};
    static const char *kinds[] = {"plain", "priority", "delayed", "ordered"};
    for (int lane = 0; lane < 3; lane++) {
        for (int kind = PLAIN; kind <= ORDERED; kind++) {
            t_truncate();
            CHECK_INT(pqmq_pause(q, "held", "a test"), 1);
            put("held", (enum kind)kind, 3, 60000);
            put("free", (enum kind)kind, 2, 60000);
            if (kind == PLAIN && !t_citus())
                CHECK_INT(rows_of("held"), 0); /* logged (on Citus nothing is) */
            else
                CHECK_INT(rows_of("held"), 3); /* rows of mq_rows */
            int other = 0, held = 0;
            /* An ordered chain gives one message a poll. */
            for (int i = 0; i < 3; i++) {
                int o = 0;
                held += poll_lane(lane, "held", &o);
                other += o;
            }
            if (held != 0 || other != 2)
                t_fail(__FILE__, __LINE__, "%s, %s: paused gave %d (expected 0), other %d",
                       lanes[lane], kinds[kind], held, other);
            CHECK_INT(pqmq_resume(q, "held"), 1);
            for (int i = 0; i < 4; i++)
                held += poll_lane(lane, "held", NULL);
            if (held != 3)
                t_fail(__FILE__, __LINE__, "%s, %s: resumed gave %d, expected 3", lanes[lane],
                       kinds[kind], held);
        }
    }
}

/* A paused name with many args (more chain keys than a poll's walk may
 * visit, 2 * batch + 16) does not hide the channels after it: the walks pass
 * the paused name in one step. Each poll starts (the session's turn) at the
 * paused name's range, and the other channel's keys come after it. */
static void test_many_paused_keys_do_not_starve(void)
{
    static const char *kinds[] = {"priority", "delayed", "ordered"};
    PGresult *r = t_sql(pg, "SELECT n FROM unnest(ARRAY['pa', 'pb', 'pc', 'pd', 'pe', 'pf']) n "
                            "ORDER BY hashtext(n)");
    if (!r || PQntuples(r) != 6) {
        t_fail(__FILE__, __LINE__, "no names");
        PQclear(r);
        return;
    }
    char held[8], other[8];
    snprintf(held, sizeof held, "%s", PQgetvalue(r, 0, 0));
    snprintf(other, sizeof other, "%s", PQgetvalue(r, 5, 0));
    PQclear(r);
    for (int kind = PRIORITY; kind <= ORDERED; kind++) {
        t_truncate();
        put_spread(held, (enum kind)kind, 60, 60000, 1);
        put_spread(other, (enum kind)kind, 3, 60000, 1);
        CHECK_INT(pqmq_pause(q, held, NULL), 1);
        int got = 0;
        for (int i = 0; i < 3; i++) {
            t_exec(pg,
                   "SELECT set_config('pqmq.next_' || 'mq_msgs'::regclass::oid, "
                   "to_hex(hashtext('%s')::bigint << 32), false)",
                   held);
            got += (int)t_sql_int(
                pg, "SELECT count(*) FROM mq_claim(NULL, 1) WHERE channel_name = '%s'", other);
        }
        if (got != 3)
            t_fail(__FILE__, __LINE__, "%s: %d of the other channel's 3 delivered",
                   kinds[kind - 1], got);
        CHECK_INT(
            t_sql_int(pg,
                      "SELECT count(*) FROM mq_claim(ARRAY['%s'], 100) WHERE id IS NOT NULL",
                      held),
            0);
        CHECK_INT(pqmq_resume(q, held), 1);
    }
}

/* A poll that names the paused channel gets nothing, and its wait says
 * "nothing ready" rather than "now" (a runner would spin). */
static void test_named_poll_and_wait(void)
{
    t_truncate();
    CHECK_INT(pqmq_pause(q, "held", NULL), 1);
    put("held", PLAIN, 2, 60000);
    put("held", PRIORITY, 2, 60000);
    put("held", ORDERED, 2, 60000);
    const char *chans[] = {"held"};
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, chans, 1, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 0);
    CHECK_INT(pqmq_batch_wait_ms(b), -1);
    pqmq_batch_free(b);
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 0);
    CHECK_INT(pqmq_batch_wait_ms(b), -1);
    pqmq_batch_free(b);
    CHECK_OK(q, pqmq_poll_locked(q, chans, 1, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 0);
    CHECK_OK(q, pqmq_complete_commit(q, b));
    pqmq_batch_free(b);
    CHECK_INT(pqmq_resume(q, "held"), 1);
    CHECK_OK(q, pqmq_poll(q, chans, 1, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 5); /* the chain's head only */
    pqmq_batch_free(b);
}

static int handled;
static char handled_names[64][16];

static int h_count(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)ctx;
    (void)arg;
    int i = __atomic_fetch_add(&handled, 1, __ATOMIC_SEQ_CST);
    if (i < 64)
        snprintf(handled_names[i], sizeof handled_names[i], "%s", pqmq_job_channel(job));
    return 0;
}

static int handled_of(const char *channel)
{
    int n = 0, all = __atomic_load_n(&handled, __ATOMIC_SEQ_CST);
    for (int i = 0; i < all && i < 64; i++)
        n += !strcmp(handled_names[i], channel);
    return n;
}

/* The runner (lease lane, then locked lane): the paused channel waits, the
 * other is handled; resume wakes the runner, which handles the rest. */
static void test_runner_skips_a_paused_channel(void)
{
    for (int locked = 0; locked < 2; locked++) {
        t_truncate();
        __atomic_store_n(&handled, 0, __ATOMIC_SEQ_CST);
        CHECK_INT(pqmq_pause(q, "held", NULL), 1);
        put("held", PLAIN, 3, 60000);
        put("held", PRIORITY, 2, 60000);
        put("free", PLAIN, 2, 60000);
        put("free", ORDERED, 2, 60000);
        pqmq_runner *r = t_runner();
        CHECK_INT(pqmq_runner_handle(r, NULL, h_count, NULL), 0);
        if (locked)
            CHECK_INT(pqmq_runner_set_locked(r, 1), 0);
        t_bg bg;
        t_runner_start(&bg, r);
        WAIT_UNTIL(handled_of("free") >= 4, 15000);
        t_sleep_ms(500);
        CHECK_INT(handled_of("free"), 4);
        CHECK_INT(handled_of("held"), 0);
        int64_t t0 = t_now_ms();
        CHECK_INT(pqmq_resume(q, "held"), 1);
        WAIT_UNTIL(handled_of("held") >= 5, 15000);
        CHECK_INT(handled_of("held"), 5);
        /* Woken by the resume's notification, not a poll's timer. */
        CHECK(t_now_ms() - t0 < 5000);
        t_runner_stop(&bg);
        pqmq_runner_free(r);
    }
}

/* A chain keeps its order across a pause: the head taken before the pause
 * is completed during it, and the rest come after the resume, in order. */
static void test_chain_order_across_pause(void)
{
    t_truncate();
    put("ch", ORDERED, 4, 60000);
    const char *chans[] = {"ch"};
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, chans, 1, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_STR(pqmq_job_name(pqmq_batch_job(b, 0)), "m0");
    CHECK_INT(pqmq_pause(q, "ch", NULL), 1);
    /* In flight: still completed while paused. */
    CHECK_OK(q, pqmq_complete_batch(q, b));
    pqmq_batch_free(b);
    CHECK_OK(q, pqmq_poll(q, chans, 1, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 0);
    pqmq_batch_free(b);
    CHECK_INT(pqmq_resume(q, "ch"), 1);
    for (int i = 1; i < 4; i++) {
        char want[8];
        snprintf(want, sizeof want, "m%d", i);
        CHECK_OK(q, pqmq_poll(q, chans, 1, 10, &b));
        CHECK_INT(pqmq_batch_count(b), 1);
        if (pqmq_batch_count(b) == 1)
            CHECK_STR(pqmq_job_name(pqmq_batch_job(b, 0)), want);
        CHECK_OK(q, pqmq_complete_batch(q, b));
        pqmq_batch_free(b);
    }
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
}

/* In flight when paused: completed (logged and mq_rows' messages); a lease
 * that runs out meanwhile is not delivered again until the resume. */
static void test_in_flight_and_leases_that_run_out(void)
{
    for (int kind = PLAIN; kind <= PRIORITY; kind++) {
        t_truncate();
        put("f", (enum kind)kind, 2, 200);
        pqmq_batch *b = NULL;
        CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
        CHECK_INT(pqmq_batch_count(b), 2);
        CHECK_INT(pqmq_pause(q, "f", "maintenance"), 1);
        /* The first is completed while paused; the second's lease runs out. */
        uuid_t id;
        if (pqmq_batch_count(b) == 2) {
            pqmq_job_id(pqmq_batch_job(b, 0), id);
            CHECK_OK(q, pqmq_complete(q, (const uuid_t *)&id, 1));
        }
        pqmq_batch_free(b);
        t_sleep_ms(400);
        for (int i = 0; i < 3; i++) {
            CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
            CHECK_INT(pqmq_batch_count(b), 0);
            CHECK_INT(pqmq_batch_wait_ms(b), -1);
            pqmq_batch_free(b);
            CHECK_OK(q, pqmq_poll_locked(q, NULL, 0, 10, &b));
            CHECK_INT(pqmq_batch_count(b), 0);
            CHECK_OK(q, pqmq_complete_commit(q, b));
            pqmq_batch_free(b);
        }
        CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 1);
        CHECK_INT(pqmq_resume(q, "f"), 1);
        CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
        CHECK_INT(pqmq_batch_count(b), 1);
        if (pqmq_batch_count(b) == 1)
            CHECK_INT(pqmq_job_attempt(pqmq_batch_job(b, 0)), 2);
        CHECK_OK(q, pqmq_complete_batch(q, b));
        pqmq_batch_free(b);
        CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
    }
}

/* The pause lives in the queue: a new connection (a restarted consumer)
 * sees it. A name never used may be paused; a second pause and a resume of
 * a channel not paused change nothing; a name is required. */
static void test_pause_is_kept_and_its_answers(void)
{
    t_truncate();
    pqmq_client *a = t_client();
    CHECK_INT(pqmq_pause(a, "fresh", "before its first message"), 1);
    CHECK_INT(pqmq_pause(a, "fresh", "again"), 0);
    pqmq_client_free(a);
    put("fresh", PLAIN, 2, 60000);
    pqmq_client *c = t_client();
    pqmq_batch *b = NULL;
    CHECK_OK(c, pqmq_poll(c, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 0);
    pqmq_batch_free(b);
    /* The first pause's reason and role are kept. */
    PGresult *r = t_sql(pg, "SELECT reason, paused_by = session_user FROM mq_paused_channels() "
                            "WHERE channel_name = 'fresh'");
    CHECK_INT(r ? PQntuples(r) : 0, 1);
    if (r && PQntuples(r) == 1) {
        CHECK_STR(PQgetvalue(r, 0, 0), "before its first message");
        CHECK_STR(PQgetvalue(r, 0, 1), "t");
    }
    PQclear(r);
    CHECK_INT(pqmq_resume(c, "never-paused"), 0);
    CHECK_INT(pqmq_resume(c, "fresh"), 1);
    CHECK_INT(pqmq_resume(c, "fresh"), 0);
    CHECK_OK(c, pqmq_poll(c, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 2);
    pqmq_batch_free(b);
    CHECK_ERR(c, pqmq_pause(c, "", NULL), PQMQ_EINVAL, "channel name");
    CHECK_ERR(c, pqmq_resume(c, NULL), PQMQ_EINVAL, "channel name");
    /* The SQL functions refuse them too. */
    r = PQexec(pg, "SELECT mq_pause(NULL)");
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22023");
    PQclear(r);
    r = PQexec(pg, "SELECT mq_resume('')");
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22023");
    PQclear(r);
    pqmq_client_free(c);
}

/* Resume sends the insert's notification of the channel. */
static void test_resume_notifies(void)
{
    t_truncate();
    PGconn *l = t_listener();
    t_listen(l, "mq_note");
    CHECK_INT(pqmq_pause(q, "note", NULL), 1);
    CHECK_INT(pqmq_resume(q, "note"), 1);
    PQconsumeInput(l);
    int64_t end = t_now_ms() + 5000;
    PGnotify *n = NULL;
    while (!(n = PQnotifies(l)) && t_now_ms() < end) {
        t_sleep_ms(10);
        PQconsumeInput(l);
    }
    CHECK(n != NULL);
    if (n)
        CHECK_STR(n->relname, "mq_note");
    PQfreemem(n);
    PQfinish(l);
}

/* mq_metrics, pqmq status and pqmq metrics show a paused channel, one
 * with no message included. */
static void test_visible_in_figures(void)
{
    t_truncate();
    CHECK_INT(pqmq_pause(q, "quiet", "a reason"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_metrics() "
                            "WHERE channel_name = 'quiet' AND paused AND ready = 0"),
              1);
    int st = -1;
    char *text = t_run_pqmq("metrics quiet", &st);
    CHECK_INT(st, 0);
    CHECK(text && strstr(text, "pqmq_channel_paused{channel=\"quiet\"} 1\n"));
    free(text);
    text = t_run_pqmq("status --json quiet", &st);
    CHECK_INT(st, 0);
    CHECK(text && strstr(text, "\"paused\": true"));
    free(text);
    text = t_run_pqmq("status", &st);
    CHECK_INT(st, 0);
    CHECK(text && strstr(text, "quiet (paused)"));
    free(text);
    CHECK_INT(pqmq_resume(q, "quiet"), 1);
    text = t_run_pqmq("metrics", &st);
    CHECK(text && !strstr(text, "pqmq_channel_paused{channel=\"quiet\"}"));
    free(text);
}

/* Only the administer duty pauses: a consume-only role is refused. */
static void test_duty(void)
{
    t_truncate();
    char cons[64], adm[64];
    snprintf(cons, sizeof cons, "t_pause_%ld_consumer", (long)getpid());
    snprintf(adm, sizeof adm, "t_pause_%ld_admin", (long)getpid());
    PGconn *su = t_pg();
    t_exec(su, "CREATE ROLE %s NOLOGIN", cons);
    t_exec(su, "CREATE ROLE %s NOLOGIN", adm);
    t_exec(su, "SELECT mq_grant('consume', '%s')", cons);
    t_exec(su, "SELECT mq_grant('administer', '%s')", adm);
    PGconn *cc = t_pg(), *ac = t_pg();
    t_exec(cc, "SET ROLE %s", cons);
    t_exec(ac, "SET ROLE %s", adm);
    pqmq_client *c = NULL, *a = NULL;
    if (pqmq_wrap(cc, &c) != 0 || pqmq_wrap(ac, &a) != 0)
        abort();
    CHECK_ERR(c, pqmq_pause(c, "d", NULL), PQMQ_ESERVER, "permission denied");
    CHECK_ERR(c, pqmq_resume(c, "d"), PQMQ_ESERVER, "permission denied");
    CHECK_INT(pqmq_pause(a, "d", "by the admin"), 1);
    CHECK_INT(t_sql_int(ac, "SELECT count(*) FROM mq_paused_channels()"), 1);
    CHECK_INT(pqmq_resume(a, "d"), 1);
    pqmq_client_free(c);
    pqmq_client_free(a);
    PQfinish(cc);
    PQfinish(ac);
    t_exec(su, "DROP OWNED BY %s CASCADE; DROP ROLE %s", cons, cons);
    t_exec(su, "DROP OWNED BY %s CASCADE; DROP ROLE %s", adm, adm);
    PQfinish(su);
}

int main(void)
{
    t_init("test_pause");
    q = t_client();
    pg = t_pg();
    T_RUN(test_every_lane_skips_a_paused_channel);
    T_RUN(test_named_poll_and_wait);
    T_RUN(test_many_paused_keys_do_not_starve);
    T_RUN(test_runner_skips_a_paused_channel);
    T_RUN(test_chain_order_across_pause);
    T_RUN(test_in_flight_and_leases_that_run_out);
    T_RUN(test_pause_is_kept_and_its_answers);
    T_RUN(test_resume_notifies);
    T_RUN(test_visible_in_figures);
    T_RUN(test_duty);
    pqmq_client_free(q);
    PQfinish(pg);
    return t_done();
}
