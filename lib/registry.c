/*
 * registry.c: a runner's entry in mq_workers: registered when the runner
 * starts, a heartbeat (one UPDATE) every PQMQ__BEAT_MS, deleted when it
 * stops. Runs on the runner's control connection, between its polls.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "claims.h"
#include "pqmq-int.h"
#include "registry.h"

/* A text[] literal of the channels (a parameter value, never SQL text), or
 * NULL for every channel / no memory. Caller frees. */
static char *channels_literal(char *const *names, size_t n)
{
    size_t len = 3;
    for (size_t i = 0; i < n; i++)
        len += 2 * strlen(names[i]) + 3;
    char *s = n ? malloc(len) : NULL, *p = s;
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

/* Runs sql with text parameters; returns the first value as a number, or
 * -1 when it failed (ignored: see registry.h). */
static long long call(pqmq_client *c, const char *sql, int n, const char *const *params)
{
    PGconn *conn = pqmq_conn(c);
    if (!conn || PQstatus(conn) != CONNECTION_OK)
        return -1;
    PGresult *r = PQexecParams(conn, sql, n, NULL, params, NULL, NULL, 0);
    long long v = -1;
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0)) {
        const char *x = PQgetvalue(r, 0, 0);
        v = x[0] == 't' ? 1 : x[0] == 'f' ? 0 : atoll(x);
    }
    PQclear(r);
    return v;
}

static void join(pqmq__registry *g, pqmq_client *c)
{
    char host[256] = "", pid[16], threads[16];
    if (gethostname(host, sizeof host - 1) != 0)
        host[0] = '\0';
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    snprintf(threads, sizeof threads, "%d", g->threads);
    char *chans = channels_literal(g->channels, g->nchannels);
    if (g->nchannels && !chans)
        return; /* no memory: next beat */
    const char *p[5] = {host, pid, PACKAGE_VERSION, chans, threads};
    long long id =
        call(c, "SELECT mq_worker_register($1, $2::int, $3, $4::text[], $5::int)", 5, p);
    free(chans);
    g->id = id > 0 ? id : 0;
}

void pqmq__registry_join(pqmq__registry *g, pqmq_client *c, char *const *channels,
                         size_t nchannels, int threads)
{
    *g = (pqmq__registry){.channels = channels, .nchannels = nchannels, .threads = threads};
    join(g, c);
    g->beat_at = pqmq__now_ms() + PQMQ__BEAT_MS;
}

void pqmq__registry_beat(pqmq__registry *g, pqmq_client *c, const pqmq__counters *k)
{
    if (pqmq__now_ms() < g->beat_at)
        return;
    g->beat_at = pqmq__now_ms() + PQMQ__BEAT_MS;
    if (!g->id) {
        join(g, c);
        return;
    }
    char id[24], done[24], failed[24], in_flight[24];
    snprintf(id, sizeof id, "%lld", g->id);
    snprintf(done, sizeof done, "%llu", (unsigned long long)atomic_load(&k->processed));
    snprintf(failed, sizeof failed, "%llu", (unsigned long long)atomic_load(&k->failed));
    snprintf(in_flight, sizeof in_flight, "%llu",
             (unsigned long long)atomic_load(&k->in_flight));
    const char *p[4] = {id, done, failed, in_flight};
    if (call(c, "SELECT mq_worker_beat($1::bigint, $2::bigint, $3::bigint, $4::int)", 4, p) ==
        0)
        join(g, c); /* the entry was deleted (a stop of an hour): a new one */
}

void pqmq__registry_leave(pqmq__registry *g, pqmq_client *c)
{
    if (!g->id)
        return;
    char id[24];
    snprintf(id, sizeof id, "%lld", g->id);
    const char *p[1] = {id};
    call(c, "SELECT mq_worker_leave($1::bigint)", 1, p);
    g->id = 0;
}
