#!/usr/bin/env bash
# tests/test_exactly_once.sh [EXACTLY_ONCE]: effects happen exactly once
# even when the worker is killed with SIGKILL at random moments.
#
# EXACTLY_ONCE is the examples/exactly_once program (default:
# ./examples/exactly_once, as seen from the build directory make check runs
# in). Uses the server in $PQMQ_TEST_DSN (skips, exit 77, without one) and a
# schema of its own, dropped at the end.
#
#   1. exactly_once creates the queue's schema and its ledger (then stops on
#      SIGTERM, which must exit 0);
#   2. 2,000 messages {"seq": n} go in with psql calling mq_insert: 1,500
#      ordered on 10 chains (channels chain0..chain9), 500 unordered;
#   3. exactly_once is started and killed with SIGKILL at least 10 times,
#      after a random 50-400 ms each time;
#   4. a last exactly_once drains the queue and is stopped with SIGTERM.
# Then: the queue is empty; the ledger has exactly one row per message (with
# its seq and channel); on each chain, completion order is seq order.
# Exits 0 on success, 1 with a message on failure. Bounded to about a minute.
# PQMQ_EO_KILLS (default 12, at least 10 is the point) sets how many kills.

set -u

bin=${1:-./examples/exactly_once}
kills_wanted=${PQMQ_EO_KILLS:-12}
total=2000

# shellcheck source=tests/lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
t_need_dsn
t_need_program "$bin" "exactly_once program" "make examples/exactly_once"
t_need_tools psql

schema=t_exactly_once_$$
conninfo="$PQMQ_TEST_DSN options='-c search_path=$schema -c client_min_messages=warning'"
work=$(mktemp -d)
log=$work/exactly_once.log
pid=

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    if [[ -n $pid ]]; then
        kill -9 "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    psql -X -q -d "$PQMQ_TEST_DSN" -c "DROP SCHEMA IF EXISTS $schema CASCADE" \
        >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT

# Unlike lib.sh's, this fail ends the test. Also from inside $(...): the
# message goes to stderr, which the test log holds too, and the caller's
# "|| fail" then ends the script.
fail() {
    {
        echo "FAIL: $*"
        if [[ -s $log ]]; then
            echo "---- last lines of the exactly_once output ----"
            tail -n 20 "$log"
        fi
    } >&2
    exit 1
}

# The result of SQL on the test schema (unaligned, tuples only); unlike
# lib.sh's, on error it prints the statement and psql's message, returns 1.
sql() {
    if ! psql -X -q -At -v ON_ERROR_STOP=1 -d "$conninfo" -c "$1" 2>"$work/psql.err"; then
        echo "SQL failed: $1" >&2
        cat "$work/psql.err" >&2
        return 1
    fi
}

start() {
    "$bin" "$conninfo" 2>>"$log" &
    pid=$!
}

# Waits up to $2 seconds for the SQL $1 to return "t".
wait_for() {
    local deadline=$((SECONDS + $2))
    while (( SECONDS < deadline )); do
        [[ $(sql "$1" 2>/dev/null) == t ]] && return 0
        sleep 0.1
    done
    return 1
}

# Sends SIGTERM and expects a clean exit 0 within 15 s.
stop_gracefully() {
    kill -TERM "$pid" || fail "exactly_once (pid $pid) is not running"
    local deadline=$((SECONDS + 15))
    while kill -0 "$pid" 2>/dev/null && (( SECONDS < deadline )); do
        sleep 0.05
    done
    kill -0 "$pid" 2>/dev/null && fail "exactly_once did not stop within 15 s of SIGTERM"
    wait "$pid"
    local rc=$?
    pid=
    (( rc == 0 )) || fail "exactly_once exited with status $rc after SIGTERM"
}

psql -X -q -v ON_ERROR_STOP=1 -d "$PQMQ_TEST_DSN" \
    -c "SET client_min_messages = warning" \
    -c "DROP SCHEMA IF EXISTS $schema CASCADE" -c "CREATE SCHEMA $schema" \
    >/dev/null || fail "cannot create schema $schema"

# 1. The example creates the queue's schema and its ledger.
start
wait_for "SELECT to_regclass('example_ledger') IS NOT NULL" 15 \
    || fail "exactly_once did not create its schema within 15 s"
stop_gracefully

# 2. The messages. eo_sent remembers each id with its seq and channel.
sql "CREATE TABLE eo_sent (id uuid PRIMARY KEY, seq int NOT NULL, channel text NOT NULL)" \
    || fail "cannot create eo_sent"
for part in 0 1 2 3; do
    lo=$((part * total / 4 + 1)) hi=$(((part + 1) * total / 4))
    sql "WITH m AS (
           SELECT gen_random_uuid() AS id, n,
                  CASE WHEN n % 4 = 0 THEN 'loose' ELSE 'chain' || n % 10 END AS channel
           FROM generate_series($lo, $hi) AS n
         ),
         sent AS (INSERT INTO eo_sent SELECT id, n, channel FROM m)
         SELECT mq_insert(array_agg(ROW(
                    id, interval '0', 20, interval '500 ms', channel, '', NULL,
                    n % 4 <> 0, 'ledger', json_build_object('seq', n)::text, NULL
                )::mq_new_t ORDER BY n))
         FROM m" >/dev/null || fail "mq_insert failed"
done
inserted=$(sql "SELECT count(*) FROM mq_msgs") || fail "cannot count mq_msgs"
(( inserted == total )) || fail "inserted $inserted messages, expected $total"

# 3. Kill it at random moments.
kills=0 progress=
for ((i = 0; i < kills_wanted; i++)); do
    start
    sleep "0.$(printf '%03d' $((50 + RANDOM % 351)))"
    kill -0 "$pid" 2>/dev/null || fail "exactly_once died on its own (run $((i + 1)))"
    kill -9 "$pid"
    wait "$pid" 2>/dev/null
    pid=
    kills=$((kills + 1))
    progress+=" $(sql "SELECT count(*) FROM example_ledger")" || fail "cannot count the ledger"
done
echo "inserted $inserted messages; killed exactly_once $kills times (SIGKILL)"
echo "ledger rows after each kill:$progress"

# 4. The last one drains the queue.
start
wait_for "SELECT NOT EXISTS (SELECT 1 FROM mq_msgs)" 30 \
    || fail "the queue still holds $(sql "SELECT count(*) FROM mq_msgs") messages after 30 s" \
            "($(sql "SELECT count(*) FROM mq_msgs WHERE attempts = 0") with no attempts left)"
stop_gracefully
grep 'stopped' "$log" | tail -n 1

# The checks.
rows=$(sql "SELECT count(*) FROM example_ledger") || fail "cannot count the ledger"
echo "ledger rows: $rows"
(( rows == total )) || fail "the ledger has $rows rows, expected $total"
missing=$(sql "SELECT count(*) FROM eo_sent s
               WHERE NOT EXISTS (SELECT 1 FROM example_ledger l
                                 WHERE l.msg_id = s.id AND l.seq = s.seq
                                   AND l.channel = s.channel
                                   AND l.payload = jsonb_build_object('seq', s.seq))") \
    || fail "cannot compare eo_sent with the ledger"
(( missing == 0 )) || fail "$missing messages have no matching ledger row"
seqs=$(sql "SELECT count(DISTINCT seq) FROM example_ledger WHERE seq BETWEEN 1 AND $total") \
    || fail "cannot count seqs"
(( seqs == total )) || fail "the ledger holds $seqs distinct seqs, expected $total"
left=$(sql "SELECT (SELECT count(*) FROM mq_msgs) + (SELECT count(*) FROM mq_payloads)
               + (SELECT count(*) FROM mq_chains)") || fail "cannot count queue rows"
(( left == 0 )) || fail "$left rows left in mq_msgs, mq_payloads and mq_chains"
chains=$(sql "SELECT count(DISTINCT channel) FROM example_ledger WHERE channel LIKE 'chain%'") \
    || fail "cannot count chains"
(( chains == 10 )) || fail "found $chains chains in the ledger, expected 10"
disorder=$(sql "SELECT count(*) FROM (
                  SELECT done_at, lag(done_at) OVER (PARTITION BY channel ORDER BY seq) AS prev
                  FROM example_ledger WHERE channel LIKE 'chain%') x
                WHERE prev >= done_at") || fail "cannot check chain order"
(( disorder == 0 )) || fail "$disorder ordered messages completed before their predecessor"
echo "exactly once: $rows of $total, in order on all $chains chains"
exit 0
