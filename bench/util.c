/*
 * util.c: the small things every phase of pqmq-bench needs: clocks,
 * fatal errors, connections into the bench schema, payloads, percentiles
 * and the process's peak memory.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "options.h"
#include "results.h"
#include "util.h"

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int64_t realtime_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* Called by die before it prints: clears a progress line off the terminal. */
static void (*before_death)(void);

void die_first(void (*fn)(void))
{
    before_death = fn;
}

void die(const char *fmt, ...)
{
    static atomic_flag dying = ATOMIC_FLAG_INIT;
    if (atomic_flag_test_and_set(&dying))
        for (;;)
            pause(); /* another thread is already reporting and exiting */
    va_list ap;
    if (before_death)
        before_death();
    fputs("pqmq-bench: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

/* Appends s to the buffer at *p as a single-quoted conninfo value. */
static void put_quoted(char **p, const char *s)
{
    *(*p)++ = '\'';
    for (; *s; s++) {
        if (*s == '\'' || *s == '\\')
            *(*p)++ = '\\';
        *(*p)++ = *s;
    }
    *(*p)++ = '\'';
}

/*
 * The user's conninfo (key=value or URI; NULL or "" for libpq's
 * environment) rewritten as key=value with our search_path added to its
 * options, so that pqmq_connect and pqmq_runner_new, which take a conninfo
 * string, land in the bench schema.
 */
char *bench_conninfo(const char *dsn, int profile)
{
    const char *ours = profile ? "-c search_path=" BENCH_SCHEMA
                                 " -c client_min_messages=warning -c track_functions=pl"
                               : "-c search_path=" BENCH_SCHEMA
                                 " -c client_min_messages=warning";
    char *err = NULL;
    PQconninfoOption *opts = PQconninfoParse(dsn ? dsn : "", &err);
    if (!opts)
        die("bad --dsn: %s", err ? err : "out of memory");
    const char *options = NULL;
    size_t cap = 2 * strlen(ours) + 8;
    for (PQconninfoOption *p = opts; p->keyword; p++) {
        if (!p->val)
            continue;
        cap += strlen(p->keyword) + 2 * strlen(p->val) + 4;
        if (!strcmp(p->keyword, "options"))
            options = p->val;
    }
    char *out = malloc(cap + 16), *w = out;
    if (!out)
        die("out of memory");
    for (PQconninfoOption *p = opts; p->keyword; p++) {
        if (!p->val || !strcmp(p->keyword, "options"))
            continue;
        w += sprintf(w, "%s=", p->keyword);
        put_quoted(&w, p->val);
        *w++ = ' ';
    }
    char *merged = malloc((options ? strlen(options) : 0) + strlen(ours) + 2);
    if (!merged)
        die("out of memory");
    sprintf(merged, "%s%s%s", options ? options : "", options ? " " : "", ours);
    w += sprintf(w, "options=");
    put_quoted(&w, merged);
    *w = '\0';
    free(merged);
    PQconninfoFree(opts);
    return out;
}

PGconn *bench_connect(const struct opts *o)
{
    PGconn *conn = PQconnectdb(o->conninfo);
    if (PQstatus(conn) != CONNECTION_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", PQerrorMessage(conn));
        msg[strcspn(msg, "\n")] = '\0';
        PQfinish(conn);
        die("cannot connect: %s", msg);
    }
    return conn;
}

pqmq_client *bench_client(const struct opts *o)
{
    pqmq_client *c = NULL;
    if (pqmq_connect(o->conninfo, &c))
        die("cannot connect: %s", pqmq_errmsg(c));
    return c;
}

void bench_sql(PGconn *conn, const char *sql)
{
    PGresult *r = PQexec(conn, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", PQerrorMessage(conn));
        msg[strcspn(msg, "\n")] = '\0';
        PQclear(r);
        die("%s: %s", sql, msg);
    }
    PQclear(r);
}

long bench_scalar(PGconn *conn, const char *sql)
{
    PGresult *r = PQexec(conn, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", PQerrorMessage(conn));
        msg[strcspn(msg, "\n")] = '\0';
        PQclear(r);
        die("%s: %s", sql, msg);
    }
    long v = strtol(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

int shape_ordered(const struct shape *s, long seq)
{
    if (s->ordered <= 0)
        return 0;
    if (s->ordered >= 1)
        return 1;
    return (long)((double)(seq + 1) * s->ordered) > (long)((double)seq * s->ordered);
}

size_t bench_payload_cap(int bytes)
{
    return (size_t)(bytes > 0 ? bytes : 0) + 64;
}

int bench_payload(char *buf, size_t cap, long seq, int64_t ts, int bytes)
{
    int n = snprintf(buf, cap, "{\"seq\":%ld,\"ts\":%lld,\"pad\":\"", seq, (long long)ts);
    int pad = bytes - n - 2;
    while (pad-- > 0 && (size_t)n + 3 < cap)
        buf[n++] = 'x';
    buf[n++] = '"';
    buf[n++] = '}';
    buf[n] = '\0';
    return n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentiles: p99 of 200 samples is the 198th smallest. */
void latency_summary(double *v, int n, struct latency *out)
{
    memset(out, 0, sizeof *out);
    if (n <= 0)
        return;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i50 = (n * 50 + 99) / 100 - 1, i99 = (n * 99 + 99) / 100 - 1;
    out->n = n;
    out->p50 = v[i50 < 0 ? 0 : i50];
    out->p99 = v[i99 < 0 ? 0 : i99];
    out->max = v[n - 1];
}

long maxrss_kb(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1;
}

int derive_runner_threads(PGconn *admin, int consumers, int batch)
{
    long free_slots = bench_scalar(
        admin,
        "SELECT current_setting('max_connections')::int"
        " - current_setting('superuser_reserved_connections')::int"
        " - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')");
    /* Keep 10 for the bench's own connections and for other users; each
     * runner also has its control connection. */
    long per = (free_slots - 10) / consumers - 1;
    /* A runner claims up to --batch jobs whatever its thread count, so a
     * trivial handler needs few threads: more only add switching. */
    int cap = batch < 8 ? batch : 8;
    if (per > cap)
        per = cap;
    if (per < 1)
        die("the server has too few free connections (%ld) for %d runners; "
            "raise max_connections or lower --consumers",
            free_slots, consumers);
    return (int)per;
}
