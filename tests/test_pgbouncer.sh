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
# directory make check runs in. Then, through a plain pgbouncer (no reset
# after a transaction), the pqmq command's subcommands and serve with
# --schema, each followed by another client that must see its own
# search_path. Skips (77) only when pgbouncer is missing.

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

# The pqmq command with --schema leaves nothing in a pooled session: through
# a plain pgbouncer in transaction mode (no DISCARD ALL after a transaction,
# so a leaked setting stays for the next client of that server connection),
# each subcommand works on its schema, and another client of the pool then
# sees its own search_path, not the queue's.
pqmq_bin=${PQMQ_TEST_BUILDDIR:-.}/cli/pqmq
if [[ -x $pqmq_bin && ${PQMQ_TEST_CITUS:-} != 1 ]]; then
    pgb_stop
    pgb_start "$direct" || { echo "FAIL: cannot start a plain pgbouncer"; exit 1; }
    cli=pgb_cli_$$
    psql "$direct" -X -q -c "SET client_min_messages = warning" \
        -c "DROP SCHEMA IF EXISTS $cli CASCADE; CREATE SCHEMA $cli" >/dev/null
    base=$(psql "$PGB_DSN" -X -At -c "SHOW search_path")
    leaked=0
    cli_run() {
        local out
        if ! out=$("$pqmq_bin" -d "$PGB_DSN" --schema "$cli" "$@" 2>&1 </dev/null); then
            echo "not ok - pqmq --schema $cli $* through pgbouncer: $out"
            rc=1
        fi
        for _ in 1 2 3; do
            out=$(psql "$PGB_DSN" -X -At -c "SHOW search_path")
            if [[ $out != "$base" ]]; then
                echo "not ok - after pqmq $*, another client's search_path is $out (not $base)"
                leaked=1
                rc=1
                break
            fi
        done
    }
    cli_run migrate
    cli_run migrate --status
    cli_run send work job '{"n": 1}'
    cli_run status work
    cli_run peek work
    cli_run dead
    cli_run metrics
    cli_run purge --channel work --yes
    [[ $(psql "$direct" -X -At -c "SELECT count(*) FROM $cli.mq_msgs") == 0 ]] ||
        { echo "not ok - purge through pgbouncer left messages in $cli"; rc=1; }
    if "$pqmq_bin" serve --help >/dev/null 2>&1; then
        out_file=$(mktemp)
        "$pqmq_bin" -d "$PGB_DSN" --schema "$cli" serve --listen 127.0.0.1:0 --interval 1 \
            >"$out_file" 2>&1 &
        server=$!
        port=
        for _ in $(seq 100); do
            port=$(sed -n 's|^pqmq serve: listening on http://127.0.0.1:\([0-9]*\)/.*|\1|p' \
                "$out_file")
            [[ -n $port ]] && break
            sleep 0.1
        done
        if [[ -z $port ]]; then
            echo "not ok - pqmq serve --schema through pgbouncer: $(head -c 300 "$out_file")"
            rc=1
        else
            sleep 1.5 # a sample or two after the first
            curl -sS --max-time 10 "http://127.0.0.1:$port/metrics" | grep -q mq_removed_total ||
                { echo "not ok - serve through pgbouncer: no /metrics"; rc=1; }
            got=$(psql "$PGB_DSN" -X -At -c "SHOW search_path")
            [[ $got == "$base" ]] ||
                { echo "not ok - while serve runs, another client's search_path is $got"; rc=1; }
        fi
        kill "$server" 2>/dev/null
        wait "$server" 2>/dev/null
        rm -f "$out_file"
    fi
    psql "$direct" -X -q -c "SET client_min_messages = warning" -c "DROP SCHEMA $cli CASCADE" \
        >/dev/null
    ((leaked)) || echo "ok - pqmq --schema leaves no setting in a pooled session"
fi
exit $rc
