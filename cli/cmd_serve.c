/*
 * cmd_serve.c: pqmq serve, the dashboard and /metrics over HTTP: options,
 * the listening address, the CSRF token, and the main thread's loop, which
 * samples the queue every --interval seconds until SIGINT or SIGTERM.
 * (serve.h says which file does the rest.)
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <netdb.h>
#include <sys/random.h>
#include <sys/socket.h>

#include "serve.h"

#define MAX_HOSTS 16
#define TOKEN_MARK "@PQMQ_CSRF_TOKEN@"

static void help(void)
{
    printf("usage: pqmq serve [--listen ADDRESS:PORT] [--admin] [--interval S] [--dead N]\n"
           "                  [--timeout S] [--host NAME]... [--log-format text|json]\n\n"
           "Serves a web dashboard of the queue (channels and their states, the\n"
           "oldest ready message's age, completions per second over the last\n"
           "%d minutes, dead letters and the chain heads that block) at /, and\n"
           "the text of 'pqmq metrics' at /metrics for Prometheus. It reads the queue\n"
           "once per interval, whoever asks. Read-only unless --admin, which adds\n"
           "retry and skip buttons (the role still needs the administer duty).\n\n"
           "      --listen A:P    address and port (default 127.0.0.1:9187; [::1]:P\n"
           "                      for IPv6; port 0 picks a free one)\n"
           "      --admin         allow retry and skip from the page\n"
           "      --interval S    seconds between readings of the queue (default 5)\n"
           "      --dead N        dead letters shown, oldest first (default 100)\n"
           "      --timeout S     drop a connection idle this long (default 15)\n"
           "      --host NAME     accept this name in the Host header (repeatable;\n"
           "                      IP addresses and localhost always are)\n"
           "      --log-format F  text (default) or json: one JSON object a line\n"
           "                      (time, level, cmd, msg) on stdout and stderr\n%s",
           SERVE_HISTORY_SECONDS / 60, tool_common_help);
}

/* Splits "HOST:PORT" or "[V6]:PORT" and resolves it. Returns 0 with *out
 * (freeaddrinfo) set, or EXIT_USAGE (printed). */
static int parse_listen(tool *t, const char *text, struct addrinfo **out)
{
    char host[256];
    const char *port;
    if (text[0] == '[') {
        const char *end = strchr(text, ']');
        if (!end || end[1] != ':' || (size_t)(end - text - 1) >= sizeof host)
            return tool_usage(t, "--listen: \"%s\" is not [IPv6]:PORT", text);
        memcpy(host, text + 1, (size_t)(end - text - 1));
        host[end - text - 1] = '\0';
        port = end + 2;
    } else {
        const char *colon = strrchr(text, ':');
        if (!colon || colon == text || (size_t)(colon - text) >= sizeof host)
            return tool_usage(t, "--listen: \"%s\" is not ADDRESS:PORT", text);
        memcpy(host, text, (size_t)(colon - text));
        host[colon - text] = '\0';
        port = colon + 1;
    }
    long long p;
    if (tool_parse_int(t, "--listen port", port, 65535, &p))
        return EXIT_USAGE;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    int rc = getaddrinfo(host, port, &hints, out);
    if (rc != 0)
        return tool_usage(t, "--listen: cannot resolve \"%s\": %s", host, gai_strerror(rc));
    return 0;
}

/* 32 random bytes as hex: the token every POST must carry. */
static int make_token(tool *t, char out[65])
{
    unsigned char bytes[32];
    size_t got = 0;
    while (got < sizeof bytes) {
        ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
        if (n < 0 && errno != EINTR)
            return tool_err(t, "cannot get random bytes for the CSRF token: %s",
                            strerror(errno));
        if (n > 0)
            got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof bytes; i++)
        snprintf(out + 2 * i, 3, "%02x", bytes[i]);
    return 0;
}

/* index.html with the token in place of its mark. */
static int make_page(tool *t, serve *s)
{
    const serve_asset *a = NULL;
    for (size_t i = 0; i < serve_asset_count; i++)
        if (strcmp(serve_assets[i].path, "/index.html") == 0)
            a = &serve_assets[i];
    const char *mark = a ? memmem(a->data, a->len, TOKEN_MARK, strlen(TOKEN_MARK)) : NULL;
    if (!mark)
        return tool_err(t, "the built-in page has no token mark (a build error)");
    size_t before = (size_t)(mark - (const char *)a->data), mlen = strlen(TOKEN_MARK);
    size_t tlen = strlen(s->token), after = a->len - before - mlen;
    s->page_len = before + tlen + after;
    s->page = malloc(s->page_len);
    if (!s->page)
        return tool_err(t, "out of memory");
    memcpy(s->page, a->data, before);
    memcpy(s->page + before, s->token, tlen);
    memcpy(s->page + before + tlen, mark + mlen, after);
    return 0;
}

/* One info line on f, as tool_log writes them. */
static void say(const tool *t, FILE *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tool_vlog(t, f, "info", fmt, ap);
    va_end(ap);
}

/* The listening line goes to stdout: scripts read the port from it. */
static void print_address(const tool *t, const struct addrinfo *ai, unsigned port, int admin,
                          const char *schema)
{
    char host[NI_MAXHOST] = "?";
    getnameinfo(ai->ai_addr, ai->ai_addrlen, host, sizeof host, NULL, 0, NI_NUMERICHOST);
    int v6 = ai->ai_family == AF_INET6;
    say(t, stdout, "listening on http://%s%s%s:%u/ (%s), queue in schema \"%s\"", v6 ? "[" : "",
        host, v6 ? "]" : "", port, admin ? "admin" : "read-only", schema ? schema : "?");
}

/* Samples every interval seconds until a signal in set arrives. */
static void run(serve *s, const sigset_t *set)
{
    for (;;) {
        struct timespec wait = {.tv_sec = s->interval};
        int sig = sigtimedwait(set, NULL, &wait);
        if (sig > 0) {
            tool_log(s->t, "info", "stopping on signal %d", sig);
            return;
        }
        if (errno != EAGAIN)
            continue; /* EINTR */
        pthread_mutex_lock(&s->db_lock);
        serve_sample(s);
        pthread_mutex_unlock(&s->db_lock);
    }
}

static int parse_options(tool *t, serve *s, int argc, char **argv, const char **listen,
                         char **hosts)
{
    static const struct option opts[] = {
        TOOL_COMMON_OPTS,
        {"listen", required_argument, NULL, 'l'},
        {"admin", no_argument, NULL, 'A'},
        {"interval", required_argument, NULL, 'i'},
        {"dead", required_argument, NULL, 'n'},
        {"timeout", required_argument, NULL, 'T'},
        {"host", required_argument, NULL, 'H'},
        {"log-format", required_argument, NULL, 'L'},
        {NULL, 0, NULL, 0},
    };
    long long v;
    int c;
    while ((c = getopt_long(argc, argv, TOOL_COMMON_SHORT, opts, NULL)) != -1) {
        if (c == 'h') {
            help();
            return -1;
        } else if (c == 'l') {
            *listen = optarg;
        } else if (c == 'A') {
            s->admin = 1;
        } else if (c == 'i' || c == 'T') {
            const char *name = c == 'i' ? "--interval" : "--timeout";
            if (tool_parse_int(t, name, optarg, 3600, &v))
                return EXIT_USAGE;
            if (v == 0)
                return tool_usage(t, "%s: must be at least 1 second", name);
            *(c == 'i' ? &s->interval : &s->timeout) = (int)v;
        } else if (c == 'n') {
            if (tool_parse_rows(t, optarg, &v))
                return EXIT_USAGE;
            s->dead_max = (int)v;
        } else if (c == 'H') {
            if (s->nhosts == MAX_HOSTS)
                return tool_usage(t, "--host: at most %d names", MAX_HOSTS);
            if (!*optarg || strchr(optarg, ':'))
                return tool_usage(t, "--host: \"%s\" is not a host name", optarg);
            hosts[s->nhosts++] = optarg;
        } else if (c == 'L') {
            if (strcmp(optarg, "text") != 0 && strcmp(optarg, "json") != 0)
                return tool_usage(t, "--log-format: \"%s\" is not text or json", optarg);
            t->log_json = optarg[0] == 'j';
        } else if (tool_common_opt(t, c, optarg)) {
            return EXIT_USAGE;
        }
    }
    if (optind < argc)
        return tool_usage(t, "unexpected argument \"%s\" (try 'pqmq serve --help')",
                          argv[optind]);
    return 0;
}

int cmd_serve(tool *t, int argc, char **argv)
{
    serve s = {.t = t, .interval = 5, .dead_max = 100, .timeout = 15};
    char *hosts[MAX_HOSTS];
    const char *listen = "127.0.0.1:9187";
    int rc = parse_options(t, &s, argc, argv, &listen, hosts);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    s.hosts = hosts;
    struct addrinfo *ai = NULL;
    if ((rc = parse_listen(t, listen, &ai)))
        return rc;
    pthread_mutex_init(&s.db_lock, NULL);
    pthread_mutex_init(&s.snap_lock, NULL);

    /* A database the server cannot read at start is a mistake to report
     * now; later failures are shown on the page and retried. */
    rc = tool_connect(t, TOOL_MIN_VERSION);
    if (!rc && !(s.schema = tool_current_schema(t)))
        rc = EXIT_ERR;
    if (!rc)
        rc = make_token(t, s.token);
    if (!rc)
        rc = make_page(t, &s);
    if (!rc)
        rc = serve_sample(&s);

    /* Every thread libmicrohttpd starts inherits this mask, so the
     * signals reach only sigtimedwait in run(). */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (!rc && serve_http_start(&s, ai->ai_addr, ai->ai_addrlen))
        rc = tool_err(t, "cannot listen on %s (the line above says why)", listen);
    if (!rc) {
        print_address(t, ai, serve_http_port(&s), s.admin, s.schema);
        run(&s, &set);
        serve_http_stop(&s);
    }
    freeaddrinfo(ai);
    serve_state_free(&s);
    free(s.page);
    free(s.schema);
    pthread_mutex_destroy(&s.db_lock);
    pthread_mutex_destroy(&s.snap_lock);
    return rc;
}
