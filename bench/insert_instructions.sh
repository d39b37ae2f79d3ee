#!/usr/bin/env bash
# bench/insert_instructions.sh: server instructions per inserted message,
# the floor's INSERT against pqmq's (unordered and ordered), and per
# claimed message, counted by callgrind (stable on a noisy machine, unlike
# rates). docs/performance.md.
#
#   bench/insert_instructions.sh [BATCHES]     (default 200 batches of 100)
#
# A throwaway cluster (tests/pgtmp.sh) gets the queue (build/cli/pqmq
# migrate), the floor's table and a source table of UUIDv7-ordered ids and
# JSON payloads; then the server is stopped and each form runs as BATCHES
# statements of 100 rows in a single-user server under callgrind (fsync
# off), every statement its own transaction:
#   base   SELECT 1                               (startup and statements)
#   floor  INSERT INTO floor_msgs ... FROM src     (reads the source rows)
#   table  the same rows INSERTed into mq_log      (reads the source rows)
#   array  builds the mq_new_t[] of each batch     (reads the source rows)
#   pqmq   mq_insert of that array (a batch's messages on one channel)
#   manyarray, many   the same with message k on channel name 'c' || k % 100
#          (a batch's messages on 100 channels)
#   ordarray, ordered   the same with every message ordered, on one of
#          1,000 chains (message k of the run on chain k % 1000, as the
#          bench's chains phase spreads them)
#   claim  pqmq, then as many mq_claim(NULL, 100) (the lease lane's poll of
#          all channels, without completing)
#   process, ordprocess   pqmq or ordered, then as many statements that
#          claim 100 and complete them (mq_complete of mq_claim(NULL, 100)),
#          which must leave the queue empty
#   onearr, one   a batch of one message (the first of each batch's rows),
#          built, and inserted by mq_insert: what a call costs whatever its size
#   idle0, idle1, idle2   BATCHES rounds of one message inserted and
#          completed by id (idle0), claimed by mq_claim(NULL, 100) and
#          completed (idle1), and then an empty mq_claim(NULL, 100) (idle2):
#          what a poll of a near-empty queue costs
# and prints instructions per message: floor and table less base, and
# mq_insert alone (pqmq less array; many less manyarray; ordered less
# ordarray), mq_claim (claim less pqmq), and a claim and completion
# (process less pqmq; ordprocess less ordered: each chain gives one
# message a poll), and per call an insert of one message (one less onearr),
# a claim of one message (idle1 less idle0) and an empty claim (idle2 less
# idle1). Needs valgrind.
set -euo pipefail
batches=${1:-200}
here=$(cd "$(dirname "$0")" && pwd)
pqmq=${PQMQ_CMD:-$here/../build/cli/pqmq}
# shellcheck source=bench/scratch_cluster.sh
. "$here/scratch_cluster.sh"
q -c 'CREATE SCHEMA q'
"$pqmq" -d "$PGTMP_DSN" --schema q migrate >/dev/null
q -c "CREATE TABLE q.floor_msgs (id uuid PRIMARY KEY, channel text NOT NULL, payload jsonb,
                                 created_at timestamptz NOT NULL DEFAULT now())" \
    -c 'CREATE INDEX ON q.floor_msgs (created_at)' \
    -c "CREATE TABLE q.src AS
        SELECT i AS batch, i * 100 + g AS k,
               ('00000000-0000-7000-8000-' || lpad(to_hex(i * 1000 + g), 12, '0'))::uuid AS id,
               'c' || (i % 100) AS ch, '{\"k\": ' || g || '}' AS payload
        FROM generate_series(1, $batches) i, generate_series(1, 100) g" \
    -c 'CREATE INDEX ON q.src (batch)' -c 'VACUUM ANALYZE q.src'
data=$PGTMP_DIR/data
pgtmp_run "$PGTMP_BINDIR/pg_ctl" -D "$data" -m fast -w stop >/dev/null

# One statement per batch: in single-user mode with -j a statement ends
# with a semicolon and an empty line.
script() {
    local form=$1 i
    # Source row s as one unordered message (the pqmq, claim, process and
    # idle forms insert it; array builds it).
    local msg="ROW(s.id, NULL, 3, interval '1 second', s.ch, '', NULL, false, 'n', s.payload, NULL)::mq_new_t"
    {
        printf 'SET search_path = q;\n\n'
        # The same folds of the counters (one call in 250, at random) in
        # every run and version.
        printf 'SELECT setseed(0.25);\n\n'
        printf 'TRUNCATE mq_rows, mq_log, mq_cursors, mq_cursor_keys, mq_receipts, mq_done, mq_log_gone, mq_count_deltas, mq_count_batches, mq_counts, floor_msgs;\n\n'
        for ((i = 1; i <= batches; i++)); do
            case $form in
            base) printf 'SELECT 1;\n\n' ;;
            onearr) printf "SELECT cardinality(ARRAY(SELECT $msg FROM src s WHERE s.batch = %d AND s.k = %d));\n\n" "$i" "$((i * 100 + 1))" ;;
            one | idle0 | idle1 | idle2)
                printf "SELECT mq_insert(ARRAY(SELECT $msg FROM src s WHERE s.batch = %d AND s.k = %d));\n\n" "$i" "$((i * 100 + 1))"
                # (one: the insert alone)
                if [[ $form == idle0 ]]; then
                    printf 'SELECT mq_complete(ARRAY(SELECT m.id FROM mq_msgs m));\n\n'
                elif [[ $form != one ]]; then
                    printf 'SELECT mq_complete(ARRAY(SELECT j.id FROM mq_claim(NULL, 100) j));\n\n'
                fi
                if [[ $form == idle2 ]]; then
                    printf 'SELECT count(*) FROM mq_claim(NULL, 100);\n\n'
                fi
                ;;
            floor) printf 'INSERT INTO floor_msgs (id, channel, payload) SELECT s.id, s.ch, s.payload::jsonb FROM src s WHERE s.batch = %d;\n\n' "$i" ;;
            table) printf "INSERT INTO mq_log (place, channel_key, id, created_at, attempts, retry_backoff, channel_name, channel_args, name, payload_json) SELECT s.k, (hashtext(s.ch)::bigint << 32) | (hashtext('')::bigint & 4294967295), s.id, now(), 3, interval '1 second', s.ch, '', 'n', s.payload::jsonb FROM src s WHERE s.batch = %d;\n\n" "$i" ;;
            array) printf "SELECT cardinality(ARRAY(SELECT $msg FROM src s WHERE s.batch = %d));\n\n" "$i" ;;
            pqmq | claim | process) printf "SELECT mq_insert(ARRAY(SELECT $msg FROM src s WHERE s.batch = %d));\n\n" "$i" ;;
            manyarray) printf "SELECT cardinality(ARRAY(SELECT ROW(s.id, NULL, 3, interval '1 second', 'c' || s.k %% 100, '', NULL, false, 'n', s.payload, NULL)::mq_new_t FROM src s WHERE s.batch = %d));\n\n" "$i" ;;
            many) printf "SELECT mq_insert(ARRAY(SELECT ROW(s.id, NULL, 3, interval '1 second', 'c' || s.k %% 100, '', NULL, false, 'n', s.payload, NULL)::mq_new_t FROM src s WHERE s.batch = %d));\n\n" "$i" ;;
            ordarray) printf "SELECT cardinality(ARRAY(SELECT ROW(s.id, NULL, 3, interval '1 second', 'bench', 'c' || s.k %% 1000, NULL, true, 'n', s.payload, NULL)::mq_new_t FROM src s WHERE s.batch = %d ORDER BY s.k));\n\n" "$i" ;;
            ordered | ordprocess) printf "SELECT mq_insert(ARRAY(SELECT ROW(s.id, NULL, 3, interval '1 second', 'bench', 'c' || s.k %% 1000, NULL, true, 'n', s.payload, NULL)::mq_new_t FROM src s WHERE s.batch = %d ORDER BY s.k));\n\n" "$i" ;;
            esac
        done
        if [[ $form == claim ]]; then
            for ((i = 1; i <= batches; i++)); do
                printf 'SELECT count(*) FROM mq_claim(NULL, 100);\n\n'
            done
        fi
        if [[ $form == process || $form == ordprocess ]]; then
            for ((i = 1; i <= batches; i++)); do
                printf 'SELECT mq_complete(ARRAY(SELECT j.id FROM mq_claim(NULL, 100) j));\n\n'
            done
            # (count() stops on an ERROR in the output)
            printf "DO \$\$ BEGIN IF EXISTS (SELECT FROM mq_msgs) THEN RAISE EXCEPTION '%% messages left unprocessed', (SELECT count(*) FROM mq_msgs); END IF; END \$\$;\n\n"
        fi
    } >"$work/$form.sql"
}

# Instructions of one form's run.
count() {
    local form=$1
    script "$form"
    chmod 644 "$work/$form.sql"
    [[ -n $PGTMP_RUNAS ]] && chown -R "$PGTMP_RUNAS:" "$work"
    pgtmp_run valgrind --tool=callgrind --callgrind-out-file="$work/cg.$form" \
        "$PGTMP_BINDIR/postgres" --single -j -D "$data" -c fsync=off -c autovacuum=off \
        postgres <"$work/$form.sql" >"$work/$form.out" 2>&1
    if grep -q ERROR "$work/$form.out"; then
        grep ERROR "$work/$form.out" >&2
        exit 1
    fi
    sed -n 's/^summary: //p' "$work/cg.$form"
}

declare -A n
for form in base floor table array pqmq manyarray many ordarray ordered claim process ordprocess \
    onearr one idle0 idle1 idle2; do
    n[$form]=$(count "$form")
done
rows=$((batches * 100))
per() { echo "scale=1; $1 / $rows / 1000" | bc; }
floor=$(per "$((n[floor] - n[base]))")
table=$(per "$((n[table] - n[base]))")
insert=$(per "$((n[pqmq] - n[array]))")
ordered=$(per "$((n[ordered] - n[ordarray]))")
many=$(per "$((n[many] - n[manyarray]))")
claim=$(per "$((n[claim] - n[pqmq]))")
process=$(per "$((n[process] - n[pqmq]))")
ordprocess=$(per "$((n[ordprocess] - n[ordered]))")
printf 'instructions per message (thousands), %d batches of 100:\n' "$batches"
printf '  floor INSERT (with reading the source rows)          %s\n' "$floor"
printf '  plain INSERT into mq_log (with reading the source)   %s  (%.2fx)\n' "$table" \
    "$(echo "$table / $floor" | bc -l)"
printf '  mq_insert alone (without reading or building)        %s  (%.2fx)\n' "$insert" \
    "$(echo "$insert / $floor" | bc -l)"
printf '  mq_insert, 100 channel names a batch (the same)      %s  (%.2fx)\n' "$many" \
    "$(echo "$many / $floor" | bc -l)"
printf '  mq_insert, ordered, 1,000 chains (the same)          %s  (%.2fx; %.2f of unordered)\n' \
    "$ordered" "$(echo "$ordered / $floor" | bc -l)" "$(echo "$insert / $ordered" | bc -l)"
printf '  mq_claim, polls of 100 of all channels (claim only)   %s\n' "$claim"
printf '  claimed and completed, polls of 100 of all channels   %s\n' "$process"
printf '  the same, ordered, 1,000 chains                       %s  (%.2f of unordered)\n' \
    "$ordprocess" "$(echo "$process / $ordprocess" | bc -l)"
printf 'per call (thousands):\n'
printf '  mq_insert of a batch of one message                   %s\n' \
    "$(echo "scale=1; ($((n[one] - n[onearr]))) / $batches / 1000" | bc)"
printf '  mq_claim(NULL, 100) on a near-empty queue:\n'
printf '    taking the one message there                        %s\n' \
    "$(echo "scale=1; ($((n[idle1] - n[idle0]))) / $batches / 1000" | bc)"
printf '    finding none (an empty claim)                       %s\n' \
    "$(echo "scale=1; ($((n[idle2] - n[idle1]))) / $batches / 1000" | bc)"

# Where the difference goes: inclusive instructions per message of the
# executor steps the two tables do not share.
part() {
    callgrind_annotate --inclusive=yes "$work/cg.$1" 2>/dev/null |
        awk -v f="$2" '$0 ~ ("[?]:" f " ") { gsub(",", "", $1); print $1; exit }'
}
printf 'of which (thousands per message)            floor   mq_log\n'
for fn in btinsert ExecBRInsertTriggers; do
    printf '  %-40s %6s %8s\n' "$fn" "$(per "0$(part floor "$fn")")" \
        "$(per "0$(part table "$fn")")"
done
