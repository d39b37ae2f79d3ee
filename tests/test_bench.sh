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
#   - --rounds outside 1..9 is refused with exit 2, naming the option;
#   - every report ends with its targets beside their figures (text and
#     JSON): only figures the run measured, each with its value, reference,
#     ratio, bound and ok or MISSED; the idle latency against 1.5 / 5 ms;
#   - --repeat 2 runs the whole default run twice and prints each target's
#     figure as the range of the runs, judged on the median;
#   - --steady measures a burn-down rate, offers half of it and judges
#     kept up and poll p99; --held-xmin judges the backlog at the end of the
#     hold (offered load) or the rate during the hold (saturated);
#   - --steady with --rate, and --repeat with another mode or outside 1..9,
#     are refused with exit 2.
#
# Figures are not judged here, only printed beside their targets: they are
# measurements (docs/performance.md).
# BENCH defaults to ./bench/pqmq-bench, as seen from the build directory.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bench=${1:-${PQMQ_TEST_BUILDDIR:-.}/bench/pqmq-bench}
# shellcheck source=tests/lib.sh
. "$here/lib.sh"

t_need_dsn
t_need_program "$bench" "pqmq-bench" "make bench/pqmq-bench"
t_need_tools psql jq
# Absolute: the sweep runs in a directory of its own.
bench=$(cd "$(dirname "$bench")" && pwd)/$(basename "$bench")

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
    # The targets: without --floor no ratio to the floor is judged; the
    # chains in every lane, WAL and the idle latency are.
    jq -e '.targets | length == 7 and all(.[]; (.ok | type) == "boolean"
        and (.op | test("^(>=|<=|<)$")) and .runs == 1 and .value_min == .value_max)
        and (map(.figure) | any(test("of the floor")) | not)
        and (map(select(.figure | startswith("8 chains, of unordered: "))) | length) == 4
        and (map(select(.figure == "idle latency p50" and .target == 1.5 and .op == "<="))
            | length) == 1
        and (map(select(.figure == "idle latency p99" and .target == 5)) | length) == 1
        and (map(select(.figure | startswith("WAL"))) | .[0].reference_min == 262
            and .[0].target == 0.8)' "$work/json" >/dev/null ||
        fail "JSON targets of a run without --floor: $(jq -c .targets "$work/json")"
fi

# The text report without --floor: no row of a figure that was not
# measured (a value "-"), no floor or ratio column with nothing in it, no
# verdict in the latency rows (the targets table judges the idle runner's),
# and the rows against the main scenario have a header of their own.
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
    # The targets table: a header naming its columns, and rows each ending
    # in its bound and verdict, up to the blank line after it.
    sed -n '/^target  *value  *reference  *ratio  *target$/,/^$/p' "$work/text" >"$work/targets"
    [[ $(wc -l <"$work/targets") -ge 8 ]] ||
        fail "no targets table in the report: $(tail -20 "$work/text")"
    sed '1d;/^$/d' "$work/targets" | grep -vE " (>=|<=|<) [0-9.]+( ms| s| B)? +(ok|MISSED)$" \
        >"$work/bad" && fail "targets rows without a bound and verdict: $(cat "$work/bad")"
    grep -qE "^idle latency p99 +[0-9.]+ ms +- +- +<= 5 ms +(ok|MISSED)$" "$work/targets" ||
        fail "the idle latency p99 is not judged against 5 ms: $(cat "$work/targets")"
    grep -q "of the floor" "$work/targets" && fail "a floor target in a run without --floor"
fi

# --repeat 2: the whole run twice, each run's report, then the targets as
# ranges of the two runs, judged on the median (text), and the same in JSON.
if ! "$bench" "${small[@]}" --repeat 2 >"$work/rep" 2>"$work/err"; then
    fail "pqmq-bench --repeat 2 exited $?: $(tail -3 "$work/err")"
else
    [[ $(grep -c "^==== run [12] of 2$" "$work/rep") == 2 ]] ||
        fail "--repeat 2 did not print each run's report: $(grep '^====' "$work/rep")"
    grep -q "^pqmq-bench --repeat 2: .*range.*median" "$work/rep" ||
        grep -A2 "^pqmq-bench --repeat 2" "$work/rep" | grep -q median ||
        fail "the --repeat header does not say what the verdict is judged on"
    sed -n '/^target .*target  *median$/,$p' "$work/rep" | sed 1d | grep -vE \
        " (>=|<=|<) [0-9.]+( ms| s| B)? +[0-9.]+ (ok|MISSED)$" >"$work/bad" &&
        fail "--repeat rows without bound, median and verdict: $(cat "$work/bad")"
fi
if ! "$bench" "${small[@]}" --repeat 2 --json >"$work/repj" 2>"$work/err"; then
    fail "pqmq-bench --repeat 2 --json exited $?: $(tail -3 "$work/err")"
else
    jq -e '.parameters.repeat == 2 and (.targets | length >= 7) and all(.targets[]; .runs == 2
        and .value_min <= .value_max
        and (if .ratio_min == null then .value_min <= .judged and .judged <= .value_max
             else .ratio_min <= .judged and .judged <= .ratio_max end))' "$work/repj" >/dev/null ||
        fail "JSON of --repeat 2: $(head -c 600 "$work/repj")"
fi

# --steady, briefly: a burn-down rate, half of it offered, kept up and poll
# p99 judged.
if ! "$bench" "${small[@]}" --steady --duration 2 --json >"$work/steady" 2>"$work/err"; then
    fail "pqmq-bench --steady exited $?: $(tail -3 "$work/err")"
else
    jq -e '.load.burn_down_per_s > 0 and .parameters.steady
        and ((.load.offered_per_s - .load.burn_down_per_s / 2) | fabs) <= 1
        and .load.duration_s == 2
        and (.load.targets | map(.figure)) == ["kept up: backlog at the end, s of load",
            "poll call p99"]
        and .load.targets[1].target == 20' "$work/steady" >/dev/null ||
        fail "JSON of --steady: $(jq -c .load.targets,.load.burn_down_per_s "$work/steady")"
fi
if ! "$bench" "${small[@]}" --steady --duration 1 >"$work/steady" 2>"$work/err"; then
    fail "pqmq-bench --steady (text) exited $?: $(tail -3 "$work/err")"
else
    grep -qE "^pqmq-bench --steady: 400 queued messages burnt down at [0-9,]+ messages/s" \
        "$work/steady" || fail "--steady does not print its burn-down: $(head -2 "$work/steady")"
    burn=$(sed -n 's/.* burnt down at \([0-9,]*\) messages.*/\1/p' "$work/steady" | tr -d ,)
    offered=$(sed -n 's/^  offered half of it, \([0-9,]*\) messages.*/\1/p' "$work/steady" | tr -d ,)
    [[ -n $burn && -n $offered ]] && awk -v b="$burn" -v o="$offered" \
        'BEGIN { d = b / 2 - o; exit !(d <= 1 && d >= -1) }' ||
        fail "--steady offered '$offered' messages/s, not half of '$burn': $(head -2 "$work/steady")"
    grep -qE "^poll call p99 +[0-9.]+ ms +- +- +<= 20 ms +(ok|MISSED)$" "$work/steady" ||
        fail "--steady does not judge poll p99: $(cat "$work/steady")"
fi

# A held snapshot: offered, the backlog at the hold's end; saturated, the
# rate during the hold against before it.
if ! "$bench" "${small[@]}" --held-xmin 1 --rate 2000 --json >"$work/held" 2>"$work/err"; then
    fail "pqmq-bench --held-xmin --rate exited $?: $(tail -3 "$work/err")"
else
    jq -e '.load.targets | map(select(.figure == "backlog at the end of the hold, s of load"
        and .op == "<" and .target == 10)) | length == 1' "$work/held" >/dev/null ||
        fail "--held-xmin --rate targets: $(jq -c .load.targets "$work/held")"
fi
if ! "$bench" "${small[@]}" --held-xmin 1 --json >"$work/held" 2>"$work/err"; then
    fail "pqmq-bench --held-xmin exited $?: $(tail -3 "$work/err")"
else
    jq -e '.load.targets | map(.figure) == ["processed during the hold / before"]' \
        "$work/held" >/dev/null && jq -e '.load.targets[0] | .target == 0.5 and
        .reference_min > 0' "$work/held" >/dev/null ||
        fail "saturated --held-xmin targets: $(jq -c .load.targets "$work/held")"
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

# Modes that do not go together, and --repeat out of range.
for args in "--steady --rate 100" "--repeat 2 --steady" "--repeat 2 --rate 100" "--repeat 10"; do
    # shellcheck disable=SC2086  # the words are the options
    "$bench" --dsn "$PQMQ_TEST_DSN" $args >"$work/out" 2>"$work/err"
    rc=$?
    [[ $rc == 2 ]] || fail "$args exited $rc, want 2"
done

if ((failed)); then
    echo "$failed check(s) failed"
    exit 1
fi
echo "PASS: pqmq-bench end to end, --rounds, targets, --repeat, --steady"
