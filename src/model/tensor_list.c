#include "model/tensor_list.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    tensor_list *list;
    size_t capacity;
    int failed;
} builder;

static tensor_spec *add(builder *b, dtype t, int64_t d0, int64_t d1, int block, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static tensor_spec *add(builder *b, dtype t, int64_t d0, int64_t d1, int block, const char *fmt, ...) {
    if (b->failed) return NULL;
    if (b->list->count == b->capacity) {
        size_t cap = b->capacity ? b->capacity * 2 : 1024;
        tensor_spec *s = realloc(b->list->specs, cap * sizeof *s);
        if (!s) { b->failed = 1; return NULL; }
        b->list->specs = s;
        b->capacity = cap;
    }
    tensor_spec *s = &b->list->specs[b->list->count++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->name, sizeof s->name, fmt, ap);
    va_end(ap);
    s->dtype = t;
    s->ndim = d1 > 0 ? 2 : 1;
    s->shape[0] = d0;
    s->shape[1] = d1 > 0 ? d1 : 0;
    s->block = block;
    s->expert = -1;
    s->part = EXPERT_PART_NONE;
    return s;
}

/* An FP8 linear: e4m3 weight [O, I] plus one E8M0 scale per 128x128 block. */
static void add_fp8(builder *b, int block, const char *prefix, const char *name, int64_t out, int64_t in) {
    add(b, DTYPE_F8_E4M3, out, in, block, "%s%s.weight", prefix, name);
    add(b, DTYPE_F8_E8M0, (out + 127) / 128, (in + 127) / 128, block, "%s%s.scale", prefix, name);
}

void block_prefix(const model_config *c, int block, char *out, size_t out_size) {
    if (block < c->num_hidden_layers) snprintf(out, out_size, "layers.%d.", block);
    else snprintf(out, out_size, "mtp.%d.", block - c->num_hidden_layers);
}

static void add_block(builder *b, const model_config *c, int block) {
    char p[32];
    block_prefix(c, block, p, sizeof p);
    const int64_t d = c->hidden_size, hc = c->hc_mult, mix = (2 + hc) * hc, H = c->num_attention_heads;
    const int64_t hd = c->head_dim, inter = c->moe_intermediate_size, E = c->n_routed_experts;
    const int ratio = c->compress_ratios[block];
    const int is_mtp = block >= c->num_hidden_layers;
    const int is_hash = !is_mtp && block < c->num_hash_layers;

    add(b, DTYPE_BF16, d, 0, block, "%sattn_norm.weight", p);
    add(b, DTYPE_BF16, d, 0, block, "%sffn_norm.weight", p);
    add(b, DTYPE_F32, mix, hc * d, block, "%shc_attn_fn", p);
    add(b, DTYPE_F32, mix, 0, block, "%shc_attn_base", p);
    add(b, DTYPE_F32, 3, 0, block, "%shc_attn_scale", p);
    add(b, DTYPE_F32, mix, hc * d, block, "%shc_ffn_fn", p);
    add(b, DTYPE_F32, mix, 0, block, "%shc_ffn_base", p);
    add(b, DTYPE_F32, 3, 0, block, "%shc_ffn_scale", p);

    char a[48];
    snprintf(a, sizeof a, "%sattn.", p);
    add(b, DTYPE_F32, H, 0, block, "%sattn_sink", a);
    add_fp8(b, block, a, "wq_a", c->q_lora_rank, d);
    add(b, DTYPE_BF16, c->q_lora_rank, 0, block, "%sq_norm.weight", a);
    add_fp8(b, block, a, "wq_b", H * hd, c->q_lora_rank);
    add_fp8(b, block, a, "wkv", hd, d);
    add(b, DTYPE_BF16, hd, 0, block, "%skv_norm.weight", a);
    add_fp8(b, block, a, "wo_a", (int64_t)c->o_groups * c->o_lora_rank, H * hd / c->o_groups);
    add_fp8(b, block, a, "wo_b", d, (int64_t)c->o_groups * c->o_lora_rank);
    if (ratio) {
        const int64_t coff = ratio == 4 ? 2 : 1; /* ratio 4 compresses overlapping windows */
        add(b, DTYPE_BF16, coff * hd, d, block, "%scompressor.wkv.weight", a);
        add(b, DTYPE_BF16, coff * hd, d, block, "%scompressor.wgate.weight", a);
        add(b, DTYPE_F32, ratio, coff * hd, block, "%scompressor.ape", a);
        add(b, DTYPE_BF16, hd, 0, block, "%scompressor.norm.weight", a);
    }
    if (ratio == 4) {
        const int64_t ih = c->index_n_heads, ihd = c->index_head_dim;
        add_fp8(b, block, a, "indexer.wq_b", ih * ihd, c->q_lora_rank);
        add(b, DTYPE_BF16, ih, d, block, "%sindexer.weights_proj.weight", a);
        add(b, DTYPE_BF16, 2 * ihd, d, block, "%sindexer.compressor.wkv.weight", a);
        add(b, DTYPE_BF16, 2 * ihd, d, block, "%sindexer.compressor.wgate.weight", a);
        add(b, DTYPE_F32, 4, 2 * ihd, block, "%sindexer.compressor.ape", a);
        add(b, DTYPE_BF16, ihd, 0, block, "%sindexer.compressor.norm.weight", a);
    }

    add(b, DTYPE_BF16, E, d, block, "%sffn.gate.weight", p);
    if (is_hash) add(b, DTYPE_I64, c->vocab_size, c->num_experts_per_tok, block, "%sffn.gate.tid2eid", p);
    else add(b, DTYPE_F32, E, 0, block, "%sffn.gate.bias", p);
    for (int e = 0; e < E; e++) {
        static const struct { const char *w; int rows_is_d; expert_part part; } parts[3] = {
            {"w1", 0, EXPERT_W1_WEIGHT}, {"w2", 1, EXPERT_W2_WEIGHT}, {"w3", 0, EXPERT_W3_WEIGHT}};
        for (int k = 0; k < 3; k++) {
            int64_t rows = parts[k].rows_is_d ? d : inter, cols = parts[k].rows_is_d ? inter : d;
            /* add() may move the array: mark each entry right after adding it. */
            tensor_spec *w = add(b, DTYPE_I8, rows, cols / 2, block, "%sffn.experts.%d.%s.weight", p, e, parts[k].w);
            if (!w) return;
            w->expert = e;
            w->part = parts[k].part;
            tensor_spec *s = add(b, DTYPE_F8_E8M0, rows, cols / 32, block, "%sffn.experts.%d.%s.scale", p, e, parts[k].w);
            if (!s) return;
            s->expert = e;
            s->part = (expert_part)(parts[k].part + 1);
        }
    }
    add_fp8(b, block, p, "ffn.shared_experts.w1", inter, d);
    add_fp8(b, block, p, "ffn.shared_experts.w2", d, inter);
    add_fp8(b, block, p, "ffn.shared_experts.w3", inter, d);

    if (is_mtp) {
        add_fp8(b, block, p, "e_proj", d, d);
        add_fp8(b, block, p, "h_proj", d, d);
        add(b, DTYPE_BF16, d, 0, block, "%senorm.weight", p);
        add(b, DTYPE_BF16, d, 0, block, "%shnorm.weight", p);
        add(b, DTYPE_BF16, d, 0, block, "%snorm.weight", p);
        add(b, DTYPE_F32, hc, hc * d, block, "%shc_head_fn", p);
        add(b, DTYPE_F32, hc, 0, block, "%shc_head_base", p);
        add(b, DTYPE_F32, 1, 0, block, "%shc_head_scale", p);
    }
}

int tensor_list_build(const model_config *c, tensor_list *out, ds4f_error *err) {
    out->specs = NULL;
    out->count = 0;
    builder b = {out, 0, 0};
    const int64_t d = c->hidden_size, hc = c->hc_mult;
    add(&b, DTYPE_BF16, c->vocab_size, d, -1, "embed.weight");
    add(&b, DTYPE_BF16, c->vocab_size, d, -1, "head.weight");
    add(&b, DTYPE_BF16, d, 0, -1, "norm.weight");
    add(&b, DTYPE_F32, hc, hc * d, -1, "hc_head_fn");
    add(&b, DTYPE_F32, hc, 0, -1, "hc_head_base");
    add(&b, DTYPE_F32, 1, 0, -1, "hc_head_scale");
    for (int blk = 0; blk < config_total_blocks(c); blk++) add_block(&b, c, blk);
    if (b.failed) {
        tensor_list_free(out);
        return error_set(err, "out of memory building the tensor list");
    }
    return 0;
}

void tensor_list_free(tensor_list *l) {
    free(l->specs);
    l->specs = NULL;
    l->count = 0;
}

uint64_t tensor_spec_bytes(const tensor_spec *s) {
    uint64_t n = (uint64_t)dtype_size(s->dtype);
    for (int i = 0; i < s->ndim; i++) n *= (uint64_t)s->shape[i];
    return n;
}
