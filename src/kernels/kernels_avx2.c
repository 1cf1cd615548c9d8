/* AVX2 + FMA kernels, bit-identical to kernels_scalar.c. The same exact methods as the AVX-512
 * variant (see kernels_avx512.c), at half the width and without VNNI or byte permutes:
 *  - FP8 x FP8: f64 FMAs on exact values; a weight code becomes an f64 by sign extension and
 *    shifts (sign to bit 63, exponent and mantissa fields to bits 55..49: value * 2^-1016), the
 *    activations carry 2^1000. One token converts as it goes and keeps this plain form: the
 *    AVX-512 variant's raised form (no subnormal operands, for matrices that list their low
 *    codes) takes one more instruction per 4 codes without ternary logic, which cost more than
 *    the assists it saves (4096 x 4096: 2.13 -> 2.69 ms on weights without low codes, 2.84 ->
 *    2.77 on heavy-tailed ones). Several tokens convert each block once into a tile, where the
 *    extra instruction is cheap, so listed matrices take the raised form there.
 *  - FP4 x FP8 (kernels_avx2_fp4.h): 1 to 3 tokens with the activation split into four
 *    signed-byte planes, the weight as the unsigned byte j + 12; VPMADDUBSW then VPMADDWD stand
 *    for VPDPBUSD (pair sums stay below 2 * 24 * 120, far from the 16-bit saturation), VPMADDWD
 *    multiplying by the plane's power of two so that the planes combine with adds alone; planes
 *    that are all zero in a chunk are skipped. 4 or more tokens on int16 words, VPMADDWD + VPADDD
 *    standing for VPDPWSSD.
 *  - Float products: each vector one column of 8 rows (half a group of MATRIX_GROUPS16 weights,
 *    loaded directly; else from a tile of 8 rows x 32 bytes transposed in registers), acc = acc +
 *    w * x per column in column order (no FMA), several 8-row chains side by side. */
#include "kernels/kernels_avx2_fp4.h"
#include "kernels/kernels_avx2_inline.h"
#include "kernels/kernels_internal.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local kernel_scratch act_scratch, tile_scratch, x_pack_scratch, row_sums_scratch;

/* ---------------------------------------------------------------------------------------------
 * FP8 x FP8 */

/* 4 weight codes -> 4 f64: plain (value * 2^-1016) or raised (bit 61 also set: value * 2^-504 but
 * for the low codes, see kernel_fp8_low_value), which costs one more instruction here. */
static inline __attribute__((always_inline)) __m256d fp8x4_to_f64(const uint8_t *src, int raised) {
    int32_t four;
    memcpy(&four, src, 4);
    const __m256i q = _mm256_cvtepi8_epi64(_mm_cvtsi32_si128(four));
    const __m256i placed = _mm256_and_si256(_mm256_slli_epi64(q, 49), _mm256_set1_epi64x((long long)0x80ffffffffffffffull));
    return _mm256_castsi256_pd(raised ? _mm256_or_si256(placed, _mm256_set1_epi64x((long long)0x2000000000000000ull)) : placed);
}

/* VPSHUFB controls of fp8x16_plain: qword lane i (0..3) gets word 4h + i of its 128-bit lane
 * (both lanes hold the same 8 words) in bytes 6 and 7, zeros elsewhere. */
static const uint8_t fp8_word_to_qword[2][32] __attribute__((aligned(32))) = {
#define Q(w) 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 2 * (w), 2 * (w) + 1
    {Q(0), Q(1), Q(2), Q(3)},
    {Q(4), Q(5), Q(6), Q(7)},
#undef Q
};

/* 16 weight codes -> 16 f64 in the plain form of fp8x4_to_f64 (the same bits), with half its
 * shuffle and shift work: that form sign-extends 4 codes per instruction, then shifts and masks.
 * Here the 16 codes are loaded into both 128-bit lanes, each code's word (c << 1 in its low byte,
 * its sign bit alone in the high byte: VPADDB, VPAND, then VPUNPCK{L,H}BW) is what the f64 needs in
 * bits 48..63 (c0..c6 at 49..55, the sign at 63), and one in-lane VPSHUFB places 4 words there. */
static inline __attribute__((always_inline)) void fp8x16_plain(const uint8_t *src, __m256d out[4]) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)src));
    const __m256i doubled = _mm256_add_epi8(v, v), sign = _mm256_and_si256(v, _mm256_set1_epi8((char)0x80));
    const __m256i words_lo = _mm256_unpacklo_epi8(doubled, sign), words_hi = _mm256_unpackhi_epi8(doubled, sign);
    const __m256i first = _mm256_load_si256((const __m256i *)fp8_word_to_qword[0]);
    const __m256i second = _mm256_load_si256((const __m256i *)fp8_word_to_qword[1]);
    out[0] = _mm256_castsi256_pd(_mm256_shuffle_epi8(words_lo, first));
    out[1] = _mm256_castsi256_pd(_mm256_shuffle_epi8(words_lo, second));
    out[2] = _mm256_castsi256_pd(_mm256_shuffle_epi8(words_hi, first));
    out[3] = _mm256_castsi256_pd(_mm256_shuffle_epi8(words_hi, second));
}

/* [sum(a), sum(b), sum(c), sum(d)] (exact: the lanes hold integers times a power of two). */
static inline __m256d hsum4_pd(__m256d a, __m256d b, __m256d c, __m256d d) {
    const __m256d ab = _mm256_hadd_pd(a, b), cd = _mm256_hadd_pd(c, d); /* [a01 b01 a23 b23] */
    return _mm256_add_pd(_mm256_permute2f128_pd(ab, cd, 0x20), _mm256_permute2f128_pd(ab, cd, 0x31));
}

/* The block sums are value * 2^-16 (plain) or 2^496 (raised): back to the block's value, then the
 * scalar's block step acc + f32(sum) * (xs * ws) for 4 rows. */
/* kernel_e8m0 of block b's scale of 4 rows: e << 23, 0 -> 2^-127 (0x00400000) by the max, 255 ->
 * the quiet NaN 0x7fc00000 as NAN. */
static inline __m128 e8m0x4(const uint8_t *const ws[4], int b) {
    const __m128i e = _mm_setr_epi32(ws[0][b], ws[1][b], ws[2][b], ws[3][b]);
    const __m128i half = _mm_set1_epi32(0x00400000);
    const __m128i nan = _mm_and_si128(_mm_cmpeq_epi32(e, _mm_set1_epi32(255)), half);
    return _mm_castsi128_ps(_mm_or_si128(_mm_max_epi32(_mm_slli_epi32(e, 23), half), nan));
}

static inline __m128 fp8_block_step(__m128 acc, __m256d block_sum, int raised, float xs, const uint8_t *const ws[4], int b) {
    const __m128 f = _mm256_cvtpd_ps(_mm256_mul_pd(block_sum, _mm256_set1_pd(raised ? 0x1p-496 : 0x1p16)));
    const __m128 w_scale = e8m0x4(ws, b);
    return _mm_add_ps(acc, _mm_mul_ps(f, _mm_mul_ps(_mm_set1_ps(xs), w_scale)));
}

/* y[t][r0 .. r0 + nr) = step(y[t][...], block sums): the running sums live in y. */
static inline void fp8_store_step(float *yt, int nr, __m256d sums, int raised, float xs, const uint8_t *const ws[4], int b) {
    float cur[4] = {0, 0, 0, 0}, out[4];
    for (int i = 0; i < nr; i++) cur[i] = yt[i];
    _mm_storeu_ps(out, fp8_block_step(_mm_loadu_ps(cur), sums, raised, xs, ws, b));
    for (int i = 0; i < nr; i++) yt[i] = out[i];
}

/* Several tokens, 4 rows, blocks [b0, b1): each block is converted once into an L1 tile and used
 * by every token, two at a time (8 FMA chains; the running sums live in y, set to zero with the
 * first block). Converting once makes the raised form's extra instruction cheap, so a listed
 * matrix takes it, its low codes then overwritten in the tile with their exact values: no
 * subnormal operand. */
static inline __attribute__((always_inline)) void fp8_quad_tokens(const fp8_matrix *w, const uint8_t *const wr[4],
                                                                   const uint8_t *const ws[4], const int rows[4], int nr,
                                                                   const double *xd, const float *x_scales, int n_tokens,
                                                                   int b0, int b1, float *y, int y_stride, int r0,
                                                                   int raised) {
    const int cols = w->cols, blocks = cols / FP8_ACT_BLOCK;
    double *tile = kernel_scratch_get(&tile_scratch, 4 * FP8_ACT_BLOCK * sizeof(double));
    uint32_t next_low[4] = {0, 0, 0, 0}, end_low[4] = {0, 0, 0, 0};
    if (raised)
        for (int i = 0; i < 4; i++) kernel_fp8_low_range(w->low, rows[i], b0 * FP8_ACT_BLOCK, &next_low[i], &end_low[i]);
    if (b0 == 0)
        for (int t = 0; t < n_tokens; t++)
            for (int i = 0; i < nr; i++) y[(size_t)t * y_stride + r0 + i] = 0.0f;
    for (int b = b0; b < b1; b++) {
        const size_t off = (size_t)b * FP8_ACT_BLOCK;
        for (int i = 0; i < 4; i++) {
            for (int c = 0; c < FP8_ACT_BLOCK; c += 4) _mm256_store_pd(tile + i * FP8_ACT_BLOCK + c, fp8x4_to_f64(wr[i] + off + c, raised));
            if (raised) kernel_fp8_tile_patch_low(tile + i * FP8_ACT_BLOCK, wr[i], w->low, &next_low[i], end_low[i], (int)off);
        }
        for (int t = 0; t < n_tokens; t += 2) {
            const int pair = t + 1 < n_tokens;
            const double *x0 = xd + (size_t)t * cols + off;
            const double *x1 = pair ? x0 + cols : x0;
            __m256d a00 = _mm256_setzero_pd(), a10 = a00, a20 = a00, a30 = a00, a01 = a00, a11 = a00, a21 = a00,
                    a31 = a00;
            UNROLL(4)
            for (int c = 0; c < FP8_ACT_BLOCK; c += 4) {
                const __m256d xv0 = _mm256_loadu_pd(x0 + c), xv1 = _mm256_loadu_pd(x1 + c);
                const __m256d w0 = _mm256_load_pd(tile + c), w1 = _mm256_load_pd(tile + FP8_ACT_BLOCK + c);
                const __m256d w2 = _mm256_load_pd(tile + 2 * FP8_ACT_BLOCK + c);
                const __m256d w3 = _mm256_load_pd(tile + 3 * FP8_ACT_BLOCK + c);
                a00 = _mm256_fmadd_pd(w0, xv0, a00);
                a10 = _mm256_fmadd_pd(w1, xv0, a10);
                a20 = _mm256_fmadd_pd(w2, xv0, a20);
                a30 = _mm256_fmadd_pd(w3, xv0, a30);
                a01 = _mm256_fmadd_pd(w0, xv1, a01);
                a11 = _mm256_fmadd_pd(w1, xv1, a11);
                a21 = _mm256_fmadd_pd(w2, xv1, a21);
                a31 = _mm256_fmadd_pd(w3, xv1, a31);
            }
            fp8_store_step(y + (size_t)t * y_stride + r0, nr, hsum4_pd(a00, a10, a20, a30), raised,
                           x_scales[(size_t)t * blocks + b], ws, b);
            if (pair)
                fp8_store_step(y + (size_t)(t + 1) * y_stride + r0, nr, hsum4_pd(a01, a11, a21, a31), raised,
                               x_scales[(size_t)(t + 1) * blocks + b], ws, b);
        }
    }
}

static void avx2_matmul_fp8_prepared(const fp8_matrix *w, const void *act, const float *x_scales, int n_tokens,
                                     float *y, int y_stride, int row_begin, int row_end) {
    const int cols = w->cols, blocks = cols / FP8_ACT_BLOCK;
    if (row_end <= row_begin || n_tokens <= 0) return;
    const double *xd = act;
    if (n_tokens > 1) {
        /* tiles of tokens x columns whose activations stay in L2 while every row quad passes over
         * them (kernel_fp8_tile_shape), the column tiles in order */
        int slice, tile_blocks;
        kernel_fp8_tile_shape(n_tokens, cols, FP8_ACT_BLOCK * sizeof(double), KERNEL_SLICE_FORM_BYTES, 64, &slice, &tile_blocks);
        for (int t0 = 0; t0 < n_tokens; t0 += slice) {
            const int nt = n_tokens - t0 < slice ? n_tokens - t0 : slice;
            for (int b0 = 0; b0 < blocks; b0 += tile_blocks) {
                const int b1 = blocks - b0 < tile_blocks ? blocks : b0 + tile_blocks;
                for (int r0 = row_begin; r0 < row_end; r0 += 4) {
                    const int nr = row_end - r0 < 4 ? row_end - r0 : 4;
                    const uint8_t *wr[4], *ws[4];
                    int rows[4];
                    kernel_fp8_pass_rows(w, r0, nr, 4, rows, wr, ws);
                    if (w->low)
                        fp8_quad_tokens(w, wr, ws, rows, nr, xd + (size_t)t0 * cols, x_scales + (size_t)t0 * blocks, nt,
                                        b0, b1, y + (size_t)t0 * y_stride, y_stride, r0, 1);
                    else
                        fp8_quad_tokens(w, wr, ws, rows, nr, xd + (size_t)t0 * cols, x_scales + (size_t)t0 * blocks, nt,
                                        b0, b1, y + (size_t)t0 * y_stride, y_stride, r0, 0);
                }
            }
        }
        return;
    }
    /* short rows bring the next quad into L2 as a quad is computed (kernel_fp8_decode_next_quad) */
    for (int r0 = row_begin; r0 < row_end; r0 += 4) {
        const int nr = row_end - r0 < 4 ? row_end - r0 : 4;
        const uint8_t *wr[4], *ws[4];
        int rows[4];
        kernel_fp8_pass_rows(w, r0, nr, 4, rows, wr, ws);
        const uint8_t *next_quad = kernel_fp8_decode_next_quad(w, r0, row_end);
        /* one token: the plain form, converted as it is used; the running sums in a register */
        __m128 acc = _mm_setzero_ps();
        for (int b = 0; b < blocks; b++) {
            const size_t off = (size_t)b * FP8_ACT_BLOCK;
            const double *xb = xd + off;
            if (next_quad)
                for (int l = 0; l < 8; l++) _mm_prefetch((const char *)(next_quad + (size_t)b * 512 + 64 * l), _MM_HINT_T1);
            __m256d a[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
            for (int c = 0; c < FP8_ACT_BLOCK; c += 16) {
                UNROLL(4)
                for (int i = 0; i < 4; i++) {
                    __m256d f[4];
                    fp8x16_plain(wr[i] + off + c, f);
                    UNROLL(4)
                    for (int q = 0; q < 4; q++) a[i] = _mm256_fmadd_pd(f[q], _mm256_loadu_pd(xb + c + 4 * q), a[i]);
                }
            }
            const __m256d sums = hsum4_pd(a[0], a[1], a[2], a[3]);
            acc = fp8_block_step(acc, sums, 0, x_scales[b], ws, b);
        }
        float out[4];
        _mm_storeu_ps(out, acc);
        for (int i = 0; i < nr; i++) y[r0 + i] = out[i];
    }
}

/* --- FP8 x FP8 with 8 or more tokens: int16 dot products (VPMADDWD) ---
 *
 * The AVX-512 variant's words form (kernels_avx512.c states the method and its bounds; the layout
 * is kernel_fp8_words_form) with 8-row lanes: S = 256 A + 16 B + C with A = sum wh xh, B = sum wh
 * xl + sum wl xh, C = sum wl xl, each pair product VPMADDWD + VPADDD (16 products per pair of
 * instructions against the f64 FMA's 4). Codes become words by F16C instead of a word permute:
 * the f16 with bits (c & 0x80) << 8 | (c & 0x7f) << 7 is the e4m3 value times 2^-8 exactly
 * (subnormals included, the exponent field simply wider), so VCVTPH2PS and a multiply by 2^17
 * give k, and k & 15 decides between hi = k / 16 and lo = k.
 *
 * From 8 tokens (12 at first): below, the conversion of a tile (about 2 instructions per code, 8
 * rows x 128 codes) costs more than the tokens' dot products save, and the f64 form converts 4
 * times cheaper. 4096 x 4096, 1 thread, Gaussian activations and weights quantized per 128 x 128
 * block, ms per token, f64 against words (`bench_kernels --several-tokens 2,3,4,6,8,12,16`, three
 * alternating runs on an AMD EPYC with AVX2): 4 tokens 1.61-1.84 against 2.38-3.22, 8 tokens
 * 1.38-1.56 against 1.48-1.99, 12 tokens 1.30-2.05 against 1.17-1.59, 16 tokens 1.35-2.07 against
 * 1.03-1.39; 256 tokens 1.45-1.89 against 0.65-0.76. Since the words form's passes of 3 tiles
 * (`--several-tokens 4,6,8,10,12 --best 10`, three alternating runs, AMD EPYC Zen 5): 6 tokens
 * 0.909-0.947 against 0.957-1.044, 8 tokens 0.845-0.884 against 0.774-0.831, 10 tokens
 * 0.795-0.822 against 0.661-0.719. */
#define FP8_WORDS_MIN 8

/* 16 codes -> their 16 hi and 16 lo words, in order. */
static inline __attribute__((always_inline)) void fp8_codes16_to_words(const uint8_t *src, __m256i *hi, __m256i *lo) {
    const __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)src));
    const __m256i magnitude = _mm256_slli_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x7f)), 7);
    const __m256i h16 = _mm256_or_si256(magnitude, _mm256_slli_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x80)), 8));
    __m256i h32[2], l32[2];
    UNROLL(2)
    for (int i = 0; i < 2; i++) {
        const __m128i half = i ? _mm256_extracti128_si256(h16, 1) : _mm256_castsi256_si128(h16);
        const __m256i k = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_cvtph_ps(half), _mm256_set1_ps(0x1p17f)));
        const __m256i divisible = _mm256_cmpeq_epi32(_mm256_and_si256(k, _mm256_set1_epi32(15)), _mm256_setzero_si256());
        h32[i] = _mm256_and_si256(divisible, _mm256_srai_epi32(k, 4));
        l32[i] = _mm256_andnot_si256(divisible, k);
    }
    /* packs works per 128-bit lane: [0-3, 8-11, 4-7, 12-15] back in order by the qword permute */
    *hi = _mm256_permute4x64_epi64(_mm256_packs_epi32(h32[0], h32[1]), 0xd8);
    *lo = _mm256_permute4x64_epi64(_mm256_packs_epi32(l32[0], l32[1]), 0xd8);
}

static void fp8_words_prepare(const uint8_t *x_codes, int n_tokens, int cols, void *act) {
    const int blocks = cols / FP8_ACT_BLOCK;
    const size_t token_blocks = (size_t)n_tokens * blocks;
    int16_t *words = act; /* the layout of kernel_fp8_words_form, written here */
    uint64_t *masks = (uint64_t *)((uint8_t *)act + token_blocks * KERNEL_FP8_WORDS_BLOCK_BYTES);
    double *norms = (double *)(masks + token_blocks);
    for (size_t tb = 0; tb < token_blocks; tb++) {
        const uint8_t *xc = x_codes + tb * FP8_ACT_BLOCK; /* token t's block b is block t * blocks + b */
        int16_t *hi = words + tb * (2 * FP8_ACT_BLOCK), *lo = hi + FP8_ACT_BLOCK;
        uint64_t m = 0;
        __m256i n2 = _mm256_setzero_si256(); /* int64 lanes: sums of pair sums <= 2 * 14336^2 */
        for (int q = 0; q < FP8_ACT_BLOCK / 16; q++) {
            __m256i h, l;
            fp8_codes16_to_words(xc + 16 * q, &h, &l);
            _mm256_storeu_si256((__m256i *)(hi + 16 * q), h);
            _mm256_storeu_si256((__m256i *)(lo + 16 * q), l);
            const __m256i no_lo = _mm256_cmpeq_epi32(l, _mm256_setzero_si256());
            m |= (uint64_t)(~_mm256_movemask_ps(_mm256_castsi256_ps(no_lo)) & 0xff) << (8 * q);
            const __m256i sq = _mm256_madd_epi16(h, h);
            n2 = _mm256_add_epi64(n2, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(sq)));
            n2 = _mm256_add_epi64(n2, _mm256_cvtepi32_epi64(_mm256_extracti128_si256(sq, 1)));
        }
        int64_t lanes[4];
        _mm256_storeu_si256((__m256i *)lanes, n2);
        masks[tb] = m;
        norms[tb] = (double)(lanes[0] + lanes[1] + lanes[2] + lanes[3]);
    }
}

/* The 8 rows' block at column off -> wh[j], wl[j] lane r = row r's hi / lo word pair j; returns
 * the mask of the pairs where some row has a lo (wl written only when it is nonzero), and in
 * *norm2 the largest row |w_hi|_2^2 (f32 sums of exact pair sums: relative error below 2^-17). */
static inline __attribute__((always_inline)) uint64_t fp8_words_tile8(const uint8_t *const wr[8], size_t off, __m256i *wh,
                                                                      __m256i *wl, float *norm2) {
    uint64_t mask = 0;
    __m256 n2 = _mm256_setzero_ps();
    for (int q = 0; q < FP8_ACT_BLOCK / 16; q++) {
        __m256i h[8], l[8], any = _mm256_setzero_si256();
        UNROLL(8)
        for (int r = 0; r < 8; r++) {
            fp8_codes16_to_words(wr[r] + off + 16 * q, &h[r], &l[r]);
            any = _mm256_or_si256(any, l[r]);
        }
        transpose8x8(h);
        UNROLL(8)
        for (int j = 0; j < 8; j++) {
            _mm256_store_si256(&wh[8 * q + j], h[j]);
            n2 = _mm256_add_ps(n2, _mm256_cvtepi32_ps(_mm256_madd_epi16(h[j], h[j]))); /* pair sums <= 2 * 14336^2 */
        }
        if (!_mm256_testz_si256(any, any)) {
            transpose8x8(l);
            for (int j = 0; j < 8; j++) {
                _mm256_store_si256(&wl[8 * q + j], l[j]);
                if (!_mm256_testz_si256(l[j], l[j])) mask |= 1ull << (8 * q + j);
            }
        }
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, n2);
    float mx = lanes[0];
    for (int i = 1; i < 8; i++) mx = lanes[i] > mx ? lanes[i] : mx;
    *norm2 = mx;
    return mask;
}

static inline __m256i words_madd_add(__m256i acc, __m256i w, const int32_t *x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(w, _mm256_set1_epi32(*x)));
}

/* A of one token's block with int32 sums of 4 pairs (8 products per lane, below 2^31) added in
 * f64: exact for any codes. */
static __attribute__((noinline)) void fp8_words_wide_a8(const __m256i *wh, const int32_t *xh, __m256d a_out[2]) {
    __m256d lo = _mm256_setzero_pd(), hi = lo;
    for (int g = 0; g < FP8_ACT_BLOCK / 2; g += 4) {
        __m256i s = _mm256_setzero_si256();
        for (int j = g; j < g + 4; j++) s = words_madd_add(s, wh[j], &xh[j]);
        lo = _mm256_add_pd(lo, _mm256_cvtepi32_pd(_mm256_castsi256_si128(s)));
        hi = _mm256_add_pd(hi, _mm256_cvtepi32_pd(_mm256_extracti128_si256(s, 1)));
    }
    a_out[0] = lo;
    a_out[1] = hi;
}

/* The activation lows' share of one token's block: B += wh xl, C += wl xl over the pairs in x_mask. */
static __attribute__((noinline)) void fp8_words_x_lows8(const __m256i *wh, const __m256i *wl, uint64_t w_mask,
                                                       const int32_t *xl, uint64_t x_mask, __m256i *b, __m256i *c) {
    __m256i B = *b, C = *c;
    for (uint64_t m = x_mask; m; m &= m - 1) {
        const int j = __builtin_ctzll(m);
        B = words_madd_add(B, wh[j], &xl[j]);
    }
    for (uint64_t m = w_mask & x_mask; m; m &= m - 1) {
        const int j = __builtin_ctzll(m);
        C = words_madd_add(C, wl[j], &xl[j]);
    }
    *b = B;
    *c = C;
}

/* f32 of a narrow block's value S * 2^-18, S = 256 A + 16 B + C, exact for any low terms: one FMA
 * of 256 f32(A') and the exact rest, A' = A + (B >> 4) (kernels_avx512.c,
 * fp8_words_block_value_exact, states the bounds). */
static inline __m256 fp8_words_value_exact8(__m256i A, __m256i B, __m256i C) {
    const __m256i a = _mm256_add_epi32(A, _mm256_srai_epi32(B, 4));
    const __m256i rest = _mm256_add_epi32(_mm256_slli_epi32(_mm256_and_si256(B, _mm256_set1_epi32(15)), 4), C);
    const __m256 fa = _mm256_cvtepi32_ps(a);
    const __m256i r = _mm256_sub_epi32(a, _mm256_cvtps_epi32(fa)); /* fa is an integer: converts back exactly */
    const __m256 e = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_slli_epi32(r, 8), rest));
    return _mm256_mul_ps(_mm256_fmadd_ps(fa, _mm256_set1_ps(256.0f), e), _mm256_set1_ps(0x1p-18f));
}

/* f32 of a block's value (S * 2^-18) from A (as f64 halves) and the int32 low terms: S exact in
 * f64 (below 2^43), rounded to f32 once. */
static inline __m256 fp8_words_value8(const __m256d A[2], __m256i B, __m256i C) {
    __m128 half[2];
    UNROLL(2)
    for (int h = 0; h < 2; h++) {
        const __m256d b = _mm256_cvtepi32_pd(h ? _mm256_extracti128_si256(B, 1) : _mm256_castsi256_si128(B));
        const __m256d c = _mm256_cvtepi32_pd(h ? _mm256_extracti128_si256(C, 1) : _mm256_castsi256_si128(C));
        const __m256d sum = _mm256_fmadd_pd(A[h], _mm256_set1_pd(256.0), _mm256_fmadd_pd(b, _mm256_set1_pd(16.0), c));
        half[h] = _mm256_cvtpd_ps(_mm256_mul_pd(sum, _mm256_set1_pd(0x1p-18)));
    }
    return _mm256_insertf128_ps(_mm256_castps128_ps256(half[0]), half[1], 1);
}

/* The block value of a token outside fp8_words_tokens8's in-line case: every activation-low pair's
 * terms, then the exact f32 form, or where A may not fit int32 (wide) the f64 form with A again
 * from narrow int32 sums. B holds the weight lows' part. */
static __attribute__((noinline)) __m256 fp8_words_value_general8(const __m256i *wh, const __m256i *wl, uint64_t w_mask,
                                                                  int wide, __m256i A, __m256i B, const int32_t *xh,
                                                                  uint64_t x_mask) {
    __m256i C = _mm256_setzero_si256();
    if (x_mask) fp8_words_x_lows8(wh, wl, w_mask, xh + FP8_ACT_BLOCK / 2, x_mask, &B, &C);
    if (!wide) return fp8_words_value_exact8(A, B, C);
    __m256d Ad[2];
    fp8_words_wide_a8(wh, xh, Ad);
    return fp8_words_value8(Ad, B, C);
}

/* One 8-row tile of a pass (fp8_words_matmul8): its converted block and what fp8_words_tile8 found. */
typedef struct fp8_pass_tile8 {
    __m256i *wh, *wl; /* the block's hi and lo pair vectors (wl read only where w_mask says) */
    uint64_t w_mask;
    float w_norm2;
    __m256 w_scale;
} fp8_pass_tile8;

/* Tiles per pass and tokens per step: each broadcast activation pair feeds the products of 3
 * tiles, each loaded weight vector those of 2 tokens (6 accumulators, 3 weight vectors: room in
 * the 16 registers). One tile of 4 tokens (a broadcast per product) took 0.2836-0.2954 ms per token
 * against 0.2472-0.2637 (4096 x 4096, 256 tokens, 1 thread, three alternating runs of
 * `bench_kernels --quick --several-tokens 16,64,256 --best 10`, AMD EPYC Zen 5; 64 tokens
 * 0.3067-0.3131 against 0.2752-0.2882); 2 x 3, 3 x 3 and 4 x 2 measured within those, 2 x 4
 * spilled its accumulators and took 0.43-0.44. */
#define FP8_WORDS8_PASS_TILES 3
#define FP8_WORDS8_STEP_TOKENS 2

/* T tokens from t of the slice over R converted tiles: sums[u][k] += block value * (xs *
 * ws) (the pass's running sums of token t + u, 8 floats per tile, FP8_WORDS8_PASS_TILES tiles per
 * token, contiguous). */
static inline __attribute__((always_inline)) void fp8_words_tokens8(const int R, const int T, const fp8_pass_tile8 *tiles,
                                                                    const int16_t *words, const uint64_t *masks,
                                                                    const double *norms, const float *x_scales, int blocks,
                                                                    int b, int t, float *sums) {
    const int32_t *xh[FP8_WORDS8_STEP_TOKENS];
    uint64_t xm[FP8_WORDS8_STEP_TOKENS];
    for (int u = 0; u < T; u++) {
        xh[u] = (const int32_t *)(words + ((size_t)(t + u) * blocks + b) * (2 * FP8_ACT_BLOCK));
        xm[u] = masks[(size_t)(t + u) * blocks + b];
    }
    __m256i a[FP8_WORDS8_PASS_TILES * FP8_WORDS8_STEP_TOKENS];
    UNROLL(8)
    for (int i = 0; i < R * T; i++) a[i] = _mm256_setzero_si256();
    UNROLL(16)
    for (int j = 0; j < FP8_ACT_BLOCK / 2; j++) {
        __m256i wj[FP8_WORDS8_PASS_TILES];
        UNROLL(4)
        for (int k = 0; k < R; k++) wj[k] = _mm256_load_si256(&tiles[k].wh[j]);
        UNROLL(4)
        for (int u = 0; u < T; u++) {
            const __m256i xb = _mm256_set1_epi32(xh[u][j]);
            UNROLL(4)
            for (int k = 0; k < R; k++) a[k * T + u] = _mm256_add_epi32(a[k * T + u], _mm256_madd_epi16(wj[k], xb));
        }
    }
    UNROLL(4)
    for (int k = 0; k < R; k++) {
        const fp8_pass_tile8 *tk = &tiles[k];
        /* the weight lows' part of B, each listed pair's vector loaded once for the group */
        __m256i B[FP8_WORDS8_STEP_TOKENS];
        UNROLL(4)
        for (int u = 0; u < T; u++) B[u] = _mm256_setzero_si256();
        for (uint64_t m = tk->w_mask; m; m &= m - 1) {
            const int j = __builtin_ctzll(m);
            const __m256i wlj = _mm256_load_si256(&tk->wl[j]);
            UNROLL(4)
            for (int u = 0; u < T; u++) B[u] = words_madd_add(B[u], wlj, &xh[u][j]);
        }
        /* As kernels_avx512.c's fp8_words_tokens: the exact f32 form in line for a narrow token
         * with at most one pair of activation lows, the rest out of line (fp8_words_value_general8). */
        UNROLL(4)
        for (int u = 0; u < T; u++) {
            const __m256i A = a[k * T + u];
            const double x_norm2 = norms[(size_t)(t + u) * blocks + b];
            const int narrow = !kernel_fp8_words_wide(tk->w_norm2, x_norm2);
            __m256 f;
            if (narrow && !(xm[u] & (xm[u] - 1))) {
                /* without activation lows pair 63, whose lo words are zero then (the form writes
                 * every lo word, zeros included): both terms vanish */
                const int j0 = __builtin_ctzll(xm[u] | 1ull << 63);
                const int32_t *x0 = xh[u] + FP8_ACT_BLOCK / 2 + j0;
                /* the weight lows of pair j0 where w_mask lists them, else zero (wl is not written there) */
                const __m256i w_low = _mm256_set1_epi32(-(int)((tk->w_mask >> j0) & 1));
                const __m256i C =
                    _mm256_madd_epi16(_mm256_and_si256(_mm256_load_si256(&tk->wl[j0]), w_low), _mm256_set1_epi32(*x0));
                f = fp8_words_value_exact8(A, words_madd_add(B[u], tk->wh[j0], x0), C);
            } else {
                f = fp8_words_value_general8(tk->wh, tk->wl, tk->w_mask, !narrow, A, B[u], xh[u], xm[u]);
            }
            const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(x_scales[(size_t)(t + u) * blocks + b]), tk->w_scale);
            float *st = sums + ((size_t)u * FP8_WORDS8_PASS_TILES + k) * 8;
            _mm256_storeu_ps(st, _mm256_add_ps(_mm256_loadu_ps(st), _mm256_mul_ps(f, scale)));
        }
    }
}

/* The tokens [t0, t1) of the slice over R tiles, FP8_WORDS8_STEP_TOKENS at a time. */
static inline __attribute__((always_inline)) void fp8_words_pass8(const int R, const fp8_pass_tile8 *tiles,
                                                                  const int16_t *words, const uint64_t *masks,
                                                                  const double *norms, const float *x_scales, int blocks,
                                                                  int b, int t0, int t1, float *sums) {
    const size_t token_sums = 8 * FP8_WORDS8_PASS_TILES;
    int t = t0;
    for (; t + FP8_WORDS8_STEP_TOKENS <= t1; t += FP8_WORDS8_STEP_TOKENS)
        fp8_words_tokens8(R, FP8_WORDS8_STEP_TOKENS, tiles, words, masks, norms, x_scales, blocks, b, t,
                          sums + (size_t)(t - t0) * token_sums);
    for (; t < t1; t++)
        fp8_words_tokens8(R, 1, tiles, words, masks, norms, x_scales, blocks, b, t, sums + (size_t)(t - t0) * token_sums);
}

static void fp8_words_matmul8(const fp8_matrix *w, const void *act, const float *x_scales, int n_tokens, float *y,
                              int y_stride, int row_begin, int row_end) {
    const int cols = w->cols, blocks = cols / FP8_ACT_BLOCK;
    const int16_t *words;
    const uint64_t *masks;
    const double *norms;
    kernel_fp8_words_form(act, n_tokens, cols, &words, &masks, &norms);
    /* per tile of a pass: 64 hi then 64 lo pair vectors */
    __m256i *tile_words = kernel_scratch_get(&tile_scratch, FP8_WORDS8_PASS_TILES * FP8_ACT_BLOCK * sizeof(__m256i));
    int slice, tile_blocks;
    kernel_fp8_tile_shape(n_tokens, cols, KERNEL_FP8_WORDS_BLOCK_BYTES, KERNEL_SLICE_FORM_BYTES, 128, &slice, &tile_blocks);
    const size_t token_sums = 8 * FP8_WORDS8_PASS_TILES;
    float *sums = kernel_scratch_get(&row_sums_scratch, (size_t)slice * token_sums * sizeof(float));
    for (int t0 = 0; t0 < n_tokens; t0 += slice) {
        const int nt = n_tokens - t0 < slice ? n_tokens - t0 : slice;
        for (int b0 = 0; b0 < blocks; b0 += tile_blocks) {
            const int b1 = blocks - b0 < tile_blocks ? blocks : b0 + tile_blocks;
            /* Passes of up to 3 row groups of 8 (a shorter last pass goes one group at a time); a
             * short last group repeats its last row (computed, not stored). */
            for (int p0 = row_begin; p0 < row_end; p0 += 8 * FP8_WORDS8_PASS_TILES) {
                const int pass_rows = row_end - p0 < 8 * FP8_WORDS8_PASS_TILES ? row_end - p0 : 8 * FP8_WORDS8_PASS_TILES;
                const int R = (pass_rows + 7) / 8;
                fp8_pass_tile8 tiles[FP8_WORDS8_PASS_TILES];
                const uint8_t *wr[FP8_WORDS8_PASS_TILES][8], *ws[FP8_WORDS8_PASS_TILES][8];
                __m256i store[FP8_WORDS8_PASS_TILES];
                for (int k = 0; k < R; k++) {
                    const int r0 = p0 + 8 * k, nr = row_end - r0 < 8 ? row_end - r0 : 8;
                    int rows[8];
                    kernel_fp8_pass_rows(w, r0, nr, 8, rows, wr[k], ws[k]);
                    store[k] = lanes_below8(nr);
                    tiles[k].wh = tile_words + (size_t)k * FP8_ACT_BLOCK;
                    tiles[k].wl = tiles[k].wh + FP8_ACT_BLOCK / 2;
                }
                /* the slice's running sums of these rows, contiguous for the column tile: y's rows
                 * of the tokens lie a power of two apart, in the same cache sets */
                for (int t = 0; t < nt; t++)
                    for (int k = 0; k < R; k++)
                        _mm256_storeu_ps(sums + (size_t)t * token_sums + 8 * k,
                                         b0 == 0 ? _mm256_setzero_ps()
                                                 : masked_load8(y + (size_t)(t0 + t) * y_stride + p0 + 8 * k, store[k]));
                for (int b = b0; b < b1; b++) {
                    for (int k = 0; k < R; k++) {
                        fp8_pass_tile8 *tk = &tiles[k];
                        tk->w_mask = fp8_words_tile8(wr[k], (size_t)b * FP8_ACT_BLOCK, tk->wh, tk->wl, &tk->w_norm2);
                        float wsf[8];
                        for (int i = 0; i < 8; i++) wsf[i] = kernel_e8m0(ws[k][i][b]);
                        tk->w_scale = _mm256_loadu_ps(wsf);
                    }
                    if (R == FP8_WORDS8_PASS_TILES)
                        fp8_words_pass8(FP8_WORDS8_PASS_TILES, tiles, words, masks, norms, x_scales, blocks, b, t0, t0 + nt, sums);
                    else
                        for (int k = 0; k < R; k++)
                            fp8_words_pass8(1, &tiles[k], words, masks, norms, x_scales, blocks, b, t0, t0 + nt, sums + 8 * k);
                }
                for (int t = 0; t < nt; t++)
                    for (int k = 0; k < R; k++)
                        masked_store8(y + (size_t)(t0 + t) * y_stride + p0 + 8 * k, store[k],
                                      _mm256_loadu_ps(sums + (size_t)t * token_sums + 8 * k));
            }
        }
    }
}

static size_t avx2_fp8_act_bytes(int n_tokens, int cols) {
    return n_tokens >= FP8_WORDS_MIN ? kernel_fp8_words_bytes(n_tokens, cols) : kernel_fp8_f64_act_bytes(n_tokens, cols);
}

static void avx2_fp8_act_prepare(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols, void *act) {
    if (n_tokens >= FP8_WORDS_MIN)
        fp8_words_prepare(x_codes, n_tokens, cols, act);
    else
        kernel_fp8_f64_act_prepare(x_codes, x_scales, n_tokens, cols, act);
}

static void avx2_fp8_prepared(const fp8_matrix *w, const void *act, const float *x_scales, int n_tokens, float *y,
                              int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    if (n_tokens >= FP8_WORDS_MIN)
        fp8_words_matmul8(w, act, x_scales, n_tokens, y, y_stride, row_begin, row_end);
    else
        avx2_matmul_fp8_prepared(w, act, x_scales, n_tokens, y, y_stride, row_begin, row_end);
}

static void avx2_matmul_fp8(const fp8_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                            int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    void *act = kernel_scratch_get(&act_scratch, avx2_fp8_act_bytes(n_tokens, w->cols));
    avx2_fp8_act_prepare(x_codes, x_scales, n_tokens, w->cols, act);
    avx2_fp8_prepared(w, act, x_scales, n_tokens, y, y_stride, row_begin, row_end);
}

/* ---------------------------------------------------------------------------------------------
 * Float products: 8 rows x 32 bytes tiles transposed in registers. */

static inline __attribute__((always_inline)) void tile_to_columns(float_kind kind, const __m256i r[8], __m256 ws, int ndw,
                                                                   __m256 *dst) {
    if (kind == FLOAT_F32) {
        UNROLL(8)
        for (int j = 0; j < 8; j++)
            if (j < ndw) dst[j] = _mm256_castsi256_ps(r[j]);
    } else if (kind == FLOAT_BF16) {
        const __m256i high = _mm256_set1_epi32((int)0xffff0000u);
        UNROLL(8)
        for (int j = 0; j < 8; j++)
            if (j < ndw) {
                dst[2 * j] = _mm256_castsi256_ps(_mm256_slli_epi32(r[j], 16));
                dst[2 * j + 1] = _mm256_castsi256_ps(_mm256_and_si256(r[j], high));
            }
    } else {
        const __m256i keep = _mm256_set1_epi32((int)0x87f00000u), top = _mm256_set1_epi32((int)0xff000000u);
        const __m256 up = _mm256_set1_ps(0x1p120f);
        UNROLL(8)
        for (int j = 0; j < 8; j++)
            if (j < ndw) {
                UNROLL(4)
                for (int k = 0; k < 4; k++) {
                    const __m256i b = k == 3 ? r[j] : _mm256_slli_epi32(r[j], 24 - 8 * k);
                    const __m256i bits = _mm256_and_si256(_mm256_srai_epi32(_mm256_and_si256(b, top), 4), keep);
                    dst[4 * j + k] = _mm256_mul_ps(_mm256_mul_ps(_mm256_castsi256_ps(bits), up), ws);
                }
            }
    }
}

static inline __attribute__((always_inline)) void load_tile8(const uint8_t *const rows[8], size_t off, int avail,
                                                             __m256i r[8]) {
    if (avail >= 32) {
        UNROLL(8)
        for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_si256((const __m256i *)(rows[i] + off));
    } else {
        for (int i = 0; i < 8; i++) {
            uint8_t tmp[32] = {0};
            memcpy(tmp, rows[i] + off, (size_t)(avail > 0 ? avail : 0));
            r[i] = _mm256_loadu_si256((const __m256i *)tmp);
        }
    }
}



/* One column of 8 rows of a MATRIX_GROUPS16 group as f32 (bf16 exactly; FP8 as value * 2^-120,
 * the e4m3 fields in an f32's: sign to 31, exponent and mantissa to 26..20). */
static inline __attribute__((always_inline)) __m256 group_column8(float_kind kind, const uint8_t *p) {
    if (kind == FLOAT_F32) return _mm256_loadu_ps((const float *)p);
    if (kind == FLOAT_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    const __m256i d = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(d, 20), _mm256_set1_epi32((int)0x87f00000u)));
}

/* Lanes [lo, hi) of the 8 rows from gr that lie in [row_begin, row_end). */
static inline __m256i rows_store_mask(int gr, int row_begin, int row_end) {
    const int lo = row_begin > gr ? row_begin - gr : 0, hi = row_end - gr < 8 ? row_end - gr : 8;
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_and_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(hi), idx),
                            _mm256_cmpgt_epi32(_mm256_add_epi32(idx, _mm256_set1_epi32(1)), _mm256_set1_epi32(lo)));
}

#define FLOAT_GROUPS 4

static inline __attribute__((always_inline)) void float_matmul(const float_matrix *m, const float *x, int x_stride,
                                                               int n_tokens, float *y, int y_stride, int row_begin,
                                                               int row_end) {
    const int vpd = m->kind == FLOAT_F32 ? 1 : m->kind == FLOAT_BF16 ? 2 : 4;
    const int elem_bytes = 4 / vpd;
    const size_t total_bytes = (size_t)m->cols * elem_bytes;
    /* 32 columns per tile whatever the element size (one 8 x 8 dword tile for FP8, two for bf16,
     * four for f32), so that each token's running sums in y are read and written once per 32
     * columns: with 8-column f32 tiles that traffic, not the products, bounded hc_fn-like shapes
     * at 64 tokens */
    const int cols_per_tile = 32, cols_per_load = 8 * vpd;
    const size_t tile_bytes = (size_t)cols_per_tile * elem_bytes;
    const size_t col_bytes = 16 * (size_t)elem_bytes; /* one column of a MATRIX_GROUPS16 group */
    __m256 *cols_tile = kernel_scratch_get(&tile_scratch, (size_t)FLOAT_GROUPS * 32 * sizeof(__m256));
    /* Several tokens: the activations packed tile by tile (kernel_pack_column_tiles) and the
     * running sums of a row block in a scratch of their own ((t * FLOAT_GROUPS + g) * 8), both
     * contiguous. Read in place, the tokens' rows of x and y lie a power of two apart (16 to 128
     * KB), all in the same cache sets, and a block's pass over 256 tokens missed L1 and L2 on
     * nearly every load (wo_a in a 256-token prefill chunk: 22% of the prefill's time). */
    const int tiles = (m->cols + cols_per_tile - 1) / cols_per_tile;
    float *xp = NULL, *sums = NULL;
    if (n_tokens > 1) {
        xp = kernel_scratch_get(&x_pack_scratch, (size_t)tiles * n_tokens * 32 * sizeof(float));
        sums = kernel_scratch_get(&row_sums_scratch, (size_t)n_tokens * FLOAT_GROUPS * 8 * sizeof(float));
        kernel_pack_column_tiles(xp, x, x_stride, n_tokens, m->cols, 32);
    }
    /* grouped: whole groups are read (r0 stays 16-aligned, so 8 rows are half a group) */
    const int start = m->grouped ? row_begin - row_begin % 16 : row_begin;
    for (int r0 = start; r0 < row_end; r0 += 8 * FLOAT_GROUPS) {
        const int rows_here = row_end - r0 < 8 * FLOAT_GROUPS ? row_end - r0 : 8 * FLOAT_GROUPS;
        const int groups = (rows_here + 7) / 8;
        const uint8_t *rows[FLOAT_GROUPS][8], *srow[FLOAT_GROUPS][8];
        __m256i store_mask[FLOAT_GROUPS];
        for (int g = 0; g < groups; g++) {
            const int nr = rows_here - 8 * g < 8 ? rows_here - 8 * g : 8;
            store_mask[g] = rows_store_mask(r0 + 8 * g, row_begin, row_end);
            if (m->grouped) continue;
            for (int i = 0; i < 8; i++) {
                const int r = r0 + 8 * g + (i < nr ? i : nr - 1);
                rows[g][i] = m->data + (size_t)r * m->row_bytes;
                srow[g][i] = m->kind == FLOAT_FP8 ? m->scales + (size_t)(r / 128) * m->scale_cols : NULL;
            }
        }
        __m256 acc[FLOAT_GROUPS];
        for (int g = 0; g < FLOAT_GROUPS; g++) acc[g] = _mm256_setzero_ps();
        if (n_tokens > 1) memset(sums, 0, (size_t)n_tokens * FLOAT_GROUPS * 8 * sizeof(float));
        for (size_t off = 0; off < total_bytes; off += tile_bytes) {
            const int col0 = (int)(off / (size_t)elem_bytes);
            const int ncols = m->cols - col0 < cols_per_tile ? m->cols - col0 : cols_per_tile;
            for (int g = 0; g < groups; g++) {
                __m256 *dst = cols_tile + (size_t)g * 32;
                if (m->grouped) {
                    const int gr = r0 + 8 * g;
                    const uint8_t *p = m->data + ((size_t)(gr / 16) * m->cols + col0) * col_bytes +
                                       (size_t)(gr % 16) * elem_bytes;
                    if (m->kind == FLOAT_FP8) {
                        const __m256 ws =
                            _mm256_set1_ps(kernel_e8m0(m->scales[(size_t)(gr / 128) * m->scale_cols + col0 / 128]));
                        for (int j = 0; j < ncols; j++)
                            dst[j] = _mm256_mul_ps(
                                _mm256_mul_ps(group_column8(FLOAT_FP8, p + j * col_bytes), _mm256_set1_ps(0x1p120f)), ws);
                    } else {
                        for (int j = 0; j < ncols; j++) dst[j] = group_column8(m->kind, p + j * col_bytes);
                    }
                    continue;
                }
                __m256 ws = _mm256_setzero_ps();
                if (m->kind == FLOAT_FP8) { /* a 32-column tile lies within one 128-column scale block */
                    float sc[8];
                    for (int i = 0; i < 8; i++) sc[i] = kernel_e8m0(srow[g][i][col0 / 128]);
                    ws = _mm256_loadu_ps(sc);
                }
                for (int k = 0; k * cols_per_load < ncols; k++) {
                    const size_t sub = off + (size_t)k * 32;
                    const int sub_cols = ncols - k * cols_per_load < cols_per_load ? ncols - k * cols_per_load : cols_per_load;
                    __m256i r[8];
                    load_tile8(rows[g], sub, (int)(total_bytes - sub < 32 ? total_bytes - sub : 32), r);
                    transpose8x8(r);
                    tile_to_columns(m->kind, r, ws, (sub_cols + vpd - 1) / vpd, dst + k * cols_per_load);
                }
            }
            if (n_tokens == 1) {
                const float *xc = x + col0;
                if (groups == FLOAT_GROUPS) {
                    for (int c = 0; c < ncols; c++) {
                        const __m256 xv = _mm256_set1_ps(xc[c]);
                        UNROLL(4)
                        for (int g = 0; g < FLOAT_GROUPS; g++)
                            acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(cols_tile[g * 32 + c], xv));
                    }
                } else {
                    for (int c = 0; c < ncols; c++) {
                        const __m256 xv = _mm256_set1_ps(xc[c]);
                        for (int g = 0; g < groups; g++) acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(cols_tile[g * 32 + c], xv));
                    }
                }
                continue;
            }
            const float *xk = xp + (size_t)(col0 / 32) * n_tokens * 32;
            for (int g = 0; g < groups; g++) {
                const __m256 *col = cols_tile + (size_t)g * 32;
                int t = 0;
                for (; t + 4 <= n_tokens; t += 4) {
                    const float *x0 = xk + (size_t)t * 32, *x1 = x0 + 32, *x2 = x1 + 32, *x3 = x2 + 32;
                    float *s0 = sums + ((size_t)t * FLOAT_GROUPS + g) * 8;
                    const size_t step = FLOAT_GROUPS * 8;
                    __m256 a0 = _mm256_loadu_ps(s0), a1 = _mm256_loadu_ps(s0 + step);
                    __m256 a2 = _mm256_loadu_ps(s0 + 2 * step), a3 = _mm256_loadu_ps(s0 + 3 * step);
                    for (int c = 0; c < ncols; c++) {
                        a0 = _mm256_add_ps(a0, _mm256_mul_ps(col[c], _mm256_set1_ps(x0[c])));
                        a1 = _mm256_add_ps(a1, _mm256_mul_ps(col[c], _mm256_set1_ps(x1[c])));
                        a2 = _mm256_add_ps(a2, _mm256_mul_ps(col[c], _mm256_set1_ps(x2[c])));
                        a3 = _mm256_add_ps(a3, _mm256_mul_ps(col[c], _mm256_set1_ps(x3[c])));
                    }
                    _mm256_storeu_ps(s0, a0);
                    _mm256_storeu_ps(s0 + step, a1);
                    _mm256_storeu_ps(s0 + 2 * step, a2);
                    _mm256_storeu_ps(s0 + 3 * step, a3);
                }
                for (; t < n_tokens; t++) {
                    const float *xt = xk + (size_t)t * 32;
                    float *st = sums + ((size_t)t * FLOAT_GROUPS + g) * 8;
                    __m256 a0 = _mm256_loadu_ps(st);
                    for (int c = 0; c < ncols; c++) a0 = _mm256_add_ps(a0, _mm256_mul_ps(col[c], _mm256_set1_ps(xt[c])));
                    _mm256_storeu_ps(st, a0);
                }
            }
        }
        if (n_tokens > 1)
            for (int t = 0; t < n_tokens; t++)
                for (int g = 0; g < groups; g++)
                    masked_store8(y + (size_t)t * y_stride + r0 + 8 * g, store_mask[g],
                                  _mm256_loadu_ps(sums + ((size_t)t * FLOAT_GROUPS + g) * 8));
        if (n_tokens == 1)
            for (int g = 0; g < groups; g++) masked_store8(y + r0 + 8 * g, store_mask[g], acc[g]);
    }
}

/* Decode (one token) on MATRIX_GROUPS16 weights: NG groups from group g0, two 8-row chains each,
 * the weights converted in registers as they stream in (see the AVX-512 variant for the single
 * FP8 scale multiply). */
#define DECODE_GROUPS 4

static inline __attribute__((always_inline)) void group_decode(const float_matrix *m, const int NG, int g0,
                                                               const float *x, __m256 acc[2 * DECODE_GROUPS]) {
    const float_kind kind = m->kind;
    const size_t col_bytes = 16 * (size_t)float_kind_bytes(kind), half = col_bytes / 2;
    const size_t group_bytes = (size_t)m->cols * col_bytes;
    const uint8_t *base = m->data + (size_t)g0 * group_bytes;
    UNROLL(8)
    for (int g = 0; g < 2 * NG; g++) acc[g] = _mm256_setzero_ps();
    for (int c0 = 0; c0 < m->cols; c0 += 128) {
        const int c1 = m->cols - c0 < 128 ? m->cols : c0 + 128;
        const uint8_t *p = base + (size_t)c0 * col_bytes;
        if (kind != FLOAT_FP8) {
            for (int c = c0; c < c1; c++, p += col_bytes) {
                const __m256 xv = _mm256_set1_ps(x[c]);
                UNROLL(4)
                for (int g = 0; g < NG; g++) {
                    acc[2 * g] = _mm256_add_ps(acc[2 * g], _mm256_mul_ps(group_column8(kind, p + g * group_bytes), xv));
                    acc[2 * g + 1] =
                        _mm256_add_ps(acc[2 * g + 1], _mm256_mul_ps(group_column8(kind, p + g * group_bytes + half), xv));
                }
            }
            continue;
        }
        float ws[DECODE_GROUPS];
        int wide = 0, shared = 1;
        UNROLL(4)
        for (int g = 0; g < NG; g++) {
            ws[g] = kernel_e8m0(m->scales[(size_t)((g0 + g) * 16 / 128) * m->scale_cols + c0 / 128]);
            wide |= ws[g] > 0x1p7f;
            shared &= ws[g] == ws[0];
        }
        /* one scale for all the groups: moved onto the activations, as in the AVX-512 variant */
        if (shared && ws[0] >= 0x1p-117f && ws[0] <= 0x1p7f) {
            float xk[128];
            const __m256 kx = _mm256_set1_ps(ws[0] * 0x1p120f), inf = _mm256_set1_ps(INFINITY);
            const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
            int finite = 1;
            int c = c0;
            for (; c + 8 <= c1; c += 8) {
                const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + c), kx);
                finite &= _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v, abs_mask), inf, _CMP_LT_OQ)) == 0xff;
                _mm256_storeu_ps(xk + (c - c0), v);
            }
            for (; c < c1; c++) {
                xk[c - c0] = x[c] * (ws[0] * 0x1p120f);
                finite &= fabsf(xk[c - c0]) < INFINITY;
            }
            if (finite) {
                for (c = c0; c < c1; c++, p += col_bytes) {
                    const __m256 xv = _mm256_set1_ps(xk[c - c0]);
                    UNROLL(4)
                    for (int g = 0; g < NG; g++) {
                        acc[2 * g] = _mm256_add_ps(acc[2 * g], _mm256_mul_ps(group_column8(FLOAT_FP8, p + g * group_bytes), xv));
                        acc[2 * g + 1] = _mm256_add_ps(
                            acc[2 * g + 1], _mm256_mul_ps(group_column8(FLOAT_FP8, p + g * group_bytes + half), xv));
                    }
                }
                continue;
            }
        }
        if (!wide) {
            __m256 k[DECODE_GROUPS];
            UNROLL(4)
            for (int g = 0; g < NG; g++) k[g] = _mm256_set1_ps(ws[g] * 0x1p120f);
            for (int c = c0; c < c1; c++, p += col_bytes) {
                const __m256 xv = _mm256_set1_ps(x[c]);
                UNROLL(4)
                for (int g = 0; g < NG; g++) {
                    const __m256 w0 = _mm256_mul_ps(group_column8(FLOAT_FP8, p + g * group_bytes), k[g]);
                    const __m256 w1 = _mm256_mul_ps(group_column8(FLOAT_FP8, p + g * group_bytes + half), k[g]);
                    acc[2 * g] = _mm256_add_ps(acc[2 * g], _mm256_mul_ps(w0, xv));
                    acc[2 * g + 1] = _mm256_add_ps(acc[2 * g + 1], _mm256_mul_ps(w1, xv));
                }
            }
        } else {
            const __m256 up = _mm256_set1_ps(0x1p120f);
            for (int c = c0; c < c1; c++, p += col_bytes) {
                const __m256 xv = _mm256_set1_ps(x[c]);
                for (int g = 0; g < NG; g++) {
                    const __m256 wsv = _mm256_set1_ps(ws[g]);
                    const __m256 w0 = _mm256_mul_ps(_mm256_mul_ps(group_column8(FLOAT_FP8, p + g * group_bytes), up), wsv);
                    const __m256 w1 =
                        _mm256_mul_ps(_mm256_mul_ps(group_column8(FLOAT_FP8, p + g * group_bytes + half), up), wsv);
                    acc[2 * g] = _mm256_add_ps(acc[2 * g], _mm256_mul_ps(w0, xv));
                    acc[2 * g + 1] = _mm256_add_ps(acc[2 * g + 1], _mm256_mul_ps(w1, xv));
                }
            }
        }
    }
}

static inline __attribute__((always_inline)) void grouped_decode(const float_matrix *m, const float *x, float *y,
                                                                 int row_begin, int row_end) {
    const int g_end = (row_end + 15) / 16;
    for (int g = row_begin / 16; g < g_end;) {
        const int left = g_end - g, ng = left >= 4 ? 4 : left >= 2 ? 2 : 1;
        __m256 acc[2 * DECODE_GROUPS];
        switch (ng) {
        case 4: group_decode(m, 4, g, x, acc); break;
        case 2: group_decode(m, 2, g, x, acc); break;
        default: group_decode(m, 1, g, x, acc); break;
        }
        for (int i = 0; i < 2 * ng; i++)
            masked_store8(y + (size_t)(g * 16 + 8 * i), rows_store_mask(g * 16 + 8 * i, row_begin, row_end), acc[i]);
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

static void avx2_matmul_bf16(const bf16_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                             int row_begin, int row_end) {
    const float_matrix m = float_matrix_bf16(w);
    float_product(&m, w->rows, w->layout, x, x_stride, n_tokens, y, y_stride, row_begin, row_end);
}

static void avx2_matmul_f32(const f32_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                            int row_begin, int row_end) {
    const float_matrix m = float_matrix_f32(w);
    float_product(&m, w->rows, MATRIX_ROWS, x, x_stride, n_tokens, y, y_stride, row_begin, row_end);
}

static void avx2_matmul_fp8_dequant(const fp8_matrix *w, const float *x, int x_stride, int n_tokens, float *y,
                                    int y_stride, int row_begin, int row_end) {
    const float_matrix m = float_matrix_fp8(w);
    float_product(&m, w->rows, w->layout, x, x_stride, n_tokens, y, y_stride, row_begin, row_end);
}

/* 2 heads x 32 outputs of sums in registers across all the rows (each row's product and add in
 * row order, as the scalar), then y * rescale + s; each row vector loaded serves both heads; the
 * last n % 8 outputs as the scalar. The first nh (1, 2) of the 2 heads are used. fused (a constant
 * after inlining): one FMA per product (the caller knows every product exact: the same bits). */
#define ROWS_ADD_HEADS 2
#define ROWS_ADD_VECTORS 4
static inline __attribute__((always_inline)) void weighted_rows_pass(float *y, const float *rescale, const float *a,
                                                                     int a_stride, const float *const *rows,
                                                                     int n_rows, int n, int i0, int nv, int nh,
                                                                     int fused) {
    __m256 acc[ROWS_ADD_HEADS][ROWS_ADD_VECTORS];
    UNROLL(2)
    for (int h = 0; h < ROWS_ADD_HEADS; h++)
        UNROLL(4)
        for (int v = 0; v < ROWS_ADD_VECTORS; v++) acc[h][v] = _mm256_setzero_ps();
    for (int j = 0; j < n_rows; j++) {
        const float *x = rows[j] + i0;
        __m256 xv[ROWS_ADD_VECTORS];
        UNROLL(4)
        for (int v = 0; v < ROWS_ADD_VECTORS; v++) xv[v] = v < nv ? _mm256_loadu_ps(x + 8 * v) : _mm256_setzero_ps();
        UNROLL(2)
        for (int h = 0; h < ROWS_ADD_HEADS; h++) {
            if (h >= nh) break;
            const __m256 av = _mm256_set1_ps(a[(size_t)h * a_stride + j]);
            UNROLL(4)
            for (int v = 0; v < ROWS_ADD_VECTORS; v++)
                acc[h][v] = fused ? _mm256_fmadd_ps(av, xv[v], acc[h][v]) : _mm256_add_ps(acc[h][v], _mm256_mul_ps(av, xv[v]));
        }
    }
    UNROLL(2)
    for (int h = 0; h < ROWS_ADD_HEADS; h++) {
        if (h >= nh) break;
        const __m256 rs = _mm256_set1_ps(rescale[h]);
        float *yh = y + (size_t)h * n + i0;
        UNROLL(4)
        for (int v = 0; v < ROWS_ADD_VECTORS; v++)
            if (v < nv) _mm256_storeu_ps(yh + 8 * v, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(yh + 8 * v), rs), acc[h][v]));
    }
}

static void avx2_rescale_add_weighted_rows_f32(float *y, const float *rescale, const float *a, int a_stride,
                                               int n_heads, const float *const *rows, int n_rows, int n,
                                               int products_exact) {
    for (int h0 = 0; h0 < n_heads; h0 += ROWS_ADD_HEADS) {
        const int nh = n_heads - h0 < ROWS_ADD_HEADS ? n_heads - h0 : ROWS_ADD_HEADS;
        float *yh = y + (size_t)h0 * n;
        const float *ah = a + (size_t)h0 * a_stride;
        for (int i0 = 0; i0 + 8 <= n; i0 += 8 * ROWS_ADD_VECTORS) {
            const int nv = (n - i0) / 8 < ROWS_ADD_VECTORS ? (n - i0) / 8 : ROWS_ADD_VECTORS;
            if (products_exact)
                weighted_rows_pass(yh, rescale + h0, ah, a_stride, rows, n_rows, n, i0, nv, nh, 1);
            else
                weighted_rows_pass(yh, rescale + h0, ah, a_stride, rows, n_rows, n, i0, nv, nh, 0);
        }
        for (int h = 0; h < nh; h++)
            rescale_add_weighted_rows_range(yh + (size_t)h * n, rescale[h0 + h], ah + (size_t)h * a_stride, rows, n_rows,
                                            n - n % 8, n);
    }
}

/* Activation quantization: the AVX-512 variant's steps (kernels_avx512.c states them against the
 * scalar) on 8 lanes. MAXPS keeps its second operand when either is NaN, so max(|x|, amax) skips
 * NaN as fmaxf does, and max(q, -448) is -448 for a NaN q; below 2^-6 the code is rint(|q| * 2^9),
 * rounded to nearest even by ROUNDPS whatever the MXCSR mode. */
static void avx2_quantize_fp8_act(const float *x, int n, uint8_t *codes, float *scales) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    /* byte 0 of each dword to the low bytes of its 128-bit lane, then the two lanes' dwords 0 */
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1,
                                          -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i join = _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1);
    for (int b = 0; b < n / FP8_ACT_BLOCK; b++) {
        const float *xb = x + (size_t)b * FP8_ACT_BLOCK;
        __m256 amax = _mm256_setzero_ps();
        for (int i = 0; i < FP8_ACT_BLOCK; i += 8) amax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + i), abs_mask), amax);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float s = pow2_scale_ceil(fmaxf(_mm_cvtss_f32(m4), 1e-4f), 1.0f / 448.0f);
        scales[b] = s;
        const __m256 sv = _mm256_set1_ps(s);
        for (int i = 0; i < FP8_ACT_BLOCK; i += 8) {
            __m256 q = _mm256_div_ps(_mm256_loadu_ps(xb + i), sv);
            q = _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(-448.0f)), _mm256_set1_ps(448.0f));
            const __m256i bits = _mm256_castps_si256(q);
            const __m256i mag = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
            const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(mag, 20), _mm256_set1_epi32(1));
            const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(mag, _mm256_set1_epi32(0x7ffff)), lsb), 20);
            const __m256i normal = _mm256_sub_epi32(rounded, _mm256_set1_epi32((127 - 7) << 3));
            const __m256 a = _mm256_castsi256_ps(mag);
            const __m256i sub = _mm256_cvttps_epi32(
                _mm256_round_ps(_mm256_mul_ps(a, _mm256_set1_ps(512.0f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            const __m256 tiny = _mm256_cmp_ps(a, _mm256_set1_ps(0x1p-6f), _CMP_LT_OQ);
            __m256i code = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(normal), _mm256_castsi256_ps(sub), tiny));
            code = _mm256_or_si256(code, _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80)));
            const __m256i packed = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(code, pick), join);
            _mm_storel_epi64((__m128i *)(codes + (size_t)b * FP8_ACT_BLOCK + i), _mm256_castsi256_si128(packed));
        }
    }
}

const kernel_ops kernel_ops_avx2 = {
    .name = "avx2",
    .plain_c_level = KERNELS_PLAIN_C_AVX2,
    .matmul_fp8 = avx2_matmul_fp8,
    .matmul_fp4 = avx2_matmul_fp4,
    .matmul_fp8_dequant = avx2_matmul_fp8_dequant,
    .matmul_bf16 = avx2_matmul_bf16,
    .matmul_f32 = avx2_matmul_f32,
    .rescale_add_weighted_rows_f32 = avx2_rescale_add_weighted_rows_f32,
    .quantize_fp8_act = avx2_quantize_fp8_act,
    .fp8_act_bytes = avx2_fp8_act_bytes,
    .fp8_act_prepare = avx2_fp8_act_prepare,
    .matmul_fp8_prepared = avx2_fp8_prepared,
    .fp4_act_bytes = avx2_fp4_act_bytes,
    .fp4_act_prepare = avx2_fp4_act_prepare,
    .matmul_fp4_prepared = avx2_matmul_fp4_prepared,
};
