# tests/lib.sh: what the shell tests share; they source it. Defines:
#   t_need_dsn                  exits 77 (skip) unless PQMQ_TEST_DSN is set;
#   t_need_program PATH WHAT [HINT]
#                               exits 1 unless PATH is an executable;
#   t_need_tools TOOL...        exits 1 naming the first TOOL not on PATH;
#   fail MESSAGE                prints a failed check and counts it in
#                               $failed (the test sets it to 0 first);
#   sql SQL                     the result of SQL on $schema (psql, unaligned,
#                               tuples only, stops at the first error).

# shellcheck shell=bash disable=SC2154 # schema and failed are the test's

t_need_dsn() {
    if [[ -z ${PQMQ_TEST_DSN:-} ]]; then
        echo "SKIP: PQMQ_TEST_DSN is not set (tests/run-tests.sh sets it)"
        exit 77
    fi
}

t_need_program() {
    if [[ ! -x $1 ]]; then
        echo "FAIL: no $2 at $1${3:+ ($3)}"
        exit 1
    fi
}

t_need_tools() {
    local tool
    for tool in "$@"; do
        if ! command -v "$tool" >/dev/null 2>&1; then
            case $tool in
            psql) echo "FAIL: psql not found (Debian package: postgresql-client)" ;;
            *) echo "FAIL: $tool not found (Debian package: $tool)" ;;
            esac
            exit 1
        fi
    done
}

fail() {
    echo "FAIL: $*"
    failed=$((failed + 1))
}

# has FILE TEXT...: each TEXT is in $work/FILE (fixed strings).
has() {
    local f=$work/$1 s
    shift
    for s in "$@"; do
        grep -qF -- "$s" "$f" || fail "$(basename "$f") lacks \"$s\": $(head -c 400 "$f")"
    done
}

sql() {
    PGOPTIONS="-c search_path=$schema -c client_min_messages=warning" \
        psql -X -q -At -v ON_ERROR_STOP=1 -d "$PQMQ_TEST_DSN" -c "$1"
}
