# shellcheck shell=bash disable=SC2034  # CITUS_* are for the caller
# tests/citus/cluster.sh: a throwaway Citus cluster on loopback, a coordinator
# and two workers, each a tests/pgtmp.sh cluster. Source it from bash:
#
#   citus_start PARENT   start the three servers (shared_preload_libraries =
#                        citus), create the extension in each, register the
#                        coordinator and add the workers; sets
#                          CITUS_DSN          the coordinator's conninfo
#                          CITUS_WORKER_DSN   the workers' (an array)
#                          CITUS_WORKER_DIR   their directories (an array)
#                          CITUS_WORKER_PORT  their ports (an array)
#                        Returns non-zero, with the reason on stderr.
#   citus_stop           stop all three and remove them (safe to call twice,
#                        and after a failed citus_start: call it from a trap).
#   citus_worker_stop N  stop worker N (0 or 1) at once (pg_ctl -m immediate)
#   citus_worker_start N start it again on the same port
#
# Requires Citus in the server's extension directory (tests/citus/install.sh).

_citus_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/pgtmp.sh
. "$_citus_here/../pgtmp.sh"

CITUS_DSN=
CITUS_WORKER_PORT=()
CITUS_WORKER_DSN=()
CITUS_WORKER_DIR=()
_citus_dirs=()
_citus_socks=()
_citus_ports=()

# _citus_node PARENT: one server, remembered for citus_stop.
_citus_node() {
    PGTMP_DIR=
    PGTMP_SOCKDIR_EXTRA=
    PGTMP_CONF="shared_preload_libraries = 'citus'
max_prepared_transactions = 100
citus.log_remote_commands = off
${CITUS_EXTRA_CONF:-}" pgtmp_start "$1" || return 1
    _citus_dirs+=("$PGTMP_DIR")
    _citus_socks+=("$PGTMP_SOCKDIR_EXTRA")
    psql -X -q -v ON_ERROR_STOP=1 -d "$PGTMP_DSN" -c 'CREATE EXTENSION citus' >/dev/null || {
        pgtmp_say "CREATE EXTENSION citus failed in $PGTMP_DIR"
        return 1
    }
}

citus_start() {
    local parent=${1:?usage: citus_start PARENT} i
    _citus_node "$parent" || return 1
    CITUS_DSN=$PGTMP_DSN
    local coord_port=$PGTMP_PORT
    CITUS_WORKER_DSN=()
    CITUS_WORKER_DIR=()
    for i in 0 1; do
        _citus_node "$parent" || return 1
        CITUS_WORKER_DSN+=("$PGTMP_DSN")
        CITUS_WORKER_DIR+=("$PGTMP_DIR")
        _citus_ports+=("$PGTMP_PORT")
    done
    CITUS_WORKER_PORT=("${_citus_ports[@]}")
    # Nodes reach each other over TCP on loopback (pgtmp.sh listens there,
    # with trust authentication).
    psql -X -q -v ON_ERROR_STOP=1 -d "$CITUS_DSN" \
        -c "SELECT citus_set_coordinator_host('127.0.0.1', $coord_port)" \
        -c "SELECT citus_add_node('127.0.0.1', ${_citus_ports[0]})" \
        -c "SELECT citus_add_node('127.0.0.1', ${_citus_ports[1]})" >/dev/null || {
        pgtmp_say "could not add the workers to the coordinator"
        return 1
    }
}

citus_worker_stop() {
    bash "$_citus_here/node.sh" stop "${CITUS_WORKER_DIR[$1]}" "${_citus_ports[$1]}"
}

citus_worker_start() {
    bash "$_citus_here/node.sh" start "${CITUS_WORKER_DIR[$1]}" "${_citus_ports[$1]}"
}

citus_stop() {
    local i
    for i in "${!_citus_dirs[@]}"; do
        PGTMP_DIR=${_citus_dirs[$i]}
        PGTMP_SOCKDIR_EXTRA=${_citus_socks[$i]}
        pgtmp_stop
    done
    _citus_dirs=()
    _citus_socks=()
    _citus_ports=()
}
