/* Attention of one block (OFF-M Attention.forward, OFF-K sparse_attn_kernel; spec §3.4).
 *
 * One shared 512-wide K=V row per token (MQA). A query at position p sees the window p-127..p
 * plus compressed entries: all visible ones on ratio-128 layers, the indexer's choice on ratio-4
 * layers. Order of work per token, as OFF-M: indexer (its compressor may emit first), window
 * write, attention-compressor emission, then attention — every entry a query may see is emitted
 * before it attends. A chunk does the state-changing steps for all its tokens in order first,
 * recording what each token sees (its window rows, how many entries, the indexer's choice), then
 * the attention of all tokens, which only reads: the same keys in the same order either way. */
#include "nn/layers.h"
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

/* OFF-K processes the key list in blocks of 64 with an online softmax, rounding the
 * probabilities to bf16 for P.V relative to the running maximum of the blocks seen so far. The
 * list is the window (always `sliding_window` slots, oldest first, unfilled slots skipped: the
 * decode layout, used for every schedule so that results do not depend on it) followed by the
 * compressed entries. */
#define ATTN_KEY_BLOCK 64

/* Exact products for P.V: a bf16 probability times a bf16 key value (8 significant bits each) is
 * exact in f32 when the product is a normal number (kernels_products_exact: biased exponents
 * adding up to 128..380, neither operand subnormal, infinite or NaN); zeros always. Then the P.V kernel may fuse each
 * multiply and add (the same bits). The key values' range is found as they are copied to f32 (the
 * window history once per chunk, a token's compressed entries once per token), shared by every
 * head; each block's probabilities are checked as they are made. */
typedef struct bf16_exponents {
    unsigned lo, hi; /* smallest and largest magnitude bits (bf16: exponent << 7 | mantissa) of the nonzero values */
} bf16_exponents;

#define BF16_EXPONENTS_EMPTY ((bf16_exponents){0x7fff, 0})

static inline void bf16_exponents_add(bf16_exponents *r, uint16_t v) {
    const unsigned mag = v & 0x7fffu;
    if (mag && mag < r->lo) r->lo = mag;
    if (mag > r->hi) r->hi = mag;
}

/* n bf16 values -> f32, their range added to *range: 8 at a time in the compiler's generic
 * vectors (the range on 16-bit lanes, as signed: magnitudes are below 2^15), the rest one by one. */
typedef int32_t attn_i32x8 __attribute__((vector_size(32)));
typedef int16_t attn_i16x8 __attribute__((vector_size(16)));
typedef uint16_t attn_u16x8 __attribute__((vector_size(16)));
static void bf16_to_f32_ranged(const uint16_t *src, float *dst, int n, bf16_exponents *range) {
    const attn_i16x8 none = (attn_i16x8){0} + 0x7fff;
    attn_i16x8 lo = none, hi = (attn_i16x8){0};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        attn_u16x8 h;
        memcpy(&h, src + i, sizeof h);
        const attn_i32x8 u = __builtin_convertvector(h, attn_i32x8) << 16;
        memcpy(dst + i, &u, sizeof u);
        const attn_i16x8 mag = (attn_i16x8)h & 0x7fff;
        const attn_i16x8 zero = mag == 0;
        const attn_i16x8 mz = (mag & ~zero) | (none & zero);
        const attn_i16x8 below = mz < lo, above = mag > hi;
        lo = (mz & below) | (lo & ~below);
        hi = (mag & above) | (hi & ~above);
    }
    for (int k = 0; k < 8; k++) {
        if ((unsigned)lo[k] < range->lo) range->lo = (unsigned)lo[k];
        if ((unsigned)hi[k] > range->hi) range->hi = (unsigned)hi[k];
    }
    for (; i < n; i++) {
        dst[i] = bf16_to_f32(src[i]);
        bf16_exponents_add(range, src[i]);
    }
}

/* the biased exponents are the magnitude bits' top 8 (hi 0: all zeros) */
static int bf16_products_exact(bf16_exponents a, bf16_exponents b) {
    return kernels_products_exact(a.lo >> 7, a.hi >> 7, b.lo >> 7, b.hi >> 7);
}

typedef struct key_list {
    const float *const *rows; /* [count] -> hd f32 copies of the bf16 values of each key */
    const int *slot;     /* list position of each row (decides its 64-block) */
    int count;
    bf16_exponents range; /* of all the rows' values */
} key_list;

/* A group of heads' softmax over their precomputed scores (q . k * softmax_scale for every key, in
 * list order) and the bf16-probability weighted sums of the keys. Each head's steps are its own
 * (running maximum, rescale, probabilities, denominator); the heads go through the key blocks
 * together so that the P.V kernel reads each key row once for all of them. */
#define ATTN_HEAD_GROUP 8
static void sparse_attention_heads(const float *scores, int score_stride, const key_list *keys, int hd,
                                   const float *sinks, int nh, float *acc, float *o) {
    float m[ATTN_HEAD_GROUP], denom[ATTN_HEAD_GROUP], rescale[ATTN_HEAD_GROUP];
    float weights[ATTN_HEAD_GROUP][ATTN_KEY_BLOCK];
    for (int h = 0; h < nh; h++) m[h] = -INFINITY, denom[h] = 0.0f;
    memset(acc, 0, (size_t)nh * hd * sizeof(float));
    int i = 0;
    while (i < keys->count) {
        const int block = keys->slot[i] / ATTN_KEY_BLOCK;
        int end = i;
        while (end < keys->count && keys->slot[end] / ATTN_KEY_BLOCK == block) end++;
        /* each head's bf16 probabilities of the block, then acc * rescale + their weighted sum of
         * the keys in key order */
        bf16_exponents weight_range = BF16_EXPONENTS_EMPTY;
        for (int h = 0; h < nh; h++) {
            const float *sh = scores + (size_t)h * score_stride;
            float m_new = m[h];
            for (int j = i; j < end; j++) m_new = max_num_f32(m_new, sh[j]);
            rescale[h] = expf(m[h] - m_new);
            double psum = 0;
            for (int j = i; j < end; j++) {
                const float p = expf(sh[j] - m_new);
                psum += p;
                const uint16_t w = f32_to_bf16(p);
                weights[h][j - i] = bf16_to_f32(w);
                bf16_exponents_add(&weight_range, w);
            }
            denom[h] = denom[h] * rescale[h] + (float)psum;
            m[h] = m_new;
        }
        rescale_add_weighted_rows_f32(acc, rescale, &weights[0][0], ATTN_KEY_BLOCK, nh, keys->rows + i, end - i, hd,
                                      bf16_products_exact(weight_range, keys->range));
        i = end;
    }
    /* The sink enlarges the denominator only; it is not part of the running maximum. */
    for (int h = 0; h < nh; h++) {
        const float d = denom[h] + expf(sinks[h] - m[h]);
        for (int dd = 0; dd < hd; dd++) o[(size_t)h * hd + dd] = bf16_round(acc[(size_t)h * hd + dd] / d);
    }
}

/* The heads of one token in groups of ATTN_HEAD_GROUP, split across the thread pool (each group
 * writes only its own outputs and uses its own accumulators). */
typedef struct heads_job {
    const key_list *keys;
    const float *scores;      /* [H][score_stride] */
    int score_stride, hd, nope, n_heads;
    const float *sinks;
    const rope_angles *angles; /* of the token's position */
    float *acc;               /* [H][hd] */
    float *o;                 /* [H][hd] */
} heads_job;

static void heads_task(void *ctx, int group) {
    const heads_job *j = ctx;
    const int h0 = group * ATTN_HEAD_GROUP;
    const int nh = j->n_heads - h0 < ATTN_HEAD_GROUP ? j->n_heads - h0 : ATTN_HEAD_GROUP;
    sparse_attention_heads(j->scores + (size_t)h0 * j->score_stride, j->score_stride, j->keys, j->hd, j->sinks + h0, nh,
                           j->acc + (size_t)h0 * j->hd, j->o + (size_t)h0 * j->hd);
    /* K = V carries RoPE on its last rd dims: rotate the outputs back. */
    for (int h = h0; h < h0 + nh; h++) rope_rotate_bf16(j->angles, j->o + (size_t)h * j->hd + j->nope, 1);
}

/* Keys a token of a layer with this ratio may see: the window and the compressed entries. */
static int attention_max_keys(const model_config *c, int ratio, int max_context) {
    return c->sliding_window + (ratio == 128 ? max_context / 128 + 1 : ratio == 4 ? c->index_topk : 0);
}

/* Work space of one token's attention: f32 copies of its compressed entries, every key's address
 * and list position, every head's scores, accumulators. One per thread when a chunk's tokens run
 * side by side. */
static size_t attention_token_bytes(const model_config *c, int max_keys) {
    const size_t H = (size_t)c->num_attention_heads, hd = (size_t)c->head_dim, f = sizeof(float);
    const size_t comp = max_keys > c->sliding_window ? (size_t)(max_keys - c->sliding_window) : 0;
    const size_t bytes = comp * hd * f + (size_t)max_keys * (sizeof(float *) + sizeof(int)) + H * (size_t)max_keys * f + H * hd * f;
    return (bytes + 63) & ~(size_t)63;
}

size_t attention_scratch_bytes(const model_config *c, int max_chunk, int max_context, int threads) {
    /* the longest key list of the three layer kinds (ratio 0 has the window alone) */
    const int k4 = attention_max_keys(c, 4, max_context), k128 = attention_max_keys(c, 128, max_context);
    const int max_keys = k4 > k128 ? k4 : k128;
    const size_t history = ((size_t)c->sliding_window + (size_t)max_chunk) * (size_t)c->head_dim * sizeof(float);
    const size_t per_token = (size_t)c->index_topk * sizeof(int32_t) + sizeof(int);
    return attention_token_bytes(c, max_keys) * (size_t)threads + history + (size_t)max_chunk * per_token + 4 * 64;
}

/* Every token's attention over the keys phase one left for it (it only reads shared state). */
typedef struct attend_job {
    const model_config *c;
    const block_weights *bw;
    const rope_table *rope;
    int64_t first_pos;
    int win, ratio, max_keys;
    const float *history;    /* rows of positions [history_first, first_pos + n): f32 copies of bf16 */
    bf16_exponents history_range;
    int64_t history_first;
    const uint16_t *entries; /* the attention compressor's entries */
    const int32_t *selected; /* [n][index_topk]: ratio 4, the indexer's choice per token */
    const int *n_comp;       /* [n]: compressed entries each token sees */
    const float *q;          /* [n][H][hd] */
    float *o;                /* [n][H][hd] */
    float softmax_scale;
    uint8_t *work;           /* attention_token_bytes per thread */
} attend_job;

static void attend_rows(void *ctx, int begin, int end) {
    const attend_job *j = ctx;
    const model_config *c = j->c;
    const int H = c->num_attention_heads, hd = c->head_dim, nope = hd - c->qk_rope_head_dim, win = j->win;
    uint8_t *work = j->work + attention_token_bytes(c, j->max_keys) * (size_t)kernels_thread_index();
    const int max_comp = j->max_keys - c->sliding_window;
    float *comp_rows = (float *)work;
    const float **key_row = (const float **)(comp_rows + (size_t)(max_comp > 0 ? max_comp : 0) * hd);
    int *key_slot = (int *)(key_row + j->max_keys);
    float *head_scores = (float *)(key_slot + j->max_keys);
    float *acc = head_scores + (size_t)H * j->max_keys;
    for (int t = begin; t < end; t++) {
        const int64_t pos = j->first_pos + t;
        /* The key list: window positions oldest first (list positions 0..win-1; consecutive rows
         * of the history), then the compressed entries (copied). The range of their values is
         * taken over the whole history: a superset, so exactness still holds where it says so. */
        int count = 0;
        bf16_exponents range = j->history_range;
        const int64_t oldest = pos >= win - 1 ? pos - win + 1 : 0;
        const float *window_rows = j->history + (size_t)(oldest - j->history_first) * hd;
        for (int64_t p = oldest; p <= pos; p++, count++) {
            key_row[count] = window_rows + (size_t)(p - oldest) * hd;
            key_slot[count] = (int)(p - oldest);
        }
        const int n_window = count;
        for (int i = 0; i < j->n_comp[t]; i++, count++) {
            const int e = j->ratio == 128 ? i : j->selected[(size_t)t * c->index_topk + i];
            bf16_to_f32_ranged(j->entries + (size_t)e * hd, comp_rows + (size_t)i * hd, hd, &range);
            key_row[count] = comp_rows + (size_t)i * hd;
            key_slot[count] = win + i;
        }
        key_list keys = {key_row, key_slot, count, range};
        /* Every head's scores at once: the keys are the rows of an f32 matrix (the window's, then
         * the compressed entries') and the heads its inputs (each score is the sequential dot
         * product of the scalar reference, whatever matrix its key is a row of). */
        const f32_matrix window_matrix = {(float *)window_rows, n_window, hd};
        par_matmul_f32(&window_matrix, j->q + (size_t)t * H * hd, hd, H, head_scores, count, 0, n_window);
        if (count > n_window) {
            const f32_matrix comp_matrix = {comp_rows, count - n_window, hd};
            par_matmul_f32(&comp_matrix, j->q + (size_t)t * H * hd, hd, H, head_scores + n_window, count, 0,
                           count - n_window);
        }
        for (int i = 0; i < H * count; i++) head_scores[i] = head_scores[i] * j->softmax_scale;
        rope_angles angles;
        rope_angles_at(j->rope, pos, &angles);
        heads_job job = {&keys, head_scores, count, hd, nope, H, j->bw->attn_sink, &angles, acc, j->o + (size_t)t * H * hd};
        const int groups = (H + ATTN_HEAD_GROUP - 1) / ATTN_HEAD_GROUP;
        /* waking the pool costs more than a few small heads (inside a pool task: always inline) */
        if ((size_t)H * count * hd < (1u << 16))
            for (int g = 0; g < groups; g++) heads_task(&job, g);
        else
            kernels_parallel_for(heads_task, &job, groups);
    }
}

void linear_fp8_bf16(const fp8_matrix *w, const float *x, int x_stride, int n, float *y, int y_stride,
                     scratch_arena *scratch) {
    size_t mark = scratch->used;
    uint8_t *codes = scratch_take(scratch, (size_t)n * w->cols);
    float *scales = scratch_take(scratch, (size_t)n * (w->cols / FP8_ACT_BLOCK) * sizeof(float));
    par_quantize_fp8_act(x, x_stride, w->cols, n, codes, scales);
    par_matmul_fp8_bf16(w, codes, scales, n, y, y_stride, 0, w->rows);
    scratch->used = mark;
}

/* The per-token steps between the projections (tokens independent: split across the pool). */
typedef struct token_steps {
    const model_config *c;
    const block_weights *bw;
    const rope_table *rope;
    int64_t first_pos;
    float *q, *kv, *qi;
} token_steps;

/* per-head normalisation and RoPE of q */
static void q_heads_rows(void *ctx, int begin, int end) {
    const token_steps *j = ctx;
    const int H = j->c->num_attention_heads, hd = j->c->head_dim, nope = hd - j->c->qk_rope_head_dim;
    for (int t = begin; t < end; t++) {
        rope_angles angles;
        rope_angles_at(j->rope, j->first_pos + t, &angles);
        for (int h = 0; h < H; h++) {
            float *qh = j->q + ((size_t)t * H + h) * hd;
            head_rms_normalize_bf16(qh, hd, j->c->rms_norm_eps);
            rope_rotate_bf16(&angles, qh + nope, 0);
        }
    }
}

/* kv_norm, RoPE, FP8 simulation of the non-rope dims */
static void kv_rows(void *ctx, int begin, int end) {
    const token_steps *j = ctx;
    const int hd = j->c->head_dim, nope = hd - j->c->qk_rope_head_dim;
    for (int t = begin; t < end; t++) {
        float *k = j->kv + (size_t)t * hd;
        rmsnorm_bf16(k, j->bw->kv_norm, hd, j->c->rms_norm_eps, k);
        rope_apply_bf16(j->rope, k + nope, j->first_pos + t, 0);
        fp8_simulate_bf16(k, nope, 64);
    }
}

/* the indexer's queries: RoPE, Hadamard rotation, FP4 simulation */
static void index_q_rows(void *ctx, int begin, int end) {
    const token_steps *j = ctx;
    const int iH = j->c->index_n_heads, ihd = j->c->index_head_dim, rd = j->c->qk_rope_head_dim;
    for (int t = begin; t < end; t++) {
        rope_angles angles;
        rope_angles_at(j->rope, j->first_pos + t, &angles);
        for (int h = 0; h < iH; h++) {
            float *qh = j->qi + ((size_t)t * iH + h) * ihd;
            rope_rotate_bf16(&angles, qh + ihd - rd, 0);
            hadamard_bf16(qh, ihd);
            fp4_simulate_bf16(qh, ihd, 32);
        }
    }
}

/* Normalises, ropes and simulates the storage rounding of a freshly pooled compressed entry, then
 * appends it (bf16) to the state's entries. */
static void store_entry(nn_session *s, compressor_state *st, const compressor_weights *cw, float *entry, int64_t pos,
                        int is_indexer) {
    const model_config *c = s->c;
    const int D = cw->head_dim, rd = c->qk_rope_head_dim;
    rmsnorm_bf16(entry, cw->norm, D, c->rms_norm_eps, entry);
    /* RoPE at the first token of the window. */
    rope_apply_bf16(&s->rope_compressed, entry + D - rd, pos + 1 - cw->ratio, 0);
    if (is_indexer) {
        hadamard_bf16(entry, D);
        fp4_simulate_bf16(entry, D, 32);
    } else {
        fp8_simulate_bf16(entry, D - rd, 64);
    }
    uint16_t *dst = st->entries + (size_t)st->n_entries * D;
    for (int i = 0; i < D; i++) dst[i] = f32_to_bf16(entry[i]);
    st->n_entries++;
}

int attention_forward(nn_session *s, int block, const float *a, int n, int64_t first_pos, float *out,
                      scratch_arena *scratch, ds4f_error *err) {
    const model_config *c = s->c;
    const block_weights *bw = &s->w->blocks[block];
    block_state *st = &s->blocks[block];
    const int d = c->hidden_size, H = c->num_attention_heads, hd = c->head_dim;
    const int qlr = c->q_lora_rank, G = c->o_groups, olr = c->o_lora_rank, win = c->sliding_window;
    const int ratio = bw->ratio;
    const rope_table *rope = ratio ? &s->rope_compressed : &s->rope_plain;
    const size_t mark = scratch->used;

    /* q: wq_a -> q_norm -> wq_b -> per-head normalisation -> RoPE on the last rd dims */
    token_steps steps = {c, bw, rope, first_pos, NULL, NULL, NULL};
    float *qr = scratch_take(scratch, (size_t)n * qlr * sizeof(float));
    linear_fp8_bf16(&bw->wq_a, a, d, n, qr, qlr, scratch);
    rmsnorm_bf16_rows(qr, bw->q_norm, qlr, c->rms_norm_eps, n);
    float *q = steps.q = scratch_take(scratch, (size_t)n * H * hd * sizeof(float));
    linear_fp8_bf16(&bw->wq_b, qr, qlr, n, q, H * hd, scratch);
    kernels_parallel_rows(q_heads_rows, &steps, n);

    /* kv: wkv -> kv_norm -> RoPE -> FP8 simulation of the non-rope dims */
    float *kv = steps.kv = scratch_take(scratch, (size_t)n * hd * sizeof(float));
    linear_fp8_bf16(&bw->wkv, a, d, n, kv, hd, scratch);
    kernels_parallel_rows(kv_rows, &steps, n);

    /* Compressor projections: f32 weights (the BF16 checkpoint values) on the f32 input. */
    float *ckv = NULL, *cgate = NULL, *ikv = NULL, *igate = NULL, *qi = NULL, *wi = NULL;
    const int cwidth = ratio == 4 ? 2 * hd : hd;
    const int iH = c->index_n_heads, ihd = c->index_head_dim;
    if (ratio) {
        ckv = scratch_take(scratch, (size_t)n * cwidth * sizeof(float));
        cgate = scratch_take(scratch, (size_t)n * cwidth * sizeof(float));
        par_matmul_bf16(&bw->compressor.wkv, a, d, n, ckv, cwidth, 0, cwidth);
        par_matmul_bf16(&bw->compressor.wgate, a, d, n, cgate, cwidth, 0, cwidth);
    }
    if (ratio == 4) {
        qi = steps.qi = scratch_take(scratch, (size_t)n * iH * ihd * sizeof(float));
        linear_fp8_bf16(&bw->indexer_wq_b, qr, qlr, n, qi, iH * ihd, scratch);
        kernels_parallel_rows(index_q_rows, &steps, n);
        ikv = scratch_take(scratch, (size_t)n * 2 * ihd * sizeof(float));
        igate = scratch_take(scratch, (size_t)n * 2 * ihd * sizeof(float));
        par_matmul_bf16(&bw->indexer_compressor.wkv, a, d, n, ikv, 2 * ihd, 0, 2 * ihd);
        par_matmul_bf16(&bw->indexer_compressor.wgate, a, d, n, igate, 2 * ihd, 0, 2 * ihd);
        /* weights_proj is a plain bf16 linear; the scale multiplies the bf16 result. */
        wi = scratch_take(scratch, (size_t)n * iH * sizeof(float));
        par_matmul_bf16(&bw->indexer_weights_proj, a, d, n, wi, iH, 0, iH);
        const float head_scale = (float)(1.0 / sqrt((double)ihd) / sqrt((double)iH));
        for (int i = 0; i < n * iH; i++) wi[i] = bf16_round(bf16_round(wi[i]) * head_scale);
    }

    /* Per token, in position order: emissions, window writes, the indexer's choice (these change
     * the layer's state, so they run in order); then every token's attention, which only reads. A
     * token's window is read from `history`, the bf16 rows of positions [history_first, first_pos
     * + n) (the ring's last rows before the chunk, then the chunk's own), because later tokens of
     * the chunk overwrite the ring slots an earlier token sees. */
    const int max_keys = attention_max_keys(c, ratio, s->max_context);
    const int topk = c->index_topk;
    float *entry = scratch_take(scratch, (size_t)(hd > ihd ? hd : ihd) * sizeof(float));
    const int max_index_entries = s->max_context / 4 + 1;
    float *index_scores = ratio == 4 ? scratch_take(scratch, ((size_t)max_index_entries + 2 * (size_t)topk) * sizeof(float)) : NULL;
    int32_t *selected = ratio == 4 ? scratch_take(scratch, (size_t)n * topk * sizeof(int32_t)) : NULL;
    float *index_head_scores = ratio == 4 ? scratch_take(scratch, (size_t)iH * max_index_entries * sizeof(float)) : NULL;
    int *n_comp = scratch_take(scratch, (size_t)n * sizeof(int));
    float *o = scratch_take(scratch, (size_t)n * H * hd * sizeof(float));
    const int64_t history_first = first_pos >= win - 1 ? first_pos - win + 1 : 0;
    float *history = scratch_take(scratch, (size_t)(first_pos + n - history_first) * hd * sizeof(float));
    bf16_exponents history_range = BF16_EXPONENTS_EMPTY;
    for (int64_t p = history_first; p < first_pos; p++)
        bf16_to_f32_ranged(st->window + (size_t)(p % win) * hd, history + (size_t)(p - history_first) * hd, hd,
                           &history_range);

    for (int t = 0; t < n; t++) {
        const int64_t pos = first_pos + t;
        int n_selected = 0;
        if (ratio == 4) {
            int32_t *chosen = selected + (size_t)t * topk;
            if (compressor_push(&st->indexer, ikv + (size_t)t * 2 * ihd, igate + (size_t)t * 2 * ihd,
                                bw->indexer_compressor.ape, pos, entry))
                store_entry(s, &st->indexer, &bw->indexer_compressor, entry, pos, 1);
            n_selected = indexer_select(s, &st->indexer, qi + (size_t)t * iH * ihd, wi + (size_t)t * iH, pos,
                                        index_head_scores, index_scores, chosen);
            if (s->probe.indexer) {
                int visible = (int)((pos + 1) / 4);
                int32_t sorted[4096];
                int k = n_selected < 4096 ? n_selected : 4096;
                for (int i = 0; i < k; i++) sorted[i] = chosen[i];
                for (int i = 1; i < k; i++)
                    for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
                        int32_t tmp = sorted[j];
                        sorted[j] = sorted[j - 1];
                        sorted[j - 1] = tmp;
                    }
                s->probe.indexer(s->probe.ctx, block, pos, index_scores, visible, sorted, k);
            }
        }
        uint16_t *slot = st->window + (size_t)(pos % win) * hd;
        for (int i = 0; i < hd; i++) slot[i] = f32_to_bf16(kv[(size_t)t * hd + i]);
        bf16_to_f32_ranged(slot, history + (size_t)(pos - history_first) * hd, hd, &history_range);
        if (ratio && compressor_push(&st->compressor, ckv + (size_t)t * cwidth, cgate + (size_t)t * cwidth,
                                     bw->compressor.ape, pos, entry))
            store_entry(s, &st->compressor, &bw->compressor, entry, pos, 0);
        /* the compressed entries this token sees: every one emitted so far (ratio 128), the
         * indexer's choice (ratio 4) */
        n_comp[t] = ratio == 128 ? (int)((pos + 1) / 128) : n_selected;
        if (ratio == 128 && n_comp[t] > st->compressor.n_entries) n_comp[t] = st->compressor.n_entries;
    }

    attend_job job = {c,           bw,       rope, first_pos, win, ratio, max_keys, history, history_range, history_first,
                      st->compressor.entries, selected, n_comp, q, o, (float)(1.0 / sqrt((double)hd)),
                      scratch_take(scratch, attention_token_bytes(c, max_keys) * (size_t)s->scratch_threads)};
    /* A chunk's tokens side by side, one thread each; a few tokens (decode) one at a time with the
     * products and heads of each split across the threads instead. */
    const int threads = kernels_threads();
    if (n >= 2 * threads && threads <= s->scratch_threads)
        kernels_parallel_rows(attend_rows, &job, n);
    else
        attend_rows(&job, 0, n);

    /* Grouped low-rank output: group g maps heads [g*H/G, (g+1)*H/G) through its wo_a rows. */
    const int group_in = H / G * hd;
    float *z = scratch_take(scratch, (size_t)n * G * olr * sizeof(float));
    for (int g = 0; g < G; g++)
        par_matmul_fp8_dequant(&bw->wo_a, o + (size_t)g * group_in, H * hd, n, z, G * olr, g * olr, (g + 1) * olr);
    par_round_bf16(z, G * olr, G * olr, n);
    linear_fp8_bf16(&bw->wo_b, z, G * olr, n, out, d, scratch);
    scratch->used = mark;
    (void)err;
    return 0;
}
