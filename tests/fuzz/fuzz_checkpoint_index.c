/* libFuzzer harness for model.safetensors.index.json (checkpoint_index_parse). Not part of
 * `make test`.
 *
 * Build with `make fuzz` (clang's libFuzzer: apt-get install clang libclang-rt-14-dev), then run
 * from the repository root:
 *
 *   mkdir -p build/fuzz/corpus/checkpoint_index
 *   build/fuzz/fuzz_checkpoint_index -max_len=8192 -max_total_time=600 -jobs=1 \
 *     -dict=tests/fuzz/corpus/checkpoint_index.dict build/fuzz/corpus/checkpoint_index tests/fuzz/corpus/checkpoint_index
 *
 * Input: the index text (any bytes, embedded NULs included: the parser takes a length).
 * Properties (any failure aborts): a refusal leaves a non-empty message and a zeroed index; an
 * accepted index lists every tensor once, with a plain shard file name (no directory, not "." or
 * ".."), found again by name; a name it does not list is not found. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/checkpoint.h"

#define PROPERTY(cond)                                                                 \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "property failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                   \
        }                                                                              \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A private copy without a terminating NUL, so that reading past `size` is caught. */
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    memcpy(text, data, size);
    checkpoint_index ix;
    ds4f_error err = {{0}};
    if (checkpoint_index_parse(&ix, text, size, "fuzz.index.json", &err) == 0) {
        PROPERTY(ix.json != NULL);
        PROPERTY(!ix.has_total_size || ix.total_size <= (1ull << 53));
        for (size_t i = 0; i < ix.count; i++) {
            const char *shard = ix.shards[i];
            PROPERTY(ix.tensors[i] && shard && shard[0]);
            PROPERTY(!strchr(shard, '/') && strcmp(shard, ".") && strcmp(shard, ".."));
            PROPERTY(checkpoint_index_shard(&ix, ix.tensors[i]) == shard);
        }
        /* A name longer than any listed one cannot be listed. */
        size_t longest = 0;
        for (size_t i = 0; i < ix.count; i++)
            if (strlen(ix.tensors[i]) > longest) longest = strlen(ix.tensors[i]);
        char *absent = malloc(longest + 2);
        PROPERTY(absent);
        memset(absent, 'x', longest + 1);
        absent[longest + 1] = 0;
        PROPERTY(checkpoint_index_shard(&ix, absent) == NULL);
        free(absent);
        checkpoint_index_free(&ix);
        PROPERTY(ix.json == NULL && ix.count == 0);
    } else {
        PROPERTY(err.msg[0] != 0 && memchr(err.msg, 0, sizeof err.msg));
        PROPERTY(ix.json == NULL && ix.count == 0 && ix.tensors == NULL);
    }
    free(text);
    return 0;
}
