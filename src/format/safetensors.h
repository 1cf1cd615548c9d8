/* safetensors files: header parsing (no tensor data is read) and a streaming writer.
 *
 * Layout: u64 little-endian header length N, N bytes of JSON
 * {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the
 * raw little-endian data; offsets are relative to the end of the header. The reader trusts
 * nothing: sizes are checked against the dtype and shape, every extent against the file size, and
 * extents may not overlap. */
#ifndef DS4F_FORMAT_SAFETENSORS_H
#define DS4F_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "base/str_map.h"
#include "format/dtype.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER_BYTES (100u * 1024u * 1024u)

typedef struct st_tensor {
    char *name;
    dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t offset; /* absolute file offset of the first byte */
    uint64_t bytes;
} st_tensor;

typedef struct st_file {
    char *path;
    int fd;
    uint64_t file_bytes;
    uint64_t data_offset; /* 8 + header length */
    st_tensor *tensors;
    size_t n_tensors;
    str_map by_name;
    char **metadata; /* key, value, key, value, ..., NULL */
} st_file;

int st_open(st_file *f, const char *path, ds4f_error *err);
/* Parses a header held in memory (used by st_open and by the fuzzer). file_bytes bounds the
 * extents; fd is left -1. */
int st_parse(st_file *f, const char *path, const uint8_t *bytes, size_t n_bytes, uint64_t file_bytes,
             ds4f_error *err);
void st_close(st_file *f);
const st_tensor *st_find(const st_file *f, const char *name);
const char *st_metadata(const st_file *f, const char *key);
/* Reads a whole tensor into dst (st->bytes bytes). */
int st_read(const st_file *f, const st_tensor *t, void *dst, ds4f_error *err);
uint64_t st_element_count(const st_tensor *t);
/* "[2048, 4096]" */
void st_shape_string(const int64_t *shape, int ndim, char *out, size_t out_size);

/* Writer: tensors are written in the given order; data either from `data` or produced in chunks
 * of whole first-dimension rows by `fill` (so multi-GB tensors never sit in memory at once). A
 * tensor with no data and no fill function is left as a hole (sparse file). */
typedef struct st_write_tensor {
    const char *name;
    dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;
} st_write_tensor;

typedef int (*st_fill_fn)(void *ctx, size_t tensor_index, int64_t first_row, int64_t n_rows, void *dst,
                          ds4f_error *err);
typedef void (*st_progress_fn)(void *ctx, uint64_t bytes_written);

/* metadata: NULL or key, value, ..., NULL. Written to path via a temporary file + rename. */
int st_write_file(const char *path, const st_write_tensor *tensors, size_t n, const char *const *metadata,
                  st_fill_fn fill, void *fill_ctx, st_progress_fn progress, ds4f_error *err);

#endif
