/* AMX kernels: the FP8 x FP8 products of 2 or more tokens and the FP4 x FP8 products of 9 or more
 * (prefill chunks, experts several tokens chose) on the tile matrix unit (AMX-TILE, -INT8, -BF16), bit-identical
 * to kernels_scalar.c. Everything else, fewer tokens included, is the AVX-512 variant's.
 *
 * How the block sums stay exact:
 *  - FP8 x FP8 (AMX-INT8). A code's integer k = value * 2^9 (|k| <= 229376) is written in three
 *    balanced base-128 digits, |k| = d0 + 2^7 d1 + 2^14 d2 with d0, d1 in [-64, 63] and d2 in
 *    [0, 14], negated for negative codes: three signed bytes per code, one "digit plane" each.
 *    TDPBSSD adds to a 16 x 16 tile of int32 the products of 16 rows x 64 signed bytes (here:
 *    weight rows) and 64 x 16 signed bytes (activations of 16 tokens). Per block of 128 columns the
 *    nine weight-digit x activation-digit products go into five tiles by digit weight,
 *    G_s = sum over i + j = s of W_i . X_j (|G_s| < 2^21). Then L = G0 + 2^7 G1 (< 2^28) and
 *    T = G2 + 2^7 G3 + 2^14 G4 (< 2^30) in int32, and S = L + 2^14 T by one f64 FMA on integers
 *    below 2^53: exact. The f64 holds the exact sum, so its rounding to f32 is the scalar's
 *    (float)int64 conversion.
 *  - FP4 x FP8 (AMX-BF16), block of 32 columns: weights and activations as bf16 in two activation
 *    planes whose f32 sums are exact in any order (see the FP4 section).
 *  - Then the scalar's steps in its order: f = f32(S) * 2^-18 (FP4: 2^-10), acc = acc + f * (xs *
 *    ws), blocks ascending (separate multiply and add).
 *
 * Layout. The activations of a product are prepared once (and shared by the threads) in the
 * second-operand order of the tile products, then the activation scales token by token; tokens
 * past the last are zero. The weights are turned into digit planes (FP8) or bf16 (FP4) one block
 * of rows x 128 columns at a time, in a small per-thread buffer that stays in L1 while every token
 * group uses it. Accumulators hold 16 rows x 16 tokens (a row per vector, a token per lane); a
 * transpose stores them as y[token][row].
 *
 * The operating system must allow a process to use the tile registers (Linux:
 * arch_prctl(ARCH_REQ_XCOMP_PERM)); kernels_amx_permitted asks once. */
#include "kernels/kernels_internal.h"
#include "kernels/kernels_avx512_inline.h"

#include <immintrin.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* Below these many tokens the AVX-512 forms are faster (a tile always computes 16 tokens; measured
 * on 4096 x 4096 FP8 and 2048 x 4096 FP4 products, one thread: FP8 1.9 ms with AVX-512 against 3.0
 * with tiles at 1 token, 3.7 against 3.1 at 2. FP4 against the AVX-512 int16 words form, ms per
 * token, `bench_kernels --quick --several-tokens`, two runs: 4 tokens 0.148-0.150 against
 * 0.222-0.231 with tiles, 6 tokens 0.124-0.128 against 0.152-0.153, 8 tokens 0.110-0.117 against
 * 0.113-0.118, 9 tokens 0.110-0.112 against 0.105, 12 tokens 0.095-0.100 against 0.079-0.081). */
#define AMX_FP8_MIN_TOKENS 2
#define AMX_FP4_MIN_TOKENS 9

#define DIGITS 3
#define TILE_BYTES 1024
#define STEP_COLS 64 /* columns of one TDPBSSD */

int kernels_amx_permitted(void) {
#if defined(__linux__)
    static int answer = -1;
    if (answer < 0) {
        /* ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA: the process may use the 8 KB tile state */
        answer = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    }
    return answer;
#else
    return 0;
#endif
}

/* Both products take their token groups a slice at a time, every row of the matrix passing over
 * one slice's activation form before the next (1 MB of it: the cores with AMX have 2 MB of L2),
 * instead of over the whole form once per row group: for a 256-token chunk of 4096 columns the
 * FP8 form is 3 MB, the FP4 one 4 MB, read again from beyond L2 for every 16 or 32 rows. The
 * weights' conversion is then repeated per slice. 4096 x 4096 FP8, 1 thread, 256 tokens: 58-59
 * -> 38-39 ms (43-46 at 512 KB or 1.5 MB), 64 tokens (one slice) unchanged; FP4 2048 x 4096:
 * 0.072-0.077 -> 0.060-0.062 ms per token at 256 tokens, 0.057-0.060 at 64 either way. */
#define AMX_SLICE_FORM_BYTES ((size_t)1 << 20)

/* The tile configuration TILELOADCONFIG reads: palette 1, bytes per row and rows of each tile. */
typedef struct __attribute__((packed)) tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static void tile_config_set(tile_config *c, int tile, int rows, int colsb) {
    c->rows[tile] = (uint8_t)rows;
    c->colsb[tile] = (uint16_t)colsb;
}

_Static_assert(DIGITS == KERNEL_E4M3_DIGITS, "the digit tables are built in kernels_scalar.c");

typedef struct digit_lookup {
    __m512i lo[DIGITS], hi[DIGITS];
} digit_lookup;

static inline digit_lookup digit_lookup_make(void) {
    digit_lookup t;
    for (int d = 0; d < DIGITS; d++) {
        t.lo[d] = _mm512_load_si512(kernel_e4m3_digits[d]);
        t.hi[d] = _mm512_load_si512(kernel_e4m3_digits[d] + 64);
    }
    return t;
}

/* 64 e4m3 codes -> their three digit planes. */
static inline __attribute__((always_inline)) void digits64(const digit_lookup *t, __m512i codes, __m512i out[DIGITS]) {
    const __m512i mag = _mm512_and_si512(codes, _mm512_set1_epi8(0x7f));
    const __mmask64 neg = _mm512_movepi8_mask(codes);
    UNROLL(3)
    for (int d = 0; d < DIGITS; d++) {
        const __m512i v = _mm512_permutex2var_epi8(t->lo[d], mag, t->hi[d]);
        out[d] = _mm512_mask_sub_epi8(v, neg, _mm512_setzero_si512(), v);
    }
}

/* --- the shared activation form --- */

static inline int token_groups(int n_tokens) { return (n_tokens + 15) / 16; }

static size_t amx_planes_bytes(int n_tokens, int cols) {
    return (size_t)token_groups(n_tokens) * (cols / STEP_COLS) * DIGITS * TILE_BYTES;
}

static size_t amx_act_bytes(int n_tokens, int cols) {
    return amx_planes_bytes(n_tokens, cols) + (size_t)token_groups(n_tokens) * (cols / FP8_ACT_BLOCK) * 16 * sizeof(float);
}

/* Token group g's activation scales, block by block, token by token ([groups][blocks][16]; 0 for
 * the tokens past the last): the scale part of both activation forms. */
static void group_scales_store(const float *x_scales, int n_tokens, int blocks, int g, float *scales) {
    for (int b = 0; b < blocks; b++)
        for (int n = 0; n < 16; n++) {
            const int tok = 16 * g + n;
            scales[((size_t)g * blocks + b) * 16 + n] = tok < n_tokens ? x_scales[(size_t)tok * blocks + b] : 0.0f;
        }
}

/* The FP8 form: per group of 16 tokens and 64 columns, three 1 KB digit tiles in TDPBSSD's
 * second-operand order (row q holds, for each token n, its digits of columns 4q..4q+3 at bytes
 * 4n..4n+3), then the activation scales. */
static void amx_act_prepare(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols, void *act) {
    const int groups = token_groups(n_tokens), steps = cols / STEP_COLS, blocks = cols / FP8_ACT_BLOCK;
    const digit_lookup t = digit_lookup_make();
    uint8_t *planes = act;
    float *scales = (float *)(planes + amx_planes_bytes(n_tokens, cols));
    for (int g = 0; g < groups; g++) {
        for (int s = 0; s < steps; s++) {
            __m512i r[16];
            for (int n = 0; n < 16; n++) {
                const int tok = 16 * g + n;
                r[n] = tok < n_tokens ? _mm512_loadu_si512(x_codes + (size_t)tok * cols + (size_t)s * STEP_COLS)
                                      : _mm512_setzero_si512();
            }
            transpose16x16(r); /* r[q] lane n: codes 4q..4q+3 of token n */
            uint8_t *dst = planes + ((size_t)g * steps + s) * DIGITS * TILE_BYTES;
            for (int q = 0; q < 16; q++) {
                __m512i d[DIGITS];
                digits64(&t, r[q], d);
                for (int k = 0; k < DIGITS; k++) _mm512_store_si512(dst + k * TILE_BYTES + q * 64, d[k]);
            }
        }
        group_scales_store(x_scales, n_tokens, blocks, g, scales);
    }
}

/* Stores a 16 rows x 16 tokens accumulator tile (acc[i] lane n) as y[token][row]. */
static inline void store_tile(const float *acc, float *y, int y_stride, int r0, int nr, int t0, int nt) {
    __m512i r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_load_si512(acc + 16 * i);
    transpose16x16(r); /* r[n] lane i: row i of token n */
    const __mmask16 rows = (__mmask16)((1u << nr) - 1);
    for (int n = 0; n < nt; n++) _mm512_mask_storeu_ps(y + (size_t)(t0 + n) * y_stride + r0, rows, _mm512_castsi512_ps(r[n]));
}

static _Thread_local kernel_scratch act_scratch, work_scratch;

/* --- FP8 x FP8 ---
 * Tiles: 0-4 the digit-weight sums G_s, 5 a weight digit plane, 6 and 7 activation digit planes. */

/* One finished block product of a token group: its five digit-weight sums, to be added to the
 * group's accumulators with the block's scales. */
typedef struct fp8_pending {
    const int32_t *sums; /* [5][16 rows][16 tokens] */
    float *acc;          /* [16 rows][16 tokens] */
    const float *ws;     /* [16 rows] */
    __m512 xs;
} fp8_pending;

/* Row i of a pending block: acc = acc + f * (xs * ws) with f = f32(S) * 2^-18 as the scalar. */
static inline __attribute__((always_inline)) void fp8_combine_row(const fp8_pending *p, int i) {
    const __m512d two14 = _mm512_set1_pd(0x1p14);
    const int32_t *s = p->sums + 16 * i;
    const __m512i lo = _mm512_add_epi32(_mm512_load_si512(s), _mm512_slli_epi32(_mm512_load_si512(s + 256), 7));
    const __m512i hi = _mm512_add_epi32(_mm512_load_si512(s + 512), _mm512_slli_epi32(_mm512_load_si512(s + 768), 7));
    const __m512i top = _mm512_add_epi32(hi, _mm512_slli_epi32(_mm512_load_si512(s + 1024), 14));
    __m512d e[2];
    UNROLL(2)
    for (int half = 0; half < 2; half++) {
        const __m256i l = half ? _mm512_extracti64x4_epi64(lo, 1) : _mm512_castsi512_si256(lo);
        const __m256i u = half ? _mm512_extracti64x4_epi64(top, 1) : _mm512_castsi512_si256(top);
        e[half] = _mm512_fmadd_pd(_mm512_cvtepi32_pd(u), two14, _mm512_cvtepi32_pd(l));
    }
    const __m512 sum = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(e[0])), _mm512_cvtpd_ps(e[1]), 1);
    const __m512 f = _mm512_mul_ps(sum, _mm512_set1_ps(0x1p-18f));
    const __m512 sc = _mm512_mul_ps(p->xs, _mm512_set1_ps(p->ws[i]));
    float *acc = p->acc + 16 * i;
    _mm512_store_ps(acc, _mm512_add_ps(_mm512_load_ps(acc), _mm512_mul_ps(f, sc)));
}

/* The previous token group's sums (the other half of a double buffer) are added a row at a time
 * between this group's tile products. A tile product retires only when done, and the instructions
 * after it wait in the reorder buffer: the vector work of a whole block (about 430 instructions)
 * placed after the products fills that buffer and stalls the next products; one row (27) after
 * each product does not. Tile sequence alone 5.2 ns per product, with the whole combine after it
 * 9.5-9.7, with the rows interleaved 5.9 (a /tmp microbenchmark of this loop). */
static void amx_fp8_rows(const fp8_matrix *w, const void *act, int n_tokens, float *y, int y_stride, int row_begin,
                         int row_end) {
    const int cols = w->cols, blocks = cols / FP8_ACT_BLOCK, steps = cols / STEP_COLS, scale_cols = (cols + 127) / 128;
    const int groups = token_groups(n_tokens);
    const uint8_t *planes = act;
    const float *x_scales = (const float *)(planes + amx_planes_bytes(n_tokens, cols));
    /* weight digits [3][16 rows][128], sums [2 buffers][5][16][16], accumulators [groups][16][16] */
    uint8_t *work = kernel_scratch_get(&work_scratch, DIGITS * 16 * 128 + 2 * 5 * TILE_BYTES + (size_t)groups * TILE_BYTES);
    int8_t *wd = (int8_t *)work;
    int32_t *sums = (int32_t *)(work + DIGITS * 16 * 128);
    float *accs = (float *)(work + DIGITS * 16 * 128 + 2 * 5 * TILE_BYTES);
    const digit_lookup t = digit_lookup_make();

    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) tile_config_set(&cfg, i, 16, 64);
    _tile_loadconfig(&cfg);

    const size_t group_bytes = (size_t)steps * DIGITS * TILE_BYTES;
    int slice = (int)(AMX_SLICE_FORM_BYTES / group_bytes);
    slice = slice < 1 ? 1 : slice;
    for (int g0 = 0; g0 < groups; g0 += slice) {
        const int g1 = groups - g0 < slice ? groups : g0 + slice;
        for (int r0 = row_begin; r0 < row_end; r0 += 16) {
            const int nr = row_end - r0 < 16 ? row_end - r0 : 16;
            memset(accs, 0, (size_t)(g1 - g0) * TILE_BYTES);
            /* the last group of a block is added while the next block's first is computed, so
             * the weight scales are double-buffered */
            fp8_pending pending = {0}; /* pending.sums is NULL until the first product */
            int buffer = 0;
            float ws_buffers[2][16];
            for (int b = 0; b < blocks; b++) {
                float *ws = ws_buffers[b & 1];
                /* the next block's weights: 16 rows far apart, which the hardware prefetcher misses */
                if (b + 1 < blocks)
                    for (int i = 0; i < nr; i++) {
                        const char *next = (const char *)(w->codes + (size_t)(r0 + i) * cols + (size_t)(b + 1) * 128);
                        _mm_prefetch(next, _MM_HINT_T0);
                        _mm_prefetch(next + 64, _MM_HINT_T0);
                    }
                for (int i = 0; i < 16; i++) {
                    __m512i d[2][DIGITS];
                    if (i < nr) {
                        const uint8_t *src = w->codes + (size_t)(r0 + i) * cols + (size_t)b * 128;
                        digits64(&t, _mm512_loadu_si512(src), d[0]);
                        digits64(&t, _mm512_loadu_si512(src + 64), d[1]);
                        ws[i] = kernel_e8m0(w->scales[(size_t)((r0 + i) / 128) * scale_cols + b]);
                    } else {
                        for (int k = 0; k < DIGITS; k++) d[0][k] = d[1][k] = _mm512_setzero_si512();
                        ws[i] = 0.0f;
                    }
                    for (int k = 0; k < DIGITS; k++) {
                        _mm512_store_si512(wd + (k * 16 + i) * 128, d[0][k]);
                        _mm512_store_si512(wd + (k * 16 + i) * 128 + 64, d[1][k]);
                    }
                }
                for (int g = g0; g < g1; g++) {
                    int32_t *out = sums + (size_t)buffer * 5 * 256;
                    _tile_zero(0);
                    _tile_zero(1);
                    _tile_zero(2);
                    _tile_zero(3);
                    _tile_zero(4);
                    for (int h = 0; h < 2; h++) {
                        const uint8_t *xt = planes + ((size_t)g * steps + 2 * b + h) * DIGITS * TILE_BYTES;
                        const int8_t *w0 = wd + h * 64, *w1 = wd + 16 * 128 + h * 64, *w2 = wd + 2 * 16 * 128 + h * 64;
                        /* activation digits 0 and 1 against every weight digit, then digit 2; no two
                         * products in a row add to the same tile (a product's latency is longer than
                         * its issue interval) */
                        const int r = 8 * h; /* rows r..r+7 of the pending sums */
#define FP8_PENDING_ROW(k) \
    if (pending.sums) fp8_combine_row(&pending, r + (k))
                        _tile_loadd(6, xt, 64);
                        _tile_loadd(7, xt + TILE_BYTES, 64);
                        _tile_loadd(5, w0, 128);
                        _tile_dpbssd(0, 5, 6);
                        FP8_PENDING_ROW(0);
                        _tile_dpbssd(1, 5, 7);
                        FP8_PENDING_ROW(1);
                        _tile_loadd(5, w1, 128);
                        _tile_dpbssd(2, 5, 7);
                        FP8_PENDING_ROW(2);
                        _tile_dpbssd(1, 5, 6);
                        FP8_PENDING_ROW(3);
                        _tile_loadd(5, w2, 128);
                        _tile_dpbssd(3, 5, 7);
                        FP8_PENDING_ROW(4);
                        _tile_dpbssd(2, 5, 6);
                        FP8_PENDING_ROW(5);
                        _tile_loadd(6, xt + 2 * TILE_BYTES, 64);
                        _tile_dpbssd(4, 5, 6);
                        FP8_PENDING_ROW(6);
                        _tile_loadd(5, w1, 128);
                        _tile_dpbssd(3, 5, 6);
                        FP8_PENDING_ROW(7);
                        _tile_loadd(5, w0, 128);
                        _tile_dpbssd(2, 5, 6);
#undef FP8_PENDING_ROW
                    }
                    _tile_stored(0, out, 64);
                    _tile_stored(1, out + 256, 64);
                    _tile_stored(2, out + 512, 64);
                    _tile_stored(3, out + 768, 64);
                    _tile_stored(4, out + 1024, 64);
                    pending = (fp8_pending){out, accs + (size_t)(g - g0) * 256, ws,
                                            _mm512_loadu_ps(x_scales + ((size_t)g * blocks + b) * 16)};
                    buffer ^= 1;
                }
            }
            if (pending.sums)
                for (int i = 0; i < 16; i++) fp8_combine_row(&pending, i);
            for (int g = g0; g < g1; g++) {
                const int nt = n_tokens - 16 * g < 16 ? n_tokens - 16 * g : 16;
                store_tile(accs + (size_t)(g - g0) * 256, y, y_stride, r0, nr, 16 * g, nt);
            }
        }
    }
    _tile_release();
}

/* --- FP4 x FP8 ---
 * On the BF16 tile products (TDPBF16PS: 16 x 16 f32 += 16 rows x 32 bf16 . 32 bf16 x 16 tokens),
 * whose sums are exact here whatever order the unit adds in: every operand is a bf16 with at most
 * four significant bits (weights j = 2 * e2m1 in [-12, 12], activations k * 2^-10, k = value *
 * 2^9 an integer), so every product is exact in f32, and each token group's block of activations
 * is split in two planes so that no partial sum needs more than 24 bits. With v(k) the number of
 * times 2 divides k and B = 12 * sum |k| over a token's 32 columns (which bounds every partial
 * sum of that token's products, in units of 2^-10), the group's shift s is the least with B <
 * 2^(24 + s) for all 16 tokens (s <= 3: B < 12 * 32 * 229376 < 2^27):
 *  - plane H: the codes with v(k) >= s (zeros included): every term is a multiple of 2^s units
 *    and every partial sum below 2^(24 + s) units, so exact;
 *  - plane L: the rest, v(k) < s, so |k| <= 60 (e4m3 exponent field <= 3): partial sums below
 *    12 * 32 * 60 units, exact.
 * On quantized activations s is mostly 0 or 1, and L is then empty (s = 0) or holds only codes
 * below 2^-4 with an odd k; a group's block whose L is empty (flagged in the form) takes one tile
 * product and one store instead of two of each. Nothing is subnormal (the smallest nonzero term
 * is 2^-10, the largest sum below 2^17), so the unit's flushing of subnormals never applies.
 * H + L rounded once is f32(S) * 2^-10, the scalar's block value; then acc = acc + f * (xs * ws)
 * in the scalar's order.
 * Tiles: 0-3 the H and L sums of one block for two row groups, 4 and 5 the weights, 6 and 7 the
 * activation planes. */

#define FP4_BLOCK 32

static size_t amx_fp4_planes_bytes(int n_tokens, int cols) {
    return (size_t)token_groups(n_tokens) * (cols / FP4_BLOCK) * 2 * TILE_BYTES;
}

static size_t amx_fp4_scales_bytes(int n_tokens, int cols) {
    return (size_t)token_groups(n_tokens) * (cols / FP8_ACT_BLOCK) * 16 * sizeof(float);
}

static size_t amx_fp4_form_bytes(int n_tokens, int cols) {
    /* planes, scales, then a byte per group and 32-column block: 1 where its L plane holds a
     * nonzero value; then 1 byte: whether the activation scales allow folding (below) */
    return amx_fp4_planes_bytes(n_tokens, cols) + amx_fp4_scales_bytes(n_tokens, cols) +
           (size_t)token_groups(n_tokens) * (cols / FP4_BLOCK) + 1;
}

/* The shift s of a block for one token whose |k| sum is k_sum (see above). */
static inline int fp4_plane_shift(int64_t k_sum) {
    const int64_t bound = 12 * k_sum;
    return bound < ((int64_t)1 << 24) ? 0 : (63 - __builtin_clzll((unsigned long long)bound)) - 23;
}

/* Folding a block's weight scale 2^e into its bf16 weights (j * 2^e) makes the tile sums
 * 2^e * H and 2^e * L, still exact (the same sums scaled by a power of two), so that the combine
 * computes acc + f' * xs with f' = 2^e * f instead of acc + f * (xs * 2^e): the same value while
 * nothing leaves the normal range, since scaling by a power of two commutes with rounding there.
 * With e in [-64, 64] and every |xs| 0 or in [2^-40, 2^40] it cannot: the weights are at least
 * 2^-64, the smallest nonzero term 2^-74 and the largest sum below 2^81; xs * 2^e lies in
 * [2^-104, 2^104] and f * xs * 2^e (f 0 or in [2^-10, 2^17]) in [2^-114, 2^121]. Blocks of rows
 * with a scale outside (and calls with such an xs) keep the unscaled weights and multiply by
 * xs * ws as the scalar does. */
static int fp4_scales_foldable(const float *x_scales, int n) {
    for (int i = 0; i < n; i++)
        if (!kernel_fp4_fold_x_scale(x_scales[i])) return 0;
    return 1;
}

/* Per group of 16 tokens and block of 32 columns, the H and L tiles in TDPBF16PS's second-operand
 * order (row q holds, for each token n, its values of columns 2q, 2q+1 at bytes 4n..4n+3; an
 * empty L tile is not written); then the activation scales as in the FP8 form; then the L flags. */
static void amx_fp4_form_prepare(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols, void *act) {
    const int groups = token_groups(n_tokens), blocks32 = cols / FP4_BLOCK, blocks = cols / FP8_ACT_BLOCK;
    __m512i quarter[4];
    for (int k = 0; k < 4; k++) quarter[k] = _mm512_load_si512(kernel_e4m3_bf16 + 32 * k);
    /* v(8 + m) for the mantissa field m (lanes 0-7): v(k) = v(8 + m) + max(E - 1, 0) for every
     * nonzero code of exponent field E, subnormals (E = 0, k = m) included */
    const __m512i mantissa_twos = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                   0, 0, 0, 1, 0, 2, 0, 1, 0, 3);
    uint8_t *planes = act;
    float *scales = (float *)(planes + amx_fp4_planes_bytes(n_tokens, cols));
    uint8_t *l_flags = (uint8_t *)scales + amx_fp4_scales_bytes(n_tokens, cols);
    for (int g = 0; g < groups; g++) {
        for (int c = 0; c < blocks32; c++) {
            __m512i v[16], mag[16];
            int shift = 0;
            for (int n = 0; n < 16; n++) {
                const int tok = 16 * g + n;
                const __m256i codes8 = tok < n_tokens
                                           ? _mm256_loadu_si256((const __m256i *)(x_codes + (size_t)tok * cols + (size_t)c * FP4_BLOCK))
                                           : _mm256_setzero_si256();
                const __m512i codes = _mm512_cvtepu8_epi16(codes8);
                mag[n] = _mm512_and_si512(codes, _mm512_set1_epi16(0x7f));
                const __mmask32 upper = _mm512_test_epi16_mask(mag[n], _mm512_set1_epi16(64));
                const __m512i a = _mm512_mask_blend_epi16(upper, _mm512_permutex2var_epi16(quarter[0], mag[n], quarter[1]),
                                                          _mm512_permutex2var_epi16(quarter[2], mag[n], quarter[3]));
                v[n] = _mm512_or_si512(a, _mm512_slli_epi16(_mm512_and_si512(codes, _mm512_set1_epi16(0x80)), 8));
                /* sum of |k| * 2^-10 in f32: multiples of 2^-10 below 2^13, exact in any order */
                const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
                const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(a, _mm512_set1_epi32((int)0xffff0000u)));
                const int s_tok = fp4_plane_shift((int64_t)(_mm512_reduce_add_ps(_mm512_add_ps(even, odd)) * 1024.0f));
                shift = s_tok > shift ? s_tok : shift;
            }
            uint8_t *dst = planes + ((size_t)g * blocks32 + c) * 2 * TILE_BYTES;
            uint8_t *flag = l_flags + (size_t)g * blocks32 + c;
            if (shift == 0) { /* everything in H */
                transpose16x16(v); /* v[q] lane n: the pair of columns 2q, 2q+1 of token n */
                for (int q = 0; q < 16; q++) _mm512_store_si512(dst + q * 64, v[q]);
                *flag = 0;
                continue;
            }
            __m512i l[16], any_l = _mm512_setzero_si512();
            for (int n = 0; n < 16; n++) {
                const __m512i twos = _mm512_add_epi16(_mm512_permutexvar_epi16(_mm512_and_si512(mag[n], _mm512_set1_epi16(7)), mantissa_twos),
                                                      _mm512_subs_epu16(_mm512_srli_epi16(mag[n], 3), _mm512_set1_epi16(1)));
                const __mmask32 in_l = _mm512_cmplt_epu16_mask(twos, _mm512_set1_epi16((short)shift)) &
                                       _mm512_test_epi16_mask(mag[n], mag[n]);
                l[n] = _mm512_maskz_mov_epi16(in_l, v[n]);
                v[n] = _mm512_maskz_mov_epi16(~in_l, v[n]);
                any_l = _mm512_or_si512(any_l, l[n]);
            }
            transpose16x16(v);
            for (int q = 0; q < 16; q++) _mm512_store_si512(dst + q * 64, v[q]);
            *flag = _mm512_test_epi16_mask(any_l, any_l) != 0;
            if (*flag) {
                transpose16x16(l);
                for (int q = 0; q < 16; q++) _mm512_store_si512(dst + TILE_BYTES + q * 64, l[q]);
            }
        }
        group_scales_store(x_scales, n_tokens, blocks, g, scales);
    }
    l_flags[(size_t)groups * blocks32] = (uint8_t)fp4_scales_foldable(x_scales, n_tokens * blocks);
}

/* 64 packed bytes (128 e2m1 nibbles, low nibble first) -> 128 bf16 weights j = 2 * value, the
 * 32 of sub-block q times 2^exps[q] (exps all 0: unscaled). Zeros of either sign stay zero. */
static inline void fp4_unpack128_bf16(const uint8_t *src, const int exps[4], uint16_t *dst) {
    const __m512i table = _mm512_load_si512(kernel_e2m1_bf16);
    UNROLL(4)
    for (int k = 0; k < 4; k++) {
        /* a dword per packed byte: its low nibble in the low word, its high nibble in the high word */
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(src + 16 * k)));
        const __m512i idx = _mm512_or_si512(_mm512_and_si512(b, _mm512_set1_epi32(0x0f)),
                                            _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0xf0)), 12));
        const __m512i v = _mm512_permutexvar_epi16(idx, table);
        const __mmask32 nonzero = _mm512_test_epi16_mask(v, _mm512_set1_epi16(0x7fff));
        _mm512_store_si512(dst + 32 * k, _mm512_mask_add_epi16(v, nonzero, v, _mm512_set1_epi16((short)(exps[k] << 7))));
    }
}

/* The scales of sub-blocks 4b..4b+3 of rows r0..r0+n-1 (n <= 16): as floats into ws[q][at + i]
 * (0 for the rows past n), their bytes into raw[i]; returns whether all may be folded. */
static inline int fp4_block_scales(const fp4_matrix *w, int r0, int n, int b, float ws[4][32], int at, uint32_t raw[16]) {
    const int blocks32 = w->cols / FP4_BLOCK;
    const __mmask16 rows = (__mmask16)((1u << n) - 1);
    const __m512i index = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32(blocks32));
    /* 4 bytes of each row from byte 4b: int offsets, so the matrix' scales are below 2 GB */
    const __m512i d = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), rows, index,
                                                  w->scales + (size_t)r0 * blocks32 + 4 * (size_t)b, 1);
    _mm512_storeu_si512(raw, d);
    __mmask16 outside = 0;
    for (int q = 0; q < 4; q++) {
        const __m512i e = _mm512_and_si512(_mm512_srli_epi32(d, 8 * q), _mm512_set1_epi32(0xff));
        /* kernel_e8m0: e << 23, with 2^-127 for 0 and NaN for 255 */
        __m512i f = _mm512_slli_epi32(e, 23);
        f = _mm512_mask_mov_epi32(f, _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()), _mm512_set1_epi32(0x00400000));
        f = _mm512_mask_mov_epi32(f, _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(255)), _mm512_set1_epi32(0x7fc00000));
        _mm512_storeu_si512(&ws[q][at], _mm512_maskz_mov_epi32(rows, f));
        outside |= _mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(KERNEL_FP4_FOLD_W_E8M0_MIN)) |
                   _mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(KERNEL_FP4_FOLD_W_E8M0_MAX));
    }
    return (outside & rows) == 0;
}

/* The finished tile sums of one token group's 128-column block, to be added to its accumulators:
 * H sums [4 sub-blocks q][2 row groups][16 rows][16 tokens], the L sums FP4_L_SUMS_OFFSET floats
 * further (apart, so that the usual empty L planes leave only the H sums in the cache). */
#define FP4_L_SUMS_OFFSET (2 * 4 * 2 * 256)
typedef struct fp4_pending {
    const float *sums;
    float *acc;       /* [2 row groups][16 rows][16 tokens] */
    const float *ws;  /* [4 q][32 rows]: the weight scales (used where not folded) */
    __m512 xs;
    int row_groups;
    int l_mask;       /* bit q: sub-block q's L sums were computed (a nonempty plane) */
    int folded;
} fp4_pending;

/* acc = acc + f * s for the four sub-blocks in order, the accumulators held in registers across
 * them; s = xs (folded) or xs * ws (the scalar's product), f = H or H + L rounded once. */
static inline __attribute__((always_inline)) void fp4_combine_rows(const fp4_pending *p, int rg, int folded) {
    float *acc = p->acc + rg * 256;
    __m512 a[16];
    UNROLL(16)
    for (int i = 0; i < 16; i++) a[i] = _mm512_load_ps(acc + 16 * i);
    for (int q = 0; q < 4; q++) {
        const float *h = p->sums + (size_t)(q * 2 + rg) * 256, *l = h + FP4_L_SUMS_OFFSET;
        const float *ws = p->ws + 32 * q + 16 * rg;
        if (p->l_mask >> q & 1) {
            UNROLL(16)
            for (int i = 0; i < 16; i++) {
                const __m512 f = _mm512_add_ps(_mm512_load_ps(h + 16 * i), _mm512_load_ps(l + 16 * i));
                const __m512 s = folded ? p->xs : _mm512_mul_ps(p->xs, _mm512_set1_ps(ws[i]));
                a[i] = _mm512_add_ps(a[i], _mm512_mul_ps(f, s));
            }
        } else {
            UNROLL(16)
            for (int i = 0; i < 16; i++) {
                const __m512 s = folded ? p->xs : _mm512_mul_ps(p->xs, _mm512_set1_ps(ws[i]));
                a[i] = _mm512_add_ps(a[i], _mm512_mul_ps(_mm512_load_ps(h + 16 * i), s));
            }
        }
    }
    UNROLL(16)
    for (int i = 0; i < 16; i++) _mm512_store_ps(acc + 16 * i, a[i]);
}

static void fp4_combine(const fp4_pending *p) {
    for (int rg = 0; rg < p->row_groups; rg++) {
        if (p->folded)
            fp4_combine_rows(p, rg, 1);
        else
            fp4_combine_rows(p, rg, 0);
    }
}

/* The products of sub-block q (tile rows wv + 32 q) against the activation tile at xt into tiles
 * t (rows 0-15) and t2 (rows 16-31, when there are); the stores of such a pair of sums. */
#define FP4_PRODUCTS(t, t2, xt)                                   \
    do {                                                          \
        _tile_zero(t);                                            \
        _tile_loadd(4, wv + 32 * q, 256);                         \
        _tile_loadd(6, (xt), 64);                                 \
        _tile_dpbf16ps(t, 4, 6);                                  \
        if (row_groups == 2) {                                    \
            _tile_zero(t2);                                       \
            _tile_loadd(5, wv + 16 * 128 + 32 * q, 256);          \
            _tile_dpbf16ps(t2, 5, 6);                             \
        }                                                         \
    } while (0)
#define FP4_STORE(t, t2, o)                                       \
    do {                                                          \
        _tile_stored(t, (o), 64);                                 \
        if (row_groups == 2) _tile_stored(t2, (o) + 256, 64);     \
    } while (0)
/* the H sums left in their tiles (amx_fp4_rows: deferred_out, deferred_set), if any, stored */
#define FP4_STORE_DEFERRED()                                      \
    do {                                                          \
        if (deferred_out) {                                       \
            if (deferred_set)                                     \
                FP4_STORE(1, 3, deferred_out);                    \
            else                                                  \
                FP4_STORE(0, 2, deferred_out);                    \
            deferred_out = NULL;                                  \
        }                                                         \
    } while (0)

/* Rows go 32 at a time (two tiles of weights share each pair of activation tiles, halving what
 * is read of the activation form). A tile store waits for its product, and the next product
 * into that tile waits for the store: so a sub-block's H sums stay in their tiles (0/2 or 1/3)
 * while the next sub-block's products go to the other pair, and are stored after those are
 * issued (a sub-block with an L plane uses both pairs and stores at once). Stored right after
 * each product, 11 ns per product; deferred, 7.6-8.3 (a /tmp microbenchmark of this pattern).
 * The previous token group's sums are added once this group's first products are issued. */
static void amx_fp4_rows(const fp4_matrix *w, const void *act, int n_tokens, float *y, int y_stride, int row_begin,
                         int row_end) {
    const int cols = w->cols, blocks = cols / FP8_ACT_BLOCK, blocks32 = cols / FP4_BLOCK;
    const int groups = token_groups(n_tokens);
    const uint8_t *planes = act;
    const float *x_scales = (const float *)(planes + amx_fp4_planes_bytes(n_tokens, cols));
    const uint8_t *l_flags = (const uint8_t *)x_scales + amx_fp4_scales_bytes(n_tokens, cols);
    const int xs_foldable = l_flags[(size_t)groups * blocks32];
    /* weights [32 rows][128 bf16], sums [H, L][2 buffers][4 q][2 row groups][16][16],
     * accumulators [groups][2 row groups][16][16] */
    enum { SUMS_BYTES = 2 * 2 * 4 * 2 * TILE_BYTES };
    uint8_t *work = kernel_scratch_get(&work_scratch, 32 * 256 + SUMS_BYTES + (size_t)groups * 2 * TILE_BYTES);
    uint16_t *wv = (uint16_t *)work;
    float *sums = (float *)(work + 32 * 256);
    float *accs = (float *)(work + 32 * 256 + SUMS_BYTES);

    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) tile_config_set(&cfg, i, 16, 64);
    _tile_loadconfig(&cfg);

    const size_t group_bytes = (size_t)blocks32 * 2 * TILE_BYTES;
    int slice = (int)(AMX_SLICE_FORM_BYTES / group_bytes);
    slice = slice < 1 ? 1 : slice;
    for (int g0 = 0; g0 < groups; g0 += slice) {
        const int g1 = groups - g0 < slice ? groups : g0 + slice;
        for (int r0 = row_begin; r0 < row_end; r0 += 32) {
            const int nr = row_end - r0 < 32 ? row_end - r0 : 32, row_groups = nr > 16 ? 2 : 1;
            memset(accs, 0, (size_t)(g1 - g0) * 2 * TILE_BYTES);
            /* the last group of a block is added while the next block's first is computed (its
             * weights and scales unpacked in between), so the scales are double-buffered */
            fp4_pending pending = {0}; /* pending.sums is NULL until the first group */
            int buffer = 0;
            /* H sums left in the tiles of set deferred_set (0: tiles 0/2, 1: 1/3), stored to
             * deferred_out after the next sub-block's products are issued (a store waits for its
             * product; meanwhile the unit computes the next one) */
            float *deferred_out = NULL;
            int deferred_set = 0;
            float ws_buffers[2][4][32];
            for (int b = 0; b < blocks; b++) {
                float (*ws)[32] = ws_buffers[b & 1];
                /* the next block's weights: rows far apart, which the hardware prefetcher misses */
                if (b + 1 < blocks)
                    for (int i = 0; i < nr; i++)
                        _mm_prefetch((const char *)(w->packed + (size_t)(r0 + i) * (cols / 2) + (size_t)(b + 1) * 64), _MM_HINT_T0);
                uint32_t raw[32]; /* row i's four scale bytes, sub-block q in byte q */
                int folded = xs_foldable;
                for (int rg = 0; rg < row_groups; rg++)
                    folded &= fp4_block_scales(w, r0 + 16 * rg, nr - 16 * rg < 16 ? nr - 16 * rg : 16, b, ws, 16 * rg, raw + 16 * rg);
                for (int i = 0; i < 16 * row_groups; i++) {
                    if (i < nr) {
                        int exps[4] = {0, 0, 0, 0};
                        if (folded)
                            for (int q = 0; q < 4; q++) exps[q] = (int)(raw[i] >> 8 * q & 0xff) - 127;
                        fp4_unpack128_bf16(w->packed + (size_t)(r0 + i) * (cols / 2) + (size_t)b * 64, exps, wv + i * 128);
                    } else {
                        for (int k = 0; k < 4; k++) _mm512_store_si512(wv + i * 128 + 32 * k, _mm512_setzero_si512());
                    }
                }
                for (int g = g0; g < g1; g++) {
                    float *out = sums + (size_t)buffer * 4 * 2 * 256;
                    int l_mask = 0;
                    for (int q = 0; q < 4; q++) {
                        const size_t block = (size_t)g * blocks32 + 4 * b + q;
                        const uint8_t *xt = planes + block * 2 * TILE_BYTES;
                        const int has_l = l_flags[block];
                        float *o = out + (size_t)q * 2 * 256; /* [rg][256], L sums FP4_L_SUMS_OFFSET further */
                        l_mask |= has_l << q;
                        if (has_l) {
                            /* H in tiles 0/2, L in 1/3: the deferred sums are stored first */
                            FP4_STORE_DEFERRED();
                            FP4_PRODUCTS(0, 2, xt);
                            FP4_PRODUCTS(1, 3, xt + TILE_BYTES);
                            FP4_STORE(0, 2, o);
                            FP4_STORE(1, 3, o + FP4_L_SUMS_OFFSET);
                        } else if (deferred_out && deferred_set == 0) {
                            FP4_PRODUCTS(1, 3, xt);
                            FP4_STORE(0, 2, deferred_out);
                            deferred_out = o, deferred_set = 1;
                        } else {
                            FP4_PRODUCTS(0, 2, xt);
                            if (deferred_out) FP4_STORE(1, 3, deferred_out);
                            deferred_out = o, deferred_set = 0;
                        }
                        /* the previous group's last sums are stored now */
                        if (q == 0 && pending.sums) fp4_combine(&pending);
                    }
                    pending = (fp4_pending){out,
                                            accs + (size_t)(g - g0) * 2 * 256,
                                            &ws[0][0],
                                            _mm512_loadu_ps(x_scales + ((size_t)g * blocks + b) * 16),
                                            row_groups,
                                            l_mask,
                                            folded};
                    buffer ^= 1;
                }
            }
            FP4_STORE_DEFERRED();
            if (pending.sums) fp4_combine(&pending);
            for (int g = g0; g < g1; g++) {
                const int nt = n_tokens - 16 * g < 16 ? n_tokens - 16 * g : 16;
                for (int rg = 0; rg < row_groups; rg++)
                    store_tile(accs + ((size_t)(g - g0) * 2 + rg) * 256, y, y_stride, r0 + 16 * rg,
                               nr - 16 * rg < 16 ? nr - 16 * rg : 16, 16 * g, nt);
            }
        }
    }
    _tile_release();
}

/* --- entry points: AMX from AMX_FP8_MIN_TOKENS / AMX_FP4_MIN_TOKENS tokens, the AVX-512 forms below --- */

static size_t amx_fp8_act_bytes(int n_tokens, int cols) {
    return n_tokens >= AMX_FP8_MIN_TOKENS ? amx_act_bytes(n_tokens, cols) : kernel_ops_avx512.fp8_act_bytes(n_tokens, cols);
}

static void amx_fp8_act_prepare(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols, void *act) {
    if (n_tokens >= AMX_FP8_MIN_TOKENS)
        amx_act_prepare(x_codes, x_scales, n_tokens, cols, act);
    else
        kernel_ops_avx512.fp8_act_prepare(x_codes, x_scales, n_tokens, cols, act);
}

static void amx_matmul_fp8_prepared(const fp8_matrix *w, const void *act, const float *x_scales, int n_tokens, float *y,
                                    int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    if (n_tokens >= AMX_FP8_MIN_TOKENS)
        amx_fp8_rows(w, act, n_tokens, y, y_stride, row_begin, row_end);
    else
        kernel_ops_avx512.matmul_fp8_prepared(w, act, x_scales, n_tokens, y, y_stride, row_begin, row_end);
}

static void amx_matmul_fp8(const fp8_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                           int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    if (n_tokens < AMX_FP8_MIN_TOKENS) {
        kernel_ops_avx512.matmul_fp8(w, x_codes, x_scales, n_tokens, y, y_stride, row_begin, row_end);
        return;
    }
    void *act = kernel_scratch_get(&act_scratch, amx_act_bytes(n_tokens, w->cols));
    amx_act_prepare(x_codes, x_scales, n_tokens, w->cols, act);
    amx_fp8_rows(w, act, n_tokens, y, y_stride, row_begin, row_end);
}

static size_t amx_fp4_act_bytes(int n_tokens, int cols) {
    return n_tokens >= AMX_FP4_MIN_TOKENS ? amx_fp4_form_bytes(n_tokens, cols) : kernel_ops_avx512.fp4_act_bytes(n_tokens, cols);
}

static void amx_fp4_act_prepare(const uint8_t *x_codes, const float *x_scales, int n_tokens, int cols, void *act) {
    if (n_tokens >= AMX_FP4_MIN_TOKENS)
        amx_fp4_form_prepare(x_codes, x_scales, n_tokens, cols, act);
    else
        kernel_ops_avx512.fp4_act_prepare(x_codes, x_scales, n_tokens, cols, act);
}

static void amx_matmul_fp4_prepared(const fp4_matrix *w, const void *act, const float *x_scales, int n_tokens, float *y,
                                    int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    if (n_tokens >= AMX_FP4_MIN_TOKENS)
        amx_fp4_rows(w, act, n_tokens, y, y_stride, row_begin, row_end);
    else
        kernel_ops_avx512.matmul_fp4_prepared(w, act, x_scales, n_tokens, y, y_stride, row_begin, row_end);
}

static void amx_matmul_fp4(const fp4_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                           int y_stride, int row_begin, int row_end) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    if (n_tokens < AMX_FP4_MIN_TOKENS) {
        kernel_ops_avx512.matmul_fp4(w, x_codes, x_scales, n_tokens, y, y_stride, row_begin, row_end);
        return;
    }
    void *act = kernel_scratch_get(&act_scratch, amx_fp4_form_bytes(n_tokens, w->cols));
    amx_fp4_form_prepare(x_codes, x_scales, n_tokens, w->cols, act);
    amx_fp4_rows(w, act, n_tokens, y, y_stride, row_begin, row_end);
}

const kernel_ops kernel_ops_amx = {
    .name = "amx",
    .base = &kernel_ops_avx512,
    .matmul_fp8 = amx_matmul_fp8,
    .matmul_fp4 = amx_matmul_fp4,
    .fp8_act_bytes = amx_fp8_act_bytes,
    .fp8_act_prepare = amx_fp8_act_prepare,
    .matmul_fp8_prepared = amx_matmul_fp8_prepared,
    .fp4_act_bytes = amx_fp4_act_bytes,
    .fp4_act_prepare = amx_fp4_act_prepare,
    .matmul_fp4_prepared = amx_matmul_fp4_prepared,
};
