# shellcheck shell=bash
# bench/scratch_cluster.sh: the throwaway cluster of the callgrind scripts
# (insert_instructions.sh, layout_instructions.sh). Sourced from a script
# that has set $here to its own folder; it starts a cluster (tests/pgtmp.sh)
# in a fresh folder $work, stops and removes both when the script exits,
# and defines q (psql on the cluster). The caller stops the server before
# it runs the single-user one.
# shellcheck source=tests/pgtmp.sh
. "$here/../tests/pgtmp.sh"
command -v valgrind >/dev/null || { echo "needs valgrind" >&2; exit 1; }
work=$(mktemp -d)
chmod 755 "$work"
trap 'pgtmp_stop; rm -rf "$work"' EXIT
pgtmp_start "$work" || exit 1
q() { psql -X -q -v ON_ERROR_STOP=1 -d "$PGTMP_DSN" "$@"; }
