/*
 * serve_http.c: pqmq serve's HTTP side, on libmicrohttpd.
 *
 *   GET  /              the dashboard (cli/assets/index.html, CSRF token in)
 *   GET  /app.js ...    the other files of cli/assets/
 *   GET  /api/state     the snapshot as JSON; the page polls it
 *   GET  /metrics       the Prometheus text of pqmq metrics
 *   GET  /healthz       "ok", or 503 while the queue cannot be read
 *   GET  /api/message   a message's story, a channel's dead or waiting
 *   GET  /api/messages  messages (serve_story.c)
 *   POST /api/retry     admin actions (serve_api.c), only with --admin
 *   POST /api/skip
 *   POST /api/pause     (serve_pause.c: channel=NAME)
 *   POST /api/resume
 *
 * Every request but /metrics must name an accepted Host (an IP literal,
 * localhost or a --host name), so a page on another site that rebinds its
 * DNS name to this address gets nothing; a request without a Host is
 * refused too. A POST must also come from this origin (Origin equal to
 * Host, Sec-Fetch-Site same-origin when sent) and carry the token in
 * X-Pqmq-Token: the page's, or with --admin-token-file the file's.
 *
 * One thread per connection, at most CONN_LIMIT of them, each dropped
 * after --timeout seconds without progress. Every local process can
 * connect, and can hold connections open by sending half a request, from
 * as many loopback addresses as it likes: so no per-address share, but
 * once KEEP_LIMIT connections are open, each new one closes the connection
 * that has waited longest for its next request (conn_notify). A client
 * that holds connections cannot lock out the next one, /metrics and
 * /healthz included: that one is the newest, and sends its request at once.
 * Only a POST may have a body (the admin actions, after their checks), so
 * no request stays in progress for longer than its answer takes to write.
 * Request line and headers must fit in MEMORY_LIMIT (libmicrohttpd answers
 * 431 otherwise), a POST body in BODY_MAX.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <sys/socket.h>

#include <microhttpd.h>

#include "serve.h"

#define CONN_LIMIT 64
#define KEEP_LIMIT 48 /* the rest: room while the closed ones wind down */
#define MEMORY_LIMIT (32 * 1024)
#define BODY_MAX (16 * 1024)
#define STACK_SIZE (512 * 1024)

#define TOKEN_HEADER "X-Pqmq-Token"
#define FORM_TYPE "application/x-www-form-urlencoded"
#define CSP                                                                                    \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "                \
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

typedef enum { R_PAGE, R_ASSET, R_STATE, R_METRICS, R_HEALTH, R_ACTION, R_STORY } route_kind;

typedef struct {
    route_kind kind;
    const serve_asset *asset; /* R_ASSET */
    const char *action;       /* R_ACTION: "retry", "skip", "pause" or "resume" */
} route;

/* An accepted request: its route and, for a POST, its body. Answered at
 * the call after the headers, not during it: libmicrohttpd closes the
 * connection after an answer queued before the request was read whole, and
 * keeps it open otherwise (the page polls; Prometheus scrapes). */
typedef struct {
    route r;
    char *body;
    size_t len;
    int too_big;
} request;

/* An open connection, as conn_notify sees it (under
 * conn_lock): whether a request is being answered on it, and since when
 * it has waited for one. */
typedef struct conn {
    int fd; /* the socket, read at the start: another thread's connection
             * info is not ours to ask (libmicrohttpd answers in a buffer of
             * the connection's) */
    struct conn *prev, *next;
    double waiting_since;
    int busy;
} conn;

static pthread_mutex_t conn_lock = PTHREAD_MUTEX_INITIALIZER;
static conn *conns; /* newest first */
static size_t nconns;

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Marks c's connection busy (its request is read, the answer under way) or
 * waiting again (the answer is sent). */
static void conn_mark(struct MHD_Connection *c, int busy)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (!ci || !ci->socket_context)
        return;
    conn *k = ci->socket_context;
    pthread_mutex_lock(&conn_lock);
    k->busy = busy;
    k->waiting_since = mono_now();
    pthread_mutex_unlock(&conn_lock);
}

/* The connection to close for a new one: the one waiting longest for a
 * request, else (all busy) the oldest busy one. conn_lock held. */
static conn *conn_victim(const conn *fresh)
{
    conn *best = NULL;
    for (conn *k = conns; k; k = k->next) {
        if (k == fresh)
            continue;
        if (!best || (best->busy && !k->busy) ||
            (best->busy == k->busy && k->waiting_since < best->waiting_since))
            best = k;
    }
    return best;
}

static void conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                        enum MHD_ConnectionNotificationCode code)
{
    (void)cls;
    conn *k = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        if (!k)
            return;
        /* libmicrohttpd closes the socket after this call: under conn_lock
         * no shutdown below can reach a descriptor that was reused. */
        pthread_mutex_lock(&conn_lock);
        if (k->prev)
            k->prev->next = k->next;
        else
            conns = k->next;
        if (k->next)
            k->next->prev = k->prev;
        nconns--;
        pthread_mutex_unlock(&conn_lock);
        free(k);
        *socket_context = NULL;
        return;
    }
    k = calloc(1, sizeof *k);
    if (!k)
        return; /* untracked: never chosen to close */
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    k->fd = ci ? ci->connect_fd : -1;
    k->waiting_since = mono_now();
    *socket_context = k;
    pthread_mutex_lock(&conn_lock);
    k->next = conns;
    if (conns)
        conns->prev = k;
    conns = k;
    if (++nconns > KEEP_LIMIT) {
        conn *victim = conn_victim(k);
        /* Its thread sees the end of the stream and closes it. */
        if (victim && victim->fd >= 0)
            shutdown(victim->fd, SHUT_RDWR);
        if (victim) /* not chosen again while it winds down */
            victim->waiting_since = mono_now() + 1e9;
    }
    pthread_mutex_unlock(&conn_lock);
}

static int find_route(const char *url, route *r)
{
    static const struct {
        const char *path;
        route_kind kind;
        const char *action;
    } fixed[] = {
        {"/", R_PAGE, NULL},
        {"/index.html", R_PAGE, NULL},
        {"/api/state", R_STATE, NULL},
        {"/metrics", R_METRICS, NULL},
        {"/healthz", R_HEALTH, NULL},
        {"/api/retry", R_ACTION, "retry"},
        {"/api/skip", R_ACTION, "skip"},
        {"/api/pause", R_ACTION, "pause"},
        {"/api/resume", R_ACTION, "resume"},
        {"/api/message", R_STORY, NULL},
        {"/api/messages", R_STORY, NULL},
    };
    *r = (route){0};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (strcmp(url, fixed[i].path) == 0) {
            r->kind = fixed[i].kind;
            r->action = fixed[i].action;
            return 1;
        }
    for (size_t i = 0; i < serve_asset_count; i++)
        if (strcmp(url, serve_assets[i].path) == 0) {
            r->kind = R_ASSET;
            r->asset = &serve_assets[i];
            return 1;
        }
    return 0;
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type,
                             const void *body, size_t len, const char *allow)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", type);
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "X-Frame-Options", "DENY");
    MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(resp, "Content-Security-Policy", CSP);
    if (allow)
        MHD_add_response_header(resp, "Allow", allow);
    enum MHD_Result ret = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

unsigned serve_json_error(FILE *out, unsigned status, const char *msg)
{
    fputs("{\"error\": ", out);
    out_json_str(out, msg, strlen(msg));
    fputs("}\n", out);
    return status;
}

/* An error: JSON under /api/, one line of text elsewhere. */
static enum MHD_Result refuse(struct MHD_Connection *c, const char *url, unsigned status,
                              const char *allow, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static enum MHD_Result refuse(struct MHD_Connection *c, const char *url, unsigned status,
                              const char *allow, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char *body = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&body, &len);
    if (!f)
        return MHD_NO;
    int json = strncmp(url, "/api/", 5) == 0;
    if (json)
        serve_json_error(f, status, msg);
    else
        fprintf(f, "%u %s\n", status, msg);
    fclose(f);
    enum MHD_Result ret = reply(
        c, status, json ? "application/json" : "text/plain; charset=utf-8", body, len, allow);
    free(body);
    return ret;
}

/* Host names a page of another site cannot be served under: IP literals,
 * localhost, and what --host accepts. A request without one (HTTP/1.0, or
 * an empty value) names nothing that can be checked: refused. */
static int host_ok(const serve *s, const char *host)
{
    if (!host || !*host)
        return 0;
    char name[256];
    unsigned char addr[16];
    if (host[0] == '[') {
        size_t n = strcspn(host + 1, "]");
        if (host[1 + n] != ']' || n >= sizeof name)
            return 0;
        memcpy(name, host + 1, n);
        name[n] = '\0';
        return inet_pton(AF_INET6, name, addr) == 1;
    }
    size_t n = strcspn(host, ":");
    if (n == 0 || n >= sizeof name)
        return 0;
    memcpy(name, host, n);
    name[n] = '\0';
    if (inet_pton(AF_INET, name, addr) == 1 || strcasecmp(name, "localhost") == 0)
        return 1;
    for (size_t i = 0; i < s->nhosts; i++)
        if (strcasecmp(name, s->hosts[i]) == 0)
            return 1;
    return 0;
}

/* The Origin of a POST is this server's: scheme, then exactly the Host. */
static int origin_ok(const char *origin, const char *host)
{
    if (!origin || !host)
        return 0;
    const char *rest = NULL;
    if (strncmp(origin, "http://", 7) == 0)
        rest = origin + 7;
    else if (strncmp(origin, "https://", 8) == 0)
        rest = origin + 8;
    return rest && strcasecmp(rest, host) == 0;
}

/* Compares the whole token whatever the first difference (its length is no
 * secret). */
static int token_ok(const serve *s, const char *given)
{
    size_t n = strlen(s->token);
    if (!given || strlen(given) != n)
        return 0;
    unsigned char diff = 0;
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)(given[i] ^ s->token[i]);
    return diff == 0;
}

static void peer_of(struct MHD_Connection *c, char *buf, size_t size)
{
    snprintf(buf, size, "?");
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr)
        return;
    socklen_t len = ci->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                           : sizeof(struct sockaddr_in);
    getnameinfo(ci->client_addr, len, buf, (socklen_t)size, NULL, 0, NI_NUMERICHOST);
}

static const char *header(struct MHD_Connection *c, const char *name)
{
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
}

/* Renders the snapshot with fn under snap_lock. */
static enum MHD_Result reply_snapshot(serve *s, struct MHD_Connection *c, route_kind kind)
{
    char *body = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&body, &len);
    if (!f)
        return MHD_NO;
    unsigned status = 200;
    pthread_mutex_lock(&s->snap_lock);
    if (kind == R_METRICS) {
        if (serve_render_metrics(s, f))
            status = 503;
    } else if (kind == R_HEALTH) {
        if (s->error || !s->rows) {
            fprintf(f, "pqmq serve: cannot read the queue: %s\n",
                    s->error ? s->error : "no sample yet");
            status = 503;
        } else {
            fputs("ok\n", f);
        }
    } else {
        serve_render_state(s, f);
    }
    pthread_mutex_unlock(&s->snap_lock);
    fclose(f);
    const char *type = kind == R_STATE     ? "application/json"
                       : kind == R_METRICS ? (status == 200 ? "text/plain; version=0.0.4; "
                                                              "charset=utf-8"
                                                            : "text/plain; charset=utf-8")
                                           : "text/plain; charset=utf-8";
    enum MHD_Result ret = reply(c, status, type, body, len, NULL);
    free(body);
    return ret;
}

/* A message's story or a channel's list (serve_story.c). */
static enum MHD_Result reply_story(serve *s, struct MHD_Connection *c, const char *url)
{
    char *body = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&body, &len);
    if (!f)
        return MHD_NO;
    unsigned status = serve_story(s, c, url, f);
    fclose(f);
    enum MHD_Result ret = reply(c, status, "application/json", body, len, NULL);
    free(body);
    return ret;
}

static enum MHD_Result get(serve *s, struct MHD_Connection *c, const char *url, const route *r)
{
    switch (r->kind) {
    case R_STORY: return reply_story(s, c, url);
    case R_PAGE: return reply(c, 200, "text/html; charset=utf-8", s->page, s->page_len, NULL);
    case R_ASSET: return reply(c, 200, r->asset->type, r->asset->data, r->asset->len, NULL);
    default: return reply_snapshot(s, c, r->kind);
    }
}

/* The checks a POST passes before its body is read. Returns 0, or queues
 * the refusal and returns 1 (ret holds MHD's answer). */
static int post_refused(serve *s, struct MHD_Connection *c, const char *url,
                        enum MHD_Result *ret)
{
    const char *host = header(c, "Host");
    const char *why = NULL;
    unsigned status = 403;
    const char *type = header(c, "Content-Type");
    const char *length = header(c, "Content-Length");
    const char *site = header(c, "Sec-Fetch-Site");
    if (!s->admin) {
        why = "read-only: this pqmq serve was started without --admin";
    } else if (!origin_ok(header(c, "Origin"), host)) {
        why = "the Origin header is missing or not this server's";
    } else if (site && strcmp(site, "same-origin") != 0) {
        why = "not sent by this server's page (Sec-Fetch-Site)";
    } else if (!token_ok(s, header(c, TOKEN_HEADER))) {
        why = s->token_file ? "missing or wrong " TOKEN_HEADER " (the first line of the "
                              "--admin-token-file)"
                            : "missing or wrong " TOKEN_HEADER " (reload the page)";
    } else if (!type || strncasecmp(type, FORM_TYPE, strlen(FORM_TYPE)) != 0) {
        status = 415;
        why = "the body must be " FORM_TYPE;
    } else if (length && strtoull(length, NULL, 10) > BODY_MAX) {
        status = 413;
        why = "the body is too large";
    }
    if (!why)
        return 0;
    char peer[64];
    peer_of(c, peer, sizeof peer);
    tool_log(s->t, "warning", "POST %s from %s refused: %s", url, peer, why);
    *ret = refuse(c, url, status, NULL, "%s", why);
    return 1;
}

/* Keeps a POST's body (up to BODY_MAX); other bodies are dropped. */
static int receive(request *rq, const char *data, size_t size)
{
    if (rq->r.kind != R_ACTION)
        return 0;
    if (rq->too_big || rq->len + size > BODY_MAX) {
        rq->too_big = 1;
        return 0;
    }
    char *grown = realloc(rq->body, rq->len + size);
    if (!grown)
        return -1;
    memcpy(grown + rq->len, data, size);
    rq->body = grown;
    rq->len += size;
    return 0;
}

/* Answers an accepted request, read whole. */
static enum MHD_Result answer(serve *s, struct MHD_Connection *c, const char *url,
                              const request *rq)
{
    if (rq->r.kind != R_ACTION)
        return get(s, c, url, &rq->r);
    if (rq->too_big)
        return refuse(c, url, 413, NULL, "the body is larger than %d bytes", BODY_MAX);
    char *body = NULL, peer[64];
    size_t len = 0;
    FILE *f = open_memstream(&body, &len);
    if (!f)
        return MHD_NO;
    peer_of(c, peer, sizeof peer);
    unsigned status = serve_action(s, rq->r.action, rq->body ? rq->body : "", rq->len, peer, f);
    fclose(f);
    enum MHD_Result ret = reply(c, status, "application/json", body, len, NULL);
    free(body);
    return ret;
}

/* The checks of a request's headers: a refusal is queued at once (and the
 * connection closed after it), an accepted request gets its request. */
static enum MHD_Result accept_request(serve *s, struct MHD_Connection *c, const char *url,
                                      const char *method, void **con_cls)
{
    route r;
    if (!find_route(url, &r))
        return refuse(c, url, 404, NULL,
                      "not found (the dashboard is at /, metrics at /metrics)");
    if (r.kind != R_METRICS && !host_ok(s, header(c, "Host")))
        return refuse(c, url, 403, NULL,
                      "Host not accepted (or missing): use an IP address or localhost, or "
                      "start pqmq serve with --host NAME");
    int is_get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    const char *length = header(c, "Content-Length");
    if (r.kind == R_ACTION) {
        if (strcmp(method, "POST") != 0)
            return refuse(c, url, 405, "POST", "%s: use POST", url);
        enum MHD_Result ret;
        if (post_refused(s, c, url, &ret))
            return ret;
    } else if (!is_get) {
        return refuse(c, url, 405, "GET, HEAD", "%s: use GET", url);
    } else if (header(c, "Transfer-Encoding") || (length && strtoull(length, NULL, 10) > 0)) {
        /* A body would keep the request in progress for as long as its
         * sender trickles it: only the admin actions take one. */
        return refuse(c, url, 413, NULL, "%s: a GET has no body", url);
    }
    request *rq = calloc(1, sizeof *rq);
    if (!rq)
        return MHD_NO;
    rq->r = r;
    *con_cls = rq;
    conn_mark(c, 1);
    return MHD_YES;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_data_size, void **con_cls)
{
    (void)version;
    serve *s = cls;
    request *rq = *con_cls;
    if (!rq)
        return accept_request(s, c, url, method, con_cls);
    if (*upload_data_size > 0) {
        if (receive(rq, upload_data, *upload_data_size))
            return MHD_NO;
        *upload_data_size = 0;
        return MHD_YES;
    }
    return answer(s, c, url, rq);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)toe;
    request *rq = *con_cls;
    if (rq) {
        free(rq->body);
        free(rq);
        *con_cls = NULL;
    }
    conn_mark(c, 0);
}

static void logger(void *cls, const char *fmt, va_list ap)
{
    const serve *s = cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    tool_log(s->t, "warning", "libmicrohttpd: %s", line);
}

/* Paths are matched as sent, never unescaped: every route is plain ASCII,
 * and an unescaped "/%00" would end at its NUL and read as "/". A path
 * with an escape is no route: 404. */
static size_t keep_escapes(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    (void)c;
    return strlen(s);
}

int serve_http_start(serve *s, const void *addr, size_t addrlen)
{
    (void)addrlen;
    const struct sockaddr *sa = addr;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (sa->sa_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* The logger first, or libmicrohttpd logs the other options' problems
     * its own way. */
    s->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, handle, s, MHD_OPTION_EXTERNAL_LOGGER, logger, s,
        MHD_OPTION_SOCK_ADDR, sa, MHD_OPTION_CONNECTION_LIMIT, (unsigned)CONN_LIMIT,
        MHD_OPTION_NOTIFY_CONNECTION, conn_notify, s, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)s->timeout, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)MEMORY_LIMIT,
        MHD_OPTION_THREAD_STACK_SIZE, (size_t)STACK_SIZE, MHD_OPTION_STRICT_FOR_CLIENT, (int)1,
        MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_UNESCAPE_CALLBACK, keep_escapes,
        NULL, MHD_OPTION_END);
    return s->daemon ? 0 : EXIT_ERR;
}

unsigned serve_http_port(const serve *s)
{
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    return info ? info->port : 0;
}

void serve_http_stop(serve *s)
{
    if (s->daemon)
        MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
}
