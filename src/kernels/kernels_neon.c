/* NEON (arm64 Advanced SIMD) kernels, bit-identical to kernels_scalar.c, with the exact methods
 * of the x86 variants (see kernels_avx512.c):
 *  - FP8 x FP8: f64 FMAs on exact values. Codes become f16 (the e4m3 fields moved into the f16
 *    fields: value * 2^-8, exact for every code), then f32 and f64; the activations carry 2^8.
 *  - FP4 x FP8: the activation split into four signed-byte planes (m * 2^(s - 4p), at most 120),
 *    the weight as the signed byte j = 2 * e2m1; widening multiplies to int16 (at most 1440) and
 *    pairwise accumulation to int32, the planes combined with shifts: exact.
 *  - Float products: 4 rows x 4 columns tiles transposed in registers (or, for MATRIX_GROUPS16
 *    weights, a column of 4 rows loaded directly), acc = acc + w * x per column in column order
 *    with separate multiply and add, four 4-row chains side by side. */
#include "kernels/kernels_internal.h"

#include <arm_neon.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local kernel_scratch act_scratch;

static double e4m3_times_256[256];

__attribute__((constructor)) static void neon_tables_init(void) {
    for (int c = 0; c < 256; c++) {
        e4m3_times_256[c] = (double)kernel_e4m3_int[c] / 2.0;
    }
}

/* ---------------------------------------------------------------------------------------------
 * FP8 x FP8 */

/* acc[0..3] += 8 weight codes times 8 activations (f64, value * 2^8). */
static inline void fp8x8_fma(const uint8_t *w, const double *x, float64x2_t acc[4]) {
    const int16x8_t s = vmovl_s8(vld1_s8((const int8_t *)w));
    const uint16x8_t h = vandq_u16(vshlq_n_u16(vreinterpretq_u16_s16(s), 7), vdupq_n_u16(0xbf80));
    const float16x8_t f16 = vreinterpretq_f16_u16(h);
    const float32x4_t lo = vcvt_f32_f16(vget_low_f16(f16)), hi = vcvt_high_f32_f16(f16);
    acc[0] = vfmaq_f64(acc[0], vcvt_f64_f32(vget_low_f32(lo)), vld1q_f64(x));
    acc[1] = vfmaq_f64(acc[1], vcvt_high_f64_f32(lo), vld1q_f64(x + 2));
    acc[2] = vfmaq_f64(acc[2], vcvt_f64_f32(vget_low_f32(hi)), vld1q_f64(x + 4));
    acc[3] = vfmaq_f64(acc[3], vcvt_high_f64_f32(hi), vld1q_f64(x + 6));
}

static void neon_matmul_fp8(const fp8_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                            int y_stride, int row_begin, int row_end) {
    const int cols = w->cols, blocks = cols / FP8_ACT_BLOCK, scale_cols = (cols + 127) / 128;
    if (row_end <= row_begin || n_tokens <= 0) return;
    double *xd = kernel_scratch_get(&act_scratch, (size_t)n_tokens * cols * sizeof(double));
    for (size_t i = 0; i < (size_t)n_tokens * cols; i++) xd[i] = e4m3_times_256[x_codes[i]];
    for (int r = row_begin; r < row_end; r++) {
        const uint8_t *wr = w->codes + (size_t)r * cols;
        const uint8_t *ws = w->scales + (size_t)(r / 128) * scale_cols;
        for (int t = 0; t < n_tokens; t++) {
            const double *xt = xd + (size_t)t * cols;
            const float *xs = x_scales + (size_t)t * blocks;
            float acc = 0.0f;
            for (int b = 0; b < blocks; b++) {
                float64x2_t a[4] = {vdupq_n_f64(0), vdupq_n_f64(0), vdupq_n_f64(0), vdupq_n_f64(0)};
                for (int c = b * FP8_ACT_BLOCK; c < (b + 1) * FP8_ACT_BLOCK; c += 8) fp8x8_fma(wr + c, xt + c, a);
                /* exact: every partial sum is an integer times 2^-18 below 2^25 */
                const double sum = vaddvq_f64(vaddq_f64(vaddq_f64(a[0], a[1]), vaddq_f64(a[2], a[3])));
                const float block = (float)sum;
                acc += block * (xs[b] * kernel_e8m0(ws[b]));
            }
            y[(size_t)t * y_stride + r] = acc;
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * FP4 x FP8 */

static void neon_matmul_fp4(const fp4_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                            int y_stride, int row_begin, int row_end) {
    const int cols = w->cols, blocks32 = cols / 32, xblocks = cols / FP8_ACT_BLOCK;
    if (row_end <= row_begin || n_tokens <= 0) return;
    /* planes [t][block][plane][32]: bytes 0..15 the even elements, 16..31 the odd */
    const size_t plane_bytes = (size_t)n_tokens * blocks32 * 128;
    int8_t *planes = kernel_scratch_get(&act_scratch, plane_bytes);
    memset(planes, 0, plane_bytes);
    for (int t = 0; t < n_tokens; t++) {
        const uint8_t *xc = x_codes + (size_t)t * cols;
        for (int b = 0; b < blocks32; b++) {
            int8_t *dst = planes + ((size_t)t * blocks32 + b) * 128;
            for (int i = 0; i < 16; i++) {
                const uint8_t even = xc[b * 32 + 2 * i], odd = xc[b * 32 + 2 * i + 1];
                dst[kernel_plane_index[even] * 32 + i] = kernel_plane_value[even];
                dst[kernel_plane_index[odd] * 32 + 16 + i] = kernel_plane_value[odd];
            }
        }
    }
    static const int8_t table_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    const int8x16_t table = vld1q_s8(table_values);
    for (int r = row_begin; r < row_end; r++) {
        const uint8_t *wr = w->packed + (size_t)r * (cols / 2);
        const uint8_t *ws = w->scales + (size_t)r * blocks32;
        for (int t = 0; t < n_tokens; t++) {
            const float *xs = x_scales + (size_t)t * xblocks;
            float acc = 0.0f;
            for (int b = 0; b < blocks32; b++) {
                const uint8x16_t packed = vld1q_u8(wr + (size_t)b * 16);
                const int8x16_t even = vqtbl1q_s8(table, vandq_u8(packed, vdupq_n_u8(15)));
                const int8x16_t odd = vqtbl1q_s8(table, vshrq_n_u8(packed, 4));
                const int8_t *pl = planes + ((size_t)t * blocks32 + b) * 128;
                int32x4_t d[4];
                for (int p = 0; p < 4; p++) {
                    const int8x16_t pe = vld1q_s8(pl + 32 * p), po = vld1q_s8(pl + 32 * p + 16);
                    int32x4_t s = vdupq_n_s32(0);
                    s = vpadalq_s16(s, vmull_s8(vget_low_s8(even), vget_low_s8(pe)));
                    s = vpadalq_s16(s, vmull_high_s8(even, pe));
                    s = vpadalq_s16(s, vmull_s8(vget_low_s8(odd), vget_low_s8(po)));
                    s = vpadalq_s16(s, vmull_high_s8(odd, po));
                    d[p] = s;
                }
                const int32x4_t l = vaddq_s32(vaddq_s32(d[0], vshlq_n_s32(d[1], 4)),
                                              vaddq_s32(vshlq_n_s32(d[2], 8), vshlq_n_s32(d[3], 12)));
                const int32_t sum = vaddvq_s32(l);
                const float block = (float)sum * 0x1p-10f;
                acc += block * (xs[b / 4] * kernel_e8m0(ws[b]));
            }
            y[(size_t)t * y_stride + r] = acc;
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Float products: four rows at a time, 4 x 4 tiles transposed in registers. */

/* Element c of row `row` as an f32 bit pattern loaded for 4 columns: returns the 4 values of
 * columns c..c+3 (zero past cols), as exact f32 (FP8 with the block scale applied). */
static inline float32x4_t row_values4(float_kind kind, const uint8_t *row, int c, int cols, float scale) {
    uint32_t bits[4] = {0, 0, 0, 0};
    const int n = cols - c < 4 ? cols - c : 4;
    if (kind == FLOAT_F32) {
        memcpy(bits, row + (size_t)c * 4, (size_t)n * 4);
        return vreinterpretq_f32_u32(vld1q_u32(bits));
    }
    if (kind == FLOAT_BF16) {
        uint16_t h[4] = {0, 0, 0, 0};
        memcpy(h, row + (size_t)c * 2, (size_t)n * 2);
        return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(h), 16));
    }
    uint8_t b[4] = {0, 0, 0, 0};
    memcpy(b, row + c, (size_t)n);
    const uint32x4_t codes = vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8((uint64_t)b[0] | (uint64_t)b[1] << 8 |
                                                                         (uint64_t)b[2] << 16 | (uint64_t)b[3] << 24))));
    /* e4m3 fields into an f32's (sign to 31, exponent and mantissa to 26..20): value * 2^-120 */
    const int32x4_t shifted = vshrq_n_s32(vreinterpretq_s32_u32(vshlq_n_u32(codes, 24)), 4);
    const uint32x4_t f = vandq_u32(vreinterpretq_u32_s32(shifted), vdupq_n_u32(0x87f00000u));
    return vmulq_f32(vmulq_f32(vreinterpretq_f32_u32(f), vdupq_n_f32(0x1p120f)), vdupq_n_f32(scale));
}

/* 4 consecutive elements (4 rows of one column of a MATRIX_GROUPS16 group) as exact f32. */
static inline float32x4_t group_values4(float_kind kind, const uint8_t *p, float scale) {
    if (kind == FLOAT_F32) return vld1q_f32((const float *)p);
    if (kind == FLOAT_BF16) return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)p), 16));
    uint8_t b[8] = {p[0], p[1], p[2], p[3], 0, 0, 0, 0};
    const int32x4_t d = vmovl_s16(vget_low_s16(vmovl_s8(vld1_s8((const int8_t *)b))));
    /* sign-extended code << 20: the sign fills bits 27..31, the fields land on 26..20 */
    const uint32x4_t f = vandq_u32(vreinterpretq_u32_s32(vshlq_n_s32(d, 20)), vdupq_n_u32(0x87f00000u));
    return vmulq_f32(vmulq_f32(vreinterpretq_f32_u32(f), vdupq_n_f32(0x1p120f)), vdupq_n_f32(scale));
}

/* Rows [row_begin, row_end), all inside MATRIX_GROUPS16 groups, 4-row quads of a group at a time
 * (whole quads are read, the rows outside the range not stored). */
static void grouped_matmul(float_kind kind, const uint8_t *data, int cols, const uint8_t *scales, int scale_cols,
                           const float *x, int x_stride, int n_tokens, float *y, int y_stride, int row_begin, int row_end) {
    const size_t eb = (size_t)float_kind_bytes(kind), col_bytes = 16 * eb;
    for (int r0 = row_begin - row_begin % 4; r0 < row_end; r0 += 4) {
        const uint8_t *base = data + (size_t)(r0 / 16) * cols * col_bytes + (size_t)(r0 % 16) * eb;
        for (int t0 = 0; t0 < n_tokens; t0 += 4) {
            const int nt = n_tokens - t0 < 4 ? n_tokens - t0 : 4;
            float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
            for (int c = 0; c < cols; c++) {
                const float s = kind == FLOAT_FP8 ? kernel_e8m0(scales[(size_t)(r0 / 128) * scale_cols + c / 128]) : 0.0f;
                const float32x4_t col = group_values4(kind, base + (size_t)c * col_bytes, s);
                for (int tt = 0; tt < nt; tt++)
                    acc[tt] = vaddq_f32(acc[tt], vmulq_f32(col, vdupq_n_f32(x[(size_t)(t0 + tt) * x_stride + c])));
            }
            for (int tt = 0; tt < nt; tt++) {
                float out[4];
                vst1q_f32(out, acc[tt]);
                for (int i = 0; i < 4; i++)
                    if (r0 + i >= row_begin && r0 + i < row_end) y[(size_t)(t0 + tt) * y_stride + r0 + i] = out[i];
            }
        }
    }
}

static void float_matmul(float_kind kind, const uint8_t *data, size_t row_bytes, int cols, const uint8_t *scales,
                         int scale_cols, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                         int row_begin, int row_end) {
    for (int r0 = row_begin; r0 < row_end; r0 += 4) {
        const int nr = row_end - r0 < 4 ? row_end - r0 : 4;
        const uint8_t *rows[4];
        int rix[4];
        for (int i = 0; i < 4; i++) {
            rix[i] = r0 + (i < nr ? i : nr - 1);
            rows[i] = data + (size_t)rix[i] * row_bytes;
        }
        for (int t0 = 0; t0 < n_tokens; t0 += 4) {
            const int nt = n_tokens - t0 < 4 ? n_tokens - t0 : 4;
            float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
            for (int c = 0; c < cols; c += 4) {
                float32x4_t v[4];
                for (int i = 0; i < 4; i++) {
                    const float s = kind == FLOAT_FP8 ? kernel_e8m0(scales[(size_t)(rix[i] / 128) * scale_cols + c / 128]) : 0.0f;
                    v[i] = row_values4(kind, rows[i], c, cols, s);
                }
                /* transpose: col[j] lane i = row i, column c + j */
                const float32x4_t t0v = vtrn1q_f32(v[0], v[1]), t1v = vtrn2q_f32(v[0], v[1]);
                const float32x4_t t2v = vtrn1q_f32(v[2], v[3]), t3v = vtrn2q_f32(v[2], v[3]);
                float32x4_t col[4];
                col[0] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0v), vreinterpretq_f64_f32(t2v)));
                col[1] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1v), vreinterpretq_f64_f32(t3v)));
                col[2] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0v), vreinterpretq_f64_f32(t2v)));
                col[3] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1v), vreinterpretq_f64_f32(t3v)));
                const int ncols = cols - c < 4 ? cols - c : 4;
                for (int j = 0; j < ncols; j++)
                    for (int tt = 0; tt < nt; tt++)
                        acc[tt] = vaddq_f32(acc[tt], vmulq_f32(col[j], vdupq_n_f32(x[(size_t)(t0 + tt) * x_stride + c + j])));
            }
            for (int tt = 0; tt < nt; tt++) {
                float out[4];
                vst1q_f32(out, acc[tt]);
                for (int i = 0; i < nr; i++) y[(size_t)(t0 + tt) * y_stride + r0 + i] = out[i];
            }
        }
    }
}

/* The whole groups of a MATRIX_GROUPS16 matrix through grouped_matmul, the rows after them
 * row-major. */
static void float_product(float_kind kind, int layout, int rows, const uint8_t *data, size_t row_bytes, int cols,
                          const uint8_t *scales, int scale_cols, const float *x, int x_stride, int n_tokens, float *y,
                          int y_stride, int row_begin, int row_end) {
    if (layout == MATRIX_GROUPS16) {
        const int rows16 = rows - rows % 16, end = row_end < rows16 ? row_end : rows16;
        if (row_begin < end)
            grouped_matmul(kind, data, cols, scales, scale_cols, x, x_stride, n_tokens, y, y_stride, row_begin, end);
        if (row_begin < rows16) row_begin = rows16;
    }
    if (row_begin < row_end)
        float_matmul(kind, data, row_bytes, cols, scales, scale_cols, x, x_stride, n_tokens, y, y_stride, row_begin,
                     row_end);
}

static void neon_matmul_bf16(const bf16_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                             int row_begin, int row_end) {
    float_product(FLOAT_BF16, w->layout, w->rows, (const uint8_t *)w->values, (size_t)w->cols * 2, w->cols, NULL, 0, x, x_stride, n_tokens, y,
                 y_stride, row_begin, row_end);
}

static void neon_matmul_f32(const f32_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                            int row_begin, int row_end) {
    float_matmul(FLOAT_F32, (const uint8_t *)w->values, (size_t)w->cols * 4, w->cols, NULL, 0, x, x_stride, n_tokens, y,
                 y_stride, row_begin, row_end);
}

static void neon_matmul_fp8_dequant(const fp8_matrix *w, const float *x, int x_stride, int n_tokens, float *y,
                                    int y_stride, int row_begin, int row_end) {
    float_product(FLOAT_FP8, w->layout, w->rows, w->codes, (size_t)w->cols, w->cols, w->scales, (w->cols + 127) / 128, x, x_stride, n_tokens, y,
                 y_stride, row_begin, row_end);
}

/* 4 heads x 16 outputs of sums in registers across all the rows (each row's product and add in
 * row order, as the scalar), then y * rescale + s; each row vector loaded serves 4 heads; the last
 * n % 4 outputs as the scalar. The first nh (1..4) of the 4 heads are used. fused (a constant after
 * inlining): one FMLA per product (the caller knows every product exact: the same bits). */
#define ROWS_ADD_HEADS 4
#define ROWS_ADD_VECTORS 4
static inline __attribute__((always_inline)) void weighted_rows_pass(float *y, const float *rescale, const float *a,
                                                                     int a_stride, const float *const *rows,
                                                                     int n_rows, int n, int i0, int nv, int nh,
                                                                     int fused) {
    float32x4_t acc[ROWS_ADD_HEADS][ROWS_ADD_VECTORS];
    for (int h = 0; h < ROWS_ADD_HEADS; h++)
        for (int v = 0; v < ROWS_ADD_VECTORS; v++) acc[h][v] = vdupq_n_f32(0.0f);
    for (int j = 0; j < n_rows; j++) {
        const float *x = rows[j] + i0;
        float32x4_t xv[ROWS_ADD_VECTORS];
        for (int v = 0; v < ROWS_ADD_VECTORS; v++) xv[v] = v < nv ? vld1q_f32(x + 4 * v) : vdupq_n_f32(0.0f);
        for (int h = 0; h < ROWS_ADD_HEADS; h++) {
            if (h >= nh) break;
            const float32x4_t av = vdupq_n_f32(a[(size_t)h * a_stride + j]);
            for (int v = 0; v < ROWS_ADD_VECTORS; v++)
                acc[h][v] = fused ? vfmaq_f32(acc[h][v], av, xv[v]) : vaddq_f32(acc[h][v], vmulq_f32(av, xv[v]));
        }
    }
    for (int h = 0; h < ROWS_ADD_HEADS; h++) {
        if (h >= nh) break;
        float *yh = y + (size_t)h * n + i0;
        for (int v = 0; v < ROWS_ADD_VECTORS; v++)
            if (v < nv) vst1q_f32(yh + 4 * v, vaddq_f32(vmulq_n_f32(vld1q_f32(yh + 4 * v), rescale[h]), acc[h][v]));
    }
}

static void neon_rescale_add_weighted_rows_f32(float *y, const float *rescale, const float *a, int a_stride,
                                               int n_heads, const float *const *rows, int n_rows, int n,
                                               int products_exact) {
    for (int h0 = 0; h0 < n_heads; h0 += ROWS_ADD_HEADS) {
        const int nh = n_heads - h0 < ROWS_ADD_HEADS ? n_heads - h0 : ROWS_ADD_HEADS;
        float *yh = y + (size_t)h0 * n;
        const float *ah = a + (size_t)h0 * a_stride;
        for (int i0 = 0; i0 + 4 <= n; i0 += 4 * ROWS_ADD_VECTORS) {
            const int nv = (n - i0) / 4 < ROWS_ADD_VECTORS ? (n - i0) / 4 : ROWS_ADD_VECTORS;
            if (products_exact)
                weighted_rows_pass(yh, rescale + h0, ah, a_stride, rows, n_rows, n, i0, nv, nh, 1);
            else
                weighted_rows_pass(yh, rescale + h0, ah, a_stride, rows, n_rows, n, i0, nv, nh, 0);
        }
        for (int h = 0; h < nh; h++)
            rescale_add_weighted_rows_range(yh + (size_t)h * n, rescale[h0 + h], ah + (size_t)h * a_stride, rows, n_rows,
                                            n - n % 4, n);
    }
}

const kernel_ops kernel_ops_neon = {
    .name = "neon",
    .matmul_fp8 = neon_matmul_fp8,
    .matmul_fp4 = neon_matmul_fp4,
    .matmul_fp8_dequant = neon_matmul_fp8_dequant,
    .matmul_bf16 = neon_matmul_bf16,
    .matmul_f32 = neon_matmul_f32,
    .rescale_add_weighted_rows_f32 = neon_rescale_add_weighted_rows_f32,
};
