#!/bin/sh
# Model benchmark: builds bench/bench_model.c against build/libds4f.a and runs it (see the usage
# at the top of bench/bench_model.c). Typical run, on the synthetic full-size model:
#
#   build/ds4f synth /tmp/full8 --preset full --experts 8
#   bench/bench_model.sh /tmp/full8
set -eu
BUILD=${BUILD:-build}
make -s "$BUILD/libds4f.a"
${CC:-cc} -std=c11 -O2 -D_GNU_SOURCE -Iinclude -Isrc bench/bench_model.c "$BUILD/libds4f.a" \
    $(pkg-config --libs libcjson libpcre2-8 libmicrohttpd libedit 2>/dev/null) -lm -lpthread -o "$BUILD/bench_model"
exec "$BUILD/bench_model" "$@"
