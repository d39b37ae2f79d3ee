# shellcheck shell=bash
# bench/layouts-forms.sh: the storage layouts of bench/layouts.sh (rates,
# under pgbench) and bench/layout_instructions.sh (server instructions, in
# a single-user server): their tables, their fills and their statements.
# Sourced; defines functions only.
#
# Every form is written with pgbench's variables (:ids, :seqs, :keys: the
# previous batch; :s, the first channel key of the walk; :per, :v; :ch, the
# producer's channel) and ends in one marked line, "-- out: COLUMNS FROM
# CTE" (the columns and the FROM separated by " ;; "), which layouts_form turns into pgbench's \gset or, for a session
# without variables, into an UPDATE of the state table lay_st.

# The tables of the floor and of layouts b and c (layout a is pqmq's own
# mq_rows, installed by `pqmq migrate --schema lay_a`).
layouts_ddl() {
    cat <<'SQL'
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
CREATE TABLE lay_st (ids uuid[] NOT NULL DEFAULT '{}', seqs bigint[] NOT NULL DEFAULT '{}',
                     keys bigint[] NOT NULL DEFAULT '{}', bytes bigint);
INSERT INTO lay_st DEFAULT VALUES;
SQL
}

# The tables of LAYOUT, as a list of quoted names.
tables_of() {
    case $1 in
    floor) echo "'lay_floor.msgs'" ;;
    a) echo "'lay_a.mq_rows'" ;;
    b) echo "'lay_b.msgs', 'lay_b.extra'" ;;
    c | d) echo "'lay_c.log', 'lay_c.cursors', 'lay_c.claims', 'lay_c.done'" ;;
    esac
}

# fill_sql LAYOUT CHANNELS ORDERED ROWS: a backlog of ROWS messages over
# CHANNELS channels (chains when ORDERED is 1), 100 to a place in time.
fill_sql() {
    local lay=$1 ch=$2 ordered=$3 rows=$4
    local t="now() - interval '1 hour' + (g / 100) * interval '1 ms'"
    case $lay in
    floor)
        echo "TRUNCATE lay_floor.msgs;"
        echo "INSERT INTO lay_floor.msgs SELECT gen_random_uuid(), 'c' || (g % $ch), '{\"k\": 1}', $t
              FROM generate_series(1, $rows) g;" ;;
    a)
        echo "TRUNCATE lay_a.mq_rows;"
        echo "INSERT INTO lay_a.mq_rows (id, attempts, retry_backoff, channel_name, name, payload_json,
                  attempt_at, ready_at, channel_key, after_message_id, chain_seq)
              SELECT gen_random_uuid(), 3, interval '1 second', 'c' || (g % $ch), 'n',
                     '{\"k\": 1}', $t, $t, g % $ch,
                     CASE WHEN $ordered = 1 THEN '00000000-0000-0000-0000-000000000000'::uuid END,
                     CASE WHEN $ordered = 1 THEN g END
              FROM generate_series(1, $rows) g;" ;;
    b)
        echo "TRUNCATE lay_b.msgs;"
        echo "INSERT INTO lay_b.msgs (id, channel_key, ready_at, attempt_at, attempts, backoff_ms,
                  chain_seq, channel_name, name, payload_json)
              SELECT gen_random_uuid(), g % $ch, $t, $t, 3, 1000,
                     CASE WHEN $ordered = 1 THEN g END, 'c' || (g % $ch), 'n', '{\"k\": 1}'
              FROM generate_series(1, $rows) g;" ;;
    c | d)
        echo "TRUNCATE lay_c.log, lay_c.cursors, lay_c.claims, lay_c.done;"
        echo "INSERT INTO lay_c.log (seq, channel_key, id, attempts, backoff_ms, channel_name, name,
                  payload_json)
              SELECT g, g % $ch, gen_random_uuid(), 3, 1000, 'c' || (g % $ch), 'n', '{\"k\": 1}'
              FROM generate_series(1, $rows) g;"
        echo "INSERT INTO lay_c.cursors (channel_key) SELECT g FROM generate_series(0, $ch - 1) g;"
        echo "SELECT setval('lay_c.seq', $rows + 1);" ;;
    esac
}

# layouts_form NAME MODE: form NAME (LAYOUT-fair, LAYOUT-chains,
# LAYOUT-insert), its last line for MODE pgbench (\gset) or state (an UPDATE
# of lay_st; the variables then read lay_st).
layouts_form() {
    local name=$1 mode=$2
    "form_${name//-/_}" | if [[ $mode == pgbench ]]; then
        sed -E '/^-- out: /{ s/^-- out: /SELECT /; s/ ;; FROM / FROM /; s/ ;; /, /g; s/$/ \\gset/; }'
    else
        sed -E "s/:ids::uuid\[\]/(SELECT ids FROM lay_st)::uuid[]/g; s/:seqs::bigint\[\]/(SELECT seqs FROM lay_st)::bigint[]/g;
                s/:keys::bigint\[\]/(SELECT keys FROM lay_st)::bigint[]/g" |
            awk '/^-- out: / { sub(/^-- out: /, ""); n = split($0, c, / ;; /); set = "";
                               for (i = 1; i < n; i++) {
                                   split(c[i], kv, /::text AS | AS /);
                                   set = set (set == "" ? "" : ", ") kv[2] " = (SELECT " kv[1] " " c[n] ")" }
                               print "UPDATE lay_st SET " set ";"; next } { print }'
    fi
}

# a and b: complete the previous batch (fenced: deliveries = 1), then a loose
# scan over the chain keys of PRED's index from :s, at most :v channels, at
# most :per rows of each, claimed with a lease (a HOT update by TID).
fair_lease() {
    local t=$1 pred=$2 backoff=$3
    cat <<SQL
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
-- out: COALESCE(array_agg(id), '{}')::text AS ids ;; sum(octet_length(payload_json::text)) AS bytes ;; FROM claimed
SQL
}

# a and b, chains: each chain key's first live entry (its head), if not in
# flight, locked by TID.
chain_lease() {
    local t=$1 backoff=$2
    cat <<SQL
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
-- out: COALESCE(array_agg(id), '{}')::text AS ids ;; sum(octet_length(payload_json::text)) AS bytes ;; FROM claimed
SQL
}

apred="dead_since IS NULL AND after_message_id IS NULL AND priority <= 0"
form_a_fair() { fair_lease lay_a.mq_rows "$apred" "retry_backoff = retry_backoff * 2"; }
form_b_fair() { fair_lease lay_b.msgs "chain_seq IS NULL" "backoff_ms = backoff_ms * 2"; }
form_a_chains() { chain_lease lay_a.mq_rows "retry_backoff = retry_backoff * 2"; }
form_b_chains() { chain_lease lay_b.msgs "backoff_ms = backoff_ms * 2"; }

# c and d: the cursors of channels with something past their place, from
# :s, at most :v. c locks them (FOR NO KEY UPDATE SKIP LOCKED); d takes a
# channel by its advisory lock (pg_try_advisory_xact_lock in a key space of
# its own: no row lock written) and moves a cursor only from the place it
# read (a cursor moved meanwhile by a consumer that has committed fails the
# test, and its rows are not delivered), so that two consumers never
# deliver one row and never wait for each other. PRED: which cursors may
# take (chains: none with a member in flight).
cursor_pick() {
    local lock=$1 pred=$2
    local scan="SELECT c.channel_key, c.pos FROM lay_c.cursors c
    WHERE c.channel_key >= :s$pred
      AND EXISTS (SELECT 1 FROM lay_c.log l WHERE l.channel_key = c.channel_key AND l.seq > c.pos)
    ORDER BY c.channel_key LIMIT :v"
    if [[ $lock == row ]]; then
        printf 'cur AS (\n    %s FOR NO KEY UPDATE SKIP LOCKED),\n' "$scan"
    else
        printf 'cand AS MATERIALIZED (\n    %s),\n' "$scan"
        printf 'cur AS MATERIALIZED (\n    SELECT * FROM cand WHERE pg_try_advisory_xact_lock(7, cand.channel_key::int)),\n'
    fi
}
# took: at most PER rows of each cursor's channel after its place (with
# LOCK advisory, the place each was read from).
cursor_took() {
    local from=
    [[ $2 == advisory ]] && from=", cur.pos AS from_pos"
    cat <<SQL
took AS MATERIALIZED (
    SELECT t.* FROM cur, LATERAL (
        SELECT l.seq, l.channel_key, l.id, l.payload_json$from FROM lay_c.log l
        WHERE l.channel_key = cur.channel_key AND l.seq > cur.pos
        ORDER BY l.seq LIMIT $1) t
    LIMIT 100),
SQL
}
# d's test that the cursor is still where it was read.
unmoved() { [[ $1 == advisory ]] && printf ' AND c.pos = %s.from_pos%s' "$2" "${3:-}"; }
# What a claim delivers: with LOCK row every row taken, with advisory those
# of the cursors it moved (CTE MOVED); then the marked last line (COLUMNS).
delivered() {
    local lock=$1 moved=$2 cols=$3 src=took
    if [[ $lock == advisory ]]; then
        printf 'got AS (\n    SELECT t.* FROM took t WHERE t.channel_key IN (SELECT m.channel_key FROM %s m))\n' "$moved"
        src=got
    fi
    printf -- '-- out: %s ;; FROM %s\n' "$cols" "$src"
}

# Unordered: a completion is one appended row; a claim moves each cursor to
# the last row taken and appends one receipt row (the ranges taken, an
# element a channel).
cursor_fair() {
    local lock=$1
    cat <<'SQL'
WITH done AS (
    INSERT INTO lay_c.done (seqs) SELECT :seqs::bigint[] WHERE :seqs::bigint[] <> '{}'
    RETURNING 1),
SQL
    cursor_pick "$lock" ""
    cursor_took :per "$lock"
    local from=
    [[ $lock == advisory ]] && from=", min(from_pos) AS from_pos"
    cat <<SQL
moved AS (
    UPDATE lay_c.cursors c SET pos = r.hi
    FROM (SELECT channel_key, min(seq) AS lo, max(seq) AS hi$from
          FROM took GROUP BY channel_key) r
    WHERE c.channel_key = r.channel_key$(unmoved "$lock" r)
    RETURNING c.channel_key, r.lo, r.hi),
receipts AS (
    INSERT INTO lay_c.claims (keys, los, his, lease_until)
    SELECT array_agg(channel_key), array_agg(lo), array_agg(hi), now() + interval '5 minutes'
    FROM moved HAVING count(*) > 0 RETURNING 1)$([[ $lock == advisory ]] && echo ,)
SQL
    delivered "$lock" moved "COALESCE(array_agg(seq), '{}')::text AS seqs ;; sum(octet_length(payload_json::text)) AS bytes"
}

# Chains: the cursor is the receipt: a claim sets the member in flight and
# its lease, a completion moves the cursor past it.
cursor_chains() {
    local lock=$1
    cat <<'SQL'
WITH done AS (
    UPDATE lay_c.cursors c SET pos = c.inflight, inflight = NULL, lease_until = NULL
    WHERE c.channel_key = ANY (:keys::bigint[]) AND c.inflight = ANY (:seqs::bigint[])
    RETURNING 1),
SQL
    cursor_pick "$lock" " AND (c.inflight IS NULL OR c.lease_until < now())"
    cursor_took 1 "$lock"
    cat <<SQL
claimed AS (
    UPDATE lay_c.cursors c SET inflight = t.seq, lease_until = now() + interval '5 minutes'
    FROM took t
    WHERE c.channel_key = t.channel_key$(unmoved "$lock" t "
      AND (c.inflight IS NULL OR c.lease_until < now())")
    RETURNING $([[ $lock == advisory ]] && echo "c.channel_key)," || echo "1)")
SQL
    delivered "$lock" claimed "COALESCE(array_agg(seq), '{}')::text AS seqs ;; COALESCE(array_agg(channel_key), '{}')::text AS keys ;; sum(octet_length(payload_json::text)) AS bytes"
}
form_c_fair() { cursor_fair row; }
form_c_chains() { cursor_chains row; }
form_d_fair() { cursor_fair advisory; }
form_d_chains() { cursor_chains advisory; }
form_floor_fair() {
    cat <<'SQL'
WITH gone AS (
    DELETE FROM lay_floor.msgs WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM lay_floor.msgs ORDER BY created_at LIMIT 100
        FOR UPDATE SKIP LOCKED)) RETURNING id, payload)
-- out: sum(octet_length(payload::text)) AS bytes ;; FROM gone
SQL
}
form_floor_chains() { form_floor_fair; }

# The enqueue forms: 100 rows a statement on channel :ch.
form_floor_insert() {
    cat <<'SQL'
INSERT INTO lay_floor.msgs (id, channel, payload)
SELECT gen_random_uuid(), 'c' || :ch, '{"k": 1}' FROM generate_series(1, 100);
SQL
}
form_a_insert() {
    cat <<'SQL'
INSERT INTO lay_a.mq_rows (id, attempts, retry_backoff, channel_name, name, payload_json, channel_key)
SELECT gen_random_uuid(), 3, interval '1 second', 'c' || :ch, 'n', '{"k": 1}', :ch
FROM generate_series(1, 100);
SQL
}
form_b_insert() {
    cat <<'SQL'
INSERT INTO lay_b.msgs (id, channel_key, ready_at, attempt_at, attempts, backoff_ms, channel_name,
                        name, payload_json)
SELECT gen_random_uuid(), :ch, now(), now(), 3, 1000, 'c' || :ch, 'n', '{"k": 1}'
FROM generate_series(1, 100);
SQL
}
# c's producers take the channel's advisory lock until commit, so that
# places are in commit order and no cursor passes a late committer.
form_c_insert() {
    cat <<'SQL'
WITH lk AS MATERIALIZED (SELECT pg_advisory_xact_lock(:ch) AS l, nextval('lay_c.seq') AS base),
cur AS (INSERT INTO lay_c.cursors (channel_key) SELECT :ch FROM lk ON CONFLICT DO NOTHING RETURNING 1)
INSERT INTO lay_c.log (seq, channel_key, id, attempts, backoff_ms, channel_name, name, payload_json)
SELECT lk.base + g, :ch, gen_random_uuid(), 3, 1000, 'c' || :ch, 'n', '{"k": 1}'
FROM lk, generate_series(1, 100) g;
SQL
}
form_d_insert() { form_c_insert; }
