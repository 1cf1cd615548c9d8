/* Element-wise pieces of the official forward pass, each with the rounding points of
 * OFF-M / OFF-K (spec §3, §5.2). Arrays are f32 holding bf16 values wherever the official code
 * holds a bf16 tensor; functions named *_bf16 round their result to bf16. */
#ifndef DS4F_NN_NUMERICS_H
#define DS4F_NN_NUMERICS_H

#include <stdint.h>

#include "format/dtype.h"

/* Official RMSNorm: f32 math from the bf16 input, y = bf16(w * (x * rsqrt(mean(x^2) + eps))). */
void rmsnorm_bf16(const float *x, const float *weight, int n, float eps, float *y);
/* rmsnorm_bf16 in place on rows rows of n values (a chunk's tokens), split across the thread pool. */
void rmsnorm_bf16_rows(float *x, const float *weight, int n, float eps, int rows);

/* Per-head q normalisation, in bf16 arithmetic as OFF-M does it on a bf16 tensor:
 * r = bf16(rsqrt(bf16(bf16(mean(bf16(q^2))) + eps))), q = bf16(q * r). */
void head_rms_normalize_bf16(float *q, int n, float eps);

/* The f64 sum of n nonnegative bf16 values (f32 holding them), defined as the sequential sum
 * i = 0..n-1: head_rms_normalize_bf16's sum of squares; exposed for tests. */
double sum_nonnegative_bf16(const float *v, int n);

/* In-place FP8 simulation of the current official revision (act_quant inplace, ue8m0):
 * per block, s = 2^ceil(log2(max(amax, 1e-4) * f32(1/448))), v = bf16(e4m3(v / s) * s). */
void fp8_simulate_bf16(float *x, int n, int block);

/* In-place FP4 simulation (fp4_act_quant inplace): per block of 32,
 * s = 2^ceil(log2(max(amax, 6*2^-126) * f32(1/6))), v = bf16(e2m1(clamp(v / s, -6, 6)) * s). */
void fp4_simulate_bf16(float *x, int n, int block);

/* Unnormalised Walsh-Hadamard butterfly in natural order then * n^-1/2, bf16 result (the
 * indexer's rotate_activation). n must be a power of two. */
void hadamard_bf16(float *x, int n);

/* RoPE on `dims` interleaved pairs (x[2k], x[2k+1]) with the angles of one position. */
typedef struct rope_table {
    int dims;                /* rotated values (64): dims/2 frequencies */
    float inv_freq[128];     /* f32, as the official precompute_freqs_cis builds them */
} rope_table;

/* yarn = 0: plain RoPE with `base`. yarn = 1: the official YaRN frequency blend (no mscale). */
void rope_table_init(rope_table *t, int dims, double base, int yarn, double factor, int original_max_position,
                     double beta_fast, double beta_slow);
/* The cosines and sines of one position's angles (pos * inv_freq[k], each correctly rounded to
 * f32): computed once per position and table, shared by every head rotated at that position. */
typedef struct rope_angles {
    int dims;
    float cos[128], sin[128];
} rope_angles;
void rope_angles_at(const rope_table *t, int64_t pos, rope_angles *a);
/* Rotates x (f32 holding bf16) by the angles a (inverse: by -angle); bf16 result. */
void rope_rotate_bf16(const rope_angles *a, float *x, int inverse);
/* rope_angles_at then rope_rotate_bf16, for a single vector at its position. */
void rope_apply_bf16(const rope_table *t, float *x, int64_t pos, int inverse);

/* fmaxf / fminf (a NaN operand yields the other; a tie, +0 against -0, yields a, as glibc's), inline
 * so the loops around them vectorize (the libm calls do not). */
static inline float max_num_f32(float a, float b) { return a >= b || b != b ? a : b; }
static inline float min_num_f32(float a, float b) { return a <= b || b != b ? a : b; }
static inline float softplus_f32(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
static inline float sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float silu_f32(float x) { return x / (1.0f + expf(-x)); }

#endif
