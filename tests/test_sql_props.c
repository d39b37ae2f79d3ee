/*
 * test_sql_props.c: a property-based test of the SQL functions.
 *
 * Random operations (inserts of random batches of valid and invalid
 * messages, polls by two consumers, keep-alives, completions, failures and
 * releases with random intervals and random array shapes) against these
 * properties: every call either succeeds with its documented effect or fails
 * with a named error (SQLSTATE) and writes nothing; no message is ever
 * leased in the past; no message is held by two consumers at once; a
 * keep-alive never shortens a lease. Intervals carry month, day and negative
 * parts. PQMQ_PROP_SEED replays a run (the seed is printed).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* asprintf */
#endif
#include <stdlib.h>
#include <time.h>
#include <uuid/uuid.h>

#include "harness.h"

#define DAY_US 86400000000LL
#define CAP_US (36500000LL * DAY_US)

static PGconn *pg;
static uint64_t rng;

static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static long long between(long long lo, long long hi) /* inclusive */
{
    return lo + (long long)(next() % (uint64_t)(hi - lo + 1));
}
static int chance(int percent)
{
    return (int)(next() % 100) < percent;
}

/* ---- random intervals ---------------------------------------------------- */

typedef struct {
    int null;
    int months, days;
    long long us;
} ival;

static ival rand_ival(long long us_lo, long long us_hi)
{
    ival v = {0, 0, 0, 0};
    if (chance(8)) {
        v.null = 1;
        return v;
    }
    if (chance(25))
        v.months = (int)between(-2, 2);
    if (chance(25))
        v.days = (int)between(-40, 40);
    if (chance(3))
        v.days = 40000000; /* past the limit */
    v.us = between(us_lo, us_hi);
    return v;
}

/* Its length with 30-day months and 24-hour days: what pqmq means. */
static long long fixed_us(ival v)
{
    return ((long long)v.months * 30 + v.days) * DAY_US + v.us;
}

static void ival_text(ival v, char *buf, size_t n)
{
    if (v.null)
        snprintf(buf, n, "NULL");
    else
        snprintf(buf, n, "\"%d mons %d days %lld microseconds\"", v.months, v.days, v.us);
}

/* ---- the tables' state ------------------------------------------------- */

static char *fingerprint(void)
{
    PGresult *r =
        t_sql(pg, "SELECT md5(COALESCE((SELECT string_agg(m::text, ',' ORDER BY m.id) "
                  "FROM mq_msgs m), '') || COALESCE((SELECT string_agg(p::text, ',' "
                  "ORDER BY p.id) FROM mq_payloads p), '') || COALESCE((SELECT "
                  "string_agg(c::text, ',' ORDER BY c.tail_id) FROM mq_chains c), ''))");
    char *s = strdup(r && PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "?");
    PQclear(r);
    return s;
}

static const char *state(PGresult *r)
{
    ExecStatusType s = PQresultStatus(r);
    if (s == PGRES_TUPLES_OK || s == PGRES_COMMAND_OK)
        return "";
    const char *st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    return st ? st : "?";
}

static int failures;
#define PROP(cond, ...)                                                                        \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            failures++;                                                                        \
            t_fail(__FILE__, __LINE__, __VA_ARGS__);                                           \
        }                                                                                      \
    } while (0)

/* A failed call must name its error and change nothing. */
static void check_refused(const char *what, PGresult *r, const char *before, const char *want)
{
    const char *st = state(r);
    PROP(*st && strcmp(st, "?") != 0, "%s failed without a SQLSTATE", what);
    if (want)
        PROP(!strcmp(st, want), "%s: SQLSTATE %s, expected %s: %s", what, st, want,
             PQresultErrorMessage(r));
    char *after = fingerprint();
    PROP(!strcmp(before, after), "%s failed (%s) but changed the tables", what, st);
    free(after);
}

/* ---- holders ------------------------------------------------------------- */

#define MAXH 4096
static struct {
    char id[37];
    int holder; /* 0: none, 1 or 2 */
    int attempt;
    long long until; /* lease end, server microseconds since the epoch */
} held[MAXH];
static int nheld;

static int find(const char *id)
{
    for (int i = 0; i < nheld; i++)
        if (!strcmp(held[i].id, id))
            return i;
    return -1;
}

/* Reads attempt_at (µs since the epoch) of id; -1 when gone. */
static long long attempt_at(const char *id)
{
    const char *v[1] = {id};
    PGresult *r = PQexecParams(pg,
                               "SELECT (extract(epoch FROM attempt_at) * 1000000)::bigint "
                               "FROM mq_msgs WHERE id = $1::uuid",
                               1, NULL, v, NULL, NULL, 0);
    long long at = PQntuples(r) == 1 ? atoll(PQgetvalue(r, 0, 0)) : -1;
    PQclear(r);
    return at;
}

/* ---- operations ---------------------------------------------------------- */

static int ninsert_ok, ninsert_bad, npolled, nkeep, ncomplete, nfail, nrelease;

static void escape_into(char *dst, size_t n, const char *s)
{
    size_t k = 0;
    dst[k++] = '"';
    for (; *s && k + 3 < n; s++) {
        if (*s == '"' || *s == '\\')
            dst[k++] = '\\';
        dst[k++] = *s;
    }
    dst[k++] = '"';
    dst[k] = 0;
}

/* A random interval; in a batch meant to be valid, one that is. */
static ival pick_ival(int valid, long long lo, long long hi)
{
    for (;;) {
        ival v = rand_ival(lo, hi);
        if (!valid || v.null || (fixed_us(v) >= 0 && fixed_us(v) <= CAP_US))
            return v;
    }
}

static void op_insert(void)
{
    int n = (int)between(1, 8);
    /* Most batches are meant to be valid; the rest get faults anywhere. */
    int valid = chance(60);
    char ids[8][37];
    ival delay[8], backoff[8], ci[8];
    int retries[8], ordered[8], bad = 0, bad_field = 0;
    const char *chans[] = {"", "a", "b", "c", NULL};
    const char *jsons[] = {"{\"k\": 1}", "[1, 2]", "not json", NULL, "{\"s\": \"\\\"q\\\"\"}"};
    char a_id[8 * 45] = "{", a_delay[8 * 64] = "{", a_retries[8 * 16] = "{",
                  a_backoff[8 * 64] = "{", a_chan[8 * 1100] = "{", a_ci[8 * 64] = "{",
                  a_ord[8 * 4] = "{", a_json[8 * 80] = "{";
    char *longname = malloc(1026);
    memset(longname, 'x', 1025);
    longname[1025] = 0;
    for (int i = 0; i < n; i++) {
        uuid_t u;
        uuid_generate_random(u);
        uuid_unparse_lower(u, ids[i]);
        int id_kind = !valid && chance(10) ? (int)between(1, 3) : 0; /* NULL, nil, dup */
        if (id_kind == 3 && i == 0)
            id_kind = 0;
        delay[i] = pick_ival(valid, -1000000, 300000);
        backoff[i] = pick_ival(valid, -100000, 400000);
        ci[i] = chance(70) ? (ival){1, 0, 0, 0} : pick_ival(valid, -100000, 200000);
        retries[i] = !valid && chance(10) ? -1 : (int)between(0, 3);
        ordered[i] = chance(50);
        int ch = (int)between(0, valid ? 3 : 4);
        const char *chan = !valid && chance(5) ? longname : chans[ch];
        int js = (int)between(0, 4);
        if (valid && js == 2)
            js = 0;
        /* What the batch should get. */
        if (id_kind == 1 || id_kind == 2 || !chan || strlen(chan) > 1024 || retries[i] < 0)
            bad_field = 1;
        ival *iv[3] = {&delay[i], &backoff[i], &ci[i]};
        for (int k = 0; k < 3; k++)
            if (!iv[k]->null && (fixed_us(*iv[k]) < 0 || fixed_us(*iv[k]) > CAP_US))
                bad_field = 1;
        if (id_kind == 3 || js == 2)
            bad = 1;
        char buf[1100];
        const char *sep = i ? "," : "";
        if (id_kind == 1)
            snprintf(buf, sizeof buf, "NULL");
        else if (id_kind == 2)
            snprintf(buf, sizeof buf, "00000000-0000-0000-0000-000000000000");
        else
            snprintf(buf, sizeof buf, "%s", id_kind == 3 ? ids[0] : ids[i]);
        if (id_kind == 3)
            snprintf(ids[i], sizeof ids[i], "%s", ids[0]);
        strcat(a_id, sep), strcat(a_id, buf);
        ival_text(delay[i], buf, sizeof buf);
        strcat(a_delay, sep), strcat(a_delay, buf);
        ival_text(backoff[i], buf, sizeof buf);
        strcat(a_backoff, sep), strcat(a_backoff, buf);
        ival_text(ci[i], buf, sizeof buf);
        strcat(a_ci, sep), strcat(a_ci, buf);
        if (retries[i] == 3 && chance(30))
            snprintf(buf, sizeof buf, "NULL"), retries[i] = 4; /* NULL: the default */
        else
            snprintf(buf, sizeof buf, "%d", retries[i]);
        strcat(a_retries, sep), strcat(a_retries, buf);
        if (chan)
            escape_into(buf, sizeof buf, chan);
        else
            snprintf(buf, sizeof buf, "NULL");
        strcat(a_chan, sep), strcat(a_chan, buf);
        strcat(a_ord, sep), strcat(a_ord, ordered[i] ? "t" : "f");
        if (jsons[js])
            escape_into(buf, sizeof buf, jsons[js]);
        else
            snprintf(buf, sizeof buf, "NULL");
        strcat(a_json, sep), strcat(a_json, buf);
    }
    free(longname);
    strcat(a_id, "}"), strcat(a_delay, "}"), strcat(a_retries, "}"), strcat(a_backoff, "}");
    strcat(a_chan, "}"), strcat(a_ci, "}"), strcat(a_ord, "}"), strcat(a_json, "}");
    const char *vals[8] = {a_id, a_delay, a_retries, a_backoff, a_chan, a_ci, a_ord, a_json};
    char *before = fingerprint();
    PGresult *r = PQexecParams(
        pg,
        "SELECT mq_insert(ARRAY(SELECT ROW(u.id, u.delay, u.retries, u.backoff, u.chan, '', "
        "u.ci, u.ord, 'prop', u.json, NULL)::mq_new_t FROM unnest($1::uuid[], "
        "$2::interval[], $3::int[], $4::interval[], $5::text[], $6::interval[], $7::bool[], "
        "$8::text[]) WITH ORDINALITY AS u(id, delay, retries, backoff, chan, ci, ord, json, o) "
        "ORDER BY u.o))",
        8, NULL, vals, NULL, NULL, 0);
    if (bad_field || bad) {
        ninsert_bad++;
        PROP(*state(r),
             "an invalid batch was accepted: ids %s delays %s backoffs %s ci %s "
             "retries %s",
             a_id, a_delay, a_backoff, a_ci, a_retries);
        if (*state(r))
            check_refused("mq_insert", r, before, bad_field ? "22023" : NULL);
    } else {
        ninsert_ok++;
        PROP(!*state(r), "a valid batch was refused: %s (delays %s backoffs %s ci %s)",
             PQresultErrorMessage(r), a_delay, a_backoff, a_ci);
        for (int i = 0; i < n && !*state(r); i++) {
            long long want_at =
                (delay[i].null ? 0 : fixed_us(delay[i])) + (ci[i].null ? 0 : fixed_us(ci[i]));
            long long want_backoff = backoff[i].null ? 1000000 : fixed_us(backoff[i]);
            const char *v[1] = {ids[i]};
            PGresult *m = PQexecParams(
                pg,
                "SELECT (extract(epoch FROM attempt_at - created_at) * 1000000)::bigint, "
                "(extract(epoch FROM retry_backoff) * 1000000)::bigint, attempts "
                "FROM mq_msgs WHERE id = $1::uuid",
                1, NULL, v, NULL, NULL, 0);
            PROP(PQntuples(m) == 1, "message %s missing after insert", ids[i]);
            if (PQntuples(m) == 1) {
                PROP(atoll(PQgetvalue(m, 0, 0)) == want_at,
                     "%s: attempt_at - created_at = %s "
                     "us, expected %lld",
                     ids[i], PQgetvalue(m, 0, 0), want_at);
                PROP(atoll(PQgetvalue(m, 0, 1)) == want_backoff,
                     "%s: backoff %s us, expected "
                     "%lld",
                     ids[i], PQgetvalue(m, 0, 1), want_backoff);
                PROP(atoi(PQgetvalue(m, 0, 2)) == retries[i] + 1,
                     "%s: attempts %s, expected %d", ids[i], PQgetvalue(m, 0, 2),
                     retries[i] + 1);
            }
            PQclear(m);
        }
    }
    free(before);
    PQclear(r);
}

static void op_poll(int who)
{
    char n[8];
    snprintf(n, sizeof n, "%d", (int)between(1, 10));
    const char *v[1] = {n};
    PGresult *r =
        PQexecParams(pg,
                     "SELECT id, (extract(epoch FROM retry_backoff) * 1000000)::bigint,"
                     " attempt FROM mq_poll_jobs(NULL, $1::int) WHERE id IS NOT NULL",
                     1, NULL, v, NULL, NULL, 0);
    PROP(!*state(r), "poll failed: %s", PQresultErrorMessage(r));
    for (int i = 0; !*state(r) && i < PQntuples(r); i++) {
        const char *id = PQgetvalue(r, i, 0);
        long long lease = atoll(PQgetvalue(r, i, 1));
        long long until = attempt_at(id);
        long long claimed = until - lease;
        npolled++;
        PROP(lease >= 0, "%s leased in the past (%lld us)", id, lease);
        int k = find(id);
        if (k >= 0 && held[k].holder)
            PROP(held[k].until <= claimed, "%s held by %d until %lld, claimed by %d at %lld",
                 id, held[k].holder, held[k].until, who, claimed);
        if (k < 0 && nheld < MAXH)
            k = nheld++;
        if (k >= 0) {
            snprintf(held[k].id, sizeof held[k].id, "%s", id);
            held[k].holder = who;
            held[k].attempt = atoi(PQgetvalue(r, i, 2));
            held[k].until = until;
        }
    }
    PQclear(r);
}

/* Up to 4 ids held by who, as array literals of ids and attempts. */
static int pick_held(int who, char *ids, char *attempts, int *idx)
{
    int n = 0;
    strcpy(ids, "{");
    strcpy(attempts, "{");
    for (int i = 0; i < nheld && n < 4; i++) {
        if (held[i].holder != who || chance(40))
            continue;
        char a[16];
        snprintf(a, sizeof a, "%d", held[i].attempt);
        strcat(ids, n ? "," : ""), strcat(ids, held[i].id);
        strcat(attempts, n ? "," : ""), strcat(attempts, a);
        idx[n++] = i;
    }
    strcat(ids, "}");
    strcat(attempts, "}");
    return n;
}

static void op_keep_alive(int who)
{
    char ids[4 * 40 + 4], attempts[64];
    int idx[4];
    int n = pick_held(who, ids, attempts, idx);
    ival d = rand_ival(-200000, 600000);
    char dur[80];
    ival_text(d, dur, sizeof dur);
    if (!d.null) /* without the array quotes */
        snprintf(dur, sizeof dur, "%d mons %d days %lld microseconds", d.months, d.days, d.us);
    long long before_at[4];
    for (int i = 0; i < n; i++)
        before_at[i] = attempt_at(held[idx[i]].id);
    char *before = fingerprint();
    const char *v[2] = {ids, d.null ? NULL : dur};
    PGresult *r = PQexecParams(pg, "SELECT mq_keep_alive($1::uuid[], $2::interval)", 2, NULL, v,
                               NULL, NULL, 0);
    nkeep++;
    if (d.null || fixed_us(d) < 0) {
        check_refused("mq_keep_alive", r, before, "22023");
    } else {
        PROP(!*state(r), "keep-alive %s refused: %s", dur, PQresultErrorMessage(r));
        for (int i = 0; i < n; i++) {
            long long at = attempt_at(held[idx[i]].id);
            PROP(at >= before_at[i], "keep-alive %s shortened %s's lease", dur,
                 held[idx[i]].id);
            held[idx[i]].until = at;
        }
    }
    free(before);
    PQclear(r);
}

static void op_complete(int who)
{
    char ids[4 * 40 + 4], attempts[64];
    int idx[4];
    int n = pick_held(who, ids, attempts, idx);
    int shape = (int)between(0, 5); /* 0-2 right, 3 short, 4 NULL inside, 5 no attempts */
    if (shape == 3 && n > 0)
        snprintf(attempts, sizeof attempts, "{}");
    if (shape == 4)
        snprintf(attempts, sizeof attempts, "{NULL}");
    char *before = fingerprint();
    const char *v[2] = {ids, shape == 5 ? NULL : attempts};
    PGresult *r = PQexecParams(pg, "SELECT mq_complete($1::uuid[], $2::int[])", 2, NULL, v,
                               NULL, NULL, 0);
    ncomplete++;
    if ((shape == 3 || shape == 4) && n > 0) {
        check_refused("mq_complete", r, before, "22023");
    } else {
        PROP(!*state(r), "mq_complete refused: %s", PQresultErrorMessage(r));
        for (int i = 0; i < n; i++)
            if (attempt_at(held[idx[i]].id) < 0)
                held[idx[i]].holder = 0;
    }
    free(before);
    PQclear(r);
}

static void op_fail_or_release(int who)
{
    char ids[4 * 40 + 4], attempts[64];
    int idx[4];
    int n = pick_held(who, ids, attempts, idx);
    char *before = fingerprint();
    PGresult *r;
    if (chance(50) && n > 0) {
        char a[16];
        snprintf(a, sizeof a, "%d", held[idx[0]].attempt);
        const char *v[2] = {held[idx[0]].id, a};
        r = PQexecParams(pg, "SELECT mq_fail($1::uuid, 'prop', $2::int)", 2, NULL, v, NULL,
                         NULL, 0);
        nfail++;
        PROP(!*state(r), "mq_fail refused: %s", PQresultErrorMessage(r));
        held[idx[0]].holder = 0; /* its lease ends with the failure */
    } else {
        int bad = chance(30);
        if (bad)
            snprintf(attempts, sizeof attempts, "{1,2,3,4,5}");
        const char *v[2] = {ids, attempts};
        r = PQexecParams(pg, "SELECT mq_release($1::uuid[], $2::int[])", 2, NULL, v, NULL, NULL,
                         0);
        nrelease++;
        if (bad && n != 5)
            check_refused("mq_release", r, before, "22023");
        else {
            PROP(!*state(r), "mq_release refused: %s", PQresultErrorMessage(r));
            for (int i = 0; i < n; i++)
                held[idx[i]].holder = 0;
        }
    }
    free(before);
    PQclear(r);
}

static void test_random_operations(void)
{
    t_truncate();
    const char *seed = getenv("PQMQ_PROP_SEED");
    rng = seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL) * 2654435761u + 1;
    if (!rng)
        rng = 1;
    printf("# PQMQ_PROP_SEED=%llu\n", (unsigned long long)rng);
    for (int step = 0; step < 600 && failures < 5; step++) {
        int who = (int)between(1, 2);
        int op = (int)between(0, 9);
        if (op < 3)
            op_insert();
        else if (op < 6)
            op_poll(who);
        else if (op < 7)
            op_keep_alive(who);
        else if (op < 8)
            op_complete(who);
        else if (op < 9)
            op_fail_or_release(who);
        else if (chance(30))
            t_sleep_ms(between(1, 60)); /* let short leases run out */
    }
    printf("# inserts %d ok / %d refused, %d deliveries, %d keep-alives, %d completions, "
           "%d failures, %d releases\n",
           ninsert_ok, ninsert_bad, npolled, nkeep, ncomplete, nfail, nrelease);
    CHECK(ninsert_ok > 10 && ninsert_bad > 10 && npolled > 10);
}

/* Fixed-length intervals: the sign a check sees is the sign the arithmetic
 * gives, and the length added is the length checked, on every date (two
 * daylight-saving zones, 1990 to 2100, month ends included). */
static void test_intervals_agree_on_every_date(void)
{
    const char *zones[] = {"America/New_York", "Europe/London", "Australia/Lord_Howe"};
    for (int z = 0; z < 3; z++) {
        t_exec(pg, "SET TimeZone = '%s'", zones[z]);
        CHECK_INT(
            t_sql_int(pg,
                      "SELECT count(*) FROM ("
                      " SELECT timestamptz '1990-01-31 00:30' + k * interval '37 hours 11 min'"
                      "        AS ts,"
                      "        make_interval(0, (k %% 5) - 2, 0, ((k * 7) %% 81) - 40,"
                      "                      0, 0, ((k * 7919) %% 200000) - 100000) AS x"
                      " FROM generate_series(0, 25000) AS k) s,"
                      " LATERAL (SELECT _mq_fixed_length(s.x) AS f) f "
                      "WHERE (f.f < interval '0') <> (s.ts + f.f < s.ts)"
                      "   OR (s.ts + f.f) - s.ts <> f.f"
                      "   OR f.f <> s.x"),
            0);
    }
    t_exec(pg, "RESET TimeZone");
}

int main(void)
{
    t_init("sql_props");
    pg = t_pg();
    T_RUN(test_intervals_agree_on_every_date);
    T_RUN(test_random_operations);
    PQfinish(pg);
    return t_done();
}
