/*
 * physical.c: what processing a message costs the server physically, read
 * around a drain: WAL bytes and records (pg_current_wal_insert_lsn,
 * pg_stat_wal) and the updates of the queue's tables and their HOT share
 * (pg_stat_user_tables), divided by the messages processed.
 * Unlike rates, noise on a shared machine does not move these. The WAL is
 * the whole server's: the bench's cluster has nothing else running.
 */
#include <stdio.h>
#include <stdlib.h>

#include "physical.h"
#include "results.h"
#include "util.h"

/* One reading; pg_stat_force_next_flush and a short wait first, so that
 * the consumers' backends (closed just before) have reported. */
static void snap(PGconn *admin, struct phys_snap *s)
{
    bench_sql(admin, "SELECT pg_stat_force_next_flush()");
    sleep_s(0.5);
    bench_sql(admin, "SELECT pg_stat_clear_snapshot()");
    PGresult *r = PQexec(admin, "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn,"
                                " (SELECT wal_records FROM pg_stat_wal),"
                                " COALESCE((SELECT sum(n_tup_upd) FROM pg_stat_user_tables"
                                "           WHERE relname IN ('mq_rows', 'mq_log', "
                                "'mq_cursors', 'mq_receipts', 'mq_done', 'mq_log_gone')), 0),"
                                " COALESCE((SELECT sum(n_tup_hot_upd) FROM pg_stat_user_tables"
                                "           WHERE relname IN ('mq_rows', 'mq_log', "
                                "'mq_cursors', 'mq_receipts', 'mq_done', 'mq_log_gone')), 0)");
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        die("physical: %s", PQerrorMessage(admin));
    s->wal_bytes = strtod(PQgetvalue(r, 0, 0), NULL);
    s->wal_records = strtod(PQgetvalue(r, 0, 1), NULL);
    s->updates = strtod(PQgetvalue(r, 0, 2), NULL);
    s->hot_updates = strtod(PQgetvalue(r, 0, 3), NULL);
    PQclear(r);
}

void physical_begin(PGconn *admin, struct phys_snap *s)
{
    snap(admin, s);
}

void physical_end(PGconn *admin, const struct phys_snap *s, long messages, struct physical *out)
{
    struct phys_snap e;
    snap(admin, &e);
    double n = messages > 0 ? (double)messages : 1;
    out->wal_bytes = (e.wal_bytes - s->wal_bytes) / n;
    out->wal_records = (e.wal_records - s->wal_records) / n;
    double upd = e.updates - s->updates;
    out->updates = upd / n;
    out->hot = upd > 0 ? (e.hot_updates - s->hot_updates) / upd : 1;
}
