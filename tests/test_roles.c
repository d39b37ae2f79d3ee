/*
 * test_roles.c: least privilege. Roles granted a duty with
 * mq_grant do that duty through the functions and nothing else: no table
 * rights, no other duty's functions, no internal helpers; and nothing a
 * caller puts on its own search_path (functions, operators, temporary
 * tables) is run or read by the functions, which run as the queue's owner.
 *
 * The roles are NOLOGIN and used with SET ROLE on the harness's connection,
 * so the test needs no extra authentication setup. They are cluster-wide:
 * named after this process and dropped at the end.
 */
#include <glob.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

static PGconn *su; /* the harness's (superuser) connection: the owner */
static char prod[64], cons[64], adm[64], other[64], member[64];
static char evil_schema[80];

/* A connection acting as role (caller PQfinish'es); *c wraps it. */
static PGconn *as_role(const char *role, pqmq_client **c)
{
    PGconn *conn = t_pg();
    t_exec(conn, "SET ROLE %s", role);
    *c = NULL;
    if (pqmq_wrap(conn, c) != 0)
        abort();
    return conn;
}

static void done_role(PGconn *conn, pqmq_client *c)
{
    pqmq_client_free(c);
    PQfinish(conn);
}

/* Runs sql, which must fail; returns its SQLSTATE (static buffer). */
static const char *sql_state(PGconn *conn, const char *sql)
{
    static char state[8];
    PGresult *r = PQexec(conn, sql);
    const char *s = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    snprintf(state, sizeof state, "%s", s ? s : "(ok)");
    PQclear(r);
    return state;
}

#define DENIED(conn, sql) CHECK_STR(sql_state(conn, sql), "42501")

static void uuid_of(const pqmq_msg *m, uuid_t out)
{
    pqmq_msg_id(m, out);
}

static void insert_as_owner(pqmq_msg **m, size_t n)
{
    pqmq_client *o = t_client();
    CHECK_OK(o, pqmq_insert(o, m, n));
    pqmq_client_free(o);
    t_msgs_free(m, n);
}

/* One unordered message, inserted by the owner; its id goes to id. */
static void insert_one_as_owner(const char *channel, const char *name, const char *json,
                                uuid_t id)
{
    pqmq_msg *m[] = {t_msg(channel, NULL, name, json, 0)};
    uuid_of(m[0], id);
    insert_as_owner(m, 1);
}

static void drop_roles(void)
{
    const char *all[] = {member, prod, cons, adm, other};
    for (size_t i = 0; i < 5; i++) {
        PGresult *r = PQexec(su, "SELECT 1"); /* keep su usable */
        PQclear(r);
        char sql[200];
        snprintf(sql, sizeof sql,
                 "DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '%s') THEN "
                 "DROP OWNED BY %s CASCADE; DROP ROLE %s; END IF; END $$",
                 all[i], all[i], all[i]);
        t_exec(su, "%s", sql);
    }
}

static void setup(void)
{
    long pid = (long)getpid();
    snprintf(prod, sizeof prod, "t_roles_%ld_producer", pid);
    snprintf(cons, sizeof cons, "t_roles_%ld_consumer", pid);
    snprintf(adm, sizeof adm, "t_roles_%ld_admin", pid);
    snprintf(other, sizeof other, "t_roles_%ld_other", pid);
    snprintf(member, sizeof member, "t_roles_%ld_member", pid);
    snprintf(evil_schema, sizeof evil_schema, "%s_evil", t_schema());
    su = t_pg();
    drop_roles();
    t_exec(su, "CREATE ROLE %s NOLOGIN", prod);
    t_exec(su, "CREATE ROLE %s NOLOGIN", cons);
    t_exec(su, "CREATE ROLE %s NOLOGIN", adm);
    t_exec(su, "CREATE ROLE %s NOLOGIN", other);
    /* mq_insert (with and without priorities), mq_insert_unique, mq_commit,
     * mq_schedule, mq_cron_slots; and, for each duty, mq_schema_version */
    CHECK_INT(t_sql_int(su, "SELECT mq_grant('produce', '%s')", prod), 7);
    /* consume: with mq_worker_register, mq_worker_beat, mq_worker_leave;
     * administer: with mq_alert_metrics, mq_workers, mq_pause, mq_resume,
     * mq_paused_channels, mq_message, mq_message_payload, mq_waiting */
    CHECK_INT(t_sql_int(su, "SELECT mq_grant('consume', '%s')", cons), 20);
    CHECK_INT(t_sql_int(su, "SELECT mq_grant('administer', '%s')", adm), 23);
}

/* ---- each duty does its own job ---------------------------------------- */

static void test_each_duty_end_to_end(void)
{
    t_truncate();
    pqmq_client *p, *c, *a;
    PGconn *pc = as_role(prod, &p), *cc = as_role(cons, &c), *ac = as_role(adm, &a);

    /* Produce: one plain message, one that will die, one two-phase. */
    pqmq_msg *m[3] = {t_msg("r", NULL, "ok", "{\"n\": 1}", 0),
                      t_msg("r", NULL, "dies", "{\"n\": 2}", 0),
                      t_msg("r", NULL, "later", "{\"n\": 3}", 0)};
    pqmq_msg_set_retries(m[1], 0);
    pqmq_msg_set_commit_interval(m[2], 3600000);
    uuid_t pending;
    uuid_of(m[2], pending);
    CHECK_OK(p, pqmq_insert(p, m, 3));
    t_msgs_free(m, 3);
    CHECK_OK(p, pqmq_commit(p, (const uuid_t *)&pending, 1));

    /* Consume: poll, keep alive, checkpoint, fail one, complete the rest. */
    pqmq_batch *b = NULL;
    CHECK_OK(c, pqmq_poll(c, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 3);
    uuid_t good[3];
    size_t ngood = 0;
    for (size_t i = 0; i < pqmq_batch_count(b) && i < 3; i++) {
        uuid_t id;
        pqmq_job_id(pqmq_batch_job(b, i), id);
        size_t ext = 0;
        CHECK_OK(c, pqmq_keep_alive(c, (const uuid_t *)&id, 1, 60000, &ext));
        CHECK_INT(ext, 1);
        if (!strcmp(pqmq_job_name(pqmq_batch_job(b, i)), "dies")) {
            CHECK_OK(c, pqmq_fail(c, id, "no luck"));
        } else {
            CHECK_OK(c, pqmq_checkpoint(c, id, 60000, "{\"saved\": true}", NULL, 0, 0));
            memcpy(good[ngood++], id, sizeof(uuid_t));
        }
    }
    CHECK_INT(ngood, 2);
    CHECK_OK(c, pqmq_complete(c, (const uuid_t *)good, ngood));
    pqmq_batch *next = NULL;
    CHECK_OK(c, pqmq_complete_and_poll(c, NULL, NULL, 0, 10, &next));
    CHECK_INT(pqmq_batch_count(next), 0);
    pqmq_batch_free(next);
    pqmq_batch_free(b);

    /* Administer: see the dead letter, retry it, stats. */
    pqmq_batch *dead = NULL;
    CHECK_OK(a, pqmq_dead_letters(a, NULL, 0, 10, &dead));
    CHECK_INT(pqmq_batch_count(dead), 1);
    if (pqmq_batch_count(dead) == 1) {
        CHECK_STR(pqmq_job_last_error(pqmq_batch_job(dead, 0)), "no luck");
        uuid_t id;
        size_t n = 0;
        pqmq_job_id(pqmq_batch_job(dead, 0), id);
        CHECK_OK(a, pqmq_retry(a, (const uuid_t *)&id, 1, 0, &n));
        CHECK_INT(n, 1);
    }
    pqmq_batch_free(dead);
    CHECK_INT(t_sql_int(ac, "SELECT sum(ready) FROM mq_stats(NULL)"), 1);
    /* The operator's functions (the pqmq command) are the administer duty. */
    CHECK_INT(t_sql_int(ac, "SELECT sum(ready) FROM mq_metrics(NULL)"), 1);
    CHECK_INT(t_sql_int(ac, "SELECT count(*) FROM mq_peek('r')"), 1);

    /* The consumer finishes it. */
    CHECK_OK(c, pqmq_poll(c, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_OK(c, pqmq_complete_batch(c, b));
    pqmq_batch_free(b);
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM mq_msgs"), 0);

    done_role(pc, p);
    done_role(cc, c);
    done_role(ac, a);
}

/* ---- what each duty cannot do ------------------------------------------ */

static void test_producer_cannot_consume_read_or_administer(void)
{
    t_truncate();
    uuid_t id;
    insert_one_as_owner("p", "n", "{\"secret\": 1}", id);
    pqmq_client *p;
    PGconn *pc = as_role(prod, &p);
    pqmq_batch *b = NULL;
    CHECK_ERR(p, pqmq_poll(p, NULL, 0, 10, &b), PQMQ_ESERVER, "permission denied");
    CHECK_STR(pqmq_sqlstate(p), "42501");
    CHECK_ERR(p, pqmq_complete(p, (const uuid_t *)&id, 1), PQMQ_ESERVER, "permission denied");
    CHECK_ERR(p, pqmq_dead_letters(p, NULL, 0, 10, &b), PQMQ_ESERVER, "permission denied");
    CHECK_ERR(p, pqmq_retry(p, (const uuid_t *)&id, 1, 1, NULL), PQMQ_ESERVER,
              "permission denied");
    DENIED(pc, "SELECT * FROM mq_payloads");
    DENIED(pc, "SELECT * FROM mq_msgs");
    DENIED(pc, "DELETE FROM mq_msgs");
    DENIED(pc, "DELETE FROM mq_payloads");
    DENIED(pc, "SELECT * FROM mq_poll_jobs(NULL, 10)");
    DENIED(pc, "SELECT * FROM mq_claim(NULL, 10)");
    DENIED(pc, "SELECT * FROM mq_dead_jobs(NULL, 10)");
    DENIED(pc, "SELECT mq_delete(ARRAY[gen_random_uuid()])");
    DENIED(pc, "SELECT * FROM mq_stats(NULL)");
    DENIED(pc, "SELECT * FROM mq_metrics(NULL)");
    DENIED(pc, "SELECT * FROM mq_peek('p')");
    DENIED(pc, "SELECT * FROM mq_purge('p')");
    DENIED(pc, "SELECT mq_pause('p')");
    DENIED(pc, "SELECT mq_skip(ARRAY[gen_random_uuid()])");
    /* Internal helpers: one call could hold a chain's producers back. */
    DENIED(pc, "SELECT _mq_lock_new_chains(ARRAY[]::mq_new_t[])");
    DENIED(pc, "SELECT _mq_pick_chains(NULL, 0, 0, 0, 1, 1, 1, now(), 0, false, now(), "
               "'{}', '{}', '{}')");
    DENIED(pc, "SELECT _mq_wake(ARRAY['p'])");
    /* Nor can it give itself more. */
    DENIED(pc, "SELECT mq_grant('consume', current_user::regrole)");
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM mq_msgs WHERE deliveries = 0"), 1);
    done_role(pc, p);
}

static void test_consumer_has_no_table_rights(void)
{
    t_truncate();
    pqmq_client *c;
    PGconn *cc = as_role(cons, &c);
    /* Writing another channel's messages straight into the tables. */
    DENIED(cc, "INSERT INTO mq_msgs (id, channel_name) VALUES (gen_random_uuid(), 'theirs')");
    DENIED(cc, "INSERT INTO mq_payloads (id, name) VALUES (gen_random_uuid(), 'x')");
    DENIED(cc, "INSERT INTO mq_chains (channel_name, channel_args, tail_id) "
               "VALUES ('theirs', '', gen_random_uuid())");
    DENIED(cc, "SELECT payload_json FROM mq_payloads");
    DENIED(cc, "UPDATE mq_payloads SET payload_json = '{}'");
    /* mq_msgs is a view (TRUNCATE refuses it for every role): the property is
     * that a consumer may not empty the table behind it. */
    DENIED(cc, "TRUNCATE mq_rows");
    /* Nor produce or administer. */
    pqmq_msg *m[] = {t_msg("theirs", NULL, "n", "{}", 0)};
    CHECK_ERR(c, pqmq_insert(c, m, 1), PQMQ_ESERVER, "permission denied");
    t_msgs_free(m, 1);
    DENIED(cc, "SELECT mq_retry(ARRAY[gen_random_uuid()], 1)");
    DENIED(cc, "SELECT * FROM mq_stats(NULL)");
    DENIED(cc, "SELECT * FROM mq_dead_jobs(NULL, 10)");
    DENIED(cc, "SELECT mq_grant('administer', current_user::regrole)");
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM mq_msgs"), 0);
    done_role(cc, c);
}

static void test_admin_cannot_produce_or_read_tables(void)
{
    pqmq_client *a;
    PGconn *ac = as_role(adm, &a);
    pqmq_msg *m[] = {t_msg("x", NULL, "n", "{}", 0)};
    CHECK_ERR(a, pqmq_insert(a, m, 1), PQMQ_ESERVER, "permission denied");
    t_msgs_free(m, 1);
    DENIED(ac, "SELECT * FROM mq_payloads");
    DENIED(ac, "SELECT * FROM mq_poll_jobs(NULL, 10)");
    done_role(ac, a);
}

static void test_unknown_duty_and_revoke(void)
{
    CHECK_STR(sql_state(su, "SELECT mq_grant('drive', 'postgres')"), "22023");
    CHECK_STR(sql_state(su, "SELECT mq_grant(NULL, 'postgres')"), "22023");
    CHECK_INT(t_sql_int(su, "SELECT mq_grant('produce', '%s')", other), 7);
    CHECK_INT(t_sql_int(su,
                        "SELECT has_function_privilege('%s', 'mq_insert(mq_new_t[])', "
                        "'EXECUTE')::int",
                        other),
              1);
    CHECK_INT(t_sql_int(su, "SELECT mq_revoke('produce', '%s')", other), 7);
    CHECK_INT(t_sql_int(su,
                        "SELECT has_function_privilege('%s', 'mq_insert(mq_new_t[], int[])', "
                        "'EXECUTE')::int",
                        other),
              0);
    CHECK_INT(t_sql_int(su,
                        "SELECT has_function_privilege('%s', 'mq_insert(mq_new_t[])', "
                        "'EXECUTE')::int",
                        other),
              0);

    /* A function of two duties stays while the role holds the other one:
     * mq_schema_version (every duty's), which the pqmq command calls, and
     * mq_cron_slots (produce's and administer's). */
    const char *version = "SELECT has_function_privilege('%s', 'mq_schema_version()', "
                          "'EXECUTE')::int";
    t_exec(su, "SELECT mq_grant('produce', '%s'), mq_grant('administer', '%s')", other, other);
    CHECK_INT(t_sql_int(su, "SELECT mq_revoke('produce', '%s')", other), 5);
    CHECK_INT(t_sql_int(su, version, other), 1);
    CHECK_INT(t_sql_int(su, "SELECT mq_revoke('administer', '%s')", other), 23);
    CHECK_INT(t_sql_int(su, version, other), 0);
}

/* ---- escaping through search_path -------------------------------------- */

/* The consumer owns a schema and fills it with exact-type overloads of
 * built-ins and operators the functions use; each logs who ran it. With
 * that schema first on its path, it drives a whole consume cycle. */
static void test_shadowing_functions_in_own_schema_are_not_run(void)
{
    if (t_citus_skip("its hostile role cannot log in, and Citus creates the role's functions "
                     "on the workers as that role"))
        return;
    t_truncate();
    t_exec(su, "CREATE SCHEMA %s AUTHORIZATION %s", evil_schema, cons);
    pqmq_client *c;
    PGconn *cc = as_role(cons, &c);
    const char *e = evil_schema;
    t_exec(cc, "CREATE TABLE %s.hits (who text, what text)", e);
    t_exec(cc, "GRANT INSERT ON %s.hits TO PUBLIC", e);
    t_exec(cc,
           "CREATE FUNCTION %s.cardinality(uuid[]) RETURNS int LANGUAGE sql AS "
           "$$ INSERT INTO %s.hits VALUES (current_user, 'cardinality') RETURNING 0 $$",
           e, e);
    t_exec(cc,
           "CREATE FUNCTION %s.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS "
           "$$ INSERT INTO %s.hits VALUES (current_user, 'clock') RETURNING now() $$",
           e, e);
    t_exec(cc,
           "CREATE FUNCTION %s.hashtext(text) RETURNS int LANGUAGE sql AS "
           "$$ INSERT INTO %s.hits VALUES (current_user, 'hashtext') RETURNING 0 $$",
           e, e);
    t_exec(cc,
           "CREATE FUNCTION %s.uuid_eq_spy(uuid, uuid) RETURNS boolean LANGUAGE sql AS "
           "$$ INSERT INTO %s.hits VALUES (current_user, '=') RETURNING $1::text = $2::text $$",
           e, e);
    t_exec(cc,
           "CREATE OPERATOR %s.= (LEFTARG = uuid, RIGHTARG = uuid, "
           "FUNCTION = %s.uuid_eq_spy)",
           e, e);
    t_exec(cc, "SET search_path = %s, %s", e, t_schema());
    /* The shadows work in the caller's own statements ... */
    t_exec(cc, "SELECT cardinality(ARRAY[gen_random_uuid()])");
    CHECK_INT(t_sql_int(cc, "SELECT count(*) FROM %s.hits", e), 1);
    t_exec(cc, "DELETE FROM %s.hits", e);

    /* ... and never inside the queue's functions. */
    pqmq_msg *m[] = {t_msg("s", "a", "n", "{}", 1), t_msg("s", "a", "n", "{}", 1)};
    insert_as_owner(m, 2);
    pqmq_batch *b = NULL;
    CHECK_OK(c, pqmq_poll(c, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 1); /* ordered: one at a time */
    if (pqmq_batch_count(b) == 1) {
        uuid_t id;
        pqmq_job_id(pqmq_batch_job(b, 0), id);
        CHECK_OK(c, pqmq_keep_alive(c, (const uuid_t *)&id, 1, 60000, NULL));
    }
    pqmq_batch *next = NULL;
    CHECK_OK(c, pqmq_complete_and_poll(c, b, NULL, 0, 10, &next));
    CHECK_INT(pqmq_batch_count(next), 1);
    if (pqmq_batch_count(next) == 1) {
        uuid_t id;
        pqmq_job_id(pqmq_batch_job(next, 0), id);
        CHECK_OK(c, pqmq_fail(c, id, "x"));
    }
    pqmq_batch_free(b);
    pqmq_batch_free(next);
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM %s.hits", e), 0);
    /* The consumer stayed what it was. */
    CHECK_INT(t_sql_int(su, "SELECT rolsuper::int FROM pg_roles WHERE rolname = '%s'", cons),
              0);
    done_role(cc, c);
    t_exec(su, "DROP SCHEMA %s CASCADE", evil_schema);
}

/* A temporary table is searched before every schema unless pg_temp is on
 * the path: a caller's temporary mq_msgs must not stand in for the queue's
 * inside functions that run as the owner. */
static void test_temporary_tables_do_not_shadow_the_queue(void)
{
    t_truncate();
    uuid_t real;
    insert_one_as_owner("tt", "real", "{}", real);
    pqmq_client *c;
    PGconn *cc = as_role(cons, &c);
    t_exec(cc, "CREATE TEMP TABLE mq_msgs (id uuid, created_at timestamptz, "
               "attempt_at timestamptz, attempts int, retry_backoff interval, "
               "channel_name text, channel_args text, commit_interval interval, "
               "after_message_id uuid, deliveries int, dead_since timestamptz, "
               "channel_key bigint)");
    t_exec(cc, "CREATE TEMP TABLE mq_payloads (id uuid, name text, payload_json jsonb, "
               "payload_bytes bytea, last_error text)");
    t_exec(cc, "INSERT INTO mq_msgs VALUES ('00000000-0000-0000-0000-00000000f00d', now(), "
               "now() - interval '1 hour', 5, '1 s', 'tt', '', NULL, NULL, 0, NULL, "
               "(hashtext('tt')::bigint << 32) | (hashtext('')::bigint & 4294967295))");
    t_exec(cc, "INSERT INTO mq_payloads VALUES ('00000000-0000-0000-0000-00000000f00d', "
               "'fake', '{}', NULL, NULL)");
    /* The caller itself sees its own table ... */
    CHECK_INT(t_sql_int(cc, "SELECT count(*) FROM mq_msgs"), 1);
    /* ... the queue's functions see the queue's. */
    pqmq_batch *b = NULL;
    CHECK_OK(c, pqmq_poll(c, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    if (pqmq_batch_count(b) == 1)
        CHECK_STR(pqmq_job_name(pqmq_batch_job(b, 0)), "real");
    CHECK_OK(c, pqmq_complete_batch(c, b));
    pqmq_batch_free(b);
    CHECK_INT(t_sql_int(cc, "SELECT count(*) FROM mq_msgs WHERE deliveries = 0"), 1);
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM mq_msgs"), 0);
    done_role(cc, c);
}

/* A role that can create objects in the queue's schema could plant an
 * overload there that the owner's functions would run: no duty for it. */
static void test_grant_refuses_a_role_that_can_create_in_the_schema(void)
{
    t_exec(su, "GRANT CREATE ON SCHEMA %s TO %s", t_schema(), other);
    CHECK_STR(sql_state(su, "SELECT mq_grant('consume', 'postgres')"), "42501");
    char sql[200];
    snprintf(sql, sizeof sql, "SELECT mq_grant('consume', '%s')", other);
    CHECK_STR(sql_state(su, sql), "42501");
    t_exec(su, "REVOKE CREATE ON SCHEMA %s FROM %s", t_schema(), other);
    /* PUBLIC's CREATE counts for everyone. */
    t_exec(su, "GRANT CREATE ON SCHEMA %s TO PUBLIC", t_schema());
    CHECK_STR(sql_state(su, sql), "42501");
    t_exec(su, "REVOKE CREATE ON SCHEMA %s FROM PUBLIC", t_schema());
    CHECK_INT(t_sql_int(su, "SELECT mq_grant('consume', '%s')", other), 20);
    CHECK_INT(t_sql_int(su, "SELECT mq_revoke('consume', '%s')", other), 20);
}

/* mq_create_roles makes NOLOGIN group roles; a login role that is a member
 * works through them. */
static void test_group_roles(void)
{
    t_truncate();
    char prefix[64];
    snprintf(prefix, sizeof prefix, "t_roles_%ld_g", (long)getpid());
    PGresult *r =
        t_sql(su, "SELECT duty, role_name FROM mq_create_roles('%s') ORDER BY 1", prefix);
    CHECK(r && PQntuples(r) == 3);
    if (r && PQntuples(r) == 3) {
        CHECK_STR(PQgetvalue(r, 0, 0), "administer");
        CHECK(strstr(PQgetvalue(r, 2, 1), "_producer") != NULL);
    }
    PQclear(r);
    /* Twice is harmless. */
    PQclear(t_sql(su, "SELECT * FROM mq_create_roles('%s')", prefix));
    snprintf(member, sizeof member, "t_roles_%ld_member", (long)getpid());
    t_exec(su, "CREATE ROLE %s NOLOGIN", member);
    t_exec(su, "GRANT %s_consumer, %s_producer TO %s", prefix, prefix, member);
    pqmq_client *c;
    PGconn *cc = as_role(member, &c);
    pqmq_msg *m[] = {t_msg("g", NULL, "n", "{}", 0)};
    CHECK_OK(c, pqmq_insert(c, m, 1));
    t_msgs_free(m, 1);
    pqmq_batch *b = NULL;
    CHECK_OK(c, pqmq_poll(c, NULL, 0, 10, &b));
    CHECK_INT(pqmq_batch_count(b), 1);
    CHECK_OK(c, pqmq_complete_batch(c, b));
    pqmq_batch_free(b);
    DENIED(cc, "SELECT * FROM mq_payloads");
    DENIED(cc, "SELECT * FROM mq_stats(NULL)");
    done_role(cc, c);
    const char *sfx[] = {"producer", "consumer", "admin"};
    for (int i = 0; i < 3; i++)
        t_exec(su, "DROP OWNED BY %s_%s CASCADE; DROP ROLE %s_%s", prefix, sfx[i], prefix,
               sfx[i]);
}

/* The mq_payloads view's grants are what a write through it needs, as on
 * the seed's table: a role with DELETE on the view and no duty completes a
 * message through it (the chain moving up), one with SELECT only reads, and
 * INSERT stays refused without its grant. */
static void test_payloads_view_grants(void)
{
    if (t_citus_skip("a Citus coordinator refuses writes through the view (0A000)"))
        return;
    t_truncate();
    pqmq_msg *m[2] = {t_msg("v", "a", "first", "{}", 1), t_msg("v", "a", "second", "{}", 1)};
    uuid_t head, next;
    uuid_of(m[0], head);
    uuid_of(m[1], next);
    char h[37], n[37];
    uuid_unparse_lower(head, h);
    uuid_unparse_lower(next, n);
    insert_as_owner(m, 2);
    CHECK_INT(t_sql_int(su,
                        "SELECT has_function_privilege('%s', 'mq_complete(uuid[], int[])', "
                        "'EXECUTE')::int",
                        other),
              0);
    t_exec(su, "GRANT SELECT ON mq_payloads TO %s", other);
    pqmq_client *c;
    PGconn *oc = as_role(other, &c);
    CHECK_INT(t_sql_int(oc, "SELECT count(*) FROM mq_payloads WHERE id = '%s'", h), 1);
    DENIED(oc, "DELETE FROM mq_payloads");
    t_exec(su, "GRANT DELETE ON mq_payloads TO %s", other);
    PGresult *r = t_sql(oc, "DELETE FROM mq_payloads WHERE id = '%s' RETURNING name", h);
    CHECK(r && PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 0), "first"));
    PQclear(r);
    CHECK_INT(t_sql_int(su,
                        "SELECT count(*) FROM mq_msgs WHERE id = '%s' AND after_message_id = "
                        "'00000000-0000-0000-0000-000000000000'",
                        n),
              1);
    DENIED(oc, "INSERT INTO mq_payloads (id, name) VALUES (gen_random_uuid(), 'x')");
    DENIED(oc, "SELECT * FROM mq_msgs");
    done_role(oc, c);
    t_exec(su, "REVOKE ALL ON mq_payloads FROM %s", other);
}

/* The seed's mq_msgs is a view: its grants are the right to write through
 * it (as mq_payloads'), with no right on mq_rows or the log's tables. A
 * plain message lives in the log, an ordered one in mq_rows: both. */
static void test_msgs_view_grants(void)
{
    if (t_citus_skip("a Citus coordinator refuses writes through the view (0A000)"))
        return;
    t_truncate();
    pqmq_msg *m[1] = {t_msg("v", "a", "logged", "{}", 0)};
    pqmq_msg *o[1] = {t_msg("v", "a", "ordered", "{}", 1)};
    uuid_t lid, oid;
    uuid_of(m[0], lid);
    uuid_of(o[0], oid);
    char l[37], r[37];
    uuid_unparse_lower(lid, l);
    uuid_unparse_lower(oid, r);
    insert_as_owner(m, 1);
    insert_as_owner(o, 1);
    t_exec(su, "GRANT SELECT, UPDATE, DELETE ON mq_msgs TO %s", other);
    pqmq_client *c;
    PGconn *oc = as_role(other, &c);
    DENIED(oc, "SELECT count(*) FROM mq_rows");
    DENIED(oc, "SELECT count(*) FROM mq_log");
    CHECK_INT(t_sql_int(oc, "SELECT count(*) FROM mq_msgs WHERE id IN ('%s', '%s')", l, r), 2);
    t_exec(oc, "UPDATE mq_msgs SET name = 'renamed' WHERE id = '%s'", l);
    CHECK_INT(
        t_sql_int(su, "SELECT count(*) FROM mq_msgs WHERE id = '%s' AND name = 'renamed'", l),
        1);
    PGresult *res =
        t_sql(oc, "DELETE FROM mq_msgs WHERE id IN ('%s', '%s') RETURNING id", l, r);
    CHECK(res && PQntuples(res) == 2);
    PQclear(res);
    CHECK_INT(t_sql_int(su, "SELECT count(*) FROM mq_msgs WHERE id IN ('%s', '%s')", l, r), 0);
    done_role(oc, c);
    t_exec(su, "REVOKE ALL ON mq_msgs FROM %s", other);
}

/* schema/roles.sql's text, from $PQMQ_SCHEMA_DIR (make check sets it);
 * NULL when it cannot be read. Caller frees. */
static char *roles_migration(void)
{
    const char *dir = getenv("PQMQ_SCHEMA_DIR");
    char pattern[4200];
    snprintf(pattern, sizeof pattern, "%s/roles.sql", dir ? dir : "../schema");
    glob_t g;
    char *text = NULL;
    if (glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc == 1) {
        FILE *f = fopen(g.gl_pathv[0], "rb");
        size_t cap = 1 << 20, n = 0;
        text = f ? malloc(cap) : NULL;
        if (text)
            n = fread(text, 1, cap - 1, f);
        if (text)
            text[n] = '\0';
        if (f)
            fclose(f);
    }
    globfree(&g);
    return text;
}

/* A role that uses the queue through table rights gets every duty when
 * the schema's roles.sql is applied (again); one that can create in the
 * schema gets none (a warning says why). */
static void test_table_users_keep_working(void)
{
    if (t_citus_skip("it applies schema/roles.sql as one string, whose statements "
                     "a coordinator forwards unqualified"))
        return;
    char *sql = roles_migration();
    CHECK(sql != NULL);
    if (!sql)
        return;
    /* Table rights are those on mq_rows, the table the messages' rows are in
     * (renamed from mq_msgs, its grants kept). */
    t_exec(su, "GRANT SELECT, INSERT, UPDATE, DELETE ON mq_rows, mq_payloads, mq_chains TO %s",
           other);
    t_exec(su, "GRANT SELECT, UPDATE ON mq_rows TO %s", member);
    t_exec(su, "GRANT CREATE ON SCHEMA %s TO %s", t_schema(), member);
    CHECK_INT(t_sql_int(su,
                        "SELECT has_function_privilege('%s', 'mq_claim(text[], int)', "
                        "'EXECUTE')::int",
                        other),
              0);
    t_exec(su, "%s", sql); /* applying a schema file again is harmless */
    const char *fns[] = {"mq_insert(mq_new_t[])", "mq_claim(text[], int)", "mq_stats(text[])"};
    for (int i = 0; i < 3; i++) {
        CHECK_INT(t_sql_int(su, "SELECT has_function_privilege('%s', '%s', 'EXECUTE')::int",
                            other, fns[i]),
                  1);
        CHECK_INT(t_sql_int(su, "SELECT has_function_privilege('%s', '%s', 'EXECUTE')::int",
                            member, fns[i]),
                  0);
    }
    t_exec(su, "REVOKE CREATE ON SCHEMA %s FROM %s", t_schema(), member);
    t_exec(su, "REVOKE ALL ON mq_rows, mq_payloads, mq_chains FROM %s, %s", other, member);
    const char *duties[] = {"produce", "consume", "administer"};
    for (int i = 0; i < 3; i++)
        PQclear(t_sql(su, "SELECT mq_revoke('%s', '%s')", duties[i], other));
    free(sql);
}

int main(void)
{
    t_init("roles");
    setup();
    T_RUN(test_each_duty_end_to_end);
    T_RUN(test_producer_cannot_consume_read_or_administer);
    T_RUN(test_consumer_has_no_table_rights);
    T_RUN(test_admin_cannot_produce_or_read_tables);
    T_RUN(test_unknown_duty_and_revoke);
    T_RUN(test_shadowing_functions_in_own_schema_are_not_run);
    T_RUN(test_temporary_tables_do_not_shadow_the_queue);
    T_RUN(test_grant_refuses_a_role_that_can_create_in_the_schema);
    T_RUN(test_group_roles);
    T_RUN(test_payloads_view_grants);
    T_RUN(test_msgs_view_grants);
    T_RUN(test_table_users_keep_working);
    drop_roles();
    PQfinish(su);
    return t_done();
}
