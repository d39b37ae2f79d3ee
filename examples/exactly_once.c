/*
 * exactly_once.c: a runner whose effects happen exactly once, even if the
 * process is killed at any moment.
 *
 *   exactly_once CONNINFO [--locked | --batched]
 *
 * For every message on every channel it writes one row into a ledger table
 * and completes the message in the same transaction (pqmq_ctx_begin): either
 * both happen or neither does, so a message is never lost and never
 * recorded twice. --locked uses the locked lane (pqmq_runner_set_locked):
 * each worker claims a batch in a transaction of its own and commits the
 * batch's effects and completions together, one commit per batch instead of
 * one per message. --batched keeps the lease lane and commits each worker's
 * jobs in batches (pqmq_runner_set_commit_batch): each handler in a
 * savepoint, one commit for a batch's effects and completions. SIGINT or
 * SIGTERM stops it gracefully (in-flight handlers finish first, the batch
 * in hand commits); it then prints its counters and exits 0. Copy freely.
 */
#define _POSIX_C_SOURCE 200809L /* sigaction under -std=c11 */

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <pqmq.h>

/* The effect of a message: created if missing. msg_id as primary key makes
 * a second effect of one message impossible, not merely unlikely. */
static const char *const ledger_sql =
    "CREATE TABLE IF NOT EXISTS example_ledger ("
    " msg_id uuid PRIMARY KEY,"
    " channel text NOT NULL,"
    " seq bigint,"
    " payload jsonb,"
    " done_at timestamptz NOT NULL DEFAULT clock_timestamp())";

/* The runner the signal handler stops: pqmq_runner_stop is safe there. */
static pqmq_runner *runner;

static void on_signal(int sig)
{
    (void)sig;
    pqmq_runner_stop(runner);
}

/* The handler: runs on a worker thread, once per delivery. */
static int record(pqmq_ctx *ctx, const pqmq_job *job, void *arg)
{
    (void)arg;
    /* The worker's connection, inside a transaction the runner owns: do not
     * COMMIT or ROLLBACK here. Returning 0 completes the message in this
     * same transaction and commits; anything else rolls it all back. */
    PGconn *conn = pqmq_ctx_begin(ctx);
    if (!conn) {
        pqmq_ctx_error(ctx, "cannot open the job's transaction");
        return -1;
    }

    uuid_t id;
    char id_text[37];
    pqmq_job_id(job, id);
    uuid_unparse_lower(id, id_text);

    /* Every value is a parameter, never spliced into the SQL. The JSON
     * payload (NULL when the message has none) goes in as text and is both
     * stored and mined for its "seq" field by the server. */
    const char *params[3] = {id_text, pqmq_job_channel(job), pqmq_job_json(job)};
    PGresult *res =
        PQexecParams(conn,
                     "INSERT INTO example_ledger (msg_id, channel, seq, payload) "
                     "VALUES ($1::uuid, $2, ($3::jsonb ->> 'seq')::bigint, $3::jsonb)",
                     3, NULL, params, NULL, NULL, 0);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok) /* recorded as the message's last_error; retried after its backoff */
        pqmq_ctx_error(ctx, "ledger insert: %s", PQresultErrorMessage(res));
    PQclear(res);
    return ok ? 0 : -1;
}

/* Creates the queue's schema and the ledger; 0 on success. */
static int setup(const char *conninfo)
{
    pqmq_client *client = NULL;
    int rc = pqmq_connect(conninfo, &client);
    if (rc == PQMQ_OK)
        rc = pqmq_migrate(client);
    if (rc != PQMQ_OK) {
        fprintf(stderr, "exactly_once: %s\n", pqmq_errmsg(client));
        pqmq_client_free(client);
        return -1;
    }
    PGresult *res = PQexec(pqmq_conn(client), ledger_sql);
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok)
        fprintf(stderr, "exactly_once: creating example_ledger: %s", PQresultErrorMessage(res));
    PQclear(res);
    pqmq_client_free(client);
    return ok ? 0 : -1;
}

int main(int argc, char **argv)
{
    int locked = argc == 3 && !strcmp(argv[2], "--locked");
    int batched = argc == 3 && !strcmp(argv[2], "--batched");
    if (argc != 2 && !locked && !batched) {
        fprintf(stderr, "usage: %s CONNINFO [--locked | --batched]\n", argv[0]);
        return 2;
    }
    if (setup(argv[1]) != 0)
        return 1;

    /* The runner opens its own connections with this conninfo. */
    runner = pqmq_runner_new(argv[1]);
    if (!runner) {
        fprintf(stderr, "exactly_once: out of memory\n");
        return 1;
    }
    /* name NULL: the fallback handler, for messages of every name. No
     * pqmq_runner_set_channels: all channels. */
    pqmq_runner_handle(runner, NULL, record, NULL);
    /* The same handler, one commit per batch of each worker. */
    if (locked)
        pqmq_runner_set_locked(runner, 1);
    /* The same handler, its transaction shared by up to 64 jobs of a worker
     * (0, 0: the default batch size and time). */
    if (batched)
        pqmq_runner_set_commit_batch(runner, 0, 0);

    /* sigaction rather than signal(): no SA_RESTART surprises, one
     * behaviour everywhere. The handler only asks the runner to stop. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    fprintf(stderr, "exactly_once: recording every message into example_ledger "
                    "(SIGINT or SIGTERM stops)\n");
    /* Blocks until stopped; a lost connection is re-established inside. */
    int rc = pqmq_runner_run(runner);
    if (rc != PQMQ_OK) {
        fprintf(stderr, "exactly_once: %s\n", pqmq_runner_errmsg(runner));
        pqmq_runner_free(runner);
        return 1;
    }

    pqmq_runner_stats_t st;
    pqmq_runner_stats(runner, &st);
    fprintf(stderr,
            "exactly_once: stopped: %llu processed, %llu failed, %llu polls, "
            "%llu wake-ups, %llu reconnects\n",
            (unsigned long long)st.processed, (unsigned long long)st.failed,
            (unsigned long long)st.polls, (unsigned long long)st.wakeups,
            (unsigned long long)st.reconnects);
    pqmq_runner_free(runner);
    return 0;
}
