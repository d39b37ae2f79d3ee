/*
 * examples/example_env.h: how every example chooses its server and the
 * queue's schema, as the pqmq command does (docs/operating.md, "Choosing
 * the server and the schema"). Included by each example; define
 * _POSIX_C_SOURCE before any header, for setenv.
 */
#ifndef PQMQ_EXAMPLE_ENV_H
#define PQMQ_EXAMPLE_ENV_H

#include <stdio.h>
#include <stdlib.h>

/* The server, as pqmq(1) chooses it: the command line's CONNINFO, else
 * $PQMQ_DSN, else $DATABASE_URL, else "" (libpq's PG* variables and
 * service file); an empty value counts as unset. */
static const char *conninfo_from(const char *arg)
{
    const char *v = arg && *arg ? arg : getenv("PQMQ_DSN");
    if (!v || !*v)
        v = getenv("DATABASE_URL");
    return v && *v ? v : "";
}

/* $PQMQ_SCHEMA, when set, is the queue's schema: it goes first on the
 * search_path of every connection this process opens, through libpq's
 * PGOPTIONS (it works with URIs and keyword strings alike, and reaches
 * the runner's connections too). Behind a pooler in transaction mode, set
 * the role's search_path instead (docs/pgbouncer.md). 0, or -1 if the
 * name does not fit. */
static int schema_from_env(void)
{
    const char *schema = getenv("PQMQ_SCHEMA"), *old = getenv("PGOPTIONS");
    if (!schema || !*schema)
        return 0;
    char opts[1024];
    size_t n = (size_t)snprintf(opts, sizeof opts, "%s%s-c search_path=\"", old ? old : "",
                                old && *old ? " " : "");
    for (const char *p = schema; *p && n + 4 < sizeof opts; p++) {
        if (*p == ' ' || *p == '\\')
            opts[n++] = '\\'; /* the server splits options at spaces */
        else if (*p == '"')
            opts[n++] = '"'; /* a quoted identifier doubles its quotes */
        opts[n++] = *p;
    }
    if (n + 2 > sizeof opts)
        return -1;
    opts[n++] = '"';
    opts[n] = '\0';
    return setenv("PGOPTIONS", opts, 1);
}

#endif
