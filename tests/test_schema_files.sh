#!/usr/bin/env bash
# tests/test_schema_files.sh [SRCDIR]: schema/ is written for its readers
# (docs/sql-contract.md, "The API and the helpers"):
#   - no file of schema/ is over 600 lines;
#   - every function is either API (mq_*) or an internal helper (_mq_*);
#   - every API function's definition is preceded by its header: a
#     "-- Parameters:" line and a "-- Returns: ... Duty: ..." line;
#   - the duties (mq_duties in schema/roles.sql) name API functions only,
#     and every API function but the owner's four is given to a duty.
# Exits 0 when all hold, else 1, naming FILE:LINE for each fault.
set -u
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root/schema" || exit 1
faults=0
fault() {
    echo "FAIL $*"
    faults=$((faults + 1))
}

for f in *.sql; do
    n=$(wc -l <"$f")
    ((n <= 600)) || fault "schema/$f: $n lines (at most 600)"
done

# Every CREATE FUNCTION, with its file, line and name.
defs=$(grep -nE '^CREATE (OR REPLACE )?FUNCTION' ./*.sql |
    sed -E 's#^\./([^:]+):([0-9]+):CREATE (OR REPLACE )?FUNCTION ([A-Za-z_0-9]+).*#\1 \2 \4#')
[[ -n $defs ]] || fault "no function definitions found in $root/schema"
while read -r file line name; do
    case $name in
    _mq_*) continue ;;
    mq_*) ;;
    *) fault "schema/$file:$line: $name is neither API (mq_) nor a helper (_mq_)" && continue ;;
    esac
    head=$(sed -n "$((line > 12 ? line - 12 : 1)),$((line - 1))p" "$file")
    grep -q '^-- Parameters:' <<<"$head" ||
        fault "schema/$file:$line: $name has no '-- Parameters:' header line"
    grep -A3 '^-- Returns: ' <<<"$head" | grep -qE 'Duty: [a-z]' ||
        fault "schema/$file:$line: $name has no '-- Returns: ... Duty: ...' header line"
done <<<"$defs"

# The duties' functions, from mq_duties' VALUES list.
duty_fns=$(sed -n '/FUNCTION mq_duties()/,/^\$\$;/p' roles.sql |
    grep -oE "'(_?mq_[a-z_0-9]+)'" | tr -d "'" | sort -u)
[[ -n $duty_fns ]] || fault "schema/roles.sql: no functions found in mq_duties"
for fn in $duty_fns; do
    [[ $fn == mq_* ]] || fault "schema/roles.sql: mq_duties gives the helper $fn to a duty"
    grep -q " $fn\$" <<<"$defs" || fault "schema/roles.sql: mq_duties names $fn, which schema/ does not define"
done
while read -r file line name; do
    [[ $name == mq_* ]] || continue
    case $name in mq_grant | mq_revoke | mq_create_roles | mq_duties) continue ;; esac
    grep -qx "$name" <<<"$duty_fns" ||
        fault "schema/$file:$line: API function $name is given to no duty (mq_duties)"
done <<<"$defs"

echo "$((faults == 0 ? 1 : 0)) passed, $((faults == 0 ? 0 : 1)) failed"
((faults == 0))
