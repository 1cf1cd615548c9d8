#!/bin/sh
# Expert streaming benchmark (README "## Streaming"): decode speed of a model bigger than the
# memory it may use, against the two floors measured in the same run.
#
#   bench/bench_stream.sh [options]
#     --model DIR      checkpoint (default $WORK/full32, made with `ds4f synth --preset full
#                      --experts 32 --seed 1` when missing: the real dimensions, about 27 GB)
#     --limit SIZE     memory cgroup limit, RSS + page cache (default 12G; "none": no cgroup)
#     --ram SIZE       the engine's budget inside it (default 11G: the limit less kernel and
#                      page-cache slack)
#     --experts FILE   packed experts (ds4f pack), else the shards
#     --prompt N --tokens N   (default 8 and 64)
#     --floor-experts N       experts read for the I/O floor (default 200)
#     --label TEXT     first field of the summary line
#     -- ARGS          more ds4f bench flags (--no-prefetch, --cache-slots N, ...)
#
# Needs root for the cgroup (v1 memory controller) and for dropping the page cache before each
# measurement (cold start). The cgroup is removed at the end. Prints the engine's report, then
#   floors: io_floor_s=... (miss GB per token / GB/s of 13 MB random reads at the engine's queue
#           depth, measured before and after the run) compute_s=... (the run's own compute time)
#   disk:   every byte the token used from disk (misses and prefetched hits) at that GB/s, and how
#           busy the run kept the disk: the floor the disk itself sets once prefetch hides misses
#   summary: s/token, ratio to the larger floor (target <= 1.15), peak RSS vs plan, cgroup peak.
set -u
DS4F=${DS4F:-build/ds4f}
WORK=${WORK:-/work/tmp}
MODEL=$WORK/full32
LIMIT=12G
RAM=11G
EXPERTS=
PROMPT=8
TOKENS=64
FLOOR_N=200
LABEL=run
while [ $# -gt 0 ]; do
    case $1 in
    --model) MODEL=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    --ram) RAM=$2; shift 2 ;;
    --experts) EXPERTS=$2; shift 2 ;;
    --prompt) PROMPT=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --floor-experts) FLOOR_N=$2; shift 2 ;;
    --label) LABEL=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "bench_stream.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
EXTRA="$*"
[ -x "$DS4F" ] || { echo "bench_stream.sh: build $DS4F first (make)" >&2; exit 2; }
if [ ! -f "$MODEL/model.safetensors.index.json" ]; then
    echo "== synthesizing $MODEL (full preset, 32 experts per layer)"
    "$DS4F" synth "$MODEL" --preset full --experts 32 --seed 1 || exit 1
fi
experts_flag=
[ -n "$EXPERTS" ] && experts_flag="--experts $EXPERTS"

CG=/sys/fs/cgroup/memory/ds4f-bench-$$
cleanup() { [ -d "$CG" ] && rmdir "$CG" 2>/dev/null; }
trap cleanup EXIT INT TERM
if [ "$LIMIT" != none ]; then
    mkdir "$CG" || { echo "bench_stream.sh: cannot create $CG (root and cgroup v1 memory controller needed)" >&2; exit 2; }
    echo "$LIMIT" >"$CG/memory.limit_in_bytes"
fi
# in_limit CMD...: runs CMD inside the cgroup (or plainly with --limit none).
in_limit() {
    if [ "$LIMIT" != none ]; then
        sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$CG" "$@"
    else
        "$@"
    fi
}
cold() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || echo "(could not drop the page cache: not root?)" >&2; }
field() { printf '%s\n' "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -1; }

echo "== machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo) RAM, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== model $MODEL ${EXPERTS:+(packed: $EXPERTS)}, limit $LIMIT, budget $RAM, prompt $PROMPT, decode $TOKENS $EXTRA"

cold
floor1=$(in_limit "$DS4F" bench -m "$MODEL" $experts_flag --io-floor "$FLOOR_N" --seed 11 2>&1)
echo "$floor1" | grep '^io floor'
gbps1=$(field io_floor_gbps "$(echo "$floor1" | grep '^bench:')")

cold
out=$(in_limit "$DS4F" bench -m "$MODEL" $experts_flag --ram "$RAM" --ctx $((PROMPT + TOKENS + 8)) \
    --prompt "$PROMPT" --tokens "$TOKENS" $EXTRA 2>&1)
status=$?
echo "$out"
cg_peak=
[ "$LIMIT" != none ] && cg_peak=$(awk '{printf "%.2f", $1/1073741824}' "$CG/memory.max_usage_in_bytes")
[ $status -eq 0 ] || { echo "bench_stream.sh: the run failed (status $status)"; exit 1; }

cold
floor2=$(in_limit "$DS4F" bench -m "$MODEL" $experts_flag --io-floor "$FLOOR_N" --seed 12 2>&1)
echo "$floor2" | grep '^io floor'
gbps2=$(field io_floor_gbps "$(echo "$floor2" | grep '^bench:')")

line=$(echo "$out" | grep '^bench: s_per_token')
s=$(field s_per_token "$line")
compute=$(field compute_s_per_token "$line")
miss=$(field miss_gb_per_token "$line")
gb=$(field gb_per_token "$line")
hit=$(field hit_rate "$line")
rss=$(field peak_rss_gib "$line")
plan=$(field plan_gib "$line")
wasted=$(field wasted_gb_per_token "$line")
awk -v s="$s" -v c="$compute" -v m="$miss" -v g1="$gbps1" -v g2="$gbps2" -v gb="$gb" -v hit="$hit" -v rss="$rss" \
    -v plan="$plan" -v cg="$cg_peak" -v label="$LABEL" -v wasted="$wasted" 'BEGIN {
    bw = (g1 + g2) / 2; io = m / bw; big = io > c ? io : c
    printf "floors: io_floor_s=%.3f (%.3f miss GB/token at %.3f GB/s: %.3f before, %.3f after) compute_s=%.3f\n", io, m, bw, g1, g2, c
    # Not the gate, but what the disk itself allows: prefetched experts that arrive in time count
    # as hits, yet were read this token. Every byte the token used from disk, at the same GB/s.
    printf "disk: needed_gb_per_token=%.3f (read %.3f less %.3f wasted guesses) disk_floor_s=%.3f disk_busy=%.0f%% (%.2f GB/s achieved)\n",
        gb - wasted, gb, wasted, (gb - wasted) / bw, 100 * (gb / s) / bw, gb / s
    printf "summary: %s s_per_token=%.3f ratio_to_larger_floor=%.3f (target <= 1.15: %s) gb_read_per_token=%.3f hit_rate=%.3f peak_rss_gib=%.2f plan_gib=%.2f (%s)%s\n",
        label, s, s / big, s / big <= 1.15 ? "met" : "MISSED", gb, hit, rss, plan, rss <= plan ? "within plan" : "ABOVE PLAN",
        cg != "" ? sprintf(" cgroup_peak_gib=%s", cg) : ""
}'
