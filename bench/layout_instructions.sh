#!/usr/bin/env bash
# bench/layout_instructions.sh: server instructions per message of each
# storage layout of bench/layouts.sh (the same statements, from
# bench/layouts-forms.sh), counted by callgrind: stable on a noisy machine,
# unlike rates.
#
#   bench/layout_instructions.sh [BATCHES]     (default 100)
#
# A throwaway cluster (tests/pgtmp.sh) gets the layouts' tables (layout a by
# build/cli/pqmq migrate); then the server is stopped and each run is a
# single-user server under callgrind (fsync off, autovacuum off, the
# planner settings of the queue's hot functions), every statement its own
# transaction, the measured ones prepared once and executed:
#   base                 BATCHES times SELECT 1
#   LAYOUT-insert        BATCHES inserts of 100 messages (channel i % 100)
#   LAYOUT-CASE-fill     the backlog of CASE alone
#   LAYOUT-CASE          the same backlog, then BATCHES statements that
#                        complete the previous batch and claim the next
# with CASE deep (100 channels, at most 25 a channel a poll), wide (10,000
# channels, one a channel a poll) or chains (1,000 chains). Prints thousands
# of instructions per message: an insert (LAYOUT-insert less base, over the
# rows inserted) and processing (LAYOUT-CASE less its fill, over the
# messages claimed), and each as a ratio to the floor's. One session, so no
# lock is ever skipped: what the statements cost, not what contention adds.
# LAYOUTS chooses the layouts (default "floor a b c d"). Needs valgrind.
set -euo pipefail
batches=${1:-100}
here=$(cd "$(dirname "$0")" && pwd)
pqmq=${PQMQ_CMD:-$here/../build/cli/pqmq}
read -ra layouts <<<"${LAYOUTS:-floor a b c d}"
# shellcheck source=bench/layouts-forms.sh
. "$here/layouts-forms.sh"
# shellcheck source=bench/scratch_cluster.sh
. "$here/scratch_cluster.sh"
q -c 'CREATE SCHEMA lay_floor' -c 'CREATE SCHEMA lay_a' -c 'CREATE SCHEMA lay_b' -c 'CREATE SCHEMA lay_c'
layouts_ddl | q
"$pqmq" -d "$PGTMP_DSN" --schema lay_a migrate >/dev/null
q -c 'ALTER TABLE lay_a.mq_rows DISABLE TRIGGER USER'
data=$PGTMP_DIR/data
pgtmp_run "$PGTMP_BINDIR/pg_ctl" -D "$data" -m fast -w stop >/dev/null

# case_shape CASE: "CHANNELS ORDERED ROWS PER V".
case_shape() {
    local rows=$((batches * 100))
    case $1 in
    deep) echo "100 0 $((rows + 5000)) 25 5" ;;
    wide) echo "10000 0 $((rows + 10000)) 1 100" ;;
    chains) echo "1000 0 $((rows + 10000)) 1 216" | sed 's/ 0 / 1 /' ;;
    esac
}

# In single-user mode with -j a statement ends with a semicolon and an
# empty line: every statement is put on lines of its own, blank lines out.
stmt() { sed '/^[[:space:]]*$/d; s/;[[:space:]]*$//'; printf ';\n\n'; }

# script RUN: the statements of one run.
script() {
    local run=$1 lay kase ch ordered rows per v i form
    lay=${run%%-*}
    {
        printf 'SET search_path = public;\n\n'
        printf "UPDATE lay_st SET ids = '{}', seqs = '{}', keys = '{}';\n\n"
        case $run in
        base)
            printf 'PREPARE i(int) AS SELECT $1;\n\n'
            for ((i = 1; i <= batches; i++)); do printf 'EXECUTE i(%d);\n\n' $((i % 100)); done ;;
        *-insert)
            for t in $(tables_of "$lay" | tr -d "',"); do printf 'TRUNCATE %s;\n\n' "$t"; done
            { printf 'PREPARE i(int) AS '; layouts_form "$lay-insert" state | sed 's/:ch\b/$1/g'; } | stmt
            for ((i = 1; i <= batches; i++)); do printf 'EXECUTE i(%d);\n\n' $((i % 100)); done ;;
        *)
            kase=${run#*-}
            kase=${kase%-fill}
            read -r ch ordered rows per v <<<"$(case_shape "$kase")"
            fill_sql "$lay" "$ch" "$ordered" "$rows" | tr '\n' ' ' | sed 's/; */;\n\n/g'
            printf '\n\n'
            # Prepared, as pgbench -M prepared and the queue's own functions
            # run their statements: planned once, not per batch.
            { printf 'PREPARE p(bigint, int, int) AS '
              layouts_form "$lay-$([[ $kase == chains ]] && echo chains || echo fair)" state |
                  sed 's/:s\b/$1/g; s/:per\b/$2/g; s/:v\b/$3/g'; } | stmt
            if [[ $run != *-fill ]]; then
                for ((i = 1; i <= batches; i++)); do
                    printf 'EXECUTE p(%d, %d, %d);\n\n' $(((i * 7919) % (ch - v + 1))) "$per" "$v"
                done
            fi ;;
        esac
    } >"$work/$run.sql"
}

# Messages a run's statements claimed (its server's data, after the run).
claimed_sql() {
    local lay=$1 rows=$2
    case $lay in
    floor) echo "SELECT $rows - count(*) AS n FROM lay_floor.msgs" ;;
    a) echo "SELECT count(*) FILTER (WHERE deliveries = 0) AS n FROM lay_a.mq_rows" ;;
    b) echo "SELECT count(*) FILTER (WHERE deliveries = 0) AS n FROM lay_b.msgs" ;;
    c | d) echo "SELECT (SELECT count(*) FROM lay_c.log l JOIN lay_c.cursors c USING (channel_key)
                     WHERE l.seq <= COALESCE(c.inflight, c.pos)) AS n" ;;
    esac
}

# The planner settings the queue's hot functions run with (schema/trust.sql):
# every layout's statements probe indexes whatever the statistics say.
settings=(-c enable_seqscan=off -c enable_hashjoin=off -c enable_mergejoin=off -c jit=off
          -c plan_cache_mode=force_generic_plan)
single() { # single [valgrind args...] < script
    pgtmp_run "$@" "$PGTMP_BINDIR/postgres" --single -j -D "$data" -c fsync=off -c autovacuum=off \
        "${settings[@]}" postgres
}

# count RUN: instructions of RUN's statements.
count() {
    local run=$1
    script "$run"
    chmod 644 "$work/$run.sql"
    [[ -n $PGTMP_RUNAS ]] && chown -R "$PGTMP_RUNAS:" "$work"
    single valgrind --tool=callgrind --callgrind-out-file="$work/cg.$run" <"$work/$run.sql" \
        >"$work/$run.out" 2>&1
    if grep -q ERROR "$work/$run.out"; then
        grep -m3 -A2 ERROR "$work/$run.out" >&2
        exit 1
    fi
    sed -n 's/^summary: //p' "$work/cg.$run"
}

# The value of the single-user server's answer to SQL.
answer() {
    printf '%s;\n\n' "$1" >"$work/answer.sql"
    chmod 644 "$work/answer.sql"
    single <"$work/answer.sql" 2>&1 | sed -n 's/.*n = "\([0-9]*\)".*/\1/p' | head -1
}

declare -A ins k
n_base=$(count base)
rows=$((batches * 100))
for lay in "${layouts[@]}"; do
    ins[$lay]=$(echo "($(count "$lay-insert") - $n_base) / $rows / 1000" | bc -l)
done
for kase in deep wide chains; do
    read -r _ _ fillrows _ _ <<<"$(case_shape "$kase")"
    for lay in "${layouts[@]}"; do
        f=$(count "$lay-$kase-fill")
        p=$(count "$lay-$kase")
        frows=$fillrows
        got=$(answer "$(claimed_sql "$lay" "$frows")")
        # a and b count the unclaimed rows left: claimed is the rest.
        [[ $lay == a || $lay == b ]] && got=$((frows - got))
        ((got > 0)) || { echo "layout_instructions: $lay $kase claimed nothing" >&2; exit 1; }
        k[$kase,$lay]=$(echo "($p - $f) / $got / 1000" | bc -l)
        k[$kase,$lay,n]=$got
    done
done

printf 'server instructions per message (thousands), %d statements of 100:\n' "$batches"
printf '| layout | insert | of the floor |'
for kase in deep wide chains; do printf ' %s | of the floor |' "$kase"; done
printf '\n|---|---|---|---|---|---|---|---|---|\n'
for lay in "${layouts[@]}"; do
    printf '| %s | %.1f | %.2f |' "$lay" "${ins[$lay]}" "$(echo "${ins[floor]} / ${ins[$lay]}" | bc -l)"
    for kase in deep wide chains; do
        printf ' %.1f | %.2f |' "${k[$kase,$lay]}" "$(echo "${k[$kase,floor]} / ${k[$kase,$lay]}" | bc -l)"
    done
    printf '\n'
done
printf '(the ratios are the floor'"'"'s instructions over the layout'"'"'s: 1.00 costs what the floor costs)\n'
