/* Test-only tool for tests/cli/inspect.sh: writes damaged copies of a checkpoint, and header-only
 * (sparse) checkpoints of any config. Built by the test script with the project's own compiler and
 * libraries (no Python needed):
 *
 *   cc -std=c11 -D_GNU_SOURCE -Iinclude -Isrc $(pkg-config --cflags libcjson) \
 *      tests/cli/make_bad_checkpoint.c build/libds4f.a $(pkg-config --libs libcjson) -lm -lpthread
 *
 * Usage:
 *   make_bad_checkpoint SRC DST OP [ARGS...]   copy checkpoint SRC to DST (config.json, every shard,
 *                                              the index), applying one edit:
 *     copy                          none
 *     drop NAME                     remove a tensor from its shard's header and from the index
 *     unindex NAME                  remove a tensor from the index only
 *     dtype NAME DTYPE              change the declared dtype only (offsets unchanged)
 *     shape NAME D0[,D1...]         change the declared shape only (offsets unchanged)
 *     resize NAME DELTA             move the end offset by DELTA bytes (size != dtype x shape)
 *     overlap A B                   move B so that it starts where A starts (B keeps its size)
 *     past-end NAME                 move NAME so that it starts at the end of its shard's data
 *     add NAME DTYPE D0[,D1...]     append a new tensor (zero bytes) to the first shard and index
 *     cut BYTES                     cut the last BYTES bytes off the first shard (truncation)
 *     index-shard NAME FILE         make the index say NAME lives in FILE
 *     total BYTES                   set the index's metadata.total_size
 *     split N                       rewrite as N shards model-0000k-of-0000N.safetensors + index
 *   make_bad_checkpoint --sparse CONFIG DST N  header-faithful checkpoint of CONFIG's complete
 *                                              inventory in N shards with an index; tensor data are
 *                                              holes, so the real 160 GB model takes no disk space
 *                                              (exit status 3, nothing written, where the file
 *                                              system cannot keep holes)
 *
 * The index's metadata.total_size is recomputed from the written headers (except by `total`), so
 * each edit introduces exactly the problem it names. Tensor bytes are not copied: `inspect` reads
 * headers only, so every written shard has its full size but its data is a hole (zeros), which
 * keeps the dozens of variants cheap. Exit status 0 on success, 1 with a message. */
#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file_io.h"
#include "format/config.h"
#include "format/dtype.h"
#include "format/safetensors.h"
#include "model/tensor_list.h"

#define MAX_SHARDS 256

typedef struct {
    char name[256];
    cJSON *header;
    uint64_t data_len; /* bytes after the header */
} shard;

static shard shards[MAX_SHARDS];
static int n_shards;
static cJSON *index_root; /* NULL: single model.safetensors without an index */

static void die(const char *fmt, const char *a) {
    fprintf(stderr, "make_bad_checkpoint: ");
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
    exit(1);
}

static char *read_file(const char *path, size_t *len) {
    char *text;
    ds4f_error err;
    if (file_read_all(path, &text, len, &err)) die("%s", err.msg);
    return text;
}

static void write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) die("cannot write %s", path);
}

static void load_shard(const char *dir, const char *name) {
    for (int i = 0; i < n_shards; i++)
        if (!strcmp(shards[i].name, name)) return;
    if (n_shards == MAX_SHARDS) die("%s", "too many shards");
    char path[4096];
    path_join(path, sizeof path, dir, name);
    FILE *f = fopen(path, "rb");
    struct stat st;
    uint8_t len_bytes[8];
    if (!f || fstat(fileno(f), &st) != 0 || fread(len_bytes, 1, 8, f) != 8) die("cannot read %s", path);
    uint64_t header_len = 0, len = (uint64_t)st.st_size;
    for (int i = 7; i >= 0; i--) header_len = (header_len << 8) | len_bytes[i];
    if (header_len > len - 8 || header_len > (1u << 30)) die("%s: not a safetensors file", path);
    char *text = malloc(header_len + 1);
    if (!text || fread(text, 1, header_len, f) != header_len) die("cannot read %s", path);
    fclose(f);
    shard *s = &shards[n_shards++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->header = cJSON_ParseWithLength(text, header_len);
    free(text);
    if (!cJSON_IsObject(s->header)) die("%s: header is not JSON", path);
    s->data_len = len - 8 - header_len;
}

static void load(const char *dir) {
    char path[4096];
    path_join(path, sizeof path, dir, "model.safetensors.index.json");
    struct stat st;
    if (stat(path, &st) != 0) {
        load_shard(dir, "model.safetensors");
        return;
    }
    char *text = read_file(path, NULL);
    index_root = cJSON_Parse(text);
    free(text);
    cJSON *map = cJSON_GetObjectItemCaseSensitive(index_root, "weight_map");
    if (!cJSON_IsObject(map)) die("%s: no weight_map", path);
    for (cJSON *e = map->child; e; e = e->next) load_shard(dir, e->valuestring);
}

static uint64_t header_total(const shard *s) {
    uint64_t total = 0;
    for (cJSON *e = s->header->child; e; e = e->next) {
        cJSON *o = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (cJSON_IsArray(o))
            total += (uint64_t)(cJSON_GetArrayItem(o, 1)->valuedouble - cJSON_GetArrayItem(o, 0)->valuedouble);
    }
    return total;
}

static void save(const char *dir, int recompute_total) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) die("cannot create %s", dir);
    char path[4096];
    uint64_t total = 0;
    for (int i = 0; i < n_shards; i++) {
        shard *s = &shards[i];
        char *json = cJSON_PrintUnformatted(s->header);
        size_t jl = strlen(json), padded = (jl + 7) & ~(size_t)7;
        uint8_t *out = malloc(8 + padded);
        for (int b = 0; b < 8; b++) out[b] = (uint8_t)((uint64_t)padded >> (8 * b));
        memcpy(out + 8, json, jl);
        memset(out + 8 + jl, ' ', padded - jl);
        path_join(path, sizeof path, dir, s->name);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(out, 1, 8 + padded, f) != 8 + padded || fflush(f) != 0 ||
            ftruncate(fileno(f), (off_t)(8 + padded + s->data_len)) != 0 || fclose(f) != 0)
            die("cannot write %s", path);
        free(out);
        free(json);
        total += header_total(s);
    }
    if (index_root) {
        cJSON *meta = cJSON_GetObjectItemCaseSensitive(index_root, "metadata");
        if (!meta) meta = cJSON_AddObjectToObject(index_root, "metadata");
        if (recompute_total) {
            cJSON_DeleteItemFromObjectCaseSensitive(meta, "total_size");
            cJSON_AddNumberToObject(meta, "total_size", (double)total);
        }
        char *json = cJSON_Print(index_root);
        path_join(path, sizeof path, dir, "model.safetensors.index.json");
        write_file(path, json, strlen(json));
        free(json);
    }
}

static void copy_config(const char *src, const char *dst) {
    char from[4096], to[4096];
    path_join(from, sizeof from, src, "config.json");
    path_join(to, sizeof to, dst, "config.json");
    size_t len;
    char *text = read_file(from, &len);
    write_file(to, text, len);
    free(text);
}

/* The header entry of a tensor, and its shard. */
static cJSON *find(const char *name, shard **where) {
    for (int i = 0; i < n_shards; i++) {
        cJSON *e = cJSON_GetObjectItemCaseSensitive(shards[i].header, name);
        if (e) {
            if (where) *where = &shards[i];
            return e;
        }
    }
    die("no tensor '%s' in the source checkpoint", name);
    return NULL;
}

static double offset_of(cJSON *e, int k) { return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(e, "data_offsets"), k)->valuedouble; }

static void set_offsets(cJSON *e, double begin, double end) {
    cJSON *o = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    cJSON_SetNumberValue(cJSON_GetArrayItem(o, 0), begin);
    cJSON_SetNumberValue(cJSON_GetArrayItem(o, 1), end);
}

static cJSON *shape_array(const char *dims) {
    cJSON *a = cJSON_CreateArray();
    for (const char *p = dims; *p;) {
        char *end;
        long long d = strtoll(p, &end, 10);
        if (end == p) die("bad shape '%s'", dims);
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)d));
        p = *end == ',' ? end + 1 : end;
    }
    return a;
}

static cJSON *index_map(void) {
    cJSON *map = index_root ? cJSON_GetObjectItemCaseSensitive(index_root, "weight_map") : NULL;
    if (!map) die("%s", "this edit needs a checkpoint with an index");
    return map;
}

static void split(int n) {
    if (n_shards != 1 || n < 2 || n > MAX_SHARDS) die("%s", "split needs one source shard and 2..256 parts");
    shard src = shards[0];
    int count = cJSON_GetArraySize(src.header);
    cJSON *map = cJSON_CreateObject();
    if (index_root) cJSON_Delete(index_root);
    index_root = cJSON_CreateObject();
    cJSON_AddObjectToObject(index_root, "metadata");
    cJSON_AddItemToObject(index_root, "weight_map", map);
    for (int k = 0; k < n; k++) {
        shard *s = &shards[k];
        memset(s, 0, sizeof *s);
        snprintf(s->name, sizeof s->name, "model-%05d-of-%05d.safetensors", k + 1, n);
        s->header = cJSON_CreateObject();
    }
    n_shards = n;
    int i = 0;
    for (cJSON *e = src.header->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) continue;
        shard *s = &shards[(long)i++ * n / count];
        double b = offset_of(e, 0), end = offset_of(e, 1);
        cJSON *copy = cJSON_Duplicate(e, 1);
        set_offsets(copy, (double)s->data_len, (double)s->data_len + (end - b));
        s->data_len += (uint64_t)(end - b);
        cJSON_AddItemToObject(s->header, e->string, copy);
        cJSON_AddStringToObject(map, e->string, s->name);
    }
    cJSON_Delete(src.header);
}

/* --sparse: every tensor of the config's inventory, as holes, in n shards of about equal bytes. */
static int sparse(const char *config_path, const char *dir, int n) {
    model_config c;
    tensor_list l;
    ds4f_error err;
    if (config_load(&c, config_path, &err) || tensor_list_build(&c, &l, &err)) die("%s", err.msg);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) die("cannot create %s", dir);
    char path[4096];
    /* Where the file system does not keep holes this would write 160 GB: probe with 64 MiB first. */
    path_join(path, sizeof path, dir, "sparse-probe");
    FILE *probe = fopen(path, "wb");
    struct stat st;
    if (!probe || ftruncate(fileno(probe), 64 << 20) != 0 || fstat(fileno(probe), &st) != 0) die("cannot write %s", path);
    fclose(probe);
    unlink(path);
    if ((uint64_t)st.st_blocks * 512 > (1u << 20)) {
        fprintf(stderr, "make_bad_checkpoint: %s: the file system does not keep holes (sparse files)\n", dir);
        return 3;
    }
    path_join(path, sizeof path, dir, "config.json");
    size_t len;
    char *text = read_file(config_path, &len);
    write_file(path, text, len);
    free(text);

    uint64_t total = 0;
    for (size_t i = 0; i < l.count; i++) total += tensor_spec_bytes(&l.specs[i]);
    st_write_tensor *w = calloc(l.count, sizeof *w);
    cJSON *index = cJSON_CreateObject();
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(index, "metadata"), "total_size", (double)total);
    cJSON *map = cJSON_AddObjectToObject(index, "weight_map");
    static const char *const meta[] = {"format", "pt", NULL};
    size_t first = 0;
    uint64_t done = 0;
    for (int k = 0; k < n; k++) {
        size_t end = first;
        uint64_t target = total / (uint64_t)n * (uint64_t)(k + 1);
        while (end < l.count && (k == n - 1 || done < target)) done += tensor_spec_bytes(&l.specs[end++]);
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, n);
        for (size_t i = first; i < end; i++) {
            const tensor_spec *s = &l.specs[i];
            w[i - first] = (st_write_tensor){.name = s->name, .dtype = s->dtype, .ndim = s->ndim,
                                             .shape = {s->shape[0], s->shape[1]}, .data = NULL};
            cJSON_AddStringToObject(map, s->name, name);
        }
        path_join(path, sizeof path, dir, name);
        if (st_write_file(path, w, end - first, meta, NULL, NULL, NULL, &err)) die("%s", err.msg);
        first = end;
    }
    char *json = cJSON_Print(index);
    path_join(path, sizeof path, dir, "model.safetensors.index.json");
    write_file(path, json, strlen(json));
    free(json);
    cJSON_Delete(index);
    free(w);
    tensor_list_free(&l);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--sparse")) return sparse(argv[2], argv[3], atoi(argv[4]));
    if (argc < 4) die("%s", "usage: make_bad_checkpoint SRC DST OP [ARGS...] | --sparse CONFIG DST N");
    const char *src = argv[1], *dst = argv[2], *op = argv[3];
    char **a = argv + 4;
    int na = argc - 4, recompute = 1;
    load(src);
    shard *s;
    if (!strcmp(op, "copy") && na == 0) {
    } else if (!strcmp(op, "drop") && na == 1) {
        find(a[0], &s);
        cJSON_DeleteItemFromObjectCaseSensitive(s->header, a[0]);
        if (index_root) cJSON_DeleteItemFromObjectCaseSensitive(index_map(), a[0]);
    } else if (!strcmp(op, "unindex") && na == 1) {
        find(a[0], NULL);
        cJSON_DeleteItemFromObjectCaseSensitive(index_map(), a[0]);
    } else if (!strcmp(op, "dtype") && na == 2) {
        cJSON_ReplaceItemInObjectCaseSensitive(find(a[0], NULL), "dtype", cJSON_CreateString(a[1]));
    } else if (!strcmp(op, "shape") && na == 2) {
        cJSON_ReplaceItemInObjectCaseSensitive(find(a[0], NULL), "shape", shape_array(a[1]));
    } else if (!strcmp(op, "resize") && na == 2) {
        cJSON *e = find(a[0], NULL);
        set_offsets(e, offset_of(e, 0), offset_of(e, 1) + atof(a[1]));
    } else if (!strcmp(op, "overlap") && na == 2) {
        cJSON *x = find(a[0], NULL), *y = find(a[1], NULL);
        set_offsets(y, offset_of(x, 0), offset_of(x, 0) + offset_of(y, 1) - offset_of(y, 0));
    } else if (!strcmp(op, "past-end") && na == 1) {
        cJSON *e = find(a[0], &s);
        set_offsets(e, (double)s->data_len, (double)s->data_len + offset_of(e, 1) - offset_of(e, 0));
    } else if (!strcmp(op, "add") && na == 3) {
        s = &shards[0];
        dtype t = dtype_from_name(a[1]);
        if (t == DTYPE_INVALID) die("unknown dtype %s", a[1]);
        cJSON *e = cJSON_AddObjectToObject(s->header, a[0]);
        cJSON_AddStringToObject(e, "dtype", a[1]);
        cJSON *shape = shape_array(a[2]);
        cJSON_AddItemToObject(e, "shape", shape);
        uint64_t bytes = (uint64_t)dtype_size(t);
        for (cJSON *d = shape->child; d; d = d->next) bytes *= (uint64_t)d->valuedouble;
        cJSON *o = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)s->data_len));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(s->data_len + bytes)));
        s->data_len += bytes;
        if (index_root) cJSON_AddStringToObject(index_map(), a[0], s->name);
    } else if (!strcmp(op, "cut") && na == 1) {
        uint64_t cut = (uint64_t)atoll(a[0]);
        if (cut > shards[0].data_len) die("cannot cut %s bytes", a[0]);
        shards[0].data_len -= cut;
    } else if (!strcmp(op, "index-shard") && na == 2) {
        find(a[0], NULL);
        cJSON_ReplaceItemInObjectCaseSensitive(index_map(), a[0], cJSON_CreateString(a[1]));
    } else if (!strcmp(op, "total") && na == 1) {
        cJSON *meta = cJSON_GetObjectItemCaseSensitive(index_root, "metadata");
        if (!meta) die("%s", "the index has no metadata");
        cJSON_ReplaceItemInObjectCaseSensitive(meta, "total_size", cJSON_CreateNumber(atof(a[0])));
        recompute = 0;
    } else if (!strcmp(op, "split") && na == 1) {
        split(atoi(a[0]));
    } else {
        die("unknown edit or wrong arguments: %s", op);
    }
    save(dst, recompute);
    copy_config(src, dst);
    return 0;
}
