#include "model/weights.h"
#include "base/large_alloc.h"
#include "base/progress.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    model_weights *m;
    uint64_t *arena_offset; /* per spec; UINT64_MAX for routed experts */
    size_t f32_used, f32_capacity;
    ds4f_error *err;
    int failed;
} binder;

static long find(binder *b, const char *fmt, va_list ap) {
    char name[128];
    vsnprintf(name, sizeof name, fmt, ap);
    long i = checkpoint_find(&b->m->ck, name);
    if (i < 0 && !b->failed) {
        error_set(b->err, "internal: tensor '%s' is not in the model description", name);
        b->failed = 1;
    }
    return i;
}

static const void *data(binder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const void *data(binder *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    long i = find(b, fmt, ap);
    va_end(ap);
    return i < 0 ? NULL : b->m->arena + b->arena_offset[i];
}

/* BF16 vectors that the official code keeps in f32 (RMSNorm weights): converted once, exactly. */
static const float *f32_vector(binder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const float *f32_vector(binder *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    long i = find(b, fmt, ap);
    va_end(ap);
    if (i < 0) return NULL;
    const tensor_spec *s = &b->m->ck.expected.specs[i];
    size_t n = (size_t)s->shape[0];
    if (b->f32_used + n > b->f32_capacity) {
        error_set(b->err, "internal: f32 arena too small");
        b->failed = 1;
        return NULL;
    }
    float *dst = b->m->f32_arena + b->f32_used;
    const uint16_t *src = (const uint16_t *)(b->m->arena + b->arena_offset[i]);
    for (size_t k = 0; k < n; k++) dst[k] = bf16_to_f32(src[k]);
    b->f32_used += n;
    return dst;
}

/* Data pointer and 2-D shape of a tensor named prefix + name. */
static const void *matrix_data(binder *b, const char *prefix, const char *name, int *rows, int *cols) {
    char full[128];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    const void *p = data(b, "%s", full);
    long k = checkpoint_find(&b->m->ck, full);
    *rows = k >= 0 ? (int)b->m->ck.expected.specs[k].shape[0] : 0;
    *cols = k >= 0 ? (int)b->m->ck.expected.specs[k].shape[1] : 0;
    return p;
}

static fp8_matrix fp8(binder *b, const char *prefix, const char *name) {
    fp8_matrix w = {0};
    char weight[96];
    snprintf(weight, sizeof weight, "%s.weight", name);
    w.codes = matrix_data(b, prefix, weight, &w.rows, &w.cols);
    w.scales = data(b, "%s%s.scale", prefix, name);
    return w;
}

/* The FP8 x FP8 products' matrices (row-major) list their low codes, so that the x86 kernels
 * can read every code as a normal f64 (see fp8_low_codes). */
static fp8_matrix fp8_listed(binder *b, const char *prefix, const char *name) {
    fp8_matrix w = fp8(b, prefix, name);
    if (!w.codes || b->failed || w.cols > FP8_LOW_CODES_MAX_COLS) return w;
    model_weights *m = b->m;
    if (m->n_low_lists == m->low_lists_capacity) {
        const size_t cap = m->low_lists_capacity ? 2 * m->low_lists_capacity : 64;
        fp8_low_codes **grown = realloc(m->low_lists, cap * sizeof *grown);
        if (!grown) goto oom;
        m->low_lists = grown;
        m->low_lists_capacity = cap;
    }
    int too_many = 0;
    fp8_low_codes *list = fp8_low_codes_list(&w, fp8_low_codes_limit((uint64_t)w.rows * (uint64_t)w.cols), &too_many);
    if (!list && !too_many) goto oom;
    if (list) m->low_lists[m->n_low_lists++] = list;
    w.low = list;
    return w;
oom:
    error_set(b->err, "out of memory");
    b->failed = 1;
    return w;
}

/* The weights of the float products (every bf16 matrix, and wo_a, the FP8 matrix used
 * dequantized) are rearranged once, in place in the arena, into MATRIX_GROUPS16: decode reads
 * them as columns of 16 rows, one load each, where row-major order costs a transpose per tile. */
static void group_rows(binder *b, const void *values, size_t elem_bytes, int rows, int cols, int *layout) {
    if (!values || b->failed) return;
    /* values lies in the arena, which the model owns and only reads after loading */
    if (matrix_group_rows((void *)(uintptr_t)values, elem_bytes, rows, cols) != 0) {
        error_set(b->err, "out of memory");
        b->failed = 1;
        return;
    }
    *layout = MATRIX_GROUPS16;
}

static fp8_matrix fp8_dequantized(binder *b, const char *prefix, const char *name) {
    fp8_matrix w = fp8(b, prefix, name);
    group_rows(b, w.codes, 1, w.rows, w.cols, &w.layout);
    return w;
}

static bf16_matrix bf16m(binder *b, const char *prefix, const char *name) {
    bf16_matrix w = {0};
    w.values = matrix_data(b, prefix, name, &w.rows, &w.cols);
    group_rows(b, w.values, 2, w.rows, w.cols, &w.layout);
    return w;
}

static f32_matrix f32m(binder *b, const char *prefix, const char *name) {
    f32_matrix w = {0};
    w.values = matrix_data(b, prefix, name, &w.rows, &w.cols);
    return w;
}

static void bind_compressor(binder *b, compressor_weights *c, const char *prefix, const char *which, int ratio, int dim) {
    char p[96];
    snprintf(p, sizeof p, "%s%s", prefix, which);
    c->ratio = ratio;
    c->head_dim = dim;
    c->ape = data(b, "%sape", p);
    c->wkv = bf16m(b, p, "wkv.weight");
    c->wgate = bf16m(b, p, "wgate.weight");
    c->norm = f32_vector(b, "%snorm.weight", p);
}

static void bind_block(binder *b, block_weights *w, int blk) {
    const model_config *c = &b->m->config;
    char p[32], a[48];
    block_prefix(c, blk, p, sizeof p);
    snprintf(a, sizeof a, "%sattn.", p);
    w->index = blk;
    w->ratio = c->compress_ratios[blk];
    w->is_mtp = blk >= c->num_hidden_layers;
    w->hash_routed = !w->is_mtp && blk < c->num_hash_layers;
    w->hc_attn_fn = f32m(b, p, "hc_attn_fn");
    w->hc_ffn_fn = f32m(b, p, "hc_ffn_fn");
    w->hc_attn_base = data(b, "%shc_attn_base", p);
    w->hc_ffn_base = data(b, "%shc_ffn_base", p);
    w->hc_attn_scale = data(b, "%shc_attn_scale", p);
    w->hc_ffn_scale = data(b, "%shc_ffn_scale", p);
    w->attn_norm = f32_vector(b, "%sattn_norm.weight", p);
    w->ffn_norm = f32_vector(b, "%sffn_norm.weight", p);
    w->attn_sink = data(b, "%sattn_sink", a);
    w->wq_a = fp8_listed(b, a, "wq_a");
    w->q_norm = f32_vector(b, "%sq_norm.weight", a);
    w->wq_b = fp8_listed(b, a, "wq_b");
    w->wkv = fp8_listed(b, a, "wkv");
    w->kv_norm = f32_vector(b, "%skv_norm.weight", a);
    w->wo_a = fp8_dequantized(b, a, "wo_a");
    w->wo_b = fp8_listed(b, a, "wo_b");
    if (w->ratio) bind_compressor(b, &w->compressor, a, "compressor.", w->ratio, c->head_dim);
    if (w->ratio == 4) {
        w->indexer_wq_b = fp8_listed(b, a, "indexer.wq_b");
        w->indexer_weights_proj = bf16m(b, a, "indexer.weights_proj.weight");
        bind_compressor(b, &w->indexer_compressor, a, "indexer.compressor.", 4, c->index_head_dim);
    }
    w->gate = bf16m(b, p, "ffn.gate.weight");
    if (w->hash_routed) w->tid2eid = data(b, "%sffn.gate.tid2eid", p);
    else w->gate_bias = data(b, "%sffn.gate.bias", p);
    w->shared_w1 = fp8_listed(b, p, "ffn.shared_experts.w1");
    w->shared_w2 = fp8_listed(b, p, "ffn.shared_experts.w2");
    w->shared_w3 = fp8_listed(b, p, "ffn.shared_experts.w3");
    if (w->is_mtp) {
        w->e_proj = fp8_listed(b, p, "e_proj");
        w->h_proj = fp8_listed(b, p, "h_proj");
        w->enorm = f32_vector(b, "%senorm.weight", p);
        w->hnorm = f32_vector(b, "%shnorm.weight", p);
        w->mtp_norm = f32_vector(b, "%snorm.weight", p);
        w->hc_head_fn = f32m(b, p, "hc_head_fn");
        w->hc_head_base = data(b, "%shc_head_base", p);
        w->hc_head_scale = data(b, "%shc_head_scale", p);
    }
}

/* An E8M0 byte of 255 is NaN: no valid checkpoint contains one, and it would poison every
 * product of its block silently. */
static int check_scales(const model_weights *m, const tensor_spec *s, const uint8_t *bytes, ds4f_error *err) {
    if (s->dtype != DTYPE_F8_E8M0) return 0;
    uint64_t n = tensor_spec_bytes(s);
    for (uint64_t i = 0; i < n; i++)
        if (bytes[i] == 255) return error_set(err, "%s: tensor '%s' has a NaN scale (E8M0 byte 255) at element %llu",
                                              m->ck.dir, s->name, (unsigned long long)i);
    return 0;
}

int model_weights_load(model_weights *m, const char *dir, const model_load_options *opt, ds4f_error *err) {
    memset(m, 0, sizeof *m);
    if (checkpoint_open(&m->ck, dir, err) != 0) {
        checkpoint_close(&m->ck);
        return -1;
    }
    m->config = m->ck.config;
    const model_config *c = &m->config;
    const tensor_list *l = &m->ck.expected;
    binder b = {.m = m, .err = err};
    b.arena_offset = calloc(l->count, sizeof *b.arena_offset);
    m->n_blocks = config_total_blocks(c);
    m->blocks = calloc((size_t)m->n_blocks, sizeof *m->blocks);
    m->experts = calloc((size_t)m->n_blocks * c->n_routed_experts * EXPERT_PARTS, sizeof *m->experts);
    if (!b.arena_offset || !m->blocks || !m->experts) goto oom;

    uint64_t offset = 0;
    size_t f32_values = 0;
    for (size_t i = 0; i < l->count; i++) {
        const tensor_spec *s = &l->specs[i];
        if (s->expert >= 0) {
            b.arena_offset[i] = UINT64_MAX;
            expert_extent *x = &m->experts[((size_t)s->block * c->n_routed_experts + (size_t)s->expert) * EXPERT_PARTS + s->part];
            x->shard = m->ck.bound_shard[i];
            x->offset = m->ck.bound[i]->offset;
            x->bytes = m->ck.bound[i]->bytes;
            if (s->block == 0 && s->expert == 0) m->expert_bytes += x->bytes;
            continue;
        }
        b.arena_offset[i] = offset;
        offset += (tensor_spec_bytes(s) + 63) & ~(uint64_t)63; /* 64-byte aligned rows for SIMD */
        if (s->dtype == DTYPE_BF16 && s->ndim == 1) f32_values += (size_t)s->shape[0];
    }
    m->arena_bytes = offset;
    m->arena = large_alloc(offset);
    m->f32_arena = malloc((f32_values ? f32_values : 1) * sizeof(float));
    if (!m->arena || !m->f32_arena) {
        error_set(err, "cannot allocate %.2f GB for the resident weights", (double)offset / 1e9);
        goto fail;
    }
    b.f32_capacity = f32_values;

    progress bar;
    progress_begin(&bar, "loading", offset, "B");
    if (!opt || !opt->show_progress) bar.enabled = 0;
    uint64_t done = 0;
    for (size_t i = 0; i < l->count; i++) {
        if (b.arena_offset[i] == UINT64_MAX) continue;
        uint8_t *dst = m->arena + b.arena_offset[i];
        if (checkpoint_read(&m->ck, i, dst, err) != 0) goto fail;
        if (check_scales(m, &l->specs[i], dst, err) != 0) goto fail;
        done += tensor_spec_bytes(&l->specs[i]);
        progress_update(&bar, done);
    }
    progress_end(&bar);

    m->embed = data(&b, "embed.weight");
    m->head = bf16m(&b, "", "head.weight");
    m->norm = f32_vector(&b, "norm.weight");
    m->hc_head_fn = f32m(&b, "", "hc_head_fn");
    m->hc_head_base = data(&b, "hc_head_base");
    m->hc_head_scale = data(&b, "hc_head_scale");
    for (int blk = 0; blk < m->n_blocks; blk++) bind_block(&b, &m->blocks[blk], blk);
    if (b.failed) goto fail;
    /* tid2eid names experts by id: an id outside [0, E) would index past the expert table. */
    for (int blk = 0; blk < m->n_blocks; blk++) {
        const int64_t *t = m->blocks[blk].tid2eid;
        if (!t) continue;
        for (size_t i = 0; i < (size_t)c->vocab_size * c->num_experts_per_tok; i++)
            if (t[i] < 0 || t[i] >= c->n_routed_experts) {
                error_set(err, "%s: layers.%d.ffn.gate.tid2eid[%zu][%zu] = %lld is not an expert id (0..%d)", dir, blk,
                          i / c->num_experts_per_tok, i % c->num_experts_per_tok, (long long)t[i], c->n_routed_experts - 1);
                goto fail;
            }
    }
    free(b.arena_offset);
    return 0;
oom:
    error_set(err, "out of memory");
fail:
    free(b.arena_offset);
    model_weights_free(m);
    return -1;
}

void model_weights_free(model_weights *m) {
    for (size_t i = 0; i < m->n_low_lists; i++) free(m->low_lists[i]);
    free(m->low_lists);
    free(m->arena);
    free(m->f32_arena);
    free(m->blocks);
    free(m->experts);
    checkpoint_close(&m->ck);
    memset(m, 0, sizeof *m);
}
