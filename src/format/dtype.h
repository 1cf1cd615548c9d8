/* Element formats of the checkpoint and the rounding functions of the official numerics.
 *
 * Activations are carried as f32 values; wherever the official code stores a bf16 tensor we
 * round with bf16_round() at exactly that point, so an f32 array "holding bf16 values" is the
 * in-memory equivalent of the reference's bf16 tensor. */
#ifndef DS4F_FORMAT_DTYPE_H
#define DS4F_FORMAT_DTYPE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    DTYPE_INVALID = 0,
    DTYPE_BF16,
    DTYPE_F16,
    DTYPE_F32,
    DTYPE_F64,
    DTYPE_F8_E4M3,
    DTYPE_F8_E8M0,
    DTYPE_I8,   /* in routed experts: packed FP4 E2M1, two values per byte (low nibble first) */
    DTYPE_U8,
    DTYPE_I16,
    DTYPE_I32,
    DTYPE_I64,
    DTYPE_BOOL,
} dtype;

/* Bytes per stored element; 0 for DTYPE_INVALID. */
int dtype_size(dtype t);
/* safetensors spelling ("BF16", "F8_E4M3", ...) and back; unknown names give DTYPE_INVALID. */
const char *dtype_name(dtype t);
dtype dtype_from_name(const char *name);

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

/* Round to nearest even bf16 (the conversion torch's .to(bfloat16) performs); NaN stays NaN. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float bf16_round(float f) { return bf16_to_f32(f32_to_bf16(f)); }

/* bf16_round on every element: 8 at a time in the compiler's generic vectors (whatever SIMD the
 * build targets; rounding is one of the commonest steps of a prefill chunk), the same integer
 * steps as f32_to_bf16 with the NaN case selected by mask. Same results as bf16_round. */
typedef uint32_t bf16_u32x8 __attribute__((vector_size(32)));
static inline void bf16_round_array(float *x, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        bf16_u32x8 u;
        memcpy(&u, x + i, sizeof u);
        const bf16_u32x8 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        const bf16_u32x8 quiet_nan = (u & 0xffff0000u) | 0x00400000u;
        const bf16_u32x8 is_nan = (bf16_u32x8)((u & 0x7fffffffu) > 0x7f800000u);
        const bf16_u32x8 r = (is_nan & quiet_nan) | (~is_nan & rounded);
        memcpy(x + i, &r, sizeof r);
    }
    for (; i < n; i++) x[i] = bf16_round(x[i]);
}

/* F8_E4M3 (OCP e4m3fn): table decode. 0x7f/0xff are NaN; there is no infinity. */
extern const float e4m3_value_table[256];
static inline float e4m3_to_f32(uint8_t code) { return e4m3_value_table[code]; }

/* Nearest e4m3fn code to v with ties to the even code. Requires |v| <= 448 (callers clamp, as
 * the official kernels do before the cast). */
uint8_t e4m3_encode_rne(float v);

/* F8_E8M0: unsigned exponent, value 2^(e-127); 255 is NaN (never valid in a checkpoint). */
static inline float e8m0_to_f32(uint8_t e) {
    if (e == 0) return 0x1p-127f; /* subnormal in f32: not expressible through the exponent field */
    if (e == 255) return NAN;
    return f32_from_bits((uint32_t)e << 23);
}

/* FP4 E2M1 nibble: bit 3 sign, magnitude {0,.5,1,1.5,2,3,4,6}. */
extern const float e2m1_value_table[16];
static inline float e2m1_to_f32(uint8_t nibble) { return e2m1_value_table[nibble & 15]; }
/* Nearest E2M1 code to v (|v| <= 6), ties to the even code. */
uint8_t e2m1_encode_rne(float v);
/* e2m1_to_f32(e2m1_encode_rne(v)) without the code (|v| <= 6): the grid point rintf picks on the
 * step of v's binade (0.5 below 2, 1 in [2, 4), 2 above; the multiplies by 2 are exact), v's sign
 * kept (so -0 for small negatives, as the sign bit of the code). Inline, so loops vectorize.
 * Checked against the code path over every float of magnitude <= 6 (test_format.c samples). */
static inline float e2m1_round_value(float v) {
    const float a = fabsf(v);
    const float r = a < 2.0f ? rintf(a * 2.0f) * 0.5f : a < 4.0f ? rintf(a) : rintf(a * 0.5f) * 2.0f;
    return copysignf(r, v);
}

/* The "ue8m0" power-of-two scale of the official kernels (fast_round_scale): 2^ceil(log2(v)) with
 * v = amax * inv_qmax, where inv_qmax is the f32 reciprocal (multiply, do not divide) and the
 * ceiling is read off the bits: exponent - 127 + (mantissa != 0). */
static inline float pow2_scale_ceil(float amax, float inv_qmax) {
    uint32_t u = f32_bits(amax * inv_qmax);
    int e = (int)((u >> 23) & 0xff) - 127 + ((u & 0x7fffff) != 0);
    return f32_from_bits((uint32_t)(e + 127) << 23);
}

#endif
