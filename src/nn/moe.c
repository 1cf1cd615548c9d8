/* Mixture of experts (OFF-M Gate / Expert / MoE, spec §3.5).
 *
 * Router: f32 scores sqrt(softplus(gate . b)); the first num_hash_layers blocks take their experts
 * from tid2eid[token], the others the top-k of score + bias (the bias chooses, it never weighs).
 * Weights are the unbiased scores of the chosen experts, normalised, times routed_scaling_factor.
 * Experts run in ascending id and accumulate in f32; the shared expert is added last; the sum is
 * rounded to bf16. The SwiGLU clamp applies to routed and shared experts (current revision). */
#include "nn/layers.h"
#include "kernels/kernels.h"
#include "base/timer.h"

#include <math.h>
#include <string.h>

/* SwiGLU of one expert on an already quantized input: h = bf16(weight * silu(min(g, L)) * clamp(u, -L, L)),
 * then the down projection, whose bf16 output is returned in f32 `out`. */
static void run_expert(const model_config *c, const void *w1, const void *w3, const void *w2, int fp4, float weight,
                       int weighted, const uint8_t *x_codes, const float *x_scales, float *gate, float *up,
                       uint8_t *h_codes, float *h_scales, float *out) {
    const int inter = c->moe_intermediate_size, d = c->hidden_size;
    const float limit = c->swiglu_limit;
    if (fp4) {
        matmul_fp4(w1, x_codes, x_scales, 1, gate, inter, 0, inter);
        matmul_fp4(w3, x_codes, x_scales, 1, up, inter, 0, inter);
    } else {
        matmul_fp8(w1, x_codes, x_scales, 1, gate, inter, 0, inter);
        matmul_fp8(w3, x_codes, x_scales, 1, up, inter, 0, inter);
    }
    for (int i = 0; i < inter; i++) {
        float g = bf16_round(gate[i]), u = bf16_round(up[i]);
        if (limit > 0) {
            u = fminf(fmaxf(u, -limit), limit);
            g = fminf(g, limit);
        }
        float h = silu_f32(g) * u;
        if (weighted) h = weight * h;
        gate[i] = bf16_round(h);
    }
    quantize_fp8_act(gate, inter, h_codes, h_scales);
    if (fp4) matmul_fp4(w2, h_codes, h_scales, 1, out, d, 0, d);
    else matmul_fp8(w2, h_codes, h_scales, 1, out, d, 0, d);
    round_bf16_inplace(out, d);
}

int moe_forward(nn_session *s, int block, const float *b, const int32_t *tokens, int n, int64_t first_pos, float *out,
                scratch_arena *scratch, ds4f_error *err) {
    const model_config *c = s->c;
    const block_weights *bw = &s->w->blocks[block];
    const int d = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok, inter = c->moe_intermediate_size;
    const size_t mark = scratch->used;
    float *scores = scratch_take(scratch, (size_t)E * sizeof(float));
    float *logits = scratch_take(scratch, (size_t)E * sizeof(float));
    uint8_t *x_codes = scratch_take(scratch, (size_t)d);
    float *x_scales = scratch_take(scratch, (size_t)(d / FP8_ACT_BLOCK) * sizeof(float));
    uint8_t *h_codes = scratch_take(scratch, (size_t)inter);
    float *h_scales = scratch_take(scratch, (size_t)(inter / FP8_ACT_BLOCK) * sizeof(float));
    float *gate = scratch_take(scratch, (size_t)inter * sizeof(float));
    float *up = scratch_take(scratch, (size_t)inter * sizeof(float));
    float *expert_out = scratch_take(scratch, (size_t)d * sizeof(float));
    float *acc = scratch_take(scratch, (size_t)d * sizeof(float));
    int32_t ids[64];
    float weights[64];
    expert_view views[64];
    int rc = 0;

    for (int t = 0; t < n && rc == 0; t++) {
        const float *bt = b + (size_t)t * d;
        matmul_bf16(&bw->gate, bt, d, 1, logits, E, 0, E);
        for (int e = 0; e < E; e++) scores[e] = sqrtf(softplus_f32(logits[e]));
        if (bw->hash_routed) {
            for (int k = 0; k < K; k++) ids[k] = (int32_t)bw->tid2eid[(size_t)tokens[t] * K + k];
        } else {
            /* top-k of the biased scores, in descending order (ties: lower id first) */
            for (int k = 0; k < K; k++) {
                int best = -1;
                float best_v = -INFINITY;
                for (int e = 0; e < E; e++) {
                    int taken = 0;
                    for (int j = 0; j < k; j++) taken |= ids[j] == e;
                    float v = scores[e] + bw->gate_bias[e];
                    if (!taken && (best < 0 || v > best_v)) {
                        best = e;
                        best_v = v;
                    }
                }
                ids[k] = best;
            }
        }
        float sum = 0.0f;
        for (int k = 0; k < K; k++) {
            weights[k] = scores[ids[k]];
            sum += weights[k];
        }
        for (int k = 0; k < K; k++) weights[k] = weights[k] / sum * c->routed_scaling_factor;
        /* OFF-M loops over experts in ascending id; sort (id, weight) pairs. */
        for (int i = 1; i < K; i++)
            for (int j = i; j > 0 && ids[j - 1] > ids[j]; j--) {
                int32_t ti = ids[j]; ids[j] = ids[j - 1]; ids[j - 1] = ti;
                float tw = weights[j]; weights[j] = weights[j - 1]; weights[j - 1] = tw;
            }
        if (s->probe.routing) s->probe.routing(s->probe.ctx, block, first_pos + t, ids, weights, K);

        quantize_fp8_act(bt, d, x_codes, x_scales);
        memset(acc, 0, (size_t)d * sizeof(float));
        double wait_start = time_now_seconds();
        if (s->experts->acquire(s->experts, block, ids, K, views, err) != 0) {
            rc = -1;
            break;
        }
        s->seconds_in_experts_wait += time_now_seconds() - wait_start;
        for (int k = 0; k < K; k++) {
            run_expert(c, &views[k].w1, &views[k].w3, &views[k].w2, 1, weights[k], 1, x_codes, x_scales, gate, up,
                       h_codes, h_scales, expert_out);
            for (int i = 0; i < d; i++) acc[i] += expert_out[i];
        }
        s->experts->release(s->experts, block, ids, K);
        run_expert(c, &bw->shared_w1, &bw->shared_w3, &bw->shared_w2, 0, 1.0f, 0, x_codes, x_scales, gate, up, h_codes,
                   h_scales, expert_out);
        for (int i = 0; i < d; i++) out[(size_t)t * d + i] = bf16_round(acc[i] + expert_out[i]);
    }
    scratch->used = mark;
    return rc;
}
