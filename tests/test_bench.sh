#!/usr/bin/env bash
# tests/test_bench.sh [BENCH]: pqmq-bench, the README's main demo, end to
# end on a few hundred messages against the server in $PQMQ_TEST_DSN (its
# schema pqmq_bench is dropped and made anew, as the bench always does):
#
#   - a default run with --json prints every rate of the main scenario and
#     of the ordered chains, each above zero, and leaves the queue empty;
#     each latency figure is split at pqmq_insert's return (the insert and
#     its commit, then the runner's part), in the JSON and in the report;
#   - --rounds 3 runs the rate phases three times, interleaved (--profile
#     names every phase it measures: each round's runner phases, main
#     before chains in each round, and the chains' index probes a message
#     of the chains' phases), and says in its report that figures are
#     medians;
#   - --sweep with --rounds 2 runs every value in each round, in turn, and
#     reports medians, one CSV row a value;
#   - --rounds outside 1..9 is refused with exit 2, naming the option.
#
# Figures are not judged here: they are measurements (docs/performance.md).
# BENCH defaults to ./bench/pqmq-bench, as seen from the build directory.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bench=${1:-${PQMQ_TEST_BUILDDIR:-.}/bench/pqmq-bench}
# shellcheck source=tests/lib.sh
. "$here/lib.sh"

t_need_dsn
t_need_program "$bench" "pqmq-bench" "make bench/pqmq-bench"
t_need_tools psql jq

work=$(mktemp -d)
failed=0
trap 'rm -rf "$work"' EXIT
schema=pqmq_bench

# A small run: every phase, a few batches each.
small=(--dsn "$PQMQ_TEST_DSN" --messages 400 --batch 50 --channels 4 --chains 8
    --priorities 0 --runner-threads 2 --latency-samples 3 --latency-gap-ms 1)

# A default run, as JSON.
if ! "$bench" "${small[@]}" --json >"$work/json" 2>"$work/err"; then
    fail "pqmq-bench --json exited $?: $(tail -3 "$work/err")"
else
    for f in .enqueue_per_s .process_runner_per_s .process_poll_per_s .process_locked_per_s \
        .process_runner_locked_per_s .ordered.enqueue_per_s .ordered.process_runner_per_s \
        .ordered.process_poll_per_s .ordered.process_locked_per_s; do
        v=$(jq -r "$f // \"missing\"" "$work/json")
        [[ $v =~ ^[0-9.]+$ ]] && awk -v v="$v" 'BEGIN { exit !(v > 0) }' ||
            fail "JSON $f is $v, not a rate above zero"
    done
    # The idle latency's split at pqmq_insert's return: an insert takes
    # time, and neither part's median exceeds the whole's maximum.
    for k in idle ordered; do
        jq -e --arg k "$k" '.latency_ms[$k] as $l | ($l.insert_p50 | type) == "number"
            and $l.insert_p50 > 0 and $l.insert_p99 >= $l.insert_p50
            and $l.runner_p50 >= 0 and $l.runner_p99 >= $l.runner_p50
            and $l.insert_p50 <= $l.max and $l.runner_p50 <= $l.max' "$work/json" >/dev/null ||
            fail "JSON latency_ms.$k has no split at the insert's return: $(jq -c ".latency_ms.$k" "$work/json")"
    done
    [[ $(jq -r '.parameters.rounds' "$work/json") == 1 ]] ||
        fail "JSON parameters.rounds of a default run: $(jq -c .parameters "$work/json")"
    left=$(sql "SELECT count(*) FROM mq_msgs")
    [[ $left == 0 ]] || fail "the run left $left messages in the queue"
fi

# The text report without --floor: no row of a figure that was not
# measured (a value "-"), no floor or ratio column with nothing in it, no
# verdict on latencies (their targets are for other settings: README), and
# the rows against the main scenario have a header of their own.
if ! "$bench" "${small[@]}" >"$work/text" 2>"$work/err"; then
    fail "pqmq-bench (text) exited $?: $(tail -3 "$work/err")"
else
    grep -q "10 batches a call" "$work/text" &&
        fail "the report prints the pipelined row, measured only with --floor"
    grep -q "^latency.*MISSED\|^  .*(ms).*MISSED" "$work/text" &&
        fail "the report judges the latencies: $(grep MISSED "$work/text")"
    grep -qE "^latency \(ms\) +p50 +p99 +max" "$work/text" ||
        fail "the latencies' header does not name its columns"
    awk '$0 ~ /^[a-z0-9]/ && $0 !~ /:$/ && NF >= 2 && $2 == "-" { bad = 1; print }
         END { exit bad }' "$work/text" >"$work/unmeasured" ||
        fail "rows without a value: $(tr '\n' '|' <"$work/unmeasured")"
    grep -qE "^figure +messages/s\b" "$work/text" ||
        fail "the rates' header does not say what its column holds: $(head -4 "$work/text")"
    grep -qE "^figure.*floor" "$work/text" && fail "a floor column in a run without --floor"
    grep -qE "^(vs the main scenario|against the main scenario).*main" "$work/text" ||
        fail "the rows against the main scenario have no header of their own"
fi

# Three rounds, as text: --profile's lines (stderr, one a phase) show each
# round's phases, in turn.
if ! "$bench" "${small[@]}" --rounds 3 --profile >"$work/out" 2>"$work/err"; then
    fail "pqmq-bench --rounds 3 exited $?: $(tail -3 "$work/err")"
else
    grep -A2 "^  idle runner " "$work/out" | grep -qE "^    insert\+commit +[0-9.]+ +[0-9.]+$" &&
        grep -A2 "^  idle runner " "$work/out" | grep -qE "^    runner +[0-9.]+ +[0-9.]+$" ||
        fail "the report does not split the idle latency: $(grep idle "$work/out")"
    grep -q "the median of 3 interleaved rounds" "$work/out" ||
        fail "the --rounds 3 report does not say its figures are medians"
    # The order of first appearance of each round's runner phases.
    sed -n 's/^profile: \(.* (round [0-9] of 3): runner\): wall .*/\1/p' "$work/err" >"$work/order"
    want=$'main (round 1 of 3): runner\n8 ordered chains (round 1 of 3): runner\nmain (round 2 of 3): runner\n8 ordered chains (round 2 of 3): runner\nmain (round 3 of 3): runner\n8 ordered chains (round 3 of 3): runner'
    [[ $(cat "$work/order") == "$want" ]] ||
        fail "runner phases of --rounds 3, in order: $(tr '\n' '|' <"$work/order")"
    grep -q "^1000 ordered chains\|^8 ordered chains: runner" "$work/out" ||
        fail "no ordered chains row in the --rounds 3 report"
    # Each chain member a poll takes is one probe of the chains' index at
    # least (among the lines under the phase's profile line).
    probes=$(awk '/^profile: / { on = /^profile: 8 ordered chains \(round 1 of 3\): runner:/ }
                  on && match($0, /mq_msgs_chain probes [0-9.]+/) {
                      print substr($0, RSTART + 21, RLENGTH - 21) }' "$work/err")
    [[ -n $probes ]] && awk -v p="$probes" 'BEGIN { exit !(p >= 0.9) }' ||
        fail "chain probes a message of the chains' runner phase: '$probes'"
fi

# A sweep of two values in two rounds: each value runs in each round, in
# turn (its progress lines on stderr), the report says its figures are
# medians, and the CSV has one row a value.
if ! (cd "$work" && "$bench" "${small[@]}" --sweep batch=20,50 --rounds 2 \
    --sweep-out "$work/sw" >"$work/out" 2>"$work/err"); then
    fail "pqmq-bench --sweep --rounds 2 exited $?: $(tail -3 "$work/err")"
else
    got=$(sed -n 's/^sweep: //p' "$work/err" | tr '\n' '|')
    want="batch = 20 (round 1 of 2)|batch = 50 (round 1 of 2)|batch = 20 (round 2 of 2)|batch = 50 (round 2 of 2)|"
    [[ $got == "$want" ]] || fail "sweep phases of --rounds 2, in order: $got"
    grep -q "the median of 2 interleaved rounds" "$work/out" ||
        fail "the sweep's --rounds 2 report does not say its figures are medians"
    [[ $(tail -n +2 "$work/sw.csv" | cut -d, -f1 | tr '\n' ' ') == "20 50 " ]] ||
        fail "sweep CSV rows: $(cat "$work/sw.csv")"
fi

# Out of range.
for n in 0 10 x; do
    "$bench" --dsn "$PQMQ_TEST_DSN" --rounds "$n" >"$work/out" 2>"$work/err"
    rc=$?
    [[ $rc == 2 ]] || fail "--rounds $n exited $rc, want 2"
    grep -q -- "--rounds\|rounds" "$work/err" || fail "--rounds $n: error does not name the option: $(cat "$work/err")"
done

if ((failed)); then
    echo "$failed check(s) failed"
    exit 1
fi
echo "PASS: pqmq-bench end to end, --rounds"
