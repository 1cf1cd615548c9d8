/* Internal interfaces between the nn files (one file per sublayer). */
#ifndef DS4F_NN_LAYERS_H
#define DS4F_NN_LAYERS_H

#include "nn/session.h"

/* Bump allocator over the session scratch; everything is 64-byte aligned. */
typedef struct scratch_arena {
    uint8_t *base;
    size_t used, capacity;
} scratch_arena;
void *scratch_take(scratch_arena *a, size_t bytes);

/* --- hyper-connections (spec §3.3) --- */
/* state [hc][d] -> u [d] (bf16), post [hc], comb [hc][hc] (after Sinkhorn). */
void hc_pre(const model_config *c, const f32_matrix *fn, const float *scale, const float *base, const float *state,
            float *u, float *post, float *comb);
/* hc_pre for n positions at once (one matrix product for all of them): states [n][hc][d] ->
 * u [n][d], post [n][hc], comb [n][hc][hc]; mixes is work space of n * (2+hc)*hc floats. */
void hc_pre_tokens(const model_config *c, const f32_matrix *fn, const float *scale, const float *base,
                   const float *states, int n, float *mixes, float *u, float *post, float *comb);
/* For n positions (out [n][d], residual and states [n][hc][d], post [n][hc], comb [n][hc][hc]):
 * state [hc][d] <- bf16(post[k] * out + sum_j comb[j][k] * residual[j]). */
void hc_post_tokens(const model_config *c, const float *out, const float *residual, const float *post,
                    const float *comb, int n, float *states);
/* The head collapse: y = bf16(sum_h pre[h] * state[h]) with pre from hc_head_fn. */
void hc_head_collapse(const model_config *c, const f32_matrix *fn, const float *scale, const float *base,
                      const float *state, float *y);
/* The same for n positions: states [n][hc][d] -> y [n][d]; mixes is work space of n * hc floats. */
void hc_head_collapse_tokens(const model_config *c, const f32_matrix *fn, const float *scale, const float *base,
                             const float *states, int n, float *mixes, float *y);
/* Sinkhorn normalisation of the comb logits (n x n, row-major) in place; exposed for tests. */
void hc_sinkhorn(float *comb, int n, int iters, float eps);

/* --- attention (spec §3.4): a [n][d] (attn_norm output) -> out [n][d] --- */
/* Scratch bytes attention takes beyond its per-chunk buffers: the window history of a chunk and
 * each thread's work space for a token's keys, scores and accumulators. */
size_t attention_scratch_bytes(const model_config *c, int max_chunk, int max_context, int threads);
int attention_forward(nn_session *s, int block, const float *a, int n, int64_t first_pos, float *out,
                      scratch_arena *scratch, ds4f_error *err);

/* --- compressor (spec §3.4.3): one token's projections (f32 [coff*D] each) --- */
/* Adds the token at position pos; returns 1 and writes the finished entry (bf16 values, before
 * any FP8/FP4 simulation) into entry[D] when pos completes a window, else 0. */
int compressor_push(compressor_state *st, const float *kv, const float *score, const float *ape, int64_t pos,
                    float *entry);

/* --- indexer (spec §3.4.4): chooses the compressed entries the query at pos attends to --- */
/* q_index [iH][ihd] (already rope'd, rotated and FP4-simulated), head weights [iH]; fills
 * selected (descending score order) and returns how many. scores gets the n visible entries;
 * head_scores is work space of iH * n floats. */
int indexer_select(const nn_session *s, const compressor_state *keys, const float *q_index, const float *head_weights,
                   int64_t pos, float *head_scores, float *scores, int32_t *selected);

/* --- MoE (spec §3.5): b [n][d] (ffn_norm output) -> out [n][d] --- */
int moe_forward(nn_session *s, int block, const float *b, const int32_t *tokens, int n, int64_t first_pos, float *out,
                scratch_arena *scratch, ds4f_error *err);

/* Prefetch hints given before block's attention (a [n][d]: its normalized attention input):
 * at block 0 the experts of every hash-routed block (exact: from the token ids); at every block,
 * a guess for block+1 when it is score-routed: its router applied to a. Guessing from the MoE
 * input instead, as the router itself will, arrives late about half the time while the cores are
 * fast (bench/bench_stream.sh: 46% late and 0.163 s/token waiting, against 20-38% and 0.08-0.12
 * from the attention input; 85-86% of guesses used either way). Hints only: results never change. */
void moe_prefetch(nn_session *s, int block, const float *a, const int32_t *tokens, int n);

/* Quantizes rows of activations and runs an FP8 linear: y [n][rows] bf16-valued. */
void linear_fp8_bf16(const fp8_matrix *w, const float *x, int x_stride, int n, float *y, int y_stride,
                     scratch_arena *scratch);

#endif
