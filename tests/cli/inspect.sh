#!/bin/sh
# `ds4f inspect DIR` accepts a valid checkpoint and prints its inventory, and refuses damaged ones
# (design invariant 5) with exit status 1 and a message that names the tensor and what was expected
# and found. The damaged copies of tests/data/golden/small are made by
# tests/cli/make_bad_checkpoint.c (built here against the project's library: no Python needed; the
# copies' tensor data are holes, since inspect reads headers only). The real-size inventory is
# checked on a header-only checkpoint of the real config in 46 sparse shards (160 GB apparent, a
# few MB on disk), removed at the end.
#
# Run by tests/run.sh from the repository root with DS4F_BIN (the ds4f binary) and DS4F_BUILD (the
# build directory holding libds4f.a). Prints one line per check and "N passed, N failed" last.
BIN=${DS4F_BIN:-build/ds4f}
BUILD=${DS4F_BUILD:-build}
CC=${CC:-cc}
GOLDEN=tests/data/golden/small
REAL_CONFIG=tests/data/configs/deepseek-v4-flash.json
pass=0
fail=0

mkdir -p "$BUILD" || exit 1
work=$(mktemp -d "$BUILD/inspect-test.XXXXXX") || { echo "cannot create a temporary directory"; echo "0 passed, 1 failed"; exit 1; }
trap 'rm -rf "$work"' EXIT
trap 'rm -rf "$work"; exit 1' INT TERM HUP

ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() {
    fail=$((fail + 1))
    echo "FAIL $1: $2"
    [ -s "$work/out" ] && sed 's/^/    | /' "$work/out" | head -n 20
}

# Builds the helper; without it only the checks on the pristine checkpoint can run.
cflags=$(pkg-config --cflags libcjson 2>/dev/null)
libs=$(pkg-config --libs libcjson 2>/dev/null || echo -lcjson)
TOOL="$work/make_bad_checkpoint"
# shellcheck disable=SC2086
if ! $CC -std=c11 -O1 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -Iinclude -Isrc $cflags tests/cli/make_bad_checkpoint.c \
        "$BUILD/libds4f.a" $libs -lm -lpthread -o "$TOOL" >"$work/out" 2>&1; then
    bad "build tests/cli/make_bad_checkpoint.c" "compiler failed"
    TOOL=false
fi

# make_variant NAME SRC OP ARGS...: $work/NAME, a copy of checkpoint SRC with one edit.
make_variant() {
    name=$1; src=$2; shift 2
    rm -f "$work/out"
    "$TOOL" "$src" "$work/$name" "$@" >"$work/out" 2>&1
}

# expect STATUS NAME DIR PATTERN...: inspect exits with STATUS and its output holds every PATTERN
# (fixed strings).
expect() {
    want=$1; name=$2; dir=$3; shift 3
    "$BIN" inspect "$dir" >"$work/out" 2>&1
    status=$?
    why=""
    [ "$status" -eq "$want" ] || why="exit status $status, want $want"
    for pat in "$@"; do
        grep -F -e "$pat" "$work/out" >/dev/null || why="${why:+$why; }output lacks \"$pat\""
    done
    if [ -z "$why" ]; then ok "$name"; else bad "$name" "$why"; fi
}

# variant NAME "OP ARGS" PATTERN...: a damaged copy of the golden checkpoint must be refused with
# messages holding every PATTERN. The edit is one string, split into words on purpose.
variant() {
    name=$1; edit=$2; shift 2
    # shellcheck disable=SC2086
    if make_variant "$name" "$GOLDEN" $edit; then
        expect 1 "$name" "$work/$name" "$@"
    else
        bad "$name" "could not build the variant"
    fi
    rm -rf "${work:?}/$name"
}

# ---- a valid checkpoint passes and prints the inventory ----
expect 0 valid_checkpoint_passes_with_inventory "$GOLDEN" "shards      1" "tensors     921" "bytes       19001852 " \
    "routed experts  112 x 52224 bytes" "ok"
if make_variant rewritten "$GOLDEN" copy; then
    expect 0 rewritten_copy_passes "$work/rewritten" "tensors     921"
else bad rewritten_copy_passes "could not build the variant"; fi
if make_variant split3 "$GOLDEN" split 3; then
    expect 0 three_shards_pass "$work/split3" "shards      3" "tensors     921" "bytes       19001852 "
else bad three_shards_pass "could not build the variant"; fi
rm -rf "$work/rewritten" "$work/split3"

# ---- missing, extra, mistyped, misshapen tensors ----
variant missing_tensor "drop layers.1.ffn_norm.weight" \
    "1 problem:" "missing tensor 'layers.1.ffn_norm.weight' (expected BF16 [256])"
variant missing_expert_tensor "drop layers.3.ffn.experts.7.w2.scale" \
    "missing tensor 'layers.3.ffn.experts.7.w2.scale' (expected F8_E8M0 [256, 4])"
variant wrong_dtype "dtype layers.0.attn_norm.weight F16" \
    "tensor 'layers.0.attn_norm.weight': expected BF16 [256], found F16 [256] in model.safetensors"
# BF16 [256] declared F32 [128]: the same 512 bytes, so only the binder can notice.
if make_variant f32_step "$GOLDEN" dtype norm.weight F32 && make_variant wrong_dtype_same_size "$work/f32_step" shape norm.weight 128; then
    expect 1 wrong_dtype_same_size "$work/wrong_dtype_same_size" "tensor 'norm.weight': expected BF16 [256], found F32 [128]"
else bad wrong_dtype_same_size "could not build the variant"; fi
rm -rf "$work/f32_step" "$work/wrong_dtype_same_size"
variant wrong_shape "shape layers.0.hc_attn_fn 1024,24" \
    "tensor 'layers.0.hc_attn_fn': expected F32 [24, 1024], found F32 [1024, 24]"
variant wrong_rank "shape layers.2.hc_ffn_base 4,6" \
    "tensor 'layers.2.hc_ffn_base': expected F32 [24], found F32 [4, 6]"
variant wrong_expert_shape "shape layers.4.ffn.experts.15.w1.weight 256,64" \
    "tensor 'layers.4.ffn.experts.15.w1.weight': expected I8 [128, 128], found I8 [256, 64]"
variant extra_tensor "add layers.0.attn.bogus.weight F32 4" \
    "unexpected tensor 'layers.0.attn.bogus.weight' (F32 [4]) in model.safetensors: not part of this config's model"
variant extra_layer "add layers.6.attn_norm.weight BF16 256" \
    "unexpected tensor 'layers.6.attn_norm.weight' (BF16 [256])"
variant extra_expert "add layers.5.ffn.experts.16.w3.scale F8_E8M0 128,8" \
    "unexpected tensor 'layers.5.ffn.experts.16.w3.scale' (F8_E8M0 [128, 8])"
variant unknown_dtype "dtype layers.0.attn_norm.weight Q4_K" \
    "tensor 'layers.0.attn_norm.weight' has unknown dtype 'Q4_K'"

# ---- truncated shard, headers that lie about offsets ----
if make_variant truncated "$GOLDEN" cut 2; then
    size=$(wc -c <"$work/truncated/model.safetensors" | tr -d ' ')
    expect 1 truncated_shard "$work/truncated" \
        "tensor 'mtp.0.hc_head_scale' ends at file offset $((size + 2)) but the file has only $size bytes (truncated?)"
else bad truncated_shard "could not build the variant"; fi
rm -rf "$work/truncated"
# A shard cut inside its header, and a directory with no shard at all (no index either).
mkdir -p "$work/cut_header" && cp "$GOLDEN/config.json" "$work/cut_header/" &&
    dd if="$GOLDEN/model.safetensors" of="$work/cut_header/model.safetensors" bs=1000 count=1 2>/dev/null
expect 1 truncated_header "$work/cut_header" "cut_header/model.safetensors: header length" "does not fit the file (1000 bytes)"
rm -f "$work/cut_header/model.safetensors"
expect 1 no_shards "$work/cut_header" "has neither model.safetensors.index.json nor model.safetensors"
rm -rf "$work/cut_header"
variant overlapping_tensors "overlap layers.0.attn_norm.weight layers.0.ffn_norm.weight" \
    "overlap" "'layers.0.attn_norm.weight'" "'layers.0.ffn_norm.weight'"
variant extent_past_end "past-end norm.weight" "tensor 'norm.weight' ends at file offset" "(truncated?)"
variant size_not_dtype_times_shape "resize layers.0.attn.attn_sink 4" \
    "tensor 'layers.0.attn.attn_sink' (F32 [4]) should hold 16 bytes but data_offsets" "span 20"
variant size_short "resize layers.0.hc_attn_scale -4" \
    "tensor 'layers.0.hc_attn_scale' (F32 [3]) should hold 12 bytes but data_offsets" "span 8"
variant dtype_changes_size "dtype layers.0.attn_norm.weight F32" \
    "tensor 'layers.0.attn_norm.weight' (F32 [256]) should hold 1024 bytes" "span 512"

# ---- the index disagrees with the shards ----
variant index_names_missing_shard "index-shard layers.0.attn_norm.weight model-00002-of-00002.safetensors" \
    "names shard model-00002-of-00002.safetensors for tensor 'layers.0.attn_norm.weight'" \
    "model-00002-of-00002.safetensors: cannot open"
variant index_names_path "index-shard embed.weight ../model.safetensors" \
    "weight_map entry 'embed.weight' must name a shard file in the same directory"
if make_variant split2 "$GOLDEN" split 2 &&
        make_variant wrong_shard "$work/split2" index-shard embed.weight model-00002-of-00002.safetensors; then
    expect 1 tensor_in_wrong_shard "$work/wrong_shard" "2 problems:" \
        "index lists tensor 'embed.weight' in model-00002-of-00002.safetensors, but that shard does not contain it" \
        "tensor 'embed.weight' in model-00001-of-00002.safetensors is not listed there by the index"
else bad tensor_in_wrong_shard "could not build the variant"; fi
rm -rf "$work/split2" "$work/wrong_shard"
variant tensor_not_in_index "unindex layers.1.attn.wkv.scale" \
    "tensor 'layers.1.attn.wkv.scale' in model.safetensors is not listed there by the index"
variant index_total_size_wrong "total 12345" \
    "index metadata.total_size is 12345 bytes but the shards' tensors hold 19001852"

# ---- config.json ----
# config_variant NAME FROM TO PATTERN...: the golden checkpoint with FROM replaced by TO in
# config.json (FROM must occur) must be refused with messages holding every PATTERN.
config_variant() {
    name=$1; from=$2; to=$3; shift 3
    if make_variant "$name" "$GOLDEN" copy && sed "s/$from/$to/" "$GOLDEN/config.json" >"$work/$name/config.json" &&
            ! cmp -s "$GOLDEN/config.json" "$work/$name/config.json"; then
        expect 1 "$name" "$work/$name" "$@"
    else
        bad "$name" "could not build the variant"
    fi
    rm -rf "${work:?}/$name"
}
config_variant config_unknown_key '"use_cache": true,' '"use_cache": true, "n_group": 8,' \
    "config.json: unknown key 'n_group'" "refusing to guess"
config_variant config_unsupported_value '"scoring_func": "sqrtsoftplus"' '"scoring_func": "sigmoid"' \
    "config.json: 'scoring_func' is \"sigmoid\"; ds4f implements only \"sqrtsoftplus\""
config_variant config_missing_key '"num_hash_layers": 3,' '' "config.json: missing key 'num_hash_layers'"
# A config that disagrees with the tensors: every mismatch is listed, not just the first.
config_variant config_disagrees_lists_all '"vocab_size": 1024' '"vocab_size": 2048' "5 problems:" \
    "tensor 'embed.weight': expected BF16 [2048, 256], found BF16 [1024, 256]" \
    "tensor 'head.weight': expected BF16 [2048, 256], found BF16 [1024, 256]" \
    "tensor 'layers.2.ffn.gate.tid2eid': expected I64 [2048, 6], found I64 [1024, 6]"

# ---- the real model's inventory on a header-only, sparse checkpoint in 46 shards ----
real="$work/real"
"$TOOL" --sparse "$REAL_CONFIG" "$real" 46 >"$work/out" 2>&1
status=$?
if [ "$status" -eq 3 ]; then
    # Not counted either way: this file system would store 160 GB of zeros.
    echo "skip real_size_inventory: $(cat "$work/out")"
elif [ "$status" -eq 0 ]; then
    expect 0 real_size_inventory "$real" "shards      46" "tensors     69187" "bytes       159609485896 " \
        "routed experts  11264 x 13369344 bytes" "147169738752 without MTP" "ok"
    kb=$(du -sk "$real" | cut -f1)
    rm -f "$work/out"
    if [ "$kb" -lt 65536 ]; then ok "real_size_shards_are_sparse ($kb KB on disk)"
    else bad real_size_shards_are_sparse "$kb KB on disk for 160 GB of holes"; fi
    # At full scale one damaged tensor is still found and named.
    if make_variant real_bad "$real" drop layers.42.ffn.experts.255.w2.scale; then
        expect 1 real_size_missing_expert_tensor "$work/real_bad" "1 problem:" \
            "missing tensor 'layers.42.ffn.experts.255.w2.scale' (expected F8_E8M0 [4096, 64])"
    else bad real_size_missing_expert_tensor "could not build the variant"; fi
else
    bad real_size_inventory "could not write the sparse checkpoint"
fi
rm -rf "$real" "$work/real_bad"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
