/* AVX2 + AVX-VNNI kernels (VEX-encoded VPDPBUSD and VPDPWSSD on 256-bit vectors: Intel client
 * cores from Alder Lake on, which have no AVX-512), bit-identical to kernels_scalar.c. Only the
 * FP4 x FP8 products differ from the AVX2 variant (the rest comes from it, see `base` below), in
 * two forms:
 *  - 1 to 3 tokens: the AVX2 form (kernels_avx2_fp4.h) with each plane's dot product one
 *    VPDPBUSD per half instead of VPMADDUBSW + VPMADDWD, the planes combined by Horner's rule.
 *  - 4 or more tokens: the AVX-512 variant's words form at half the width (kernels_avx512.c
 *    states the method and its int32 bounds; the activation form is the shared
 *    kernel_fp4_words_prepare): lanes are 8 rows, each half of a 32-block of the group's weights
 *    is converted once into 8 registers of int16 pairs while every token of a slice passes over
 *    it, the token's word pairs broadcast, so each lane ends with its own row's block sum and
 *    nothing is reduced across lanes. */
#include "kernels/kernels_avx2_fp4.h"
#include "kernels/kernels_avx2_inline.h"
#include "kernels/kernels_internal.h"

#include <immintrin.h>
#include <string.h>

/* Below 4 tokens a row group's conversion is not repaid (the decode form reads the weights as
 * they come instead). */
#define FP4_TOKENS_MIN 4

static _Thread_local kernel_scratch tokens_act_scratch, tokens_tile_scratch;

/* 8 rows x one half (16 columns, 8 packed bytes from off) of a 32-block -> W[d] lane i = row i's
 * signed weights j = 2 * e2m1 of the word pair the half's dword d of the words form holds
 * (kernel_fp4_words_prepare pairs element 4g + r with 4g + r + 2): vector k takes rows k and
 * 4 + k in its two 128-bit lanes, so that the in-lane 4 x 4 dword transposition leaves row 4l + k
 * in lane 4l + k; bytes (b0, b1, b2, b3) = elements 4g..4g+3 then become the int16 pairs (b0, b2)
 * and (b1, b3), sign-extended in place. */
static inline __attribute__((always_inline)) void fp4_half_words8(const uint8_t *const wr[8], size_t off, __m256i W[8]) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kernel_e2m1_bytes));
    __m256i v[4];
    UNROLL(4)
    for (int k = 0; k < 4; k++) {
        const __m256i z = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)(wr[k] + off))),
                                                  _mm_loadl_epi64((const __m128i *)(wr[4 + k] + off)), 1);
        const __m256i lo = _mm256_and_si256(z, _mm256_set1_epi8(0x0f));
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(z, 4), _mm256_set1_epi8(0x0f));
        v[k] = _mm256_shuffle_epi8(table, _mm256_unpacklo_epi8(lo, hi)); /* the half's 16 elements */
    }
    const __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    const __m256i B[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t1, t3),
                          _mm256_unpackhi_epi64(t1, t3)};
    UNROLL(4)
    for (int g = 0; g < 4; g++) {
        W[2 * g] = _mm256_srai_epi16(_mm256_slli_epi16(B[g], 8), 8);
        W[2 * g + 1] = _mm256_srai_epi16(B[g], 8);
    }
}

/* One token's half block of words (8 dwords) against the 8 rows. */
static inline __attribute__((always_inline)) __m256i fp4_half_dot8(const __m256i W[8], const int32_t *x) {
    __m256i a = _mm256_setzero_si256(), b = a;
    UNROLL(4)
    for (int d = 0; d < 8; d += 2) {
        a = _mm256_dpwssd_avx_epi32(a, W[d], _mm256_set1_epi32(x[d]));
        b = _mm256_dpwssd_avx_epi32(b, W[d + 1], _mm256_set1_epi32(x[d + 1]));
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
    const int slice = kernel_fp4_words_slice(n_tokens, cols);
    /* the group's transposed scales (fp4_group_scales8), then per token of a slice the 8 rows'
     * running sums and the first halves' A and L sums */
    __m256i *sbuf = kernel_scratch_get(&tokens_tile_scratch, ((size_t)dwords + 8 + 3 * (size_t)slice) * sizeof(__m256i));
    float *acc_buf = (float *)(sbuf + dwords + 8);
    __m256i *first_a = sbuf + dwords + 8 + slice, *first_l = first_a + slice;
    for (int t0 = 0; t0 < n_tokens; t0 += slice) {
        const int nt = n_tokens - t0 < slice ? n_tokens - t0 : slice;
        for (int r0 = row_begin; r0 < row_end; r0 += 8) {
            const int nr = row_end - r0 < 8 ? row_end - r0 : 8;
            const __m256i store_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
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
                _mm256_maskstore_ps(y + (size_t)(t0 + t) * y_stride + r0, store_mask, _mm256_loadu_ps(acc_buf + (size_t)t * 8));
        }
    }
}

static size_t avxvnni_fp4_act_bytes(int n_tokens, int cols) {
    return n_tokens >= FP4_TOKENS_MIN ? kernel_fp4_words_bytes(n_tokens, cols) : avx2_fp4_act_bytes(n_tokens, cols);
}

static void avxvnni_fp4_act_prepare(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols, void *act) {
    if (n_tokens >= FP4_TOKENS_MIN)
        kernel_fp4_words_prepare(x_codes, x_scales, n_tokens, cols, act);
    else
        avx2_fp4_act_prepare(x_codes, x_scales, n_tokens, cols, act);
}

static void avxvnni_matmul_fp4_prepared(const fp4_matrix *w, const void *act, const float *x_scales, int n_tokens,
                                        float *y, int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    if (n_tokens >= FP4_TOKENS_MIN)
        fp4_tokens_matmul8(w, act, n_tokens, y, y_stride, row_begin, row_end);
    else
        avx2_matmul_fp4_prepared(w, act, x_scales, n_tokens, y, y_stride, row_begin, row_end);
}

static void avxvnni_matmul_fp4(const fp4_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens,
                               float *y, int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    void *act = kernel_scratch_get(&tokens_act_scratch, avxvnni_fp4_act_bytes(n_tokens, w->cols) + 64);
    avxvnni_fp4_act_prepare(x_codes, x_scales, n_tokens, w->cols, act);
    avxvnni_matmul_fp4_prepared(w, act, x_scales, n_tokens, y, y_stride, row_begin, row_end);
}

const kernel_ops kernel_ops_avxvnni = {
    .name = "avxvnni",
    .base = &kernel_ops_avx2,
    .matmul_fp4 = avxvnni_matmul_fp4,
    .fp4_act_bytes = avxvnni_fp4_act_bytes,
    .fp4_act_prepare = avxvnni_fp4_act_prepare,
    .matmul_fp4_prepared = avxvnni_matmul_fp4_prepared,
};
