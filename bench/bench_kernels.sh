#!/bin/sh
# Kernel benchmark: builds bench/bench_kernels.c against build/libds4f.a and prints, from one run,
# the machine's measured peaks (memory read bandwidth, f64 FMA and int8 dot-product rates) and
# each product's GFLOP/s and GB/s of weights for every kernel variant this CPU runs, at 1 thread
# and at all physical cores, for decode (1 token) and a prefill chunk (64 tokens).
#
#   bench/bench_kernels.sh [--quick] [--several-tokens [N,N,...] [--best N] [--from-ram]]
set -eu
BUILD=${BUILD:-build}
make -s "$BUILD/libds4f.a"
${CC:-cc} -std=c11 -O2 -D_GNU_SOURCE -Iinclude -Isrc bench/bench_kernels.c "$BUILD/libds4f.a" \
    $(pkg-config --libs libcjson libpcre2-8 libmicrohttpd libedit 2>/dev/null) -lm -lpthread -o "$BUILD/bench_kernels"
exec "$BUILD/bench_kernels" "$@"
