#!/usr/bin/env bash
# tests/test_symbols.sh [LIBPATH [HEADER]]: the shared library exports only
# the public API.
#
# Every symbol the library defines in its dynamic symbol table must start
# with "pqmq_", and there must be at least one. When HEADER (include/pqmq.h)
# is given, each exported name must also appear in it: anything not in the
# header is not API and must stay hidden (lib code marks API with PQMQ_EXPORT
# and is compiled with -fvisibility=hidden).
#
# LIBPATH and HEADER default to $PQMQ_TEST_LIBPATH and $PQMQ_TEST_HEADER,
# which make check sets (lib/.libs/libpqmq.so, include/pqmq.h).
# Exits 0 on success, 1 on failure (printing the offending names).

set -u

lib=${1:-${PQMQ_TEST_LIBPATH:-}}
header=${2:-${PQMQ_TEST_HEADER:-}}

if [[ -z $lib ]]; then
    echo "usage: $0 LIBPATH [HEADER] (or set PQMQ_TEST_LIBPATH)" >&2
    exit 1
fi
if [[ ! -f $lib ]]; then
    echo "no shared library at $lib (configured with --disable-shared?)" >&2
    exit 1
fi
if ! command -v nm >/dev/null 2>&1; then
    echo "nm not found (Debian package: binutils)" >&2
    exit 1
fi

if ! out=$(nm -D --defined-only "$lib"); then
    echo "nm -D --defined-only $lib failed" >&2
    exit 1
fi

exported=()
bad=()
while read -r _addr type name; do
    [[ -n ${name:-} ]] || continue
    name=${name%%@*}            # drop a symbol version (name@@VER)
    case $type in
        [TtDdBbRrGgSsWwVvi]) ;;
        *) continue ;;           # absolute (A) and other linker markers
    esac
    case $name in
        # Linker and C runtime symbols, and sanitizer instrumentation.
        _init | _fini | _edata | _end | __bss_start | __bss_end__ | _bss_end__ | \
        __end__ | __data_start | data_start | _DYNAMIC | _GLOBAL_OFFSET_TABLE_ | \
        _IO_stdin_used | __dso_handle | __TMC_END__ | _ITM_* | __gmon_start__ | \
        __asan_* | __ubsan_* | __odr_asan* | __sanitizer_* | __lsan_*)
            continue ;;
    esac
    exported+=("$name")
    [[ $name == pqmq_* ]] || bad+=("$name ($type)")
done <<<"$out"

rc=0
if (( ${#bad[@]} > 0 )); then
    echo "exported symbols without the pqmq_ prefix (mark only API with PQMQ_EXPORT):"
    printf '  %s\n' "${bad[@]}"
    rc=1
fi

count=0
for name in "${exported[@]}"; do
    [[ $name == pqmq_* ]] && count=$((count + 1))
done
if (( count == 0 )); then
    echo "no pqmq_ symbols exported by $lib: is PQMQ_EXPORT defined when PQMQ_BUILDING is?"
    rc=1
fi

if [[ -n $header ]]; then
    if [[ ! -f $header ]]; then
        echo "no header at $header" >&2
        exit 1
    fi
    missing=()
    for name in "${exported[@]}"; do
        [[ $name == pqmq_* ]] || continue
        grep -qw -- "$name" "$header" || missing+=("$name")
    done
    if (( ${#missing[@]} > 0 )); then
        echo "exported but not declared in $header (internal names must stay hidden):"
        printf '  %s\n' "${missing[@]}"
        rc=1
    fi
fi

(( rc == 0 )) && echo "ok: $count pqmq_ symbols exported by $lib, nothing else"
exit "$rc"
