#!/usr/bin/env bash
# tests/faults/run-faults.sh BUILDDIR [SCENARIO...]: pqmq's fault suite.
#
# Proves the guarantees of README.md under faults, against a throwaway
# PostgreSQL of its own (tests/pgtmp.sh, in BUILDDIR; unix socket and
# 127.0.0.1 only), which it restarts with "pg_ctl restart -m immediate" and
# stops when it exits, however it exits. Scenarios (default: all, in order):
#
#   kill9-exactly-once  2 examples/exactly_once runners, SIGKILLed at random
#                       moments (PQMQ_FAULTS_KILLS times, default 30) while 2
#                       producers insert: nothing lost, chains in order, no
#                       duplicate effect at all.
#   kill9-plain         the same with tests/faults/plain_worker (effect in
#                       autocommit, then plain batched completion): nothing
#                       lost, chains in order; duplicates allowed only from a
#                       redelivery (attempt >= 2, one effect per attempt).
#   kill9-locked        the same with tests/faults/locked_worker (the locked
#                       lane, effects committed with the completion, and the
#                       lease lane for what a killed worker held): nothing
#                       lost, chains in order, no duplicate effect at all.
#   kill9-locked-runner the same with examples/exactly_once --locked (the
#                       runner's workers on the locked lane).
#   kill9-batched-runner the same with examples/exactly_once --batched (commit
#                       batches: a worker's jobs in one transaction, so a kill
#                       lands inside open batches): nothing lost, chains in
#                       order, no duplicate effect at all.
#   kill9-grouped-runner the same with examples/exactly_once --grouped (a group
#                       handler: a worker's queued jobs in one savepoint and
#                       one INSERT).
#   restart             pg_ctl restart -m immediate (PQMQ_FAULTS_RESTARTS,
#                       default 6) while 3 producers insert and 2
#                       exactly_once runners poll and complete: every
#                       acknowledged insert survives and is processed once;
#                       producers and runners recover by themselves.
#   restart-locked      the same with examples/exactly_once --locked.
#   terminate           pg_terminate_backend of producer, worker and listener
#                       connections, found by application_name
#                       (PQMQ_FAULTS_TERMINATIONS, default 40), with
#                       plain_worker runners.
#   timeouts            tests/faults/timeouts (each call under
#                       lock_timeout / statement_timeout: SQLSTATE 55P03 /
#                       57014, nothing half-written, nothing left claimed),
#                       then producers and runners with low timeouts while
#                       locks come and go; a normal runner then drains all.
#   worker-reconnect-refused  a worker that cannot reconnect for 6 s (its
#                       role's connection limit is taken) must back off, not
#                       flood the server, and hold no job; all is processed.
#
# Producers (tests/faults/producer) write every message the server
# acknowledged to a file; a batch whose outcome is unknown (connection lost
# during the call) is recorded apart and must be all there or not at all; a
# refused batch must not be there at all. Each scenario prints one line:
#   RESULT name: inserted N, delivered N, lost N, duplicated N (unexplained
#   N), out-of-order N, ... and the faults it injected
# and fails on any loss, order violation, unexplained duplicate, leftover
# row, half-written batch, or too few injected faults. The last line is
# "N passed, M failed" (scenarios); the exit status is 1 when one failed.
#
# Programs: BUILDDIR/tests/faults/{producer,plain_worker,timeouts} and
# BUILDDIR/examples/exactly_once (PQMQ_FAULTS_BINDIR and
# PQMQ_FAULTS_EXACTLY_ONCE override). Logs: BUILDDIR/tests/faults-logs/.
# Needs psql. PQMQ_PG_BINDIR, PGTMP_KEEP: see tests/pgtmp.sh.
#
# More knobs: PQMQ_FAULTS_BATCH and PQMQ_FAULTS_INTERVAL_MS (producers'
# batch size and pause, default 10 and 40), PQMQ_FAULTS_BACKLOG_SECONDS
# (head start of the producers in the kill scenarios, default 2),
# PQMQ_FAULTS_DRAIN_SECONDS (default 90), PQMQ_FAULTS_STRICT=1 (see
# misreported_text), and PQMQ_FAULTS_SABOTAGE=SQL, run on the scenario's
# schema just before its checks, to see that they can fail, e.g.
#   PQMQ_FAULTS_SABOTAGE="DELETE FROM fault_effects WHERE n = 1" \
#       run-faults.sh BUILDDIR kill9-plain     (then: lost 1, FAIL)

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/pgtmp.sh
. "$here/../pgtmp.sh"

if (( $# < 1 )) || [[ ! -d $1 ]]; then
    echo "usage: $0 BUILDDIR [SCENARIO...]" >&2
    exit 2
fi
build=$(cd "$1" && pwd)
shift
bindir=${PQMQ_FAULTS_BINDIR:-$build/tests/faults}
eo_bin=${PQMQ_FAULTS_EXACTLY_ONCE:-$build/examples/exactly_once}
producer_bin=$bindir/producer
plain_bin=$bindir/plain_worker
locked_bin=$bindir/locked_worker
timeouts_bin=$bindir/timeouts
kills_wanted=${PQMQ_FAULTS_KILLS:-30}
restarts_wanted=${PQMQ_FAULTS_RESTARTS:-6}
terms_wanted=${PQMQ_FAULTS_TERMINATIONS:-40}
drain_limit=${PQMQ_FAULTS_DRAIN_SECONDS:-90}

all_scenarios=(kill9-exactly-once kill9-plain kill9-locked kill9-locked-runner kill9-batched-runner kill9-grouped-runner restart restart-locked terminate timeouts worker-reconnect-refused)
if (( $# )); then scenarios=("$@"); else scenarios=("${all_scenarios[@]}"); fi

logdir=$build/tests/faults-logs
rm -rf "$logdir"
mkdir -p "$logdir" || exit 1

for b in "$producer_bin" "$plain_bin" "$timeouts_bin" "$eo_bin"; do
    if [[ ! -x $b ]]; then
        echo "run-faults.sh: missing program $b (build it first: make check-faults)" >&2
        echo "0 passed, ${#scenarios[@]} failed"
        exit 1
    fi
done
if ! command -v psql >/dev/null 2>&1; then
    echo "run-faults.sh: psql not found (Debian package: postgresql-client)" >&2
    echo "0 passed, ${#scenarios[@]} failed"
    exit 1
fi

# ---- processes -------------------------------------------------------------
# Every background process this script starts is in live_pids until it has
# been reaped; the EXIT trap kills what is left (by pid, nothing else).

declare -A live_pids=()
last_pid=

# start_bg LOG CMD...: starts CMD in the background, output appended to LOG;
# sets last_pid. (Not from $(...): the process must be this shell's child.)
start_bg() {
    local log=$1
    shift
    "$@" </dev/null >>"$log" 2>&1 &
    last_pid=$!
    live_pids[$last_pid]=1
}

# reap PID: waits for it; sets reaped_rc.
reap() {
    wait "$1" 2>/dev/null
    reaped_rc=$?
    unset "live_pids[$1]"
}

kill9() {
    kill -KILL "$1" 2>/dev/null
    reap "$1"
}

# stop_gracefully PID WHAT: SIGTERM, then expects exit 0 within 30 s.
stop_gracefully() {
    local pid=$1 what=$2 deadline=$((SECONDS + 30))
    kill -TERM "$pid" 2>/dev/null
    while kill -0 "$pid" 2>/dev/null && (( SECONDS < deadline )); do
        sleep 0.05
    done
    if kill -0 "$pid" 2>/dev/null; then
        note "$what (pid $pid) did not stop within 30 s of SIGTERM"
        kill9 "$pid"
        return 1
    fi
    reap "$pid"
    if (( reaped_rc != 0 )); then
        note "$what (pid $pid) exited with status $reaped_rc after SIGTERM"
        return 1
    fi
    return 0
}

kill_all() {
    local pid
    for pid in "${!live_pids[@]}"; do
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        unset "live_pids[$pid]"
    done
}

on_exit() {
    local rc=$?
    trap - EXIT INT TERM HUP
    kill_all
    pgtmp_finish "$logdir"
    exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# ---- output ----------------------------------------------------------------

t_start=$SECONDS
problems=()

say() { printf '[%3ds] %s\n' $((SECONDS - t_start)) "$*"; }

# A reason for the current scenario to fail (printed now, counted at the end).
note() {
    say "  PROBLEM: $*"
    problems+=("$*")
}

# random_sleep MIN_MS MAX_MS
random_sleep() {
    local ms=$(($1 + RANDOM % ($2 - $1 + 1)))
    sleep "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
}

# ---- the server ------------------------------------------------------------

# Durability is PostgreSQL's default (fsync, synchronous_commit on): an
# acknowledged commit survives the immediate shutdown.
PGTMP_CONF="max_connections = 300
log_min_messages = warning
log_connections = off
log_disconnections = off"
if ! pgtmp_start "$build"; then
    echo "run-faults.sh: cannot start a throwaway PostgreSQL (see above)" >&2
    echo "0 passed, ${#scenarios[@]} failed"
    exit 1
fi
say "started a throwaway PostgreSQL: $PGTMP_DSN"
base_dsn=$PGTMP_DSN

# pg_ctl restart -m immediate: every backend dies at once, the server runs
# crash recovery and accepts connections again. Returns when it is up.
restart_server() {
    pgtmp_run "$PGTMP_BINDIR/pg_ctl" -D "$PGTMP_DIR/data" -l "$PGTMP_LOG" -w -t 60 \
        -m immediate restart >>"$logdir/pg_ctl.log" 2>&1
}

# ---- SQL -------------------------------------------------------------------

conninfo=   # the current scenario's: its own schema on the search_path

# sql SQL: the result (unaligned, tuples only) on the scenario's schema.
sql() {
    psql -X -q -At -v ON_ERROR_STOP=1 -d "$conninfo" -c "$1" 2>>"$logdir/psql.err"
}

# wait_for SQL SECONDS: until SQL returns "t"; 1 on timeout.
wait_for() {
    local deadline=$((SECONDS + $2))
    while (( SECONDS < deadline )); do
        [[ $(sql "$1" 2>/dev/null) == t ]] && return 0
        sleep 0.2
    done
    return 1
}

# new_schema NAME: a fresh schema with the queue, fault_effects, fault_sent
# and the observer; sets conninfo.
new_schema() {
    local schema=$1
    psql -X -q -v ON_ERROR_STOP=1 -d "$base_dsn" -c "SET client_min_messages = warning" \
        -c "DROP SCHEMA IF EXISTS $schema CASCADE" -c "CREATE SCHEMA $schema" \
        >/dev/null 2>>"$logdir/psql.err" || { note "cannot create schema $schema"; return 1; }
    conninfo="$base_dsn options='-c search_path=$schema -c client_min_messages=warning'"
    "$plain_bin" "$conninfo" --setup >>"$logdir/setup.log" 2>&1 \
        || { note "plain_worker --setup failed (see $logdir/setup.log)"; return 1; }
    sql "CREATE TABLE fault_sent (kind text NOT NULL, producer int NOT NULL,
                                  batch int NOT NULL, id uuid NOT NULL, seq bigint NOT NULL,
                                  channel text NOT NULL, ordered text NOT NULL,
                                  why text NOT NULL)" \
        || { note "cannot create fault_sent"; return 1; }
    # An observer (test schema only): the attempt on which each message was
    # completed, to show that the faults hit messages in flight. A
    # completion deletes a message of mq_rows, or adds an mq_done row naming
    # the places of logged ones (their attempt: 1 when leased, 0 when held
    # by the locked lane, as mq_msgs shows them).
    sql "CREATE TABLE fault_completed (id uuid NOT NULL, deliveries int NOT NULL);
         CREATE FUNCTION fault_observe() RETURNS trigger LANGUAGE plpgsql AS
           'BEGIN INSERT INTO fault_completed SELECT id, deliveries FROM gone; RETURN NULL; END';
         CREATE TRIGGER fault_observe AFTER DELETE ON mq_rows REFERENCING OLD TABLE AS gone
           FOR EACH STATEMENT EXECUTE FUNCTION fault_observe();
         CREATE FUNCTION fault_observe_done() RETURNS trigger LANGUAGE plpgsql AS
           'BEGIN
              INSERT INTO fault_completed
              SELECT l.id, CASE WHEN r.lane = 1 THEN 0 ELSE 1 END
              FROM added d
              JOIN mq_receipts r ON r.channel_key = d.channel_key AND r.lo = d.lo
              JOIN mq_log l ON l.channel_key = d.channel_key AND l.place = ANY (d.places);
              RETURN NULL;
            END';
         CREATE TRIGGER fault_observe_done AFTER INSERT ON mq_done REFERENCING NEW TABLE AS added
           FOR EACH STATEMENT EXECUTE FUNCTION fault_observe_done()" \
        || { note "cannot create the observer trigger"; return 1; }
}

# The example creates its ledger when it starts: once, alone, before the
# runners that race each other.
create_ledger() {
    start_bg "$logdir/$scenario.eo.log" "$eo_bin" "$conninfo"
    local pid=$last_pid
    wait_for "SELECT to_regclass('example_ledger') IS NOT NULL" 20 \
        || { note "exactly_once did not create example_ledger"; kill9 "$pid"; return 1; }
    stop_gracefully "$pid" "exactly_once (setup)"
}

# ---- producers and runners -------------------------------------------------

producer_pids=()
runner_pids=()

# start_producer I CONNINFO_EXTRA [OPTION...]: producer I (its files are
# $scenario.{acked,doubt,rejected}I) with the scenario's conninfo plus
# CONNINFO_EXTRA; OPTIONs go to the producer after the defaults.
start_producer() {
    local i=$1 extra=$2
    shift 2
    start_bg "$logdir/$scenario.producer$i.log" "$producer_bin" "$conninfo $extra" "$i" \
        "$logdir/$scenario.acked$i" --doubt "$logdir/$scenario.doubt$i" \
        --rejected "$logdir/$scenario.rejected$i" --hot fhot \
        --batch "${PQMQ_FAULTS_BATCH:-10}" --interval "${PQMQ_FAULTS_INTERVAL_MS:-40}" "$@"
    producer_pids+=("$last_pid")
}

# start_producers N: N producers, application_name fault_producer.
start_producers() {
    local i
    producer_pids=()
    for ((i = 0; i < $1; i++)); do
        start_producer "$i" application_name=fault_producer
    done
}

stop_producers() {
    local i ok=0
    for i in "${!producer_pids[@]}"; do
        stop_gracefully "${producer_pids[$i]}" "producer $i" || ok=1
        tail -n 1 "$logdir/$scenario.producer$i.log" | sed 's/^/  /'
    done
    producer_pids=()
    return $ok
}

# start_runner KIND CONNINFO_EXTRA: KIND eo (examples/exactly_once),
# eolocked (the same, --locked), eobatched (the same, --batched), eogrouped
# (the same, --grouped), locked
# (tests/faults/locked_worker) or plain.
start_runner() {
    local kind=$1 extra=$2
    if [[ $kind == eo ]]; then
        start_bg "$logdir/$scenario.eo.log" "$eo_bin" "$conninfo $extra"
    elif [[ $kind == locked ]]; then
        start_bg "$logdir/$scenario.locked.log" "$locked_bin" "$conninfo $extra"
    elif [[ $kind == eolocked ]]; then
        start_bg "$logdir/$scenario.eo.log" "$eo_bin" "$conninfo $extra" --locked
    elif [[ $kind == eobatched ]]; then
        start_bg "$logdir/$scenario.eo.log" "$eo_bin" "$conninfo $extra" --batched
    elif [[ $kind == eogrouped ]]; then
        start_bg "$logdir/$scenario.eo.log" "$eo_bin" "$conninfo $extra" --grouped
    else
        start_bg "$logdir/$scenario.plain.log" "$plain_bin" "$conninfo $extra" \
            --worker-name fault_worker
    fi
}

stop_runners() {
    local i ok=0
    for i in "${!runner_pids[@]}"; do
        stop_gracefully "${runner_pids[$i]}" "runner $i" || ok=1
    done
    runner_pids=()
    return $ok
}

# Waits until nothing is left to deliver (dead letters aside).
drain() {
    local t0=$SECONDS
    if ! wait_for "SELECT NOT EXISTS (SELECT 1 FROM mq_msgs WHERE dead_since IS NULL)" \
            "$drain_limit"; then
        note "not drained after ${drain_limit}s: $(sql "SELECT count(*) FROM mq_msgs") messages left"
        return 1
    fi
    say "  drained in $((SECONDS - t0))s"
}

# ---- checks ----------------------------------------------------------------

# Lost connections that pqmq reported as PQMQ_ESERVER with no SQLSTATE
# instead of PQMQ_ECONN (libpq 15 hands back "server closed the connection
# unexpectedly" while PQstatus still says CONNECTION_OK). The producers
# treat them as lost connections; they are counted, and fail the scenario
# (PQMQ_FAULTS_STRICT=0 only warns).
misreported_text() {
    local n
    n=$(grep -ho 'misreported [0-9]*' "$logdir/$scenario.producer"*.log 2>/dev/null |
        awk '{ s += $2 } END { print s + 0 }')
    (( n > 0 )) || return 0
    faults_text+=", lost connections misreported as ESERVER without SQLSTATE $n"
    if [[ ${PQMQ_FAULTS_STRICT:-1} == 1 ]]; then
        note "$n lost connections were reported as PQMQ_ESERVER, not PQMQ_ECONN"
    else
        say "  KNOWN ISSUE: $n lost connections were reported as PQMQ_ESERVER without SQLSTATE, not PQMQ_ECONN (PQMQ_FAULTS_STRICT=1 fails on it)"
    fi
}

# Loads what the producers wrote into fault_sent (kind acked/doubt/rejected).
load_sent() {
    local f kind i all=$logdir/$scenario.sent.tsv
    : >"$all"
    for kind in acked doubt rejected; do
        for f in "$logdir/$scenario.$kind"*; do
            [[ -f $f ]] || continue
            i=${f##*"$kind"}
            awk -v k="$kind" -v p="$i" 'NF == 6 { print k "\t" p "\t" $0 }' "$f" >>"$all"
        done
    done
    sql "\\copy fault_sent FROM '$all'" || { note "cannot load $all"; return 1; }
}

# check FX_KIND: counts and verdict of the current scenario. FX_KIND eo (the
# example's ledger, one row per message by its primary key; order by
# done_at) or plain (fault_effects; order by its serial n). Prints the
# RESULT line; the faults done are in $faults_text.
check() {
    local fx
    if [[ $1 != plain ]]; then
        fx="SELECT msg_id, 0 AS attempt,
                   extract(epoch FROM done_at)::numeric * 1000000 AS ord FROM example_ledger"
    else
        fx="SELECT msg_id, attempt, n::numeric AS ord FROM fault_effects"
    fi
    sql "CREATE OR REPLACE VIEW fx AS $fx" || { note "cannot create view fx"; return 1; }
    load_sent || return 1
    if [[ -n ${PQMQ_FAULTS_SABOTAGE:-} ]]; then
        say "  sabotage: $PQMQ_FAULTS_SABOTAGE"
        sql "$PQMQ_FAULTS_SABOTAGE" >/dev/null || note "the sabotage SQL failed"
    fi

    # Redelivered: delivered more than once; the locked lane counts no
    # delivery, so there one leased delivery is a redelivery.
    local again=1
    [[ $1 == locked || $1 == eolocked ]] && again=0
    local r
    r=$(sql "WITH acked AS (SELECT DISTINCT id FROM fault_sent WHERE kind = 'acked'),
                  per_msg AS (SELECT msg_id, count(*) AS n FROM fx GROUP BY msg_id),
                  per_attempt AS (SELECT msg_id, attempt, count(*) AS n FROM fx
                                  GROUP BY msg_id, attempt),
                  doubt AS (SELECT s.producer, s.batch, count(*) AS n,
                                   count(f.msg_id) + count(q.id) AS present,
                                   bool_or(s.why = 'e') AS misreported
                            FROM fault_sent s
                            LEFT JOIN per_msg f ON f.msg_id = s.id
                            LEFT JOIN mq_msgs q ON q.id = s.id
                            WHERE s.kind = 'doubt' GROUP BY 1, 2)
             SELECT (SELECT count(*) FROM acked),
                    (SELECT count(*) FROM acked a JOIN per_msg f ON f.msg_id = a.id),
                    (SELECT count(*) FROM acked a
                     WHERE NOT EXISTS (SELECT 1 FROM per_msg f WHERE f.msg_id = a.id)),
                    (SELECT coalesce(sum(n - 1), 0) FROM per_msg),
                    (SELECT count(*) FROM per_msg WHERE n > 1),
                    (SELECT coalesce(sum(n - 1), 0) FROM per_attempt)
                    + (SELECT count(*) FROM per_msg f JOIN fault_completed c ON c.id = f.msg_id
                       WHERE f.n > 1 AND c.deliveries < 2)
                    + (SELECT count(*) FROM (SELECT msg_id, max(attempt) AS a FROM fx
                                             GROUP BY 1) f
                       JOIN fault_completed c ON c.id = f.msg_id WHERE f.a > c.deliveries),
                    (SELECT count(*) FROM per_msg f
                     WHERE NOT EXISTS (SELECT 1 FROM fault_sent s
                                       WHERE s.id = f.msg_id AND s.kind <> 'rejected')),
                    (SELECT count(*) FROM fault_sent s WHERE s.kind = 'rejected'),
                    (SELECT count(*) FROM fault_sent s WHERE s.kind = 'rejected'
                       AND (EXISTS (SELECT 1 FROM per_msg f WHERE f.msg_id = s.id)
                            OR EXISTS (SELECT 1 FROM mq_msgs q WHERE q.id = s.id)
                            OR EXISTS (SELECT 1 FROM mq_payloads p WHERE p.id = s.id))),
                    (SELECT coalesce(sum(n), 0) FROM doubt),
                    (SELECT coalesce(sum(present), 0) FROM doubt),
                    (SELECT count(*) FROM doubt WHERE present <> 0 AND present <> n),
                    (SELECT count(*) FROM doubt WHERE present > 0 AND misreported),
                    (SELECT count(*) FROM mq_msgs),
                    (SELECT count(*) FROM mq_msgs WHERE dead_since IS NOT NULL),
                    (SELECT count(*) FROM mq_payloads) + (SELECT count(*) FROM mq_chains),
                    (SELECT count(DISTINCT (channel, producer)) FROM fault_sent
                     WHERE ordered <> 'f' AND kind = 'acked'),
                    (SELECT count(*) FROM fault_completed WHERE deliveries > $again)" | tr '|' ' ') \
        || { note "the checking query failed (see $logdir/psql.err)"; return 1; }
    local inserted delivered lost dups dup_msgs unexplained ghosts rejected rej_present
    local doubt doubt_present doubt_partial doubt_misreported left dead cold chains
    redelivered=0
    read -r inserted delivered lost dups dup_msgs unexplained ghosts rejected rej_present \
        doubt doubt_present doubt_partial doubt_misreported left dead cold chains \
        redelivered <<<"$r"

    # Order: on each chain (per producer: its messages keep its insertion
    # order, seq), every effect of a message comes after every effect of
    # its predecessor.
    local disorder
    disorder=$(sql "WITH m AS (
                      SELECT s.channel, s.producer, s.seq, min(f.ord) AS first, max(f.ord) AS last
                      FROM fault_sent s JOIN fx f ON f.msg_id = s.id
                      WHERE s.kind <> 'rejected' AND s.ordered <> 'f'
                      GROUP BY 1, 2, 3),
                    o AS (SELECT first, lag(last) OVER (PARTITION BY channel, producer
                                                        ORDER BY seq) AS prev_last FROM m)
                    SELECT count(*) FROM o WHERE prev_last >= first") \
        || { note "the order query failed"; return 1; }

    say "RESULT $scenario: inserted $inserted, delivered $delivered, lost $lost," \
        "duplicated $dups on $dup_msgs messages (unexplained $unexplained)," \
        "redelivered $redelivered," \
        "out-of-order $disorder on $chains chains; in doubt $doubt (present $doubt_present," \
        "half-written batches $doubt_partial), rejected $rejected (present $rej_present)," \
        "left $left (dead $dead); $faults_text"

    (( inserted > 0 )) || note "nothing was inserted"
    (( lost == 0 )) || note "$lost acknowledged messages were never processed"
    (( disorder == 0 )) || note "$disorder ordered messages took effect before their predecessor"
    (( unexplained == 0 )) || note "$unexplained unexplained duplicates (two effects of one attempt, duplicates of a message delivered once, or attempts the queue never made)"
    if [[ $1 != plain ]]; then
        (( dups == 0 )) || note "$dups duplicate effects with transactional completion"
    fi
    (( ghosts == 0 )) || note "$ghosts effects of messages no producer sent"
    (( rej_present == 0 )) || note "$rej_present messages of refused batches exist"
    (( doubt_partial == 0 )) || note "$doubt_partial batches of unknown outcome are half there"
    if (( doubt_misreported > 0 )); then
        say "  KNOWN ISSUE: $doubt_misreported batches whose pqmq_insert returned PQMQ_ESERVER (no SQLSTATE: a lost connection) were committed all the same"
        [[ ${PQMQ_FAULTS_STRICT:-1} == 1 ]] &&
            note "$doubt_misreported batches reported as refused (PQMQ_ESERVER) were committed"
    fi
    (( left == 0 )) || note "$left messages left in the queue ($dead dead)"
    (( cold == 0 )) || note "$cold rows left in mq_payloads/mq_chains"
    (( delivered + lost == inserted )) || note "counts do not add up"
    return 0
}

# ---- scenarios -------------------------------------------------------------

# kill9 KIND: runners of KIND (eo or plain), two at a time, SIGKILLed at
# random moments while 2 producers insert.
scenario_kill9() {
    local kind=$1 kills=0 i victim
    new_schema "f_$kind" || return
    if [[ $kind != plain ]]; then create_ledger || return; fi
    start_producers 2
    # A backlog first, so that the runners are busy when they are killed.
    sleep "${PQMQ_FAULTS_BACKLOG_SECONDS:-2}"
    runner_pids=()
    for i in 0 1; do
        start_runner "$kind" "application_name=fault_runner"
        runner_pids+=("$last_pid")
    done
    for ((i = 0; i < kills_wanted; i++)); do
        random_sleep 150 650
        victim=$((RANDOM % 2))
        if ! kill -0 "${runner_pids[$victim]}" 2>/dev/null; then
            reap "${runner_pids[$victim]}"
            note "runner $victim died on its own (status $reaped_rc)"
        else
            kill9 "${runner_pids[$victim]}"
            kills=$((kills + 1))
        fi
        start_runner "$kind" "application_name=fault_runner"
        runner_pids[victim]=$last_pid
    done
    say "  $kills runners killed with SIGKILL; ledger/effects so far: $(sql "SELECT count(*) FROM $([[ $kind == plain ]] && echo fault_effects || echo example_ledger)")"
    stop_producers || note "a producer failed"
    drain
    stop_runners || note "a runner did not stop cleanly"
    faults_text="kills $kills"
    check "$kind"
    (( kills >= kills_wanted )) || note "only $kills kills"
    (( redelivered > 0 )) || note "no kill hit a message in flight (nothing was redelivered)"
}

# restart: the server restarts (immediate) under load; producers and
# runners reconnect by themselves.
scenario_restart() {
    local kind=$1 restarts=0 i acked_before acked_after t_last
    new_schema "f_restart_$kind" || return
    create_ledger || return
    start_producers 2
    # A third one inserts small batches almost back to back, so that some
    # restarts catch an insert in the middle (outcome unknown).
    start_producer 2 application_name=fault_producer --batch 3 --interval 3
    runner_pids=()
    for i in 0 1; do
        start_runner "$kind" "application_name=fault_runner"
        runner_pids+=("$last_pid")
    done
    for ((i = 0; i < restarts_wanted; i++)); do
        random_sleep 1000 2500
        if restart_server; then
            restarts=$((restarts + 1))
        else
            note "pg_ctl restart failed (see $logdir/pg_ctl.log)"
        fi
    done
    t_last=$(sql "SELECT now()")
    acked_before=$(cat "$logdir/$scenario.acked"* | wc -l)
    sleep 3
    acked_after=$(cat "$logdir/$scenario.acked"* | wc -l)
    say "  $restarts immediate restarts; acknowledged messages at the last one: $acked_before, 3 s later: $acked_after"
    (( acked_after > acked_before )) || note "producers did not carry on after the last restart"
    for i in 0 1; do
        kill -0 "${runner_pids[$i]}" 2>/dev/null || note "runner $i died"
    done
    stop_producers || note "a producer failed"
    drain
    local recent
    recent=$(sql "SELECT count(*) FROM example_ledger WHERE done_at > '$t_last'")
    (( recent > 0 )) || note "no message was processed after the last restart"
    stop_runners || note "a runner did not stop cleanly"
    grep -h 'stopped' "$logdir/$scenario.eo.log" | tail -n 2 | sed 's/^/  /'
    faults_text="restarts $restarts"
    misreported_text
    check "$kind"
    (( restarts >= restarts_wanted )) || note "only $restarts restarts"
    grep -q 'reconnects [1-9]' "$logdir/$scenario.producer"*.log \
        || note "no producer reconnected"
}

# terminate: pg_terminate_backend of producer, worker and listener
# connections, chosen by application_name (and, for the runner's listening
# control connection, by what it runs).
scenario_terminate() {
    local i kind n=0 tries=0
    local -A done_by=([producer]=0 [worker]=0 [listener]=0)
    local -A where=(
        [producer]="application_name = 'fault_producer'"
        [worker]="application_name = 'fault_worker'"
        [listener]="application_name = 'fault_runner' AND query <> ''")
    local kinds=(producer worker listener)
    new_schema f_terminate || return
    start_producers 2
    start_producer 2 application_name=fault_producer --batch 3 --interval 3
    runner_pids=()
    for i in 0 1; do
        start_runner plain "application_name=fault_runner"
        runner_pids+=("$last_pid")
    done
    sleep 0.5
    while (( n < terms_wanted && tries < 6 * terms_wanted )); do
        tries=$((tries + 1))
        kind=${kinds[$((tries % 3))]}
        random_sleep 100 350
        if [[ $(sql "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE ${where[$kind]} AND datname = current_database()
                       AND pid <> pg_backend_pid()
                     ORDER BY random() LIMIT 1") == t ]]; then
            n=$((n + 1))
            done_by[$kind]=$((done_by[$kind] + 1))
        fi
    done
    say "  terminated $n backends: ${done_by[producer]} producer, ${done_by[worker]} worker, ${done_by[listener]} listener"
    sleep 1
    for i in 0 1; do
        kill -0 "${runner_pids[$i]}" 2>/dev/null || note "runner $i died"
    done
    stop_producers || note "a producer failed"
    drain
    stop_runners || note "a runner did not stop cleanly"
    grep -h 'stopped' "$logdir/$scenario.plain.log" | sed 's/^/  /'
    faults_text="terminations $n (producer ${done_by[producer]}, worker ${done_by[worker]}, listener ${done_by[listener]})"
    misreported_text
    check plain
    (( n >= terms_wanted )) || note "only $n terminations"
    for kind in "${kinds[@]}"; do
        (( done_by[$kind] >= 3 )) || note "only ${done_by[$kind]} $kind terminations"
    done
}

# blocker_loop STOPFILE: takes and holds locks, one after the other, until
# STOPFILE exists; then writes how many to STOPFILE.count (failures to
# STOPFILE.err). Runs in a background subshell.
blocker_loop() {
    local stopfile=$1 locks=0 rc
    while [[ ! -e $stopfile ]]; do
        random_sleep 100 300
        case $((locks % 3)) in
            0) sql "SELECT pg_advisory_lock(hashtext('fhot'), hashtext(''));
                    SELECT pg_sleep(0.5)" >/dev/null ;;
            1) sql "BEGIN; LOCK TABLE mq_msgs, mq_payloads IN ACCESS EXCLUSIVE MODE;
                    SELECT pg_sleep(0.4); COMMIT" >/dev/null ;;
            2) sql "BEGIN; SELECT count(*) FROM (SELECT 1 FROM mq_msgs WHERE deliveries > 0
                                                 FOR UPDATE SKIP LOCKED) s;
                    SELECT pg_sleep(0.5); COMMIT" >/dev/null ;;
        esac
        rc=$?
        (( rc == 0 )) || echo "lock $locks failed (psql status $rc)" >>"$stopfile.err"
        locks=$((locks + 1))
    done
    echo "$locks" >"$stopfile.count"
}

# timeouts: the C checks, then load under low timeouts with locks coming
# and going, then a normal runner drains.
scenario_timeouts() {
    local i calls_log=$logdir/$scenario.calls.log
    new_schema f_timeouts_calls || return
    if "$timeouts_bin" "$conninfo" >"$calls_log" 2>&1; then
        say "  $(tail -n 1 "$calls_log")"
        grep '^ok' "$calls_log" | grep -E 'SQLSTATE' | sed 's/^/  /' | head -n 8
    else
        sed 's/^/  /' "$calls_log"
        note "tests/faults/timeouts failed"
    fi

    new_schema f_timeouts || return
    # Producer 0 under lock_timeout, producer 1 under statement_timeout; the
    # runners under both.
    producer_pids=()
    start_producer 0 \
        "application_name=fault_producer options='-c search_path=f_timeouts -c lock_timeout=100ms'"
    start_producer 1 \
        "application_name=fault_producer options='-c search_path=f_timeouts -c statement_timeout=150ms'"
    runner_pids=()
    for i in 0 1; do
        start_runner plain "application_name=fault_runner options='-c search_path=f_timeouts -c lock_timeout=100ms -c statement_timeout=200ms'"
        runner_pids+=("$last_pid")
    done
    # The locks, in a background loop: a chain's advisory lock (inserts and
    # completions on it wait), both tables locked (everything waits), row
    # locks on claimed messages (their completion and failure wait). It
    # keeps going while the low-timeout runners stop, so that some of their
    # last completions fail too.
    local stopfile=$logdir/$scenario.blocker.stop blocker
    blocker_loop "$stopfile" &
    blocker=$!
    live_pids[$blocker]=1
    sleep 10
    # The runners stop first (locks still coming and going, producers still
    # inserting): what they leave behind is for the normal runner below.
    stop_runners || note "a low-timeout runner did not stop cleanly"
    grep -h 'stopped' "$logdir/$scenario.plain.log" | sed 's/^/  /'
    sleep 1
    stop_producers || note "a producer failed"
    local st57014 st55P03
    st57014=$(grep -ho '57014:[0-9]*' "$logdir/$scenario.producer"*.log | head -n 1)
    st55P03=$(grep -ho '55P03:[0-9]*' "$logdir/$scenario.producer"*.log | head -n 1)
    [[ -n $st57014 ]] || note "no insert was refused with SQLSTATE 57014"
    [[ -n $st55P03 ]] || note "no insert was refused with SQLSTATE 55P03"
    grep -h 'refused' "$logdir/$scenario.producer"*.log | sed 's/^/  /'
    touch "$stopfile"
    reap "$blocker"
    local locks
    locks=$(cat "$stopfile.count" 2>/dev/null || echo 0)
    [[ -s $stopfile.err ]] && note "a blocker statement failed: $(head -n 1 "$stopfile.err")"
    # A normal runner (no timeouts) must now find everything claimable.
    local left_before claimed
    left_before=$(sql "SELECT count(*) FROM mq_msgs")
    claimed=$(sql "SELECT count(*) FROM mq_msgs WHERE deliveries > 0")
    start_runner plain "application_name=fault_runner"
    runner_pids=("$last_pid")
    say "  held $locks locks; a normal runner drains the $left_before messages left ($claimed of them delivered before, not completed)"
    drain
    stop_runners || note "the normal runner did not stop cleanly"
    faults_text="locks held $locks, refused inserts by sqlstate ${st57014:-57014:0} ${st55P03:-55P03:0}"
    check plain
}

# worker-reconnect-refused: a worker whose
# backend is terminated cannot reconnect for a while (its role's connection
# limit is taken), while the runner's control connection keeps working. The
# worker must retry with a backoff (not flood the server with connection
# attempts) and take no job meanwhile; the other workers run them, and once
# it can connect again it works as before. Then every worker is cut off: the
# runner hands back what it claimed, and a second runner runs it.
scenario_refused() {
    local role=fault_limited i attempts before after
    new_schema f_refused || return
    psql -X -q -v ON_ERROR_STOP=1 -d "$base_dsn" \
        -c "DROP ROLE IF EXISTS $role" \
        -c "CREATE ROLE $role LOGIN CONNECTION LIMIT 5" \
        -c "GRANT ALL ON f_refused.fault_effects TO $role" \
        -c "GRANT ALL ON ALL SEQUENCES IN SCHEMA f_refused TO $role" \
        -c "SET search_path = f_refused" \
        -c "SELECT mq_grant('consume', '$role')" \
        >/dev/null 2>>"$logdir/psql.err" || { note "cannot create role $role"; return; }
    local limited="user=$role application_name=fault_runner"
    # ctl + 4 workers = the role's 5 connections.
    start_runner plain "$limited"
    runner_pids=("$last_pid")
    producer_pids=()
    start_producer 0 application_name=fault_producer --max 40 --unordered 100
    reap "${producer_pids[0]}"
    producer_pids=()
    wait_for "SELECT NOT EXISTS (SELECT 1 FROM mq_msgs)
              AND (SELECT count(*) FROM pg_stat_activity
                   WHERE application_name = 'fault_worker') = 4" 20 \
        || { note "the runner did not start its 4 workers"; return; }
    sql "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE application_name = 'fault_worker' LIMIT 1" >/dev/null
    wait_for "SELECT count(*) = 4 FROM pg_stat_activity WHERE usename = '$role'" 10 \
        || { note "the terminated backend did not go away"; return; }
    # Take the freed slot for 6 seconds.
    start_bg "$logdir/$scenario.holder.log" psql -X -q -d "$base_dsn user=$role" \
        -c "SELECT pg_sleep(6)"
    local holder=$last_pid
    wait_for "SELECT count(*) = 5 FROM pg_stat_activity WHERE usename = '$role'" 10 \
        || { note "the holder did not connect"; return; }
    before=$(grep -c "too many connections for role" "$PGTMP_LOG")
    start_producer 1 application_name=fault_producer --max 100 --unordered 100
    reap "${producer_pids[0]}"
    producer_pids=()
    sleep 5
    after=$(grep -c "too many connections for role" "$PGTMP_LOG")
    attempts=$((after - before))
    local stuck
    stuck=$(sql "SELECT count(*) FROM mq_msgs WHERE deliveries > 0")
    say "  the worker tried to reconnect $attempts times in 5 s; $stuck messages held meanwhile"
    # Backoff from 100 ms doubling to 2 s allows about 8 attempts in 5 s.
    (( attempts <= 12 )) || note "the worker retried its connection $attempts times in 5 s (no backoff)"
    # The healthy workers ran everything; the cut-off one took no job.
    (( stuck == 0 )) || note "$stuck messages were held while a worker could not connect"
    reap "$holder"
    drain
    # Every worker connected and named again (a worker names its session on
    # its first job after connecting): feed jobs until all four have had one.
    wait_for "SELECT count(*) = 5 FROM pg_stat_activity WHERE usename = '$role'" 10 \
        || { note "the cut-off worker did not reconnect"; return; }
    for i in 3 4 5 6 7 8; do
        start_producer "$i" application_name=fault_producer --max 40 --unordered 100
        reap "${producer_pids[0]}"
        producer_pids=()
        wait_for "SELECT NOT EXISTS (SELECT 1 FROM mq_msgs)
                  AND (SELECT count(*) FROM pg_stat_activity
                       WHERE application_name = 'fault_worker') = 4" 5 && break
    done
    [[ $(sql "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'fault_worker'") == 4 ]] \
        || { note "the reconnected worker ran no job"; return; }

    # Phase 2: every worker cut off, the control connection still up. The
    # runner must hand back what it claimed (its workers cannot run it), so
    # that another consumer runs it while the slots are taken.
    before=$(grep -c "too many connections for role" "$PGTMP_LOG")
    sql "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE application_name = 'fault_worker'" >/dev/null
    wait_for "SELECT count(*) = 1 FROM pg_stat_activity WHERE usename = '$role'" 10 \
        || { note "the terminated backends did not go away: $(sql "SELECT string_agg(application_name || ':' || state, ' ') FROM pg_stat_activity WHERE usename = '$role'")"; return; }
    local holders=()
    for i in 1 2 3 4; do
        start_bg "$logdir/$scenario.holder.log" psql -X -q -d "$base_dsn user=$role" \
            -c "SELECT pg_sleep(10)"
        holders+=("$last_pid")
    done
    wait_for "SELECT count(*) = 5 FROM pg_stat_activity WHERE usename = '$role'" 10 \
        || { note "the holders did not connect"; return; }
    start_producer 9 application_name=fault_producer --max 60 --unordered 100
    reap "${producer_pids[0]}"
    producer_pids=()
    sleep 1 # the cut-off runner claims, finds no worker up, hands back
    local tried held
    tried=$(( $(grep -c "too many connections for role" "$PGTMP_LOG") - before ))
    held=$(sql "SELECT count(*) FROM mq_msgs WHERE deliveries > 0")
    say "  every worker cut off: $tried refused connection attempts, $held of $(sql "SELECT count(*) FROM mq_msgs") messages held"
    (( tried > 0 )) || note "the cut-off runner's workers never tried to run a job"
    (( held == 0 )) || note "the runner whose workers were all cut off held $held messages"
    start_runner plain "application_name=fault_runner_healthy"
    runner_pids+=("$last_pid")
    local t0=$SECONDS
    if wait_for "SELECT NOT EXISTS (SELECT 1 FROM mq_msgs)" 6; then
        say "  with every worker of the first runner cut off, a second runner ran everything in $((SECONDS - t0))s"
    else
        note "the runner whose workers were all cut off held $(sql "SELECT count(*) FROM mq_msgs WHERE deliveries > 0") claimed messages"
    fi
    for i in "${holders[@]}"; do reap "$i"; done
    drain
    stop_runners || note "the runners did not stop cleanly"
    psql -X -q -d "$base_dsn" -c "DROP OWNED BY $role" -c "DROP ROLE $role" \
        >/dev/null 2>>"$logdir/psql.err"
    faults_text="refused reconnects $attempts"
    check plain
}

# ---- main ------------------------------------------------------------------

passed=0 failed=0
summary=()
for scenario in "${scenarios[@]}"; do
    problems=()
    faults_text=
    t0=$SECONDS
    say "== $scenario"
    case $scenario in
        kill9-exactly-once) scenario_kill9 eo ;;
        kill9-plain) scenario_kill9 plain ;;
        kill9-locked) scenario_kill9 locked ;;
        kill9-locked-runner) scenario_kill9 eolocked ;;
        kill9-batched-runner) scenario_kill9 eobatched ;;
        kill9-grouped-runner) scenario_kill9 eogrouped ;;
        restart-locked) scenario_restart eolocked ;;
        restart) scenario_restart eo ;;
        terminate) scenario_terminate ;;
        timeouts) scenario_timeouts ;;
        worker-reconnect-refused) scenario_refused ;;
        *) note "unknown scenario (known: ${all_scenarios[*]})" ;;
    esac
    kill_all
    producer_pids=()
    runner_pids=()
    if (( ${#problems[@]} == 0 )); then
        passed=$((passed + 1))
        summary+=("PASS: $scenario ($((SECONDS - t0))s)")
    else
        failed=$((failed + 1))
        summary+=("FAIL: $scenario ($((SECONDS - t0))s): ${problems[0]}$( ((${#problems[@]} > 1)) && echo " (and $((${#problems[@]} - 1)) more)")")
    fi
    say "${summary[-1]}"
done

echo
echo "fault suite summary (logs in $logdir, $((SECONDS - t_start))s in all):"
printf '  %s\n' "${summary[@]}"
echo "$passed passed, $failed failed"
(( failed == 0 ))
