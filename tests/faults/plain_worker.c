/*
 * tests/faults/plain_worker.c: a runner WITHOUT transactional completion,
 * for the fault suite.
 *
 *   plain_worker CONNINFO [--threads N] [--worker-name NAME]
 *   plain_worker CONNINFO --setup
 *
 * For every message on every channel the handler writes one effect row
 * into fault_effects on the worker's connection, in autocommit, and returns
 * 0: the runner then completes the message in its batched, plain
 * completion. So a crash between the effect and the completion repeats the
 * effect: at-least-once. Each effect row records the attempt number the
 * handler saw, which lets the suite tell an explained duplicate (from a
 * redelivery, attempt >= 2) from an unexplained one (two effects of one
 * attempt).
 *
 * --setup creates the queue's schema (pqmq_migrate) and fault_effects, and
 * exits. --worker-name NAME: the handler renames its worker connection's
 * session to application_name NAME (once per backend), so that the suite
 * can tell worker connections from the runner's listening (control)
 * connection, which keeps the application_name of CONNINFO.
 *
 * SIGTERM or SIGINT stops it gracefully; it then prints its counters on
 * stdout and exits 0.
 */
#define _POSIX_C_SOURCE 200809L

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pqmq.h>

#include "fault.h"

static const char *const effects_sql =
    "CREATE TABLE IF NOT EXISTS fault_effects ("
    " n bigserial PRIMARY KEY," /* allocation order = effect order */
    " msg_id uuid NOT NULL,"
    " channel text NOT NULL,"
    " seq bigint,"
    " producer int,"
    " attempt int NOT NULL,"
    " backend int NOT NULL DEFAULT pg_backend_pid(),"
    " done_at timestamptz NOT NULL DEFAULT clock_timestamp())";

static pqmq_runner *runner;
static const char *worker_name;

static void on_signal(int sig)
{
    (void)sig;
    pqmq_runner_stop(runner);
}

/* The backend this thread last renamed (application_name). */
static _Thread_local int renamed_backend;

static void rename_session(PGconn *conn)
{
    int pid = PQbackendPID(conn);
    if (!worker_name || pid == renamed_backend)
        return;
    const char *params[1] = {worker_name};
    PGresult *res = PQexecParams(conn, "SELECT set_config('application_name', $1, false)", 1,
                                 NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) == PGRES_TUPLES_OK)
        renamed_backend = pid;
    PQclear(res);
}

static int effect(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)arg;
    PGconn *conn = pqmq_ctx_conn(ctx);
    rename_session(conn);

    uuid_t id;
    char id_text[37], attempt[16];
    pqmq_job_id(job, id);
    uuid_unparse_lower(id, id_text);
    snprintf(attempt, sizeof attempt, "%d", pqmq_job_attempt(job));
    const char *params[4] = {id_text, pqmq_job_channel(job), pqmq_job_json(job), attempt};
    PGresult *res =
        PQexecParams(conn,
                     "INSERT INTO fault_effects (msg_id, channel, seq, producer, attempt) "
                     "VALUES ($1::uuid, $2, ($3::jsonb ->> 'seq')::bigint, "
                     "($3::jsonb ->> 'p')::int, $4::int)",
                     4, NULL, params, NULL, NULL, 0);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok)
        pqmq_ctx_error(ctx, "effect insert: %s", PQresultErrorMessage(res));
    PQclear(res);
    return ok ? 0 : -1;
}

static int setup(const char *conninfo)
{
    pqmq_client *c = NULL;
    int rc = pqmq_connect(conninfo, &c);
    if (rc == PQMQ_OK)
        rc = pqmq_migrate(c);
    if (rc != PQMQ_OK) {
        fprintf(stderr, "plain_worker: %s\n", pqmq_errmsg(c));
        pqmq_client_free(c);
        return 1;
    }
    PGresult *res = PQexec(pqmq_conn(c), effects_sql);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok)
        fprintf(stderr, "plain_worker: creating fault_effects: %s", PQresultErrorMessage(res));
    PQclear(res);
    pqmq_client_free(c);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CONNINFO [--setup | --threads N] [--worker-name NAME]\n",
                argv[0]);
        return 2;
    }
    int threads = 4;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--setup"))
            return setup(argv[1]);
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--worker-name") && i + 1 < argc)
            worker_name = argv[++i];
        else {
            fprintf(stderr, "plain_worker: unknown argument %s\n", argv[i]);
            return 2;
        }
    }

    runner = pqmq_runner_new(argv[1]);
    if (!runner || pqmq_runner_handle(runner, NULL, effect, NULL) ||
        pqmq_runner_set_concurrency(runner, threads)) {
        fprintf(stderr, "plain_worker: cannot set up the runner\n");
        return 1;
    }
    fault_on_stop_signals(on_signal);

    int rc = pqmq_runner_run(runner);
    if (rc != PQMQ_OK) {
        fprintf(stderr, "plain_worker: %s\n", pqmq_runner_errmsg(runner));
        pqmq_runner_free(runner);
        return 1;
    }
    pqmq_runner_stats_t st;
    pqmq_runner_stats(runner, &st);
    printf("plain_worker: stopped: %llu processed, %llu failed, %llu polls, %llu wake-ups, "
           "%llu reconnects\n",
           (unsigned long long)st.processed, (unsigned long long)st.failed,
           (unsigned long long)st.polls, (unsigned long long)st.wakeups,
           (unsigned long long)st.reconnects);
    pqmq_runner_free(runner);
    return 0;
}
