#include "text/dsml.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================================================
 * Buffer
 * ============================================================================================== */

static bool buf_reserve(dsml_buf *b, size_t extra) {
    if (b->oom) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    if (extra > SIZE_MAX / 2 - b->len) { b->oom = true; return false; }
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) { b->oom = true; return false; }
    b->data = p;
    b->cap = cap;
    return true;
}

void dsml_buf_put(dsml_buf *b, const void *bytes, size_t n) {
    if (!buf_reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, bytes, n);
    b->len += n;
    b->data[b->len] = 0;
}

void dsml_buf_puts(dsml_buf *b, const char *s) { dsml_buf_put(b, s, strlen(s)); }

static void buf_putc(dsml_buf *b, char c) { dsml_buf_put(b, &c, 1); }

void dsml_buf_free(dsml_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

char *dsml_buf_take(dsml_buf *b, size_t *len) {
    if (!b->data && buf_reserve(b, 0)) b->data[0] = 0;
    if (b->oom) { dsml_buf_free(b); return NULL; }
    char *p = b->data;
    if (len) *len = b->len;
    memset(b, 0, sizeof *b);
    return p;
}

static char *dup_bytes(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* ================================================================================================
 * UTF-8
 * ============================================================================================== */

/* Decodes one well-formed UTF-8 character (no overlongs, no surrogates, <= U+10FFFF); returns
 * its length, or 0 if the bytes at s are not one. */
static size_t utf8_decode(const unsigned char *s, size_t avail, uint32_t *cp) {
    if (!avail) return 0;
    unsigned c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    size_t n;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) { n = 2; v = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { n = 3; v = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { n = 4; v = c & 0x07; min = 0x10000; }
    else return 0;
    if (avail < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return n;
}

bool utf8_valid(const char *s, size_t len) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    uint32_t cp;
    while (i < len) {
        if (p[i] < 0x80) { i++; continue; }
        size_t n = utf8_decode(p + i, len - i, &cp);
        if (!n) return false;
        i += n;
    }
    return true;
}

int utf8_clip(const char *s, size_t len, size_t max) {
    if (len <= max) return (int)len;
    size_t n = max;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    return (int)n;
}

static void put_utf8(dsml_buf *b, uint32_t cp) {
    char t[4];
    size_t n;
    if (cp < 0x80) { t[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { t[0] = (char)(0xC0 | (cp >> 6)); t[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12)); t[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[2] = (char)(0x80 | (cp & 0x3F)); n = 3;
    } else {
        t[0] = (char)(0xF0 | (cp >> 18)); t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); t[3] = (char)(0x80 | (cp & 0x3F)); n = 4;
    }
    dsml_buf_put(b, t, n);
}

/* Python's str.isspace(), which is what \s matches in the official parser's regular
 * expressions (str patterns are Unicode-aware). */
static bool unicode_is_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ================================================================================================
 * Python-compatible JSON output
 * ============================================================================================== */

void pyjson_put_string(dsml_buf *out, const char *s, size_t len) {
    static const char hex[] = "0123456789abcdef";
    buf_putc(out, '"');
    size_t run = 0; /* bytes copied verbatim in one go */
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[7];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                memcpy(u, "\\u00", 4);
                u[4] = hex[c >> 4];
                u[5] = hex[c & 15];
                u[6] = 0;
                esc = u;
            }
        }
        if (!esc) { run++; continue; }
        dsml_buf_put(out, s + i - run, run);
        run = 0;
        dsml_buf_puts(out, esc);
    }
    dsml_buf_put(out, s + len - run, run);
    buf_putc(out, '"');
}

/* Shortest decimal digits that read back as v (Python's repr, via David Gay's algorithm there):
 * try 1..17 significant digits, correctly rounded by printf. Only when v is a power of two is
 * the interval of decimals that round to v lopsided (half as wide below), so that the nearest
 * p-digit decimal can miss it while the next one up hits it; that neighbour is tried too. */
static void shortest_digits(double v, char *digits, int *ndigits, int *exp10) {
    char s[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(s, sizeof s, "%.*e", p - 1, v);
        char *e = strchr(s, 'e');
        int n = 0;
        for (char *q = s; q < e; q++)
            if (*q >= '0' && *q <= '9') digits[n++] = *q;
        digits[n] = 0;
        int ex = atoi(e + 1);
        if (strtod(s, NULL) == v) { *ndigits = n; *exp10 = ex; return; }
        int mexp;
        if (frexp(v, &mexp) == 0.5 && strtod(s, NULL) < v) {
            char up[24];
            memcpy(up, digits, (size_t)n + 1);
            int k = n - 1, upexp = ex;
            while (k >= 0 && up[k] == '9') up[k--] = '0';
            if (k >= 0) up[k]++;
            else { memmove(up + 1, up, (size_t)n); up[0] = '1'; up[n] = 0; upexp++; }
            char t[48];
            snprintf(t, sizeof t, "%c.%se%d", up[0], up + 1, upexp);
            if (strtod(t, NULL) == v) {
                memcpy(digits, up, (size_t)n + 1);
                *ndigits = n;
                *exp10 = upexp;
                return;
            }
        }
    }
    /* 17 digits always round-trip; not reached. */
    *ndigits = 17;
    *exp10 = 0;
}

void pyjson_put_double(dsml_buf *out, double v) {
    if (isnan(v)) { dsml_buf_puts(out, "NaN"); return; }
    if (isinf(v)) { dsml_buf_puts(out, v < 0 ? "-Infinity" : "Infinity"); return; }
    if (signbit(v)) { buf_putc(out, '-'); v = -v; }
    if (v == 0) { dsml_buf_puts(out, "0.0"); return; }
    char d[24];
    int n, e;
    shortest_digits(v, d, &n, &e);
    /* Python's float_repr_style 'short': exponent form when the decimal point would sit more
     * than 16 places right of the first digit or 4 or more places left of it. */
    int decpt = e + 1;
    if (decpt > 16 || decpt <= -4) {
        buf_putc(out, d[0]);
        if (n > 1) { buf_putc(out, '.'); dsml_buf_put(out, d + 1, (size_t)n - 1); }
        char t[16];
        snprintf(t, sizeof t, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
        dsml_buf_puts(out, t);
    } else if (decpt <= 0) {
        dsml_buf_puts(out, "0.");
        for (int i = 0; i < -decpt; i++) buf_putc(out, '0');
        dsml_buf_put(out, d, (size_t)n);
    } else if (decpt >= n) {
        dsml_buf_put(out, d, (size_t)n);
        for (int i = n; i < decpt; i++) buf_putc(out, '0');
        dsml_buf_puts(out, ".0");
    } else {
        dsml_buf_put(out, d, (size_t)decpt);
        buf_putc(out, '.');
        dsml_buf_put(out, d + decpt, (size_t)(n - decpt));
    }
}

/* One member of an object being printed: the key's bytes and the value already printed. */
typedef struct {
    char *key;
    size_t key_len;
    char *value;       /* printed JSON */
    size_t value_len;
    char *str;         /* the decoded string when the value is a JSON string, else NULL */
    size_t str_len;
    size_t order;      /* position among the members as written */
} pj_member;

typedef struct {
    pj_member *items;
    size_t n, cap;
} pj_members;

static void members_free(pj_members *m) {
    for (size_t i = 0; i < m->n; i++) {
        free(m->items[i].key);
        free(m->items[i].value);
        free(m->items[i].str);
    }
    free(m->items);
    memset(m, 0, sizeof *m);
}

static bool members_push(pj_members *m, pj_member it) {
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 8;
        pj_member *p = realloc(m->items, cap * sizeof *p);
        if (!p) return false;
        m->items = p;
        m->cap = cap;
    }
    it.order = m->n;
    m->items[m->n++] = it;
    return true;
}

static int member_cmp_key(const void *a, const void *b) {
    const pj_member *x = a, *y = b;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, n);
    if (c) return c;
    if (x->key_len != y->key_len) return x->key_len < y->key_len ? -1 : 1;
    return x->order < y->order ? -1 : (x->order > y->order);
}

static int member_cmp_order(const void *a, const void *b) {
    const pj_member *x = a, *y = b;
    return x->order < y->order ? -1 : (x->order > y->order);
}

/* A Python dict built from repeated keys keeps the first key's position and the last value. */
static void members_collapse_duplicates(pj_members *m) {
    if (m->n < 2) return;
    qsort(m->items, m->n, sizeof *m->items, member_cmp_key);
    size_t w = 0;
    for (size_t i = 0; i < m->n;) {
        size_t j = i + 1;
        while (j < m->n && m->items[j].key_len == m->items[i].key_len &&
               memcmp(m->items[j].key, m->items[i].key, m->items[i].key_len) == 0)
            j++;
        pj_member keep = m->items[i];
        if (j - i > 1) {
            pj_member *last = &m->items[j - 1];
            free(keep.value);
            free(keep.str);
            keep.value = last->value;
            keep.value_len = last->value_len;
            keep.str = last->str;
            keep.str_len = last->str_len;
            free(last->key);
            for (size_t k = i + 1; k + 1 < j; k++) {
                free(m->items[k].key);
                free(m->items[k].value);
                free(m->items[k].str);
            }
        }
        m->items[w++] = keep;
        i = j;
    }
    m->n = w;
    qsort(m->items, m->n, sizeof *m->items, member_cmp_order);
}

static void members_print(const pj_members *m, dsml_buf *out) {
    buf_putc(out, '{');
    for (size_t i = 0; i < m->n; i++) {
        if (i) dsml_buf_puts(out, ", ");
        pyjson_put_string(out, m->items[i].key, m->items[i].key_len);
        dsml_buf_puts(out, ": ");
        dsml_buf_put(out, m->items[i].value, m->items[i].value_len);
    }
    buf_putc(out, '}');
}

/* ---- reading JSON text as Python's json module does --------------------------------------- */

/* Python gives up on deeper nesting with a RecursionError near its recursion limit (1000). */
#define PJ_MAX_DEPTH 900
/* Python >= 3.11 refuses to convert integers longer than this (sys.int_info.default_max_str_digits). */
#define PJ_MAX_INT_DIGITS 4300

typedef struct {
    const char *s;
    size_t len, pos;
    int depth;
    ds4f_error *err;
    bool oom;
    bool lone_surrogate; /* Python reads one without complaint; it only fails to encode it later */
} pj_reader;

static int pj_fail(pj_reader *r, const char *what) {
    return error_set(r->err, "not JSON: %s at byte %zu", what, r->pos);
}

static void pj_ws(pj_reader *r) {
    while (r->pos < r->len) {
        char c = r->s[r->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        r->pos++;
    }
}

static bool pj_lit(pj_reader *r, const char *lit) {
    size_t n = strlen(lit);
    if (r->len - r->pos < n || memcmp(r->s + r->pos, lit, n) != 0) return false;
    r->pos += n;
    return true;
}

static int pj_hex4(pj_reader *r, uint32_t *v) {
    if (r->len - r->pos < 4) return pj_fail(r, "truncated \\u escape");
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        char c = r->s[r->pos + (size_t)i];
        x <<= 4;
        if (c >= '0' && c <= '9') x |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') x |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') x |= (uint32_t)(c - 'A' + 10);
        else return pj_fail(r, "invalid \\u escape");
    }
    r->pos += 4;
    *v = x;
    return 0;
}

/* Reads a string literal (r->pos at the opening quote) into its decoded bytes. */
static int pj_string(pj_reader *r, dsml_buf *out) {
    r->pos++;
    for (;;) {
        size_t start = r->pos;
        while (r->pos < r->len) {
            unsigned char c = (unsigned char)r->s[r->pos];
            if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
            r->pos++;
        }
        dsml_buf_put(out, r->s + start, r->pos - start);
        if (r->pos >= r->len) return pj_fail(r, "unterminated string");
        unsigned char c = (unsigned char)r->s[r->pos];
        if (c == '"') { r->pos++; return 0; }
        if (c < 0x20) return pj_fail(r, "control character in string");
        if (c >= 0x80) {
            uint32_t cp;
            size_t n = utf8_decode((const unsigned char *)r->s + r->pos, r->len - r->pos, &cp);
            if (!n) return pj_fail(r, "invalid UTF-8");
            dsml_buf_put(out, r->s + r->pos, n);
            r->pos += n;
            continue;
        }
        r->pos++; /* backslash */
        if (r->pos >= r->len) return pj_fail(r, "unterminated string");
        char e = r->s[r->pos++];
        switch (e) {
        case '"': buf_putc(out, '"'); break;
        case '\\': buf_putc(out, '\\'); break;
        case '/': buf_putc(out, '/'); break;
        case 'b': buf_putc(out, '\b'); break;
        case 'f': buf_putc(out, '\f'); break;
        case 'n': buf_putc(out, '\n'); break;
        case 'r': buf_putc(out, '\r'); break;
        case 't': buf_putc(out, '\t'); break;
        case 'u': {
            uint32_t cp;
            if (pj_hex4(r, &cp)) return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF && r->len - r->pos >= 6 && r->s[r->pos] == '\\' &&
                r->s[r->pos + 1] == 'u') {
                size_t save = r->pos;
                r->pos += 2;
                uint32_t lo;
                if (pj_hex4(r, &lo)) return -1;
                if (lo >= 0xDC00 && lo <= 0xDFFF) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else r->pos = save;
            }
            if (cp >= 0xD800 && cp <= 0xDFFF) {
                r->lone_surrogate = true;
                cp = 0xFFFD;
            }
            put_utf8(out, cp);
            break;
        }
        default:
            r->pos--;
            return pj_fail(r, "invalid escape");
        }
    }
}

static int pj_number(pj_reader *r, dsml_buf *out) {
    size_t start = r->pos;
    bool is_float = false;
    if (r->s[r->pos] == '-') r->pos++;
    if (r->pos >= r->len) return pj_fail(r, "expected a value");
    char c = r->s[r->pos];
    if (c == '0') r->pos++;
    else if (c >= '1' && c <= '9') {
        while (r->pos < r->len && r->s[r->pos] >= '0' && r->s[r->pos] <= '9') r->pos++;
    } else return pj_fail(r, "expected a value");
    if (r->pos + 1 < r->len && r->s[r->pos] == '.' && r->s[r->pos + 1] >= '0' && r->s[r->pos + 1] <= '9') {
        is_float = true;
        r->pos++;
        while (r->pos < r->len && r->s[r->pos] >= '0' && r->s[r->pos] <= '9') r->pos++;
    }
    if (r->pos < r->len && (r->s[r->pos] == 'e' || r->s[r->pos] == 'E')) {
        size_t e = r->pos++;
        if (r->pos < r->len && (r->s[r->pos] == '+' || r->s[r->pos] == '-')) r->pos++;
        size_t d = r->pos;
        while (r->pos < r->len && r->s[r->pos] >= '0' && r->s[r->pos] <= '9') r->pos++;
        if (r->pos > d) is_float = true;
        else r->pos = e; /* "1e" is the number 1 followed by junk, as in Python */
    }
    size_t n = r->pos - start;
    if (!is_float) {
        bool neg = r->s[start] == '-';
        if (n - neg > PJ_MAX_INT_DIGITS) return pj_fail(r, "integer too long for Python's int()");
        /* Python's int() drops the sign of zero. */
        if (neg && n == 2 && r->s[start + 1] == '0') dsml_buf_puts(out, "0");
        else dsml_buf_put(out, r->s + start, n);
        return 0;
    }
    char small[64];
    char *tmp = n < sizeof small ? small : malloc(n + 1);
    if (!tmp) { r->oom = true; return error_set(r->err, "out of memory"); }
    memcpy(tmp, r->s + start, n);
    tmp[n] = 0;
    double v = strtod(tmp, NULL);
    if (tmp != small) free(tmp);
    pyjson_put_double(out, v);
    return 0;
}

static int pj_value(pj_reader *r, dsml_buf *out, dsml_buf *str_out);

static int pj_object(pj_reader *r, pj_members *m) {
    r->pos++;
    pj_ws(r);
    if (r->pos < r->len && r->s[r->pos] == '}') { r->pos++; return 0; }
    for (;;) {
        if (r->pos >= r->len || r->s[r->pos] != '"') return pj_fail(r, "expected a property name in double quotes");
        dsml_buf key = {0}, value = {0}, str = {0};
        bool is_str = false;
        if (pj_string(r, &key)) goto fail;
        pj_ws(r);
        if (r->pos >= r->len || r->s[r->pos] != ':') { pj_fail(r, "expected ':'"); goto fail; }
        r->pos++;
        pj_ws(r);
        is_str = r->pos < r->len && r->s[r->pos] == '"';
        if (pj_value(r, &value, is_str ? &str : NULL)) goto fail;
        if (key.oom || value.oom || str.oom) { r->oom = true; error_set(r->err, "out of memory"); goto fail; }
        pj_member it = {0};
        it.key = dsml_buf_take(&key, &it.key_len);
        it.value = dsml_buf_take(&value, &it.value_len);
        if (is_str) it.str = dsml_buf_take(&str, &it.str_len);
        if (!it.key || !it.value || (is_str && !it.str) || !members_push(m, it)) {
            free(it.key); free(it.value); free(it.str);
            r->oom = true;
            return error_set(r->err, "out of memory");
        }
        pj_ws(r);
        if (r->pos < r->len && r->s[r->pos] == '}') { r->pos++; break; }
        if (r->pos >= r->len || r->s[r->pos] != ',') return pj_fail(r, "expected ',' or '}'");
        r->pos++;
        pj_ws(r);
        continue;
    fail:
        dsml_buf_free(&key);
        dsml_buf_free(&value);
        dsml_buf_free(&str);
        return -1;
    }
    members_collapse_duplicates(m);
    return 0;
}

/* Reads one value and prints it Python-style to out; when str_out is given and the value is a
 * string, also stores its decoded bytes there. */
static int pj_value(pj_reader *r, dsml_buf *out, dsml_buf *str_out) {
    if (r->pos >= r->len) return pj_fail(r, "expected a value");
    char c = r->s[r->pos];
    if (c == '"') {
        dsml_buf tmp = {0};
        dsml_buf *s = str_out ? str_out : &tmp;
        int rc = pj_string(r, s);
        if (rc == 0) pyjson_put_string(out, s->data ? s->data : "", s->len);
        if (s->oom) r->oom = true;
        dsml_buf_free(&tmp);
        return rc;
    }
    if (c == '{' || c == '[') {
        if (++r->depth > PJ_MAX_DEPTH) return pj_fail(r, "nested too deeply");
        int rc = 0;
        if (c == '{') {
            pj_members m = {0};
            rc = pj_object(r, &m);
            if (rc == 0) members_print(&m, out);
            members_free(&m);
        } else {
            r->pos++;
            pj_ws(r);
            buf_putc(out, '[');
            if (r->pos < r->len && r->s[r->pos] == ']') r->pos++;
            else {
                for (bool first = true;; first = false) {
                    if (!first) dsml_buf_puts(out, ", ");
                    if ((rc = pj_value(r, out, NULL))) break;
                    pj_ws(r);
                    if (r->pos < r->len && r->s[r->pos] == ']') { r->pos++; break; }
                    if (r->pos >= r->len || r->s[r->pos] != ',') { rc = pj_fail(r, "expected ',' or ']'"); break; }
                    r->pos++;
                    pj_ws(r);
                }
            }
            buf_putc(out, ']');
        }
        r->depth--;
        return rc;
    }
    if (pj_lit(r, "null")) { dsml_buf_puts(out, "null"); return 0; }
    if (pj_lit(r, "true")) { dsml_buf_puts(out, "true"); return 0; }
    if (pj_lit(r, "false")) { dsml_buf_puts(out, "false"); return 0; }
    if (pj_lit(r, "NaN")) { dsml_buf_puts(out, "NaN"); return 0; }
    if (pj_lit(r, "Infinity")) { dsml_buf_puts(out, "Infinity"); return 0; }
    if (pj_lit(r, "-Infinity")) { dsml_buf_puts(out, "-Infinity"); return 0; }
    if (c == '-' || (c >= '0' && c <= '9')) return pj_number(r, out);
    return pj_fail(r, "expected a value");
}

static int pj_finish(pj_reader *r) {
    pj_ws(r);
    if (r->pos != r->len) return pj_fail(r, "extra data after the value");
    return 0;
}

int pyjson_canonical(const char *text, size_t len, dsml_buf *out, ds4f_error *err) {
    pj_reader r = {.s = text, .len = len, .err = err};
    pj_ws(&r);
    if (pj_value(&r, out, NULL) || pj_finish(&r)) return -1;
    if (r.lone_surrogate) return error_set(err, "JSON text has a lone UTF-16 surrogate escape, which has no UTF-8 form");
    if (out->oom) return error_set(err, "out of memory");
    return 0;
}

/* ---- printing a cJSON tree --------------------------------------------------------------- */

static int dump_cjson(const cJSON *it, dsml_buf *out, int depth, ds4f_error *err) {
    if (depth > PJ_MAX_DEPTH) return error_set(err, "JSON nested too deeply");
    if (cJSON_IsNull(it)) { dsml_buf_puts(out, "null"); return 0; }
    if (cJSON_IsTrue(it)) { dsml_buf_puts(out, "true"); return 0; }
    if (cJSON_IsFalse(it)) { dsml_buf_puts(out, "false"); return 0; }
    if (cJSON_IsNumber(it)) {
        double v = it->valuedouble;
        if (isfinite(v) && v == floor(v) && fabs(v) <= 9007199254740992.0) {
            char t[32];
            snprintf(t, sizeof t, "%.0f", v == 0 ? 0.0 : v);
            dsml_buf_puts(out, t);
        } else {
            pyjson_put_double(out, v);
        }
        return 0;
    }
    if (cJSON_IsString(it)) {
        const char *s = it->valuestring ? it->valuestring : "";
        size_t n = strlen(s);
        if (!utf8_valid(s, n)) return error_set(err, "JSON string is not valid UTF-8");
        pyjson_put_string(out, s, n);
        return 0;
    }
    if (cJSON_IsArray(it)) {
        buf_putc(out, '[');
        bool first = true;
        for (const cJSON *c = it->child; c; c = c->next) {
            if (!first) dsml_buf_puts(out, ", ");
            first = false;
            if (dump_cjson(c, out, depth + 1, err)) return -1;
        }
        buf_putc(out, ']');
        return 0;
    }
    if (cJSON_IsObject(it)) {
        pj_members m = {0};
        for (const cJSON *c = it->child; c; c = c->next) {
            const char *k = c->string ? c->string : "";
            size_t kn = strlen(k);
            if (!utf8_valid(k, kn)) { members_free(&m); return error_set(err, "JSON key is not valid UTF-8"); }
            dsml_buf v = {0};
            if (dump_cjson(c, &v, depth + 1, err)) { dsml_buf_free(&v); members_free(&m); return -1; }
            pj_member mem = {0};
            mem.key = dup_bytes(k, kn);
            mem.key_len = kn;
            mem.value = dsml_buf_take(&v, &mem.value_len);
            if (!mem.key || !mem.value || !members_push(&m, mem)) {
                free(mem.key); free(mem.value);
                members_free(&m);
                return error_set(err, "out of memory");
            }
        }
        members_collapse_duplicates(&m);
        members_print(&m, out);
        members_free(&m);
        return 0;
    }
    return error_set(err, "unsupported cJSON item type %d", it->type);
}

int pyjson_dump_cjson(const cJSON *item, dsml_buf *out, ds4f_error *err) {
    if (!item) return error_set(err, "no JSON value");
    if (dump_cjson(item, out, 0, err)) return -1;
    if (out->oom) return error_set(err, "out of memory");
    return 0;
}

/* ================================================================================================
 * DSML rendering
 * ============================================================================================== */

#define PARAM_OPEN "<" DSV4_DSML "parameter name=\""
#define PARAM_CLOSE "</" DSV4_DSML "parameter>"

static void put_param(dsml_buf *out, const char *key, size_t key_len, bool is_string, const char *value,
                      size_t value_len) {
    dsml_buf_puts(out, PARAM_OPEN);
    dsml_buf_put(out, key, key_len);
    dsml_buf_puts(out, is_string ? "\" string=\"true\">" : "\" string=\"false\">");
    dsml_buf_put(out, value, value_len);
    dsml_buf_puts(out, PARAM_CLOSE);
}

int dsml_encode_arguments(const char *arguments, dsml_buf *out, ds4f_error *err) {
    if (!arguments) return error_set(err, "tool call has no arguments");
    size_t len = strlen(arguments);
    if (!utf8_valid(arguments, len)) return error_set(err, "tool call arguments are not valid UTF-8");
    ds4f_error ignored;
    pj_reader r = {.s = arguments, .len = len, .err = &ignored};
    pj_ws(&r);
    bool is_object = r.pos < len && arguments[r.pos] == '{';
    pj_members m = {0};
    int rc;
    if (is_object) {
        if (++r.depth > PJ_MAX_DEPTH) rc = -1;
        else rc = pj_object(&r, &m);
        if (rc == 0) rc = pj_finish(&r);
    } else {
        dsml_buf scratch = {0};
        rc = pj_value(&r, &scratch, NULL);
        if (rc == 0) rc = pj_finish(&r);
        dsml_buf_free(&scratch);
        if (rc == 0) return error_set(err, "tool call arguments are JSON but not an object: %.*s", utf8_clip(arguments, len, 80),
                                    arguments);
    }
    if (r.oom) { members_free(&m); return error_set(err, "out of memory"); }
    if (rc == 0 && r.lone_surrogate) {
        members_free(&m);
        return error_set(err, "tool call arguments have a lone UTF-16 surrogate escape, which has no UTF-8 form");
    }
    if (rc != 0) {
        /* Not JSON at all: the official encoder passes the text through as one string. */
        members_free(&m);
        put_param(out, "arguments", 9, true, arguments, len);
    } else {
        for (size_t i = 0; i < m.n; i++) {
            if (i) buf_putc(out, '\n');
            const pj_member *it = &m.items[i];
            if (it->str) put_param(out, it->key, it->key_len, true, it->str, it->str_len);
            else put_param(out, it->key, it->key_len, false, it->value, it->value_len);
        }
        members_free(&m);
    }
    if (out->oom) return error_set(err, "out of memory");
    return 0;
}

/* ================================================================================================
 * Parsing a generated turn
 * ============================================================================================== */

#define INVOKE_OPEN "<" DSV4_DSML "invoke"
#define INVOKE_CLOSE "</" DSV4_DSML "invoke"
#define PARAM_START "<" DSV4_DSML "parameter"
#define PARAM_END "/" DSV4_DSML "parameter"

/* Finds the earliest occurrence at or after `from` of any of the stop strings. Returns which stop
 * matched (-1: none, then the content runs to the end); *content_end is where the content before
 * it ends and *next is just past the stop. */
static int read_until(const char *t, size_t len, size_t from, const char *const *stops, int nstops,
                      size_t *content_end, size_t *next) {
    int which = -1;
    size_t best = len;
    for (int k = 0; k < nstops; k++) {
        if (from > len) break;
        const char *hit = memmem(t + from, len - from, stops[k], strlen(stops[k]));
        if (hit && (size_t)(hit - t) < best) {
            best = (size_t)(hit - t);
            which = k;
        }
    }
    *content_end = which < 0 ? len : best;
    *next = which < 0 ? len : best + strlen(stops[which]);
    return which;
}

static bool range_is(const char *t, size_t from, size_t to, const char *lit) {
    size_t n = strlen(lit);
    return to - from == n && memcmp(t + from, lit, n) == 0;
}

static bool ends_with(const char *t, size_t from, size_t to, const char *lit) {
    size_t n = strlen(lit);
    return to - from >= n && memcmp(t + to - n, lit, n) == 0;
}

static int format_error(ds4f_error *err, const char *what, const char *t, size_t from, size_t to) {
    size_t n = to - from;
    return error_set(err, "DSML tool calls: %s, got \"%.*s%s\"", what, utf8_clip(t + from, n, 120), t + from,
                     n > 120 ? "..." : "");
}

typedef struct {
    dsml_tool_call *items;
    size_t n, cap;
} call_list;

static void call_list_free(call_list *l) {
    for (size_t i = 0; i < l->n; i++) {
        free(l->items[i].name);
        free(l->items[i].arguments);
    }
    free(l->items);
    memset(l, 0, sizeof *l);
}

/* One parameter as written: name and value are byte ranges of the text. */
typedef struct {
    size_t name_at, name_len, value_at, value_len;
    bool is_string;
} dsml_param;

/* The invoke header, matching ^\s*name="(.*?)">\n$ (DOTALL): the $ also matches before one final
 * newline, so the header may end in ">\n or ">\n\n. */
static int parse_invoke_name(const char *t, size_t from, size_t to, size_t *name_at, size_t *name_len,
                             ds4f_error *err) {
    size_t i = from;
    while (i < to) {
        uint32_t cp;
        size_t n = utf8_decode((const unsigned char *)t + i, to - i, &cp);
        if (!n || !unicode_is_space(cp)) break;
        i += n;
    }
    static const char lead[] = "name=\"";
    if (to - i < sizeof lead - 1 || memcmp(t + i, lead, sizeof lead - 1) != 0)
        return format_error(err, "expected name=\"...\" in an invoke tag", t, from, to);
    i += sizeof lead - 1;
    size_t tail;
    if (ends_with(t, i, to, "\">\n\n")) tail = 4;
    else if (ends_with(t, i, to, "\">\n")) tail = 3;
    else return format_error(err, "expected an invoke tag to end in \">\\n", t, from, to);
    *name_at = i;
    *name_len = to - tail - i;
    return 0;
}

/* One parameter, matching ^ name="(.*?)" string="(true|false)">(.*?)<$ (DOTALL) on the text up
 * to the "/｜DSML｜parameter" that closed it. */
static int parse_param(const char *t, size_t from, size_t to, dsml_param *p, ds4f_error *err) {
    static const char lead[] = " name=\"";
    static const char mid_true[] = "\" string=\"true\">", mid_false[] = "\" string=\"false\">";
    if (to - from < sizeof lead - 1 || memcmp(t + from, lead, sizeof lead - 1) != 0)
        return format_error(err, "expected a parameter tag with name=\"...\"", t, from, to);
    size_t name_at = from + sizeof lead - 1;
    for (size_t i = name_at; i < to; i++) {
        const char *hit = memmem(t + i, to - i, "\" string=\"", 10);
        if (!hit) break;
        i = (size_t)(hit - t);
        size_t mid;
        bool is_string;
        if (to - i >= sizeof mid_true - 1 && memcmp(t + i, mid_true, sizeof mid_true - 1) == 0) {
            mid = sizeof mid_true - 1;
            is_string = true;
        } else if (to - i >= sizeof mid_false - 1 && memcmp(t + i, mid_false, sizeof mid_false - 1) == 0) {
            mid = sizeof mid_false - 1;
            is_string = false;
        } else {
            continue;
        }
        size_t value_at = i + mid, value_end;
        if (to > value_at && t[to - 1] == '<') value_end = to - 1;
        else if (to >= value_at + 2 && t[to - 2] == '<' && t[to - 1] == '\n') value_end = to - 2;
        else break;
        p->name_at = name_at;
        p->name_len = i - name_at;
        p->value_at = value_at;
        p->value_len = value_end - value_at;
        p->is_string = is_string;
        return 0;
    }
    return format_error(err, "malformed parameter (expected string=\"true|false\">VALUE</...)", t, from, to);
}

/* Official decode_dsml_to_arguments: keys and string values become JSON strings, the other
 * values are copied as written. */
static char *arguments_json(const char *t, const dsml_param *ps, size_t n, size_t *len) {
    dsml_buf b = {0};
    buf_putc(&b, '{');
    for (size_t i = 0; i < n; i++) {
        if (i) dsml_buf_puts(&b, ", ");
        pyjson_put_string(&b, t + ps[i].name_at, ps[i].name_len);
        dsml_buf_puts(&b, ": ");
        if (ps[i].is_string) pyjson_put_string(&b, t + ps[i].value_at, ps[i].value_len);
        else dsml_buf_put(&b, t + ps[i].value_at, ps[i].value_len);
    }
    buf_putc(&b, '}');
    return dsml_buf_take(&b, len);
}

/* Official parse_tool_calls, from just past "\n\n<｜DSML｜tool_calls". *closed tells whether it
 * stopped at the block's closing tag (rather than at the end of the text). */
static int parse_tool_calls(const char *t, size_t len, size_t *index, bool *closed, call_list *calls,
                            ds4f_error *err) {
    static const char *const invoke_or_end[] = {INVOKE_OPEN, DSV4_TOOL_CALLS_END};
    static const char *const param_or_close[] = {PARAM_START, INVOKE_CLOSE};
    static const char *const param_end[] = {PARAM_END};
    size_t i = *index, ce, next;
    dsml_param *params = NULL;
    size_t n_params = 0, cap_params = 0;
    int rc = -1;
    *closed = false;
    while (i < len) {
        int stop = read_until(t, len, i, invoke_or_end, 2, &ce, &next);
        if (!range_is(t, i, ce, ">\n")) { format_error(err, "expected \">\\n\" after a tag", t, i, ce); goto out; }
        i = next;
        if (stop == 1) { *closed = true; break; }
        if (stop < 0) { error_set(err, "DSML tool calls: the block ends without its closing tag"); goto out; }

        stop = read_until(t, len, i, param_or_close, 2, &ce, &next);
        size_t name_at = 0, name_len = 0;
        if (parse_invoke_name(t, i, ce, &name_at, &name_len, err)) goto out;
        i = next;
        n_params = 0;
        while (stop == 0) {
            read_until(t, len, i, param_end, 1, &ce, &next);
            dsml_param p;
            if (parse_param(t, i, ce, &p, err)) goto out;
            i = next;
            for (size_t k = 0; k < n_params; k++) {
                if (params[k].name_len == p.name_len && memcmp(t + params[k].name_at, t + p.name_at, p.name_len) == 0) {
                    error_set(err, "DSML tool calls: parameter \"%.*s\" given twice", utf8_clip(t + p.name_at, p.name_len, 80),
                              t + p.name_at);
                    goto out;
                }
            }
            if (n_params == cap_params) {
                size_t cap = cap_params ? cap_params * 2 : 8;
                dsml_param *np = realloc(params, cap * sizeof *np);
                if (!np) { error_set(err, "out of memory"); goto out; }
                params = np;
                cap_params = cap;
            }
            params[n_params++] = p;
            stop = read_until(t, len, i, param_or_close, 2, &ce, &next);
            if (!range_is(t, i, ce, ">\n")) { format_error(err, "expected \">\\n\" after a parameter", t, i, ce); goto out; }
            i = next;
        }
        if (calls->n == calls->cap) {
            size_t cap = calls->cap ? calls->cap * 2 : 4;
            dsml_tool_call *nc = realloc(calls->items, cap * sizeof *nc);
            if (!nc) { error_set(err, "out of memory"); goto out; }
            calls->items = nc;
            calls->cap = cap;
        }
        dsml_tool_call call = {0};
        call.name = dup_bytes(t + name_at, name_len);
        call.name_len = name_len;
        call.arguments = arguments_json(t, params, n_params, &call.arguments_len);
        if (!call.name || !call.arguments) {
            free(call.name);
            free(call.arguments);
            error_set(err, "out of memory");
            goto out;
        }
        calls->items[calls->n++] = call;
    }
    *index = i;
    rc = 0;
out:
    free(params);
    return rc;
}

void dsml_parsed_free(dsml_parsed *p) {
    if (!p) return;
    free(p->reasoning_content);
    free(p->content);
    for (size_t i = 0; i < p->n_tool_calls; i++) {
        free(p->tool_calls[i].name);
        free(p->tool_calls[i].arguments);
    }
    free(p->tool_calls);
    memset(p, 0, sizeof *p);
}

static int check_no_special(const char *t, size_t from, size_t to, const char *field, ds4f_error *err) {
    static const char *const specials[] = {DSV4_BOS, DSV4_EOS, DSV4_THINK_START, DSV4_THINK_END, DSV4_DSML};
    for (size_t k = 0; k < sizeof specials / sizeof *specials; k++)
        if (memmem(t + from, to - from, specials[k], strlen(specials[k])))
            return error_set(err, "generated %s contains the special token %s", field, specials[k]);
    return 0;
}

static int parse_completion(const char *t, size_t len, unsigned flags, dsml_parsed *out, ds4f_error *err);

int dsml_parse_completion(const char *t, size_t len, unsigned flags, dsml_parsed *out, ds4f_error *err) {
    static const char eos[] = DSV4_EOS;
    if (!(flags & DSML_PARSE_EOS_OPTIONAL) || memmem(t, len, eos, sizeof eos - 1))
        return parse_completion(t, len, flags, out, err);
    /* Exactly as if the EOS had been detokenized too. (Without it the official parser accepts a
     * tool-call block cut off anywhere, e.g. by a token limit; with it, it does not.) */
    char *with_eos = malloc(len + sizeof eos);
    if (!with_eos) return error_set(err, "out of memory");
    memcpy(with_eos, t, len);
    memcpy(with_eos + len, eos, sizeof eos);
    int rc = parse_completion(with_eos, len + sizeof eos - 1, flags, out, err);
    free(with_eos);
    return rc;
}

static int parse_completion(const char *t, size_t len, unsigned flags, dsml_parsed *out, ds4f_error *err) {
    static const char *const think_stops[] = {DSV4_THINK_END, DSV4_TOOL_CALLS_START};
    static const char *const content_stops[] = {DSV4_EOS, DSV4_TOOL_CALLS_START};
    static const char *const eos_stop[] = {DSV4_EOS};
    memset(out, 0, sizeof *out);
    size_t i = 0, ce, next, r_end = 0;
    if (flags & DSML_PARSE_THINKING) {
        int stop = read_until(t, len, 0, think_stops, 2, &ce, &next);
        if (stop != 0) return error_set(err, "generated reasoning is not closed by </think>");
        r_end = ce;
        i = next;
    }
    size_t c_at = i;
    int stop = read_until(t, len, i, content_stops, 2, &ce, &next);
    size_t c_end = ce;
    i = next;
    if (stop < 0) return error_set(err, "generated turn does not end with the EOS token");
    call_list calls = {0};
    if (stop == 1) {
        bool closed;
        if (parse_tool_calls(t, len, &i, &closed, &calls, err)) { call_list_free(&calls); return -1; }
        read_until(t, len, i, eos_stop, 1, &ce, &next);
        if (ce != i) {
            call_list_free(&calls);
            return error_set(err, "generated turn has text after its tool calls: \"%.*s\"", utf8_clip(t + i, ce - i, 80), t + i);
        }
        i = next;
    }
    if (i != len) {
        call_list_free(&calls);
        return error_set(err, "generated turn has text after the EOS token");
    }
    if (check_no_special(t, 0, r_end, "reasoning", err) || check_no_special(t, c_at, c_end, "content", err)) {
        call_list_free(&calls);
        return -1;
    }
    out->reasoning_content = dup_bytes(t, r_end);
    out->reasoning_len = r_end;
    out->content = dup_bytes(t + c_at, c_end - c_at);
    out->content_len = c_end - c_at;
    out->tool_calls = calls.items;
    out->n_tool_calls = calls.n;
    if (!out->reasoning_content || !out->content) {
        dsml_parsed_free(out);
        return error_set(err, "out of memory");
    }
    return 0;
}

/* ================================================================================================
 * Streaming
 * ============================================================================================== */

enum { ST_REASONING, ST_CONTENT, ST_TOOLS, ST_AFTER_TOOLS, ST_END };

void dsml_stream_init(dsml_stream *s, unsigned flags, dsml_event_fn fn, void *user) {
    memset(s, 0, sizeof *s);
    s->flags = flags;
    s->fn = fn;
    s->user = user;
    s->state = (flags & DSML_PARSE_THINKING) ? ST_REASONING : ST_CONTENT;
}

void dsml_stream_free(dsml_stream *s) { dsml_buf_free(&s->text); }

const char *dsml_stream_unreported(const dsml_stream *s, size_t *len) {
    *len = s->text.len - s->done;
    return s->text.data ? s->text.data + s->done : "";
}

static void emit_text(dsml_stream *s, dsml_event_kind kind, size_t from, size_t to) {
    if (to <= from || !s->fn) return;
    dsml_event ev = {.kind = kind, .text = s->text.data + from, .len = to - from};
    s->fn(s->user, &ev);
}

static void emit_tool_calls(dsml_stream *s, const dsml_tool_call *calls, size_t n) {
    for (; s->tool_calls_reported < n; s->tool_calls_reported++) {
        if (!s->fn) continue;
        const dsml_tool_call *c = &calls[s->tool_calls_reported];
        dsml_event ev = {.kind = DSML_EVENT_TOOL_CALL, .tool_index = s->tool_calls_reported, .name = c->name,
                         .arguments = c->arguments, .name_len = c->name_len, .arguments_len = c->arguments_len};
        s->fn(s->user, &ev);
    }
}

/* How many bytes at the end of [from, to) could be the start of `marker`. */
static size_t partial_marker(const char *t, size_t from, size_t to, const char *marker) {
    size_t m = strlen(marker);
    size_t max = to - from < m - 1 ? to - from : m - 1;
    for (size_t k = max; k > 0; k--)
        if (memcmp(t + to - k, marker, k) == 0) return k;
    return 0;
}

/* How many bytes at the end of [from, to) are an unfinished UTF-8 character. */
static size_t partial_utf8(const char *t, size_t from, size_t to) {
    const unsigned char *u = (const unsigned char *)t;
    for (size_t k = 1; k <= 3 && k <= to - from; k++) {
        unsigned c = u[to - k];
        if ((c & 0xC0) == 0x80) continue;
        size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        return need > k ? k : 0;
    }
    return 0;
}

/* Reports [done, end) minus whatever might still turn into one of the markers. */
static void emit_safe(dsml_stream *s, dsml_event_kind kind, const char *const *markers, int n) {
    const char *t = s->text.data;
    size_t end = s->text.len, hold = 0;
    for (int k = 0; k < n; k++) {
        size_t h = partial_marker(t, s->done, end, markers[k]);
        if (h > hold) hold = h;
    }
    if (!hold) hold = partial_utf8(t, s->done, end);
    emit_text(s, kind, s->done, end - hold);
    s->done = end - hold;
}

static int stream_step(dsml_stream *s, ds4f_error *err) {
    static const char *const think_marks[] = {DSV4_THINK_END};
    static const char *const content_marks[] = {DSV4_TOOL_CALLS_START, DSV4_EOS};
    const char *t = s->text.data;
    size_t len = s->text.len;
    for (;;) {
        size_t ce, next;
        switch (s->state) {
        case ST_REASONING:
            if (read_until(t, len, s->done, think_marks, 1, &ce, &next) < 0) {
                emit_safe(s, DSML_EVENT_REASONING, think_marks, 1);
                return 0;
            }
            emit_text(s, DSML_EVENT_REASONING, s->done, ce);
            s->done = next;
            s->state = ST_CONTENT;
            break;
        case ST_CONTENT: {
            int which = read_until(t, len, s->done, content_marks, 2, &ce, &next);
            if (which < 0) {
                emit_safe(s, DSML_EVENT_CONTENT, content_marks, 2);
                return 0;
            }
            emit_text(s, DSML_EVENT_CONTENT, s->done, ce);
            if (which == 0) {
                s->done = ce; /* the block stays unreported until its tool calls are known */
                s->tools_at = s->tools_scan = next;
                s->state = ST_TOOLS;
            } else {
                s->done = next;
                s->state = ST_END;
            }
            break;
        }
        case ST_TOOLS: {
            const size_t end_len = strlen(DSV4_TOOL_CALLS_END);
            const char *hit = s->tools_scan <= len
                                  ? memmem(t + s->tools_scan, len - s->tools_scan, DSV4_TOOL_CALLS_END, end_len)
                                  : NULL;
            if (!hit) {
                if (len >= end_len && len - end_len + 1 > s->tools_scan) s->tools_scan = len - end_len + 1;
                return 0;
            }
            size_t block_end = (size_t)(hit - t) + end_len;
            /* Parsing only up to this closing tag gives the whole-text parse's answer whenever it
             * ends at this tag: every search it made found its stop before the tag. Otherwise the
             * tag sat inside a parameter value; keep looking. */
            size_t i = s->tools_at;
            bool closed = false;
            call_list calls = {0};
            ds4f_error ignored;
            int rc = parse_tool_calls(t, block_end, &i, &closed, &calls, &ignored);
            if (rc == 0 && closed && i == block_end) {
                emit_tool_calls(s, calls.items, calls.n);
                s->done = block_end;
                s->state = ST_AFTER_TOOLS;
            } else {
                s->tools_scan = (size_t)(hit - t) + 1;
            }
            call_list_free(&calls);
            if (s->text.oom) return error_set(err, "out of memory");
            break;
        }
        default:
            return 0;
        }
    }
}

int dsml_stream_feed(dsml_stream *s, const char *bytes, size_t len, ds4f_error *err) {
    dsml_buf_put(&s->text, bytes, len);
    if (s->text.oom) return error_set(err, "out of memory buffering generated text");
    if (!s->text.data) return 0;
    return stream_step(s, err);
}

int dsml_stream_finish(dsml_stream *s, dsml_parsed *out, ds4f_error *err) {
    if (s->state == ST_REASONING || s->state == ST_CONTENT) {
        emit_text(s, s->state == ST_REASONING ? DSML_EVENT_REASONING : DSML_EVENT_CONTENT, s->done, s->text.len);
        s->done = s->text.len;
    }
    dsml_parsed local, *p = out ? out : &local;
    int rc = dsml_parse_completion(s->text.data ? s->text.data : "", s->text.len, s->flags, p, err);
    if (rc == 0) {
        emit_tool_calls(s, p->tool_calls, p->n_tool_calls);
        if (s->state == ST_TOOLS || s->state == ST_AFTER_TOOLS) s->done = s->text.len;
    }
    if (!out && rc == 0) dsml_parsed_free(&local);
    return rc;
}
