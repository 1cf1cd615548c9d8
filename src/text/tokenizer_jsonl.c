/* JSON lines for `ds4f tokenize`: see tokenizer_jsonl.h. */
#include "text/tokenizer_jsonl.h"

#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_internal.h"

size_t tokenizer_json_skip_space(const char *s, size_t len, size_t pos) {
    while (pos < len && (s[pos] == ' ' || s[pos] == '\t' || s[pos] == '\n' || s[pos] == '\r')) pos++;
    return pos;
}

static const char *describe(const char *s, size_t len, size_t pos, char *buf, size_t size) {
    if (pos >= len) return "the end of the line";
    unsigned char c = (unsigned char)s[pos];
    if (c >= 0x20 && c < 0x7F) snprintf(buf, size, "'%c'", c);
    else snprintf(buf, size, "byte 0x%02X", c);
    return buf;
}

int tokenizer_json_expect(const char *s, size_t len, size_t *pos, char c, ds4f_error *err) {
    *pos = tokenizer_json_skip_space(s, len, *pos);
    if (*pos < len && s[*pos] == c) { (*pos)++; return 0; }
    char buf[32];
    return error_set(err, "column %zu: expected '%c', found %s", *pos + 1, c, describe(s, len, *pos, buf, sizeof buf));
}

static int hex4(const char *s, size_t len, size_t pos, uint32_t *out) {
    if (pos + 4 > len) return -1;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[pos + i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static size_t utf8_encode(uint32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int tokenizer_json_parse_string(const char *s, size_t len, size_t *pos, char **out, size_t *out_len,
                                ds4f_error *err) {
    *out = NULL;
    *out_len = 0;
    size_t i = tokenizer_json_skip_space(s, len, *pos);
    char buf[32];
    if (i >= len || s[i] != '"')
        return error_set(err, "column %zu: expected a JSON string (\"...\"), found %s", i + 1,
                         describe(s, len, i, buf, sizeof buf));
    size_t open = i++;
    /* Escapes only shorten: the text up to the closing quote bounds the output. */
    char *o = malloc(len - i + 1);
    if (!o) return error_set(err, "out of memory");
    size_t n = 0;
    for (;;) {
        if (i >= len) { free(o); return error_set(err, "column %zu: string opened here is not closed", open + 1); }
        unsigned char c = (unsigned char)s[i];
        if (c == '"') break;
        if (c < 0x20) {
            free(o);
            return error_set(err, "column %zu: raw control character 0x%02X in a string (JSON requires \\u%04X)", i + 1,
                             c, c);
        }
        if (c >= 0x80) {
            size_t k = utf8_valid_char_len((const uint8_t *)s + i, len - i);
            if (!k) { free(o); return error_set(err, "column %zu: invalid UTF-8 (byte 0x%02X)", i + 1, c); }
            memcpy(o + n, s + i, k);
            n += k;
            i += k;
            continue;
        }
        if (c != '\\') { o[n++] = (char)c; i++; continue; }
        if (i + 1 >= len) { free(o); return error_set(err, "column %zu: unfinished escape", i + 1); }
        char e = s[i + 1];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            o[n++] = map[simple - "\"\\/bfnrt"];
            i += 2;
            continue;
        }
        if (e != 'u') {
            free(o);
            return error_set(err, "column %zu: invalid escape \\%c", i + 1, e >= 0x20 && e < 0x7F ? e : '?');
        }
        uint32_t cp;
        if (hex4(s, len, i + 2, &cp) != 0) {
            free(o);
            return error_set(err, "column %zu: \\u must be followed by 4 hex digits", i + 1);
        }
        size_t esc = i;
        i += 6;
        if (cp >= 0xDC00 && cp <= 0xDFFF) {
            free(o);
            return error_set(err, "column %zu: lone UTF-16 low surrogate \\u%04X (no UTF-8 form)", esc + 1, cp);
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t low;
            if (i + 1 < len && s[i] == '\\' && s[i + 1] == 'u' && hex4(s, len, i + 2, &low) == 0 && low >= 0xDC00 &&
                low <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                i += 6;
            } else {
                free(o);
                return error_set(err, "column %zu: lone UTF-16 high surrogate \\u%04X (no UTF-8 form)", esc + 1, cp);
            }
        }
        n += utf8_encode(cp, o + n);
    }
    o[n] = 0;
    *pos = i + 1;
    *out = o;
    *out_len = n;
    return 0;
}

int tokenizer_json_parse_ids(const char *s, size_t len, size_t *pos, int32_t **ids, size_t *n_ids,
                             ds4f_error *err) {
    *ids = NULL;
    *n_ids = 0;
    size_t i = *pos;
    if (tokenizer_json_expect(s, len, &i, '[', err) != 0) return error_prefix(err, "expected a JSON array of ids");
    int32_t *v = NULL;
    size_t n = 0, cap = 0;
    char buf[32];
    i = tokenizer_json_skip_space(s, len, i);
    if (i < len && s[i] == ']') { *pos = i + 1; return 0; }
    for (;;) {
        i = tokenizer_json_skip_space(s, len, i);
        size_t start = i;
        if (i >= len || s[i] < '0' || s[i] > '9') {
            free(v);
            return error_set(err, "column %zu: expected a non-negative integer id, found %s", i + 1,
                             describe(s, len, i, buf, sizeof buf));
        }
        uint64_t value = 0;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            value = value * 10 + (uint64_t)(s[i] - '0');
            if (value > INT32_MAX) { free(v); return error_set(err, "column %zu: id too large", start + 1); }
            i++;
        }
        if (s[start] == '0' && i - start > 1) {
            free(v);
            return error_set(err, "column %zu: JSON numbers have no leading zeros", start + 1);
        }
        if (i < len && (s[i] == '.' || s[i] == 'e' || s[i] == 'E')) {
            free(v);
            return error_set(err, "column %zu: ids are integers (no fraction or exponent)", start + 1);
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            int32_t *w = realloc(v, cap * sizeof *w);
            if (!w) { free(v); return error_set(err, "out of memory"); }
            v = w;
        }
        v[n++] = (int32_t)value;
        i = tokenizer_json_skip_space(s, len, i);
        if (i < len && s[i] == ',') { i++; continue; }
        if (i < len && s[i] == ']') { i++; break; }
        free(v);
        return error_set(err, "column %zu: expected ',' or ']' after an id, found %s", i + 1,
                         describe(s, len, i, buf, sizeof buf));
    }
    *pos = i;
    *ids = v;
    *n_ids = n;
    return 0;
}

int tokenizer_json_write_string(FILE *out, const char *bytes, size_t len) {
    const uint8_t *b = (const uint8_t *)bytes;
    fputc('"', out);
    for (size_t i = 0; i < len;) {
        uint8_t c = b[i];
        if (c >= 0x80) {
            size_t k = utf8_valid_char_len(b + i, len - i);
            if (k) { fwrite(b + i, 1, k, out); i += k; continue; }
            /* Maximal ill-formed subsequence: the longest prefix of a well-formed sequence
             * (at least one byte), replaced by one U+FFFD. */
            size_t need = c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xF0 && c < 0xF5 ? 4 : 1;
            size_t bad = 1;
            if (need > 1 && i + 1 < len) {
                uint8_t lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
                if (b[i + 1] >= lo && b[i + 1] <= hi) {
                    bad = 2;
                    while (bad < need && i + bad < len && (b[i + bad] & 0xC0) == 0x80) bad++;
                }
            }
            fputs("\xEF\xBF\xBD", out);
            i += bad;
            continue;
        }
        switch (c) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        case '\b': fputs("\\b", out); break;
        case '\f': fputs("\\f", out); break;
        default:
            if (c < 0x20) fprintf(out, "\\u%04X", c);
            else fputc(c, out);
        }
        i++;
    }
    fputc('"', out);
    return ferror(out) ? -1 : 0;
}

static int run_line(const tokenizer *tok, const char *line, size_t len, FILE *out, bool decode, unsigned flags,
                    ds4f_error *err) {
    size_t pos = tokenizer_json_skip_space(line, len, 0);
    if (pos == len)
        return error_set(err, "empty line (expected %s)", decode ? "a JSON array of ids such as [1, 2]"
                                                                 : "a JSON string such as \"text\"");
    int rc;
    if (decode) {
        int32_t *ids;
        size_t n;
        if (tokenizer_json_parse_ids(line, len, &pos, &ids, &n, err) != 0) return -1;
        char *text = NULL;
        size_t text_len = 0;
        rc = tokenizer_decode(tok, ids, n, &text, &text_len, err);
        free(ids);
        if (rc == 0) {
            pos = tokenizer_json_skip_space(line, len, pos);
            if (pos < len) rc = error_set(err, "column %zu: unexpected text after the array", pos + 1);
        }
        if (rc == 0) {
            rc = tokenizer_json_write_string(out, text, text_len);
            fputc('\n', out);
        }
        free(text);
    } else {
        char *text;
        size_t text_len;
        if (tokenizer_json_parse_string(line, len, &pos, &text, &text_len, err) != 0) return -1;
        pos = tokenizer_json_skip_space(line, len, pos);
        if (pos < len) { free(text); return error_set(err, "column %zu: unexpected text after the string", pos + 1); }
        int32_t *ids = NULL;
        size_t n = 0;
        rc = tokenizer_encode_flags(tok, text, text_len, flags, &ids, &n, err);
        free(text);
        if (rc == 0) {
            fputc('[', out);
            for (size_t i = 0; i < n; i++) fprintf(out, i ? ",%d" : "%d", ids[i]);
            fputs("]\n", out);
        }
        free(ids);
    }
    if (rc == 0 && ferror(out)) rc = error_set(err, "write error on the output");
    return rc;
}

int tokenizer_jsonl_run(const tokenizer *tok, FILE *in, FILE *out, bool decode, unsigned flags, ds4f_error *err) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    size_t line_no = 0;
    int rc = 0;
    while ((got = getline(&line, &cap, in)) >= 0) {
        line_no++;
        size_t len = (size_t)got;
        if (len && line[len - 1] == '\n') len--;
        if (run_line(tok, line, len, out, decode, flags, err) != 0) {
            /* "line 3, column 7: ..." reads better than "line 3: column 7: ...". */
            if (!strncmp(err->msg, "column ", 7)) {
                char msg[sizeof err->msg];
                memcpy(msg, err->msg, sizeof msg);
                error_set(err, "line %zu, %s", line_no, msg);
            } else {
                error_prefix(err, "line %zu", line_no);
            }
            rc = -1;
            break;
        }
        /* A coprocess writing a line and waiting for its answer must get it now. */
        fflush(out);
    }
    if (rc == 0 && ferror(in)) rc = error_set(err, "read error on the input after line %zu", line_no);
    free(line);
    return rc;
}
