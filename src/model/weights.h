/* The model in memory: every resident tensor (everything but the routed experts) loaded in its
 * native format, bound to named fields, plus where each routed expert's six tensors lie on disk.
 * Shapes follow spec §2.3; d = hidden_size, H = heads, hd = head_dim. */
#ifndef DS4F_MODEL_WEIGHTS_H
#define DS4F_MODEL_WEIGHTS_H

#include "format/matrix.h"
#include "model/checkpoint.h"

typedef struct compressor_weights {
    int ratio;           /* 4 (overlapping windows) or 128 */
    int head_dim;        /* D: 512 (attention) or index_head_dim (indexer) */
    const float *ape;    /* [ratio][coff*D], coff = 2 when ratio == 4 */
    bf16_matrix wkv;     /* [coff*D, d], applied in f32 */
    bf16_matrix wgate;   /* [coff*D, d] */
    const float *norm;   /* [D] */
} compressor_weights;

typedef struct block_weights {
    int index;
    int ratio;            /* compress ratio: 0, 4 or 128 */
    int hash_routed;      /* routes by tid2eid[token] */
    int is_mtp;
    /* hyper-connections */
    f32_matrix hc_attn_fn, hc_ffn_fn;            /* [(2+hc)*hc, hc*d] */
    const float *hc_attn_base, *hc_ffn_base;     /* [(2+hc)*hc] */
    const float *hc_attn_scale, *hc_ffn_scale;   /* [3] */
    const float *attn_norm, *ffn_norm;           /* [d] */
    /* attention */
    const float *attn_sink;                      /* [H] */
    fp8_matrix wq_a;                             /* [q_lora, d] */
    const float *q_norm;                         /* [q_lora] */
    fp8_matrix wq_b;                             /* [H*hd, q_lora] */
    fp8_matrix wkv;                              /* [hd, d] */
    const float *kv_norm;                        /* [hd] */
    fp8_matrix wo_a;                             /* [groups*o_lora, H*hd/groups], used dequantized */
    fp8_matrix wo_b;                             /* [d, groups*o_lora] */
    compressor_weights compressor;               /* ratio != 0 */
    fp8_matrix indexer_wq_b;                     /* [iH*ihd, q_lora], ratio == 4 */
    bf16_matrix indexer_weights_proj;            /* [iH, d] */
    compressor_weights indexer_compressor;       /* ratio 4, D = ihd */
    /* MoE */
    bf16_matrix gate;                            /* [E, d], applied in f32 */
    const int64_t *tid2eid;                      /* [vocab, topk], hash-routed blocks */
    const float *gate_bias;                      /* [E], score-routed blocks */
    fp8_matrix shared_w1, shared_w3;             /* [inter, d] */
    fp8_matrix shared_w2;                        /* [d, inter] */
    /* MTP block only */
    fp8_matrix e_proj, h_proj;                   /* [d, d] */
    const float *enorm, *hnorm, *mtp_norm;       /* [d] */
    f32_matrix hc_head_fn;                       /* [hc, hc*d] */
    const float *hc_head_base, *hc_head_scale;
} block_weights;

/* Where one routed expert's tensor lies on disk. */
typedef struct expert_extent {
    int32_t shard;
    uint64_t offset;
    uint64_t bytes;
} expert_extent;

typedef struct model_weights {
    checkpoint ck;            /* open shards: the expert stores read from them */
    model_config config;
    uint8_t *arena;           /* all resident tensors */
    uint64_t arena_bytes;
    float *f32_arena;         /* norm weights converted from bf16 (the official code keeps them f32) */
    const uint16_t *embed;    /* [vocab, d] bf16 */
    bf16_matrix head;         /* [vocab, d] */
    const float *norm;        /* [d] */
    f32_matrix hc_head_fn;    /* [hc, hc*d] */
    const float *hc_head_base, *hc_head_scale;
    block_weights *blocks;    /* num_hidden_layers + num_nextn_predict_layers */
    int n_blocks;
    expert_extent *experts;   /* [n_blocks][n_routed_experts][EXPERT_PARTS] */
    uint64_t expert_bytes;    /* bytes of one routed expert (all six tensors) */
    fp8_low_codes **low_lists; /* the fp8_low_codes of the row-major FP8 matrices that have them */
    size_t n_low_lists, low_lists_capacity;
} model_weights;

/* The most low codes an FP8 matrix of n codes gets a list for (fp8_low_codes_list): 1 in 64, so
 * that a list costs at most 3.1% of the matrix (plus 4 bytes a row). Quantized Gaussian weights
 * whose block maximum lies near 448 would hold a few in 1000 (an estimate); the synthetic model's
 * matrices hold 0 or 1 in 128. A matrix with more keeps the plain form (and the AVX-512 one-token
 * product its f64 form). */
static inline size_t fp8_low_codes_limit(uint64_t n_codes) { return (size_t)(n_codes / 64); }

typedef struct model_load_options {
    int show_progress;
} model_load_options;

int model_weights_load(model_weights *m, const char *dir, const model_load_options *opt, ds4f_error *err);
void model_weights_free(model_weights *m);

static inline const expert_extent *expert_extents(const model_weights *m, int block, int expert) {
    return &m->experts[((size_t)block * m->config.n_routed_experts + (size_t)expert) * EXPERT_PARTS];
}

#endif
