/* Inline helpers of the files compiled for AVX2 (kernels_avx2.c, kernels_avxvnni.c). */
#ifndef DS4F_KERNELS_AVX2_INLINE_H
#define DS4F_KERNELS_AVX2_INLINE_H

#include <immintrin.h>

/* Full unrolling of the short fixed loops keeps their vectors in registers (GCC and clang). */
#define UNROLL(n) _Pragma(UNROLL_STR(GCC unroll n))
#define UNROLL_STR(x) #x

/* The dword lanes 0 .. n - 1 all ones, the rest zero: the mask of a short last group's rows. */
static inline __m256i lanes_below8(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 8 f32 through a lane mask. VMASKMOVPS is microcoded on AMD Zen (a masked store there costs
 * tens of cycles), so a full mask, the common case, takes the plain load or store. */
static inline __m256 masked_load8(const float *p, __m256i mask) {
    return _mm256_movemask_ps(_mm256_castsi256_ps(mask)) == 0xff ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask);
}
static inline void masked_store8(float *p, __m256i mask, __m256 v) {
    if (_mm256_movemask_ps(_mm256_castsi256_ps(mask)) == 0xff)
        _mm256_storeu_ps(p, v);
    else
        _mm256_maskstore_ps(p, mask, v);
}

/* In-register transpose of 8 x 8 dwords: afterwards r[j] lane i = (before) r[i] lane j. */
static inline __attribute__((always_inline)) void transpose8x8(__m256i r[8]) {
    __m256i t[8], u[8];
    UNROLL(4)
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    UNROLL(2)
    for (int q = 0; q < 2; q++) {
        u[4 * q] = _mm256_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
        u[4 * q + 1] = _mm256_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
        u[4 * q + 2] = _mm256_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
        u[4 * q + 3] = _mm256_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
    }
    /* u[4q + k], 128-bit lane L: column 4L + k of rows 4q..4q+3 */
    UNROLL(4)
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
        r[4 + k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
    }
}

#endif
