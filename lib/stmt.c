/*
 * stmt.c: running statements (one, or several in one round trip) and
 * turning a failure into a code and a message on the client.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pqmq-int.h"

/* Maps a failed statement to a code and message (detail: the server's
 * DETAIL, which names what was wrong, e.g. the duplicate key; may be NULL). */
static int fail_from(pqmq_client *c, const char *msg, const char *detail, const char *state)
{
    /* An error libpq made itself (no SQLSTATE) is often a dead connection
     * that libpq still calls CONNECTION_OK until it reads the hang-up: read
     * it. A lost connection leaves the statement's outcome unknown, which
     * PQMQ_ECONN says and PQMQ_ESERVER ("refused") would not. Server-side
     * shutdowns (57P0x) and connection exceptions (08xxx) count too. */
    if (!state)
        (void)PQconsumeInput(c->conn);
    if (PQstatus(c->conn) != CONNECTION_OK || (!state && PQsocket(c->conn) < 0) ||
        (state && (!strncmp(state, "57P0", 4) || !strncmp(state, "08", 2)))) {
        int rc = pqmq__err(c, PQMQ_ECONN, "connection lost: %s",
                           msg && *msg ? msg : PQerrorMessage(c->conn));
        pqmq__set_sqlstate(c, state);
        return rc;
    }
    int code = PQMQ_ESERVER;
    if (state &&
        (!strcmp(state, "42883") || !strcmp(state, "42P01") || !strcmp(state, "42704")))
        code = PQMQ_ESCHEMA; /* undefined function, table or type */
    else if (state && !strcmp(state, "22023"))
        code = PQMQ_EINVAL; /* invalid_parameter_value from our checks */
    else if (state && !strcmp(state, "54000"))
        code = PQMQ_ETOOBIG; /* program_limit_exceeded */
    else if (state && !strcmp(state, "PQ001"))
        code = PQMQ_ESTALE; /* mq_complete_all: not all were still ours */
    int rc = pqmq__err(c, code, "%s%s%s%s%s%s%s", msg && *msg ? msg : "error",
                       state ? " (SQLSTATE " : "", state ? state : "", state ? ")" : "",
                       detail && *detail ? ": " : "", detail && *detail ? detail : "",
                       code == PQMQ_ESCHEMA ? "; run pqmq_migrate to create the queue" : "");
    pqmq__set_sqlstate(c, state);
    return rc;
}

/* The server's one-line message, or libpq's own text for local errors. */
static const char *result_message(const PGresult *r)
{
    const char *primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    return primary && *primary ? primary : PQresultErrorMessage(r);
}

/* Takes a statement's last result: returns it when it succeeded, else
 * clears it, sets the error and returns NULL. */
static PGresult *outcome(pqmq_client *c, PGresult *r, int *rc)
{
    ExecStatusType st = PQresultStatus(r);
    if (r && (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)) {
        if (!c->doubt[0]) {
            *rc = 0;
            return r;
        }
        /* Succeeded, but a commit's outcome is unknown (client.c). */
        *rc = pqmq__err(c, PQMQ_ECONN, "the commit's outcome is unknown (%s)", c->doubt);
        c->doubt[0] = '\0';
        PQclear(r);
        return NULL;
    }
    if (!r)
        *rc = fail_from(c, PQerrorMessage(c->conn), NULL, NULL);
    else
        *rc = fail_from(c, result_message(r), PQresultErrorField(r, PG_DIAG_MESSAGE_DETAIL),
                        PQresultErrorField(r, PG_DIAG_SQLSTATE));
    PQclear(r);
    return NULL;
}

PGresult *pqmq__exec(pqmq_client *c, PGparam *param, const char *sql, int *rc)
{
    /* Send with libpqtypes, but read the outcome from the PGresult: the
     * error text libpqtypes keeps (PQgeterror) is one per process, which
     * threads with their own connections would overwrite. */
    if (!PQparamSendQuery(c->conn, param, sql, 1)) {
        *rc = fail_from(c, PQerrorMessage(c->conn), NULL, NULL);
        return NULL;
    }
    PGresult *r = NULL, *next;
    while ((next = PQgetResult(c->conn)) != NULL) {
        PQclear(r); /* only the last result of the statement matters */
        r = next;
    }
    return outcome(c, r, rc);
}

PGresult *pqmq__result_outcome(pqmq_client *c, PGresult *r, int *rc)
{
    return outcome(c, r, rc);
}

/* Sends one parameterless statement into the pipeline. */
static int send_plain(PGconn *conn, const char *sql)
{
    return !sql || PQsendQueryParams(conn, sql, 0, NULL, NULL, NULL, NULL, 0);
}

/* The results of one statement in the pipeline: its last one, or NULL. */
static PGresult *take(PGconn *conn)
{
    PGresult *r = NULL, *next;
    while ((next = PQgetResult(conn)) != NULL) {
        PQclear(r);
        r = next;
    }
    return r;
}

/* The outcome of one piped statement (sql may be NULL: none was sent). */
static PGresult *piped_outcome(pqmq_client *c, const char *sql, int *rc)
{
    if (!sql)
        return NULL;
    PGresult *r = take(c->conn);
    if (r && PQresultStatus(r) == PGRES_PIPELINE_ABORTED) {
        PQclear(r);
        *rc = PQMQ_ESERVER; /* an earlier statement failed and said why */
        return NULL;
    }
    return outcome(c, r, rc);
}

PGresult *pqmq__exec_piped(pqmq_client *c, const char *before, PGparam *param, const char *sql,
                           const char *after, int *rc)
{
    PGconn *conn = c->conn;
    if (!PQenterPipelineMode(conn)) {
        *rc = fail_from(c, PQerrorMessage(conn), NULL, NULL);
        return NULL;
    }
    if (!send_plain(conn, before) || !PQparamSendQuery(conn, param, sql, 1) ||
        !send_plain(conn, after) || !PQpipelineSync(conn)) {
        *rc = fail_from(c, PQerrorMessage(conn), NULL, NULL);
        PQexitPipelineMode(conn);
        return NULL;
    }
    int rc_before = 0, rc_after = 0;
    PQclear(piped_outcome(c, before, &rc_before));
    PGresult *r = piped_outcome(c, sql, rc);
    if (!rc_before && *rc)
        rc_before = *rc; /* the statement's own error is the one to report */
    PQclear(piped_outcome(c, after, &rc_after));
    PGresult *sync =
        PQgetResult(conn); /* PGRES_PIPELINE_SYNC, or NULL if the connection died */
    PQclear(sync);
    PQexitPipelineMode(conn);
    *rc = rc_before ? rc_before : *rc ? *rc : rc_after;
    if (*rc) {
        PQclear(r);
        return NULL;
    }
    return r;
}

PGresult *pqmq__exec_text(pqmq_client *c, const char *sql, int *rc)
{
    return outcome(c, PQexec(c->conn, sql), rc);
}

int pqmq__exec_scalar(pqmq_client *c, PGparam *param, const char *sql, const char *spec,
                      int *value)
{
    int rc;
    PGresult *r = pqmq__exec(c, param, sql, &rc);
    if (!r)
        return rc;
    *value = 0;
    if (spec && !PQgetf(r, 0, spec, 0, value))
        rc = pqmq__err(c, PQMQ_ESERVER, "unexpected result: %s", PQgeterror());
    PQclear(r);
    return rc;
}
