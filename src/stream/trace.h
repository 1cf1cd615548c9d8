/* Expert traces: which experts each token was routed to in each block, in execution order.
 *
 * Text, one line per (token, block):   REQ POS TOKEN BLOCK E1 .. EK   (ascending expert ids)
 * after a header line:                  # ds4f-trace 1 blocks=B experts=E k=K hash_layers=H main_blocks=M expert_bytes=N
 * REQ numbers the cache requests: the lines of one chunk's tokens in one block share it (the
 * engine asks for their distinct experts at once), so replay sees the requests the engine made. */
#ifndef DS4F_STREAM_TRACE_H
#define DS4F_STREAM_TRACE_H

#include <stdint.h>
#include <stdio.h>

#include "base/error.h"

typedef struct trace_header {
    int blocks, experts, k, hash_layers, main_blocks;
    uint64_t expert_bytes;
} trace_header;

typedef struct stream_trace {
    FILE *file;
    char *path;
    trace_header header;
    int failed;          /* a write failed: reported once at close */
} stream_trace;

int trace_create(stream_trace *t, const char *path, const trace_header *h, ds4f_error *err);
void trace_record(stream_trace *t, uint64_t request, int64_t pos, int32_t token, int block, const int32_t *ids, int k);
int trace_close(stream_trace *t, ds4f_error *err);

typedef struct trace_line {
    uint64_t request;
    int64_t pos;
    int32_t token;
    int32_t block;
    int32_t first;       /* index of its experts in trace_data.experts */
} trace_line;

typedef struct trace_data {
    trace_header header;
    trace_line *lines;
    size_t n_lines;
    int32_t *experts;    /* [n_lines][k] */
} trace_data;

/* Refuses a malformed file with its line number. */
int trace_load(const char *path, trace_data *out, ds4f_error *err);
void trace_free(trace_data *t);

#endif
