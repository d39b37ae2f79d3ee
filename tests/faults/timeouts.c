/*
 * tests/faults/timeouts.c: pqmq calls under a low statement_timeout and
 * lock_timeout fail with clear errors, write nothing half, and leave
 * nothing stuck claimed.
 *
 *   timeouts CONNINFO
 *
 * CONNINFO names a database whose search_path holds a migrated queue. A
 * second connection (the holder) takes the locks a call must wait for: a
 * chain's advisory lock (inserts and ordered completions take it), an
 * ACCESS EXCLUSIVE lock on mq_msgs (everything waits), or a row lock on a
 * claimed message. The client under test then runs with lock_timeout or
 * statement_timeout set and must get PQMQ_ESERVER with SQLSTATE 55P03 or
 * 57014 in pqmq_sqlstate() and in pqmq_errmsg(), promptly; afterwards the
 * same client, with the lock gone, must succeed and find every message
 * still claimable. Uses channels to_*; leaves none of its messages behind.
 * Prints one line per check and exits 0 when all pass, 1 otherwise.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pqmq.h>

static int failures, checks;

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static void check(int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    checks++;
    if (!ok)
        failures++;
}

/* Runs SQL on a plain connection; exits on failure (a broken harness). */
static void exec_or_die(PGconn *conn, const char *sql)
{
    PGresult *r = PQexec(conn, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        fprintf(stderr, "timeouts: %s: %s", sql, PQerrorMessage(conn));
        exit(1);
    }
    PQclear(r);
}

static long scalar(PGconn *conn, const char *sql)
{
    PGresult *r = PQexec(conn, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
        fprintf(stderr, "timeouts: %s: %s", sql, PQerrorMessage(conn));
        exit(1);
    }
    long v = atol(PQgetvalue(r, 0, 0));
    PQclear(r);
    return v;
}

static void set_timeouts(pqmq_client *c, int lock_ms, int stmt_ms)
{
    char sql[128];
    snprintf(sql, sizeof sql, "SET lock_timeout = %d; SET statement_timeout = %d", lock_ms,
             stmt_ms);
    exec_or_die(pqmq_conn(c), sql);
}

/* The failure a timed-out call must produce. */
static void expect_timeout(const char *what, pqmq_client *c, int rc, long ms, const char *state)
{
    char tag[32];
    snprintf(tag, sizeof tag, "SQLSTATE %s", state);
    int ok = rc == PQMQ_ESERVER && !strcmp(pqmq_sqlstate(c), state) &&
             strstr(pqmq_errmsg(c), tag) != NULL && ms < 3000 &&
             PQstatus(pqmq_conn(c)) == CONNECTION_OK;
    check(ok, "%s: %s (rc %d), sqlstate \"%s\", after %ld ms: %s", what, pqmq_strerror(rc), rc,
          pqmq_sqlstate(c), ms, pqmq_errmsg(c));
}

/* A list of ids as SQL: '{...}'::uuid[]. */
static void ids_sql(char *out, size_t size, pqmq_msg *const *msgs, int n)
{
    size_t used = (size_t)snprintf(out, size, "'{");
    for (int i = 0; i < n; i++) {
        uuid_t id;
        char text[37];
        pqmq_msg_id(msgs[i], id);
        uuid_unparse_lower(id, text);
        used += (size_t)snprintf(out + used, size - used, "%s%s", i ? "," : "", text);
    }
    snprintf(out + used, size - used, "}'::uuid[]");
}

static long count_ids(PGconn *conn, const char *table, const char *ids)
{
    char sql[1024];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM %s WHERE id = ANY (%s)", table, ids);
    return scalar(conn, sql);
}

/* Polls one job of channel; returns the batch (or NULL). */
static pqmq_batch *poll_one(pqmq_client *c, const char *channel)
{
    pqmq_batch *b = NULL;
    const char *chans[1] = {channel};
    int rc = pqmq_poll(c, chans, 1, 1, &b);
    if (rc != PQMQ_OK || pqmq_batch_count(b) != 1) {
        check(0, "poll %s: expected one job, got rc %d (%s), %zu jobs", channel, rc,
              pqmq_errmsg(c), pqmq_batch_count(b));
        pqmq_batch_free(b);
        return NULL;
    }
    return b;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: timeouts CONNINFO\n");
        return 2;
    }
    pqmq_client *c = NULL;
    if (pqmq_connect(argv[1], &c) != PQMQ_OK) {
        fprintf(stderr, "timeouts: %s\n", pqmq_errmsg(c));
        return 1;
    }
    PGconn *holder = PQconnectdb(argv[1]);
    if (PQstatus(holder) != CONNECTION_OK) {
        fprintf(stderr, "timeouts: holder: %s", PQerrorMessage(holder));
        return 1;
    }
    exec_or_die(holder, "SET application_name = 'fault_holder'");

    /* One batch: unordered to_loose, ordered heads of to_chain and to_other.
     * Leases of 10 s: nothing runs out during the test by itself. */
    const char *channels[3] = {"to_loose", "to_chain", "to_other"};
    pqmq_msg *msgs[3];
    for (int i = 0; i < 3; i++) {
        msgs[i] = pqmq_msg_new();
        if (!msgs[i] || pqmq_msg_set_channel(msgs[i], channels[i], "") ||
            pqmq_msg_set_name(msgs[i], "job") || pqmq_msg_set_json(msgs[i], "{\"seq\": 1}") ||
            pqmq_msg_set_ordered(msgs[i], i > 0) || pqmq_msg_set_backoff(msgs[i], 10000) ||
            pqmq_msg_set_retries(msgs[i], 5))
            return 1;
    }
    char ids[512];
    ids_sql(ids, sizeof ids, msgs, 3);
    long t0;
    int rc;

    /* 1. insert, to_chain's advisory lock held, lock_timeout. */
    exec_or_die(holder, "SELECT pg_advisory_lock(hashtext('to_chain'), hashtext(''))");
    set_timeouts(c, 200, 0);
    t0 = now_ms();
    rc = pqmq_insert(c, msgs, 3);
    expect_timeout("insert, chain locked, lock_timeout 200ms", c, rc, now_ms() - t0, "55P03");
    check(count_ids(holder, "mq_msgs", ids) + count_ids(holder, "mq_payloads", ids) == 0,
          "the refused batch left no rows (mq_msgs, mq_payloads)");

    /* 2. the same with statement_timeout (no lock_timeout). */
    set_timeouts(c, 0, 300);
    t0 = now_ms();
    rc = pqmq_insert(c, msgs, 3);
    expect_timeout("insert, chain locked, statement_timeout 300ms", c, rc, now_ms() - t0,
                   "57014");
    check(count_ids(holder, "mq_msgs", ids) + count_ids(holder, "mq_payloads", ids) == 0,
          "the refused batch left no rows (mq_msgs, mq_payloads)");
    exec_or_die(holder, "SELECT pg_advisory_unlock(hashtext('to_chain'), hashtext(''))");

    /* 3. without the lock the same client, timeouts still set, succeeds. */
    rc = pqmq_insert(c, msgs, 3);
    check(rc == PQMQ_OK && count_ids(holder, "mq_msgs", ids) == 3,
          "insert after the lock is released: rc %d (%s), %ld messages", rc, pqmq_errmsg(c),
          count_ids(holder, "mq_msgs", ids));

    /* 4. poll while mq_msgs is locked: lock_timeout, then statement_timeout. */
    exec_or_die(holder, "BEGIN; LOCK TABLE mq_msgs IN ACCESS EXCLUSIVE MODE");
    const char *all[3] = {"to_loose", "to_chain", "to_other"};
    pqmq_batch *b = NULL;
    set_timeouts(c, 200, 0);
    t0 = now_ms();
    rc = pqmq_poll(c, all, 3, 10, &b);
    expect_timeout("poll, mq_msgs locked, lock_timeout 200ms", c, rc, now_ms() - t0, "55P03");
    pqmq_batch_free(b);
    b = NULL;
    set_timeouts(c, 0, 300);
    t0 = now_ms();
    rc = pqmq_poll(c, all, 3, 10, &b);
    expect_timeout("poll, mq_msgs locked, statement_timeout 300ms", c, rc, now_ms() - t0,
                   "57014");
    pqmq_batch_free(b);
    b = NULL;
    exec_or_die(holder, "ROLLBACK");
    {
        char sql[1024];
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM mq_msgs WHERE id = ANY (%s) AND deliveries = 0", ids);
        long fresh = scalar(holder, sql);
        check(fresh == 3, "the timed-out polls claimed nothing: %ld of 3 never delivered",
              fresh);
    }

    /* 5. complete / fail / keep-alive of a claimed message whose row is locked. */
    set_timeouts(c, 200, 0);
    b = poll_one(c, "to_chain");
    if (b) {
        uuid_t id;
        char idt[37], sql[256];
        pqmq_job_id(pqmq_batch_job(b, 0), id);
        uuid_unparse_lower(id, idt);
        /* The claimed message's row locked by another session: an ordered
         * message is a row of mq_rows (mq_msgs is a view, not lockable). */
        snprintf(sql, sizeof sql, "BEGIN; SELECT 1 FROM mq_rows WHERE id = '%s' FOR UPDATE",
                 idt);
        exec_or_die(holder, sql);
        t0 = now_ms();
        rc = pqmq_complete_batch(c, b);
        expect_timeout("complete, row locked, lock_timeout 200ms", c, rc, now_ms() - t0,
                       "55P03");
        t0 = now_ms();
        rc = pqmq_fail(c, id, "should time out");
        expect_timeout("fail, row locked, lock_timeout 200ms", c, rc, now_ms() - t0, "55P03");
        size_t extended = 99;
        t0 = now_ms();
        rc = pqmq_keep_alive(c, (const uuid_t *)&id, 1, 10000, &extended);
        long ms = now_ms() - t0;
        check(rc == PQMQ_OK && extended == 0 && ms < 150,
              "keep-alive, row locked: skips it without waiting: rc %d, extended %zu, %ld ms",
              rc, extended, ms);
        exec_or_die(holder, "ROLLBACK");
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM mq_msgs m JOIN mq_payloads p USING (id) "
                 "WHERE id = '%s' AND deliveries = 1 AND dead_since IS NULL "
                 "AND p.last_error IS NULL AND attempt_at > now()",
                 idt);
        check(scalar(holder, sql) == 1,
              "after the timeouts the message is unchanged: attempt 1, still leased, "
              "not dead, no error recorded");
        rc = pqmq_complete_batch(c, b);
        snprintf(sql, sizeof sql, "SELECT count(*) FROM mq_msgs WHERE id = '%s'", idt);
        check(rc == PQMQ_OK && scalar(holder, sql) == 0,
              "complete once the row lock is gone: rc %d (%s)", rc, pqmq_errmsg(c));
        pqmq_batch_free(b);
    }

    /* 6. complete of an ordered message whose chain lock a producer holds:
     * done at once, since only producers serialize on a chain's lock (a
     * completion deletes its row and writes nothing to the next member). */
    set_timeouts(c, 0, 300);
    b = poll_one(c, "to_other");
    if (b) {
        exec_or_die(holder, "SELECT pg_advisory_lock(hashtext('to_other'), hashtext(''))");
        t0 = now_ms();
        rc = pqmq_complete_batch(c, b);
        long took = now_ms() - t0;
        exec_or_die(holder, "SELECT pg_advisory_unlock(hashtext('to_other'), hashtext(''))");
        check(rc == PQMQ_OK, /* waiting for the lock would end in 57014 */
              "complete, chain locked by a producer, statement_timeout 300ms: rc %d (%s) "
              "after %ld ms",
              rc, pqmq_errmsg(c), took);
        pqmq_batch_free(b);
    }

    /* 7. inside the caller's transaction: the timed-out insert takes the
     * transaction down with it; after ROLLBACK nothing of it exists. */
    {
        pqmq_msg *m = pqmq_msg_new();
        pqmq_msg_set_channel(m, "to_chain", "");
        pqmq_msg_set_ordered(m, 1);
        pqmq_msg_set_json(m, "{\"seq\": 2}");
        char mid[512];
        ids_sql(mid, sizeof mid, &m, 1);
        pqmq_client *w = NULL;
        pqmq_wrap(pqmq_conn(c), &w);
        set_timeouts(c, 200, 0);
        exec_or_die(pqmq_conn(c), "BEGIN");
        exec_or_die(holder, "SELECT pg_advisory_lock(hashtext('to_chain'), hashtext(''))");
        t0 = now_ms();
        rc = pqmq_insert(w, &m, 1);
        expect_timeout("insert in the caller's transaction, chain locked, lock_timeout", w, rc,
                       now_ms() - t0, "55P03");
        exec_or_die(pqmq_conn(c), "ROLLBACK");
        exec_or_die(holder, "SELECT pg_advisory_unlock(hashtext('to_chain'), hashtext(''))");
        check(count_ids(holder, "mq_msgs", mid) + count_ids(holder, "mq_payloads", mid) == 0,
              "nothing of the rolled-back insert exists");
        pqmq_client_free(w);
        pqmq_msg_free(m);
    }

    /* 8. the rest is claimable at once: to_loose was never claimed. */
    set_timeouts(c, 0, 0);
    b = poll_one(c, "to_loose");
    if (b) {
        rc = pqmq_complete_batch(c, b);
        check(rc == PQMQ_OK, "to_loose claimable and completed: rc %d", rc);
        pqmq_batch_free(b);
    }
    long left =
        scalar(holder, "SELECT (SELECT count(*) FROM mq_msgs WHERE channel_name LIKE 'to\\_%')"
                       " + (SELECT count(*) FROM mq_chains WHERE channel_name LIKE 'to\\_%')");
    check(left == 0 && count_ids(holder, "mq_payloads", ids) == 0,
          "nothing left behind: %ld rows in mq_msgs/mq_chains", left);

    for (int i = 0; i < 3; i++)
        pqmq_msg_free(msgs[i]);
    pqmq_client_free(c);
    PQfinish(holder);
    printf("timeouts: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
