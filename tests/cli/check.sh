#!/bin/sh
# `ds4f check`. The official vectors need the real 160 GB checkpoint, so here: a synthetic model
# is refused before anything runs, with the reason; the real tokenizer renders the five official
# prompts to the API's prompt_tokens and finds every official answer token; and the comparison
# itself runs on vectors recorded from a synthetic model (--record): they pass under other cache
# and thread settings (placement never changes results), and tampered ones fail.
. "$(dirname "$0")/lib.sh"
setup_tmp

model=$tmp/tiny
if ! "$DS4F_BIN" synth "$model" --preset tiny --seed 5 >"$tmp/log" 2>&1; then
    fail "ds4f synth tiny: $(tail -2 "$tmp/log")"
    finish
    exit 1
fi

# A synthetic model: its own tokenizer gives other prompt lengths; nothing is loaded or run.
"$DS4F_BIN" check -m "$model" >"$tmp/synth.out" 2>"$tmp/synth.err"
status=$?
if [ $status -eq 1 ] && grep -q 'short_italian_fact .*renders to [0-9]* tokens .*official count is 21' "$tmp/synth.out" &&
    grep -q 'tokenizer has 768 ids; DeepSeek-V4-Flash.s has 129280' "$tmp/synth.out" &&
    grep -q 'need the real DeepSeek-V4-Flash checkpoint.*Nothing was run' "$tmp/synth.err"; then
    pass "synthetic model refused with the reason"
else
    fail "synthetic model: status $status, $(cat "$tmp/synth.out" "$tmp/synth.err" | tail -3)"
fi

# The real tokenizer with the synthetic weights: the tokenizer stage passes (the official
# rendering and token ids are right), then the model's vocabulary is refused.
mkdir "$tmp/mixed"
cp "$model"/* "$tmp/mixed/"
cp tests/data/tokenizer/tokenizer.json "$tmp/mixed/"
"$DS4F_BIN" check -m "$tmp/mixed" >"$tmp/mixed.out" 2>"$tmp/mixed.err"
status=$?
if grep -q '^tokenizer: 5 of 5 prompts render to the official token counts; 17 of 17 official answer tokens are in the vocabulary$' "$tmp/mixed.out"; then
    pass "official prompts render to the API's prompt_tokens with the real tokenizer"
else
    fail "official rendering: $(cat "$tmp/mixed.out")"
fi
if [ $status -eq 1 ] && grep -q "vocabulary (config.json) has 768 ids but its tokenizer.json 129280" "$tmp/mixed.err"; then
    pass "a model whose vocabulary is not the tokenizer's is refused"
else
    fail "mixed model: status $status, $(cat "$tmp/mixed.err")"
fi

# Record this engine's answers to two prompts, then check against them.
mkdir -p "$tmp/src/prompts"
printf 'Hello there' >"$tmp/src/prompts/a.txt"
printf 'What is the capital of France?\nAnswer briefly.' >"$tmp/src/prompts/b.txt"
cat >"$tmp/src/manifest.json" <<'EOF'
{"model": "test", "prompts": [
  {"id": "hello", "prompt_file": "prompts/a.txt", "official_file": "official/a.json", "steps": 4},
  {"id": "france", "prompt_file": "prompts/b.txt", "official_file": "official/b.json", "steps": 3}]}
EOF
if "$DS4F_BIN" check -m "$model" --vectors "$tmp/src" --record "$tmp/rec" >"$tmp/rec.out" 2>&1 &&
    [ -f "$tmp/rec/manifest.json" ] && [ -f "$tmp/rec/official/hello.official.json" ]; then
    pass "--record writes vectors"
else
    fail "--record: $(tail -2 "$tmp/rec.out")"
fi
"$DS4F_BIN" check -m "$model" --vectors "$tmp/rec" --cache-slots 7 -t 1 >"$tmp/same.out" 2>&1
status=$?
if [ $status -eq 0 ] && grep -q '^hello  *[0-9]*  4/4  *80/80  *0.000000  *PASS$' "$tmp/same.out" &&
    grep -q '^france  *[0-9]*  3/3  *60/60  *0.000000  *PASS$' "$tmp/same.out" &&
    grep -q '^check: 2 passed, 0 failed' "$tmp/same.out"; then
    pass "recorded vectors pass exactly with another cache size and thread count"
else
    fail "recorded vectors: status $status, $(cat "$tmp/same.out")"
fi

# Tampered vectors: another answer token, and a top log-probability beyond the tolerance.
awk '!done && /"bytes":/ { sub(/\[[0-9, ]*\]/, "[97]"); done = 1 } { print }' \
    "$tmp/rec/official/france.official.json" >"$tmp/x" && mv "$tmp/x" "$tmp/rec/official/france.official.json"
"$DS4F_BIN" check -m "$model" --vectors "$tmp/rec" >"$tmp/bad.out" 2>&1
status=$?
if [ $status -eq 1 ] && grep -q '^france  *[0-9]*  [0-2]/3 .*FAIL' "$tmp/bad.out" &&
    grep -q '^check: 1 passed, 1 failed' "$tmp/bad.out"; then
    pass "a different answer token fails its case"
else
    fail "tampered token: status $status, $(cat "$tmp/bad.out")"
fi
awk '/"top_logprobs":/ { intop = 1 } intop && !done && /"logprob":/ { sub(/-?[0-9][0-9.e-]*,?$/, "-30"); done = 1 } { print }' \
    "$tmp/rec/official/hello.official.json" >"$tmp/x" && mv "$tmp/x" "$tmp/rec/official/hello.official.json"
"$DS4F_BIN" check -m "$model" --vectors "$tmp/rec" --tolerance 2 >"$tmp/bad2.out" 2>&1
if grep -q '^hello .* 2[0-9]\.[0-9]*  *FAIL' "$tmp/bad2.out" && grep -q 'tolerance 2.00 nats' "$tmp/bad2.out"; then
    pass "a log-probability beyond the tolerance fails its case"
else
    fail "tampered logprob: $(cat "$tmp/bad2.out")"
fi

expect_failure "missing vectors directory" "manifest.json" "$DS4F_BIN" check -m "$model" --vectors "$tmp/nope"
expect_failure "no tokenizer" "tokenizer.json: no such file" "$DS4F_BIN" check -m tests/data/golden/small
expect_failure "no -m" "give -m DIR" "$DS4F_BIN" check

finish
