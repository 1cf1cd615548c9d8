#!/bin/sh
# Expert streaming from the command line, on the golden small checkpoint: ds4f plan (fits /
# refuses with the numbers), pack + bench on the packed file with a trace, replay of the trace
# (Belady is never beaten), a damaged packed file stopping a run with the file and offset, and
# the I/O floor measurement.
. "$(dirname "$0")/lib.sh"
setup_tmp
model=tests/data/golden/small

out=$("$DS4F_BIN" plan -m "$model" --ram 2G --ctx 1000 2>&1)
if [ $? -eq 0 ] && printf '%s' "$out" | grep -q "total .* fits"; then pass "plan fits in 2G"; else fail "plan 2G: $out"; fi
expect_failure "plan refuses a 40M budget with the numbers" "resident weights [0-9.]* GiB.*budget of [0-9.]* GiB" \
    "$DS4F_BIN" plan -m "$model" --ram 40M

if "$DS4F_BIN" pack "$model" --out "$tmp/small.experts" >"$tmp/pack.log" 2>&1; then
    pass "pack"
else
    fail "pack: $(tail -2 "$tmp/pack.log")"
fi

"$DS4F_BIN" bench -m "$model" --experts "$tmp/small.experts" --prompt 8 --tokens 12 --cache-slots 20 \
    --trace "$tmp/run.trace" >"$tmp/bench.log" 2>&1
if grep -q "^report: .*hit .*peak RSS" "$tmp/bench.log" && grep -q "^bench: s_per_token=" "$tmp/bench.log" &&
    grep -q "packed file" "$tmp/bench.log"; then
    pass "bench on the packed file prints the report"
else
    fail "bench: $(tail -3 "$tmp/bench.log")"
fi
lines=$(grep -vc '^#' "$tmp/run.trace")
# 20 tokens x 6 main blocks (bench does not run the MTP block) = 120 lines
if [ "$lines" -eq 120 ]; then pass "trace has one line per token and block"; else fail "trace has $lines lines"; fi

"$DS4F_BIN" replay "$tmp/run.trace" --slots 6,20,60 --half-life 2,8 >"$tmp/replay.log" 2>&1
bad=$(awk '$1 ~ /^[0-9]+$/ { for (i = 3; i < NF; i++) if ($i + 0 > $NF + 0) print }' "$tmp/replay.log")
if [ -z "$bad" ] && [ "$(grep -c '%' "$tmp/replay.log")" -eq 3 ]; then
    pass "replay: LRU and LFRU never beat Belady"
else
    fail "replay: $(cat "$tmp/replay.log")"
fi

# Damage every record but the first and last (those are checked against the checkpoint at open):
# whichever expert the run reads first stops it.
cp "$tmp/small.experts" "$tmp/damaged.experts"
header=$(od -An -tu4 -j12 -N4 "$tmp/damaged.experts" | tr -d ' ')
stride=$(od -An -tu8 -j16 -N8 "$tmp/damaged.experts" | tr -d ' ')
i=1
while [ $i -lt 111 ]; do
    printf 'Z' | dd of="$tmp/damaged.experts" bs=1 seek=$((header + i * stride + 100)) conv=notrunc 2>/dev/null
    i=$((i + 1))
done
expect_failure "a damaged packed record stops the run, naming file and offset" \
    "damaged.experts: record of block [0-9]* expert [0-9]* at offset [0-9]* is damaged" \
    "$DS4F_BIN" bench -m "$model" --experts "$tmp/damaged.experts" --prompt 4 --tokens 2

out=$("$DS4F_BIN" bench -m "$model" --io-floor 20 2>&1)
if printf '%s' "$out" | grep -q "^bench: io_floor_gbps="; then pass "io floor"; else fail "io floor: $out"; fi
finish
