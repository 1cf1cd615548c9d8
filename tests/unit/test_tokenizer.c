/* Tokenizer: the 2118 HF Rust vectors, the spec's examples, special ids, invalid UTF-8, streaming
 * decode, the regex translation, the loader's refusals and the JSON-lines front end. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/commands.h"
#include "base/file_io.h"
#include "test.h"
#include "text/tokenizer.h"
#include "text/tokenizer_internal.h"
#include "text/tokenizer_jsonl.h"

#define TOKENIZER_JSON "tests/data/tokenizer/tokenizer.json"
#define VECTORS_JSON "tests/data/tokenizer/hf_rust_vectors.json"

/* The real tokenizer, loaded once for all tests (about 0.1 s). */
static tokenizer *real_tokenizer(void) {
    static tokenizer *tok;
    static bool tried;
    if (!tried) {
        tried = true;
        ds4f_error err = {{0}};
        if (tokenizer_load(TOKENIZER_JSON, &tok, &err) != 0) printf("    load failed: %s\n", err.msg);
    }
    return tok;
}

static bool ids_equal(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static void format_ids(char *out, size_t size, const int32_t *ids, size_t n) {
    size_t pos = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && pos + 16 < size; i++) pos += (size_t)snprintf(out + pos, size - pos, "%s%d", i ? "," : "", ids[i]);
}

static void check_encodes_to(const tokenizer *tok, const char *text, size_t len, const int32_t *want, size_t n_want,
                             const char *label) {
    int32_t *ids = NULL;
    size_t n = 0;
    ds4f_error err = {{0}};
    if (tokenizer_encode(tok, text, len, &ids, &n, &err) != 0) {
        CHECK(0, "%s: encode failed: %s", label, err.msg);
        return;
    }
    if (!ids_equal(ids, n, want, n_want)) {
        char got_s[400], want_s[400];
        format_ids(got_s, sizeof got_s, ids, n);
        format_ids(want_s, sizeof want_s, want, n_want);
        CHECK(0, "%s: got [%s] want [%s]", label, got_s, want_s);
    }
    char *back = NULL;
    size_t back_len = 0;
    if (tokenizer_decode(tok, want, n_want, &back, &back_len, &err) != 0) CHECK(0, "%s: decode failed: %s", label, err.msg);
    else CHECK(back_len == len && memcmp(back, text, len) == 0, "%s: decode does not give the text back", label);
    free(back);
    free(ids);
}

TEST(tokenizer_hf_rust_vectors) {
    tokenizer *tok = real_tokenizer();
    REQUIRE(tok, "tokenizer did not load");
    char *json;
    size_t len;
    ds4f_error err = {{0}};
    REQUIRE(file_read_all(VECTORS_JSON, &json, &len, &err) == 0, "%s", err.msg);
    /* [{"t": text, "ids": [...]}, ...], read with the tokenize command's JSON readers (the texts
     * contain "\u0000", which cJSON would truncate). */
    size_t pos = 0, count = 0, failures = 0;
    bool ok = tokenizer_json_expect(json, len, &pos, '[', &err) == 0;
    while (ok) {
        char *text = NULL;
        size_t text_len = 0;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        ok = tokenizer_json_expect(json, len, &pos, '{', &err) == 0;
        for (int field = 0; ok && field < 2; field++) {
            char *key;
            size_t key_len;
            ok = tokenizer_json_parse_string(json, len, &pos, &key, &key_len, &err) == 0 &&
                 tokenizer_json_expect(json, len, &pos, ':', &err) == 0;
            if (ok && !strcmp(key, "t")) ok = tokenizer_json_parse_string(json, len, &pos, &text, &text_len, &err) == 0;
            else if (ok && !strcmp(key, "ids")) ok = tokenizer_json_parse_ids(json, len, &pos, &ids, &n_ids, &err) == 0;
            else if (ok) ok = (error_set(&err, "unknown key %s", key), false);
            free(key);
            if (ok && field == 0) ok = tokenizer_json_expect(json, len, &pos, ',', &err) == 0;
        }
        if (ok) ok = tokenizer_json_expect(json, len, &pos, '}', &err) == 0;
        if (ok && text) {
            char label[64];
            snprintf(label, sizeof label, "vector %zu", count);
            bool before = test_failed_now();
            check_encodes_to(tok, text, text_len, ids, n_ids, label);
            if (!before && test_failed_now()) failures++;
            count++;
        }
        free(text);
        free(ids);
        if (!ok) break;
        pos = tokenizer_json_skip_space(json, len, pos);
        if (pos < len && json[pos] == ',') { pos++; continue; }
        break;
    }
    CHECK(ok, "vectors file: %s", err.msg);
    CHECK(count == 2118, "expected 2118 vectors, read %zu", count);
    free(json);
}

TEST(tokenizer_spec_examples) {
    tokenizer *tok = real_tokenizer();
    REQUIRE(tok, "tokenizer did not load");
    const char *t1 = "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ";
    const int32_t w1[] = {19923, 3, 223, 5464, 5008, 1175, 19, 940, 223, 19, 438, 223, 20,
                          6113, 257, 76589, 131, 100, 76032, 1628, 76589, 131, 108, 76589, 131, 98};
    check_encodes_to(tok, t1, strlen(t1), w1, sizeof w1 / sizeof *w1, "spec example 1");
    const char *t2 = "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>";
    const int32_t w2[] = {128803, 30594, 128804, 128821, 36101, 128822, 7624, 1};
    check_encodes_to(tok, t2, strlen(t2), w2, sizeof w2 / sizeof *w2, "spec example 2");
}

TEST(tokenizer_special_ids_from_file) {
    tokenizer *tok = real_tokenizer();
    REQUIRE(tok, "tokenizer did not load");
    CHECK(tokenizer_vocab_size(tok) == 129280, "vocab size %d", tokenizer_vocab_size(tok));
    static const struct { const char *name; int32_t id; } specials[] = {
        {"<｜begin▁of▁sentence｜>", 0}, {"<｜end▁of▁sentence｜>", 1}, {"<｜User｜>", 128803},
        {"<｜Assistant｜>", 128804}, {"<think>", 128821}, {"</think>", 128822}, {"｜DSML｜", 128825},
        {"<｜latest_reminder｜>", 128828}, {"<｜action｜>", 128829}, {"<｜read_url｜>", 128845},
        {"<｜image｜>", 129279}, {"Ġthe", 270}, {"no such token", -1}, {"", -1},
    };
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) {
        int32_t id = tokenizer_token_id(tok, specials[i].name);
        CHECK(id == specials[i].id, "%s: id %d, want %d", specials[i].name, id, specials[i].id);
    }
    size_t len;
    const uint8_t *b = tokenizer_token_bytes(tok, 270, &len);
    CHECK(b && len == 4 && !memcmp(b, " the", 4), "id 270 should decode to \" the\"");
    b = tokenizer_token_bytes(tok, 128803, &len);
    CHECK(b && len == strlen("<｜User｜>") && !memcmp(b, "<｜User｜>", len), "an added token decodes to its content");
    CHECK(tokenizer_token_bytes(tok, 129280, &len) == NULL && tokenizer_token_bytes(tok, -1, &len) == NULL,
          "ids out of range have no bytes");
}

TEST(tokenizer_plain_text_flag) {
    tokenizer *tok = real_tokenizer();
    REQUIRE(tok, "tokenizer did not load");
    const char *text = "say <｜User｜> and <think>";
    int32_t *plain = NULL, *with_added = NULL;
    size_t n_plain = 0, n_added = 0;
    ds4f_error err = {{0}};
    REQUIRE(tokenizer_encode_flags(tok, text, strlen(text), TOKENIZER_PLAIN_TEXT, &plain, &n_plain, &err) == 0, "%s", err.msg);
    REQUIRE(tokenizer_encode(tok, text, strlen(text), &with_added, &n_added, &err) == 0, "%s", err.msg);
    bool plain_has_control = false, added_has_user = false;
    for (size_t i = 0; i < n_plain; i++) plain_has_control |= plain[i] >= 128000;
    for (size_t i = 0; i < n_added; i++) added_has_user |= with_added[i] == 128803;
    CHECK(!plain_has_control, "plain text must not produce added tokens");
    CHECK(added_has_user, "default encoding matches <｜User｜>");
    char *back;
    size_t back_len;
    REQUIRE(tokenizer_decode(tok, plain, n_plain, &back, &back_len, &err) == 0, "%s", err.msg);
    CHECK(back_len == strlen(text) && !memcmp(back, text, back_len), "plain encoding round-trips");
    free(back);
    free(plain);
    free(with_added);
}

/* Leftmost-longest, non-normalized tokens first: "<｜tr｜>" (normalized=false) must not be cut by
 * anything else, and a token inside ordinary text is found wherever it starts. */
TEST(tokenizer_added_token_matching) {
    tokenizer *tok = real_tokenizer();
    REQUIRE(tok, "tokenizer did not load");
    const char *text = "x<｜tr｜><think></think><｜User｜";
    int32_t *ids;
    size_t n;
    ds4f_error err = {{0}};
    REQUIRE(tokenizer_encode(tok, text, strlen(text), &ids, &n, &err) == 0, "%s", err.msg);
    int32_t tr = tokenizer_token_id(tok, "<｜tr｜>");
    CHECK(n >= 4 && ids[1] == tr && ids[2] == 128821 && ids[3] == 128822, "added tokens in sequence");
    for (size_t i = 4; i < n; i++) CHECK(ids[i] != 128803, "an unterminated <｜User｜ is plain text");
    free(ids);
}

static bool round_trips(const tokenizer *tok, const uint8_t *bytes, size_t len, unsigned flags) {
    int32_t *ids = NULL;
    size_t n = 0;
    char *back = NULL;
    size_t back_len = 0;
    ds4f_error err = {{0}};
    bool ok = tokenizer_encode_flags(tok, (const char *)bytes, len, flags, &ids, &n, &err) == 0 &&
              tokenizer_decode(tok, ids, n, &back, &back_len, &err) == 0 && back_len == len &&
              (len == 0 || memcmp(back, bytes, len) == 0);
    free(ids);
    free(back);
    return ok;
}

TEST(tokenizer_invalid_utf8_round_trips) {
    tokenizer *tok = real_tokenizer();
    REQUIRE(tok, "tokenizer did not load");
    static const char *const cases[] = {
        "ab\xFF" "cd", "\xC3", "\xE4\xBD", "\xE4\xBD" "a", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xC0\xAF",
        "x \xF0\x9F\x98", "\x80\x80\x80 hello", "<\xEF\xBD\x9CUser\xEF\xBD\x9C>\xFF",
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CHECK(round_trips(tok, (const uint8_t *)cases[i], strlen(cases[i]), 0), "case %zu does not round-trip", i);
        CHECK(round_trips(tok, (const uint8_t *)cases[i], strlen(cases[i]), TOKENIZER_PLAIN_TEXT),
              "case %zu (plain) does not round-trip", i);
    }
    /* An ill-formed run is a piece of its own: "ab\xFFcd" is "ab" + "\xFF" + "cd". */
    int32_t *ids;
    size_t n;
    ds4f_error err = {{0}};
    REQUIRE(tokenizer_encode(tok, "ab\xFF" "cd", 5, &ids, &n, &err) == 0, "%s", err.msg);
    int32_t *ab, *cd;
    size_t n_ab, n_cd;
    REQUIRE(tokenizer_encode(tok, "ab", 2, &ab, &n_ab, &err) == 0 && tokenizer_encode(tok, "cd", 2, &cd, &n_cd, &err) == 0,
            "%s", err.msg);
    CHECK(n == n_ab + 1 + n_cd && ids[n_ab] == tok->byte_id[0xFF], "ill-formed byte splits the text");
    free(ids);
    free(ab);
    free(cd);
    /* Random bytes, biased towards UTF-8 lead and continuation bytes. */
    uint64_t state = 12345;
    uint8_t buf[300];
    for (int round = 0; round < 300; round++) {
        size_t len = (size_t)(round % 97) * 3;
        for (size_t i = 0; i < len; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            uint8_t r = (uint8_t)(state >> 56);
            buf[i] = r < 96 ? (uint8_t)(0x80 | (r & 0x3F)) : r < 128 ? (uint8_t)(0xC0 | (r & 0x3F)) : r < 200 ? (uint8_t)(' ' + r % 90) : r;
        }
        CHECK(round_trips(tok, buf, len, 0), "random case %d does not round-trip", round);
    }
}

static bool valid_utf8(const char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        size_t n = utf8_valid_char_len((const uint8_t *)s + i, len - i);
        if (!n) return false;
        i += n;
    }
    return true;
}

TEST(tokenizer_stream_decode_never_splits_characters) {
    tokenizer *tok = real_tokenizer();
    REQUIRE(tok, "tokenizer did not load");
    /* Rare CJK characters, emoji with modifiers and Cyrillic come out as several byte tokens. */
    const char *text = "龘靐齉 👩🏽‍🚀 привет 𠀋𠀍 ok\xF0\x9F";
    int32_t *ids;
    size_t n;
    ds4f_error err = {{0}};
    REQUIRE(tokenizer_encode(tok, text, strlen(text), &ids, &n, &err) == 0, "%s", err.msg);
    tokenizer_stream s;
    tokenizer_stream_init(&s, tok);
    char all[256];
    size_t all_len = 0;
    int held_back = 0;
    for (size_t i = 0; i < n; i++) {
        const char *chunk;
        size_t chunk_len;
        REQUIRE(tokenizer_stream_push(&s, ids[i], &chunk, &chunk_len, &err) == 0, "%s", err.msg);
        CHECK(valid_utf8(chunk, chunk_len), "chunk %zu splits a character", i);
        if (s.held_len) held_back++;
        memcpy(all + all_len, chunk, chunk_len);
        all_len += chunk_len;
    }
    const char *rest;
    size_t rest_len;
    tokenizer_stream_flush(&s, &rest, &rest_len);
    CHECK(rest_len == 2 && !memcmp(rest, "\xF0\x9F", 2), "flush returns the unfinished character");
    memcpy(all + all_len, rest, rest_len);
    all_len += rest_len;
    CHECK(held_back > 0, "the text should have needed holding back");
    CHECK(all_len == strlen(text) && !memcmp(all, text, all_len), "stream output equals the text");
    const char *chunk;
    size_t chunk_len;
    CHECK(tokenizer_stream_push(&s, 129280, &chunk, &chunk_len, &err) != 0 && strstr(err.msg, "129280"),
          "out-of-range id is an error");
    /* Bytes that cannot become a character are passed on at once. */
    REQUIRE(tokenizer_stream_push(&s, tok->byte_id[0xFF], &chunk, &chunk_len, &err) == 0, "%s", err.msg);
    CHECK(chunk_len == 1 && (uint8_t)chunk[0] == 0xFF, "0xFF is emitted, not held");
    REQUIRE(tokenizer_stream_push(&s, tok->byte_id[0xE0], &chunk, &chunk_len, &err) == 0, "%s", err.msg);
    CHECK(chunk_len == 0, "E0 is held");
    REQUIRE(tokenizer_stream_push(&s, tok->byte_id[0x80], &chunk, &chunk_len, &err) == 0, "%s", err.msg);
    CHECK(chunk_len == 2, "E0 80 (overlong) is emitted as soon as it is known ill-formed");
    tokenizer_stream_free(&s);
    free(ids);
}

TEST(tokenizer_bpe_scan_equals_heap) {
    tokenizer *tok = real_tokenizer();
    REQUIRE(tok, "tokenizer did not load");
    static const char *const words[] = {"hello", " world", "================================", "        ",
                                        "internationalization", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"};
    int32_t a[64], b[64];
    for (size_t i = 0; i < sizeof words / sizeof *words; i++) {
        size_t len = strlen(words[i]);
        size_t na = tokenizer_bpe_piece(tok, (const uint8_t *)words[i], len, a, 0);
        size_t nb = tokenizer_bpe_piece(tok, (const uint8_t *)words[i], len, b, 2);
        CHECK(ids_equal(a, na, b, nb), "\"%s\": scan and heap differ", words[i]);
    }
    uint64_t state = 99;
    uint8_t piece[48];
    const char alphabet[] = "aeinorst ._=-\n";
    for (int round = 0; round < 2000; round++) {
        size_t len = 2 + (size_t)round % 46;
        for (size_t i = 0; i < len; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            piece[i] = (uint8_t)alphabet[(state >> 33) % (sizeof alphabet - 1)];
        }
        size_t na = tokenizer_bpe_piece(tok, piece, len, a, 0);
        size_t nb = tokenizer_bpe_piece(tok, piece, len, b, 2);
        CHECK(ids_equal(a, na, b, nb), "random piece %d: scan and heap differ", round);
    }
}

typedef struct pieces {
    char text[512];
    size_t len;
} pieces;

static int collect_piece(void *ctx, const uint8_t *p, size_t len, ds4f_error *err) {
    (void)err;
    pieces *c = ctx;
    if (c->len + len + 2 < sizeof c->text) {
        memcpy(c->text + c->len, p, len);
        c->len += len;
        c->text[c->len++] = '|';
        c->text[c->len] = 0;
    }
    return 0;
}

/* The pre-tokenizer's regexes follow Oniguruma where PCRE2 differs: U+180E (Cf since Unicode 6.3)
 * is not \s, U+0085 and U+3000 are. The pieces are joined with '|'. */
TEST(tokenizer_pretokenizer_oniguruma_semantics) {
    tokenizer *tok = real_tokenizer();
    REQUIRE(tok, "tokenizer did not load");
    static const struct { const char *text, *want; } cases[] = {
        {"x\xE1\xA0\x8E\ny", "x|\xE1\xA0\x8E|\n|y|"},
        {"x\xC2\x85\ny", "x|\xC2\x85\n|y|"},
        {"a\xE3\x80\x80\xE3\x80\x80" "b", "a|\xE3\x80\x80|\xE3\x80\x80" "b|"},
        {"Hello  world\n\n  x", "Hello| | world|\n\n| | x|"},
        {"12345 abc", "123|45| abc|"},
        {"中文text", "中文|text|"},
        {"foo.bar(baz)", "foo|.bar|(baz|)|"},
        {"  \n  ", "  \n|  |"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        pieces c = {{0}, 0};
        ds4f_error err = {{0}};
        CHECK(tokenizer_pretokenize(tok, (const uint8_t *)cases[i].text, strlen(cases[i].text), collect_piece, &c, &err) == 0,
              "%s", err.msg);
        CHECK(!strcmp(c.text, cases[i].want), "case %zu: pieces \"%s\", want \"%s\"", i, c.text, cases[i].want);
    }
}

TEST(tokenizer_regex_translation) {
    char *out;
    ds4f_error err = {{0}};
    REQUIRE(tokenizer_regex_translate("\\s+(?!\\S)", 9, &out, &err) == 0, "%s", err.msg);
    CHECK(strstr(out, "\\x{1680}") && !strstr(out, "180E") && strstr(out, "[^"), "\\s spelled out: %s", out);
    free(out);
    REQUIRE(tokenizer_regex_translate("a{,3}\\u00e9\\xA", 14, &out, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(out, "a{0,3}\\x{00e9}\\x{A}"), "translated to %s", out);
    free(out);
    static const char *const refused[] = {"\\w+", "^a", "a$", "[a[b]]", "[a&&b]", "(?i)a", "\\bx", "\\h", "a{1,2}+",
                                          "\\p{Greek}", "[\\S]", "\\1", "a{x}", "(?<name>a)", "\\"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        err.msg[0] = 0;
        out = NULL;
        CHECK(tokenizer_regex_translate(refused[i], strlen(refused[i]), &out, &err) != 0 && strstr(err.msg, "not supported"),
              "\"%s\" should be refused (got \"%s\")", refused[i], out ? out : err.msg);
        free(out);
    }
}

/* A minimal byte-level tokenizer.json: the 256 byte tokens, merges of "a b" -> "ab" etc. The
 * pre_tokenizer / model / decoder parts can be replaced to test the loader's refusals. */
static char *tiny_tokenizer_json(const char *pre_tokenizer, const char *model_extra, const char *merges,
                                 const char *decoder) {
    size_t cap = 65536;
    char *j = malloc(cap);
    size_t n = (size_t)snprintf(j, cap, "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":259,\"content\":\"<|x|>\","
                                "\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,"
                                "\"special\":true}],\"normalizer\":null,\"pre_tokenizer\":%s,\"post_processor\":null,"
                                "\"decoder\":%s,\"model\":{\"type\":\"BPE\"%s,\"vocab\":{",
                                pre_tokenizer, decoder, model_extra);
    for (int b = 0; b < 256; b++) {
        uint32_t cp = tokenizer_byte_to_codepoint((uint8_t)b);
        char ch[8];
        if (cp == '"' || cp == '\\') snprintf(ch, sizeof ch, "\\%c", (char)cp);
        else if (cp < 0x80) snprintf(ch, sizeof ch, "%c", (char)cp);
        else snprintf(ch, sizeof ch, "%c%c", (char)(0xC0 | (cp >> 6)), (char)(0x80 | (cp & 0x3F)));
        n += (size_t)snprintf(j + n, cap - n, "\"%s\":%d,", ch, b);
    }
    n += (size_t)snprintf(j + n, cap - n, "\"ab\":256,\"abc\":257,\"bc\":258},\"merges\":%s}}", merges);
    return j;
}

static const char TINY_PRE[] = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
                               "\"\\\\s+|[a-z]+\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
                               "\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":false}]}";
static const char TINY_DECODER[] = "{\"type\":\"ByteLevel\"}";

static void expect_load(const char *json, const char *want_in_error, const char *label) {
    tokenizer *tok = NULL;
    ds4f_error err = {{0}};
    int rc = tokenizer_load_from_memory(json, strlen(json), "tiny.json", &tok, &err);
    if (!want_in_error) CHECK(rc == 0, "%s: %s", label, err.msg);
    else CHECK(rc != 0 && strstr(err.msg, want_in_error) && strstr(err.msg, "tiny.json"),
               "%s: expected an error mentioning \"%s\", got \"%s\"", label, want_in_error, rc ? err.msg : "success");
    tokenizer_free(tok);
}

TEST(tokenizer_loader_small_vocabulary_and_refusals) {
    char *good = tiny_tokenizer_json(TINY_PRE, "", "[\"a b\",[\"ab\",\"c\"],\"b c\"]", TINY_DECODER);
    tokenizer *tok = NULL;
    ds4f_error err = {{0}};
    REQUIRE(tokenizer_load_from_memory(good, strlen(good), "tiny.json", &tok, &err) == 0, "%s", err.msg);
    CHECK(tokenizer_vocab_size(tok) == 260, "vocab size %d", tokenizer_vocab_size(tok));
    CHECK(tokenizer_token_id(tok, "<|x|>") == 259 && tokenizer_token_id(tok, "<｜end▁of▁sentence｜>") == -1,
          "special ids come from the file");
    int32_t *ids;
    size_t n;
    REQUIRE(tokenizer_encode(tok, "abc bc<|x|>", 11, &ids, &n, &err) == 0, "%s", err.msg);
    const int32_t want[] = {257, ' ', 258, 259};
    CHECK(ids_equal(ids, n, want, 4), "tiny encode");
    free(ids);
    tokenizer_free(tok);
    free(good);

    struct { const char *pre, *model_extra, *merges, *decoder, *error; } bad[] = {
        {"{\"type\":\"Whitespace\"}", "", "[]", TINY_DECODER, "\"Whitespace\" is not supported"},
        {"{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}", "", "[]", TINY_DECODER, "use_regex"},
        {TINY_PRE, ",\"dropout\":0.1", "[]", TINY_DECODER, "dropout"},
        {TINY_PRE, "", "[\"a q\"]", TINY_DECODER, "\"aq\", which is not in model.vocab"},
        {TINY_PRE, "", "[\"abc\"]", TINY_DECODER, "merges[0]"},
        {TINY_PRE, "", "[]", "{\"type\":\"WordPiece\"}", "decoder type \"WordPiece\""},
        {"{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\w+\"},\"behavior\":\"Isolated\"}", "", "[]", TINY_DECODER,
         "not supported"},
        {"{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},"
         "\"behavior\":\"Isolated\"}]}", "", "[]", TINY_DECODER, "Regex"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *json = tiny_tokenizer_json(bad[i].pre, bad[i].model_extra, bad[i].merges, bad[i].decoder);
        char label[32];
        snprintf(label, sizeof label, "bad case %zu", i);
        expect_load(json, bad[i].error, label);
        free(json);
    }
    expect_load("{\"model\":", "not valid JSON", "truncated");
    expect_load("[]", "not a JSON object", "array");
    /* A vocabulary without the byte '$', and one with a hole (ids 256 and 260..299 unused). */
    char *holes = tiny_tokenizer_json(TINY_PRE, "", "[]", TINY_DECODER);
    char *at = strstr(holes, "\"$\":36,");
    REQUIRE(at, "fixture");
    memmove(at, at + 7, strlen(at + 7) + 1);
    expect_load(holes, "no token for byte 0x24", "missing byte");
    free(holes);
    holes = tiny_tokenizer_json(TINY_PRE, "", "[]", TINY_DECODER);
    at = strstr(holes, "\"ab\":256");
    REQUIRE(at, "fixture");
    memcpy(at, "\"ab\":300", 8);
    expect_load(holes, "id 256 is neither", "hole");
    free(holes);
}

static char *run_jsonl(const tokenizer *tok, const char *input, bool decode, unsigned flags, int *rc, ds4f_error *err) {
    FILE *in = fmemopen((void *)input, strlen(input), "r");
    char *out_buf = NULL;
    size_t out_len = 0;
    FILE *out = open_memstream(&out_buf, &out_len);
    *rc = tokenizer_jsonl_run(tok, in, out, decode, flags, err);
    fclose(in);
    fclose(out);
    return out_buf;
}

TEST(tokenizer_jsonl_front_end) {
    tokenizer *tok = real_tokenizer();
    REQUIRE(tok, "tokenizer did not load");
    int rc;
    ds4f_error err = {{0}};
    char *out = run_jsonl(tok, "\"Hello!\"\n  \"\\u0000\\ud83d\\ude00 <think>\"  \r\n\"\"", false, 0, &rc, &err);
    CHECK(rc == 0, "%s", err.msg);
    CHECK(out && !strcmp(out, "[19923,3]\n[191,28927,225,223,128821]\n[]\n"), "encode output: %s", out);
    free(out);
    out = run_jsonl(tok, "[19923, 3]\n[]\n[191,28927,225,223,128821]\n[128803]\n[ 3 , 4 ]\n", true, 0, &rc, &err);
    CHECK(rc == 0, "%s", err.msg);
    CHECK(out && !strcmp(out, "\"Hello!\"\n\"\"\n\"\\u0000😀 <think>\"\n\"<｜User｜>\"\n\"!\\\"\"\n"), "decode output: %s", out);
    free(out);
    out = run_jsonl(tok, "[" "128" "]\n[223]\n", true, 0, &rc, &err);
    CHECK(rc == 0, "%s", err.msg);
    free(out);
    static const struct { const char *input; bool decode; const char *error; } bad[] = {
        {"\"ok\"\nnot json\n", false, "line 2, column 1: expected a JSON string"},
        {"\"unterminated\n", false, "line 1, column 1: string opened here is not closed"},
        {"\"a\" \"b\"\n", false, "line 1, column 5: unexpected text after the string"},
        {"\"\\ud800\"\n", false, "lone UTF-16 high surrogate"},
        {"\"\\x\"\n", false, "invalid escape"},
        {"\"\xFF\"\n", false, "invalid UTF-8"},
        {"\"tab\there\"\n", false, "raw control character"},
        {"\n", false, "line 1: empty line"},
        {"[1,2\n", true, "expected ',' or ']'"},
        {"[1.5]\n", true, "no fraction"},
        {"[-1]\n", true, "non-negative integer"},
        {"[01]\n", true, "leading zeros"},
        {"[99999999999]\n", true, "id too large"},
        {"[1]\n[129280]\n", true, "line 2: decode: id 129280 at index 0 is outside the vocabulary"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err.msg[0] = 0;
        out = run_jsonl(tok, bad[i].input, bad[i].decode, 0, &rc, &err);
        CHECK(rc != 0 && strstr(err.msg, bad[i].error), "bad input %zu: expected \"%s\", got \"%s\"", i, bad[i].error,
              rc ? err.msg : "success");
        free(out);
    }
}

/* Ill-formed bytes from decoding arbitrary ids become U+FFFD in JSON output, one per maximal
 * ill-formed subsequence (as Rust's from_utf8_lossy, so as HF's decode). */
TEST(tokenizer_json_write_lossy) {
    static const struct { const char *bytes, *want; } cases[] = {
        {"a\xFF" "b", "\"a\xEF\xBF\xBD" "b\""},
        {"\xE4\xBD", "\"\xEF\xBF\xBD\""},
        {"\xE0\x80", "\"\xEF\xBF\xBD\xEF\xBF\xBD\""},
        {"\xF0\x9F\x98" "x", "\"\xEF\xBF\xBDx\""},
        {"\"\\\n\x01", "\"\\\"\\\\\\n\\u0001\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        tokenizer_json_write_string(f, cases[i].bytes, strlen(cases[i].bytes));
        fclose(f);
        CHECK(!strcmp(buf, cases[i].want), "case %zu: got %s", i, buf);
        free(buf);
    }
}

/* The subcommand itself, with stdin, stdout and stderr redirected to files. */
static int run_cmd_tokenize(char **argv, int argc, const char *input, char *out, size_t out_size, char *errout,
                            size_t err_size) {
    char in_path[] = "/tmp/ds4f_tok_in_XXXXXX", out_path[] = "/tmp/ds4f_tok_out_XXXXXX",
         err_path[] = "/tmp/ds4f_tok_err_XXXXXX";
    int in_fd = mkstemp(in_path), out_fd = mkstemp(out_path), err_fd = mkstemp(err_path);
    if (in_fd < 0 || out_fd < 0 || err_fd < 0) return -100;
    if (write(in_fd, input, strlen(input)) != (ssize_t)strlen(input)) return -100;
    lseek(in_fd, 0, SEEK_SET);
    fflush(stdout);
    fflush(stderr);
    int saved[3] = {dup(0), dup(1), dup(2)};
    dup2(in_fd, 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    clearerr(stdin);
    int rc = cmd_tokenize(argc, argv);
    fflush(stdout);
    fflush(stderr);
    for (int fd = 0; fd < 3; fd++) { dup2(saved[fd], fd); close(saved[fd]); }
    clearerr(stdin);
    char *bufs[2] = {out, errout};
    size_t sizes[2] = {out_size, err_size};
    int fds[2] = {out_fd, err_fd};
    for (int k = 0; k < 2; k++) {
        ssize_t n = pread(fds[k], bufs[k], sizes[k] - 1, 0);
        bufs[k][n > 0 ? n : 0] = 0;
    }
    close(in_fd); close(out_fd); close(err_fd);
    unlink(in_path); unlink(out_path); unlink(err_path);
    return rc;
}

TEST(tokenizer_cmd_tokenize) {
    char out[4096], errout[4096];
    char *encode[] = {"tokenize", "--tokenizer", "tests/data/tokenizer", NULL};
    int rc = run_cmd_tokenize(encode, 3, "\"Hello!\"\n\"<｜User｜>\"\n", out, sizeof out, errout, sizeof errout);
    CHECK(rc == 0 && !strcmp(out, "[19923,3]\n[128803]\n"), "encode: rc %d, out %s, err %s", rc, out, errout);
    char *plain[] = {"tokenize", "-m", "tests/data/tokenizer", "--plain", NULL};
    rc = run_cmd_tokenize(plain, 4, "\"<｜User｜>\"\n", out, sizeof out, errout, sizeof errout);
    CHECK(rc == 0 && strcmp(out, "[128803]\n") != 0 && out[0] == '[', "--plain: rc %d, out %s", rc, out);
    char *decode[] = {"tokenize", "--tokenizer=" TOKENIZER_JSON, "--decode", NULL};
    rc = run_cmd_tokenize(decode, 3, "[19923,3]\n", out, sizeof out, errout, sizeof errout);
    CHECK(rc == 0 && !strcmp(out, "\"Hello!\"\n"), "decode: rc %d, out %s, err %s", rc, out, errout);
    rc = run_cmd_tokenize(encode, 3, "\"ok\"\n[1]\n", out, sizeof out, errout, sizeof errout);
    CHECK(rc == 1 && strstr(errout, "line 2, column 1") && !strcmp(out, "[633]\n"), "bad line: rc %d, err %s", rc, errout);
    char *none[] = {"tokenize", NULL};
    rc = run_cmd_tokenize(none, 1, "", out, sizeof out, errout, sizeof errout);
    CHECK(rc == 2 && strstr(errout, "--tokenizer PATH is required"), "no tokenizer: rc %d, err %s", rc, errout);
    char *missing[] = {"tokenize", "--tokenizer", "tests/data/no_such_dir/tokenizer.json", NULL};
    rc = run_cmd_tokenize(missing, 3, "", out, sizeof out, errout, sizeof errout);
    CHECK(rc == 1 && strstr(errout, "no_such_dir"), "missing file: rc %d, err %s", rc, errout);
    char *help[] = {"tokenize", "--help", NULL};
    rc = run_cmd_tokenize(help, 2, "", out, sizeof out, errout, sizeof errout);
    CHECK(rc == 0 && strstr(out, "usage: ds4f tokenize"), "help: rc %d", rc);
    char *bad_opt[] = {"tokenize", "--frobnicate", NULL};
    rc = run_cmd_tokenize(bad_opt, 2, "", out, sizeof out, errout, sizeof errout);
    CHECK(rc == 2 && strstr(errout, "--frobnicate"), "unknown option: rc %d, err %s", rc, errout);
}
