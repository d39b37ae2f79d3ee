/*
 * unique.c: inserting messages with unique keys (mq_insert_unique), and
 * what became of each: inserted, kept or replaced.
 */
#include <string.h>

#include "pqmq-int.h"

static const char *mode_name(pqmq_key_mode mode)
{
    switch (mode) {
    case PQMQ_KEY_KEEP: return "keep";
    case PQMQ_KEY_REPLACE: return "replace";
    case PQMQ_KEY_REPLACE_PAYLOAD: return "replace_payload";
    }
    return NULL;
}

/* Reads row i of mq_insert_unique's result into *out. */
static int read_result(pqmq_client *c, PGresult *r, int i, pqmq_insert_result *out)
{
    PGuuid id = NULL;
    PGtext outcome = NULL;
    if (!PQgetf(r, i, "%uuid %text", 0, &id, 1, &outcome) || !id || !outcome)
        return pqmq__err(c, PQMQ_ESERVER, "unexpected result: %s", PQgeterror());
    memcpy(out->id, id, sizeof out->id);
    if (!strcmp(outcome, "inserted"))
        out->outcome = PQMQ_INSERTED;
    else if (!strcmp(outcome, "kept"))
        out->outcome = PQMQ_KEPT;
    else if (!strcmp(outcome, "replaced"))
        out->outcome = PQMQ_REPLACED;
    else
        return pqmq__err(c, PQMQ_ESERVER, "unknown outcome %s", outcome);
    return 0;
}

static int read_results(pqmq_client *c, PGresult *r, size_t n, pqmq_insert_result *results)
{
    if ((size_t)PQntuples(r) != n)
        return pqmq__err(c, PQMQ_ESERVER, "%d results for %zu messages", PQntuples(r), n);
    for (size_t i = 0; i < n; i++) {
        int rc = read_result(c, r, (int)i, &results[i]);
        if (rc)
            return rc;
    }
    return 0;
}

PQMQ_EXPORT int pqmq_insert_unique(pqmq_client *c, pqmq_msg *const *msgs, size_t n,
                                   pqmq_key_mode mode, int64_t retention_ms,
                                   pqmq_insert_result *results)
{
    if (pqmq__enter(c, "pqmq_insert_unique"))
        return PQMQ_EINVAL;
    if (!mode_name(mode))
        return pqmq__err(c, PQMQ_EINVAL, "mode %d is not a pqmq_key_mode", (int)mode);
    if (retention_ms < 0)
        return pqmq__err(c, PQMQ_EINVAL, "retention_ms is negative (%lld)",
                         (long long)retention_ms);
    PGparam *param;
    int keys;
    int rc = pqmq__begin_insert(c, msgs, n, 1, &param, &keys);
    if (!rc && !PQputf(param, "%text", mode_name(mode)))
        rc = pqmq__err(c, PQMQ_ENOMEM, "%s", PQgeterror());
    if (!rc)
        rc = pqmq__put_duration(c, param, retention_ms, NULL);
    int prio = 0;
    if (!rc)
        rc = pqmq__put_priorities_if_any(c, param, msgs, n, &prio);
    PGresult *r = NULL;
    if (!rc)
        r = pqmq__exec(c, param,
                       prio ? "SELECT * FROM mq_insert_unique($1, $2, $3, $4, $5)"
                            : "SELECT * FROM mq_insert_unique($1, $2, $3, $4)",
                       &rc);
    PQparamClear(param);
    if (!rc && results)
        rc = read_results(c, r, n, results);
    PQclear(r);
    return rc;
}
