# shellcheck shell=bash disable=SC2034  # PGB_* are for the caller
# tests/pgbouncer.sh: a throwaway PgBouncer in transaction pooling mode in
# front of a PostgreSQL server, for tests and benchmarks. Source it from
# bash; it defines two functions and sets no traps:
#
#   pgb_start DSN [strict]  start pgbouncer in front of the server DSN
#                    reaches (through that server's unix socket directory and
#                    port, so the server must be on this machine) and set
#                      PGB_DSN   "host=127.0.0.1 port=PORT user=USER dbname=DB"
#                      PGB_DIR PGB_LOG PGB_PORT
#                    With "strict", every transaction ends with DISCARD ALL
#                    (server_reset_query_always): anything that leans on
#                    session state (prepared statements, SET, LISTEN,
#                    session advisory locks) breaks every time instead of
#                    sometimes. Returns non-zero, with the reason on stderr.
#   pgb_stop         stop it and remove its directory; safe to call twice
#                    and after a failed pgb_start (call it from a trap).
#
# Any role may log in (auth_type trust; roles not in the auth file are
# looked up with auth_query as the DSN's user), options in the startup
# packet are ignored as PgBouncer 1.18 cannot carry them (a pooled session
# gets its search_path from ALTER ROLE/DATABASE ... SET). Pools are small
# (4 server connections per user and database) so that clients share them.
# As root it runs as "postgres", like tests/pgtmp.sh runs the server.
# Environment: PGB_BIN (default: pgbouncer in PATH, else /usr/sbin/pgbouncer).

PGB_DIR=
PGB_PID=

pgb_find() {
    local b=${PGB_BIN:-}
    [[ -z $b ]] && b=$(command -v pgbouncer 2>/dev/null)
    [[ -z $b && -x /usr/sbin/pgbouncer ]] && b=/usr/sbin/pgbouncer
    [[ -n $b && -x $b ]] || return 1
    PGB_BIN=$b
}

pgb_start() {
    local dsn=${1:?usage: pgb_start DSN [strict]} strict=${2:-} sockdir port user db
    local runas= first attempt
    pgb_find || { echo "pgbouncer: binary not found" >&2; return 1; }
    pgb_q() { psql "$dsn" -X -At -v ON_ERROR_STOP=1 -c "$1"; }
    sockdir=$(pgb_q "SHOW unix_socket_directories") || return 1
    sockdir=${sockdir%%,*}
    port=$(pgb_q "SHOW port") || return 1
    user=$(pgb_q "SELECT current_user") || return 1
    db=$(pgb_q "SELECT current_database()") || return 1
    [[ $(id -u) == 0 ]] && runas=postgres

    PGB_DIR=$(mktemp -d /tmp/pqmq-pgb-XXXXXX) || return 1
    [[ -n $runas ]] && chown "$runas:" "$PGB_DIR"
    PGB_LOG=$PGB_DIR/pgbouncer.log
    printf '"%s" ""\n' "$user" >"$PGB_DIR/users.txt"

    first=$(( 20000 + RANDOM % 30000 ))
    for (( attempt = 0; attempt < 30; attempt++ )); do
        PGB_PORT=$(( first + attempt ))
        (exec 3<>"/dev/tcp/127.0.0.1/$PGB_PORT") 2>/dev/null && continue
        cat >"$PGB_DIR/pgbouncer.ini" <<EOF
[databases]
* = host=$sockdir port=$port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGB_PORT
unix_socket_dir = $PGB_DIR
pidfile = $PGB_DIR/pgbouncer.pid
logfile = $PGB_LOG
pool_mode = transaction
default_pool_size = 4
max_client_conn = 500
auth_type = trust
auth_file = $PGB_DIR/users.txt
auth_user = $user
ignore_startup_parameters = extra_float_digits, options
server_reset_query = DISCARD ALL
server_reset_query_always = $([[ $strict == strict ]] && echo 1 || echo 0)
server_check_delay = 0
log_connections = 0
log_disconnections = 0
EOF
        [[ -n $runas ]] && chown -R "$runas:" "$PGB_DIR"
        if [[ -n $runas ]]; then
            (cd / && runuser -u "$runas" -- "$PGB_BIN" -d -q "$PGB_DIR/pgbouncer.ini")
        else
            (cd / && "$PGB_BIN" -d -q "$PGB_DIR/pgbouncer.ini")
        fi
        PGB_DSN="host=127.0.0.1 port=$PGB_PORT user=$user dbname=$db"
        local i
        for (( i = 0; i < 50; i++ )); do
            if psql "$PGB_DSN" -X -At -c "SELECT 1" >/dev/null 2>&1; then
                PGB_PID=$(cat "$PGB_DIR/pgbouncer.pid" 2>/dev/null)
                return 0
            fi
            sleep 0.1
        done
        [[ -f $PGB_DIR/pgbouncer.pid ]] && kill "$(cat "$PGB_DIR/pgbouncer.pid")" 2>/dev/null
        grep -q "Address already in use" "$PGB_LOG" 2>/dev/null && continue
        echo "pgbouncer did not start; log:" >&2
        tail -n 20 "$PGB_LOG" >&2
        return 1
    done
    echo "pgbouncer: no free port" >&2
    return 1
}

pgb_stop() {
    [[ -n ${PGB_DIR:-} ]] || return 0
    local pid=${PGB_PID:-}
    [[ -z $pid && -f $PGB_DIR/pgbouncer.pid ]] && pid=$(cat "$PGB_DIR/pgbouncer.pid")
    if [[ $pid =~ ^[0-9]+$ ]]; then
        kill -INT "$pid" 2>/dev/null
        for (( i = 0; i < 50; i++ )); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null
    fi
    rm -rf "$PGB_DIR"
    PGB_DIR= PGB_PID= PGB_DSN=
    return 0
}
