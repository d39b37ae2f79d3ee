#!/usr/bin/env bash
# tests/test_cli.sh [PQMQ]: the pqmq command, every subcommand, against the
# server in $PQMQ_TEST_DSN (skips, exit 77, without one), in schemas of its
# own that it drops at the end. Checks outputs, the state the server is left
# in (through psql), the one-line error messages and the exit statuses
# (0 success, 1 error, 2 usage).
#
# PQMQ defaults to ./cli/pqmq, as seen from the build directory make check
# runs in. Exits 0 on success, 1 listing every failed check.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
pqmq_bin=${1:-${PQMQ_TEST_BUILDDIR:-.}/cli/pqmq}
# shellcheck source=tests/lib.sh
. "$here/lib.sh"

t_need_dsn
t_need_program "$pqmq_bin" "pqmq command" "make cli/pqmq"
t_need_tools psql
# The checks below choose the connection and schema with options; the
# environment section sets these itself.
unset PQMQ_DSN DATABASE_URL PQMQ_SCHEMA

schema=cli_$$
old=cli_old_$$
bare=cli_bare_$$
broken=cli_broken_$$
work=$(mktemp -d)
failed=0

cleanup() {
    psql -X -q -d "$PQMQ_TEST_DSN" \
        -c "DROP SCHEMA IF EXISTS $schema, $old, $bare, $broken CASCADE" >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT

# run EXPECTED_STATUS ARGS...: runs pqmq on the test schema; stdout in
# $work/out, stderr in $work/err; checks the exit status.
run() {
    local want=$1 rc
    shift
    "$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$schema" "$@" >"$work/out" 2>"$work/err" \
        </dev/null
    rc=$?
    if [[ $rc != "$want" ]]; then
        fail "pqmq $* exited $rc, expected $want; stderr: $(head -c 300 "$work/err")"
    fi
    return 0
}

# one_line: the error is exactly one line.
one_line() {
    local n
    n=$(wc -l <"$work/err")
    [[ $n == 1 ]] || fail "expected one line on stderr, got $n: $(cat "$work/err")"
}

psql -X -q -d "$PQMQ_TEST_DSN" -c "CREATE SCHEMA $schema; CREATE SCHEMA $old; CREATE SCHEMA $bare" \
    >/dev/null || { echo "FAIL: cannot create the test schemas"; exit 1; }

# --- usage and help ----------------------------------------------------------
"$pqmq_bin" >/dev/null 2>&1; [[ $? == 2 ]] || fail "pqmq without a command: not exit 2"
"$pqmq_bin" --help >"$work/out" || fail "pqmq --help failed"
has out "usage: pqmq" "migrate" "metrics"
"$pqmq_bin" --version >"$work/out" || fail "pqmq --version failed"
has out "schema version 100"
run 2 nosuchcommand
has err "unknown command"
for c in migrate status peek show dead retry skip purge send watch metrics pause resume; do
    run 0 "$c" --help
    has out "usage: pqmq $c" "--dsn" "--schema" "PQMQ_DSN" "PQMQ_SCHEMA"
    run 2 "$c" --no-such-option
done

# --- connection and schema errors ---------------------------------------------
"$pqmq_bin" -d "host=/nonexistent port=1" status >"$work/out" 2>"$work/err"
[[ $? == 1 ]] || fail "status against no server: not exit 1"
has err "pqmq status: cannot connect to the server"
one_line
"$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "no_such_schema_$$" status >/dev/null 2>"$work/err"
[[ $? == 1 ]] || fail "status in a missing schema: not exit 1"
has err "schema \"no_such_schema_$$\" does not exist"
run 1 status
has err "no pqmq queue in schema \"$schema\": run 'pqmq migrate' to install one"
one_line

# --- migrate ------------------------------------------------------------------
run 0 migrate --status
has out "no queue: pending install of version 100"
run 0 migrate --sql
has out "-- migrations/0.1.0_to_1.0.0" "-- schema/tables" "-- schema/roles" \
    "CREATE TABLE IF NOT EXISTS mq_rows"
# The printed SQL, applied by psql in another schema, makes a whole queue
# (not on a Citus coordinator, which psql cannot install to: docs/citus.md).
if [[ ${PQMQ_TEST_CITUS:-} == 1 ]]; then
    echo "skipped on Citus: migrate --sql applied with psql"
else
    "$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$bare" migrate --sql >"$work/bare.sql" 2>/dev/null
    psql -X -q -v ON_ERROR_STOP=1 -1 -d "$PQMQ_TEST_DSN" -f "$work/bare.sql" >/dev/null 2>&1 \
        || fail "psql -1 -f of 'migrate --sql' failed"
    "$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$bare" migrate --status >"$work/out" 2>&1
    grep -q pending "$work/out" && fail "migrate --sql then psql left pending migrations"
    "$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$bare" migrate --sql >"$work/out" 2>"$work/err"
    [[ -s $work/out ]] && fail "migrate --sql of an up-to-date schema printed SQL"
    has err "up to date"
fi
run 0 migrate
has out "queue installed at version 100"
run 0 migrate
has out "is at version 100 already: nothing to do"
grep -q "installed" "$work/out" && fail "a second migrate says it installed: $(cat "$work/out")"

# --- the environment: PQMQ_DSN, DATABASE_URL, PQMQ_SCHEMA ----------------------
# envrun EXPECTED_STATUS [NAME=VALUE...] ARGS...: runs pqmq with only these
# of pqmq's variables set, and libpq's own PG* defaults pointing nowhere, so
# that a variable pqmq ignored makes the connection fail.
envrun() {
    local want=$1 rc
    shift
    local -a vars=()
    while [[ $# -gt 0 && $1 == *=* ]]; do
        vars+=("$1")
        shift
    done
    env -u PQMQ_DSN -u DATABASE_URL -u PQMQ_SCHEMA -u PGSERVICE PGHOST=/nonexistent PGPORT=1 \
        "${vars[@]}" "$pqmq_bin" "$@" >"$work/out" 2>"$work/err" </dev/null
    rc=$?
    [[ $rc == "$want" ]] ||
        fail "${vars[*]} pqmq $* exited $rc, expected $want; stderr: $(head -c 300 "$work/err")"
}
# urlencode TEXT: TEXT percent-encoded for a postgresql:// URL.
urlencode() {
    local s=$1 out= c i
    for ((i = 0; i < ${#s}; i++)); do
        c=${s:i:1}
        case $c in
        [A-Za-z0-9/._~-]) out+=$c ;;
        *) out+=$(printf '%%%02X' "'$c") ;;
        esac
    done
    printf '%s' "$out"
}
read -r u_host u_port u_user u_db < <(psql -X -q -d "$PQMQ_TEST_DSN" \
    -c '\echo :HOST :PORT :USER :DBNAME')
url="postgresql://$(urlencode "$u_user")@/$(urlencode "$u_db")?host=$(urlencode "$u_host")&port=$u_port"
nowhere="host=/nonexistent port=1"
envrun 0 PQMQ_DSN="$PQMQ_TEST_DSN" PQMQ_SCHEMA="$schema" status
envrun 0 DATABASE_URL="$url" PQMQ_SCHEMA="$schema" status
envrun 0 PQMQ_DSN="$url" DATABASE_URL="$nowhere" PQMQ_SCHEMA="$schema" status
envrun 0 PQMQ_DSN= DATABASE_URL="$PQMQ_TEST_DSN" PQMQ_SCHEMA="$schema" status
envrun 0 PQMQ_DSN="$nowhere" DATABASE_URL="$nowhere" PQMQ_SCHEMA="$schema" \
    -d "$PQMQ_TEST_DSN" status
envrun 1 PQMQ_DSN="$PQMQ_TEST_DSN" PQMQ_SCHEMA="no_such_schema_$$" status
has err "schema \"no_such_schema_$$\" does not exist"
envrun 0 PQMQ_DSN="$PQMQ_TEST_DSN" PQMQ_SCHEMA="no_such_schema_$$" --schema "$schema" status
envrun 0 PQMQ_DSN="$PQMQ_TEST_DSN" PQMQ_SCHEMA="no_such_schema_$$" status --schema "$schema"
# A missing schema: the error says how to have it; --create-schema makes it.
made=cli_made_$$
"$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$made" migrate >/dev/null 2>"$work/err"
[[ $? == 1 ]] || fail "migrate into a missing schema: not exit 1"
has err "schema \"$made\" does not exist: add --create-schema"
"$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$made" migrate --create-schema >"$work/out" 2>"$work/err" ||
    fail "migrate --create-schema: $(cat "$work/err")"
has out "queue installed at version 100"
# A fresh install has nothing to tell (no notice of a step it skipped); a
# Citus coordinator announces the schema it distributes, its own news.
grep -v "^NOTICE:  distributing the schema $made\$" "$work/err" | grep -q . &&
    fail "a fresh install printed: $(cat "$work/err")"
[[ $(sql "SELECT count(*) FROM $made.mq_schema_migrations") == 1 ]] ||
    fail "migrate --create-schema made no queue"
psql -X -q -d "$PQMQ_TEST_DSN" -c "SET client_min_messages = warning" \
    -c "DROP SCHEMA $made CASCADE" >/dev/null
run 2 migrate --create-schema --status
# Without the right --schema, the advice names the schema that holds a queue
# rather than 'pqmq migrate', which would install an empty second one.
"$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$old" status >/dev/null 2>"$work/err"
[[ $? == 1 ]] || fail "status in a schema without a queue: not exit 1"
has err "no pqmq queue in schema \"$old\"" "$schema" "--schema"
grep -qF "pqmq migrate" "$work/err" && fail "the advice installs a second queue: $(cat "$work/err")"
one_line
run 0 migrate
run 0 migrate --status
has out "version 100 (pqmq 1.0.0), applied" "up to date"
grep -q pending "$work/out" && fail "migrate left pending migrations"
run 2 migrate --status --sql
# A queue of an older release is refused by the other commands with a clear
# message, said pending by --status, and upgraded by migrate.
"$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$old" migrate >/dev/null 2>&1
PGOPTIONS="-c search_path=$old" psql -X -q -d "$PQMQ_TEST_DSN" \
    -c "UPDATE mq_schema_migrations SET version = 17, name = '0017_citus'" >/dev/null
"$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$old" status >/dev/null 2>"$work/err"
[[ $? == 1 ]] || fail "status on a version 17 queue: not exit 1"
has err "is at version 17, this command needs 100: run 'pqmq migrate'"
"$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$old" migrate --status >"$work/out" 2>&1
has out "version 17, applied" "pending upgrade to version 100"
"$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$old" migrate >"$work/out" 2>&1 \
    || fail "migrate of a version 17 queue failed: $(cat "$work/out")"
"$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$old" status >/dev/null 2>&1 \
    || fail "status after upgrading a version 17 queue failed"

# --- send ---------------------------------------------------------------------
run 0 send orders ship '{"step": 1, "items": [1, 2]}'
id1=$(cat "$work/out")
[[ $id1 =~ ^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$ ]] \
    || fail "send printed \"$id1\", not a UUIDv7"
[[ $(sql "SELECT p.name || ' ' || m.channel_name || ' ' || (p.payload_json->>'step')
          FROM mq_msgs m JOIN mq_payloads p USING (id) WHERE m.id = '$id1'") == "ship orders 1" ]] \
    || fail "send: the message is not in the queue as sent"
echo '{"from": "stdin"}' | "$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$schema" \
    send orders ship - >"$work/out" || fail "send - failed"
[[ $(sql "SELECT payload_json->>'from' FROM mq_payloads WHERE id = '$(cat "$work/out")'") == stdin ]] \
    || fail "send -: payload not read from stdin"
run 0 send --ordered --args cust-1 --retries 7 --backoff 2500 chain step
id_chain=$(cat "$work/out")
[[ $(sql "SELECT attempts || ' ' || channel_args || ' ' || (after_message_id IS NOT NULL)
          || ' ' || extract(epoch FROM retry_backoff) FROM mq_msgs WHERE id = '$id_chain'") \
   == "8 cust-1 true 2.500000" ]] || fail "send flags not applied"
run 0 send --delay 600000 later tick
run 0 send --key k1 keyed first '{"v": 1}'
id_k=$(cat "$work/out")
run 0 send --key k1 keyed second '{"v": 2}'
[[ $(cat "$work/out") == "$id_k" ]] || fail "send --key: a second send did not print the holder"
has err "kept: key \"k1\" is held by $id_k"
run 0 send --key k1 --replace keyed third '{"v": 3}'
has err "replaced"
[[ $(sql "SELECT count(*) || ' ' || min(name) FROM mq_msgs WHERE channel_name = 'keyed'") \
   == "1 third" ]] || fail "send --key --replace: not one message with the new payload"
run 2 send --replace keyed fourth
run 1 send orders bad '{"unclosed": '
# Said as the command line knows it: no C call, no array index.
has err "pqmq send: message 1: payload is not valid JSON (at byte 14)"
grep -qE 'pqmq_insert|msgs\[' "$work/err" && fail "send shows C internals: $(cat "$work/err")"
one_line
run 0 send --priority 7 prio p
[[ $(sql "SELECT priority FROM mq_msgs WHERE id = '$(cat "$work/out")'") == 7 ]] ||
    fail "send --priority 7: not priority 7"
run 0 send -p 32767 prio p
run 2 send --priority 32768 prio p
has err '--priority: "32768" is not a whole number in 0..32767'
run 2 send --backoff 0 prio p
has err '--backoff: "0" is not a whole number in 1..'
# A queue missing a function: the advice is the command's, once.
if [[ ${PQMQ_TEST_CITUS:-} != 1 ]]; then
    "$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$broken" migrate --create-schema >/dev/null 2>&1
    PGOPTIONS="-c search_path=$broken" psql -X -q -d "$PQMQ_TEST_DSN" \
        -c "DROP FUNCTION mq_insert(mq_new_t[])" >/dev/null
    "$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$broken" send a b '{}' >/dev/null 2>"$work/err"
    [[ $? == 1 ]] || fail "send to a queue missing mq_insert: not exit 1"
    has err "run 'pqmq migrate'"
    [[ $(grep -o "migrate" "$work/err" | wc -l) == 1 ]] ||
        fail "the advice is not given once: $(cat "$work/err")"
    grep -qF "pqmq_" "$work/err" && fail "the advice names a C function: $(cat "$work/err")"
    one_line
fi
run 2 send orders
run 2 send --retries x orders ship
run 2 send --delay -5 orders ship

# --- status -------------------------------------------------------------------
run 0 status
has out "CHANNEL" "READY" "orders" "chain" "later" "(total)"
run 0 status --json orders
has out '"channel": "orders"' '"ready": 2' '"total": {'
run 0 status --json later
has out '"scheduled": 1'
run 1 status orders no_such_channel
has err "unknown channel \"no_such_channel\""

# --- peek ---------------------------------------------------------------------
sql "SELECT mq_insert(ARRAY[
       ROW(gen_random_uuid(), NULL, 4, NULL, 'bin', '', NULL, false, 'mp', NULL,
           '\\x82a16101a162c3'::bytea)::mq_new_t,
       ROW(gen_random_uuid(), NULL, 4, NULL, 'bin', '', NULL, false, 'raw', NULL,
           '\\xc1'::bytea)::mq_new_t])" >/dev/null || fail "inserting binary payloads"
run 0 peek orders
has out "$id1" "ready" "name ship" '"step": 1,' '"items": [' 'payload (JSON)'
[[ $(grep -c 'payload (JSON)' "$work/out") == 2 ]] || fail "peek orders: not 2 messages"
run 0 peek -n 1 orders
[[ $(grep -c 'payload (JSON)' "$work/out") == 1 ]] || fail "peek -n 1: not 1 message"
run 0 peek bin
has out "payload (msgpack, 7 bytes, as JSON)" '"a": 1' '"b": true' "payload (bytes, 1): c1"
run 0 peek chain cust-1
has out "$id_chain" "ordered"
# Peeking claims nothing.
[[ $(sql "SELECT sum(deliveries) FROM mq_msgs") == 0 ]] || fail "peek delivered messages"
run 1 peek no_such_channel
has err "unknown channel"
one_line
run 2 peek
# Every wrong -n is said the same way.
run 2 peek -n 0 orders
has err 'pqmq peek: -n: "0" is not a whole number in 1..10000'
one_line
run 2 peek -n abc orders
has err 'pqmq peek: -n: "abc" is not a whole number in 1..10000'
one_line
run 2 peek -n 10001 orders
has err 'pqmq peek: -n: "10001" is not a whole number in 1..10000'

# --- dead, retry, skip --------------------------------------------------------
run 0 send --retries 0 --backoff 1 dch boom '{"n": 1}'
dead1=$(cat "$work/out")
run 0 send --retries 0 --backoff 1 --ordered --args k sk head
head_id=$(cat "$work/out")
run 0 send --ordered --args k sk follower
# Deliver both once; their 1 ms leases run out: dead.
sql "SELECT count(*) FROM mq_poll_jobs('{dch,sk}', 10)" >/dev/null
sleep 0.2
run 0 dead
has out "$dead1" "$head_id" "LAST_ERROR"
# A table, as status prints one: columns padded with spaces, no tabs.
grep -qP '\t' "$work/out" && fail "dead prints tabs: $(head -c 300 "$work/out")"
head -n 1 "$work/out" | grep -qE '^ID {35}CHANNEL +ARGS +NAME +DELIVERIES BLOCKING +LAST_ERROR$' ||
    fail "dead: not a table header: $(head -n 1 "$work/out")"
[[ $(awk 'NR > 1 { print index($0, $2) }' "$work/out" | sort -u) == 38 ]] ||
    fail "dead: the CHANNEL column is not aligned: $(cat "$work/out")"
run 0 dead --json
has out '"dead": [' "\"id\": \"$dead1\"" '"channel": "dch"' '"name": "boom"' \
    '"blocking": true' '"count": 2}'
if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert len(d["dead"]) == d["count"] == 2' \
        "$work/out" || fail "dead --json: not the JSON of two messages: $(cat "$work/out")"
fi
run 0 dead --json orders
has out '{"dead": [], "count": 0}'
run 0 dead dch
has out "$dead1"
grep -qF "$head_id" "$work/out" && fail "dead dch lists another channel's message"
run 1 dead no_such_channel
has err "unknown channel"
run 0 status --json sk
has out '"dead": 1' '"blocked_chains": 1' '"waiting": 1'

run 0 retry "$dead1"
has out "retried $dead1"
[[ $(sql "SELECT dead_since IS NULL AND attempts = 1 FROM mq_msgs WHERE id = '$dead1'") == t ]] \
    || fail "retry did not revive the message"
# The message is live now: retrying it does nothing, and says so.
run 1 retry "$dead1"
has err "$dead1: no dead message with this id"
one_line
run 2 retry not-a-uuid
has err "is not a message id"
run 2 retry
run 2 retry --dead "$dead1"
run 2 retry --channel dch "$dead1"
sql "SELECT count(*) FROM mq_poll_jobs('{dch}', 10)" >/dev/null
sleep 0.2
run 0 retry --dead --channel dch --retries 2
has out "retried 1 dead message"
[[ $(sql "SELECT attempts FROM mq_msgs WHERE id = '$dead1'") == 3 ]] \
    || fail "retry --retries 2: not 3 deliveries left"
run 1 retry --dead --channel no_such_channel

run 1 skip "$dead1"
has err "no ordered message in a chain with this id"
run 2 skip nope
run 2 skip
run 0 skip "$head_id"
has out "skipped $head_id"
run 0 status --json sk
has out '"blocked_chains": 0' '"waiting": 0' '"ready": 1'

# --- show ---------------------------------------------------------------------
# dead1's two leases ran out (one before and one after its first retry):
# both attempts are in its story; retried, it is ready.
run 0 show "$dead1"
has out "message  $dead1" "state    ready" "channel  dch" "name     boom" "chain    unordered" \
    "attempts 2 used, 3 left" "attempt 1  " "attempt 2  " "lease ran out" 'payload (JSON, 8 bytes)' \
    '{"n": 1}'
run 0 show --json "$dead1"
has out "\"id\": \"$dead1\"" '"state": "ready"' '"channel": "dch"' '"payload": {' \
    '"json_preview": "{\"n\": 1}"'
if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
assert [h["attempt"] for h in d["history"]] == [1, 2], d["history"]
assert all(h["error"] == "lease ran out" for h in d["history"])
assert d["attempts_used"] == 2 and d["attempts_left"] == 3 and d["logged"] is False' \
        "$work/out" || fail "show --json: not dead1's story: $(cat "$work/out")"
fi
run 0 show --json --no-payload "$dead1"
grep -qF '"payload"' "$work/out" && fail "show --no-payload shows the payload"
run 0 show --max-bytes 3 "$dead1"
has out 'payload (JSON, 8 bytes, the start)' '{"n'
run 0 show "$head_id"
has out "state    dead" "dead     since"
run 0 send --ordered --args w wch first
w1=$(cat "$work/out")
run 0 send --ordered --args w wch second
w2=$(cat "$work/out")
run 0 show "$w2"
has out "state    waiting" "args     w" "chain    ordered: 1 ahead of it, the head is $w1"
run 1 show 00000000-0000-0000-0000-0000000000aa
has err "pqmq show: no message 00000000-0000-0000-0000-0000000000aa (completed, deleted or never inserted)"
one_line
run 2 show not-a-uuid
has err "is not a message id"
run 2 show
run 2 show --max-bytes 0 "$dead1"
has err '--max-bytes: "0" is not a whole number in 1..1048576'
run 0 purge --channel wch --yes

# --- purge --------------------------------------------------------------------
before_orders=$(sql "SELECT count(*) FROM mq_msgs WHERE channel_name = 'orders'")
run 2 purge --channel sk
has err "add --yes"
run 2 purge --yes
run 2 purge --yes sk
run 1 purge --channel no_such_channel --yes
has err "unknown channel"
run 0 purge --channel sk --dead-only --yes
has out "$head_id"
has err "removed 1 message from channel \"sk\""
[[ $(sql "SELECT count(*) FROM mq_msgs WHERE channel_name = 'sk'") == 1 ]] \
    || fail "purge --dead-only removed live messages"
run 0 purge --channel chain --args other --yes
has err "removed 0 messages"
run 0 purge --channel sk --yes
has err "removed 1 message from channel \"sk\""
[[ $(sql "SELECT count(*) FROM mq_msgs WHERE channel_name = 'sk'") == 0 ]] \
    || fail "purge left messages"
[[ $(sql "SELECT count(*) FROM mq_msgs WHERE channel_name = 'orders'") == "$before_orders" ]] \
    || fail "purge touched another channel"
# On a terminal it asks; anything but y keeps the messages.
if command -v script >/dev/null 2>&1; then
    printf 'n\n' | script -qec "'$pqmq_bin' -d '$PQMQ_TEST_DSN' --schema $schema purge --channel orders" \
        /dev/null >"$work/out" 2>&1
    has out "Delete all messages of channel \"orders\"" "nothing deleted"
    [[ $(sql "SELECT count(*) FROM mq_msgs WHERE channel_name = 'orders'") == "$before_orders" ]] \
        || fail "purge deleted without a yes"
    printf 'y\n' | script -qec "'$pqmq_bin' -d '$PQMQ_TEST_DSN' --schema $schema purge --channel orders" \
        /dev/null >"$work/out" 2>&1
    [[ $(sql "SELECT count(*) FROM mq_msgs WHERE channel_name = 'orders'") == 0 ]] \
        || fail "purge did not delete after y"
else
    echo "note: script(1) not found; the terminal confirmation is not checked"
fi

# --- pause, resume -------------------------------------------------------------
run 2 pause
run 2 resume --reason why pz
run 2 pause ''
run 0 pause --reason "a deploy" pz other_pz
has out "paused pz" "paused other_pz"
run 0 pause pz
has out "already paused: pz"
[[ $(sql "SELECT reason FROM mq_paused WHERE channel_name = 'pz'") == "a deploy" ]] \
    || fail "pause did not keep its reason"
run 0 send pz job '{}'
[[ $(sql "SELECT count(*) FROM mq_poll(ARRAY['pz'], 10) WHERE id IS NOT NULL") == 0 ]] \
    || fail "a paused channel's message was delivered"
run 0 status
has out "pz (paused)"
run 0 metrics
has out 'pqmq_channel_paused{channel="pz"} 1' 'pqmq_channel_paused{channel="other_pz"} 1'
run 0 resume pz other_pz nothing_here
has out "resumed pz" "resumed other_pz" "not paused: nothing_here"
[[ $(sql "SELECT count(*) FROM mq_paused") == 0 ]] || fail "resume left a pause"
[[ $(sql "SELECT count(*) FROM mq_poll(ARRAY['pz'], 10) WHERE id IS NOT NULL") == 1 ]] \
    || fail "a resumed channel's message was not delivered"

# --- metrics (the format itself is parsed by test_metrics) ---------------------
run 0 metrics
has out "# TYPE pqmq_messages gauge" 'pqmq_messages{channel="chain",state="ready"} 1'

# --- control characters: a producer's channel name cannot drive the terminal ---
esc=$'\033'
run 0 send $'evil\033]0;owned\a\033[2J' ping
run 0 status
grep -q "$esc" "$work/out" && fail "status wrote a raw ESC"
has out 'evil\x1b]0;owned\x07\x1b[2J'
run 1 status $'gone\033[2J'
grep -q "$esc" "$work/err" && fail "an error message wrote a raw ESC"
has err 'unknown channel "gone\x1b[2J"'
one_line
run 0 send --key $'k\033[2J' keyed ping
run 0 send --key $'k\033[2J' keyed ping
grep -q "$esc" "$work/err" && fail "send's key line wrote a raw ESC"
has err 'key "k\x1b[2J" is held by'
# metrics: exact for Prometheus when redirected, escaped on a terminal.
run 0 metrics
grep -qF "channel=\"evil$esc]0;owned"$'\a'"$esc[2J\"" "$work/out" \
    || fail "metrics to a file changed the channel name: $(grep evil "$work/out" | head -1)"
if command -v script >/dev/null 2>&1; then
    script -qec "'$pqmq_bin' -d '$PQMQ_TEST_DSN' --schema $schema metrics" /dev/null \
        >"$work/out" 2>&1 </dev/null
    grep -q "$esc" "$work/out" && fail "metrics on a terminal wrote a raw ESC"
    has out 'channel="evil\x1b]0;owned\x07\x1b[2J"'
fi
# A schema name with a newline stays inside the comment of migrate --sql.
nl_schema="cli_nl_$$"$'\n'"SELECT 'injected'"
psql -X -q -d "$PQMQ_TEST_DSN" -c "CREATE SCHEMA \"$nl_schema\"" >/dev/null \
    || fail "cannot create the schema with a newline"
"$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$nl_schema" migrate --sql >"$work/out" 2>"$work/err"
grep -q "^SELECT 'injected'" "$work/out" && fail "migrate --sql: a schema name ended its comment"
has out "for schema \"cli_nl_$$\\nSELECT 'injected'\""
psql -X -q -d "$PQMQ_TEST_DSN" -c "DROP SCHEMA \"$nl_schema\"" >/dev/null

# --- a reader that stops early: no SIGPIPE death (exit 141) ------------------
# The reader is gone before pqmq writes (it waits first), so every write
# fails; the command still finishes and exits 0.
( sleep 0.5; exec "$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$schema" metrics ) | true
rc=${PIPESTATUS[0]}
[[ $rc == 0 ]] || fail "metrics into a closed pipe exited $rc, expected 0"
( sleep 0.5; exec "$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$schema" send piped ping ) | true
rc=${PIPESTATUS[0]}
[[ $rc == 0 ]] || fail "send into a closed pipe exited $rc, expected 0"
[[ $(sql "SELECT count(*) FROM mq_msgs WHERE channel_name = 'piped'") == 1 ]] \
    || fail "send into a closed pipe did not insert its message"
# watch stops when its reader does (head takes the first line and exits).
timeout 30 "$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$schema" watch --interval 1 \
    | head -n 1 >/dev/null
rc=${PIPESTATUS[0]}
[[ $rc == 0 ]] || fail "watch | head exited $rc, expected 0 (124: it never stopped)"
timeout 20 "$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$schema" watch --count 0 --interval 1 \
    >/dev/null 2>"$work/err"
rc=$?
[[ $rc == 2 ]] || fail "watch --count 0 exited $rc, expected 2 (124: it never stopped)"
has err "--count: must be at least 1"

# --- watch: redrawn by a notification, not by its (hour-long) interval ---------
"$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$schema" watch --count 2 --interval 3600 \
    >"$work/watch" 2>&1 &
watch_pid=$!
for _ in $(seq 100); do
    grep -q "pqmq watch" "$work/watch" && break
    sleep 0.1
done
grep -q "pqmq watch" "$work/watch" || fail "watch drew nothing"
run 0 send wakeup ping
# The second redraw follows the insert's notification; without LISTEN it
# would wait an hour and this wait would time out.
( sleep 60; kill "$watch_pid" 2>/dev/null ) &
killer=$!
wait "$watch_pid"
watch_rc=$?
kill "$killer" 2>/dev/null
wait "$killer" 2>/dev/null
[[ $watch_rc == 0 ]] || fail "watch did not redraw on a notification (exit $watch_rc)"
[[ $(grep -c "^CHANNEL" "$work/watch") == 2 ]] || fail "watch: not two redraws"
grep -q "wakeup" "$work/watch" || fail "watch: the second redraw lacks the new channel"
grep -q "REMOVED/S" "$work/watch" || fail "watch: no REMOVED/S column"

if ((failed > 0)); then
    echo "$failed check(s) failed"
    exit 1
fi
echo "ok: every pqmq subcommand"
exit 0
