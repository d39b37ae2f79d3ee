/*
 * tests/faults/locked_worker.c: a consumer of the locked lane, for the
 * fault suite.
 *
 *   locked_worker CONNINFO
 *
 * Per batch: BEGIN, pqmq_poll_locked, one example_ledger row per message
 * (msg_id its primary key: a second effect is impossible, not unlikely),
 * pqmq_complete_batch, COMMIT. When the locked lane comes back short it
 * also polls the lease lane (retries, and messages whose locked delivery
 * died with a killed worker) and records those the same way, fenced by
 * attempt. The ledger must exist (examples/exactly_once creates it).
 * SIGTERM or SIGINT stops it after the batch in hand; it then prints its
 * counters and exits 0.
 */
#define _POSIX_C_SOURCE 200809L

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <pqmq.h>

#include "fault.h"

static volatile sig_atomic_t stopping;

static void on_signal(int sig)
{
    (void)sig;
    stopping = 1;
}

static int exec_ok(PGconn *conn, const char *sql)
{
    PGresult *r = PQexec(conn, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    return ok;
}

/* The effects of b's jobs, in the open transaction; 0 when all were written. */
static int record(PGconn *conn, const pqmq_batch *b)
{
    for (size_t i = 0; i < pqmq_batch_count(b); i++) {
        const pqmq_job *job = pqmq_batch_job(b, i);
        uuid_t id;
        char text[37];
        pqmq_job_id(job, id);
        uuid_unparse_lower(id, text);
        const char *params[3] = {text, pqmq_job_channel(job), pqmq_job_json(job)};
        PGresult *r = PQexecParams(conn,
                                   "INSERT INTO example_ledger (msg_id, channel, seq, payload) "
                                   "VALUES ($1::uuid, $2, ($3::jsonb ->> 'seq')::bigint, "
                                   "$3::jsonb)",
                                   3, NULL, params, NULL, NULL, 0);
        int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
        if (!ok)
            return -1;
    }
    return 0;
}

/* One transaction: a poll (locked or leased), the effects, the completion.
 * Returns how many messages it settled, -1 on an error (rolled back). */
static long one_batch(pqmq_client *c, int locked, int max)
{
    PGconn *conn = pqmq_conn(c);
    pqmq_batch *b = NULL;
    if (!exec_ok(conn, "BEGIN"))
        return -1;
    int rc = locked ? pqmq_poll_locked(c, NULL, 0, max, &b) : pqmq_poll(c, NULL, 0, max, &b);
    long n = rc ? -1 : (long)pqmq_batch_count(b);
    if (n > 0 && (record(conn, b) || pqmq_complete_batch(c, b)))
        n = -1; /* a stale lease (ESTALE) rolls its effects back too */
    if (n < 0 || !exec_ok(conn, "COMMIT")) {
        exec_ok(conn, "ROLLBACK");
        n = -1;
    }
    pqmq_batch_free(b);
    return n;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CONNINFO\n", argv[0]);
        return 2;
    }
    fault_on_stop_signals(on_signal);

    pqmq_client *c = NULL;
    if (pqmq_connect(argv[1], &c) != PQMQ_OK) {
        fprintf(stderr, "locked_worker: %s\n", pqmq_errmsg(c));
        pqmq_client_free(c);
        return 1;
    }
    long locked = 0, leased = 0, errors = 0;
    while (!stopping) {
        long a = one_batch(c, 1, 20);
        long b = a < 20 ? one_batch(c, 0, 10) : 0;
        locked += a > 0 ? a : 0;
        leased += b > 0 ? b : 0;
        if (a < 0 || b < 0) {
            errors++;
            if (PQstatus(pqmq_conn(c)) != CONNECTION_OK) { /* not a fault of this suite */
                fprintf(stderr, "locked_worker: connection lost\n");
                pqmq_client_free(c);
                return 1;
            }
        }
        if (a <= 0 && b <= 0)
            fault_sleep_ms(20);
    }
    fprintf(stderr, "locked_worker: stopped: %ld locked, %ld leased, %ld errors\n", locked,
            leased, errors);
    pqmq_client_free(c);
    return 0;
}
