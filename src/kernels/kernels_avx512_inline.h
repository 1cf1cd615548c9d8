/* Inline helpers of the files compiled for AVX-512 (kernels_avx512.c, kernels_amx.c). */
#ifndef DS4F_KERNELS_AVX512_INLINE_H
#define DS4F_KERNELS_AVX512_INLINE_H

#include <immintrin.h>

/* Full unrolling of the short fixed loops keeps their vectors in registers (GCC and clang). */
#define UNROLL(n) _Pragma(UNROLL_STR(GCC unroll n))
#define UNROLL_STR(x) #x

/* acc + VPDPWSSD(w, the dword *x in every lane), the dword read as the instruction's embedded
 * broadcast ({1to16}): GCC 12 loads _mm512_set1_epi32(*x) into a register first, a separate
 * instruction and register per product (the FP4 words kernel measured 0.129 -> 0.099 ms per token
 * with the broadcast folded in). The same instruction on the same values: the same result. */
static inline __attribute__((always_inline)) __m512i dpwssd_broadcast(__m512i acc, __m512i w, const int32_t *x) {
    __asm__("vpdpwssd %1%{1to16%}, %2, %0" : "+v"(acc) : "m"(*x), "v"(w));
    return acc;
}

/* *p into a register that every later use reads: in an unrolled loop that reuses
 * one loaded vector for several products, GCC 12 reloads it from memory at every use instead
 * (rematerialization: 1.25 loads per VPDPWSSD where 0.58 were written), which halved the
 * products' rate (a loop of 4 weight vectors x 3 broadcast activations: 2.1-2.4 -> 3.9-4.8 G
 * VPDPWSSD/s on an Ice Lake server core). */
static inline __attribute__((always_inline)) __m512i zmm_load_once(const __m512i *p) {
    __m512i v = _mm512_load_si512(p);
    __asm__("" : "+v"(v)); /* the value is now the asm's output: no use can be re-loaded */
    return v;
}

/* In-register transpose of 16 x 16 dwords: afterwards r[j] lane i = (before) r[i] lane j. */
static inline __attribute__((always_inline)) void transpose16x16(__m512i r[16]) {
    __m512i t[16];
    UNROLL(8)
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* r[4q + k], 128-bit lane L: column 4L + k of rows 4q..4q+3 */
    UNROLL(4)
    for (int q = 0; q < 4; q++) {
        r[4 * q] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
        r[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
        r[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
        r[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
    }
    /* column 4L + k gathers lane L of r[k], r[4+k], r[8+k], r[12+k]: a 4 x 4 transpose of lanes */
    UNROLL(4)
    for (int k = 0; k < 4; k++) {
        const __m512i ab_even = _mm512_shuffle_i32x4(r[k], r[4 + k], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i ab_odd = _mm512_shuffle_i32x4(r[k], r[4 + k], _MM_SHUFFLE(3, 1, 3, 1));
        const __m512i cd_even = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i cd_odd = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], _MM_SHUFFLE(3, 1, 3, 1));
        t[k] = _mm512_shuffle_i32x4(ab_even, cd_even, _MM_SHUFFLE(2, 0, 2, 0));
        t[4 + k] = _mm512_shuffle_i32x4(ab_odd, cd_odd, _MM_SHUFFLE(2, 0, 2, 0));
        t[8 + k] = _mm512_shuffle_i32x4(ab_even, cd_even, _MM_SHUFFLE(3, 1, 3, 1));
        t[12 + k] = _mm512_shuffle_i32x4(ab_odd, cd_odd, _MM_SHUFFLE(3, 1, 3, 1));
    }
    UNROLL(16)
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

#endif
