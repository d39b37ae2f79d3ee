#!/usr/bin/env bash
# bench/pgbouncer.sh [ROUNDS [PQMQ-BENCH ARGS...]]: pqmq-bench straight to
# a throwaway PostgreSQL and through PgBouncer in transaction pooling mode
# in front of it, in one run, alternating ROUNDS times (default 3), and the
# ratios (through / direct). Run from the build directory (it uses
# ./bench/pqmq-bench, tests/pgtmp.sh and tests/pgbouncer.sh).
#
# PgBouncer here is plain transaction mode (no DISCARD ALL per transaction,
# pools of 4 server connections per user and database). The bench connects
# as role pqmq_bench, whose default search_path is the bench's schema: a
# pooled session cannot take the schema from startup options. Runners
# LISTEN straight to the server (--listen-dsn).

set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=tests/pgtmp.sh
. "$here/tests/pgtmp.sh"
# shellcheck source=tests/pgbouncer.sh
. "$here/tests/pgbouncer.sh"

rounds=${1:-3}
shift || true
bench=./bench/pqmq-bench
[[ -x $bench ]] || { echo "no $bench (run from the build directory after make)" >&2; exit 1; }

trap 'pgb_stop; pgtmp_stop' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
pgtmp_start "$PWD" >/dev/null || exit 1
pgb_start "$PGTMP_DSN" || exit 1
psql "$PGTMP_DSN" -X -Atq -v ON_ERROR_STOP=1 \
    -c "CREATE ROLE pqmq_bench LOGIN SUPERUSER" \
    -c "ALTER ROLE pqmq_bench SET search_path = pqmq_bench" \
    -c "ALTER ROLE pqmq_bench SET client_min_messages = warning" || exit 1

# field NAME FILE: the first number after "NAME": in a --json report.
field() {
    grep -o "\"$1\": [0-9.]*" "$2" | head -n 1 | sed 's/.*: //'
}

out=$(mktemp -d)
keys=(enqueue_per_s process_runner_per_s process_poll_per_s)
printf '%-6s %-8s %12s %12s %12s %10s %10s\n' round route enqueue runner poll "p50 ms" "p99 ms"
for (( i = 1; i <= rounds; i++ )); do
    for route in direct pgbouncer; do
        f=$out/$route-$i.json
        if [[ $route == direct ]]; then
            "$bench" --dsn "$PGTMP_DSN user=pqmq_bench" --json "$@" >"$f" || exit 1
        else
            "$bench" --dsn "$PGB_DSN user=pqmq_bench" --listen-dsn "$PGTMP_DSN" \
                --json "$@" >"$f" || exit 1
        fi
        lat=$(grep -o '"idle": {"p50": [0-9.]*, "p99": [0-9.]*' "$f" |
              sed 's/.*"p50": \([0-9.]*\), "p99": \([0-9.]*\)/\1 \2/')
        printf '%-6s %-8s %12s %12s %12s %10s %10s\n' "$i" "$route" \
            "$(field enqueue_per_s "$f")" "$(field process_runner_per_s "$f")" \
            "$(field process_poll_per_s "$f")" ${lat:-- -}
    done
    for k in "${keys[@]}"; do
        d=$(field "$k" "$out/direct-$i.json") p=$(field "$k" "$out/pgbouncer-$i.json")
        printf '       ratio %s: %s\n' "$k" "$(awk -v a="$p" -v b="$d" 'BEGIN { printf "%.2f", a / b }')"
    done
done
rm -rf "$out"
