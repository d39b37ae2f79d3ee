/* test_schedule.c: recurring messages: cron expressions (every field form),
 * slots across daylight-saving changes, runners sharing a schedule, and
 * backfill after a gap. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static pqmq_client *q;
static PGconn *pg;

/* A runner on this test's queue schema. */
static pqmq_runner *new_runner(void)
{
    char ci[1024];
    snprintf(ci, sizeof ci, "%s options='-c search_path=%s -c client_min_messages=warning'",
             t_dsn(), t_schema());
    return pqmq_runner_new(ci);
}

/* Unix ms of a UTC time written as SQL understands it. */
static int64_t at_ms(const char *utc)
{
    return t_sql_int(pg, "SELECT (extract(epoch FROM timestamptz '%s UTC') * 1000)::bigint",
                     utc);
}

/* The slots of cron in tz over (after, until], joined by spaces. */
static char *slots(const char *cron, const char *tz, const char *after, const char *until)
{
    static char out[4096];
    char **s = NULL;
    size_t n = 0;
    out[0] = 0;
    CHECK_OK(q, pqmq_cron_slots(q, cron, tz, at_ms(after), at_ms(until), &s, &n));
    for (size_t i = 0; i < n && strlen(out) + strlen(s[i]) + 2 < sizeof out; i++) {
        if (i)
            strcat(out, " ");
        strcat(out, s[i]);
    }
    pqmq_cron_slots_free(s, n);
    return out;
}

static void test_field_forms(void)
{
    /* Lists, ranges, steps, range steps, N/step. */
    CHECK_STR(slots("5,10 * * * *", NULL, "2026-01-01 00:00", "2026-01-01 00:30"),
              "2026-01-01T00:05 2026-01-01T00:10");
    CHECK_STR(slots("58-59,1 * * * *", NULL, "2026-01-01 00:57", "2026-01-01 01:02"),
              "2026-01-01T00:58 2026-01-01T00:59 2026-01-01T01:01");
    CHECK_STR(slots("*/20 * * * *", NULL, "2026-01-01 00:00", "2026-01-01 01:00"),
              "2026-01-01T00:20 2026-01-01T00:40 2026-01-01T01:00");
    CHECK_STR(slots("10-40/15 3 * * *", NULL, "2026-01-01 00:00", "2026-01-02 00:00"),
              "2026-01-01T03:10 2026-01-01T03:25 2026-01-01T03:40");
    CHECK_STR(slots("50/5 3 * * *", NULL, "2026-01-01 00:00", "2026-01-02 00:00"),
              "2026-01-01T03:50 2026-01-01T03:55");
    /* Names, any case; weekday 7 is Sunday; 2026-02-01 is a Sunday. */
    CHECK_STR(slots("0 12 * FEB sun", NULL, "2026-01-25 00:00", "2026-02-10 00:00"),
              "2026-02-01T12:00 2026-02-08T12:00");
    CHECK_STR(slots("0 12 * 2 7", NULL, "2026-01-25 00:00", "2026-02-10 00:00"),
              "2026-02-01T12:00 2026-02-08T12:00");
    CHECK_STR(slots("0 0 * * Mon-Wed", NULL, "2026-02-01 00:00", "2026-02-06 00:00"),
              "2026-02-02T00:00 2026-02-03T00:00 2026-02-04T00:00");
    /* Day of month and day of week both restricted: either matches. */
    CHECK_STR(slots("0 0 3 * fri", NULL, "2026-02-01 00:00", "2026-02-10 00:00"),
              "2026-02-03T00:00 2026-02-06T00:00");
    /* One restricted: that one alone (a '*' day field does not widen it). */
    CHECK_STR(slots("0 0 3 * *", NULL, "2026-02-01 00:00", "2026-02-10 00:00"),
              "2026-02-03T00:00");
    CHECK_STR(slots("0 0 * * fri", NULL, "2026-02-01 00:00", "2026-02-10 00:00"),
              "2026-02-06T00:00");
    /* Macros, and day 31 only in months that have it. */
    CHECK_STR(slots("@daily", NULL, "2026-01-01 00:00", "2026-01-03 00:00"),
              "2026-01-02T00:00 2026-01-03T00:00");
    CHECK_STR(slots("0 0 31 * *", NULL, "2026-01-30 00:00", "2026-02-28 00:00"),
              "2026-01-31T00:00");
    /* A named zone: 09:00 in Tokyo is 00:00 UTC. */
    CHECK_STR(slots("0 9 * * *", "Asia/Tokyo", "2026-01-01 23:00", "2026-01-02 01:00"),
              "2026-01-02T09:00");
}

/* Days as cronie and vixie cron match them: OR'ed only when neither day
 * field starts with '*'; a step after '*' restricts. 2026-02-01 is a
 * Sunday, 2026-06-01 a Monday. */
static void test_days_as_cronie(void)
{
    static const char *const table[][4] = {
        {"0 0 */2 * *", "2026-02-01 00:00", "2026-02-08 00:00",
         "2026-02-03T00:00 2026-02-05T00:00 2026-02-07T00:00"},
        {"0 0 */10 * mon", "2026-05-25 00:00", "2026-06-24 00:00", "2026-06-01T00:00"},
        {"0 0 */10 * 1-5", "2026-05-31 00:00", "2026-06-30 00:00",
         "2026-06-01T00:00 2026-06-11T00:00"},
        {"0 0 * * */2", "2026-02-01 00:00", "2026-02-08 00:00",
         "2026-02-03T00:00 2026-02-05T00:00 2026-02-07T00:00 2026-02-08T00:00"},
        {"0 0 15 * */3", "2026-02-01 00:00", "2026-03-01 00:00", "2026-02-15T00:00"},
        {"0 0 1-7 * mon", "2026-02-01 00:00", "2026-02-10 00:00",
         "2026-02-02T00:00 2026-02-03T00:00 2026-02-04T00:00 2026-02-05T00:00 "
         "2026-02-06T00:00 2026-02-07T00:00 2026-02-09T00:00"},
        {"0 0 1 * 7", "2026-02-01 00:00", "2026-03-01 00:00",
         "2026-02-08T00:00 2026-02-15T00:00 2026-02-22T00:00 2026-03-01T00:00"},
        {"0 0 */7 * */7", "2026-02-01 00:00", "2026-02-28 00:00",
         "2026-02-08T00:00 2026-02-15T00:00 2026-02-22T00:00"},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        const char *got = slots(table[i][0], NULL, table[i][1], table[i][2]);
        if (strcmp(got, table[i][3]) != 0)
            t_fail(__FILE__, __LINE__, "%s: \"%s\", expected \"%s\"", table[i][0], got,
                   table[i][3]);
    }
}

static void test_daylight_saving(void)
{
    /* New York springs forward on 2026-03-08: 02:00 EST becomes 03:00 EDT
     * (07:00 UTC). 02:30 never happens: it comes due right after the gap,
     * once, and the day's 03:30 as usual. */
    CHECK_STR(slots("30 2,3 * * *", "America/New_York", "2026-03-08 05:00", "2026-03-08 09:00"),
              "2026-03-08T02:30 2026-03-08T03:30");
    /* It falls back on 2026-11-01: 01:00-01:59 EDT happens, then again as
     * EST. 01:30 comes due once (at 05:30 UTC), not at 06:30 UTC too. */
    CHECK_STR(slots("30 1 * * *", "America/New_York", "2026-11-01 04:00", "2026-11-01 08:00"),
              "2026-11-01T01:30");
    /* ... also when an evaluation starts inside the repeated hour. */
    CHECK_STR(slots("30 1 * * *", "America/New_York", "2026-11-01 06:00", "2026-11-01 08:00"),
              "");
    /* Every 30 minutes across the fall back: each local time once. */
    CHECK_STR(slots("*/30 * * * *", "America/New_York", "2026-11-01 04:50", "2026-11-01 07:10"),
              "2026-11-01T01:00 2026-11-01T01:30 2026-11-01T02:00");
}

static void bad(const char *cron, const char *needle)
{
    char **s = NULL;
    size_t n = 0;
    CHECK_ERR(q, pqmq_cron_slots(q, cron, NULL, 0, 60000, &s, &n), PQMQ_EINVAL, needle);
    CHECK(s == NULL);
}

static void test_bad_expressions_name_the_field(void)
{
    bad("* * * *", "4 fields");
    bad("* * * * * *", "6 fields");
    bad("60 * * * *", "field 1 (minute): \"60\" is outside 0..59");
    bad("* 24 * * *", "field 2 (hour)");
    bad("* * 0 * *", "field 3 (day of month): \"0\" is outside 1..31");
    bad("* * * 13 *", "field 4 (month)");
    bad("* * * foo *", "field 4 (month): \"foo\" is not a value");
    bad("* * * * 8", "field 5 (day of week): \"8\" is outside 0..7");
    bad("* 5-2 * * *", "field 2 (hour): \"5-2\" runs backwards");
    bad("*/0 * * * *", "field 1 (minute): \"*/0\" has a bad step");
    bad("1,,2 * * * *", "field 1 (minute): an empty");
    bad("@often", "1 fields");
    /* The runner refuses it too, naming the schedule and the field. */
    pqmq_runner *r = new_runner();
    pqmq_msg *m = t_msg("sched", NULL, "tick", "{}", 0);
    CHECK_INT(pqmq_runner_schedule(r, "s1", "* * 32 * *", NULL, m, PQMQ_BACKFILL_ALL),
              PQMQ_EINVAL);
    CHECK(strstr(pqmq_runner_errmsg(r), "s1: cron: field 3 (day of month)") != NULL);
    pqmq_msg_free(m);
    pqmq_runner_free(r);
}

/* A payload that is not JSON is refused when the schedule is given, not
 * left to fail (or be skipped) when a slot comes due. */
static void test_bad_json_payload_is_refused(void)
{
    pqmq_runner *r = new_runner();
    pqmq_msg *m = t_msg("sched", NULL, "tick", "{\"a\": ", 0);
    CHECK_INT(pqmq_runner_schedule(r, "s-json", "* * * * *", NULL, m, PQMQ_BACKFILL_ALL),
              PQMQ_EINVAL);
    if (!strstr(pqmq_runner_errmsg(r), "s-json: payload is not valid JSON"))
        t_fail(__FILE__, __LINE__, "errmsg: %s", pqmq_runner_errmsg(r));
    pqmq_msg_free(m);
    pqmq_runner_free(r);

    /* Through SQL too, for a schedule first seen (no slot due yet). */
    PGresult *res =
        PQexec(pg, "SELECT mq_schedule('s-json-sql', 1, 16777215, 4294967294, 8190, "
                   "127, true, true, 'UTC', 'all', 'sched', 'tick', '{\"a\": ', "
                   "NULL, 3, interval '1 second')");
    const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    CHECK_INT(PQresultStatus(res), PGRES_FATAL_ERROR);
    CHECK_STR(state ? state : "", "22P02");
    if (!strstr(PQresultErrorMessage(res), "schedule 's-json-sql': payload is not valid JSON"))
        t_fail(__FILE__, __LINE__, "error: %s", PQresultErrorMessage(res));
    PQclear(res);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_schedules WHERE name = 's-json-sql'"), 0);
}

/* Runs mq_schedule as a runner would, with now moved by shifting the
 * schedule's memory (mq_schedules.last_slot) back instead. */
static int tick(const char *name, const char *backfill)
{
    return (int)t_sql_int(pg,
                          "SELECT mq_schedule('%s', 1, 16777215, 4294967294, 8190, 127, true, "
                          "true, 'UTC', '%s', 'sched', 'tick', '{\"a\": 1}', NULL, 3, "
                          "interval '1 second')",
                          name, backfill);
}

static void test_backfill_after_a_gap(void)
{
    t_truncate();
    t_exec(pg, "DELETE FROM mq_schedules");
    /* Minute 0 of every hour. First seen: starts now, nothing from before. */
    CHECK_INT(tick("hourly", "all"), 0);
    CHECK_INT(tick("hourly-latest", "latest"), 0);
    /* Down for five hours: five slots came due. (_mq_at: a form of the
     * update that a Citus coordinator can ship, schema/common.sql.) */
    t_exec(pg, "UPDATE mq_schedules SET last_slot = _mq_at(last_slot, - interval '5 hours')");
    CHECK_INT(tick("hourly", "all"), 5);
    CHECK_INT(tick("hourly-latest", "latest"), 1);
    CHECK_INT(tick("hourly", "all"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(DISTINCT payload_json->>'_slot') FROM mq_msgs"), 5);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE payload_json->>'a' = '1' "
                            "AND name = 'tick' AND channel_name = 'sched'"),
              6);
    /* A runner that lost its memory of the schedule does not insert a slot
     * twice: the slot's key decides (kept a day after completion). */
    t_exec(pg, "SELECT mq_complete(ARRAY(SELECT id FROM mq_msgs))");
    t_exec(pg, "UPDATE mq_schedules SET last_slot = _mq_at(last_slot, - interval '5 hours')");
    CHECK_INT(tick("hourly", "all"), 0);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
}

/* A gap longer than 31 days backfills the last 31 days only. */
static void test_backfill_stops_at_31_days(void)
{
    t_truncate();
    t_exec(pg, "DELETE FROM mq_schedules");
    CHECK_INT(tick("long", "all"), 0);
    t_exec(pg, "UPDATE mq_schedules SET last_slot = _mq_at(last_slot, - interval '960 hours')");
    CHECK_INT(tick("long", "all"), 31 * 24);
}

/* Two runners with the same schedule over several slots insert each slot
 * once. */
static int handled;
static pthread_mutex_t handled_lock = PTHREAD_MUTEX_INITIALIZER;

static int on_tick(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)ctx, (void)job, (void)arg;
    pthread_mutex_lock(&handled_lock);
    handled++;
    pthread_mutex_unlock(&handled_lock);
    return 0;
}

static void *run(void *arg)
{
    pqmq_runner_run(arg);
    return NULL;
}

static void test_two_runners_insert_each_slot_once(void)
{
    t_truncate();
    t_exec(pg, "DELETE FROM mq_schedules");
    /* Every minute; the schedule has been down for 10 minutes. */
    t_exec(pg, "INSERT INTO mq_schedules VALUES ('shared', date_trunc('minute', now()) - "
               "interval '10 minutes')");
    pqmq_runner *r[2];
    pthread_t th[2];
    pqmq_msg *m = t_msg("sched", NULL, "tick", "{}", 0);
    handled = 0;
    for (int i = 0; i < 2; i++) {
        r[i] = new_runner();
        CHECK_INT(pqmq_runner_handle(r[i], "tick", on_tick, NULL), 0);
        CHECK_INT(pqmq_runner_schedule(r[i], "shared", "* * * * *", "Europe/Paris", m,
                                       PQMQ_BACKFILL_ALL),
                  0);
        CHECK_INT(pthread_create(&th[i], NULL, run, r[i]), 0);
    }
    pqmq_msg_free(m);
    /* Each runner evaluates the schedule when it starts. */
    int64_t until = t_now_ms() + 30000;
    while (t_now_ms() < until) {
        pthread_mutex_lock(&handled_lock);
        int h = handled;
        pthread_mutex_unlock(&handled_lock);
        if (h >= 10)
            break;
        t_sleep_ms(50);
    }
    t_sleep_ms(300);
    for (int i = 0; i < 2; i++) {
        pqmq_runner_stop(r[i]);
        pthread_join(th[i], NULL);
        pqmq_runner_free(r[i]);
    }
    /* Ten slots came due (more when a minute turned meanwhile): each was
     * inserted and handled once. */
    long long slots_in = t_sql_int(pg, "SELECT count(*) FROM mq_keys WHERE unique_key LIKE "
                                       "'schedule:shared:%%'");
    if (handled < 10 || handled != slots_in)
        t_fail(__FILE__, __LINE__, "handled %d messages of %lld slots", handled, slots_in);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 0);
}

/* After its first evaluation a runner evaluates its schedules each minute:
 * a schedule first seen starts now, and the next minute's slot comes. */
static void test_runner_evaluates_each_minute(void)
{
    t_truncate();
    t_exec(pg, "DELETE FROM mq_schedules");
    pqmq_runner *r = new_runner();
    pqmq_msg *m = t_msg("sched", NULL, "tick", "{}", 0);
    CHECK_INT(pqmq_runner_handle(r, "tick", on_tick, NULL), 0);
    CHECK_INT(pqmq_runner_schedule(r, "minutely", "* * * * *", NULL, m, PQMQ_BACKFILL_ALL), 0);
    pqmq_msg_free(m);
    handled = 0;
    pthread_t th;
    CHECK_INT(pthread_create(&th, NULL, run, r), 0);
    int64_t until = t_now_ms() + 90000;
    int h = 0;
    while (h == 0 && t_now_ms() < until) {
        t_sleep_ms(200);
        pthread_mutex_lock(&handled_lock);
        h = handled;
        pthread_mutex_unlock(&handled_lock);
    }
    pqmq_runner_stop(r);
    pthread_join(th, NULL);
    pqmq_runner_free(r);
    CHECK(h >= 1);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_keys WHERE unique_key LIKE "
                            "'schedule:minutely:%%'"),
              h);
}

static void test_unknown_time_zone_fails_the_run(void)
{
    pqmq_runner *r = new_runner();
    pqmq_msg *m = t_msg("sched", NULL, "tick", "{}", 0);
    CHECK_INT(pqmq_runner_handle(r, "tick", on_tick, NULL), 0);
    CHECK_INT(pqmq_runner_schedule(r, "tz", "* * * * *", "Mars/Olympus", m, PQMQ_BACKFILL_ALL),
              0);
    pqmq_msg_free(m);
    CHECK(pqmq_runner_run(r) != 0);
    CHECK(strstr(pqmq_runner_errmsg(r), "schedule tz") != NULL);
    if (!strstr(pqmq_runner_errmsg(r), "Mars/Olympus"))
        t_fail(__FILE__, __LINE__, "errmsg: %s", pqmq_runner_errmsg(r));
    pqmq_runner_free(r);
}

int main(void)
{
    t_init("schedule");
    q = t_client();
    pg = t_pg();
    T_RUN(test_field_forms);
    T_RUN(test_days_as_cronie);
    T_RUN(test_daylight_saving);
    T_RUN(test_bad_expressions_name_the_field);
    T_RUN(test_bad_json_payload_is_refused);
    T_RUN(test_backfill_after_a_gap);
    T_RUN(test_backfill_stops_at_31_days);
    T_RUN(test_two_runners_insert_each_slot_once);
    T_RUN(test_runner_evaluates_each_minute);
    T_RUN(test_unknown_time_zone_fails_the_run);
    pqmq_client_free(q);
    PQfinish(pg);
    return t_done();
}
