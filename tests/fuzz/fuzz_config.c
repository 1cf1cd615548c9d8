/* libFuzzer harness for config.json validation (config_parse) and the tensor inventory it implies
 * (tensor_list_build). Not part of `make test`.
 *
 * Build with `make fuzz` (clang's libFuzzer: apt-get install clang libclang-rt-14-dev), then run
 * from the repository root (the seeds are the real and the golden configs):
 *
 *   mkdir -p build/fuzz/corpus/config
 *   build/fuzz/fuzz_config -max_len=8192 -max_total_time=600 -jobs=1 \
 *     -dict=tests/fuzz/corpus/config.dict build/fuzz/corpus/config tests/fuzz/corpus/config
 *
 * Input: the config text (any bytes; a NUL ends it, as for a file read with file_read_all).
 * Properties (any failure aborts): a refusal leaves a non-empty message; an accepted config holds
 * every constraint config.h documents; when its inventory is small enough to build here, every
 * tensor has a unique name, positive dimensions, and a byte size that does not overflow. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/str_map.h"
#include "format/config.h"
#include "model/tensor_list.h"

#define PROPERTY(cond)                                                                 \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "property failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                   \
        }                                                                              \
    } while (0)

static void check_config(const model_config *c) {
    PROPERTY(c->num_hidden_layers >= 1 && config_total_blocks(c) <= CONFIG_MAX_LAYERS);
    PROPERTY(c->num_nextn_predict_layers == 0 || c->num_nextn_predict_layers == 1);
    for (int i = 0; i < config_total_blocks(c); i++) {
        int r = c->compress_ratios[i];
        PROPERTY(r == 0 || r == 4 || r == 128);
        if (i >= c->num_hidden_layers) PROPERTY(r == 0);
    }
    PROPERTY(c->hidden_size > 0 && c->hidden_size % 128 == 0);
    PROPERTY(c->q_lora_rank > 0 && c->q_lora_rank % 128 == 0);
    PROPERTY(c->moe_intermediate_size > 0 && c->moe_intermediate_size % 128 == 0);
    PROPERTY(c->qk_rope_head_dim > 0 && c->qk_rope_head_dim % 2 == 0 && c->qk_rope_head_dim < c->head_dim);
    PROPERTY((c->head_dim - c->qk_rope_head_dim) % 64 == 0);
    PROPERTY(c->o_groups > 0 && c->num_attention_heads % c->o_groups == 0);
    PROPERTY(c->index_head_dim > c->qk_rope_head_dim && (c->index_head_dim & (c->index_head_dim - 1)) == 0);
    PROPERTY(c->num_experts_per_tok >= 1 && c->num_experts_per_tok <= c->n_routed_experts);
    PROPERTY(c->num_hash_layers >= 0 && c->num_hash_layers <= c->num_hidden_layers);
    PROPERTY(c->vocab_size >= 2 && c->hc_mult >= 1 && c->sliding_window >= 1 && c->index_topk >= 1);
    PROPERTY(c->rope_theta >= 1 && c->compress_rope_theta >= 1 && c->rope_factor >= 1);
    PROPERTY(c->rope_original_max_position >= 1 && c->max_position_embeddings >= 1);
    PROPERTY(c->hc_eps >= 0 && c->rms_norm_eps >= 0 && c->routed_scaling_factor >= 0 && c->swiglu_limit >= 0);
}

static void check_inventory(const model_config *c) {
    /* Up to about 128 x 65536 x 6 tensors are possible; build only what fits a fuzzing run. */
    if ((long long)config_total_blocks(c) * c->n_routed_experts > 4096) return;
    tensor_list l;
    ds4f_error err = {{0}};
    PROPERTY(tensor_list_build(c, &l, &err) == 0);
    str_map names;
    str_map_init(&names);
    for (size_t i = 0; i < l.count; i++) {
        const tensor_spec *s = &l.specs[i];
        size_t len = strnlen(s->name, sizeof s->name);
        PROPERTY(len > 0 && len < sizeof s->name - 1); /* not cut short by the fixed buffer */
        PROPERTY(str_map_put(&names, s->name, (void *)s) == 0);
        PROPERTY(s->ndim == 1 || s->ndim == 2);
        uint64_t bytes = (uint64_t)dtype_size(s->dtype);
        PROPERTY(bytes > 0);
        for (int d = 0; d < s->ndim; d++) {
            PROPERTY(s->shape[d] > 0 && s->shape[d] < (1ll << 40));
            PROPERTY(bytes <= UINT64_MAX / (uint64_t)s->shape[d]);
            bytes *= (uint64_t)s->shape[d];
        }
        PROPERTY(tensor_spec_bytes(s) == bytes);
    }
    str_map_free(&names);
    tensor_list_free(&l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    model_config c;
    ds4f_error err = {{0}};
    if (config_parse(&c, text, "fuzz.json", &err) == 0) {
        check_config(&c);
        check_inventory(&c);
    } else {
        PROPERTY(err.msg[0] != 0 && memchr(err.msg, 0, sizeof err.msg));
    }
    free(text);
    return 0;
}
