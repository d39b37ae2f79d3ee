/*
 * error.c: the error of a client's last call: its code's text, its message
 * (prefixed with the call's name, which the call records on entry) and the
 * server's SQLSTATE.
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
    case PQMQ_ESCHEMA: return "queue schema missing";
    case PQMQ_ESTALE: return "message delivered again since; not yours to settle";
    default: return "unknown error";
    }
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
