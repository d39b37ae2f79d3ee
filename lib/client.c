/*
 * client.c: pqmq_client owns or borrows a PGconn, sets up libpqtypes on it
 * (types and prepared formats), reconnects, and holds the error of the last
 * call. Statements are run by stmt.c.
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
    c->call = "pqmq";
    return c;
}

/* Citus commits a single worker's transaction with one COMMIT; when the
 * worker is lost during it, the coordinator only warns (the outcome is not
 * known) and the statement still succeeds. The call must not say
 * "committed" then: outcome() turns the warning into PQMQ_ECONN, as for a
 * connection lost at COMMIT. Every notice still goes on to libpq's own
 * receiver (stderr by default). */
static void on_notice(void *arg, const PGresult *r)
{
    pqmq_client *c = arg;
    const char *severity = PQresultErrorField(r, PG_DIAG_SEVERITY_NONLOCALIZED);
    const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    static const char lost[] = "failed to commit transaction on ";
    if (severity && !strcmp(severity, "WARNING") && msg && !strncmp(msg, lost, sizeof lost - 1))
        snprintf(c->doubt, sizeof c->doubt, "%s", msg);
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
    return c ? c->errmsg : pqmq_empty;
}

PQMQ_EXPORT const char *pqmq_sqlstate(const pqmq_client *c)
{
    return c ? c->sqlstate : pqmq_empty;
}

int pqmq__enter(pqmq_client *c, const char *call)
{
    if (!c)
        return PQMQ_EINVAL;
    c->call = call;
    pqmq__clearerr(c);
    return 0;
}

void pqmq__clearerr(pqmq_client *c)
{
    if (c->errmsg != pqmq_empty)
        free(c->errmsg);
    c->errmsg = pqmq_empty;
    c->sqlstate[0] = '\0';
    c->doubt[0] = '\0';
}

/* Sets the error to prefix (NULL: none) and the formatted message. */
static int set_error(pqmq_client *c, int code, const char *prefix, const char *fmt, va_list ap)
{
    char buf[1024];
    size_t n = prefix ? (size_t)snprintf(buf, sizeof buf, "%s: ", prefix) : 0;
    if (n >= sizeof buf)
        n = sizeof buf - 1;
    vsnprintf(buf + n, sizeof buf - n, fmt, ap);
    /* libpq messages end in a newline; ours read better without it. */
    n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    if (c->errmsg != pqmq_empty)
        free(c->errmsg);
    c->errmsg = strdup(buf);
    if (!c->errmsg)
        c->errmsg = pqmq_empty;
    return code;
}

int pqmq__seterr(pqmq_client *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error(c, code, NULL, fmt, ap);
    va_end(ap);
    return code;
}

int pqmq__err(pqmq_client *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error(c, code, c->call, fmt, ap);
    va_end(ap);
    return code;
}

void pqmq__set_sqlstate(pqmq_client *c, const char *state)
{
    snprintf(c->sqlstate, sizeof c->sqlstate, "%s", state ? state : "");
}

static const struct {
    const char *name, *format;
} spec_defs[PQMQ__NSPECS] = {
    [PQMQ__SPEC_UUID] = {"@pqmq_uuid", "%uuid"},
    [PQMQ__SPEC_INT4] = {"@pqmq_int4", "%int4"},
    [PQMQ__SPEC_UUID8] = {"@pqmq_uuid8", "%uuid %uuid %uuid %uuid %uuid %uuid %uuid %uuid"},
    [PQMQ__SPEC_INT4_8] = {"@pqmq_int4_8", "%int4 %int4 %int4 %int4 %int4 %int4 %int4 %int4"},
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

/* libpqtypes' lookup of mq_new_t failed, saying why only in text: a missing
 * schema, or a refusal of the lookup itself (a statement timeout under
 * load, say), which must not read as a missing schema. A probe of our own
 * tells them apart and, when it is refused too, carries the SQLSTATE. */
static int lookup_failed(pqmq_client *c, PGregisterType *t, const char *why)
{
    char *text = strdup(why ? why : "");
    int rc;
    const char *call = c->call; /* the probe's errors name it */
    c->call = "looking up type mq_new_t";
    PGresult *r =
        pqmq__exec_text(c, "SELECT pg_catalog.to_regtype('mq_new_t') IS NOT NULL", &rc);
    c->call = call;
    if (!r) {
        free(text);
        return rc;
    }
    int present = PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    if (!present) {
        rc = pqmq__seterr(c, PQMQ_ESCHEMA,
                          "type mq_new_t not found on the search_path (run pqmq_migrate): %s",
                          text ? text : "");
    } else if (PQregisterTypes(c->conn, PQT_COMPOSITE, t, 1, 0)) {
        c->composite_ready = 1; /* refused once, then found */
        rc = 0;
    } else {
        rc = pqmq__seterr(c, PQMQ_ESERVER, "looking up type mq_new_t failed: %s",
                          text ? text : "");
    }
    free(text);
    return rc;
}

int pqmq__need_composite(pqmq_client *c)
{
    if (c->composite_ready)
        return 0;
    /* Its elements are written by pqmq__put_new_msg (new_msg.c). */
    PGregisterType t = {"mq_new_t", pqmq__put_new_msg, NULL};
    if (!PQregisterTypes(c->conn, PQT_USERDEFINED, &t, 1, 0)) {
        const char *why = PQgeterror();
        if (PQstatus(c->conn) != CONNECTION_OK)
            return pqmq__seterr(c, PQMQ_ECONN, "connection lost: %s", PQerrorMessage(c->conn));
        if (PQtransactionStatus(c->conn) == PQTRANS_INERROR) {
            /* The lookup failed because the caller's transaction already
             * did, not because the schema is missing. */
            int rc = pqmq__seterr(c, PQMQ_ESERVER,
                                  "current transaction is aborted, commands ignored until "
                                  "end of transaction block (SQLSTATE 25P02): roll it back");
            pqmq__set_sqlstate(c, "25P02");
            return rc;
        }
        return lookup_failed(c, &t, why);
    }
    c->composite_ready = 1;
    return 0;
}

int pqmq__reset_conn(pqmq_client *c)
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
    int rc = pqmq__enter(c, "pqmq_reconnect");
    return rc ? rc : pqmq__reset_conn(c);
}
