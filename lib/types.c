/*
 * types.c: libpqtypes set up on a connection (prepared formats, mq_new_t's
 * registration), and the array parameters: ids, attempts, messages, keys
 * and priorities, put eight elements a PQputf.
 *
 * Every PQputf clears libpqtypes' 18 KB error state (new_msg.c), and a
 * prepared spec holds at most 8 types: so elements go eight a call, group
 * i of an array being its elements 8i to 8i + 7, the last group fewer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pqmq-int.h"

/* ---- set-up ------------------------------------------------------------ */

static const struct {
    const char *name, *format;
} spec_defs[PQMQ__NSPECS] = {
    [PQMQ__SPEC_UUID] = {"@pqmq_uuid", "%uuid"},
    [PQMQ__SPEC_INT4] = {"@pqmq_int4", "%int4"},
    [PQMQ__SPEC_UUID8] = {"@pqmq_uuid8", "%uuid %uuid %uuid %uuid %uuid %uuid %uuid %uuid"},
    [PQMQ__SPEC_INT4_8] = {"@pqmq_int4_8", "%int4 %int4 %int4 %int4 %int4 %int4 %int4 %int4"},
};

const char *pqmq__spec(const pqmq_client *c, enum pqmq__spec s)
{
    return c->specs_ready & (1u << s) ? spec_defs[s].name : spec_defs[s].format;
}

/* Prepares the specs on the connection, or finds them there from an
 * earlier client or before a PQreset (same built-in types, same formats).
 * One that fails (out of memory) stays unprepared; its format is used. */
static void prepare_specs(pqmq_client *c)
{
    c->specs_ready = 0;
    for (int s = 0; s < PQMQ__NSPECS; s++) {
        const char *name = spec_defs[s].name + 1; /* without the '@' */
        if (PQspecPrepare(c->conn, name, spec_defs[s].format, 0) ||
            strstr(PQgeterror(), "already exists"))
            c->specs_ready |= 1u << s;
    }
}

void pqmq__types_ready(pqmq_client *c)
{
    if (c->typed_conn == c->conn)
        return;
    /* Fails only when the caller already set libpqtypes up on a borrowed
     * conn, which is as good for us. */
    (void)PQinitTypes(c->conn);
    c->typed_conn = c->conn;
    c->composite_ready = 0;
    prepare_specs(c);
}

void pqmq__types_forget(pqmq_client *c)
{
    /* libpqtypes drops its registered types on reset: register again. */
    c->typed_conn = NULL;
    c->composite_ready = 0;
    c->specs_ready = 0;
}

/* libpqtypes' lookup of mq_new_t failed, saying why only in text: a missing
 * schema, or a refusal of the lookup itself (a statement timeout under
 * load, say), which must not read as a missing schema. A probe of our own
 * tells them apart and, when it is refused too, carries the SQLSTATE. */
static int lookup_failed(pqmq_client *c, PGregisterType *t, const char *why)
{
    char *text = strdup(why ? why : "");
    int rc;
    const char *call = c->call; /* the probe's errors name it */
    c->call = "looking up type mq_new_t";
    PGresult *r =
        pqmq__exec_text(c, "SELECT pg_catalog.to_regtype('mq_new_t') IS NOT NULL", &rc);
    c->call = call;
    if (!r) {
        free(text);
        return rc;
    }
    int present = PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    if (!present) {
        rc = pqmq__seterr(c, PQMQ_ESCHEMA,
                          "type mq_new_t not found on the search_path: %s; run pqmq_migrate",
                          text ? text : "");
    } else if (PQregisterTypes(c->conn, PQT_COMPOSITE, t, 1, 0)) {
        c->composite_ready = 1; /* refused once, then found */
        rc = 0;
    } else {
        rc = pqmq__seterr(c, PQMQ_ESERVER, "looking up type mq_new_t failed: %s",
                          text ? text : "");
    }
    free(text);
    return rc;
}

int pqmq__need_composite(pqmq_client *c)
{
    if (c->composite_ready)
        return 0;
    /* Its elements are written by pqmq__put_new_msg (new_msg.c). */
    PGregisterType t = {"mq_new_t", pqmq__put_new_msg, NULL};
    if (!PQregisterTypes(c->conn, PQT_USERDEFINED, &t, 1, 0)) {
        const char *why = PQgeterror();
        if (PQstatus(c->conn) != CONNECTION_OK)
            return pqmq__seterr(c, PQMQ_ECONN, "connection lost: %s", PQerrorMessage(c->conn));
        if (PQtransactionStatus(c->conn) == PQTRANS_INERROR) {
            /* The lookup failed because the caller's transaction already
             * did, not because the schema is missing. */
            int rc = pqmq__seterr(c, PQMQ_ESERVER,
                                  "current transaction is aborted, commands ignored until "
                                  "end of transaction block (SQLSTATE 25P02): roll it back");
            pqmq__set_sqlstate(c, "25P02");
            return rc;
        }
        return lookup_failed(c, &t, why);
    }
    c->composite_ready = 1;
    return 0;
}

/* ---- arrays ------------------------------------------------------------ */

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

/* Ids and attempt numbers, a group a call. The ids are the first member
 * of items that are size bytes apart: uuid_t ids, or deliveries. */
struct group {
    const void *items;
    size_t n, size;
};

static size_t group_len(const struct group *g, size_t i)
{
    size_t left = g->n - i * PQMQ__GROUP;
    return left < PQMQ__GROUP ? left : PQMQ__GROUP;
}

static int put_id(pqmq_client *c, PGparam *array, const void *items, size_t i)
{
    const struct group *g = items;
    const unsigned char *first = (const unsigned char *)g->items + i * PQMQ__GROUP * g->size;
    PGuuid u[PQMQ__GROUP];
    size_t k = group_len(g, i);
    for (size_t j = 0; j < k; j++)
        u[j] = (PGuuid)(first + j * g->size);
    if (k == PQMQ__GROUP)
        return PQputf(array, pqmq__spec(c, PQMQ__SPEC_UUID8), u[0], u[1], u[2], u[3], u[4],
                      u[5], u[6], u[7]);
    int ok = 1;
    for (size_t j = 0; ok && j < k; j++)
        ok = PQputf(array, pqmq__spec(c, PQMQ__SPEC_UUID), u[j]);
    return ok;
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

int pqmq__put_ids(pqmq_client *c, PGparam *param, const uuid_t *ids, size_t n)
{
    struct group g = {ids, n, sizeof(uuid_t)};
    return pqmq__put_array(c, param, "%uuid[]", &g, pqmq__groups(n), put_id);
}

int pqmq__put_deliveries(pqmq_client *c, PGparam *param, const pqmq__delivery *d, size_t n)
{
    struct group g = {d, n, sizeof *d};
    int rc = pqmq__put_array(c, param, "%uuid[]", &g, pqmq__groups(n), put_id);
    return rc ? rc
              : pqmq__put_array(c, param, "%int4[]", &g, pqmq__groups(n), put_delivery_attempt);
}

/* A batch's messages, put as mq_new_t elements a group a call (their
 * element handler: new_msg.c), and so are their priorities and unique
 * keys. */
struct batch {
    pqmq_msg *const *msgs;
    size_t n;
};

/* Group i of the batch (i < pqmq__groups(n)): messages 8i up to 8i + 7, or to
 * the batch's end, in g; returns how many, at least one. */
static size_t group_of(const struct batch *b, size_t i, const pqmq_msg **g)
{
    size_t k = 0;
    for (size_t j = i * PQMQ__GROUP; j < b->n && k < PQMQ__GROUP; j++)
        g[k++] = b->msgs[j];
    return k;
}

/* The first k (1..8) of eight conversions, each width bytes with its
 * space, as a format in buf. */
static const char *first_of(char *buf, const char *eight, size_t width, size_t k)
{
    size_t len = k * width - 1;
    memcpy(buf, eight, len);
    buf[len] = '\0';
    return buf;
}

static int put_group(pqmq_client *c, PGparam *array, const void *items, size_t i)
{
    (void)c;
    const pqmq_msg *g[PQMQ__GROUP] = {0};
    size_t k = group_of(items, i, g);
    char f[96];
    /* (Arguments past the format's k are not read.) */
    return PQputf(array,
                  first_of(f,
                           "%mq_new_t %mq_new_t %mq_new_t %mq_new_t %mq_new_t %mq_new_t "
                           "%mq_new_t %mq_new_t",
                           10, k),
                  g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]);
}

static int put_keys(pqmq_client *c, PGparam *array, const void *items, size_t i)
{
    (void)c;
    const pqmq_msg *g[PQMQ__GROUP] = {0};
    size_t k = group_of(items, i, g);
    const char *key[PQMQ__GROUP] = {0};
    for (size_t j = 0; j < k; j++)
        key[j] = g[j]->unique_key;
    char f[64];
    return PQputf(array,
                  first_of(f, "%text* %text* %text* %text* %text* %text* %text* %text*", 7, k),
                  key[0], key[1], key[2], key[3], key[4], key[5], key[6], key[7]);
}

/* Does any message of the batch have a priority above 0? */
static int has_priorities(pqmq_msg *const *msgs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (msgs[i]->priority)
            return 1;
    return 0;
}

static int put_priorities(pqmq_client *c, PGparam *array, const void *items, size_t i)
{
    (void)c;
    const pqmq_msg *g[PQMQ__GROUP] = {0};
    size_t k = group_of(items, i, g);
    int p[PQMQ__GROUP] = {0};
    for (size_t j = 0; j < k; j++)
        p[j] = g[j]->priority;
    char f[64];
    return PQputf(array, first_of(f, "%int4 %int4 %int4 %int4 %int4 %int4 %int4 %int4", 6, k),
                  p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]);
}

int pqmq__put_priorities_if_any(pqmq_client *c, PGparam *param, pqmq_msg *const *msgs, size_t n,
                                int *put)
{
    struct batch b = {msgs, n};
    *put = has_priorities(msgs, n);
    return *put ? pqmq__put_array(c, param, "%int4[]", &b, pqmq__groups(n), put_priorities) : 0;
}

int pqmq__put_batch(pqmq_client *c, PGparam *param, pqmq_msg *const *msgs, size_t n, int keys)
{
    struct batch b = {msgs, n};
    int rc = pqmq__put_array(c, param, "%mq_new_t[]", &b, pqmq__groups(n), put_group);
    if (!rc && keys)
        rc = pqmq__put_array(c, param, "%text[]", &b, pqmq__groups(n), put_keys);
    return rc;
}
