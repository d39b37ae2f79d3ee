/*
 * client.c: pqmq_client owns or borrows a PGconn, sets up libpqtypes on it,
 * runs statements, and turns failures into codes plus messages.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pqmq-int.h"

static char pqmq_empty[] = "";

PQMQ_EXPORT const char *pqmq_strerror(int code)
{
    switch (code) {
    case PQMQ_OK: return "success";
    case PQMQ_EINVAL: return "bad argument";
    case PQMQ_ENOMEM: return "out of memory";
    case PQMQ_ECONN: return "no usable connection";
    case PQMQ_ESERVER: return "the server refused the request";
    case PQMQ_ETOOBIG: return "over a size limit";
    case PQMQ_ENOTHELD: return "message gone or lease expired";
    case PQMQ_EPAYLOAD: return "payload does not decode";
    case PQMQ_ESCHEMA: return "queue schema missing (run pqmq_migrate)";
    case PQMQ_ESTALE: return "message delivered again since; not yours to settle";
    default: return "unknown error";
    }
}

static pqmq_client *client_new(PGconn *conn, int owns)
{
    pqmq_client *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->conn = conn;
    c->owns_conn = owns;
    c->errmsg = pqmq_empty;
    return c;
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
    return c ? c->errmsg : pqmq_empty;
}

PQMQ_EXPORT const char *pqmq_sqlstate(const pqmq_client *c)
{
    return c ? c->sqlstate : pqmq_empty;
}

void pqmq__clearerr(pqmq_client *c)
{
    if (c->errmsg != pqmq_empty)
        free(c->errmsg);
    c->errmsg = pqmq_empty;
    c->sqlstate[0] = '\0';
}

int pqmq__seterr(pqmq_client *c, int code, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    /* libpq messages end in a newline; ours read better without it. */
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    if (c->errmsg != pqmq_empty)
        free(c->errmsg);
    c->errmsg = strdup(buf);
    if (!c->errmsg)
        c->errmsg = pqmq_empty;
    return code;
}

static const struct {
    const char *name, *format;
} spec_defs[PQMQ__NSPECS] = {
    [PQMQ__SPEC_UUID] = {"@pqmq_uuid", "%uuid"},
    [PQMQ__SPEC_INT4] = {"@pqmq_int4", "%int4"},
    [PQMQ__SPEC_MSG1] = {"@pqmq_msg1", "%uuid %interval %int4 %interval %text* %text*"},
    [PQMQ__SPEC_MSG2] = {"@pqmq_msg2", "%interval %bool %text* %text* %bytea*"},
    [PQMQ__SPEC_JOB1] = {"@pqmq_job1", "%uuid %bool %text %text %bytea %interval %interval"},
    [PQMQ__SPEC_JOB2] = {"@pqmq_job2", "%text %text %int4 %int4 %text %bool"},
};

const char *pqmq__spec(const pqmq_client *c, enum pqmq__spec s)
{
    return c->specs_ready & (1u << s) ? spec_defs[s].name : spec_defs[s].format;
}

/* Prepares the specs on the connection, or finds them there from an
 * earlier client or before a PQreset (same built-in types, same formats).
 * One that fails (out of memory) stays unprepared; its format is used. */
static void prepare_specs(pqmq_client *c)
{
    c->specs_ready = 0;
    for (int s = 0; s < PQMQ__NSPECS; s++) {
        const char *name = spec_defs[s].name + 1; /* without the '@' */
        if (PQspecPrepare(c->conn, name, spec_defs[s].format, 0) ||
            strstr(PQgeterror(), "already exists"))
            c->specs_ready |= 1u << s;
    }
}

int pqmq__ready(pqmq_client *c)
{
    if (PQstatus(c->conn) != CONNECTION_OK)
        return pqmq__seterr(c, PQMQ_ECONN, "connection is not usable: %s",
                            PQerrorMessage(c->conn));
    if (c->typed_conn != c->conn) {
        /* Fails only when the caller already set libpqtypes up on a
         * borrowed conn, which is as good for us. */
        (void)PQinitTypes(c->conn);
        c->typed_conn = c->conn;
        c->composite_ready = 0;
        prepare_specs(c);
    }
    return 0;
}

int pqmq__need_composite(pqmq_client *c)
{
    if (c->composite_ready)
        return 0;
    PGregisterType t = {"mq_new_t", NULL, NULL};
    if (!PQregisterTypes(c->conn, PQT_COMPOSITE, &t, 1, 0)) {
        const char *why = PQgeterror();
        if (PQstatus(c->conn) != CONNECTION_OK)
            return pqmq__seterr(c, PQMQ_ECONN, "connection lost: %s",
                                PQerrorMessage(c->conn));
        return pqmq__seterr(c, PQMQ_ESCHEMA,
                            "type mq_new_t not found on the search_path "
                            "(run pqmq_migrate): %s", why);
    }
    c->composite_ready = 1;
    return 0;
}

/* Maps a failed statement to a code and message. */
static int fail_from(pqmq_client *c, const char *what, const char *msg,
                     const char *state)
{
    /* An error libpq made itself (no SQLSTATE) is often a dead connection
     * that libpq still calls CONNECTION_OK until it reads the hang-up: read
     * it. A lost connection leaves the statement's outcome unknown, which
     * PQMQ_ECONN says and PQMQ_ESERVER ("refused") would not. Server-side
     * shutdowns (57P0x) and connection exceptions (08xxx) count too. */
    if (!state)
        (void)PQconsumeInput(c->conn);
    snprintf(c->sqlstate, sizeof c->sqlstate, "%s", state ? state : "");
    if (PQstatus(c->conn) != CONNECTION_OK || (!state && PQsocket(c->conn) < 0) ||
        (state && (!strncmp(state, "57P0", 4) || !strncmp(state, "08", 2))))
        return pqmq__seterr(c, PQMQ_ECONN, "%s: connection lost: %s", what,
                            msg && *msg ? msg : PQerrorMessage(c->conn));
    int code = PQMQ_ESERVER;
    if (state && (!strcmp(state, "42883") || !strcmp(state, "42P01") ||
                  !strcmp(state, "42704")))
        code = PQMQ_ESCHEMA; /* undefined function, table or type */
    else if (state && !strcmp(state, "22023"))
        code = PQMQ_EINVAL; /* invalid_parameter_value from our checks */
    else if (state && !strcmp(state, "54000"))
        code = PQMQ_ETOOBIG; /* program_limit_exceeded */
    char keep[sizeof c->sqlstate];
    memcpy(keep, c->sqlstate, sizeof keep);
    int rc = pqmq__seterr(c, code, "%s: %s%s%s%s%s", what, msg && *msg ? msg : "error",
                          state ? " (SQLSTATE " : "", state ? state : "",
                          state ? ")" : "",
                          code == PQMQ_ESCHEMA ? "; run pqmq_migrate to create the queue" : "");
    memcpy(c->sqlstate, keep, sizeof keep);
    return rc;
}

/* The server's one-line message, or libpq's own text for local errors. */
static const char *result_message(const PGresult *r)
{
    const char *primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    return primary && *primary ? primary : PQresultErrorMessage(r);
}

PGresult *pqmq__exec(pqmq_client *c, PGparam *param, const char *sql,
                     const char *what, int *rc)
{
    /* Send with libpqtypes, but read the outcome from the PGresult: the
     * error text libpqtypes keeps (PQgeterror) is one per process, which
     * threads with their own connections would overwrite. */
    if (!PQparamSendQuery(c->conn, param, sql, 1)) {
        *rc = fail_from(c, what, PQerrorMessage(c->conn), NULL);
        return NULL;
    }
    PGresult *r = NULL, *next;
    while ((next = PQgetResult(c->conn)) != NULL) {
        PQclear(r); /* only the last result of the statement matters */
        r = next;
    }
    ExecStatusType st = PQresultStatus(r);
    if (r && (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)) {
        *rc = 0;
        return r;
    }
    if (!r)
        *rc = fail_from(c, what, PQerrorMessage(c->conn), NULL);
    else
        *rc = fail_from(c, what, result_message(r), PQresultErrorField(r, PG_DIAG_SQLSTATE));
    PQclear(r);
    return NULL;
}

PGresult *pqmq__exec_text(pqmq_client *c, const char *sql, const char *what,
                          int *rc)
{
    PGresult *r = PQexec(c->conn, sql);
    ExecStatusType st = PQresultStatus(r);
    if (r && (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)) {
        *rc = 0;
        return r;
    }
    if (!r) {
        *rc = fail_from(c, what, PQerrorMessage(c->conn), NULL);
        return NULL;
    }
    *rc = fail_from(c, what, result_message(r), PQresultErrorField(r, PG_DIAG_SQLSTATE));
    PQclear(r);
    return NULL;
}

void pqmq__ms_to_interval(int64_t ms, PGinterval *iv)
{
    memset(iv, 0, sizeof *iv);
    iv->hours = (int)(ms / 3600000);
    ms %= 3600000;
    iv->mins = (int)(ms / 60000);
    ms %= 60000;
    iv->secs = (int)(ms / 1000);
    iv->usecs = (int)(ms % 1000) * 1000;
}

int64_t pqmq__interval_to_ms(const PGinterval *iv)
{
    int64_t days = ((int64_t)iv->years * 12 + iv->mons) * 30 + iv->days;
    int64_t ms = days * 86400000 + (int64_t)iv->hours * 3600000 +
                 (int64_t)iv->mins * 60000 + (int64_t)iv->secs * 1000;
    /* Round up so that "wait 0.2 ms" never becomes a busy "wait 0 ms". */
    return ms + (iv->usecs + 999) / 1000;
}

int pqmq__check_ms(pqmq_client *c, int64_t ms, const char *what)
{
    if (ms < 0)
        return pqmq__seterr(c, PQMQ_EINVAL, "%s is negative (%lld ms)", what,
                            (long long)ms);
    if (ms > PQMQ_MAX_DURATION_MS)
        return pqmq__seterr(c, PQMQ_EINVAL,
                            "%s of %lld ms is over the limit of 3650 days", what,
                            (long long)ms);
    return 0;
}

PGparam *pqmq__param(pqmq_client *c)
{
    PGparam *p = PQparamCreate(c->conn);
    if (!p)
        pqmq__seterr(c, PQMQ_ENOMEM, "out of memory creating parameters");
    return p;
}

int pqmq__check_ids(pqmq_client *c, const uuid_t *ids, size_t n, const char *what)
{
    if (!ids || n == 0)
        return pqmq__seterr(c, PQMQ_EINVAL, "%s: no ids given (ids %s, n %zu)", what,
                            ids ? "set" : "NULL", n);
    if (n > PQMQ_MAX_BATCH)
        return pqmq__seterr(c, PQMQ_ETOOBIG, "%s: %zu ids is over the limit of %d",
                            what, n, PQMQ_MAX_BATCH);
    return 0;
}

int pqmq__put_uuids(pqmq_client *c, PGparam *param, const uuid_t *ids, size_t n,
                    const char *what)
{
    PGarray arr;
    memset(&arr, 0, sizeof arr);
    arr.param = pqmq__param(c);
    if (!arr.param)
        return PQMQ_ENOMEM;
    int ok = 1;
    for (size_t i = 0; ok && i < n; i++)
        ok = PQputf(arr.param, pqmq__spec(c, PQMQ__SPEC_UUID), (PGuuid)ids[i]);
    ok = ok && PQputf(param, "%uuid[]", &arr);
    PQparamClear(arr.param);
    if (!ok)
        return pqmq__seterr(c, PQMQ_ENOMEM, "%s: cannot build the id array: %s", what,
                            PQgeterror());
    return 0;
}

int pqmq__reconnect(pqmq_client *c)
{
    if (!c->owns_conn)
        return pqmq__seterr(c, PQMQ_EINVAL, "cannot reconnect a borrowed connection");
    PQreset(c->conn);
    /* libpqtypes drops its registered types on reset: register again. */
    c->typed_conn = NULL;
    c->composite_ready = 0;
    c->specs_ready = 0;
    return pqmq__ready(c);
}

PQMQ_EXPORT int pqmq_reconnect(pqmq_client *c)
{
    if (!c)
        return PQMQ_EINVAL;
    pqmq__clearerr(c);
    return pqmq__reconnect(c);
}
