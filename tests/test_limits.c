/*
 * test_limits.c: the limits of an insert through SQL, as the C library
 * keeps them (payload bytes per batch, bytes per channel name, channel
 * args and message name; an escaped NUL named by its message), and
 * checkpoints fenced as completions are: only the holder of the current
 * attempt may checkpoint, keep alive or fail a message (issue 52).
 */
#include <stdlib.h>
#include <uuid/uuid.h>

#include "harness.h"

static PGconn *pg;

/* sql must fail with SQLSTATE state, its message containing needle, and
 * leave no message behind. */
static void refused(const char *file, int line, const char *sql, const char *state,
                    const char *needle)
{
    PGresult *r = PQexec(pg, sql);
    const char *got = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    const char *msg = PQresultErrorMessage(r);
    if (PQresultStatus(r) != PGRES_FATAL_ERROR || !got || strcmp(got, state) != 0)
        t_fail(file, line, "%.200s...: SQLSTATE %s, expected %s (%s)", sql, got ? got : "none",
               state, msg);
    else if (!strstr(msg, needle))
        t_fail(file, line, "%.200s...: message \"%s\" lacks \"%s\"", sql, msg, needle);
    PQclear(r);
    if (t_sql_int(pg, "SELECT count(*) FROM mq_msgs") != 0)
        t_fail(file, line, "%.200s...: a refused batch left messages", sql);
}
#define REFUSED(sql, state, needle) refused(__FILE__, __LINE__, sql, state, needle)

/* An mq_new_t on channel ch with args, name, JSON and bytes (SQL text). */
#define ROW(ch, args, name, json, bytes)                                                       \
    "ROW(gen_random_uuid(), NULL, NULL, NULL, " ch ", " args ", NULL, false, " name ", " json  \
    ", " bytes ")::mq_new_t"
#define PLAIN ROW("'lim'", "''", "'n'", "'{}'", "NULL")

/* ---- payload bytes per insert ---- */

static void test_batch_payload_total(void)
{
    t_truncate();
    /* 16 payloads of 16 MiB (each within its limit) and one byte more:
     * one byte over 256 MiB in all. */
    REFUSED("SELECT mq_insert(ARRAY(SELECT " ROW(
                "'lim'", "''", "'n'", "NULL",
                "convert_to(repeat('x', 16777216), 'UTF8')") " FROM generate_series(1, 16))"
                                                             " || " ROW("'lim'", "''", "'n'",
                                                                        "NULL",
                                                                        "'\\x01'::bytea") ")",
            "54000", "268435457 bytes in all, over the limit of 268435456");
    /* The 17 x 16 MiB, through mq_insert_unique too. */
    REFUSED("SELECT * FROM mq_insert_unique(ARRAY(SELECT " ROW(
                "'lim'", "''", "'n'", "NULL",
                "convert_to(repeat('x', 16777216), 'UTF8')") " FROM generate_series(1, 17)),"
                                                             " ARRAY(SELECT 'k' || g FROM "
                                                             "generate_series(1, 17) g))",
            "54000", "over the limit of 268435456");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_keys"), 0);
    /* JSON and binary payloads count together: 8 x (16 MiB + 16 MiB) and
     * one more byte. */
    REFUSED("SELECT mq_insert(ARRAY(SELECT " ROW(
                "'lim'", "''", "'n'", "'\"' || repeat('x', 16777214) || '\"'",
                "convert_to(repeat('x', 16777216), 'UTF8')") " FROM generate_series(1, 8))"
                                                             " || " ROW("'lim'", "''", "'n'",
                                                                        "NULL",
                                                                        "'\\x01'::bytea") ")",
            "54000", "268435457 bytes in all");
}

/* ---- bytes per channel name, channel args, message name ---- */

static void test_text_fields(void)
{
    t_truncate();
    REFUSED("SELECT mq_insert(ARRAY[" PLAIN
            ", " ROW("repeat('c', 1025)", "''", "'n'", "'{}'", "NULL") "])",
            "22023", "message 2 of the batch: channel_name is over 1024 bytes");
    REFUSED("SELECT mq_insert(ARRAY[" PLAIN ", " PLAIN
            ", " ROW("'lim'", "repeat('a', 1025)", "'n'", "'{}'", "NULL") "])",
            "22023", "message 3 of the batch: channel_args is over 1024 bytes");
    /* The 10 MiB. */
    REFUSED("SELECT mq_insert(ARRAY[" ROW("'lim'", "''", "repeat('n', 10485760)", "'{}'",
                                          "NULL") "])",
            "22023", "message 1 of the batch: name is over 1024 bytes");
    /* Bytes, not characters: 513 two-byte characters. */
    REFUSED("SELECT * FROM mq_insert_unique(ARRAY[" ROW("'lim'", "repeat('é', 513)", "'n'",
                                                        "'{}'", "NULL") "], ARRAY['k'])",
            "22023", "message 1 of the batch: channel_args is over 1024 bytes");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_keys"), 0);
    /* 1024 bytes each is within the limits. */
    t_exec(pg, "SELECT mq_insert(ARRAY[" ROW("repeat('c', 1024)", "repeat('é', 512)",
                                             "repeat('n', 1024)", "'{}'", "NULL") "])");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE octet_length(channel_name) = "
                            "1024 AND octet_length(channel_args) = 1024 AND "
                            "octet_length(name) = 1024"),
              1);

    /* A schedule whose every slot would be refused is refused when given. */
    t_truncate();
    PGresult *r = PQexec(pg, "SELECT mq_schedule('lim', 1, 1, 2, 2, 1, true, true, 'UTC', "
                             "'latest', 'lim', repeat('n', 1025), '{}', NULL, 0, "
                             "interval '1 second')");
    CHECK_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22023");
    CHECK(strstr(PQresultErrorMessage(r), "msg_name is over 1024 bytes") != NULL);
    PQclear(r);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_schedules"), 0);

    /* The C library refuses the same before sending anything. */
    pqmq_client *q = t_client();
    char big[1026];
    memset(big, 'x', 1025);
    big[1025] = 0;
    pqmq_msg *m[2] = {t_msg("lim", NULL, "n", "{}", 0), t_msg("lim", big, "n", "{}", 0)};
    CHECK_ERR(q, pqmq_insert(q, m, 2), PQMQ_EINVAL, "msgs[1]: channel args is over 1024 bytes");
    pqmq_msg_set_channel(m[1], big, NULL);
    CHECK_ERR(q, pqmq_insert(q, m, 2), PQMQ_EINVAL, "msgs[1]: channel is over 1024 bytes");
    pqmq_msg_set_channel(m[1], "lim", NULL);
    pqmq_msg_set_name(m[1], big);
    CHECK_ERR(q, pqmq_insert(q, m, 2), PQMQ_EINVAL, "msgs[1]: name is over 1024 bytes");
    big[1024] = 0;
    pqmq_msg_set_name(m[1], big);
    pqmq_msg_set_channel(m[1], big, big);
    CHECK_OK(q, pqmq_insert(q, m, 2));
    t_msgs_free(m, 2);
    pqmq_client_free(q);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 2);
}

/* ---- an escaped NUL, which jsonb refuses ---- */

static void test_nul_escape_named(void)
{
    t_truncate();
    REFUSED("SELECT mq_insert(ARRAY[" PLAIN ", " PLAIN
            ", " ROW("'lim'", "''", "'n'", "'[\"a\\u0000b\"]'", "NULL") "])",
            "22P05", "message 3 of the batch: payload_json is not JSON");
    REFUSED("SELECT * FROM mq_insert_unique(ARRAY[" PLAIN ", " ROW(
                "'lim'", "''", "'n'", "'{\"k\": \"\\u0000\"}'", "NULL") "], ARRAY['a', 'b'])",
            "22P05", "message 2 of the batch: payload_json is not JSON");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_keys"), 0);
    /* An escaped backslash before "u0000" is no NUL: inserted. */
    t_exec(pg, "SELECT mq_insert(ARRAY[" ROW("'lim'", "''", "'n'", "'[\"\\\\u0000\"]'",
                                             "NULL") "])");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE payload_json->>0 = "
                            "'\\u0000'"),
              1);
}

/* ---- checkpoints, fenced ---- */

/* Everything a checkpoint, keep-alive or failure could change, as text. */
static char *state(const char *id)
{
    PGresult *r = t_sql(pg,
                        "SELECT row(attempt_at, ready_at, attempts, deliveries, retry_backoff, "
                        "payload_json, payload_bytes, last_error, dead_since)::text "
                        "FROM mq_msgs WHERE id = '%s'",
                        id);
    char *s = strdup(r && PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "?");
    PQclear(r);
    return s;
}

/* Polls a: one job, whose attempt number is returned. */
static int take(pqmq_client *a)
{
    pqmq_batch *b = NULL;
    CHECK_OK(a, pqmq_poll(a, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    int attempt = pqmq_batch_count(b) == 1 ? pqmq_job_attempt(pqmq_batch_job(b, 0)) : -1;
    pqmq_batch_free(b);
    return attempt;
}

static void test_checkpoint_only_by_lease_holder(void)
{
    t_truncate();
    pqmq_client *a = t_client(), *b = t_client();
    pqmq_msg *m = t_msg("fence", NULL, "job", "{\"step\": 0}", 0);
    pqmq_msg_set_retries(m, 3);
    pqmq_msg_set_backoff(m, 20000); /* the retry waits 20 s */
    uuid_t uid;
    pqmq_msg_id(m, uid);
    CHECK_OK(a, pqmq_insert(a, &m, 1));
    pqmq_msg_free(m);
    char id[37];
    uuid_unparse_lower(uid, id);

    /* A fails its delivery: the message waits for its retry. */
    CHECK_INT(take(a), 1);
    CHECK_OK(a, pqmq_fail(a, uid, "boom"));
    char *before = state(id);

    /* B's checkpoint changes nothing and finds no lease: through C, the
     * seed's SQL form and mq_checkpoint_found. */
    CHECK_ERR(b, pqmq_checkpoint(b, uid, 864000000, "{\"step\": 99}", NULL, 0, 100),
              PQMQ_ENOTHELD, "lease ran out");
    t_exec(pg, "SELECT mq_checkpoint('%s', interval '10 days', '{\"step\": 99}', NULL, 100)",
           id);
    CHECK_INT(t_sql_int(pg,
                        "SELECT mq_checkpoint_found('%s', interval '10 days', NULL, NULL, "
                        "100)::int",
                        id),
              0);
    /* Nor may B keep it alive or fail it again. */
    size_t ext = 9;
    CHECK_OK(b, pqmq_keep_alive(b, (const uuid_t *)&uid, 1, 864000000, &ext));
    CHECK_INT(ext, 0);
    CHECK_ERR(b, pqmq_fail(b, uid, "not mine"), PQMQ_ENOTHELD, "lease ran out");
    char *after = state(id);
    CHECK_STR(after, before);
    free(before);
    free(after);

    /* Retried: A holds attempt 2 and checkpoints it, again after a
     * keep-alive, and by attempt number. */
    t_exec(pg, "UPDATE mq_msgs SET attempt_at = now() WHERE id = '%s'", id);
    CHECK_INT(take(a), 2);
    CHECK_OK(a, pqmq_checkpoint(a, uid, 60000, "{\"step\": 1}", NULL, 0, 1));
    CHECK_OK(a, pqmq_keep_alive(a, (const uuid_t *)&uid, 1, 120000, &ext));
    CHECK_INT(ext, 1);
    CHECK_OK(a, pqmq_checkpoint(a, uid, 60000, "{\"step\": 2}", NULL, 0, 0));
    CHECK_INT(t_sql_int(pg,
                        "SELECT mq_checkpoint_found('%s', interval '1 minute', "
                        "'{\"step\": 3}', NULL, 0, 2)::int",
                        id),
              1);
    /* A stale attempt number is refused, and changes nothing. */
    before = state(id);
    CHECK_INT(t_sql_int(pg,
                        "SELECT mq_checkpoint_found('%s', interval '10 days', "
                        "'{\"step\": 99}', NULL, 100, 1)::int",
                        id),
              0);
    after = state(id);
    CHECK_STR(after, before);
    free(before);
    free(after);
    CHECK_INT(t_sql_int(pg, "SELECT (payload_json->>'step')::int FROM mq_msgs"), 3);
    CHECK_INT(t_sql_int(pg, "SELECT attempts FROM mq_msgs"), 3);
    /* Still A's lease: its failure is taken, with its attempt number. */
    CHECK_INT(t_sql_int(pg, "SELECT mq_fail('%s', 'stale', 1)::int", id), 0);
    CHECK_INT(t_sql_int(pg, "SELECT mq_fail('%s', 'second', 2)::int", id), 1);
    pqmq_client_free(a);
    pqmq_client_free(b);
}

/* A delayed message that was never delivered is not kept alive (its delay
 * is the producer's), a pending two-phase one is (its commit deadline). */
static void test_keep_alive_leaves_delays(void)
{
    t_truncate();
    pqmq_client *a = t_client();
    pqmq_msg *m[2] = {t_msg("fence", NULL, "job", "{}", 0),
                      t_msg("fence", NULL, "job", "{}", 0)};
    pqmq_msg_set_delay(m[0], 60000);
    pqmq_msg_set_commit_interval(m[1], 60000);
    uuid_t ids[2];
    pqmq_msg_id(m[0], ids[0]);
    pqmq_msg_id(m[1], ids[1]);
    CHECK_OK(a, pqmq_insert(a, m, 2));
    t_msgs_free(m, 2);
    size_t ext = 9;
    CHECK_OK(a, pqmq_keep_alive(a, (const uuid_t *)ids, 2, 600000, &ext));
    CHECK_INT(ext, 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE commit_interval IS NULL "
                            "AND attempt_at < clock_timestamp() + interval '2 minutes'"),
              1);
    pqmq_client_free(a);
}

int main(void)
{
    t_init("limits");
    pg = t_pg();
    T_RUN(test_batch_payload_total);
    T_RUN(test_text_fields);
    T_RUN(test_nul_escape_named);
    T_RUN(test_checkpoint_only_by_lease_holder);
    T_RUN(test_keep_alive_leaves_delays);
    PQfinish(pg);
    return t_done();
}
