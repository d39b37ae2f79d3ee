#!/usr/bin/env bash
# tests/test_quickstart.sh: ./quickstart builds pqmq serve for both of its
# commands: its build step, run for "bench" and for "test" against a
# configure and a make that only record their arguments, passes
# --with-microhttpd to configure; and both commands want libmicrohttpd-dev.
# Needs no server. Exits 0 on success, 1 listing every failed check.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
qs=$here/../quickstart
work=$(mktemp -d)
failed=0
trap 'rm -rf "$work"' EXIT

fail() {
    echo "FAIL: $*"
    failed=$((failed + 1))
}

[[ -f $qs ]] || { echo "FAIL: no quickstart at $qs"; exit 1; }
# The step's function, as quickstart defines it.
sed -n '/^build() {/,/^}/p' "$qs" >"$work/build.sh"
grep -q "^build() {" "$work/build.sh" || { echo "FAIL: no build() in quickstart"; exit 1; }

mkdir -p "$work/top" "$work/bin"
printf '#!/bin/sh\necho "$@" >"%s/configure.args"\n' "$work" >"$work/top/configure"
printf '#!/bin/sh\nexit 0\n' >"$work/bin/make"
chmod +x "$work/top/configure" "$work/bin/make"

for cmd in bench test; do
    rm -rf "$work/dir" "$work/configure.args"
    (
        PATH=$work/bin:$PATH
        top=$work/top
        say() { :; }
        # shellcheck disable=SC1091
        . "$work/build.sh"
        build "$work/dir"
    ) >/dev/null 2>&1 || fail "$cmd: the build step failed"
    grep -q -- "--with-microhttpd" "$work/configure.args" 2>/dev/null ||
        fail "./quickstart $cmd configures without --with-microhttpd: $(cat "$work/configure.args" 2>/dev/null)"
done

# The package list: libmicrohttpd-dev is wanted whatever the command.
sed -n '/^ensure_packages() {/,/^}/p' "$qs" >"$work/ensure.sh"
grep -qE '^ *want\+=\(libmicrohttpd-dev\)' "$work/ensure.sh" ||
    fail "libmicrohttpd-dev is not wanted for every command: $(grep -n libmicrohttpd "$work/ensure.sh")"

if ((failed)); then
    echo "$failed check(s) failed"
    exit 1
fi
echo "ok - ./quickstart builds pqmq serve for bench and test"
