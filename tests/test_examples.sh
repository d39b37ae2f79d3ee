#!/usr/bin/env bash
# tests/test_examples.sh [BUILDDIR]: the examples take their configuration
# from the environment as pqmq(1) does: the server from the command line,
# else PQMQ_DSN, else DATABASE_URL (libpq's PG* variables last), the
# queue's schema from PQMQ_SCHEMA. Runs examples/producer, consumer and
# exactly_once against the server in $PQMQ_TEST_DSN (skips, exit 77,
# without one) with libpq's PG* variables pointing nowhere, in a schema of
# its own (a name that needs quoting) that it drops at the end.
#
# BUILDDIR defaults to $PQMQ_TEST_BUILDDIR, else ".". Exits 0 on success, 1
# listing every failed check.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:-${PQMQ_TEST_BUILDDIR:-.}}
# shellcheck source=tests/lib.sh
. "$here/lib.sh"

t_need_dsn
for p in producer consumer exactly_once; do
    t_need_program "$build/examples/$p" "example $p" "make check builds it"
done
t_need_tools psql
if [[ ${PQMQ_TEST_POOLED:-} == 1 ]]; then
    # PQMQ_SCHEMA travels in the startup packet's options, which a pooler
    # in transaction mode refuses (docs/pgbouncer.md: the role's search_path).
    echo "SKIP: behind a pooler"
    exit 77
fi

schema="Ex q$$"
qschema="\"Ex q$$\""
work=$(mktemp -d)
failed=0
runner_pid=

cleanup() {
    [[ -n $runner_pid ]] && kill "$runner_pid" 2>/dev/null
    psql -X -q -d "$PQMQ_TEST_DSN" -c "SET client_min_messages = warning" \
        -c "DROP SCHEMA IF EXISTS $qschema CASCADE" >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT

psql -X -q -d "$PQMQ_TEST_DSN" -c "CREATE SCHEMA $qschema" >/dev/null ||
    { echo "FAIL: cannot create the test schema"; exit 1; }

nowhere="host=/nonexistent port=1"
count() {
    psql -X -q -At -d "$PQMQ_TEST_DSN" -c "SELECT count(*) FROM $qschema.mq_msgs"
}

# ex VARS... -- PROGRAM ARGS...: runs an example with only these of pqmq's
# variables set and libpq's defaults pointing nowhere; output in $work/out
# and $work/err. Returns its exit status.
ex() {
    local -a vars=()
    while [[ $1 != -- ]]; do
        vars+=("$1")
        shift
    done
    shift
    local prog=$1
    shift
    env -u PQMQ_DSN -u DATABASE_URL -u PQMQ_SCHEMA -u PGSERVICE -u PGOPTIONS \
        PGHOST=/nonexistent PGPORT=1 "${vars[@]}" "$build/examples/$prog" "$@" \
        >"$work/out" 2>"$work/err" </dev/null
}

# PQMQ_DSN and PQMQ_SCHEMA: the queue is installed and filled in that schema.
ex PQMQ_DSN="$PQMQ_TEST_DSN" PQMQ_SCHEMA="$schema" -- producer ||
    fail "producer with PQMQ_DSN: $(head -c 300 "$work/err")"
grep -q "inserted 10 messages" "$work/out" || fail "producer: $(cat "$work/out" "$work/err")"
[[ $(count) == 10 ]] || fail "producer with PQMQ_SCHEMA: not 10 messages in schema $schema"
# DATABASE_URL when PQMQ_DSN is unset or empty.
ex PQMQ_DSN= DATABASE_URL="$PQMQ_TEST_DSN" PQMQ_SCHEMA="$schema" -- producer "" 2 ||
    fail "producer with DATABASE_URL: $(head -c 300 "$work/err")"
[[ $(count) == 12 ]] || fail "producer with DATABASE_URL: not 12 messages"
# PQMQ_DSN wins over DATABASE_URL, the command line over both.
ex PQMQ_DSN="$PQMQ_TEST_DSN" DATABASE_URL="$nowhere" PQMQ_SCHEMA="$schema" -- producer "" 1 ||
    fail "PQMQ_DSN does not win over DATABASE_URL: $(head -c 300 "$work/err")"
ex PQMQ_DSN="$nowhere" DATABASE_URL="$nowhere" PQMQ_SCHEMA="$schema" -- \
    producer "$PQMQ_TEST_DSN" 1 ||
    fail "the command line does not win over PQMQ_DSN: $(head -c 300 "$work/err")"
[[ $(count) == 14 ]] || fail "not 14 messages after the precedence checks"
# Nothing set: libpq's defaults, which point nowhere here.
ex -- producer "" 1 && fail "producer without any server setting connected"
grep -q "connect:" "$work/err" || fail "producer without a server: $(cat "$work/err")"

# The consumer finds them through the same variables.
ex DATABASE_URL="$PQMQ_TEST_DSN" PQMQ_SCHEMA="$schema" -- consumer ||
    fail "consumer with DATABASE_URL: $(head -c 300 "$work/err")"
[[ $(grep -c "^orders/" "$work/out") == 14 ]] || fail "consumer did not do the 14 messages"
[[ $(count) == 0 ]] || fail "consumer left messages"

# The runner's own connections (exactly_once) use the schema too.
ex PQMQ_DSN="$PQMQ_TEST_DSN" PQMQ_SCHEMA="$schema" -- producer "" 3 ||
    fail "producer: $(head -c 300 "$work/err")"
env -u DATABASE_URL -u PQMQ_SCHEMA -u PGSERVICE -u PGOPTIONS PGHOST=/nonexistent PGPORT=1 \
    PQMQ_DSN="$PQMQ_TEST_DSN" PQMQ_SCHEMA="$schema" "$build/examples/exactly_once" \
    >"$work/eo.out" 2>"$work/eo.err" </dev/null &
runner_pid=$!
for _ in $(seq 200); do
    [[ $(psql -X -q -At -d "$PQMQ_TEST_DSN" \
        -c "SELECT count(*) FROM $qschema.example_ledger" 2>/dev/null) == 3 ]] && break
    sleep 0.05
done
kill -TERM "$runner_pid"
wait "$runner_pid" || fail "exactly_once exited non-zero: $(head -c 300 "$work/eo.err")"
runner_pid=
[[ $(psql -X -q -At -d "$PQMQ_TEST_DSN" -c "SELECT count(*) FROM $qschema.example_ledger") == 3 ]] ||
    fail "exactly_once with PQMQ_SCHEMA: not 3 ledger rows: $(head -c 300 "$work/eo.err")"
[[ $(count) == 0 ]] || fail "exactly_once left messages"

if ((failed > 0)); then
    echo "$failed check(s) failed"
    exit 1
fi
echo "ok: the examples read PQMQ_DSN, DATABASE_URL and PQMQ_SCHEMA"
exit 0
