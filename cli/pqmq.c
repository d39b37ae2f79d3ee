/*
 * pqmq.c: the pqmq command: main, the options every subcommand shares, the
 * connection and the checks that give one clear line per error.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "pqmq-tool.h"

static const struct {
    const char *name;
    int (*fn)(tool *t, int argc, char **argv);
    const char *summary;
} commands[] = {
    {"migrate", cmd_migrate, "create or upgrade the queue's schema (--status, --sql)"},
    {"status", cmd_status, "messages per channel and state"},
    {"peek", cmd_peek, "the next messages of a channel, unclaimed"},
    {"show", cmd_show, "one message's story: state, chain, attempts, payload"},
    {"dead", cmd_dead, "list dead messages"},
    {"retry", cmd_retry, "give dead messages more attempts"},
    {"skip", cmd_skip, "move ordered messages out of their chains"},
    {"purge", cmd_purge, "delete a channel's messages"},
    {"pause", cmd_pause, "stop delivering a channel's messages"},
    {"resume", cmd_resume, "deliver a paused channel's messages again"},
    {"send", cmd_send, "insert one message"},
    {"watch", cmd_watch, "status, refreshed when the queue changes"},
    {"metrics", cmd_metrics, "status and alert counters in the Prometheus text format"},
    {"workers", cmd_workers, "the runners consuming the queue"},
    {"serve", cmd_serve, "a web dashboard and /metrics over HTTP"},
};

const char tool_common_help[] =
    "  -d, --dsn CONNINFO  the server (default: $PQMQ_DSN, else $DATABASE_URL,\n"
    "                      else libpq's PG* environment and service file)\n"
    "      --schema NAME   the schema the queue lives in (default: $PQMQ_SCHEMA,\n"
    "                      else the first schema of the search_path)\n"
    "  -h, --help          this help\n";

static void usage(FILE *f)
{
    fprintf(f, "usage: pqmq [-d CONNINFO] [--schema NAME] COMMAND [ARG...]\n\n");
    fprintf(f, "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n%s", tool_common_help);
    fprintf(f, "      --version       pqmq's version and schema version\n");
    fprintf(f, "\n'pqmq COMMAND --help' describes a command; see also pqmq(1).\n");
}

/* Messages name channels, keys and schemas that any producer chose: their
 * control characters reach the terminal as \xHH, never raw, and the
 * message stays one line. */
static void vsay(const tool *t, const char *fmt, va_list ap)
{
    if (t && t->errbuf && t->errbuf_size) {
        va_list copy;
        va_copy(copy, ap);
        vsnprintf(t->errbuf, t->errbuf_size, fmt, copy);
        va_end(copy);
    }
    if (!t || !t->quiet)
        tool_vlog(t, stderr, "error", fmt, ap);
}

int tool_err(const tool *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsay(t, fmt, ap);
    va_end(ap);
    return EXIT_ERR;
}

int tool_usage(const tool *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsay(t, fmt, ap);
    va_end(ap);
    return EXIT_USAGE;
}

int tool_common_opt(tool *t, int c, const char *arg)
{
    switch (c) {
    case 'd': t->dsn = arg; return 0;
    case TOOL_OPT_SCHEMA:
        if (!*arg)
            return tool_usage(t, "--schema: empty schema name");
        t->schema = arg;
        return 0;
    default:
        /* getopt_long has printed what was wrong. */
        fprintf(stderr, "try 'pqmq %s --help'\n", t->cmd ? t->cmd : "");
        return EXIT_USAGE;
    }
}

const char *tool_first_line(const char *msg)
{
    static char line[512];
    if (!msg)
        msg = "";
    if (strncmp(msg, "ERROR:  ", 8) == 0)
        msg += 8;
    else if (strncmp(msg, "FATAL:  ", 8) == 0)
        msg += 8;
    size_t n = strcspn(msg, "\n");
    if (n >= sizeof line)
        n = sizeof line - 1;
    memcpy(line, msg, n);
    line[n] = '\0';
    /* libpq puts the useful part of a refused connection on the second
     * line ("connection to server ... failed:\n\tNo such file..."). */
    if (n > 0 && line[n - 1] == ':' && msg[n] == '\n') {
        const char *more = msg + n + 1;
        while (*more == ' ' || *more == '\t')
            more++;
        size_t m = strcspn(more, "\n");
        if (m > sizeof line - n - 2)
            m = sizeof line - n - 2;
        line[n] = ' ';
        memcpy(line + n + 1, more, m);
        line[n + 1 + m] = '\0';
    }
    return line;
}

const char *tool_lib_error(const char *msg)
{
    static char line[512];
    const char *s = tool_first_line(msg);
    /* "pqmq_insert: msgs[0]: payload ..." -> "message 1: payload ...": the
     * library names its call and array index, the command line knows
     * neither. */
    if (!strncmp(s, "pqmq_", 5)) {
        size_t n = strspn(s + 5, "abcdefghijklmnopqrstuvwxyz_");
        if (!strncmp(s + 5 + n, ": ", 2))
            s += 5 + n + 2;
    }
    size_t o = 0;
    while (*s && o + 1 < sizeof line) {
        unsigned long i;
        int used = 0;
        if (!strncmp(s, "msgs[", 5) && sscanf(s, "msgs[%lu]%n", &i, &used) == 1 && used > 0) {
            o += (size_t)snprintf(line + o, sizeof line - o, "message %lu", i + 1);
            s += used;
        } else if (!strncmp(s, "run pqmq_migrate", 16)) {
            o += (size_t)snprintf(line + o, sizeof line - o, "run 'pqmq migrate'");
            s += 16;
        } else {
            line[o++] = *s++;
        }
        if (o >= sizeof line)
            o = sizeof line - 1;
    }
    line[o] = '\0';
    return line;
}

PGresult *tool_query(tool *t, const char *sql, int nparams, const char *const *params)
{
    PGresult *r = PQexecParams(t->conn, sql, nparams, NULL, params, NULL, NULL, 0);
    ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)
        return r;
    if (PQstatus(t->conn) != CONNECTION_OK)
        tool_err(t, "lost the connection to the server: %s",
                 tool_first_line(PQerrorMessage(t->conn)));
    else
        tool_err(t, "%s",
                 tool_first_line(r ? PQresultErrorMessage(r) : PQerrorMessage(t->conn)));
    PQclear(r);
    return NULL;
}

char *tool_current_schema(tool *t)
{
    PGresult *r = tool_query(t, "SELECT pg_catalog.current_schema()", 0, NULL);
    char *s = NULL;
    if (r && !PQgetisnull(r, 0, 0))
        s = strdup(PQgetvalue(r, 0, 0));
    PQclear(r);
    return s;
}

/* The schemas that hold a queue (a quoted, comma-separated list the caller
 * frees), or NULL for none: what an error names instead of advising to
 * install a second queue. */
static char *queue_schemas(tool *t)
{
    PGresult *r =
        tool_query(t,
                   "SELECT pg_catalog.string_agg(pg_catalog.quote_ident(n.nspname::text), ', '"
                   " ORDER BY n.nspname), pg_catalog.count(*) "
                   "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
                   " ON n.oid OPERATOR(pg_catalog.=) c.relnamespace "
                   "WHERE c.relname OPERATOR(pg_catalog.=) 'mq_schema_migrations'"
                   " AND c.relkind OPERATOR(pg_catalog.=) 'r'",
                   0, NULL);
    char *s = NULL;
    if (r && !PQgetisnull(r, 0, 0))
        s = strdup(PQgetvalue(r, 0, 0));
    PQclear(r);
    return s;
}

/* Why --schema selected nothing: current_schema() skips a schema the role
 * has no USAGE on, as it skips a missing one, and the two need different
 * fixes. Prints the reason; returns EXIT_ERR. */
int tool_schema_unusable(tool *t, const char *missing_hint)
{
    const char *p[1] = {t->schema};
    PGresult *r = tool_query(t,
                             "SELECT pg_catalog.has_schema_privilege(oid, 'USAGE') "
                             "FROM pg_catalog.pg_namespace "
                             "WHERE nspname OPERATOR(pg_catalog.=) $1",
                             1, p);
    int exists = r && PQntuples(r) == 1, usable = exists && PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    if (exists && !usable)
        return tool_err(t,
                        "permission denied for schema \"%s\": this role has no USAGE on "
                        "it (the queue's owner grants a duty with mq_grant)",
                        t->schema);
    return tool_err(t, "schema \"%s\" does not exist%s", t->schema,
                    missing_hint ? missing_hint : "");
}

/* Is the queue in the current schema migrated to min_version? The version
 * comes from the table for its owner and from mq_schema_version() for the
 * roles of the duties, which have no rights on the tables. */
static int check_schema(tool *t, int min_version)
{
    PGresult *r =
        tool_query(t,
                   "SELECT pg_catalog.current_schema(), "
                   "CASE WHEN pg_catalog.to_regclass(x.t) IS NULL THEN 0"
                   " WHEN pg_catalog.has_table_privilege(x.t, 'SELECT') THEN 1 ELSE 2 END "
                   "FROM (SELECT pg_catalog.quote_ident(pg_catalog.current_schema())"
                   " OPERATOR(pg_catalog.||) '.mq_schema_migrations' AS t) x",
                   0, NULL);
    if (!r)
        return EXIT_ERR;
    int rc = 0, how = atoi(PQgetvalue(r, 0, 1));
    if (PQgetisnull(r, 0, 0)) {
        rc = t->schema ? tool_schema_unusable(t, NULL)
                       : tool_err(t, "no schema on the search_path (use --schema)");
    } else if (how == 0) {
        char *others = queue_schemas(t);
        if (!others)
            rc =
                tool_err(t, "no pqmq queue in schema \"%s\": run 'pqmq migrate' to install one",
                         PQgetvalue(r, 0, 0));
        else if (!strchr(others, ','))
            rc = tool_err(
                t, "no pqmq queue in schema \"%s\"; schema %s holds one: add --schema %s",
                PQgetvalue(r, 0, 0), others, others);
        else
            rc = tool_err(t,
                          "no pqmq queue in schema \"%s\"; these schemas hold one: %s "
                          "(add --schema NAME)",
                          PQgetvalue(r, 0, 0), others);
        free(others);
    }
    if (rc || min_version <= 0) {
        PQclear(r);
        return rc;
    }
    char *schema = strdup(PQgetvalue(r, 0, 0));
    PQclear(r);
    r = tool_query(t,
                   how == 1
                       ? "SELECT COALESCE(pg_catalog.max(version), 0) FROM mq_schema_migrations"
                       : "SELECT mq_schema_version()",
                   0, NULL);
    if (!r) {
        free(schema);
        return EXIT_ERR;
    }
    int have = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    if (have < min_version)
        rc = tool_err(t,
                      "the queue in schema \"%s\" is at version %d, this command needs "
                      "%d: run 'pqmq migrate'",
                      schema ? schema : "?", have, min_version);
    free(schema);
    return rc;
}

int tool_connect(tool *t, int min_version)
{
    int rc = pqmq_connect(t->dsn ? t->dsn : "", &t->client);
    if (rc != PQMQ_OK) {
        if (!t->client)
            return tool_err(t, "out of memory");
        return tool_err(t, "cannot connect to the server: %s",
                        tool_lib_error(pqmq_errmsg(t->client)));
    }
    t->conn = pqmq_conn(t->client);
    rc = tool_begin(t);
    if (rc)
        return rc;
    return min_version < 0 ? 0 : check_schema(t, min_version);
}

int tool_begin(tool *t)
{
    if (!t->schema || PQtransactionStatus(t->conn) != PQTRANS_IDLE)
        return 0;
    PGresult *r = tool_query(t, "BEGIN", 0, NULL);
    if (!r)
        return EXIT_ERR;
    PQclear(r);
    const char *p[1] = {t->schema};
    r = tool_query(
        t, "SELECT pg_catalog.set_config('search_path', pg_catalog.quote_ident($1), true)", 1,
        p);
    if (!r)
        return EXIT_ERR;
    PQclear(r);
    return 0;
}

int tool_commit(tool *t)
{
    if (!t->conn || PQstatus(t->conn) != CONNECTION_OK)
        return 0;
    PGTransactionStatusType st = PQtransactionStatus(t->conn);
    if (st != PQTRANS_INTRANS && st != PQTRANS_INERROR)
        return 0;
    PGresult *r = tool_query(t, st == PQTRANS_INTRANS ? "COMMIT" : "ROLLBACK", 0, NULL);
    if (!r)
        return EXIT_ERR;
    PQclear(r);
    return 0;
}

void tool_disconnect(tool *t)
{
    pqmq_client_free(t->client);
    t->client = NULL;
    t->conn = NULL;
}

char *tool_text_array(char *const *names, size_t n)
{
    if (n == 0)
        return NULL;
    size_t cap = 3;
    for (size_t i = 0; i < n; i++)
        cap += 2 * strlen(names[i]) + 3;
    char *s = malloc(cap), *p = s;
    if (!s)
        return NULL;
    *p++ = '{';
    for (size_t i = 0; i < n; i++) {
        if (i)
            *p++ = ',';
        *p++ = '"';
        for (const char *c = names[i]; *c; c++) {
            if (*c == '"' || *c == '\\')
                *p++ = '\\';
            *p++ = *c;
        }
        *p++ = '"';
    }
    *p++ = '}';
    *p = '\0';
    return s;
}

int tool_parse_id(const tool *t, const char *text, uuid_t out)
{
    if (strlen(text) != 36 || uuid_parse(text, out) != 0)
        return tool_usage(t,
                          "\"%s\" is not a message id (a UUID like "
                          "0190c2a4-5b6e-7c3d-9e0f-123456789abc)",
                          text);
    return 0;
}

int tool_parse_range(const tool *t, const char *opt, const char *text, long long min,
                     long long max, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    /* One message for every way to miss: not a number, too small, too big. */
    if (errno || end == text || *end || v < min || v > max)
        return tool_usage(t, "%s: \"%s\" is not a whole number in %lld..%lld", opt, text, min,
                          max);
    *out = v;
    return 0;
}

int tool_parse_int(const tool *t, const char *opt, const char *text, long long max,
                   long long *out)
{
    return tool_parse_range(t, opt, text, 0, max, out);
}

int tool_parse_rows(tool *t, const char *text, long long *out)
{
    return tool_parse_range(t, "-n", text, 1, PQMQ_MAX_BATCH, out);
}

/* A set, non-empty environment variable's value, else NULL. */
static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* The defaults of -d and --schema; the options, parsed after, override
 * them. PQMQ_DSN wins over DATABASE_URL so that pqmq can be pointed at a
 * queue other than the application's database. */
static void tool_env_defaults(tool *t)
{
    t->dsn = env("PQMQ_DSN");
    if (!t->dsn)
        t->dsn = env("DATABASE_URL");
    t->schema = env("PQMQ_SCHEMA");
}

/* Did the reader of stdout go away (`pqmq ... | head`)? A pipe whose
 * reading end is closed polls as POLLERR. */
int tool_output_closed(void)
{
    if (ferror(stdout) && errno == EPIPE)
        return 1;
    struct pollfd p = {.fd = fileno(stdout), .events = 0};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLERR);
}

int main(int argc, char **argv)
{
    tool t = {0};
    /* A reader that stops early (`pqmq dead | head`) must not kill the
     * command in the middle of its transaction: writes fail with EPIPE
     * instead, and the command finishes what it was doing. */
    signal(SIGPIPE, SIG_IGN);
    tool_env_defaults(&t);
    static const struct option opts[] = {
        TOOL_COMMON_OPTS,
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    int c;
    opterr = 1;
    /* "+": the options before the command; the command parses the rest. */
    while ((c = getopt_long(argc, argv, "+" TOOL_COMMON_SHORT, opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return EXIT_OK;
        }
        if (c == 'V') {
            printf("pqmq %s (schema version %d)\n", PACKAGE_VERSION, pqmq_schema_version());
            return EXIT_OK;
        }
        if (tool_common_opt(&t, c, optarg))
            return EXIT_USAGE;
    }
    if (optind >= argc) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *name = argv[optind];
    if (strcmp(name, "help") == 0) {
        usage(stdout);
        return EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(name, commands[i].name) != 0)
            continue;
        t.cmd = commands[i].name;
        int sub_argc = argc - optind;
        char **sub_argv = argv + optind;
        /* getopt_long names argv[0] in its messages. */
        char prog[64];
        snprintf(prog, sizeof prog, "pqmq %s", t.cmd);
        sub_argv[0] = prog;
        optind = 0; /* glibc: getopt_long starts over on the command's arguments */
        int rc = commands[i].fn(&t, sub_argc, sub_argv);
        /* What a command did before an error stands, as it would have
         * without the transaction that --schema opens. */
        if (tool_commit(&t) && rc == EXIT_OK)
            rc = EXIT_ERR;
        tool_disconnect(&t);
        errno = 0;
        /* Output nobody reads any more is not an error: the reader has
         * what it wanted. */
        if ((fflush(stdout) != 0 || ferror(stdout)) && rc == EXIT_OK && !tool_output_closed())
            rc = tool_err(&t, "cannot write the output: %s",
                          errno ? strerror(errno) : "write error");
        return rc;
    }
    return tool_usage(&t, "unknown command \"%s\" (try 'pqmq --help')", name);
}
