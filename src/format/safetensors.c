#include "format/safetensors.h"
#include "base/file_io.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

uint64_t st_element_count(const st_tensor *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

void st_shape_string(const int64_t *shape, int ndim, char *out, size_t out_size) {
    size_t used = 0;
    used += (size_t)snprintf(out + used, out_size - used, "[");
    for (int i = 0; i < ndim && used < out_size; i++)
        used += (size_t)snprintf(out + used, out_size - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < out_size) snprintf(out + used, out_size - used, "]");
}

/* JSON numbers arrive as doubles: accept only exact non-negative integers below 2^53. */
static int json_uint(const cJSON *item, uint64_t *out) {
    if (!cJSON_IsNumber(item)) return -1;
    double v = item->valuedouble;
    if (!(v >= 0) || v > 9007199254740992.0 || v != (double)(uint64_t)v) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int compare_offsets(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : 0;
}

static int parse_tensor(st_tensor *t, const cJSON *entry, uint64_t data_offset, uint64_t file_bytes,
                        const char *path, ds4f_error *err) {
    const char *name = entry->string;
    if (!cJSON_IsObject(entry)) return error_set(err, "%s: header entry '%s' is not an object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    if (!cJSON_IsString(dt)) return error_set(err, "%s: tensor '%s' has no dtype string", path, name);
    t->dtype = dtype_from_name(dt->valuestring);
    if (t->dtype == DTYPE_INVALID)
        return error_set(err, "%s: tensor '%s' has unknown dtype '%s'", path, name, dt->valuestring);
    if (!cJSON_IsArray(shape)) return error_set(err, "%s: tensor '%s' has no shape array", path, name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > ST_MAX_DIMS) return error_set(err, "%s: tensor '%s' has %d dimensions (at most %d)", path, name, ndim, ST_MAX_DIMS);
    t->ndim = ndim;
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        uint64_t d;
        if (json_uint(cJSON_GetArrayItem(shape, i), &d) != 0 || d > (1ull << 40))
            return error_set(err, "%s: tensor '%s' has an invalid shape entry %d", path, name, i);
        t->shape[i] = (int64_t)d;
        if (d && count > UINT64_MAX / d / 8) return error_set(err, "%s: tensor '%s' shape overflows", path, name);
        count *= d;
    }
    uint64_t begin, end;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || json_uint(cJSON_GetArrayItem(offs, 0), &begin) != 0 ||
        json_uint(cJSON_GetArrayItem(offs, 1), &end) != 0)
        return error_set(err, "%s: tensor '%s' has invalid data_offsets (want [begin, end])", path, name);
    if (end < begin) return error_set(err, "%s: tensor '%s' has data_offsets end %llu before begin %llu", path, name,
                                      (unsigned long long)end, (unsigned long long)begin);
    uint64_t want = count * (uint64_t)dtype_size(t->dtype);
    if (end - begin != want) {
        char s[128];
        st_shape_string(t->shape, ndim, s, sizeof s);
        return error_set(err, "%s: tensor '%s' (%s %s) should hold %llu bytes but data_offsets [%llu, %llu] span %llu",
                         path, name, dt->valuestring, s, (unsigned long long)want, (unsigned long long)begin,
                         (unsigned long long)end, (unsigned long long)(end - begin));
    }
    if (data_offset + end > file_bytes)
        return error_set(err, "%s: tensor '%s' ends at file offset %llu but the file has only %llu bytes (truncated?)",
                         path, name, (unsigned long long)(data_offset + end), (unsigned long long)file_bytes);
    t->offset = data_offset + begin;
    t->bytes = want;
    return 0;
}

int st_parse(st_file *f, const char *path, const uint8_t *bytes, size_t n_bytes, uint64_t file_bytes,
             ds4f_error *err) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    str_map_init(&f->by_name);
    f->path = strdup(path);
    if (!f->path) return error_set(err, "out of memory");
    if (n_bytes < 8 || file_bytes < 8) { st_close(f); return error_set(err, "%s: too short to be a safetensors file (%llu bytes)", path, (unsigned long long)file_bytes); }
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--) header_len = (header_len << 8) | bytes[i];
    if (header_len > ST_MAX_HEADER_BYTES || header_len > file_bytes - 8 || header_len > n_bytes - 8) {
        st_close(f);
        return error_set(err, "%s: header length %llu does not fit the file (%llu bytes)", path,
                         (unsigned long long)header_len, (unsigned long long)file_bytes);
    }
    f->file_bytes = file_bytes;
    f->data_offset = 8 + header_len;
    const char *json = (const char *)bytes + 8, *json_end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)header_len, &json_end, 0);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        st_close(f);
        return error_set(err, "%s: header is not a JSON object", path);
    }
    /* Writers pad the header with spaces; anything else after the object is not a header. */
    for (const char *p = json_end; p < json + header_len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            st_close(f);
            return error_set(err, "%s: header has bytes after its JSON object (at header byte %llu)", path,
                             (unsigned long long)(p - json));
        }
    size_t n = 0, n_meta = 0;
    int seen_meta = 0;
    for (cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            if (!cJSON_IsObject(e) || seen_meta++) goto bad_meta;
            for (cJSON *m = e->child; m; m = m->next) {
                if (!cJSON_IsString(m)) goto bad_meta;
                n_meta++;
            }
        } else {
            n++;
        }
    }
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    f->metadata = calloc(2 * n_meta + 1, sizeof *f->metadata);
    if (!f->tensors || !f->metadata) { cJSON_Delete(root); st_close(f); return error_set(err, "out of memory"); }
    for (cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            size_t k = 0;
            for (cJSON *m = e->child; m; m = m->next) {
                f->metadata[k++] = strdup(m->string);
                f->metadata[k++] = strdup(m->valuestring);
                if (!f->metadata[k - 2] || !f->metadata[k - 1]) { cJSON_Delete(root); st_close(f); return error_set(err, "out of memory"); }
            }
            continue;
        }
        st_tensor *t = &f->tensors[f->n_tensors];
        if (parse_tensor(t, e, f->data_offset, file_bytes, path, err) != 0) { cJSON_Delete(root); st_close(f); return -1; }
        t->name = strdup(e->string);
        if (!t->name) { cJSON_Delete(root); st_close(f); return error_set(err, "out of memory"); }
        f->n_tensors++;
        int r = str_map_put(&f->by_name, t->name, t);
        if (r != 0) {
            cJSON_Delete(root);
            if (r > 0) error_set(err, "%s: tensor '%s' appears twice in the header", path, t->name);
            else error_set(err, "out of memory");
            st_close(f);
            return -1;
        }
    }
    cJSON_Delete(root);
    /* Two tensors may not share bytes: a header whose offsets overlap is lying about something.
     * Empty tensors hold no bytes, so they overlap nothing (whatever their order in the header). In
     * begin order, with no overlap so far, the last non-empty extent is the one that ends last. */
    st_tensor **order = malloc((f->n_tensors ? f->n_tensors : 1) * sizeof *order);
    if (!order) { st_close(f); return error_set(err, "out of memory"); }
    size_t n_order = 0;
    for (size_t i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].bytes) order[n_order++] = &f->tensors[i];
    qsort(order, n_order, sizeof *order, compare_offsets);
    for (size_t i = 1; i < n_order; i++) {
        if (order[i]->offset < order[i - 1]->offset + order[i - 1]->bytes) {
            error_set(err, "%s: tensors '%s' and '%s' overlap (data offsets %llu and %llu)", path, order[i - 1]->name,
                      order[i]->name, (unsigned long long)(order[i - 1]->offset - f->data_offset),
                      (unsigned long long)(order[i]->offset - f->data_offset));
            free(order);
            st_close(f);
            return -1;
        }
    }
    free(order);
    return 0;
bad_meta:
    cJSON_Delete(root);
    st_close(f);
    return error_set(err, "%s: __metadata__ must be one object of strings", path);
}

int st_open(st_file *f, const char *path, ds4f_error *err) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return error_set(err, "%s: cannot open: %s", path, strerror(errno));
    uint64_t size;
    if (file_size(fd, &size, path, err) != 0) { close(fd); return -1; }
    uint8_t len_bytes[8];
    if (size < 8) { close(fd); return error_set(err, "%s: too short to be a safetensors file (%llu bytes)", path, (unsigned long long)size); }
    if (file_pread_exact(fd, len_bytes, 8, 0, path, err) != 0) { close(fd); return -1; }
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--) header_len = (header_len << 8) | len_bytes[i];
    if (header_len > ST_MAX_HEADER_BYTES || header_len > size - 8) {
        close(fd);
        return error_set(err, "%s: header length %llu does not fit the file (%llu bytes)", path,
                         (unsigned long long)header_len, (unsigned long long)size);
    }
    uint8_t *buf = malloc(8 + header_len);
    if (!buf) { close(fd); return error_set(err, "out of memory"); }
    if (file_pread_exact(fd, buf, 8 + header_len, 0, path, err) != 0) { free(buf); close(fd); return -1; }
    int r = st_parse(f, path, buf, 8 + header_len, size, err);
    free(buf);
    if (r != 0) { close(fd); return -1; }
    f->fd = fd;
    return 0;
}

void st_close(st_file *f) {
    if (f->fd >= 0) close(f->fd);
    for (size_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    if (f->metadata)
        for (char **m = f->metadata; *m; m++) free(*m);
    free(f->metadata);
    str_map_free(&f->by_name);
    free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

const st_tensor *st_find(const st_file *f, const char *name) { return str_map_get(&f->by_name, name); }

const char *st_metadata(const st_file *f, const char *key) {
    if (!f->metadata) return NULL;
    for (char **m = f->metadata; m[0]; m += 2)
        if (!strcmp(m[0], key)) return m[1];
    return NULL;
}

int st_read(const st_file *f, const st_tensor *t, void *dst, ds4f_error *err) {
    if (file_pread_exact(f->fd, dst, t->bytes, t->offset, f->path, err) != 0)
        return error_prefix(err, "reading tensor '%s'", t->name);
    return 0;
}

/* ---- writer ---- */

static uint64_t write_tensor_bytes(const st_write_tensor *t) {
    uint64_t n = (uint64_t)dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

int st_write_file(const char *path, const st_write_tensor *tensors, size_t n, const char *const *metadata,
                  st_fill_fn fill, void *fill_ctx, st_progress_fn progress, ds4f_error *err) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return error_set(err, "out of memory");
    if (metadata && metadata[0]) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        for (const char *const *m = metadata; m[0]; m += 2) cJSON_AddStringToObject(meta, m[0], m[1]);
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(root, tensors[i].name);
        cJSON_AddStringToObject(e, "dtype", dtype_name(tensors[i].dtype));
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < tensors[i].ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)tensors[i].shape[d]));
        uint64_t bytes = write_tensor_bytes(&tensors[i]);
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(offset + bytes)));
        offset += bytes;
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) return error_set(err, "out of memory");
    size_t json_len = strlen(json);
    size_t padded = (json_len + 7) & ~(size_t)7; /* data starts 8-byte aligned, as safetensors does */

    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { free(json); return error_set(err, "%s: cannot create: %s", tmp, strerror(errno)); }
    uint8_t len_bytes[8];
    for (int i = 0; i < 8; i++) len_bytes[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int rc = file_write_exact(fd, len_bytes, 8, tmp, err);
    if (rc == 0) rc = file_write_exact(fd, json, json_len, tmp, err);
    for (size_t i = json_len; rc == 0 && i < padded; i++) rc = file_write_exact(fd, " ", 1, tmp, err);
    free(json);

    const size_t chunk_target = 64u << 20;
    uint8_t *chunk = NULL;
    uint64_t written = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const st_write_tensor *t = &tensors[i];
        uint64_t bytes = write_tensor_bytes(t);
        if (t->data) {
            rc = file_write_exact(fd, t->data, bytes, tmp, err);
            written += bytes;
            if (progress) progress(fill_ctx, written);
            continue;
        }
        if (!fill) {
            /* No data source: leave a hole (sparse file). Used to build header-faithful checkpoints
             * of the real size for inventory tests without writing 160 GB. */
            if (lseek(fd, (off_t)bytes, SEEK_CUR) < 0) rc = error_set(err, "%s: seek failed: %s", tmp, strerror(errno));
            written += bytes;
            continue;
        }
        int64_t rows = t->ndim ? t->shape[0] : 1;
        uint64_t row_bytes = rows ? bytes / (uint64_t)rows : 0;
        int64_t rows_per_chunk = row_bytes ? (int64_t)(chunk_target / row_bytes) : 1;
        if (rows_per_chunk < 1) rows_per_chunk = 1;
        if (!chunk) chunk = malloc(chunk_target > row_bytes ? chunk_target : row_bytes);
        if (!chunk) { rc = error_set(err, "out of memory"); break; }
        for (int64_t r = 0; rc == 0 && r < rows; r += rows_per_chunk) {
            int64_t nr = rows - r < rows_per_chunk ? rows - r : rows_per_chunk;
            rc = fill(fill_ctx, i, r, nr, chunk, err);
            if (rc == 0) rc = file_write_exact(fd, chunk, (size_t)nr * row_bytes, tmp, err);
            written += (uint64_t)nr * row_bytes;
            if (progress) progress(fill_ctx, written);
        }
    }
    free(chunk);
    if (rc == 0 && ftruncate(fd, (off_t)(8 + padded + offset)) != 0)
        rc = error_set(err, "%s: cannot set the file size: %s", tmp, strerror(errno));
    if (close(fd) != 0 && rc == 0) rc = error_set(err, "%s: close failed: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0) rc = error_set(err, "%s: rename failed: %s", path, strerror(errno));
    if (rc != 0) unlink(tmp);
    return rc;
}
