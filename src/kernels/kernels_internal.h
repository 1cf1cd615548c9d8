/* What the kernel variants share: the table of entry points each variant fills, and the exact
 * integer forms of the FP8/FP4 codes. Only src/kernels/ and the kernel tests include this. */
#ifndef DS4F_KERNELS_INTERNAL_H
#define DS4F_KERNELS_INTERNAL_H

#include "kernels/kernels.h"
#include "format/dtype.h"

#include <string.h>

typedef void (*matmul_q_fn)(const void *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                            int y_stride, int row_begin, int row_end);

/* One implementation of every product. A variant may leave an entry NULL: its base's (or the
 * scalar one) is used. */
typedef struct kernel_ops {
    const char *name;
    /* The variant that fills this one's NULL entries (NULL: the scalar reference). */
    const struct kernel_ops *base;
    /* KERNELS_PLAIN_C_*: which copy of plain C loops goes with this variant (0: its base's). */
    int plain_c_level;
    void (*quantize_fp8_act)(const float *x, int n, uint8_t *codes, float *scales);
    void (*matmul_fp8)(const fp8_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                       int y_stride, int row_begin, int row_end);
    void (*matmul_fp4)(const fp4_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                       int y_stride, int row_begin, int row_end);
    void (*matmul_fp8_dequant)(const fp8_matrix *w, const float *x, int x_stride, int n_tokens, float *y,
                               int y_stride, int row_begin, int row_end);
    void (*matmul_bf16)(const bf16_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                        int row_begin, int row_end);
    void (*matmul_f32)(const f32_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                       int row_begin, int row_end);
    void (*rescale_add_weighted_rows_f32)(float *y, const float *rescale, const float *a, int a_stride, int n_heads,
                                          const float *const *rows, int n_rows, int n, int products_exact);
    /* The activation forms of the FP8 and FP4 products (f64 values, byte planes), prepared once
     * per product and shared by every thread that computes some of its rows. NULL: the variant
     * prepares nothing and the par_* forms call the plain products. */
    size_t (*fp8_act_bytes)(int n_tokens, int cols);
    void (*fp8_act_prepare)(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols, void *act);
    void (*matmul_fp8_prepared)(const fp8_matrix *w, const void *act, const float *x_scales, int n_tokens, float *y,
                                int y_stride, int row_begin, int row_end);
    size_t (*fp4_act_bytes)(int n_tokens, int cols);
    void (*fp4_act_prepare)(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols, void *act);
    void (*matmul_fp4_prepared)(const fp4_matrix *w, const void *act, const float *x_scales, int n_tokens, float *y,
                                int y_stride, int row_begin, int row_end);
} kernel_ops;

extern const kernel_ops kernel_ops_scalar;
#if defined(__x86_64__) || defined(_M_X64)
extern const kernel_ops kernel_ops_avx2;
/* AVX2 plus VEX-encoded VNNI (VPDPBUSD on ymm) for the FP4 x FP8 products. */
extern const kernel_ops kernel_ops_avxvnni;
extern const kernel_ops kernel_ops_avx512;
/* AVX-512 with the AMX tile unit for the FP8 and FP4 products of prefill. */
extern const kernel_ops kernel_ops_amx;
/* Whether the operating system lets this process use the tile registers (asked once). */
int kernels_amx_permitted(void);
#endif
#if defined(__aarch64__)
extern const kernel_ops kernel_ops_neon;
#endif

/* The scalar rescale_add_weighted_rows_f32 of one head on the outputs [i_begin, i_end): the
 * reference, and the SIMD variants' last outputs past their vector width. */
static inline void rescale_add_weighted_rows_range(float *y, float rescale, const float *a, const float *const *rows,
                                                   int n_rows, int i_begin, int i_end) {
    for (int i = i_begin; i < i_end; i++) {
        float s = 0.0f;
        for (int j = 0; j < n_rows; j++) {
            const float p = a[j] * rows[j][i];
            s = s + p;
        }
        const float kept = y[i] * rescale;
        y[i] = kept + s;
    }
}

/* The variant in use (entries all filled). */
extern kernel_ops kernels_current;

/* Looks a variant up by name (kernels_variant_names); NULL when this binary has none
 * or the CPU cannot run it. Tests run every available variant side by side through this. */
const kernel_ops *kernels_lookup(const char *name);

/* e4m3 code -> value * 2^9 (an integer, |k| <= 229376 = 448 * 512); NaN codes give 0.
 * e2m1 nibble -> value * 2 (an integer in [-12, 12]). */
extern int32_t kernel_e4m3_int[256];
extern const int32_t kernel_e2m1_int[16];
/* The same e2m1 integers as bytes: the VPSHUFB table of the SIMD words forms. */
extern const int8_t kernel_e2m1_bytes[16];

/* The activation byte planes of the VNNI / dot-product FP4 kernels: k = m * 2^s (m < 16, s < 15)
 * lies in plane s / 4 as the signed byte m * 2^(s mod 4) (at most 120). */
extern int8_t kernel_plane_value[256];
extern uint8_t kernel_plane_index[256];

/* The f64 activation form of the x86 FP8 x FP8 kernels: each code as value * 2^1000 (exact), so
 * products with weight codes read as value * 2^-1016 are value * 2^-16, never subnormal. */
size_t kernel_fp8_f64_act_bytes(int n_tokens, int cols);
void kernel_fp8_f64_act_prepare(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols, void *act);

/* The several-token activation form of the x86 FP4 x FP8 kernels whose lanes are rows (AVX-512,
 * AVX-VNNI: kernels_avx512.c describes the method): each code's k = m * 2^s (m < 16; s is
 * kernel_e4m3_exponent) as one int16 word per element, per token and 32-block "in its window":
 * with s_max the largest s of a nonzero k of the block and shift = max(0, s_max - 11), word A
 * holds k / 2^shift (exact: |A| <= 15 * 2^11 = 30720) for every k with s >= shift, and word L
 * holds k (|k| < 16 * 2^(shift - 1) <= 64) for the few below (quantized Gaussian activations: a
 * few blocks in a hundred have one). Per block and token (the tokens of a block adjacent): 32
 * words A in the order the weight conversions pair the columns, the octet order: the dwords 4o
 * .. 4o + 3 hold the pairs of elements (8o, 8o + 4), (8o + 2, 8o + 6), (8o + 1, 8o + 5), (8o + 3,
 * 8o + 7), which one packed weight dword's two nibble sets give (fp4_group_words); then as many
 * words L (written only for blocks whose meta says low); then the metas. */
typedef struct kernel_fp4_words_meta {
    float factor;   /* 2^(shift - 10) when the block has no L words, else 2^-10 */
    float x_scale;  /* the activation scale of the block's 128-element chunk */
    int16_t shift;  /* the window's (A = k / 2^shift) */
    uint16_t low;   /* bit d: dword d of the words L (a word pair) is nonzero; with any, the block
                     * sum is (A . w) * 2^shift + L . w, where only those dwords' products count */
} kernel_fp4_words_meta;

/* Lookup tables of the AVX-512 and AMX forms, indexed by an e4m3 magnitude code 0..127 (the sign
 * bit applied after the lookup; the NaN code reads as 0), 64-byte aligned as VPERMI2B / VPERMI2W
 * take them. They are built in kernels_scalar.c: a constructor in a file compiled with the
 * AVX-512 flags would itself run AVX-512 instructions at load, on every CPU (SIGILL on AVX2-only
 * ones; `make test` checks that no such file has a constructor).
 *  - hi / lo words of the AVX-512 FP8 int16 form: k / 16 when 16 divides k, else k as the lo;
 *  - the three balanced base-128 digits of k (AMX FP8, kernels_amx.c);
 *  - bf16 bits of k * 2^-10, and of each e2m1 nibble's 2 * value (entries 16..31 zero; AMX FP4). */
#define KERNEL_E4M3_DIGITS 3
extern int16_t kernel_e4m3_hi_words[128], kernel_e4m3_lo_words[128];
/* The one-token AVX-512 FP8 form's VPERMI2B tables of the signed hi word k / 16 (0 unless 16
 * divides k): its low byte for the 128 magnitudes (a negative code's is the negation), its high
 * byte for every code (codes 0..127, then 128..255); and by the whole code the signed lo k (0
 * when 16 divides k), which its low-code corrections add. */
extern uint8_t kernel_e4m3_hi_word_lo_bytes[128], kernel_e4m3_hi_word_hi_bytes[256];
extern int32_t kernel_e4m3_lo_int[256];
extern int8_t kernel_e4m3_digits[KERNEL_E4M3_DIGITS][128];
extern uint16_t kernel_e4m3_bf16[128], kernel_e2m1_bf16[32];

/* The FP8 x FP8 words form of 4 or more tokens (AVX-512 and AVX2; kernels_avx512.c states the
 * method): per token and 128-block the 128 hi words then the 128 lo words of its codes (k = 16 hi
 * + lo, one of the two zero); then per token and block the mask of the word pairs (2j, 2j + 1)
 * holding a lo; then per token and block |x_hi|_2^2 (exact, in f64). */
#define KERNEL_FP8_WORDS_BLOCK_BYTES (2 * FP8_ACT_BLOCK * 2)
static inline size_t kernel_fp8_words_bytes(int n_tokens, int cols) {
    const size_t token_blocks = (size_t)n_tokens * (cols / FP8_ACT_BLOCK);
    return token_blocks * (KERNEL_FP8_WORDS_BLOCK_BYTES + sizeof(uint64_t) + sizeof(double));
}
static inline void kernel_fp8_words_form(const void *act, int n_tokens, int cols, const int16_t **words,
                                         const uint64_t **masks, const double **norms) {
    const size_t token_blocks = (size_t)n_tokens * (cols / FP8_ACT_BLOCK);
    *words = act;
    *masks = (const uint64_t *)((const uint8_t *)act + token_blocks * KERNEL_FP8_WORDS_BLOCK_BYTES);
    *norms = (const double *)(*masks + token_blocks);
}
/* Whether a (token, row tile) may overflow int32 in A = sum wh xh: largest row |w_hi|_2^2 (an f32
 * sum, relative error below 2^-17) times the token's |x_hi|_2^2 at or above 2^61. */
static inline int kernel_fp8_words_wide(float w_norm2, double x_norm2) { return (double)w_norm2 * x_norm2 >= 0x1p61; }

#define KERNEL_FP4_WORDS_BYTES 64 /* 32 int16 per block and token, A and L each */
extern uint8_t kernel_e4m3_exponent[256];

size_t kernel_fp4_words_bytes(int n_tokens, int cols);
void kernel_fp4_words_prepare(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols, void *act);
static inline const int16_t *kernel_fp4_words_low(const void *act, int n_tokens, int cols) {
    return (const int16_t *)act + (size_t)n_tokens * (cols / 32) * 32;
}
static inline const kernel_fp4_words_meta *kernel_fp4_words_metas(const void *act, int n_tokens, int cols) {
    return (const kernel_fp4_words_meta *)((const uint8_t *)act +
                                           (size_t)n_tokens * (cols / 32) * 2 * KERNEL_FP4_WORDS_BYTES);
}

/* The 1 to 3 token activation form of the AVX2 FP4 x FP8 products, whose lanes are columns (the
 * weights read as they come, kernels_avx2_fp4.h): the same words A and L "in the block's window"
 * as kernel_fp4_words_prepare (each 32-block's shift, A = k / 2^shift, L = k below it), laid out
 * per token and 64-element chunk (two blocks) in the order one 32-byte load of packed weights
 * expands to: a[16 r + m] and l[16 r + m] hold element 4m + r (r = 0..3, m = 0..15), so vector r of
 * the chunk pairs with the weights of the packed words' r-th nibbles. A chunk is low when either
 * block has L words; then both blocks' sums are rebuilt as (A . w) * 2^shift + L . w and scaled
 * by factor 2^-10, otherwise by 2^(shift - 10) (the same f32, as in the words form). The l words
 * are written only for low chunks. */
typedef struct kernel_fp4_row_chunk {
    int16_t a[64];
    int16_t l[64];
    float factor[2]; /* per block */
    int32_t shift[2];
    int32_t low;
    int32_t pad[3];
} kernel_fp4_row_chunk; /* 288 bytes: the 32-byte vectors stay aligned in an aligned form */
static inline size_t kernel_fp4_row_words_bytes(int n_tokens, int cols) {
    return (size_t)n_tokens * (cols / 64) * sizeof(kernel_fp4_row_chunk);
}
void kernel_fp4_row_words_prepare(const uint8_t *x_codes, int n_tokens, int cols, void *act);

/* The "raised" f64 weight form of the x86 FP8 x FP8 kernels, used when the matrix lists its low
 * codes (fp8_low_codes): the e4m3 sign, exponent and mantissa fields placed at f64 bits 63 and
 * 55..49 with bit 61 set read as value * 2^-504, a normal f64, for every code with a nonzero
 * exponent field; a code whose field is zero (mantissa m) reads sign * (1 + m/8) * 2^-511 instead
 * of sign * m * 2^-513, too much by sign * (8 - m) * 2^-514. The list holds those and a few more
 * small codes (exponent fields 1 to 4), whose reading is exact. Without a list the kernels place
 * the fields as they are (value * 2^-1016: exact too, but the e4m3 subnormals become f64
 * subnormals, which cost a microcode assist per FMA on Intel cores). */
static inline double kernel_fp8_low_value(uint8_t code) { /* exact value * 2^-504, any listed code */
    return (double)kernel_e4m3_int[code] * 0x1p-513;
}
static inline double kernel_fp8_low_excess(uint8_t code) { /* raised reading - value * 2^-504 */
    /* a table, not a branch on the sign: the signs of the low codes are a coin toss; the other
     * listed codes (exponent field 1..4) read exactly */
#define LOW_EXCESS(m) ((8 - (m)) * 0x1p-514)
    static const double excess[16] = {LOW_EXCESS(0),  LOW_EXCESS(1),  LOW_EXCESS(2),  LOW_EXCESS(3),
                                      LOW_EXCESS(4),  LOW_EXCESS(5),  LOW_EXCESS(6),  LOW_EXCESS(7),
                                      -LOW_EXCESS(0), -LOW_EXCESS(1), -LOW_EXCESS(2), -LOW_EXCESS(3),
                                      -LOW_EXCESS(4), -LOW_EXCESS(5), -LOW_EXCESS(6), -LOW_EXCESS(7)};
#undef LOW_EXCESS
    return (code & 0x78) ? 0.0 : excess[((code >> 4) & 8) | (code & 7)];
}

/* The scale ranges within which the FP4 kernels fold a power of two into their scales (AMX: the
 * weight scale into the bf16 weights; AVX-512 words: the block factor into xs * ws), where each
 * kernel shows the bits stay the scalar's: activation scales 0 or of magnitude 2^-40 .. 2^40,
 * weight scales 2^-64 .. 2^64 (E8M0 bytes 63 .. 191). */
#define KERNEL_FP4_FOLD_W_E8M0_MIN (127 - 64)
#define KERNEL_FP4_FOLD_W_E8M0_MAX (127 + 64)
static inline int kernel_fp4_fold_x_scale(float xs) {
    const float a = xs < 0 ? -xs : xs;
    return a == 0.0f || (a >= 0x1p-40f && a <= 0x1p40f); /* NaN fails too */
}

/* Bytes of activation form in one token slice of the x86 several-token products (FP8 x FP8 on
 * both variants, there a tile of tokens x columns, see below; FP4 x FP8 on AVX2 and AVX-512),
 * which take the tokens a slice at a time so that the form
 * (f64 activations for FP8, 8 bytes per element: a 256-token chunk of 4096 columns is 8 MB)
 * stays in L2 while every row group of the matrix passes over it; each weight block is then
 * converted once per slice instead of once per call, which costs little. 4096 x 4096, 1 thread,
 * AVX-512 (8 rows at a time) with 256 tokens: 274 ms as one slice, 186 in 512 KB slices (185 at
 * 1 MB, 221 at 256 KB and at 2 MB), 64 tokens: 55 -> 48 ms; AVX2: 256 tokens 583 -> 279, 64
 * tokens 150 -> 76 (a busier host). */
#define KERNEL_SLICE_FORM_BYTES (512 * 1024)

/* Tokens per slice of the FP4 words form: at most form_bytes (KERNEL_SLICE_FORM_BYTES unless a
 * kernel measured otherwise) of the words A and metas the kernel reads for every block (the words
 * L are rarely read), at least 4 tokens, and the call's tokens split into slices of equal size: a
 * short last slice converts every weight block again for a few tokens. */
static inline int kernel_fp4_words_slice(int n_tokens, int cols, size_t form_bytes) {
    const size_t token_bytes = (size_t)(cols / 32) * (KERNEL_FP4_WORDS_BYTES + sizeof(kernel_fp4_words_meta));
    int slice = (int)(form_bytes / token_bytes);
    if (slice < 4) slice = 4;
    if (slice >= n_tokens) return n_tokens;
    const int slices = (n_tokens + slice - 1) / slice;
    return (n_tokens + slices - 1) / slices;
}

/* The tiles of the x86 several-token FP8 x FP8 products: *tokens per slice and *blocks (of 128
 * columns) per column tile, at most form_bytes (KERNEL_SLICE_FORM_BYTES unless a kernel measured
 * otherwise) of activation form (block_bytes per token and block: 1 KB of f64, or the int16
 * form's 512 bytes). A slice of whole rows of a wide matrix holds few tokens (8 at 8192 columns),
 * and every weight block is converted once per slice, as many instructions per code as 4 tokens'
 * FMAs: so the tokens come max_tokens at a time (or all of them) and the columns in tiles narrow
 * enough for them. */
static inline void kernel_fp8_tile_shape(int n_tokens, int cols, size_t block_bytes, size_t form_bytes, int max_tokens,
                                         int *tokens, int *blocks) {
    const int all_blocks = cols / FP8_ACT_BLOCK;
    int t = n_tokens < max_tokens ? n_tokens : max_tokens;
    int b = (int)(form_bytes / ((size_t)t * block_bytes));
    if (b >= all_blocks) { /* whole rows: as many tokens as fit */
        b = all_blocks;
        t = (int)(form_bytes / ((size_t)all_blocks * block_bytes));
        if (t > n_tokens) t = n_tokens;
    }
    *tokens = t < 1 ? 1 : t;
    *blocks = b < 1 ? 1 : b;
}

/* The rows of one pass of n over an FP8 matrix from row r0, nr of them real (a short last pass
 * repeats its last row: computed, not stored): their indices, codes and scale rows. */
static inline void kernel_fp8_pass_rows(const fp8_matrix *w, int r0, int nr, int n, int *rows, const uint8_t **codes,
                                        const uint8_t **scales) {
    for (int i = 0; i < n; i++) {
        rows[i] = r0 + (i < nr ? i : nr - 1);
        codes[i] = w->codes + (size_t)rows[i] * w->cols;
        scales[i] = w->scales + (size_t)(rows[i] / 128) * ((w->cols + 127) / 128);
    }
}

/* One-token FP8 decode in row quads (the x86 variants): the codes of the quad after the one at r0,
 * for the caller to bring into L2 while it computes this one (4 * cols contiguous bytes, 512 per
 * 128-column block), or NULL. Only rows of up to 2048 columns: a quad of them ends every 16 blocks
 * or fewer and its four streams would start cold, more than the hardware prefetchers follow from
 * one core; with 4096 columns or more the same prefetch lost 5-10% (AVX-512, from RAM, 1 token,
 * 2 threads: 32768 x 1024 14.9 -> 21.5 GB/s, 4096 x 2048 14.0 -> 18.4; AVX2 32768 x 1024 11.9 ->
 * 18.7). */
static inline const uint8_t *kernel_fp8_decode_next_quad(const fp8_matrix *w, int r0, int row_end) {
    return w->cols <= 2048 && r0 + 4 < row_end ? w->codes + (size_t)(r0 + 4) * w->cols : NULL;
}

/* The list entries of a row from column col0 on: [*next, *end) (the row's entries ascend). */
static inline void kernel_fp8_low_range(const fp8_low_codes *low, int row, int col0, uint32_t *next, uint32_t *end) {
    *next = low->row_first[row];
    *end = low->row_first[row + 1];
    while (*next < *end && low->cols[*next] < col0) ++*next;
}

/* In a tile row holding columns [off, off + FP8_ACT_BLOCK) of a row in the raised form, the low
 * codes' readings replaced by their exact values; *next walks the row's list entries (ascending)
 * up to end, so successive blocks continue where the last stopped. */
static inline void kernel_fp8_tile_patch_low(double *tile_row, const uint8_t *row_codes, const fp8_low_codes *low,
                                             uint32_t *next, uint32_t end, int off) {
    for (; *next < end && low->cols[*next] < off + FP8_ACT_BLOCK; ++*next) {
        const int c = low->cols[*next];
        tile_row[c - off] = kernel_fp8_low_value(row_codes[c]);
    }
}

/* The raised reading's excess in the block sums of 4 rows against one token's f64 activations
 * (value * 2^1000): excess[4 * b + i] for block b and row rows[i], in the sums' units (value *
 * 2^496). Each term is a 4-bit integer times an activation and a power of two, at most 128 per
 * block: every sum is exact. Returns 0, excess untouched, when the rows have no low code. */
int kernel_fp8_quad_excess(const fp8_matrix *w, const int rows[4], const double *x, double *excess);

/* The par_* product call a pool task is running on this thread (a number unique to the call; 0
 * outside one): lets a kernel compute what depends only on the call's activations once per thread
 * and call instead of once per row range. */
unsigned long long kernel_call_id(void);

/* Per-thread working memory of a variant (activation forms, tiles): grown on demand and kept, so
 * the steady state allocates nothing per call. Each variant keeps its own _Thread_local buffers. */
typedef struct kernel_scratch {
    void *p;
    size_t bytes;
} kernel_scratch;
void *kernel_scratch_get(kernel_scratch *b, size_t bytes);

/* The float products (BF16, F32, and FP8 used dequantized) of the SIMD variants: one description
 * of the weights whatever their type, so each variant writes its product once for all three. */
typedef enum { FLOAT_F32, FLOAT_BF16, FLOAT_FP8 } float_kind;

static inline int float_kind_bytes(float_kind k) { return k == FLOAT_F32 ? 4 : k == FLOAT_BF16 ? 2 : 1; }

typedef struct float_matrix {
    float_kind kind;
    const uint8_t *data;
    size_t row_bytes;
    int cols;
    const uint8_t *scales; /* FP8: E8M0 [ceil(rows/128)][ceil(cols/128)] */
    int scale_cols;
    int grouped; /* every row this call reads is in a MATRIX_GROUPS16 group */
} float_matrix;

/* Several tokens' activations packed for the float products: column tile k (tile_cols columns) of
 * token t at xp[(k * n_tokens + t) * tile_cols], so that a pass over the tokens reads contiguous
 * memory. In place the tokens' rows lie x_stride apart, in the model a power of two (16 to 128
 * KB), all in the same cache sets. A last partial tile leaves the rest of its rows unwritten. */
static inline void kernel_pack_column_tiles(float *xp, const float *x, int x_stride, int n_tokens, int cols,
                                            int tile_cols) {
    for (int k = 0; k * tile_cols < cols; k++) {
        const int ncols = cols - k * tile_cols < tile_cols ? cols - k * tile_cols : tile_cols;
        for (int t = 0; t < n_tokens; t++) {
            float *dst = xp + ((size_t)k * n_tokens + t) * tile_cols;
            const float *src = x + (size_t)t * x_stride + (size_t)k * tile_cols;
            /* a whole tile by a copy of constant size (the callers' tile_cols), which the compiler
             * makes a few vector moves; a variable-size memcpy of 256 bytes went to REP MOVSQ and
             * its start-up: 10% of wo_a's time in a 256-token chunk (perf) */
            if (ncols == tile_cols) memcpy(dst, src, (size_t)tile_cols * sizeof(float));
            else memcpy(dst, src, (size_t)ncols * sizeof(float));
        }
    }
}

static inline float_matrix float_matrix_bf16(const bf16_matrix *w) {
    return (float_matrix){FLOAT_BF16, (const uint8_t *)w->values, (size_t)w->cols * 2, w->cols, NULL, 0, 0};
}
static inline float_matrix float_matrix_f32(const f32_matrix *w) {
    return (float_matrix){FLOAT_F32, (const uint8_t *)w->values, (size_t)w->cols * 4, w->cols, NULL, 0, 0};
}
static inline float_matrix float_matrix_fp8(const fp8_matrix *w) {
    return (float_matrix){FLOAT_FP8, w->codes, (size_t)w->cols, w->cols, w->scales, (w->cols + 127) / 128, 0};
}

/* E8M0 byte -> 2^(e-127) as f32 (byte 0 is the subnormal 2^-127); 255 (NaN) is refused at load. */
static inline float kernel_e8m0(uint8_t e) { return e8m0_to_f32(e); }

#endif
