#!/usr/bin/env bash
# tests/test_install.sh: `make install` gives users what the README promises.
#
# Installs the build tree into a scratch DESTDIR, then checks: the shared and
# static libraries, pqmq.h, pqmq.pc and the schema as one plain SQL script
# (share/pqmq/pqmq.sql, every file of migrations/ and schema/ in it) are
# there; a program built with `pkg-config --cflags --libs pqmq` (and one
# linked statically, with --static) compiles, links and runs against the
# installed copy; the examples build with -std=c11 -Wall -Wextra -Werror
# against it.
#
# make check sets PQMQ_TEST_BUILDDIR, PQMQ_MIGRATIONS_DIR, PQMQ_TEST_CC and
# PQMQ_TEST_CFLAGS / PQMQ_TEST_LDFLAGS (configure's, so that a sanitizer
# build links its own runtime). Exits 0 on success, 1 on failure.
# PQMQ_KEEP=1 keeps the scratch directory for a look.

set -u

build=${PQMQ_TEST_BUILDDIR:-.}
migrations=${PQMQ_MIGRATIONS_DIR:-}
cc=${PQMQ_TEST_CC:-cc}
cflags=${PQMQ_TEST_CFLAGS:-}
ldflags=${PQMQ_TEST_LDFLAGS:-}
make_cmd=${MAKE:-make}

fail=0
problem() {
    echo "FAIL: $*"
    fail=1
}

dest=$(mktemp -d "${TMPDIR:-/tmp}/pqmq-install.XXXXXX") || exit 1
trap '[[ -n ${PQMQ_KEEP:-} ]] || rm -rf "$dest"' EXIT

if ! "$make_cmd" -s -C "$build" install DESTDIR="$dest" >"$dest/install.log" 2>&1; then
    cat "$dest/install.log"
    echo "FAIL: make install DESTDIR=$dest"
    exit 1
fi

# Where the files landed: the .pc file names the prefix.
pc=$(find "$dest" -name pqmq.pc -path '*/pkgconfig/*' | head -n 1)
[[ -n $pc ]] || { echo "FAIL: no pkgconfig/pqmq.pc installed"; exit 1; }
prefix=$(sed -n 's/^prefix=//p' "$pc")
root=$dest$prefix
libdir=$(dirname "$(dirname "$pc")")
echo "installed under $root"

for f in "$root/include/pqmq.h" "$libdir/libpqmq.so" "$libdir/libpqmq.a"; do
    [[ -e $f ]] || problem "missing $f"
done
ls "$libdir"/libpqmq.so.* >/dev/null 2>&1 || problem "no versioned libpqmq.so.N"

# The pqmq command and the manual pages.
for f in "$root/bin/pqmq" "$root/share/man/man1/pqmq.1" "$root/share/man/man3/pqmq.3"; do
    [[ -e $f ]] || problem "missing $f"
done
if [[ -x $root/bin/pqmq ]]; then
    LD_LIBRARY_PATH=$libdir "$root/bin/pqmq" --help 2>&1 | grep -q "usage: pqmq" \
        || problem "the installed pqmq does not run"
fi

# The install script, as built, with every file of migrations/ and schema/.
if [[ -n $migrations ]]; then
    cmp -s "$build/pqmq.sql" "$root/share/pqmq/pqmq.sql" \
        || problem "share/pqmq/pqmq.sql is not the pqmq.sql of the build"
    for f in "$migrations"/*.sql "$migrations"/../schema/*.sql; do
        name=$(basename "$(dirname "$f")")/$(basename "$f")
        grep -qxF -- "-- $name" "$root/share/pqmq/pqmq.sql" \
            || problem "share/pqmq/pqmq.sql lacks $name"
    done
fi

# A user's program, through pkg-config only.
cat >"$dest/user.c" <<'EOF'
#include <pqmq.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    uuid_t a, b;
    pqmq_uuid_generate(a);
    pqmq_uuid_generate(b);
    pqmq_msg *m = pqmq_msg_new();
    int ok = memcmp(a, b, sizeof a) < 0 && m &&
             pqmq_msg_set_channel(m, "orders", NULL) == PQMQ_OK &&
             pqmq_msg_set_channel(NULL, "orders", NULL) == PQMQ_EINVAL;
    pqmq_msg_free(m);
    printf("%s\n", ok ? "linked" : "broken");
    return ok ? 0 : 1;
}
EOF
# The .pc as installed, moved to where DESTDIR put it (--define-variable
# would move libpq's and uuid's too).
mkdir -p "$dest/pc"
sed "s|^prefix=.*|prefix=$root|" "$pc" >"$dest/pc/pqmq.pc"
export PKG_CONFIG_PATH=$dest/pc${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
# Static: libpqmq.a, then what the .pc says it needs, public and private
# (Debian's libpq has no static archive, so those stay shared).
requires=$(sed -n 's/^Requires: *//p' "$pc")
private=$(sed -n 's/^Libs.private: *//p' "$pc")
private_pkgs=$(sed -n 's/^Requires.private: *//p' "$pc")
for mode in shared static; do
    if [[ $mode == shared ]]; then
        flags=$(pkg-config --cflags --libs pqmq 2>&1) \
            || { problem "pkg-config --cflags --libs pqmq: $flags"; continue; }
    else
        # shellcheck disable=SC2086 # package lists
        flags="$(pkg-config --cflags pqmq) -L$libdir -Wl,-Bstatic -lpqmq -Wl,-Bdynamic
               $private $(pkg-config --libs $requires $private_pkgs)" \
            || { problem "pkg-config for the static link failed"; continue; }
    fi
    out=$dest/user-$mode
    # shellcheck disable=SC2086 # flags and cflags are word lists
    if ! "$cc" $cflags "$dest/user.c" -o "$out" $flags $ldflags \
        >"$dest/cc-$mode.log" 2>&1; then
        cat "$dest/cc-$mode.log"
        problem "cannot build a program against the installed library ($mode)"
        continue
    fi
    result=$(LD_LIBRARY_PATH=$libdir "$out" 2>&1)
    if [[ $result != linked ]]; then
        problem "the $mode program printed: $result"
        continue
    fi
    echo "ok: a program built with pkg-config's flags runs ($mode)"
done

# The examples, as a user copies them: C11 and no warning, against the
# installed header (feature macros for what C11 leaves out, e.g. nanosleep).
examples=$(cd "$(dirname "${BASH_SOURCE[0]}")/../examples" && pwd)
if flags=$(pkg-config --cflags --libs pqmq 2>&1); then
    for ex in "$examples"/*.c; do
        name=$(basename "$ex" .c)
        # shellcheck disable=SC2086 # flags and cflags are word lists
        if "$cc" $cflags -std=c11 -Wall -Wextra -Werror "$ex" -o "$dest/ex-$name" $flags \
            $ldflags >"$dest/ex-$name.log" 2>&1; then
            echo "ok: examples/$name.c builds with -std=c11 -Wall -Wextra -Werror"
        else
            head -n 5 "$dest/ex-$name.log"
            problem "examples/$name.c does not build warning-free with -std=c11"
        fi
    done
fi

if [[ -x $dest/user-static ]] && ldd "$dest/user-static" 2>/dev/null | grep -q libpqmq; then
    problem "the static program still loads libpqmq.so"
fi

exit $fail
