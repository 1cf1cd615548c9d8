/* The AVX2 FP4 x FP8 products, included by kernels_avx2.c and, compiled with AVX-VNNI, by
 * kernels_avxvnni.c (each file gets its own static copy built for its own instructions; with
 * __AVXVNNI__ defined a few instruction pairs become one, on the same integers, so the same bits).
 * Two forms:
 *  - 1 to 3 tokens: byte planes (below): the weights read as they come, each plane's dot product
 *    VPMADDUBSW + VPMADDWD (VNNI: VPDPBUSD).
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

/* Below 4 tokens a row group's conversion into words is not repaid (the planes form reads the
 * weights as they come instead). */
#define FP4_TOKENS_MIN 4

/* ---------------------------------------------------------------------------------------------
 * FP4 x FP8, 64 elements (32 packed bytes, two 32-blocks) per step. The form holds, per token and
 * chunk, the four planes as two vectors each in the expansion's order: "lo" byte i = element 64c +
 * 2i (low nibble of packed byte i), "hi" byte i = element 64c + 2i + 1. After VPMADDUBSW on lo
 * and on hi, the two 16-bit results add (|pair sum| <= 2 * 24 * 120, so |lo + hi| <= 11520: no
 * saturation, no overflow), and VPMADDWD turns them into dwords, lane L covering elements
 * 8L..8L+7: lanes 0-3 belong to the first block, 4-7 to the second. VPMADDWD multiplies by the
 * plane's weight 2^(4(p - first)) (<= 4096, an int16) in the same instruction, so the planes
 * combine with adds alone: a = sum_p 2^(4(p - first)) dot_p, |a| <= 4 * 11520 * 4369 < 2^28.
 *
 * Only the planes first..first+count-1 (the lowest and highest holding a nonzero value in the
 * chunk, decided once per call from the prepared activations) enter; the others are all zero.
 * As in the AVX-512 variant, the block sum is S = 2^(4 first) * S' with S' = (block's lanes of a)
 * - 12 * sum(k) / 2^(4 first) exact, and (float)S * 2^-10 = (float)S' * 2^(4 first - 10). */
#define FP4_CHUNK2 64
#define FP4_CHUNK2_BYTES (4 * 2 * 32)

typedef struct fp4_chunk2_meta {
    int32_t ksum[2]; /* 12 * sum of k over each 32-block, divided by 2^(4 first) (exact) */
    float factor;    /* 2^(4 first - 10) */
    int32_t first;   /* lowest plane entering the sums */
    int32_t count;   /* planes first..first+count-1 (0: every activation of the chunk is zero) */
    int32_t pad[3];
} fp4_chunk2_meta;

static size_t fp4_planes_bytes(int n_tokens, int cols) {
    return (size_t)n_tokens * (cols / FP4_CHUNK2) * (FP4_CHUNK2_BYTES + sizeof(fp4_chunk2_meta));
}

static fp4_chunk2_meta *fp4_chunk2_metas(const void *act, int n_tokens, int cols) {
    return (fp4_chunk2_meta *)((uint8_t *)act + (size_t)n_tokens * (cols / FP4_CHUNK2) * FP4_CHUNK2_BYTES);
}

static void fp4_planes_prepare(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols, void *act) {
    const int chunks = cols / FP4_CHUNK2;
    int8_t *planes = act;
    fp4_chunk2_meta *meta = fp4_chunk2_metas(act, n_tokens, cols);
    (void)x_scales;
    memset(planes, 0, (size_t)n_tokens * chunks * FP4_CHUNK2_BYTES);
    for (int t = 0; t < n_tokens; t++)
        for (int c = 0; c < chunks; c++) {
            const uint8_t *xc = x_codes + (size_t)t * cols + (size_t)c * FP4_CHUNK2;
            int8_t *dst = planes + ((size_t)t * chunks + c) * FP4_CHUNK2_BYTES;
            unsigned present = 0;
            for (int i = 0; i < 32; i++) {
                const uint8_t even = xc[2 * i], odd = xc[2 * i + 1];
                dst[kernel_plane_index[even] * 64 + i] = kernel_plane_value[even];
                dst[kernel_plane_index[odd] * 64 + 32 + i] = kernel_plane_value[odd];
                present |= (kernel_plane_value[even] != 0 ? 1u : 0u) << kernel_plane_index[even];
                present |= (kernel_plane_value[odd] != 0 ? 1u : 0u) << kernel_plane_index[odd];
            }
            fp4_chunk2_meta *m = &meta[(size_t)t * chunks + c];
            const int first = present ? __builtin_ctz(present) : 0, last = present ? 31 - __builtin_clz(present) : -1;
            memset(m, 0, sizeof *m);
            m->first = first;
            m->count = last - first + 1;
            m->factor = ldexpf(1.0f, 4 * first - 10);
            for (int b = 0; b < 2; b++) {
                int32_t s = 0;
                for (int i = 0; i < 32; i++) s += kernel_e4m3_int[xc[32 * b + i]];
                m->ksum[b] = 12 * s / (1 << (4 * first)); /* exact: every k is a multiple of 2^(4 first) */
            }
        }
}

/* e2m1 nibble -> the biased weight byte j + 12, in both 16-byte lanes (VPSHUFB table). */
static inline __m256i fp4_biased_table8(void) {
    return _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
}

/* 32 packed bytes -> the biased weights j + 12 of the even (lo) and odd (hi) elements. */
static inline __attribute__((always_inline)) void fp4x64_lo_hi(const uint8_t *src, __m256i *lo, __m256i *hi) {
    const __m256i table = fp4_biased_table8();
    const __m256i nib = _mm256_set1_epi8(0x0f);
    const __m256i v = _mm256_loadu_si256((const __m256i *)src);
    *lo = _mm256_shuffle_epi8(table, _mm256_and_si256(v, nib));
    *hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
}

/* a = sum over the planes (highest first in pl: lo, hi per plane; mul the matching powers of 2). */
static inline __attribute__((always_inline)) __m256i fp4_row64(__m256i lo, __m256i hi, const __m256i *pl,
                                                              const __m256i *mul, int count) {
    __m256i a = _mm256_setzero_si256();
#ifdef __AVXVNNI__
    /* Horner's rule in the VPDPBUSD accumulator, a = (a << 4) + dot_q: the same integer as the
     * sum of products below (|a| < 2^28 at every step), in 3 instructions per plane instead of 5 */
    (void)mul;
    UNROLL(4)
    for (int q = 0; q < count; q++) {
        if (q) a = _mm256_slli_epi32(a, 4);
        a = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(a, lo, pl[2 * q]), hi, pl[2 * q + 1]);
    }
    return a;
#endif
    UNROLL(4)
    for (int q = 0; q < count; q++) {
        const __m256i x = _mm256_add_epi16(_mm256_maddubs_epi16(lo, pl[2 * q]), _mm256_maddubs_epi16(hi, pl[2 * q + 1]));
        const __m256i d = _mm256_madd_epi16(x, mul[q]);
        a = q ? _mm256_add_epi32(a, d) : d;
    }
    return a;
}

/* 8 rows' lane vectors -> out[b] lane i = block b's sum of row i (b = 0, 1). */
static inline __attribute__((always_inline)) void fp4_reduce8(const __m256i l[8], __m256i out[2]) {
    __m256i W[2];
    UNROLL(2)
    for (int g = 0; g < 2; g++) {
        __m256i P[2];
        UNROLL(2)
        for (int h = 0; h < 2; h++) {
            const __m256i a = l[4 * g + 2 * h], b = l[4 * g + 2 * h + 1];
            P[h] = _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
        }
        W[g] = _mm256_add_epi32(_mm256_unpacklo_epi64(P[0], P[1]), _mm256_unpackhi_epi64(P[0], P[1]));
    }
    out[0] = _mm256_permute2x128_si256(W[0], W[1], 0x20);
    out[1] = _mm256_permute2x128_si256(W[0], W[1], 0x31);
}

/* One chunk of 8 rows for one token: the plane vectors (highest first) and multipliers. */
static inline __attribute__((always_inline)) void fp4_chunk8(const uint8_t *const wr[8], size_t off, const __m256i *wt,
                                                             const int8_t *tp, int last, int count, __m256i out[2]) {
    __m256i pl[8], mul[4], l[8];
    UNROLL(4)
    for (int q = 0; q < count; q++) {
        pl[2 * q] = _mm256_load_si256((const __m256i *)(tp + (last - q) * 64));
        pl[2 * q + 1] = _mm256_load_si256((const __m256i *)(tp + (last - q) * 64 + 32));
        mul[q] = _mm256_set1_epi16((short)(1 << (4 * (count - 1 - q))));
    }
    UNROLL(8)
    for (int i = 0; i < 8; i++) {
        __m256i lo, hi;
        if (wt) {
            lo = wt[2 * i];
            hi = wt[2 * i + 1];
        } else {
            fp4x64_lo_hi(wr[i] + off, &lo, &hi);
        }
        l[i] = fp4_row64(lo, hi, pl, mul, count);
    }
    fp4_reduce8(l, out);
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

/* Rows [row_begin, row_end) for n_tokens tokens whose planes and chunk descriptions start at
 * planes and meta (a slice of a prepared form). */
static inline __attribute__((always_inline)) void fp4_rows8(const fp4_matrix *w, const int8_t *planes,
                                                            const fp4_chunk2_meta *meta, const float *x_scales,
                                                            const int n_tokens, const int one, float *y, int y_stride,
                                                            int row_begin, int row_end) {
    const int cols = w->cols, chunks = cols / FP4_CHUNK2, blocks32 = cols / 32, dwords = blocks32 / 4;
    const int xblocks = cols / FP8_ACT_BLOCK;
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
            for (int t = 0; t < n_tokens; t++) _mm256_maskstore_ps(y + (size_t)t * y_stride + r0, store_mask, _mm256_setzero_ps());
        for (int c = 0; c < chunks; c++) {
            const size_t off = (size_t)c * 32;
            __m256i wt[16];
            if (!one)
                for (int i = 0; i < 8; i++) fp4x64_lo_hi(wr[i] + off, &wt[2 * i], &wt[2 * i + 1]);
            const __m256i sd = _mm256_load_si256(&sbuf[c / 2]);
            for (int t = 0; t < n_tokens; t++) {
                const fp4_chunk2_meta *m = &meta[(size_t)t * chunks + c];
                const int8_t *tp = planes + ((size_t)t * chunks + c) * FP4_CHUNK2_BYTES;
                const int last = m->first + m->count - 1;
                const __m256i *wtp = one ? NULL : wt;
                __m256i out[2];
                switch (m->count) {
                case 4: fp4_chunk8(wr, off, wtp, tp, last, 4, out); break;
                case 3: fp4_chunk8(wr, off, wtp, tp, last, 3, out); break;
                case 2: fp4_chunk8(wr, off, wtp, tp, last, 2, out); break;
                case 1: fp4_chunk8(wr, off, wtp, tp, last, 1, out); break;
                default: out[0] = out[1] = _mm256_setzero_si256(); break; /* still 0 * scale below */
                }
                const __m256 xs = _mm256_set1_ps(x_scales[(size_t)t * xblocks + c / 2]);
                const __m256 factor = _mm256_set1_ps(m->factor);
                float *yt = y + (size_t)t * y_stride + r0;
                __m256 acc = one ? acc1 : _mm256_maskload_ps(yt, store_mask);
                UNROLL(2)
                for (int b = 0; b < 2; b++) {
                    const __m256 ws = fp4_block_scales8(sd, 2 * (c & 1) + b);
                    const __m256i s = _mm256_sub_epi32(out[b], _mm256_set1_epi32(m->ksum[b]));
                    const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(s), factor);
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(f, _mm256_mul_ps(xs, ws)));
                }
                if (one)
                    acc1 = acc;
                else
                    _mm256_maskstore_ps(yt, store_mask, acc);
            }
        }
        if (one) _mm256_maskstore_ps(y + r0, store_mask, acc1);
    }
}

static void fp4_planes_matmul(const fp4_matrix *w, const void *act, const float *x_scales, int n_tokens, float *y,
                              int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    const int chunks = w->cols / FP4_CHUNK2;
    const int8_t *planes = act;
    const fp4_chunk2_meta *meta = fp4_chunk2_metas(act, n_tokens, w->cols);
    if (n_tokens == 1) {
        fp4_rows8(w, planes, meta, x_scales, 1, 1, y, y_stride, row_begin, row_end);
        return;
    }
    /* token slices whose form stays in L2 while every 8-row group passes over it, as the FP8
     * products do (256 tokens of 4096 columns: 4.6 MB of form; 2048 x 4096, 1 thread, 256 tokens:
     * 0.77 -> 0.45-0.48 ms per token; 64 tokens 0.48 -> 0.44) */
    int slice = KERNEL_SLICE_FORM_BYTES / (chunks * (int)(FP4_CHUNK2_BYTES + sizeof(fp4_chunk2_meta)));
    slice = slice < 2 ? 2 : slice;
    for (int t0 = 0; t0 < n_tokens; t0 += slice) {
        const int nt = n_tokens - t0 < slice ? n_tokens - t0 : slice;
        fp4_rows8(w, planes + (size_t)t0 * chunks * FP4_CHUNK2_BYTES, meta + (size_t)t0 * chunks,
                  x_scales + (size_t)t0 * (w->cols / FP8_ACT_BLOCK), nt, 0, y + (size_t)t0 * y_stride, y_stride, row_begin,
                  row_end);
    }
}

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

/* a + the dword-lane sums of the int16 pair products of w and x: VPDPWSSD, or without AVX-VNNI its
 * two halves VPMADDWD and VPADDD (the same int32s: |pair sum| <= 2 * 12 * 30720 < 2^20). */
static inline __attribute__((always_inline)) __m256i words_dot_add(__m256i a, __m256i w, __m256i x) {
#ifdef __AVXVNNI__
    return _mm256_dpwssd_avx_epi32(a, w, x);
#else
    return _mm256_add_epi32(a, _mm256_madd_epi16(w, x));
#endif
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
                _mm256_maskstore_ps(y + (size_t)(t0 + t) * y_stride + r0, store_mask, _mm256_loadu_ps(acc_buf + (size_t)t * 8));
        }
    }
}

/* The entry points: the words form from FP4_TOKENS_MIN tokens, the planes form below. */
static size_t avx2_fp4_act_bytes(int n_tokens, int cols) {
    return n_tokens >= FP4_TOKENS_MIN ? kernel_fp4_words_bytes(n_tokens, cols) : fp4_planes_bytes(n_tokens, cols);
}

static void avx2_fp4_act_prepare(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols, void *act) {
    if (n_tokens >= FP4_TOKENS_MIN)
        kernel_fp4_words_prepare(x_codes, x_scales, n_tokens, cols, act);
    else
        fp4_planes_prepare(x_codes, x_scales, n_tokens, cols, act);
}

static void avx2_matmul_fp4_prepared(const fp4_matrix *w, const void *act, const float *x_scales, int n_tokens,
                                     float *y, int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    if (n_tokens >= FP4_TOKENS_MIN)
        fp4_tokens_matmul8(w, act, n_tokens, y, y_stride, row_begin, row_end);
    else
        fp4_planes_matmul(w, act, x_scales, n_tokens, y, y_stride, row_begin, row_end);
}

static inline void avx2_matmul_fp4(const fp4_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                            int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    void *act = kernel_scratch_get(&fp4_act_scratch, avx2_fp4_act_bytes(n_tokens, w->cols) + 64);
    avx2_fp4_act_prepare(x_codes, x_scales, n_tokens, w->cols, act);
    avx2_matmul_fp4_prepared(w, act, x_scales, n_tokens, y, y_stride, row_begin, row_end);
}

#endif
