/*
 * profile.c: --profile, where a phase's time goes. Every connection runs
 * with track_functions = pl (a superuser setting), so the server counts
 * calls, total and self time of each SQL function of the queue; after each
 * phase (once its backends have exited, which flushes their counters:
 * settle) the deltas are printed to stderr, with the bench process's own
 * CPU time beside the phase's wall time: client against server.
 * When the server runs on this machine, the CPU time of the backends that
 * exited during the phase (the postmaster's cutime + cstime from /proc: the
 * phase's own connections, but also any other session's that ended
 * meanwhile) is printed too.
 * With the number of messages the phase moved, it also prints the physical
 * cost per message from the server's statistics, which noise does not
 * move: WAL records, bytes and full-page images (pg_stat_wal, the whole
 * cluster), heap tuples inserted, updated and deleted in the bench schema,
 * the fraction of updates that were HOT (they wrote no index entry), and the
 * probes of the chains' index (mq_msgs_chain) and entries they read: what a
 * poll's walk of the chains steps over.
 * When the bench's database has pg_stat_statements (CREATE EXTENSION, with
 * the library preloaded), it also prints the statements the server ran per
 * message (each statement of a multi-statement query counts) and the
 * commits per message, and the phase's most frequent statements: where
 * the round trips go.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "options.h"
#include "profile.h"
#include "util.h"

#define MAX_FUNCS 64
#define MAX_STMTS 256
#define TOP_STMTS 8

/* A statement's calls so far (pg_stat_statements), by queryid. */
struct sstat {
    char id[24];
    char text[72];
    long calls;
};

struct fstat {
    char name[64];
    long calls;
    double total_ms, self_ms;
};

/* Physical work done so far, from the server's statistics. */
struct phys {
    double wal_bytes;
    long wal_records, wal_fpi;
    long ins, upd, hot, del;
    long chain_scans, chain_reads; /* mq_msgs_chain: probes, entries read */
};

static struct {
    int nf;
    struct fstat f[MAX_FUNCS];
    struct phys phys;
    double wall, user, sys;
    long postmaster;   /* 0: not looked up yet; -1: not on this machine */
    double server_cpu; /* postmaster's reaped children's CPU at begin */
    int pss;           /* 0: not looked up yet; 1: pg_stat_statements; -1: none */
    char pss_view[96]; /* its view, schema-qualified */
    int ns;
    struct sstat s[MAX_STMTS];
    long commits;
} S;

/* The postmaster's pid if the server runs here: the parent of our
 * backend, when /proc shows it as a postgres process. */
static long find_postmaster(PGconn *admin)
{
    long backend = bench_scalar(admin, "SELECT pg_backend_pid()");
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%ld/status", backend);
    FILE *f = fopen(path, "r");
    long ppid = -1;
    int postgres = 0;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "PPid:", 5))
            ppid = strtol(line + 5, NULL, 10);
        if (!strncmp(line, "Name:", 5) && strstr(line, "postgres"))
            postgres = 1;
    }
    fclose(f);
    return postgres && ppid > 1 ? ppid : -1;
}

/* CPU seconds of the postmaster's reaped children, or -1. */
static double reaped_cpu(void)
{
    if (S.postmaster <= 0)
        return -1;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", S.postmaster);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* after the command name */
    if (!p)
        return -1;
    /* Fields after ")": state(3) ... utime(14) stime(15) cutime(16) cstime(17). */
    long v[15];
    int k = 0;
    for (p++; k < 15 && *p; k++) {
        char *end;
        while (*p == ' ')
            p++;
        v[k] = strtol(p, &end, 10);
        if (end == p) { /* the state letter */
            while (*p && *p != ' ')
                p++;
            v[k] = 0;
        } else {
            p = end;
        }
    }
    if (k < 15)
        return -1;
    return (double)(v[13] + v[14]) / (double)sysconf(_SC_CLK_TCK);
}

static double cpu_s(const struct timeval *tv)
{
    return (double)tv->tv_sec + tv->tv_usec / 1e6;
}

static void snapshot(PGconn *admin, struct fstat *f, int *nf)
{
    bench_sql(admin, "SELECT pg_stat_clear_snapshot()");
    PGresult *r = PQexec(admin, "SELECT funcname, calls, total_time, self_time"
                                " FROM pg_stat_user_functions"
                                " WHERE schemaname = '" BENCH_SCHEMA "' ORDER BY funcname");
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        die("profile: %s", PQerrorMessage(admin));
    *nf = 0;
    for (int i = 0; i < PQntuples(r) && i < MAX_FUNCS; i++) {
        snprintf(f[i].name, sizeof f[i].name, "%s", PQgetvalue(r, i, 0));
        f[i].calls = strtol(PQgetvalue(r, i, 1), NULL, 10);
        f[i].total_ms = strtod(PQgetvalue(r, i, 2), NULL);
        f[i].self_ms = strtod(PQgetvalue(r, i, 3), NULL);
        (*nf)++;
    }
    PQclear(r);
}

static void phys_snapshot(PGconn *admin, struct phys *p)
{
    PGresult *r = PQexec(
        admin, "SELECT w.wal_records, w.wal_fpi, w.wal_bytes, t.ins, t.upd, t.hot, t.del,"
               " i.scans, i.reads"
               " FROM pg_stat_wal w, (SELECT COALESCE(sum(n_tup_ins), 0) AS ins,"
               " COALESCE(sum(n_tup_upd), 0) AS upd, COALESCE(sum(n_tup_hot_upd), 0)"
               " AS hot, COALESCE(sum(n_tup_del), 0) AS del FROM pg_stat_user_tables"
               " WHERE schemaname = '" BENCH_SCHEMA "') t,"
               " (SELECT COALESCE(sum(idx_scan), 0) AS scans,"
               " COALESCE(sum(idx_tup_read), 0) AS reads FROM pg_stat_user_indexes"
               " WHERE schemaname = '" BENCH_SCHEMA "'"
               " AND indexrelname = 'mq_msgs_chain') i");
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        die("profile: %s", PQerrorMessage(admin));
    p->wal_records = strtol(PQgetvalue(r, 0, 0), NULL, 10);
    p->wal_fpi = strtol(PQgetvalue(r, 0, 1), NULL, 10);
    p->wal_bytes = strtod(PQgetvalue(r, 0, 2), NULL);
    p->ins = strtol(PQgetvalue(r, 0, 3), NULL, 10);
    p->upd = strtol(PQgetvalue(r, 0, 4), NULL, 10);
    p->hot = strtol(PQgetvalue(r, 0, 5), NULL, 10);
    p->del = strtol(PQgetvalue(r, 0, 6), NULL, 10);
    p->chain_scans = strtol(PQgetvalue(r, 0, 7), NULL, 10);
    p->chain_reads = strtol(PQgetvalue(r, 0, 8), NULL, 10);
    PQclear(r);
}

/* The physical cost per message of the phase that just ended. */
static void phys_report(const struct phys *a, const struct phys *b, long messages)
{
    if (messages <= 0)
        return;
    double m = (double)messages;
    long upd = b->upd - a->upd;
    fprintf(stderr,
            "  per message: WAL %.0f bytes in %.1f records (%.2f full-page images); heap "
            "tuples inserted %.2f, updated %.2f (HOT %.0f%%), deleted %.2f\n",
            (b->wal_bytes - a->wal_bytes) / m, (double)(b->wal_records - a->wal_records) / m,
            (double)(b->wal_fpi - a->wal_fpi) / m, (double)(b->ins - a->ins) / m,
            (double)upd / m, upd > 0 ? 100.0 * (double)(b->hot - a->hot) / (double)upd : 0.0,
            (double)(b->del - a->del) / m);
    /* What a poll's walk of the chains costs: probes of their index. */
    if (b->chain_scans > a->chain_scans)
        fprintf(stderr, "  per message: mq_msgs_chain probes %.2f, entries read %.1f\n",
                (double)(b->chain_scans - a->chain_scans) / m,
                (double)(b->chain_reads - a->chain_reads) / m);
}

/* Whether the database has pg_stat_statements; finds its view. */
static int have_pss(PGconn *admin)
{
    if (S.pss)
        return S.pss > 0;
    PGresult *r =
        PQexec(admin, "SELECT quote_ident(n.nspname) || '.pg_stat_statements'"
                      " FROM pg_extension e JOIN pg_namespace n"
                      " ON n.oid = e.extnamespace WHERE e.extname = 'pg_stat_statements'");
    S.pss = -1;
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
        snprintf(S.pss_view, sizeof S.pss_view, "%s", PQgetvalue(r, 0, 0));
        S.pss = 1;
    }
    PQclear(r);
    return S.pss > 0;
}

/* The statements' calls so far (the most frequent MAX_STMTS, which covers
 * a phase's), and the database's commits. */
static void stmt_snapshot(PGconn *admin, struct sstat *st, int *ns, long *commits)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT queryid::text, left(regexp_replace(query, '\\s+', ' ', 'g'), %d), calls"
             " FROM %s WHERE dbid = (SELECT oid FROM pg_database"
             " WHERE datname = current_database()) ORDER BY calls DESC LIMIT %d",
             (int)sizeof st->text - 1, S.pss_view, MAX_STMTS);
    PGresult *r = PQexec(admin, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        die("profile: %s", PQerrorMessage(admin));
    *ns = 0;
    for (int i = 0; i < PQntuples(r) && i < MAX_STMTS; i++, (*ns)++) {
        snprintf(st[i].id, sizeof st[i].id, "%s", PQgetvalue(r, i, 0));
        snprintf(st[i].text, sizeof st[i].text, "%s", PQgetvalue(r, i, 1));
        st[i].calls = strtol(PQgetvalue(r, i, 2), NULL, 10);
    }
    PQclear(r);
    *commits = bench_scalar(admin, "SELECT xact_commit FROM pg_stat_database"
                                   " WHERE datname = current_database()");
}

static int by_calls_desc(const void *a, const void *b)
{
    long x = ((const struct sstat *)a)->calls, y = ((const struct sstat *)b)->calls;
    return (x < y) - (x > y);
}

/* Statements and commits per message of the phase that just ended, and
 * its most frequent statements (the admin connection's few included). */
static void stmt_report(PGconn *admin, long messages)
{
    static struct sstat now[MAX_STMTS];
    int n;
    long commits;
    stmt_snapshot(admin, now, &n, &commits);
    long total = 0;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < S.ns; k++)
            if (!strcmp(S.s[k].id, now[i].id)) {
                now[i].calls -= S.s[k].calls;
                break;
            }
        total += now[i].calls;
    }
    qsort(now, (size_t)n, sizeof *now, by_calls_desc);
    double m = messages > 0 ? (double)messages : 1;
    fprintf(stderr, "  per message: statements %.3f, commits %.4f\n", (double)total / m,
            (double)(commits - S.commits) / m);
    for (int i = 0; i < n && i < TOP_STMTS && now[i].calls > 0; i++)
        fprintf(stderr, "  %8.3f  %s\n", (double)now[i].calls / m, now[i].text);
}

/* Waits (3 s at most) until the phase's backends have gone: a backend
 * flushes its statistics as it exits, before it leaves pg_stat_activity.
 * (Other sessions of the database, or a pooler's, make it wait the 3 s.) */
static void settle(PGconn *admin)
{
    for (int i = 0; i < 30; i++) {
        if (!bench_scalar(admin, "SELECT count(*) FROM pg_stat_activity"
                                 " WHERE datname = current_database()"
                                 " AND backend_type = 'client backend'"
                                 " AND pid <> pg_backend_pid()"))
            break;
        sleep_s(0.1);
    }
}

void profile_begin(const struct opts *o, PGconn *admin)
{
    if (!o->profile)
        return;
    settle(admin); /* backends of the previous phase flush their counters on exit */
    snapshot(admin, S.f, &S.nf);
    phys_snapshot(admin, &S.phys);
    if (have_pss(admin))
        stmt_snapshot(admin, S.s, &S.ns, &S.commits);
    if (!S.postmaster)
        S.postmaster = find_postmaster(admin);
    S.server_cpu = reaped_cpu();
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    S.user = cpu_s(&ru.ru_utime);
    S.sys = cpu_s(&ru.ru_stime);
    S.wall = now_s();
}

void profile_end(const struct opts *o, PGconn *admin, const char *label, long messages)
{
    if (!o->profile)
        return;
    double wall = now_s() - S.wall;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double user = cpu_s(&ru.ru_utime) - S.user, sys = cpu_s(&ru.ru_stime) - S.sys;
    settle(admin);
    struct fstat now[MAX_FUNCS];
    int n;
    snapshot(admin, now, &n);
    struct phys phys;
    phys_snapshot(admin, &phys);
    double server = reaped_cpu();
    fprintf(stderr,
            "profile: %s: wall %.3f s (with connecting), bench process CPU %.3f s "
            "(user %.3f, sys %.3f)",
            label, wall, user + sys, user, sys);
    if (server >= 0 && S.server_cpu >= 0)
        fprintf(stderr, ", exited backends CPU %.3f s", server - S.server_cpu);
    fputc('\n', stderr);
    phys_report(&S.phys, &phys, messages);
    if (have_pss(admin))
        stmt_report(admin, messages);
    int header = 0;
    for (int i = 0; i < n; i++) {
        struct fstat d = now[i];
        for (int k = 0; k < S.nf; k++)
            if (!strcmp(S.f[k].name, d.name)) {
                d.calls -= S.f[k].calls;
                d.total_ms -= S.f[k].total_ms;
                d.self_ms -= S.f[k].self_ms;
            }
        if (d.calls <= 0)
            continue;
        if (!header++)
            fprintf(stderr, "  %-22s %8s %11s %11s %9s\n", "SQL function", "calls", "total ms",
                    "self ms", "ms/call");
        fprintf(stderr, "  %-22s %8ld %11.1f %11.1f %9.3f\n", d.name, d.calls, d.total_ms,
                d.self_ms, d.total_ms / (double)d.calls);
    }
}
