/* test_notify.c: wake-ups (semantic 11). */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* strdup */
#endif
#include <stdlib.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

/* ---- a listener ---- */

enum { MAX_NOTES = 64 };

/* Notifications one backend sent, in arrival order. */
typedef struct {
    int n;
    char *chan[MAX_NOTES];
    char *extra[MAX_NOTES];
} notes;

static void notes_free(notes *ns)
{
    for (int i = 0; i < ns->n; i++) {
        free(ns->chan[i]);
        free(ns->extra[i]);
    }
    ns->n = 0;
}

static int count_on(const notes *ns, const char *chan)
{
    int k = 0;
    for (int i = 0; i < ns->n; i++)
        k += !strcmp(ns->chan[i], chan);
    return k;
}

/* Notifications that carried a payload. */
static int with_payload(const notes *ns)
{
    int k = 0;
    for (int i = 0; i < ns->n; i++)
        k += ns->extra[i][0] != '\0';
    return k;
}

/* The marker channel collect() stops at. */
static void marker_of(PGconn *l, char *out, size_t size)
{
    snprintf(out, size, "pqmq_nt_marker_%d", PQbackendPID(l));
}

/* A raw connection listening on the marker and on "mq" + chans. */
static PGconn *listener(const char *const *chans, int n)
{
    PGconn *l = t_pg();
    char marker[64];
    marker_of(l, marker, sizeof marker);
    t_listen(l, marker);
    t_listen(l, "mq");
    for (int i = 0; i < n; i++)
        t_listen(l, chans[i]);
    return l;
}

/* "mq_" + channel. */
static void notify_name(const char *channel, char *out, size_t size)
{
    snprintf(out, size, "mq_%s", channel);
}

/*
 * Collects into *out what l receives from the backend of conn `from`, until
 * a marker notification sent by `marker_from` after all that (notifications
 * arrive in commit order) comes in. Other backends' notifications (other
 * tests on the same database) are ignored. Returns 0, or -1 (and fails the
 * check) when the marker did not come within 2 s.
 */
static void keep_note(const PGnotify *nt, void *arg)
{
    notes *out = arg;
    if (out->n == MAX_NOTES) /* more would fail the counts anyway */
        return;
    out->chan[out->n] = strdup(nt->relname);
    out->extra[out->n] = strdup(nt->extra ? nt->extra : "");
    if (!out->chan[out->n] || !out->extra[out->n])
        abort();
    out->n++;
}

static int collect(PGconn *l, PGconn *from, PGconn *marker_from, notes *out)
{
    char marker[64];
    marker_of(l, marker, sizeof marker);
    t_exec(marker_from, "NOTIFY %s", marker);
    out->n = 0;
    int rc = t_collect_notes(l, PQbackendPID(from), marker, 2000, keep_note, out);
    if (rc == -2)
        t_fail(__FILE__, __LINE__, "the marker notification did not arrive within 2 s");
    return rc ? -1 : 0;
}

static void print_notes(const notes *ns)
{
    for (int i = 0; i < ns->n; i++)
        printf("    note %d: \"%s\" \"%s\"\n", i, ns->chan[i], ns->extra[i]);
}

/* Inserts one message on channel; its id goes to id (may be NULL). */
static void insert_on(pqmq_client *c, const char *channel, int ordered, uuid_t id)
{
    pqmq_msg *m = t_msg(channel, "args", "n", "{}", ordered);
    if (id)
        pqmq_msg_id(m, id);
    CHECK_OK(c, pqmq_insert(c, &m, 1));
    pqmq_msg_free(m);
}

/* Polls one job of channel and checks that its channel is exactly that. */
static void poll_exact(const char *channel)
{
    const char *only[] = {channel};
    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, only, 1, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    if (pqmq_batch_count(b) == 1)
        CHECK_STR(pqmq_job_channel(pqmq_batch_job(b, 0)), channel);
    pqmq_batch_free(b);
}

/* ---- tests ---- */

static void test_batch_wakes_each_channel_once(void)
{
    t_truncate();
    const char *chans[] = {"mq_alpha", "mq_beta"};
    PGconn *l = listener(chans, 2);
    pqmq_msg *msgs[8];
    for (int i = 0; i < 8; i++) /* interleaved: a b a b a b a a */
        msgs[i] =
            t_msg(i < 6 ? (i % 2 ? "beta" : "alpha") : "alpha", NULL, "n", "{}", i % 3 == 0);
    CHECK_OK(q, pqmq_insert(q, msgs, 8));
    t_msgs_free(msgs, 8);
    notes ns;
    if (!collect(l, pqmq_conn(q), pg, &ns)) {
        CHECK_INT(ns.n, 3);
        CHECK_INT(count_on(&ns, "mq_alpha"), 1);
        CHECK_INT(count_on(&ns, "mq_beta"), 1);
        CHECK_INT(count_on(&ns, "mq"), 1);
        CHECK_INT(with_payload(&ns), 0); /* no payload data */
        if (ns.n != 3)
            print_notes(&ns);
    }
    notes_free(&ns);

    /* The SQL function is the same statement: same wake-ups. */
    t_exec(pqmq_conn(q),
           "SELECT mq_insert(ARRAY[(gen_random_uuid(), NULL, 0, interval '1 s', 'alpha', "
           "'', NULL, false, 'n', '{\"secret\": 1}', NULL)::mq_new_t, "
           "(gen_random_uuid(), NULL, 0, interval '1 s', 'alpha', "
           "'', NULL, false, 'n', '{\"secret\": 2}', NULL)::mq_new_t])");
    if (!collect(l, pqmq_conn(q), pg, &ns)) {
        CHECK_INT(ns.n, 2);
        CHECK_INT(count_on(&ns, "mq_alpha"), 1);
        CHECK_INT(count_on(&ns, "mq"), 1);
        CHECK_INT(with_payload(&ns), 0);
    }
    notes_free(&ns);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 10);
    PQfinish(l);
}

static void test_strange_channel_name_round_trips(void)
{
    const char *names[] = {
        "it's \"odd\"; DROP TABLE mq_msgs; -- Mixed Case",
        "  Spaces  and\ttabs ",
        "UPPER",
        "back\\slash $1 %s ' \"",
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        t_truncate();
        char chan[128];
        notify_name(names[i], chan, sizeof chan);
        const char *chans[] = {chan};
        PGconn *l = listener(chans, 1);
        insert_on(q, names[i], i % 2, NULL);
        notes ns;
        if (!collect(l, pqmq_conn(q), pg, &ns)) {
            CHECK_INT(ns.n, 2);
            CHECK_INT(count_on(&ns, chan), 1);
            CHECK_INT(count_on(&ns, "mq"), 1);
            if (ns.n != 2 || count_on(&ns, chan) != 1)
                print_notes(&ns);
        }
        notes_free(&ns);
        poll_exact(names[i]);
        /* Stored exactly as given. */
        char *lit = PQescapeLiteral(pg, names[i], strlen(names[i]));
        CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE channel_name = %s", lit),
                  1);
        PQfreemem(lit);
        PQfinish(l);
    }
    /* The names dropped nothing: the queue's table and view are still there. */
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM pg_tables WHERE tablename = 'mq_rows'"
                            " AND schemaname = current_schema()"),
              1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM pg_views WHERE viewname = 'mq_msgs'"
                            " AND schemaname = current_schema()"),
              1);
}

static void test_long_channel_names(void)
{
    char n60[61], n61[62], n200[201], mb60[61], mb75[76];
    memset(n60, 'a', 60);
    n60[60] = '\0';
    memset(n61, 'b', 61);
    n61[61] = '\0';
    memset(n200, 'c', 200);
    n200[200] = '\0';
    mb60[0] = mb75[0] = '\0';
    for (int i = 0; i < 20; i++)
        strcat(mb60, "\xe6\x97\xa5"); /* U+65E5, 3 bytes: 20 chars, 60 bytes */
    for (int i = 0; i < 25; i++)
        strcat(mb75, "\xe6\x97\xa5"); /* 25 chars, 75 bytes */
    struct {
        const char *name;
        int own; /* "mq_" + name fits PostgreSQL's 63 bytes */
    } cases[] = {{n60, 1}, {mb60, 1}, {n61, 0}, {n200, 0}, {mb75, 0}};

    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        t_truncate();
        char chan[256];
        notify_name(cases[i].name, chan, sizeof chan);
        /* Listening on a name over 63 bytes listens on its first 63 bytes:
         * that catches a wake-up on a truncated name too. */
        const char *chans[] = {chan};
        PGconn *l = listener(chans, 1);
        insert_on(q, cases[i].name, (int)(i % 2), NULL);
        notes ns;
        if (!collect(l, pqmq_conn(q), pg, &ns)) {
            CHECK_INT(count_on(&ns, "mq"), 1);
            CHECK_INT(ns.n, cases[i].own ? 2 : 1);
            if (cases[i].own)
                CHECK_INT(count_on(&ns, chan), 1);
            if (ns.n != (cases[i].own ? 2 : 1)) {
                printf("    case %zu (%zu bytes):\n", i, strlen(cases[i].name));
                print_notes(&ns);
            }
        }
        notes_free(&ns);
        poll_exact(cases[i].name);
        PQfinish(l);
    }
}

static void test_completing_chain_head_wakes_channel(void)
{
    t_truncate();
    const char *chans[] = {"mq_chain"};
    PGconn *l = listener(chans, 1);
    uuid_t head, next;
    pqmq_msg *m[2] = {t_msg("chain", "k", "n", "{\"i\": 0}", 1),
                      t_msg("chain", "k", "n", "{\"i\": 1}", 1)};
    pqmq_msg_id(m[0], head);
    pqmq_msg_id(m[1], next);
    CHECK_OK(q, pqmq_insert(q, m, 2));
    t_msgs_free(m, 2);
    notes ns;
    collect(l, pqmq_conn(q), pg, &ns);
    notes_free(&ns);

    pqmq_batch *b = NULL;
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 1); /* only the head */
    pqmq_batch_free(b);

    /* Completing from another connection: the next one is ready now. */
    pqmq_client *other = t_client();
    CHECK_OK(other, pqmq_complete(other, (const uuid_t *)&head, 1));
    if (!collect(l, pqmq_conn(other), pg, &ns)) {
        CHECK_INT(count_on(&ns, "mq_chain"), 1);
        CHECK_INT(count_on(&ns, "mq"), 1);
        CHECK_INT(ns.n, 2);
        CHECK_INT(with_payload(&ns), 0);
    }
    notes_free(&ns);
    CHECK_OK(q, pqmq_poll(q, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    if (pqmq_batch_count(b) == 1)
        CHECK_STR(pqmq_job_json(pqmq_batch_job(b, 0)), "{\"i\": 1}");
    pqmq_batch_free(b);
    pqmq_client_free(other);
    PQfinish(l);
}

static void test_rolled_back_insert_sends_nothing(void)
{
    t_truncate();
    const char *chans[] = {"mq_alpha"};
    PGconn *l = listener(chans, 1);
    PGconn *conn = t_pg();
    pqmq_client *w = NULL;
    CHECK_OK(w, pqmq_wrap(conn, &w));

    t_exec(conn, "BEGIN");
    insert_on(w, "alpha", 0, NULL);
    insert_on(w, "alpha", 1, NULL);
    notes ns;
    /* Nothing is sent before the transaction ends (marker from elsewhere). */
    if (!collect(l, conn, pg, &ns))
        CHECK_INT(ns.n, 0);
    notes_free(&ns);
    t_exec(conn, "ROLLBACK");
    if (!collect(l, conn, conn, &ns))
        CHECK_INT(ns.n, 0);
    notes_free(&ns);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);

    /* The same committed: the wake-up comes with the commit, once. */
    t_exec(conn, "BEGIN");
    insert_on(w, "alpha", 0, NULL);
    insert_on(w, "alpha", 1, NULL);
    if (!collect(l, conn, pg, &ns))
        CHECK_INT(ns.n, 0);
    notes_free(&ns);
    t_exec(conn, "COMMIT");
    if (!collect(l, conn, conn, &ns)) {
        CHECK_INT(ns.n, 2);
        CHECK_INT(count_on(&ns, "mq_alpha"), 1);
        CHECK_INT(count_on(&ns, "mq"), 1);
    }
    notes_free(&ns);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 2);

    pqmq_client_free(w);
    PQfinish(conn);
    PQfinish(l);
}

int main(void)
{
    t_init("notify");
    q = t_client();
    pg = t_pg();
    T_RUN(test_batch_wakes_each_channel_once);
    T_RUN(test_strange_channel_name_round_trips);
    T_RUN(test_long_channel_names);
    T_RUN(test_completing_chain_head_wakes_channel);
    T_RUN(test_rolled_back_insert_sends_nothing);
    pqmq_client_free(q);
    PQfinish(pg);
    return t_done();
}
