#!/usr/bin/env bash
# bench/layouts.sh: candidate storage layouts for the queue, each in bare SQL,
# measured side by side against the floor in one run, with one client
# (pgbench) for every form.
#
#   bench/layouts.sh CONNINFO [SECONDS] [ROUNDS] [MESSAGES]
#
# The layouts (each in a schema of its own, dropped at the end):
#   floor  a 4-column table indexed by id and time; INSERT, and DELETE ...
#          FOR UPDATE SKIP LOCKED by ctid (no lease, no order, no fairness).
#   a      pqmq's mq_rows (installed by `pqmq migrate`; it holds the queue's
#          exceptions, plain messages going to the log): one 21-column row a
#          message under its five indexes; a claim is a HOT update, a
#          completion a DELETE. Its triggers are disabled: the counters are
#          not storage, and every layout would need them in some form.
#   b      a narrow hot row: only what a poll and a claim read or write (id,
#          chain key, place, lease, attempts, deliveries, priority, chain
#          place, backoff, channel, name, payload), the rest (arguments,
#          commit interval, unique key, last error, dead state) in a side
#          table written only when used, and no time index; claims and
#          completions as in a.
#   c      an append-only log: one row and two index entries a message
#          (chain key + sequence, id); a cursor row per channel (unordered:
#          the last place handed out; a chain: the last place completed and
#          the member in flight); a claim advances cursors and appends one
#          receipt row (the ranges it took, one element a channel), a
#          completion appends one row per batch; the log, receipts and completions are reclaimed by
#          TRUNCATE of a finished segment, never by DELETE. Producers of one
#          channel take its advisory lock until commit, so places are in
#          commit order and a cursor never passes a late committer.
#          Retries, delays, two-phase messages, priorities, unique keys and
#          dead letters would take exception paths (tables of their own),
#          not measured here.
#   d      c's tables and producers, with consumers that take a channel by
#          an advisory try-lock instead of a row lock on its cursor, and move
#          a cursor only from the place they read.
# Every pick is fair in the same way: channels in key order from a random
# channel (a loose index scan on a and b, the cursor table on c), at most
# PER messages a channel, 100 a batch; a statement completes the previous
# batch (fenced: deliveries = 1 on a and b) and claims the next with a
# 5-minute lease, as pqmq_complete_and_poll does.
#
# Cases, each with every layout in turn, ROUNDS (default 3) times:
#   deep    100 channels, at most 25 a channel a poll;
#   wide    10,000 channels, one message a channel a poll;
#   chains  1,000 ordered chains (one member of a chain in flight at a time).
# Each drain runs SECONDS (default 5) with 2 clients over a backlog of
# MESSAGES (default 1,000,000); the enqueue (deep only) inserts batches of 100
# on one of 100 channels into an empty table, 2 clients, SECONDS.
# Then, once per layout (HELD seconds, default 60; HELD=0 skips it), a held
# REPEATABLE READ snapshot under a steady offered load (RATE msg/s, default
# 5,000, in batches of 100, one producer) with 2 consumers draining the deep
# channels as fast as they can: processed, backlog and dead tuples at the end.
#
# Figures per layout: msg/s and its ratio to the floor of the same case and
# round; WAL bytes and full-page images per message (pg_current_wal_insert_lsn
# and pg_stat_wal around the phase; CHECKPOINT before each fill, none between
# a fill and its drain); index entries per message (enqueue: the rows each
# index covers, and beside them the tuples pgstattuple counts, after btree
# deduplication merged equal keys; processing: entries written, i.e. inserted
# rows and non-HOT updates times the table's indexes); dead
# tuples of the layout's tables at the end (pg_stat_all_tables).
# Needs pgbench, psql, bc, the pgstattuple extension (contrib) and a role
# that may create it; LAYOUTS chooses the layouts (default "floor a b c d").
set -euo pipefail
dsn=${1:?usage: bench/layouts.sh CONNINFO [SECONDS] [ROUNDS] [MESSAGES]}
secs=${2:-5}
rounds=${3:-3}
n=${4:-1000000}
held=${HELD:-60}
# The floor drains several times faster than any layout: it gets a bigger
# backlog, so that it never runs dry.
floor_x=3
rate_offered=${RATE:-5000}
here=$(cd "$(dirname "$0")" && pwd)
pqmq=${PQMQ_CMD:-$here/../build/cli/pqmq}
read -ra layouts <<<"${LAYOUTS:-floor a b c d}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
q() { psql -X -q -v ON_ERROR_STOP=1 -d "$dsn" "$@"; }
qa() { q -At "$@"; }
# The planner settings of the queue's hot functions (schema/trust.sql), for
# every layout's statements alike.
planner="-c enable_seqscan=off -c enable_hashjoin=off -c enable_mergejoin=off -c jit=off"
planner+=" -c plan_cache_mode=force_generic_plan"

# shellcheck source=bench/layouts-forms.sh
. "$here/layouts-forms.sh"

# ---- the layouts' tables ------------------------------------------------------

q -c 'SET client_min_messages = warning' \
    -c 'CREATE EXTENSION IF NOT EXISTS pgstattuple' \
    -c 'DROP SCHEMA IF EXISTS lay_floor, lay_a, lay_b, lay_c CASCADE' \
    -c 'CREATE SCHEMA lay_floor' -c 'CREATE SCHEMA lay_a' -c 'CREATE SCHEMA lay_b' -c 'CREATE SCHEMA lay_c' \
    -c 'DROP TABLE IF EXISTS lay_st'
layouts_ddl | q
"$pqmq" -d "$dsn" --schema lay_a migrate >/dev/null
q -c 'ALTER TABLE lay_a.mq_rows DISABLE TRIGGER USER'

# fill LAYOUT CHANNELS ORDERED: the backlog of a drain (the floor's bigger).
fill() {
    local lay=$1 rows=$n
    [[ $lay == floor ]] && rows=$((n * floor_x))
    q -c CHECKPOINT
    fill_sql "$lay" "$2" "$3" "$rows" | q >/dev/null
    # shellcheck disable=SC2046
    q -c "VACUUM ANALYZE $(tables_of "$lay" | tr -d "'")"
}

for f in {a,b,c,d,floor}-{fair,chains}; do
    layouts_form "$f" pgbench >"$work/$f.sql"
done
for f in floor a b c d; do
    { echo '\set ch random(0, 99)'; layouts_form "$f-insert" pgbench; } >"$work/$f-insert.sql"
done

# ---- measuring -------------------------------------------------------------------

# Prints "wal_bytes fpi ins hot_upd upd idx_written dead" for LAYOUT's tables.
phys() {
    local tl
    tl=$(tables_of "$1")
    q -c 'SELECT pg_stat_force_next_flush()' >/dev/null
    sleep 0.6
    qa -c "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn, w.wal_fpi, s.ins, s.hot, s.upd, s.idx, s.dead
           FROM pg_stat_wal w, (
               SELECT COALESCE(sum(t.n_tup_ins), 0) AS ins, COALESCE(sum(t.n_tup_hot_upd), 0) AS hot,
                      COALESCE(sum(t.n_tup_upd), 0) AS upd,
                      COALESCE(sum((t.n_tup_ins + t.n_tup_upd - t.n_tup_hot_upd)
                                   * (SELECT count(*) FROM pg_index i WHERE i.indrelid = t.relid)), 0) AS idx,
                      COALESCE(sum(t.n_dead_tup), 0) AS dead
               FROM pg_stat_all_tables t WHERE t.relid = ANY (ARRAY[$tl]::regclass[])) s" -F ' ' |
        sed 's/^/ /'
}
backlog_left() {
    case $1 in
    floor) qa -c "SELECT count(*) FROM lay_floor.msgs" ;;
    a) qa -c "SELECT count(*) FROM lay_a.mq_rows" ;;
    b) qa -c "SELECT count(*) FROM lay_b.msgs" ;;
    c | d) qa -c "SELECT count(*) FROM lay_c.log l JOIN lay_c.cursors c USING (channel_key) WHERE l.seq > c.pos" ;;
    esac
}
# Messages processed so far, of a drain's backlog.
processed() {
    local rows=$n
    [[ $1 == floor ]] && rows=$((n * floor_x))
    echo $((rows - $(backlog_left "$1")))
}

declare -A res
# drain LAYOUT CASE CH PER V: one timed drain; records rate, wal, fpi, idx, dead.
drain() {
    local lay=$1 case=$2 ch=$3 per=$4 v=$5 form=fair ordered=0 before after done
    [[ $case == chains ]] && { form=chains; ordered=1; }
    fill "$lay" "$ch" "$ordered"
    read -ra before < <(phys "$lay")
    PGOPTIONS="$planner" pgbench -n -M prepared -c 2 -j 2 -T "$secs" -D ids='{}' -D seqs='{}' -D keys='{}' \
        -D per="$per" -D v="$v" -f <(printf '\\set s random(0, %d)\n' $((ch - v > 0 ? ch - v : 0)); cat "$work/$lay-$form.sql") \
        "$dsn" >"$work/out" 2>&1 || { cat "$work/out" >&2; return 1; }
    read -ra after < <(phys "$lay")
    done=$(processed "$lay")
    ((done > 0)) || { echo "layouts: $lay $case processed nothing" >&2; cat "$work/out" >&2; return 1; }
    (( $(backlog_left "$lay") > 0 )) || { echo "layouts: $lay $case ran dry; give it more messages" >&2; return 1; }
    res[$case,$lay,rate]=$(echo "$done / $secs" | bc -l)
    res[$case,$lay,wal]=$(echo "(${after[0]} - ${before[0]}) / $done" | bc -l)
    res[$case,$lay,fpi]=$(echo "(${after[1]} - ${before[1]}) / $done" | bc -l)
    res[$case,$lay,hot]=$(echo "h=${after[4]} - ${before[4]}; if (h > 0) (${after[3]} - ${before[3]}) / h else 1" | bc -l)
    res[$case,$lay,idx]=$(echo "(${after[5]} - ${before[5]}) / $done" | bc -l)
    res[$case,$lay,dead]=${after[6]}
}

# enqueue LAYOUT: SECONDS of inserts into the empty table.
enqueue() {
    local lay=$1 before after rows idx tup tl
    tl=$(tables_of "$lay")
    # shellcheck disable=SC2046
    q -c "TRUNCATE $(echo "$tl" | tr -d "'")" -c CHECKPOINT
    read -ra before < <(phys "$lay")
    PGOPTIONS="$planner" pgbench -n -M prepared -c 2 -j 2 -T "$secs" -f "$work/$lay-insert.sql" "$dsn" >"$work/out" 2>&1 ||
        { cat "$work/out" >&2; return 1; }
    read -ra after < <(phys "$lay")
    case $lay in
    floor) rows=$(qa -c "SELECT count(*) FROM lay_floor.msgs") ;;
    a) rows=$(qa -c "SELECT count(*) FROM lay_a.mq_rows") ;;
    b) rows=$(qa -c "SELECT count(*) FROM lay_b.msgs") ;;
    c | d) rows=$(qa -c "SELECT count(*) FROM lay_c.log") ;;
    esac
    # Entries: the rows each index holds (its predicate's); tuples: what
    # the index stores, after btree deduplication merged equal keys.
    idx=$(qa -c "SELECT sum((xpath('/row/c/text()', query_to_xml(format(
                     'SELECT count(*) AS c FROM %s WHERE %s', i.indrelid::regclass,
                     COALESCE(pg_get_expr(i.indpred, i.indrelid), 'true')), false, true, '')))[1]::text::bigint)
                 FROM pg_index i WHERE i.indrelid = ANY (ARRAY[$tl]::regclass[])")
    tup=$(qa -c "SELECT sum((pgstattuple(i.indexrelid)).tuple_count) FROM pg_index i
                 WHERE i.indrelid = ANY (ARRAY[$tl]::regclass[])")
    res[enqueue,$lay,rate]=$(echo "$rows / $secs" | bc -l)
    res[enqueue,$lay,wal]=$(echo "(${after[0]} - ${before[0]}) / $rows" | bc -l)
    res[enqueue,$lay,fpi]=$(echo "(${after[1]} - ${before[1]}) / $rows" | bc -l)
    res[enqueue,$lay,idx]=$(echo "$idx / $rows" | bc -l)
    res[enqueue,$lay,tup]=$(echo "$tup / $rows" | bc -l)
}

# Keeps every round's figure of KEY as a space-separated list.
keep() { all[$1]+="${res[$1]} "; }
declare -A all
range() { # "min-max" of a list, with FMT
    local fmt=$1
    shift
    printf '%s\n' "$@" | sort -g | sed -n '1p;$p' | xargs printf "$fmt" | sed 's/ $//; s/ /–/'
}

for r in $(seq 1 "$rounds"); do
    for lay in "${layouts[@]}"; do drain "$lay" deep 100 25 5; done
    for lay in "${layouts[@]}"; do drain "$lay" wide 10000 1 100; done
    for lay in "${layouts[@]}"; do drain "$lay" chains 1000 1 216; done
    for lay in "${layouts[@]}"; do enqueue "$lay"; done
    for case in deep wide chains enqueue; do
        line="round $r, $case:"
        for lay in "${layouts[@]}"; do
            res[$case,$lay,ratio]=$(echo "${res[$case,$lay,rate]} / ${res[$case,floor,rate]}" | bc -l)
            for k in rate ratio wal fpi idx tup hot dead; do
                [[ -n ${res[$case,$lay,$k]:-} ]] && keep "$case,$lay,$k"
            done
            line+=$(printf ' %s %.0f (%.2f)' "$lay" "${res[$case,$lay,rate]}" "${res[$case,$lay,ratio]}")
        done
        echo "$line"
    done
done

echo
echo "| case | layout | msg/s | of the floor | WAL B/msg | FPI/msg | index entries/msg | index tuples/msg | HOT | dead tuples at end |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for case in deep wide chains enqueue; do
    for lay in "${layouts[@]}"; do
        # shellcheck disable=SC2086
        printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$case" "$lay" \
            "$(range '%.0f ' ${all[$case,$lay,rate]})" "$(range '%.2f ' ${all[$case,$lay,ratio]})" \
            "$(range '%.0f ' ${all[$case,$lay,wal]})" "$(range '%.2f ' ${all[$case,$lay,fpi]})" \
            "$(range '%.2f ' ${all[$case,$lay,idx]})" \
            "$([[ -n ${all[$case,$lay,tup]:-} ]] && range '%.2f ' ${all[$case,$lay,tup]} || echo -)" \
            "$([[ -n ${all[$case,$lay,hot]:-} ]] && range '%.2f ' ${all[$case,$lay,hot]} || echo -)" \
            "$([[ -n ${all[$case,$lay,dead]:-} ]] && range '%.0f ' ${all[$case,$lay,dead]} || echo -)"
    done
done

# ---- a held snapshot under a steady offered load -------------------------------

held_run() {
    local lay=$1 hpid before after ins left dead lat
    local tl
    tl=$(tables_of "$lay")
    # shellcheck disable=SC2046
    q -c "TRUNCATE $(echo "$tl" | tr -d "'")" -c CHECKPOINT
    [[ $lay == c || $lay == d ]] && q -c "INSERT INTO lay_c.cursors (channel_key) SELECT g FROM generate_series(0, 99) g"
    read -ra before < <(phys "$lay")
    psql -X -q -d "$dsn" -c 'BEGIN ISOLATION LEVEL REPEATABLE READ' -c 'SELECT count(*) FROM pg_class' \
        -c "SELECT pg_sleep($held + 2)" -c COMMIT >/dev/null &
    hpid=$!
    sleep 1
    PGOPTIONS="$planner" pgbench -n -M prepared -c 1 -j 1 -R $((rate_offered / 100)) -T "$held" -f "$work/$lay-insert.sql" \
        "$dsn" >"$work/prod" 2>&1 &
    PGOPTIONS="$planner" pgbench -n -M prepared -c 2 -j 2 -T "$held" -D ids='{}' -D seqs='{}' -D keys='{}' -D per=25 -D v=5 \
        -f <(printf '\\set s random(0, 95)\n'; cat "$work/$lay-fair.sql") "$dsn" >"$work/cons" 2>&1 || true
    wait
    read -ra after < <(phys "$lay")
    ins=$(grep -oE 'actually processed: [0-9]+' "$work/prod" | grep -oE '[0-9]+$')
    ins=$((ins * 100))
    left=$(backlog_left "$lay")
    dead=${after[6]}
    lat=$(grep -oE 'latency average = [0-9.]+ ms' "$work/cons" | grep -oE '[0-9.]+')
    printf '| %s | %d | %.0f | %d | %.1f s | %s | %.0f |\n' "$lay" "$ins" \
        "$(echo "($ins - $left) / $held" | bc -l)" "$left" "$(echo "$left / $rate_offered" | bc -l)" \
        "${lat:-?} ms" "$dead"
}
if ((held > 0)); then
    echo
    echo "Held REPEATABLE READ snapshot for $held s, $rate_offered msg/s offered on 100 channels, 2 consumers:"
    echo "| layout | inserted | processed/s | backlog at end | backlog in seconds of load | consumer statement latency (avg) | dead tuples at end |"
    echo "|---|---|---|---|---|---|---|"
    for lay in "${layouts[@]}"; do held_run "$lay"; done
fi

q -c 'SET client_min_messages = warning' -c 'DROP SCHEMA lay_floor, lay_a, lay_b, lay_c CASCADE' -c 'DROP TABLE lay_st'
