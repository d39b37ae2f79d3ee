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

#include <fcntl.h>
#include <netdb.h>
#include <unistd.h>

#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "serve.h"

#define MAX_HOSTS 16
#define TOKEN_MARK "@PQMQ_CSRF_TOKEN@"

static void help(void)
{
    printf("usage: pqmq serve [--listen ADDRESS:PORT] [--admin [--admin-token-file PATH]]\n"
           "                  [--interval S] [--dead N] [--timeout S] [--host NAME]...\n"
           "                  [--log-format text|json]\n\n"
           "Serves a web dashboard of the queue (channels and their states, the\n"
           "oldest ready message's age, completions per second over the last\n"
           "%d minutes, dead letters and the chain heads that block) at /, and\n"
           "the text of 'pqmq metrics' at /metrics for Prometheus. It reads the queue\n"
           "once per interval, whoever asks. Read-only unless --admin, which adds\n"
           "retry and skip buttons (the role still needs the administer duty).\n\n"
           "      --listen A:P    address and port (default 127.0.0.1:9187; [::1]:P\n"
           "                      for IPv6; port 0 picks a free one)\n"
           "      --admin         allow retry and skip from the page (any local user\n"
           "                      can read the page, and with it the token they need)\n"
           "      --admin-token-file PATH\n"
           "                      with --admin: the token is this file's first line\n"
           "                      (32 to 128 printable characters; the file must be\n"
           "                      private to its owner, mode 0600 or 0400) and the\n"
           "                      page does not carry it: it asks for it\n"
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

/* Reads the admin token from path: a regular file that only its owner may
 * read or write, whose first line is 32 to 128 printable ASCII characters
 * (no spaces). 0 or EXIT_ERR (printed). */
static int read_token_file(tool *t, const char *path, char *out, size_t size)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return tool_err(t, "--admin-token-file: cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return tool_err(t, "--admin-token-file: %s is not a regular file", path);
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        close(fd);
        return tool_err(t,
                        "--admin-token-file: %s is open to other users (mode %04o): "
                        "chmod 600 it",
                        path, (unsigned)(st.st_mode & 07777));
    }
    char buf[256];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0)
        return tool_err(t, "--admin-token-file: cannot read %s: %s", path, strerror(errno));
    buf[n] = '\0';
    size_t len = strcspn(buf, "\r\n");
    buf[len] = '\0';
    int printable = 1;
    for (size_t i = 0; i < len; i++)
        if (buf[i] <= ' ' || buf[i] > '~')
            printable = 0;
    if (len < 32 || len > 128 || len >= size || !printable)
        return tool_err(t,
                        "--admin-token-file: the first line of %s must be 32 to 128 "
                        "printable characters without spaces (e.g. openssl rand -hex 32)",
                        path);
    memcpy(out, buf, len + 1);
    return 0;
}

/* Does addr reach only this machine? */
static int is_loopback(const struct sockaddr *addr)
{
    if (addr->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (addr->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)addr;
        return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
    }
    return 0;
}

/* index.html with the token in place of its mark (an empty token with
 * --admin-token-file: the page asks for it). */
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
    size_t tlen = s->token_file ? 0 : strlen(s->token), after = a->len - before - mlen;
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
                         char **hosts, const char **token_file)
{
    static const struct option opts[] = {
        TOOL_COMMON_OPTS,
        {"listen", required_argument, NULL, 'l'},
        {"admin", no_argument, NULL, 'A'},
        {"interval", required_argument, NULL, 'i'},
        {"dead", required_argument, NULL, 'n'},
        {"timeout", required_argument, NULL, 'T'},
        {"host", required_argument, NULL, 'H'},
        {"admin-token-file", required_argument, NULL, 'K'},
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
        } else if (c == 'K') {
            *token_file = optarg;
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
    if (*token_file && !s->admin)
        return tool_usage(t, "--admin-token-file goes with --admin");
    return 0;
}

int cmd_serve(tool *t, int argc, char **argv)
{
    serve s = {.t = t, .interval = 5, .dead_max = 100, .timeout = 15};
    char *hosts[MAX_HOSTS];
    const char *listen = "127.0.0.1:9187", *token_file = NULL;
    int rc = parse_options(t, &s, argc, argv, &listen, hosts, &token_file);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    s.hosts = hosts;
    struct addrinfo *ai = NULL;
    if ((rc = parse_listen(t, listen, &ai)))
        return rc;
    if (!is_loopback(ai->ai_addr))
        tool_log(t, "warning",
                 "%s is not a loopback address: anyone who can reach it reads the queue's "
                 "figures and dead letters%s, with no login; put an authenticating proxy in "
                 "front and listen on 127.0.0.1 instead",
                 listen, s.admin ? " and can retry and skip" : "");
    if (token_file) {
        s.token_file = 1;
        if ((rc = read_token_file(t, token_file, s.token, sizeof s.token))) {
            freeaddrinfo(ai);
            return rc;
        }
    }
    pthread_mutex_init(&s.db_lock, NULL);
    pthread_mutex_init(&s.snap_lock, NULL);

    /* A database the server cannot read at start is a mistake to report
     * now; later failures are shown on the page and retried. */
    rc = tool_connect(t, TOOL_MIN_VERSION);
    if (!rc && !(s.schema = tool_current_schema(t)))
        rc = EXIT_ERR;
    if (!rc && !s.token_file)
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
