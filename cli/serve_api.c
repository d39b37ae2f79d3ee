/*
 * serve_api.c: the admin actions of pqmq serve, POST /api/retry and
 * POST /api/skip. The body is a form (application/x-www-form-urlencoded):
 * id=UUID, repeated, and for retry retries=N (default 0), as pqmq retry and
 * pqmq skip take them; or, instead of ids, channel=NAME&all=dead|waiting
 * (&name=NAME: only messages of that name), every such message of the
 * channel (serve_bulk, serve_story.c). serve_http.c has checked --admin, the Host, the
 * Origin and the CSRF token before; what the database role may do stays the
 * database's to decide (mq_retry and mq_skip belong to the administer duty).
 * After a change the snapshot is read again, so the page's next poll shows
 * it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

/* Ids one request may name (the page sends one at a time). */
#define SERVE_MAX_IDS 1000

typedef struct {
    uuid_t ids[SERVE_MAX_IDS];
    size_t n;
    long long retries;
    char *channel, *all, *name; /* the bulk form (NULL: not given) */
} action_form;

/* Keeps a copy of a bulk field's value in *slot; -1 when given twice or
 * out of memory. */
static int keep_field(char **slot, const char *value)
{
    if (*slot)
        return -1;
    *slot = strdup(value);
    return *slot ? 0 : -1;
}

/* Parses the body into f; on a bad field returns -1 with why filled. */
static int parse_form(char *body, int is_retry, action_form *f, char *why, size_t size)
{
    f->n = 0;
    f->retries = 0;
    char *field, *value;
    int got;
    while ((got = serve_form_next(&body, &field, &value)) > 0) {
        if (strcmp(field, "id") == 0) {
            if (f->n == SERVE_MAX_IDS) {
                snprintf(why, size, "at most %d ids in one request", SERVE_MAX_IDS);
                return -1;
            }
            if (strlen(value) != 36 || uuid_parse(value, f->ids[f->n]) != 0) {
                snprintf(why, size, "\"%.40s\" is not a message id", value);
                return -1;
            }
            f->n++;
        } else if (strcmp(field, "channel") == 0 || strcmp(field, "all") == 0 ||
                   strcmp(field, "name") == 0) {
            char **slot = field[0] == 'c' ? &f->channel : field[0] == 'a' ? &f->all : &f->name;
            if (keep_field(slot, value)) {
                snprintf(why, size, "%s: given twice", field);
                return -1;
            }
        } else if (strcmp(field, "retries") == 0 && is_retry) {
            char *end;
            errno = 0;
            long long v = strtoll(value, &end, 10);
            if (errno || end == value || *end || v < 0 || v > 2147483646) {
                snprintf(why, size, "retries: \"%.20s\" is not a whole number in 0..2147483646",
                         value);
                return -1;
            }
            f->retries = v;
        } else {
            snprintf(why, size, "unexpected form field \"%.40s\"", field);
            return -1;
        }
    }
    if (got < 0) {
        snprintf(why, size, "a form field is not properly encoded");
        return -1;
    }
    if (f->channel || f->all || f->name) {
        if (f->n || !f->channel || !f->all) {
            snprintf(why, size, "either ids (id=) or a whole channel (channel= and all=)");
            return -1;
        }
        return 0;
    }
    if (f->n == 0) {
        snprintf(why, size, "no message id given (form field id)");
        return -1;
    }
    return 0;
}

/* The HTTP status for a failed call: a role without the duty is refused. */
static unsigned failure_status(const serve *s, int rc)
{
    const char *state = pqmq_sqlstate(s->t->client);
    if (rc == PQMQ_ESERVER && state && strcmp(state, "42501") == 0)
        return 403;
    if (rc == PQMQ_EINVAL)
        return 400;
    if (rc == PQMQ_ECONN)
        return 503;
    return 500;
}

unsigned serve_action(serve *s, const char *action, const char *body, size_t len,
                      const char *peer, FILE *out)
{
    if (strcmp(action, "pause") == 0 || strcmp(action, "resume") == 0)
        return serve_pause_action(s, action, body, len, peer, out);
    int is_retry = strcmp(action, "retry") == 0;
    char why[160];
    char *copy = malloc(len + 1);
    action_form *f = malloc(sizeof *f);
    if (!copy || !f) {
        free(copy);
        free(f);
        return serve_json_error(out, 500, "out of memory");
    }
    memcpy(copy, body, len);
    copy[len] = '\0';
    f->channel = f->all = f->name = NULL;
    int bad = memchr(body, '\0', len) != NULL || parse_form(copy, is_retry, f, why, sizeof why);
    free(copy);
    if (bad) {
        free(f->channel);
        free(f->all);
        free(f->name);
        free(f);
        return serve_json_error(out, 400,
                                memchr(body, '\0', len) ? "a NUL byte in the form" : why);
    }

    unsigned status = 200;
    size_t done = 0;
    pthread_mutex_lock(&s->db_lock);
    int rc = serve_connect(s) || tool_begin(s->t) ? PQMQ_ECONN : PQMQ_OK;
    if (f->channel) {
        status = rc == PQMQ_OK ? serve_bulk(s, action, f->channel, f->all, f->name, f->retries,
                                            &done, why, sizeof why)
                               : 503;
        if (rc != PQMQ_OK)
            snprintf(why, sizeof why, "no connection to the server");
        if (tool_commit(s->t) && status == 200) {
            status = 503;
            snprintf(why, sizeof why, "the commit failed");
        }
        if (status != 200) {
            tool_log(s->t, "warning", "%s of channel %s's %s messages from %s refused: %s",
                     action, f->channel, f->all, peer, why);
            serve_json_error(out, status, why);
        } else {
            tool_log(s->t, "info", "%s of channel %s's %s messages from %s: %zu done", action,
                     f->channel, f->all, peer, done);
            fprintf(out, "{\"action\": \"%s\", \"all\": ", action);
            out_json_str(out, f->all, strlen(f->all));
            fprintf(out, ", \"done\": %zu}\n", done);
            serve_sample(s);
        }
        pthread_mutex_unlock(&s->db_lock);
        free(f->channel);
        free(f->all);
        free(f->name);
        free(f);
        return status;
    }
    if (rc == PQMQ_OK)
        rc = is_retry ? pqmq_retry(s->t->client, f->ids, f->n, (int)f->retries, &done)
                      : pqmq_skip(s->t->client, f->ids, f->n, &done);
    if (tool_commit(s->t) && rc == PQMQ_OK)
        rc = PQMQ_ECONN;
    if (rc != PQMQ_OK) {
        status = failure_status(s, rc);
        const char *msg = s->t->client ? tool_lib_error(pqmq_errmsg(s->t->client))
                                       : "no connection to the server";
        tool_log(s->t, "warning", "%s of %zu message%s from %s refused: %s", action, f->n,
                 f->n == 1 ? "" : "s", peer, msg);
        serve_json_error(out, status, msg);
    } else {
        tool_log(s->t, "info", "%s of %zu message%s from %s: %zu done", action, f->n,
                 f->n == 1 ? "" : "s", peer, done);
        fprintf(out, "{\"action\": \"%s\", \"asked\": %zu, \"done\": %zu}\n", action, f->n,
                done);
        serve_sample(s);
    }
    pthread_mutex_unlock(&s->db_lock);
    free(f);
    return status;
}
