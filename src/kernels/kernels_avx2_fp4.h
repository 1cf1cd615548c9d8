/* The AVX2 FP4 x FP8 products, included by kernels_avx2.c and, compiled with AVX-VNNI, by
 * kernels_avxvnni.c (each file gets its own static copy built for its own instructions; with
 * __AVXVNNI__ defined a few instruction pairs become one, on the same integers, so the same bits).
 * Two forms:
 *  - 1 to 3 tokens: row words (below): the weights read as they come, each row's 64 elements
 *    expanded into int16 words against the activation words in the same order, VPMADDWD + VPADDD
 *    (VNNI: VPDPWSSD).
 *  - 4 or more tokens: the AVX-512 variant's words form at half the width (kernels_avx512.c
 *    states the method and its int32 bounds; the activation form is the shared
 *    kernel_fp4_words_prepare): lanes are 8 rows, each half of a 32-block of the group's weights
 *    is converted once into 8 registers of int16 pairs while every token of a slice passes over
 *    it, the token's word pairs broadcast (VPMADDWD + VPADDD; VNNI: VPDPWSSD), so each lane ends
 *    with its own row's block sum and nothing is reduced across lanes. */
#ifndef DS4F_KERNELS_AVX2_FP4_H
#define DS4F_KERNELS_AVX2_FP4_H

#include "kernels/kernels_avx2_inline.h"
#include "kernels/kernels_internal.h"

#include <math.h>
#include <string.h>

static _Thread_local kernel_scratch fp4_act_scratch, fp4_scale_scratch, tokens_tile_scratch;

/* Below 4 tokens a row group's conversion into words is not repaid (the row words form reads the
 * weights as they come instead). */
#define FP4_TOKENS_MIN 4

/* ---------------------------------------------------------------------------------------------
 * 1 to 3 tokens: the weights as they come, 64 elements (32 packed bytes, two 32-blocks) of a row
 * per step, against the row words form (kernel_fp4_row_words_prepare: the words A of each block's
 * window, and L for the few values below it). Two VPSHUFB of the nibbles give the signed weights
 * j = 2 * e2m1 as bytes (e: the low nibbles, o: the high ones); as int16 words, packed word m (the
 * elements 4m..4m+3) then yields 256 j(4m + r) by one shift or one mask: r = 0: e << 8, r = 1:
 * o << 8, r = 2: e & 0xff00, r = 3: o & 0xff00. VPMADDWD of vector r with the form's vector r puts
 * the elements 8L + r and 8L + 4 + r in dword lane L, so the four products' sum has elements
 * 8L..8L+7 in lane L: lanes 0-3 the first block, 4-7 the second. Per step that is 9 instructions
 * to expand and 4 products (VNNI: VPDPWSSD adds them in place) instead of 5 per activation plane
 * (usually 3 or 4) of the byte planes form this replaced; the f32 steps per block and the 8-row
 * reduction stay, so the gain is small: 2048 x 4096 on quantized Gaussian activations, 1 thread,
 * the two builds alternating 5 times, 10.4-10.9 -> 10.8-11.5 GB/s (the loop alone, 8 rows from L1
 * without reduction or scales, runs at 4.7-5.7 cycles per step; the whole kernel near 8.5).
 *
 * int32 bounds: |256 j| <= 3072 and |A| <= 30720, so a lane's 8 products (times 256) are below
 * 7.6e8 and two lanes' below 1.6e9 < 2^31: the first step of the 8-row reduction adds two lanes,
 * then shifts the exact multiple of 256 right by 8, and the second adds the other two (the block
 * sum |A . w| <= 32 * 12 * 30720 < 2^24). A low chunk's S = (A . w) * 2^shift + L . w stays below
 * 2^27 (shift <= 3, |L| < 128). */

/* 32 packed bytes -> the four vectors of int16 256 j (above). */
static inline __attribute__((always_inline)) void fp4_row_words64(const uint8_t *src, __m256i W[4]) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kernel_e2m1_bytes));
    const __m256i nib = _mm256_set1_epi8(0x0f), high = _mm256_set1_epi16((short)0xff00);
    const __m256i v = _mm256_loadu_si256((const __m256i *)src);
    const __m256i e = _mm256_shuffle_epi8(table, _mm256_and_si256(v, nib));
    const __m256i o = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
    W[0] = _mm256_slli_epi16(e, 8);
    W[1] = _mm256_slli_epi16(o, 8);
    W[2] = _mm256_and_si256(e, high);
    W[3] = _mm256_and_si256(o, high);
}

/* a + the dword-lane sums of the int16 pair products of w and x: VPDPWSSD, or without AVX-VNNI its
 * two halves VPMADDWD and VPADDD (the same int32s: no step above 2^31 in either form). */
static inline __attribute__((always_inline)) __m256i words_dot_add(__m256i a, __m256i w, __m256i x) {
#ifdef __AVXVNNI__
    return _mm256_dpwssd_avx_epi32(a, w, x);
#else
    return _mm256_add_epi32(a, _mm256_madd_epi16(w, x));
#endif
}

/* One row's 64 elements against a chunk's four vectors of words. */
static inline __attribute__((always_inline)) __m256i fp4_row_dot64(const __m256i W[4], const __m256i X[4]) {
    __m256i a = _mm256_madd_epi16(W[0], X[0]);
    UNROLL(3)
    for (int r = 1; r < 4; r++) a = words_dot_add(a, W[r], X[r]);
    return a;
}

/* The 8-row reduction in two steps. First two rows a, b: P = [a0+a2, b0+b2, a1+a3, b1+b3 | the
 * same of lanes 4-7], shifted right by 8 (exact: every product carried the factor 256). */
static inline __attribute__((always_inline)) __m256i fp4_pair_sums(__m256i a, __m256i b) {
    return _mm256_srai_epi32(_mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b)), 8);
}

/* Then the four pairs of rows (0, 1), (2, 3), (4, 5), (6, 7) -> out[b] lane i = block b's sum of row i. */
static inline __attribute__((always_inline)) void fp4_pairs_reduce(const __m256i P[4], __m256i out[2]) {
    const __m256i lo = _mm256_add_epi32(_mm256_unpacklo_epi64(P[0], P[1]), _mm256_unpackhi_epi64(P[0], P[1]));
    const __m256i hi = _mm256_add_epi32(_mm256_unpacklo_epi64(P[2], P[3]), _mm256_unpackhi_epi64(P[2], P[3]));
    out[0] = _mm256_permute2x128_si256(lo, hi, 0x20);
    out[1] = _mm256_permute2x128_si256(lo, hi, 0x31);
}

/* One chunk's 8 rows against the words at x (a or l of a chunk): the rows' words (wt, converted
 * once for several tokens) or their packed bytes (wr, one token). (Reducing each pair of rows as
 * soon as it is done, to keep fewer vectors live, measured 10% slower.) */
static inline __attribute__((always_inline)) void fp4_rows_dot8(const uint8_t *const wr[8], size_t off, const __m256i *wt,
                                                                const int16_t *x, __m256i out[2]) {
    __m256i X[4], l[8], P[4];
    UNROLL(4)
    for (int r = 0; r < 4; r++) X[r] = _mm256_loadu_si256((const __m256i *)(x + 16 * r));
    UNROLL(8)
    for (int i = 0; i < 8; i++) {
        __m256i W[4];
        if (wt) {
            UNROLL(4)
            for (int r = 0; r < 4; r++) W[r] = wt[4 * i + r];
        } else {
            fp4_row_words64(wr[i] + off, W);
        }
        l[i] = fp4_row_dot64(W, X);
    }
    UNROLL(4)
    for (int h = 0; h < 4; h++) P[h] = fp4_pair_sums(l[2 * h], l[2 * h + 1]);
    fp4_pairs_reduce(P, out);
}

/* One chunk of 8 rows for one token: out[b] = the exact block sums S' (S = S' * 2^shift unless
 * the chunk is low, then S). */
static inline __attribute__((always_inline)) void fp4_row_chunk8(const uint8_t *const wr[8], size_t off, const __m256i *wt,
                                                                 const kernel_fp4_row_chunk *ch, __m256i out[2]) {
    fp4_rows_dot8(wr, off, wt, ch->a, out);
    if (!ch->low) return;
    /* rare (a few chunks in a hundred on quantized Gaussian activations): the words L */
    __m256i low[2];
    fp4_rows_dot8(wr, off, wt, ch->l, low);
    UNROLL(2)
    for (int b = 0; b < 2; b++)
        out[b] = _mm256_add_epi32(_mm256_sll_epi32(out[b], _mm_cvtsi32_si128(ch->shift[b])), low[b]);
}

/* VPSHUFB controls: byte b of each dword to its low byte, the other bytes zero. */
static const uint8_t fp4_scale_pick2[4][32] __attribute__((aligned(32))) = {
#define PICK(b) {b, 0x80, 0x80, 0x80, 4 + b, 0x80, 0x80, 0x80, 8 + b, 0x80, 0x80, 0x80, 12 + b, 0x80, 0x80, 0x80, \
                 b, 0x80, 0x80, 0x80, 4 + b, 0x80, 0x80, 0x80, 8 + b, 0x80, 0x80, 0x80, 12 + b, 0x80, 0x80, 0x80}
    PICK(0), PICK(1), PICK(2), PICK(3)
#undef PICK
};

/* The packed rows and scale rows of an 8-row pass from r0, nr of them real (rows past the end
 * repeat the last: computed, never stored). */
static inline void fp4_pass_rows8(const fp4_matrix *w, int r0, int nr, const uint8_t *wr[8], const uint8_t *sr[8]) {
    for (int i = 0; i < 8; i++) {
        const int r = r0 + (i < nr ? i : nr - 1);
        wr[i] = w->packed + (size_t)r * (w->cols / 2);
        sr[i] = w->scales + (size_t)r * (w->cols / 32);
    }
}

/* The E8M0 scales of an 8-row group, transposed: sbuf[d] lane i = row i's 4 block scales of
 * columns 128d .. 128d + 127 (one dword). */
static inline __attribute__((always_inline)) void fp4_group_scales8(const uint8_t *const sr[8], int dwords, __m256i *sbuf) {
    for (int d0 = 0; d0 < dwords; d0 += 8) {
        const int n = dwords - d0 < 8 ? dwords - d0 : 8;
        const __m256i lmask = lanes_below8(n);
        __m256i r[8];
        UNROLL(8)
        for (int i = 0; i < 8; i++) r[i] = _mm256_maskload_epi32((const int *)(sr[i] + 4 * (size_t)d0), lmask);
        transpose8x8(r);
        for (int j = 0; j < n; j++) _mm256_store_si256(&sbuf[d0 + j], r[j]);
    }
}

/* Block q (0..3) of transposed scales (fp4_group_scales8) as 8 f32: e << 23, and byte 0 ->
 * 0x00400000 (2^-127) by the max. */
static inline __m256 fp4_block_scales8(__m256i sd, int q) {
    const __m256i e = _mm256_slli_epi32(_mm256_shuffle_epi8(sd, _mm256_load_si256((const __m256i *)fp4_scale_pick2[q])), 23);
    return _mm256_castsi256_ps(_mm256_max_epi32(e, _mm256_set1_epi32(0x00400000)));
}

/* Rows [row_begin, row_end) for n_tokens (1 to 3) tokens of a row words form. */
static void fp4_row_words_matmul(const fp4_matrix *w, const void *act, const float *x_scales, const int n_tokens,
                                 float *y, int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    const int cols = w->cols, chunks = cols / 64, dwords = cols / 128, xblocks = cols / FP8_ACT_BLOCK;
    const int one = n_tokens == 1;
    const kernel_fp4_row_chunk *form = act;
    /* the weight scales of an 8-row group, transposed: one vector of 8 dwords (a row's 4 block
     * scales each) per 128 columns */
    __m256i *sbuf = kernel_scratch_get(&fp4_scale_scratch, ((size_t)dwords + 8) * sizeof(__m256i));
    for (int r0 = row_begin; r0 < row_end; r0 += 8) {
        const int nr = row_end - r0 < 8 ? row_end - r0 : 8;
        const __m256i store_mask = lanes_below8(nr);
        const uint8_t *wr[8], *sr[8];
        fp4_pass_rows8(w, r0, nr, wr, sr);
        fp4_group_scales8(sr, dwords, sbuf);
        __m256 acc1 = _mm256_setzero_ps();
        if (!one)
            for (int t = 0; t < n_tokens; t++) masked_store8(y + (size_t)t * y_stride + r0, store_mask, _mm256_setzero_ps());
        /* the next group's packed rows (contiguous: 8 rows x cols / 2 bytes, 256 per chunk) into
         * L2 as this one is computed, and its scales (cols / 4 bytes, a line per 4 chunks), as
         * the AVX-512 decode does: the group's 8 row streams, 32 bytes per chunk each, are more
         * than the hardware prefetchers follow from one core. Measured from RAM, 1 token, 2
         * threads: 2048 x 4096 13.0 -> 19.4 GB/s. */
        const int prefetch_next = r0 + 8 < row_end;
        const uint8_t *next_rows = w->packed + (size_t)(r0 + 8) * (cols / 2);
        const uint8_t *next_scales = w->scales + (size_t)(r0 + 8) * (cols / 32);
        for (int c = 0; c < chunks; c++) {
            const size_t off = (size_t)c * 32;
            __m256i wt[32];
            if (prefetch_next) {
                UNROLL(4)
                for (int l = 0; l < 4; l++) _mm_prefetch((const char *)(next_rows + (size_t)c * 256 + 64 * l), _MM_HINT_T1);
                if ((c & 3) == 0) _mm_prefetch((const char *)(next_scales + (size_t)c * 16), _MM_HINT_T1);
            }
            if (!one)
                for (int i = 0; i < 8; i++) fp4_row_words64(wr[i] + off, wt + 4 * i);
            const __m256i sd = _mm256_load_si256(&sbuf[c / 2]);
            for (int t = 0; t < n_tokens; t++) {
                const kernel_fp4_row_chunk *ch = &form[(size_t)t * chunks + c];
                __m256i out[2];
                fp4_row_chunk8(wr, off, one ? NULL : wt, ch, out);
                const __m256 xs = _mm256_set1_ps(x_scales[(size_t)t * xblocks + c / 2]);
                float *yt = y + (size_t)t * y_stride + r0;
                __m256 acc = one ? acc1 : masked_load8(yt, store_mask);
                UNROLL(2)
                for (int b = 0; b < 2; b++) {
                    const __m256 ws = fp4_block_scales8(sd, 2 * (c & 1) + b);
                    const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(out[b]), _mm256_set1_ps(ch->factor[b]));
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(f, _mm256_mul_ps(xs, ws)));
                }
                if (one)
                    acc1 = acc;
                else
                    masked_store8(yt, store_mask, acc);
            }
        }
        if (one) masked_store8(y + r0, store_mask, acc1);
    }
}

/* 8 rows x one half (16 columns, 8 packed bytes from off) of a 32-block -> W[d] lane i = row i's
 * signed weights j = 2 * e2m1 of the word pair the half's dword d of the words form holds (the
 * octet order, kernels_internal.h), as the AVX-512 fp4_group_words: vector k takes rows k and
 * 4 + k in its two 128-bit lanes, the in-lane dword transposition of the packed bytes leaves in
 * T[q] lane i row i's packed dword q (an octet of elements), and its nibbles' bytes j
 * sign-extend in place into the octet's four pairs. */
static inline __attribute__((always_inline)) void fp4_half_words8(const uint8_t *const wr[8], size_t off, __m256i W[8]) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kernel_e2m1_bytes));
    __m256i z[4];
    UNROLL(4)
    for (int k = 0; k < 4; k++)
        z[k] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)(wr[k] + off))),
                                       _mm_loadl_epi64((const __m128i *)(wr[4 + k] + off)), 1);
    const __m256i t0 = _mm256_unpacklo_epi32(z[0], z[1]), t2 = _mm256_unpacklo_epi32(z[2], z[3]);
    const __m256i T[2] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2)};
    UNROLL(2)
    for (int q = 0; q < 2; q++) {
        const __m256i L = _mm256_shuffle_epi8(table, _mm256_and_si256(T[q], _mm256_set1_epi8(0x0f)));
        const __m256i H = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(T[q], 4), _mm256_set1_epi8(0x0f)));
        W[4 * q + 0] = _mm256_srai_epi16(_mm256_slli_epi16(L, 8), 8);
        W[4 * q + 1] = _mm256_srai_epi16(L, 8);
        W[4 * q + 2] = _mm256_srai_epi16(_mm256_slli_epi16(H, 8), 8);
        W[4 * q + 3] = _mm256_srai_epi16(H, 8);
    }
}

/* One token's half block of words (8 dwords) against the 8 rows. */
static inline __attribute__((always_inline)) __m256i fp4_half_dot8(const __m256i W[8], const int32_t *x) {
    __m256i a = _mm256_setzero_si256(), b = a;
    UNROLL(4)
    for (int d = 0; d < 8; d += 2) {
        a = words_dot_add(a, W[d], _mm256_set1_epi32(x[d]));
        b = words_dot_add(b, W[d + 1], _mm256_set1_epi32(x[d + 1]));
    }
    return _mm256_add_epi32(a, b);
}

/* The AVX-512 words kernel (kernels_avx512.c states the method and its int32 bounds) at 8 rows:
 * 16 registers of int16 pairs would be all that AVX2 has, so each block goes in two halves of 16
 * columns, the first half's sums (words A, and L for a block that has them) kept per token of the
 * slice until the second adds its own and rounds. */
static void fp4_tokens_matmul8(const fp4_matrix *w, const void *act, int n_tokens, float *y, int y_stride, int row_begin,
                               int row_end) {
    const int cols = w->cols, blocks = cols / 32, dwords = cols / 128;
    const int32_t *words = act, *lows = (const int32_t *)kernel_fp4_words_low(act, n_tokens, cols);
    const kernel_fp4_words_meta *meta = kernel_fp4_words_metas(act, n_tokens, cols);
    const int slice = kernel_fp4_words_slice(n_tokens, cols, KERNEL_SLICE_FORM_BYTES);
    /* the group's transposed scales (fp4_group_scales8), then per token of a slice the 8 rows'
     * running sums and the first halves' A and L sums */
    __m256i *sbuf = kernel_scratch_get(&tokens_tile_scratch, ((size_t)dwords + 8 + 3 * (size_t)slice) * sizeof(__m256i));
    float *acc_buf = (float *)(sbuf + dwords + 8);
    __m256i *first_a = sbuf + dwords + 8 + slice, *first_l = first_a + slice;
    for (int t0 = 0; t0 < n_tokens; t0 += slice) {
        const int nt = n_tokens - t0 < slice ? n_tokens - t0 : slice;
        for (int r0 = row_begin; r0 < row_end; r0 += 8) {
            const int nr = row_end - r0 < 8 ? row_end - r0 : 8;
            const __m256i store_mask = lanes_below8(nr);
            const uint8_t *wr[8], *sr[8];
            fp4_pass_rows8(w, r0, nr, wr, sr);
            fp4_group_scales8(sr, dwords, sbuf);
            for (int t = 0; t < nt; t++) _mm256_storeu_ps(acc_buf + (size_t)t * 8, _mm256_setzero_ps());
            for (int b = 0; b < blocks; b++) {
                const size_t first_form = (size_t)b * n_tokens + t0;
                const kernel_fp4_words_meta *m = meta + first_form;
                __m256i W[8];
                fp4_half_words8(wr, (size_t)b * 16, W);
                for (int t = 0; t < nt; t++) {
                    _mm256_store_si256(&first_a[t], fp4_half_dot8(W, words + (first_form + t) * 16));
                    if (m[t].low) _mm256_store_si256(&first_l[t], fp4_half_dot8(W, lows + (first_form + t) * 16));
                }
                fp4_half_words8(wr, (size_t)b * 16 + 8, W);
                const __m256 ws = fp4_block_scales8(_mm256_load_si256(&sbuf[b / 4]), b % 4);
                for (int t = 0; t < nt; t++) {
                    __m256i sum = _mm256_add_epi32(_mm256_load_si256(&first_a[t]),
                                                   fp4_half_dot8(W, words + (first_form + t) * 16 + 8));
                    if (m[t].low) {
                        const __m256i l = _mm256_add_epi32(_mm256_load_si256(&first_l[t]),
                                                           fp4_half_dot8(W, lows + (first_form + t) * 16 + 8));
                        sum = _mm256_add_epi32(_mm256_sll_epi32(sum, _mm_cvtsi32_si128(m[t].shift)), l);
                    }
                    const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(m[t].factor));
                    float *acc = acc_buf + (size_t)t * 8;
                    _mm256_storeu_ps(acc, _mm256_add_ps(_mm256_loadu_ps(acc),
                                                        _mm256_mul_ps(f, _mm256_mul_ps(_mm256_set1_ps(m[t].x_scale), ws))));
                }
            }
            for (int t = 0; t < nt; t++)
                masked_store8(y + (size_t)(t0 + t) * y_stride + r0, store_mask, _mm256_loadu_ps(acc_buf + (size_t)t * 8));
        }
    }
}

/* The entry points: the words form from FP4_TOKENS_MIN tokens, the row words form below. */
static size_t avx2_fp4_act_bytes(int n_tokens, int cols) {
    return n_tokens >= FP4_TOKENS_MIN ? kernel_fp4_words_bytes(n_tokens, cols) : kernel_fp4_row_words_bytes(n_tokens, cols);
}

static void avx2_fp4_act_prepare(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols, void *act) {
    if (n_tokens >= FP4_TOKENS_MIN)
        kernel_fp4_words_prepare(x_codes, x_scales, n_tokens, cols, act);
    else
        kernel_fp4_row_words_prepare(x_codes, n_tokens, cols, act);
}

static void avx2_matmul_fp4_prepared(const fp4_matrix *w, const void *act, const float *x_scales, int n_tokens,
                                     float *y, int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    if (n_tokens >= FP4_TOKENS_MIN)
        fp4_tokens_matmul8(w, act, n_tokens, y, y_stride, row_begin, row_end);
    else
        fp4_row_words_matmul(w, act, x_scales, n_tokens, y, y_stride, row_begin, row_end);
}

static inline void avx2_matmul_fp4(const fp4_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                            int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    void *act = kernel_scratch_get(&fp4_act_scratch, avx2_fp4_act_bytes(n_tokens, w->cols) + 64);
    avx2_fp4_act_prepare(x_codes, x_scales, n_tokens, w->cols, act);
    avx2_matmul_fp4_prepared(w, act, x_scales, n_tokens, y, y_stride, row_begin, row_end);
}

#endif
