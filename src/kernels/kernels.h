/* Matrix products for each weight format, with the official activation quantization.
 *
 * Contract shared by every implementation (scalar reference and SIMD variants):
 *  - Inputs x are f32 arrays holding the activation values (bf16-valued where the official code
 *    has bf16 tensors); outputs are f32 accumulators: the caller rounds to bf16 where the
 *    official code stores bf16.
 *  - FP8 x FP8 and FP4 x FP8 products are computed exactly per scale block (integer
 *    arithmetic: e4m3 values are integers times 2^-9, e2m1 values integers times 2^-1), rounded
 *    once to f32, multiplied by the block's scale product, and accumulated in f32 in ascending
 *    block order. Exact block sums make the result independent of the order inside a block.
 *  - Float products (bf16, dequantized-FP8 or f32 weights with f32 activations) accumulate
 *    sequentially over the input dimension, acc = acc + w*x with the product rounded to f32 first
 *    (no FMA contraction). SIMD variants vectorise across output rows (or keys), never inside one
 *    sum, so their results equal the scalar ones bit for bit.
 *  - Rows [row_begin, row_end) of y are written for each of the n_tokens activation rows, so a
 *    thread pool can split the rows.
 *  - Weights keep their native formats. FP8 x FP8 and FP4 x FP8 products read the checkpoint's
 *    row-major order. The float products read the matrix's `layout` (format/matrix.h): the
 *    loader stores every bf16 matrix and wo_a in MATRIX_GROUPS16 (rearranged once, in place), so
 *    the SIMD variants load one column of 16 rows at a time; row-major float matrices (f32, the
 *    KV cache, rows after the last whole group) go through tiles transposed in registers. The
 *    layout changes where values are read, never the order of the sums: results are the same
 *    bits in either layout.
 *  - E4M3 NaN codes (0x7f, 0xff) are outside the contract (quantization never produces them).
 *  - FP8 and FP4 products need cols to be a multiple of 128 (the activation block; every
 *    checkpoint matrix is). */
#ifndef DS4F_KERNELS_KERNELS_H
#define DS4F_KERNELS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "format/matrix.h"

#define FP8_ACT_BLOCK 128

/* Official act_quant (block 128, ue8m0 scales): per block, amax = max(max|x|, 1e-4),
 * s = 2^ceil(log2(amax * f32(1/448))), code = e4m3_rne(clamp(x / s, -448, 448)).
 * n must be a multiple of 128; scales gets n/128 entries. */
void quantize_fp8_act(const float *x, int n, uint8_t *codes, float *scales);

/* y[t][r] = sum_c W[r][c] * xq[t][c] with FP8 weights and FP8-quantized activations.
 * x_codes/x_scales hold n_tokens rows of w->cols codes and w->cols/128 scales. */
void matmul_fp8(const fp8_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                int y_stride, int row_begin, int row_end);

/* Same with packed FP4 weights (scale per 32 columns). */
void matmul_fp4(const fp4_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                int y_stride, int row_begin, int row_end);

/* FP8 weights used as their exact dequantized values against unquantized activations (wo_a:
 * the official code dequantizes it to bf16, which e4m3 x 2^k represents exactly). */
void matmul_fp8_dequant(const fp8_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                        int row_begin, int row_end);

void matmul_bf16(const bf16_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                 int row_begin, int row_end);
void matmul_f32(const f32_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                int row_begin, int row_end);

/* Sequential dot products (see above). */
float dot_f32(const float *a, const float *b, int n);
float dot_f32_bf16(const float *a, const uint16_t *b, int n);

/* Attention's step for one block of keys, for each head h < n_heads (y_h = y + h * n, a_h = a + h *
 * a_stride): y_h[i] = y_h[i] * rescale[h] + s[i] (i < n), where s[i] starts at 0 and adds a_h[j] *
 * rows[j][i] for j = 0 .. n_rows-1 in turn, each product rounded to f32 first (the P.V sum over the
 * block's keys in key order), then the separate multiply by rescale[h] and add. products_exact:
 * the caller knows that every a_h[j] * rows[j][i] is exact in f32 (a variant may then fuse each
 * multiply and add: the same bits); results never depend on it. */
void rescale_add_weighted_rows_f32(float *y, const float *rescale, const float *a, int a_stride, int n_heads,
                                   const float *const *rows, int n_rows, int n, int products_exact);

/* The rule of the fused (FMA) paths: given the smallest and largest biased exponents of two sets
 * of nonzero values whose significands fit f32 together (at most 8 + 16 bits), whether every
 * product of one by the other is exact, i.e. a normal finite f32: exponent sums 128..380, neither
 * set subnormal (exponent 0), infinite or NaN (255). hi == 0: the set is all zeros, every product
 * an exact zero. acc + round(a * b) is then fma(a, b, acc). */
static inline int kernels_products_exact(unsigned a_lo, unsigned a_hi, unsigned b_lo, unsigned b_hi) {
    if (a_hi == 0 || b_hi == 0) return 1;
    if (a_lo == 0 || b_lo == 0 || a_hi == 255 || b_hi == 255) return 0;
    return a_lo + b_lo >= 128 && a_hi + b_hi <= 380;
}

/* --- Variant choice (speed only: every variant computes the same bits) ---
 * The functions above dispatch to one implementation chosen once per process: "auto" (the best
 * the CPU supports; the default), "scalar", "avx2", "avxvnni" (AVX2 plus the VEX-encoded VNNI dot
 * products for the FP4 products), "avx512", "amx" (AVX-512 plus the AMX tile unit for the FP8 and
 * FP4 products of several tokens) or "neon". kernels_select refuses a
 * variant this binary or this CPU cannot run. The choice is process-wide: make it before running
 * a model, not while one runs. */
int kernels_select(const char *name, char *msg, size_t msg_size);
/* Every variant name this project has (whether or not this binary and CPU run it), NULL-ended. */
extern const char *const kernels_variant_names[];
const char *kernels_selected(void);
/* Whether this binary and CPU can run the named variant. */
int kernels_available(const char *name);
/* The vector level the current variant stands for, for plain C compiled per level
 * (kernels/plain_c_targets.h). */
enum { KERNELS_PLAIN_C_BASELINE = 0, KERNELS_PLAIN_C_AVX2 = 1, KERNELS_PLAIN_C_AVX512 = 2 };
int kernels_plain_c_level(void);

/* --- Threads ---
 * A persistent pool: the par_* products below split their output rows across it. Every row is
 * computed by the same code whatever the split, so results do not depend on the thread count.
 * kernels_set_threads(0) means the default: the number of physical cores. Calls from inside a
 * pool task run on the calling thread alone. */
int kernels_set_threads(int n);
int kernels_threads(void);
int kernels_default_threads(void);

/* Task i of n_tasks runs fn(ctx, i); returns when all have run. Tasks run concurrently on the
 * pool, so they must write disjoint memory. */
typedef void (*kernels_task_fn)(void *ctx, int task);
void kernels_parallel_for(kernels_task_fn fn, void *ctx, int n_tasks);

/* The pool thread running the caller: 0 for any thread outside the pool (the one that calls
 * kernels_parallel_for included), 1 .. kernels_threads() - 1 for the workers. A task may use it to
 * pick its own slice of a work space sized for kernels_threads() threads. */
int kernels_thread_index(void);

/* Rows [0, n) of per-row work whose rows are independent (norms, roundings, quantization of a
 * chunk's tokens): fn(ctx, begin, end) on disjoint ranges that cover them, a few per thread, run
 * concurrently; one call fn(ctx, 0, n) when there is one row or one thread. Every row is computed
 * by the same code whatever the split, so results do not depend on it. */
typedef void (*kernels_rows_fn)(void *ctx, int begin, int end);
void kernels_parallel_rows(kernels_rows_fn fn, void *ctx, int n);
/* The same for work so light per row (copies, activation forms) that fewer than
 * KERNELS_LIGHT_ROWS_MIN rows run on the caller: waking the pool would cost more than they take. */
#define KERNELS_LIGHT_ROWS_MIN 32
void kernels_parallel_light_rows(kernels_rows_fn fn, void *ctx, int n);

/* The command-line flags of every command that runs the model (speed only, results unchanged):
 *   -t N, --threads N   threads of the products (default: physical cores)
 *   --kernels NAME      scalar, avx2, avxvnni, avx512, amx, neon or auto (default)
 * Applies argv[*i] when it is one of them: returns 1 with *i past the flag and its value, 0 when
 * it is not one of them, -1 after printing an error. */
int kernels_flag_parse(int argc, char **argv, int *i);
/* Their --help lines (a string literal, for the commands' help texts). */
#define KERNELS_FLAGS_HELP \
    "  -t, --threads N     threads for the matrix products (default: the physical cores)\n" \
    "  --kernels NAME      scalar, avx2, avxvnni, avx512, amx, neon or auto (default: the best this\n" \
    "                      CPU runs; avxvnni: AVX2 with VNNI for the expert products, amx: AVX-512\n" \
    "                      with the AMX tile unit for prefill's FP8 and FP4 products);\n" \
    "                      speed only, every choice computes the same bits\n"

/* Upper bound of the memory the products keep between calls for chunks of up to max_tokens tokens
 * and inputs of up to max_cols columns, with the variant and thread count chosen now: the shared
 * activation form of the par_* products plus each thread's own form and tiles (the memory plan's
 * "kernel workspace"). */
size_t kernels_workspace_bytes(int max_tokens, int max_cols);

/* Row-parallel forms of per-token element-wise work (kernels_parallel_rows): quantize_fp8_act of
 * n rows of x (x_stride apart) into codes [n][cols] and scales [n][cols / 128]; y = bf16(y) on n
 * rows of cols values (y_stride apart). */
void par_quantize_fp8_act(const float *x, int x_stride, int cols, int n, uint8_t *codes, float *scales);
void par_round_bf16(float *y, int y_stride, int cols, int n);

/* Multi-threaded forms of the products above: same arguments, same results. */
void par_matmul_fp8(const fp8_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                    int y_stride, int row_begin, int row_end);
/* par_matmul_fp8 with y rounded to bf16 (the official fp8_gemm's bf16 output): each thread rounds
 * the rows it computed while they are in its cache. */
void par_matmul_fp8_bf16(const fp8_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                         int y_stride, int row_begin, int row_end);
void par_matmul_fp4(const fp4_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                    int y_stride, int row_begin, int row_end);
/* par_matmul_fp4 of two matrices with the same columns on the same activations (an expert's w1
 * and w3), all rows of each: the activation form is prepared once for both. */
void par_matmul_fp4_pair(const fp4_matrix *wa, const fp4_matrix *wb, const uint8_t *x_codes, const float *x_scales,
                         int n_tokens, float *ya, float *yb, int y_stride);
void par_matmul_fp8_dequant(const fp8_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                            int row_begin, int row_end);
void par_matmul_bf16(const bf16_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                     int row_begin, int row_end);
void par_matmul_f32(const f32_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                    int row_begin, int row_end);

#endif
