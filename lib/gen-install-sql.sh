#!/bin/sh
# gen-install-sql.sh RELEASE FILE.sql... > pqmq.sql
#
# Writes the schema as one plain SQL script, the files in the order given
# (INSTALL_SQL in Makefile.am, the order pqmq_migrate applies them in), for
# psql and for clients in other languages. It installs or upgrades the queue
# in the first schema of the search_path:
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
-- Function bodies name functions of files further down.
SET LOCAL check_function_bodies = off;
HEAD
for f in "$@"; do
    [ -r "$f" ] || { echo "gen-install-sql.sh: cannot read $f" >&2; exit 1; }
    dir=${f%/*}
    printf '\n-- %s/%s\n' "${dir##*/}" "${f##*/}"
    cat "$f"
done
