#!/usr/bin/env bash
# tests/test_man.sh [LIBPATH]: the manual pages are well-formed and complete.
#
#   - man/pqmq.1 and man/pqmq.3 format with no warning from
#     `man --warnings -l` (groff's warnings: bad requests, macros, escapes);
#   - every symbol the shared library exports (found as tests/test_symbols.sh
#     finds them: nm -D --defined-only, names starting with pqmq_) is
#     documented in pqmq(3) as a function entry;
#   - every subcommand the pqmq command lists in its --help has a section in
#     pqmq(1).
#
# LIBPATH defaults to $PQMQ_TEST_LIBPATH (make check sets it); the pqmq
# command is ${PQMQ_TEST_BUILDDIR:-.}/cli/pqmq. Exits 0 on success, 1 on
# failure (naming what is wrong).

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mandir=$here/../man
lib=${1:-${PQMQ_TEST_LIBPATH:-}}
pqmq_bin=${PQMQ_TEST_BUILDDIR:-.}/cli/pqmq
rc=0

for tool in man nm; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "FAIL: $tool not found (Debian packages: man-db groff-base binutils)"
        exit 1
    fi
done
if [[ -z $lib || ! -f $lib ]]; then
    echo "FAIL: no shared library at '$lib' (set PQMQ_TEST_LIBPATH)"
    exit 1
fi

for page in "$mandir/pqmq.1" "$mandir/pqmq.3"; do
    if [[ ! -s $page ]]; then
        echo "FAIL: $page is missing or empty"
        rc=1
        continue
    fi
    warnings=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -E UTF-8 -l "$page" 2>&1 >/dev/null)
    if [[ -n $warnings ]]; then
        echo "FAIL: man --warnings -l $page:"
        echo "$warnings"
        rc=1
    fi
done

# A function entry in pqmq(3) is a .BI line naming the function before "(".
missing=()
count=0
while read -r _addr type name; do
    name=${name%%@*}
    [[ $name == pqmq_* ]] || continue
    case $type in [TtDdBbRrGgSsWwVvi]) ;; *) continue ;; esac
    count=$((count + 1))
    grep -qE "^\.BI \"[^\"]*[ *]$name\(\"" "$mandir/pqmq.3" || missing+=("$name")
done < <(nm -D --defined-only "$lib")
if ((count == 0)); then
    echo "FAIL: nm found no pqmq_ symbols in $lib"
    rc=1
fi
if ((${#missing[@]} > 0)); then
    echo "FAIL: exported but not documented in pqmq(3):"
    printf '  %s\n' "${missing[@]}"
    rc=1
fi

if [[ -x $pqmq_bin ]]; then
    cmds=$("$pqmq_bin" --help | awk '/^commands:/ {on = 1; next} on && /^  [a-z]/ {print $1} on && /^$/ {on = 0}')
    [[ -n $cmds ]] || { echo "FAIL: pqmq --help lists no commands"; rc=1; }
    for c in $cmds; do
        grep -qx "\.SS $c" "$mandir/pqmq.1" || { echo "FAIL: pqmq(1) has no section for '$c'"; rc=1; }
    done
else
    echo "FAIL: no pqmq command at $pqmq_bin"
    rc=1
fi

((rc == 0)) && echo "ok: pqmq(1) and pqmq(3) format cleanly; $count exported symbols documented"
exit "$rc"
