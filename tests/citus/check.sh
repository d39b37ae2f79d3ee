#!/usr/bin/env bash
# tests/citus/check.sh: make check-citus. Runs pqmq's behaviour on a Citus
# cluster on loopback: a coordinator and two workers (tests/citus/cluster.sh),
# Citus built first when the server has none (tests/citus/install.sh, cached
# in BUILDDIR/citus-VERSION).
#
#   tests/citus/check.sh          (from the build directory, as make runs it)
#
# Every test program listed below runs against the coordinator: each makes
# its own queue (a schema, which pqmq_migrate distributes; Citus places the
# schemas of the programs over both workers). tests/citus/test_citus then
# checks what only a cluster shows: two queues on two workers, a worker
# stopped while both are busy. The exactly-once example runs under kill -9
# through the coordinator too, and the pqmq command's tests. Prints the runner's summary as the last line,
# "N passed, M failed".
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/../.." && pwd)
builddir=$PWD

echo "== Citus: the extension"
bash "$here/install.sh" "$builddir/citus"
rc=$?
if (( rc == 3 )); then
    echo "SKIP: check-citus: no Citus, and no source to build it from (above)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
elif (( rc != 0 )); then
    echo "check-citus: Citus could not be built or installed (above)"
    echo "0 passed, 1 failed"
    exit 1
fi

# shellcheck source=tests/citus/cluster.sh
. "$here/cluster.sh"
trap 'citus_stop' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "== Citus: a coordinator and two workers"
mkdir -p "$builddir/citus-run"
if ! citus_start "$builddir/citus-run"; then
    echo "check-citus: the cluster did not start (above)"
    echo "0 passed, 1 failed"
    exit 1
fi
echo "coordinator: $CITUS_DSN"

# How tests/citus/test_citus stops and starts worker 0.
export PQMQ_CITUS_WORKER_STOP="bash '$here/node.sh' stop '${CITUS_WORKER_DIR[0]}' ${CITUS_WORKER_PORT[0]}"
export PQMQ_CITUS_WORKER_START="bash '$here/node.sh' start '${CITUS_WORKER_DIR[0]}' ${CITUS_WORKER_PORT[0]}"
export PQMQ_CITUS_WORKER_PORT=${CITUS_WORKER_PORT[0]}

# The core behaviours, through the coordinator. Left out, as they test a
# single server's own machinery: test_migrate (psql installs, catalogue
# fingerprints), test_hardening (psql installs by hostile roles), test_plans
# (EXPLAIN of the server's plans), and the pooler tests.
tests=(insert order concurrency twophase dead lifecycle complete_poll poll client
       payload notify runner runner_locked locked priority unique schedule
       metrics roles sqlxmq pause story)
progs=()
for t in "${tests[@]}"; do
    progs+=("./tests/test_$t")
done
progs+=(./tests/citus/test_citus "$top/tests/test_exactly_once.sh" "$top/tests/test_cli.sh")

PQMQ_TEST_DSN=$CITUS_DSN PQMQ_TEST_CITUS=1 PQMQ_TEST_LOGDIR=$builddir/tests/citus \
    bash "$top/tests/run-tests.sh" "${progs[@]}"
