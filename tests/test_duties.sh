#!/usr/bin/env bash
# tests/test_duties.sh [PQMQ]: each duty runs what the documents say it may,
# as a login role that holds that duty and nothing else, against the server
# in $PQMQ_TEST_DSN, in a schema of its own that it drops at the end.
#
#   - administer: every subcommand that reads or repairs the queue (status,
#     metrics, watch, peek, show, dead, retry, skip, purge, pause, resume, serve
#     with /metrics);
#   - produce: pqmq send and examples/producer (which calls pqmq_migrate: on
#     a queue that is current it does nothing, and needs no table rights);
#   - consume: examples/consumer;
#   - each is refused what another duty does, with "permission denied".
#
# Skips (77) without PQMQ_TEST_DSN or with a URI one (roles are given as
# "user=" after the keyword conninfo). Exits 0 on success, 1 listing every
# failed check.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${PQMQ_TEST_BUILDDIR:-.}
pqmq_bin=${1:-$build/cli/pqmq}
# shellcheck source=tests/lib.sh
. "$here/lib.sh"

t_need_dsn
t_need_program "$pqmq_bin" "pqmq command" "make cli/pqmq"
t_need_program "$build/examples/producer" "example producer" "make check builds it"
t_need_program "$build/examples/consumer" "example consumer" "make check builds it"
t_need_tools psql curl
if [[ $PQMQ_TEST_DSN == *://* ]]; then
    echo "SKIP: PQMQ_TEST_DSN is a URI; roles are given as user= after a keyword conninfo"
    exit 77
fi

schema=duties_$$
admin=duties_admin_$$
producer=duties_producer_$$
consumer=duties_consumer_$$
work=$(mktemp -d)
failed=0
server=

cleanup() {
    [[ -n $server ]] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
    psql -X -q -d "$PQMQ_TEST_DSN" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1
    local r
    for r in "$admin" "$producer" "$consumer"; do
        psql -X -q -d "$PQMQ_TEST_DSN" -c "DROP OWNED BY $r; DROP ROLE IF EXISTS $r" \
            >/dev/null 2>&1
    done
    rm -rf "$work"
}
trap cleanup EXIT

# as ROLE EXPECTED_STATUS ARGS...: pqmq as ROLE on the test schema; stdout
# in $work/out, stderr in $work/err.
as() {
    local role=$1 want=$2 rc
    shift 2
    "$pqmq_bin" -d "$PQMQ_TEST_DSN user=$role" --schema "$schema" "$@" \
        >"$work/out" 2>"$work/err" </dev/null
    rc=$?
    [[ $rc == "$want" ]] ||
        fail "pqmq $* as $role exited $rc, expected $want: $(head -c 300 "$work/err")"
    return 0
}

psql -X -q -v ON_ERROR_STOP=1 -d "$PQMQ_TEST_DSN" -c "CREATE SCHEMA $schema" \
    -c "CREATE ROLE $admin LOGIN" -c "CREATE ROLE $producer LOGIN" \
    -c "CREATE ROLE $consumer LOGIN" >/dev/null ||
    { echo "FAIL: cannot create the schema and roles"; exit 1; }
"$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$schema" migrate >/dev/null ||
    { echo "FAIL: pqmq migrate as the owner"; exit 1; }
sql "SELECT mq_grant('administer', '$admin'), mq_grant('produce', '$producer'),
            mq_grant('consume', '$consumer')" >/dev/null ||
    { echo "FAIL: mq_grant"; exit 1; }
# The examples take a conninfo only: the schema comes from the role, as
# docs/pgbouncer.md advises.
for r in "$producer" "$consumer"; do
    sql "ALTER ROLE $r SET search_path = $schema" >/dev/null
done

# --- produce ---------------------------------------------------------------------
echo "== produce"
as "$producer" 0 send --args a work job '{"n": 1}'
as "$producer" 0 send --args b --ordered work job '{"n": 2}'
[[ $(sql "SELECT count(*) FROM mq_msgs WHERE channel_name = 'work'") == 2 ]] ||
    fail "send as the producer did not insert"
"$build/examples/producer" "$PQMQ_TEST_DSN user=$producer" 3 >"$work/out" 2>"$work/err" ||
    fail "examples/producer as a produce role: $(head -c 300 "$work/err")"
has out "inserted 3 messages"
[[ $(sql "SELECT count(*) FROM mq_msgs WHERE channel_name = 'orders'") == 3 ]] ||
    fail "examples/producer did not insert its 3 messages"
as "$producer" 1 status
has err "permission denied"

# --- consume ---------------------------------------------------------------------
echo "== consume"
# A message due in 10 minutes: "exit when idle" does not wait for it.
as "$producer" 0 send --delay 600000 orders later
start=$SECONDS
timeout 60 "$build/examples/consumer" "$PQMQ_TEST_DSN user=$consumer" >"$work/out" \
    2>"$work/err" || fail "examples/consumer as a consume role: $(head -c 300 "$work/err")"
((SECONDS - start < 30)) || fail "examples/consumer waited $((SECONDS - start)) s when idle"
[[ $(sql "SELECT count(*) FROM mq_msgs WHERE channel_name = 'orders'") == 1 ]] ||
    fail "examples/consumer did not do the 3 ready orders, or did the delayed one"
as "$consumer" 1 send work job '{}'
has err "permission denied"

# --- administer ------------------------------------------------------------------
echo "== administer"
as "$admin" 0 status
has out "work"
as "$admin" 0 status --json
as "$admin" 0 metrics
has out "mq_messages"
as "$admin" 0 watch --count 1
as "$admin" 0 peek work
as "$admin" 0 dead
# A dead letter to retry and a chain head to skip: delivered once, with
# 1 ms leases and no retries.
as "$producer" 0 send --retries 0 --backoff 1 dch boom '{"n": 1}'
dead1=$(cat "$work/out")
as "$producer" 0 send --retries 0 --backoff 1 --ordered --args k sk head
head_id=$(cat "$work/out")
sql "SELECT count(*) FROM mq_poll_jobs('{dch,sk}', 10)" >/dev/null
sleep 0.2
as "$admin" 0 dead
has out "$dead1" "$head_id"
as "$admin" 0 show "$dead1"
has out "state    dead" "lease ran out" '{"n": 1}'
as "$consumer" 1 show "$dead1"
has err "permission denied"
as "$admin" 0 retry "$dead1"
as "$admin" 0 skip "$head_id"
as "$admin" 0 purge --channel work --yes
[[ $(sql "SELECT count(*) FROM mq_msgs WHERE channel_name = 'work'") == 0 ]] ||
    fail "purge as the admin left messages"
as "$admin" 1 send work job '{}'
has err "permission denied"
as "$admin" 0 pause --reason "a test" work
has out "paused work"
as "$admin" 0 resume work
has out "resumed work"
as "$consumer" 1 pause work
has err "permission denied"

if "$pqmq_bin" serve --help >/dev/null 2>&1; then
    "$pqmq_bin" -d "$PQMQ_TEST_DSN user=$admin" --schema "$schema" serve --listen 127.0.0.1:0 \
        --interval 1 >"$work/serve.out" 2>"$work/serve.err" &
    server=$!
    port=
    for _ in $(seq 100); do
        port=$(sed -n 's|^pqmq serve: listening on http://127.0.0.1:\([0-9]*\)/.*|\1|p' \
            "$work/serve.out")
        [[ -n $port ]] && break
        kill -0 "$server" 2>/dev/null || break
        sleep 0.1
    done
    if [[ -z $port ]]; then
        fail "serve as the admin did not start: $(head -c 300 "$work/serve.err")"
    else
        curl -sS --max-time 10 "http://127.0.0.1:$port/metrics" >"$work/metrics" 2>&1 ||
            fail "serve as the admin: GET /metrics failed"
        has metrics "mq_removed_total"
        curl -sS --max-time 10 "http://127.0.0.1:$port/api/message?id=$dead1" >"$work/story" \
            2>&1 || fail "serve as the admin: GET /api/message failed"
        has story "\"id\": \"$dead1\""
    fi
    kill "$server" 2>/dev/null
    wait "$server" 2>/dev/null
    server=
else
    echo "skipped: serve (built without libmicrohttpd)"
fi

if ((failed)); then
    echo "$failed check(s) failed"
    exit 1
fi
echo "ok - each duty runs its subcommands and examples"
