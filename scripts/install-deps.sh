#!/bin/sh
# Installs ds4f's build dependencies from the system package manager (Debian/Ubuntu apt or
# Homebrew). Only what the package manager provides: a C compiler, make, pkg-config, cJSON,
# PCRE2, libmicrohttpd, libedit; for the server tests curl, Node.js and npm (which installs the
# official `openai` client into build/node); on x86-64 Debian/Ubuntu, for the NEON kernels' test,
# an aarch64 cross-compiler and qemu-user. Idempotent: exits quickly when everything is present.
set -eu

# On x86-64 Linux with apt-get the NEON kernels are cross-built and run under qemu-user.
neon_cross_wanted() {
    [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ] && command -v apt-get >/dev/null 2>&1
}

need_missing() {
    for pc in libcjson libpcre2-8 libmicrohttpd libedit; do
        pkg-config --exists "$pc" 2>/dev/null || return 0
    done
    command -v cc >/dev/null 2>&1 || return 0
    command -v tmux >/dev/null 2>&1 || return 0 # the chat test drives `ds4f chat` in a pseudo-terminal
    for tool in curl node npm; do # the server tests: curl, and the official openai client on Node.js
        command -v "$tool" >/dev/null 2>&1 || return 0
    done
    if neon_cross_wanted; then # the NEON kernels' test on x86-64 Linux (tests/cli/neon.sh)
        for tool in aarch64-linux-gnu-gcc qemu-aarch64; do
            command -v "$tool" >/dev/null 2>&1 || return 0
        done
    fi
    return 1
}

if command -v pkg-config >/dev/null 2>&1 && ! need_missing; then
    exit 0
fi

if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "ds4f: installing build dependencies with apt-get" >&2
    # Node.js from another source (NodeSource's package bundles npm and conflicts with Debian's
    # npm) is kept: only the commands that are missing get Debian's packages.
    PKGS="build-essential pkg-config libcjson-dev libpcre2-dev libmicrohttpd-dev libedit-dev"
    for tool in curl tmux; do
        command -v "$tool" >/dev/null 2>&1 || PKGS="$PKGS $tool"
    done
    command -v node >/dev/null 2>&1 || PKGS="$PKGS nodejs"
    command -v npm >/dev/null 2>&1 || PKGS="$PKGS npm"
    if neon_cross_wanted; then
        command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || PKGS="$PKGS gcc-aarch64-linux-gnu"
        command -v qemu-aarch64 >/dev/null 2>&1 || PKGS="$PKGS qemu-user"
    fi
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086 # the list is meant to split into words
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $PKGS
elif command -v brew >/dev/null 2>&1; then
    echo "ds4f: installing build dependencies with Homebrew" >&2
    brew install pkg-config cjson pcre2 libmicrohttpd libedit node tmux
else
    echo "ds4f: no apt-get or brew found; install pkg-config, cJSON, PCRE2, libmicrohttpd and libedit (and curl, Node.js, npm for the server tests)" >&2
    exit 1
fi
