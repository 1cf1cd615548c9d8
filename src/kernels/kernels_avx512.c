/* AVX-512 kernels (F, BW, DQ, VL, VNNI, VBMI), bit-identical to kernels_scalar.c.
 *
 * How each product stays exact:
 *  - FP8 x FP8: a product of two e4m3 values has at most 8 significant bits and lies in
 *    [2^-18, 2^17.6]; a block of 128 sums to less than 2^25 in multiples of 2^-18, so f64 FMAs give
 *    the exact block sum in any order (43 bits < 53). The f64 sum is rounded to f32 once, as the
 *    scalar (float)int64 conversion does (scaling by a power of two commutes with rounding here).
 *    A weight code becomes an f64 by sign extension, a shift and one ternary-logic step: its sign
 *    goes to bit 63 and its exponent and mantissa fields to bits 55..49; when the matrix lists
 *    its low codes (fp8_low_codes) bit 61 is also set, which reads as value * 2^-504 for every
 *    code but those, whose excess (kernel_fp8_low_excess) each block sum gives back, or whose
 *    exact values a multi-token tile holds. Unraised the fields read as value * 2^-1016, exact
 *    as well, but e4m3 subnormals become f64 subnormals and every FMA reading one takes a
 *    microcode assist on Intel cores (+38% on a 4096 x 4096 product of heavy-tailed weights,
 *    1e-3 of whose codes are low). The activations carry 2^1000, so products are value * 2^496
 *    (raised) or value * 2^-16, never subnormal. That is the form of 2 and 3 tokens (and of one
 *    token when the matrix has no list); with 4 or more, each code's integer value * 2^9 splits
 *    into a 16-bit high part and a rare low part, and the block sum comes from VPDPWSSD int16 dot
 *    products (four times the f64 FMA's products per instruction), exact by the bounds stated at
 *    "FP8 x FP8 with 4 or more tokens". One token takes the same high parts, looked up as bytes
 *    (VPERMI2B) for each code, and the rare low parts from the matrix's list ("FP8 x FP8, one
 *    token").
 *  - FP4 x FP8: with 1 to 3 tokens (decode), the activations k = x * 2^9 of a 128-element chunk
 *    become A = k / 2^shift (shift the largest power of two dividing them all, so A is exact) in
 *    one to three balanced base-256 digits (signed bytes); the weight enters VPDPBUSD as the
 *    unsigned byte j + 12 (j = 2 * e2m1 in [-12, 12]); 16 rows per pass, the nibbles expanded
 *    with two VPERMB, the digits added by Horner's rule inside the accumulator (a shift by 8
 *    between them, no adds). Block sum = 2^shift * (dot(j + 12, A) - 12 * sum(A)): all int32,
 *    exact, the factor 2^shift moved to the f32 scaling, exactly. With 4 or more, the activations
 *    are int16 words in their block's window and the weights signed words, on VPDPWSSD (exact by
 *    the bounds at "4 or more tokens" below); each 32-column block of 16-row tiles is converted
 *    once and every token of a slice passes over it (4 tiles per pass from 16 tokens a slice).
 *  - Float products: 16 rows at a time, each vector one column of 16 rows (loaded directly from
 *    MATRIX_GROUPS16 weights, else from a tile of 16 rows x 64 bytes transposed in registers);
 *    acc = acc + w * x per column, in column order, with separate multiply and add: per row
 *    exactly the scalar sequence. With several tokens, a tile whose every product w * x is exact
 *    in f32 takes one FMA instead, which rounds the same sum once (see "Exact products" below);
 *    with one, the dequantized FP8 product (wo_a) does the same for each 128-column block whose
 *    activations make every product exact (group_decode). */
#include "kernels/kernels_internal.h"
#include "kernels/kernels_avx2_inline.h"
#include "kernels/kernels_avx512_inline.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local kernel_scratch act_scratch, tile_scratch, excess_scratch, x_pack_scratch, row_sums_scratch;

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

/* 64 weight codes -> 8 vectors of 8 f64, in code order: raised (value * 2^-504 but for the low
 * codes, see kernel_fp8_low_value) or plain (value * 2^-1016). */
static inline __attribute__((always_inline)) void fp8x64_to_f64(const uint8_t *src, int raised, __m512d out[8]) {
    /* sign-extended code c (all high bits = sign) shifted up by 49: the sign lands in bit 63 and
     * bits 56..62, the 7 exponent and mantissa bits in 49..55; keep masks 63 and 55..49, and the
     * raised form also sets bit 61 (exponent + 512) in the same ternary-logic step */
    const __m512i keep = _mm512_set1_epi64((long long)0x80fe000000000000ull);
    const __m512i raise = _mm512_set1_epi64(raised ? (long long)0x2000000000000000ull : 0);
    UNROLL(8)
    for (int k = 0; k < 8; k++) {
        const __m512i d = _mm512_cvtepi8_epi64(_mm_loadl_epi64((const __m128i *)(src + 8 * k)));
        out[k] = _mm512_castsi512_pd(_mm512_ternarylogic_epi64(_mm512_slli_epi64(d, 49), keep, raise, 0xea));
    }
}

/* acc0/acc1 += 64 weights of one row times the matching activations (two chains: FMA latency). */
static inline __attribute__((always_inline)) void fp8_row64(const uint8_t *w, const double *x, int raised,
                                                            __m512d *acc0, __m512d *acc1) {
    __m512d wv[8];
    fp8x64_to_f64(w, raised, wv);
    UNROLL(4)
    for (int k = 0; k < 8; k += 2) {
        *acc0 = _mm512_fmadd_pd(wv[k], _mm512_loadu_pd(x + 8 * k), *acc0);
        *acc1 = _mm512_fmadd_pd(wv[k + 1], _mm512_loadu_pd(x + 8 * k + 8), *acc1);
    }
}

/* The block sums come out as value * 2^496 (raised) or 2^-16 (plain): back to the block's value
 * before rounding to f32. */
static inline __m256d fp8_unscale(__m256d sums, int raised) {
    return _mm256_mul_pd(sums, _mm256_set1_pd(raised ? 0x1p-496 : 0x1p16));
}

static inline __m512d fp8_unscale8(__m512d sums, int raised) {
    return _mm512_mul_pd(sums, _mm512_set1_pd(raised ? 0x1p-496 : 0x1p16));
}

/* acc[i] = acc[i] + f32(block_sum[i]) * (xs * ws[i]): the scalar's block step for 4 rows. */
static inline __m128 fp8_block_step(__m128 acc, __m256d block_sum, float xs, const uint8_t *const ws[4], int b) {
    const __m128 f = _mm256_cvtpd_ps(block_sum);
    const __m128 w_scale = _mm_setr_ps(kernel_e8m0(ws[0][b]), kernel_e8m0(ws[1][b]), kernel_e8m0(ws[2][b]),
                                       kernel_e8m0(ws[3][b]));
    const __m128 scale = _mm_mul_ps(_mm_set1_ps(xs), w_scale);
    return _mm_add_ps(acc, _mm_mul_ps(f, scale));
}

/* One token, 4 rows: with the raised form each block's sums lose the excess of the quad's low
 * codes (`excess`, computed for the quad from the list before its blocks; NULL when it has
 * none) before rounding. next_quad: the next quad's codes (4 * blocks * FP8_ACT_BLOCK bytes from
 * there) to bring into L2 as this one goes, or NULL. */
static inline __attribute__((always_inline)) __m128 fp8_quad_decode(const uint8_t *const wr[4], const uint8_t *const ws[4],
                                                                    const double *xd, const float *x_scales, int blocks,
                                                                    int raised, const double *excess,
                                                                    const uint8_t *next_quad) {
    __m128 acc = _mm_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        const double *xb = xd + (size_t)b * FP8_ACT_BLOCK;
        const size_t off = (size_t)b * FP8_ACT_BLOCK;
        __m512d a00 = _mm512_setzero_pd(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
        /* two blocks ahead: four rows are four streams, more than the hardware prefetchers
         * follow well from one core */
        for (int i = 0; i < 4; i++) {
            _mm_prefetch((const char *)(wr[i] + off + 2 * FP8_ACT_BLOCK), _MM_HINT_T0);
            _mm_prefetch((const char *)(wr[i] + off + 2 * FP8_ACT_BLOCK + 64), _MM_HINT_T0);
        }
        if (next_quad)
            for (int l = 0; l < 8; l++) _mm_prefetch((const char *)(next_quad + (size_t)b * 512 + 64 * l), _MM_HINT_T1);
        UNROLL(2)
        for (int c = 0; c < FP8_ACT_BLOCK; c += 64) {
            fp8_row64(wr[0] + off + c, xb + c, raised, &a00, &a01);
            fp8_row64(wr[1] + off + c, xb + c, raised, &a10, &a11);
            fp8_row64(wr[2] + off + c, xb + c, raised, &a20, &a21);
            fp8_row64(wr[3] + off + c, xb + c, raised, &a30, &a31);
        }
        __m256d sums = hsum4_pd(_mm512_add_pd(a00, a01), _mm512_add_pd(a10, a11), _mm512_add_pd(a20, a21),
                                _mm512_add_pd(a30, a31));
        if (raised && excess) sums = _mm256_sub_pd(sums, _mm256_loadu_pd(excess + 4 * b));
        acc = fp8_block_step(acc, fp8_unscale(sums, raised), x_scales[b], ws, b);
    }
    return acc;
}

/* [sum(a[0]), ..., sum(a[7])] of 8 vectors of 8 lanes, the lanes f64 (as_f64) or int64: pairwise,
 * lanes of a and b interleaved and added, three times, then the 128-bit halves. */
static inline __attribute__((always_inline)) __m512i hsum8_lanes(const __m512i a[8], const int as_f64) {
#define HSUM8_ADD(x, y) \
    (as_f64 ? _mm512_castpd_si512(_mm512_add_pd(_mm512_castsi512_pd(x), _mm512_castsi512_pd(y))) : _mm512_add_epi64(x, y))
    const __m512i s01 = HSUM8_ADD(_mm512_unpacklo_epi64(a[0], a[1]), _mm512_unpackhi_epi64(a[0], a[1]));
    const __m512i s23 = HSUM8_ADD(_mm512_unpacklo_epi64(a[2], a[3]), _mm512_unpackhi_epi64(a[2], a[3]));
    const __m512i s45 = HSUM8_ADD(_mm512_unpacklo_epi64(a[4], a[5]), _mm512_unpackhi_epi64(a[4], a[5]));
    const __m512i s67 = HSUM8_ADD(_mm512_unpacklo_epi64(a[6], a[7]), _mm512_unpackhi_epi64(a[6], a[7]));
    /* sXY = [X01 Y01 | X23 Y23 | X45 Y45 | X67 Y67] (pairs of lanes summed) */
    const __m512i q0 = HSUM8_ADD(_mm512_shuffle_i64x2(s01, s23, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_i64x2(s01, s23, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i q1 = HSUM8_ADD(_mm512_shuffle_i64x2(s45, s67, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_i64x2(s45, s67, _MM_SHUFFLE(3, 1, 3, 1)));
    /* q0 = [a0 a1 (lanes 0-3) | a0 a1 (lanes 4-7) | a2 a3 (0-3) | a2 a3 (4-7)], q1 likewise */
    const __m512i lo = _mm512_shuffle_i64x2(q0, q1, _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i hi = _mm512_shuffle_i64x2(q0, q1, _MM_SHUFFLE(3, 1, 3, 1));
    return HSUM8_ADD(lo, hi); /* [a0 a1 a2 a3 a4 a5 a6 a7] */
#undef HSUM8_ADD
}

/* hsum8_lanes of f64 lanes (exact where the lanes hold integers times a power of two). */
static inline __m512d hsum8_pd(const __m512d a[8]) {
    __m512i v[8];
    for (int i = 0; i < 8; i++) v[i] = _mm512_castpd_si512(a[i]);
    return _mm512_castsi512_pd(hsum8_lanes(v, 1));
}

/* Several tokens, 8 rows, blocks [b0, b1): each block of the 8 rows is converted once into an L1
 * tile (the raised form, its low codes then overwritten with their exact values from the list)
 * and used by every token, two tokens at a time (16 FMA chains; each activation load feeds 8
 * rows); the running sums live in y (set to zero with the first block). */
static inline __attribute__((always_inline)) void fp8_oct_tokens(const fp8_matrix *w, const uint8_t *const wr[8],
                                                                  const uint8_t *const ws[8], const int rows[8], int nr,
                                                                  const double *xd, const float *x_scales, int n_tokens,
                                                                  int b0, int b1, float *y, int y_stride, int r0,
                                                                  int raised) {
    const int cols = w->cols, blocks = cols / FP8_ACT_BLOCK;
    double *tile = kernel_scratch_get(&tile_scratch, 8 * FP8_ACT_BLOCK * sizeof(double));
    uint32_t next_low[8] = {0}, end_low[8] = {0};
    if (raised)
        for (int i = 0; i < 8; i++) kernel_fp8_low_range(w->low, rows[i], b0 * FP8_ACT_BLOCK, &next_low[i], &end_low[i]);
    const __mmask8 store = (__mmask8)((1u << nr) - 1);
    if (b0 == 0)
        for (int t = 0; t < n_tokens; t++) _mm256_mask_storeu_ps(y + (size_t)t * y_stride + r0, store, _mm256_setzero_ps());
    for (int b = b0; b < b1; b++) {
        for (int i = 0; i < 8; i++) {
            for (int c = 0; c < FP8_ACT_BLOCK; c += 64) {
                __m512d wv[8];
                fp8x64_to_f64(wr[i] + (size_t)b * FP8_ACT_BLOCK + c, raised, wv);
                for (int k = 0; k < 8; k++) _mm512_store_pd(tile + i * FP8_ACT_BLOCK + c + 8 * k, wv[k]);
            }
            if (raised)
                kernel_fp8_tile_patch_low(tile + i * FP8_ACT_BLOCK, wr[i], w->low, &next_low[i], end_low[i], b * FP8_ACT_BLOCK);
        }
        float wsf[8];
        for (int i = 0; i < 8; i++) wsf[i] = kernel_e8m0(ws[i][b]);
        const __m256 w_scale = _mm256_loadu_ps(wsf);
        for (int t = 0; t < n_tokens; t += 2) {
            const int pair = t + 1 < n_tokens;
            const double *x0 = xd + (size_t)t * cols + (size_t)b * FP8_ACT_BLOCK;
            const double *x1 = pair ? x0 + cols : x0;
            __m512d a0[8], a1[8];
            UNROLL(8)
            for (int i = 0; i < 8; i++) a0[i] = a1[i] = _mm512_setzero_pd();
            UNROLL(2)
            for (int c = 0; c < FP8_ACT_BLOCK; c += 8) {
                const __m512d xv0 = _mm512_loadu_pd(x0 + c), xv1 = _mm512_loadu_pd(x1 + c);
                UNROLL(8)
                for (int i = 0; i < 8; i++) {
                    const __m512d wv = _mm512_load_pd(tile + i * FP8_ACT_BLOCK + c);
                    a0[i] = _mm512_fmadd_pd(wv, xv0, a0[i]);
                    a1[i] = _mm512_fmadd_pd(wv, xv1, a1[i]);
                }
            }
            for (int u = 0; u <= pair; u++) {
                const __m256 f = _mm512_cvtpd_ps(fp8_unscale8(hsum8_pd(u == 0 ? a0 : a1), raised));
                const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(x_scales[(size_t)(t + u) * blocks + b]), w_scale);
                float *yt = y + (size_t)(t + u) * y_stride + r0;
                _mm256_mask_storeu_ps(yt, store, _mm256_add_ps(_mm256_maskz_loadu_ps(store, yt), _mm256_mul_ps(f, scale)));
            }
        }
    }
}

static void avx512_matmul_fp8_prepared(const fp8_matrix *w, const void *act, const float *x_scales, int n_tokens,
                                       float *y, int y_stride, int row_begin, int row_end) {
    const int cols = w->cols, blocks = cols / FP8_ACT_BLOCK;
    if (row_end <= row_begin || n_tokens <= 0) return;
    const double *xd = act;
    const int raised = w->low != NULL;
    if (n_tokens > 1) {
        /* Tiles of tokens x columns whose activations stay in L2 while every row octet passes over
         * them (kernel_fp8_tile_shape); the blocks of each (row, token) still add in order, the
         * column tiles taken in order with the running sums in y. */
        int slice, tile_blocks;
        kernel_fp8_tile_shape(n_tokens, cols, FP8_ACT_BLOCK * sizeof(double), KERNEL_SLICE_FORM_BYTES, 64, &slice, &tile_blocks);
        for (int t0 = 0; t0 < n_tokens; t0 += slice) {
            const int nt = n_tokens - t0 < slice ? n_tokens - t0 : slice;
            const double *xs_slice = xd + (size_t)t0 * cols;
            const float *scales_slice = x_scales + (size_t)t0 * blocks;
            float *y_slice = y + (size_t)t0 * y_stride;
            for (int b0 = 0; b0 < blocks; b0 += tile_blocks) {
                const int b1 = blocks - b0 < tile_blocks ? blocks : b0 + tile_blocks;
                /* Row octets; a short last one repeats its last row (computed, not stored). */
                for (int r0 = row_begin; r0 < row_end; r0 += 8) {
                    const int nr = row_end - r0 < 8 ? row_end - r0 : 8;
                    const uint8_t *wr[8], *ws[8];
                    int rows[8];
                    kernel_fp8_pass_rows(w, r0, nr, 8, rows, wr, ws);
                    if (raised)
                        fp8_oct_tokens(w, wr, ws, rows, nr, xs_slice, scales_slice, nt, b0, b1, y_slice, y_stride, r0, 1);
                    else
                        fp8_oct_tokens(w, wr, ws, rows, nr, xs_slice, scales_slice, nt, b0, b1, y_slice, y_stride, r0, 0);
                }
            }
        }
        return;
    }
    /* One token, row quads; a short last quad repeats its last row (computed, not stored); short
     * rows also bring the next quad into L2 (kernel_fp8_decode_next_quad). */
    double *excess = raised ? kernel_scratch_get(&excess_scratch, (size_t)blocks * 4 * sizeof(double)) : NULL;
    for (int r0 = row_begin; r0 < row_end; r0 += 4) {
        const int nr = row_end - r0 < 4 ? row_end - r0 : 4;
        const uint8_t *wr[4], *ws[4];
        int rows[4];
        kernel_fp8_pass_rows(w, r0, nr, 4, rows, wr, ws);
        const uint8_t *next_quad = kernel_fp8_decode_next_quad(w, r0, row_end);
        __m128 acc;
        if (raised) {
            const int any_low = kernel_fp8_quad_excess(w, rows, xd, excess);
            acc = fp8_quad_decode(wr, ws, xd, x_scales, blocks, 1, any_low ? excess : NULL, next_quad);
        } else {
            acc = fp8_quad_decode(wr, ws, xd, x_scales, blocks, 0, NULL, next_quad);
        }
        float out[4];
        _mm_storeu_ps(out, acc);
        for (int i = 0; i < nr; i++) y[r0 + i] = out[i];
    }
}

/* --- FP8 x FP8 with 4 or more tokens: int16 dot products (VPDPWSSD) ---
 *
 * Every e4m3 value times 2^9 is an integer k = m * 2^s (m < 16); split it as k = 16 * hi + lo with
 * hi = k / 16 when 16 divides k (else 0) and lo = k otherwise (else 0): one of the two is zero,
 * |hi| <= 14336 and |lo| <= 120 (16 fails to divide k only when s <= 3). A block's exact sum is
 *   S = sum (16 wh + wl)(16 xh + xl) = 256 A + 16 B + C,
 *   A = sum wh xh,  B = sum wh xl + sum wl xh,  C = sum wl xl,
 * each an int16 dot product, VPDPWSSD's 32 products per instruction against the f64 FMA's 8.
 * Bounds: a lane (a row) of B adds at most 2 * 128 products of 14336 * 120 and C 128 of 120^2,
 * far inside int32; 256 A + 16 B + C is rounded to f32 once, as the scalar's (float)int64, by
 * one FMA of exact f32 terms (fp8_words_block_value_exact), or where A is wide (below) formed in
 * f64 (below 2^43, exact) and rounded from there. A lane of A adds 128 products of up to 14336^2, which int32 holds only when the
 * values are not all near the block's maximum: every partial sum of a row's A (the two chains
 * and their total are sums over subsets of the columns) is at most |w_hi|_2 * |x_hi|_2 by
 * Cauchy-Schwarz, so a (token, 16-row tile) whose largest |w_hi|_2^2 * |x_hi|_2^2 is below 2^61
 * (2^62 with room for the f32 rounding of the row norms) cannot overflow. Quantized blocks pass
 * with a wide margin (about 2^57 estimated for Gaussian weights and activations); one that does
 * not gets its A again with int32 sums of 8 products (|sum| <= 8 * 14336^2 < 2^31) added in f64.
 * A is the dense part; lo is rare (only values below 0.24, under 1/1800 of the block maximum
 * 448), so B and C take only the column pairs that hold a lo: a mask per token and block for the
 * activations, per 16-row weight tile for the weights.
 *
 * Lanes are 16 rows. Per 128-column block each tile of 16 rows is converted once (codes to hi and
 * lo words by table, a 16 x 16 dword transposition per 32 columns) into 64 vectors whose lane r
 * holds row r's word pair (2j, 2j + 1). A pass takes 4 such tiles (64 rows) and the tokens of a
 * slice go over them 4 at a time, each token's word pair broadcast once into a register for the
 * 4 tiles' products (fp8_words_tokens). The running sums of a pass stay in a contiguous scratch
 * while it crosses a column tile. Slices and column tiles as the f64 form's
 * (kernel_fp8_tile_shape), for this form's size. */
/* From 4 tokens: with 2 or 3 the tile's conversion, repaid over so few tokens, costs more than
 * the f64 form saves (4096 x 4096, 1 thread, Gaussian weights quantized per 128 x 128 block:
 * 2 tokens 1.76 -> 2.39-2.43 ms per token, 3 tokens 1.58-1.67 -> 1.74-1.91, 4 even at 1.35-1.49,
 * 8 tokens 0.94-0.99 -> 0.72-0.73). */
#define FP8_WORDS_MIN 4

/* The hi and lo words of the 128 code magnitudes (kernels_internal.h), as the four 32-word
 * vectors VPERMI2W looks up. */
static inline void fp8_word_tables(__m512i th[4], __m512i tl[4]) {
    for (int i = 0; i < 4; i++) {
        th[i] = _mm512_load_si512(kernel_e4m3_hi_words + 32 * i);
        tl[i] = _mm512_load_si512(kernel_e4m3_lo_words + 32 * i);
    }
}

/* 32 codes -> their hi and lo words (VPERMI2W on the 128-entry tables, bit 6 choosing the half,
 * bit 7 negating). */
static inline __attribute__((always_inline)) void fp8_codes_to_words(const uint8_t *src, const __m512i th[4],
                                                                     const __m512i tl[4], __m512i *hi, __m512i *lo) {
    const __m512i idx = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)src));
    const __mmask32 upper = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(0x40));
    const __mmask32 neg = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(0x80));
    const __m512i zero = _mm512_setzero_si512();
    __m512i h = _mm512_mask_blend_epi16(upper, _mm512_permutex2var_epi16(th[0], idx, th[1]),
                                        _mm512_permutex2var_epi16(th[2], idx, th[3]));
    __m512i l = _mm512_mask_blend_epi16(upper, _mm512_permutex2var_epi16(tl[0], idx, tl[1]),
                                        _mm512_permutex2var_epi16(tl[2], idx, tl[3]));
    *hi = _mm512_mask_sub_epi16(h, neg, zero, h);
    *lo = _mm512_mask_sub_epi16(l, neg, zero, l);
}

typedef struct fp8_words_prepare_job {
    const uint8_t *x_codes;
    int n_tokens, cols;
    void *act;
} fp8_words_prepare_job;

/* The tokens [t_begin, t_end) of the form (each token's entries are its own). */
static void fp8_words_prepare_tokens(void *ctx, int t_begin, int t_end) {
    const fp8_words_prepare_job *j = ctx;
    const uint8_t *x_codes = j->x_codes;
    const int cols = j->cols, blocks = cols / FP8_ACT_BLOCK;
    /* the form's layout (kernel_fp8_words_form), written here */
    const size_t token_blocks = (size_t)j->n_tokens * blocks;
    int16_t *words = j->act;
    uint64_t *masks = (uint64_t *)((uint8_t *)j->act + token_blocks * KERNEL_FP8_WORDS_BLOCK_BYTES);
    double *norms = (double *)(masks + token_blocks);
    __m512i th[4], tl[4];
    fp8_word_tables(th, tl);
    for (int t = t_begin; t < t_end; t++)
        for (int b = 0; b < blocks; b++) {
            const uint8_t *xc = x_codes + (size_t)t * cols + (size_t)b * FP8_ACT_BLOCK;
            int16_t *hi = words + ((size_t)t * blocks + b) * (2 * FP8_ACT_BLOCK), *lo = hi + FP8_ACT_BLOCK;
            uint64_t m = 0;
            __m512i n2 = _mm512_setzero_si512(); /* int64 lanes: sums of pair sums <= 2 * 14336^2 */
            for (int q = 0; q < FP8_ACT_BLOCK / 32; q++) {
                __m512i h, l;
                fp8_codes_to_words(xc + 32 * q, th, tl, &h, &l);
                _mm512_storeu_si512(hi + 32 * q, h);
                _mm512_storeu_si512(lo + 32 * q, l);
                m |= (uint64_t)_mm512_test_epi32_mask(l, l) << (16 * q);
                const __m512i sq = _mm512_madd_epi16(h, h);
                n2 = _mm512_add_epi64(n2, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(sq)));
                n2 = _mm512_add_epi64(n2, _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(sq, 1)));
            }
            masks[(size_t)t * blocks + b] = m;
            norms[(size_t)t * blocks + b] = (double)_mm512_reduce_add_epi64(n2);
        }
}

/* Split across the pool, as kernel_fp4_words_prepare (the calling thread prepares the form
 * before the product's tasks start). */
static void fp8_words_prepare(const uint8_t *x_codes, int n_tokens, int cols, void *act) {
    fp8_words_prepare_job j = {x_codes, n_tokens, cols, act};
    kernels_parallel_light_rows(fp8_words_prepare_tokens, &j, n_tokens);
}

/* The 16 rows' block at column off -> wh[j], wl[j] lane r = row r's hi / lo word pair j; returns
 * the mask of the pairs where some row has a lo (wl written only when it is nonzero), and in
 * *norm2 the largest row |w_hi|_2^2 (f32 sums of exact pair sums: relative error below 2^-17). */
static inline __attribute__((always_inline)) uint64_t fp8_words_tile(const uint8_t *const wr[16], size_t off,
                                                                     const __m512i th[4], const __m512i tl[4],
                                                                     __m512i *wh, __m512i *wl, float *norm2) {
    uint64_t mask = 0;
    __m512 n2 = _mm512_setzero_ps();
    for (int q = 0; q < FP8_ACT_BLOCK / 32; q++) {
        __m512i h[16], l[16], any = _mm512_setzero_si512();
        UNROLL(16)
        for (int r = 0; r < 16; r++) {
            fp8_codes_to_words(wr[r] + off + 32 * q, th, tl, &h[r], &l[r]);
            any = _mm512_or_si512(any, l[r]);
        }
        transpose16x16(h);
        UNROLL(16)
        for (int j = 0; j < 16; j++) {
            _mm512_store_si512(&wh[16 * q + j], h[j]);
            n2 = _mm512_add_ps(n2, _mm512_cvtepi32_ps(_mm512_madd_epi16(h[j], h[j]))); /* pair sums <= 2 * 14336^2 */
        }
        if (_mm512_test_epi32_mask(any, any)) {
            transpose16x16(l);
            for (int j = 0; j < 16; j++) {
                _mm512_store_si512(&wl[16 * q + j], l[j]);
                if (_mm512_test_epi32_mask(l[j], l[j])) mask |= 1ull << (16 * q + j);
            }
        }
    }
    *norm2 = _mm512_reduce_max_ps(n2);
    return mask;
}

/* A of one token's block with int32 sums of 4 instructions (8 products per lane, below 2^31)
 * added in f64: exact for any codes. */
static __attribute__((noinline)) void fp8_words_wide_a(const __m512i *wh, const int32_t *xh, __m512d a_out[2]) {
    __m512d lo = _mm512_setzero_pd(), hi = lo;
    for (int g = 0; g < FP8_ACT_BLOCK / 2; g += 4) {
        __m512i s = _mm512_setzero_si512();
        for (int j = g; j < g + 4; j++) s = _mm512_dpwssd_epi32(s, wh[j], _mm512_set1_epi32(xh[j]));
        lo = _mm512_add_pd(lo, _mm512_cvtepi32_pd(_mm512_castsi512_si256(s)));
        hi = _mm512_add_pd(hi, _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(s, 1)));
    }
    a_out[0] = lo;
    a_out[1] = hi;
}

/* The activation lows' share of one token's block: B += wh xl, C += wl xl over the pairs in
 * x_mask (the weight lows' B += wl xh is taken for a token group at once, in fp8_words_tokens). */
static __attribute__((noinline)) void fp8_words_x_lows(const __m512i *wh, const __m512i *wl, uint64_t w_mask,
                                                       const int32_t *xl, uint64_t x_mask, __m512i *b, __m512i *c) {
    __m512i B = *b, C = *c;
    for (uint64_t m = x_mask; m; m &= m - 1) {
        const int j = __builtin_ctzll(m);
        B = _mm512_dpwssd_epi32(B, wh[j], _mm512_set1_epi32(xl[j]));
    }
    for (uint64_t m = w_mask & x_mask; m; m &= m - 1) {
        const int j = __builtin_ctzll(m);
        C = _mm512_dpwssd_epi32(C, wl[j], _mm512_set1_epi32(xl[j]));
    }
    *b = B;
    *c = C;
}

/* f32 of a block's value S * 2^-18, S = 256 A + 16 B + C, from the int32 A, B and C of a narrow
 * (token, tile) on 16 f32 lanes, exact for any low terms: A' = A + (B >> 4) and the rest 16 (B & 15)
 * + C make S = 256 A' + 16 (B & 15) + C; fa = f32(A') and r = A' - fa (an exact integer: the narrow
 * bound keeps |A| < 2^30.5 and |B >> 4| < 2^25 (B below 2^29, the form's bounds above), so fa is
 * below 2^31 and |r| <= 64) make S = 256 fa + e with e = 256 r + 16 (B & 15) + C, |e| <= 2^14 +
 * 240 + 128 * 120^2 < 2^24: exact in f32, and one FMA rounds 256 fa + e once, as f32(S) must be.
 * Then f32(S) * 2^-18 is exact (S is an integer: the value is 0 or at least 2^-18, normal).
 * One form for every narrow block: it replaced a single-FMA step for C = 0 with B within a bound
 * (checked per tile and token) and the f64 form for the rest, at the same speed on bench_kernels'
 * Gaussian blocks (4096 x 4096, 1 thread, three alternating runs, ms per token: 256 tokens
 * 0.1150-0.1183 before, 0.1121-0.1198 after; 64 tokens 0.1360-0.1377, 0.1338-0.1362). */
static inline __m512 fp8_words_block_value_exact(__m512i A, __m512i B, __m512i C) {
    const __m512i a = _mm512_add_epi32(A, _mm512_srai_epi32(B, 4));
    const __m512i rest = _mm512_add_epi32(_mm512_slli_epi32(_mm512_and_si512(B, _mm512_set1_epi32(15)), 4), C);
    const __m512 fa = _mm512_cvtepi32_ps(a);
    const __m512i r = _mm512_sub_epi32(a, _mm512_cvtps_epi32(fa)); /* fa is an integer: converts back exactly */
    const __m512 e = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(r, 8), rest));
    return _mm512_mul_ps(_mm512_fmadd_ps(fa, _mm512_set1_ps(256.0f), e), _mm512_set1_ps(0x1p-18f));
}

/* f32 of a block's value (S * 2^-18) from A (as f64 halves) and the int32 low terms. */
static inline __m512 fp8_words_block_value(const __m512d A[2], __m512i B, __m512i C) {
    __m256 half[2];
    UNROLL(2)
    for (int h = 0; h < 2; h++) {
        const __m512d a = A[h];
        const __m512d b = _mm512_cvtepi32_pd(h ? _mm512_extracti64x4_epi64(B, 1) : _mm512_castsi512_si256(B));
        const __m512d c = _mm512_cvtepi32_pd(h ? _mm512_extracti64x4_epi64(C, 1) : _mm512_castsi512_si256(C));
        const __m512d sum = _mm512_fmadd_pd(a, _mm512_set1_pd(256.0), _mm512_fmadd_pd(b, _mm512_set1_pd(16.0), c));
        half[h] = _mm512_cvtpd_ps(_mm512_mul_pd(sum, _mm512_set1_pd(0x1p-18)));
    }
    return _mm512_insertf32x8(_mm512_castps256_ps512(half[0]), half[1], 1);
}

/* One 16-row tile of a pass (fp8_words_matmul): its converted block and what fp8_words_tile found. */
typedef struct fp8_words_pass_tile {
    __m512i *wh, *wl; /* the block's hi and lo pair vectors (wl read only where w_mask says) */
    uint64_t w_mask;
    float w_norm2;
    __m512 w_scale;
    int r0;
    __mmask16 store;
} fp8_words_pass_tile;

/* The block value of a (token, tile) pair outside fp8_words_tokens' in-line case: every
 * activation-low pair's terms, then the exact f32 form, or where A may not fit int32 (wide) the
 * f64 form with A again from narrow int32 sums. B holds the weight lows' part. */
static __attribute__((noinline)) __m512 fp8_words_block_value_general(const fp8_words_pass_tile *tk, __m512i A,
                                                                      __m512i B, const int32_t *xh, uint64_t x_mask,
                                                                      double x_norm2) {
    __m512i C = _mm512_setzero_si512();
    if (x_mask) fp8_words_x_lows(tk->wh, tk->wl, tk->w_mask, xh + FP8_ACT_BLOCK / 2, x_mask, &B, &C);
    if (!kernel_fp8_words_wide(tk->w_norm2, x_norm2)) return fp8_words_block_value_exact(A, B, C);
    __m512d Ad[2];
    fp8_words_wide_a(tk->wh, xh, Ad);
    return fp8_words_block_value(Ad, B, C);
}

/* Tiles per pass and tokens per step: each pair vector loaded feeds FP8_WORDS_STEP_TOKENS
 * products and each broadcast activation pair FP8_WORDS_PASS_TILES, 0.5 loads per VPDPWSSD in
 * 16 independent chains. The form it replaced (one tile, four tokens, every activation pair a
 * broadcast memory operand: 1.25 loads per product) issued about 2 G VPDPWSSD/s on a core whose
 * unit does 5.3 (Ice Lake server, a loop of only the products, L1-resident); 4 tiles x 3 tokens
 * (0.58 loads) measured 5.0-5.2 there, and in the whole product 4 tokens per step did a little
 * better than 3 (4096 x 4096, 1 thread, ms per token, alternating: 256 tokens 0.27-0.28 against
 * 0.29-0.37, 64 tokens 0.30-0.34 against 0.32-0.49). */
#define FP8_WORDS_PASS_TILES 4
#define FP8_WORDS_STEP_TOKENS 4

/* T tokens from t of the slice over R converted tiles: y += block value * (xs * ws). The sums
 * are int32 and wrap modulo 2^32, so their order is free: exact whenever the true A fits, which
 * the norms' bound (kernel_fp8_words_wide) checks per (token, tile). */
static inline __attribute__((always_inline)) void fp8_words_tokens(const int R, const int T,
                                                                   const fp8_words_pass_tile *tiles,
                                                                   const int16_t *words, const uint64_t *masks,
                                                                   const double *norms, const float *x_scales,
                                                                   int blocks, int b, int t, float *sums) {
    const int32_t *xh[FP8_WORDS_STEP_TOKENS];
    uint64_t xm[FP8_WORDS_STEP_TOKENS];
    UNROLL(16)
    for (int u = 0; u < T; u++) {
        xh[u] = (const int32_t *)(words + ((size_t)(t + u) * blocks + b) * (2 * FP8_ACT_BLOCK));
        xm[u] = masks[(size_t)(t + u) * blocks + b];
    }
    __m512i a[FP8_WORDS_PASS_TILES * FP8_WORDS_STEP_TOKENS];
    UNROLL(16)
    for (int i = 0; i < R * T; i++) a[i] = _mm512_setzero_si512();
    const __m512i *wh[FP8_WORDS_PASS_TILES];
    UNROLL(16)
    for (int k = 0; k < R; k++) wh[k] = tiles[k].wh;
    UNROLL(64)
    for (int j = 0; j < FP8_ACT_BLOCK / 2; j++) {
        __m512i wj[FP8_WORDS_PASS_TILES];
        UNROLL(16)
        for (int k = 0; k < R; k++) wj[k] = zmm_load_once(wh[k] + j);
        UNROLL(16)
        for (int u = 0; u < T; u++) {
            const __m512i xb = _mm512_set1_epi32(xh[u][j]);
            UNROLL(16)
            for (int k = 0; k < R; k++) a[k * T + u] = _mm512_dpwssd_epi32(a[k * T + u], wj[k], xb);
        }
    }
    /* The block values in one form (fp8_words_block_value_exact), with no branch on the low terms,
     * for every token with at most one pair of activation lows (j0; of the synth model's blocks
     * with activation lows, 72% have one pair) whose A fits int32 for every tile of the pass (by
     * its largest weight norm): B += wh[j0] xl[j0] and C = wl[j0] xl[j0], the weight lows read
     * through a mask (zero where w_mask has no j0); the rest out of line
     * (fp8_words_block_value_general). */
    float pass_norm2 = tiles[0].w_norm2;
    UNROLL(16)
    for (int k = 1; k < R; k++) pass_norm2 = tiles[k].w_norm2 > pass_norm2 ? tiles[k].w_norm2 : pass_norm2;
    int in_line[FP8_WORDS_STEP_TOKENS], j0[FP8_WORDS_STEP_TOKENS];
    __m512i x0[FP8_WORDS_STEP_TOKENS];
    UNROLL(16)
    for (int u = 0; u < T; u++) {
        in_line[u] = !(xm[u] & (xm[u] - 1)) && !kernel_fp8_words_wide(pass_norm2, norms[(size_t)(t + u) * blocks + b]);
        /* pair 63 for a token without activation lows: its lo words are zero (the form writes
         * every lo word, zeros included), so both terms vanish */
        j0[u] = __builtin_ctzll(xm[u] | 1ull << 63);
        x0[u] = _mm512_set1_epi32(xh[u][FP8_ACT_BLOCK / 2 + j0[u]]);
    }
    UNROLL(16)
    for (int k = 0; k < R; k++) {
        const fp8_words_pass_tile *tk = &tiles[k];
        /* the weight lows' part of B, each listed pair's vector loaded once for the step */
        __m512i B[FP8_WORDS_STEP_TOKENS];
        UNROLL(16)
        for (int u = 0; u < T; u++) B[u] = _mm512_setzero_si512();
        for (uint64_t m = tk->w_mask; m; m &= m - 1) {
            const int j = __builtin_ctzll(m);
            const __m512i wlj = _mm512_load_si512(&tk->wl[j]);
            UNROLL(16)
            for (int u = 0; u < T; u++) B[u] = _mm512_dpwssd_epi32(B[u], wlj, _mm512_set1_epi32(xh[u][j]));
        }
        UNROLL(16)
        for (int u = 0; u < T; u++) {
            const __m512i A = a[k * T + u];
            __m512 f;
            if (in_line[u]) {
                const __mmask16 w_low = (__mmask16) - (int)((tk->w_mask >> j0[u]) & 1);
                const __m512i C = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                                      _mm512_maskz_load_epi32(w_low, &tk->wl[j0[u]]), x0[u]);
                f = fp8_words_block_value_exact(A, _mm512_dpwssd_epi32(B[u], _mm512_load_si512(&tk->wh[j0[u]]), x0[u]), C);
            } else {
                f = fp8_words_block_value_general(tk, A, B[u], xh[u], xm[u], norms[(size_t)(t + u) * blocks + b]);
            }
            const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(x_scales[(size_t)(t + u) * blocks + b]), tk->w_scale);
            float *st = sums + (size_t)u * 16 * FP8_WORDS_PASS_TILES + 16 * k;
            _mm512_store_ps(st, _mm512_add_ps(_mm512_load_ps(st), _mm512_mul_ps(f, scale)));
        }
    }
}

/* The tokens [t0, t1) of the slice over R tiles, FP8_WORDS_STEP_TOKENS at a time; sums holds the
 * pass's running sums, 16 * FP8_WORDS_PASS_TILES per token from t0 (tile k at 16 k). */
static inline __attribute__((always_inline)) void fp8_words_pass(const int R, const fp8_words_pass_tile *tiles,
                                                                 const int16_t *words, const uint64_t *masks,
                                                                 const double *norms, const float *x_scales, int blocks,
                                                                 int b, int t0, int t1, float *sums) {
    const size_t token_sums = 16 * FP8_WORDS_PASS_TILES;
    int t = t0;
    for (; t + FP8_WORDS_STEP_TOKENS <= t1; t += FP8_WORDS_STEP_TOKENS)
        fp8_words_tokens(R, FP8_WORDS_STEP_TOKENS, tiles, words, masks, norms, x_scales, blocks, b, t,
                         sums + (size_t)(t - t0) * token_sums);
    for (; t < t1; t++)
        fp8_words_tokens(R, 1, tiles, words, masks, norms, x_scales, blocks, b, t, sums + (size_t)(t - t0) * token_sums);
}

/* A pass's running sums between y and the contiguous scratch: from y (dir 1), zeros (-1) or back to
 * y (0). One token's rows of the pass are 4 lines of y and the next token's y_stride floats on
 * (16 KB in a 4096-row product), a stride no hardware prefetcher follows: they are prefetched
 * 8 tokens ahead (4096 x 4096, 256 tokens, 1 thread: these moves were 12% of the product's
 * time, y being read and written once per column tile). */
static void fp8_words_sums_move(const fp8_words_pass_tile *tiles, int R, float *y, int y_stride, float *sums, int t0,
                                int nt, int dir) {
    for (int t = t0; t < t0 + nt; t++) {
        float *yt = y + (size_t)t * y_stride, *st = sums + (size_t)(t - t0) * 16 * FP8_WORDS_PASS_TILES;
        if (dir >= 0 && t + 8 < t0 + nt)
            for (int k = 0; k < R; k++) _mm_prefetch((const char *)(yt + (size_t)8 * y_stride + tiles[k].r0), _MM_HINT_T0);
        for (int k = 0; k < R; k++) {
            if (dir == 0)
                _mm512_mask_storeu_ps(yt + tiles[k].r0, tiles[k].store, _mm512_load_ps(st + 16 * k));
            else
                _mm512_store_ps(st + 16 * k, dir < 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(tiles[k].store, yt + tiles[k].r0));
        }
    }
}

static void fp8_words_matmul(const fp8_matrix *w, const void *act, const float *x_scales, int n_tokens, float *y,
                             int y_stride, int row_begin, int row_end) {
    const int cols = w->cols, blocks = cols / FP8_ACT_BLOCK;
    const int16_t *words;
    const uint64_t *masks;
    const double *norms;
    kernel_fp8_words_form(act, n_tokens, cols, &words, &masks, &norms);
    __m512i th[4], tl[4];
    fp8_word_tables(th, tl);
    /* per tile of a pass: 64 hi then 64 lo pair vectors (32 KB for four: the hi halves, read by
     * every token, stay in L1) */
    __m512i *tile_words = kernel_scratch_get(&tile_scratch, FP8_WORDS_PASS_TILES * FP8_ACT_BLOCK * sizeof(__m512i));
    int slice, tile_blocks;
    /* 256 tokens (a whole prefill chunk) in 1 MB of form, 8 blocks of them: each weight block is
     * converted once per call instead of twice, the running sums move as often as before.
     * 4096 x 4096, 1 thread, ms per token (`bench_kernels --quick --several-tokens 16,64,256
     * --best 10`, three alternating runs, AMD EPYC, Zen 5 with 1 MB of L2): 128 tokens in 512 KB
     * (as measured best on an Intel host earlier: 0.29 against 0.33-0.34 with 64 and 0.32-0.36
     * with 256 in 512 KB) 0.176-0.187 at 256 tokens, 0.209-0.228 at 64; 256 in 512 KB
     * 0.160-0.163, 0.212-0.225; 256 in 1 MB 0.150-0.155, 0.196-0.206. */
    kernel_fp8_tile_shape(n_tokens, cols, KERNEL_FP8_WORDS_BLOCK_BYTES, 2 * KERNEL_SLICE_FORM_BYTES, 256, &slice,
                          &tile_blocks);
    /* The running sums of a pass's rows for the slice's tokens, contiguous: in y, one token's
     * rows lie a multiple of 4 KB from the next token's, so every store to one token's sums and
     * the next token's load aliased (and all of them shared an L1 set). */
    float *sums = kernel_scratch_get(&row_sums_scratch, (size_t)slice * 16 * FP8_WORDS_PASS_TILES * sizeof(float));
    for (int t0 = 0; t0 < n_tokens; t0 += slice) {
        const int nt = n_tokens - t0 < slice ? n_tokens - t0 : slice;
        for (int b0 = 0; b0 < blocks; b0 += tile_blocks) {
            const int b1 = blocks - b0 < tile_blocks ? blocks : b0 + tile_blocks;
            /* Passes of up to 4 tiles of 16 rows; a short last tile repeats its last row
             * (computed, not stored). */
            for (int p0 = row_begin; p0 < row_end; p0 += 16 * FP8_WORDS_PASS_TILES) {
                const int pass_rows = row_end - p0 < 16 * FP8_WORDS_PASS_TILES ? row_end - p0 : 16 * FP8_WORDS_PASS_TILES;
                const int R = (pass_rows + 15) / 16;
                fp8_words_pass_tile tiles[FP8_WORDS_PASS_TILES];
                const uint8_t *wr[FP8_WORDS_PASS_TILES][16], *ws[FP8_WORDS_PASS_TILES][16];
                for (int k = 0; k < R; k++) {
                    const int r0 = p0 + 16 * k, nr = row_end - r0 < 16 ? row_end - r0 : 16;
                    int rows[16];
                    kernel_fp8_pass_rows(w, r0, nr, 16, rows, wr[k], ws[k]);
                    tiles[k].r0 = r0;
                    tiles[k].store = (__mmask16)((1u << nr) - 1);
                    tiles[k].wh = tile_words + (size_t)k * FP8_ACT_BLOCK;
                    tiles[k].wl = tiles[k].wh + FP8_ACT_BLOCK / 2;
                }
                fp8_words_sums_move(tiles, R, y, y_stride, sums, t0, nt, b0 == 0 ? -1 : 1);
                for (int b = b0; b < b1; b++) {
                    /* The next block of the pass's rows, 2 lines from each of up to 64 rows 4 KB or
                     * more apart: more streams than the hardware prefetchers follow, and the
                     * conversion below waited for them (`perf`: its row loads were the hottest
                     * instructions of the conversion, 19% of the product). 4096 x 4096, 1 thread,
                     * ms per token, `bench_kernels --quick --several-tokens 16,64,256 --best 10
                     * --from-ram`, four alternating runs (AMD EPYC Zen 5): 16 tokens 0.348-0.404
                     * -> 0.298-0.307, 64 tokens 0.186-0.192 -> 0.170-0.179, 256 tokens
                     * 0.144-0.155 -> 0.139-0.150; two blocks ahead measured the same. */
                    if (b + 1 < b1)
                        for (int k = 0; k < R; k++)
                            for (int i = 0; i < 16; i++) {
                                const char *next = (const char *)(wr[k][i] + (size_t)(b + 1) * FP8_ACT_BLOCK);
                                _mm_prefetch(next, _MM_HINT_T0);
                                _mm_prefetch(next + 64, _MM_HINT_T0);
                            }
                    for (int k = 0; k < R; k++) {
                        fp8_words_pass_tile *tk = &tiles[k];
                        tk->w_mask = fp8_words_tile(wr[k], (size_t)b * FP8_ACT_BLOCK, th, tl, tk->wh, tk->wl, &tk->w_norm2);
                        float wsf[16];
                        for (int i = 0; i < 16; i++) wsf[i] = kernel_e8m0(ws[k][i][b]);
                        tk->w_scale = _mm512_loadu_ps(wsf);
                    }
                    if (R == FP8_WORDS_PASS_TILES)
                        fp8_words_pass(FP8_WORDS_PASS_TILES, tiles, words, masks, norms, x_scales, blocks, b, t0, t0 + nt, sums);
                    else
                        for (int k = 0; k < R; k++)
                            fp8_words_pass(1, &tiles[k], words, masks, norms, x_scales, blocks, b, t0, t0 + nt, sums + 16 * k);
                }
                fp8_words_sums_move(tiles, R, y, y_stride, sums, t0, nt, 0);
            }
        }
    }
}

/* --- FP8 x FP8, one token: int16 words from byte tables (VPDPWSSD) ---
 *
 * Decode reads each weight once, so the conversion of a code is what a product costs. Here a
 * code becomes the signed int16 hi word k / 16 (k = value * 2^9; 0 when 16 does not divide k, see
 * below) from byte tables: its high byte by two VPERMI2B lookups (codes 0..127 and 128..255 of
 * kernel_e4m3_hi_word_hi_bytes, blended by the sign bit), its low byte by one (the magnitude's,
 * kernel_e4m3_hi_word_lo_bytes, negated where the sign is set), then one VPUNPCKLBW / VPUNPCKHBW: 64 codes in about a dozen
 * instructions where the f64 form above takes 32. The unpacking interleaves the
 * bytes of each 128-bit lane's halves (words 8L..8L+7 of the low unpack are codes 16L..16L+7, of
 * the high one 16L+8..16L+15), so the activation words are stored in that order.
 *
 * A block's exact sum is S = sum k_w k_x. With k_x = 16 xh + xl as in the several-token words
 * form (xl the rare remainder, nonzero only below 0.24) and k_w = 16 wh + wl:
 *   S = 256 A + 16 B + L,  A = sum wh xh,  B = sum wh xl,  L = sum wl k_x.
 * A and B are VPDPWSSD sums (B only in blocks where the token has an xl, flagged in the form);
 * L comes from the matrix's low-code list (fp8_low_codes), which holds every code whose wl is
 * nonzero, as kernel_e4m3_lo_int[code] * k_x per entry. Without a list (more low codes than
 * fp8_low_codes_limit) the product takes the f64 form.
 * Bounds: |wh|, |xh| <= 14336, so a lane of the two accumulators of A holds 4 products each, at
 * most 8.2e8, and their sum 1.64e9 < 2^31; B's lanes are below 8 * 14336 * 120. Each lane pair
 * becomes an int64 16 A + B (below 2^36), 8 blocks' lanes are summed at once (hsum8_lanes: block
 * sums below 2^39), converted to f64 (exact) and multiplied by 16, plus L: S exactly, below 2^53.
 * Then the scalar's block step: f32(S) * 2^-18 times f32(xs * ws), added in block order. (The
 * lanes widened to f64 by VCVTDQ2PD instead, as before: 512 x 4096, 1 thread, in L2, 4.38 -> 4.25
 * ns per row and block; from a 40-matrix pool 5.9-6.9 -> 4.9-5.4, the host noisy.)
 *
 * Rows go one at a time through all their blocks, a single sequential stream that the hardware
 * prefetcher follows (several rows side by side are as many streams, which it follows worse: two
 * rows interleaved block by block, which shares the in-order adds' shuffles, took 6% less in L2
 * and 2.3 times as long from a pool of 40 matrices of 512 x 4096). The block values stay in
 * registers up to their f32 products; those go through memory only as whole vectors, read back
 * with the shape they were stored in (a vector read of values just stored one by one, or the
 * reverse, waits for the stores to retire). */
#define FP8_DWORDS_BATCH 8 /* blocks summed by one hsum8_lanes */

typedef struct fp8_dwords_form {
    const int16_t *xh, *xl; /* [cols] each, in the unpack order */
    const uint8_t *codes;   /* [cols]: the token's codes (k for the low-code corrections; the f64 form) */
    const uint8_t *flags;   /* [blocks]: the block has an xl */
} fp8_dwords_form;

static size_t fp8_dwords_bytes(int cols) { return (size_t)cols * (2 + 2 + 1) + (size_t)(cols / FP8_ACT_BLOCK) + 64; }

static fp8_dwords_form fp8_dwords_layout(const void *act, int cols) {
    fp8_dwords_form f;
    f.xh = act;
    f.xl = f.xh + cols;
    f.codes = (const uint8_t *)(f.xl + cols);
    f.flags = f.codes + cols;
    return f;
}

/* The token's hi and lo words (fp8_codes_to_words, natural order) moved into the unpack order,
 * 64 columns at a time: the first 32 words are columns 16L + t, the next 32 columns 16L + 8 + t
 * (lane L, t < 8). */
static void fp8_dwords_prepare(const uint8_t *x_codes, int cols, void *act) {
    int16_t *xh = act, *xl = xh + cols;
    uint8_t *codes = (uint8_t *)(xl + cols), *flags = codes + cols;
    memcpy(codes, x_codes, (size_t)cols);
    int16_t order[64];
    for (int j = 0; j < 32; j++) {
        order[j] = (int16_t)(16 * (j / 8) + j % 8);
        order[32 + j] = (int16_t)(16 * (j / 8) + 8 + j % 8);
    }
    const __m512i first = _mm512_loadu_si512(order), second = _mm512_loadu_si512(order + 32);
    __m512i th[4], tl[4];
    fp8_word_tables(th, tl);
    for (int b = 0; b < cols / FP8_ACT_BLOCK; b++) {
        __m512i any = _mm512_setzero_si512();
        for (int c = b * FP8_ACT_BLOCK; c < (b + 1) * FP8_ACT_BLOCK; c += 64) {
            __m512i h0, l0, h1, l1;
            fp8_codes_to_words(x_codes + c, th, tl, &h0, &l0);
            fp8_codes_to_words(x_codes + c + 32, th, tl, &h1, &l1);
            _mm512_store_si512(xh + c, _mm512_permutex2var_epi16(h0, first, h1));
            _mm512_store_si512(xh + c + 32, _mm512_permutex2var_epi16(h0, second, h1));
            _mm512_store_si512(xl + c, _mm512_permutex2var_epi16(l0, first, l1));
            _mm512_store_si512(xl + c + 32, _mm512_permutex2var_epi16(l0, second, l1));
            any = _mm512_or_si512(any, _mm512_or_si512(l0, l1));
        }
        flags[b] = (uint8_t)(_mm512_test_epi16_mask(any, any) != 0);
    }
}

/* The two signed hi words of 64 codes, in the unpack order. t: the low bytes of codes 0..127,
 * then the high bytes of codes 0..127 and 128..255 (the tables above). A negative code's
 * low byte is the negated low byte of its magnitude (-v mod 2^16 has low byte -v mod 2^8), one
 * masked subtraction where a second lookup and a blend took two shuffle-unit operations and a
 * register copy: 512 x 4096, 1 thread, in L2, a copy of the kernel, 4.16 -> 3.89 ns per row and
 * block (best of 5 alternating). The high byte has no such form (it also depends on whether the
 * low byte is zero; computed so, it took 4.29). */
static inline __attribute__((always_inline)) void fp8_dwords_convert(const uint8_t *src, const __m512i t[6], __m512i *w0,
                                                                     __m512i *w1) {
    const __m512i idx = _mm512_loadu_si512(src);
    const __mmask64 neg = _mm512_movepi8_mask(idx);
    const __m512i lo_magnitude = _mm512_permutex2var_epi8(t[0], idx, t[1]);
    const __m512i lo = _mm512_mask_sub_epi8(lo_magnitude, neg, _mm512_setzero_si512(), lo_magnitude);
    const __m512i hi = _mm512_mask_blend_epi8(neg, _mm512_permutex2var_epi8(t[2], idx, t[3]),
                                              _mm512_permutex2var_epi8(t[4], idx, t[5]));
    *w0 = _mm512_unpacklo_epi8(lo, hi);
    *w1 = _mm512_unpackhi_epi8(lo, hi);
}

/* One block of a row: its lanes as 8 int64, 16 A + B (B only when the token's block has an xl).
 * Each int32 lane is widened by shifts (its dword pairs sign-extended and added), which the
 * shuffle units do not take: they are busy with the code conversion. */
static inline __attribute__((always_inline)) __m512i fp8_dwords_widen(__m512i a) {
    return _mm512_add_epi64(_mm512_srai_epi64(_mm512_slli_epi64(a, 32), 32), _mm512_srai_epi64(a, 32));
}

static inline __attribute__((always_inline)) __m512i fp8_dwords_block(const uint8_t *wrow, const int16_t *xh,
                                                                      const int16_t *xl, int flagged, const __m512i t[6]) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0;
    __m512i w[4];
    fp8_dwords_convert(wrow, t, &w[0], &w[1]);
    fp8_dwords_convert(wrow + 64, t, &w[2], &w[3]);
    UNROLL(4)
    for (int q = 0; q < 4; q += 2) {
        a0 = _mm512_dpwssd_epi32(a0, w[q], _mm512_load_si512(xh + 32 * q));
        a1 = _mm512_dpwssd_epi32(a1, w[q + 1], _mm512_load_si512(xh + 32 * q + 32));
    }
    __m512i v = _mm512_slli_epi64(fp8_dwords_widen(_mm512_add_epi32(a0, a1)), 4);
    if (flagged) {
        __m512i bsum = _mm512_setzero_si512();
        UNROLL(4)
        for (int q = 0; q < 4; q++) bsum = _mm512_dpwssd_epi32(bsum, w[q], _mm512_load_si512(xl + 32 * q));
        v = _mm512_add_epi64(v, fp8_dwords_widen(bsum));
    }
    return v;
}

/* One row's block products f32(S) * 2^-18 * f32(xs * ws), 8 blocks per vector: out[j * stride]
 * lane i = block 8j + i (zero past the last block). */
static inline __attribute__((always_inline)) void fp8_dwords_row(const fp8_matrix *w, const fp8_dwords_form *f,
                                                                 const float *scale, int r, const __m512i t[6],
                                                                 __m256 *out, size_t stride) {
    const int cols = w->cols, blocks = cols / FP8_ACT_BLOCK;
    const uint8_t *wrow = w->codes + (size_t)r * cols;
    uint32_t k = w->low->row_first[r];
    const uint32_t k_end = w->low->row_first[r + 1];
    for (int b0 = 0; b0 < blocks; b0 += FP8_DWORDS_BATCH) {
        const int n = blocks - b0 < FP8_DWORDS_BATCH ? blocks - b0 : FP8_DWORDS_BATCH;
        __m512i v[FP8_DWORDS_BATCH];
        UNROLL(8)
        for (int i = 0; i < FP8_DWORDS_BATCH; i++) {
            const int b = b0 + i;
            if (i < n)
                v[i] = fp8_dwords_block(wrow + (size_t)b * FP8_ACT_BLOCK, f->xh + (size_t)b * FP8_ACT_BLOCK,
                                        f->xl + (size_t)b * FP8_ACT_BLOCK, f->flags[b], t);
            else
                v[i] = _mm512_setzero_si512();
        }
        /* 16 (16 A + B) = 256 A + 16 B, below 2^43: exact in f64 */
        __m512d s = _mm512_mul_pd(_mm512_cvtepi64_pd(hsum8_lanes(v, 0)), _mm512_set1_pd(16.0));
        /* the row's low codes in these blocks: lane b - b0 gains lo * k_x (|product| < 2^25) */
        for (const int c_end = (b0 + n) * FP8_ACT_BLOCK; k < k_end && w->low->cols[k] < c_end; k++) {
            const int c = w->low->cols[k];
            const double p = (double)(kernel_e4m3_lo_int[wrow[c]] * kernel_e4m3_int[f->codes[c]]);
            s = _mm512_mask_add_pd(s, (__mmask8)(1u << (c / FP8_ACT_BLOCK - b0)), s, _mm512_set1_pd(p));
        }
        const __m256 block = _mm256_mul_ps(_mm512_cvtpd_ps(s), _mm256_set1_ps(0x1p-18f));
        out[(size_t)(b0 / FP8_DWORDS_BATCH) * stride] = _mm256_mul_ps(block, _mm256_loadu_ps(scale + b0)); /* 0 past the end */
    }
}

/* Rows are computed one at a time (one stream each, above), 8 of them into a small buffer; then
 * the block step's adds, in block order for each row, run on the 8 rows at once (the buffer read
 * back as vectors of 8 rows through an 8 x 8 transpose): one vector add per block for 8 rows
 * where each row took an add and a lane extraction per block. Copy of the kernel, 512 x 4096,
 * 1 thread, in L2, alternating: 3.68-3.75 -> 3.26-3.31 ns per row and block. */
static void fp8_dwords_matmul(const fp8_matrix *w, const void *act, const float *x_scales, float *y, int row_begin,
                              int row_end) {
    const int cols = w->cols, blocks = cols / FP8_ACT_BLOCK, scale_cols = (cols + 127) / 128;
    const int batches = (blocks + FP8_DWORDS_BATCH - 1) / FP8_DWORDS_BATCH;
    const fp8_dwords_form f = fp8_dwords_layout(act, cols);
    __m512i t[6];
    for (int i = 0; i < 2; i++) t[i] = _mm512_load_si512(kernel_e4m3_hi_word_lo_bytes + 64 * i);
    for (int i = 0; i < 4; i++) t[2 + i] = _mm512_load_si512(kernel_e4m3_hi_word_hi_bytes + 64 * i);
    /* per 128 rows: f32(xs * ws) per block, as the scalar rounds it (0 past the last block) */
    float *scale = kernel_scratch_get(&excess_scratch, (size_t)batches * FP8_DWORDS_BATCH * sizeof(float));
    /* [batches][8 rows]: 32 bytes per 128 columns */
    __m256 *products = kernel_scratch_get(&tile_scratch, (size_t)batches * 8 * sizeof(__m256));
    int scale_row = -1;
    for (int r8 = row_begin; r8 < row_end; r8 += 8) {
        const int nr = row_end - r8 < 8 ? row_end - r8 : 8;
        for (int i = 0; i < 8; i++) {
            if (i >= nr) { /* the last group's missing rows: zeros, never stored */
                for (int j = 0; j < batches; j++) products[(size_t)j * 8 + i] = _mm256_setzero_ps();
                continue;
            }
            const int r = r8 + i;
            if (r / 128 != scale_row) {
                scale_row = r / 128;
                const uint8_t *ws = w->scales + (size_t)scale_row * scale_cols;
                for (int b = 0; b < batches * FP8_DWORDS_BATCH; b++) scale[b] = b < blocks ? x_scales[b] * kernel_e8m0(ws[b]) : 0.0f;
            }
            fp8_dwords_row(w, &f, scale, r, t, products + i, 8);
        }
        /* lane i = row r8 + i: acc + p[0] + p[1] + ..., one add at a time in block order */
        __m256 acc = _mm256_setzero_ps();
        for (int j = 0; j < batches; j++) {
            const int n = blocks - j * FP8_DWORDS_BATCH < FP8_DWORDS_BATCH ? blocks - j * FP8_DWORDS_BATCH : FP8_DWORDS_BATCH;
            __m256i col[8];
            UNROLL(8)
            for (int i = 0; i < 8; i++) col[i] = _mm256_castps_si256(products[(size_t)j * 8 + i]);
            transpose8x8(col); /* col[b] lane i = row r8 + i's block 8j + b */
            if (n == FP8_DWORDS_BATCH) {
                UNROLL(8)
                for (int b = 0; b < 8; b++) acc = _mm256_add_ps(acc, _mm256_castsi256_ps(col[b]));
            } else {
                for (int b = 0; b < n; b++) acc = _mm256_add_ps(acc, _mm256_castsi256_ps(col[b]));
            }
        }
        if (nr == 8)
            _mm256_storeu_ps(y + r8, acc);
        else
            _mm256_mask_storeu_ps(y + r8, (__mmask8)((1u << nr) - 1), acc);
    }
}

/* One token: the words form above (fp8_dwords); 2 or 3: the f64 form; from FP8_WORDS_MIN: the
 * several-token words form. */
static size_t avx512_fp8_act_bytes(int n_tokens, int cols) {
    if (n_tokens == 1) return fp8_dwords_bytes(cols);
    return n_tokens >= FP8_WORDS_MIN ? kernel_fp8_words_bytes(n_tokens, cols) : kernel_fp8_f64_act_bytes(n_tokens, cols);
}

static void avx512_fp8_act_prepare(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols, void *act) {
    if (n_tokens == 1)
        fp8_dwords_prepare(x_codes, cols, act);
    else if (n_tokens >= FP8_WORDS_MIN)
        fp8_words_prepare(x_codes, n_tokens, cols, act);
    else
        kernel_fp8_f64_act_prepare(x_codes, x_scales, n_tokens, cols, act);
}

static void avx512_fp8_prepared(const fp8_matrix *w, const void *act, const float *x_scales, int n_tokens, float *y,
                                int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    if (n_tokens == 1 && w->low) {
        fp8_dwords_matmul(w, act, x_scales, y, row_begin, row_end);
    } else if (n_tokens == 1) {
        /* no list (more low codes than fp8_low_codes_limit): the f64 form, from the token's codes,
         * in this thread's own form (the shared one is act; avx512_matmul_fp8 takes this case
         * before preparing into act_scratch) */
        void *f64 = kernel_scratch_get(&act_scratch, kernel_fp8_f64_act_bytes(1, w->cols));
        kernel_fp8_f64_act_prepare(fp8_dwords_layout(act, w->cols).codes, x_scales, 1, w->cols, f64);
        avx512_matmul_fp8_prepared(w, f64, x_scales, 1, y, y_stride, row_begin, row_end);
    } else if (n_tokens >= FP8_WORDS_MIN) {
        fp8_words_matmul(w, act, x_scales, n_tokens, y, y_stride, row_begin, row_end);
    } else {
        avx512_matmul_fp8_prepared(w, act, x_scales, n_tokens, y, y_stride, row_begin, row_end);
    }
}

static void avx512_matmul_fp8(const fp8_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens,
                              float *y, int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    if (n_tokens == 1 && !w->low) { /* the f64 form directly: no words form to prepare */
        void *f64 = kernel_scratch_get(&act_scratch, kernel_fp8_f64_act_bytes(1, w->cols));
        kernel_fp8_f64_act_prepare(x_codes, x_scales, 1, w->cols, f64);
        avx512_matmul_fp8_prepared(w, f64, x_scales, 1, y, y_stride, row_begin, row_end);
        return;
    }
    void *act = kernel_scratch_get(&act_scratch, avx512_fp8_act_bytes(n_tokens, w->cols));
    avx512_fp8_act_prepare(x_codes, x_scales, n_tokens, w->cols, act);
    avx512_fp8_prepared(w, act, x_scales, n_tokens, y, y_stride, row_begin, row_end);
}

/* ---------------------------------------------------------------------------------------------
 * FP4 x FP8 */

/* 1 to 3 tokens use the decode form below, 4 or more the words form after it (fp4_tokens_matmul). */
#define FP4_TOKENS_MIN 4

/* --- 1 to 3 tokens (decode, and experts that few tokens chose) ---
 *
 * Per token and 128-element chunk (one activation block: four weight blocks, 64 packed bytes of a
 * row) the form holds the activations as integers A = k / 2^shift, where shift is the largest
 * power of two dividing every k of the chunk (so A is exact), written in balanced base-256 digits
 * A = d0 + 256 d1 + 65536 d2 (each d a signed byte, -128..127), as many digits as the chunk's
 * largest |A| needs (count: 1 to 3; 0 when every activation of the chunk is zero). Each digit is a
 * plane of two vectors in the order the nibble expansion gives the weights: "lo" byte i = element
 * 128c + 2i (low nibble of packed byte i), "hi" byte i = element 128c + 2i + 1. VPDPBUSD multiplies
 * the biased weight bytes j + 12 (unsigned, 0..24) by the digits (signed): lane L then covers
 * elements 8L..8L+7 (of both halves), all in block L / 4; lo and hi accumulate into the same
 * lanes, and lanes 4b..4b+3 add up to block b. The digits combine by Horner's rule inside the
 * accumulator, highest first: a = dot(w, d_top); a = (a << 8) + dot(w, d_next); ... = dot(w + 12, A).
 * Block b's sum is S = 2^shift * S' with S' = (sum over its lanes of a) - 12 * sum(A), an exact
 * integer; (float)S * 2^-10, as the reference computes it, equals (float)S' * 2^(shift - 10): f32
 * rounding commutes with scaling by a power of two (|S| < 2^31, results >= 2^-10 or zero, far
 * from overflow and subnormals).
 *
 * Quantized Gaussian activations take two digits in 93.6% of their chunks and three in the rest
 * (10^5 chunks counted: three when a value of the chunk lies below about 1/3500 of its largest),
 * where base-16 planes of fixed position took three or four (two VPDPBUSD each). 256 x 4096, one quantized Gaussian token, 1 thread, in L2,
 * the two builds alternating, best of 4 x 15: 0.0218 -> 0.0165 ms per call; 2 threads each
 * running one matrix at a time from a pool of 40 (as decode runs the experts side by side): best
 * 39.3 -> 54.5 GB/s, beside a read test of 39-54 GB/s.
 *
 * int32 bounds: a dot lane adds 8 products (j + 12 <= 24) * |digit| (<= 128), so |dot| <= 24576;
 * after three digits |a| <= 24576 * (1 + 256 + 65536) < 2^30.7 / 4, so a block's 4 lanes stay
 * below 2^31 in magnitude (1.62e9 at most); 12 * sum|A| <= 12 * 32 * 229376 < 2^27, and with
 * three digits A itself is below 2^18, so the true |S'| is far below the bound. */
#define FP4_DCHUNK 128
#define FP4_DIGITS_MAX 3
#define FP4_DCHUNK_BYTES (FP4_DIGITS_MAX * 2 * 64) /* digits x {lo, hi} x 64 bytes */

typedef struct fp4_chunk_meta {
    int32_t ksum[4]; /* 12 * sum of A over each 32-block (exact) */
    float factor;    /* 2^(shift - 10) */
    int32_t count;   /* digits d0..d(count-1) (0: every activation of the chunk is zero) */
    int32_t pad[2];
} fp4_chunk_meta;

static size_t fp4_decode_bytes(int n_tokens, int cols) {
    return (size_t)n_tokens * (cols / FP4_DCHUNK) * (FP4_DCHUNK_BYTES + sizeof(fp4_chunk_meta));
}

static const fp4_chunk_meta *fp4_decode_meta(const void *act, int n_tokens, int cols) {
    return (const fp4_chunk_meta *)((const uint8_t *)act + (size_t)n_tokens * (cols / FP4_DCHUNK) * FP4_DCHUNK_BYTES);
}

/* GCC's >> of a negative int is arithmetic (its documented choice), which the digits below rely
 * on: every shift is exact there (the shifted-out bits are zero). */
static void fp4_decode_prepare(const uint8_t *x_codes, int n_tokens, int cols, void *act) {
    const int chunks = cols / FP4_DCHUNK;
    int8_t *planes = act;
    fp4_chunk_meta *meta = (fp4_chunk_meta *)fp4_decode_meta(act, n_tokens, cols);
    for (int t = 0; t < n_tokens; t++)
        for (int c = 0; c < chunks; c++) {
            const uint8_t *xc = x_codes + (size_t)t * cols + (size_t)c * FP4_DCHUNK;
            int8_t *dst = planes + ((size_t)t * chunks + c) * FP4_DCHUNK_BYTES;
            int32_t k[FP4_DCHUNK];
            uint32_t bits = 0;
            for (int i = 0; i < FP4_DCHUNK; i++) {
                k[i] = kernel_e4m3_int[xc[i]];
                bits |= (uint32_t)k[i];
            }
            /* the lowest set bit of any k is the lowest one of their OR: 2^shift divides every k */
            const int shift = bits ? __builtin_ctz(bits) : 0;
            int32_t amax = 0;
            for (int i = 0; i < FP4_DCHUNK; i++) {
                k[i] >>= shift;
                const int32_t m = k[i] < 0 ? -k[i] : k[i];
                amax = m > amax ? m : amax;
            }
            /* balanced digits cover -128..127, -32896..32639, and more than |A| <= 229376 with three */
            const int count = bits == 0 ? 0 : amax <= 127 ? 1 : amax <= 32639 ? 2 : 3;
            fp4_chunk_meta *m = &meta[(size_t)t * chunks + c];
            m->count = count;
            m->factor = ldexpf(1.0f, shift - 10);
            m->pad[0] = m->pad[1] = 0;
            for (int b = 0; b < 4; b++) {
                int32_t s = 0;
                for (int i = 0; i < 32; i++) s += k[32 * b + i];
                m->ksum[b] = 12 * s;
            }
            /* digit d = a's low byte as a signed byte (in -128..127), then a = (a - d) / 256 */
            for (int p = 0; p < FP4_DIGITS_MAX; p++)
                for (int i = 0; i < FP4_DCHUNK / 2; i++) {
                    const int32_t even = (int32_t)((uint32_t)(k[2 * i] + 128) & 255u) - 128;
                    const int32_t odd = (int32_t)((uint32_t)(k[2 * i + 1] + 128) & 255u) - 128;
                    dst[p * 128 + i] = (int8_t)even;
                    dst[p * 128 + 64 + i] = (int8_t)odd;
                    k[2 * i] = (k[2 * i] - even) >> 8;
                    k[2 * i + 1] = (k[2 * i + 1] - odd) >> 8;
                }
        }
}

/* The Horner sum of one row's 128-element chunk (lanes as described above). pl: the digit
 * vectors, highest digit first, lo then hi. */
static inline __attribute__((always_inline)) __m512i fp4_row_chunk(const uint8_t *src, __m512i table, const __m512i *pl,
                                                                  int count) {
    __m512i v = _mm512_loadu_si512(src);
    __asm__("" : "+v"(v)); /* one load into a register (GCC otherwise re-reads it through a stack copy) */
    /* VPERMB reads the low 6 bits of each index byte: the 64-entry table repeats the 16 nibble
     * values, so the high nibble (or the bits the shift brings in) never matters */
    const __m512i lo = _mm512_permutexvar_epi8(v, table);
    const __m512i hi = _mm512_permutexvar_epi8(_mm512_srli_epi64(v, 4), table);
    __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, pl[0]);
    a = _mm512_dpbusd_epi32(a, hi, pl[1]);
    UNROLL(2)
    for (int q = 1; q < count; q++) {
        a = _mm512_slli_epi32(a, 8);
        a = _mm512_dpbusd_epi32(a, lo, pl[2 * q]);
        a = _mm512_dpbusd_epi32(a, hi, pl[2 * q + 1]);
    }
    return a;
}

/* One chunk of 16 rows: out[b] lane i = block b's sum (before the bias term) of row i. Rows are
 * reduced as they come (pairs, then quads) to keep few vectors live. */
static inline __attribute__((always_inline)) void fp4_chunk16(const uint8_t *const wr[16], size_t off, __m512i table,
                                                              const int8_t *tp, int count, __m512i out[4]) {
    __m512i pl[2 * FP4_DIGITS_MAX], W[4];
    UNROLL(3)
    for (int q = 0; q < count; q++) {
        pl[2 * q] = _mm512_load_si512(tp + (count - 1 - q) * 128);
        pl[2 * q + 1] = _mm512_load_si512(tp + (count - 1 - q) * 128 + 64);
    }
    UNROLL(4)
    for (int g = 0; g < 4; g++) {
        __m512i P[2];
        UNROLL(2)
        for (int h = 0; h < 2; h++) {
            const __m512i a = fp4_row_chunk(wr[4 * g + 2 * h] + off, table, pl, count);
            const __m512i b = fp4_row_chunk(wr[4 * g + 2 * h + 1] + off, table, pl, count);
            /* per 128-bit lane (one block): [a0+a2, b0+b2, a1+a3, b1+b3] */
            P[h] = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
        }
        /* per 128-bit lane b: block b of rows 4g..4g+3 */
        W[g] = _mm512_add_epi32(_mm512_unpacklo_epi64(P[0], P[1]), _mm512_unpackhi_epi64(P[0], P[1]));
    }
    /* 4 x 4 transpose of 128-bit lanes: out[b] = lane b of W[0..3] */
    const __m512i x0 = _mm512_shuffle_i32x4(W[0], W[1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i x1 = _mm512_shuffle_i32x4(W[0], W[1], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i y0 = _mm512_shuffle_i32x4(W[2], W[3], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i y1 = _mm512_shuffle_i32x4(W[2], W[3], _MM_SHUFFLE(3, 2, 3, 2));
    out[0] = _mm512_shuffle_i32x4(x0, y0, _MM_SHUFFLE(2, 0, 2, 0));
    out[1] = _mm512_shuffle_i32x4(x0, y0, _MM_SHUFFLE(3, 1, 3, 1));
    out[2] = _mm512_shuffle_i32x4(x1, y1, _MM_SHUFFLE(2, 0, 2, 0));
    out[3] = _mm512_shuffle_i32x4(x1, y1, _MM_SHUFFLE(3, 1, 3, 1));
}

/* The packed rows and scale rows of a 16-row pass from r0, nr of them real (rows past the end
 * repeat the last: computed, never stored). */
static inline void fp4_pass_rows16(const fp4_matrix *w, int r0, int nr, const uint8_t *wr[16], const uint8_t *sr[16]) {
    for (int i = 0; i < 16; i++) {
        const int r = r0 + (i < nr ? i : nr - 1);
        wr[i] = w->packed + (size_t)r * (w->cols / 2);
        sr[i] = w->scales + (size_t)r * (w->cols / 32);
    }
}

/* e2m1 nibble -> the biased weight byte j + 12, in every 16-byte lane (VPSHUFB / VPERMB table). */
static inline __m512i fp4_biased_table(void) {
    static const int8_t nib[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)nib));
}

/* Constants of the E8M0 conversion: VPSHUFB controls moving byte b of each dword (block b's
 * scale) to the dword's low byte, zeroing the others. */
static const uint8_t fp4_scale_pick[4][64] __attribute__((aligned(64))) = {
#define PICK(b) {b, 0x80, 0x80, 0x80, 4 + b, 0x80, 0x80, 0x80, 8 + b, 0x80, 0x80, 0x80, 12 + b, 0x80, 0x80, 0x80, \
                 b, 0x80, 0x80, 0x80, 4 + b, 0x80, 0x80, 0x80, 8 + b, 0x80, 0x80, 0x80, 12 + b, 0x80, 0x80, 0x80, \
                 b, 0x80, 0x80, 0x80, 4 + b, 0x80, 0x80, 0x80, 8 + b, 0x80, 0x80, 0x80, 12 + b, 0x80, 0x80, 0x80, \
                 b, 0x80, 0x80, 0x80, 4 + b, 0x80, 0x80, 0x80, 8 + b, 0x80, 0x80, 0x80, 12 + b, 0x80, 0x80, 0x80}
    PICK(0), PICK(1), PICK(2), PICK(3)
#undef PICK
};

/* The E8M0 scales of a 16-row group, transposed: sbuf[c] lane i = row i's 4 block scales of
 * 128-element chunk c (one dword). */
static inline __attribute__((always_inline)) void fp4_group_scales(const uint8_t *const sr[16], int chunks, __m512i *sbuf) {
    for (int c0 = 0; c0 < chunks; c0 += 16) {
        const int n = chunks - c0 < 16 ? chunks - c0 : 16;
        __m512i r[16];
        UNROLL(16)
        for (int i = 0; i < 16; i++) r[i] = _mm512_maskz_loadu_epi32((__mmask16)((1u << n) - 1), sr[i] + 4 * (size_t)c0);
        transpose16x16(r);
        for (int j = 0; j < n; j++) _mm512_store_si512(&sbuf[c0 + j], r[j]);
    }
}

/* A 16-row tile from r0 (rows past row_end repeat the last): its packed and scale rows, its
 * transposed scales in sbuf (fp4_group_scales); returns the mask of its real rows. */
static inline __attribute__((always_inline)) __mmask16 fp4_tile_begin(const fp4_matrix *w, int r0, int row_end,
                                                                      const uint8_t *wr[16], const uint8_t *sr[16],
                                                                      __m512i *sbuf) {
    const int nr = row_end - r0 < 16 ? row_end - r0 : 16;
    fp4_pass_rows16(w, r0, nr, wr, sr);
    fp4_group_scales(sr, w->cols / FP4_DCHUNK, sbuf);
    return (__mmask16)((1u << nr) - 1);
}

/* Block q of a chunk's transposed scales (fp4_group_scales) as 16 f32: e << 23, and byte 0 ->
 * 0x00400000 (2^-127) by the max. */
static inline __m512 fp4_block_scales(__m512i sd, int q) {
    const __m512i e = _mm512_slli_epi32(_mm512_shuffle_epi8(sd, _mm512_load_si512(fp4_scale_pick[q])), 23);
    return _mm512_castsi512_ps(_mm512_max_epi32(e, _mm512_set1_epi32(0x00400000)));
}

static inline __attribute__((always_inline)) void fp4_decode_rows(const fp4_matrix *w, const void *act, const float *x_scales,
                                                                  const int T, float *y, int y_stride, int row_begin, int row_end) {
    const int cols = w->cols, chunks = cols / FP4_DCHUNK, blocks32 = cols / 32, xblocks = cols / FP8_ACT_BLOCK;
    const int8_t *planes = act;
    const fp4_chunk_meta *meta = fp4_decode_meta(act, T, cols);
    const __m512i table = fp4_biased_table();
    /* the weight scales of a 16-row group, transposed: one vector of 16 dwords (a row's 4 block
     * scales each) per chunk */
    __m512i *sbuf = kernel_scratch_get(&tile_scratch, ((size_t)chunks + 16) * sizeof(__m512i));
    for (int r0 = row_begin; r0 < row_end; r0 += 16) {
        const uint8_t *wr[16], *sr[16];
        const __mmask16 store_mask = fp4_tile_begin(w, r0, row_end, wr, sr, sbuf);
        __m512 acc[3];
        UNROLL(3)
        for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
        /* software prefetch of the next group while this one is computed: its scales (16 rows x
         * 4 bytes per chunk, one line per chunk, into L1: the transposition above reads them
         * first) and its packed rows, contiguous (16 rows x cols / 2 bytes, 1 KB per chunk, into
         * L2). The group's 16 row streams, each read 64 bytes per chunk, are more than the
         * hardware prefetchers follow from one core. Measured from RAM, 1 token, 2 threads,
         * Gaussian activations: 2048 x 4096 15.1 -> 19.8 GB/s, 4096 x 2048 15.2 -> 19.8 (the
         * packed rows' first line only, one per chunk, into L1, as before; into L1 all of them:
         * 17.6 and 18.7; two groups ahead: no better). */
        const uint8_t *next_scales = r0 + 16 < row_end ? w->scales + (size_t)(r0 + 16) * blocks32 : NULL;
        const uint8_t *next_rows = w->packed + (size_t)(r0 + 16) * (cols / 2);
        for (int c = 0; c < chunks; c++) {
            const size_t off = (size_t)c * 64;
            if (next_scales) {
                _mm_prefetch((const char *)(next_scales + off), _MM_HINT_T0);
                UNROLL(16)
                for (int l = 0; l < 16; l++) _mm_prefetch((const char *)(next_rows + (size_t)c * 1024 + 64 * l), _MM_HINT_T1);
            }
            UNROLL(3)
            for (int t = 0; t < T; t++) {
                const fp4_chunk_meta *m = &meta[(size_t)t * chunks + c];
                const int8_t *tp = planes + ((size_t)t * chunks + c) * FP4_DCHUNK_BYTES;
                __m512i out[4];
                switch (m->count) {
                case 3: fp4_chunk16(wr, off, table, tp, 3, out); break;
                case 2: fp4_chunk16(wr, off, table, tp, 2, out); break;
                case 1: fp4_chunk16(wr, off, table, tp, 1, out); break;
                default: out[0] = out[1] = out[2] = out[3] = _mm512_setzero_si512(); break; /* still 0 * scale below */
                }
                const __m512i sd = _mm512_load_si512(&sbuf[c]);
                const __m512 xs = _mm512_set1_ps(x_scales[(size_t)t * xblocks + c]);
                const __m512 factor = _mm512_set1_ps(m->factor);
                UNROLL(4)
                for (int b = 0; b < 4; b++) {
                    const __m512 ws = fp4_block_scales(sd, b);
                    const __m512i s = _mm512_sub_epi32(out[b], _mm512_set1_epi32(m->ksum[b]));
                    const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(s), factor);
                    acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(f, _mm512_mul_ps(xs, ws)));
                }
            }
        }
        UNROLL(3)
        for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y + (size_t)t * y_stride + r0, store_mask, acc[t]);
    }
}

static void fp4_decode_matmul(const fp4_matrix *w, const void *act, const float *x_scales, int n_tokens, float *y,
                              int y_stride, int row_begin, int row_end) {
    switch (n_tokens) {
    case 1: fp4_decode_rows(w, act, x_scales, 1, y, y_stride, row_begin, row_end); break;
    case 2: fp4_decode_rows(w, act, x_scales, 2, y, y_stride, row_begin, row_end); break;
    default: fp4_decode_rows(w, act, x_scales, 3, y, y_stride, row_begin, row_end); break;
    }
}

/* --- 4 or more tokens ---
 *
 * Lane i of a vector belongs to row i of a group of 16. Per 32-block the group's weights are
 * converted once into 16 vectors of int16 pairs (W[d] lane i: row i's signed weights j = 2 * e2m1
 * of the two columns the form's dword d holds) that stay in registers while every token of a
 * slice passes: VPDPWSSD adds W[d] times dword d of the token's words A, broadcast from the form
 * (4 bytes of L1 per instruction), so every lane ends with its own row's block sum and nothing is
 * reduced across lanes. The words are the activations' k "in the block's window"
 * (kernel_fp4_words_prepare): A = k / 2^shift, exact, for every value within 11 binades of the
 * block's largest, so one pass of 16 instructions takes the whole block; the rare block with a
 * value below the window (meta low) adds a second pass over its words L (those values' k) to the
 * first shifted back: S = (A . w) * 2^shift + L . w, the exact integer block sum. Without L words
 * S = 2^shift (A . w) and (float)S * 2^-10, as the reference computes it, equals
 * (float)(A . w) * 2^(shift - 10) (f32 rounding commutes with scaling by a power of two; |S| <
 * 2^31, far from overflow and subnormals), the meta's factor.
 *
 * This replaced byte planes of base 16 on VPDPBUSD (64 products per instruction, but two planes at
 * least, a third for half of all Gaussian blocks, whose values span more than 8 binades, behind a
 * branch that mispredicted as often): 2048 x 4096, 192 tokens, 1 thread, the two builds
 * alternating, best of 8: 0.154 -> 0.103 ms per token.
 *
 * int32 bounds: |j| <= 12 and |A| <= 15 * 2^11 = 30720, so a lane's 32 products sum below
 * 2^23.5, times 2^shift (shift <= 3: the largest k is 14 * 2^14) below 2^26.5; |L| < 128.
 *
 * Tokens are taken a slice at a time (2 MB of words and metas, fp4_tokens_matmul) so the slice
 * stays in cache while every row group of the call passes over it. A slice of 16 tokens or more goes
 * over passes of 4 tiles (64 rows), its converted blocks in L1, 3 tokens at a time (each dword
 * broadcast once for the 4 tiles' products, fp4_words_tokens); fewer go over one tile at a time,
 * its block in registers. */
/* e2m1 nibble -> the signed weight byte j = 2 * value, in every 16-byte lane. */
static inline __m512i fp4_signed_table(void) {
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)kernel_e2m1_bytes));
}

/* 16 rows x one 32-block (16 packed bytes each) -> W[d] lane i = row i's signed weights j of the
 * word pair the form's dword d holds (the octet order, kernels_internal.h). The packed bytes are
 * transposed first, while they are a quarter of the words' size: vector k takes rows k, 4 + k,
 * 8 + k, 12 + k in its 128-bit lanes, and the in-lane 4 x 4 dword transposition leaves in T[q]
 * lane i row i's packed dword q (elements 8q..8q+7; byte m holds 8q + 2m in its low nibble and
 * 8q + 2m + 1 in its high one). A table lookup on each nibble set gives the bytes L = j of 8q,
 * 8q + 2, 8q + 4, 8q + 6 and H = j of 8q + 1, 8q + 3, 8q + 5, 8q + 7, whose even and odd bytes
 * sign-extend in place into the pairs (8q, 8q + 4), (8q + 2, 8q + 6), (8q + 1, 8q + 5), (8q + 3,
 * 8q + 7). 64 operations per block where expanding first and transposing the bytes took 80 (28
 * of them on the shuffle port instead of 44). */
static inline __attribute__((always_inline)) void fp4_group_words(const uint8_t *const wr[16], size_t off, __m512i table,
                                                                  __m512i W[16]) {
    __m512i Z[4];
    UNROLL(4)
    for (int k = 0; k < 4; k++) {
        __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(wr[k] + off)));
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(wr[4 + k] + off)), 1);
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(wr[8 + k] + off)), 2);
        Z[k] = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(wr[12 + k] + off)), 3);
    }
    const __m512i t0 = _mm512_unpacklo_epi32(Z[0], Z[1]), t1 = _mm512_unpackhi_epi32(Z[0], Z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(Z[2], Z[3]), t3 = _mm512_unpackhi_epi32(Z[2], Z[3]);
    const __m512i T[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2), _mm512_unpacklo_epi64(t1, t3),
                          _mm512_unpackhi_epi64(t1, t3)};
    UNROLL(4)
    for (int q = 0; q < 4; q++) {
        const __m512i L = _mm512_shuffle_epi8(table, _mm512_and_si512(T[q], _mm512_set1_epi8(0x0f)));
        const __m512i H = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(T[q], 4), _mm512_set1_epi8(0x0f)));
        W[4 * q + 0] = _mm512_srai_epi16(_mm512_slli_epi16(L, 8), 8);
        W[4 * q + 1] = _mm512_srai_epi16(L, 8);
        W[4 * q + 2] = _mm512_srai_epi16(_mm512_slli_epi16(H, 8), 8);
        W[4 * q + 3] = _mm512_srai_epi16(H, 8);
    }
}

/* One token's words (16 dwords) against the 16 rows: lane i = row i's sum over the block. */
static inline __attribute__((always_inline)) __m512i fp4_words_dot(const __m512i W[16], const int32_t *x) {
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    UNROLL(4)
    for (int g = 0; g < 16; g += 4) {
        a = dpwssd_broadcast(a, W[g], &x[g]);
        b = dpwssd_broadcast(b, W[g + 1], &x[g + 1]);
        c = dpwssd_broadcast(c, W[g + 2], &x[g + 2]);
        d = dpwssd_broadcast(d, W[g + 3], &x[g + 3]);
    }
    return _mm512_add_epi32(_mm512_add_epi32(a, b), _mm512_add_epi32(c, d));
}

/* A block with values below the words' window: S = (A . w) * 2^shift + L . w, L . w over the
 * dwords the meta lists (one or two of 16, typically: the others are zero). Out of line so that
 * the pass's products need not keep the tile's 16 weight vectors in registers for this rare case
 * (they are read again from L1): inlined, GCC held them live across the products' loop and
 * spilled its accumulators. */
static __attribute__((noinline)) __m512i fp4_words_low_sum(__m512i sum, const __m512i W[16], const int32_t *lows,
                                                            int shift, unsigned low_dwords) {
    __m512i l = _mm512_setzero_si512();
    for (unsigned m = low_dwords; m; m &= m - 1) {
        const int d = __builtin_ctz(m);
        l = _mm512_dpwssd_epi32(l, _mm512_load_si512(&W[d]), _mm512_set1_epi32(lows[d]));
    }
    return _mm512_add_epi32(_mm512_sll_epi32(sum, _mm_cvtsi32_si128(shift)), l);
}

/* Folding the factor into the scales: f32(sum) * f32(f32(factor * xs) * ws) has the bits of the
 * scalar's f32(f32(sum) * factor) * f32(xs * ws), one multiply fewer per row tile and token, while
 * no product leaves the normal range, since scaling by a power of two commutes with rounding
 * there. factor is 2^-10 .. 2^-7 (a block's shift is at most 3: e4m3 magnitudes are below 16 *
 * 2^14), so with every |xs| 0 or in [2^-40, 2^40] and the weight scales in [2^-64, 2^64]: factor
 * * xs lies in [2^-50, 2^33] (exact), xs * ws in [2^-104, 2^104] and factor * xs * ws in
 * [2^-114, 2^97], and f32(sum) * factor is exact (f32(sum) is 0 or at least 1). Otherwise the
 * products go as the scalar's. 2048 x 4096, 1 thread, ms per token, four alternating runs of
 * `bench_kernels --quick --several-tokens 16,64,192,256 --best 10` (AMD EPYC Zen 5): 192 tokens
 * 0.0512-0.0527 -> 0.0490-0.0511, 16 tokens 0.0756-0.0784 -> 0.0729-0.0770. */
static int fp4_words_x_scales_foldable(const kernel_fp4_words_meta *meta, int n_tokens, int blocks, int t0, int nt) {
    for (int b = 0; b < blocks; b += 4) /* the scale of a 128-column chunk, in each of its 4 blocks' metas */
        for (int t = t0; t < t0 + nt; t++)
            if (!kernel_fp4_fold_x_scale(meta[(size_t)b * n_tokens + t].x_scale)) return 0;
    return 1;
}

static inline int fp4_words_w_scales_foldable(__m512 ws) {
    /* the floats 2^(e - 127) of the bounds' E8M0 bytes e */
    const __m512 lo = _mm512_castsi512_ps(_mm512_set1_epi32(KERNEL_FP4_FOLD_W_E8M0_MIN << 23));
    const __m512 hi = _mm512_castsi512_ps(_mm512_set1_epi32(KERNEL_FP4_FOLD_W_E8M0_MAX << 23));
    return (__mmask16)(_mm512_cmp_ps_mask(ws, lo, _CMP_GE_OQ) & _mm512_cmp_ps_mask(ws, hi, _CMP_LE_OQ)) == (__mmask16)0xffff;
}

/* Tiles of 16 rows per pass and tokens per step, as for FP8 (fp8_words_tokens): each converted
 * block's 16 word vectors per tile go to L1 and are loaded once per step of 4 tokens, each
 * activation dword broadcast once for the 4 tiles. 4 tokens measured no faster than 3 while
 * the low words' dot product was inlined (its register demand spilled the accumulators); since
 * (2048 x 4096, 1 thread, best of 4 x 30 calls, alternating, ms per token): 256 tokens 0.1015
 * -> 0.0934, 64 tokens 0.113 -> 0.109. */
#define FP4_WORDS_PASS_TILES 4
#define FP4_WORDS_STEP_TOKENS 4

/* T tokens of the slice from form index f (b * n_tokens + t) over R tiles' converted block W
 * (16 vectors per tile): acc (64 floats per token, tile k at 16 k) += block value * (xs * ws[k]). */
static inline __attribute__((always_inline)) void fp4_words_tokens(const int R, const int T, const int FOLDED,
                                                                   const __m512i *W, const __m512 *ws,
                                                                   const int32_t *words, const int32_t *lows,
                                                                   const kernel_fp4_words_meta *m, size_t f, float *acc) {
    __m512i a[FP4_WORDS_PASS_TILES * FP4_WORDS_STEP_TOKENS];
    UNROLL(16)
    for (int i = 0; i < R * T; i++) a[i] = _mm512_setzero_si512();
    const int32_t *x = words + f * 16;
    UNROLL(16)
    for (int g = 0; g < 16; g++) {
        __m512i wg[FP4_WORDS_PASS_TILES];
        UNROLL(4)
        for (int k = 0; k < R; k++) wg[k] = zmm_load_once(&W[16 * k + g]);
        UNROLL(4)
        for (int u = 0; u < T; u++) {
            const __m512i xb = _mm512_set1_epi32(x[16 * u + g]);
            UNROLL(4)
            for (int k = 0; k < R; k++) a[k * T + u] = _mm512_dpwssd_epi32(a[k * T + u], wg[k], xb);
        }
    }
    UNROLL(4)
    for (int u = 0; u < T; u++) {
        const kernel_fp4_words_meta *mu = m + f + u;
        const __m512 xs = _mm512_set1_ps(mu->x_scale), factor = _mm512_set1_ps(mu->factor);
        const __m512 factor_xs = _mm512_mul_ps(factor, xs); /* exact where FOLDED */
        UNROLL(4)
        for (int k = 0; k < R; k++) {
            __m512i sum = a[k * T + u];
            if (mu->low) sum = fp4_words_low_sum(sum, W + 16 * k, lows + (f + u) * 16, mu->shift, mu->low);
            float *ak = acc + (size_t)u * 16 * FP4_WORDS_PASS_TILES + 16 * k;
            __m512 p;
            if (FOLDED) /* f32(sum) * f32(f32(factor * xs) * ws): the same product (fp4_words_x_scales_foldable) */
                p = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(factor_xs, ws[k]));
            else
                p = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), factor), _mm512_mul_ps(xs, ws[k]));
            _mm512_store_ps(ak, _mm512_add_ps(_mm512_load_ps(ak), p));
        }
    }
}

/* The nt tokens of the slice at form index f over R tiles, FP4_WORDS_STEP_TOKENS at a time. */
static inline __attribute__((always_inline)) void fp4_words_pass(const int R, const int FOLDED, const __m512i *W,
                                                                 const __m512 *ws, const int32_t *words,
                                                                 const int32_t *lows, const kernel_fp4_words_meta *m,
                                                                 size_t f, int nt, float *acc) {
    const size_t token_acc = 16 * FP4_WORDS_PASS_TILES;
    int t = 0;
    for (; t + FP4_WORDS_STEP_TOKENS <= nt; t += FP4_WORDS_STEP_TOKENS)
        fp4_words_tokens(R, FP4_WORDS_STEP_TOKENS, FOLDED, W, ws, words, lows, m, f + (size_t)t, acc + (size_t)t * token_acc);
    /* the 1 to 3 tokens left as one step: each weight vector loaded once for them */
    switch (nt - t) {
    case 3: fp4_words_tokens(R, 3, FOLDED, W, ws, words, lows, m, f + (size_t)t, acc + (size_t)t * token_acc); break;
    case 2: fp4_words_tokens(R, 2, FOLDED, W, ws, words, lows, m, f + (size_t)t, acc + (size_t)t * token_acc); break;
    case 1: fp4_words_tokens(R, 1, FOLDED, W, ws, words, lows, m, f + (size_t)t, acc + (size_t)t * token_acc); break;
    default: break;
    }
}

/* With fewer tokens in a slice than this, a pass is one tile whose converted block stays in
 * registers (fp4_tokens_one_tile): the 4-tile pass stores its blocks to L1 and reads 64 rows'
 * streams at once, which few tokens do not repay (2048 x 4096, 1 thread, ms per token, one tile
 * against four, best of 3 x 40 calls, once the 1 to 3 tokens left after the 4-token steps went
 * as one step: 7 tokens 0.138 / 0.144, 8 0.136 / 0.133, 9 equal; it was 9 while those tokens
 * went one at a time, and 16 before the 4-tile pass lost its spills and took 4 tokens a step). */
#define FP4_WORDS_PASS_MIN_TOKENS 8

/* Rows [row_begin, row_end) for the slice's nt tokens from t0, a 16-row tile per pass. */
static void fp4_tokens_one_tile(const fp4_matrix *w, const int32_t *words, const int32_t *lows,
                                const kernel_fp4_words_meta *meta, int n_tokens, int t0, int nt, float *y, int y_stride,
                                int row_begin, int row_end, __m512i *sbuf, float *acc_buf) {
    const int blocks = w->cols / 32;
    const __m512i table = fp4_signed_table();
    for (int r0 = row_begin; r0 < row_end; r0 += 16) {
        const uint8_t *wr[16], *sr[16];
        const __mmask16 store_mask = fp4_tile_begin(w, r0, row_end, wr, sr, sbuf);
        for (int t = 0; t < nt; t++) _mm512_storeu_ps(acc_buf + (size_t)t * 16, _mm512_setzero_ps());
        /* The next tile's packed rows (one contiguous run of lines) are asked into L2 a few lines
         * per block, so that its 16 short streams start in cache (2048 x 4096, 1 thread, best of
         * 6 x 30 calls, ms per token: 4 tokens 0.175 -> 0.169, 6 0.167 -> 0.163, 8 0.166 ->
         * 0.157). */
        const int next_rows = row_end - (r0 + 16) < 16 ? row_end - (r0 + 16) : 16;
        const uint8_t *next = w->packed + (size_t)(r0 + 16) * (w->cols / 2);
        const size_t next_lines = next_rows > 0 ? (size_t)next_rows * (w->cols / 2) / 64 : 0;
        const size_t lines_per_block = (next_lines + blocks - 1) / blocks;
        for (int b = 0; b < blocks; b++) {
            for (size_t l = (size_t)b * lines_per_block, e = l + lines_per_block; l < e && l < next_lines; l++)
                _mm_prefetch((const char *)(next + l * 64), _MM_HINT_T1);
            __m512i W[16];
            fp4_group_words(wr, (size_t)b * 16, table, W);
            const __m512 ws = fp4_block_scales(_mm512_load_si512(&sbuf[b / 4]), b % 4);
            const size_t first_form = (size_t)b * n_tokens + t0;
            const int32_t *xp = words + first_form * 16;
            const kernel_fp4_words_meta *m = meta + first_form;
            for (int t = 0; t < nt; t++, xp += 16, m++) {
                __m512i sum = fp4_words_dot(W, xp);
                if (m->low)
                    sum = _mm512_add_epi32(_mm512_sll_epi32(sum, _mm_cvtsi32_si128(m->shift)),
                                           fp4_words_dot(W, lows + (first_form + t) * 16));
                const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(m->factor));
                float *acc = acc_buf + (size_t)t * 16;
                _mm512_storeu_ps(acc, _mm512_add_ps(_mm512_loadu_ps(acc),
                                                    _mm512_mul_ps(f, _mm512_mul_ps(_mm512_set1_ps(m->x_scale), ws))));
            }
        }
        for (int t = 0; t < nt; t++)
            _mm512_mask_storeu_ps(y + (size_t)(t0 + t) * y_stride + r0, store_mask, _mm512_loadu_ps(acc_buf + (size_t)t * 16));
    }
}

/* The same with passes of up to FP4_WORDS_PASS_TILES tiles. */
static void fp4_tokens_tile_passes(const fp4_matrix *w, const int32_t *words, const int32_t *lows,
                                   const kernel_fp4_words_meta *meta, int n_tokens, int t0, int nt, float *y,
                                   int y_stride, int row_begin, int row_end, __m512i *sbuf, float *acc_buf) {
    const int blocks = w->cols / 32, chunks = w->cols / FP4_DCHUNK;
    const size_t sbuf_tile = (size_t)chunks + 16;
    __m512i *W = sbuf + FP4_WORDS_PASS_TILES * sbuf_tile;
    const __m512i table = fp4_signed_table();
    const int xs_foldable = fp4_words_x_scales_foldable(meta, n_tokens, blocks, t0, nt);
    for (int p0 = row_begin; p0 < row_end; p0 += 16 * FP4_WORDS_PASS_TILES) {
        const int pass_rows = row_end - p0 < 16 * FP4_WORDS_PASS_TILES ? row_end - p0 : 16 * FP4_WORDS_PASS_TILES;
        const int R = (pass_rows + 15) / 16;
        const uint8_t *wr[FP4_WORDS_PASS_TILES][16], *sr[FP4_WORDS_PASS_TILES][16];
        __mmask16 store[FP4_WORDS_PASS_TILES];
        for (int k = 0; k < R; k++) store[k] = fp4_tile_begin(w, p0 + 16 * k, row_end, wr[k], sr[k], sbuf + (size_t)k * sbuf_tile);
        memset(acc_buf, 0, (size_t)nt * 16 * FP4_WORDS_PASS_TILES * sizeof(float));
        for (int b = 0; b < blocks; b++) {
            /* Each row's packed weights are a stream, 64 of them at once: more than the hardware
             * prefetchers follow (16 tokens: 0.23 ms per token before this, 0.15 after). A line
             * holds 4 blocks of a row: at block b tile b % 4 asks for its rows' line 2 ahead (16
             * prefetches at a time; all 64 every fourth block stalled on the line fill buffers). */
            const int pk = b & 3;
            if (pk < R && b + 8 < blocks)
                for (int i = 0; i < 16; i++) _mm_prefetch((const char *)(wr[pk][i] + (size_t)(b + 8) * 16), _MM_HINT_T0);
            __m512 ws[FP4_WORDS_PASS_TILES];
            int folded = xs_foldable;
            for (int k = 0; k < R; k++) {
                __m512i Wk[16];
                fp4_group_words(wr[k], (size_t)b * 16, table, Wk);
                for (int g = 0; g < 16; g++) _mm512_store_si512(&W[16 * k + g], Wk[g]);
                ws[k] = fp4_block_scales(_mm512_load_si512(&sbuf[(size_t)k * sbuf_tile + b / 4]), b % 4);
                folded &= fp4_words_w_scales_foldable(ws[k]);
            }
            const size_t first_form = (size_t)b * n_tokens + t0;
            if (R == FP4_WORDS_PASS_TILES) {
                if (folded)
                    fp4_words_pass(FP4_WORDS_PASS_TILES, 1, W, ws, words, lows, meta, first_form, nt, acc_buf);
                else
                    fp4_words_pass(FP4_WORDS_PASS_TILES, 0, W, ws, words, lows, meta, first_form, nt, acc_buf);
            } else {
                for (int k = 0; k < R; k++)
                    fp4_words_pass(1, 0, W + 16 * k, ws + k, words, lows, meta, first_form, nt, acc_buf + 16 * k);
            }
        }
        for (int t = 0; t < nt; t++)
            for (int k = 0; k < R; k++)
                _mm512_mask_storeu_ps(y + (size_t)(t0 + t) * y_stride + p0 + 16 * k, store[k],
                                      _mm512_load_ps(acc_buf + ((size_t)t * FP4_WORDS_PASS_TILES + k) * 16));
    }
}

static void fp4_tokens_matmul(const fp4_matrix *w, const void *act, int n_tokens, float *y, int y_stride, int row_begin,
                              int row_end) {
    const int cols = w->cols;
    const int32_t *words = act, *lows = (const int32_t *)kernel_fp4_words_low(act, n_tokens, cols);
    const kernel_fp4_words_meta *meta = kernel_fp4_words_metas(act, n_tokens, cols);
    /* 2 MB of form (214 tokens of 4096 columns; the blocks in use stay in a 1 MB L2, the rest
     * streams in order): each weight block is converted once per slice. 2048 x 4096, 1 thread, ms
     * per token at 64 / 192 / 256 tokens (`bench_kernels --quick --several-tokens 16,64,192,256
     * --best 10`, two sets of three alternating runs, AMD EPYC Zen 5): 512 KB 0.066-0.079 /
     * 0.062-0.072 / 0.062-0.073, 1 MB 0.057-0.060 / 0.056-0.059 / 0.058-0.070, 2 MB 0.056-0.058 /
     * 0.052-0.056 / 0.053-0.057; then 512 KB 0.061-0.064 / 0.057-0.060 / 0.056-0.060, 2 MB
     * 0.054-0.062 / 0.050-0.060 / 0.052-0.057, 2 MB in equal slices 0.056-0.067 / 0.051-0.061 /
     * 0.052-0.061. AVX2 measured no different at 1 or 2 MB, so it keeps 512 KB. */
    const int slice = kernel_fp4_words_slice(n_tokens, cols, 4 * KERNEL_SLICE_FORM_BYTES);
    /* per tile of a pass its transposed scales (fp4_group_scales), the pass's converted block (16
     * vectors per tile), per token of a slice the pass's running sums (16 floats per tile) */
    const size_t sbuf_tile = (size_t)(cols / FP4_DCHUNK) + 16;
    __m512i *sbuf = kernel_scratch_get(&tile_scratch, (FP4_WORDS_PASS_TILES * (sbuf_tile + 16) + (size_t)slice * FP4_WORDS_PASS_TILES) *
                                                          sizeof(__m512i));
    float *acc_buf = (float *)(sbuf + FP4_WORDS_PASS_TILES * (sbuf_tile + 16));
    for (int t0 = 0; t0 < n_tokens; t0 += slice) {
        const int nt = n_tokens - t0 < slice ? n_tokens - t0 : slice;
        if (nt >= FP4_WORDS_PASS_MIN_TOKENS)
            fp4_tokens_tile_passes(w, words, lows, meta, n_tokens, t0, nt, y, y_stride, row_begin, row_end, sbuf, acc_buf);
        else
            fp4_tokens_one_tile(w, words, lows, meta, n_tokens, t0, nt, y, y_stride, row_begin, row_end, sbuf, acc_buf);
    }
}

static size_t avx512_fp4_act_bytes(int n_tokens, int cols) {
    return n_tokens >= FP4_TOKENS_MIN ? kernel_fp4_words_bytes(n_tokens, cols) : fp4_decode_bytes(n_tokens, cols);
}

static void avx512_fp4_act_prepare(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols, void *act) {
    if (n_tokens >= FP4_TOKENS_MIN)
        kernel_fp4_words_prepare(x_codes, x_scales, n_tokens, cols, act);
    else
        fp4_decode_prepare(x_codes, n_tokens, cols, act);
}

static void avx512_matmul_fp4_prepared(const fp4_matrix *w, const void *act, const float *x_scales, int n_tokens,
                                       float *y, int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    if (n_tokens >= FP4_TOKENS_MIN)
        fp4_tokens_matmul(w, act, n_tokens, y, y_stride, row_begin, row_end);
    else
        fp4_decode_matmul(w, act, x_scales, n_tokens, y, y_stride, row_begin, row_end);
}

static void avx512_matmul_fp4(const fp4_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens,
                              float *y, int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    void *act = kernel_scratch_get(&act_scratch, avx512_fp4_act_bytes(n_tokens, w->cols) + 64);
    avx512_fp4_act_prepare(x_codes, x_scales, n_tokens, w->cols, act);
    avx512_matmul_fp4_prepared(w, act, x_scales, n_tokens, y, y_stride, row_begin, row_end);
}

/* ---------------------------------------------------------------------------------------------
 * Float products: 16 rows per vector. Weights in MATRIX_GROUPS16 give one column of a group's 16
 * rows per load; row-major weights (f32 matrices, the KV cache, the rows after the last whole
 * group) come through tiles of 16 rows x 64 bytes transposed in registers. */


static inline int values_per_dword(float_kind k) { return k == FLOAT_F32 ? 1 : k == FLOAT_BF16 ? 2 : 4; }

/* A transposed tile (r[j]: dword column j for 16 rows) -> its weight columns as f32 (exact values;
 * FP8 with the block scale applied, still exact), column c in dst[c]. */
static inline __attribute__((always_inline)) void tile_to_columns(float_kind kind, const __m512i r[16], __m512 ws,
                                                                   int ndw, __m512 *dst) {
    if (kind == FLOAT_F32) {
        UNROLL(16)
        for (int j = 0; j < 16; j++)
            if (j < ndw) dst[j] = _mm512_castsi512_ps(r[j]);
    } else if (kind == FLOAT_BF16) {
        const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
        UNROLL(16)
        for (int j = 0; j < 16; j++)
            if (j < ndw) {
                dst[2 * j] = _mm512_castsi512_ps(_mm512_slli_epi32(r[j], 16));
                dst[2 * j + 1] = _mm512_castsi512_ps(_mm512_and_si512(r[j], high));
            }
    } else {
        /* e4m3 byte k of each dword: its fields placed in an f32's (sign to 31, exponent and
         * mantissa to 26..20) give value * 2^-120, subnormals included; * 2^120 and * scale are
         * exact */
        const __m512i keep = _mm512_set1_epi32((int)0x87f00000u), top = _mm512_set1_epi32((int)0xff000000u);
        const __m512 up = _mm512_set1_ps(0x1p120f);
        UNROLL(16)
        for (int j = 0; j < 16; j++)
            if (j < ndw) {
                UNROLL(4)
                for (int k = 0; k < 4; k++) {
                    const __m512i b = k == 3 ? r[j] : _mm512_slli_epi32(r[j], 24 - 8 * k);
                    const __m512i bits = _mm512_and_si512(_mm512_srai_epi32(_mm512_and_si512(b, top), 4), keep);
                    dst[4 * j + k] = _mm512_mul_ps(_mm512_mul_ps(_mm512_castsi512_ps(bits), up), ws);
                }
            }
    }
}

/* Loads 16 rows x 64 bytes at byte offset off (bytes past `avail` read as zero). */
static inline __attribute__((always_inline)) void load_tile(const uint8_t *const rows[16], size_t off, int avail, __m512i r[16]) {
    if (avail >= 64) {
        UNROLL(16)
        for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(rows[i] + off);
    } else {
        const __mmask64 m = avail <= 0 ? 0 : (__mmask64)(~0ull >> (64 - avail));
        for (int i = 0; i < 16; i++) r[i] = _mm512_maskz_loadu_epi8(m, rows[i] + off);
    }
}

/* One column of a group's 16 rows (MATRIX_GROUPS16) as f32: bf16 exactly; FP8 as value * 2^-120
 * with the e4m3 fields placed in an f32's (sign to 31, exponent and mantissa to 26..20: after
 * sign extension and the shift, bits 27..31 all hold the sign and the mask keeps bit 31). */
static inline __attribute__((always_inline)) __m512 group_column(float_kind kind, const uint8_t *p) {
    if (kind == FLOAT_F32) return _mm512_loadu_ps(p);
    if (kind == FLOAT_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
    const __m512i d = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(d, 20), _mm512_set1_epi32((int)0x87f00000u)));
}

static inline int group_column_bytes(float_kind k) { return 16 * (4 / values_per_dword(k)); }

/* Rows of a group stored: [lo, hi) relative to its first row gr, as a lane mask. */
static inline __mmask16 group_store_mask(int gr, int row_begin, int row_end) {
    const int lo = row_begin > gr ? row_begin - gr : 0, hi = row_end - gr < 16 ? row_end - gr : 16;
    return (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
}

/* Row groups of 16 processed together: each group's sum is one chain of dependent adds (the
 * scalar order), so several groups (or several tokens) run side by side to hide the add latency. */
#define FLOAT_GROUPS 4

/* --- Exact products: when the multiply and add may be one FMA ---
 * acc + w*x with the product rounded first is fma(w, x, acc) whenever w*x is exact in f32: both
 * round the same exact sum once. It is exact when the significands fit (w with at most 8
 * significant bits, as every bf16 and dequantized-FP8 weight, x with at most 16: bf16-valued, as
 * the activations the official code keeps in bf16) and the product is a normal finite number
 * (kernels_products_exact: e_w + e_x >= 128 and <= 380, neither operand subnormal, inf or NaN). The
 * prefill path checks this for the activations once per call and for each 64-column tile of
 * weights, and takes the FMA loop (half the instructions) only where it holds: same bits. */
typedef struct exponent_range {
    /* min and max of the magnitude bits (exponent and mantissa) of the nonzero values, whose top
     * bits are the biased exponents; OR of all the bits (bits 0..15 must end up zero) */
    __m512i lo, hi, all_bits;
} exponent_range;

static inline exponent_range exponent_range_empty(void) {
    return (exponent_range){_mm512_set1_epi32(0x7fffffff), _mm512_setzero_si512(), _mm512_setzero_si512()};
}

static inline __attribute__((always_inline)) void exponent_range_add(exponent_range *r, __m512i bits, __mmask16 lanes) {
    const __m512i mag = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 nonzero = _mm512_mask_test_epi32_mask(lanes, mag, mag);
    r->lo = _mm512_mask_min_epu32(r->lo, nonzero, r->lo, mag);
    r->hi = _mm512_mask_max_epu32(r->hi, lanes, r->hi, mag); /* zeros cannot raise it */
    r->all_bits = _mm512_mask_or_epi32(r->all_bits, lanes, r->all_bits, bits);
}

/* Whether the values can take part in exact products at all (bits 0..15 zero, none subnormal,
 * infinite or NaN); then their smallest and largest biased exponents (*hi = 0: all zeros). */
static inline int exponent_range_fits(const exponent_range *r, unsigned *lo, unsigned *hi) {
    if (_mm512_reduce_or_epi32(r->all_bits) & 0xffff) return 0;
    const unsigned max = _mm512_reduce_max_epu32(r->hi);
    *lo = _mm512_reduce_min_epu32(r->lo) >> 23;
    *hi = max >> 23;
    return max == 0 || (*lo >= 1 && *hi <= 254);
}

/* Whether every product of a weight in w and an activation in x is exact (see above). */
static inline int exponent_ranges_exact(const exponent_range *w, const exponent_range *x) {
    unsigned wlo, whi, xlo, xhi;
    if (!exponent_range_fits(w, &wlo, &whi) || !exponent_range_fits(x, &xlo, &xhi)) return 0;
    return kernels_products_exact(wlo, whi, xlo, xhi);
}

static _Thread_local struct {
    unsigned long long call; /* kernel_call_id of the scan below; 0: none */
    exponent_range range;
} activation_scan_memo;

static exponent_range activation_exponents(const float *x, int x_stride, int n_tokens, int cols) {
    exponent_range r = exponent_range_empty();
    for (int t = 0; t < n_tokens; t++) {
        const float *xt = x + (size_t)t * x_stride;
        int c = 0;
        for (; c + 16 <= cols; c += 16) exponent_range_add(&r, _mm512_castps_si512(_mm512_loadu_ps(xt + c)), 0xffff);
        if (c < cols) {
            const __mmask16 m = (__mmask16)((1u << (cols - c)) - 1);
            exponent_range_add(&r, _mm512_castps_si512(_mm512_maskz_loadu_ps(m, xt + c)), m);
        }
    }
    return r;
}

/* y[t][16 rows of group g] += the tile's columns times token t's activations (x: the tile's first
 * column, token t at x + t * x_stride), for tokens [t0, n_tokens), four tokens' chains side by
 * side; the running sums live in y (the caller's scratch) between tiles. fused: one FMA per column
 * (only where every product is exact), else the multiply and the add. */
static inline __attribute__((always_inline)) void group_token_chains(const __m512 *col, int ncols, const float *x,
                                                                     int x_stride, int t0, int n_tokens, float *y,
                                                                     int y_stride, int row0, __mmask16 mask, int fused) {
#define CHAIN_STEP(acc, v) ((acc) = fused ? _mm512_fmadd_ps(col[c], (v), (acc)) : _mm512_add_ps((acc), _mm512_mul_ps(col[c], (v))))
    int t = t0;
    for (; t + 4 <= n_tokens; t += 4) {
        const float *x0 = x + (size_t)t * x_stride, *x1 = x0 + x_stride, *x2 = x1 + x_stride, *x3 = x2 + x_stride;
        float *y0 = y + (size_t)t * y_stride + row0;
        __m512 a0 = _mm512_maskz_loadu_ps(mask, y0);
        __m512 a1 = _mm512_maskz_loadu_ps(mask, y0 + y_stride);
        __m512 a2 = _mm512_maskz_loadu_ps(mask, y0 + 2 * (size_t)y_stride);
        __m512 a3 = _mm512_maskz_loadu_ps(mask, y0 + 3 * (size_t)y_stride);
        for (int c = 0; c < ncols; c++) {
            CHAIN_STEP(a0, _mm512_set1_ps(x0[c]));
            CHAIN_STEP(a1, _mm512_set1_ps(x1[c]));
            CHAIN_STEP(a2, _mm512_set1_ps(x2[c]));
            CHAIN_STEP(a3, _mm512_set1_ps(x3[c]));
        }
        _mm512_mask_storeu_ps(y0, mask, a0);
        _mm512_mask_storeu_ps(y0 + y_stride, mask, a1);
        _mm512_mask_storeu_ps(y0 + 2 * (size_t)y_stride, mask, a2);
        _mm512_mask_storeu_ps(y0 + 3 * (size_t)y_stride, mask, a3);
    }
    for (; t < n_tokens; t++) {
        const float *xt = x + (size_t)t * x_stride;
        float *yt = y + (size_t)t * y_stride + row0;
        __m512 a0 = _mm512_maskz_loadu_ps(mask, yt);
        for (int c = 0; c < ncols; c++) CHAIN_STEP(a0, _mm512_set1_ps(xt[c]));
        _mm512_mask_storeu_ps(yt, mask, a0);
    }
#undef CHAIN_STEP
}

/* One tile of columns (cols_tile[g * 64 + c]: column c of group g's 16 rows) for every token, with
 * FMAs (only where every product is exact: the same bits as acc + w*x). FMA_TOKENS tokens times
 * the groups side by side (16 independent chains: enough to cover the FMA latency on two ports):
 * each activation broadcast serves every group, each column every token. */
#define FMA_TOKENS 4
static inline __attribute__((always_inline)) void float_tile_fma(const __m512 *cols_tile, int groups, int ncols,
                                                                 const float *x, int x_stride, int n_tokens, float *y,
                                                                 int y_stride, const __mmask16 *store_mask) {
    int t = 0;
    if (groups == FLOAT_GROUPS) {
        for (; t + FMA_TOKENS <= n_tokens; t += FMA_TOKENS) {
            const float *xt = x + (size_t)t * x_stride;
            float *yt = y + (size_t)t * y_stride;
            __m512 a[FMA_TOKENS][FLOAT_GROUPS];
            UNROLL(4)
            for (int u = 0; u < FMA_TOKENS; u++)
                UNROLL(4)
                for (int g = 0; g < FLOAT_GROUPS; g++) a[u][g] = _mm512_maskz_loadu_ps(store_mask[g], yt + (size_t)u * y_stride + 16 * g);
            for (int c = 0; c < ncols; c++) {
                __m512 col[FLOAT_GROUPS];
                UNROLL(4)
                for (int g = 0; g < FLOAT_GROUPS; g++) col[g] = cols_tile[g * 64 + c];
                UNROLL(4)
                for (int u = 0; u < FMA_TOKENS; u++) {
                    const __m512 v = _mm512_set1_ps(xt[(size_t)u * x_stride + c]);
                    UNROLL(4)
                    for (int g = 0; g < FLOAT_GROUPS; g++) a[u][g] = _mm512_fmadd_ps(col[g], v, a[u][g]);
                }
            }
            UNROLL(4)
            for (int u = 0; u < FMA_TOKENS; u++)
                UNROLL(4)
                for (int g = 0; g < FLOAT_GROUPS; g++) _mm512_mask_storeu_ps(yt + (size_t)u * y_stride + 16 * g, store_mask[g], a[u][g]);
        }
    }
    for (int g = 0; g < groups; g++)
        group_token_chains(cols_tile + (size_t)g * 64, ncols, x, x_stride, t, n_tokens, y, y_stride, 16 * g, store_mask[g],
                           1);
}

/* The activations float_matmul packed last on this thread: the call (kernel_call_id; 0, outside a
 * par_* call, is never reused) and the source and destination, which with the call fix the shape */
static _Thread_local struct {
    unsigned long long call;
    const float *x;
    const float *xp;
} x_pack_memo;

static inline __attribute__((always_inline)) void float_matmul(const float_matrix *m, const float *x, int x_stride,
                                                               int n_tokens, float *y, int y_stride, int row_begin,
                                                               int row_end) {
    const int vpd = values_per_dword(m->kind);
    const int elem_bytes = 4 / vpd;
    const size_t total_bytes = (size_t)m->cols * elem_bytes;
    /* 64 columns per tile whatever the element size (one 16 x 16 dword tile for FP8, two for
     * bf16, four for f32), so that each token's running sums are read and written once per 64
     * columns, not once per 16 (f32) */
    enum { TILE_COLS = 64 };
    const int cols_per_load = 16 * vpd; /* weight columns in 64 bytes */
    const size_t tile_bytes = (size_t)TILE_COLS * elem_bytes;
    const size_t col_bytes = (size_t)group_column_bytes(m->kind);
    /* [FLOAT_GROUPS][TILE_COLS] columns of 16 rows, as f32 */
    __m512 *cols_tile = kernel_scratch_get(&tile_scratch, (size_t)FLOAT_GROUPS * TILE_COLS * sizeof(__m512));
    /* Several tokens: the activations packed tile by tile (kernel_pack_column_tiles) and the
     * running sums of a row block in a scratch of their own ((t * FLOAT_GROUPS + g) *
     * 16), both contiguous. Read in place, the tokens' rows of x and y lie a power of two apart
     * (wo_a in a 256-token chunk: 128 KB and 32 KB), in the same cache sets, so a row block's pass
     * over the tokens missed L1 and L2 on nearly every load. With a single row block (the
     * hyper-connection mixes: 24 rows) the activations are read once anyway, and packing them
     * only costs (hc_fn, 64 tokens: 1.07 -> 1.18 ms). */
    const int tiles = (m->cols + TILE_COLS - 1) / TILE_COLS;
    const int sums_stride = FLOAT_GROUPS * 16;
    /* grouped: whole groups are read, the rows outside [row_begin, row_end) not stored */
    const int start = m->grouped ? row_begin - row_begin % 16 : row_begin;
    const int pack_x = n_tokens > 1 && row_end - start > 16 * FLOAT_GROUPS;
    float *xp = NULL, *sums = NULL;
    if (n_tokens > 1) sums = kernel_scratch_get(&row_sums_scratch, (size_t)n_tokens * sums_stride * sizeof(float));
    if (pack_x) {
        xp = kernel_scratch_get(&x_pack_scratch, (size_t)tiles * n_tokens * TILE_COLS * sizeof(float));
        /* one par_* call gives a thread several row tasks on the same activations: packed once */
        const unsigned long long call = kernel_call_id();
        if (!call || x_pack_memo.call != call || x_pack_memo.x != x || x_pack_memo.xp != xp) {
            kernel_pack_column_tiles(xp, x, x_stride, n_tokens, m->cols, TILE_COLS);
            x_pack_memo.call = call;
            x_pack_memo.x = x;
            x_pack_memo.xp = xp;
        }
    }
    /* the activations' range, scanned when the first weight tile could use it (never for f32
     * weights with low bits, as the hyper-connection mixes have); once the activations alone rule
     * FMAs out, the weight tiles are not scanned either */
    exponent_range x_range = exponent_range_empty();
    enum { X_UNSCANNED, X_USABLE, X_UNUSABLE } x_state = X_UNSCANNED;
    for (int r0 = start; r0 < row_end; r0 += 16 * FLOAT_GROUPS) {
        const int rows_here = row_end - r0 < 16 * FLOAT_GROUPS ? row_end - r0 : 16 * FLOAT_GROUPS;
        const int groups = (rows_here + 15) / 16;
        const uint8_t *rows[FLOAT_GROUPS][16];
        const uint8_t *srow[FLOAT_GROUPS][16];
        __mmask16 store_mask[FLOAT_GROUPS];
        for (int g = 0; g < groups; g++) {
            const int nr = rows_here - 16 * g < 16 ? rows_here - 16 * g : 16;
            store_mask[g] = group_store_mask(r0 + 16 * g, row_begin, row_end);
            if (m->grouped) continue;
            for (int i = 0; i < 16; i++) {
                const int r = r0 + 16 * g + (i < nr ? i : nr - 1); /* a short group repeats its last row */
                rows[g][i] = m->data + (size_t)r * m->row_bytes;
                /* FP8 block scales: a group may straddle a 128-row boundary */
                srow[g][i] = m->kind == FLOAT_FP8 ? m->scales + (size_t)(r / 128) * m->scale_cols : NULL;
            }
        }
        __m512 acc[FLOAT_GROUPS];
        for (int g = 0; g < FLOAT_GROUPS; g++) acc[g] = _mm512_setzero_ps();
        if (n_tokens > 1) memset(sums, 0, (size_t)n_tokens * sums_stride * sizeof(float));
        for (size_t off = 0; off < total_bytes; off += tile_bytes) {
            const int col0 = (int)(off / (size_t)elem_bytes);
            const int ncols = m->cols - col0 < TILE_COLS ? m->cols - col0 : TILE_COLS;
            /* each group's 16 rows x 64 columns as f32 columns (a tile lies inside one FP8 scale block) */
            for (int g = 0; g < groups; g++) {
                __m512 *dst = cols_tile + (size_t)g * TILE_COLS;
                if (m->grouped) {
                    const uint8_t *p = m->data + ((size_t)(r0 / 16 + g) * m->cols + col0) * col_bytes;
                    if (m->kind == FLOAT_FP8) {
                        const __m512 ws = _mm512_set1_ps(
                            kernel_e8m0(m->scales[(size_t)((r0 + 16 * g) / 128) * m->scale_cols + col0 / 128]));
                        for (int j = 0; j < ncols; j++)
                            dst[j] = _mm512_mul_ps(_mm512_mul_ps(group_column(FLOAT_FP8, p + j * col_bytes),
                                                                 _mm512_set1_ps(0x1p120f)),
                                                   ws);
                    } else {
                        for (int j = 0; j < ncols; j++) dst[j] = group_column(m->kind, p + j * col_bytes);
                    }
                    continue;
                }
                __m512 ws = _mm512_setzero_ps();
                if (m->kind == FLOAT_FP8) {
                    float sc[16];
                    for (int i = 0; i < 16; i++) sc[i] = kernel_e8m0(srow[g][i][col0 / 128]);
                    ws = _mm512_loadu_ps(sc);
                }
                for (int k = 0; k * cols_per_load < ncols; k++) {
                    const size_t sub = off + (size_t)k * 64;
                    const int sub_cols = ncols - k * cols_per_load < cols_per_load ? ncols - k * cols_per_load : cols_per_load;
                    __m512i r[16];
                    load_tile(rows[g], sub, (int)(total_bytes - sub < 64 ? total_bytes - sub : 64), r);
                    transpose16x16(r);
                    tile_to_columns(m->kind, r, ws, (sub_cols + vpd - 1) / vpd, dst + k * cols_per_load);
                }
            }
            if (n_tokens == 1) {
                const float *xc = x + col0;
                if (groups == FLOAT_GROUPS) {
                    for (int c = 0; c < ncols; c++) {
                        const __m512 xv = _mm512_set1_ps(xc[c]);
                        UNROLL(4)
                        for (int g = 0; g < FLOAT_GROUPS; g++)
                            acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(cols_tile[g * TILE_COLS + c], xv));
                    }
                } else {
                    for (int c = 0; c < ncols; c++) {
                        const __m512 xv = _mm512_set1_ps(xc[c]);
                        for (int g = 0; g < groups; g++) acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(cols_tile[g * TILE_COLS + c], xv));
                    }
                }
                continue;
            }
            /* several tokens: this tile's activations (packed or in place), the running sums in
             * the scratch */
            const float *xk = pack_x ? xp + (size_t)(col0 / TILE_COLS) * n_tokens * TILE_COLS : x + col0;
            const int xk_stride = pack_x ? TILE_COLS : x_stride;
            if (x_state != X_UNUSABLE) {
                exponent_range w_range = exponent_range_empty();
                for (int g = 0; g < groups; g++)
                    for (int c = 0; c < ncols; c++)
                        exponent_range_add(&w_range, _mm512_castps_si512(cols_tile[g * TILE_COLS + c]), 0xffff);
                if (x_state == X_UNSCANNED && !(_mm512_reduce_or_epi32(w_range.all_bits) & 0xffff)) {
                    /* the same activations for every row range of one par_* call: scanned once per thread */
                    const unsigned long long call = kernel_call_id();
                    if (call && activation_scan_memo.call == call) {
                        x_range = activation_scan_memo.range;
                    } else {
                        x_range = activation_exponents(x, x_stride, n_tokens, m->cols);
                        activation_scan_memo.call = call;
                        activation_scan_memo.range = x_range;
                    }
                    unsigned lo, hi;
                    x_state = exponent_range_fits(&x_range, &lo, &hi) ? X_USABLE : X_UNUSABLE;
                }
                if (x_state == X_USABLE && exponent_ranges_exact(&w_range, &x_range)) {
                    float_tile_fma(cols_tile, groups, ncols, xk, xk_stride, n_tokens, sums, sums_stride, store_mask);
                    continue;
                }
            }
            for (int g = 0; g < groups; g++)
                group_token_chains(cols_tile + (size_t)g * TILE_COLS, ncols, xk, xk_stride, 0, n_tokens, sums, sums_stride,
                                   16 * g, store_mask[g], 0);
        }
        if (n_tokens > 1)
            for (int t = 0; t < n_tokens; t++)
                for (int g = 0; g < groups; g++)
                    _mm512_mask_storeu_ps(y + (size_t)t * y_stride + r0 + 16 * g, store_mask[g],
                                          _mm512_loadu_ps(sums + (size_t)t * sums_stride + 16 * g));
        if (n_tokens == 1)
            for (int g = 0; g < groups; g++) _mm512_mask_storeu_ps(y + r0 + 16 * g, store_mask[g], acc[g]);
    }
}

/* Decode (one token) on MATRIX_GROUPS16 weights: NG groups from group g0, each a chain of adds
 * over all columns, their weights converted in registers as they stream in. */
#define DECODE_GROUPS 8

/* n columns of NG FP8 groups from p (each group's columns group_bytes apart) against activations
 * xk[0..n) already carrying the block's scale: acc + w * x per column, the product rounded first,
 * or (fused, a constant after inlining: the caller knows every product exact) one FMA. */
static inline __attribute__((always_inline)) void fp8_scaled_columns(const uint8_t *p, size_t col_bytes,
                                                                     size_t group_bytes, const int NG, const float *xk,
                                                                     int n, const int fused, __m512 acc[DECODE_GROUPS]) {
    for (int c = 0; c < n; c++, p += col_bytes) {
        const __m512 xv = _mm512_set1_ps(xk[c]);
        UNROLL(8)
        for (int g = 0; g < NG; g++) {
            const __m512 w = group_column(FLOAT_FP8, p + g * group_bytes);
            acc[g] = fused ? _mm512_fmadd_ps(w, xv, acc[g]) : _mm512_add_ps(acc[g], _mm512_mul_ps(w, xv));
        }
    }
}

static inline __attribute__((always_inline)) void group_decode(const float_matrix *m, const int NG, int g0,
                                                               const float *x, __m512 acc[DECODE_GROUPS]) {
    const float_kind kind = m->kind;
    const size_t col_bytes = (size_t)group_column_bytes(kind), group_bytes = (size_t)m->cols * col_bytes;
    const uint8_t *base = m->data + (size_t)g0 * group_bytes;
    UNROLL(8)
    for (int g = 0; g < NG; g++) acc[g] = _mm512_setzero_ps();
    for (int c0 = 0; c0 < m->cols; c0 += 128) {
        const int c1 = m->cols - c0 < 128 ? m->cols : c0 + 128;
        const uint8_t *p = base + (size_t)c0 * col_bytes;
        if (kind != FLOAT_FP8) {
            for (int c = c0; c < c1; c++, p += col_bytes) {
                const __m512 xv = _mm512_set1_ps(x[c]);
                UNROLL(8)
                for (int g = 0; g < NG; g++)
                    acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(group_column(kind, p + g * group_bytes), xv));
            }
            continue;
        }
        /* A group lies inside one 128-row scale block. The scalar product w = e4m3 * 2^k is
         * rounded once (exact unless it leaves the f32 range); (value * 2^-120) * 2^(k+120) is the
         * same product, so one multiply does when 2^(k+120) is a float, two otherwise. */
        float ws[DECODE_GROUPS];
        int wide = 0, shared = 1;
        UNROLL(8)
        for (int g = 0; g < NG; g++) {
            ws[g] = kernel_e8m0(m->scales[(size_t)((g0 + g) * 16 / 128) * m->scale_cols + c0 / 128]);
            wide |= ws[g] > 0x1p7f;
            shared &= ws[g] == ws[0];
        }
        /* Groups of one scale (eight groups from a multiple of 8 are one 128-row block): for
         * 2^-117 <= 2^k <= 2^7, w is a normal float (|e4m3| is in [2^-9, 448]) or zero, so the
         * scalar w * x is x * value * 2^k rounded once; x * 2^(k+120) is exact when finite (a
         * scaling up by 2^3 or more loses no bits), so (value * 2^-120) * (x * 2^(k+120)) rounds
         * the same product, with the scale moved onto the 128 activations, once for all groups. */
        if (shared && ws[0] >= 0x1p-117f && ws[0] <= 0x1p7f) {
            float xk[128];
            const __m512 kx = _mm512_set1_ps(ws[0] * 0x1p120f);
            __mmask16 bad = 0;
            __m512i low_bits = _mm512_setzero_si512(), smallest = _mm512_set1_epi32(0x7fffffff);
            for (int c = c0; c < c1; c += 16) {
                const __mmask16 in = c1 - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (c1 - c)) - 1);
                const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, x + c), kx);
                bad |= _mm512_fpclass_ps_mask(v, 0x99); /* NaN or infinity */
                const __m512i bits = _mm512_castps_si512(v), mag = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
                low_bits = _mm512_or_si512(low_bits, bits);
                smallest = _mm512_mask_min_epu32(smallest, _mm512_test_epi32_mask(mag, mag), smallest, mag);
                _mm512_storeu_ps(xk + (c - c0), v);
            }
            if (!bad) {
                /* Every product exact, so one FMA each (the same bits, one instruction fewer per
                 * 16 products): the weights (value * 2^-120) are multiples of 2^-129 with at most 4
                 * significant bits; bf16-valued activations (the official code's bf16 input: low
                 * 16 bits zero) have at most 8, and at a biased exponent of 114 or more their
                 * lowest bit is at least 2^-20, so every product has at most 12 bits, none below
                 * 2^-149, and is below 448 * 2^8 (the activations are finite): exact in f32,
                 * normal or subnormal. */
                if (!(_mm512_reduce_or_epi32(low_bits) & 0xffff) && (_mm512_reduce_min_epu32(smallest) >> 23) >= 114)
                    fp8_scaled_columns(p, col_bytes, group_bytes, NG, xk, c1 - c0, 1, acc);
                else
                    fp8_scaled_columns(p, col_bytes, group_bytes, NG, xk, c1 - c0, 0, acc);
                continue;
            }
        }
        if (!wide) {
            __m512 k[DECODE_GROUPS];
            UNROLL(8)
            for (int g = 0; g < NG; g++) k[g] = _mm512_set1_ps(ws[g] * 0x1p120f);
            for (int c = c0; c < c1; c++, p += col_bytes) {
                const __m512 xv = _mm512_set1_ps(x[c]);
                UNROLL(8)
                for (int g = 0; g < NG; g++) {
                    const __m512 w = _mm512_mul_ps(group_column(FLOAT_FP8, p + g * group_bytes), k[g]);
                    acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(w, xv));
                }
            }
        } else {
            for (int c = c0; c < c1; c++, p += col_bytes) {
                const __m512 xv = _mm512_set1_ps(x[c]);
                for (int g = 0; g < NG; g++) {
                    const __m512 w = _mm512_mul_ps(
                        _mm512_mul_ps(group_column(FLOAT_FP8, p + g * group_bytes), _mm512_set1_ps(0x1p120f)),
                        _mm512_set1_ps(ws[g]));
                    acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(w, xv));
                }
            }
        }
    }
}

static inline __attribute__((always_inline)) void grouped_decode(const float_matrix *m, const float *x, float *y,
                                                                 int row_begin, int row_end) {
    const int g_end = (row_end + 15) / 16;
    for (int g = row_begin / 16; g < g_end;) {
        const int left = g_end - g, ng = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
        __m512 acc[DECODE_GROUPS];
        switch (ng) {
        case 8: group_decode(m, 8, g, x, acc); break;
        case 4: group_decode(m, 4, g, x, acc); break;
        case 2: group_decode(m, 2, g, x, acc); break;
        default: group_decode(m, 1, g, x, acc); break;
        }
        for (int i = 0; i < ng; i++)
            _mm512_mask_storeu_ps(y + (size_t)(g + i) * 16, group_store_mask((g + i) * 16, row_begin, row_end), acc[i]);
        g += ng;
    }
}

/* Rows [row_begin, row_end) of a matrix with `rows` rows in `layout`: the whole groups through the
 * grouped paths, the rows after them row-major. */
static inline __attribute__((always_inline)) void float_product(const float_matrix *m, int rows, int layout,
                                                                const float *x, int x_stride, int n_tokens, float *y,
                                                                int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    if (layout == MATRIX_GROUPS16) {
        const int rows16 = rows - rows % 16, end = row_end < rows16 ? row_end : rows16;
        if (row_begin < end) {
            float_matrix g = *m;
            g.grouped = 1;
            if (n_tokens == 1) grouped_decode(&g, x, y, row_begin, end);
            else float_matmul(&g, x, x_stride, n_tokens, y, y_stride, row_begin, end);
        }
        if (row_begin < rows16) row_begin = rows16;
    }
    if (row_begin < row_end) float_matmul(m, x, x_stride, n_tokens, y, y_stride, row_begin, row_end);
}

static void avx512_matmul_bf16(const bf16_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                               int row_begin, int row_end) {
    const float_matrix m = float_matrix_bf16(w);
    float_product(&m, w->rows, w->layout, x, x_stride, n_tokens, y, y_stride, row_begin, row_end);
}

static void avx512_matmul_f32(const f32_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                              int row_begin, int row_end) {
    const float_matrix m = float_matrix_f32(w);
    float_product(&m, w->rows, MATRIX_ROWS, x, x_stride, n_tokens, y, y_stride, row_begin, row_end);
}

static void avx512_matmul_fp8_dequant(const fp8_matrix *w, const float *x, int x_stride, int n_tokens, float *y,
                                      int y_stride, int row_begin, int row_end) {
    const float_matrix m = float_matrix_fp8(w);
    float_product(&m, w->rows, w->layout, x, x_stride, n_tokens, y, y_stride, row_begin, row_end);
}

/* ---------------------------------------------------------------------------------------------
 * Activation quantization (the scalar's steps on 16 lanes)
 *
 * amax: MAXPS returns its second operand when either is NaN, so max(|x|, amax) skips NaN as fmaxf
 * does. q = x / s and the clamp as the scalar (MAXPS(q, -448) is -448 for a NaN q, as fmaxf).
 * e4m3 with ties to even: below 2^-6 the code is rint(|q| * 2^9) (0..8, 8 being the smallest
 * normal, as in the scalar); above, the f32 bits rounded to three mantissa bits by adding
 * 0x7ffff plus the lowest kept bit (a carry into the exponent is the scalar's m == 16 case),
 * shifted down, and rebased from the f32 to the e4m3 exponent bias. */
static void avx512_quantize_fp8_act(const float *x, int n, uint8_t *codes, float *scales) {
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int b = 0; b < n / FP8_ACT_BLOCK; b++) {
        const float *xb = x + (size_t)b * FP8_ACT_BLOCK;
        __m512 amax = _mm512_setzero_ps();
        for (int i = 0; i < FP8_ACT_BLOCK; i += 16) amax = _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(xb + i), abs_mask), amax);
        const float s = pow2_scale_ceil(fmaxf(_mm512_reduce_max_ps(amax), 1e-4f), 1.0f / 448.0f);
        scales[b] = s;
        const __m512 sv = _mm512_set1_ps(s);
        for (int i = 0; i < FP8_ACT_BLOCK; i += 16) {
            __m512 q = _mm512_div_ps(_mm512_loadu_ps(xb + i), sv);
            q = _mm512_min_ps(_mm512_max_ps(q, _mm512_set1_ps(-448.0f)), _mm512_set1_ps(448.0f));
            const __m512i bits = _mm512_castps_si512(q);
            const __m512i mag = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
            const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(mag, 20), _mm512_set1_epi32(1));
            const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(mag, _mm512_set1_epi32(0x7ffff)), lsb), 20);
            const __m512i normal = _mm512_sub_epi32(rounded, _mm512_set1_epi32((127 - 7) << 3));
            const __m512 a = _mm512_castsi512_ps(mag);
            const __m512i sub = _mm512_cvt_roundps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(512.0f)),
                                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __mmask16 tiny = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0x1p-6f), _CMP_LT_OQ);
            __m512i code = _mm512_mask_mov_epi32(normal, tiny, sub);
            code = _mm512_or_si512(code, _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80)));
            _mm_storeu_si128((__m128i *)(codes + (size_t)b * FP8_ACT_BLOCK + i), _mm512_cvtepi32_epi8(code));
        }
    }
}

/* 4 heads x 64 outputs of sums in registers across all the rows (each row's product and add in
 * row order, as the scalar), then y * rescale + s: each row vector loaded serves 4 heads (the rows
 * are shared, and re-reading them per head made this bound by L2 reads); the first nh (1..4) of
 * the 4 heads are used. fused (a constant after inlining): one FMA per product (the caller knows
 * every product exact). */
#define ROWS_ADD_HEADS 4
#define ROWS_ADD_VECTORS 4
static inline __attribute__((always_inline)) void weighted_rows_pass(float *y, const float *rescale, const float *a,
                                                                     int a_stride, const float *const *rows,
                                                                     int n_rows, int n, int i0, int nh, int fused) {
    __mmask16 mask[ROWS_ADD_VECTORS];
    __m512 acc[ROWS_ADD_HEADS][ROWS_ADD_VECTORS];
    UNROLL(4)
    for (int v = 0; v < ROWS_ADD_VECTORS; v++) {
        const int left = n - i0 - 16 * v;
        mask[v] = left <= 0 ? 0 : left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        UNROLL(4)
        for (int h = 0; h < ROWS_ADD_HEADS; h++) acc[h][v] = _mm512_setzero_ps();
    }
    for (int j = 0; j < n_rows; j++) {
        const float *x = rows[j] + i0;
        __m512 xv[ROWS_ADD_VECTORS];
        UNROLL(4)
        for (int v = 0; v < ROWS_ADD_VECTORS; v++) xv[v] = _mm512_maskz_loadu_ps(mask[v], x + 16 * v);
        UNROLL(4)
        for (int h = 0; h < ROWS_ADD_HEADS; h++) {
            if (h >= nh) break;
            const __m512 av = _mm512_set1_ps(a[(size_t)h * a_stride + j]);
            UNROLL(4)
            for (int v = 0; v < ROWS_ADD_VECTORS; v++)
                acc[h][v] = fused ? _mm512_fmadd_ps(av, xv[v], acc[h][v]) : _mm512_add_ps(acc[h][v], _mm512_mul_ps(av, xv[v]));
        }
    }
    UNROLL(4)
    for (int h = 0; h < ROWS_ADD_HEADS; h++) {
        if (h >= nh) break;
        const __m512 rs = _mm512_set1_ps(rescale[h]);
        float *yh = y + (size_t)h * n + i0;
        UNROLL(4)
        for (int v = 0; v < ROWS_ADD_VECTORS; v++) {
            const __m512 kept = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask[v], yh + 16 * v), rs);
            _mm512_mask_storeu_ps(yh + 16 * v, mask[v], _mm512_add_ps(kept, acc[h][v]));
        }
    }
}

static void avx512_rescale_add_weighted_rows_f32(float *y, const float *rescale, const float *a, int a_stride,
                                                 int n_heads, const float *const *rows, int n_rows, int n,
                                                 int products_exact) {
    for (int h0 = 0; h0 < n_heads; h0 += ROWS_ADD_HEADS) {
        const int nh = n_heads - h0 < ROWS_ADD_HEADS ? n_heads - h0 : ROWS_ADD_HEADS;
        float *yh = y + (size_t)h0 * n;
        const float *ah = a + (size_t)h0 * a_stride;
        for (int i0 = 0; i0 < n; i0 += 16 * ROWS_ADD_VECTORS) {
            if (products_exact)
                weighted_rows_pass(yh, rescale + h0, ah, a_stride, rows, n_rows, n, i0, nh, 1);
            else
                weighted_rows_pass(yh, rescale + h0, ah, a_stride, rows, n_rows, n, i0, nh, 0);
        }
    }
}

const kernel_ops kernel_ops_avx512 = {
    .name = "avx512",
    .plain_c_level = KERNELS_PLAIN_C_AVX512,
    .quantize_fp8_act = avx512_quantize_fp8_act,
    .matmul_fp8 = avx512_matmul_fp8,
    .matmul_fp4 = avx512_matmul_fp4,
    .matmul_fp8_dequant = avx512_matmul_fp8_dequant,
    .matmul_bf16 = avx512_matmul_bf16,
    .matmul_f32 = avx512_matmul_f32,
    .rescale_add_weighted_rows_f32 = avx512_rescale_add_weighted_rows_f32,
    .fp8_act_bytes = avx512_fp8_act_bytes,
    .fp8_act_prepare = avx512_fp8_act_prepare,
    .matmul_fp8_prepared = avx512_fp8_prepared,
    .fp4_act_bytes = avx512_fp4_act_bytes,
    .fp4_act_prepare = avx512_fp4_act_prepare,
    .matmul_fp4_prepared = avx512_matmul_fp4_prepared,
};
