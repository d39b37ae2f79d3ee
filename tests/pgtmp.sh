# shellcheck shell=bash disable=SC2034  # PGTMP_* are for the caller
# tests/pgtmp.sh: a throwaway PostgreSQL cluster for tests and benchmarks.
# Source it from bash; it defines two functions and sets no traps:
#
#   pgtmp_start PARENT  initdb into a fresh PARENT/tmp-pgdata-XXXXXX, start the
#                       server on a free port (unix socket in that directory,
#                       TCP on 127.0.0.1 only) and set
#                         PGTMP_DSN   "host=SOCKETDIR port=PORT user=USER dbname=postgres"
#                         PGTMP_HOST PGTMP_PORT PGTMP_USER PGTMP_DIR PGTMP_LOG
#                       Returns non-zero, with the reason on stderr, on failure.
#   pgtmp_stop          stop the server (fast, else immediate) and remove the
#                       directory. Safe to call at any point, also twice, and
#                       after a failed pgtmp_start: call it from a trap.
#
# As root, initdb and postgres run as the "postgres" user (they refuse to run
# as root) and the cluster's superuser is "postgres"; otherwise both are the
# current user. Authentication is "trust": keep the cluster private.
#
# Settings from the environment:
#   PQMQ_PG_BINDIR   directory holding initdb, pg_ctl and postgres (default:
#                    PATH, else the newest /usr/lib/postgresql/*/bin)
#   PGTMP_CONF       extra lines appended to postgresql.conf
#   PGTMP_KEEP=1     keep the directory after pgtmp_stop (for debugging)

PGTMP_DIR=
PGTMP_SOCKDIR_EXTRA=
PGTMP_RUNAS=

pgtmp_say() {
    printf 'pgtmp: %s\n' "$*" >&2
}

# Sets PGTMP_BINDIR to a directory with initdb, pg_ctl and postgres.
pgtmp_find_bindir() {
    local d c
    local -a candidates=()
    if [[ -n ${PQMQ_PG_BINDIR:-} ]]; then
        candidates=("$PQMQ_PG_BINDIR")
    else
        if c=$(command -v pg_ctl 2>/dev/null); then
            candidates+=("$(dirname "$c")")
        fi
        # Debian keeps the server binaries out of PATH, one dir per major
        # version; newest first.
        # shellcheck disable=SC2012
        while IFS= read -r d; do
            [[ -n $d ]] && candidates+=("$d")
        done < <(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5nr)
        if c=$(command -v pg_config 2>/dev/null) && d=$("$c" --bindir 2>/dev/null); then
            candidates+=("$d")
        fi
    fi
    for d in "${candidates[@]}"; do
        if [[ -x $d/initdb && -x $d/pg_ctl && -x $d/postgres ]]; then
            PGTMP_BINDIR=$d
            return 0
        fi
    done
    if [[ -n ${PQMQ_PG_BINDIR:-} ]]; then
        pgtmp_say "PQMQ_PG_BINDIR=$PQMQ_PG_BINDIR has no initdb, pg_ctl and postgres"
    else
        pgtmp_say "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PATH or /usr/lib/postgresql/*/bin"
        pgtmp_say "install them (Debian: apt-get install postgresql), set PQMQ_PG_BINDIR, or set PQMQ_TEST_DSN to an existing server"
    fi
    return 1
}

# Runs a command as the cluster's owner, from /, where the owner can be.
pgtmp_run() {
    if [[ -z $PGTMP_RUNAS ]]; then
        (cd / && "$@")
    elif command -v runuser >/dev/null 2>&1; then
        (cd / && runuser -u "$PGTMP_RUNAS" -- "$@")
    else
        (cd / && su "$PGTMP_RUNAS" -s /bin/sh -c "$(printf '%q ' "$@")")
    fi
}

# Quotes a value for a libpq conninfo string when it needs it.
pgtmp_conninfo_quote() {
    local v=$1
    if [[ $v =~ ^[A-Za-z0-9_./:-]+$ ]]; then
        printf '%s' "$v"
    else
        v=${v//\\/\\\\}
        v=${v//\'/\\\'}
        printf "'%s'" "$v"
    fi
}

# True when something accepts TCP connections on 127.0.0.1:PORT.
pgtmp_port_busy() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Makes a fresh directory for the owner under $1 (mktemp template); falls back
# to /tmp when the owner cannot write there (e.g. a build tree under /root).
pgtmp_mkdir() {
    local template=$1 fallback=$2 d
    d=$(mktemp -d "$template") || return 1
    if [[ -n $PGTMP_RUNAS ]]; then
        chown "$PGTMP_RUNAS:" "$d" || { rmdir "$d"; return 1; }
        if ! pgtmp_run test -w "$d"; then
            rmdir "$d"
            d=$(mktemp -d "$fallback") || return 1
            chown "$PGTMP_RUNAS:" "$d" || { rmdir "$d"; return 1; }
        fi
    fi
    printf '%s' "$d"
}

pgtmp_start() {
    local parent=${1:?usage: pgtmp_start PARENT_DIR}
    local data sockdir port first attempt conf_sockdir

    pgtmp_find_bindir || return 1
    parent=$(cd "$parent" && pwd) || return 1

    if [[ $(id -u) == 0 ]]; then
        if ! id -u postgres >/dev/null 2>&1; then
            pgtmp_say "running as root, but there is no 'postgres' user to run the server as"
            pgtmp_say "create one (Debian: apt-get install postgresql), run as another user, or set PQMQ_TEST_DSN"
            return 1
        fi
        PGTMP_RUNAS=postgres
        PGTMP_USER=postgres
    else
        PGTMP_RUNAS=
        PGTMP_USER=$(id -un)
    fi

    PGTMP_DIR=$(pgtmp_mkdir "$parent/tmp-pgdata-XXXXXX" /tmp/tmp-pgdata-XXXXXX) || {
        PGTMP_DIR=
        pgtmp_say "cannot make a directory for the cluster under $parent"
        return 1
    }
    data=$PGTMP_DIR/data
    PGTMP_LOG=$PGTMP_DIR/postgres.log

    # A unix socket path is limited to about 107 bytes.
    sockdir=$PGTMP_DIR
    if (( ${#sockdir} + 16 > 100 )); then  # 16: "/.s.PGSQL.65535"
        sockdir=$(pgtmp_mkdir /tmp/pqmq-sock-XXXXXX /tmp/pqmq-sock-XXXXXX) || return 1
        PGTMP_SOCKDIR_EXTRA=$sockdir
    fi

    if ! pgtmp_run "$PGTMP_BINDIR/initdb" -D "$data" -U "$PGTMP_USER" \
            --auth=trust --encoding=UTF8 --locale=C --no-sync \
            >"$PGTMP_DIR/initdb.log" 2>&1; then
        pgtmp_say "initdb failed:"
        tail -n 20 "$PGTMP_DIR/initdb.log" >&2
        return 1
    fi

    conf_sockdir=${sockdir//\'/\'\'}
    cat >>"$data/postgresql.conf" <<EOF

# --- added by pgtmp.sh (throwaway test cluster) ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '$conf_sockdir'
max_connections = 200
shared_buffers = 128MB
${PGTMP_CONF:-}
EOF

    # Start on a free port: from a random start, skip ports in use, and try
    # the next one when the server loses a race for its port.
    first=$(( 20000 + RANDOM % 30000 ))
    for (( attempt = 0; attempt < 50; attempt++ )); do
        port=$(( first + attempt ))
        pgtmp_port_busy "$port" && continue
        : >"$PGTMP_LOG"
        [[ -n $PGTMP_RUNAS ]] && chown "$PGTMP_RUNAS:" "$PGTMP_LOG"
        if pgtmp_run "$PGTMP_BINDIR/pg_ctl" -D "$data" -l "$PGTMP_LOG" -w -t 60 \
                -o "-p $port" start >/dev/null 2>&1; then
            PGTMP_PORT=$port
            PGTMP_HOST=$sockdir
            PGTMP_DSN="host=$(pgtmp_conninfo_quote "$sockdir") port=$port user=$(pgtmp_conninfo_quote "$PGTMP_USER") dbname=postgres"
            if [[ -x $PGTMP_BINDIR/pg_isready ]] &&
                ! "$PGTMP_BINDIR/pg_isready" -q -h "$sockdir" -p "$port" -t 10; then
                pgtmp_say "server started but pg_isready does not see it; log:"
                tail -n 20 "$PGTMP_LOG" >&2
                return 1
            fi
            return 0
        fi
        # Stop whatever may be half up before retrying or giving up.
        pgtmp_run "$PGTMP_BINDIR/pg_ctl" -D "$data" -m immediate -w stop >/dev/null 2>&1
        if ! grep -qE 'could not bind|Address already in use|could not create any TCP/IP sockets' "$PGTMP_LOG"; then
            pgtmp_say "the server did not start; log ($PGTMP_LOG):"
            tail -n 20 "$PGTMP_LOG" >&2
            return 1
        fi
    done
    pgtmp_say "no free port found (tried $first..$port)"
    return 1
}

# pgtmp_finish LOGDIR: if this shell started a server, keeps its log as
# LOGDIR/postgres.log (beside the tests' logs) and stops it.
pgtmp_finish() {
    [[ -n ${PGTMP_DIR:-} ]] || return 0
    [[ -f ${PGTMP_LOG:-} ]] && cp -f "$PGTMP_LOG" "$1/postgres.log" 2>/dev/null
    pgtmp_stop
}

pgtmp_stop() {
    local data pid
    [[ -n ${PGTMP_DIR:-} ]] || return 0
    data=$PGTMP_DIR/data
    if [[ -f $data/postmaster.pid && -n ${PGTMP_BINDIR:-} ]]; then
        pgtmp_run "$PGTMP_BINDIR/pg_ctl" -D "$data" -m fast -w -t 30 stop >/dev/null 2>&1 ||
            pgtmp_run "$PGTMP_BINDIR/pg_ctl" -D "$data" -m immediate -w -t 30 stop >/dev/null 2>&1
        if [[ -f $data/postmaster.pid ]]; then
            pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null)
            [[ $pid =~ ^[0-9]+$ ]] && kill -KILL "$pid" 2>/dev/null
        fi
    fi
    if [[ ${PGTMP_KEEP:-0} == 1 ]]; then
        pgtmp_say "kept $PGTMP_DIR"
    else
        rm -rf "$PGTMP_DIR"
        [[ -n $PGTMP_SOCKDIR_EXTRA ]] && rm -rf "$PGTMP_SOCKDIR_EXTRA"
    fi
    PGTMP_DIR=
    PGTMP_SOCKDIR_EXTRA=
    PGTMP_DSN=
    return 0
}
