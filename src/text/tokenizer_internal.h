/* Private to src/text/tokenizer*.c (and the tokenizer's tests and fuzz harness): the loaded
 * tokenizer's layout and the steps of encoding, so that each can be tested on its own. */
#ifndef DS4F_TEXT_TOKENIZER_INTERNAL_H
#define DS4F_TEXT_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

#define TOKENIZER_MAX_SPLITS 8

/* (left id, right id) -> (rank, merged id); open addressing, keys 0 = empty slot is impossible
 * because the key stores left+1. */
typedef struct merge_slot {
    uint64_t key;
    uint32_t rank;
    int32_t merged_id;
} merge_slot;

typedef struct merge_map {
    merge_slot *slots;
    size_t mask; /* capacity - 1, capacity a power of two */
    size_t count;
} merge_map;

/* Byte string -> id, open addressing. A slot holds 32 bits of the key's hash next to the entry
 * index, so that probing past other keys touches no entry; an entry holds all a lookup needs. */
typedef struct string_entry {
    const uint8_t *key; /* not owned */
    uint32_t len;
    int32_t value;
} string_entry;

typedef struct string_map {
    uint64_t *slots; /* hash high 32 bits << 32 | (entry index + 1); 0 = empty */
    size_t mask;
    string_entry *entries;
    size_t count, cap;
} string_map;

/* Byte trie of added-token contents, for leftmost-longest matching. */
typedef struct trie_node {
    uint32_t first_child; /* 0 = none (node 0 is the root, never a child) */
    uint32_t next_sibling;
    int32_t token_id;     /* -1 if no token ends here */
    uint8_t byte;
} trie_node;

typedef struct added_trie {
    trie_node *nodes;
    size_t count, cap;
    uint32_t root_child[256]; /* direct index for the first byte */
} added_trie;

struct pcre2_real_code_8;
typedef struct regex_split {
    struct pcre2_real_code_8 *code;
    char *onig_pattern;  /* as written in tokenizer.json */
    char *pcre2_pattern; /* after translation */
    bool jit;            /* JIT-compiled: matched with pcre2_jit_match, which skips pcre2_match's checks */
} regex_split;

struct tokenizer {
    int32_t vocab_size;
    /* Decoded bytes of every id: token_bytes[token_start[id] ..][.. token_len[id]]. */
    uint32_t *token_start;
    uint32_t *token_len;
    uint8_t *token_bytes;
    uint8_t *names;          /* every name as written in the file; the keys of by_name */
    string_map by_name;      /* names as written in the file -> id (added tokens win) */
    string_map bpe_vocab;    /* decoded vocabulary bytes -> id; only built for ignore_merges */
    merge_map merges;
    int32_t byte_id[256];    /* the vocabulary id of each single byte */
    bool ignore_merges;
    added_trie added_plain;      /* normalized=false: matched first, in the raw text */
    added_trie added_normalized; /* normalized=true: matched next, in the gaps */
    regex_split splits[TOKENIZER_MAX_SPLITS];
    int n_splits;
};

/* GPT-2 byte-level alphabet: the code point standing for each byte, and the reverse (-1 when a
 * code point stands for no byte). */
uint32_t tokenizer_byte_to_codepoint(uint8_t byte);
int tokenizer_codepoint_to_byte(uint32_t cp);

/* UTF-8: length of the well-formed character at s[0..len) (1..4), or 0 if ill-formed there. */
size_t utf8_valid_char_len(const uint8_t *s, size_t len);

/* Oniguruma pattern (HF tokenizers' regex engine) -> PCRE2 pattern with the same meaning, or an
 * error naming the construct. Only constructs verified to behave the same are accepted. */
int tokenizer_regex_translate(const char *onig, size_t onig_len, char **pcre2_out, ds4f_error *err);
int tokenizer_regex_compile(regex_split *split, const char *onig, size_t onig_len, ds4f_error *err);
void tokenizer_regex_free(regex_split *split);

/* Pre-tokenization of well-formed UTF-8 text (no added tokens inside): calls piece(ctx, p, n) for
 * every final piece, in order. Returns 0, or -1 if a callback or the regex engine failed. */
typedef int (*tokenizer_piece_fn)(void *ctx, const uint8_t *piece, size_t len, ds4f_error *err);
int tokenizer_pretokenize(const tokenizer *tok, const uint8_t *text, size_t len, tokenizer_piece_fn piece,
                          void *ctx, ds4f_error *err);
/* Same, keeping PCRE2's match data in *match between calls (created on first use; free it with
 * tokenizer_match_data_free). */
struct pcre2_real_match_data_8;
int tokenizer_pretokenize_with(const tokenizer *tok, struct pcre2_real_match_data_8 **match, const uint8_t *text,
                               size_t len, tokenizer_piece_fn piece, void *ctx, ds4f_error *err);
void tokenizer_match_data_free(struct pcre2_real_match_data_8 *match);

/* BPE of one piece (bytes) into out (room for len ids); returns the number of ids, 0 only when out
 * of memory (for len > 0). Two algorithms with identical results: a quadratic scan, fastest on
 * short pieces, and a heap for long ones; `algorithm` 0 chooses by length, 2 forces the heap
 * (tests compare them). */
size_t tokenizer_bpe_piece(const tokenizer *tok, const uint8_t *piece, size_t len, int32_t *out, int algorithm);

/* Added-token matching of text into segments: calls segment(ctx, start, end, id) with id -1 for
 * plain text between tokens. */
typedef int (*tokenizer_segment_fn)(void *ctx, size_t start, size_t end, int32_t id, ds4f_error *err);
int tokenizer_split_added(const tokenizer *tok, const uint8_t *text, size_t len, tokenizer_segment_fn segment,
                          void *ctx, ds4f_error *err);

/* Hash maps. */
int string_map_init(string_map *m, size_t expected);
void string_map_free(string_map *m);
/* Returns 1 if inserted, 0 if the key existed (value unchanged), -1 on OOM. Keys are not copied. */
int string_map_put(string_map *m, const uint8_t *key, size_t len, int32_t value);
int32_t string_map_get(const string_map *m, const uint8_t *key, size_t len); /* -1 if absent */
int merge_map_init(merge_map *m, size_t expected);
void merge_map_free(merge_map *m);
int merge_map_put(merge_map *m, int32_t left, int32_t right, uint32_t rank, int32_t merged_id);
const merge_slot *merge_map_get(const merge_map *m, int32_t left, int32_t right);

#endif
