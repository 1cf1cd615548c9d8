#!/bin/sh
# `ds4f logits` on the golden checkpoints: the output file passes every golden check (the same
# checks as the unit tests, read back from the file), and bad input is refused clearly.
. "$(dirname "$0")/lib.sh"
setup_tmp

for case in small wide; do
    ref=tests/data/golden/$case
    flags="--all"
    [ "$case" = small ] && flags="--all --mtp"
    if "$DS4F_BIN" logits -m "$ref" --tokens "$ref/tokens.json" --out "$tmp/$case.safetensors" $flags >"$tmp/log" 2>&1; then
        pass "logits --all on $case runs"
        if "$DS4F_BUILD/tools/golden_check" "$ref/reference.safetensors" "$tmp/$case.safetensors" >"$tmp/check" 2>&1; then
            pass "logits output of $case passes the golden checks"
        else
            fail "logits output of $case fails the golden checks: $(grep FAIL "$tmp/check" | head -3)"
        fi
    else
        fail "logits --all on $case: $(tail -2 "$tmp/log")"
    fi
done

# --mtp wrote T-1 rows of MTP logits (checked by reading the header).
if grep -q '"mtp_logits":{"dtype":"F32","shape":\[399,1024\]' "$tmp/small.safetensors"; then
    pass "mtp_logits has T-1 rows"
else
    fail "mtp_logits missing or of the wrong shape"
fi

printf '{"tokens": [1, 2, 99999]}' >"$tmp/bad.json"
expect_failure "token outside the vocabulary is refused" "tokens\[2\] is not a token id" \
    "$DS4F_BIN" logits -m tests/data/golden/small --tokens "$tmp/bad.json" --out "$tmp/x.safetensors"
printf '{"tokens": [1, 2, 3], "prefill": 9}' >"$tmp/bad2.json"
expect_failure "prefill longer than the tokens is refused" '"prefill" must be an integer in \[1, 3\]' \
    "$DS4F_BIN" logits -m tests/data/golden/small --tokens "$tmp/bad2.json" --out "$tmp/x.safetensors"
printf '{"tokens": [1, 2' >"$tmp/bad3.json"
expect_failure "malformed JSON is refused" "expected a JSON object" \
    "$DS4F_BIN" logits -m tests/data/golden/small --tokens "$tmp/bad3.json" --out "$tmp/x.safetensors"
expect_failure "--mtp on a model without MTP is refused" "no MTP block" \
    "$DS4F_BIN" logits -m tests/data/golden/wide --tokens tests/data/golden/wide/tokens.json --out "$tmp/x.safetensors" --mtp

finish
