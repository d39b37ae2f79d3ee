/*
 * log.c: the log function a client or a runner reports to (pqmq_set_log,
 * pqmq_runner_set_log). A library prints nothing of its own: lines go to
 * the application's function, or nowhere.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pqmq-int.h"

PQMQ_EXPORT const char *pqmq_log_level_name(int level)
{
    switch (level) {
    case PQMQ_LOG_ERROR: return "error";
    case PQMQ_LOG_WARN: return "warn";
    case PQMQ_LOG_INFO: return "info";
    case PQMQ_LOG_DEBUG: return "debug";
    default: return "unknown";
    }
}

PQMQ_EXPORT int pqmq_set_log(pqmq_client *c, pqmq_log_fn fn, void *ctx)
{
    if (!c)
        return PQMQ_EINVAL;
    pqmq__client_set_log(c, &(pqmq__logger){fn, ctx, NULL}, NULL);
    c->notices_to_log = fn != NULL; /* NULL: back to libpq's receiver */
    return 0;
}

void pqmq__client_set_log(pqmq_client *c, const pqmq__logger *log, const char *label)
{
    c->log = log ? *log : (pqmq__logger){NULL, NULL, NULL};
    c->notices_to_log = 1;
    snprintf(c->log_label, sizeof c->log_label, "%s", label ? label : "");
}

/* Copies s into out as one line: each run of white space holding a line
 * break becomes "; " and trailing ones go ("a\nb\n" -> "a; b"). A log line
 * is one line, which grep and journald keep whole. */
void pqmq__one_line(const char *s, char *out, size_t outlen)
{
    size_t o = 0;
    while (*s && o + 1 < outlen) {
        size_t run = strspn(s, " \t\r\n");
        if (run && memchr(s, '\n', run)) {
            s += run;
            if (!*s)
                break;
            if (o + 3 >= outlen)
                break;
            out[o++] = ';';
            out[o++] = ' ';
            continue;
        }
        out[o++] = *s++;
    }
    out[o] = '\0';
}

void pqmq__log(const pqmq__logger *log, int level, const char *fmt, ...)
{
    if (!log || !log->fn)
        return;
    char text[1024], line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    pqmq__one_line(text, line, sizeof line);
    if (log->lock)
        pthread_mutex_lock(log->lock);
    log->fn(log->ctx, level, line);
    if (log->lock)
        pthread_mutex_unlock(log->lock);
}

void pqmq__conn_error(pqmq_client *c, char *out, size_t len)
{
    PGconn *conn = pqmq_conn(c);
    const char *msg = PQstatus(conn) == CONNECTION_BAD || !pqmq_errmsg(c)[0]
                          ? PQerrorMessage(conn)
                          : pqmq_errmsg(c);
    char text[1024], one[512];
    snprintf(text, sizeof text, "%s", msg);
    /* The CONTEXT of an error in a statement quotes its SQL, over lines;
     * the operator needs the error, not our statements. */
    char *context = strstr(text, "\nCONTEXT:");
    if (context)
        *context = '\0';
    pqmq__one_line(text, one, sizeof one);
    if (c->last_words[0] && !strstr(one, c->last_words))
        snprintf(out, len, "%s%s%s", c->last_words, one[0] ? "; " : "", one);
    else
        snprintf(out, len, "%s", one[0] ? one : "connection lost");
}
