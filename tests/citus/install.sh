#!/usr/bin/env bash
# tests/citus/install.sh: make sure the PostgreSQL server that the tests use
# has the Citus extension, building it from source when it has none.
#
#   tests/citus/install.sh BUILDDIR
#
# Citus is not in Debian's archive, and this machine reaches no other
# package source, so the tests build the release the project pins from its
# source tarball (found in $PQMQ_CITUS_TARBALL, else in shared/vendor/
# beside the checkout or one of the directories above it, else in
# /work/shared/vendor), in BUILDDIR/citus-VERSION, and install it into the
# server's library and extension directories. The build is kept there: a
# second run only installs it again (a package upgrade may have replaced
# the server's directories). Users install Citus from its own packages
# instead (docs/citus.md).
#
# As root, the Debian packages the build needs are installed with apt-get;
# otherwise the apt-get line is printed. Prints "citus: ..." lines; exits
# non-zero, with the reason, when Citus cannot be had: 3 when the server has
# none and no tarball is found.
set -euo pipefail

version=13.2.2
builddir=${1:?usage: tests/citus/install.sh BUILDDIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/../.." && pwd)

say() { printf 'citus: %s\n' "$*"; }

# shellcheck source=tests/pgtmp.sh
. "$top/tests/pgtmp.sh"
pgtmp_find_bindir || exit 1
pg_config=$PGTMP_BINDIR/pg_config
[[ -x $pg_config ]] || pg_config=$(command -v pg_config || true)
major=$("$PGTMP_BINDIR/postgres" --version | sed -E 's/.* ([0-9]+)\..*/\1/')

installed() {
    [[ -x $pg_config ]] &&
        [[ -f $("$pg_config" --pkglibdir)/citus.so ]] &&
        [[ -f $("$pg_config" --sharedir)/extension/citus.control ]]
}

packages() {
    # The server's headers; zstd and lz4 (columnar storage, whatever
    # configure is told: the server was built with them); gssapi's headers,
    # which libpq-be.h includes.
    local -a want=("postgresql-server-dev-$major" libzstd-dev liblz4-dev libkrb5-dev make gcc)
    local -a missing=()
    local p
    command -v dpkg >/dev/null 2>&1 || return 0
    for p in "${want[@]}"; do
        dpkg -s "$p" 2>/dev/null | grep -q '^Status: install ok installed' || missing+=("$p")
    done
    (( ${#missing[@]} == 0 )) && return 0
    if [[ $(id -u) != 0 ]]; then
        say "missing packages: ${missing[*]}" >&2
        say "  sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
        exit 1
    fi
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null ||
        { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
}

# The source tarball: $PQMQ_CITUS_TARBALL, else shared/vendor/ beside the
# checkout or beside any directory above it, else /work/shared/vendor.
tarball() {
    local t d=$top
    t=${PQMQ_CITUS_TARBALL:-}
    [[ -n $t && -f $t ]] && { printf '%s\n' "$t"; return 0; }
    while [[ $d != / ]]; do
        t=$(dirname "$d")/shared/vendor/citus-$version.tar.gz
        [[ -f $t ]] && { printf '%s\n' "$t"; return 0; }
        d=$(dirname "$d")
    done
    t=/work/shared/vendor/citus-$version.tar.gz
    [[ -f $t ]] && { printf '%s\n' "$t"; return 0; }
    return 1
}

build() {
    local src=$builddir/citus-$version compat
    if [[ ! -f $src/.built ]]; then
        rm -rf "$src"
        mkdir -p "$builddir"
        tar -xzf "$(tarball)" -C "$builddir"
        # Recent minor releases of PostgreSQL 15 (15.20 here) export
        # have_createdb_privilege, which this release of Citus defines for
        # itself as a static function; keep the server's.
        compat=$src/src/include/pg_version_compat.h
        if grep -q 'have_createdb_privilege' \
               "$("$pg_config" --includedir-server)/commands/dbcommands.h"; then
            sed -i 's/^have_createdb_privilege(void)$/citus_own_have_createdb_privilege(void)/' \
                "$compat"
        fi
        say "building Citus $version in $src (a few minutes)"
        (cd "$src" && ./configure --without-libcurl PG_CONFIG="$pg_config" >configure.out 2>&1 &&
            make -j2 >make.out 2>&1) || {
            say "the build failed; see $src/configure.out and $src/make.out" >&2
            exit 1
        }
        touch "$src/.built"
    fi
    (cd "$src" && make install >install.out 2>&1) || {
        say "make install failed; see $src/install.out" >&2
        exit 1
    }
}

if installed; then
    say "the server has Citus"
    exit 0
fi
# Exit status 3: no Citus and nothing to build it from (tests/citus/check.sh
# then skips, saying so).
if ! tarball >/dev/null; then
    say "no Citus in the server and no citus-$version.tar.gz to build it from" >&2
    say "(put it in ../shared/vendor/ or set PQMQ_CITUS_TARBALL)" >&2
    exit 3
fi
packages
pg_config=$PGTMP_BINDIR/pg_config
[[ -x $pg_config ]] || pg_config=$(command -v pg_config)
build
installed || { say "installed, but the server does not see it" >&2; exit 1; }
say "installed Citus $version into $("$pg_config" --pkglibdir)"
