/* Hyper-connections (OFF-M Block.hc_pre / hc_post, ParallelHead.hc_head, OFF-K
 * hc_split_sinkhorn_kernel). All f32; the state between sublayers is bf16 (OFF-M keeps it in the
 * model dtype), so outputs are rounded to bf16 where the official code returns its dtype. */
#include "nn/layers.h"
#include "kernels/kernels.h"
#include "kernels/plain_c_targets.h"

#include <math.h>
#include <string.h>

/* rsqrt(mean(x^2) + eps) over the whole flattened state, f32 (sum accumulated in f64). */
static float state_rsqrt(const float *x, int n, float eps) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    return 1.0f / sqrtf((float)s / (float)n + eps);
}

void hc_sinkhorn(float *comb, int n, int iters, float eps) {
    /* comb = softmax(comb, rows) + eps, then column-normalise, then (iters-1) x (rows, columns);
     * eps in every denominator, exactly as hc_split_sinkhorn_kernel. */
    for (int j = 0; j < n; j++) {
        float *row = comb + j * n;
        float m = row[0];
        for (int k = 1; k < n; k++) m = max_num_f32(m, row[k]);
        double sum = 0;
        for (int k = 0; k < n; k++) {
            row[k] = expf(row[k] - m);
            sum += row[k];
        }
        for (int k = 0; k < n; k++) row[k] = row[k] / (float)sum + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int j = 0; j < n; j++) {
                double sum = 0;
                for (int k = 0; k < n; k++) sum += comb[j * n + k];
                float den = (float)sum + eps;
                for (int k = 0; k < n; k++) comb[j * n + k] = comb[j * n + k] / den;
            }
        for (int k = 0; k < n; k++) {
            double sum = 0;
            for (int j = 0; j < n; j++) sum += comb[j * n + k];
            float den = (float)sum + eps;
            for (int j = 0; j < n; j++) comb[j * n + k] = comb[j * n + k] / den;
        }
    }
}

/* Weighted sum of the streams, f32 in stream order, rounded to bf16. */
static void collapse_streams(const float *state, const float *pre, int hc, int d, float *u) {
    for (int i = 0; i < d; i++) {
        float acc = pre[0] * state[i];
        for (int h = 1; h < hc; h++) acc = acc + pre[h] * state[(size_t)h * d + i];
        u[i] = bf16_round(acc);
    }
}

/* Everything after the mixing product, for one position. */
static void hc_pre_finish(const model_config *c, const float *scale, const float *base, const float *state,
                          float *mixes, float *u, float *post, float *comb) {
    const int hc = c->hc_mult, d = c->hidden_size, mix = (2 + hc) * hc;
    const float rs = state_rsqrt(state, hc * d, c->rms_norm_eps);
    for (int i = 0; i < mix; i++) mixes[i] = mixes[i] * rs;
    float pre[16];
    for (int i = 0; i < hc; i++) pre[i] = sigmoid_f32(mixes[i] * scale[0] + base[i]) + c->hc_eps;
    for (int i = 0; i < hc; i++) post[i] = 2.0f * sigmoid_f32(mixes[hc + i] * scale[1] + base[hc + i]);
    for (int i = 0; i < hc * hc; i++) comb[i] = mixes[2 * hc + i] * scale[2] + base[2 * hc + i];
    hc_sinkhorn(comb, hc, c->hc_sinkhorn_iters, c->hc_eps);
    collapse_streams(state, pre, hc, d, u);
}

void hc_pre(const model_config *c, const f32_matrix *fn, const float *scale, const float *base, const float *state,
            float *u, float *post, float *comb) {
    const int hc = c->hc_mult, d = c->hidden_size, mix = (2 + hc) * hc;
    float mixes[(2 + 16) * 16];
    par_matmul_f32(fn, state, hc * d, 1, mixes, mix, 0, mix);
    hc_pre_finish(c, scale, base, state, mixes, u, post, comb);
}

/* The per-position work of hc_pre_tokens, split across the pool (positions are independent). */
typedef struct hc_pre_job {
    const model_config *c;
    const float *scale, *base, *states;
    float *mixes, *u, *post, *comb;
} hc_pre_job;

static void hc_pre_rows(void *ctx, int begin, int end) {
    const hc_pre_job *j = ctx;
    const int hc = j->c->hc_mult, d = j->c->hidden_size, mix = (2 + hc) * hc;
    for (int t = begin; t < end; t++)
        hc_pre_finish(j->c, j->scale, j->base, j->states + (size_t)t * hc * d, j->mixes + (size_t)t * mix,
                      j->u + (size_t)t * d, j->post + (size_t)t * hc, j->comb + (size_t)t * hc * hc);
}

void hc_pre_tokens(const model_config *c, const f32_matrix *fn, const float *scale, const float *base,
                   const float *states, int n, float *mixes, float *u, float *post, float *comb) {
    const int hc = c->hc_mult, d = c->hidden_size, mix = (2 + hc) * hc;
    par_matmul_f32(fn, states, hc * d, n, mixes, mix, 0, mix);
    hc_pre_job j = {c, scale, base, states, mixes, u, post, comb};
    kernels_parallel_rows(hc_pre_rows, &j, n);
}

/* One position: state [hc][d] <- bf16(post[k] * out + sum_j comb[j][k] * residual[j]), each
 * element's sum in stream order; 8 elements at a time in the compiler's generic vectors (the same
 * operations per element, so the same bits), then rounded. */
typedef float hc_f32x8 __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) void hc_post(const model_config *c, const float *out, const float *residual,
                                                         const float *post, const float *comb, float *state) {
    const int hc = c->hc_mult, d = c->hidden_size;
    for (int k = 0; k < hc; k++) {
        float *dst = state + (size_t)k * d;
        int i = 0;
        for (; i + 8 <= d; i += 8) {
            hc_f32x8 r, o, mixed;
            memcpy(&r, residual + i, sizeof r);
            mixed = comb[k] * r; /* comb is used transposed: stream k gathers sum_j comb[j][k] * residual[j] */
            for (int j = 1; j < hc; j++) {
                memcpy(&r, residual + (size_t)j * d + i, sizeof r);
                mixed = mixed + comb[j * hc + k] * r;
            }
            memcpy(&o, out + i, sizeof o);
            const hc_f32x8 v = post[k] * o + mixed;
            memcpy(dst + i, &v, sizeof v);
        }
        for (; i < d; i++) {
            float mixed = comb[k] * residual[i];
            for (int j = 1; j < hc; j++) mixed = mixed + comb[j * hc + k] * residual[(size_t)j * d + i];
            dst[i] = post[k] * out[i] + mixed;
        }
        bf16_round_array(dst, (size_t)d);
    }
}

typedef struct hc_post_job {
    const model_config *c;
    const float *out, *residual, *post, *comb;
    float *states;
} hc_post_job;

/* hc_post inlined into plain C copies per vector level (kernels/plain_c_targets.h) */
static inline __attribute__((always_inline)) void hc_post_range_body(const hc_post_job *j, int begin, int end) {
    const int hc = j->c->hc_mult, d = j->c->hidden_size;
    for (int t = begin; t < end; t++)
        hc_post(j->c, j->out + (size_t)t * d, j->residual + (size_t)t * hc * d, j->post + (size_t)t * hc,
                j->comb + (size_t)t * hc * hc, j->states + (size_t)t * hc * d);
}
PLAIN_C_TARGETS(hc_post_range, (const hc_post_job *j, int begin, int end), (j, begin, end))

static void hc_post_rows(void *ctx, int begin, int end) {
    PLAIN_C_TARGETS_CALL(hc_post_range, ((const hc_post_job *)ctx, begin, end));
}

void hc_post_tokens(const model_config *c, const float *out, const float *residual, const float *post,
                    const float *comb, int n, float *states) {
    hc_post_job j = {c, out, residual, post, comb, states};
    kernels_parallel_rows(hc_post_rows, &j, n);
}

void hc_head_collapse(const model_config *c, const f32_matrix *fn, const float *scale, const float *base,
                      const float *state, float *y) {
    float mixes[16];
    hc_head_collapse_tokens(c, fn, scale, base, state, 1, mixes, y);
}

void hc_head_collapse_tokens(const model_config *c, const f32_matrix *fn, const float *scale, const float *base,
                             const float *states, int n, float *mixes, float *y) {
    const int hc = c->hc_mult, d = c->hidden_size;
    par_matmul_f32(fn, states, hc * d, n, mixes, hc, 0, hc);
    for (int t = 0; t < n; t++) {
        const float *state = states + (size_t)t * hc * d;
        const float rs = state_rsqrt(state, hc * d, c->rms_norm_eps);
        float pre[16];
        for (int i = 0; i < hc; i++) pre[i] = sigmoid_f32(mixes[(size_t)t * hc + i] * rs * scale[0] + base[i]) + c->hc_eps;
        collapse_streams(state, pre, hc, d, y + (size_t)t * d);
    }
}
