/* One sequence through the model: embedding, blocks, head (OFF-M Transformer.forward). */
#include "nn/layers.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *scratch_take(scratch_arena *a, size_t bytes) {
    size_t start = (a->used + 63) & ~(size_t)63;
    if (start + bytes > a->capacity) {
        /* The scratch size is computed from the config at session creation; running out is a bug. */
        fprintf(stderr, "ds4f: internal error: scratch arena exhausted (%zu + %zu > %zu)\n", start, bytes, a->capacity);
        abort();
    }
    a->used = start + bytes;
    return a->base + start;
}

/* Upper bound of the scratch one chunk needs (attention is the largest user, plus the block
 * buffers held across sublayers). Generous rather than exact: it is small next to the weights. */
size_t nn_session_scratch_bytes(const model_config *c, int max_chunk, int max_context) {
    const size_t T = (size_t)max_chunk, f = sizeof(float);
    const size_t d = (size_t)c->hidden_size, hc = (size_t)c->hc_mult, H = (size_t)c->num_attention_heads;
    const size_t hd = (size_t)c->head_dim, qlr = (size_t)c->q_lora_rank, iH = (size_t)c->index_n_heads;
    const size_t ihd = (size_t)c->index_head_dim, G = (size_t)c->o_groups, olr = (size_t)c->o_lora_rank;
    const size_t inter = (size_t)c->moe_intermediate_size, E = (size_t)c->n_routed_experts;
    size_t maxcols = d;
    if (qlr > maxcols) maxcols = qlr;
    if (G * olr > maxcols) maxcols = G * olr;
    if (inter > maxcols) maxcols = inter;
    size_t block_buffers = T * hc * d * f /* residual */ + T * d * f * 3 + T * (hc + hc * hc) * f;
    size_t quant = T * maxcols + T * (maxcols / 128) * f;
    size_t attention = T * qlr * f + T * H * hd * f * 2 + T * hd * f + T * 2 * hd * f * 2 + T * iH * ihd * f +
                       T * 2 * ihd * f * 2 + T * iH * f + 4 * hd * f + 64 * f +
                       ((size_t)max_context / 4 + 1 + 2 * (size_t)c->index_topk) * f + T * G * olr * f +
                       attention_scratch_bytes(c, max_chunk, max_context, kernels_threads());
    size_t moe = E * f * 2 + d + d / 128 * f + inter + inter / 128 * f + inter * f * 2 + d * f * 2;
    size_t head = T * d * f + T * hc * f;
    /* the indexer's per-head entry scores, the hyper-connection mixes of a chunk */
    size_t heads = iH * ((size_t)max_context / 4 + 1) * f;
    size_t hc_mixes = T * (2 + hc) * hc * f;
    size_t mtp = T * (2 * d + hc * d) * f + T * hc * d + T * hc * (d / 128) * f;
    return block_buffers + quant + attention + moe + head + mtp + heads + hc_mixes + 64 * 64;
}

static int compressor_state_init(compressor_state *st, int ratio, int dim, int max_context) {
    st->ratio = ratio;
    st->dim = dim;
    st->overlap = ratio == 4;
    const int coff = st->overlap ? 2 : 1;
    const size_t rows = (size_t)coff * ratio, width = (size_t)coff * dim;
    st->kv_rows = malloc(rows * width * sizeof(float));
    st->score_rows = malloc(rows * width * sizeof(float));
    st->capacity = max_context / ratio + 1;
    st->entries = malloc((size_t)st->capacity * dim * sizeof(uint16_t));
    return st->kv_rows && st->score_rows && st->entries ? 0 : -1;
}

static void compressor_state_reset(compressor_state *st) {
    if (!st->kv_rows) return;
    const int coff = st->overlap ? 2 : 1;
    const size_t n = (size_t)coff * st->ratio * coff * st->dim;
    for (size_t i = 0; i < n; i++) {
        st->kv_rows[i] = 0.0f;
        st->score_rows[i] = -INFINITY;
    }
    st->n_entries = 0;
}

static void compressor_state_free(compressor_state *st) {
    free(st->kv_rows);
    free(st->score_rows);
    free(st->entries);
}

void nn_session_free(nn_session *s) {
    if (!s) return;
    if (s->blocks)
        for (int b = 0; b < s->w->n_blocks; b++) {
            free(s->blocks[b].window);
            compressor_state_free(&s->blocks[b].compressor);
            compressor_state_free(&s->blocks[b].indexer);
        }
    free(s->blocks);
    free(s->scratch);
    free(s->last_hidden);
    free(s->mtp_states);
    free(s->kept_states);
    free(s);
}

void nn_session_reset(nn_session *s) {
    const model_config *c = s->c;
    s->position = 0;
    s->mtp_position = 0;
    s->kept_count = 0;
    for (int b = 0; b < s->w->n_blocks; b++) {
        memset(s->blocks[b].window, 0, (size_t)c->sliding_window * c->head_dim * sizeof(uint16_t));
        compressor_state_reset(&s->blocks[b].compressor);
        compressor_state_reset(&s->blocks[b].indexer);
    }
}

int nn_session_create(const model_weights *w, expert_source *experts, int max_context, int max_chunk,
                      nn_session **out, ds4f_error *err) {
    const model_config *c = &w->config;
    nn_session *s = calloc(1, sizeof *s);
    if (!s) return error_set(err, "out of memory");
    s->w = w;
    s->c = c;
    s->experts = experts;
    s->max_context = max_context;
    s->max_chunk = max_chunk;
    s->blocks = calloc((size_t)w->n_blocks, sizeof *s->blocks);
    if (!s->blocks) goto oom;
    for (int b = 0; b < w->n_blocks; b++) {
        block_state *st = &s->blocks[b];
        st->window = calloc((size_t)c->sliding_window * c->head_dim, sizeof(uint16_t));
        if (!st->window) goto oom;
        const int ratio = w->blocks[b].ratio;
        if (ratio && compressor_state_init(&st->compressor, ratio, c->head_dim, max_context) != 0) goto oom;
        if (ratio == 4 && compressor_state_init(&st->indexer, 4, c->index_head_dim, max_context) != 0) goto oom;
    }
    rope_table_init(&s->rope_plain, c->qk_rope_head_dim, c->rope_theta, 0, 1, 1, 1, 1);
    rope_table_init(&s->rope_compressed, c->qk_rope_head_dim, c->compress_rope_theta, 1, c->rope_factor,
                    c->rope_original_max_position, c->rope_beta_fast, c->rope_beta_slow);
    s->scratch_threads = kernels_threads();
    s->scratch_bytes = nn_session_scratch_bytes(c, max_chunk, max_context);
    s->scratch = aligned_alloc(64, (s->scratch_bytes + 63) & ~(size_t)63);
    s->last_hidden = malloc((size_t)max_chunk * c->hc_mult * c->hidden_size * sizeof(float));
    s->mtp_states = malloc((size_t)max_chunk * c->hc_mult * c->hidden_size * sizeof(float));
    if (!s->scratch || !s->last_hidden || !s->mtp_states) goto oom;
    nn_session_reset(s);
    *out = s;
    return 0;
oom:
    nn_session_free(s);
    return error_set(err, "out of memory creating the session state (context %d)", max_context);
}

int nn_session_keep_states(nn_session *s, int capacity, ds4f_error *err) {
    const model_config *c = s->c;
    free(s->kept_states);
    s->kept_states = malloc((size_t)capacity * c->hc_mult * c->hidden_size * sizeof(float));
    if (!s->kept_states) return error_set(err, "out of memory keeping %d states for the MTP block", capacity);
    s->keep_states = 1;
    s->kept_capacity = capacity;
    s->kept_count = 0;
    return 0;
}

int nn_block_forward(nn_session *s, int block, float *states, const int32_t *tokens, int n, int64_t first_pos,
                     ds4f_error *err) {
    const model_config *c = s->c;
    const block_weights *bw = &s->w->blocks[block];
    const int d = c->hidden_size, hc = c->hc_mult;
    scratch_arena scratch = {s->scratch, 0, s->scratch_bytes};
    float *residual = scratch_take(&scratch, (size_t)n * hc * d * sizeof(float));
    float *normed = scratch_take(&scratch, (size_t)n * d * sizeof(float));
    float *sub_out = scratch_take(&scratch, (size_t)n * d * sizeof(float));
    float *post = scratch_take(&scratch, (size_t)n * hc * sizeof(float));
    float *comb = scratch_take(&scratch, (size_t)n * hc * hc * sizeof(float));
    memcpy(residual, states, (size_t)n * hc * d * sizeof(float));

    float *mixes = scratch_take(&scratch, (size_t)n * (2 + hc) * hc * sizeof(float));
    hc_pre_tokens(c, &bw->hc_attn_fn, bw->hc_attn_scale, bw->hc_attn_base, states, n, mixes, normed, post, comb);
    rmsnorm_bf16_rows(normed, bw->attn_norm, d, c->rms_norm_eps, n);
    moe_prefetch(s, block, normed, tokens, n);
    if (attention_forward(s, block, normed, n, first_pos, sub_out, &scratch, err) != 0) return -1;
    hc_post_tokens(c, sub_out, residual, post, comb, n, states);

    memcpy(residual, states, (size_t)n * hc * d * sizeof(float));
    hc_pre_tokens(c, &bw->hc_ffn_fn, bw->hc_ffn_scale, bw->hc_ffn_base, states, n, mixes, normed, post, comb);
    rmsnorm_bf16_rows(normed, bw->ffn_norm, d, c->rms_norm_eps, n);
    if (moe_forward(s, block, normed, tokens, n, first_pos, sub_out, &scratch, err) != 0) return -1;
    hc_post_tokens(c, sub_out, residual, post, comb, n, states);
    if (s->probe.block_output)
        for (int t = 0; t < n; t++) s->probe.block_output(s->probe.ctx, block, first_pos + t, states + (size_t)t * hc * d);
    return 0;
}

/* hc_head collapse with the given parameters, a final norm, then the shared LM head (f32). */
static void head_forward(nn_session *s, const f32_matrix *fn, const float *scale, const float *base, const float *norm,
                         const float *states, int n, int64_t first_pos, float *logits, int report) {
    const model_config *c = s->c;
    const int d = c->hidden_size, hc = c->hc_mult;
    scratch_arena scratch = {s->scratch, 0, s->scratch_bytes};
    float *y = scratch_take(&scratch, (size_t)n * d * sizeof(float));
    float *mixes = scratch_take(&scratch, (size_t)n * hc * sizeof(float));
    hc_head_collapse_tokens(c, fn, scale, base, states, n, mixes, y);
    for (int t = 0; t < n; t++) {
        float *yt = y + (size_t)t * d;
        rmsnorm_bf16(yt, norm, d, c->rms_norm_eps, yt);
        if (report && s->probe.final_hidden) s->probe.final_hidden(s->probe.ctx, first_pos + t, yt);
    }
    /* one pass over the head's rows for all positions */
    if (logits) par_matmul_bf16(&s->w->head, y, d, n, logits, c->vocab_size, 0, c->vocab_size);
}

void nn_head(nn_session *s, const float *states, int n, int64_t first_pos, float *logits) {
    const model_weights *w = s->w;
    head_forward(s, &w->hc_head_fn, w->hc_head_scale, w->hc_head_base, w->norm, states, n, first_pos, logits, 1);
}

int nn_mtp_forward(nn_session *s, const float *main_states, const int32_t *next_tokens, int n, float *logits,
                   ds4f_error *err) {
    const model_config *c = s->c;
    if (c->num_nextn_predict_layers < 1) return error_set(err, "this model has no MTP block");
    const int d = c->hidden_size, hc = c->hc_mult, blk = c->num_hidden_layers;
    const block_weights *bw = &s->w->blocks[blk];
    for (int i = 0; i < n; i++)
        if (next_tokens[i] < 0 || next_tokens[i] >= c->vocab_size)
            return error_set(err, "token id %d is outside the vocabulary (0..%d)", next_tokens[i], c->vocab_size - 1);
    for (int start = 0; start < n; start += s->max_chunk) {
        const int m = n - start < s->max_chunk ? n - start : s->max_chunk;
        float *x = s->mtp_states;
        scratch_arena scratch = {s->scratch, 0, s->scratch_bytes};
        float *e = scratch_take(&scratch, (size_t)m * d * sizeof(float));
        float *e_proj = scratch_take(&scratch, (size_t)m * d * sizeof(float));
        float *h = scratch_take(&scratch, (size_t)m * hc * d * sizeof(float));
        for (int t = 0; t < m; t++) {
            const uint16_t *row = s->w->embed + (size_t)next_tokens[start + t] * d;
            float *et = e + (size_t)t * d;
            for (int i = 0; i < d; i++) et[i] = bf16_to_f32(row[i]);
            rmsnorm_bf16(et, bw->enorm, d, c->rms_norm_eps, et);
            for (int k = 0; k < hc; k++) {
                const float *src = main_states + ((size_t)(start + t) * hc + k) * d;
                rmsnorm_bf16(src, bw->hnorm, d, c->rms_norm_eps, h + ((size_t)t * hc + k) * d);
            }
        }
        linear_fp8_bf16(&bw->e_proj, e, d, m, e_proj, d, &scratch);
        linear_fp8_bf16(&bw->h_proj, h, d, m * hc, x, d, &scratch);
        /* e_proj(e) is broadcast over the streams and added in bf16. */
        for (int t = 0; t < m; t++)
            for (int k = 0; k < hc; k++)
                for (int i = 0; i < d; i++) {
                    float *v = x + ((size_t)t * hc + k) * d + i;
                    *v = bf16_round(e_proj[(size_t)t * d + i] + *v);
                }
        if (nn_block_forward(s, blk, x, next_tokens + start, m, s->mtp_position, err) != 0) return -1;
        head_forward(s, &bw->hc_head_fn, bw->hc_head_scale, bw->hc_head_base, bw->mtp_norm, x, m, s->mtp_position,
                     logits ? logits + (size_t)start * c->vocab_size : NULL, 0);
        s->mtp_position += m;
    }
    return 0;
}

int nn_forward(nn_session *s, const int32_t *tokens, int n, float *logits, int all_logits, ds4f_error *err) {
    const model_config *c = s->c;
    const int d = c->hidden_size, hc = c->hc_mult;
    if (s->position + n > s->max_context)
        return error_set(err, "context full: %lld + %d tokens exceed the context of %d", (long long)s->position, n,
                         s->max_context);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return error_set(err, "token id %d at index %d is outside the vocabulary (0..%d)", tokens[i], i, c->vocab_size - 1);
    float *states = s->last_hidden;
    if (s->keep_states && n > s->kept_capacity)
        return error_set(err, "%d positions in one call exceed the %d the session keeps for the MTP block", n, s->kept_capacity);
    s->kept_count = s->keep_states ? n : 0;
    for (int start = 0; start < n; start += s->max_chunk) {
        const int m = n - start < s->max_chunk ? n - start : s->max_chunk;
        for (int t = 0; t < m; t++) {
            const uint16_t *row = s->w->embed + (size_t)tokens[start + t] * d;
            for (int h = 0; h < hc; h++)
                for (int i = 0; i < d; i++) states[((size_t)t * hc + h) * d + i] = bf16_to_f32(row[i]);
        }
        for (int b = 0; b < c->num_hidden_layers; b++)
            if (nn_block_forward(s, b, states, tokens + start, m, s->position, err) != 0) return -1;
        if (s->keep_states)
            memcpy(s->kept_states + (size_t)start * hc * d, states, (size_t)m * hc * d * sizeof(float));
        if (logits && all_logits) {
            nn_head(s, states, m, s->position, logits + (size_t)start * c->vocab_size);
        } else if (logits && start + m == n) {
            nn_head(s, states + (size_t)(m - 1) * hc * d, 1, s->position + m - 1, logits);
        } else if (s->probe.final_hidden) {
            nn_head(s, states, m, s->position, NULL);
        }
        s->position += m;
    }
    return 0;
}
