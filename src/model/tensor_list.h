/* The complete tensor inventory a config implies (spec §2.3): every name, dtype and shape the
 * official checkpoint holds, in a fixed order (globals, then each block, then MTP). Used by the
 * binder (missing / extra / mismatched tensors), by `inspect`, and by `synth` (which writes
 * exactly this list). For the real config it has 69,187 entries and 159,609,485,896 bytes. */
#ifndef DS4F_MODEL_TENSOR_LIST_H
#define DS4F_MODEL_TENSOR_LIST_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "format/config.h"
#include "format/dtype.h"

typedef enum {
    EXPERT_PART_NONE = -1,
    EXPERT_W1_WEIGHT = 0, /* gate_proj, packed FP4 [inter, d/2] */
    EXPERT_W1_SCALE,      /* E8M0 [inter, d/32] */
    EXPERT_W3_WEIGHT,     /* up_proj */
    EXPERT_W3_SCALE,
    EXPERT_W2_WEIGHT,     /* down_proj, [d, inter/2] */
    EXPERT_W2_SCALE,
    EXPERT_PARTS
} expert_part;

typedef struct tensor_spec {
    char name[96];
    dtype dtype;
    int ndim;
    int64_t shape[2];
    int block;        /* -1 for globals; blocks num_hidden_layers.. are MTP blocks */
    int expert;       /* routed expert id, or -1 */
    expert_part part; /* which of the six routed-expert tensors, or EXPERT_PART_NONE */
} tensor_spec;

typedef struct tensor_list {
    tensor_spec *specs;
    size_t count;
} tensor_list;

int tensor_list_build(const model_config *c, tensor_list *out, ds4f_error *err);
void tensor_list_free(tensor_list *l);
uint64_t tensor_spec_bytes(const tensor_spec *s);
/* "layers.N." for main blocks, "mtp.J." for MTP blocks. */
void block_prefix(const model_config *c, int block, char *out, size_t out_size);

#endif
