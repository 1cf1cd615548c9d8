/* Tokenizer: byte-level BPE loaded from a checkpoint's tokenizer.json, giving exactly the ids of
 * Hugging Face `tokenizers` (`encode(text, add_special_tokens=False)`).
 *
 * Encoding, in HF's order:
 *   1. added tokens (tokenizer.json `added_tokens`) are found in the raw text, leftmost-longest,
 *      first those with normalized=false, then those with normalized=true in the gaps, and each
 *      becomes its own id;
 *   2. the text between them is pre-tokenized by the file's `Split(Regex, Isolated)` steps
 *      (Oniguruma semantics, run on PCRE2 after a checked translation), then byte-level mapped;
 *   3. each piece is BPE-merged (lowest merge rank first, leftmost on ties).
 * Input need not be valid UTF-8 (HF cannot take such text, so the behaviour is ours): every
 * maximal run of bytes that is not well-formed UTF-8 is a piece of its own, cut off from its
 * neighbours like an added token, and BPE-merged on its bytes. Because byte-level BPE covers all
 * 256 bytes, decode(encode(x)) == x for every byte string x (given added tokens that decode to
 * their own content, as all of DeepSeek's do: HF decodes an added token made only of byte-level
 * alphabet characters, say "Ġx", to the bytes they stand for, " x", and so do we).
 *
 * A loaded tokenizer is immutable: any number of threads may encode and decode with it at once.
 * Special-token ids come from the file (synthetic checkpoints have small vocabularies): look them
 * up with tokenizer_token_id, never hard-code them. */
#ifndef DS4F_TEXT_TOKENIZER_H
#define DS4F_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "base/error.h"

typedef struct tokenizer tokenizer;

/* Loads tokenizer.json. Refuses (with the file name and the offending key) anything this engine
 * would not reproduce exactly: another model type, normalizer, pre-tokenizer or decoder, regex
 * constructs whose meaning differs between Oniguruma and PCRE2, merges naming unknown tokens. */
int tokenizer_load(const char *path, tokenizer **out, ds4f_error *err);
/* Same, from a tokenizer.json already in memory; `name` is used in error messages. */
int tokenizer_load_from_memory(const char *json, size_t json_len, const char *name, tokenizer **out,
                               ds4f_error *err);
void tokenizer_free(tokenizer *tok);

/* Number of ids: one more than the largest id of the vocabulary or the added tokens (129280 for
 * DeepSeek-V4-Flash). Every id below it decodes (the loader refuses a file with holes). */
int32_t tokenizer_vocab_size(const tokenizer *tok);
/* The id of a token given as it is written in tokenizer.json: an added token's content
 * ("<｜end▁of▁sentence｜>") or a vocabulary string in its byte-level form ("Ġthe"); -1 if absent. */
int32_t tokenizer_token_id(const tokenizer *tok, const char *token);
/* The bytes an id decodes to (not NUL-terminated), or NULL when id is out of range. */
const uint8_t *tokenizer_token_bytes(const tokenizer *tok, int32_t id, size_t *len);

enum {
    /* Do not match added tokens: the whole text is plain text, so "<｜User｜>" typed by a user
     * becomes ordinary BPE pieces instead of the control token. Chat front ends use it for
     * message contents. (HF's `split_special_tokens` skips only tokens marked special; this skips
     * every added token, because the special flags of the published file are not reliable.) */
    TOKENIZER_PLAIN_TEXT = 1u << 0,
};

/* Encodes text[0..len) into a malloc'd id array (*ids, *n_ids; *ids may be NULL when *n_ids is 0).
 * tokenizer_encode matches added tokens (HF's default); tokenizer_encode_flags takes
 * TOKENIZER_* flags. Fails only on memory exhaustion or a regex engine failure. */
int tokenizer_encode(const tokenizer *tok, const char *text, size_t len, int32_t **ids, size_t *n_ids,
                     ds4f_error *err);
int tokenizer_encode_flags(const tokenizer *tok, const char *text, size_t len, unsigned flags,
                           int32_t **ids, size_t *n_ids, ds4f_error *err);

/* Decodes ids into a malloc'd byte string (*text, *len; also NUL-terminated for convenience, but
 * it may contain NUL bytes and, for arbitrary id sequences, ill-formed UTF-8). An id outside
 * [0, vocab_size) is an error naming its index. */
int tokenizer_decode(const tokenizer *tok, const int32_t *ids, size_t n_ids, char **text, size_t *len,
                     ds4f_error *err);

/* Streaming decoder for generation: push one id at a time and print what comes back. It never
 * splits a well-formed UTF-8 character: an incomplete character at the end is held back until the
 * next tokens complete it. Bytes that can no longer become a well-formed character are passed on
 * unchanged, so the concatenation of all outputs (flush included) equals tokenizer_decode. */
typedef struct tokenizer_stream {
    const tokenizer *tok;
    uint8_t held[4];      /* start of an incomplete trailing character */
    size_t held_len;
    char *buf;            /* output of the last push/flush, owned by the stream */
    size_t buf_cap;
} tokenizer_stream;

void tokenizer_stream_init(tokenizer_stream *s, const tokenizer *tok);
/* Sets *text and *len to the bytes that are ready (possibly none); valid until the next call. */
int tokenizer_stream_push(tokenizer_stream *s, int32_t id, const char **text, size_t *len, ds4f_error *err);
/* End of the sequence: returns whatever is still held (an unfinished character, as raw bytes). */
void tokenizer_stream_flush(tokenizer_stream *s, const char **text, size_t *len);
void tokenizer_stream_free(tokenizer_stream *s);

#endif
