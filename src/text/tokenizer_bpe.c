/* Encoding: added-token matching, then per piece of the pre-tokenizer the BPE merge loop, with a
 * per-call cache of finished pieces (ordinary text repeats its words a lot). */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_internal.h"

/* ---- BPE on one piece ---- */

#define NO_MERGE UINT32_MAX
/* Up to this many bytes the quadratic scan beats the heap (measured on English and code). */
#define SCAN_MAX_SYMBOLS 48

static inline uint32_t pair_rank(const tokenizer *tok, int32_t left, int32_t right, int32_t *merged) {
    const merge_slot *m = merge_map_get(&tok->merges, left, right);
    if (!m) return NO_MERGE;
    *merged = m->merged_id;
    return m->rank;
}

/* Repeatedly merges the adjacent pair of lowest rank (the leftmost one on ties), keeping each
 * pair's rank cached so that a merge only looks up its two new neighbours. */
static size_t bpe_scan(const tokenizer *tok, int32_t *ids, size_t n) {
    uint32_t rank[SCAN_MAX_SYMBOLS];
    int32_t merged[SCAN_MAX_SYMBOLS];
    for (size_t i = 0; i + 1 < n; i++) rank[i] = pair_rank(tok, ids[i], ids[i + 1], &merged[i]);
    while (n > 1) {
        uint32_t best = NO_MERGE;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++)
            if (rank[i] < best) { best = rank[i]; at = i; }
        if (best == NO_MERGE) break;
        ids[at] = merged[at];
        /* Drop symbol at+1 and pair at+1 (whose left symbol is gone). */
        memmove(ids + at + 1, ids + at + 2, (n - at - 2) * sizeof *ids);
        if (at + 3 < n) {
            memmove(rank + at + 1, rank + at + 2, (n - at - 3) * sizeof *rank);
            memmove(merged + at + 1, merged + at + 2, (n - at - 3) * sizeof *merged);
        }
        n--;
        if (at + 1 < n) rank[at] = pair_rank(tok, ids[at], ids[at + 1], &merged[at]);
        if (at > 0) rank[at - 1] = pair_rank(tok, ids[at - 1], ids[at], &merged[at - 1]);
    }
    return n;
}

typedef struct heap_entry {
    uint32_t rank;
    uint32_t pos;   /* original index of the left symbol: ties go to the leftmost, as in HF */
    int32_t left, right;
} heap_entry;

static inline int heap_less(const heap_entry *a, const heap_entry *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(heap_entry *h, size_t *n, heap_entry e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_less(&e, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = e;
}

static heap_entry heap_pop(heap_entry *h, size_t *n) {
    heap_entry top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= *n) break;
        if (child + 1 < *n && heap_less(&h[child + 1], &h[child])) child++;
        if (!heap_less(&h[child], &last)) break;
        h[i] = h[child];
        i = child;
    }
    if (*n) h[i] = last;
    return top;
}

/* Same result as bpe_scan in O(n log n) for long pieces (long runs of spaces or punctuation):
 * symbols form a linked list; a popped pair is stale unless both symbols still hold the ids it
 * was made from (a symbol's id only ever grows into a longer token, so ids identify the state). */
static size_t bpe_heap(const tokenizer *tok, int32_t *ids, size_t n) {
    int32_t *next = malloc(n * sizeof *next), *prev = malloc(n * sizeof *prev);
    /* n - 1 initial pairs, and each of at most n - 1 merges pushes at most two. */
    heap_entry *heap = malloc(3 * n * sizeof *heap);
    if (!next || !prev || !heap) {
        free(next); free(prev); free(heap);
        return 0;
    }
    size_t heap_n = 0;
    for (size_t i = 0; i < n; i++) {
        next[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        prev[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        int32_t m;
        uint32_t r = pair_rank(tok, ids[i], ids[i + 1], &m);
        if (r != NO_MERGE) heap_push(heap, &heap_n, (heap_entry){r, (uint32_t)i, ids[i], ids[i + 1]});
    }
    while (heap_n) {
        heap_entry e = heap_pop(heap, &heap_n);
        int32_t right = next[e.pos];
        if (ids[e.pos] != e.left || right < 0 || ids[right] != e.right) continue;
        int32_t merged = -1;
        pair_rank(tok, e.left, e.right, &merged);
        ids[e.pos] = merged;
        ids[right] = -1;
        next[e.pos] = next[right];
        if (next[right] >= 0) prev[next[right]] = (int32_t)e.pos;
        int32_t m;
        if (prev[e.pos] >= 0) {
            int32_t p = prev[e.pos];
            uint32_t r = pair_rank(tok, ids[p], ids[e.pos], &m);
            if (r != NO_MERGE) heap_push(heap, &heap_n, (heap_entry){r, (uint32_t)p, ids[p], ids[e.pos]});
        }
        if (next[e.pos] >= 0) {
            int32_t q = next[e.pos];
            uint32_t r = pair_rank(tok, ids[e.pos], ids[q], &m);
            if (r != NO_MERGE) heap_push(heap, &heap_n, (heap_entry){r, e.pos, ids[e.pos], ids[q]});
        }
    }
    size_t out = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) ids[out++] = ids[i];
    free(next); free(prev); free(heap);
    return out;
}

size_t tokenizer_bpe_piece(const tokenizer *tok, const uint8_t *piece, size_t len, int32_t *out, int algorithm) {
    if (len == 0) return 0;
    if (tok->ignore_merges) {
        int32_t whole = string_map_get(&tok->bpe_vocab, piece, len);
        if (whole >= 0) { out[0] = whole; return 1; }
    }
    for (size_t i = 0; i < len; i++) out[i] = tok->byte_id[piece[i]];
    if (len <= SCAN_MAX_SYMBOLS && algorithm != 2) return bpe_scan(tok, out, len);
    return bpe_heap(tok, out, len);
}

/* ---- added tokens ---- */

/* Leftmost-longest matching of one trie over text[start..end), like HF's aho-corasick matcher
 * with MatchKind::LeftmostLongest; text between matches is passed on with id -1. */
static int match_trie(const added_trie *trie, const uint8_t *text, size_t start, size_t end,
                      tokenizer_segment_fn segment, void *ctx, ds4f_error *err) {
    size_t plain_from = start;
    if (trie->count) {
        for (size_t i = start; i < end;) {
            uint32_t node = trie->root_child[text[i]];
            int32_t best_id = -1;
            size_t best_end = 0;
            for (size_t j = i + 1; node; j++) {
                if (trie->nodes[node].token_id >= 0) { best_id = trie->nodes[node].token_id; best_end = j; }
                if (j >= end) break;
                uint32_t child = trie->nodes[node].first_child;
                while (child && trie->nodes[child].byte != text[j]) child = trie->nodes[child].next_sibling;
                node = child;
            }
            if (best_id < 0) { i++; continue; }
            if (i > plain_from && segment(ctx, plain_from, i, -1, err) != 0) return -1;
            if (segment(ctx, i, best_end, best_id, err) != 0) return -1;
            i = plain_from = best_end;
        }
    }
    if (end > plain_from && segment(ctx, plain_from, end, -1, err) != 0) return -1;
    return 0;
}

typedef struct second_pass {
    const tokenizer *tok;
    const uint8_t *text;
    tokenizer_segment_fn segment;
    void *ctx;
} second_pass;

static int match_normalized(void *ctx, size_t start, size_t end, int32_t id, ds4f_error *err) {
    second_pass *s = ctx;
    if (id >= 0) return s->segment(s->ctx, start, end, id, err);
    return match_trie(&s->tok->added_normalized, s->text, start, end, s->segment, s->ctx, err);
}

/* HF's order: normalized=false tokens over the raw text, then normalized=true tokens in the gaps
 * (after normalization, which is the identity here). A normalized=true token therefore never
 * wins over an overlapping normalized=false one, even if it starts earlier. */
int tokenizer_split_added(const tokenizer *tok, const uint8_t *text, size_t len, tokenizer_segment_fn segment,
                          void *ctx, ds4f_error *err) {
    second_pass s = {.tok = tok, .text = text, .segment = segment, .ctx = ctx};
    return match_trie(&tok->added_plain, text, 0, len, match_normalized, &s, err);
}

/* ---- encoding ---- */

/* Finished pieces of the current call: bytes -> ids. Entries refer to arenas by offset, so the
 * arenas can grow. Long pieces are rarely repeated and are not cached. */
#define CACHE_MAX_PIECE_BYTES 256
#define CACHE_MAX_ENTRIES (1u << 20)
#define CACHE_MAX_KEY_BYTES (16u << 20)

typedef struct cache_entry {
    uint64_t hash;
    uint32_t key_off, key_len;
    uint32_t ids_off, ids_len;
} cache_entry;

typedef struct encoder {
    const tokenizer *tok;
    struct pcre2_real_match_data_8 *match; /* reused by every pre-tokenizer call */
    const uint8_t *text;
    int32_t *ids;
    size_t n_ids, cap_ids;
    int32_t *scratch;          /* BPE output of one piece */
    size_t scratch_cap;
    cache_entry *slots;        /* open addressing; key_len 0 = empty */
    size_t mask, used;
    uint8_t *keys;
    size_t keys_len, keys_cap;
    int32_t *cached_ids;
    size_t cached_len, cached_cap;
} encoder;

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t cap2 = *cap ? *cap : 256;
    while (cap2 < need) cap2 *= 2;
    void *q = realloc(*p, cap2 * elem);
    if (!q) return -1;
    *p = q;
    *cap = cap2;
    return 0;
}

static int emit(encoder *E, const int32_t *ids, size_t n) {
    if (grow((void **)&E->ids, &E->cap_ids, E->n_ids + n, sizeof *E->ids) != 0) return -1;
    memcpy(E->ids + E->n_ids, ids, n * sizeof *ids);
    E->n_ids += n;
    return 0;
}

static uint64_t piece_hash(const uint8_t *p, size_t len) {
    uint64_t h = 0xCBF29CE484222325ull ^ len;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001B3ull;
        h ^= h >> 31;
    }
    uint64_t w = 0;
    memcpy(&w, p + i, len - i);
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

static cache_entry *cache_find(encoder *E, const uint8_t *p, size_t len, uint64_t h) {
    size_t i = h & E->mask;
    for (;;) {
        cache_entry *e = &E->slots[i];
        if (!e->key_len) return e;
        if (e->hash == h && e->key_len == len && !memcmp(E->keys + e->key_off, p, len)) return e;
        i = (i + 1) & E->mask;
    }
}

static int cache_grow_table(encoder *E) {
    /* Starts small: prompt-sized calls are common and must not pay for clearing a big table. */
    size_t cap = E->slots ? (E->mask + 1) * 2 : 64;
    cache_entry *slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; E->slots && i <= E->mask; i++) {
        if (!E->slots[i].key_len) continue;
        size_t j = E->slots[i].hash & (cap - 1);
        while (slots[j].key_len) j = (j + 1) & (cap - 1);
        slots[j] = E->slots[i];
    }
    free(E->slots);
    E->slots = slots;
    E->mask = cap - 1;
    return 0;
}

static int encode_piece(void *ctx, const uint8_t *p, size_t len, ds4f_error *err) {
    encoder *E = ctx;
    if (len == 1) return emit(E, &E->tok->byte_id[p[0]], 1) == 0 ? 0 : error_set(err, "encode: out of memory");
    bool cacheable = len <= CACHE_MAX_PIECE_BYTES && E->used < CACHE_MAX_ENTRIES && E->keys_len < CACHE_MAX_KEY_BYTES;
    uint64_t h = 0;
    if (cacheable) {
        if (!E->slots && cache_grow_table(E) != 0) return error_set(err, "encode: out of memory");
        h = piece_hash(p, len);
        cache_entry *e = cache_find(E, p, len, h);
        if (e->key_len)
            return emit(E, E->cached_ids + e->ids_off, e->ids_len) == 0 ? 0 : error_set(err, "encode: out of memory");
    }
    if (grow((void **)&E->scratch, &E->scratch_cap, len, sizeof *E->scratch) != 0)
        return error_set(err, "encode: out of memory");
    size_t n = tokenizer_bpe_piece(E->tok, p, len, E->scratch, 0);
    if (n == 0 || emit(E, E->scratch, n) != 0) return error_set(err, "encode: out of memory");
    if (!cacheable) return 0;
    if ((E->used + 1) * 2 > E->mask + 1 && cache_grow_table(E) != 0) return error_set(err, "encode: out of memory");
    if (grow((void **)&E->keys, &E->keys_cap, E->keys_len + len, 1) != 0 ||
        grow((void **)&E->cached_ids, &E->cached_cap, E->cached_len + n, sizeof *E->cached_ids) != 0)
        return error_set(err, "encode: out of memory");
    cache_entry *e = cache_find(E, p, len, h);
    *e = (cache_entry){h, (uint32_t)E->keys_len, (uint32_t)len, (uint32_t)E->cached_len, (uint32_t)n};
    memcpy(E->keys + E->keys_len, p, len);
    memcpy(E->cached_ids + E->cached_len, E->scratch, n * sizeof *E->scratch);
    E->keys_len += len;
    E->cached_len += n;
    E->used++;
    return 0;
}

/* Plain text: well-formed UTF-8 runs go through the pre-tokenizer; each maximal run of bytes that
 * are not well-formed UTF-8 is one piece of its own (the regex engines take only valid UTF-8). */
static int encode_plain(encoder *E, const uint8_t *text, size_t len, ds4f_error *err) {
    size_t i = 0;
    while (i < len) {
        size_t valid_end = i;
        for (;;) {
            while (valid_end < len && text[valid_end] < 0x80) valid_end++;
            if (valid_end >= len) break;
            size_t n = utf8_valid_char_len(text + valid_end, len - valid_end);
            if (!n) break;
            valid_end += n;
        }
        if (valid_end > i &&
            tokenizer_pretokenize_with(E->tok, &E->match, text + i, valid_end - i, encode_piece, E, err) != 0)
            return -1;
        size_t bad_end = valid_end;
        while (bad_end < len && utf8_valid_char_len(text + bad_end, len - bad_end) == 0) bad_end++;
        if (bad_end > valid_end && encode_piece(E, text + valid_end, bad_end - valid_end, err) != 0) return -1;
        i = bad_end;
    }
    return 0;
}

static int encode_segment(void *ctx, size_t start, size_t end, int32_t id, ds4f_error *err) {
    encoder *E = ctx;
    if (id >= 0) return emit(E, &id, 1) == 0 ? 0 : error_set(err, "encode: out of memory");
    return encode_plain(E, E->text + start, end - start, err);
}

int tokenizer_encode_flags(const tokenizer *tok, const char *text, size_t len, unsigned flags, int32_t **ids,
                           size_t *n_ids, ds4f_error *err) {
    encoder E = {.tok = tok, .text = (const uint8_t *)text};
    *ids = NULL;
    *n_ids = 0;
    int rc = (flags & TOKENIZER_PLAIN_TEXT) ? encode_plain(&E, E.text, len, err)
                                            : tokenizer_split_added(tok, E.text, len, encode_segment, &E, err);
    tokenizer_match_data_free(E.match);
    free(E.scratch);
    free(E.slots);
    free(E.keys);
    free(E.cached_ids);
    if (rc != 0) { free(E.ids); return -1; }
    *ids = E.ids;
    *n_ids = E.n_ids;
    return 0;
}

int tokenizer_encode(const tokenizer *tok, const char *text, size_t len, int32_t **ids, size_t *n_ids,
                     ds4f_error *err) {
    return tokenizer_encode_flags(tok, text, len, 0, ids, n_ids, err);
}
