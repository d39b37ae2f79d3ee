#!/usr/bin/env bash
# tests/test_serve_local.sh [PQMQ]: what another local process can do to
# pqmq serve (docs/security.md, "pqmq serve and local processes"), against
# the server in $PQMQ_TEST_DSN, in a schema of its own that it drops at the
# end. curl and bash only (tests/test_serve.sh drives the page in Chromium):
#
#   - connections held half-open cannot lock others out: /metrics and
#     /healthz still answer, and a GET cannot hold its request open with a
#     body it trickles;
#   - a request without a Host (or with an empty one) is refused, except
#     /metrics;
#   - --listen on an address that is not loopback warns;
#   - --admin-token-file: a private file's token, which the page does not
#     carry, is what a POST needs; a file open to others, a short token, or
#     the option without --admin are refused;
#   - a role without USAGE on the schema is told so, not that the schema
#     does not exist.
#
# Skips (77) without PQMQ_TEST_DSN or in a build without libmicrohttpd.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
pqmq_bin=${1:-${PQMQ_TEST_BUILDDIR:-.}/cli/pqmq}
# shellcheck source=tests/lib.sh
. "$here/lib.sh"

t_need_dsn
t_need_program "$pqmq_bin" "pqmq command"
t_need_tools psql curl
if ! "$pqmq_bin" serve --help >/dev/null 2>&1; then
    echo "SKIP: pqmq was built without libmicrohttpd (configure --with-microhttpd)"
    exit 77
fi

schema=serve_local_$$
role=serve_local_nobody_$$
work=$(mktemp -d)
failed=0
pids=()
slow=()

cleanup() {
    local p fd
    for fd in "${slow[@]}"; do
        exec {fd}<&-
    done
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
    done
    psql -X -q -d "$PQMQ_TEST_DSN" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1
    psql -X -q -d "$PQMQ_TEST_DSN" -c "DROP ROLE IF EXISTS $role" >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT

pqmq() {
    "$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$schema" "$@"
}

# start_server NAME ARGS...: pqmq serve on a free loopback port; sets $port
# and appends its pid to pids; output in $work/NAME.out and .err.
start_server() {
    local name=$1
    shift
    "$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$schema" serve --listen 127.0.0.1:0 --interval 1 \
        "$@" >"$work/$name.out" 2>"$work/$name.err" &
    pids+=($!)
    port=
    for _ in $(seq 100); do
        port=$(sed -n 's|^pqmq serve: listening on http://127.0.0.1:\([0-9]*\)/.*|\1|p' \
            "$work/$name.out")
        [[ -n $port ]] && return 0
        kill -0 "${pids[-1]}" 2>/dev/null || break
        sleep 0.1
    done
    echo "FAIL: pqmq serve $* did not start: $(cat "$work/$name.err")"
    exit 1
}

# http EXPECTED_STATUS CURL_ARGS... URL_PATH: the body in $work/body.
http() {
    local want=$1 code
    shift
    local path=${*: -1}
    code=$(curl -sS --max-time 10 -o "$work/body" -w '%{http_code}' \
        "${@:1:$#-1}" "http://127.0.0.1:$port$path" 2>"$work/curl.err")
    [[ $code == "$want" ]] ||
        fail "$* answered $code, expected $want: $(head -c 300 "$work/body" "$work/curl.err")"
}

# raw REQUEST: sends it as it is; the answer's first line in $work/status.
raw() {
    local fd
    exec {fd}<>"/dev/tcp/127.0.0.1/$port" || return 1
    (printf '%b' "$1" >&"$fd") 2>/dev/null
    timeout 10 head -n 1 <&"$fd" >"$work/status" 2>/dev/null
    exec {fd}<&-
}

psql -X -q -d "$PQMQ_TEST_DSN" -c "CREATE SCHEMA $schema" >/dev/null ||
    { echo "FAIL: cannot create schema $schema"; exit 1; }
pqmq migrate >/dev/null 2>&1 || { echo "FAIL: pqmq migrate"; exit 1; }
dead_id=$(pqmq send --retries 0 mail welcome)
sql "SELECT mq_fail(id, 'SMTP 550') FROM mq_claim('{mail}', 1)" >/dev/null

# --- held connections do not lock others out ---------------------------------
echo "== held connections (at ${SECONDS}s)"
# The default --timeout (15 s): the held connections outlive the checks.
start_server held
# Twice the connection limit, each with half a request, all from one
# address, as one local process can.
for i in $(seq 128); do
    exec {fd}<>"/dev/tcp/127.0.0.1/$port" || { fail "cannot open held connection $i"; break; }
    # In a subshell: a server that closes first must not SIGPIPE this script.
    (printf 'GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Held: ' >&"$fd") 2>/dev/null
    slow+=("$fd")
done
sleep 0.5
http 200 /metrics
grep -q '^pqmq_messages{channel="mail",state="dead"} 1' "$work/body" ||
    fail "/metrics under held connections: $(head -c 200 "$work/body")"
http 200 /healthz
http 200 /api/state
# A GET with a body it never finishes would keep its request in progress.
raw 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\nx'
grep -q '^HTTP/1.1 413' "$work/status" || fail "a GET with a body: not 413: $(cat "$work/status")"
kill -0 "${pids[-1]}" 2>/dev/null || fail "the server died under held connections"
for fd in "${slow[@]}"; do
    exec {fd}<&-
done
slow=()

# --- the Host header ------------------------------------------------------------
echo "== the Host header (at ${SECONDS}s)"
raw 'GET /api/state HTTP/1.0\r\n\r\n'
grep -q '^HTTP/1.1 403' "$work/status" || fail "HTTP/1.0 without Host: not 403: $(cat "$work/status")"
raw 'GET / HTTP/1.0\r\nHost:\r\n\r\n'
grep -q '^HTTP/1.1 403' "$work/status" || fail "an empty Host: not 403: $(cat "$work/status")"
raw 'GET /metrics HTTP/1.0\r\n\r\n'
grep -q '^HTTP/1.1 200' "$work/status" || fail "/metrics without Host: not 200: $(cat "$work/status")"
grep -q "is not a loopback address" "$work/held.err" && fail "a loopback address warned: $(cat "$work/held.err")"

# --- --listen on an address that is not loopback -------------------------------
echo "== --listen 0.0.0.0 (at ${SECONDS}s)"
timeout 5 "$pqmq_bin" -d "$PQMQ_TEST_DSN" --schema "$schema" serve --listen 0.0.0.0:0 \
    >"$work/any.out" 2>"$work/any.err"
rc=$?
[[ $rc == 124 ]] || fail "serve --listen 0.0.0.0:0 exited $rc: $(cat "$work/any.err")"
grep -q "0.0.0.0:0 is not a loopback address" "$work/any.err" ||
    fail "no warning for --listen 0.0.0.0: $(cat "$work/any.err")"

# --- --admin-token-file ---------------------------------------------------------
echo "== --admin-token-file (at ${SECONDS}s)"
secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf '%s\n' "$secret" >"$work/token"
chmod 644 "$work/token"
pqmq serve --listen 127.0.0.1:0 --admin --admin-token-file "$work/token" >/dev/null 2>"$work/err"
rc=$?
[[ $rc == 1 ]] || fail "a token file open to others: exit $rc, expected 1"
grep -q "open to other users" "$work/err" || fail "token file 0644: $(cat "$work/err")"
chmod 600 "$work/token"
pqmq serve --listen 127.0.0.1:0 --admin-token-file "$work/token" >/dev/null 2>"$work/err"
rc=$?
[[ $rc == 2 ]] || fail "--admin-token-file without --admin: exit $rc, expected 2"
printf 'short\n' >"$work/short"
chmod 600 "$work/short"
pqmq serve --listen 127.0.0.1:0 --admin --admin-token-file "$work/short" >/dev/null 2>"$work/err"
rc=$?
[[ $rc == 1 ]] || fail "a short token: exit $rc, expected 1"

start_server tokenfile --admin --admin-token-file "$work/token"
http 200 /
grep -qF "$secret" "$work/body" && fail "the page carries the token file's secret"
grep -q 'name="pqmq-token" content=""' "$work/body" || fail "the page's token is not empty"
origin="Origin: http://127.0.0.1:$port"
post() { # STATUS TOKEN
    http "$1" -X POST -H "Content-Type: application/x-www-form-urlencoded" -H "$origin" \
        -H "X-Pqmq-Token: $2" --data-binary "id=$dead_id" /api/retry
}
post 403 ""
post 403 "$(printf '%064d' 0)"
grep -q "the first line of the --admin-token-file" "$work/body" ||
    fail "the refusal does not name the token file: $(cat "$work/body")"
[[ $(sql "SELECT dead_since IS NOT NULL FROM mq_msgs WHERE id = '$dead_id'") == t ]] ||
    fail "a POST without the file's token retried the message"
post 200 "$secret"
[[ $(sql "SELECT dead_since IS NULL FROM mq_msgs WHERE id = '$dead_id'") == t ]] ||
    fail "a POST with the file's token did not retry the message"

# --- a role without USAGE on the schema ---------------------------------------------
echo "== a role without USAGE (at ${SECONDS}s)"
# (Keyword conninfo only: a later keyword overrides an earlier one.)
if [[ $PQMQ_TEST_DSN != *://* ]]; then
    psql -X -q -d "$PQMQ_TEST_DSN" -c "CREATE ROLE $role LOGIN" >/dev/null ||
        fail "cannot create role $role"
    for cmd in status "serve --listen 127.0.0.1:0"; do
        # shellcheck disable=SC2086
        "$pqmq_bin" -d "$PQMQ_TEST_DSN user=$role" --schema "$schema" $cmd >/dev/null \
            2>"$work/err"
        rc=$?
        [[ $rc == 1 ]] || fail "$cmd without USAGE: exit $rc, expected 1"
        grep -qF "permission denied for schema \"$schema\"" "$work/err" ||
            fail "$cmd without USAGE: $(cat "$work/err")"
    done
    "$pqmq_bin" -d "$PQMQ_TEST_DSN user=$role" --schema "no_such_$$" status >/dev/null \
        2>"$work/err"
    grep -qF "schema \"no_such_$$\" does not exist" "$work/err" ||
        fail "a missing schema: $(cat "$work/err")"
fi

for p in "${pids[@]}"; do
    kill -TERM "$p"
    wait "$p"
    rc=$?
    [[ $rc == 0 ]] || fail "pqmq serve exited $rc on SIGTERM"
done
pids=()

if ((failed > 0)); then
    echo "$failed check(s) failed"
    exit 1
fi
echo "ok: pqmq serve against other local processes"
exit 0
