#!/bin/sh
# `ds4f run` on a synthetic tiny checkpoint: streamed output, the chat rendering (checked against
# the same prompt given raw), prompt sources, seeds, -n, stop strings, and clear errors.
. "$(dirname "$0")/lib.sh"
setup_tmp

model=$tmp/tiny
if ! "$DS4F_BIN" synth "$model" --preset tiny --seed 3 >"$tmp/log" 2>&1; then
    fail "ds4f synth tiny: $(tail -2 "$tmp/log")"
    finish
    exit 1
fi

run() { "$DS4F_BIN" run -m "$model" "$@"; }
# prompt_tokens FILE: the prompt token count from the report line in FILE.
prompt_tokens() { sed -n 's/^report: prompt \([0-9]*\) tok .*/\1/p' "$1"; }
# decoded (evaluated) tokens: all generated ones but the last
decode_tokens() { sed -n 's/.* | decode \([0-9]*\) tok .*/\1/p' "$1"; }

if run -p "Hello there" -n 12 --seed 5 >"$tmp/a.out" 2>"$tmp/a.err" && [ -s "$tmp/a.out" ]; then
    pass "run streams an answer"
else
    fail "run: $(tail -2 "$tmp/a.err")"
fi
if grep -q '^report: prompt [0-9]* tok [0-9.]* tok/s | decode 11 tok .* | peak RSS ' "$tmp/a.err" &&
    [ "$(grep -c . "$tmp/a.err")" -eq 1 ]; then
    pass "one report line on stderr (-n 12: 11 tokens decoded after the first)"
else
    fail "report line: $(tail -1 "$tmp/a.err")"
fi

run -p "Hello there" -n 12 --seed 5 >"$tmp/b.out" 2>/dev/null
if cmp -s "$tmp/a.out" "$tmp/b.out"; then pass "same seed, same text"; else fail "same seed gave different text"; fi
run -p "Hello there" -n 12 --seed 6 >"$tmp/c.out" 2>/dev/null
if ! cmp -s "$tmp/a.out" "$tmp/c.out"; then pass "another seed, another text"; else fail "seeds 5 and 6 gave the same text"; fi

# The chat rendering: the same tokens as the rendered text given raw, and as many as the
# tokenizer gives for that text (BOS included once).
rendered='<｜begin▁of▁sentence｜><｜User｜>Hello there<｜Assistant｜></think>'
run --raw -p "$rendered" -n 12 --seed 5 >"$tmp/raw.out" 2>"$tmp/raw.err"
if cmp -s "$tmp/a.out" "$tmp/raw.out"; then
    pass "chat rendering equals the rendered text given raw"
else
    fail "chat rendering differs from the raw rendered prompt"
fi
want=$(printf '"%s"\n' "$rendered" | "$DS4F_BIN" tokenize -m "$model" | tr ',' '\n' | wc -l)
got=$(prompt_tokens "$tmp/a.err")
if [ "$got" -eq "$want" ] && [ "$(prompt_tokens "$tmp/raw.err")" -eq "$want" ]; then
    pass "prompt is the rendered text's $want tokens"
else
    fail "prompt has $got tokens, the rendered text $want"
fi
run --raw -p "Hello there" -n 4 --seed 5 >/dev/null 2>"$tmp/r1.err"
run --raw -p "<｜begin▁of▁sentence｜>Hello there" -n 4 --seed 5 >/dev/null 2>"$tmp/r2.err"
if [ "$(prompt_tokens "$tmp/r1.err")" -eq "$(prompt_tokens "$tmp/r2.err")" ]; then
    pass "--raw adds BOS only when the text lacks it"
else
    fail "--raw BOS: $(prompt_tokens "$tmp/r1.err") vs $(prompt_tokens "$tmp/r2.err") tokens"
fi

# Thinking mode and a system prompt change the rendering as the chat encoding says.
run -p "Hello there" --think --system "Be brief." -n 3 --seed 5 >/dev/null 2>"$tmp/t.err"
want=$(printf '"%s"\n' '<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hello there<｜Assistant｜><think>' |
    "$DS4F_BIN" tokenize -m "$model" | tr ',' '\n' | wc -l)
if [ "$(prompt_tokens "$tmp/t.err")" -eq "$want" ]; then
    pass "--think --system render as the chat encoding"
else
    fail "--think --system: $(prompt_tokens "$tmp/t.err") tokens, want $want"
fi

# Prompt from a file and from stdin (trailing newline dropped) equals -p.
printf 'Hello there\n' >"$tmp/prompt.txt"
run -f "$tmp/prompt.txt" -n 12 --seed 5 >"$tmp/f.out" 2>/dev/null
printf 'Hello there\n' | run -n 12 --seed 5 >"$tmp/s.out" 2>/dev/null
if cmp -s "$tmp/a.out" "$tmp/f.out" && cmp -s "$tmp/a.out" "$tmp/s.out"; then
    pass "prompt from -f and from stdin"
else
    fail "prompt from -f or stdin differs from -p"
fi

# Stop strings: the output ends right before the first occurrence, nothing of it printed.
run -p "Hello there" -n 40 --temp 0 >"$tmp/g.out" 2>/dev/null
stop=$(LC_ALL=C awk 'BEGIN { RS = "\001" } { printf "%s", substr($0, 11, 3) }' "$tmp/g.out")
LC_ALL=C awk -v s="$stop" 'BEGIN { RS = "\001" } { printf "%s", substr($0, 1, index($0, s) - 1) }' "$tmp/g.out" >"$tmp/g.want"
run -p "Hello there" -n 40 --temp 0 --stop "$stop" --stop "never-in-output" >"$tmp/g.stop" 2>/dev/null
if [ "${#stop}" -ge 2 ] && cmp -s "$tmp/g.want" "$tmp/g.stop"; then
    pass "--stop ends the text before the stop string"
else
    fail "--stop '$stop': got $(wc -c <"$tmp/g.stop") bytes, want $(wc -c <"$tmp/g.want")"
fi

run -p "Hello there" -n 7 --temp 0.8 --top-p 0.9 --top-k 40 --min-p 0.05 --seed 1 >/dev/null 2>"$tmp/n.err"
if [ "$(decode_tokens "$tmp/n.err")" = 6 ]; then pass "sampling flags accepted, -n 7"; else fail "-n 7: $(tail -1 "$tmp/n.err")"; fi

expect_failure "missing tokenizer.json is named" "tokenizer.json: no such file" \
    "$DS4F_BIN" run -m tests/data/golden/small -p hi
expect_failure "missing checkpoint directory" "no such checkpoint directory" "$DS4F_BIN" run -m "$tmp/nope" -p hi
expect_failure "no -m" "give -m DIR" "$DS4F_BIN" run -p hi
expect_failure "bad temperature" "temperature must be" "$DS4F_BIN" run -m "$model" -p hi --temp -1
expect_failure "bad number" "expects a number" "$DS4F_BIN" run -m "$model" -p hi --top-p x
expect_failure "-p and -f together" "not both" "$DS4F_BIN" run -m "$model" -p hi -f "$tmp/prompt.txt"
expect_failure "prompt longer than the context" "context holds 8" "$DS4F_BIN" run -m "$model" -p "Hello there, how are you" --ctx 8
expect_failure "unknown option" "unknown or incomplete option" "$DS4F_BIN" run -m "$model" -p hi --bogus
run -p "Hello there" -n 2 >/dev/null 2>"$tmp/seed.err"
if grep -q '^ds4f run: seed [0-9]* (--seed [0-9]* gives this answer again)$' "$tmp/seed.err"; then
    pass "a random seed is shown"
else
    fail "random seed not shown: $(head -1 "$tmp/seed.err")"
fi
if run -p "Hello there" -n 3 --ram 2G --cache-slots 8 --no-prefetch >/dev/null 2>"$tmp/stream.err"; then
    pass "streaming flags accepted"
else
    fail "streaming flags: $(tail -1 "$tmp/stream.err")"
fi
# The prefill chunk is a speed choice: a prompt of many chunks gives the same answer as one chunk.
long="Hello there, tell me a long story about the sea, the wind and the ships that sail at night"
run -p "$long" -n 8 --seed 5 >"$tmp/chunk64.out" 2>/dev/null
if run -p "$long" -n 8 --seed 5 --chunk 3 >"$tmp/chunk3.out" 2>"$tmp/chunk3.err" && [ -s "$tmp/chunk3.out" ] &&
    cmp -s "$tmp/chunk64.out" "$tmp/chunk3.out"; then
    pass "--chunk 3 gives the default chunk's answer"
else
    fail "--chunk 3 changed the answer: $(tail -1 "$tmp/chunk3.err")"
fi
expect_failure "chunk 0" "--chunk" "$DS4F_BIN" run -m "$model" -p hi --chunk 0

finish
