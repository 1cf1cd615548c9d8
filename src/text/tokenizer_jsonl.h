/* JSON lines for `ds4f tokenize` (and the tokenizer's tests): one JSON string per line in, one
 * JSON array of ids per line out, or the reverse with decode.
 *
 * The JSON readers are our own rather than cJSON's because tokenizer text may contain "\u0000",
 * which cJSON silently truncates. They accept exactly RFC 8259's grammar for strings and
 * non-negative integers; a lone UTF-16 surrogate escape is refused (no UTF-8 spelling). */
#ifndef DS4F_TEXT_TOKENIZER_JSONL_H
#define DS4F_TEXT_TOKENIZER_JSONL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "text/tokenizer.h"

/* Skips JSON whitespace from pos; returns the new position. */
size_t tokenizer_json_skip_space(const char *s, size_t len, size_t pos);
/* Expects character c (after whitespace) and steps over it. */
int tokenizer_json_expect(const char *s, size_t len, size_t *pos, char c, ds4f_error *err);
/* Parses a JSON string (after whitespace) into malloc'd bytes (*out, NUL-terminated, may contain
 * NUL); *pos moves past the closing quote. Errors give the 1-based column. */
int tokenizer_json_parse_string(const char *s, size_t len, size_t *pos, char **out, size_t *out_len,
                                ds4f_error *err);
/* Parses a JSON array of non-negative integers below 2^31 into a malloc'd array. */
int tokenizer_json_parse_ids(const char *s, size_t len, size_t *pos, int32_t **ids, size_t *n_ids,
                             ds4f_error *err);
/* Writes bytes as a JSON string. Ill-formed UTF-8 (possible when decoding arbitrary ids) becomes
 * U+FFFD, one per maximal ill-formed subsequence, as HF's decode (Rust from_utf8_lossy) does. */
int tokenizer_json_write_string(FILE *out, const char *bytes, size_t len);

/* Reads lines from in until EOF and writes one result line per input line. Stops at the first bad
 * line with an error "line N, column C: what was expected". flags: TOKENIZER_* for encoding. */
int tokenizer_jsonl_run(const tokenizer *tok, FILE *in, FILE *out, bool decode, unsigned flags, ds4f_error *err);

#endif
