/* AVX-512 kernels (F, BW, DQ, VL, VNNI), bit-identical to kernels_scalar.c.
 *
 * How each product stays exact:
 *  - FP8 x FP8: a product of two e4m3 values has at most 8 significant bits and lies in
 *    [2^-18, 2^17.6]; a block of 128 sums to less than 2^25 in multiples of 2^-18, so f64 FMAs give
 *    the exact block sum in any order (43 bits < 53). The f64 sum is rounded to f32 once, as the
 *    scalar (float)int64 conversion does (scaling by 2^-18 commutes with rounding here).
 *  - FP4 x FP8: the activation k = x * 2^9 (an integer m * 2^s, m < 16, s < 15) is split into four
 *    signed bytes, plane p holding m * 2^(s - 4p) for the elements whose s is in [4p, 4p+3] (at
 *    most 120); the weight enters VPDPBUSD as the unsigned byte j + 12 (j = 2 * e2m1 in [-12, 12]).
 *    Block sum = sum_p 2^(4p) * dot(j + 12, plane_p) - 12 * sum(k): all int32, exact.
 *  - Float products: 16 rows at a time, a tile of 16 rows x 64 bytes transposed in registers so
 *    that each vector holds one column for 16 rows; acc = acc + w * x per column, in column order,
 *    with separate multiply and add (no FMA): per row exactly the scalar sequence. */
#include "kernels/kernels_internal.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Per-thread scratch for the activation forms (grown on demand, kept: no allocation per call in
 * steady state). */
typedef struct scratch_buf {
    void *p;
    size_t bytes;
} scratch_buf;
static _Thread_local scratch_buf act_scratch, tile_scratch;

static void *scratch_get(scratch_buf *b, size_t bytes) {
    if (bytes > b->bytes) {
        free(b->p);
        b->bytes = (bytes + 4095) & ~(size_t)4095;
        b->p = aligned_alloc(64, b->bytes);
        if (!b->p) abort(); /* a few MB at most: running out here is not recoverable */
    }
    return b->p;
}

/* e4m3 code -> value * 2^8 as f64 (the weights enter as value * 2^-8: see e4m3x32_to_f16). */
static double e4m3_times_256[256];
__attribute__((constructor)) static void avx512_tables_init(void) {
    for (int c = 0; c < 256; c++) e4m3_times_256[c] = (double)kernel_e4m3_int[c] / 2.0;
}

/* 32 e4m3 codes -> their values * 2^-8 as f16 bits: the e4m3 fields land in the f16 fields
 * (sign to bit 15, exponent and mantissa to bits 13..7); f16's bias is 8 more than e4m3's and its
 * subnormals line up the same way, so every code (subnormals included) is exact. */
static inline __m512i e4m3x32_to_f16(__m256i codes) {
    __m512i w = _mm512_cvtepi8_epi16(codes);
    w = _mm512_slli_epi16(w, 7);
    return _mm512_and_si512(w, _mm512_set1_epi16((short)0xBF80));
}

/* ---------------------------------------------------------------------------------------------
 * FP8 x FP8 */

/* Sums of 4 vectors of 8 f64 -> [sum(a), sum(b), sum(c), sum(d)] as f64 (exact: integers). */
static inline __m256d hsum4_pd(__m512d a, __m512d b, __m512d c, __m512d d) {
    __m512d ab = _mm512_add_pd(_mm512_unpacklo_pd(a, b), _mm512_unpackhi_pd(a, b));
    __m512d cd = _mm512_add_pd(_mm512_unpacklo_pd(c, d), _mm512_unpackhi_pd(c, d));
    /* ab = [a01 b01 | a23 b23 | a45 b45 | a67 b67], cd likewise */
    __m512d s = _mm512_add_pd(_mm512_shuffle_f64x2(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f64x2(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
    /* s = [a0123+... lanes: (a b) (a b) (c d) (c d)] */
    __m512d q = _mm512_add_pd(s, _mm512_shuffle_f64x2(s, s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm256_insertf128_pd(_mm256_castpd128_pd256(_mm512_castpd512_pd128(q)), _mm512_extractf64x2_pd(q, 2), 1);
}

/* Converts x codes (n_tokens rows of cols) to f64 values * 2^8. */
static double *fp8_act_f64(const uint8_t *x_codes, int n_tokens, int cols) {
    double *xd = scratch_get(&act_scratch, (size_t)n_tokens * cols * sizeof(double));
    for (size_t i = 0; i < (size_t)n_tokens * cols; i++) xd[i] = e4m3_times_256[x_codes[i]];
    return xd;
}

/* 32 weight codes -> 4 vectors of 8 f64 (value * 2^-8). */
static inline void fp8x32_to_f64(const uint8_t *src, __m512d out[4]) {
    __m512i h = e4m3x32_to_f16(_mm256_loadu_si256((const __m256i *)src));
    __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    __m512 hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
    out[0] = _mm512_cvtps_pd(_mm512_castps512_ps256(lo));
    out[1] = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lo), 1)));
    out[2] = _mm512_cvtps_pd(_mm512_castps512_ps256(hi));
    out[3] = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(hi), 1)));
}

/* acc[i] = acc[i] + f32(block_sum[i]) * (xs * ws[i]): the scalar's block step for 4 rows. */
static inline __m128 fp8_block_step(__m128 acc, __m256d block_sum, float xs, const uint8_t *const ws[4], int b) {
    const __m128 f = _mm256_cvtpd_ps(block_sum);
    const __m128 w_scale = _mm_setr_ps(kernel_e8m0(ws[0][b]), kernel_e8m0(ws[1][b]), kernel_e8m0(ws[2][b]),
                                       kernel_e8m0(ws[3][b]));
    const __m128 scale = _mm_mul_ps(_mm_set1_ps(xs), w_scale);
    return _mm_add_ps(acc, _mm_mul_ps(f, scale));
}

static void avx512_matmul_fp8(const fp8_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens,
                              float *y, int y_stride, int row_begin, int row_end) {
    const int cols = w->cols, blocks = cols / FP8_ACT_BLOCK, scale_cols = (cols + 127) / 128;
    if (row_end <= row_begin || n_tokens <= 0) return;
    const double *xd = fp8_act_f64(x_codes, n_tokens, cols);
    /* Row quads; a short last quad repeats its last row (computed, not stored). */
    for (int r0 = row_begin; r0 < row_end; r0 += 4) {
        const int nr = row_end - r0 < 4 ? row_end - r0 : 4;
        const uint8_t *wr[4];
        const uint8_t *ws[4];
        for (int i = 0; i < 4; i++) {
            const int r = r0 + (i < nr ? i : nr - 1);
            wr[i] = w->codes + (size_t)r * cols;
            ws[i] = w->scales + (size_t)(r / 128) * scale_cols;
        }
        if (n_tokens == 1) {
            __m128 acc = _mm_setzero_ps();
            for (int b = 0; b < blocks; b++) {
                __m512d a[4][2];
                for (int i = 0; i < 4; i++) a[i][0] = a[i][1] = _mm512_setzero_pd();
                const double *xb = xd + (size_t)b * FP8_ACT_BLOCK;
                for (int c = 0; c < FP8_ACT_BLOCK; c += 32) {
                    const __m512d x0 = _mm512_loadu_pd(xb + c), x1 = _mm512_loadu_pd(xb + c + 8);
                    const __m512d x2 = _mm512_loadu_pd(xb + c + 16), x3 = _mm512_loadu_pd(xb + c + 24);
                    for (int i = 0; i < 4; i++) {
                        __m512d wv[4];
                        fp8x32_to_f64(wr[i] + (size_t)b * FP8_ACT_BLOCK + c, wv);
                        a[i][0] = _mm512_fmadd_pd(wv[0], x0, a[i][0]);
                        a[i][1] = _mm512_fmadd_pd(wv[1], x1, a[i][1]);
                        a[i][0] = _mm512_fmadd_pd(wv[2], x2, a[i][0]);
                        a[i][1] = _mm512_fmadd_pd(wv[3], x3, a[i][1]);
                    }
                }
                const __m256d sums = hsum4_pd(_mm512_add_pd(a[0][0], a[0][1]), _mm512_add_pd(a[1][0], a[1][1]),
                                              _mm512_add_pd(a[2][0], a[2][1]), _mm512_add_pd(a[3][0], a[3][1]));
                acc = fp8_block_step(acc, sums, x_scales[b], ws, b);
            }
            float out[4];
            _mm_storeu_ps(out, acc);
            for (int i = 0; i < nr; i++) y[r0 + i] = out[i];
            continue;
        }
        /* Several tokens: each block of the 4 rows is converted once into an L1 tile and used by
         * every token; the running sums live in y. */
        double *tile = scratch_get(&tile_scratch, 4 * FP8_ACT_BLOCK * sizeof(double));
        for (int t = 0; t < n_tokens; t++)
            for (int i = 0; i < nr; i++) y[(size_t)t * y_stride + r0 + i] = 0.0f;
        for (int b = 0; b < blocks; b++) {
            for (int i = 0; i < 4; i++)
                for (int c = 0; c < FP8_ACT_BLOCK; c += 32) {
                    __m512d wv[4];
                    fp8x32_to_f64(wr[i] + (size_t)b * FP8_ACT_BLOCK + c, wv);
                    for (int k = 0; k < 4; k++) _mm512_store_pd(tile + i * FP8_ACT_BLOCK + c + 8 * k, wv[k]);
                }
            for (int t = 0; t < n_tokens; t++) {
                const double *xb = xd + (size_t)t * cols + (size_t)b * FP8_ACT_BLOCK;
                __m512d a[4][2];
                for (int i = 0; i < 4; i++) a[i][0] = a[i][1] = _mm512_setzero_pd();
                for (int c = 0; c < FP8_ACT_BLOCK; c += 16) {
                    const __m512d x0 = _mm512_loadu_pd(xb + c), x1 = _mm512_loadu_pd(xb + c + 8);
                    for (int i = 0; i < 4; i++) {
                        a[i][0] = _mm512_fmadd_pd(_mm512_load_pd(tile + i * FP8_ACT_BLOCK + c), x0, a[i][0]);
                        a[i][1] = _mm512_fmadd_pd(_mm512_load_pd(tile + i * FP8_ACT_BLOCK + c + 8), x1, a[i][1]);
                    }
                }
                const __m256d sums = hsum4_pd(_mm512_add_pd(a[0][0], a[0][1]), _mm512_add_pd(a[1][0], a[1][1]),
                                              _mm512_add_pd(a[2][0], a[2][1]), _mm512_add_pd(a[3][0], a[3][1]));
                float *yt = y + (size_t)t * y_stride + r0;
                float cur[4] = {0, 0, 0, 0}, out[4];
                for (int i = 0; i < nr; i++) cur[i] = yt[i];
                _mm_storeu_ps(out, fp8_block_step(_mm_loadu_ps(cur), sums, x_scales[(size_t)t * blocks + b], ws, b));
                for (int i = 0; i < nr; i++) yt[i] = out[i];
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * FP4 x FP8 */

#define FP4_CHUNK 64 /* elements per vector: two 32-blocks */

/* Activation planes of one token for the FP4 kernel, in the weight vectors' element order: for
 * chunk c, bytes 0..31 hold elements 64c + 2i (low nibbles), bytes 32..63 elements 64c + 2i + 1. */
typedef struct fp4_act {
    int8_t *planes;   /* [n_tokens][cols/64][4][64] */
    int32_t *ksum;    /* [n_tokens][cols/32]: 12 * sum of k over each 32-block (the bias term) */
} fp4_act;

static int8_t plane_value[256];
static uint8_t plane_index[256];
__attribute__((constructor)) static void fp4_plane_tables_init(void) {
    for (int c = 0; c < 256; c++) {
        int32_t k = kernel_e4m3_int[c], mag = k < 0 ? -k : k;
        int s = 0;
        while (mag >= 16) { /* k = m * 2^s with m < 16: only exact shifts occur (m has 4 bits) */
            mag >>= 1;
            s++;
        }
        const int p = s / 4;
        int32_t v = mag << (s - 4 * p);
        plane_index[c] = (uint8_t)p;
        plane_value[c] = (int8_t)(k < 0 ? -v : v);
    }
}

static fp4_act fp4_act_prepare(const uint8_t *x_codes, int n_tokens, int cols) {
    const int chunks = cols / FP4_CHUNK, blocks = cols / 32;
    const size_t plane_bytes = (size_t)n_tokens * chunks * 4 * FP4_CHUNK;
    uint8_t *base = scratch_get(&act_scratch, plane_bytes + (size_t)n_tokens * blocks * sizeof(int32_t) + 64);
    fp4_act a = {(int8_t *)base, (int32_t *)(base + plane_bytes)};
    memset(a.planes, 0, plane_bytes);
    for (int t = 0; t < n_tokens; t++) {
        const uint8_t *xc = x_codes + (size_t)t * cols;
        for (int c = 0; c < chunks; c++) {
            int8_t *dst = a.planes + ((size_t)t * chunks + c) * 4 * FP4_CHUNK;
            for (int i = 0; i < 32; i++) {
                const uint8_t even = xc[c * FP4_CHUNK + 2 * i], odd = xc[c * FP4_CHUNK + 2 * i + 1];
                dst[plane_index[even] * FP4_CHUNK + i] = plane_value[even];
                dst[plane_index[odd] * FP4_CHUNK + 32 + i] = plane_value[odd];
            }
        }
        for (int b = 0; b < blocks; b++) {
            int32_t s = 0;
            for (int i = 0; i < 32; i++) s += kernel_e4m3_int[xc[b * 32 + i]];
            a.ksum[(size_t)t * blocks + b] = 12 * s;
        }
    }
    return a;
}

/* 32 packed bytes (64 e2m1 values) -> unsigned bytes j + 12, low nibbles then high nibbles. */
static inline __m512i fp4x64_biased(const uint8_t *src) {
    const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    const __m256i v = _mm256_loadu_si256((const __m256i *)src);
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
    return _mm512_shuffle_epi8(table, _mm512_and_si512(both, _mm512_set1_epi8(0x0f)));
}

/* The block sums of one 64-element chunk for one row, per lane: lanes 0-3 and 8-11 belong to the
 * first 32-block, lanes 4-7 and 12-15 to the second (before the bias term). */
static inline __m512i fp4_chunk_lanes(__m512i wb, const int8_t *planes) {
    const __m512i z = _mm512_setzero_si512();
    const __m512i d0 = _mm512_dpbusd_epi32(z, wb, _mm512_load_si512(planes));
    const __m512i d1 = _mm512_dpbusd_epi32(z, wb, _mm512_load_si512(planes + 64));
    const __m512i d2 = _mm512_dpbusd_epi32(z, wb, _mm512_load_si512(planes + 128));
    const __m512i d3 = _mm512_dpbusd_epi32(z, wb, _mm512_load_si512(planes + 192));
    /* |d| <= 4 * 24 * 120 per lane, so the combination stays below 2^26 */
    return _mm512_add_epi32(_mm512_add_epi32(d0, _mm512_slli_epi32(d1, 4)),
                            _mm512_add_epi32(_mm512_slli_epi32(d2, 8), _mm512_slli_epi32(d3, 12)));
}

/* 16 rows' lane vectors -> the first block's sums (16 rows) in *first, the second's in *second. */
static inline void fp4_reduce16(const __m512i l[16], __m512i *first, __m512i *second) {
    __m512i z[8], q[4], h[2];
    /* fold 256-bit halves, two rows per vector: [r A(4) r B(4) r' A(4) r' B(4)] */
    for (int k = 0; k < 8; k++)
        z[k] = _mm512_add_epi32(_mm512_shuffle_i64x2(l[2 * k], l[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                _mm512_shuffle_i64x2(l[2 * k], l[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* each 128-bit lane is one (row, block) group of 4 partial sums: halve them, pairing vectors */
    for (int k = 0; k < 4; k++)
        q[k] = _mm512_add_epi32(_mm512_unpacklo_epi64(z[2 * k], z[2 * k + 1]), _mm512_unpackhi_epi64(z[2 * k], z[2 * k + 1]));
    /* sum adjacent dword pairs: h[k] dword 4g + j = total of group g of z[4k + j] */
    for (int k = 0; k < 2; k++) {
        const __m512 p = _mm512_castsi512_ps(q[2 * k]), r = _mm512_castsi512_ps(q[2 * k + 1]);
        h[k] = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(p, r, _MM_SHUFFLE(2, 0, 2, 0))),
                                _mm512_castps_si512(_mm512_shuffle_ps(p, r, _MM_SHUFFLE(3, 1, 3, 1))));
    }
    /* group g of z[m] is row 2m + (g >> 1), block g & 1: gather the 16 rows of each block */
    static const int32_t idx_first[16] = {0, 8, 1, 9, 2, 10, 3, 11, 16, 24, 17, 25, 18, 26, 19, 27};
    static const int32_t idx_second[16] = {4, 12, 5, 13, 6, 14, 7, 15, 20, 28, 21, 29, 22, 30, 23, 31};
    *first = _mm512_permutex2var_epi32(h[0], _mm512_loadu_si512(idx_first), h[1]);
    *second = _mm512_permutex2var_epi32(h[0], _mm512_loadu_si512(idx_second), h[1]);
}

/* E8M0 bytes (low byte of each dword lane) -> f32, byte 0 giving the subnormal 2^-127. */
static inline __m512 e8m0x16_to_f32(__m512i bytes) {
    const __m512i e = _mm512_and_si512(bytes, _mm512_set1_epi32(0xff));
    const __m512i bits = _mm512_mask_mov_epi32(_mm512_slli_epi32(e, 23), _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()),
                                               _mm512_set1_epi32(0x00400000));
    return _mm512_castsi512_ps(bits);
}

static void avx512_matmul_fp4(const fp4_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens,
                              float *y, int y_stride, int row_begin, int row_end) {
    const int cols = w->cols, chunks = cols / FP4_CHUNK, blocks32 = cols / 32, xblocks = cols / FP8_ACT_BLOCK;
    if (row_end <= row_begin || n_tokens <= 0) return;
    const fp4_act act = fp4_act_prepare(x_codes, n_tokens, cols);
    __m512i *wtile = scratch_get(&tile_scratch, 16 * sizeof(__m512i));
    for (int r0 = row_begin; r0 < row_end; r0 += 16) {
        const int nr = row_end - r0 < 16 ? row_end - r0 : 16;
        const __mmask16 store_mask = (__mmask16)((1u << nr) - 1);
        const uint8_t *wr[16];
        int32_t scale_off[16];
        for (int i = 0; i < 16; i++) {
            const int r = r0 + (i < nr ? i : nr - 1);
            wr[i] = w->packed + (size_t)r * (cols / 2);
            scale_off[i] = (int32_t)((r - r0) * blocks32);
        }
        const uint8_t *scale_base = w->scales + (size_t)r0 * blocks32;
        const __m512i scale_idx = _mm512_loadu_si512(scale_off);
        for (int t = 0; t < n_tokens; t++) _mm512_mask_storeu_ps(y + (size_t)t * y_stride + r0, store_mask, _mm512_setzero_ps());
        for (int c = 0; c < chunks; c++) {
            for (int i = 0; i < 16; i++) wtile[i] = fp4x64_biased(wr[i] + (size_t)c * 32);
            /* weight scales of blocks 2c and 2c+1 for the 16 rows: one aligned dword per row
             * (blocks32 is a multiple of 4, so it never reads past the row's scales) */
            const int b0 = 2 * c;
            const __m512i sdw = _mm512_i32gather_epi32(scale_idx, scale_base + (b0 & ~3), 1);
            const __m512 ws0 = e8m0x16_to_f32(_mm512_srli_epi32(sdw, 8 * (b0 & 3)));
            const __m512 ws1 = e8m0x16_to_f32(_mm512_srli_epi32(sdw, 8 * ((b0 & 3) + 1)));
            for (int t = 0; t < n_tokens; t++) {
                const int8_t *planes = act.planes + ((size_t)t * chunks + c) * 4 * FP4_CHUNK;
                __m512i l[16];
                for (int i = 0; i < 16; i++) l[i] = fp4_chunk_lanes(wtile[i], planes);
                __m512i s0, s1;
                fp4_reduce16(l, &s0, &s1);
                const int32_t *ks = act.ksum + (size_t)t * blocks32 + b0;
                s0 = _mm512_sub_epi32(s0, _mm512_set1_epi32(ks[0]));
                s1 = _mm512_sub_epi32(s1, _mm512_set1_epi32(ks[1]));
                const __m512 xs = _mm512_set1_ps(x_scales[(size_t)t * xblocks + b0 / 4]);
                const __m512 f0 = _mm512_mul_ps(_mm512_cvtepi32_ps(s0), _mm512_set1_ps(0x1p-10f));
                const __m512 f1 = _mm512_mul_ps(_mm512_cvtepi32_ps(s1), _mm512_set1_ps(0x1p-10f));
                float *yt = y + (size_t)t * y_stride + r0;
                __m512 acc = _mm512_maskz_loadu_ps(store_mask, yt);
                acc = _mm512_add_ps(acc, _mm512_mul_ps(f0, _mm512_mul_ps(xs, ws0)));
                acc = _mm512_add_ps(acc, _mm512_mul_ps(f1, _mm512_mul_ps(xs, ws1)));
                _mm512_mask_storeu_ps(yt, store_mask, acc);
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Float products: 16 rows x 64 bytes tiles transposed in registers. */

/* In-register transpose of 16 x 16 dwords: afterwards r[j] lane i = (before) r[i] lane j. */
static inline void transpose16x16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* r[4q + k], 128-bit lane L: column 4L + k of rows 4q..4q+3 */
    for (int q = 0; q < 4; q++) {
        r[4 * q] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
        r[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
        r[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
        r[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
    }
    /* column 4L + k gathers lane L of r[k], r[4+k], r[8+k], r[12+k]: a 4 x 4 transpose of lanes */
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
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

typedef enum { FLOAT_F32, FLOAT_BF16, FLOAT_FP8 } float_kind;

typedef struct float_matrix {
    float_kind kind;
    const uint8_t *data;
    size_t row_bytes;
    int cols;
    const uint8_t *scales; /* FP8: E8M0 [ceil(rows/128)][ceil(cols/128)] */
    int scale_cols;
} float_matrix;

static inline int values_per_dword(float_kind k) { return k == FLOAT_F32 ? 1 : k == FLOAT_BF16 ? 2 : 4; }

/* One dword column (16 rows) -> its 1, 2 or 4 weight columns as f32 (exact values; FP8 with
 * the block scale applied, still exact). */
static inline int dword_column_values(float_kind kind, __m512i d, __m512 ws, __m512 out[4]) {
    if (kind == FLOAT_F32) {
        out[0] = _mm512_castsi512_ps(d);
        return 1;
    }
    if (kind == FLOAT_BF16) {
        out[0] = _mm512_castsi512_ps(_mm512_slli_epi32(d, 16));
        out[1] = _mm512_castsi512_ps(_mm512_and_si512(d, _mm512_set1_epi32((int)0xffff0000u)));
        return 2;
    }
    /* e4m3 byte k of each dword: its fields placed in an f32's (sign to 31, exponent and
     * mantissa to 26..20) give value * 2^-120, subnormals included; * 2^120 and * scale are exact */
    for (int k = 0; k < 4; k++) {
        const __m512i b = k == 3 ? d : _mm512_slli_epi32(d, 24 - 8 * k);
        const __m512i bits = _mm512_and_si512(_mm512_srai_epi32(_mm512_and_si512(b, _mm512_set1_epi32((int)0xff000000u)), 4),
                                              _mm512_set1_epi32((int)0x87f00000u));
        out[k] = _mm512_mul_ps(_mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0x1p120f)), ws);
    }
    return 4;
}

/* Loads 16 rows x 64 bytes at byte offset off (bytes past `avail` read as zero). */
static inline void load_tile(const uint8_t *const rows[16], size_t off, int avail, __m512i r[16]) {
    if (avail >= 64) {
        for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(rows[i] + off);
    } else {
        const __mmask64 m = avail <= 0 ? 0 : (__mmask64)(~0ull >> (64 - avail));
        for (int i = 0; i < 16; i++) r[i] = _mm512_maskz_loadu_epi8(m, rows[i] + off);
    }
}

static void float_matmul(const float_matrix *m, int rows_total, const float *x, int x_stride, int n_tokens, float *y,
                         int y_stride, int row_begin, int row_end) {
    const int vpd = values_per_dword(m->kind);
    const int elem_bytes = 4 / vpd;
    const size_t total_bytes = (size_t)m->cols * elem_bytes;
    const int cols_per_tile = 16 * vpd;
    (void)rows_total;
    __m512 *cols_tile = n_tokens > 1 ? scratch_get(&tile_scratch, 64 * sizeof(__m512)) : NULL;
    for (int r0 = row_begin; r0 < row_end; r0 += 16) {
        const int nr = row_end - r0 < 16 ? row_end - r0 : 16;
        const __mmask16 store_mask = (__mmask16)((1u << nr) - 1);
        const uint8_t *rows[16];
        for (int i = 0; i < 16; i++) rows[i] = m->data + (size_t)(r0 + (i < nr ? i : nr - 1)) * m->row_bytes;
        /* FP8 block scales: rows of one 16-row group may straddle a 128-row boundary */
        const uint8_t *srow[16];
        if (m->kind == FLOAT_FP8)
            for (int i = 0; i < 16; i++) srow[i] = m->scales + (size_t)((r0 + (i < nr ? i : nr - 1)) / 128) * m->scale_cols;
        __m512 acc1 = _mm512_setzero_ps();
        if (n_tokens > 1)
            for (int t = 0; t < n_tokens; t++) _mm512_mask_storeu_ps(y + (size_t)t * y_stride + r0, store_mask, _mm512_setzero_ps());
        for (size_t off = 0; off < total_bytes; off += 64) {
            const int col0 = (int)(off / (size_t)elem_bytes);
            const int ncols = m->cols - col0 < cols_per_tile ? m->cols - col0 : cols_per_tile;
            __m512i r[16];
            load_tile(rows, off, (int)(total_bytes - off < 64 ? total_bytes - off : 64), r);
            transpose16x16(r);
            __m512 ws = _mm512_setzero_ps();
            if (m->kind == FLOAT_FP8) {
                float s[16];
                for (int i = 0; i < 16; i++) s[i] = kernel_e8m0(srow[i][col0 / 128]);
                ws = _mm512_loadu_ps(s);
            }
            const int ndw = (ncols + vpd - 1) / vpd;
            if (n_tokens == 1) {
                for (int j = 0; j < ndw; j++) {
                    __m512 v[4];
                    const int n = dword_column_values(m->kind, r[j], ws, v);
                    for (int k = 0; k < n; k++) {
                        const int c = col0 + j * vpd + k;
                        if (c >= m->cols) break;
                        acc1 = _mm512_add_ps(acc1, _mm512_mul_ps(v[k], _mm512_set1_ps(x[c])));
                    }
                }
                continue;
            }
            int nc = 0;
            for (int j = 0; j < ndw; j++) {
                __m512 v[4];
                const int n = dword_column_values(m->kind, r[j], ws, v);
                for (int k = 0; k < n; k++) cols_tile[nc++] = v[k];
            }
            if (nc > ncols) nc = ncols;
            for (int t = 0; t < n_tokens; t++) {
                const float *xt = x + (size_t)t * x_stride + col0;
                float *yt = y + (size_t)t * y_stride + r0;
                __m512 acc = _mm512_maskz_loadu_ps(store_mask, yt);
                for (int c = 0; c < nc; c++) acc = _mm512_add_ps(acc, _mm512_mul_ps(cols_tile[c], _mm512_set1_ps(xt[c])));
                _mm512_mask_storeu_ps(yt, store_mask, acc);
            }
        }
        if (n_tokens == 1) _mm512_mask_storeu_ps(y + r0, store_mask, acc1);
    }
}

static void avx512_matmul_bf16(const bf16_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                               int row_begin, int row_end) {
    const float_matrix m = {FLOAT_BF16, (const uint8_t *)w->values, (size_t)w->cols * 2, w->cols, NULL, 0};
    float_matmul(&m, w->rows, x, x_stride, n_tokens, y, y_stride, row_begin, row_end);
}

static void avx512_matmul_f32(const f32_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                              int row_begin, int row_end) {
    const float_matrix m = {FLOAT_F32, (const uint8_t *)w->values, (size_t)w->cols * 4, w->cols, NULL, 0};
    float_matmul(&m, w->rows, x, x_stride, n_tokens, y, y_stride, row_begin, row_end);
}

static void avx512_matmul_fp8_dequant(const fp8_matrix *w, const float *x, int x_stride, int n_tokens, float *y,
                                      int y_stride, int row_begin, int row_end) {
    const float_matrix m = {FLOAT_FP8, w->codes, (size_t)w->cols, w->cols, w->scales, (w->cols + 127) / 128};
    float_matmul(&m, w->rows, x, x_stride, n_tokens, y, y_stride, row_begin, row_end);
}

static void avx512_scaled_add_f32(float *y, float a, const float *x, int n) {
    const __m512 av = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_mul_ps(av, _mm512_loadu_ps(x + i))));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_mul_ps(av, _mm512_maskz_loadu_ps(m, x + i))));
    }
}

const kernel_ops kernel_ops_avx512 = {
    .name = "avx512",
    .matmul_fp8 = avx512_matmul_fp8,
    .matmul_fp4 = avx512_matmul_fp4,
    .matmul_fp8_dequant = avx512_matmul_fp8_dequant,
    .matmul_bf16 = avx512_matmul_bf16,
    .matmul_f32 = avx512_matmul_f32,
    .scaled_add_f32 = avx512_scaled_add_f32,
};
