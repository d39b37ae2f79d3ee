#!/usr/bin/env bash
# bench/ceiling.sh: what a queue with pqmq's guarantees can reach at best,
# against the floor, with the same client (pgbench) for every form.
#
#   bench/ceiling.sh CONNINFO [SECONDS] [ROUNDS] [MESSAGES]
#
# Each form in turn drains a queue of MESSAGES (default 2,000,000) messages of
# 100 channels for SECONDS (default 5) with 2 clients in batches of 100;
# ROUNDS (default 3) times:
#   floor     DELETE ... WHERE ctid = ANY (ARRAY(SELECT ctid ... ORDER BY
#             created_at LIMIT 100 FOR UPDATE SKIP LOCKED)) RETURNING payload:
#             the bench's ctid floor, one statement and one commit a batch.
#   fair      the floor with the same fairness pick as pqmq's poll: its table
#             with an index on (channel, created_at), and a loose index scan
#             over the channels taking at most a quarter of the batch from
#             each (_mq_pick_keys' shape, without a lease, lanes or
#             priorities): what fairness costs on its own.
#   table     the floor's DELETE on pqmq's mq_rows (layout a's row, which
#             holds the queue's exceptions: its indexes, its readiness
#             test): what that table costs.
#   lease     the least SQL a lease needs, on mq_rows and its indexes:
#             one statement a batch deletes the previous batch (by id, fenced
#             by its delivery count) and leases the next (a HOT update by
#             ctid) returning its payloads; no fairness, no counters, no
#             PL/pgSQL. A lease must be written and committed before the
#             handler runs, so it costs a row version more than the floor.
#   lease-ctid  the same, deleting the previous batch by ctid.
#   locked    the least SQL of the locked lane on mq_rows: BEGIN; lock a batch
#             (FOR NO KEY UPDATE SKIP LOCKED) returning payloads; delete it
#             by ctid; COMMIT. The floor's writes, in two statements.
#   pqmq      mq_complete_claim (what pqmq_complete_and_poll sends), and
#   pqmq-locked  mq_claim_lane's lane 1 + mq_complete_all (what
#             pqmq_poll_locked and pqmq_complete_commit send), over
#             a backlog inserted by mq_insert (plain messages: the log).
# Then the inserts, each for SECONDS into an empty table, 100 rows a
# statement:
#   insert-floor  a plain INSERT into the floor's table;
#   insert-table  the same INSERT into pqmq's mq_rows (its row, its indexes);
#   insert-pqmq   mq_insert (what pqmq_insert sends: plain messages go to
#                 the log).
# Prints msg/s per form and round, and each form's ratio to the floor of
# its round. FORMS and IFORMS choose the forms (space-separated; the first
# is the one the others are divided by). Uses schemas "ceiling" (pqmq's migrations, applied here with
# the pqmq command from build/cli) and "ceiling_floor"; drops both.
set -euo pipefail
dsn=${1:?usage: bench/ceiling.sh CONNINFO [SECONDS] [ROUNDS] [MESSAGES]}
secs=${2:-5}
rounds=${3:-3}
n=${4:-2000000}
here=$(cd "$(dirname "$0")" && pwd)
pqmq=${PQMQ_CMD:-$here/../build/cli/pqmq}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
q() { psql -X -q -v ON_ERROR_STOP=1 -d "$dsn" "$@"; }

q -c 'SET client_min_messages = warning' -c 'DROP SCHEMA IF EXISTS ceiling CASCADE' -c 'DROP SCHEMA IF EXISTS ceiling_floor CASCADE' \
    -c 'CREATE SCHEMA ceiling' -c 'CREATE SCHEMA ceiling_floor' -c 'SET search_path = ceiling_floor' \
    -c 'CREATE TABLE msgs (id uuid PRIMARY KEY, channel text NOT NULL, payload jsonb,
                           created_at timestamptz NOT NULL DEFAULT now())' \
    -c 'CREATE INDEX msgs_created_at ON msgs (created_at)' \
    -c 'CREATE TABLE fmsgs (LIKE msgs INCLUDING ALL)' \
    -c 'CREATE INDEX fmsgs_channel ON fmsgs (channel, created_at)'
"$pqmq" -d "$dsn" --schema ceiling migrate >/dev/null 2>&1

# Each form's fill: n messages, 100 channels, in batches of 100 (distinct
# places per batch, as producers give them).
fill_floor() {
    local t=${1:-msgs}
    q -c "TRUNCATE ceiling_floor.$t" -c "INSERT INTO ceiling_floor.$t
          SELECT gen_random_uuid(), 'c' || (g % 100), '{\"k\": 1}',
                 now() - interval '1 hour' + (g / 100) * interval '1 ms'
          FROM generate_series(1, $n) g" -c "VACUUM ANALYZE ceiling_floor.$t"
}
# Every table of the queue's messages and their counters.
queue_tables="ceiling.mq_rows, ceiling.mq_chains, ceiling.mq_log, ceiling.mq_cursors,
    ceiling.mq_cursor_keys, ceiling.mq_receipts, ceiling.mq_done, ceiling.mq_log_gone, ceiling.mq_count_deltas,
    ceiling.mq_count_batches, ceiling.mq_counts"
fill_rows() {
    # The rows mq_insert would write to mq_rows for unordered messages,
    # inserted directly: filling through mq_insert would take longer than
    # the runs (and it puts plain messages in the log).
    q -c "TRUNCATE $queue_tables" \
        -c "INSERT INTO ceiling.mq_rows (id, attempts, retry_backoff, channel_name,
                name, payload_json, attempt_at, ready_at)
            SELECT gen_random_uuid(), 3, interval '1 second', 'c' || (g % 100), 'n',
                   '{\"k\": 1}', t, t
            FROM generate_series(1, $n) g,
                 LATERAL (SELECT now() - interval '1 hour' + (g / 100) * interval '1 ms') s(t)" \
        -c "SELECT ceiling._mq_count_fold()" \
        -c "VACUUM ANALYZE ceiling.mq_rows, ceiling.mq_count_deltas, ceiling.mq_counts" >/dev/null
    # (Rows written by hand are counted a delta row each (_mq_fill_row); the
    # fold and the vacuum leave none, dead or alive, for the runs' own folds
    # to step over: without them every fold of the first minute read the
    # fill's n dead delta rows, and the forms that delete drained at a
    # fifth of their rate.)
}
fill_pqmq() {
    # What producers' plain batches leave: the log and its cursors, through
    # mq_insert, 10,000 messages (its largest batch) a call.
    q -c "TRUNCATE $queue_tables" \
        -c "DO \$\$ BEGIN
                FOR b IN 0 .. ($n - 1) / 10000 LOOP
                    PERFORM ceiling.mq_insert(ARRAY(
                        SELECT ROW(gen_random_uuid(), NULL, 3, interval '1 second',
                                   'c' || (g % 100), '', NULL, false, 'n', '{\"k\": 1}',
                                   NULL)::ceiling.mq_new_t
                        FROM generate_series(b * 10000 + 1, LEAST($n, (b + 1) * 10000)) g));
                END LOOP;
            END \$\$" \
        -c "SELECT ceiling._mq_count_fold()" \
        -c "VACUUM ANALYZE $queue_tables" >/dev/null
}

cat >"$work/floor.sql" <<'EOF'
DELETE FROM ceiling_floor.msgs WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM ceiling_floor.msgs ORDER BY created_at LIMIT 100
    FOR UPDATE SKIP LOCKED)) RETURNING id, payload;
EOF
# The floor's DELETE of a batch picked fairly: channels in key order (a
# loose index scan, at most 2 * 100 + 16 visits, as _mq_pick_set's budget),
# at most 25 messages from each.
cat >"$work/fair.sql" <<'EOF'
WITH RECURSIVE ch(c, n) AS (
    (SELECT channel, 1 FROM ceiling_floor.fmsgs ORDER BY channel LIMIT 1)
    UNION ALL
    SELECT (SELECT f.channel FROM ceiling_floor.fmsgs f WHERE f.channel > ch.c
            ORDER BY f.channel LIMIT 1), ch.n + 1
    FROM ch WHERE ch.c IS NOT NULL AND ch.n < 216)
DELETE FROM ceiling_floor.fmsgs WHERE ctid = ANY (ARRAY(
    SELECT r.ctid FROM ch, LATERAL (
        SELECT f.ctid FROM ceiling_floor.fmsgs f WHERE f.channel = ch.c
        ORDER BY f.created_at LIMIT 25 FOR UPDATE SKIP LOCKED) r
    WHERE ch.c IS NOT NULL LIMIT 100)) RETURNING id, payload;
EOF
# The ready messages of mq_rows, in its ready index's order.
ready="FROM ceiling.mq_rows
        WHERE dead_since IS NULL
          AND after_message_id IS NULL
          AND ready_at > '-infinity' AND attempt_at <= now()
        ORDER BY ready_at LIMIT 100"
cat >"$work/table.sql" <<EOF
DELETE FROM ceiling.mq_rows WHERE ctid = ANY (ARRAY(
    SELECT ctid $ready FOR UPDATE SKIP LOCKED)) RETURNING id, payload_json;
EOF
# The least lease: the previous batch deleted by COLUMN (id or ctid, kept in
# the pgbench variable VAR of type TYPE), the next leased, in one statement.
lease_sql() {
    local column=$1 var=$2 type=$3
    cat <<EOF
WITH done AS (
    DELETE FROM ceiling.mq_rows WHERE $column = ANY (:$var::${type}[]) AND deliveries = 1
    RETURNING 1),
claimed AS (
    UPDATE ceiling.mq_rows SET attempt_at = now() + interval '5 minutes',
                               deliveries = deliveries + 1
    WHERE ctid = ANY (ARRAY(SELECT ctid $ready FOR NO KEY UPDATE SKIP LOCKED))
    RETURNING $column, payload_json)
SELECT COALESCE(array_agg($column), '{}')::text AS $var,
       sum(octet_length(payload_json::text)) AS bytes,
       (SELECT count(*) FROM done) AS completed
FROM claimed \gset
EOF
}
lease_sql id ids uuid >"$work/lease.sql"
lease_sql ctid tids tid >"$work/lease-ctid.sql"
cat >"$work/locked.sql" <<EOF
BEGIN;
SELECT COALESCE(array_agg(ctid), '{}')::text AS tids,
       sum(octet_length(payload_json::text)) AS bytes
FROM (SELECT ctid, payload_json $ready FOR NO KEY UPDATE SKIP LOCKED) s \gset
DELETE FROM ceiling.mq_rows WHERE ctid = ANY (:tids::tid[]);
COMMIT;
EOF
cat >"$work/pqmq.sql" <<'EOF'
SELECT COALESCE(array_agg((c.job).id) FILTER (WHERE (c.job).id IS NOT NULL), '{}')::text AS ids,
       COALESCE(array_agg((c.job).attempt) FILTER (WHERE (c.job).id IS NOT NULL), '{}')::text AS atts,
       sum(octet_length((c.job).payload_json)) AS bytes
FROM ceiling.mq_complete_claim(:ids::uuid[], :atts::int[], NULL, 100) c \gset
EOF
cat >"$work/pqmq-locked.sql" <<'EOF'
BEGIN;
SELECT COALESCE(array_agg((j).id) FILTER (WHERE (j).id IS NOT NULL), '{}')::text AS ids,
       -- a locked delivery is completed as attempt 0 (pqmq__batch_set_locked)
       COALESCE(array_agg(0) FILTER (WHERE (j).id IS NOT NULL), '{}')::text AS atts,
       sum(octet_length((j).payload_json)) AS bytes
FROM ceiling.mq_claim_lane(NULL, 100, 1) j \gset
SELECT ceiling.mq_complete_all(:ids::uuid[], :atts::int[]);
COMMIT;
EOF

# Runs one form for $secs seconds; prints msg/s (messages gone from the
# table over pgbench's duration; the table must not run dry).
drain() {
    local form=$1 left table=ceiling.mq_rows
    [[ $form == floor ]] && table=ceiling_floor.msgs
    [[ $form == fair ]] && table=ceiling_floor.fmsgs
    # (pqmq's forms: the live messages, wherever they are)
    [[ $form == pqmq* ]] && table=ceiling.mq_msgs
    pgbench -n -M prepared -c 2 -j 2 -T "$secs" -D ids='{}' -D atts='{}' -D tids='{}' \
        -f "$work/$form.sql" "$dsn" >"$work/out" 2>&1 || {
        cat "$work/out" >&2
        return 1
    }
    left=$(q -Atc "SELECT count(*) FROM $table")
    ((left > 0)) || { echo "ceiling: $form ran dry; give it more messages" >&2; return 1; }
    echo "($n - $left) / $secs" | bc -l | xargs printf '%.0f\n'
}

# The inserts: 100 rows a statement on one of the 100 channels, generated
# by the server alike for every form.
cat >"$work/insert-floor.sql" <<'EOF'
\set ch random(0, 99)
INSERT INTO ceiling_floor.msgs (id, channel, payload)
SELECT gen_random_uuid(), 'c' || :ch, '{"k": 1}' FROM generate_series(1, 100);
EOF
cat >"$work/insert-table.sql" <<'EOF'
\set ch random(0, 99)
INSERT INTO ceiling.mq_rows (id, attempts, retry_backoff, channel_name, name, payload_json,
                             channel_key)
SELECT gen_random_uuid(), 3, interval '1 second', 'c' || :ch, 'n', '{"k": 1}',
       (hashtext('c' || :ch)::bigint << 32) | (hashtext('')::bigint & 4294967295)
FROM generate_series(1, 100);
EOF
cat >"$work/insert-pqmq.sql" <<'EOF'
\set ch random(0, 99)
SELECT ceiling.mq_insert(ARRAY(
    SELECT ROW(gen_random_uuid(), NULL, 3, interval '1 second', 'c' || :ch, '', NULL,
               false, 'n', '{"k": 1}', NULL)::ceiling.mq_new_t
    FROM generate_series(1, 100)));
EOF

# Runs one insert form for $secs seconds into an empty table; prints msg/s.
insert() {
    local form=$1 table=ceiling.mq_rows
    [[ $form == insert-floor ]] && table=ceiling_floor.msgs
    [[ $form == insert-pqmq ]] && table=ceiling.mq_msgs
    q -c "TRUNCATE ceiling_floor.msgs, $queue_tables" \
        -c "VACUUM ANALYZE ceiling_floor.msgs, $queue_tables" -c CHECKPOINT
    pgbench -n -M prepared -c 2 -j 2 -T "$secs" -f "$work/$form.sql" "$dsn" \
        >"$work/out" 2>&1 || {
        cat "$work/out" >&2
        return 1
    }
    echo "$(q -Atc "SELECT count(*) FROM $table") / $secs" | bc -l | xargs printf '%.0f\n'
}

# Prints "label: form rate (ratio to the first form) ...".
report() {
    local label=$1 r=$2 line
    shift 2
    line="round $r, $label:"
    for f in "$@"; do
        line+=$(printf ' %s %s (%.2f)' "$f" "${rate[$r,$f]}" \
            "$(echo "${rate[$r,$f]} / ${rate[$r,$1]}" | bc -l)")
    done
    echo "$line"
}

declare -A rate
read -ra forms <<<"${FORMS:-floor fair table lease lease-ctid locked pqmq pqmq-locked}"
read -ra iforms <<<"${IFORMS:-insert-floor insert-table insert-pqmq}"
for r in $(seq 1 "$rounds"); do
    for f in "${forms[@]}"; do
        case $f in
        floor) fill_floor ;;
        fair) fill_floor fmsgs ;;
        pqmq*) fill_pqmq ;;
        *) fill_rows ;;
        esac
        rate[$r,$f]=$(drain "$f")
    done
    for f in "${iforms[@]}"; do
        rate[$r,$f]=$(insert "$f")
    done
    report processing "$r" "${forms[@]}"
    report enqueue "$r" "${iforms[@]}"
done
q -c 'SET client_min_messages = warning' -c 'DROP SCHEMA ceiling CASCADE' \
    -c 'DROP SCHEMA ceiling_floor CASCADE'
