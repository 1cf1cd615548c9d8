/* A checkpoint directory bound to the model description: config.json, the safetensors shards
 * (through model.safetensors.index.json, or a single model.safetensors), and for each tensor of
 * the expected inventory the shard and extent that hold it. Opening reads headers only.
 *
 * Binding refuses (invariant 5): a missing tensor, an unexpected extra tensor, a wrong dtype or
 * shape, a truncated shard, offsets that overlap or run past the file, an index that disagrees
 * with the shards. Every problem is collected (so `inspect` can list them all); the error message
 * names the first. */
#ifndef DS4F_MODEL_CHECKPOINT_H
#define DS4F_MODEL_CHECKPOINT_H

#include "format/config.h"
#include "format/safetensors.h"
#include "model/tensor_list.h"

#define CHECKPOINT_MAX_PROBLEMS_KEPT 64

typedef struct checkpoint {
    char *dir;
    model_config config;
    st_file *shards;
    size_t n_shards;
    tensor_list expected;
    const st_tensor **bound; /* parallel to expected.specs */
    int *bound_shard;        /* parallel to expected.specs */
    str_map expected_by_name;
    /* Problems found while binding (also on success they are empty). */
    char *problems[CHECKPOINT_MAX_PROBLEMS_KEPT];
    size_t n_problems_kept, n_problems;
} checkpoint;

int checkpoint_open(checkpoint *ck, const char *dir, ds4f_error *err);
void checkpoint_close(checkpoint *ck);
/* Index into expected.specs of a tensor name, or -1. */
long checkpoint_find(const checkpoint *ck, const char *name);
/* Reads a bound tensor fully into dst (spec bytes). */
int checkpoint_read(const checkpoint *ck, size_t index, void *dst, ds4f_error *err);

/* model.safetensors.index.json: the shard file of each tensor (parsed from text, so that it can be
 * fuzzed alone; checkpoint_open uses it). Refuses anything but an object with a "weight_map"
 * object of plain shard file names (no directories), a tensor listed twice, and a
 * metadata.total_size that is not a non-negative integer. Strings point into `json`. */
typedef struct checkpoint_index {
    size_t count;
    const char **tensors; /* weight_map keys, in file order */
    const char **shards;  /* the shard file name of each */
    str_map by_name;      /* tensor name -> position + 1 */
    int has_total_size;
    uint64_t total_size;
    void *json;           /* the parsed document (cJSON) */
} checkpoint_index;

int checkpoint_index_parse(checkpoint_index *ix, const char *text, size_t len, const char *path, ds4f_error *err);
void checkpoint_index_free(checkpoint_index *ix);
/* The shard file name the index gives for a tensor, or NULL. */
const char *checkpoint_index_shard(const checkpoint_index *ix, const char *tensor);

typedef struct inventory {
    size_t tensors;
    uint64_t bytes;
    uint64_t bytes_by_dtype[16];
    size_t tensors_by_dtype[16];
    uint64_t routed_expert_bytes;
    uint64_t routed_expert_bytes_main; /* without the MTP block's experts */
    size_t routed_experts;
    uint64_t expert_bytes_each;
} inventory;

void checkpoint_inventory(const checkpoint *ck, inventory *inv);

#endif
