#!/bin/sh
# Tokenizer benchmark: builds bench/bench_tokenizer.c against build/libds4f.a and prints the load
# time of tokenizer.json and the single-core encode speed on English, code, CJK and mixed text,
# all from one run. Usage (from the repository root):
#
#   bench/bench_tokenizer.sh [TOKENIZER_JSON] [LABEL=FILE[,FILE...] ...]
#
# Without corpora it uses what any checkout has (the repository's C sources as code, the HF test
# vectors' texts as mixed text) plus, where installed, English and CJK text shipped with Debian /
# vim (GPL-3 licence text, Rust release notes, vim's Chinese and Japanese tutors).
set -eu
BUILD=${BUILD:-build}
TOKENIZER=${1:-tests/data/tokenizer/tokenizer.json}
[ $# -gt 0 ] && shift

make -s "$BUILD/libds4f.a"
PKG="libcjson libpcre2-8"
${CC:-cc} -std=c11 -O2 -D_GNU_SOURCE -Iinclude -Isrc $(pkg-config --cflags $PKG) bench/bench_tokenizer.c \
    "$BUILD/libds4f.a" $(pkg-config --libs $PKG) -lm -lpthread -o "$BUILD/bench_tokenizer"

if [ $# -eq 0 ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # The vectors' texts, one file (they are short; encoding them one by one would time call overhead).
    python3 -c 'import json,sys; sys.stdout.write("\n".join(x["t"] for x in json.load(open(sys.argv[1]))))' \
        tests/data/tokenizer/hf_rust_vectors.json >"$tmp/vectors.txt" 2>/dev/null || true
    cat src/*/*.c src/*/*.h >"$tmp/code.txt"
    english=""
    for f in /usr/share/common-licenses/GPL-3 \
             "$HOME"/.rustup/toolchains/stable-*/share/doc/rust/html/releases.md; do
        [ -f "$f" ] && english="$english${english:+,}$f"
    done
    cjk=""
    for f in /usr/share/vim/vim*/tutor/tutor.zh_cn.utf-8 /usr/share/vim/vim*/tutor/tutor.zh.utf-8 \
             /usr/share/vim/vim*/tutor/tutor.ja.utf-8; do
        [ -f "$f" ] && cjk="$cjk${cjk:+,}$f"
    done
    set -- "code=$tmp/code.txt"
    [ -s "$tmp/vectors.txt" ] && set -- "$@" "mixed=$tmp/vectors.txt"
    [ -n "$english" ] && set -- "$@" "english=$english"
    [ -n "$cjk" ] && set -- "$@" "cjk=$cjk"
    for c in "$@"; do echo "corpus $c"; done
fi
"$BUILD/bench_tokenizer" "$TOKENIZER" "$@"
