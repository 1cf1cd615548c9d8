/* libFuzzer harness for the tokenizer: encoding of arbitrary bytes (invalid UTF-8 included), the
 * decoders, the JSON-lines front end of `ds4f tokenize`, the regex translation and the
 * tokenizer.json loader. Not part of `make test` (the Makefile builds only the files in tests/unit).
 *
 * Build and run from the repository root (clang's libFuzzer: apt-get install clang
 * libclang-rt-14-dev):
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=c11 -D_GNU_SOURCE -Iinclude -Isrc \
 *     $(pkg-config --cflags libcjson libpcre2-8) tests/fuzz/fuzz_tokenizer.c src/text/tokenizer*.c \
 *     src/base/error.c src/base/file_io.c $(pkg-config --libs libcjson libpcre2-8) -o build/fuzz_tokenizer
 *   mkdir -p build/fuzz_tokenizer_corpus
 *   build/fuzz_tokenizer -max_len=4096 -max_total_time=600 build/fuzz_tokenizer_corpus
 *
 * Differential mode against Oniguruma 6.9.8, the regex engine of HF tokenizers (apt-get install
 * libonig-dev): add -DWITH_ONIGURUMA and -lonig. The pre-tokenizer's pieces (and, for fuzzed
 * patterns that the translation accepts, the Split results) must then equal Oniguruma's.
 *
 * The real tokenizer.json is read from tests/data/tokenizer/ (or $DS4F_FUZZ_TOKENIZER). The first
 * input byte chooses what is fuzzed; the rest is the data. Any failed property aborts. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"
#include "text/tokenizer_internal.h"
#include "text/tokenizer_jsonl.h"

#ifdef WITH_ONIGURUMA
#include <oniguruma.h>
#endif

static tokenizer *real;

#define ASSERT(cond, what)                                                     \
    do {                                                                       \
        if (!(cond)) { fprintf(stderr, "property failed: %s\n", what); abort(); } \
    } while (0)

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *path = getenv("DS4F_FUZZ_TOKENIZER");
    if (!path) path = "tests/data/tokenizer/tokenizer.json";
    ds4f_error err = {{0}};
    if (tokenizer_load(path, &real, &err) != 0) {
        fprintf(stderr, "fuzz_tokenizer: %s (run from the repository root)\n", err.msg);
        exit(1);
    }
#ifdef WITH_ONIGURUMA
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
#endif
    return 0;
}

static bool is_valid_utf8(const uint8_t *s, size_t len) {
    for (size_t i = 0; i < len;) {
        size_t n = utf8_valid_char_len(s + i, len - i);
        if (!n) return false;
        i += n;
    }
    return true;
}

/* encode -> decode gives the bytes back; the stream decoder gives the same bytes, and for valid
 * UTF-8 input never hands out a chunk that is not valid UTF-8 on its own. */
static void fuzz_round_trip(const uint8_t *data, size_t len, unsigned flags) {
    int32_t *ids = NULL;
    size_t n = 0;
    ds4f_error err = {{0}};
    ASSERT(tokenizer_encode_flags(real, (const char *)data, len, flags, &ids, &n, &err) == 0, err.msg);
    char *text = NULL;
    size_t text_len = 0;
    ASSERT(tokenizer_decode(real, ids, n, &text, &text_len, &err) == 0, err.msg);
    ASSERT(text_len == len && (len == 0 || !memcmp(text, data, len)), "decode(encode(x)) == x");
    bool valid = is_valid_utf8(data, len);
    tokenizer_stream s;
    tokenizer_stream_init(&s, real);
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        const char *chunk;
        size_t chunk_len;
        ASSERT(tokenizer_stream_push(&s, ids[i], &chunk, &chunk_len, &err) == 0, err.msg);
        ASSERT(pos + chunk_len <= len && !memcmp(chunk, data + pos, chunk_len), "stream chunk matches the text");
        ASSERT(!valid || is_valid_utf8((const uint8_t *)chunk, chunk_len), "stream chunk of valid text is valid");
        pos += chunk_len;
    }
    const char *rest;
    size_t rest_len;
    tokenizer_stream_flush(&s, &rest, &rest_len);
    ASSERT(pos + rest_len == len && !memcmp(rest, data + pos, rest_len), "stream flush completes the text");
    ASSERT(!valid || rest_len == 0, "nothing is held at the end of valid text");
    tokenizer_stream_free(&s);
    free(text);
    free(ids);
}

/* The command's line reader, in both directions; a string that parses writes back to itself. */
static void fuzz_jsonl(const uint8_t *data, size_t len) {
    for (int decode = 0; decode < 2; decode++) {
        FILE *in = fmemopen((void *)data, len ? len : 1, "r");
        if (!in) return;
        char *out = NULL;
        size_t out_len = 0;
        FILE *out_file = open_memstream(&out, &out_len);
        ds4f_error err = {{0}};
        if (len) tokenizer_jsonl_run(real, in, out_file, decode, 0, &err);
        fclose(in);
        fclose(out_file);
        free(out);
    }
    size_t pos = 0;
    char *value;
    size_t value_len;
    ds4f_error err = {{0}};
    if (tokenizer_json_parse_string((const char *)data, len, &pos, &value, &value_len, &err) == 0) {
        char *json = NULL;
        size_t json_len = 0;
        FILE *f = open_memstream(&json, &json_len);
        tokenizer_json_write_string(f, value, value_len);
        fclose(f);
        size_t pos2 = 0;
        char *again;
        size_t again_len;
        ASSERT(tokenizer_json_parse_string(json, json_len, &pos2, &again, &again_len, &err) == 0, err.msg);
        ASSERT(again_len == value_len && !memcmp(again, value, value_len), "JSON string round trip");
        free(again);
        free(json);
        free(value);
    }
}

typedef struct piece_list {
    size_t starts[4096], lens[4096];
    size_t n;
    const uint8_t *base;
} piece_list;

static int collect(void *ctx, const uint8_t *p, size_t len, ds4f_error *err) {
    (void)err;
    piece_list *l = ctx;
    if (l->n < 4096) { l->starts[l->n] = (size_t)(p - l->base); l->lens[l->n] = len; l->n++; }
    return 0;
}

#ifdef WITH_ONIGURUMA
/* HF's Split(Regex, Isolated) on Oniguruma: the onig crate's find_iter (an empty match right at
 * the end of the previous match is skipped by one character), matches and gaps as pieces. */
static void onig_split(regex_t *const *regs, int n_regs, int step, const uint8_t *base, size_t start, size_t len,
                       piece_list *out) {
    if (len == 0) return;
    if (step == n_regs) {
        if (out->n < 4096) { out->starts[out->n] = start; out->lens[out->n] = len; out->n++; }
        return;
    }
    const UChar *s = base + start, *end = s + len;
    OnigRegion *region = onig_region_new();
    size_t gap = 0, from = 0, last_end = SIZE_MAX;
    while (from <= len) {
        int r = onig_search(regs[step], s, end, s + from, end, region, ONIG_OPTION_NONE);
        if (r < 0) break;
        size_t ms = (size_t)region->beg[0], me = (size_t)region->end[0];
        if (ms == me && me == last_end) {
            if (from >= len) break;
            from += utf8_valid_char_len(s + from, len - from);
            continue;
        }
        onig_split(regs, n_regs, step + 1, base, start + gap, ms - gap, out);
        onig_split(regs, n_regs, step + 1, base, start + ms, me - ms, out);
        gap = from = last_end = me;
    }
    onig_split(regs, n_regs, step + 1, base, start + gap, len - gap, out);
    onig_region_free(region, 1);
}

static regex_t *onig_compile(const char *pattern) {
    regex_t *re = NULL;
    OnigErrorInfo info;
    const UChar *p = (const UChar *)pattern;
    if (onig_new(&re, p, p + strlen(pattern), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info) !=
        ONIG_NORMAL)
        return NULL;
    return re;
}

static void compare_pieces(const piece_list *a, const piece_list *b, const char *what) {
    if (a->n == 4096 || b->n == 4096) return;
    ASSERT(a->n == b->n, what);
    for (size_t i = 0; i < a->n; i++) ASSERT(a->starts[i] == b->starts[i] && a->lens[i] == b->lens[i], what);
}
#endif

/* The real pre-tokenizer against Oniguruma (only meaningful WITH_ONIGURUMA; otherwise checks that
 * the pieces tile the text). */
static void fuzz_pretokenizer(const uint8_t *data, size_t len) {
    if (!is_valid_utf8(data, len)) return;
    static piece_list ours;
    ours.n = 0;
    ours.base = data;
    ds4f_error err = {{0}};
    ASSERT(tokenizer_pretokenize(real, data, len, collect, &ours, &err) == 0, err.msg);
    size_t pos = 0;
    for (size_t i = 0; i < ours.n && ours.n < 4096; i++) {
        ASSERT(ours.starts[i] == pos && ours.lens[i] > 0, "pieces tile the text");
        pos += ours.lens[i];
    }
    ASSERT(ours.n == 4096 || pos == len, "pieces cover the text");
#ifdef WITH_ONIGURUMA
    static regex_t *regs[TOKENIZER_MAX_SPLITS];
    static int n_regs = -1;
    if (n_regs < 0) {
        for (n_regs = 0; n_regs < real->n_splits; n_regs++) {
            regs[n_regs] = onig_compile(real->splits[n_regs].onig_pattern);
            ASSERT(regs[n_regs], "Oniguruma compiles the file's pattern");
        }
    }
    static piece_list theirs;
    theirs.n = 0;
    onig_split(regs, n_regs, 0, data, 0, len, &theirs);
    compare_pieces(&ours, &theirs, "pre-tokenizer pieces equal Oniguruma's");
#endif
}

/* A fuzzed pattern: the translation must not crash; when it accepts the pattern and PCRE2
 * compiles it, splitting a fixed text must not crash (and must equal Oniguruma's split). */
static void fuzz_pattern(const uint8_t *data, size_t len) {
    if (len > 200) return;
    const char *subject = "Hello,  world!\n\n12345 中文テキスト\t(x) a\xE1\xA0\x8E b\xC2\x85 é\xCC\x81 🙂 __init__";
    char *pattern = malloc(len + 1);
    memcpy(pattern, data, len);
    pattern[len] = 0;
    if (memchr(data, 0, len)) { free(pattern); return; }
    tokenizer t;
    memset(&t, 0, sizeof t);
    ds4f_error err = {{0}};
    if (tokenizer_regex_compile(&t.splits[0], pattern, len, &err) == 0) {
        t.n_splits = 1;
        static piece_list ours;
        ours.n = 0;
        ours.base = (const uint8_t *)subject;
        int rc = tokenizer_pretokenize(&t, (const uint8_t *)subject, strlen(subject), collect, &ours, &err);
#ifdef WITH_ONIGURUMA
        regex_t *re = onig_compile(pattern);
        if (rc == 0 && re) {
            static piece_list theirs;
            theirs.n = 0;
            onig_split(&re, 1, 0, (const uint8_t *)subject, 0, strlen(subject), &theirs);
            if (ours.n != theirs.n) fprintf(stderr, "pattern: %s\n", pattern);
            compare_pieces(&ours, &theirs, "translated pattern splits as Oniguruma does");
        }
        if (re) onig_free(re);
#else
        (void)rc;
#endif
        tokenizer_regex_free(&t.splits[0]);
    }
    free(pattern);
}

/* The loader on a tiny tokenizer.json whose middle part (merges, added tokens and pre-tokenizer)
 * is the fuzz input. */
static void fuzz_loader(const uint8_t *data, size_t len) {
    static char *head;
    static size_t head_len;
    if (!head) {
        char buf[16384];
        size_t n = (size_t)snprintf(buf, sizeof buf, "{\"model\":{\"type\":\"BPE\",\"vocab\":{");
        for (int b = 0; b < 256; b++) {
            uint32_t cp = tokenizer_byte_to_codepoint((uint8_t)b);
            if (cp == '"' || cp == '\\') n += (size_t)snprintf(buf + n, sizeof buf - n, "\"\\%c\":%d,", (char)cp, b);
            else if (cp < 0x80) n += (size_t)snprintf(buf + n, sizeof buf - n, "\"%c\":%d,", (char)cp, b);
            else n += (size_t)snprintf(buf + n, sizeof buf - n, "\"%c%c\":%d,", (char)(0xC0 | (cp >> 6)),
                                       (char)(0x80 | (cp & 0x3F)), b);
        }
        n += (size_t)snprintf(buf + n, sizeof buf - n, "\"ab\":256,\"abc\":257},\"merges\":");
        head = strdup(buf);
        head_len = n;
    }
    static const char tail[] = "},\"decoder\":{\"type\":\"ByteLevel\"}}";
    char *json = malloc(head_len + len + sizeof tail);
    memcpy(json, head, head_len);
    memcpy(json + head_len, data, len);
    memcpy(json + head_len + len, tail, sizeof tail);
    tokenizer *tok = NULL;
    ds4f_error err = {{0}};
    if (tokenizer_load_from_memory(json, head_len + len + sizeof tail - 1, "fuzz.json", &tok, &err) == 0) {
        static const char text[] = "abc ab a<|x|>\xFF\xC3";
        int32_t *ids = NULL;
        size_t n = 0;
        char *back = NULL;
        size_t back_len = 0;
        ASSERT(tokenizer_encode(tok, text, sizeof text - 1, &ids, &n, &err) == 0, err.msg);
        ASSERT(tokenizer_decode(tok, ids, n, &back, &back_len, &err) == 0, err.msg);
        free(ids);
        free(back);
        tokenizer_free(tok);
    }
    free(json);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const uint8_t *rest = data + 1;
    size_t len = size - 1;
    switch (data[0] % 6) {
    case 0: fuzz_round_trip(rest, len, 0); break;
    case 1: fuzz_round_trip(rest, len, TOKENIZER_PLAIN_TEXT); break;
    case 2: fuzz_jsonl(rest, len); break;
    case 3: fuzz_pretokenizer(rest, len); break;
    case 4: fuzz_pattern(rest, len); break;
    case 5: fuzz_loader(rest, len); break;
    }
    return 0;
}
