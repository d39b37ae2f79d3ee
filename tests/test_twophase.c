/* test_twophase.c: two-phase commit (semantic 9). */
#include <stdlib.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

/* Inserts one message on channel ch; its id goes to id. */
static void insert_one(const char *ch, int64_t commit_ms, int64_t delay_ms, int64_t backoff_ms,
                       uuid_t id)
{
    pqmq_msg *m = t_msg(ch, NULL, "tp", "{\"v\": 1}", 0);
    pqmq_msg_set_commit_interval(m, commit_ms);
    pqmq_msg_set_delay(m, delay_ms);
    pqmq_msg_set_backoff(m, backoff_ms);
    pqmq_msg_id(m, id);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    pqmq_msg_free(m);
}

/* Polls once; returns how many jobs came, and in *committed the
 * is_committed flag of the first one (-1 when none). */
static int poll_once(int64_t *wait_ms, int *committed)
{
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
    int n = (int)pqmq_batch_count(b);
    if (committed)
        *committed = n ? pqmq_job_is_committed(pqmq_batch_job(b, 0)) : -1;
    if (wait_ms)
        *wait_ms = pqmq_batch_wait_ms(b);
    pqmq_batch_free(b);
    return n;
}

static void test_pending_is_invisible_until_commit(void)
{
    t_truncate();
    uuid_t id;
    insert_one("tp", 60000, 0, 1000, id);
    int64_t wait = 0;
    CHECK_INT(poll_once(&wait, NULL), 0);
    /* The commit deadline is what the poll waits for. */
    CHECK(wait > 50000 && wait <= 60000);
    /* The seed's SQL entry point does not see it either. */
    CHECK_INT(t_sql_int(pg, "SELECT count(id) FROM mq_poll(NULL, 5)"), 0);

    CHECK_OK(q, pqmq_commit(q, (const uuid_t *)&id, 1));
    int committed = -1;
    CHECK_INT(poll_once(NULL, &committed), 1);
    CHECK_INT(committed, 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE commit_interval IS NULL"), 1);
}

static void test_commit_twice_and_unknown_ids_are_harmless(void)
{
    t_truncate();
    uuid_t ids[3];
    insert_one("tp", 60000, 0, 60000, ids[0]);
    pqmq_uuid_generate(ids[1]); /* never inserted */
    uuid_copy(ids[2], ids[0]);  /* the same id twice in one call */
    CHECK_OK(q, pqmq_commit(q, (const uuid_t *)ids, 3));
    CHECK_OK(q, pqmq_commit(q, (const uuid_t *)ids, 1));
    CHECK_OK(q, pqmq_commit(q, (const uuid_t *)&ids[1], 1));
    int committed = -1;
    CHECK_INT(poll_once(NULL, &committed), 1);
    CHECK_INT(committed, 1);
    /* Committing a delivered message again does not end its lease. */
    CHECK_OK(q, pqmq_commit(q, (const uuid_t *)ids, 1));
    int64_t wait = 0;
    CHECK_INT(poll_once(&wait, NULL), 0);
    CHECK(wait > 50000);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 1);
    CHECK_INT(t_sql_int(pg, "SELECT attempts FROM mq_msgs"), 4);
    /* No ids at all is a bad argument, not a silent success. */
    CHECK_ERR(q, pqmq_commit(q, NULL, 0), PQMQ_EINVAL, "no ids");
}

static void test_uncommitted_is_delivered_after_interval(void)
{
    t_truncate();
    uuid_t id;
    insert_one("tp", 300, 0, 60000, id);
    int64_t wait = -2;
    CHECK_INT(poll_once(&wait, NULL), 0);
    CHECK(wait >= 0 && wait <= 300);
    t_sleep_ms(400);
    int committed = -1;
    CHECK_INT(poll_once(NULL, &committed), 1);
    CHECK_INT(committed, 0);
    /* A late commit during its lease neither redelivers it nor changes the
     * lease. */
    char before[64];
    PGresult *r = t_sql(pg, "SELECT attempt_at FROM mq_msgs");
    snprintf(before, sizeof before, "%s", r && PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "?");
    PQclear(r);
    CHECK_OK(q, pqmq_commit(q, (const uuid_t *)&id, 1));
    CHECK_INT(poll_once(NULL, NULL), 0);
    r = t_sql(pg, "SELECT attempt_at FROM mq_msgs");
    CHECK(r && PQntuples(r) == 1);
    if (r && PQntuples(r) == 1)
        CHECK_STR(PQgetvalue(r, 0, 0), before);
    PQclear(r);
}

static void test_commit_keeps_the_delay(void)
{
    t_truncate();
    uuid_t id;
    insert_one("tp", 60000, 1000, 60000, id);
    int64_t wait = 0;
    CHECK_INT(poll_once(&wait, NULL), 0);
    CHECK(wait > 55000);
    CHECK_OK(q, pqmq_commit(q, (const uuid_t *)&id, 1));
    /* Now it waits for the rest of its delay: not 0, not the interval. */
    CHECK_INT(poll_once(&wait, NULL), 0);
    CHECK(wait > 300 && wait <= 1000);
    int64_t t0 = t_now_ms();
    int got = 0, committed = -1;
    while (!got && t_now_ms() - t0 < 3000) {
        t_sleep_ms(50);
        got = poll_once(NULL, &committed);
    }
    CHECK_INT(got, 1);
    CHECK_INT(committed, 1);
}

static void test_keep_alive_postpones_commit_deadline(void)
{
    t_truncate();
    uuid_t id;
    insert_one("tp", 300, 0, 60000, id);
    size_t ext = 99;
    CHECK_OK(q, pqmq_keep_alive(q, (const uuid_t *)&id, 1, 2000, &ext));
    CHECK_INT(ext, 1);
    t_sleep_ms(500);
    int64_t wait = 0;
    CHECK_INT(poll_once(&wait, NULL), 0); /* the 300 ms interval was pushed */
    CHECK(wait > 200 && wait <= 2000);
    /* A later commit still makes it ready at once, committed. */
    CHECK_OK(q, pqmq_commit(q, (const uuid_t *)&id, 1));
    int committed = -1;
    CHECK_INT(poll_once(NULL, &committed), 1);
    CHECK_INT(committed, 1);

    /* A keep-alive shorter than the rest of the interval changes nothing. */
    t_truncate();
    insert_one("tp", 60000, 0, 60000, id);
    CHECK_OK(q, pqmq_keep_alive(q, (const uuid_t *)&id, 1, 10, &ext));
    CHECK_INT(ext, 0);
    t_sleep_ms(50);
    CHECK_INT(poll_once(&wait, NULL), 0);
    CHECK(wait > 50000);
    CHECK_OK(q, pqmq_commit(q, (const uuid_t *)&id, 1));
    CHECK_INT(poll_once(NULL, &committed), 1);
    CHECK_INT(committed, 1);
}

/* ---- notifications ---- */

/* The marker channel collect() ends at. */
static const char *marker_of(PGconn *l)
{
    static char marker[64];
    snprintf(marker, sizeof marker, "pqmq_tp_marker_%d", PQbackendPID(l));
    return marker;
}

/* A raw connection listening on the marker and the given channels. */
static PGconn *listener(const char *const *chans, int n)
{
    PGconn *l = t_pg();
    t_listen(l, marker_of(l));
    for (int i = 0; i < n; i++)
        t_listen(l, chans[i]);
    return l;
}

/*
 * Sends a marker notification from sender (after everything it committed),
 * then collects what l receives from sender's backend until the marker
 * arrives (notifications are delivered in commit order). Other backends'
 * notifications (other tests on the same database) are ignored. Returns the
 * count, or -1 when the marker did not arrive within 2 s. Notes that came
 * on channel chan are counted in *on_chan, on "mq" in *on_mq.
 */
typedef struct {
    const char *chan;
    int n, on_chan, on_mq, nonempty_payloads;
} tally;

static void count_note(const PGnotify *nt, void *arg)
{
    tally *t = arg;
    t->n++;
    t->on_chan += !strcmp(nt->relname, t->chan);
    t->on_mq += !strcmp(nt->relname, "mq");
    t->nonempty_payloads += nt->extra && *nt->extra;
}

static int collect(PGconn *l, PGconn *sender, const char *chan, int *on_chan, int *on_mq,
                   int *nonempty_payloads)
{
    const char *marker = marker_of(l);
    t_exec(sender, "NOTIFY %s", marker);
    tally t = {chan, 0, 0, 0, 0};
    int rc = t_collect_notes(l, PQbackendPID(sender), marker, 2000, count_note, &t);
    *on_chan = t.on_chan;
    *on_mq = t.on_mq;
    *nonempty_payloads = t.nonempty_payloads;
    return rc ? -1 : t.n;
}

static void test_commit_wakes_listeners(void)
{
    if (t_pooled()) {
        /* collect() tells this test's notifications by the sender's backend
         * pid, which a pooler hides (test_runner covers wake-ups there). */
        printf("    skipped behind a pooler\n");
        return;
    }
    t_truncate();
    const char *chans[] = {"mq", "mq_tp wake"};
    PGconn *l = listener(chans, 2);
    pqmq_client *other = t_client();

    uuid_t id;
    insert_one("tp wake", 60000, 0, 60000, id);
    int on_chan, on_mq, payloads;
    CHECK(collect(l, pqmq_conn(q), "mq_tp wake", &on_chan, &on_mq, &payloads) >= 0);

    /* Committing from another connection wakes both channels, once. */
    CHECK_OK(other, pqmq_commit(other, (const uuid_t *)&id, 1));
    int n = collect(l, pqmq_conn(other), "mq_tp wake", &on_chan, &on_mq, &payloads);
    CHECK_INT(n, 2);
    CHECK_INT(on_chan, 1);
    CHECK_INT(on_mq, 1);
    CHECK_INT(payloads, 0);
    /* What it woke them for is there. */
    CHECK_INT(poll_once(NULL, NULL), 1);

    pqmq_client_free(other);
    PQfinish(l);
}

static void test_insert_and_commit_in_producers_transaction(void)
{
    t_truncate();
    PGconn *conn = t_pg();
    pqmq_client *w = NULL;
    CHECK_OK(w, pqmq_wrap(conn, &w));
    if (!w) {
        PQfinish(conn);
        return;
    }
    uuid_t id;
    pqmq_msg *m = t_msg("tp tx", NULL, "tp", "{\"tx\": true}", 0);
    pqmq_msg_set_commit_interval(m, 60000);
    pqmq_msg_id(m, id);

    t_exec(conn, "BEGIN");
    CHECK_OK(w, pqmq_insert(w, &m, 1));
    CHECK_OK(w, pqmq_commit(w, (const uuid_t *)&id, 1));
    CHECK_INT(poll_once(NULL, NULL), 0); /* not visible before COMMIT */
    t_exec(conn, "COMMIT");
    int committed = -1;
    CHECK_INT(poll_once(NULL, &committed), 1);
    CHECK_INT(committed, 1);

    /* Rolled back: neither the message nor its commit happened. */
    t_truncate();
    pqmq_uuid_generate(id);
    pqmq_msg_set_id(m, id);
    t_exec(conn, "BEGIN");
    CHECK_OK(w, pqmq_insert(w, &m, 1));
    CHECK_OK(w, pqmq_commit(w, (const uuid_t *)&id, 1));
    t_exec(conn, "ROLLBACK");
    int64_t wait = 0;
    CHECK_INT(poll_once(&wait, NULL), 0);
    CHECK_INT(wait, -1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_payloads"), 0);

    pqmq_msg_free(m);
    pqmq_client_free(w);
    PQfinish(conn);
}

int main(void)
{
    t_init("twophase");
    q = t_client();
    pg = t_pg();
    T_RUN(test_pending_is_invisible_until_commit);
    T_RUN(test_commit_twice_and_unknown_ids_are_harmless);
    T_RUN(test_uncommitted_is_delivered_after_interval);
    T_RUN(test_commit_keeps_the_delay);
    T_RUN(test_keep_alive_postpones_commit_deadline);
    T_RUN(test_commit_wakes_listeners);
    T_RUN(test_insert_and_commit_in_producers_transaction);
    pqmq_client_free(q);
    PQfinish(pg);
    return t_done();
}
