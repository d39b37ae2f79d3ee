#!/usr/bin/env bash
# tests/test_pgbouncer.sh [TEST...]: the client and the runner through
# PgBouncer in transaction pooling mode.
#
# Starts a pgbouncer (tests/pgbouncer.sh, "strict": every transaction ends
# with DISCARD ALL, so whatever leans on session state fails every time)
# in front of the server in $PQMQ_TEST_DSN, checks that it pools by
# transaction, then runs the producer, poll API and runner test programs
# through it: PQMQ_TEST_DSN points at pgbouncer, PQMQ_TEST_POOLED=1 gives
# each program a role whose default search_path is its schema (session
# options cannot pass a pooler), and PQMQ_TEST_LISTEN_DSN points straight
# at the server for the runners' LISTEN (pqmq_runner_set_listen_dsn).
# TEST... (default: the list below) are paths relative to the build
# directory make check runs in. Skips (77) only when pgbouncer is missing.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/pgbouncer.sh
. "$here/pgbouncer.sh"

if [[ -z ${PQMQ_TEST_DSN:-} ]]; then
    echo "SKIP: PQMQ_TEST_DSN is not set (tests/run-tests.sh sets it)"
    exit 77
fi
if ! pgb_find; then
    echo "SKIP: pgbouncer not found (Debian package: pgbouncer)"
    exit 77
fi

tests=("$@")
(( ${#tests[@]} )) || tests=(./tests/test_insert ./tests/test_order ./tests/test_poll
                             ./tests/test_twophase ./tests/test_lifecycle
                             ./tests/test_complete_poll ./tests/test_dead
                             ./tests/test_runner
                             ./tests/test_pooling)

trap 'pgb_stop' EXIT
# A timeout's TERM (run-tests.sh) must stop the daemon too: exit through EXIT.
trap 'exit 143' TERM
trap 'exit 130' INT
pgb_start "$PQMQ_TEST_DSN" strict || { echo "FAIL: cannot start pgbouncer"; exit 1; }
echo "pgbouncer: $PGB_DSN (transaction pooling, DISCARD ALL after each transaction)"

# It pools by transaction: a session setting does not outlive its
# transaction, and a LISTEN through it hears nothing.
got=$(psql "$PGB_DSN" -X -At -c "SET work_mem = '77MB'" -c "SHOW work_mem")
if [[ $got != *4MB* && $got == *77MB* ]]; then
    echo "FAIL: a SET survived its transaction: pgbouncer is not in transaction mode"
    exit 1
fi

direct=$PQMQ_TEST_DSN
# The test programs run under $PQMQ_TEST_WRAPPER (valgrind) as in run-tests.sh.
wrapper=()
[[ -n ${PQMQ_TEST_WRAPPER:-} ]] && read -r -a wrapper <<<"$PQMQ_TEST_WRAPPER"
rc=0
logdir=${PQMQ_TEST_LOGDIR:-tests}
[[ -d $logdir ]] || logdir=.
for t in "${tests[@]}"; do
    name=$(basename "$t")
    log=$logdir/pgbouncer-$name.log
    if PQMQ_TEST_DSN=$PGB_DSN PQMQ_TEST_POOLED=1 PQMQ_TEST_LISTEN_DSN=$direct \
        timeout -k 10 280 "${wrapper[@]}" "$t" >"$log" 2>&1; then
        echo "ok - $name through pgbouncer ($(tail -n 1 "$log"))"
    else
        echo "not ok - $name through pgbouncer; last lines of $log:"
        tail -n 30 "$log"
        rc=1
    fi
done
if grep -E "ERROR|FATAL|WARNING" "$PGB_LOG" | grep -v "client close request\|client unexpected eof" |
    head -n 5 | grep -q .; then
    echo "pgbouncer logged (first lines):"
    grep -E "ERROR|FATAL|WARNING" "$PGB_LOG" | head -n 5
fi
exit $rc
