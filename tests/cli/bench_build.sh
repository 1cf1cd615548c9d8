#!/bin/sh
# The benchmarks in bench/ build against the library without a warning: they are not part of
# `make`, so this keeps them from rotting as the library changes (each builds as its script does,
# plus -Wall -Wextra -Werror), and the kernel benchmark's usage error works. Running them is for
# bench/*.sh: timings are not tests.
#
# Run by tests/run.sh with DS4F_BUILD. Prints one line per check and "N passed, N failed" last.
. tests/cli/lib.sh
BUILD=${DS4F_BUILD:-build}
setup_tmp
libs=$(pkg-config --libs libcjson libpcre2-8 libmicrohttpd libedit 2>/dev/null)
for src in bench/*.c; do
    name=$(basename "$src" .c)
    # shellcheck disable=SC2086
    if out=$(${CC:-cc} -std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -Iinclude -Isrc "$src" "$BUILD/libds4f.a" $libs \
        -lm -lpthread -o "$tmp/$name" 2>&1); then
        pass "$name builds without warnings"
    else
        fail "$name: $(printf '%s' "$out" | head -5)"
    fi
done
if [ -x "$tmp/bench_kernels" ]; then
    expect_failure "bench_kernels rejects an unknown option" "usage: bench_kernels" "$tmp/bench_kernels" --bogus
    expect_failure "bench_kernels rejects a bad token list" "token counts from 1 to 256" "$tmp/bench_kernels" --several-tokens 0,x
fi
finish
