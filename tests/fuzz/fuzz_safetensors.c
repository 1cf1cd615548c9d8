/* libFuzzer harness for the safetensors header parser (st_parse): arbitrary bytes, as a whole file
 * or as header JSON with a chosen file size. Not part of `make test`.
 *
 * Build with `make fuzz` (clang's libFuzzer: apt-get install clang libclang-rt-14-dev), then run
 * from the repository root:
 *
 *   mkdir -p build/fuzz/corpus/safetensors
 *   build/fuzz/fuzz_safetensors -max_len=8192 -max_total_time=600 -jobs=1 \
 *     -dict=tests/fuzz/corpus/safetensors.dict build/fuzz/corpus/safetensors tests/fuzz/corpus/safetensors
 *
 * Input: byte 0 bit 0 clear: the rest is a whole file (file size = its length). Bit 0 set: bytes
 * 1..8 are a little-endian u64 added to the header length to give the file size, the rest is the
 * header JSON (the length prefix is made here, so the fuzzer works on JSON rather than on the
 * prefix).
 *
 * Properties of every accepted header (any failure aborts):
 *  - each tensor: a known dtype, at most ST_MAX_DIMS non-negative dimensions, bytes = elements x
 *    dtype size, extent inside [data_offset, file size], found by name;
 *  - no two tensors share a byte;
 *  - metadata is key/value pairs;
 *  - the verdict does not depend on the order of the entries: the tensors written back as a
 *    canonical header in reverse order parse to the same table.
 * A refused header must leave a non-empty message and a closed (zeroed) st_file. */
#include <cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/safetensors.h"

#define PROPERTY(cond)                                                                 \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "property failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                   \
        }                                                                              \
    } while (0)

static void check_refused(const st_file *f, const ds4f_error *err) {
    PROPERTY(err->msg[0] != 0);
    PROPERTY(memchr(err->msg, 0, sizeof err->msg) != NULL);
    PROPERTY(f->tensors == NULL && f->n_tensors == 0 && f->path == NULL && f->metadata == NULL && f->fd == -1);
}

static int compare_extent(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->bytes < y->bytes ? -1 : x->bytes > y->bytes;
}

static void check_accepted(const st_file *f, uint64_t file_bytes) {
    PROPERTY(f->file_bytes == file_bytes);
    PROPERTY(f->data_offset >= 8 && f->data_offset <= file_bytes);
    PROPERTY(f->fd == -1);
    const st_tensor **order = malloc((f->n_tensors + 1) * sizeof *order);
    PROPERTY(order);
    for (size_t i = 0; i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        PROPERTY(t->name && dtype_size(t->dtype) > 0);
        PROPERTY(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS);
        for (int d = 0; d < t->ndim; d++) PROPERTY(t->shape[d] >= 0);
        PROPERTY(t->bytes == st_element_count(t) * (uint64_t)dtype_size(t->dtype));
        PROPERTY(t->offset >= f->data_offset && t->offset <= file_bytes && t->bytes <= file_bytes - t->offset);
        PROPERTY(st_find(f, t->name) == t);
        char s[64];
        st_shape_string(t->shape, t->ndim, s, sizeof s); /* must not overrun a short buffer */
        PROPERTY(memchr(s, 0, sizeof s));
        order[i] = t;
    }
    qsort(order, f->n_tensors, sizeof *order, compare_extent);
    const st_tensor *last = NULL; /* the non-empty extent that ends last so far */
    for (size_t i = 0; i < f->n_tensors; i++) {
        if (!order[i]->bytes) continue;
        PROPERTY(!last || order[i]->offset >= last->offset + last->bytes);
        last = order[i];
    }
    free(order);
    size_t n_meta = 0;
    for (char **m = f->metadata; m && *m; m++) n_meta++;
    PROPERTY(n_meta % 2 == 0);
    for (size_t i = 0; i < n_meta; i += 2) PROPERTY(st_metadata(f, f->metadata[i]) != NULL);
}

/* The parsed table as a canonical header, tensors in reverse order, metadata last. */
static char *canonical_reversed(const st_file *f) {
    cJSON *root = cJSON_CreateObject();
    for (size_t k = f->n_tensors; k-- > 0;) {
        const st_tensor *t = &f->tensors[k];
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        cJSON_AddStringToObject(e, "dtype", dtype_name(t->dtype));
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *o = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(t->offset - f->data_offset)));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(t->offset - f->data_offset + t->bytes)));
    }
    if (f->metadata && f->metadata[0]) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        for (char **m = f->metadata; *m; m += 2) cJSON_AddStringToObject(meta, m[0], m[1]);
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return json;
}

static void check_reordered(const st_file *f) {
    char *json = canonical_reversed(f);
    PROPERTY(json);
    size_t n = strlen(json);
    /* Same data area: pad the new header to the old header's length when it fits. */
    uint64_t old_header = f->data_offset - 8;
    size_t header = n <= old_header ? (size_t)old_header : n;
    uint8_t *buf = malloc(8 + header);
    PROPERTY(buf);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)header >> (8 * i));
    memcpy(buf + 8, json, n);
    memset(buf + 8 + n, ' ', header - n);
    free(json);
    if (header != old_header) { free(buf); return; } /* canonical form is longer: offsets would move */
    st_file g;
    ds4f_error err = {{0}};
    int rc = st_parse(&g, "reordered", buf, 8 + header, f->file_bytes, &err);
    if (rc != 0) fprintf(stderr, "reordered header refused: %s\n", err.msg);
    PROPERTY(rc == 0);
    PROPERTY(g.n_tensors == f->n_tensors);
    for (size_t i = 0; i < f->n_tensors; i++) {
        const st_tensor *a = &f->tensors[i], *b = st_find(&g, a->name);
        PROPERTY(b && b->dtype == a->dtype && b->ndim == a->ndim && b->offset == a->offset && b->bytes == a->bytes);
        PROPERTY(!memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]));
    }
    for (char **m = f->metadata; m && *m; m += 2) {
        const char *v = st_metadata(&g, m[0]);
        PROPERTY(v && !strcmp(v, st_metadata(f, m[0])));
    }
    st_close(&g);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t *bytes;
    size_t n;
    uint64_t file_bytes;
    uint8_t *owned = NULL;
    if (!(data[0] & 1)) {
        bytes = data + 1;
        n = size - 1;
        file_bytes = n;
    } else {
        if (size < 9) return 0;
        uint64_t slack = 0;
        for (int i = 8; i >= 1; i--) slack = (slack << 8) | data[i];
        size_t json_len = size - 9;
        owned = malloc(8 + json_len);
        if (!owned) return 0;
        for (int i = 0; i < 8; i++) owned[i] = (uint8_t)((uint64_t)json_len >> (8 * i));
        memcpy(owned + 8, data + 9, json_len);
        bytes = owned;
        n = 8 + json_len;
        file_bytes = slack > UINT64_MAX - n ? UINT64_MAX : n + slack;
    }
    st_file f;
    ds4f_error err = {{0}};
    if (st_parse(&f, "fuzz.safetensors", bytes, n, file_bytes, &err) == 0) {
        check_accepted(&f, file_bytes);
        check_reordered(&f);
        st_close(&f);
    } else {
        check_refused(&f, &err);
    }
    free(owned);
    return 0;
}
