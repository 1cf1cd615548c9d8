#!/bin/sh
# Runs every test suite and prints one closing line "N passed, N failed" (the sum of all suites).
# Suites: the C unit tests (build/unit_tests) and each tests/cli/*.sh script (lib.sh holds their
# shared helpers). Every suite prints
# its own "N passed, N failed" as its last line.
BUILD=${1:-build}
export DS4F_BIN="$PWD/$BUILD/ds4f"
export DS4F_BUILD="$PWD/$BUILD"
total_pass=0
total_fail=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

run_suite() {
    name=$1; shift
    echo "== $name"
    "$@" >"$log" 2>&1
    status=$?
    cat "$log"
    last=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
    if [ -z "$last" ]; then
        echo "FAIL $name: suite ended (status $status) without a result line"
        total_fail=$((total_fail + 1))
        return
    fi
    p=$(echo "$last" | sed -E 's/^([0-9]+) passed.*/\1/')
    f=$(echo "$last" | sed -E 's/.* ([0-9]+) failed$/\1/')
    if [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "FAIL $name: exit status $status"; fi
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
}

run_suite unit "$BUILD/unit_tests"
for script in tests/cli/*.sh; do
    [ -e "$script" ] || continue
    [ "$(basename "$script")" = lib.sh ] && continue   # shared helpers, not a suite
    run_suite "$(basename "$script" .sh)" sh "$script"
done

echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
