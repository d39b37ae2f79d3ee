/*
 * stmt.c: the statement layer every API file uses: parameters (arrays of
 * ids, deliveries, channels, counts, durations), the prologues of calls that
 * take ids, running a statement, and turning its failure into a code and a
 * message on the client.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pqmq-int.h"

/* ---- running statements ------------------------------------------------ */

/* Maps a failed statement to a code and message (detail: the server's
 * DETAIL, which names what was wrong, e.g. the duplicate key; may be NULL). */
static int fail_from(pqmq_client *c, const char *msg, const char *detail, const char *state)
{
    /* An error libpq made itself (no SQLSTATE) is often a dead connection
     * that libpq still calls CONNECTION_OK until it reads the hang-up: read
     * it. A lost connection leaves the statement's outcome unknown, which
     * PQMQ_ECONN says and PQMQ_ESERVER ("refused") would not. Server-side
     * shutdowns (57P0x) and connection exceptions (08xxx) count too. */
    if (!state)
        (void)PQconsumeInput(c->conn);
    if (PQstatus(c->conn) != CONNECTION_OK || (!state && PQsocket(c->conn) < 0) ||
        (state && (!strncmp(state, "57P0", 4) || !strncmp(state, "08", 2)))) {
        int rc = pqmq__err(c, PQMQ_ECONN, "connection lost: %s",
                           msg && *msg ? msg : PQerrorMessage(c->conn));
        pqmq__set_sqlstate(c, state);
        return rc;
    }
    int code = PQMQ_ESERVER;
    if (state &&
        (!strcmp(state, "42883") || !strcmp(state, "42P01") || !strcmp(state, "42704")))
        code = PQMQ_ESCHEMA; /* undefined function, table or type */
    else if (state && !strcmp(state, "22023"))
        code = PQMQ_EINVAL; /* invalid_parameter_value from our checks */
    else if (state && !strcmp(state, "54000"))
        code = PQMQ_ETOOBIG; /* program_limit_exceeded */
    else if (state && !strcmp(state, "PQ001"))
        code = PQMQ_ESTALE; /* mq_complete_all: not all were still ours */
    int rc = pqmq__err(c, code, "%s%s%s%s%s%s%s", msg && *msg ? msg : "error",
                       state ? " (SQLSTATE " : "", state ? state : "", state ? ")" : "",
                       detail && *detail ? ": " : "", detail && *detail ? detail : "",
                       code == PQMQ_ESCHEMA ? "; run pqmq_migrate to create the queue" : "");
    pqmq__set_sqlstate(c, state);
    return rc;
}

/* The server's one-line message, or libpq's own text for local errors. */
static const char *result_message(const PGresult *r)
{
    const char *primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    return primary && *primary ? primary : PQresultErrorMessage(r);
}

/* Takes a statement's last result: returns it when it succeeded, else
 * clears it, sets the error and returns NULL. */
static PGresult *outcome(pqmq_client *c, PGresult *r, int *rc)
{
    ExecStatusType st = PQresultStatus(r);
    if (r && (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)) {
        if (!c->doubt[0]) {
            *rc = 0;
            return r;
        }
        /* Succeeded, but a commit's outcome is unknown (client.c). */
        *rc = pqmq__err(c, PQMQ_ECONN, "the commit's outcome is unknown (%s)", c->doubt);
        c->doubt[0] = '\0';
        PQclear(r);
        return NULL;
    }
    if (!r)
        *rc = fail_from(c, PQerrorMessage(c->conn), NULL, NULL);
    else
        *rc = fail_from(c, result_message(r), PQresultErrorField(r, PG_DIAG_MESSAGE_DETAIL),
                        PQresultErrorField(r, PG_DIAG_SQLSTATE));
    PQclear(r);
    return NULL;
}

PGresult *pqmq__exec(pqmq_client *c, PGparam *param, const char *sql, int *rc)
{
    /* Send with libpqtypes, but read the outcome from the PGresult: the
     * error text libpqtypes keeps (PQgeterror) is one per process, which
     * threads with their own connections would overwrite. */
    if (!PQparamSendQuery(c->conn, param, sql, 1)) {
        *rc = fail_from(c, PQerrorMessage(c->conn), NULL, NULL);
        return NULL;
    }
    PGresult *r = NULL, *next;
    while ((next = PQgetResult(c->conn)) != NULL) {
        PQclear(r); /* only the last result of the statement matters */
        r = next;
    }
    return outcome(c, r, rc);
}

PGresult *pqmq__result_outcome(pqmq_client *c, PGresult *r, int *rc)
{
    return outcome(c, r, rc);
}

/* Sends one parameterless statement into the pipeline. */
static int send_plain(PGconn *conn, const char *sql)
{
    return !sql || PQsendQueryParams(conn, sql, 0, NULL, NULL, NULL, NULL, 0);
}

/* The results of one statement in the pipeline: its last one, or NULL. */
static PGresult *take(PGconn *conn)
{
    PGresult *r = NULL, *next;
    while ((next = PQgetResult(conn)) != NULL) {
        PQclear(r);
        r = next;
    }
    return r;
}

/* The outcome of one piped statement (sql may be NULL: none was sent). */
static PGresult *piped_outcome(pqmq_client *c, const char *sql, int *rc)
{
    if (!sql)
        return NULL;
    PGresult *r = take(c->conn);
    if (r && PQresultStatus(r) == PGRES_PIPELINE_ABORTED) {
        PQclear(r);
        *rc = PQMQ_ESERVER; /* an earlier statement failed and said why */
        return NULL;
    }
    return outcome(c, r, rc);
}

PGresult *pqmq__exec_piped(pqmq_client *c, const char *before, PGparam *param, const char *sql,
                           const char *after, int *rc)
{
    PGconn *conn = c->conn;
    if (!PQenterPipelineMode(conn)) {
        *rc = fail_from(c, PQerrorMessage(conn), NULL, NULL);
        return NULL;
    }
    if (!send_plain(conn, before) || !PQparamSendQuery(conn, param, sql, 1) ||
        !send_plain(conn, after) || !PQpipelineSync(conn)) {
        *rc = fail_from(c, PQerrorMessage(conn), NULL, NULL);
        PQexitPipelineMode(conn);
        return NULL;
    }
    int rc_before = 0, rc_after = 0;
    PQclear(piped_outcome(c, before, &rc_before));
    PGresult *r = piped_outcome(c, sql, rc);
    if (!rc_before && *rc)
        rc_before = *rc; /* the statement's own error is the one to report */
    PQclear(piped_outcome(c, after, &rc_after));
    PGresult *sync =
        PQgetResult(conn); /* PGRES_PIPELINE_SYNC, or NULL if the connection died */
    PQclear(sync);
    PQexitPipelineMode(conn);
    *rc = rc_before ? rc_before : *rc ? *rc : rc_after;
    if (*rc) {
        PQclear(r);
        return NULL;
    }
    return r;
}

PGresult *pqmq__exec_text(pqmq_client *c, const char *sql, int *rc)
{
    return outcome(c, PQexec(c->conn, sql), rc);
}

int pqmq__exec_scalar(pqmq_client *c, PGparam *param, const char *sql, const char *spec,
                      int *value)
{
    int rc;
    PGresult *r = pqmq__exec(c, param, sql, &rc);
    if (!r)
        return rc;
    *value = 0;
    if (spec && !PQgetf(r, 0, spec, 0, value))
        rc = pqmq__err(c, PQMQ_ESERVER, "unexpected result: %s", PQgeterror());
    PQclear(r);
    return rc;
}

/* ---- parameters -------------------------------------------------------- */

PGparam *pqmq__param(pqmq_client *c)
{
    PGparam *p = PQparamCreate(c->conn);
    if (!p)
        pqmq__seterr(c, PQMQ_ENOMEM, "out of memory creating parameters");
    return p;
}

int pqmq__put_array(pqmq_client *c, PGparam *param, const char *array_format, const void *items,
                    size_t n, pqmq__put_element put)
{
    PGarray arr;
    memset(&arr, 0, sizeof arr);
    if (!(arr.param = pqmq__param(c)))
        return PQMQ_ENOMEM;
    int ok = 1;
    for (size_t i = 0; ok && i < n; i++)
        ok = put(c, arr.param, items, i);
    ok = ok && PQputf(param, array_format, &arr);
    PQparamClear(arr.param);
    if (!ok)
        return pqmq__err(c, PQMQ_ENOMEM, "cannot build an array parameter: %s", PQgeterror());
    return 0;
}

/* Ids and attempt numbers go eight a PQputf (every PQputf clears
 * libpqtypes' 18 KB error state: new_msg.c): group i of the array is its
 * elements 8i to 8i + 7, the last group fewer, put one a call. */
struct group {
    const void *items;
    size_t n;
};

static size_t group_len(const struct group *g, size_t i)
{
    size_t left = g->n - i * PQMQ__GROUP;
    return left < PQMQ__GROUP ? left : PQMQ__GROUP;
}

static int put_uuids(pqmq_client *c, PGparam *array, PGuuid *u, size_t k)
{
    if (k == PQMQ__GROUP)
        return PQputf(array, pqmq__spec(c, PQMQ__SPEC_UUID8), u[0], u[1], u[2], u[3], u[4],
                      u[5], u[6], u[7]);
    int ok = 1;
    for (size_t j = 0; ok && j < k; j++)
        ok = PQputf(array, pqmq__spec(c, PQMQ__SPEC_UUID), u[j]);
    return ok;
}

static int put_id(pqmq_client *c, PGparam *array, const void *items, size_t i)
{
    const struct group *g = items;
    const uuid_t *ids = (const uuid_t *)g->items + i * PQMQ__GROUP;
    PGuuid u[PQMQ__GROUP];
    size_t k = group_len(g, i);
    for (size_t j = 0; j < k; j++)
        u[j] = (PGuuid)ids[j];
    return put_uuids(c, array, u, k);
}

static int put_delivery_id(pqmq_client *c, PGparam *array, const void *items, size_t i)
{
    const struct group *g = items;
    const pqmq__delivery *d = (const pqmq__delivery *)g->items + i * PQMQ__GROUP;
    PGuuid u[PQMQ__GROUP];
    size_t k = group_len(g, i);
    for (size_t j = 0; j < k; j++)
        u[j] = (PGuuid)d[j].id;
    return put_uuids(c, array, u, k);
}

static int put_delivery_attempt(pqmq_client *c, PGparam *array, const void *items, size_t i)
{
    const struct group *g = items;
    const pqmq__delivery *d = (const pqmq__delivery *)g->items + i * PQMQ__GROUP;
    size_t k = group_len(g, i);
    if (k == PQMQ__GROUP)
        return PQputf(array, pqmq__spec(c, PQMQ__SPEC_INT4_8), d[0].attempt, d[1].attempt,
                      d[2].attempt, d[3].attempt, d[4].attempt, d[5].attempt, d[6].attempt,
                      d[7].attempt);
    int ok = 1;
    for (size_t j = 0; ok && j < k; j++)
        ok = PQputf(array, pqmq__spec(c, PQMQ__SPEC_INT4), d[j].attempt);
    return ok;
}

static int put_text(pqmq_client *c, PGparam *array, const void *items, size_t i)
{
    (void)c;
    const char *const *texts = items;
    return PQputf(array, "%text*", texts[i]);
}

int pqmq__put_ids(pqmq_client *c, PGparam *param, const uuid_t *ids, size_t n)
{
    int rc = pqmq__check_ids(c, ids, n);
    struct group g = {ids, n};
    return rc ? rc : pqmq__put_array(c, param, "%uuid[]", &g, pqmq__groups(n), put_id);
}

int pqmq__put_deliveries(pqmq_client *c, PGparam *param, const pqmq__delivery *d, size_t n)
{
    int rc = pqmq__check_ids(c, d, n);
    struct group g = {d, n};
    if (!rc)
        rc = pqmq__put_array(c, param, "%uuid[]", &g, pqmq__groups(n), put_delivery_id);
    return rc ? rc
              : pqmq__put_array(c, param, "%int4[]", &g, pqmq__groups(n), put_delivery_attempt);
}

int pqmq__put_channels(pqmq_client *c, PGparam *param, const char *const *channels, size_t n)
{
    if (!channels)
        return PQputf(param, "%text[]", NULL) ? 0
                                              : pqmq__err(c, PQMQ_ENOMEM, "%s", PQgeterror());
    if (n == 0)
        return pqmq__err(c, PQMQ_EINVAL, "nchannels is 0 (pass channels NULL for all)");
    for (size_t i = 0; i < n; i++)
        if (!channels[i]) /* "" is a channel like any other */
            return pqmq__err(c, PQMQ_EINVAL, "channels[%zu] is NULL", i);
    return pqmq__put_array(c, param, "%text[]", channels, n, put_text);
}

int pqmq__put_count(pqmq_client *c, PGparam *param, const char *arg, int value)
{
    if (value < 1 || value > PQMQ_MAX_BATCH)
        return pqmq__err(c, PQMQ_EINVAL, "%s %d is outside 1..%d", arg, value, PQMQ_MAX_BATCH);
    if (!PQputf(param, pqmq__spec(c, PQMQ__SPEC_INT4), value))
        return pqmq__err(c, PQMQ_ENOMEM, "%s", PQgeterror());
    return 0;
}

int pqmq__put_channels_count(pqmq_client *c, PGparam *param, const char *const *channels,
                             size_t nchannels, const char *arg, int value)
{
    int rc = pqmq__put_channels(c, param, channels, nchannels);
    return rc ? rc : pqmq__put_count(c, param, arg, value);
}

int pqmq__put_duration(pqmq_client *c, PGparam *param, int64_t ms, const char *arg)
{
    int rc = arg ? pqmq__check_ms(c, ms, "%s: %s", c->call, arg)
                 : pqmq__check_ms(c, ms, "%s", c->call);
    if (rc)
        return rc;
    PGinterval iv;
    pqmq__ms_to_interval(ms, &iv);
    if (!PQputf(param, "%interval", &iv))
        return pqmq__err(c, PQMQ_ENOMEM, "%s", PQgeterror());
    return 0;
}

/* ---- prologues --------------------------------------------------------- */

int pqmq__check_ids(pqmq_client *c, const void *ids, size_t n)
{
    if (!ids || n == 0)
        return pqmq__err(c, PQMQ_EINVAL, "no ids given (ids %s, n %zu)", ids ? "set" : "NULL",
                         n);
    if (n > PQMQ_MAX_BATCH)
        return pqmq__err(c, PQMQ_ETOOBIG, "%zu ids is over the limit of %d", n, PQMQ_MAX_BATCH);
    return 0;
}

int pqmq__begin(pqmq_client *c, PGparam **param)
{
    *param = NULL;
    pqmq__clearerr(c);
    int rc = pqmq__ready(c);
    if (!rc && !(*param = pqmq__param(c)))
        rc = PQMQ_ENOMEM;
    return rc;
}

int pqmq__begin_ids(pqmq_client *c, const uuid_t *ids, size_t n, PGparam **param)
{
    int rc = pqmq__begin(c, param);
    return rc ? rc : pqmq__put_ids(c, *param, ids, n);
}

int pqmq__begin_deliveries(pqmq_client *c, const pqmq__delivery *d, size_t n, PGparam **param)
{
    int rc = pqmq__begin(c, param);
    return rc ? rc : pqmq__put_deliveries(c, *param, d, n);
}

int pqmq__begin_id(pqmq_client *c, const uuid_t id, PGparam **param)
{
    int rc = pqmq__begin(c, param);
    if (!rc && !id)
        rc = pqmq__err(c, PQMQ_EINVAL, "id is NULL");
    if (!rc && !PQputf(*param, pqmq__spec(c, PQMQ__SPEC_UUID), (PGuuid)id))
        rc = pqmq__err(c, PQMQ_ENOMEM, "%s", PQgeterror());
    return rc;
}

int pqmq__ids_call(pqmq_client *c, const char *call, const char *sql, const uuid_t *ids,
                   size_t n, const int *extra, size_t *count)
{
    if (count)
        *count = 0;
    if (pqmq__enter(c, call))
        return PQMQ_EINVAL;
    PGparam *param;
    int rc = pqmq__begin_ids(c, ids, n, &param);
    if (!rc && extra && !PQputf(param, pqmq__spec(c, PQMQ__SPEC_INT4), *extra))
        rc = pqmq__err(c, PQMQ_ENOMEM, "%s", PQgeterror());
    int got = 0;
    if (!rc)
        rc = pqmq__exec_scalar(c, param, sql, count ? "%int4" : NULL, &got);
    PQparamClear(param);
    if (!rc && count)
        *count = (size_t)got;
    return rc;
}

/* ---- durations --------------------------------------------------------- */

void pqmq__ms_to_interval(int64_t ms, PGinterval *iv)
{
    memset(iv, 0, sizeof *iv);
    iv->hours = (int)(ms / 3600000);
    ms %= 3600000;
    iv->mins = (int)(ms / 60000);
    ms %= 60000;
    iv->secs = (int)(ms / 1000);
    iv->usecs = (int)(ms % 1000) * 1000;
}

int pqmq__check_ms(pqmq_client *c, int64_t ms, const char *fmt, ...)
{
    if (ms >= 0 && ms <= PQMQ_MAX_DURATION_MS)
        return 0;
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (ms < 0)
        return pqmq__seterr(c, PQMQ_EINVAL, "%s is negative (%lld ms)", name, (long long)ms);
    return pqmq__seterr(c, PQMQ_EINVAL, "%s of %lld ms is over the limit of 3650 days", name,
                        (long long)ms);
}
