#!/bin/sh
# gen-install-sql.sh RELEASE FILE.sql... > pqmq.sql
#
# Writes the schema as one plain SQL script, the files in the order given
# (INSTALL_SQL in Makefile.am, the order pqmq_migrate applies them in), for
# psql and for clients in other languages. It installs or upgrades the queue
# in the first schema of the search_path, then narrows the path to that
# schema alone for the rest of the transaction: pg_catalog, searched first,
# names every built-in that a default, a function or a standard SQL body
# binds to, whatever the installer's path puts ahead of it.
#
#   PGOPTIONS='-c search_path=myqueue' psql -1 -v ON_ERROR_STOP=1 -f pqmq.sql

set -e
[ $# -gt 1 ] || { echo "usage: gen-install-sql.sh RELEASE FILE.sql... > pqmq.sql" >&2; exit 1; }
release=$1
shift

cat <<HEAD
-- pqmq $release: the queue's schema in one script, generated from migrations/
-- and schema/. Installs, or upgrades, the queue in the first schema of the
-- search_path; apply it in one transaction:
--   PGOPTIONS='-c search_path=myqueue' psql -1 -v ON_ERROR_STOP=1 -f pqmq.sql
SELECT pg_catalog.pg_advisory_xact_lock(1886482797);
-- The path every object below binds to: the queue's schema alone, so that
-- pg_catalog comes first (functions pin this path; column defaults and
-- standard SQL bodies keep what it resolved). A schema other roles can
-- create in (public, say) never gets to supply now() or an operator.
SELECT pg_catalog.set_config('search_path',
                             pg_catalog.quote_ident(pg_catalog.current_schema()), true);
DO \$\$
BEGIN
    IF pg_catalog.current_setting('search_path') OPERATOR(pg_catalog.<>)
       pg_catalog.quote_ident(pg_catalog.current_schema()) THEN
        RAISE EXCEPTION 'pqmq: pqmq.sql must run in one transaction (psql -1)'
            USING ERRCODE = 'no_active_sql_transaction',
                  HINT = 'Outside one, the search_path it sets ends with its first statement.';
    END IF;
END
\$\$;
-- Function bodies name functions of files further down.
SET LOCAL check_function_bodies = off;
HEAD
for f in "$@"; do
    [ -r "$f" ] || { echo "gen-install-sql.sh: cannot read $f" >&2; exit 1; }
    dir=${f%/*}
    printf '\n-- %s/%s\n' "${dir##*/}" "${f##*/}"
    cat "$f"
done
