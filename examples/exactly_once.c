/*
 * exactly_once.c: a runner whose effects happen exactly once, even if the
 * process is killed at any moment.
 *
 *   exactly_once [CONNINFO] [--locked | --batched | --grouped]
 *
 * For every message on every channel it writes one row into a ledger table
 * and completes the message in the same transaction (pqmq_ctx_begin): either
 * both happen or neither does, so a message is never lost and never
 * recorded twice. --locked uses the locked lane (pqmq_runner_set_locked):
 * each worker claims a batch in a transaction of its own and commits the
 * batch's effects and completions together, one commit per batch instead of
 * one per message. --batched keeps the lease lane and commits each worker's
 * jobs in batches (pqmq_runner_set_commit_batch): each handler in a
 * savepoint, one commit for a batch's effects and completions. --grouped
 * is --batched with a group handler (pqmq_runner_handle_group): the queued
 * jobs a worker takes together are recorded by one INSERT. SIGINT or
 * SIGTERM stops it gracefully (in-flight handlers finish first, the batch
 * in hand commits); it then prints its counters and exits 0. Without
 * CONNINFO, the server is $PQMQ_DSN, else $DATABASE_URL, else libpq's PG*
 * variables; $PQMQ_SCHEMA names the queue's schema. Copy freely, with
 * example_env.h.
 */
#define _POSIX_C_SOURCE 200809L /* sigaction and setenv under -std=c11 */

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pqmq.h>

#include "example_env.h"

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

/* Appends value to the array literal at *buf (len used, cap allocated) as
 * a quoted element (NULL: unquoted NULL); 0, or -1 out of memory. */
static int append_element(char **buf, size_t *len, size_t *cap, const char *value)
{
    size_t need = *len + 2 * (value ? strlen(value) : 4) + 5;
    if (need > *cap) {
        size_t grown = need * 2;
        char *p = realloc(*buf, grown);
        if (!p)
            return -1;
        *buf = p;
        *cap = grown;
    }
    char *out = *buf + *len;
    *out++ = *len ? ',' : '{';
    if (!value) {
        memcpy(out, "NULL", 4);
        out += 4;
    } else {
        *out++ = '"';
        for (const char *v = value; *v; v++) {
            if (*v == '"' || *v == '\\')
                *out++ = '\\';
            *out++ = *v;
        }
        *out++ = '"';
    }
    *len = (size_t)(out - *buf);
    return 0;
}

/* The group handler (--grouped): the ledger rows of all n jobs in one
 * statement, three arrays as parameters, in the jobs' savepoint of the
 * worker's batch; they commit with the batch's completions. */
static int record_group(pqmq_ctx *ctx, const pqmq_job *const *jobs, size_t n, void *arg)
{
    (void)arg;
    char *lists[3] = {NULL, NULL, NULL};
    size_t len[3] = {0, 0, 0}, cap[3] = {0, 0, 0};
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        uuid_t id;
        char id_text[37];
        pqmq_job_id(jobs[i], id);
        uuid_unparse_lower(id, id_text);
        const char *values[3] = {id_text, pqmq_job_channel(jobs[i]), pqmq_job_json(jobs[i])};
        for (int k = 0; k < 3 && ok; k++)
            ok = append_element(&lists[k], &len[k], &cap[k], values[k]) == 0;
    }
    for (int k = 0; k < 3 && ok; k++)
        lists[k][len[k]++] = '}', lists[k][len[k]] = 0;
    PGresult *res = NULL;
    if (ok) {
        const char *params[3] = {lists[0], lists[1], lists[2]};
        res = pqmq_ctx_exec_params(
            ctx,
            "INSERT INTO example_ledger (msg_id, channel, seq, payload) "
            "SELECT i, c, (p::jsonb ->> 'seq')::bigint, p::jsonb "
            "FROM unnest($1::uuid[], $2::text[], $3::text[]) AS u(i, c, p)",
            3, params);
        ok = PQresultStatus(res) == PGRES_COMMAND_OK;
        if (!ok)
            pqmq_ctx_error(ctx, "ledger insert: %s",
                           res ? PQresultErrorMessage(res) : "no connection");
    } else {
        pqmq_ctx_error(ctx, "out of memory");
    }
    PQclear(res);
    for (int k = 0; k < 3; k++)
        free(lists[k]);
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
    const char *arg = NULL, *mode = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--", 2) && !mode)
            mode = argv[i];
        else if (strncmp(argv[i], "--", 2) && !arg)
            arg = argv[i];
        else
            mode = "?";
    }
    int locked = mode && !strcmp(mode, "--locked");
    int grouped = mode && !strcmp(mode, "--grouped");
    int batched = grouped || (mode && !strcmp(mode, "--batched"));
    if ((mode && !locked && !batched) || schema_from_env() != 0) {
        fprintf(stderr, "usage: %s [CONNINFO] [--locked | --batched | --grouped]\n", argv[0]);
        return 2;
    }
    const char *conninfo = conninfo_from(arg);
    if (setup(conninfo) != 0)
        return 1;

    /* The runner opens its own connections with this conninfo. */
    runner = pqmq_runner_new(conninfo);
    if (!runner) {
        fprintf(stderr, "exactly_once: out of memory\n");
        return 1;
    }
    /* name NULL: the fallback handler, for messages of every name. No
     * pqmq_runner_set_channels: all channels. */
    if (grouped)
        pqmq_runner_handle_group(runner, NULL, record_group, NULL);
    else
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
