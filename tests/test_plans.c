/*
 * test_plans.c: no plan of a hot statement reads a queue table (mq_rows,
 * mq_chains, the log's tables) or one of their indexes in full, whatever the last
 * ANALYZE saw. A queue's tables swing between empty and huge, so a generic
 * plan made after an ANALYZE of a nearly empty table must still probe by id
 * (issue 15: the claim and the completion became nested loops over a full
 * scan of mq_msgs_pkey, and stayed so until an ANALYZE saw a big table).
 *
 * How: auto_explain in the test's own session (notice level, JSON, nested
 * statements, generic plans) sends the plan of every statement the hot calls
 * run to the client, where a notice receiver keeps it with the name of the
 * call that ran it. Another connection loads the plans into temporary
 * tables and walks every node: a Seq Scan on a queue table, or an index scan
 * of one of their indexes with no Index Cond, fails the test, naming the
 * node, the statement and the function it is in. Checked in three states,
 * each after ANALYZE and in a new connection (no plan cached before the
 * ANALYZE survives): empty, 100,000 queued on 100 channels, drained
 * (one row left in the pages of the 100,000, vacuumed: what autovacuum finds
 * after a burst), and 20,000 queued on 1,000 ordered chains. The detector itself is checked
 * first on statements known to be bad.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strdup */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ---- capture: every plan auto_explain sends, with the call that ran it -- */

typedef struct {
    const char *call; /* an entry of calls[] */
    char *json;
} plan_t;

static plan_t *plans;
static size_t nplans, cap_plans;
static char **calls;
static size_t ncalls, cap_calls;
static const char *current_call; /* NULL: plans are not kept (set-up) */

static void *grow(void *p, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return p;
    *cap = *cap ? *cap * 2 : 64;
    p = realloc(p, *cap * size);
    if (!p)
        abort();
    return p;
}

static void on_notice(void *arg, const PGresult *r)
{
    (void)arg;
    const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    const char *json = msg && !strncmp(msg, "duration:", 9) ? strchr(msg, '{') : NULL;
    if (!json || !current_call)
        return;
    plans = grow(plans, &cap_plans, nplans, sizeof *plans);
    plans[nplans].call = current_call;
    plans[nplans].json = strdup(json);
    if (!plans[nplans].json)
        abort();
    nplans++;
}

/* From now on, plans belong to the call named label. */
static void begin_call(const char *label)
{
    calls = grow(calls, &cap_calls, ncalls, sizeof *calls);
    calls[ncalls] = strdup(label);
    if (!calls[ncalls])
        abort();
    current_call = calls[ncalls++];
}

/* With PQMQ_TEST_PLANS_DUMP=DIR, every plan of the state goes to
 * DIR/plans-STATE.txt, each after a line naming its call: for reading the
 * plans a failure names in full. */
static void dump_plans(const char *state)
{
    const char *dir = getenv("PQMQ_TEST_PLANS_DUMP");
    if (!dir || !*dir)
        return;
    char path[512];
    snprintf(path, sizeof path, "%s/plans-%s.txt", dir, state);
    for (char *c = strrchr(path, '/') + 1; *c; c++)
        if (*c == ' ')
            *c = '-';
    FILE *f = fopen(path, "w");
    if (!f) {
        t_fail(__FILE__, __LINE__, "cannot write %s", path);
        return;
    }
    for (size_t i = 0; i < nplans; i++)
        fprintf(f, "-- %zu: %s\n%s\n", i, plans[i].call, plans[i].json);
    fclose(f);
    printf("    %s: the plans are in %s\n", state, path);
}

static void forget_plans(void)
{
    for (size_t i = 0; i < nplans; i++)
        free(plans[i].json);
    for (size_t i = 0; i < ncalls; i++)
        free(calls[i]);
    nplans = ncalls = 0;
    current_call = NULL;
}

/* A new client whose session explains every statement it runs, nested ones
 * included, with generic plans (as a long-lived consumer gets them). */
static pqmq_client *explained_client(void)
{
    pqmq_client *c = t_client();
    PGconn *pg = pqmq_conn(c);
    PQsetNoticeReceiver(pg, on_notice, NULL);
    t_exec(pg, "LOAD 'auto_explain'");
    t_exec(pg, "SET auto_explain.log_min_duration = 0");
    t_exec(pg, "SET auto_explain.log_nested_statements = on");
    t_exec(pg, "SET auto_explain.log_level = notice");
    t_exec(pg, "SET auto_explain.log_format = json");
    t_exec(pg, "SET client_min_messages = notice");
    t_exec(pg, "SET plan_cache_mode = force_generic_plan");
    return c;
}

/* Runs sql (text parameters) as the call named label. Returns the result
 * (caller PQclear's) or NULL, which fails the check. */
static PGresult *sql_call(PGconn *pg, const char *label, const char *sql, int n,
                          const char *const *params)
{
    begin_call(label);
    PGresult *r = PQexecParams(pg, sql, n, NULL, params, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
        t_fail(__FILE__, __LINE__, "%s: %s\n      %s", label, sql, PQerrorMessage(pg));
        PQclear(r);
        return NULL;
    }
    return r;
}

/* ---- analysis: the plans in temporary tables, walked node by node ------- */

/* Tables of the queue (mq_msgs is a view over mq_rows and the log): by
 * name, so that partitions (mq_rows_...) count too. */
#define QUEUE_RELS_SQL                                                                         \
    "CREATE TEMP TABLE queue_rels AS"                                                          \
    " SELECT c.oid, c.relname::text AS name FROM pg_class c"                                   \
    " WHERE c.relnamespace = (SELECT n.oid FROM pg_namespace n"                                \
    "                         WHERE n.nspname = current_schema())"                             \
    "   AND c.relkind IN ('r', 'p') AND c.relname ~ "                                          \
    "'^mq_(rows|payloads|chains|log|cursors|receipts|done)'"
#define QUEUE_IDX_SQL                                                                          \
    "CREATE TEMP TABLE queue_idx AS"                                                           \
    " SELECT ci.relname::text AS name, r.name AS tab FROM pg_index i"                          \
    " JOIN queue_rels r ON r.oid = i.indrelid JOIN pg_class ci ON ci.oid = i.indexrelid"
/* Every node of every plan, with its parent (children cut) and its path. */
#define PLAN_NODES_SQL                                                                         \
    "CREATE TEMP VIEW plan_nodes AS"                                                           \
    " WITH RECURSIVE walk(i, node, parent, path) AS ("                                         \
    "   SELECT p.i, p.plan -> 'Plan', NULL::jsonb, p.plan -> 'Plan' ->> 'Node Type'"           \
    "   FROM plans p"                                                                          \
    "   UNION ALL"                                                                             \
    "   SELECT w.i, c.node, w.node - 'Plans', w.path || ' > ' || (c.node ->> 'Node Type')"     \
    "   FROM walk w CROSS JOIN LATERAL jsonb_array_elements(w.node -> 'Plans') AS c(node))"    \
    " SELECT w.i, w.node - 'Plans' AS node, w.parent, w.path FROM walk w"
/* The bad nodes, one row per statement and node: what, the path to it, the
 * function(s) whose text holds the statement, the calls that ran it, how
 * often, and the statement. A statement is found in a function by the
 * longest of a few prefixes of its text (PL/pgSQL blanks out SELECT's INTO),
 * also as PERFORM when it starts with SELECT (PL/pgSQL's rewrite of it). */
#define BAD_SQL                                                                                \
    "WITH bad AS ("                                                                            \
    "  SELECT x.i, x.path, format('%s%s%s: %s%s%s', x.node ->> 'Node Type',"                   \
    "    coalesce(' using ' || (x.node ->> 'Index Name'), ''),"                                \
    "    coalesce(' on ' || coalesce(x.node ->> 'Relation Name', qi.tab), ''),"                \
    "    CASE WHEN x.node ->> 'Node Type' IN ('Seq Scan', 'Sample Scan')"                      \
    "         THEN 'reads the whole table'"                                                    \
    "         ELSE 'no Index Cond, reads the whole index' END,"                                \
    "    coalesce(', filter ' || (x.node ->> 'Filter'), ''),"                                  \
    "    coalesce(', under ' || (x.parent ->> 'Node Type')"                                    \
    "             || coalesce(' with join filter ' || (x.parent ->> 'Join Filter'), ''), ''))" \
    "    AS what"                                                                              \
    "  FROM plan_nodes x LEFT JOIN queue_idx qi ON qi.name = x.node ->> 'Index Name'"          \
    "  WHERE (x.node ->> 'Node Type' IN ('Seq Scan', 'Sample Scan')"                           \
    "         AND x.node ->> 'Relation Name' IN (SELECT name FROM queue_rels))"                \
    "     OR (x.node ->> 'Node Type' IN ('Index Scan', 'Index Only Scan', 'Bitmap Index "      \
    "Scan')"                                                                                   \
    "         AND qi.name IS NOT NULL AND NOT x.node ? 'Index Cond')),"                        \
    " grouped AS ("                                                                            \
    "  SELECT p.plan ->> 'Query Text' AS qt, b.what, b.path,"                                  \
    "         string_agg(DISTINCT p.call, '; ') AS calls, count(*) AS times"                   \
    "  FROM bad b JOIN plans p USING (i) GROUP BY 1, 2, 3),"                                   \
    " texts AS ("                                                                              \
    "  SELECT g.*, regexp_replace(btrim(g.qt, E' \\t\\n'), '\\s+', ' ', 'g') AS flat"          \
    "  FROM grouped g),"                                                                       \
    " funcs AS (SELECT p.proname::text AS name,"                                               \
    "                  regexp_replace(p.prosrc, '\\s+', ' ', 'g') AS flat"                     \
    "           FROM pg_proc p WHERE p.pronamespace = (SELECT n.oid FROM pg_namespace n"       \
    "                                                  WHERE n.nspname = current_schema()))"   \
    " SELECT t.what, t.path,"                                                                  \
    "  coalesce((SELECT m.names"                                                               \
    "            FROM unnest(ARRAY[1000000, 400, 200, 100, 50, 20, 16]) AS l(k),"              \
    "            LATERAL (SELECT string_agg(f.name, ', ' ORDER BY f.name) AS names"            \
    "                     FROM funcs f, left(t.flat, l.k) AS h"                                \
    "                     WHERE strpos(f.flat, h) > 0"                                         \
    "                        OR (h LIKE 'SELECT %' AND"                                        \
    "                            strpos(f.flat, 'PERFORM ' || substr(h, 8)) > 0)) m"           \
    "            WHERE m.names IS NOT NULL ORDER BY l.k DESC LIMIT 1),"                        \
    "           '(no function: the statement the client sent)'),"                              \
    "  t.calls, t.times, t.flat"                                                               \
    " FROM texts t ORDER BY 3, 6, 1"

typedef struct {
    PGresult *bad;       /* BAD_SQL's rows */
    PGresult *uncovered; /* calls that ran no plan on a queue table */
    long long plans;     /* plans captured */
    long long on_queue;  /* plans with a node on a queue table */
    long long on_msgs;   /* plans with a node on mq_rows or mq_log (messages' tables) */
} verdict_t;

static void load_plans(PGconn *a)
{
    t_exec(a, "CREATE TEMP TABLE plans (i int PRIMARY KEY, call text NOT NULL,"
              " plan jsonb NOT NULL)");
    t_exec(a, "CREATE TEMP TABLE plan_calls (call text PRIMARY KEY)");
    t_exec(a, "BEGIN");
    for (size_t i = 0; i < nplans; i++) {
        char num[24];
        snprintf(num, sizeof num, "%zu", i);
        const char *p[3] = {num, plans[i].call, plans[i].json};
        PGresult *r = PQexecParams(a, "INSERT INTO plans VALUES ($1, $2, $3::jsonb)", 3, NULL,
                                   p, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            t_fail(__FILE__, __LINE__, "cannot keep a plan of %s: %s", plans[i].call,
                   PQerrorMessage(a));
        PQclear(r);
    }
    for (size_t i = 0; i < ncalls; i++) {
        const char *p[1] = {calls[i]};
        PQclear(PQexecParams(a, "INSERT INTO plan_calls VALUES ($1) ON CONFLICT DO NOTHING", 1,
                             NULL, p, NULL, NULL, 0));
    }
    t_exec(a, "COMMIT");
    t_exec(a, QUEUE_RELS_SQL);
    t_exec(a, QUEUE_IDX_SQL);
    t_exec(a, PLAN_NODES_SQL);
}

/* Judges the plans captured since forget_plans(). Caller frees with
 * verdict_free. */
static verdict_t judge(PGconn *a)
{
    verdict_t v = {0};
    load_plans(a);
    v.plans = t_sql_int(a, "SELECT count(*) FROM plans");
    v.on_queue =
        t_sql_int(a, "SELECT count(DISTINCT x.i) FROM plan_nodes x"
                     " WHERE x.node ->> 'Relation Name' IN (SELECT name FROM queue_rels)");
    v.on_msgs = t_sql_int(a, "SELECT count(DISTINCT x.i) FROM plan_nodes x"
                             " WHERE x.node ->> 'Relation Name' IN"
                             "   (SELECT name FROM queue_rels WHERE name ~ '^mq_(rows|log)'"
                             "    AND name <> 'mq_log_gone')");
    v.uncovered = t_sql(a, "SELECT c.call FROM plan_calls c WHERE NOT EXISTS ("
                           " SELECT 1 FROM plans p JOIN plan_nodes x USING (i)"
                           " WHERE p.call = c.call"
                           "   AND x.node ->> 'Relation Name' IN (SELECT name FROM queue_rels))"
                           " ORDER BY 1");
    /* (not through t_sql: the text holds format()'s % signs) */
    v.bad = PQexec(a, BAD_SQL);
    if (PQresultStatus(v.bad) != PGRES_TUPLES_OK) {
        t_fail(__FILE__, __LINE__, "the plan check failed: %s", PQerrorMessage(a));
        PQclear(v.bad);
        v.bad = NULL;
    }
    return v;
}

static void verdict_free(verdict_t *v)
{
    PQclear(v->bad);
    PQclear(v->uncovered);
}

/* 1 when some bad node was found in a statement run by the call label. */
static int flagged(const verdict_t *v, const char *label)
{
    for (int i = 0; v->bad && i < PQntuples(v->bad); i++) {
        const char *cs = PQgetvalue(v->bad, i, 3);
        for (const char *s = strstr(cs, label); s; s = strstr(s + 1, label)) {
            size_t n = strlen(label);
            if ((s == cs || s[-1] == ' ') && (s[n] == '\0' || s[n] == ';'))
                return 1;
        }
    }
    return 0;
}

/* ---- the workload: every hot call, through the C API and through SQL --- */

static void ids_text(const uuid_t *ids, size_t n, char *out)
{
    char *p = out;
    *p++ = '{';
    for (size_t i = 0; i < n; i++) {
        if (i)
            *p++ = ',';
        uuid_unparse_lower(ids[i], p);
        p += 36;
    }
    *p++ = '}';
    *p = '\0';
}

/* Leases of a minute: everything the workload holds stays held until it
 * settles it, on a slow machine too (so each statement runs in full). */
#define LEASE_MS 60000

static void api_insert(pqmq_client *q, const char *label, const char *ch, const char *args,
                       size_t n, int ordered, int64_t commit_ms, uuid_t *ids)
{
    pqmq_msg *msgs[16];
    for (size_t i = 0; i < n; i++) {
        msgs[i] = t_msg(ch, args, "job", "{\"n\": 1}", ordered);
        pqmq_msg_set_backoff(msgs[i], LEASE_MS);
        if (commit_ms >= 0)
            pqmq_msg_set_commit_interval(msgs[i], commit_ms);
        if (ids)
            pqmq_msg_id(msgs[i], ids[i]);
    }
    begin_call(label);
    CHECK_OK(q, pqmq_insert(q, msgs, n));
    t_msgs_free(msgs, n);
}

/* n messages of priorities 1..n on ch: the urgent index's statements. */
static void api_insert_urgent(pqmq_client *q, const char *ch, size_t n)
{
    pqmq_msg *msgs[16];
    for (size_t i = 0; i < n; i++) {
        msgs[i] = t_msg(ch, NULL, "job", "{\"n\": 1}", 0);
        pqmq_msg_set_backoff(msgs[i], LEASE_MS);
        pqmq_msg_set_priority(msgs[i], (int)i + 1);
    }
    begin_call("pqmq_insert (priorities)");
    CHECK_OK(q, pqmq_insert(q, msgs, n));
    t_msgs_free(msgs, n);
}

/* One claiming call, pqmq_poll or pqmq_poll_locked, counted under label. */
typedef int (*poll_call)(pqmq_client *, const char *const *, size_t, int, pqmq_batch **);
static pqmq_batch *api_poll(pqmq_client *q, poll_call call, const char *label, const char *ch,
                            int max)
{
    pqmq_batch *b = NULL;
    const char *chans[1] = {ch};
    begin_call(label);
    CHECK_OK(q, call(q, ch ? chans : NULL, ch ? 1 : 0, max, &b));
    return b;
}

/* Appends the ids of b's jobs to ids (room for max). */
static void collect(const pqmq_batch *b, uuid_t *ids, size_t *n, size_t max)
{
    for (size_t i = 0; b && i < pqmq_batch_count(b) && *n < max; i++)
        pqmq_job_id(pqmq_batch_job(b, i), ids[(*n)++]);
}

/* Holds a row lock on every message of mq_rows, on every channel's log
 * cursor and on every receipt in another transaction, so that a poll of
 * either lane finds nothing it may claim and takes its idle path (mq_msgs is
 * a view, which cannot be locked: this checks the property "every message is
 * held by another session" on the tables behind it). A claim skips locked
 * cursors; a receipt's lock keeps a poll from handing back what it holds (a
 * locked-lane receipt whose transaction committed, a lapsed lease) as new,
 * unlocked rows of mq_rows. The locker ends with unlock_everything. */
static void lock_everything(PGconn *locker)
{
    t_exec(locker, "BEGIN");
    t_exec(locker, "SELECT count(*) FROM (SELECT m.id FROM mq_rows m FOR NO KEY UPDATE) s");
    t_exec(locker, "SELECT count(*) FROM (SELECT 1 FROM mq_cursors c FOR NO KEY UPDATE) s");
    t_exec(locker, "SELECT count(*) FROM (SELECT 1 FROM mq_receipts r FOR KEY SHARE) s");
}

/* Commits, not rolls back: a cursor whose last locker aborted reads as a
 * locked delivery that died, which the locked lane passes by (for good: the
 * cursor outlives its messages), and the next state polls those channels
 * with the locked lane. */
static void unlock_everything(PGconn *locker)
{
    t_exec(locker, "COMMIT");
}

static void api_workload(pqmq_client *q, PGconn *locker)
{
    uuid_t pending[4], held[64];
    size_t nheld = 0;
    api_insert(q, "pqmq_insert", "api", NULL, 10, 0, -1, NULL);
    api_insert(q, "pqmq_insert (ordered, new chain)", "api-ord", "a", 3, 1, -1, NULL);
    api_insert(q, "pqmq_insert (ordered, onto a chain)", "api-ord", "a", 3, 1, -1, NULL);
    api_insert(q, "pqmq_insert (ordered, new chain)", "api-ord", "b", 3, 1, -1, NULL);
    api_insert(q, "pqmq_insert (two-phase)", "api-2pc", NULL, 4, 0, 3600000, pending);
    begin_call("pqmq_commit");
    CHECK_OK(q, pqmq_commit(q, pending, 4));
    api_insert_urgent(q, "api-pr", 4);

    pqmq_batch *urgent =
        api_poll(q, pqmq_poll, "pqmq_poll (one channel, priorities)", "api-pr", 2);
    CHECK(pqmq_batch_count(urgent) == 2);
    collect(urgent, held, &nheld, 64);
    pqmq_batch_free(urgent);
    pqmq_batch *named = api_poll(q, pqmq_poll, "pqmq_poll (one channel)", "api", 5);
    pqmq_batch *heads = api_poll(q, pqmq_poll, "pqmq_poll (ordered channel)", "api-ord", 10);
    pqmq_batch *any = api_poll(q, pqmq_poll, "pqmq_poll (all channels)", NULL, 10);
    CHECK(pqmq_batch_count(named) == 5);
    CHECK(pqmq_batch_count(heads) == 2);
    CHECK(pqmq_batch_count(any) > 0);
    collect(named, held, &nheld, 64);
    collect(heads, held, &nheld, 64);
    collect(any, held, &nheld, 64);
    begin_call("pqmq_keep_alive");
    CHECK_OK(q, pqmq_keep_alive(q, held, nheld, LEASE_MS, NULL));

    uuid_t id0, id1;
    pqmq_job_id(pqmq_batch_job(named, 0), id0);
    pqmq_job_id(pqmq_batch_job(named, 1), id1);
    begin_call("pqmq_checkpoint");
    CHECK_OK(q, pqmq_checkpoint(q, id0, LEASE_MS, "{\"step\": 2}", NULL, 0, 1));
    begin_call("pqmq_fail");
    CHECK_OK(q, pqmq_fail(q, id1, "boom"));
    begin_call("pqmq_complete_batch");
    CHECK_OK(q, pqmq_complete_batch(q, any));
    nheld = 0;
    collect(named, held, &nheld, 64);
    begin_call("pqmq_complete");
    CHECK_OK(q, pqmq_complete(q, held, nheld));

    /* Completing chain heads makes their successors heads. */
    pqmq_batch *next = NULL, *last = NULL;
    begin_call("pqmq_complete_and_poll (ordered channel)");
    const char *ord[1] = {"api-ord"};
    CHECK_OK(q, pqmq_complete_and_poll(q, heads, ord, 1, 10, &next));
    CHECK(next && pqmq_batch_count(next) > 0);
    begin_call("pqmq_complete_and_poll (all channels)");
    CHECK_OK(q, pqmq_complete_and_poll(q, next, NULL, 0, 10, &last));
    begin_call("pqmq_complete_batch");
    CHECK_OK(q, pqmq_complete_batch(q, last));

    /* The locked lane: claim, fail one and complete the others in one
     * transaction. */
    api_insert(q, "pqmq_insert", "api-lk", NULL, 6, 0, -1, NULL);
    t_exec(pqmq_conn(q), "BEGIN");
    pqmq_batch *lk_one =
        api_poll(q, pqmq_poll_locked, "pqmq_poll_locked (one channel)", "api-lk", 3);
    pqmq_batch *lk_all =
        api_poll(q, pqmq_poll_locked, "pqmq_poll_locked (all channels)", NULL, 10);
    CHECK(pqmq_batch_count(lk_one) == 3);
    CHECK(pqmq_batch_count(lk_all) >= 3); /* none of lk_one's again */
    pqmq_job_id(pqmq_batch_job(lk_one, 0), id0);
    begin_call("pqmq_fail (locked)");
    CHECK_OK(q, pqmq_fail(q, id0, "boom"));
    begin_call("pqmq_complete_batch (locked)");
    CHECK_OK(q, pqmq_complete_batch(q, lk_all));
    t_exec(pqmq_conn(q), "COMMIT");
    pqmq_batch_free(lk_one);
    pqmq_batch_free(lk_all);

    lock_everything(locker);
    t_exec(pqmq_conn(q), "BEGIN");
    pqmq_batch *lk_idle = api_poll(
        q, pqmq_poll_locked, "pqmq_poll_locked (all channels, nothing claimable)", NULL, 10);
    t_exec(pqmq_conn(q), "COMMIT");
    CHECK(pqmq_batch_count(lk_idle) == 0);
    pqmq_batch_free(lk_idle);
    pqmq_batch *idle =
        api_poll(q, pqmq_poll, "pqmq_poll (all channels, nothing claimable)", NULL, 10);
    pqmq_batch *none =
        api_poll(q, pqmq_poll, "pqmq_poll (one channel, nothing claimable)", "api", 10);
    unlock_everything(locker);
    CHECK(pqmq_batch_count(idle) == 0);
    CHECK(pqmq_batch_count(none) == 0);

    pqmq_batch *batches[] = {named, heads, any, next, last, idle, none};
    for (size_t i = 0; i < sizeof batches / sizeof *batches; i++)
        pqmq_batch_free(batches[i]);
}

/* The ids and attempts of the jobs a SQL call returned (columns 0 and 1 of
 * its only row: array_agg(...)::text), or NULL when it returned none. */
typedef struct {
    char *ids, *attempts;
} jobs_t;

static jobs_t jobs_of(PGresult *r, const char *label)
{
    jobs_t j = {NULL, NULL};
    if (r && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0)) {
        j.ids = strdup(PQgetvalue(r, 0, 0));
        j.attempts = strdup(PQgetvalue(r, 0, 1));
    } else {
        t_fail(__FILE__, __LINE__, "%s returned no job", label);
    }
    PQclear(r);
    return j;
}

static void jobs_free(jobs_t *j)
{
    free(j->ids);
    free(j->attempts);
}

#define JOBS_OF(fn) "SELECT array_agg(j.id)::text, array_agg(j.attempt)::text FROM " fn " j"
#define NEW_MSGS(ch, args, ordered, commit)                                                    \
    "SELECT mq_insert(ARRAY(SELECT ROW(u.id, NULL, 4, interval '1 minute', '" ch "', '" args   \
    "', " commit ", " ordered ", 'job', '{\"n\": 1}', NULL)::mq_new_t"                         \
    " FROM unnest($1::uuid[]) WITH ORDINALITY AS u(id, o) ORDER BY u.o))"

static void sql_insert(PGconn *pg, const char *label, const char *sql, uuid_t *ids, size_t n)
{
    char text[16 * 38 + 4];
    for (size_t i = 0; i < n; i++)
        pqmq_uuid_generate(ids[i]);
    ids_text(ids, n, text);
    const char *p[1] = {text};
    PQclear(sql_call(pg, label, sql, 1, p));
}

/* Runs sql with one parameter: the array of the given ids. */
static void sql_ids(PGconn *pg, const char *label, const char *sql, const uuid_t *ids, size_t n)
{
    char text[16 * 38 + 4];
    ids_text(ids, n, text);
    const char *p[1] = {text};
    PQclear(sql_call(pg, label, sql, 1, p));
}

static void sql_workload(PGconn *pg, PGconn *locker)
{
    uuid_t plain[10], o1[3], o2[3], p2[3], one[1];
    sql_insert(pg, "mq_insert", NEW_MSGS("sql", "", "false", "NULL"), plain, 10);
    sql_insert(pg, "mq_insert (ordered, new chain)", NEW_MSGS("sql-ord", "a", "true", "NULL"),
               o1, 3);
    sql_insert(pg, "mq_insert (ordered, onto a chain)",
               NEW_MSGS("sql-ord", "a", "true", "NULL"), o2, 3);
    sql_insert(pg, "mq_insert (two-phase)",
               NEW_MSGS("sql-2pc", "", "false", "interval '1 hour'"), p2, 3);
    sql_insert(pg, "mq_insert (ordered, new chain)", NEW_MSGS("sql-one", "", "true", "NULL"),
               one, 1);
    sql_ids(pg, "mq_commit", "SELECT mq_commit($1::uuid[])", p2, 3);
    sql_ids(pg, "mq_delete", "SELECT mq_delete($1::uuid[])", p2, 2);
    /* A chain's tail, a chain's middle, a chain's only member. */
    sql_ids(pg, "mq_delete (ordered)", "SELECT mq_delete($1::uuid[])", &o2[2], 1);
    sql_ids(pg, "mq_delete (ordered)", "SELECT mq_delete($1::uuid[])", &o1[1], 1);
    sql_ids(pg, "mq_delete (ordered)", "SELECT mq_delete($1::uuid[])", one, 1);

    jobs_t c1 = jobs_of(sql_call(pg, "mq_claim (one channel)",
                                 JOBS_OF("mq_claim(ARRAY['sql'], 4)") " WHERE j.id IS NOT NULL",
                                 0, NULL),
                        "mq_claim");
    jobs_t c2 = jobs_of(sql_call(pg, "mq_poll_jobs (one channel)",
                                 JOBS_OF("mq_poll_jobs(ARRAY['sql'], 3)") " WHERE j.id IS NOT "
                                                                          "NULL",
                                 0, NULL),
                        "mq_poll_jobs");
    jobs_t c3 = jobs_of(sql_call(pg, "mq_claim (one channel)",
                                 JOBS_OF("mq_claim(ARRAY['sql'], 2)") " WHERE j.id IS NOT NULL",
                                 0, NULL),
                        "mq_claim");
    const char *p3[2] = {c3.ids, c3.attempts};
    jobs_t c4 = jobs_of(sql_call(pg, "mq_complete_claim (ordered channel)",
                                 "SELECT array_agg((c.job).id)::text,"
                                 " array_agg((c.job).attempt)::text"
                                 " FROM mq_complete_claim($1::uuid[], $2::int[],"
                                 "                        ARRAY['sql-ord'], 5) c"
                                 " WHERE (c.job).id IS NOT NULL",
                                 2, p3),
                        "mq_complete_claim");
    PQclear(sql_call(pg, "mq_poll (all channels)", "SELECT count(*) FROM mq_poll(NULL, 2)", 0,
                     NULL));
    PQclear(sql_call(pg, "mq_claim (all channels)", "SELECT count(*) FROM mq_claim(NULL, 3)", 0,
                     NULL));
    PQclear(sql_call(pg, "mq_complete_poll (all channels)",
                     "SELECT count(*) FROM mq_complete_poll('{}', '{}', NULL, 2)", 0, NULL));

    const char *p1[2] = {c1.ids, c1.attempts};
    PQclear(sql_call(pg, "mq_keep_alive",
                     "SELECT mq_keep_alive($1::uuid[], interval '1 minute')", 1, p1));
    PQclear(sql_call(pg, "mq_checkpoint",
                     "SELECT mq_checkpoint(($1::uuid[])[1], interval '1 minute',"
                     " '{\"step\": 2}', NULL, 1)",
                     1, p1));
    PQclear(sql_call(pg, "mq_fail", "SELECT mq_fail(($1::uuid[])[2], 'boom', ($2::int[])[2])",
                     2, p1));
    const char *p2a[2] = {c2.ids, c2.attempts};
    PQclear(sql_call(pg, "mq_release", "SELECT mq_release($1::uuid[], $2::int[])", 2, p2a));
    PQclear(sql_call(pg, "mq_complete", "SELECT mq_complete($1::uuid[], $2::int[])", 2, p1));
    const char *p4[2] = {c4.ids, c4.attempts};
    PQclear(sql_call(pg, "mq_complete (ordered)", "SELECT mq_complete($1::uuid[], $2::int[])",
                     2, p4));
    PQclear(sql_call(pg, "mq_complete (unfenced)", "SELECT mq_complete($1::uuid[])", 1, p3));

    lock_everything(locker);
    PQclear(sql_call(pg, "mq_claim (all channels, nothing claimable)",
                     "SELECT count(*) FROM mq_claim(NULL, 5)", 0, NULL));
    PQclear(sql_call(pg, "mq_claim (one channel, nothing claimable)",
                     "SELECT count(*) FROM mq_claim(ARRAY['sql'], 5)", 0, NULL));
    unlock_everything(locker);
    jobs_free(&c1);
    jobs_free(&c2);
    jobs_free(&c3);
    jobs_free(&c4);
}

/* ---- the states --------------------------------------------------------- */

/* ANALYZE every table of the queue's schema. */
#define ANALYZE_ALL                                                                            \
    "DO $$ DECLARE r record; BEGIN"                                                            \
    " FOR r IN SELECT c.relname FROM pg_class c"                                               \
    "   WHERE c.relnamespace = (SELECT n.oid FROM pg_namespace n"                              \
    "                           WHERE n.nspname = current_schema())"                           \
    "     AND c.relkind IN ('r', 'p') LOOP"                                                    \
    "   EXECUTE pg_catalog.format('ANALYZE %%I', r.relname);"                                  \
    " END LOOP; END $$"
/* n messages with time-ordered ids (as the library makes them) on 100
 * channels; one in ten ordered, in 100 chains. */
#define BACKLOG_SQL                                                                            \
    "SELECT mq_insert(ARRAY(SELECT ROW("                                                       \
    "  ('018f0000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, NULL, 4,"               \
    "  interval '1 second', 'ch' || lpad((g %% 100)::text, 2, '0'),"                           \
    "  CASE WHEN g %% 10 = 0 THEN 'k' || (g / 100 %% 10) ELSE '' END, NULL, g %% 10 = 0,"      \
    "  'job', '{\"n\": 1}', NULL)::mq_new_t"                                                   \
    " FROM generate_series(%d, %d) g))"
#define DELETE_ALL "DELETE FROM mq_msgs; DELETE FROM mq_chains"

/* Runs every hot call in a new explained session, then judges the plans:
 * each bad node is a failure naming what to fix. */
static void run_state(const char *state)
{
    PGconn *setup = t_pg();
    t_exec(setup, ANALYZE_ALL);
    PQfinish(setup);

    forget_plans();
    pqmq_client *q = explained_client();
    PGconn *locker = t_pg();
    api_workload(q, locker);
    sql_workload(pqmq_conn(q), locker);
    current_call = NULL;
    pqmq_client_free(q);
    PQfinish(locker);

    dump_plans(state);
    PGconn *a = t_pg();
    verdict_t v = judge(a);
    int nbad = v.bad ? PQntuples(v.bad) : 0;
    printf("    %s: %lld plans captured, %lld on queue tables (%lld on mq_msgs), %d bad\n",
           state, v.plans, v.on_queue, v.on_msgs, nbad);
    /* Not vacuous: the plans were captured, and every call ran some. */
    CHECK(v.on_msgs >= 40);
    for (int i = 0; v.uncovered && i < PQntuples(v.uncovered); i++)
        t_fail(__FILE__, __LINE__, "[%s] no plan on a queue table was captured for %s", state,
               PQgetvalue(v.uncovered, i, 0));
    for (int i = 0; i < nbad; i++)
        t_fail(__FILE__, __LINE__,
               "[%s] %s\n      plan: %s\n      in: %s\n      run by: %s (%s times)\n"
               "      statement: %s",
               state, PQgetvalue(v.bad, i, 0), PQgetvalue(v.bad, i, 1), PQgetvalue(v.bad, i, 2),
               PQgetvalue(v.bad, i, 3), PQgetvalue(v.bad, i, 4), PQgetvalue(v.bad, i, 5));
    verdict_free(&v);
    PQfinish(a);
    forget_plans();
}

/* The detector flags a full table scan, a full index scan and a bitmap scan
 * without an index condition, and passes a probe by id (on the table
 * mq_rows: one node each). */
static void test_detector_flags_bad_plans(void)
{
    t_truncate();
    forget_plans();
    pqmq_client *q = explained_client();
    PGconn *pg = pqmq_conn(q);
    t_exec(pg, "PREPARE by_text(text) AS SELECT * FROM mq_rows WHERE id::text = $1");
    PQclear(sql_call(pg, "self-check: seq scan", "EXECUTE by_text('x')", 0, NULL));
    t_exec(pg, "SET enable_seqscan = off");
    t_exec(pg, "SET enable_bitmapscan = off");
    t_exec(pg, "PREPARE id_by_text(text) AS SELECT id FROM mq_rows WHERE id::text = $1");
    PQclear(sql_call(pg, "self-check: full index scan", "EXECUTE id_by_text('x')", 0, NULL));
    t_exec(pg, "SET enable_bitmapscan = on");
    t_exec(pg, "SET enable_indexscan = off");
    PQclear(sql_call(pg, "self-check: bitmap scan without a condition",
                     "SELECT count(*) FROM mq_rows WHERE dead_since IS NOT NULL", 0, NULL));
    t_exec(pg, "RESET enable_seqscan");
    t_exec(pg, "RESET enable_bitmapscan");
    t_exec(pg, "RESET enable_indexscan");
    t_exec(pg, "PREPARE by_id(uuid) AS SELECT * FROM mq_rows WHERE id = $1");
    PQclear(sql_call(pg, "self-check: probe by id",
                     "EXECUTE by_id('00000000-0000-0000-0000-000000000001')", 0, NULL));
    current_call = NULL;
    pqmq_client_free(q);

    PGconn *a = t_pg();
    verdict_t v = judge(a);
    CHECK_INT(v.plans, 4);
    CHECK_INT(v.on_msgs, 4);
    CHECK(v.uncovered && PQntuples(v.uncovered) == 0);
    CHECK(flagged(&v, "self-check: seq scan"));
    CHECK(flagged(&v, "self-check: full index scan"));
    CHECK(flagged(&v, "self-check: bitmap scan without a condition"));
    CHECK(!flagged(&v, "self-check: probe by id"));
    CHECK(v.bad && PQntuples(v.bad) == 3);
    for (int i = 0; v.bad && i < PQntuples(v.bad); i++)
        printf("    self-check found: %s (%s)\n", PQgetvalue(v.bad, i, 0),
               PQgetvalue(v.bad, i, 3));
    verdict_free(&v);
    PQfinish(a);
    forget_plans();
}

/* Empty: a few rows inserted and deleted, then ANALYZE (reltuples 0). */
static void test_plans_after_analyze_of_empty_tables(void)
{
    t_truncate();
    PGconn *pg = t_pg();
    t_exec(pg, BACKLOG_SQL, 1, 200);
    t_exec(pg, DELETE_ALL);
    PQfinish(pg);
    run_state("empty");
}

/* 100,000 queued on 100 channels, then ANALYZE. */
static void test_plans_with_100k_queued(void)
{
    t_truncate();
    PGconn *pg = t_pg();
    for (int i = 0; i < 10; i++)
        t_exec(pg, BACKLOG_SQL, i * 10000 + 1, (i + 1) * 10000);
    CHECK(t_sql_int(pg, "SELECT count(*) FROM mq_msgs") >= 100000);
    PQfinish(pg);
    run_state("100k queued");
}

/* Drained: the 100,000 worked off but the newest message, then VACUUM and
 * ANALYZE, as autovacuum finds a queue after a burst: pages and index pages
 * kept (the newest row is on the last page), one row live. */
static void test_plans_after_drain(void)
{
    PGconn *pg = t_pg();
    t_exec(pg, "DELETE FROM mq_msgs WHERE id <> (SELECT m.id FROM mq_msgs m ORDER BY m.id DESC "
               "LIMIT 1)");
    t_exec(pg, "DELETE FROM mq_chains WHERE tail_id NOT IN (SELECT id FROM mq_msgs)");
    t_exec(pg, "VACUUM mq_rows, mq_log, mq_cursors, mq_receipts, mq_done, mq_log_gone, "
               "mq_chains");
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs"), 1);
    /* The pages of the 100,000 are kept (the log's are never deleted). */
    CHECK(t_sql_int(pg, "SELECT pg_relation_size('mq_rows') + pg_relation_size('mq_log')") >
          1000000);
    PQfinish(pg);
    run_state("drained");
}

/* Every message ordered: 20,000 on 1,000 chains (the bench's chains
 * phase), then ANALYZE: statistics that say every row is chained. */
static void test_plans_with_chains_queued(void)
{
    PGconn *pg = t_pg();
    /* Tables of just these rows (no pages left by the states before). */
    t_truncate();
    for (int i = 0; i < 2; i++)
        t_exec(pg,
               "SELECT mq_insert(ARRAY(SELECT ROW("
               "  ('018f0000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, NULL, 4,"
               "  interval '1 second', 'ordered', 'k' || (g %% 1000), NULL, true,"
               "  'job', '{\"n\": 1}', NULL)::mq_new_t"
               " FROM generate_series(%d, %d) g ORDER BY g))",
               i * 10000 + 1, (i + 1) * 10000);
    CHECK_INT(t_sql_int(pg, "SELECT count(*) FROM mq_msgs WHERE chain_seq IS NOT NULL"), 20000);
    PQfinish(pg);
    run_state("20,000 on chains");
}

int main(void)
{
    const char *pooled = getenv("PQMQ_TEST_POOLED");
    if (pooled && !strcmp(pooled, "1")) {
        printf("SKIP: auto_explain is loaded per session, which a pooler does not keep\n");
        return 77;
    }
    t_init("plans");
    /* Statistics change only when this test says ANALYZE. */
    PGconn *pg = t_pg();
    t_exec(pg, "DO $$ DECLARE r record; BEGIN"
               " FOR r IN SELECT c.relname FROM pg_class c"
               "   WHERE c.relnamespace = (SELECT n.oid FROM pg_namespace n"
               "                           WHERE n.nspname = current_schema())"
               "     AND c.relkind = 'r' LOOP"
               "   EXECUTE pg_catalog.format('ALTER TABLE %%I SET (autovacuum_enabled = off)',"
               "                             r.relname);"
               " END LOOP; END $$");
    PQfinish(pg);
    T_RUN(test_detector_flags_bad_plans);
    T_RUN(test_plans_after_analyze_of_empty_tables);
    T_RUN(test_plans_with_100k_queued);
    T_RUN(test_plans_after_drain);
    T_RUN(test_plans_with_chains_queued);
    forget_plans();
    free(plans);
    free(calls);
    return t_done();
}
