/* Scalar reference kernels: the definition every faster variant must reproduce bit for bit. */
#include "kernels/kernels_internal.h"

#include <pthread.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* e4m3 value times 2^9 and e2m1 value times 2: exact integers, so block dot products are exact. */
int32_t kernel_e4m3_int[256];
const int32_t kernel_e2m1_int[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
const int8_t kernel_e2m1_bytes[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
#define e4m3_int_table kernel_e4m3_int
#define e2m1_int_table kernel_e2m1_int
int8_t kernel_plane_value[256];
uint8_t kernel_plane_index[256];
uint8_t kernel_e4m3_exponent[256];
static double e4m3_times_2p1000[256];

/* NaN codes (0x7f, 0xff) never come out of quantization (and are outside the kernel contract).
 * Priority 101: before the tables built from this one (below, priority 102). */
__attribute__((constructor(101))) static void kernel_tables_init(void) {
    for (int c = 0; c < 256; c++) {
        float v = e4m3_value_table[c];
        const int32_t k = isnan(v) ? 0 : (int32_t)(v * 512.0f);
        e4m3_int_table[c] = k;
        e4m3_times_2p1000[c] = ldexp((double)k, 1000 - 9);
        int32_t mag = k < 0 ? -k : k;
        int s = 0;
        while (mag >= 16) { /* k = m * 2^s with m < 16: only exact shifts occur (m has 4 bits) */
            mag >>= 1;
            s++;
        }
        const int p = s / 4;
        const int32_t v4 = mag << (s - 4 * p);
        kernel_e4m3_exponent[c] = (uint8_t)s;
        kernel_plane_index[c] = (uint8_t)p;
        kernel_plane_value[c] = (int8_t)(k < 0 ? -v4 : v4);
    }
}

size_t kernel_fp8_f64_act_bytes(int n_tokens, int cols) { return (size_t)n_tokens * cols * sizeof(double); }

void kernel_fp8_f64_act_prepare(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols, void *act) {
    (void)x_scales;
    double *xd = act;
    for (size_t i = 0; i < (size_t)n_tokens * cols; i++) xd[i] = e4m3_times_2p1000[x_codes[i]];
}

size_t kernel_fp4_words_bytes(int n_tokens, int cols) {
    return (size_t)n_tokens * (cols / 32) * (2 * KERNEL_FP4_WORDS_BYTES + sizeof(kernel_fp4_words_meta));
}

/* The words form's per-code tables: the exponent s of a nonzero k (0 for k = 0, so that it never
 * raises a block's largest; 15 in the second, so that it never lowers its smallest), and per
 * window shift the word A (k / 2^shift for s >= shift, else 0) and the word L (k for s < shift,
 * else 0). */
static uint8_t words_s_or_0[256], words_s_or_15[256];
static int16_t words_a[4][256], words_l[4][256];

__attribute__((constructor(102))) static void words_tables_init(void) {
    for (int c = 0; c < 256; c++) {
        const int32_t k = kernel_e4m3_int[c];
        const int s = kernel_e4m3_exponent[c];
        words_s_or_0[c] = (uint8_t)(k ? s : 0);
        words_s_or_15[c] = (uint8_t)(k ? s : 15);
        for (int shift = 0; shift < 4; shift++) {
            words_a[shift][c] = (int16_t)(k && s >= shift ? k / (1 << shift) : 0); /* exact */
            words_l[shift][c] = (int16_t)(k && s < shift ? k : 0);
        }
    }
}

int16_t kernel_e4m3_hi_words[128] __attribute__((aligned(64))), kernel_e4m3_lo_words[128] __attribute__((aligned(64)));
uint8_t kernel_e4m3_hi_word_lo_bytes[128] __attribute__((aligned(64))), kernel_e4m3_hi_word_hi_bytes[256] __attribute__((aligned(64)));
int32_t kernel_e4m3_lo_int[256];
int8_t kernel_e4m3_digits[KERNEL_E4M3_DIGITS][128] __attribute__((aligned(64)));
uint16_t kernel_e4m3_bf16[128] __attribute__((aligned(64))), kernel_e2m1_bf16[32] __attribute__((aligned(64)));

static uint16_t bf16_bits_exact(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16); /* every value tabled here has at most 8 significant bits */
}

__attribute__((constructor(102))) static void simd_tables_init(void) {
    for (int c = 0; c < 128; c++) {
        const int32_t k = kernel_e4m3_int[c]; /* >= 0 */
        kernel_e4m3_hi_words[c] = (int16_t)(k % 16 == 0 ? k / 16 : 0);
        kernel_e4m3_lo_words[c] = (int16_t)(k % 16 == 0 ? 0 : k);
        const int32_t d0 = ((k + 64) & 127) - 64, m = (k - d0) >> 7;
        const int32_t d1 = ((m + 64) & 127) - 64, d2 = (m - d1) >> 7;
        kernel_e4m3_digits[0][c] = (int8_t)d0;
        kernel_e4m3_digits[1][c] = (int8_t)d1;
        kernel_e4m3_digits[2][c] = (int8_t)d2;
        kernel_e4m3_bf16[c] = bf16_bits_exact((float)k * 0x1p-10f);
    }
    for (int c = 0; c < 256; c++) {
        const int32_t k = kernel_e4m3_int[c]; /* signed */
        const uint16_t hi = (uint16_t)(int16_t)(k % 16 == 0 ? k / 16 : 0);
        if (c < 128) kernel_e4m3_hi_word_lo_bytes[c] = (uint8_t)(hi & 0xff);
        kernel_e4m3_hi_word_hi_bytes[c] = (uint8_t)(hi >> 8);
        kernel_e4m3_lo_int[c] = k % 16 == 0 ? 0 : k;
    }
    for (int c = 0; c < 16; c++) kernel_e2m1_bf16[c] = bf16_bits_exact((float)kernel_e2m1_int[c]);
}

/* The window of one 32-block (kernel_fp4_words_prepare): its shift, and whether values lie below it. */
static inline int words_block_shift(const uint8_t *xc, int *low) {
    int s_max = 0, s_min = 15;
    for (int e = 0; e < 32; e++) {
        s_max = words_s_or_0[xc[e]] > s_max ? words_s_or_0[xc[e]] : s_max;
        s_min = words_s_or_15[xc[e]] < s_min ? words_s_or_15[xc[e]] : s_min;
    }
    const int shift = s_max > 11 ? s_max - 11 : 0;
    *low = s_min < shift;
    return shift;
}

/* One block's 32 words from a per-code table in the octet order: element 8o + r at word 8o +
 * {0, 4, 2, 6, 1, 5, 3, 7}[r] (r's three bits reversed). */
static inline void words_block(int16_t *dst, const int16_t *table, const uint8_t *xc) {
    for (int e = 0; e < 32; e += 8) {
        dst[e] = table[xc[e]];
        dst[e + 1] = table[xc[e + 4]];
        dst[e + 2] = table[xc[e + 2]];
        dst[e + 3] = table[xc[e + 6]];
        dst[e + 4] = table[xc[e + 1]];
        dst[e + 5] = table[xc[e + 5]];
        dst[e + 6] = table[xc[e + 3]];
        dst[e + 7] = table[xc[e + 7]];
    }
}

typedef struct fp4_words_prepare_job {
    const uint8_t *x_codes;
    const float *x_scales;
    int n_tokens, cols;
    void *act;
} fp4_words_prepare_job;

/* The tokens [t_begin, t_end) of the form: each token's entries are its own (the blocks of all
 * tokens interleave, but no two tokens share an entry), so token ranges can be written side by
 * side. */
static void fp4_words_prepare_tokens(void *ctx, int t_begin, int t_end) {
    const fp4_words_prepare_job *j = ctx;
    const int n_tokens = j->n_tokens, cols = j->cols, blocks = cols / 32, xblocks = cols / FP8_ACT_BLOCK;
    const uint8_t *x_codes = j->x_codes;
    const float *x_scales = j->x_scales;
    int16_t *words = j->act, *lows = (int16_t *)kernel_fp4_words_low(j->act, n_tokens, cols);
    kernel_fp4_words_meta *meta = (kernel_fp4_words_meta *)kernel_fp4_words_metas(j->act, n_tokens, cols);
    for (int t = t_begin; t < t_end; t++)
        for (int b = 0; b < blocks; b++) {
            const uint8_t *xc = x_codes + (size_t)t * cols + (size_t)b * 32;
            const size_t form = (size_t)b * n_tokens + t;
            int low;
            const int shift = words_block_shift(xc, &low);
            words_block(words + form * 32, words_a[shift], xc);
            uint16_t low_dwords = 0;
            if (low) {
                int16_t *l = lows + form * 32;
                words_block(l, words_l[shift], xc);
                for (int d = 0; d < 16; d++) low_dwords |= (uint16_t)((l[2 * d] | l[2 * d + 1]) != 0) << d;
            }
            kernel_fp4_words_meta *m = &meta[form];
            m->factor = ldexpf(1.0f, (low ? 0 : shift) - 10);
            m->x_scale = x_scales[(size_t)t * xblocks + b / 4];
            m->shift = (int16_t)shift;
            m->low = low_dwords;
        }
}

/* Prefill chunks prepare this form on the calling thread before the product's tasks start, the
 * other threads waiting (2.2% of a 512-token AVX-512 prefill's CPU time): the tokens are split
 * across the pool (inside a pool task it runs inline). */
void kernel_fp4_words_prepare(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols, void *act) {
    fp4_words_prepare_job j = {x_codes, x_scales, n_tokens, cols, act};
    kernels_parallel_light_rows(fp4_words_prepare_tokens, &j, n_tokens);
}

void kernel_fp4_row_words_prepare(const uint8_t *x_codes, int n_tokens, int cols, void *act) {
    kernel_fp4_row_chunk *chunk = act;
    for (int t = 0; t < n_tokens; t++)
        for (int c = 0; c < cols / 64; c++, chunk++) {
            const uint8_t *xc = x_codes + (size_t)t * cols + (size_t)c * 64;
            int low[2];
            for (int b = 0; b < 2; b++) chunk->shift[b] = words_block_shift(xc + 32 * b, &low[b]);
            chunk->low = low[0] | low[1];
            for (int e = 0; e < 64; e++) {
                const int shift = chunk->shift[e / 32], at = 16 * (e % 4) + e / 4;
                chunk->a[at] = words_a[shift][xc[e]];
                if (chunk->low) chunk->l[at] = words_l[shift][xc[e]];
            }
            for (int b = 0; b < 2; b++) chunk->factor[b] = ldexpf(1.0f, (chunk->low ? 0 : chunk->shift[b]) - 10);
            memset(chunk->pad, 0, sizeof chunk->pad);
        }
}

int kernel_fp8_quad_excess(const fp8_matrix *w, const int rows[4], const double *x, double *excess) {
    const uint32_t *first = w->low->row_first;
    if (first[rows[0]] == first[rows[0] + 1] && first[rows[1]] == first[rows[1] + 1] &&
        first[rows[2]] == first[rows[2] + 1] && first[rows[3]] == first[rows[3] + 1])
        return 0;
    memset(excess, 0, (size_t)(w->cols / FP8_ACT_BLOCK) * 4 * sizeof *excess);
    for (int i = 0; i < 4; i++) {
        const uint8_t *codes = w->codes + (size_t)rows[i] * w->cols;
        for (uint32_t k = first[rows[i]]; k < first[rows[i] + 1]; k++) {
            const int c = w->low->cols[k];
            excess[4 * (c / FP8_ACT_BLOCK) + i] += kernel_fp8_low_excess(codes[c]) * x[c];
        }
    }
    return 1;
}

/* The buffers a thread has grown, freed when it exits (the pool's workers end when the thread
 * count changes). Each variant keeps a handful, so a short list does. */
enum { SCRATCH_PER_THREAD = 32 };
typedef struct scratch_list {
    kernel_scratch *buffers[SCRATCH_PER_THREAD];
    int n;
} scratch_list;
static _Thread_local scratch_list thread_scratch;
static pthread_key_t scratch_exit_key;
static pthread_once_t scratch_exit_once = PTHREAD_ONCE_INIT;

static void scratch_free_at_exit(void *list) {
    scratch_list *l = list;
    for (int i = 0; i < l->n; i++) {
        free(l->buffers[i]->p);
        l->buffers[i]->p = NULL;
        l->buffers[i]->bytes = 0;
    }
    l->n = 0;
}

static void scratch_exit_key_create(void) { (void)pthread_key_create(&scratch_exit_key, scratch_free_at_exit); }

void *kernel_scratch_get(kernel_scratch *b, size_t bytes) {
    if (bytes > b->bytes) {
        if (!b->p) {
            pthread_once(&scratch_exit_once, scratch_exit_key_create);
            if (thread_scratch.n == 0) pthread_setspecific(scratch_exit_key, &thread_scratch);
            if (thread_scratch.n < SCRATCH_PER_THREAD) thread_scratch.buffers[thread_scratch.n++] = b;
        }
        free(b->p);
        b->bytes = (bytes + 4095) & ~(size_t)4095;
        b->p = aligned_alloc(64, b->bytes);
        if (!b->p) abort(); /* a few MB at most: running out here is not recoverable */
    }
    return b->p;
}

static void scalar_quantize_fp8_act(const float *x, int n, uint8_t *codes, float *scales) {
    const float inv_qmax = 1.0f / 448.0f;
    for (int b = 0; b < n / FP8_ACT_BLOCK; b++) {
        const float *xb = x + b * FP8_ACT_BLOCK;
        float amax = 0.0f;
        for (int i = 0; i < FP8_ACT_BLOCK; i++) amax = fmaxf(amax, fabsf(xb[i]));
        amax = fmaxf(amax, 1e-4f);
        float s = pow2_scale_ceil(amax, inv_qmax);
        scales[b] = s;
        for (int i = 0; i < FP8_ACT_BLOCK; i++) {
            float q = xb[i] / s;
            q = fminf(fmaxf(q, -448.0f), 448.0f);
            codes[b * FP8_ACT_BLOCK + i] = e4m3_encode_rne(q);
        }
    }
}

static void scalar_matmul_fp8(const fp8_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                int y_stride, int row_begin, int row_end) {
    const int cols = w->cols, blocks = cols / FP8_ACT_BLOCK, scale_cols = (cols + 127) / 128;
    for (int t = 0; t < n_tokens; t++) {
        const uint8_t *xc = x_codes + (size_t)t * cols;
        const float *xs = x_scales + (size_t)t * blocks;
        for (int r = row_begin; r < row_end; r++) {
            const uint8_t *wr = w->codes + (size_t)r * cols;
            const uint8_t *ws = w->scales + (size_t)(r / 128) * scale_cols;
            float acc = 0.0f;
            for (int b = 0; b < blocks; b++) {
                int64_t sum = 0;
                for (int i = b * FP8_ACT_BLOCK; i < (b + 1) * FP8_ACT_BLOCK; i++)
                    sum += (int64_t)e4m3_int_table[wr[i]] * e4m3_int_table[xc[i]];
                float block = (float)sum * 0x1p-18f;
                acc += block * (xs[b] * e8m0_to_f32(ws[b]));
            }
            y[(size_t)t * y_stride + r] = acc;
        }
    }
}

static void scalar_matmul_fp4(const fp4_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                int y_stride, int row_begin, int row_end) {
    const int cols = w->cols, blocks32 = cols / 32;
    for (int t = 0; t < n_tokens; t++) {
        const uint8_t *xc = x_codes + (size_t)t * cols;
        const float *xs = x_scales + (size_t)t * (cols / FP8_ACT_BLOCK);
        for (int r = row_begin; r < row_end; r++) {
            const uint8_t *wr = w->packed + (size_t)r * (cols / 2);
            const uint8_t *ws = w->scales + (size_t)r * blocks32;
            float acc = 0.0f;
            for (int c = 0; c < blocks32; c++) {
                int32_t sum = 0;
                for (int j = c * 16; j < (c + 1) * 16; j++) {
                    uint8_t byte = wr[j];
                    sum += e2m1_int_table[byte & 15] * e4m3_int_table[xc[2 * j]];
                    sum += e2m1_int_table[byte >> 4] * e4m3_int_table[xc[2 * j + 1]];
                }
                float block = (float)sum * 0x1p-10f;
                acc += block * (xs[c / 4] * e8m0_to_f32(ws[c]));
            }
            y[(size_t)t * y_stride + r] = acc;
        }
    }
}

/* Float products accumulate sequentially over the input dimension: acc = acc + w*x, the
 * product rounded to f32 first (no FMA). This is the order of the official code's f32 GEMMs on
 * CPU (BLAS kernels keep one accumulator per output), and it matters: the hyper-connection
 * mixing feeds sigmoids and a Sinkhorn whose bf16 outputs flip with the last bit of its input. */
float dot_f32(const float *a, const float *b, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) {
        const float p = a[i] * b[i];
        acc += p;
    }
    return acc;
}

float dot_f32_bf16(const float *a, const uint16_t *b, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) {
        const float p = a[i] * bf16_to_f32(b[i]);
        acc += p;
    }
    return acc;
}

static void scalar_matmul_fp8_dequant(const fp8_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                        int row_begin, int row_end) {
    const int cols = w->cols, scale_cols = (cols + 127) / 128;
    for (int t = 0; t < n_tokens; t++) {
        const float *xt = x + (size_t)t * x_stride;
        for (int r = row_begin; r < row_end; r++) {
            size_t step;
            const uint8_t *wr = w->codes + matrix_row_origin(w->layout, w->rows, cols, r, &step);
            const uint8_t *ws = w->scales + (size_t)(r / 128) * scale_cols;
            float acc = 0.0f;
            for (int i = 0; i < cols; i++) {
                const float wv = e4m3_to_f32(wr[(size_t)i * step]) * e8m0_to_f32(ws[i / 128]); /* exact: e4m3 times 2^k */
                const float p = wv * xt[i];
                acc += p;
            }
            y[(size_t)t * y_stride + r] = acc;
        }
    }
}

static void scalar_matmul_bf16(const bf16_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                 int row_begin, int row_end) {
    for (int t = 0; t < n_tokens; t++) {
        const float *xt = x + (size_t)t * x_stride;
        for (int r = row_begin; r < row_end; r++) {
            size_t step;
            const uint16_t *wr = w->values + matrix_row_origin(w->layout, w->rows, w->cols, r, &step);
            float acc = 0.0f;
            for (int i = 0; i < w->cols; i++) {
                const float p = xt[i] * bf16_to_f32(wr[(size_t)i * step]);
                acc += p;
            }
            y[(size_t)t * y_stride + r] = acc;
        }
    }
}

static void scalar_matmul_f32(const f32_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                int row_begin, int row_end) {
    for (int t = 0; t < n_tokens; t++)
        for (int r = row_begin; r < row_end; r++)
            y[(size_t)t * y_stride + r] = dot_f32(x + (size_t)t * x_stride, w->values + (size_t)r * w->cols, w->cols);
}

static void scalar_rescale_add_weighted_rows_f32(float *y, const float *rescale, const float *a, int a_stride,
                                                 int n_heads, const float *const *rows, int n_rows, int n,
                                                 int products_exact) {
    for (int h = 0; h < n_heads; h++)
        rescale_add_weighted_rows_range(y + (size_t)h * n, rescale[h], a + (size_t)h * a_stride, rows, n_rows, 0, n);
}

const kernel_ops kernel_ops_scalar = {
    .name = "scalar",
    .quantize_fp8_act = scalar_quantize_fp8_act,
    .matmul_fp8 = scalar_matmul_fp8,
    .matmul_fp4 = scalar_matmul_fp4,
    .matmul_fp8_dequant = scalar_matmul_fp8_dequant,
    .matmul_bf16 = scalar_matmul_bf16,
    .matmul_f32 = scalar_matmul_f32,
    .rescale_add_weighted_rows_f32 = scalar_rescale_add_weighted_rows_f32,
};
