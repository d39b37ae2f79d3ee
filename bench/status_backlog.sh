#!/usr/bin/env bash
# bench/status_backlog.sh [--dsn CONNINFO] [--messages N] [--runs R] [--keep]
#
# How long `pqmq status` and `pqmq metrics` take over a big backlog. Loads N
# messages (default 1,000,000) into the schema pqmq_status_bench (dropped
# and recreated) on 100 channels: half unordered, half on 1,000 ordered
# chains (so most of those wait behind their chain head); then delivers 1,000
# (in flight), and times each command R times (default 5), and for contrast
# the full-scan mq_stats(). Run from the source tree after a build in
# build/; without --dsn it starts a throwaway PostgreSQL (tests/pgtmp.sh).
# --keep leaves the schema in place (with --dsn) for EXPLAIN ANALYZE.

set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pqmq=$top/build/cli/pqmq
dsn= messages=1000000 runs=5 keep=0
while (($#)); do
    case $1 in
        --dsn) dsn=$2; shift 2 ;;
        --messages) messages=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        *) echo "usage: $0 [--dsn CONNINFO] [--messages N] [--runs R] [--keep]" >&2; exit 2 ;;
    esac
done
[[ -x $pqmq ]] || { echo "build first: no $pqmq" >&2; exit 1; }

if [[ -z $dsn ]]; then
    # shellcheck source=tests/pgtmp.sh
    . "$top/tests/pgtmp.sh"
    trap pgtmp_stop EXIT
    pgtmp_start "$top/build" >/dev/null
    dsn=$PGTMP_DSN
fi
schema=pqmq_status_bench
q() { PGOPTIONS="-c search_path=$schema" psql -X -q -At -v ON_ERROR_STOP=1 -d "$dsn" "$@"; }

psql -X -q -d "$dsn" -c "DROP SCHEMA IF EXISTS $schema CASCADE" -c "CREATE SCHEMA $schema" \
    2>/dev/null
"$pqmq" -d "$dsn" --schema "$schema" migrate >/dev/null
echo "loading $messages messages..."
q -c "DO \$\$
DECLARE n int := $messages; per int := 10000; i int := 0;
BEGIN
  WHILE i < n LOOP
    PERFORM mq_insert(array(
      SELECT ROW(gen_random_uuid(), NULL, 4, interval '1 hour', 'ch' || (g % 100),
                 CASE WHEN g % 2 = 0 THEN (g % 1000)::text ELSE '' END, NULL,
                 g % 2 = 0, 'job', '{\"n\": 1}', NULL)::mq_new_t
      FROM generate_series(i, i + LEAST(per, n - i) - 1) g));
    i := i + per;
  END LOOP;
END \$\$"
q -c "SELECT count(*) FROM mq_poll_jobs(NULL, 1000)" >/dev/null
q -c "VACUUM ANALYZE mq_rows, mq_chains, mq_log, mq_cursors, mq_receipts, mq_done, mq_log_gone"

ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
time_it() {
    local what=$1 t all=()
    shift
    for _ in $(seq "$runs"); do
        t=$(date +%s%N)
        "$@" >/dev/null
        all+=("$(ms "$t")")
    done
    printf '%-40s %s ms\n' "$what" "${all[*]}"
}
echo "$(q -c "SELECT count(*) FROM mq_msgs") messages; $runs runs each (wall clock, incl. connecting):"
time_it "pqmq status" "$pqmq" -d "$dsn" --schema "$schema" status
time_it "pqmq metrics" "$pqmq" -d "$dsn" --schema "$schema" metrics
time_it "pqmq status ch7" "$pqmq" -d "$dsn" --schema "$schema" status ch7
srv=()
for _ in $(seq "$runs"); do
    srv+=("$(q -c "EXPLAIN (ANALYZE, TIMING OFF) SELECT * FROM mq_metrics()" |
             sed -n 's/^Execution Time: \([0-9.]*\) ms$/\1/p')")
done
printf '%-40s %s ms\n' "mq_metrics() on the server" "${srv[*]}"
time_it "pqmq --help (process start only)" "$pqmq" --help
time_it "full scan, SELECT * FROM mq_stats()" q -c "SELECT * FROM mq_stats()"
"$pqmq" -d "$dsn" --schema "$schema" status | tail -n 1
((keep)) || psql -X -q -d "$dsn" -c "DROP SCHEMA $schema CASCADE" 2>/dev/null
