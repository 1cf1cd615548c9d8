#include "model/checkpoint.h"
#include "base/file_io.h"

#include <cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void problem(checkpoint *ck, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(checkpoint *ck, const char *fmt, ...) {
    ck->n_problems++;
    if (ck->n_problems_kept == CHECKPOINT_MAX_PROBLEMS_KEPT) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ck->problems[ck->n_problems_kept++] = strdup(buf);
}

static int fail_with_problems(checkpoint *ck, ds4f_error *err) {
    if (ck->n_problems == 1) error_set(err, "%s: %s", ck->dir, ck->problems[0]);
    else error_set(err, "%s: %zu problems, the first: %s", ck->dir, ck->n_problems, ck->problems[0]);
    return -1;
}

/* Shard names come from the index file: accept plain file names only. */
static int safe_file_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

int checkpoint_index_parse(checkpoint_index *ix, const char *text, size_t len, const char *path, ds4f_error *err) {
    memset(ix, 0, sizeof *ix);
    str_map_init(&ix->by_name);
    cJSON *root = cJSON_ParseWithLength(text, len);
    ix->json = root;
    const cJSON *map = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(map)) {
        checkpoint_index_free(ix);
        return error_set(err, "%s: not a JSON object with a \"weight_map\" object", path);
    }
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    const cJSON *total = cJSON_IsObject(meta) ? cJSON_GetObjectItemCaseSensitive(meta, "total_size") : NULL;
    if (meta && !cJSON_IsObject(meta)) {
        checkpoint_index_free(ix);
        return error_set(err, "%s: \"metadata\" must be an object", path);
    }
    if (total) {
        /* An exact non-negative integer below 2^53 (the JSON number is a double). */
        double v = cJSON_IsNumber(total) ? total->valuedouble : -1;
        if (!(v >= 0 && v <= 9007199254740992.0) || v != (double)(uint64_t)v) {
            checkpoint_index_free(ix);
            return error_set(err, "%s: metadata.total_size must be a non-negative integer", path);
        }
        ix->total_size = (uint64_t)v;
        ix->has_total_size = 1;
    }
    size_t n = (size_t)cJSON_GetArraySize(map);
    ix->tensors = calloc(n ? n : 1, sizeof *ix->tensors);
    ix->shards = calloc(n ? n : 1, sizeof *ix->shards);
    if (!ix->tensors || !ix->shards) { checkpoint_index_free(ix); return error_set(err, "out of memory"); }
    for (const cJSON *e = map->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !safe_file_name(e->valuestring)) {
            error_set(err, "%s: weight_map entry '%s' must name a shard file in the same directory", path, e->string);
            checkpoint_index_free(ix);
            return -1;
        }
        int put = str_map_put(&ix->by_name, e->string, (void *)(uintptr_t)(ix->count + 1));
        if (put != 0) {
            if (put > 0) error_set(err, "%s: weight_map lists tensor '%s' more than once", path, e->string);
            else error_set(err, "out of memory");
            checkpoint_index_free(ix);
            return -1;
        }
        ix->tensors[ix->count] = e->string;
        ix->shards[ix->count] = e->valuestring;
        ix->count++;
    }
    return 0;
}

void checkpoint_index_free(checkpoint_index *ix) {
    free(ix->tensors);
    free(ix->shards);
    str_map_free(&ix->by_name);
    cJSON_Delete(ix->json);
    memset(ix, 0, sizeof *ix);
}

const char *checkpoint_index_shard(const checkpoint_index *ix, const char *tensor) {
    uintptr_t v = (uintptr_t)str_map_get(&ix->by_name, tensor);
    return v ? ix->shards[v - 1] : NULL;
}

static int open_shard(checkpoint *ck, const char *name, ds4f_error *err) {
    for (size_t i = 0; i < ck->n_shards; i++)
        if (!strcmp(strrchr(ck->shards[i].path, '/') + 1, name)) return (int)i;
    st_file *grown = realloc(ck->shards, (ck->n_shards + 1) * sizeof *grown);
    if (!grown) return error_set(err, "out of memory");
    ck->shards = grown;
    char path[4096];
    path_join(path, sizeof path, ck->dir, name);
    if (st_open(&ck->shards[ck->n_shards], path, err) != 0) return -1;
    return (int)ck->n_shards++;
}

/* Reads the index and opens every shard it names; checks that the index and the shards agree. */
static int open_shards(checkpoint *ck, ds4f_error *err) {
    char path[4096];
    path_join(path, sizeof path, ck->dir, "model.safetensors.index.json");
    if (access(path, F_OK) != 0) {
        char single[4096];
        path_join(single, sizeof single, ck->dir, "model.safetensors");
        if (access(single, F_OK) != 0)
            return error_set(err, "%s has neither model.safetensors.index.json nor model.safetensors", ck->dir);
        return open_shard(ck, "model.safetensors", err) < 0 ? -1 : 0;
    }
    char *text;
    size_t len;
    if (file_read_all(path, &text, &len, err)) return -1;
    checkpoint_index ix;
    int rc = checkpoint_index_parse(&ix, text, len, path, err);
    free(text);
    if (rc != 0) return -1;
    for (size_t k = 0; k < ix.count; k++) {
        int s = open_shard(ck, ix.shards[k], err);
        if (s < 0) {
            /* A shard that is not there: say who named it. Any other failure names the shard. */
            char shard_path[4096];
            path_join(shard_path, sizeof shard_path, ck->dir, ix.shards[k]);
            if (access(shard_path, F_OK) != 0)
                error_prefix(err, "%s names shard %s for tensor '%s'", path, ix.shards[k], ix.tensors[k]);
            rc = -1;
            break;
        }
        if (!st_find(&ck->shards[s], ix.tensors[k]))
            problem(ck, "index lists tensor '%s' in %s, but that shard does not contain it", ix.tensors[k], ix.shards[k]);
    }
    if (rc == 0) {
        uint64_t shard_total = 0;
        for (size_t s = 0; s < ck->n_shards; s++) {
            const char *shard_name = strrchr(ck->shards[s].path, '/') + 1;
            for (size_t i = 0; i < ck->shards[s].n_tensors; i++) {
                const st_tensor *t = &ck->shards[s].tensors[i];
                shard_total += t->bytes;
                const char *where = checkpoint_index_shard(&ix, t->name);
                if (!where || strcmp(where, shard_name))
                    problem(ck, "tensor '%s' in %s is not listed there by the index", t->name, shard_name);
            }
        }
        if (ix.has_total_size && ix.total_size != shard_total)
            problem(ck, "index metadata.total_size is %llu bytes but the shards' tensors hold %llu",
                    (unsigned long long)ix.total_size, (unsigned long long)shard_total);
    }
    checkpoint_index_free(&ix);
    return rc;
}

static void describe(char *out, size_t n, dtype t, const int64_t *shape, int ndim) {
    char s[128];
    st_shape_string(shape, ndim, s, sizeof s);
    snprintf(out, n, "%s %s", dtype_name(t), s);
}

int checkpoint_open(checkpoint *ck, const char *dir, ds4f_error *err) {
    memset(ck, 0, sizeof *ck);
    str_map_init(&ck->expected_by_name);
    ck->dir = strdup(dir);
    char path[4096];
    path_join(path, sizeof path, dir, "config.json");
    if (config_load(&ck->config, path, err) != 0) goto fail;
    if (tensor_list_build(&ck->config, &ck->expected, err) != 0) goto fail;
    if (open_shards(ck, err) != 0) goto fail;

    size_t n = ck->expected.count;
    ck->bound = calloc(n, sizeof *ck->bound);
    ck->bound_shard = calloc(n, sizeof *ck->bound_shard);
    if (!ck->bound || !ck->bound_shard) { error_set(err, "out of memory"); goto fail; }
    for (size_t i = 0; i < n; i++) {
        const tensor_spec *spec = &ck->expected.specs[i];
        if (str_map_put(&ck->expected_by_name, spec->name, (void *)(uintptr_t)(i + 1)) < 0) { error_set(err, "out of memory"); goto fail; }
        const st_tensor *found = NULL;
        int shard = -1;
        for (size_t s = 0; s < ck->n_shards && !found; s++)
            if ((found = st_find(&ck->shards[s], spec->name))) shard = (int)s;
        char want[160], got[160];
        describe(want, sizeof want, spec->dtype, spec->shape, spec->ndim);
        if (!found) {
            problem(ck, "missing tensor '%s' (expected %s)", spec->name, want);
            continue;
        }
        int same = found->dtype == spec->dtype && found->ndim == spec->ndim;
        for (int d = 0; same && d < spec->ndim; d++) same = found->shape[d] == spec->shape[d];
        if (!same) {
            describe(got, sizeof got, found->dtype, found->shape, found->ndim);
            problem(ck, "tensor '%s': expected %s, found %s in %s", spec->name, want, got,
                    strrchr(ck->shards[shard].path, '/') + 1);
            continue;
        }
        ck->bound[i] = found;
        ck->bound_shard[i] = shard;
    }
    for (size_t s = 0; s < ck->n_shards; s++)
        for (size_t i = 0; i < ck->shards[s].n_tensors; i++) {
            const st_tensor *t = &ck->shards[s].tensors[i];
            if (!str_map_get(&ck->expected_by_name, t->name)) {
                char got[160];
                describe(got, sizeof got, t->dtype, t->shape, t->ndim);
                problem(ck, "unexpected tensor '%s' (%s) in %s: not part of this config's model", t->name, got,
                        strrchr(ck->shards[s].path, '/') + 1);
            }
        }
    if (ck->n_problems) {
        fail_with_problems(ck, err);
        return -1; /* problems stay available to the caller; checkpoint_close frees them */
    }
    return 0;
fail:
    return -1;
}

void checkpoint_close(checkpoint *ck) {
    for (size_t s = 0; s < ck->n_shards; s++) st_close(&ck->shards[s]);
    free(ck->shards);
    tensor_list_free(&ck->expected);
    free(ck->bound);
    free(ck->bound_shard);
    str_map_free(&ck->expected_by_name);
    for (size_t i = 0; i < ck->n_problems_kept; i++) free(ck->problems[i]);
    free(ck->dir);
    memset(ck, 0, sizeof *ck);
}

long checkpoint_find(const checkpoint *ck, const char *name) {
    uintptr_t v = (uintptr_t)str_map_get(&ck->expected_by_name, name);
    return v ? (long)(v - 1) : -1;
}

int checkpoint_read(const checkpoint *ck, size_t index, void *dst, ds4f_error *err) {
    if (!ck->bound[index]) return error_set(err, "tensor '%s' is not bound", ck->expected.specs[index].name);
    return st_read(&ck->shards[ck->bound_shard[index]], ck->bound[index], dst, err);
}

void checkpoint_inventory(const checkpoint *ck, inventory *inv) {
    memset(inv, 0, sizeof *inv);
    for (size_t i = 0; i < ck->expected.count; i++) {
        const tensor_spec *s = &ck->expected.specs[i];
        uint64_t b = tensor_spec_bytes(s);
        inv->tensors++;
        inv->bytes += b;
        inv->bytes_by_dtype[s->dtype] += b;
        inv->tensors_by_dtype[s->dtype]++;
        if (s->expert >= 0) {
            inv->routed_expert_bytes += b;
            if (s->block < ck->config.num_hidden_layers) inv->routed_expert_bytes_main += b;
            if (s->part == EXPERT_W1_WEIGHT) inv->routed_experts++;
        }
    }
    inv->expert_bytes_each = inv->routed_experts ? inv->routed_expert_bytes / inv->routed_experts : 0;
}
