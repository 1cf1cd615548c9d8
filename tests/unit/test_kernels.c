/* Kernel variants against the scalar reference, bit for bit: every variant this machine runs, on
 * random inputs of awkward sizes (rows and columns that are not multiples of the SIMD widths,
 * row ranges that start mid-tile, several tokens, strides wider than the rows) with the extreme
 * values of each format (largest codes, subnormals, negative zero, extreme block scales). The
 * thread pool is checked the same way: par_* at 1, 2 and 3 threads equals the plain call. */
#include "test.h"

#include "kernels/kernels_internal.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* every variant but the scalar reference */
static const char *const *const variants = kernels_variant_names + 1;

/* E4M3 codes: mostly random, with the extremes over-represented; never the NaN codes. */
static uint8_t random_e4m3(void) {
    static const uint8_t special[] = {0x00, 0x80, 0x01, 0x81, 0x07, 0x08, 0x7e, 0xfe, 0x7d, 0x3f};
    uint8_t c = rnd() % 8 == 0 ? special[rnd() % sizeof special] : (uint8_t)rnd();
    if ((c & 0x7f) == 0x7f) c ^= 1;
    return c;
}

static uint8_t random_e8m0(void) {
    static const uint8_t special[] = {0, 1, 2, 100, 127, 128, 200, 253, 254};
    return rnd() % 4 == 0 ? special[rnd() % sizeof special] : (uint8_t)(100 + rnd() % 40);
}

/* Activation scales as quantization makes them (powers of two), sometimes extreme. */
static float random_pow2_scale(void) {
    static const int special[] = {-126, -120, -60, 0, 30, 60};
    int e = rnd() % 5 == 0 ? special[rnd() % 6] : (int)(rnd() % 24) - 16;
    return ldexpf(1.0f, e);
}

static float random_f32_wide(void) {
    switch (rnd() % 16) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return ldexpf((float)(rnd() % 1000) - 500.0f, -140); /* subnormal range */
    case 3: return ldexpf((float)(rnd() % 1000) - 500.0f, 100);
    default: return ldexpf((float)((int)(rnd() % 2000001) - 1000000), -(int)(rnd() % 40));
    }
}

static uint16_t random_bf16(void) {
    uint16_t b = f32_to_bf16(random_f32_wide());
    if ((b & 0x7f80) == 0x7f80) b &= 0xbfff; /* no inf / NaN */
    return b;
}

static int same_bits(const float *a, const float *b, size_t n, size_t *first) {
    for (size_t i = 0; i < n; i++)
        if (f32_bits(a[i]) != f32_bits(b[i])) {
            *first = i;
            return 0;
        }
    return 1;
}

#define SENTINEL 0x7fc01234u /* a NaN pattern no kernel writes: rows outside the range keep it */

static float *sentinel_array(size_t n) {
    float *y = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) y[i] = f32_from_bits(SENTINEL);
    return y;
}

typedef struct shape {
    int rows, cols, n_tokens, row_begin, row_end, stride_pad;
} shape;

static const shape quant_shapes[] = {
    {1, 128, 1, 0, 1, 0},     {5, 128, 1, 0, 5, 3},     {17, 256, 2, 0, 17, 0},  {33, 640, 1, 3, 31, 7},
    {130, 128, 3, 1, 130, 5}, {16, 384, 5, 0, 16, 0},   {48, 1152, 2, 16, 48, 0}, {129, 256, 1, 0, 129, 1},
    /* prefill sizes (the AMX tiles: 16 rows x 16 tokens): partial and several token groups, row
     * ranges that start mid-group and cross a 128-row scale block */
    {16, 128, 8, 0, 16, 0},   {40, 256, 17, 3, 37, 2},  {150, 384, 33, 5, 150, 0}, {64, 512, 16, 16, 64, 1},
    {200, 640, 9, 100, 200, 3},
    /* AVX-512 several-token passes of 4 row tiles (64 rows) from a row that starts no tile, the
     * tokens in steps of 4 with 3 or 2 left over (1: the 9, 17 and 33 token shapes) */
    {200, 512, 23, 8, 200, 0}, {130, 256, 10, 0, 130, 2},
    /* more tokens than one slice of the AVX-512 several-token FP8 form (512 KB of f64 activations:
     * 16 tokens at 4096 columns), the last slice short and odd */
    {21, 4096, 37, 3, 21, 1},
    /* several slices of the AMX forms (1 MB: one group of 16 tokens at 16384 columns) */
    {19, 16384, 37, 0, 19, 0},
    /* two slices of the AVX-512 FP4 words form (2 MB: 53 tokens at 16384 columns, split 31 + 30) */
    {19, 16384, 61, 2, 19, 0},
    /* one token over more than one full batch of 8 blocks of the AVX-512 one-token FP8 form (17
     * blocks: two batches and one of one), rows in groups of 8 and a short last group */
    {45, 2176, 1, 3, 45, 1},
};

/* Fills random FP8-quantized activations: codes straight from the format, or quantized floats. */
static void random_activations(uint8_t *codes, float *scales, int n_tokens, int cols) {
    const int blocks = cols / FP8_ACT_BLOCK;
    if (rnd() % 2) {
        for (int i = 0; i < n_tokens * cols; i++) codes[i] = random_e4m3();
        for (int i = 0; i < n_tokens * blocks; i++) scales[i] = random_pow2_scale();
    } else {
        float *x = malloc((size_t)cols * sizeof(float));
        for (int t = 0; t < n_tokens; t++) {
            for (int i = 0; i < cols; i++) x[i] = (float)((int)(rnd() % 20001) - 10000) * ldexpf(1.0f, -(int)(rnd() % 12));
            kernel_ops_scalar.quantize_fp8_act(x, cols, codes + (size_t)t * cols, scales + (size_t)t * blocks);
        }
        free(x);
    }
}

typedef enum { Q_FP8, Q_FP4 } quant_kind;

static void check_quant_product(const kernel_ops *v, quant_kind kind) {
    for (size_t si = 0; si < sizeof quant_shapes / sizeof quant_shapes[0]; si++) {
        const shape sh = quant_shapes[si];
        const int stride = sh.rows + sh.stride_pad, cols = sh.cols;
        uint8_t *codes = malloc((size_t)sh.rows * cols), *wscales;
        size_t n_wscales;
        if (kind == Q_FP8) {
            for (size_t i = 0; i < (size_t)sh.rows * cols; i++) codes[i] = random_e4m3();
            n_wscales = (size_t)((sh.rows + 127) / 128) * ((cols + 127) / 128);
        } else {
            for (size_t i = 0; i < (size_t)sh.rows * cols / 2; i++) codes[i] = (uint8_t)rnd();
            n_wscales = (size_t)sh.rows * (cols / 32);
        }
        wscales = malloc(n_wscales);
        for (size_t i = 0; i < n_wscales; i++) wscales[i] = random_e8m0();
        uint8_t *x_codes = malloc((size_t)sh.n_tokens * cols);
        float *x_scales = malloc((size_t)sh.n_tokens * (cols / FP8_ACT_BLOCK) * sizeof(float));
        random_activations(x_codes, x_scales, sh.n_tokens, cols);
        const size_t ny = (size_t)sh.n_tokens * stride;
        float *ref = sentinel_array(ny), *got = sentinel_array(ny);
        if (kind == Q_FP8) {
            const fp8_matrix w = {codes, wscales, sh.rows, cols, MATRIX_ROWS, NULL};
            kernel_ops_scalar.matmul_fp8(&w, x_codes, x_scales, sh.n_tokens, ref, stride, sh.row_begin, sh.row_end);
            v->matmul_fp8(&w, x_codes, x_scales, sh.n_tokens, got, stride, sh.row_begin, sh.row_end);
            /* the same matrix listing its low codes (the x86 kernels' raised form): same bits */
            int too_many = 0;
            fp8_low_codes *low = fp8_low_codes_list(&w, SIZE_MAX, &too_many);
            REQUIRE(low, "fp8_low_codes_list");
            const fp8_matrix listed = {codes, wscales, sh.rows, cols, MATRIX_ROWS, low};
            float *got_listed = sentinel_array(ny);
            v->matmul_fp8(&listed, x_codes, x_scales, sh.n_tokens, got_listed, stride, sh.row_begin, sh.row_end);
            size_t at = 0;
            CHECK(same_bits(ref, got_listed, ny, &at), "%s matmul_fp8 listed rows %d cols %d tokens %d: y[%zu] = %a, scalar %a",
                  v->name, sh.rows, cols, sh.n_tokens, at, got_listed[at], ref[at]);
            free(got_listed);
            free(low);
        } else {
            const fp4_matrix w = {codes, wscales, sh.rows, cols};
            kernel_ops_scalar.matmul_fp4(&w, x_codes, x_scales, sh.n_tokens, ref, stride, sh.row_begin, sh.row_end);
            v->matmul_fp4(&w, x_codes, x_scales, sh.n_tokens, got, stride, sh.row_begin, sh.row_end);
        }
        size_t first = 0;
        CHECK(same_bits(ref, got, ny, &first), "%s %s rows %d cols %d tokens %d: y[%zu] = %a, scalar %a", v->name,
              kind == Q_FP8 ? "matmul_fp8" : "matmul_fp4", sh.rows, cols, sh.n_tokens, first, got[first], ref[first]);
        free(codes);
        free(wscales);
        free(x_codes);
        free(x_scales);
        free(ref);
        free(got);
    }
}

TEST(kernels_fp8_and_fp4_products_bitwise) {
    int ran = 0;
    for (size_t i = 0; variants[i]; i++) {
        const kernel_ops *v = kernels_lookup(variants[i]);
        if (!v) continue;
        ran++;
        for (int rep = 0; rep < 3; rep++) {
            check_quant_product(v, Q_FP8);
            check_quant_product(v, Q_FP4);
        }
    }
    printf("    %d SIMD variant(s) checked\n", ran);
}

/* Largest-magnitude inputs: every weight and activation code at +-448 and e2m1 +-6 (the integer
 * block sums at their bounds). */
TEST(kernels_quant_products_extreme_sums) {
    enum { T = 20 }; /* 2 of them (decode forms), then all 20 (prefill forms) */
    const int rows = 19, cols = 512;
    uint8_t *w8 = malloc((size_t)rows * cols), *w4 = malloc((size_t)rows * cols / 2);
    uint8_t s8[1 * 4], s4[19 * 16], xc[T * 512];
    float xs[T * 4];
    for (int i = 0; i < rows * cols; i++) w8[i] = (i / 7) % 3 ? 0x7e : 0xfe;
    for (int i = 0; i < rows * cols / 2; i++) w4[i] = (i / 5) % 2 ? 0x77 : 0xff;
    for (int i = 0; i < T * cols; i++) xc[i] = (i / 3) % 4 ? 0x7e : 0xfe;
    for (int i = 0; i < (int)sizeof s8; i++) s8[i] = 127;
    for (int i = 0; i < (int)sizeof s4; i++) s4[i] = (uint8_t)(120 + i % 8);
    for (int i = 0; i < T * 4; i++) xs[i] = 1.0f;
    const fp8_matrix m8 = {w8, s8, rows, cols, MATRIX_ROWS, NULL};
    const fp4_matrix m4 = {w4, s4, rows, cols};
    float ref[T * 19], got[T * 19];
    for (size_t i = 0; variants[i]; i++) {
        const kernel_ops *v = kernels_lookup(variants[i]);
        if (!v) continue;
        for (int n = 2; n <= T; n += T - 2) {
            size_t first = 0;
            kernel_ops_scalar.matmul_fp8(&m8, xc, xs, n, ref, rows, 0, rows);
            v->matmul_fp8(&m8, xc, xs, n, got, rows, 0, rows);
            CHECK(same_bits(ref, got, (size_t)n * rows, &first), "%s fp8 extreme, %d tokens: y[%zu] %a vs %a", v->name, n,
                  first, got[first], ref[first]);
            kernel_ops_scalar.matmul_fp4(&m4, xc, xs, n, ref, rows, 0, rows);
            v->matmul_fp4(&m4, xc, xs, n, got, rows, 0, rows);
            CHECK(same_bits(ref, got, (size_t)n * rows, &first), "%s fp4 extreme, %d tokens: y[%zu] %a vs %a", v->name, n,
                  first, got[first], ref[first]);
        }
    }
    free(w8);
    free(w4);
}

/* Every variant's FP8 product of T tokens against the scalar's, bitwise (what: the case, for the
 * message); returns how many variants ran. */
static int fp8_variants_match_scalar(const fp8_matrix *m8, const uint8_t *xc, const float *xs, int T, const char *what) {
    const size_t n = (size_t)T * m8->rows;
    float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    int ran = 0;
    kernel_ops_scalar.matmul_fp8(m8, xc, xs, T, ref, m8->rows, 0, m8->rows);
    for (size_t i = 0; variants[i]; i++) {
        const kernel_ops *v = kernels_lookup(variants[i]);
        if (!v) continue;
        size_t first = 0;
        v->matmul_fp8(m8, xc, xs, T, got, m8->rows, 0, m8->rows);
        CHECK(same_bits(ref, got, n, &first), "%s fp8, %s: y[%zu] %a vs %a", v->name, what, first, got[first], ref[first]);
        ran++;
    }
    free(ref);
    free(got);
    return ran;
}

/* FP8 block sums just past int32: n columns of +-448 in both weights and activations (the rest
 * zero) make a block's integer sum n * 229376^2 / 256 in the int16 form's units, past 2^31 from
 * n = 11 (10 stays just below); the second block is zero. The columns sit in one half of a
 * 32-column group, then spread, so a bound that looks at only part of a block misses them. */
TEST(kernels_fp8_block_sums_past_int32) {
    enum { T = 13 }; /* past every variant's threshold of the int16 form (AVX2: 8), steps of 4 or 2 and one */
    const int rows = 19, cols = 256;
    uint8_t *w8 = calloc((size_t)rows * cols, 1), xc[T * 256];
    uint8_t s8[2];
    float xs[T * 2];
    int checked = 0;
    for (int layout = 0; layout < 2; layout++)
        for (int n = 9; n <= 13; n++) {
            memset(w8, 0, (size_t)rows * cols);
            memset(xc, 0, sizeof xc);
            for (int k = 0; k < n; k++) {
                const int c = layout ? 11 * k % 128 : 16 + k; /* block 0 */
                for (int r = 0; r < rows; r++) w8[(size_t)r * cols + c] = r % 3 ? 0x7e : 0xfe;
                for (int t = 0; t < T; t++) xc[t * cols + c] = t % 2 ? 0x7e : 0xfe; /* same sign along a row */
            }
            s8[0] = s8[1] = 127;
            for (int i = 0; i < T * 2; i++) xs[i] = 1.0f;
            const fp8_matrix m8 = {w8, s8, rows, cols, MATRIX_ROWS, NULL};
            char what[64];
            snprintf(what, sizeof what, "%d columns at 448 (layout %d)", n, layout);
            checked += fp8_variants_match_scalar(&m8, xc, xs, T, what);
        }
    printf("    %d variant runs\n", checked);
    free(w8);
}

/* The one-token FP8 products with the matrix's low-code list (the AVX-512 words form) at its
 * bounds, each case also without the list (the f64 form), against the scalar: (a) every product
 * +448 * 448, the largest int32 lane sums the form makes (8 products of 14336^2 per lane, 1.64e9);
 * (b) the same with signs alternating by column in both, so every product is still positive; (c)
 * every weight a low code (the list holds them all, subnormals and fields 1 to 4) against
 * activations at 448 and activation lows in every other block, and (d) the reverse mix, weights
 * at 448 and activations all low. 3 blocks: a batch of blocks shorter than the form's 8. */
TEST(kernels_fp8_one_token_list_bounds) {
    const int rows = 19, cols = 384;
    uint8_t *w8 = malloc((size_t)rows * cols), xc[384], s8[3];
    float xs[3];
    static const uint8_t low_codes[] = {0x01, 0x87, 0x08, 0x8f, 0x11, 0x17, 0x9b, 0x21, 0xa7, 0x80, 0x00};
    static const uint8_t x_lows[] = {0x01, 0x85, 0x0f, 0x93, 0x21};
    int ran = 0;
    for (int c4 = 0; c4 < 4; c4++) {
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) {
                uint8_t code = 0x7e;
                if (c4 == 1) code = c % 2 ? 0xfe : 0x7e;
                if (c4 == 2) code = low_codes[(size_t)(r * 7 + c) % sizeof low_codes];
                w8[(size_t)r * cols + c] = code;
            }
        for (int c = 0; c < cols; c++) {
            xc[c] = c4 == 1 && c % 2 ? 0xfe : 0x7e;
            if (c4 == 2 && (c / FP8_ACT_BLOCK) % 2 && c % 5 == 0) xc[c] = x_lows[(size_t)c % sizeof x_lows];
            if (c4 == 3) xc[c] = x_lows[(size_t)c % sizeof x_lows];
        }
        for (int b = 0; b < 3; b++) {
            s8[b] = (uint8_t)(120 + 3 * b);
            xs[b] = ldexpf(1.0f, b - 1);
        }
        const fp8_matrix plain = {w8, s8, rows, cols, MATRIX_ROWS, NULL};
        int too_many = 0;
        fp8_low_codes *low = fp8_low_codes_list(&plain, SIZE_MAX, &too_many);
        REQUIRE(low, "fp8_low_codes_list");
        if (c4 == 2) CHECK(low->row_first[rows] == (uint32_t)(rows * cols), "case (c) lists every code");
        const fp8_matrix listed = {w8, s8, rows, cols, MATRIX_ROWS, low};
        char what[64];
        snprintf(what, sizeof what, "one token, case %c, listed", 'a' + c4);
        ran += fp8_variants_match_scalar(&listed, xc, xs, 1, what);
        snprintf(what, sizeof what, "one token, case %c, no list", 'a' + c4);
        ran += fp8_variants_match_scalar(&plain, xc, xs, 1, what);
        free(low);
    }
    printf("    %d variant runs\n", ran);
    free(w8);
}

/* Large mixed codes (448 down to 240) of the large-low-term tests below, whose A is near 2^29. */
static const uint8_t fp8_big_codes[5] = {0x7e, 0x7d, 0x7b, 0x79, 0x77};

/* The 3 big columns c0 .. c0 + 2 of the large-low-term tests below, in weights and activations. */
static void fp8_big_columns(uint8_t *w8, uint8_t *xc, int rows, int cols, int T, int c0) {
    for (int c = 0; c < 3; c++) {
        for (int r = 0; r < rows; r++) w8[(size_t)r * cols + c0 + c] = fp8_big_codes[(r + 2 * c) % 5];
        for (int t = 0; t < T; t++) xc[t * cols + c0 + c] = fp8_big_codes[(t + c) % 5];
    }
}

/* Two columns of the large-low-term tests below: a low-term part below the final ulp, weight k =
 * 20 against x hi 15, 300 (it moved the single-FMA step's rest across a rounding midpoint; in the
 * exact f32 form dropping the rest r is caught by the random products of
 * kernels_fp8_and_fp4_products_bitwise and kernels_fp8_low_codes_bitwise instead); and, as the
 * big columns' hi products are multiples of 2^18, an odd one (hi 9 * 9) that makes A need 28
 * bits. */
static void fp8_lows_rest_columns(uint8_t *w8, uint8_t *xc, int rows, int cols, int T) {
    for (int r = 0; r < rows; r++) w8[(size_t)r * cols + 70] = 0x12;
    for (int t = 0; t < T; t++) xc[t * cols + 70] = 0x2f;
    for (int r = 0; r < rows; r++) w8[(size_t)r * cols + 80] = 0x29;
    for (int t = 0; t < T; t++) xc[t * cols + 80] = 0x29;
}

/* FP8 blocks with large weight-low terms and no activation lows: n columns of low weights |k| =
 * 120 (+ or - by row, none on some rows) against activations at 448, so a row's low term B = n *
 * 120 * 14336 (15.5 M at n = 9, 17.2 M at n = 10: past the 2^24 below which B alone would be exact
 * in f32), beside 3 columns of large mixed codes whose A is near 2^29 and not a float (the exact
 * form's rest r = A' - f32(A'), A' = A + (B >> 4), is nonzero); the norms stay under the wide
 * bound (4 more columns at 448 would cross it). The exact form with a logical instead of an
 * arithmetic B >> 4 fails this. (Until the exact f32 form, n = 9 and 10 sat on either side of the
 * single-FMA step's bound on B.) */
TEST(kernels_fp8_large_weight_low_terms) {
    enum { T = 13 }; /* as in kernels_fp8_block_sums_past_int32 */
    const int rows = 19, cols = 256;
    uint8_t *w8 = calloc((size_t)rows * cols, 1), xc[T * 256];
    uint8_t s8[2] = {127, 127};
    float xs[T * 2];
    int checked = 0;
    for (int n = 8; n <= 11; n++) {
        memset(w8, 0, (size_t)rows * cols);
        memset(xc, 0, sizeof xc);
        fp8_big_columns(w8, xc, rows, cols, T, 0);
        for (int k = 0; k < n; k++) {
            const int c = 20 + 3 * k;
            for (int r = 0; r < rows; r++)
                if (r % 4 != 3) w8[(size_t)r * cols + c] = r % 2 ? 0x27 : 0xa7; /* k = +-120: 15 * 2^3 */
            for (int t = 0; t < T; t++) xc[t * cols + c] = 0x7e;
        }
        fp8_lows_rest_columns(w8, xc, rows, cols, T);
        for (int i = 0; i < T * 2; i++) xs[i] = 1.0f;
        const fp8_matrix m8 = {w8, s8, rows, cols, MATRIX_ROWS, NULL};
        char what[64];
        snprintf(what, sizeof what, "%d weight lows a row", n);
        checked += fp8_variants_match_scalar(&m8, xc, xs, T, what);
    }
    printf("    %d variant runs\n", checked);
    free(w8);
}

/* The same with activation lows too: n weight-low columns as above and p activation-low columns
 * (x k = +-120 on two tokens in three, against weight hi 7168 on every row), so B = (n * 14336 + p
 * * 7168) * 120, one or two pairs (in line and out of line). With shared, those tokens also have a
 * low on the first weight-low column and the big columns are left out: C = sum wl xl = +-14400,
 * hundreds of ulps of S (below 2^32), so the out-of-line form (p = 2) fails this if it ignores C
 * (the in-line C is kernels_fp8_one_activation_low_pair's), and so does the in-line form without
 * the activation lows' share of B, or the exact form without 16 (B & 15) in its rest. */
TEST(kernels_fp8_large_activation_low_terms) {
    enum { T = 13 };
    const int rows = 19, cols = 256;
    uint8_t *w8 = calloc((size_t)rows * cols, 1), xc[T * 256];
    uint8_t s8[2] = {127, 127};
    float xs[T * 2];
    int checked = 0;
    for (int shared = 0; shared < 2; shared++)
        for (int p = 1; p <= 2; p++)
            for (int n = 4; n <= 9; n++) {
                memset(w8, 0, (size_t)rows * cols);
                memset(xc, 0, sizeof xc);
                if (!shared) fp8_big_columns(w8, xc, rows, cols, T, 0); /* with shared, S stays small enough for C to show */
                for (int k = 0; k < n; k++) {
                    const int c = 20 + 3 * k;
                    for (int r = 0; r < rows; r++)
                        if (r % 4 != 3) w8[(size_t)r * cols + c] = r % 2 ? 0x27 : 0xa7;
                    for (int t = 0; t < T; t++) xc[t * cols + c] = shared && k == 0 && t % 3 ? (t % 2 ? 0x27 : 0xa7) : 0x7e;
                }
                for (int q = 0; q < p; q++) {
                    const int c = 100 + 2 * q; /* word pairs 50, 51: no weight lows there */
                    for (int r = 0; r < rows; r++) w8[(size_t)r * cols + c] = 0x76; /* k = 224 * 2^9: hi 7168 */
                    for (int t = 0; t < T; t++)
                        if (t % 3) xc[t * cols + c] = t % 2 ? 0x27 : 0xa7; /* one sign per token: the pairs add */
                }
                fp8_lows_rest_columns(w8, xc, rows, cols, T);
                for (int i = 0; i < T * 2; i++) xs[i] = 1.0f;
                const fp8_matrix m8 = {w8, s8, rows, cols, MATRIX_ROWS, NULL};
                char what[96];
                snprintf(what, sizeof what, "%d weight lows a row, %d activation low pairs%s", n, p, shared ? ", shared" : "");
                checked += fp8_variants_match_scalar(&m8, xc, xs, T, what);
            }
    printf("    %d variant runs\n", checked);
    free(w8);
}

/* Tokens whose block has exactly one word pair of activation lows (the words forms take these in
 * line, the exact f32 form with C = sum wl xl), on a pair where some rows have weight lows and
 * on one where none do: a row's C is then +-14400 or 0, which decides the result where the rest
 * of the block is empty (S = C + 16 B) and moves it across rounding points where the big columns
 * make A near 2^29 (hundreds of ulps). Tokens alternate between the two pairs and none (so steps
 * of 4 mix the classes), and one token in five has a second pair (the general path). Dropping C
 * or the activation lows' B in the one-pair path fails this, and so does reading the weight lows
 * of a pair that w_mask does not list. */
TEST(kernels_fp8_one_activation_low_pair) {
    enum { T = 13 };
    const int rows = 19, cols = 256;
    uint8_t *w8 = calloc((size_t)rows * cols, 1), xc[T * 256];
    uint8_t s8[2] = {127, 127};
    float xs[T * 2];
    int checked = 0;
    for (int big = 0; big < 2; big++)
        for (int second_block = 0; second_block < 2; second_block++) {
            const int base = second_block ? 128 : 0;
            memset(w8, 0, (size_t)rows * cols);
            memset(xc, 0, sizeof xc);
            if (big) fp8_big_columns(w8, xc, rows, cols, T, base);
            for (int r = 0; r < rows; r++) {
                /* pair 20 (columns 40, 41): lows on two rows in three, hi 7168 on the others */
                w8[(size_t)r * cols + base + 40] = r % 3 ? (r % 2 ? 0x27 : 0xa7) : 0x76;
                w8[(size_t)r * cols + base + 41] = r % 3 == 1 ? 0x27 : 0x76;
                /* pair 56: hi only */
                w8[(size_t)r * cols + base + 112] = r % 2 ? 0x76 : 0xf6;
                w8[(size_t)r * cols + base + 113] = 0x76;
                /* weight lows elsewhere, under activation hi (B's weight part) */
                w8[(size_t)r * cols + base + 90] = r % 4 ? 0x27 : 0;
                /* with the pairs in block 1, weight lows on block 0's pair 56 (no activations
                 * there), whose 32 columns in block 1 have none: a form that keeps the lo words
                 * of the tile's previous block there must not read them for block 1's pair 56 */
                if (second_block) w8[(size_t)r * cols + 112] = w8[(size_t)r * cols + 113] = 0x27;
            }
            for (int t = 0; t < T; t++) {
                uint8_t *x = xc + t * cols + base;
                x[90] = 0x7e;
                if (t % 3 == 0) x[40] = t % 2 ? 0x27 : 0xa7, x[41] = 0xa7;
                else if (t % 3 == 1) x[112] = t % 2 ? 0xa7 : 0x27;
                if (t % 5 == 4) x[100] = 0x27; /* a second pair */
            }
            for (int i = 0; i < T * 2; i++) xs[i] = 1.0f;
            const fp8_matrix m8 = {w8, s8, rows, cols, MATRIX_ROWS, NULL};
            char what[96];
            snprintf(what, sizeof what, "one activation-low pair, block %d%s", second_block, big ? ", big columns" : "");
            checked += fp8_variants_match_scalar(&m8, xc, xs, T, what);
        }
    printf("    %d variant runs\n", checked);
    free(w8);
}

/* Weights made of low codes (the raised form's corrections at their largest: every code of a block,
 * mantissas 0..7, both signs, against activations of every size up to +-448) and weights quantized
 * as the official code does from heavy-tailed values (a few low codes a row, as real checkpoints
 * have), listed and not: the same bits as the scalar's, 1, 2, 3 and 20 tokens. */
TEST(kernels_fp8_low_codes_bitwise) {
    const int rows = 23, cols = 384, T = 20;
    uint8_t *w = malloc((size_t)rows * cols), xc[20 * 384], ws[3];
    float xs[20 * 3], ref[20 * 23], got[20 * 23];
    for (int i = 0; i < (int)sizeof ws; i++) ws[i] = (uint8_t)(120 + 3 * i);
    random_activations(xc, xs, T, cols);
    for (int i = 0; i < cols; i++) xc[i] = (i / 3) % 4 ? 0x7e : 0xfe; /* token 0 at the extremes */
    for (int form = 0; form < 2; form++) {
        if (form == 0) {
            for (int i = 0; i < rows * cols; i++) w[i] = (uint8_t)((rnd() % 8) | (rnd() % 2 ? 0x80 : 0));
        } else {
            for (int i = 0; i < rows * cols; i++) {
                float v = (float)((int)(rnd() % 20001) - 10000) * 1e-4f;
                if (rnd() % 100 == 0) v *= 10.0f;
                w[i] = e4m3_encode_rne(v * 40.0f); /* amax about 400: values below 2^-6 are low */
            }
        }
        int too_many = 0;
        const fp8_matrix plain = {w, ws, rows, cols, MATRIX_ROWS, NULL};
        fp8_low_codes *low = fp8_low_codes_list(&plain, SIZE_MAX, &too_many);
        REQUIRE(low, "fp8_low_codes_list");
        CHECK(low->row_first[rows] > 0, "form %d has low codes", form);
        const fp8_matrix listed = {w, ws, rows, cols, MATRIX_ROWS, low};
        for (size_t vi = 0; variants[vi]; vi++) {
            const kernel_ops *v = kernels_lookup(variants[vi]);
            if (!v) continue;
            for (int n = 1; n <= T; n = n == 3 ? T : n + 1)
                for (int l = 0; l < 2; l++) {
                    size_t first = 0;
                    kernel_ops_scalar.matmul_fp8(&plain, xc, xs, n, ref, rows, 1, rows);
                    v->matmul_fp8(l ? &listed : &plain, xc, xs, n, got, rows, 1, rows);
                    for (int t = 0; t < n; t++) got[t * rows] = ref[t * rows] = 0.0f; /* row 0 not computed */
                    CHECK(same_bits(ref, got, (size_t)n * rows, &first), "%s fp8 low codes form %d %s, %d tokens: y[%zu] %a vs %a",
                          v->name, form, l ? "listed" : "plain", n, first, got[first], ref[first]);
                }
        }
        free(low);
    }
    free(w);
}

/* The plane of an e4m3 code in the FP4 kernels' split of k = value * 2^9 = m * 2^s (m < 16):
 * s / 4, or -1 for zero (no plane holds it). */
static int e4m3_plane(uint8_t code) {
    int32_t k = kernel_e4m3_int[code];
    if (k < 0) k = -k;
    if (k == 0) return -1;
    int s = 0;
    while (k >= 16) {
        k >>= 1;
        s++;
    }
    return s / 4;
}

/* A random nonzero e4m3 code in the given plane. */
static uint8_t random_e4m3_in_plane(int plane) {
    for (;;) {
        const uint8_t c = random_e4m3();
        if (e4m3_plane(c) == plane) return c;
    }
}

/* Every variant's FP4 product of T tokens (rows [rb, rows)) against the scalar's, bitwise (what:
 * the case, for the message); returns how many variants ran. */
static int fp4_variants_match_scalar(const fp4_matrix *m, const uint8_t *xc, const float *xs, int T, int rb,
                                     const char *what) {
    const size_t n = (size_t)T * m->rows;
    float *ref = sentinel_array(n), *got = sentinel_array(n);
    int ran = 0;
    kernel_ops_scalar.matmul_fp4(m, xc, xs, T, ref, m->rows, rb, m->rows);
    for (size_t vi = 0; variants[vi]; vi++) {
        const kernel_ops *v = kernels_lookup(variants[vi]);
        if (!v) continue;
        for (size_t i = 0; i < n; i++) got[i] = f32_from_bits(SENTINEL);
        v->matmul_fp4(m, xc, xs, T, got, m->rows, rb, m->rows);
        size_t first = 0;
        CHECK(same_bits(ref, got, n, &first), "%s fp4, %s, %d tokens: y[%zu] = %a, scalar %a", v->name, what, T, first,
              got[first], ref[first]);
        ran++;
    }
    free(ref);
    free(got);
    return ran;
}

/* FP4 products whose scales sit at and past the bounds within which the AMX and AVX-512 words
 * kernels fold a power of two into the scales (KERNEL_FP4_FOLD_W_E8M0_MIN/MAX,
 * kernel_fp4_fold_x_scale): case 0 every scale inside, at the edges among them; case 1 every
 * block of one row in five scaled 2^-100 against activations at 2^-40, so that xs * ws = 2^-140
 * is subnormal and folded factor * xs * ws = 2^-150 would round to 0 (those rows' outputs,
 * nonzero subnormals for the scalar, would come out 0); case 2 the same with the activation
 * scales of one token in three at 2^-100 against weights at 2^-40. Leaving out either of the
 * AVX-512 kernel's checks fails case 1 or 2. */
TEST(kernels_fp4_scale_fold_bounds) {
    enum { T = 23, ROWS = 70, COLS = 256 };
    static const uint8_t edge_w[] = {63, 191, 127, 64, 190};
    static const int edge_x[] = {-40, 40, 0, -39, 39, -7};
    uint8_t *packed = malloc(ROWS * COLS / 2), *wscales = malloc(ROWS * COLS / 32), *xc = malloc(T * COLS);
    float xs[T * (COLS / 128)];
    int ran = 0;
    for (int c = 0; c < 3; c++) {
        for (int i = 0; i < ROWS * COLS / 2; i++) packed[i] = (uint8_t)rnd();
        for (int i = 0; i < T * COLS; i++) xc[i] = random_e4m3();
        for (int r = 0; r < ROWS; r++)
            for (int b = 0; b < COLS / 32; b++) {
                uint8_t e = (rnd() % 3 ? 63 + rnd() % 129 : edge_w[rnd() % sizeof edge_w]);
                if (c == 1 && r % 5 == 0) e = 27;  /* 2^-100 */
                if (c == 2) e = 87;                /* 2^-40 */
                wscales[r * (COLS / 32) + b] = e;
            }
        for (int t = 0; t < T; t++)
            for (int q = 0; q < COLS / 128; q++) {
                float x = ldexpf(1.0f, edge_x[rnd() % 6]);
                if (c == 1) x = 0x1p-40f;
                if (c == 2) x = t % 3 ? 0x1p-40f : 0x1p-100f;
                xs[t * (COLS / 128) + q] = x;
            }
        const fp4_matrix w = {packed, wscales, ROWS, COLS};
        char what[32];
        snprintf(what, sizeof what, "fold case %d", c);
        ran += fp4_variants_match_scalar(&w, xc, xs, T, 0, what);
    }
    printf("    %d variant runs\n", ran);
    free(packed);
    free(wscales);
    free(xc);
}

/* FP4 x FP8 with activations whose 128-element chunks use chosen sets of planes: one plane, gaps
 * (planes 0 and 3 only), all four, none (all zero, against scale products that overflow to inf,
 * so 0 * inf = NaN must come out as in the reference), random subsets; on 1 to 5 tokens (the
 * decode form and the several-token one), row ranges that start mid-group and 17 chunks (more
 * than one batch of the SIMD kernels' scale transposition). */
TEST(kernels_fp4_activation_planes_bitwise) {
    const int rows = 37, cols = 17 * 128, chunks = cols / 128;
    uint8_t *w = malloc((size_t)rows * cols / 2), *ws = malloc((size_t)rows * (cols / 32));
    enum { MAX_T = 20 };
    static const int token_counts[] = {1, 2, 3, 4, 5, 8, 20}; /* decode, several-token, tile forms */
    uint8_t *xc = malloc((size_t)MAX_T * cols);
    float *xs = malloc((size_t)MAX_T * chunks * sizeof(float));
    int ran = 0;
    for (int mode = 0; mode < 6; mode++)
        for (size_t ti = 0; ti < sizeof token_counts / sizeof token_counts[0]; ti++) {
            const int T = token_counts[ti];
            for (int i = 0; i < rows * cols / 2; i++) w[i] = (uint8_t)rnd();
            for (int i = 0; i < rows * (cols / 32); i++) ws[i] = mode == 5 && rnd() % 3 == 0 ? 254 : random_e8m0();
            for (int t = 0; t < T; t++)
                for (int c = 0; c < chunks; c++) {
                    unsigned mask; /* the planes present in this chunk */
                    switch (mode) {
                    case 0: mask = 1u << (rnd() % 4); break;
                    case 1: mask = 0x9; break;
                    case 2: mask = 0xf; break;
                    case 3: mask = 0xe; break;
                    case 4: mask = rnd() % 16; break;
                    default: mask = rnd() % 2 ? 0 : 1u << (rnd() % 4); break;
                    }
                    uint8_t *x = xc + (size_t)t * cols + (size_t)c * 128;
                    int planes[4], n = 0;
                    for (int p = 0; p < 4; p++)
                        if (mask & (1u << p)) planes[n++] = p;
                    for (int i = 0; i < 128; i++) {
                        /* every chosen plane at least once, then random ones of them or zeros */
                        if (n == 0 || (i >= n && rnd() % 8 == 0)) x[i] = rnd() % 2 ? 0x00 : 0x80;
                        else x[i] = random_e4m3_in_plane(planes[i < n ? i : (int)(rnd() % n)]);
                    }
                    xs[t * chunks + c] = mode == 5 && rnd() % 2 ? ldexpf(1.0f, 60) : random_pow2_scale();
                }
            const fp4_matrix m = {w, ws, rows, cols};
            char what[32];
            snprintf(what, sizeof what, "planes mode %d", mode);
            ran += fp4_variants_match_scalar(&m, xc, xs, T, T % 2 ? 0 : 5, what);
        }
    printf("    %d variant runs\n", ran);
    free(w);
    free(ws);
    free(xc);
    free(xs);
}

/* FP4 x FP8 blocks at the bounds of the AMX form's plane split (B = 12 sum |k| per token and
 * 32-column block against 2^24, 2^25, 2^26): in each block nb columns hold +-448 (k = 229376) and
 * weights +-12, the others small odd k (1 to 15) and weights +-1, the columns in a random order
 * shared by every token and row. With nb = 7, 13 or 25 the block's sum passes 2^(24 + s - 1)
 * while odd terms remain, so a plane split one shift too low rounds inside the tile unit
 * (several roundings where the scalar makes one); nb = 6, 12, 24 sit just below. Random signs,
 * 1, 5 and 20 tokens. */
TEST(kernels_fp4_plane_split_bounds) {
    const int rows = 19, cols = 256, blocks32 = cols / 32, chunks = cols / 128;
    enum { MAX_T = 20 };
    static const int big_columns[] = {7, 6, 13, 12, 25, 24, 32, 0, 1};
    static const uint8_t odd_codes[] = {0x01, 0x03, 0x05, 0x07, 0x09, 0x0b, 0x0d, 0x0f}; /* k = 1, 3, ..., 15 */
    static const int token_counts[] = {1, 5, 20};
    uint8_t *w = malloc((size_t)rows * cols / 2), *ws = malloc((size_t)rows * blocks32);
    uint8_t *xc = malloc((size_t)MAX_T * cols);
    float *xs = malloc((size_t)MAX_T * chunks * sizeof(float));
    int ran = 0;
    for (int rep = 0; rep < 4; rep++)
        for (size_t ti = 0; ti < sizeof token_counts / sizeof token_counts[0]; ti++) {
            const int T = token_counts[ti];
            memset(w, 0, (size_t)rows * cols / 2);
            for (int b = 0; b < blocks32; b++) {
                const int nb = big_columns[(size_t)(b + rep * 3 + ti) % (sizeof big_columns / sizeof big_columns[0])];
                int order[32];
                for (int i = 0; i < 32; i++) order[i] = i;
                for (int i = 31; i > 0; i--) {
                    const int j = (int)(rnd() % (unsigned)(i + 1)), tmp = order[i];
                    order[i] = order[j];
                    order[j] = tmp;
                }
                for (int i = 0; i < 32; i++) {
                    const int col = b * 32 + order[i], big = i < nb;
                    for (int r = 0; r < rows; r++) {
                        /* e2m1 nibble: 6 (j = 12) for the big columns, 0.5 (j = 1) for the others */
                        const uint8_t nib = (uint8_t)((big ? 0x7 : 0x1) | (rnd() % 2 ? 0x8 : 0));
                        w[(size_t)r * (cols / 2) + col / 2] |= (uint8_t)(col % 2 ? nib << 4 : nib);
                    }
                    for (int t = 0; t < T; t++)
                        xc[(size_t)t * cols + col] = (uint8_t)((big ? 0x7e : odd_codes[rnd() % 8]) | (rnd() % 2 ? 0x80 : 0));
                }
            }
            for (int i = 0; i < rows * blocks32; i++) ws[i] = (uint8_t)(124 + rnd() % 6);
            for (int i = 0; i < T * chunks; i++) xs[i] = random_pow2_scale();
            const fp4_matrix m = {w, ws, rows, cols};
            char what[32];
            snprintf(what, sizeof what, "plane bounds rep %d", rep);
            ran += fp4_variants_match_scalar(&m, xc, xs, T, 0, what);
        }
    printf("    %d variant runs\n", ran);
    free(w);
    free(ws);
    free(xc);
    free(xs);
}

/* The e4m3 code of a positive k = value * 2^9 (0 when no code has it). */
static uint8_t e4m3_code_of_k(int32_t k) {
    for (int c = 0; c < 0x7f; c++)
        if (kernel_e4m3_int[c] == k) return (uint8_t)c;
    return 0;
}

/* FP4 x FP8 with 1 to 3 tokens at the bounds of the AVX-512 decode form (activations as balanced
 * base-256 digits of A = k / 2^shift, shift the largest power of two dividing every k of a
 * 128-column chunk, as many digits as the largest |A| needs). Each chunk holds one value that fixes
 * its shift (k = 2^s, or an odd multiple of it), one at a digit boundary (A = 120 and 128 on either
 * side of one digit, 30720 and 32768 of two, 229376 = 448 * 2^9 with shift 0: three), both with
 * random signs, and the rest random multiples of 2^s below that; weights +-6 (biased bytes 24 and
 * 0) and +-0.5 at random, so that the three-digit accumulator reaches its largest lanes. A count
 * threshold one representable value off (32768 taken as two digits, 128 as one) or a digit taken
 * unbalanced fails here. */
TEST(kernels_fp4_decode_digit_bounds) {
    const int rows = 21, cols = 6 * 128, chunks = cols / 128;
    static const int32_t boundary_a[] = {120, 128, 30720, 32768, 229376};
    uint8_t *w = malloc((size_t)rows * cols / 2), *ws = malloc((size_t)rows * (cols / 32));
    uint8_t *xc = malloc((size_t)3 * cols);
    float *xs = malloc((size_t)3 * chunks * sizeof(float));
    int ran = 0;
    for (int rep = 0; rep < 12; rep++)
        for (int T = 1; T <= 3; T++) {
            for (int i = 0; i < rows * cols / 2; i++) {
                static const uint8_t nib[4] = {0x7, 0xf, 0x1, 0x9}; /* 6, -6, 0.5, -0.5 */
                w[i] = (uint8_t)(nib[rnd() % 4] | nib[rnd() % 4] << 4);
            }
            for (int i = 0; i < rows * (cols / 32); i++) ws[i] = (uint8_t)(120 + rnd() % 12);
            for (int t = 0; t < T; t++)
                for (int c = 0; c < chunks; c++) {
                    uint8_t *x = xc + (size_t)t * cols + (size_t)c * 128;
                    const int32_t a_max = boundary_a[(rep + t + c) % 5];
                    /* shift s: 0 for 229376 (a value of k = 1 beside it), else up to what keeps
                     * a_max * 2^s within 448 * 2^9 */
                    int s_top = 0;
                    while ((a_max << (s_top + 1)) <= 229376) s_top++;
                    const int s = a_max == 229376 ? 0 : (int)(rnd() % (unsigned)(s_top + 1));
                    for (int i = 0; i < 128; i++) {
                        int32_t k = 0;
                        if (rnd() % 4) { /* a random multiple of 2^s below a_max * 2^s that e4m3 holds */
                            for (;;) {
                                const int32_t cand = kernel_e4m3_int[rnd() % 0x7f];
                                if (cand % (1 << s) == 0 && cand <= a_max << s) {
                                    k = cand;
                                    break;
                                }
                            }
                        }
                        const uint8_t code = k ? e4m3_code_of_k(k) : 0;
                        x[i] = (uint8_t)(code | (rnd() % 2 ? 0x80 : 0));
                    }
                    const int at_shift = (int)(rnd() % 128), at_max = (at_shift + 1 + (int)(rnd() % 127)) % 128;
                    x[at_shift] = (uint8_t)(e4m3_code_of_k(1 << s) | (rnd() % 2 ? 0x80 : 0));
                    x[at_max] = (uint8_t)(e4m3_code_of_k(a_max << s) | (rnd() % 2 ? 0x80 : 0));
                    REQUIRE(e4m3_code_of_k(1 << s) && e4m3_code_of_k(a_max << s), "codes for 2^%d and %d", s, a_max << s);
                    xs[t * chunks + c] = random_pow2_scale();
                }
            const fp4_matrix m = {w, ws, rows, cols};
            char what[40];
            snprintf(what, sizeof what, "digit bounds rep %d", rep);
            ran += fp4_variants_match_scalar(&m, xc, xs, T, rep % 2 ? 0 : 3, what);
        }
    printf("    %d variant runs\n", ran);
    free(w);
    free(ws);
    free(xc);
    free(xs);
}

/* Row-major weights give the reference; the same matrix rearranged to MATRIX_GROUPS16 must give
 * the same bits through every variant, the scalar one included. */
static void check_float_product(const kernel_ops *v, float_kind kind, int rows, int cols, int T, int rb, int re) {
    const int x_stride = cols + (int)(rnd() % 5), y_stride = rows + (int)(rnd() % 3);
    float *x = malloc((size_t)T * x_stride * sizeof(float));
    for (int i = 0; i < T * x_stride; i++) x[i] = kind == FLOAT_BF16 ? bf16_round(random_f32_wide()) : random_f32_wide();
    const size_t ny = (size_t)T * y_stride;
    float *ref = sentinel_array(ny), *got = sentinel_array(ny), *got_g = sentinel_array(ny), *ref_g = sentinel_array(ny);
    void *data = NULL, *grouped = NULL;
    uint8_t *scales = NULL;
    const char *name = "";
    if (kind == FLOAT_BF16) {
        uint16_t *w = malloc((size_t)rows * cols * 2), *wg = malloc((size_t)rows * cols * 2);
        for (size_t i = 0; i < (size_t)rows * cols; i++) w[i] = random_bf16();
        memcpy(wg, w, (size_t)rows * cols * 2);
        REQUIRE(matrix_group_rows(wg, 2, rows, cols) == 0, "matrix_group_rows");
        const bf16_matrix m = {w, rows, cols, MATRIX_ROWS}, mg = {wg, rows, cols, MATRIX_GROUPS16};
        kernel_ops_scalar.matmul_bf16(&m, x, x_stride, T, ref, y_stride, rb, re);
        v->matmul_bf16(&m, x, x_stride, T, got, y_stride, rb, re);
        kernel_ops_scalar.matmul_bf16(&mg, x, x_stride, T, ref_g, y_stride, rb, re);
        v->matmul_bf16(&mg, x, x_stride, T, got_g, y_stride, rb, re);
        data = w;
        grouped = wg;
        name = "matmul_bf16";
    } else if (kind == FLOAT_F32) {
        float *w = malloc((size_t)rows * cols * 4);
        for (size_t i = 0; i < (size_t)rows * cols; i++) w[i] = random_f32_wide();
        const f32_matrix m = {w, rows, cols};
        kernel_ops_scalar.matmul_f32(&m, x, x_stride, T, ref, y_stride, rb, re);
        v->matmul_f32(&m, x, x_stride, T, got, y_stride, rb, re);
        memcpy(ref_g, ref, ny * sizeof(float));
        memcpy(got_g, ref, ny * sizeof(float));
        data = w;
        name = "matmul_f32";
    } else {
        uint8_t *w = malloc((size_t)rows * cols), *wg = malloc((size_t)rows * cols);
        for (size_t i = 0; i < (size_t)rows * cols; i++) w[i] = random_e4m3();
        memcpy(wg, w, (size_t)rows * cols);
        REQUIRE(matrix_group_rows(wg, 1, rows, cols) == 0, "matrix_group_rows");
        const size_t ns = (size_t)((rows + 127) / 128) * ((cols + 127) / 128);
        scales = malloc(ns);
        for (size_t i = 0; i < ns; i++) scales[i] = random_e8m0();
        const fp8_matrix m = {w, scales, rows, cols, MATRIX_ROWS, NULL}, mg = {wg, scales, rows, cols, MATRIX_GROUPS16, NULL};
        kernel_ops_scalar.matmul_fp8_dequant(&m, x, x_stride, T, ref, y_stride, rb, re);
        v->matmul_fp8_dequant(&m, x, x_stride, T, got, y_stride, rb, re);
        kernel_ops_scalar.matmul_fp8_dequant(&mg, x, x_stride, T, ref_g, y_stride, rb, re);
        v->matmul_fp8_dequant(&mg, x, x_stride, T, got_g, y_stride, rb, re);
        data = w;
        grouped = wg;
        name = "matmul_fp8_dequant";
    }
    size_t first = 0;
    CHECK(same_bits(ref, got, ny, &first), "%s %s rows %d cols %d tokens %d range [%d, %d): y[%zu] = %a, scalar %a",
          v->name, name, rows, cols, T, rb, re, first, got[first], ref[first]);
    CHECK(same_bits(ref, ref_g, ny, &first),
          "scalar %s grouped rows %d cols %d tokens %d range [%d, %d): y[%zu] = %a, row-major %a", name, rows, cols, T,
          rb, re, first, ref_g[first], ref[first]);
    CHECK(same_bits(ref, got_g, ny, &first),
          "%s %s grouped rows %d cols %d tokens %d range [%d, %d): y[%zu] = %a, scalar %a", v->name, name, rows, cols, T,
          rb, re, first, got_g[first], ref[first]);
    free(data);
    free(grouped);
    free(scales);
    free(x);
    free(ref);
    free(got);
    free(ref_g);
    free(got_g);
}

TEST(kernels_float_products_bitwise) {
    static const int dims[][5] = {
        /* rows, cols, tokens, row_begin, row_end */
        {1, 1, 1, 0, 1},      {3, 7, 1, 0, 3},      {16, 16, 1, 0, 16},  {17, 33, 2, 0, 17},  {40, 100, 1, 5, 37},
        {33, 130, 3, 1, 33},  {64, 64, 1, 0, 64},   {20, 257, 4, 0, 20}, {130, 256, 1, 0, 130}, {24, 1024, 2, 0, 24},
        {300, 128, 1, 7, 300}, {5, 4096, 1, 0, 5},
        /* grouped layout: ranges that start and end inside groups, cross into the row-major tail
         * or lie in it, 15 groups (decode batches of 8, 4, 2, 1), 128-row scale blocks, the
         * token blocks of the prefill path */
        {245, 200, 1, 0, 245}, {245, 200, 1, 3, 243}, {245, 384, 2, 17, 241}, {245, 129, 5, 0, 245},
        {245, 256, 7, 240, 245}, {272, 300, 1, 100, 260}, {256, 128, 9, 8, 250}, {48, 1000, 1, 16, 32},
        {400, 640, 3, 120, 400}, {32, 64, 1, 31, 32},
    };
    for (size_t i = 0; variants[i]; i++) {
        const kernel_ops *v = kernels_lookup(variants[i]);
        if (!v) continue;
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
            for (int k = 0; k < 3; k++)
                check_float_product(v, (float_kind)k, dims[d][0], dims[d][1], dims[d][2], dims[d][3], dims[d][4]);
    }
}

/* A bf16 value of magnitude (1 + m/128) * 2^(e - 127), random sign and m: biased exponent e. */
static float bf16_with_exponent(int e) {
    const uint32_t bits = (rnd() % 2 ? 0x80000000u : 0u) | ((uint32_t)e << 23) | ((rnd() % 128u) << 16);
    return f32_from_bits(bits);
}

/* The prefill float products may use FMAs where every product w * x is exact (bf16-valued
 * activations, weights of at most 8 significant bits, products normal and finite): the same bits
 * as multiply-then-add. Checked against scalar on inputs where that holds (moderate exponents,
 * and the bounds: exponent sums 128 = the smallest normal product, 380 = the largest finite),
 * just outside it (127, 381, a subnormal or an f32 activation with low bits: the multiply-add
 * path), and with only some weight tiles outside (both paths in one call; one of them zeros and an
 * infinity, which is no zero tile). */
TEST(kernels_float_products_exact_products_bitwise) {
    static const int dims[][3] = {{37, 200, 2}, {64, 1024, 9}, {130, 256, 20}, {70, 64, 5}};
    int ran = 0;
    for (size_t vi = 0; variants[vi]; vi++) {
        const kernel_ops *v = kernels_lookup(variants[vi]);
        if (!v) continue;
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
            for (int mode = 0; mode < 8; mode++) {
                const int rows = dims[d][0], cols = dims[d][1], T = dims[d][2];
                /* exponents of activations and weights: their sum decides exactness */
                int ex = 127, ew = 120;
                switch (mode) {
                case 1: ex = 60, ew = 68; break;   /* sum 128: smallest normal product */
                case 2: ex = 200, ew = 180; break; /* sum 380: largest finite */
                case 3: ex = 60, ew = 67; break;   /* 127: below */
                case 4: ex = 200, ew = 181; break; /* 381: may overflow */
                default: break;
                }
                float *x = malloc((size_t)T * cols * sizeof(float));
                for (int i = 0; i < T * cols; i++) x[i] = rnd() % 9 == 0 ? 0.0f : bf16_with_exponent(ex - (int)(rnd() % 3) * (mode == 1 || mode == 3 ? 0 : 1));
                if (mode == 5) x[rnd() % (T * cols)] = f32_from_bits(0x3f800001u); /* one activation with 24 bits */
                uint16_t *wb = malloc((size_t)rows * cols * 2);
                float *wf = malloc((size_t)rows * cols * sizeof(float));
                for (int i = 0; i < rows * cols; i++) {
                    int e = ew + (mode == 1 || mode == 3 || mode == 2 || mode == 4 ? 0 : -(int)(rnd() % 4));
                    wf[i] = rnd() % 7 == 0 ? 0.0f : bf16_with_exponent(e);
                    if (mode == 6 && i % cols < 16 && i / cols == 3) wf[i] = f32_from_bits(0x00010000u); /* one subnormal column tile */
                    if (mode == 7 && i / cols < 16 && i % cols < 32) wf[i] = i == 3 * cols + 5 ? INFINITY : 0.0f; /* a tile of zeros and one inf */
                    wb[i] = f32_to_bf16(wf[i]);
                }
                const size_t ny = (size_t)T * rows;
                float *ref = sentinel_array(ny), *got = sentinel_array(ny);
                uint16_t *wbg = malloc((size_t)rows * cols * 2);
                memcpy(wbg, wb, (size_t)rows * cols * 2);
                REQUIRE(matrix_group_rows(wbg, 2, rows, cols) == 0, "grouping");
                const bf16_matrix mb = {wb, rows, cols, MATRIX_ROWS}, mbg = {wbg, rows, cols, MATRIX_GROUPS16};
                const f32_matrix mf = {wf, rows, cols};
                size_t first = 0;
                for (int k = 0; k < 3; k++) {
                    for (size_t i = 0; i < ny; i++) ref[i] = got[i] = f32_from_bits(SENTINEL);
                    if (k == 0) {
                        kernel_ops_scalar.matmul_bf16(&mb, x, cols, T, ref, rows, 0, rows);
                        v->matmul_bf16(&mb, x, cols, T, got, rows, 0, rows);
                    } else if (k == 1) {
                        kernel_ops_scalar.matmul_bf16(&mb, x, cols, T, ref, rows, 0, rows);
                        v->matmul_bf16(&mbg, x, cols, T, got, rows, 0, rows);
                    } else {
                        kernel_ops_scalar.matmul_f32(&mf, x, cols, T, ref, rows, 0, rows);
                        v->matmul_f32(&mf, x, cols, T, got, rows, 0, rows);
                    }
                    CHECK(same_bits(ref, got, ny, &first), "%s %s mode %d rows %d cols %d tokens %d: y[%zu] = %a, scalar %a",
                          v->name, k == 2 ? "f32" : k ? "bf16 grouped" : "bf16", mode, rows, cols, T, first, got[first],
                          ref[first]);
                    ran++;
                }
                free(x);
                free(wb);
                free(wbg);
                free(wf);
                free(ref);
                free(got);
            }
    }
    printf("    %d products checked\n", ran);
}

/* The one-token dequantized FP8 product (wo_a) with bf16-valued activations, where the AVX-512
 * kernel fuses each multiply and add when every product of a 128-column block is exact (the
 * scaled activations x * 2^(k + 120) bf16-valued, finite, none nonzero below the biased exponent
 * 114). Case 0 sits just outside: weight scale 2^-117 and activations 129 * 2^-24, so x * 2^3 has
 * biased exponent 113; with weights 2^-9 * 2 and 2^-9 in the first two columns the first product
 * is 129 * 2^-149 and the second 64.5 * 2^-149, a tie the scalar rounds before adding (193 *
 * 2^-149) where one FMA rounds the sum (194): the unfused path must be taken. Case 1: the same
 * weights with activations at exponent 114 and above (fused, exact); case 2: random bf16
 * activations, codes (subnormals included) and scales; case 3: the first block holds -1.5 (x = -1)
 * and then 1.5 * (1 + 2^-23), an activation of 24 significant bits, whose product the scalar
 * rounds to 1.5 + 2^-22 before adding (sum 2^-22) where an FMA keeps 2^-23 + 2^-24: the unfused
 * path must be taken; the second block as case 2. Both layouts, 1 token, 40 rows (two groups and a
 * remainder). */
TEST(kernels_fp8_dequant_one_token_fused_bounds) {
    const int rows = 40, cols = 256, ns = 1 * 2;
    int ran = 0;
    for (int mode = 0; mode < 4; mode++)
        for (int rep = 0; rep < 3; rep++) {
            uint8_t *w = malloc((size_t)rows * cols), *wg = malloc((size_t)rows * cols), scales[2];
            float x[256];
            for (int i = 0; i < rows * cols; i++) {
                const int c = i % cols;
                if (mode < 2 && c % 128 < 2) w[i] = (uint8_t)((c % 128 == 0 ? 0x02 : 0x01) | (rnd() % 2 ? 0x80 : 0));
                else if (mode == 3 && c < 2) w[i] = 0x3c; /* 1.5 */
                else w[i] = (uint8_t)(rnd() % 4 == 0 ? rnd() % 8 : random_e4m3());
            }
            for (int b = 0; b < ns; b++) scales[b] = mode < 2 ? 10 : (uint8_t)(rnd() % 3 == 0 ? 10 + rnd() % 4 : 110 + rnd() % 24);
            if (mode == 3) scales[0] = 127;
            for (int c = 0; c < cols; c++) {
                if (mode == 0) x[c] = c % 128 < 2 ? 129.0f * 0x1p-24f : 0.0f;
                else if (mode == 1) x[c] = c % 128 < 2 ? 129.0f * 0x1p-23f : rnd() % 2 ? 0.0f : bf16_with_exponent(111 + (int)(rnd() % 8));
                else x[c] = rnd() % 9 == 0 ? 0.0f : bf16_with_exponent(100 + (int)(rnd() % 40)) * (rnd() % 2 ? -1.0f : 1.0f);
                if (mode == 3 && c < 128) x[c] = c == 0 ? -1.0f : c == 1 ? f32_from_bits(0x3f800001u) : 0.0f;
            }
            memcpy(wg, w, (size_t)rows * cols);
            REQUIRE(matrix_group_rows(wg, 1, rows, cols) == 0, "grouping");
            const fp8_matrix m = {w, scales, rows, cols, MATRIX_ROWS, NULL}, mg = {wg, scales, rows, cols, MATRIX_GROUPS16, NULL};
            float ref[40], got[40];
            kernel_ops_scalar.matmul_fp8_dequant(&m, x, cols, 1, ref, rows, 0, rows);
            for (size_t vi = 0; variants[vi]; vi++) {
                const kernel_ops *v = kernels_lookup(variants[vi]);
                if (!v) continue;
                for (int layout = 0; layout < 2; layout++) {
                    size_t first = 0;
                    for (int i = 0; i < rows; i++) got[i] = f32_from_bits(SENTINEL);
                    v->matmul_fp8_dequant(layout ? &mg : &m, x, cols, 1, got, rows, 0, rows);
                    CHECK(same_bits(ref, got, (size_t)rows, &first), "%s %s mode %d rep %d: y[%zu] = %a, scalar %a", v->name,
                          layout ? "grouped" : "rows", mode, rep, first, got[first], ref[first]);
                    ran++;
                }
            }
            free(w);
            free(wg);
        }
    printf("    %d products checked\n", ran);
}

/* The grouped order element by element, for every element size and a short last group. */
TEST(kernels_matrix_group_rows_order) {
    const int rows = 37, cols = 5;
    for (size_t eb = 1; eb <= 4; eb *= 2) {
        uint8_t *a = malloc((size_t)rows * cols * eb), *g = malloc((size_t)rows * cols * eb);
        for (size_t i = 0; i < (size_t)rows * cols * eb; i++) a[i] = (uint8_t)rnd();
        memcpy(g, a, (size_t)rows * cols * eb);
        REQUIRE(matrix_group_rows(g, eb, rows, cols) == 0, "matrix_group_rows");
        int bad = 0;
        for (int r = 0; r < rows; r++) {
            size_t step;
            const size_t o = matrix_row_origin(MATRIX_GROUPS16, rows, cols, r, &step);
            for (int c = 0; c < cols; c++)
                bad += memcmp(g + (o + (size_t)c * step) * eb, a + ((size_t)r * cols + c) * eb, eb) != 0;
            CHECK(step == (r < 32 ? 16u : 1u), "row %d step %zu", r, step);
        }
        CHECK(bad == 0, "%zu-byte elements: %d misplaced", eb, bad);
        free(a);
        free(g);
    }
}

TEST(kernels_quantize_and_weighted_rows_bitwise) {
    for (size_t i = 0; variants[i]; i++) {
        const kernel_ops *v = kernels_lookup(variants[i]);
        if (!v) continue;
        for (int n = 128; n <= 1024; n += 384) {
            float *x = malloc((size_t)n * sizeof(float));
            for (int k = 0; k < n; k++) x[k] = bf16_round(random_f32_wide());
            if (n > 128) for (int k = 128; k < 256; k++) x[k] = 0.0f; /* an all-zero block: amax floor */
            uint8_t c1[1024], c2[1024];
            float s1[8], s2[8];
            kernel_ops_scalar.quantize_fp8_act(x, n, c1, s1);
            v->quantize_fp8_act(x, n, c2, s2);
            CHECK(!memcmp(c1, c2, (size_t)n) && !memcmp(s1, s2, (size_t)(n / 128) * sizeof(float)),
                  "%s quantize_fp8_act n %d differs", v->name, n);
            free(x);
        }
        /* lengths around the vector widths and the 64-output register passes, 0 to 9 rows (64: a
         * whole attention block), 1 to 9 heads (the kernels' head groups and their last partial
         * one); rescale 0 (a first block), 1, random, per head. Inputs: any f32 (products rounded);
         * bf16 values whose exponent sums are 128..380 (exact products, the fused form), at both
         * bounds. y has a margin past the heads' outputs that must stay untouched. */
        static const int lengths[] = {0, 1, 7, 15, 16, 17, 63, 250, 256, 257, 300, 512, 529};
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
            for (int mode = 0; mode < 4; mode++) {
                const int n = lengths[li], n_rows = li == 9 ? 64 : (int)(li % 10), heads = 1 + (int)((li + mode) % 9);
                const int a_stride = 67;
                static float y1[9 * 529 + 32], y2[9 * 529 + 32], a[9 * 67], rows[64 * 529];
                const int exact = mode > 0;
                for (int h = 0; h < heads; h++)
                    for (int j = 0; j < n_rows; j++)
                        a[h * a_stride + j] = !exact ? random_f32_wide() : rnd() % 9 == 0 ? 0.0f : bf16_with_exponent(mode == 2 ? 60 : mode == 3 ? 200 : 100 + (int)(rnd() % 28));
                for (int k = 0; k < n_rows * n; k++)
                    rows[k] = !exact ? random_f32_wide() : rnd() % 9 == 0 ? 0.0f : bf16_with_exponent(mode == 2 ? 68 : mode == 3 ? 180 : 40 + (int)(rnd() % 100));
                const size_t ny = (size_t)heads * n + 32;
                for (size_t k = 0; k < ny; k++) y1[k] = y2[k] = random_f32_wide();
                float rescale[9];
                for (int h = 0; h < heads; h++)
                    rescale[h] = (li + h) % 3 == 0 ? 0.0f : (li + h) % 3 == 1 ? 1.0f : ldexpf((float)(rnd() % 1000) + 1.0f, -10);
                /* rows in reverse order of memory (the kernel takes any row addresses) */
                const float *row_at[64];
                for (int j = 0; j < n_rows; j++) row_at[j] = rows + (size_t)(n_rows - 1 - j) * n;
                kernel_ops_scalar.rescale_add_weighted_rows_f32(y1, rescale, a, a_stride, heads, row_at, n_rows, n, exact);
                v->rescale_add_weighted_rows_f32(y2, rescale, a, a_stride, heads, row_at, n_rows, n, exact);
                size_t first = 0;
                CHECK(same_bits(y1, y2, ny, &first),
                      "%s rescale_add_weighted_rows_f32 mode %d n %d rows %d heads %d: y[%zu] = %a, scalar %a", v->name,
                      mode, n, n_rows, heads, first, y2[first], y1[first]);
            }
    }
}

/* Activation quantization at every rounding boundary of e4m3: each code's value, the midpoints
 * between neighbouring codes (ties: to the even code), the floats just beside them, the subnormal
 * grid, both signs, under block scales from 2^-20 to 2^20 (each block holds 448 * scale, so the
 * scale is known), and NaN and infinite activations. */
TEST(kernels_quantize_rounding_boundaries_bitwise) {
    float cand[127 * 6 + 8];
    int nc = 0;
    for (int c = 0; c < 0x7e; c++) {
        const float a = e4m3_value_table[c], b = e4m3_value_table[c + 1], mid = 0.5f * (a + b);
        cand[nc++] = a;
        cand[nc++] = -mid;
        cand[nc++] = mid;
        cand[nc++] = nextafterf(mid, 0.0f);
        cand[nc++] = -nextafterf(mid, 1000.0f);
        cand[nc++] = nextafterf(a, 1000.0f);
    }
    cand[nc++] = 448.0f;
    cand[nc++] = 460.0f; /* clamped */
    cand[nc++] = -1e30f;
    cand[nc++] = f32_from_bits(0x00000001u);
    cand[nc++] = -0.0f;
    cand[nc++] = NAN;
    cand[nc++] = INFINITY;
    cand[nc++] = 0x1p-10f;
    const int blocks = (nc + 126) / 127;
    float *x = malloc((size_t)blocks * 128 * sizeof(float));
    uint8_t *c1 = malloc((size_t)blocks * 128), *c2 = malloc((size_t)blocks * 128);
    float *s1 = malloc((size_t)blocks * sizeof(float)), *s2 = malloc((size_t)blocks * sizeof(float));
    int ran = 0;
    for (int k = -20; k <= 20; k += 5)
        for (size_t vi = 0; variants[vi]; vi++) {
            const kernel_ops *v = kernels_lookup(variants[vi]);
            if (!v) continue;
            const float scale = ldexpf(1.0f, k);
            for (int b = 0; b < blocks; b++) {
                x[b * 128] = 448.0f * scale;
                for (int i = 1; i < 128; i++) {
                    const int j = b * 127 + i - 1;
                    x[b * 128 + i] = j < nc ? cand[j] * scale : 0.0f;
                }
            }
            /* one block with a NaN and an infinity only in its amax search */
            kernel_ops_scalar.quantize_fp8_act(x, blocks * 128, c1, s1);
            v->quantize_fp8_act(x, blocks * 128, c2, s2);
            int first = -1;
            for (int i = 0; i < blocks * 128 && first < 0; i++)
                if (c1[i] != c2[i]) first = i;
            CHECK(first < 0, "%s quantize, scale 2^%d: x[%d] = %a gives code 0x%02x, scalar 0x%02x", v->name, k, first,
                  first >= 0 ? x[first] : 0.0f, first >= 0 ? c2[first] : 0, first >= 0 ? c1[first] : 0);
            CHECK(!memcmp(s1, s2, (size_t)blocks * sizeof(float)), "%s quantize, scale 2^%d: block scales differ", v->name, k);
            ran++;
        }
    printf("    %d boundary values, %d variant runs\n", nc, ran);
    free(x);
    free(c1);
    free(c2);
    free(s1);
    free(s2);
}

/* The par_* forms at 1, 2 and 3 threads equal the plain single-threaded call. */
TEST(kernels_thread_count_invariance) {
    enum { T = 20 }; /* 1 token (decode forms), 3 (several-token forms), 20 (prefill tiles) */
    const int rows = 301, cols = 512;
    uint8_t *w8 = malloc((size_t)rows * cols), *w4 = malloc((size_t)rows * cols / 2), *s4 = malloc((size_t)rows * cols / 32);
    uint8_t s8[3 * 4];
    uint16_t *wb = malloc((size_t)rows * cols * 2);
    for (int i = 0; i < rows * cols; i++) {
        w8[i] = random_e4m3();
        wb[i] = random_bf16();
    }
    for (int i = 0; i < rows * cols / 2; i++) w4[i] = (uint8_t)rnd();
    for (int i = 0; i < rows * cols / 32; i++) s4[i] = random_e8m0();
    for (int i = 0; i < 12; i++) s8[i] = random_e8m0();
    uint8_t xc[T * 512];
    float xs[T * 4], xf[T * 512];
    random_activations(xc, xs, T, cols);
    for (int i = 0; i < T * cols; i++) xf[i] = bf16_round(random_f32_wide());
    uint8_t *w8g = malloc((size_t)rows * cols);
    uint16_t *wbg = malloc((size_t)rows * cols * 2);
    memcpy(w8g, w8, (size_t)rows * cols);
    memcpy(wbg, wb, (size_t)rows * cols * 2);
    REQUIRE(matrix_group_rows(w8g, 1, rows, cols) == 0 && matrix_group_rows(wbg, 2, rows, cols) == 0, "grouping");
    const fp8_matrix m8 = {w8, s8, rows, cols, MATRIX_ROWS, NULL}, m8g = {w8g, s8, rows, cols, MATRIX_GROUPS16, NULL};
    const fp4_matrix m4 = {w4, s4, rows, cols};
    const bf16_matrix mb = {wb, rows, cols, MATRIX_ROWS}, mbg = {wbg, rows, cols, MATRIX_GROUPS16};
    const size_t ny = (size_t)T * rows;
    float *ref = malloc(ny * 6 * sizeof(float)), *got = malloc(ny * 6 * sizeof(float));
    const int before = kernels_threads();
    static const int token_counts[] = {1, 3, T};
    for (size_t ti = 0; ti < sizeof token_counts / sizeof token_counts[0]; ti++) {
        const int tokens = token_counts[ti];
        matmul_fp8(&m8, xc, xs, tokens, ref, rows, 0, rows);
        matmul_fp4(&m4, xc, xs, tokens, ref + ny, rows, 0, rows);
        matmul_bf16(&mb, xf, cols, tokens, ref + 2 * ny, rows, 0, rows);
        matmul_fp8_dequant(&m8, xf, cols, tokens, ref + 3 * ny, rows, 0, rows);
        matmul_bf16(&mbg, xf, cols, tokens, ref + 4 * ny, rows, 0, rows);
        matmul_fp8_dequant(&m8g, xf, cols, tokens, ref + 5 * ny, rows, 0, rows);
        for (int threads = 1; threads <= 3; threads++) {
            REQUIRE(kernels_set_threads(threads) == 0, "thread pool of %d", threads);
            memset(got, 0, ny * 6 * sizeof(float));
            par_matmul_fp8(&m8, xc, xs, tokens, got, rows, 0, rows);
            par_matmul_fp4(&m4, xc, xs, tokens, got + ny, rows, 0, rows);
            par_matmul_bf16(&mb, xf, cols, tokens, got + 2 * ny, rows, 0, rows);
            par_matmul_fp8_dequant(&m8, xf, cols, tokens, got + 3 * ny, rows, 0, rows);
            par_matmul_bf16(&mbg, xf, cols, tokens, got + 4 * ny, rows, 0, rows);
            par_matmul_fp8_dequant(&m8g, xf, cols, tokens, got + 5 * ny, rows, 0, rows);
            const size_t used = (size_t)tokens * rows;
            size_t first = 0;
            for (int k = 0; k < 6; k++)
                CHECK(same_bits(ref + k * ny, got + k * ny, used, &first), "%d threads, %d tokens: product %d output %zu differs",
                      threads, tokens, k, first);
            /* the bf16-output form: the same product, each output rounded, nothing outside the rows */
            for (size_t i = 0; i < ny; i++) got[i] = -1.0f;
            par_matmul_fp8_bf16(&m8, xc, xs, tokens, got, rows, 0, rows);
            int rounded_ok = 1;
            for (size_t i = 0; i < ny; i++) {
                const float want = i < used ? bf16_round(ref[i]) : -1.0f;
                rounded_ok &= !memcmp(&want, &got[i], sizeof want);
            }
            CHECK(rounded_ok, "%d threads, %d tokens: par_matmul_fp8_bf16 is not the rounded product", threads, tokens);
            /* few rows (24, not 16-aligned): the float products split their tokens across the
             * threads instead; the rows outside the range stay untouched */
            for (size_t i = 0; i < ny * 4; i++) got[i] = -1.0f;
            par_matmul_bf16(&mb, xf, cols, tokens, got, rows, 5, 29);
            par_matmul_fp8_dequant(&m8, xf, cols, tokens, got + ny, rows, 5, 29);
            par_matmul_bf16(&mbg, xf, cols, tokens, got + 2 * ny, rows, 5, 29);
            par_matmul_fp8_dequant(&m8g, xf, cols, tokens, got + 3 * ny, rows, 5, 29);
            int few_ok = 1;
            for (int k = 0; k < 4; k++)
                for (size_t i = 0; i < ny; i++) {
                    const int r = (int)(i % (size_t)rows);
                    const float want = i < used && r >= 5 && r < 29 ? ref[(2 + (k & 1) + 2 * (k >> 1)) * ny + i] : -1.0f;
                    few_ok &= !memcmp(&want, &got[k * ny + i], sizeof want);
                }
            CHECK(few_ok, "%d threads, %d tokens: the 24-row float products differ", threads, tokens);
        }
        for (size_t i = 0; i < (size_t)tokens * rows; i++)
            CHECK(!memcmp(&ref[2 * ny + i], &ref[4 * ny + i], 4) && !memcmp(&ref[3 * ny + i], &ref[5 * ny + i], 4),
                  "%d tokens: grouped layout differs at %zu", tokens, i);
    }
    kernels_set_threads(before);
    free(w8);
    free(w8g);
    free(w4);
    free(s4);
    free(wb);
    free(wbg);
    free(ref);
    free(got);
}

TEST(kernels_select_names) {
    char msg[256];
    const char *before = kernels_selected();
    CHECK(kernels_select("scalar", msg, sizeof msg) == 0, "scalar must always be available");
    CHECK(!strcmp(kernels_selected(), "scalar"), "selected %s", kernels_selected());
    CHECK(kernels_select("bogus", msg, sizeof msg) != 0 && strstr(msg, "unknown"), "bogus accepted: %s", msg);
    CHECK(kernels_select("auto", msg, sizeof msg) == 0, "auto: %s", msg);
    printf("    auto picks %s; threads default %d\n", kernels_selected(), kernels_default_threads());
    kernels_select(before, msg, sizeof msg);
}

/* The memory plan's kernel workspace bounds every activation form a product can prepare: each
 * variant, every token count up to the chunk (the forms switch layout at small counts), inputs up
 * to the widest; the shared form and each thread's own fit in it. */
TEST(kernels_workspace_bounds_every_activation_form) {
    const char *const *names = kernels_variant_names;
    char msg[256];
    const char *before = kernels_selected();
    int checked = 0;
    for (size_t vi = 0; names[vi]; vi++) {
        if (!kernels_available(names[vi])) continue;
        REQUIRE(kernels_select(names[vi], msg, sizeof msg) == 0, "%s: %s", names[vi], msg);
        const kernel_ops *k = kernels_lookup(names[vi]);
        static const int chunks[] = {1, 7, 64, 512};
        for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
            const int chunk = chunks[ci], max_cols = 8192;
            const size_t room = kernels_workspace_bytes(chunk, max_cols) / (size_t)(1 + kernels_threads());
            for (int n = 1; n <= chunk; n += n < 80 ? 1 : 37)
                for (int cols = 128; cols <= max_cols; cols *= 4) {
                    const size_t f8 = k->fp8_act_bytes ? k->fp8_act_bytes(n, cols) : 0;
                    const size_t f4 = k->fp4_act_bytes ? k->fp4_act_bytes(n, cols) : 0;
                    CHECK(f8 <= room && f4 <= room, "%s, chunk %d: %d tokens x %d columns need %zu / %zu bytes, room %zu",
                          names[vi], chunk, n, cols, f8, f4, room);
                    checked++;
                }
        }
    }
    kernels_select(before, msg, sizeof msg);
    printf("    %d form sizes checked\n", checked);
}
