#!/usr/bin/env bash
# tests/run-tests.sh TEST...: run pqmq's tests against a real PostgreSQL.
#
# Each TEST is a path to a test program or to a *.sh test script (run with
# bash). make check calls this from the build directory; it can also be run
# by hand from there, e.g.  ../tests/run-tests.sh ./tests/test_poll
#
# The server: $PQMQ_TEST_DSN when it is set and not empty; otherwise a
# throwaway cluster (tests/pgtmp.sh) in ./tmp-pgdata-XXXXXX, stopped and
# removed when this script exits, however it exits. Either way each test sees
# the conninfo string in PQMQ_TEST_DSN.
#
# Environment:
#   PQMQ_TEST_DSN      use this server instead of a throwaway one
#   PQMQ_TEST_WRAPPER  command prefixed to each test program (not to scripts),
#                      e.g. "valgrind --error-exitcode=99 --quiet"
#   PQMQ_TEST_TIMEOUT  seconds a test may run (default 300)
#   PQMQ_TEST_LOGDIR   where NAME.log goes (default ./tests, else .)
#   PQMQ_PG_BINDIR, PGTMP_CONF, PGTMP_KEEP: see tests/pgtmp.sh
#
# Output: one "PASS: name", "FAIL: name" or "SKIP: name" (exit status 77) per
# test, the tail of the log of each failure, and as the very last line
# "N passed, M failed" (", K skipped" appended when K > 0). Exits 1 when a
# test failed or the server could not be had, else 0.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/pgtmp.sh
. "$here/pgtmp.sh"

if (( $# == 0 )); then
    echo "usage: $0 TEST..." >&2
    exit 2
fi

timeout_s=${PQMQ_TEST_TIMEOUT:-300}
logdir=${PQMQ_TEST_LOGDIR:-}
if [[ -z $logdir ]]; then
    if [[ -d tests ]]; then logdir=tests; else logdir=.; fi
fi
mkdir -p "$logdir"

wrapper=()
if [[ -n ${PQMQ_TEST_WRAPPER:-} ]]; then
    read -r -a wrapper <<<"$PQMQ_TEST_WRAPPER"
fi

# Stop the cluster on any exit; an interrupt exits through here too.
test_pid=
on_exit() {
    local rc=$?
    trap - EXIT INT TERM HUP
    if [[ -n $test_pid ]]; then
        kill -TERM "$test_pid" 2>/dev/null && wait "$test_pid" 2>/dev/null
        echo "interrupted"
    fi
    pgtmp_finish "$logdir"
    exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

if [[ -n ${PQMQ_TEST_DSN:-} ]]; then
    echo "using PQMQ_TEST_DSN=$PQMQ_TEST_DSN"
else
    if ! pgtmp_start "$PWD"; then
        echo "run-tests.sh: cannot start a throwaway PostgreSQL (see above); set PQMQ_TEST_DSN to use an existing server" >&2
        echo "0 passed, $# failed"
        exit 1
    fi
    echo "started a throwaway PostgreSQL: $PGTMP_DSN"
    PQMQ_TEST_DSN=$PGTMP_DSN
fi
export PQMQ_TEST_DSN

passed=0 failed=0 skipped=0
for t in "$@"; do
    name=$(basename "$t")
    name=${name%.sh}
    log=$logdir/$name.log
    if [[ ! -e $t ]]; then
        echo "FAIL: $name (no such file: $t)"
        failed=$((failed + 1))
        continue
    fi
    if [[ $t == *.sh ]]; then
        cmd=(bash "$t")
    else
        cmd=("${wrapper[@]}" "$t")
    fi
    # In the background, so that a signal to this script runs its trap now,
    # not when the test ends; the trap then stops the test.
    timeout -k 10 "$timeout_s" "${cmd[@]}" </dev/null >"$log" 2>&1 &
    test_pid=$!
    wait "$test_pid"
    rc=$?
    test_pid=
    case $rc in
        0)
            echo "PASS: $name"
            passed=$((passed + 1))
            ;;
        77)
            echo "SKIP: $name"
            skipped=$((skipped + 1))
            ;;
        *)
            why="exit status $rc"
            (( rc == 124 || rc == 137 )) && why="timed out after ${timeout_s}s"
            (( rc > 128 && rc != 137 )) && why="killed by signal $((rc - 128))"
            echo "FAIL: $name ($why)"
            echo "---- last lines of $log ----"
            tail -n 40 "$log"
            echo "----"
            failed=$((failed + 1))
            ;;
    esac
done

summary="$passed passed, $failed failed"
(( skipped > 0 )) && summary+=", $skipped skipped"
echo "$summary"
(( failed == 0 ))
