/*
 * test_story.c: one message's story (schema/story.sql): the history of its
 * last five failed attempts, kept by the failure paths whether the message
 * started in mq_rows or in the log; its state as mq_message reports it
 * (ready, in flight, delayed, waiting in its chain with its place, dead,
 * uncommitted); the payload preview, cut and given to administrators only;
 * and an unknown id.
 */
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

static void id_text(const uuid_t id, char out[37])
{
    uuid_unparse_lower(id, out);
}

/* Inserts one message on ch (ordered on chain args "k" when ordered);
 * its id into id_out. */
static void put(const char *ch, const char *json, int ordered, int retries, int64_t backoff,
                int64_t delay, int64_t commit, char id_out[37])
{
    pqmq_msg *m = t_msg(ch, ordered ? "k" : NULL, "job", json, ordered);
    pqmq_msg_set_retries(m, retries);
    pqmq_msg_set_backoff(m, backoff);
    if (delay)
        pqmq_msg_set_delay(m, delay);
    if (commit)
        pqmq_msg_set_commit_interval(m, commit);
    uuid_t id;
    pqmq_msg_id(m, id);
    id_text(id, id_out);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    pqmq_msg_free(m);
}

/* Polls channel ch once for up to max; returns how many it got. */
static int take(const char *ch, int max)
{
    pqmq_batch *b = NULL;
    const char *chans[] = {ch};
    CHECK_OK(q, pqmq_poll(q, chans, 1, max, &b));
    int n = (int)pqmq_batch_count(b);
    pqmq_batch_free(b);
    return n;
}

/* One column of mq_message(id), as text ("(null)" for NULL, "(none)" when
 * there is no row). Static buffer. */
static const char *story(const char *id, const char *expr)
{
    static char out[4096];
    PGresult *r = t_sql(pg, "SELECT (%s)::text FROM mq_message('%s') m", expr, id);
    if (!r || PQntuples(r) == 0)
        snprintf(out, sizeof out, "(none)");
    else if (PQgetisnull(r, 0, 0))
        snprintf(out, sizeof out, "(null)");
    else
        snprintf(out, sizeof out, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return out;
}

static void test_seven_failures_keep_the_last_five(void)
{
    t_truncate();
    char id[37];
    put("h", "{}", 0, 9, 0, 0, 0, id);
    for (int i = 1; i <= 7; i++) {
        CHECK_INT(take("h", 1), 1);
        char err[32];
        snprintf(err, sizeof err, "boom %d", i);
        uuid_t u;
        uuid_parse(id, u);
        CHECK_OK(q, pqmq_fail(q, u, err));
    }
    CHECK_STR(story(id, "jsonb_array_length(m.history)"), "5");
    CHECK_STR(story(id, "(SELECT string_agg((e->>'attempt') || ':' || (e->>'error'), ',' "
                        "ORDER BY o) FROM jsonb_array_elements(m.history) "
                        "WITH ORDINALITY AS x(e, o))"),
              "3:boom 3,4:boom 4,5:boom 5,6:boom 6,7:boom 7");
    /* Times in order, each a timestamp. */
    CHECK_STR(story(id, "(SELECT bool_and(s.t >= s.p) FROM (SELECT (e->>'at')::timestamptz t, "
                        "lag((e->>'at')::timestamptz) OVER (ORDER BY o) p "
                        "FROM jsonb_array_elements(m.history) WITH ORDINALITY AS x(e, o)) s "
                        "WHERE s.p IS NOT NULL)"),
              "true");
    CHECK_STR(story(id, "m.last_error"), "boom 7");
    CHECK_STR(story(id, "m.attempts_used"), "7");
    CHECK_STR(story(id, "m.attempts_left"), "3");
    /* mq_msgs shows it too. */
    CHECK_INT(
        t_sql_int(pg, "SELECT jsonb_array_length(history) FROM mq_msgs WHERE id = '%s'", id),
        5);
}

static void test_logged_message_history_starts_in_mq_rows(void)
{
    if (t_citus_skip("nothing is logged on Citus"))
        return;
    t_truncate();
    char id[37];
    put("lg", "{\"n\": 1}", 0, 3, 0, 0, 0, id);
    /* A plain message is logged, with no history, in mq_msgs too. */
    CHECK_STR(story(id, "m.logged"), "true");
    CHECK_STR(story(id, "m.history"), "(null)");
    CHECK_INT(
        t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE id = '%s' AND history IS NULL", id),
        1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_log WHERE id = '%s'", id), 1);
    CHECK_INT(take("lg", 1), 1);
    uuid_t u;
    uuid_parse(id, u);
    CHECK_OK(q, pqmq_fail(q, u, "first failure"));
    CHECK_STR(story(id, "m.logged"), "false");
    CHECK_STR(story(id, "m.history->0->>'error'"), "first failure");
    CHECK_STR(story(id, "m.history->0->>'attempt'"), "1");
    CHECK_STR(story(id, "jsonb_array_length(m.history)"), "1");
    /* A second delivery and failure append. */
    CHECK_INT(take("lg", 1), 1);
    CHECK_OK(q, pqmq_fail(q, u, "second failure"));
    CHECK_STR(story(id, "m.history->1->>'attempt'"), "2");
    CHECK_STR(story(id, "m.history->1->>'error'"), "second failure");
}

static void test_final_lease_run_out_is_in_the_history(void)
{
    t_truncate();
    char id[37];
    put("lease", "{}", 0, 0, 100, 0, 0, id);
    CHECK_INT(take("lease", 1), 1);
    t_sleep_ms(400);
    CHECK_STR(story(id, "m.state"), "dead");
    CHECK_STR(story(id, "m.history->0->>'error'"), "lease ran out");
    CHECK_STR(story(id, "m.history->0->>'attempt'"), "1");
}

/* A claim writes no history, in the log or in mq_rows. */
static void test_claim_writes_none(void)
{
    t_truncate();
    char id[37];
    put("ok", "{}", 0, 3, 60000, 0, 0, id);
    pqmq_msg *m = t_msg("ok", "k", "job", "{}", 1); /* in mq_rows from its insert */
    uuid_t u2;
    pqmq_msg_id(m, u2);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    pqmq_msg_free(m);
    CHECK_INT(take("ok", 10), 2);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_rows WHERE history IS NOT NULL"), 0);
}

static void test_each_state(void)
{
    t_truncate();
    char ready[37], flight[37], delayed[37], dead[37], unc[37], c1[37], c2[37], c3[37];
    put("s_ready", "{}", 0, 3, 60000, 0, 0, ready);
    put("s_flight", "{}", 0, 3, 60000, 0, 0, flight);
    CHECK_INT(take("s_flight", 1), 1);
    put("s_delayed", "{}", 0, 3, 60000, 60000, 0, delayed);
    put("s_dead", "{}", 0, 0, 60000, 0, 0, dead);
    CHECK_INT(take("s_dead", 1), 1);
    uuid_t u;
    uuid_parse(dead, u);
    CHECK_OK(q, pqmq_fail(q, u, "fatal"));
    put("s_unc", "{}", 0, 3, 60000, 0, 60000, unc);
    put("s_chain", "{\"seq\": 1}", 1, 3, 60000, 0, 0, c1);
    put("s_chain", "{\"seq\": 2}", 1, 3, 60000, 0, 0, c2);
    put("s_chain", "{\"seq\": 3}", 1, 3, 60000, 0, 0, c3);

    CHECK_STR(story(ready, "m.state"), "ready");
    CHECK_STR(story(ready, "m.channel_name"), "s_ready");
    CHECK_STR(story(ready, "m.ordered"), "false");
    CHECK_STR(story(ready, "m.chain_ahead"), "(null)");
    CHECK_STR(story(ready, "m.created_at <= now()"), "true");
    CHECK_STR(story(flight, "m.state"), "in_flight");
    CHECK_STR(story(flight, "m.attempts_used"), "1");
    CHECK_STR(story(flight, "m.ready_at > now() + interval '50 seconds'"), "true");
    CHECK_STR(story(delayed, "m.state"), "delayed");
    CHECK_STR(story(delayed, "m.ready_at > now() + interval '50 seconds'"), "true");
    CHECK_STR(story(dead, "m.state"), "dead");
    CHECK_STR(story(dead, "m.dead_since IS NOT NULL AND m.ready_at IS NULL"), "true");
    CHECK_STR(story(dead, "m.attempts_left"), "0");
    CHECK_STR(story(dead, "m.last_error"), "fatal");
    CHECK_STR(story(unc, "m.state"), "uncommitted");
    CHECK_STR(story(c1, "m.state"), "ready");
    CHECK_STR(story(c1, "m.chain_ahead"), "0");
    CHECK_STR(story(c1, "m.chain_head"), c1);
    CHECK_STR(story(c2, "m.state"), "waiting");
    CHECK_STR(story(c2, "m.chain_ahead"), "1");
    CHECK_STR(story(c2, "m.chain_head"), c1);
    CHECK_STR(story(c3, "m.state"), "waiting");
    CHECK_STR(story(c3, "m.chain_ahead"), "2");
    CHECK_STR(story(c3, "m.channel_args"), "k");
    CHECK_STR(story(c3, "m.ordered"), "true");
    /* mq_waiting lists the two behind the head, in chain order. */
    PGresult *r =
        t_sql(pg,
              "SELECT string_agg(w.id || ':' || w.chain_ahead || ':' || "
              "(w.chain_head = '%s') || ':' || w.head_dead, ',' ORDER BY w.chain_ahead) "
              "FROM mq_waiting('s_chain', 10) w",
              c1);
    char want[200];
    snprintf(want, sizeof want, "%s:1:true:false,%s:2:true:false", c2, c3);
    CHECK_STR(r && PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : NULL, want);
    PQclear(r);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_waiting('s_ready', 10)"), 0);
    /* The head in flight: still the head, its followers still waiting. */
    CHECK_INT(take("s_chain", 10), 1);
    CHECK_STR(story(c1, "m.state"), "in_flight");
    CHECK_STR(story(c2, "m.state"), "waiting");
}

static void test_unknown_id(void)
{
    CHECK_STR(story("00000000-0000-0000-0000-0000000000ff", "m.state"), "(none)");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_message_payload("
                            "'00000000-0000-0000-0000-0000000000ff', 10)"),
              0);
    PGresult *r = PQexec(pg, "SELECT * FROM mq_message(NULL)");
    CHECK(PQresultStatus(r) == PGRES_FATAL_ERROR);
    CHECK(strstr(PQresultErrorMessage(r), "msg_id is NULL") != NULL);
    PQclear(r);
}

static void test_payload_preview(void)
{
    t_truncate();
    char id[37];
    /* 'é' is two bytes: a cut at 11 bytes must not split one. */
    put("p", "{\"t\": \"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"}", 0, 3,
        1000, 0, 0, id);
    PGresult *r =
        t_sql(pg,
              "SELECT json_bytes, json_preview, octet_length(json_preview), truncated "
              "FROM mq_message_payload('%s', 11)",
              id);
    CHECK_INT(PQntuples(r), 1);
    if (PQntuples(r) == 1) {
        CHECK_STR(PQgetvalue(r, 0, 0), "23");
        CHECK_STR(PQgetvalue(r, 0, 1), "{\"t\": \"\xc3\xa9\xc3\xa9");
        CHECK_STR(PQgetvalue(r, 0, 2), "11");
        CHECK_STR(PQgetvalue(r, 0, 3), "t");
    }
    PQclear(r);
    CHECK_INT(
        t_sql_int(pg, "SELECT (NOT truncated)::int FROM mq_message_payload('%s', 100)", id), 1);
    /* Bytes: hex of the first max_bytes. */
    pqmq_msg *m = t_msg("p", NULL, "bin", NULL, 0);
    unsigned char bytes[64];
    for (int i = 0; i < 64; i++)
        bytes[i] = (unsigned char)i;
    pqmq_msg_set_bytes(m, bytes, sizeof bytes);
    uuid_t u;
    char bid[37];
    pqmq_msg_id(m, u);
    id_text(u, bid);
    CHECK_OK(q, pqmq_insert(q, &m, 1));
    pqmq_msg_free(m);
    r = t_sql(pg,
              "SELECT binary_bytes, binary_preview_hex, truncated "
              "FROM mq_message_payload('%s', 4)",
              bid);
    if (PQntuples(r) == 1) {
        CHECK_STR(PQgetvalue(r, 0, 0), "64");
        CHECK_STR(PQgetvalue(r, 0, 1), "00010203");
        CHECK_STR(PQgetvalue(r, 0, 2), "t");
    } else {
        CHECK_INT(PQntuples(r), 1);
    }
    PQclear(r);
    r = PQexec(pg,
               "SELECT * FROM mq_message_payload('00000000-0000-0000-0000-000000000001', 0)");
    CHECK(PQresultStatus(r) == PGRES_FATAL_ERROR);
    PQclear(r);

    /* A consume-only role may not read it (nor the story); an
     * administrator may. */
    char cons[64], adm[64];
    snprintf(cons, sizeof cons, "t_story_%ld_consumer", (long)getpid());
    snprintf(adm, sizeof adm, "t_story_%ld_admin", (long)getpid());
    PGconn *su = t_pg();
    t_exec(su, "CREATE ROLE %s NOLOGIN", cons);
    t_exec(su, "CREATE ROLE %s NOLOGIN", adm);
    t_exec(su, "SELECT mq_grant('consume', '%s'), mq_grant('administer', '%s')", cons, adm);
    t_exec(su, "SET ROLE %s", cons);
    r = PQexecParams(su, "SELECT * FROM mq_message_payload($1::uuid, 10)", 1, NULL,
                     (const char *const[]){id}, NULL, NULL, 0);
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "42501");
    PQclear(r);
    r = PQexecParams(su, "SELECT * FROM mq_message($1::uuid)", 1, NULL,
                     (const char *const[]){id}, NULL, NULL, 0);
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "42501");
    PQclear(r);
    t_exec(su, "RESET ROLE");
    t_exec(su, "SET ROLE %s", adm);
    CHECK_INT(t_sql_int(su, "SELECT json_bytes FROM mq_message_payload('%s', 10)", id), 23);
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM mq_message('%s')", id), 1);
    t_exec(su, "RESET ROLE");
    t_exec(su, "DROP OWNED BY %s CASCADE; DROP ROLE %s", cons, cons);
    t_exec(su, "DROP OWNED BY %s CASCADE; DROP ROLE %s", adm, adm);
    PQfinish(su);
}

int main(void)
{
    t_init("story");
    q = t_client();
    pg = t_pg();
    T_RUN(test_seven_failures_keep_the_last_five);
    T_RUN(test_logged_message_history_starts_in_mq_rows);
    T_RUN(test_final_lease_run_out_is_in_the_history);
    T_RUN(test_claim_writes_none);
    T_RUN(test_each_state);
    T_RUN(test_unknown_id);
    T_RUN(test_payload_preview);
    pqmq_client_free(q);
    PQfinish(pg);
    return t_done();
}
