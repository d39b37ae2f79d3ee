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
#   a      today's mq_msgs, installed by `pqmq migrate`: one 21-column row a
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
# that may create it; LAYOUTS chooses the layouts (default "floor a b c").
set -euo pipefail
dsn=${1:?usage: bench/layouts.sh CONNINFO [SECONDS] [ROUNDS] [MESSAGES]}
secs=${2:-5}
rounds=${3:-3}
n=${4:-1000000}
held=${HELD:-60}
rate_offered=${RATE:-5000}
here=$(cd "$(dirname "$0")" && pwd)
pqmq=${PQMQ_CMD:-$here/../build/tools/pqmq}
read -ra layouts <<<"${LAYOUTS:-floor a b c}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
q() { psql -X -q -v ON_ERROR_STOP=1 -d "$dsn" "$@"; }
qa() { q -At "$@"; }

# ---- the layouts' tables ------------------------------------------------------

q -c 'SET client_min_messages = warning' \
    -c 'CREATE EXTENSION IF NOT EXISTS pgstattuple' \
    -c 'DROP SCHEMA IF EXISTS lay_floor, lay_a, lay_b, lay_c CASCADE' \
    -c 'CREATE SCHEMA lay_floor' -c 'CREATE SCHEMA lay_a' -c 'CREATE SCHEMA lay_b' -c 'CREATE SCHEMA lay_c'
q <<'EOF'
CREATE TABLE lay_floor.msgs (id uuid PRIMARY KEY, channel text NOT NULL, payload jsonb,
                             created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ON lay_floor.msgs (created_at);

CREATE TABLE lay_b.msgs (
    id            uuid PRIMARY KEY,
    channel_key   bigint NOT NULL,
    ready_at      timestamptz NOT NULL,
    attempt_at    timestamptz NOT NULL,
    attempts      smallint NOT NULL,
    deliveries    smallint NOT NULL DEFAULT 0,
    priority      smallint NOT NULL DEFAULT 0,
    backoff_ms    int NOT NULL,
    chain_seq     bigint,
    channel_name  text NOT NULL,
    name          text NOT NULL,
    payload_json  jsonb,
    payload_bytes bytea
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 500,
        autovacuum_vacuum_cost_delay = 0);
CREATE INDEX msgs_ready ON lay_b.msgs (channel_key, ready_at) WHERE chain_seq IS NULL;
CREATE INDEX msgs_chain ON lay_b.msgs (channel_key, chain_seq) WHERE chain_seq IS NOT NULL;
CREATE TABLE lay_b.extra (id uuid PRIMARY KEY, channel_args text, commit_interval interval,
                          unique_key text, key_retention interval, last_error text,
                          dead_since timestamptz, created_at timestamptz);

CREATE SEQUENCE lay_c.seq INCREMENT BY 128;
CREATE TABLE lay_c.log (
    seq           bigint NOT NULL,
    channel_key   bigint NOT NULL,
    id            uuid NOT NULL,
    attempts      smallint NOT NULL,
    backoff_ms    int NOT NULL,
    channel_name  text NOT NULL,
    name          text NOT NULL,
    payload_json  jsonb,
    payload_bytes bytea
) WITH (autovacuum_enabled = false);
CREATE INDEX log_place ON lay_c.log (channel_key, seq);
CREATE UNIQUE INDEX log_id ON lay_c.log (id);
CREATE TABLE lay_c.cursors (channel_key bigint PRIMARY KEY, pos bigint NOT NULL DEFAULT 0,
                            inflight bigint, lease_until timestamptz)
    WITH (fillfactor = 50);
CREATE TABLE lay_c.claims (keys bigint[] NOT NULL, los bigint[] NOT NULL, his bigint[] NOT NULL,
                           lease_until timestamptz NOT NULL) WITH (autovacuum_enabled = false);
CREATE TABLE lay_c.done (seqs bigint[] NOT NULL) WITH (autovacuum_enabled = false);
EOF
"$pqmq" -d "$dsn" --schema lay_a migrate >/dev/null
q -c 'ALTER TABLE lay_a.mq_msgs DISABLE TRIGGER USER'

tables_of() {
    case $1 in
    floor) echo "'lay_floor.msgs'" ;;
    a) echo "'lay_a.mq_msgs'" ;;
    b) echo "'lay_b.msgs', 'lay_b.extra'" ;;
    c) echo "'lay_c.log', 'lay_c.cursors', 'lay_c.claims', 'lay_c.done'" ;;
    esac
}

# ---- fills: MESSAGES rows over CH channels (chained when ORDERED=1) -----------

fill() {
    local lay=$1 ch=$2 ordered=$3
    local t="now() - interval '1 hour' + (g / 100) * interval '1 ms'"
    q -c CHECKPOINT
    case $lay in
    floor)
        q -c "TRUNCATE lay_floor.msgs" -c "INSERT INTO lay_floor.msgs
              SELECT gen_random_uuid(), 'c' || (g % $ch), '{\"k\": 1}', $t
              FROM generate_series(1, $n) g" ;;
    a)
        q -c "TRUNCATE lay_a.mq_msgs" -c "INSERT INTO lay_a.mq_msgs (id, attempts, retry_backoff,
                  channel_name, name, payload_json, attempt_at, ready_at, channel_key,
                  after_message_id, chain_seq)
              SELECT gen_random_uuid(), 3, interval '1 second', 'c' || (g % $ch), 'n',
                     '{\"k\": 1}', $t, $t, g % $ch,
                     CASE WHEN $ordered = 1 THEN '00000000-0000-0000-0000-000000000000'::uuid END,
                     CASE WHEN $ordered = 1 THEN g END
              FROM generate_series(1, $n) g" ;;
    b)
        q -c "TRUNCATE lay_b.msgs" -c "INSERT INTO lay_b.msgs (id, channel_key, ready_at, attempt_at,
                  attempts, backoff_ms, chain_seq, channel_name, name, payload_json)
              SELECT gen_random_uuid(), g % $ch, $t, $t, 3, 1000,
                     CASE WHEN $ordered = 1 THEN g END, 'c' || (g % $ch), 'n', '{\"k\": 1}'
              FROM generate_series(1, $n) g" ;;
    c)
        q -c "TRUNCATE lay_c.log, lay_c.cursors, lay_c.claims, lay_c.done" \
            -c "INSERT INTO lay_c.log (seq, channel_key, id, attempts, backoff_ms, channel_name,
                                       name, payload_json)
                SELECT g, g % $ch, gen_random_uuid(), 3, 1000, 'c' || (g % $ch), 'n', '{\"k\": 1}'
                FROM generate_series(1, $n) g" \
            -c "INSERT INTO lay_c.cursors (channel_key) SELECT g FROM generate_series(0, $ch - 1) g" \
            -c "SELECT setval('lay_c.seq', $n + 1)" >/dev/null ;;
    esac
    # shellcheck disable=SC2046
    q -c "VACUUM ANALYZE $(tables_of "$lay" | tr -d "'")"
}

# ---- the processing forms ------------------------------------------------------

# a and b: complete the previous batch, then a loose scan over the chain keys
# of INDEX_PRED's index from :s, at most :v channels, at most :per rows each.
fair_lease() {
    local t=$1 pred=$2 backoff=$3
    cat <<EOF
WITH RECURSIVE done AS (
    DELETE FROM $t WHERE id = ANY (:ids::uuid[]) AND deliveries = 1 RETURNING 1),
k(key, n) AS (
    (SELECT channel_key, 1 FROM $t WHERE $pred AND channel_key >= :s
     ORDER BY channel_key LIMIT 1)
    UNION ALL
    SELECT (SELECT channel_key FROM $t WHERE $pred AND channel_key > k.key
            ORDER BY channel_key LIMIT 1), k.n + 1
    FROM k WHERE k.key IS NOT NULL AND k.n < :v),
picked AS (
    SELECT p.ctid FROM k, LATERAL (
        SELECT ctid FROM $t WHERE $pred AND channel_key = k.key AND attempt_at <= now()
        ORDER BY ready_at LIMIT :per FOR NO KEY UPDATE SKIP LOCKED) p
    WHERE k.key IS NOT NULL LIMIT 100),
claimed AS (
    UPDATE $t SET attempt_at = now() + interval '5 minutes', attempts = attempts - 1,
                  deliveries = deliveries + 1, $backoff
    WHERE ctid = ANY (ARRAY(SELECT ctid FROM picked))
    RETURNING id, payload_json)
SELECT COALESCE(array_agg(id), '{}')::text AS ids, sum(octet_length(payload_json::text)) AS bytes,
       (SELECT count(*) FROM done) AS completed
FROM claimed \gset
EOF
}

# a and b, chains: each chain key's first live entry (its head), if not in
# flight, locked by TID.
chain_lease() {
    local t=$1 backoff=$2
    cat <<EOF
WITH RECURSIVE done AS (
    DELETE FROM $t WHERE id = ANY (:ids::uuid[]) AND deliveries = 1 RETURNING 1),
k(key, n) AS (
    (SELECT channel_key, 1 FROM $t WHERE chain_seq IS NOT NULL AND channel_key >= :s
     ORDER BY channel_key LIMIT 1)
    UNION ALL
    SELECT (SELECT channel_key FROM $t WHERE chain_seq IS NOT NULL AND channel_key > k.key
            ORDER BY channel_key LIMIT 1), k.n + 1
    FROM k WHERE k.key IS NOT NULL AND k.n < :v),
heads AS (
    SELECT h.ctid FROM k, LATERAL (
        SELECT ctid, attempt_at FROM $t WHERE chain_seq IS NOT NULL AND channel_key = k.key
        ORDER BY chain_seq LIMIT 1) h
    WHERE k.key IS NOT NULL AND h.attempt_at <= now() LIMIT 100),
claimed AS (
    UPDATE $t SET attempt_at = now() + interval '5 minutes', attempts = attempts - 1,
                  deliveries = deliveries + 1, $backoff
    WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM $t WHERE ctid = ANY (ARRAY(SELECT ctid FROM heads))
          AND attempt_at <= now() FOR NO KEY UPDATE SKIP LOCKED))
    RETURNING id, payload_json)
SELECT COALESCE(array_agg(id), '{}')::text AS ids, sum(octet_length(payload_json::text)) AS bytes,
       (SELECT count(*) FROM done) AS completed
FROM claimed \gset
EOF
}

apred="dead_since IS NULL AND after_message_id IS NULL AND priority <= 0"
fair_lease lay_a.mq_msgs "$apred" "retry_backoff = retry_backoff * 2" >"$work/a-fair.sql"
fair_lease lay_b.msgs "chain_seq IS NULL" "backoff_ms = backoff_ms * 2" >"$work/b-fair.sql"
chain_lease lay_a.mq_msgs "retry_backoff = retry_backoff * 2" >"$work/a-chains.sql"
chain_lease lay_b.msgs "backoff_ms = backoff_ms * 2" >"$work/b-chains.sql"

# c: a completion is one appended row; a claim locks the cursors of channels
# with something past their place, takes at most :per rows of each after it,
# moves each cursor to the last row taken and appends a receipt per channel.
cat >"$work/c-fair.sql" <<'EOF'
WITH done AS (
    INSERT INTO lay_c.done (seqs) SELECT :seqs::bigint[] WHERE :seqs::bigint[] <> '{}'
    RETURNING 1),
cur AS (
    SELECT c.channel_key, c.pos FROM lay_c.cursors c
    WHERE c.channel_key >= :s
      AND EXISTS (SELECT 1 FROM lay_c.log l WHERE l.channel_key = c.channel_key AND l.seq > c.pos)
    ORDER BY c.channel_key LIMIT :v FOR NO KEY UPDATE SKIP LOCKED),
took AS MATERIALIZED (
    SELECT t.* FROM cur, LATERAL (
        SELECT l.seq, l.channel_key, l.id, l.payload_json FROM lay_c.log l
        WHERE l.channel_key = cur.channel_key AND l.seq > cur.pos
        ORDER BY l.seq LIMIT :per) t
    LIMIT 100),
moved AS (
    UPDATE lay_c.cursors c SET pos = r.hi
    FROM (SELECT channel_key, min(seq) AS lo, max(seq) AS hi FROM took GROUP BY channel_key) r
    WHERE c.channel_key = r.channel_key
    RETURNING c.channel_key, r.lo, r.hi),
receipts AS (
    INSERT INTO lay_c.claims (keys, los, his, lease_until)
    SELECT array_agg(channel_key), array_agg(lo), array_agg(hi), now() + interval '5 minutes'
    FROM moved HAVING count(*) > 0 RETURNING 1)
SELECT COALESCE(array_agg(seq), '{}')::text AS seqs, sum(octet_length(payload_json::text)) AS bytes,
       (SELECT count(*) FROM done) AS completed, (SELECT count(*) FROM receipts) AS receipts
FROM took \gset
EOF
# c, chains: the cursor is the receipt: a claim sets the member in flight
# and its lease, a completion moves the cursor past it.
cat >"$work/c-chains.sql" <<'EOF'
WITH done AS (
    UPDATE lay_c.cursors c SET pos = c.inflight, inflight = NULL, lease_until = NULL
    WHERE c.channel_key = ANY (:keys::bigint[]) AND c.inflight = ANY (:seqs::bigint[])
    RETURNING 1),
cur AS (
    SELECT c.channel_key, c.pos FROM lay_c.cursors c
    WHERE c.channel_key >= :s AND (c.inflight IS NULL OR c.lease_until < now())
      AND EXISTS (SELECT 1 FROM lay_c.log l WHERE l.channel_key = c.channel_key AND l.seq > c.pos)
    ORDER BY c.channel_key LIMIT :v FOR NO KEY UPDATE SKIP LOCKED),
took AS MATERIALIZED (
    SELECT t.* FROM cur, LATERAL (
        SELECT l.seq, l.channel_key, l.id, l.payload_json FROM lay_c.log l
        WHERE l.channel_key = cur.channel_key AND l.seq > cur.pos
        ORDER BY l.seq LIMIT 1) t
    LIMIT 100),
claimed AS (
    UPDATE lay_c.cursors c SET inflight = t.seq, lease_until = now() + interval '5 minutes'
    FROM took t WHERE c.channel_key = t.channel_key RETURNING 1)
SELECT COALESCE(array_agg(seq), '{}')::text AS seqs, COALESCE(array_agg(channel_key), '{}')::text AS keys,
       sum(octet_length(payload_json::text)) AS bytes,
       (SELECT count(*) FROM done) AS completed, (SELECT count(*) FROM claimed) AS claimed
FROM took \gset
EOF
cat >"$work/floor-fair.sql" <<'EOF'
DELETE FROM lay_floor.msgs WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM lay_floor.msgs ORDER BY created_at LIMIT 100
    FOR UPDATE SKIP LOCKED)) RETURNING id, payload;
EOF
cp "$work/floor-fair.sql" "$work/floor-chains.sql"

# ---- the enqueue forms: 100 rows a statement on one of 100 channels -------------

cat >"$work/floor-insert.sql" <<'EOF'
\set ch random(0, 99)
INSERT INTO lay_floor.msgs (id, channel, payload)
SELECT gen_random_uuid(), 'c' || :ch, '{"k": 1}' FROM generate_series(1, 100);
EOF
cat >"$work/a-insert.sql" <<'EOF'
\set ch random(0, 99)
INSERT INTO lay_a.mq_msgs (id, attempts, retry_backoff, channel_name, name, payload_json, channel_key)
SELECT gen_random_uuid(), 3, interval '1 second', 'c' || :ch, 'n', '{"k": 1}', :ch
FROM generate_series(1, 100);
EOF
cat >"$work/b-insert.sql" <<'EOF'
\set ch random(0, 99)
INSERT INTO lay_b.msgs (id, channel_key, ready_at, attempt_at, attempts, backoff_ms, channel_name,
                        name, payload_json)
SELECT gen_random_uuid(), :ch, now(), now(), 3, 1000, 'c' || :ch, 'n', '{"k": 1}'
FROM generate_series(1, 100);
EOF
cat >"$work/c-insert.sql" <<'EOF'
\set ch random(0, 99)
WITH lk AS MATERIALIZED (SELECT pg_advisory_xact_lock(:ch) AS l, nextval('lay_c.seq') AS base),
cur AS (INSERT INTO lay_c.cursors (channel_key) SELECT :ch FROM lk ON CONFLICT DO NOTHING RETURNING 1)
INSERT INTO lay_c.log (seq, channel_key, id, attempts, backoff_ms, channel_name, name, payload_json)
SELECT lk.base + g, :ch, gen_random_uuid(), 3, 1000, 'c' || :ch, 'n', '{"k": 1}'
FROM lk, generate_series(1, 100) g;
EOF

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
# Messages processed so far (the backlog was MESSAGES).
processed() {
    case $1 in
    floor) qa -c "SELECT $n - count(*) FROM lay_floor.msgs" ;;
    a) qa -c "SELECT $n - count(*) FROM lay_a.mq_msgs" ;;
    b) qa -c "SELECT $n - count(*) FROM lay_b.msgs" ;;
    c) qa -c "SELECT count(*) FROM lay_c.log l JOIN lay_c.cursors c USING (channel_key) WHERE l.seq <= c.pos" ;;
    esac
}
backlog_left() {
    case $1 in
    floor) qa -c "SELECT count(*) FROM lay_floor.msgs" ;;
    a) qa -c "SELECT count(*) FROM lay_a.mq_msgs" ;;
    b) qa -c "SELECT count(*) FROM lay_b.msgs" ;;
    c) qa -c "SELECT count(*) FROM lay_c.log l JOIN lay_c.cursors c USING (channel_key) WHERE l.seq > c.pos" ;;
    esac
}

declare -A res
# drain LAYOUT CASE CH PER V: one timed drain; records rate, wal, fpi, idx, dead.
drain() {
    local lay=$1 case=$2 ch=$3 per=$4 v=$5 form=fair ordered=0 before after done
    [[ $case == chains ]] && { form=chains; ordered=1; }
    fill "$lay" "$ch" "$ordered"
    read -ra before < <(phys "$lay")
    pgbench -n -M prepared -c 2 -j 2 -T "$secs" -D ids='{}' -D seqs='{}' -D keys='{}' \
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
    pgbench -n -M prepared -c 2 -j 2 -T "$secs" -f "$work/$lay-insert.sql" "$dsn" >"$work/out" 2>&1 ||
        { cat "$work/out" >&2; return 1; }
    read -ra after < <(phys "$lay")
    case $lay in
    floor) rows=$(qa -c "SELECT count(*) FROM lay_floor.msgs") ;;
    a) rows=$(qa -c "SELECT count(*) FROM lay_a.mq_msgs") ;;
    b) rows=$(qa -c "SELECT count(*) FROM lay_b.msgs") ;;
    c) rows=$(qa -c "SELECT count(*) FROM lay_c.log") ;;
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
    [[ $lay == c ]] && q -c "INSERT INTO lay_c.cursors (channel_key) SELECT g FROM generate_series(0, 99) g"
    read -ra before < <(phys "$lay")
    psql -X -q -d "$dsn" -c 'BEGIN ISOLATION LEVEL REPEATABLE READ' -c 'SELECT count(*) FROM pg_class' \
        -c "SELECT pg_sleep($held + 2)" -c COMMIT >/dev/null &
    hpid=$!
    sleep 1
    pgbench -n -M prepared -c 1 -j 1 -R $((rate_offered / 100)) -T "$held" -f "$work/$lay-insert.sql" \
        "$dsn" >"$work/prod" 2>&1 &
    pgbench -n -M prepared -c 2 -j 2 -T "$held" -D ids='{}' -D seqs='{}' -D keys='{}' -D per=25 -D v=5 \
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

q -c 'SET client_min_messages = warning' -c 'DROP SCHEMA lay_floor, lay_a, lay_b, lay_c CASCADE'
