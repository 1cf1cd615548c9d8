#include "format/config.h"
#include "base/file_io.h"

#include <cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const ignorable_keys[] = {
    "attention_dropout", "initializer_range", "torch_dtype", "transformers_version", "use_cache", NULL,
};

typedef struct {
    const char *key;
    int *dst;
    int min, max;
} int_key;

static int get_required(const cJSON *root, const char *key, const cJSON **out, const char *path, ds4f_error *err) {
    *out = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!*out) return error_set(err, "%s: missing key '%s'", path, key);
    return 0;
}

static int read_int(const cJSON *root, const char *key, int *dst, int min, int max, const char *path, ds4f_error *err) {
    const cJSON *v;
    if (get_required(root, key, &v, path, err)) return -1;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < min || v->valuedouble > max)
        return error_set(err, "%s: '%s' must be an integer in [%d, %d]", path, key, min, max);
    *dst = (int)v->valuedouble;
    return 0;
}

static int read_num(const cJSON *root, const char *key, double *dst, double min, double max, const char *path,
                    ds4f_error *err) {
    const cJSON *v;
    if (get_required(root, key, &v, path, err)) return -1;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= min && v->valuedouble <= max))
        return error_set(err, "%s: '%s' must be a number in [%g, %g]", path, key, min, max);
    *dst = v->valuedouble;
    return 0;
}

static int expect_string(const cJSON *root, const char *key, const char *want, const char *path, ds4f_error *err) {
    const cJSON *v;
    if (get_required(root, key, &v, path, err)) return -1;
    if (!cJSON_IsString(v) || strcmp(v->valuestring, want))
        return error_set(err, "%s: '%s' is %s%s%s; ds4f implements only \"%s\"", path, key, cJSON_IsString(v) ? "\"" : "",
                         cJSON_IsString(v) ? v->valuestring : "not a string", cJSON_IsString(v) ? "\"" : "", want);
    return 0;
}

static int expect_bool(const cJSON *root, const char *key, int want, const char *path, ds4f_error *err) {
    const cJSON *v;
    if (get_required(root, key, &v, path, err)) return -1;
    if (!cJSON_IsBool(v) || cJSON_IsTrue(v) != want)
        return error_set(err, "%s: '%s' must be %s for DeepSeek-V4", path, key, want ? "true" : "false");
    return 0;
}

static int parse_quantization(const cJSON *q, const char *path, ds4f_error *err) {
    if (!cJSON_IsObject(q)) return error_set(err, "%s: 'quantization_config' must be an object", path);
    for (const cJSON *e = q->child; e; e = e->next) {
        const char *k = e->string;
        if (strcmp(k, "activation_scheme") && strcmp(k, "fmt") && strcmp(k, "quant_method") && strcmp(k, "scale_fmt") &&
            strcmp(k, "weight_block_size"))
            return error_set(err, "%s: unknown key 'quantization_config.%s'", path, k);
    }
    if (expect_string(q, "quant_method", "fp8", path, err) || expect_string(q, "fmt", "e4m3", path, err) ||
        expect_string(q, "scale_fmt", "ue8m0", path, err) || expect_string(q, "activation_scheme", "dynamic", path, err))
        return error_prefix(err, "quantization_config");
    const cJSON *bs = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
    if (!cJSON_IsArray(bs) || cJSON_GetArraySize(bs) != 2 || !cJSON_IsNumber(cJSON_GetArrayItem(bs, 0)) ||
        cJSON_GetArrayItem(bs, 0)->valuedouble != 128 || !cJSON_IsNumber(cJSON_GetArrayItem(bs, 1)) ||
        cJSON_GetArrayItem(bs, 1)->valuedouble != 128)
        return error_set(err, "%s: quantization_config.weight_block_size must be [128, 128]", path);
    return 0;
}

static int parse_rope_scaling(model_config *c, const cJSON *r, const char *path, ds4f_error *err) {
    if (!cJSON_IsObject(r)) return error_set(err, "%s: 'rope_scaling' must be an object", path);
    for (const cJSON *e = r->child; e; e = e->next) {
        const char *k = e->string;
        if (strcmp(k, "beta_fast") && strcmp(k, "beta_slow") && strcmp(k, "factor") &&
            strcmp(k, "original_max_position_embeddings") && strcmp(k, "type") && strcmp(k, "rope_type"))
            return error_set(err, "%s: unknown key 'rope_scaling.%s'", path, k);
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(r, "type");
    if (!type) type = cJSON_GetObjectItemCaseSensitive(r, "rope_type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "yarn"))
        return error_set(err, "%s: rope_scaling.type must be \"yarn\"", path);
    if (read_num(r, "factor", &c->rope_factor, 1, 1e6, path, err) ||
        read_int(r, "original_max_position_embeddings", &c->rope_original_max_position, 1, 1 << 30, path, err) ||
        read_num(r, "beta_fast", &c->rope_beta_fast, 1e-3, 1e6, path, err) ||
        read_num(r, "beta_slow", &c->rope_beta_slow, 1e-3, 1e6, path, err))
        return error_prefix(err, "rope_scaling");
    return 0;
}

static const char *const known_keys[] = {
    "architectures", "attention_bias", "bos_token_id", "compress_ratios", "compress_rope_theta", "eos_token_id",
    "expert_dtype", "hc_eps", "hc_mult", "hc_sinkhorn_iters", "head_dim", "hidden_act", "hidden_size",
    "index_head_dim", "index_n_heads", "index_topk", "max_position_embeddings", "model_type",
    "moe_intermediate_size", "n_routed_experts", "n_shared_experts", "norm_topk_prob", "num_attention_heads",
    "num_experts_per_tok", "num_hash_layers", "num_hidden_layers", "num_key_value_heads",
    "num_nextn_predict_layers", "o_groups", "o_lora_rank", "q_lora_rank", "qk_rope_head_dim",
    "quantization_config", "rms_norm_eps", "rope_scaling", "rope_theta", "routed_scaling_factor", "scoring_func",
    "sliding_window", "swiglu_limit", "tie_word_embeddings", "topk_method", "vocab_size", NULL,
};

static int in_list(const char *const *list, const char *k) {
    for (; *list; list++)
        if (!strcmp(*list, k)) return 1;
    return 0;
}

int config_parse(model_config *c, const char *json_text, const char *path, ds4f_error *err) {
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_Parse(json_text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return error_set(err, "%s: not a JSON object", path);
    }
    int rc = -1;
    for (const cJSON *e = root->child; e; e = e->next)
        if (!in_list(known_keys, e->string) && !in_list(ignorable_keys, e->string)) {
            error_set(err, "%s: unknown key '%s' (ds4f does not know how it changes the model; refusing to guess)", path,
                      e->string);
            goto done;
        }
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (!cJSON_IsArray(arch) || cJSON_GetArraySize(arch) != 1 || !cJSON_IsString(cJSON_GetArrayItem(arch, 0)) ||
        strcmp(cJSON_GetArrayItem(arch, 0)->valuestring, "DeepseekV4ForCausalLM")) {
        error_set(err, "%s: 'architectures' must be [\"DeepseekV4ForCausalLM\"]", path);
        goto done;
    }
    if (expect_string(root, "model_type", "deepseek_v4", path, err) || expect_string(root, "hidden_act", "silu", path, err) ||
        expect_string(root, "scoring_func", "sqrtsoftplus", path, err) ||
        expect_string(root, "topk_method", "noaux_tc", path, err) || expect_bool(root, "attention_bias", 0, path, err) ||
        expect_bool(root, "tie_word_embeddings", 0, path, err) || expect_bool(root, "norm_topk_prob", 1, path, err))
        goto done;
    /* The root config of the current revision says "fp4"; the initial revision omits the key
     * (its experts are the same packed FP4 tensors). */
    const cJSON *ed = cJSON_GetObjectItemCaseSensitive(root, "expert_dtype");
    if (ed && (!cJSON_IsString(ed) || strcmp(ed->valuestring, "fp4"))) {
        error_set(err, "%s: 'expert_dtype' must be \"fp4\"", path);
        goto done;
    }
    int kv_heads = 0, shared = 0;
    double hc_eps, norm_eps, scale, limit, maxpos;
    if (read_int(root, "vocab_size", &c->vocab_size, 2, 1 << 24, path, err) ||
        read_int(root, "hidden_size", &c->hidden_size, 128, 1 << 16, path, err) ||
        read_int(root, "num_hidden_layers", &c->num_hidden_layers, 1, CONFIG_MAX_LAYERS - 1, path, err) ||
        read_int(root, "num_nextn_predict_layers", &c->num_nextn_predict_layers, 0, 1, path, err) ||
        read_int(root, "num_attention_heads", &c->num_attention_heads, 1, 1024, path, err) ||
        read_int(root, "num_key_value_heads", &kv_heads, 1, 1, path, err) ||
        read_int(root, "head_dim", &c->head_dim, 64, 4096, path, err) ||
        read_int(root, "qk_rope_head_dim", &c->qk_rope_head_dim, 2, 4096, path, err) ||
        read_int(root, "q_lora_rank", &c->q_lora_rank, 128, 1 << 16, path, err) ||
        read_int(root, "o_lora_rank", &c->o_lora_rank, 1, 1 << 16, path, err) ||
        read_int(root, "o_groups", &c->o_groups, 1, 1024, path, err) ||
        read_int(root, "sliding_window", &c->sliding_window, 1, 1 << 20, path, err) ||
        read_int(root, "index_n_heads", &c->index_n_heads, 1, 1024, path, err) ||
        read_int(root, "index_head_dim", &c->index_head_dim, 32, 4096, path, err) ||
        read_int(root, "index_topk", &c->index_topk, 1, 1 << 24, path, err) ||
        read_int(root, "num_hash_layers", &c->num_hash_layers, 0, CONFIG_MAX_LAYERS, path, err) ||
        read_int(root, "hc_mult", &c->hc_mult, 1, 16, path, err) ||
        read_int(root, "hc_sinkhorn_iters", &c->hc_sinkhorn_iters, 1, 1000, path, err) ||
        read_num(root, "hc_eps", &hc_eps, 0, 1, path, err) || read_num(root, "rms_norm_eps", &norm_eps, 0, 1, path, err) ||
        read_num(root, "rope_theta", &c->rope_theta, 1, 1e12, path, err) ||
        read_num(root, "compress_rope_theta", &c->compress_rope_theta, 1, 1e12, path, err) ||
        read_int(root, "n_routed_experts", &c->n_routed_experts, 1, 1 << 16, path, err) ||
        read_int(root, "num_experts_per_tok", &c->num_experts_per_tok, 1, 64, path, err) ||
        read_int(root, "n_shared_experts", &shared, 1, 1, path, err) ||
        read_int(root, "moe_intermediate_size", &c->moe_intermediate_size, 128, 1 << 20, path, err) ||
        read_num(root, "routed_scaling_factor", &scale, 0, 1e6, path, err) ||
        read_num(root, "swiglu_limit", &limit, 0, 1e6, path, err) ||
        read_int(root, "bos_token_id", &c->bos_token_id, 0, 1 << 24, path, err) ||
        read_int(root, "eos_token_id", &c->eos_token_id, 0, 1 << 24, path, err) ||
        read_num(root, "max_position_embeddings", &maxpos, 1, 1e12, path, err))
        goto done;
    c->hc_eps = (float)hc_eps;
    c->rms_norm_eps = (float)norm_eps;
    c->routed_scaling_factor = (float)scale;
    c->swiglu_limit = (float)limit;
    c->max_position_embeddings = (long long)maxpos;
    const cJSON *v;
    if (get_required(root, "quantization_config", &v, path, err) || parse_quantization(v, path, err)) goto done;
    if (get_required(root, "rope_scaling", &v, path, err) || parse_rope_scaling(c, v, path, err)) goto done;

    const cJSON *ratios = cJSON_GetObjectItemCaseSensitive(root, "compress_ratios");
    int blocks = config_total_blocks(c);
    if (!cJSON_IsArray(ratios) || cJSON_GetArraySize(ratios) != blocks) {
        error_set(err, "%s: 'compress_ratios' must have %d entries (num_hidden_layers + num_nextn_predict_layers)", path, blocks);
        goto done;
    }
    for (int i = 0; i < blocks; i++) {
        const cJSON *r = cJSON_GetArrayItem(ratios, i);
        /* Compare as doubles: casting an out-of-range double (1e308) to int is undefined. */
        double v = cJSON_IsNumber(r) ? r->valuedouble : -1;
        int ratio = v == 0 ? 0 : v == 4 ? 4 : v == 128 ? 128 : -1;
        if (ratio < 0) {
            error_set(err, "%s: compress_ratios[%d] must be 0, 4 or 128", path, i);
            goto done;
        }
        if (i >= c->num_hidden_layers && ratio != 0) {
            error_set(err, "%s: compress_ratios[%d] (the MTP block) must be 0", path, i);
            goto done;
        }
        c->compress_ratios[i] = ratio;
    }
    /* Shape constraints the official code relies on (FP8 128-blocks, FP8-simulated KV in 64-blocks,
     * FP4 simulation in 32-blocks, a power-of-two Hadamard). */
    const char *bad = NULL;
    if (c->hidden_size % 128) bad = "hidden_size must be a multiple of 128";
    else if (c->q_lora_rank % 128) bad = "q_lora_rank must be a multiple of 128";
    else if (c->moe_intermediate_size % 128) bad = "moe_intermediate_size must be a multiple of 128";
    else if (c->qk_rope_head_dim % 2 || c->qk_rope_head_dim >= c->head_dim) bad = "qk_rope_head_dim must be even and below head_dim";
    else if ((c->head_dim - c->qk_rope_head_dim) % 64) bad = "head_dim - qk_rope_head_dim must be a multiple of 64";
    else if ((c->num_attention_heads * c->head_dim) % 128) bad = "num_attention_heads * head_dim must be a multiple of 128";
    else if (c->num_attention_heads % c->o_groups) bad = "num_attention_heads must be a multiple of o_groups";
    else if ((c->num_attention_heads / c->o_groups * c->head_dim) % 128) bad = "heads per group * head_dim must be a multiple of 128";
    else if ((c->o_groups * c->o_lora_rank) % 128) bad = "o_groups * o_lora_rank must be a multiple of 128";
    else if (c->index_head_dim & (c->index_head_dim - 1)) bad = "index_head_dim must be a power of two (Hadamard)";
    else if (c->index_head_dim <= c->qk_rope_head_dim) bad = "index_head_dim must exceed qk_rope_head_dim";
    else if ((c->index_n_heads * c->index_head_dim) % 128) bad = "index_n_heads * index_head_dim must be a multiple of 128";
    else if (c->num_experts_per_tok > c->n_routed_experts) bad = "num_experts_per_tok exceeds n_routed_experts";
    else if (c->num_hash_layers > c->num_hidden_layers) bad = "num_hash_layers exceeds num_hidden_layers";
    if (bad) {
        error_set(err, "%s: %s", path, bad);
        goto done;
    }
    rc = 0;
done:
    cJSON_Delete(root);
    return rc;
}

int config_load(model_config *c, const char *path, ds4f_error *err) {
    char *text;
    if (file_read_all(path, &text, NULL, err)) return -1;
    int rc = config_parse(c, text, path, err);
    free(text);
    return rc;
}
