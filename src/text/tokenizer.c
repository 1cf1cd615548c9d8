/* Tokenizer loading (tokenizer.json -> tables), token lookups and decoding. Encoding is in
 * tokenizer_bpe.c, the pre-tokenizer regexes in tokenizer_regex.c. */
#include "text/tokenizer.h"

#include <cJSON.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file_io.h"
#include "text/tokenizer_internal.h"

/* ---- GPT-2 byte-level alphabet ----
 * Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space, 0x7F-0xA0,
 * 0xAD) are given the code points 256, 257, ... in byte order, so every byte has a visible
 * character and the vocabulary can be stored as text. */
static int byte_is_self_printing(int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t tokenizer_byte_to_codepoint(uint8_t byte) {
    if (byte_is_self_printing(byte)) return byte;
    uint32_t shifted = 0;
    for (int b = 0; b < byte; b++)
        if (!byte_is_self_printing(b)) shifted++;
    return 256 + shifted;
}

int tokenizer_codepoint_to_byte(uint32_t cp) {
    if (cp < 256) return byte_is_self_printing((int)cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    uint32_t shifted = cp - 256;
    for (int b = 0; b < 256; b++)
        if (!byte_is_self_printing(b) && shifted-- == 0) return b;
    return -1;
}

/* Decoding the byte-level alphabet is on the load path for 129k strings: a table avoids the
 * linear searches above. Entry = byte + 1, 0 = not in the alphabet. */
static void build_codepoint_table(int16_t table[256 + 68]) {
    for (uint32_t cp = 0; cp < 256 + 68; cp++) table[cp] = (int16_t)(tokenizer_codepoint_to_byte(cp) + 1);
}

size_t utf8_valid_char_len(const uint8_t *s, size_t len) {
    if (len == 0) return 0;
    uint8_t b0 = s[0];
    if (b0 < 0x80) return 1;
    if (b0 < 0xC2) return 0;
    if (b0 < 0xE0) return (len >= 2 && (s[1] & 0xC0) == 0x80) ? 2 : 0;
    if (b0 < 0xF0) {
        if (len < 3) return 0;
        /* Bounds of the second byte exclude overlong forms (E0) and UTF-16 surrogates (ED). */
        uint8_t lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
        return (s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80) ? 3 : 0;
    }
    if (b0 < 0xF5) {
        if (len < 4) return 0;
        uint8_t lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
        return (s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 && (s[3] & 0xC0) == 0x80) ? 4 : 0;
    }
    return 0;
}

/* Decodes one code point of well-formed UTF-8 (as cJSON produces); returns its length. */
static size_t utf8_decode(const uint8_t *s, size_t len, uint32_t *cp) {
    size_t n = utf8_valid_char_len(s, len);
    if (n == 0) { *cp = 0xFFFFFFFFu; return 1; }
    if (n == 1) *cp = s[0];
    else if (n == 2) *cp = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    else if (n == 3) *cp = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    else *cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    return n;
}

/* HF's ByteLevel decoder, per token: if every character is in the byte alphabet, the token means
 * those bytes; otherwise (e.g. "<｜User｜>") it means its own UTF-8 text. Writes to out (room for
 * len bytes, which is enough: decoding never lengthens). Returns the byte count. */
static size_t byte_level_decode(const int16_t *cp_table, const uint8_t *s, size_t len, uint8_t *out,
                                bool *is_byte_level) {
    size_t n = 0;
    *is_byte_level = true;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += utf8_decode(s + i, len - i, &cp);
        if (cp >= 256 + 68 || cp_table[cp] == 0) {
            memcpy(out, s, len);
            *is_byte_level = false;
            return len;
        }
        out[n++] = (uint8_t)(cp_table[cp] - 1);
    }
    return n;
}

/* ---- hash maps ---- */

static uint64_t hash_bytes(const uint8_t *p, size_t len) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (len * 0xFF51AFD7ED558CCDull);
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xC2B2AE3D27D4EB4Full;
        h ^= h >> 29;
        p += 8;
        len -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, len);
    h = (h ^ w) * 0x165667B19E3779F9ull;
    h ^= h >> 32;
    return h;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

int string_map_init(string_map *m, size_t expected) {
    memset(m, 0, sizeof *m);
    size_t cap = pow2_at_least(expected * 2 + 1);
    m->slots = calloc(cap, sizeof *m->slots);
    m->cap = expected ? expected : 1;
    m->entries = malloc(m->cap * sizeof *m->entries);
    if (!m->slots || !m->entries) { string_map_free(m); return -1; }
    m->mask = cap - 1;
    return 0;
}

void string_map_free(string_map *m) {
    free(m->slots);
    free(m->entries);
    memset(m, 0, sizeof *m);
}

static uint64_t slot_tag(uint64_t hash) { return hash & 0xFFFFFFFF00000000ull; }

static int string_map_grow(string_map *m) {
    size_t new_cap = m->cap * 2;
    string_entry *entries = realloc(m->entries, new_cap * sizeof *entries);
    if (!entries) return -1;
    m->entries = entries;
    m->cap = new_cap;
    size_t n_slots = pow2_at_least(new_cap * 2 + 1);
    if (n_slots > m->mask + 1) {
        uint64_t *slots = calloc(n_slots, sizeof *slots);
        if (!slots) return -1;
        for (size_t e = 0; e < m->count; e++) {
            uint64_t h = hash_bytes(m->entries[e].key, m->entries[e].len);
            size_t i = h & (n_slots - 1);
            while (slots[i]) i = (i + 1) & (n_slots - 1);
            slots[i] = slot_tag(h) | (e + 1);
        }
        free(m->slots);
        m->slots = slots;
        m->mask = n_slots - 1;
    }
    return 0;
}

static uint64_t *string_map_find_slot(const string_map *m, const uint8_t *key, size_t len, uint64_t h) {
    size_t i = h & m->mask;
    for (;;) {
        uint64_t s = m->slots[i];
        if (!s) return &m->slots[i];
        if (slot_tag(s) == slot_tag(h)) {
            const string_entry *e = &m->entries[(s & 0xFFFFFFFFu) - 1];
            if (e->len == len && memcmp(e->key, key, len) == 0) return &m->slots[i];
        }
        i = (i + 1) & m->mask;
    }
}

int string_map_put(string_map *m, const uint8_t *key, size_t len, int32_t value) {
    if (len > UINT32_MAX || m->count >= UINT32_MAX - 1) return -1;
    uint64_t h = hash_bytes(key, len);
    uint64_t *slot = string_map_find_slot(m, key, len, h);
    if (*slot) return 0;
    if (m->count == m->cap) {
        if (string_map_grow(m) != 0) return -1;
        slot = string_map_find_slot(m, key, len, h);
    }
    m->entries[m->count] = (string_entry){key, (uint32_t)len, value};
    *slot = slot_tag(h) | ++m->count;
    return 1;
}

static void string_map_set(string_map *m, const uint8_t *key, size_t len, int32_t value) {
    uint64_t s = *string_map_find_slot(m, key, len, hash_bytes(key, len));
    if (s) m->entries[(s & 0xFFFFFFFFu) - 1].value = value;
}

int32_t string_map_get(const string_map *m, const uint8_t *key, size_t len) {
    if (!m->slots) return -1;
    uint64_t s = *string_map_find_slot(m, key, len, hash_bytes(key, len));
    return s ? m->entries[(s & 0xFFFFFFFFu) - 1].value : -1;
}

static uint64_t merge_key(int32_t left, int32_t right) {
    return ((uint64_t)(uint32_t)left + 1) << 32 | (uint32_t)right;
}

static size_t merge_hash(uint64_t key, size_t mask) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 29) & mask;
}

int merge_map_init(merge_map *m, size_t expected) {
    size_t cap = pow2_at_least(expected * 2 + 1);
    m->slots = calloc(cap, sizeof *m->slots);
    m->mask = cap - 1;
    m->count = 0;
    return m->slots ? 0 : -1;
}

void merge_map_free(merge_map *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

/* The map is sized for all merges up front, so it never fills. A repeated pair keeps the later
 * rank, as HF's merge HashMap does when it is collected from the list. */
int merge_map_put(merge_map *m, int32_t left, int32_t right, uint32_t rank, int32_t merged_id) {
    if (m->count * 2 >= m->mask) return -1;
    uint64_t key = merge_key(left, right);
    size_t i = merge_hash(key, m->mask);
    while (m->slots[i].key && m->slots[i].key != key) i = (i + 1) & m->mask;
    if (!m->slots[i].key) m->count++;
    m->slots[i].key = key;
    m->slots[i].rank = rank;
    m->slots[i].merged_id = merged_id;
    return 0;
}

const merge_slot *merge_map_get(const merge_map *m, int32_t left, int32_t right) {
    uint64_t key = merge_key(left, right);
    size_t i = merge_hash(key, m->mask);
    for (;;) {
        const merge_slot *s = &m->slots[i];
        if (s->key == key) return s;
        if (!s->key) return NULL;
        i = (i + 1) & m->mask;
    }
}

/* ---- added-token trie ---- */

static int trie_insert(added_trie *t, const uint8_t *s, size_t len, int32_t id) {
    if (len == 0) return 0;
    if (t->count == 0) {
        t->cap = 64;
        t->nodes = calloc(t->cap, sizeof *t->nodes);
        if (!t->nodes) return -1;
        t->count = 1; /* node 0 is the root; root_child[] holds its children */
        t->nodes[0].token_id = -1;
    }
    uint32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        uint32_t *link = node == 0 ? &t->root_child[s[i]] : &t->nodes[node].first_child;
        uint32_t child = *link;
        if (node != 0)
            while (child && t->nodes[child].byte != s[i]) child = t->nodes[child].next_sibling;
        if (!child) {
            if (t->count == t->cap) {
                trie_node *nodes = realloc(t->nodes, 2 * t->cap * sizeof *nodes);
                if (!nodes) return -1;
                t->nodes = nodes;
                t->cap *= 2;
                link = node == 0 ? &t->root_child[s[i]] : &t->nodes[node].first_child;
            }
            child = (uint32_t)t->count++;
            t->nodes[child] = (trie_node){.first_child = 0, .next_sibling = node == 0 ? 0 : *link,
                                          .token_id = -1, .byte = s[i]};
            *link = child;
        }
        node = child;
    }
    /* Two added tokens with the same content: HF keeps the first in its matcher. */
    if (t->nodes[node].token_id < 0) t->nodes[node].token_id = id;
    return 0;
}

static void trie_free(added_trie *t) {
    free(t->nodes);
    memset(t, 0, sizeof *t);
}

/* ---- loading ---- */

typedef struct loader {
    const char *name; /* file name, for messages */
    ds4f_error *err;
    tokenizer *tok;
    int16_t cp_table[256 + 68];
} loader;

static int load_fail(loader *L, const char *what) {
    return error_set(L->err, "%s: %s", L->name, what);
}

static const cJSON *get_key(const cJSON *obj, const char *key) {
    return cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
}

/* Null and absent both mean "off" in HF's serde defaults. */
static bool is_null_or_absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

static int get_bool(loader *L, const cJSON *obj, const char *where, const char *key, bool fallback, bool *out) {
    const cJSON *v = get_key(obj, key);
    if (!v) { *out = fallback; return 0; }
    if (!cJSON_IsBool(v)) return error_set(L->err, "%s: %s.%s must be true or false", L->name, where, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int get_id(loader *L, const cJSON *v, const char *where, int32_t *out) {
    /* The upper bound keeps vocab_size = max id + 1 and the id tables within int32 and memory. */
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < (1 << 26)) ||
        v->valuedouble != (double)(int32_t)v->valuedouble)
        return error_set(L->err, "%s: %s must be an integer id in [0, 2^26)", L->name, where);
    *out = (int32_t)v->valuedouble;
    return 0;
}

static int check_type(loader *L, const cJSON *obj, const char *where, const char *expected) {
    const cJSON *type = get_key(obj, "type");
    if (!cJSON_IsString(type))
        return error_set(L->err, "%s: %s has no \"type\" (expected \"%s\")", L->name, where, expected);
    if (strcmp(type->valuestring, expected) != 0)
        return error_set(L->err, "%s: %s type \"%s\" is not supported (expected \"%s\")", L->name, where,
                         type->valuestring, expected);
    return 0;
}

static int load_normalizer(loader *L, const cJSON *root) {
    const cJSON *n = get_key(root, "normalizer");
    if (is_null_or_absent(n)) return 0;
    const cJSON *list = get_key(n, "normalizers");
    const cJSON *type = get_key(n, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "Sequence") != 0 || !cJSON_IsArray(list) ||
        cJSON_GetArraySize(list) != 0)
        return load_fail(L, "normalizer must be null or an empty Sequence (this engine applies no normalization, "
                            "so any other would change the ids)");
    return 0;
}

static int load_pre_tokenizer(loader *L, const cJSON *root) {
    tokenizer *tok = L->tok;
    const cJSON *pre = get_key(root, "pre_tokenizer");
    if (!cJSON_IsObject(pre)) return load_fail(L, "pre_tokenizer is missing (expected Split steps and ByteLevel)");
    const cJSON *steps = pre;
    const cJSON *type = get_key(pre, "type");
    if (cJSON_IsString(type) && strcmp(type->valuestring, "Sequence") == 0) {
        steps = get_key(pre, "pretokenizers");
        if (!cJSON_IsArray(steps)) return load_fail(L, "pre_tokenizer Sequence has no \"pretokenizers\" array");
    }
    int n = cJSON_IsArray(steps) ? cJSON_GetArraySize(steps) : 1;
    bool saw_byte_level = false;
    for (int i = 0; i < n; i++) {
        const cJSON *step = cJSON_IsArray(steps) ? cJSON_GetArrayItem(steps, i) : steps;
        char where[64];
        snprintf(where, sizeof where, "pre_tokenizer step %d", i);
        const cJSON *st = get_key(step, "type");
        if (!cJSON_IsString(st)) return error_set(L->err, "%s: %s has no \"type\"", L->name, where);
        if (saw_byte_level)
            return error_set(L->err, "%s: %s (%s) follows ByteLevel; only Split steps followed by one ByteLevel "
                             "are supported", L->name, where, st->valuestring);
        if (strcmp(st->valuestring, "Split") == 0) {
            const cJSON *regex = get_key(get_key(step, "pattern"), "Regex");
            const cJSON *behavior = get_key(step, "behavior");
            bool invert;
            if (!cJSON_IsString(regex))
                return error_set(L->err, "%s: %s: only {\"Regex\": ...} patterns are supported", L->name, where);
            if (!cJSON_IsString(behavior) || strcmp(behavior->valuestring, "Isolated") != 0)
                return error_set(L->err, "%s: %s: split behavior must be \"Isolated\"", L->name, where);
            if (get_bool(L, step, where, "invert", false, &invert) != 0) return -1;
            if (invert) return error_set(L->err, "%s: %s: inverted splits are not supported", L->name, where);
            if (tok->n_splits == TOKENIZER_MAX_SPLITS)
                return error_set(L->err, "%s: more than %d Split steps", L->name, TOKENIZER_MAX_SPLITS);
            if (tokenizer_regex_compile(&tok->splits[tok->n_splits], regex->valuestring,
                                        strlen(regex->valuestring), L->err) != 0)
                return error_prefix(L->err, "%s: %s", L->name, where);
            tok->n_splits++;
        } else if (strcmp(st->valuestring, "ByteLevel") == 0) {
            bool prefix_space, use_regex;
            if (get_bool(L, step, where, "add_prefix_space", true, &prefix_space) != 0 ||
                get_bool(L, step, where, "use_regex", true, &use_regex) != 0)
                return -1;
            if (prefix_space || use_regex)
                return error_set(L->err, "%s: %s: ByteLevel must have add_prefix_space=false and use_regex=false "
                                 "(splitting is left to the Split steps)", L->name, where);
            saw_byte_level = true;
        } else {
            return error_set(L->err, "%s: %s: pre-tokenizer type \"%s\" is not supported (expected Split or "
                             "ByteLevel)", L->name, where, st->valuestring);
        }
    }
    if (!saw_byte_level) return load_fail(L, "pre_tokenizer does not end with ByteLevel (not a byte-level BPE)");
    return 0;
}

static int load_model_options(loader *L, const cJSON *model) {
    const cJSON *type = get_key(model, "type");
    /* Old files leave the type out; HF then recognises BPE by its fields. */
    if (type && check_type(L, model, "model", "BPE") != 0) return -1;
    if (!is_null_or_absent(get_key(model, "dropout")))
        return load_fail(L, "model.dropout must be null (BPE dropout is random)");
    const char *string_options[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = get_key(model, string_options[i]);
        if (!is_null_or_absent(v) && !(cJSON_IsString(v) && v->valuestring[0] == 0))
            return error_set(L->err, "%s: model.%s must be null (not a byte-level BPE option)", L->name,
                             string_options[i]);
    }
    bool byte_fallback;
    if (get_bool(L, model, "model", "byte_fallback", false, &byte_fallback) != 0 ||
        get_bool(L, model, "model", "ignore_merges", false, &L->tok->ignore_merges) != 0)
        return -1;
    if (byte_fallback) return load_fail(L, "model.byte_fallback must be false (byte-level BPE has no <0xNN> tokens)");
    /* unk_token is never used: every byte has a token (checked), so no symbol is ever unknown. */
    return 0;
}

/* One pass over the vocabulary and added tokens: validates ids and contents, sizes the tables. */
static int measure(loader *L, const cJSON *vocab, const cJSON *added, size_t *names_bytes, size_t *n_names) {
    int32_t max_id = -1;
    size_t bytes = 0, n = 0;
    for (const cJSON *e = vocab->child; e; e = e->next, n++) {
        char where[64];
        snprintf(where, sizeof where, "model.vocab entry %zu", n);
        int32_t id;
        if (get_id(L, e, where, &id) != 0) return -1;
        if (id > max_id) max_id = id;
        bytes += strlen(e->string);
    }
    if (n == 0) return load_fail(L, "model.vocab is empty");
    size_t i = 0;
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next, i++, n++) {
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu].id", i);
        int32_t id;
        if (get_id(L, get_key(a, "id"), where, &id) != 0) return -1;
        if (id > max_id) max_id = id;
        const cJSON *content = get_key(a, "content");
        if (!cJSON_IsString(content) || content->valuestring[0] == 0)
            return error_set(L->err, "%s: added_tokens[%zu] has no non-empty string \"content\"", L->name, i);
        bytes += strlen(content->valuestring);
    }
    L->tok->vocab_size = max_id + 1;
    *names_bytes = bytes;
    *n_names = n;
    return 0;
}

static int load_tables(loader *L, const cJSON *root) {
    tokenizer *tok = L->tok;
    const cJSON *model = get_key(root, "model");
    if (!cJSON_IsObject(model)) return load_fail(L, "\"model\" is missing");
    if (load_model_options(L, model) != 0) return -1;
    const cJSON *vocab = get_key(model, "vocab");
    if (!cJSON_IsObject(vocab)) return load_fail(L, "model.vocab must be an object {token: id}");
    const cJSON *added = get_key(root, "added_tokens");
    if (is_null_or_absent(added)) added = NULL;
    else if (!cJSON_IsArray(added)) return load_fail(L, "added_tokens must be an array");

    size_t names_bytes = 0, n_names = 0;
    if (measure(L, vocab, added, &names_bytes, &n_names) != 0) return -1;
    size_t n_ids = (size_t)tok->vocab_size;
    /* Decoding never lengthens a name, so each blob holds all names. */
    tok->names = malloc(names_bytes + 1);
    tok->token_bytes = malloc(names_bytes + 1);
    tok->token_start = malloc(n_ids * sizeof *tok->token_start);
    tok->token_len = calloc(n_ids, sizeof *tok->token_len);
    if (!tok->names || !tok->token_bytes || !tok->token_start || !tok->token_len ||
        string_map_init(&tok->by_name, n_names) != 0)
        return load_fail(L, "out of memory");
    for (size_t id = 0; id < n_ids; id++) tok->token_start[id] = UINT32_MAX;
    if (tok->ignore_merges && string_map_init(&tok->bpe_vocab, n_names) != 0) return load_fail(L, "out of memory");

    size_t name_pos = 0, byte_pos = 0;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id = (int32_t)e->valuedouble;
        size_t len = strlen(e->string);
        uint8_t *name = tok->names + name_pos;
        memcpy(name, e->string, len);
        name_pos += len;
        if (tok->token_start[id] != UINT32_MAX)
            return error_set(L->err, "%s: model.vocab gives id %d to two tokens", L->name, id);
        int r = string_map_put(&tok->by_name, name, len, id);
        if (r < 0) return load_fail(L, "out of memory");
        if (r == 0) return error_set(L->err, "%s: model.vocab has the token \"%s\" twice", L->name, e->string);
        bool is_byte_level;
        size_t n = byte_level_decode(L->cp_table, name, len, tok->token_bytes + byte_pos, &is_byte_level);
        tok->token_start[id] = (uint32_t)byte_pos;
        tok->token_len[id] = (uint32_t)n;
        /* ignore_merges looks a whole piece up among the strings BPE could produce, i.e. the
         * byte-level ones. */
        if (tok->ignore_merges && is_byte_level &&
            string_map_put(&tok->bpe_vocab, tok->token_bytes + byte_pos, n, id) < 0)
            return load_fail(L, "out of memory");
        byte_pos += n;
    }

    for (int b = 0; b < 256; b++) {
        uint8_t utf8[2];
        uint32_t cp = tokenizer_byte_to_codepoint((uint8_t)b);
        size_t len = 1;
        if (cp < 0x80) utf8[0] = (uint8_t)cp;
        else { utf8[0] = (uint8_t)(0xC0 | (cp >> 6)); utf8[1] = (uint8_t)(0x80 | (cp & 0x3F)); len = 2; }
        tok->byte_id[b] = string_map_get(&tok->by_name, utf8, len);
        if (tok->byte_id[b] < 0)
            return error_set(L->err, "%s: model.vocab has no token for byte 0x%02X (\"%.*s\"); a byte-level BPE "
                             "vocabulary covers all 256 bytes", L->name, b, (int)len, (const char *)utf8);
    }

    /* Merges name vocabulary tokens only, so they are resolved before added tokens join by_name. */
    const cJSON *merges = get_key(model, "merges");
    if (!cJSON_IsArray(merges)) return load_fail(L, "model.merges must be an array");
    if (merge_map_init(&tok->merges, (size_t)cJSON_GetArraySize(merges)) != 0) return load_fail(L, "out of memory");
    char *joined = NULL;
    size_t joined_cap = 0;
    uint32_t rank = 0;
    for (const cJSON *m = merges->child; m; m = m->next, rank++) {
        const char *left, *right;
        size_t left_len, right_len;
        if (cJSON_IsString(m)) {
            /* "left right": the byte-level alphabet has no raw space, so one space separates. */
            const char *sp = strchr(m->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                free(joined);
                return error_set(L->err, "%s: model.merges[%u] \"%s\" is not two tokens separated by one space",
                                 L->name, rank, m->valuestring);
            }
            left = m->valuestring;
            left_len = (size_t)(sp - left);
            right = sp + 1;
            right_len = strlen(right);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) {
            left = m->child->valuestring;
            left_len = strlen(left);
            right = m->child->next->valuestring;
            right_len = strlen(right);
        } else {
            free(joined);
            return error_set(L->err, "%s: model.merges[%u] must be \"left right\" or [\"left\", \"right\"]", L->name,
                             rank);
        }
        if (left_len + right_len > joined_cap) {
            joined_cap = 2 * (left_len + right_len) + 64;
            char *j = realloc(joined, joined_cap);
            if (!j) { free(joined); return load_fail(L, "out of memory"); }
            joined = j;
        }
        memcpy(joined, left, left_len);
        memcpy(joined + left_len, right, right_len);
        int32_t a = string_map_get(&tok->by_name, (const uint8_t *)left, left_len);
        int32_t b = string_map_get(&tok->by_name, (const uint8_t *)right, right_len);
        int32_t ab = string_map_get(&tok->by_name, (const uint8_t *)joined, left_len + right_len);
        if (a < 0 || b < 0 || ab < 0) {
            const char *missing = a < 0 ? left : b < 0 ? right : joined;
            int missing_len = (int)(a < 0 ? left_len : b < 0 ? right_len : left_len + right_len);
            error_set(L->err, "%s: model.merges[%u] uses \"%.*s\", which is not in model.vocab", L->name, rank,
                      missing_len, missing);
            free(joined);
            return -1;
        }
        merge_map_put(&tok->merges, a, b, rank, ab);
    }
    free(joined);

    size_t i = 0;
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next, i++) {
        const char *content = get_key(a, "content")->valuestring;
        size_t len = strlen(content);
        int32_t id = (int32_t)get_key(a, "id")->valuedouble;
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        bool single_word, lstrip, rstrip, normalized, special;
        if (get_bool(L, a, where, "single_word", false, &single_word) != 0 ||
            get_bool(L, a, where, "lstrip", false, &lstrip) != 0 || get_bool(L, a, where, "rstrip", false, &rstrip) != 0 ||
            get_bool(L, a, where, "normalized", true, &normalized) != 0 ||
            get_bool(L, a, where, "special", false, &special) != 0)
            return -1;
        if (single_word || lstrip || rstrip)
            return error_set(L->err, "%s: %s (\"%s\"): single_word, lstrip and rstrip are not supported", L->name,
                             where, content);
        uint8_t *name = tok->names + name_pos;
        memcpy(name, content, len);
        name_pos += len;
        /* HF decodes added tokens through the same ByteLevel decoder as the vocabulary. */
        bool is_byte_level;
        size_t n = byte_level_decode(L->cp_table, name, len, tok->token_bytes + byte_pos, &is_byte_level);
        tok->token_start[id] = (uint32_t)byte_pos;
        tok->token_len[id] = (uint32_t)n;
        byte_pos += n;
        if (trie_insert(normalized ? &tok->added_normalized : &tok->added_plain, name, len, id) != 0)
            return load_fail(L, "out of memory");
        int r = string_map_put(&tok->by_name, name, len, id);
        if (r < 0) return load_fail(L, "out of memory");
        if (r == 0) string_map_set(&tok->by_name, name, len, id);
    }
    for (size_t id = 0; id < n_ids; id++)
        if (tok->token_start[id] == UINT32_MAX)
            return error_set(L->err, "%s: id %zu is neither in model.vocab nor in added_tokens (ids must have no "
                             "holes below the largest, %d)", L->name, id, tok->vocab_size - 1);
    return 0;
}

int tokenizer_load_from_memory(const char *json, size_t json_len, const char *name, tokenizer **out,
                               ds4f_error *err) {
    *out = NULL;
    loader L = {.name = name, .err = err};
    build_codepoint_table(L.cp_table);
    /* cJSON ends strings at an escaped NUL without saying so; no real token contains one. */
    for (size_t i = 0; i + 6 <= json_len; i++) {
        if (json[i] != '\\') continue;
        if (json[i + 1] == 'u' && !memcmp(json + i + 2, "0000", 4))
            return error_set(err, "%s: contains \\u0000 at byte %zu; NUL inside token strings is not supported",
                             name, i);
        i++; /* skip the escaped character: an escaped backslash followed by u0000 is no NUL */
    }
    cJSON *root = cJSON_ParseWithLength(json, json_len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t offset = at && at >= json && at <= json + json_len ? (size_t)(at - json) : 0;
        return error_set(err, "%s: not valid JSON (parser stopped at byte %zu)", name, offset);
    }
    tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) { cJSON_Delete(root); return error_set(err, "%s: out of memory", name); }
    L.tok = tok;
    int rc = -1;
    if (!cJSON_IsObject(root)) load_fail(&L, "top level is not a JSON object");
    else if (load_normalizer(&L, root) == 0 && load_pre_tokenizer(&L, root) == 0 &&
             check_type(&L, get_key(root, "decoder"), "decoder", "ByteLevel") == 0 && load_tables(&L, root) == 0)
        rc = 0;
    cJSON_Delete(root);
    if (rc != 0) { tokenizer_free(tok); return -1; }
    *out = tok;
    return 0;
}

int tokenizer_load(const char *path, tokenizer **out, ds4f_error *err) {
    char *json;
    size_t len;
    *out = NULL;
    if (file_read_all(path, &json, &len, err) != 0) return -1;
    int rc = tokenizer_load_from_memory(json, len, path, out, err);
    free(json);
    return rc;
}

void tokenizer_free(tokenizer *tok) {
    if (!tok) return;
    free(tok->token_start);
    free(tok->token_len);
    free(tok->token_bytes);
    free(tok->names);
    string_map_free(&tok->by_name);
    string_map_free(&tok->bpe_vocab);
    merge_map_free(&tok->merges);
    trie_free(&tok->added_plain);
    trie_free(&tok->added_normalized);
    for (int i = 0; i < tok->n_splits; i++) tokenizer_regex_free(&tok->splits[i]);
    free(tok);
}

/* ---- lookups and decoding ---- */

int32_t tokenizer_vocab_size(const tokenizer *tok) { return tok->vocab_size; }

int32_t tokenizer_token_id(const tokenizer *tok, const char *token) {
    return string_map_get(&tok->by_name, (const uint8_t *)token, strlen(token));
}

const uint8_t *tokenizer_token_bytes(const tokenizer *tok, int32_t id, size_t *len) {
    if (id < 0 || id >= tok->vocab_size) { *len = 0; return NULL; }
    *len = tok->token_len[id];
    return tok->token_bytes + tok->token_start[id];
}

int tokenizer_decode(const tokenizer *tok, const int32_t *ids, size_t n_ids, char **text, size_t *len,
                     ds4f_error *err) {
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= tok->vocab_size)
            return error_set(err, "decode: id %d at index %zu is outside the vocabulary [0, %d)", ids[i], i,
                             tok->vocab_size);
        total += tok->token_len[ids[i]];
    }
    char *out = malloc(total + 1);
    if (!out) return error_set(err, "decode: out of memory for %zu bytes", total);
    size_t pos = 0;
    for (size_t i = 0; i < n_ids; i++) {
        memcpy(out + pos, tok->token_bytes + tok->token_start[ids[i]], tok->token_len[ids[i]]);
        pos += tok->token_len[ids[i]];
    }
    out[pos] = 0;
    *text = out;
    *len = pos;
    return 0;
}

void tokenizer_stream_init(tokenizer_stream *s, const tokenizer *tok) {
    memset(s, 0, sizeof *s);
    s->tok = tok;
}

void tokenizer_stream_free(tokenizer_stream *s) {
    free(s->buf);
    memset(s, 0, sizeof *s);
}

/* Length of the tail of b[0..len) that is an incomplete but still completable UTF-8 character
 * (0 if none): at most 3 bytes, a lead byte followed by fewer continuation bytes than it needs,
 * each within the bounds that well-formed UTF-8 allows at its position. */
static size_t incomplete_tail(const uint8_t *b, size_t len) {
    for (size_t back = 1; back <= 3 && back <= len; back++) {
        uint8_t lead = b[len - back];
        if ((lead & 0xC0) == 0x80) continue;
        size_t need = lead >= 0xC2 && lead < 0xE0 ? 2 : lead >= 0xE0 && lead < 0xF0 ? 3
                      : lead >= 0xF0 && lead < 0xF5 ? 4 : 0;
        if (need <= back) return 0;
        /* Second-byte bounds rule out overlongs, surrogates and code points past U+10FFFF. */
        if (back >= 2) {
            uint8_t second = b[len - back + 1];
            uint8_t lo = lead == 0xE0 ? 0xA0 : lead == 0xF0 ? 0x90 : 0x80;
            uint8_t hi = lead == 0xED ? 0x9F : lead == 0xF4 ? 0x8F : 0xBF;
            if (second < lo || second > hi) return 0;
        }
        return back;
    }
    return 0;
}

int tokenizer_stream_push(tokenizer_stream *s, int32_t id, const char **text, size_t *len, ds4f_error *err) {
    *text = NULL;
    *len = 0;
    if (id < 0 || id >= s->tok->vocab_size)
        return error_set(err, "decode: id %d is outside the vocabulary [0, %d)", id, s->tok->vocab_size);
    size_t n = s->tok->token_len[id];
    size_t total = s->held_len + n;
    if (total > s->buf_cap) {
        size_t cap = total < 64 ? 64 : 2 * total;
        char *buf = realloc(s->buf, cap);
        if (!buf) return error_set(err, "decode: out of memory");
        s->buf = buf;
        s->buf_cap = cap;
    }
    memcpy(s->buf, s->held, s->held_len);
    memcpy(s->buf + s->held_len, s->tok->token_bytes + s->tok->token_start[id], n);
    size_t hold = incomplete_tail((const uint8_t *)s->buf, total);
    memcpy(s->held, s->buf + total - hold, hold);
    s->held_len = hold;
    *text = s->buf;
    *len = total - hold;
    return 0;
}

void tokenizer_stream_flush(tokenizer_stream *s, const char **text, size_t *len) {
    /* The held bytes stay in place until the next push overwrites them. */
    *text = (const char *)s->held;
    *len = s->held_len;
    s->held_len = 0;
}
