#!/bin/sh
# One binary runs on every x86-64 CPU (issue 5): the files compiled with SIMD target flags
# (*_avx2.c, *_avxvnni.c, *_avx512.c, *_amx.c) may hold only code that the dispatcher calls after
# it has checked the CPU. A constructor (an .init_array entry) in one of them runs at load on
# every CPU; the compiler vectorizes it with the file's flags (an AVX-512 table loop crashed with
# SIGILL on an AVX2-only AMD EPYC before the tables moved to kernels_scalar.c). This checks every
# such object for load-time code, and that the binary starts here.
#
# Run by tests/run.sh with DS4F_BIN and DS4F_BUILD. Prints one line per check and "N passed, N
# failed" last.
. tests/cli/lib.sh
BIN=${DS4F_BIN:-build/ds4f}
BUILD=${DS4F_BUILD:-build}

objects=$(ls "$BUILD"/src/kernels/*_avx2.o "$BUILD"/src/kernels/*_avxvnni.o "$BUILD"/src/kernels/*_avx512.o \
    "$BUILD"/src/kernels/*_amx.o 2>/dev/null)
if [ -z "$objects" ]; then
    pass "no SIMD-flagged objects on this architecture ($(uname -m))"
elif ! command -v objdump >/dev/null 2>&1; then
    fail "objdump (binutils) is needed to read the sections of the SIMD-flagged objects"
else
    for o in $objects; do
        sections=$(objdump -h "$o" | awk '{print $2}' | grep -E '^\.(init_array|ctors|preinit_array)' | tr '\n' ' ')
        if [ -z "$sections" ]; then
            pass "$(basename "$o"): no load-time code"
        else
            fail "$(basename "$o") has load-time code ($sections): it would run with its SIMD flags on every CPU"
        fi
    done
fi

# Every x86 build holds the AVX-512 objects, so a start that runs any of their code on a CPU
# without it dies here on such a CPU (checked: SIGILL before the move).
out=$("$BIN" --help 2>&1)
status=$?
if [ $status -eq 0 ]; then pass "ds4f starts on this CPU ($(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //'))"
else fail "ds4f --help: status $status: $(printf '%s' "$out" | tail -2)"; fi
finish
