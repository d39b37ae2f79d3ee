/*
 * serve_pause.c: POST /api/pause and POST /api/resume of pqmq serve. The
 * body is a form (application/x-www-form-urlencoded): channel=NAME, and for
 * pause an optional reason=TEXT, as pqmq pause takes them. serve_http.c has
 * checked --admin, the Host, the Origin and the CSRF token before (as for
 * retry and skip); mq_pause and mq_resume belong to the administer duty, so
 * the database decides whether the role may. The snapshot is read again
 * after a change, so the page's next poll shows it.
 */
#include <stdlib.h>
#include <string.h>

#include "serve.h"

/* Longest channel name or reason a form may carry. */
#define SERVE_MAX_FIELD 1024

/* Parses body (changed in place) into *channel and *reason (pointers into
 * it); on a bad form returns -1 with why filled. */
static int parse(char *body, int is_pause, char **channel, char **reason, char *why,
                 size_t size)
{
    *channel = *reason = NULL;
    char *field, *value;
    int got;
    while ((got = serve_form_next(&body, &field, &value)) > 0) {
        char **slot = strcmp(field, "channel") == 0              ? channel
                      : strcmp(field, "reason") == 0 && is_pause ? reason
                                                                 : NULL;
        if (!slot) {
            snprintf(why, size, "unexpected form field \"%.40s\"", field);
            return -1;
        }
        if (*slot) {
            snprintf(why, size, "form field %s given twice (one channel a request)", field);
            return -1;
        }
        if (strlen(value) > SERVE_MAX_FIELD) {
            snprintf(why, size, "%s is longer than %d bytes", field, SERVE_MAX_FIELD);
            return -1;
        }
        *slot = value;
    }
    if (got < 0) {
        snprintf(why, size, "a form field is not properly encoded");
        return -1;
    }
    if (!*channel || !**channel) {
        snprintf(why, size, "no channel given (form field channel)");
        return -1;
    }
    return 0;
}

unsigned serve_pause_action(serve *s, const char *action, const char *body, size_t len,
                            const char *peer, FILE *out)
{
    int is_pause = strcmp(action, "pause") == 0;
    if (memchr(body, '\0', len))
        return serve_json_error(out, 400, "a NUL byte in the form");
    char *copy = malloc(len + 1);
    if (!copy)
        return serve_json_error(out, 500, "out of memory");
    memcpy(copy, body, len);
    copy[len] = '\0';
    char why[160], *channel, *reason;
    if (parse(copy, is_pause, &channel, &reason, why, sizeof why)) {
        free(copy);
        return serve_json_error(out, 400, why);
    }

    unsigned status = 200;
    pthread_mutex_lock(&s->db_lock);
    int rc = serve_connect(s) || tool_begin(s->t) ? PQMQ_ECONN : PQMQ_OK;
    if (rc == PQMQ_OK)
        rc = is_pause ? pqmq_pause(s->t->client, channel, reason)
                      : pqmq_resume(s->t->client, channel);
    int changed = rc > 0;
    if (rc > 0)
        rc = PQMQ_OK;
    if (tool_commit(s->t) && rc == PQMQ_OK)
        rc = PQMQ_ECONN;
    if (rc != PQMQ_OK) {
        const char *state = s->t->client ? pqmq_sqlstate(s->t->client) : NULL;
        status = rc == PQMQ_ESERVER && state && strcmp(state, "42501") == 0 ? 403
                 : rc == PQMQ_EINVAL                                        ? 400
                 : rc == PQMQ_ECONN                                         ? 503
                                                                            : 500;
        const char *msg = s->t->client ? tool_lib_error(pqmq_errmsg(s->t->client))
                                       : "no connection to the server";
        tool_log(s->t, "warning", "%s of a channel from %s refused: %s", action, peer, msg);
        serve_json_error(out, status, msg);
    } else {
        tool_log(s->t, "info", "%s of a channel from %s: %s", action, peer,
                 changed ? "done" : "nothing to do");
        fprintf(out, "{\"action\": \"%s\", \"channel\": ", action);
        out_json_str(out, channel, strlen(channel));
        fprintf(out, ", \"done\": %d}\n", changed);
        serve_sample(s);
    }
    pthread_mutex_unlock(&s->db_lock);
    free(copy);
    return status;
}
