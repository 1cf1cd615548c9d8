#!/bin/sh
# The NEON kernels (issue 5: they must at least compile in CI, and be tested where possible). On
# an arm64 host they are part of the main build and the unit tests run them. On an x86-64 Linux
# host they are cross-compiled (Debian: gcc-aarch64-linux-gnu) with the kernel equivalence tests
# (every variant against scalar, bitwise) and run under qemu-user (`make neon-test`); both come
# from scripts/install-deps.sh where apt-get exists, so missing tools there are a failure.
# Elsewhere (macOS on Intel, other distributions) the check is skipped with a note.
#
# Run by tests/run.sh with DS4F_BUILD. Prints "N passed, N failed" last (the kernel tests' own).
. tests/cli/lib.sh
BUILD=${DS4F_BUILD:-build}

case "$(uname -m)" in
aarch64 | arm64)
    pass "arm64 host: the NEON kernels are in the main build, run by the unit tests"
    finish
    exit $?
    ;;
esac

cc_cross=${NEON_CC:-aarch64-linux-gnu-gcc}
qemu=${QEMU_AARCH64:-qemu-aarch64}
if ! command -v "$cc_cross" >/dev/null 2>&1 || ! command -v "$qemu" >/dev/null 2>&1; then
    if [ "$(uname -s)" = Linux ] && command -v apt-get >/dev/null 2>&1; then
        fail "NEON kernels: $cc_cross or $qemu missing (scripts/install-deps.sh installs gcc-aarch64-linux-gnu and qemu-user)"
    else
        echo "note: no $cc_cross / $qemu here: the NEON kernels are not built on this host"
    fi
    finish
    exit $?
fi

# the kernel tests print their own "N passed, N failed" last, which tests/run.sh reads
exec make -s --no-print-directory neon-test BUILD="$BUILD"
