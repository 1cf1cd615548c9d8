/* config.json of a DeepSeek-V4 checkpoint (Hugging Face key names), validated.
 *
 * Every key of the official config is known here. Keys that change the computation are read and
 * checked against what ds4f implements; keys that do not (initializer_range, torch_dtype, ...) are
 * listed as ignorable. Any other key is refused: a new key may change the model, and guessing
 * would silently compute something else. */
#ifndef DS4F_FORMAT_CONFIG_H
#define DS4F_FORMAT_CONFIG_H

#include "base/error.h"

#define CONFIG_MAX_LAYERS 128

typedef struct model_config {
    int vocab_size;
    int hidden_size;              /* d */
    int num_hidden_layers;        /* main blocks, excluding MTP */
    int num_nextn_predict_layers; /* MTP blocks (0 or 1) */
    int num_attention_heads;      /* H */
    int head_dim;                 /* 512: K = V, last qk_rope_head_dim dims carry RoPE */
    int qk_rope_head_dim;         /* 64 */
    int q_lora_rank;
    int o_lora_rank;
    int o_groups;
    int sliding_window;           /* 128, including the current token */
    int compress_ratios[CONFIG_MAX_LAYERS]; /* num_hidden_layers + num_nextn_predict_layers entries */
    int index_n_heads;
    int index_head_dim;           /* 128: the Hadamard size */
    int index_topk;
    int num_hash_layers;          /* first layers route by tid2eid[token] */
    int hc_mult;                  /* 4 residual streams */
    int hc_sinkhorn_iters;
    float hc_eps;
    float rms_norm_eps;
    double rope_theta;            /* ratio-0 layers, plain RoPE */
    double compress_rope_theta;   /* ratio-4/128 layers, with YaRN */
    double rope_factor;           /* YaRN */
    int rope_original_max_position;
    double rope_beta_fast, rope_beta_slow;
    int n_routed_experts;
    int num_experts_per_tok;
    int moe_intermediate_size;
    float routed_scaling_factor;
    float swiglu_limit;
    int bos_token_id, eos_token_id;
    long long max_position_embeddings;
} model_config;

int config_parse(model_config *c, const char *json_text, const char *path, ds4f_error *err);
int config_load(model_config *c, const char *path, ds4f_error *err);

static inline int config_total_blocks(const model_config *c) { return c->num_hidden_layers + c->num_nextn_predict_layers; }

#endif
