/*
 * migration_info.c: the embedded schema files, listed for tools that show
 * or print them (pqmq migrate --status / --sql).
 */
#include "pqmq-int.h"

PQMQ_EXPORT int pqmq_migration_info(size_t i, int *version, const char **name, const char **sql)
{
    if (i >= pqmq_migration_count)
        return PQMQ_EINVAL;
    if (version)
        *version = pqmq_schema_release;
    if (name)
        *name = pqmq_migrations[i].name;
    if (sql)
        *sql = pqmq_migrations[i].sql;
    return PQMQ_OK;
}
