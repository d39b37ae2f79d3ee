/*
 * serve_story.c: pqmq serve's pages about messages.
 *
 *   GET /api/message?id=UUID   one message's story (mq_message, as pqmq show
 *                              --json prints it); the payload's preview
 *                              (mq_message_payload) only on an --admin server
 *   GET /api/messages?channel=NAME&kind=dead|waiting[&name=NAME][&max=N]
 *                              a channel's dead messages, or those waiting in
 *                              their chains (mq_waiting), of one message name
 *                              when given; at most N (default 500)
 *
 * and the bulk form of POST /api/retry and /api/skip (serve_api.c parses
 * it): channel=NAME&all=dead|waiting[&name=NAME], every such message of the
 * channel, in rounds of up to 10000.
 *
 * Values from the query string arrive as sent (serve_http.c keeps escapes):
 * they are decoded here (serve_form_decode, as the admin forms are), and
 * travel to the server as parameters.
 */
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "serve.h"

#define LIST_DEFAULT 500
#define BULK_ROUND 10000
#define BULK_ROUNDS 100

/* The query argument name, decoded into a new string (*out, caller frees;
 * NULL when absent). Returns 0, or -1 for a broken escape or a NUL. */
static int query_arg(struct MHD_Connection *c, const char *name, char **out)
{
    *out = NULL;
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    if (!v)
        return 0;
    char *d = strdup(v);
    if (!d || serve_form_decode(d)) {
        free(d);
        return -1;
    }
    *out = d;
    return 0;
}

/* Runs sql; on failure returns NULL with the HTTP status (403 for a role
 * without the duty, 503 for a lost connection, else 500) and the reason. */
static PGresult *run(serve *s, const char *sql, int n, const char *const *params,
                     unsigned *status, char *why, size_t size)
{
    PGresult *r = PQexecParams(s->t->conn, sql, n, NULL, params, NULL, NULL, 0);
    ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)
        return r;
    const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    *status = PQstatus(s->t->conn) != CONNECTION_OK   ? 503
              : state && strcmp(state, "42501") == 0  ? 403
              : state && strncmp(state, "22", 2) == 0 ? 400
                                                      : 500;
    snprintf(why, size, "%s",
             tool_first_line(r ? PQresultErrorMessage(r) : PQerrorMessage(s->t->conn)));
    PQclear(r);
    return NULL;
}

static const char list_dead_sql[] =
    "SELECT pg_catalog.jsonb_build_object('channel', $1::text, 'kind', 'dead', 'name', "
    "$2::text, "
    "'messages', COALESCE(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object("
    "'id', d.id, 'args', d.channel_args, 'name', d.name, 'deliveries', d.attempts, "
    "'error', d.last_error, 'dead_since', d.dead_since, 'blocking', d.blocking) "
    "ORDER BY d.dead_since, d.id), '[]'::jsonb), "
    "'count', pg_catalog.count(d.id))::text "
    "FROM (SELECT x.* FROM mq_dead_letters(ARRAY[$1::text], 10000) x "
    "WHERE $2::text IS NULL OR x.name OPERATOR(pg_catalog.=) $2::text "
    "ORDER BY x.dead_since, x.id LIMIT $3::int) d";

static const char list_waiting_sql[] =
    "SELECT pg_catalog.jsonb_build_object('channel', $1::text, 'kind', 'waiting', "
    "'name', $2::text, "
    "'messages', COALESCE(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object("
    "'id', w.id, 'args', w.channel_args, 'name', w.name, 'chain_ahead', w.chain_ahead, "
    "'chain_head', w.chain_head, 'head_dead', w.head_dead, 'created_at', w.created_at) "
    "ORDER BY w.o), '[]'::jsonb), "
    "'count', pg_catalog.count(w.id))::text "
    "FROM (SELECT x.*, pg_catalog.row_number() OVER () AS o FROM mq_waiting($1::text, 10000) x "
    "WHERE $2::text IS NULL OR x.name OPERATOR(pg_catalog.=) $2::text LIMIT $3::int) w";

/* Answers a GET of /api/message or /api/messages; db_lock held. */
static unsigned story_get(serve *s, struct MHD_Connection *c, const char *url, FILE *out)
{
    char why[512];
    unsigned status = 200;
    char *id = NULL, *channel = NULL, *kind = NULL, *name = NULL, *max = NULL;
    int bad = query_arg(c, "id", &id) | query_arg(c, "channel", &channel) |
              query_arg(c, "kind", &kind) | query_arg(c, "name", &name) |
              query_arg(c, "max", &max);
    PGresult *r = NULL;
    uuid_t u;
    if (bad) {
        status = serve_json_error(out, 400, "a query argument is not properly encoded");
    } else if (strcmp(url, "/api/message") == 0) {
        if (!id || strlen(id) != 36 || uuid_parse(id, u) != 0) {
            status = serve_json_error(out, 400, "id: not a message id (a UUID)");
        } else {
            char lower[37];
            uuid_unparse_lower(u, lower);
            const char *p[3] = {lower, s->admin ? "t" : "f", "4096"};
            r = run(s, tool_message_sql, 3, p, &status, why, sizeof why);
            if (!r)
                serve_json_error(out, status, why);
            else if (PQntuples(r) == 0) {
                snprintf(why, sizeof why,
                         "no message %s (completed, deleted or never inserted)", lower);
                status = serve_json_error(out, 404, why);
            } else
                fprintf(out, "%s\n", PQgetvalue(r, 0, 0));
        }
    } else {
        long n = max ? strtol(max, NULL, 10) : LIST_DEFAULT;
        int dead = kind && strcmp(kind, "dead") == 0;
        if (!channel) {
            status = serve_json_error(out, 400, "channel: missing");
        } else if (!dead && !(kind && strcmp(kind, "waiting") == 0)) {
            status = serve_json_error(out, 400, "kind: dead or waiting");
        } else if (n < 1 || n > 10000) {
            status = serve_json_error(out, 400, "max: a whole number in 1..10000");
        } else {
            char ns[16];
            snprintf(ns, sizeof ns, "%ld", n);
            const char *p[3] = {channel, name && *name ? name : NULL, ns};
            r = run(s, dead ? list_dead_sql : list_waiting_sql, 3, p, &status, why, sizeof why);
            if (!r)
                serve_json_error(out, status, why);
            else
                fprintf(out, "%s\n", PQgetvalue(r, 0, 0));
        }
    }
    PQclear(r);
    free(id);
    free(channel);
    free(kind);
    free(name);
    free(max);
    return status;
}

unsigned serve_story(serve *s, struct MHD_Connection *c, const char *url, FILE *out)
{
    pthread_mutex_lock(&s->db_lock);
    unsigned status;
    if (serve_connect(s) || tool_begin(s->t)) {
        status = serve_json_error(out, 503, "no connection to the server");
    } else {
        status = story_get(s, c, url, out);
        tool_commit(s->t);
    }
    pthread_mutex_unlock(&s->db_lock);
    return status;
}

unsigned serve_bulk(serve *s, const char *action, const char *channel, const char *kind,
                    const char *name, long long retries, size_t *done, char *why, size_t size)
{
    static const char retry_dead[] =
        "SELECT mq_retry(ARRAY(SELECT d.id FROM mq_dead_letters(ARRAY[$1::text], 10000) d "
        "WHERE $2::text IS NULL OR d.name OPERATOR(pg_catalog.=) $2::text), $3::int)";
    static const char skip_dead[] =
        "SELECT mq_skip(ARRAY(SELECT d.id FROM mq_dead_letters(ARRAY[$1::text], 10000) d "
        "WHERE d.blocking AND ($2::text IS NULL OR d.name OPERATOR(pg_catalog.=) $2::text)))";
    static const char skip_waiting[] =
        "SELECT mq_skip(ARRAY(SELECT w.id FROM mq_waiting($1::text, 10000) w "
        "WHERE $2::text IS NULL OR w.name OPERATOR(pg_catalog.=) $2::text))";
    int is_retry = strcmp(action, "retry") == 0, dead = strcmp(kind, "dead") == 0;
    if (!dead && strcmp(kind, "waiting") != 0) {
        snprintf(why, size, "all: dead or waiting");
        return 400;
    }
    if (is_retry && !dead) {
        snprintf(why, size, "retry takes dead messages (all=dead); waiting ones are skipped");
        return 400;
    }
    const char *sql = is_retry ? retry_dead : dead ? skip_dead : skip_waiting;
    char rs[24];
    snprintf(rs, sizeof rs, "%lld", retries);
    const char *p[3] = {channel, name && *name ? name : NULL, rs};
    *done = 0;
    /* Each round takes what is still dead (or waiting): those moved on
     * are not found again, so the rounds end. */
    for (int round = 0; round < BULK_ROUNDS; round++) {
        unsigned status = 200;
        PGresult *r = run(s, sql, is_retry ? 3 : 2, p, &status, why, size);
        if (!r)
            return status;
        long n = strtol(PQgetvalue(r, 0, 0), NULL, 10);
        PQclear(r);
        *done += (size_t)n;
        if (n < BULK_ROUND)
            break;
    }
    return 200;
}
