/*
 * client.c: pqmq_client owns or borrows a PGconn, readies it for the calls
 * (libpqtypes set up on it by types.c) and reconnects. The call's error is
 * error.c's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pqmq-int.h"

static pqmq_client *client_new(PGconn *conn, int owns)
{
    pqmq_client *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->conn = conn;
    c->owns_conn = owns;
    c->call = "pqmq";
    pqmq__clearerr(c); /* "", no SQLSTATE */
    return c;
}

/* The log level of a notice of this severity (PG_DIAG_SEVERITY). */
static int notice_level(const char *severity)
{
    if (!severity)
        return PQMQ_LOG_WARN;
    if (!strcmp(severity, "ERROR") || !strcmp(severity, "FATAL") || !strcmp(severity, "PANIC"))
        return PQMQ_LOG_ERROR;
    if (!strcmp(severity, "WARNING"))
        return PQMQ_LOG_WARN;
    if (!strcmp(severity, "NOTICE") || !strcmp(severity, "INFO") || !strcmp(severity, "LOG"))
        return PQMQ_LOG_INFO;
    return PQMQ_LOG_DEBUG;
}

/* Citus commits a single worker's transaction with one COMMIT; when the
 * worker is lost during it, the coordinator only warns (the outcome is not
 * known) and the statement still succeeds. The call must not say
 * "committed" then: outcome() turns the warning into PQMQ_ECONN, as for a
 * connection lost at COMMIT. Every notice then goes to the client's log
 * when it has one (pqmq_set_log; a runner's connections: the runner's, or
 * nowhere), else on to libpq's own receiver (stderr by default). */
static void on_notice(void *arg, const PGresult *r)
{
    pqmq_client *c = arg;
    const char *severity = PQresultErrorField(r, PG_DIAG_SEVERITY_NONLOCALIZED);
    const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    static const char lost[] = "failed to commit transaction on ";
    if (severity && !strcmp(severity, "WARNING") && msg && !strncmp(msg, lost, sizeof lost - 1))
        snprintf(c->doubt, sizeof c->doubt, "%s", msg);
    if (c->notices_to_log) {
        /* Terse, "FATAL: terminating connection ...": no CONTEXT lines,
         * which would quote the statement under way. */
        const char *shown = PQresultErrorField(r, PG_DIAG_SEVERITY);
        const char *detail = PQresultErrorField(r, PG_DIAG_MESSAGE_DETAIL);
        char text[512];
        snprintf(text, sizeof text, "%s: %s%s%s", shown ? shown : "NOTICE", msg ? msg : "",
                 detail ? " DETAIL: " : "", detail ? detail : "");
        if (c->keep_last_words && severity &&
            (!strcmp(severity, "FATAL") || !strcmp(severity, "PANIC")))
            pqmq__one_line(text, c->last_words, sizeof c->last_words);
        else
            pqmq__log(&c->log, notice_level(severity), "%s%s%s", c->log_label,
                      c->log_label[0] ? ": " : "", text);
        return;
    }
    if (c->prev_notice)
        c->prev_notice(NULL, r); /* libpq's default receiver takes no argument */
}

PQMQ_EXPORT int pqmq_connect(const char *conninfo, pqmq_client **out)
{
    if (!out)
        return PQMQ_EINVAL;
    *out = NULL;
    PGconn *conn = PQconnectdb(conninfo ? conninfo : "");
    if (!conn)
        return PQMQ_ENOMEM;
    pqmq_client *c = client_new(conn, 1);
    if (!c) {
        PQfinish(conn);
        return PQMQ_ENOMEM;
    }
    c->prev_notice = PQsetNoticeReceiver(conn, on_notice, c); /* kept by PQreset */
    *out = c;
    return pqmq__ready(c);
}

PQMQ_EXPORT int pqmq_wrap(PGconn *conn, pqmq_client **out)
{
    if (!out)
        return PQMQ_EINVAL;
    *out = NULL;
    if (!conn)
        return PQMQ_EINVAL;
    *out = client_new(conn, 0);
    return *out ? 0 : PQMQ_ENOMEM;
}

PQMQ_EXPORT void pqmq_client_free(pqmq_client *c)
{
    if (!c)
        return;
    pqmq__clearerr(c);
    if (c->owns_conn)
        PQfinish(c->conn);
    free(c);
}

PQMQ_EXPORT PGconn *pqmq_conn(pqmq_client *c)
{
    return c ? c->conn : NULL;
}

PQMQ_EXPORT const char *pqmq_errmsg(const pqmq_client *c)
{
    return c ? c->errmsg : "";
}

PQMQ_EXPORT const char *pqmq_sqlstate(const pqmq_client *c)
{
    return c ? c->sqlstate : "";
}

int pqmq__ready(pqmq_client *c)
{
    if (PQstatus(c->conn) != CONNECTION_OK)
        return pqmq__seterr(c, PQMQ_ECONN, "connection is not usable: %s",
                            PQerrorMessage(c->conn));
    pqmq__types_ready(c);
    return 0;
}

int pqmq__reset_conn(pqmq_client *c)
{
    if (!c->owns_conn)
        return pqmq__seterr(c, PQMQ_EINVAL, "cannot reconnect a borrowed connection");
    c->last_words[0] = '\0'; /* the old connection's */
    PQreset(c->conn);
    pqmq__types_forget(c);
    return pqmq__ready(c);
}

PQMQ_EXPORT int pqmq_reconnect(pqmq_client *c)
{
    int rc = pqmq__enter(c, "pqmq_reconnect");
    return rc ? rc : pqmq__reset_conn(c);
}
