#!/usr/bin/env bash
# tests/citus/node.sh stop|start DIR PORT: stops a node of the test cluster
# at once (pg_ctl -m immediate: a crash, as far as the other nodes can tell)
# or starts it again on the same port. DIR is the node's tests/pgtmp.sh
# directory (CITUS_WORKER_DIR[i] of tests/citus/cluster.sh). The commands
# run as the owner of the data directory, as pgtmp.sh runs them.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/pgtmp.sh
. "$here/../pgtmp.sh"
pgtmp_find_bindir

what=${1:?usage: node.sh stop|start DIR PORT}
dir=${2:?usage: node.sh stop|start DIR PORT}
port=${3:?usage: node.sh stop|start DIR PORT}
PGTMP_RUNAS=
if [[ $(id -u) == 0 ]]; then
    PGTMP_RUNAS=$(stat -c %U "$dir/data")
fi
case $what in
stop) pgtmp_run "$PGTMP_BINDIR/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null ;;
start)
    pgtmp_run "$PGTMP_BINDIR/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
        -o "-p $port" start >/dev/null
    ;;
*)
    echo "usage: node.sh stop|start DIR PORT" >&2
    exit 2
    ;;
esac
