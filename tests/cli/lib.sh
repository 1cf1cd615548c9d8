# Shared helpers for the CLI test scripts: pass/fail counting and the closing result line.
passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; }
# Sets $tmp to a temporary directory removed when the script exits (call it directly, not in $(...)).
setup_tmp() {
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/ds4f-test.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
}
# expect_failure NAME REGEX CMD...: the command must exit non-zero and print REGEX on stderr/stdout.
expect_failure() {
    name=$1; pattern=$2; shift 2
    out=$("$@" 2>&1)
    status=$?
    if [ $status -ne 0 ] && printf '%s' "$out" | grep -q -- "$pattern"; then
        pass "$name"
    else
        fail "$name (status $status, output: $(printf '%s' "$out" | tail -2))"
    fi
}
finish() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}
