/* The pre-tokenizer's Split regexes. HF tokenizers runs them with Oniguruma; we run them with
 * PCRE2 (UTF + UCP, JIT) after translating each pattern, and accept only constructs whose meaning
 * was checked to be the same in both engines for every code point (tests/fuzz/fuzz_tokenizer.c
 * compares the two engines directly when built with Oniguruma):
 *   - backtracking order, greedy/lazy/possessive repeats, lookaround, alternation: identical;
 *   - \p{..} general categories, \d, '.': identical for every code point when both engines use the
 *     same Unicode version (PCRE2 10.42 and Oniguruma 6.9.8 are both on Unicode 14.0). Characters
 *     assigned in a later Unicode version than the system PCRE2 knows are unassigned (Cn) here, and
 *     split differently from an HF build whose Oniguruma knows them (the HF vectors contain none);
 *   - \s: Oniguruma's is the Unicode White_Space property; PCRE2's UCP \s also matches U+180E
 *     MONGOLIAN VOWEL SEPARATOR (a space before Unicode 6.3), so \s and \S are spelled out as the
 *     White_Space set;
 *   - Oniguruma's {,n} is written {0,n} (PCRE2 10.42 would read it as text), \uHHHH as \x{HHHH};
 *   - refused: \w \b \h \R \X, backreferences, ^ $ (line anchors in Oniguruma, not in PCRE2),
 *     inline options, nested classes and && (Oniguruma set operations), {n,m}+ (possessive in
 *     PCRE2, a repeated repeat in Oniguruma), and any escape not listed. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_internal.h"

/* Unicode White_Space (stable since Unicode 6.3), written for use inside a PCRE2 class. */
static const char WHITE_SPACE_CLASS_BODY[] =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
    "\\x{3000}";

static const char *const GENERAL_CATEGORIES[] = {
    "L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No",
    "P", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So",
    "Z", "Zs", "Zl", "Zp", "C", "Cc", "Cf", "Co", "Cn",
};

typedef struct out_buf {
    char *p;
    size_t len, cap;
    bool oom;
} out_buf;

static void put(out_buf *o, const char *s, size_t n) {
    if (o->oom) return;
    if (o->len + n + 1 > o->cap) {
        size_t cap = (o->len + n + 1) * 2;
        char *p = realloc(o->p, cap);
        if (!p) { o->oom = true; return; }
        o->p = p;
        o->cap = cap;
    }
    memcpy(o->p + o->len, s, n);
    o->len += n;
    o->p[o->len] = 0;
}

static void puts_(out_buf *o, const char *s) { put(o, s, strlen(s)); }

static bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

typedef struct scanner {
    const char *s;
    size_t len, i;
    ds4f_error *err;
} scanner;

static int refuse(scanner *sc, size_t at, const char *what) {
    return error_set(sc->err,
                     "regex \"%.*s\": %s at offset %zu is not supported (its meaning differs between Oniguruma, which "
                     "HF tokenizers uses, and PCRE2, or is unverified)",
                     (int)(sc->len > 200 ? 200 : sc->len), sc->s, what, at);
}

/* Translates the escape starting at sc->s[sc->i] == '\\'. in_class: inside [...]. */
static int translate_escape(scanner *sc, out_buf *o, bool in_class) {
    size_t at = sc->i;
    if (sc->i + 1 >= sc->len) return refuse(sc, at, "a trailing backslash");
    char c = sc->s[sc->i + 1];
    sc->i += 2;
    switch (c) {
    case 's':
        if (in_class) puts_(o, WHITE_SPACE_CLASS_BODY);
        else { puts_(o, "["); puts_(o, WHITE_SPACE_CLASS_BODY); puts_(o, "]"); }
        return 0;
    case 'S':
        if (in_class) return refuse(sc, at, "\\S inside a character class");
        puts_(o, "[^");
        puts_(o, WHITE_SPACE_CLASS_BODY);
        puts_(o, "]");
        return 0;
    case 'd': case 'D': case 'r': case 'n': case 't': case 'f': case 'a': case 'e':
        put(o, sc->s + at, 2);
        return 0;
    case 'v': /* Oniguruma: the VT character; PCRE2: any vertical space */
        puts_(o, "\\x{0B}");
        return 0;
    case 'A': case 'z': case 'Z':
        if (in_class) return refuse(sc, at, "an anchor escape inside a class");
        put(o, sc->s + at, 2);
        return 0;
    case 'p': case 'P': {
        bool negate = c == 'P';
        if (sc->i >= sc->len || sc->s[sc->i] != '{') return refuse(sc, at, "a \\p without {name}");
        size_t name = sc->i + 1;
        if (name < sc->len && sc->s[name] == '^') { negate = !negate; name++; }
        size_t end = name;
        while (end < sc->len && sc->s[end] != '}') end++;
        if (end >= sc->len) return refuse(sc, at, "an unterminated \\p{");
        for (size_t k = 0; k < sizeof GENERAL_CATEGORIES / sizeof *GENERAL_CATEGORIES; k++) {
            if (strlen(GENERAL_CATEGORIES[k]) == end - name && !memcmp(GENERAL_CATEGORIES[k], sc->s + name, end - name)) {
                puts_(o, negate ? "\\P{" : "\\p{");
                puts_(o, GENERAL_CATEGORIES[k]);
                puts_(o, "}");
                sc->i = end + 1;
                return 0;
            }
        }
        return refuse(sc, at, "a \\p{..} property other than a general category (L, Lu, N, P, S, M, Z, ...)");
    }
    case 'x': {
        if (sc->i < sc->len && sc->s[sc->i] == '{') {
            size_t end = sc->i + 1;
            while (end < sc->len && is_hex(sc->s[end])) end++;
            if (end >= sc->len || sc->s[end] != '}' || end == sc->i + 1 || end - sc->i - 1 > 6)
                return refuse(sc, at, "a malformed \\x{...}");
            put(o, sc->s + at, end + 1 - at);
            sc->i = end + 1;
            return 0;
        }
        size_t end = sc->i;
        while (end < sc->len && end < sc->i + 2 && is_hex(sc->s[end])) end++;
        if (end == sc->i) return refuse(sc, at, "\\x without hex digits");
        puts_(o, "\\x{");
        put(o, sc->s + sc->i, end - sc->i);
        puts_(o, "}");
        sc->i = end;
        return 0;
    }
    case 'u': {
        if (sc->i + 4 > sc->len) return refuse(sc, at, "a malformed \\uHHHH");
        for (int k = 0; k < 4; k++)
            if (!is_hex(sc->s[sc->i + k])) return refuse(sc, at, "a malformed \\uHHHH");
        puts_(o, "\\x{");
        put(o, sc->s + sc->i, 4);
        puts_(o, "}");
        sc->i += 4;
        return 0;
    }
    default:
        /* Escaped ASCII punctuation is the literal character in both engines. */
        if ((unsigned char)c < 0x80 && c > 0x20 && !(c >= '0' && c <= '9') && !(c >= 'a' && c <= 'z') &&
            !(c >= 'A' && c <= 'Z')) {
            put(o, sc->s + at, 2);
            return 0;
        }
        return refuse(sc, at, "this escape");
    }
}

static int translate_class(scanner *sc, out_buf *o) {
    size_t open = sc->i;
    puts_(o, "[");
    sc->i++;
    if (sc->i < sc->len && sc->s[sc->i] == '^') { puts_(o, "^"); sc->i++; }
    if (sc->i < sc->len && sc->s[sc->i] == ']') return refuse(sc, sc->i, "']' first in a class");
    while (sc->i < sc->len) {
        char c = sc->s[sc->i];
        if (c == ']') { puts_(o, "]"); sc->i++; return 0; }
        if (c == '\\') {
            if (translate_escape(sc, o, true) != 0) return -1;
            continue;
        }
        if (c == '[') return refuse(sc, sc->i, "'[' inside a class (a nested class in Oniguruma)");
        if (c == '&' && sc->i + 1 < sc->len && sc->s[sc->i + 1] == '&')
            return refuse(sc, sc->i, "'&&' (class intersection in Oniguruma)");
        put(o, &sc->s[sc->i], 1);
        sc->i++;
    }
    return refuse(sc, open, "an unterminated '['");
}

/* {n}, {n,}, {n,m}; Oniguruma's {,m} means {0,m}, which PCRE2 10.42 would read as text. */
static int translate_interval(scanner *sc, out_buf *o) {
    size_t at = sc->i, k = sc->i + 1;
    size_t lo_digits = 0, hi_digits = 0;
    bool comma = false;
    while (k < sc->len && sc->s[k] >= '0' && sc->s[k] <= '9') { k++; lo_digits++; }
    if (k < sc->len && sc->s[k] == ',') {
        comma = true;
        k++;
        while (k < sc->len && sc->s[k] >= '0' && sc->s[k] <= '9') { k++; hi_digits++; }
    }
    if (k >= sc->len || sc->s[k] != '}' || (lo_digits == 0 && hi_digits == 0) || lo_digits > 5 || hi_digits > 5)
        return refuse(sc, at, "a '{' that is not a {n,m} repeat");
    puts_(o, "{");
    if (lo_digits == 0) puts_(o, "0");
    else put(o, sc->s + at + 1, lo_digits);
    if (comma) { puts_(o, ","); put(o, sc->s + at + 2 + lo_digits, hi_digits); }
    puts_(o, "}");
    sc->i = k + 1;
    if (sc->i < sc->len && sc->s[sc->i] == '+')
        return refuse(sc, sc->i, "'+' after {n,m} (possessive in PCRE2, a second repeat in Oniguruma)");
    return 0;
}

int tokenizer_regex_translate(const char *onig, size_t onig_len, char **pcre2_out, ds4f_error *err) {
    scanner sc = {.s = onig, .len = onig_len, .i = 0, .err = err};
    out_buf o = {0};
    *pcre2_out = NULL;
    puts_(&o, "");
    while (sc.i < sc.len) {
        char c = onig[sc.i];
        int rc = 0;
        if (c == '\\') rc = translate_escape(&sc, &o, false);
        else if (c == '[') rc = translate_class(&sc, &o);
        else if (c == '{') rc = translate_interval(&sc, &o);
        else if (c == '^' || c == '$') rc = refuse(&sc, sc.i, "'^' or '$' (line anchors in Oniguruma)");
        else if (c == '(') {
            static const char *const groups[] = {"(?:", "(?=", "(?!", "(?<=", "(?<!", "(?>"};
            size_t taken = 1;
            if (sc.i + 1 < sc.len && onig[sc.i + 1] == '?') {
                taken = 0;
                for (size_t k = 0; k < sizeof groups / sizeof *groups; k++) {
                    size_t n = strlen(groups[k]);
                    if (sc.i + n <= sc.len && !memcmp(onig + sc.i, groups[k], n)) { taken = n; break; }
                }
                if (!taken) rc = refuse(&sc, sc.i, "this '(?' group (options or named groups)");
            }
            if (taken) { put(&o, onig + sc.i, taken); sc.i += taken; }
        } else {
            put(&o, &onig[sc.i], 1);
            sc.i++;
        }
        if (rc != 0) { free(o.p); return -1; }
    }
    if (o.oom) { free(o.p); return error_set(err, "regex translation: out of memory"); }
    *pcre2_out = o.p;
    return 0;
}

int tokenizer_regex_compile(regex_split *split, const char *onig, size_t onig_len, ds4f_error *err) {
    memset(split, 0, sizeof *split);
    if (tokenizer_regex_translate(onig, onig_len, &split->pcre2_pattern, err) != 0) return -1;
    split->onig_pattern = malloc(onig_len + 1);
    if (!split->onig_pattern) { tokenizer_regex_free(split); return error_set(err, "out of memory"); }
    memcpy(split->onig_pattern, onig, onig_len);
    split->onig_pattern[onig_len] = 0;
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) { tokenizer_regex_free(split); return error_set(err, "out of memory"); }
    /* '.' excludes only LF, as in Oniguruma, whatever newline PCRE2 was built with. */
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    int code;
    PCRE2_SIZE offset;
    split->code = pcre2_compile((PCRE2_SPTR)split->pcre2_pattern, PCRE2_ZERO_TERMINATED,
                                PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C, &code, &offset, cc);
    pcre2_compile_context_free(cc);
    if (!split->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        error_set(err, "regex \"%s\" (as PCRE2 \"%s\") does not compile: %s at offset %zu", split->onig_pattern,
                  split->pcre2_pattern, (const char *)msg, (size_t)offset);
        tokenizer_regex_free(split);
        return -1;
    }
    /* Without JIT (some platforms forbid it) pcre2_match interprets: same results, slower. */
    split->jit = pcre2_jit_compile(split->code, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

void tokenizer_regex_free(regex_split *split) {
    pcre2_code_free(split->code);
    free(split->onig_pattern);
    free(split->pcre2_pattern);
    memset(split, 0, sizeof *split);
}

/* ---- pre-tokenization ---- */

typedef struct pretok {
    const tokenizer *tok;
    pcre2_match_data *match;
    tokenizer_piece_fn piece;
    void *ctx;
    ds4f_error *err;
} pretok;

/* One Split(Regex, Isolated) step over text[0..len), then the next step over each resulting
 * piece: matches and the gaps between them are pieces, empty ones are dropped. The search loop
 * follows the onig crate's find_iter, including its rule for empty matches (an empty match right
 * where the previous match ended is skipped by advancing one character), although the DeepSeek
 * patterns cannot match empty. */
static int split_step(pretok *P, int step, const uint8_t *text, size_t len) {
    if (step == P->tok->n_splits) return P->piece(P->ctx, text, len, P->err);
    pcre2_code *code = P->tok->splits[step].code;
    bool jit = P->tok->splits[step].jit;
    size_t gap_start = 0, search_from = 0, last_match_end = SIZE_MAX;
    while (search_from <= len) {
        /* The text is known to be valid UTF-8 (the caller splits off ill-formed bytes). */
        int rc = jit ? pcre2_jit_match(code, text, len, search_from, 0, P->match, NULL)
                     : pcre2_match(code, text, len, search_from, PCRE2_NO_UTF_CHECK, P->match, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return error_set(P->err, "pre-tokenizer regex \"%s\" failed on a %zu-byte piece: %s",
                             P->tok->splits[step].onig_pattern, len, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(P->match);
        size_t start = ov[0], end = ov[1];
        if (start == end && end == last_match_end) {
            if (search_from >= len) break;
            search_from += utf8_valid_char_len(text + search_from, len - search_from);
            continue;
        }
        if (start > gap_start && split_step(P, step + 1, text + gap_start, start - gap_start) != 0) return -1;
        if (end > start && split_step(P, step + 1, text + start, end - start) != 0) return -1;
        gap_start = end;
        search_from = end;
        last_match_end = end;
    }
    if (gap_start < len && split_step(P, step + 1, text + gap_start, len - gap_start) != 0) return -1;
    return 0;
}

int tokenizer_pretokenize_with(const tokenizer *tok, pcre2_match_data **match, const uint8_t *text, size_t len,
                               tokenizer_piece_fn piece, void *ctx, ds4f_error *err) {
    if (len == 0) return 0;
    /* One pair is enough: only the whole match is used, and pcre2_match still reports a match
     * (rc 0) when capture groups do not fit. */
    if (!*match && !(*match = pcre2_match_data_create(1, NULL))) return error_set(err, "pre-tokenizer: out of memory");
    pretok P = {.tok = tok, .match = *match, .piece = piece, .ctx = ctx, .err = err};
    return split_step(&P, 0, text, len);
}

int tokenizer_pretokenize(const tokenizer *tok, const uint8_t *text, size_t len, tokenizer_piece_fn piece,
                          void *ctx, ds4f_error *err) {
    pcre2_match_data *match = NULL;
    int rc = tokenizer_pretokenize_with(tok, &match, text, len, piece, ctx, err);
    pcre2_match_data_free(match);
    return rc;
}

void tokenizer_match_data_free(pcre2_match_data *match) { pcre2_match_data_free(match); }
