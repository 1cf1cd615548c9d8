/* Kernel benchmark: the machine's measured peaks (memory read bandwidth, f64 FMA and int8 dot
 * product rates) and, for every kernel variant this CPU runs at 1 thread and at all threads,
 * GFLOP/s and GB/s of weights of each product at the model's real shapes: decode (1 token, the
 * weights streamed from RAM, so the figure to compare is GB/s against the bandwidth) and a
 * prefill chunk (64 tokens, compute-bound: compare GFLOP/s). One run, figures side by side.
 *
 *   bench/bench_kernels.sh [--quick] [--several-tokens [N,N,...] [--best N] [--from-ram]]   (builds this against
 *   build/libds4f.a)
 */
#include "base/timer.h"
#include "bench_peaks.h"
#include "kernels/kernels_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint8_t rnd8(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint8_t)(rng >> 24);
}

/* ---- products ---- */

typedef enum { K_FP8, K_FP4, K_FP8DQ, K_BF16, K_F32 } kind;
static const char *const kind_names[] = {"fp8 x fp8", "fp4 x fp8", "fp8 dequant", "bf16", "f32"};

typedef struct product {
    kind k;
    const char *what;
    int rows, cols;
} product;

/* The model's shapes: wq_b/wo_b-like FP8, an expert's w1 and w2, wo_a, the LM head (a slice of it),
 * the hyper-connection mix. */
static const product products[] = {
    {K_FP8, "wq_b 32768x1024", 32768, 1024},  {K_FP8, "wo_b 4096x8192", 4096, 8192},
    {K_FP4, "expert w1 2048x4096", 2048, 4096}, {K_FP4, "expert w2 4096x2048", 4096, 2048},
    {K_FP8DQ, "wo_a 8192x4096", 8192, 4096},  {K_BF16, "head 16384x4096", 16384, 4096},
    {K_F32, "hc_fn 24x16384", 24, 16384},
};

static size_t weight_bytes(const product *p) {
    const size_t n = (size_t)p->rows * p->cols;
    switch (p->k) {
    case K_FP8:
    case K_FP8DQ: return n + (size_t)((p->rows + 127) / 128) * ((p->cols + 127) / 128);
    case K_FP4: return n / 2 + n / 32;
    case K_BF16: return n * 2;
    case K_F32: return n * 4;
    }
    return 0;
}

/* A pool of weight bytes bigger than any cache: each call uses the next copy-sized window of it,
 * so decode figures are RAM-bound as in the model. */
static uint8_t *pool_mem;
static size_t pool_bytes;

/* The byte soup's FP8 codes (below) hold no low codes (fp8_low_codes): the list the loader would
 * make for them is empty, and the FP8 x FP8 products get it as model matrices do. */
static uint32_t empty_row_first[32768 + 1];
static const uint16_t no_cols[1];
static const fp8_low_codes empty_low_list = {empty_row_first, no_cols};

static void run_product(const product *p, size_t offset, const uint8_t *xc, const float *xs, const float *xf, int T,
                        float *y) {
    const uint8_t *base = pool_mem + offset;
    const size_t n = (size_t)p->rows * p->cols;
    switch (p->k) {
    case K_FP8: {
        const fp8_matrix w = {base, base + n, p->rows, p->cols, MATRIX_ROWS, &empty_low_list};
        par_matmul_fp8(&w, xc, xs, T, y, p->rows, 0, p->rows);
        break;
    }
    case K_FP8DQ: {
        const fp8_matrix w = {base, base + n, p->rows, p->cols, MATRIX_GROUPS16, NULL}; /* as the loader stores wo_a */
        par_matmul_fp8_dequant(&w, xf, p->cols, T, y, p->rows, 0, p->rows);
        break;
    }
    case K_FP4: {
        const fp4_matrix w = {base, base + n / 2, p->rows, p->cols};
        par_matmul_fp4(&w, xc, xs, T, y, p->rows, 0, p->rows);
        break;
    }
    case K_BF16: {
        const bf16_matrix w = {(const uint16_t *)base, p->rows, p->cols, MATRIX_GROUPS16}; /* as the loader stores them */
        par_matmul_bf16(&w, xf, p->cols, T, y, p->rows, 0, p->rows);
        break;
    }
    case K_F32: {
        const f32_matrix w = {(const float *)base, p->rows, p->cols};
        par_matmul_f32(&w, xf, p->cols, T, y, p->rows, 0, p->rows);
        break;
    }
    }
}

/* Seconds per call (wall, and process CPU in *cpu): calls over successive windows of the pool for
 * at least min_seconds. */
static double time_product(const product *p, int T, double min_seconds, const uint8_t *xc, const float *xs,
                           const float *xf, float *y, double *cpu) {
    const size_t wb = (weight_bytes(p) + 4095) & ~(size_t)4095;
    const size_t windows = pool_bytes / wb > 0 ? pool_bytes / wb : 1;
    size_t w = 0;
    run_product(p, 0, xc, xs, xf, T, y); /* warm-up: page faults, scratch growth */
    int calls = 0;
    const double t0 = time_now_seconds(), c0 = time_process_cpu_seconds();
    double t = 0;
    do {
        w = (w + 1) % windows;
        run_product(p, w * wb, xc, xs, xf, T, y);
        calls++;
        t = time_now_seconds() - t0;
    } while (t < min_seconds);
    *cpu = (time_process_cpu_seconds() - c0) / calls;
    return t / calls;
}

/* ---- FP8 weights quantized as the official code does (128 x 128 blocks, ue8m0 scales), whose low
 * codes (e4m3 subnormals and zeros) the soup above avoids: the same product with the matrix's
 * list of them (the x86 kernels' raised form, fp8_low_codes) and without (plain form). ---- */

static double gaussian(void) {
    double u = 0;
    for (int i = 0; i < 12; i++) u += rnd8() / 256.0 + rnd8() / 65536.0;
    return u - 6.0; /* Irwin-Hall: close enough to a normal for the share of tiny values */
}

static void quantize_like_official(uint8_t *codes, uint8_t *scales, int rows, int cols, int heavy_tailed) {
    float *w = malloc((size_t)rows * cols * sizeof(float));
    for (size_t i = 0; i < (size_t)rows * cols; i++) {
        double v = gaussian();
        if (heavy_tailed && rnd8() < 3) v *= 10; /* about 1% of the weights 10x larger */
        w[i] = (float)v;
    }
    const int scale_cols = cols / 128;
    for (int rb = 0; rb < rows / 128; rb++)
        for (int cb = 0; cb < scale_cols; cb++) {
            float amax = 1e-4f;
            for (int r = rb * 128; r < rb * 128 + 128; r++)
                for (int c = cb * 128; c < cb * 128 + 128; c++) amax = fmaxf(amax, fabsf(w[(size_t)r * cols + c]));
            const float s = pow2_scale_ceil(amax, 1.0f / 448.0f);
            scales[rb * scale_cols + cb] = (uint8_t)(127 + ilogbf(s));
            for (int r = rb * 128; r < rb * 128 + 128; r++)
                for (int c = cb * 128; c < cb * 128 + 128; c++)
                    codes[(size_t)r * cols + c] = e4m3_encode_rne(fminf(fmaxf(w[(size_t)r * cols + c] / s, -448), 448));
        }
    free(w);
}

static void low_codes_section(int quick, const uint8_t *xc, const float *xs, float *y) {
    enum { ROWS = 4096, COLS = 4096 };
    uint8_t *codes = malloc((size_t)ROWS * COLS), *scales = malloc(ROWS / 128 * (COLS / 128));
    printf("\nFP8 x FP8 4096x4096 on weights quantized like the official checkpoint, 1 thread, ms/call "
           "(plain: no fp8_low_codes list, the f64 form with the codes read as they are; listed: with the list, "
           "the raised f64 form, and for one token on AVX-512 the words form):\n");
    printf("%-14s %-9s %-7s %6s %9s %9s %7s\n", "weights", "low codes", "variant", "tokens", "plain", "listed", "listed/plain");
    kernels_set_threads(1);
    for (int heavy = 0; heavy < 2; heavy++) {
        quantize_like_official(codes, scales, ROWS, COLS, heavy);
        fp8_matrix w = {codes, scales, ROWS, COLS, MATRIX_ROWS, NULL};
        int too_many = 0;
        fp8_low_codes *low = fp8_low_codes_list(&w, SIZE_MAX, &too_many);
        if (!low) break;
        const double share = (double)low->row_first[ROWS] / ((double)ROWS * COLS);
        static const char *const variants[] = {"avx2", "avx512"};
        for (size_t vi = 0; vi < sizeof variants / sizeof variants[0]; vi++) {
            if (!kernels_available(variants[vi])) continue;
            char msg[128];
            kernels_select(variants[vi], msg, sizeof msg);
            for (int T = 1; T <= 8; T += 7) {
                double ms[2];
                for (int listed = 0; listed < 2; listed++) {
                    w.low = listed ? low : NULL;
                    par_matmul_fp8(&w, xc, xs, T, y, ROWS, 0, ROWS);
                    int calls = 0;
                    const double t0 = time_now_seconds();
                    do {
                        par_matmul_fp8(&w, xc, xs, T, y, ROWS, 0, ROWS);
                        calls++;
                    } while (time_now_seconds() - t0 < (quick ? 0.2 : 0.5));
                    ms[listed] = (time_now_seconds() - t0) / calls * 1e3;
                }
                printf("%-14s %-9.1e %-7s %6d %9.3f %9.3f %7.2f\n", heavy ? "heavy-tailed" : "gaussian", share, variants[vi],
                       T, ms[0], ms[1], ms[1] / ms[0]);
            }
        }
        free(low);
    }
    free(codes);
    free(scales);
}

/* ---- several-token FP4 x FP8 and FP8 x FP8 products on quantized Gaussian activations: the
 * byte soup above puts values in every binade of a block, which the several-token forms pay for
 * (a block spanning more than 11 binades takes the FP4 words form's second pass, every code with a
 * low part the FP8 int16 form's low terms) and real activations seldom do. ms per token at 1
 * thread: FP4 on an expert's w1 (2048 x 4096, random codes and scales), FP8 on 4096 x 4096 weights
 * quantized like the official checkpoint. ---- */
static void gaussian_activations_section(int quick, int best_of, int from_ram, const int *token_counts, int n_counts,
                                        float *y) {
    enum { COLS = 4096, T_MAX = 256 };
    float *x = malloc(COLS * sizeof(float));
    uint8_t *xc = malloc((size_t)T_MAX * COLS), *w8 = malloc((size_t)4096 * COLS), *s8 = malloc(32 * 32);
    uint8_t *w4 = malloc((size_t)2048 * COLS / 2), *s4 = malloc((size_t)2048 * COLS / 32);
    float *xs = malloc((size_t)T_MAX * (COLS / 128) * sizeof(float));
    for (int t = 0; t < T_MAX; t++) {
        for (int i = 0; i < COLS; i++) x[i] = (float)gaussian();
        quantize_fp8_act(x, COLS, xc + (size_t)t * COLS, xs + (size_t)t * (COLS / 128));
    }
    quantize_like_official(w8, s8, 4096, COLS, 0);
    for (size_t i = 0; i < (size_t)2048 * COLS / 2; i++) w4[i] = rnd8();
    for (size_t i = 0; i < (size_t)2048 * COLS / 32; i++) s4[i] = (uint8_t)(118 + rnd8() % 4);
    /* --from-ram: copies of both matrices fill a pool bigger than any cache and each call takes
     * the next one, so the weights stream from RAM as in the model's decode (the same bytes at
     * other addresses); then every variant also runs at all threads. */
    const size_t b8 = ((size_t)4096 * COLS + 32 * 32 + 4095) & ~(size_t)4095;
    const size_t b4 = ((size_t)2048 * COLS / 2 + (size_t)2048 * COLS / 32 + 4095) & ~(size_t)4095;
    const size_t pool = from_ram ? (size_t)1 << 30 : 0;
    uint8_t *pool8 = from_ram ? aligned_alloc(4096, pool) : NULL, *pool4 = from_ram ? aligned_alloc(4096, pool) : NULL;
    const size_t copies8 = from_ram ? pool / b8 : 1, copies4 = from_ram ? pool / b4 : 1;
    if (from_ram && (!pool8 || !pool4)) {
        fprintf(stderr, "cannot allocate 2 GB for --from-ram\n");
        exit(1);
    }
    for (size_t c = 0; from_ram && c < copies8; c++) {
        memcpy(pool8 + c * b8, w8, (size_t)4096 * COLS);
        memcpy(pool8 + c * b8 + (size_t)4096 * COLS, s8, 32 * 32);
    }
    for (size_t c = 0; from_ram && c < copies4; c++) {
        memcpy(pool4 + c * b4, w4, (size_t)2048 * COLS / 2);
        memcpy(pool4 + c * b4 + (size_t)2048 * COLS / 2, s4, (size_t)2048 * COLS / 32);
    }
    const char *place = from_ram ? "from RAM (a 1 GB pool of copies)" : "1 thread";
    if (best_of)
        printf("\nSeveral-token products on quantized Gaussian activations, %s, ms per token (fastest of %d calls):\n",
               place, best_of);
    else
        printf("\nSeveral-token products on quantized Gaussian activations, %s, ms per token:\n", place);
    printf("%-12s %-10s %-7s %-4s", "kernel", "shape", "variant", "thr");
    for (int i = 0; i < n_counts; i++) printf(" %7d tok", token_counts[i]);
    printf("\n");
    const int all = kernels_default_threads();
    size_t next = 0; /* the copy the next call takes: never one a recent call left in a cache */
    for (int k = 0; k < 2; k++)
        for (size_t vi = 0; kernels_variant_names[vi]; vi++) {
            const char *v = kernels_variant_names[vi];
            if (!strcmp(v, "scalar") || !kernels_available(v)) continue;
            char msg[128];
            kernels_select(v, msg, sizeof msg);
            for (int th = 1; th <= (from_ram ? all : 1); th = th == all ? all + 1 : all) {
                kernels_set_threads(th);
                printf("%-12s %-10s %-7s %-4d", k ? "fp4 x fp8" : "fp8 x fp8", k ? "2048x4096" : "4096x4096", v, th);
                for (int i = 0; i < n_counts; i++) {
                    const int T = token_counts[i];
                    int calls = 0;
                    double t0 = 0, best = 1e30;
                    do {
                        const size_t c = next++;
                        const uint8_t *p8 = from_ram ? pool8 + (c % copies8) * b8 : w8;
                        const uint8_t *p4 = from_ram ? pool4 + (c % copies4) * b4 : w4;
                        const fp8_matrix m8 = {p8, from_ram ? p8 + (size_t)4096 * COLS : s8, 4096, COLS, MATRIX_ROWS, NULL};
                        const fp4_matrix m4 = {p4, from_ram ? p4 + (size_t)2048 * COLS / 2 : s4, 2048, COLS};
                        const double c0 = time_now_seconds();
                        if (k) par_matmul_fp4(&m4, xc, xs, T, y, 2048, 0, 2048);
                        else par_matmul_fp8(&m8, xc, xs, T, y, 4096, 0, 4096);
                        const double c1 = time_now_seconds();
                        if (calls++ == 0) t0 = c1; /* the first call warms up */
                        else if (c1 - c0 < best) best = c1 - c0;
                    } while (best_of ? calls <= best_of : calls < 3 || time_now_seconds() - t0 < (quick ? 0.2 : 0.5));
                    printf(" %11.4f", (best_of ? best : (time_now_seconds() - t0) / (calls - 1)) / T * 1e3);
                    fflush(stdout);
                }
                printf("\n");
            }
        }
    free(pool8);
    free(pool4);
    free(x);
    free(xc);
    free(xs);
    free(w8);
    free(s8);
    free(w4);
    free(s4);
}

int main(int argc, char **argv) {
    int quick = 0, several_only = 0, best_of = 0, from_ram = 0, token_counts[16] = {4, 8, 64, 256}, n_counts = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "--several-tokens")) {
            several_only = 1;
            if (i + 1 < argc && argv[i + 1][0] != '-') { /* an optional list of token counts */
                n_counts = 0;
                for (char *p = argv[++i], *end; *p && n_counts < 16; p = *end ? end + 1 : end) {
                    const long n = strtol(p, &end, 10);
                    if (end == p || n < 1 || n > 256 || (*end && *end != ',')) {
                        fprintf(stderr, "--several-tokens: token counts from 1 to 256, comma-separated: '%s'\n", argv[i]);
                        return 2;
                    }
                    token_counts[n_counts++] = (int)n;
                }
            }
        } else if (!strcmp(argv[i], "--best") && i + 1 < argc && atoi(argv[i + 1]) > 0) {
            best_of = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--from-ram")) {
            from_ram = 1;
        } else {
            fprintf(stderr, "usage: bench_kernels [--quick] [--several-tokens [N,N,...] [--best N] [--from-ram]]\n"
                            "  --quick           shorter timings and a 512 MB pool\n"
                            "  --several-tokens  only the several-token products on Gaussian activations\n"
                            "                    (default 4,8,64,256 tokens)\n"
                            "  --best N          with --several-tokens: the fastest of N calls instead of the\n"
                            "                    mean (a shared host's noise lengthens calls, never shortens them)\n"
                            "  --from-ram        with --several-tokens: each call on another copy of the weights\n"
                            "                    in a 1 GB pool (streamed from RAM, as decode's), at 1 and all threads\n");
            return 2;
        }
    }
    if (several_only) {
        float *y = malloc((size_t)256 * 4096 * sizeof(float));
        gaussian_activations_section(quick, best_of, from_ram, token_counts, n_counts, y);
        free(y);
        return 0;
    }
    const int all = kernels_default_threads();
    pool_bytes = (size_t)(quick ? 512 : 1024) << 20;
    pool_mem = aligned_alloc(4096, pool_bytes);
    if (!pool_mem) {
        fprintf(stderr, "cannot allocate %zu MB\n", pool_bytes >> 20);
        return 1;
    }
    /* One byte soup read as every format, so each byte must be a value of the kind real weights
     * hold in all of them: 0x38-0x3f and 0xb8-0xbf are e4m3 codes of magnitude 1 to 1.875, E8M0
     * scales near 2^-70, and the high bytes of bf16 / f32 values of magnitude 2^-15 to 1. Never a
     * subnormal: Intel cores take a microcode assist (tens of times slower) on subnormal f64 and
     * f32 operands, which real weights do not hold but uniformly random bytes often do. */
    for (size_t i = 0; i < pool_bytes; i++) {
        const uint8_t r = rnd8();
        pool_mem[i] = (uint8_t)(0x38 | (r & 0x87));
    }

    printf("machine: %d physical cores (threads used: 1 and %d)\n", all, all);
    kernels_set_threads(1);
    const double bw1 = read_bandwidth(pool_mem, pool_bytes, 1);
    kernels_set_threads(all);
    const double bwn = read_bandwidth(pool_mem, pool_bytes, all);
    printf("memory read bandwidth: %.1f GB/s (1 thread), %.1f GB/s (%d threads)\n", bw1, bwn, all);
#if defined(__x86_64__)
    if (kernels_available("avx2")) {
        const int avx512 = kernels_available("avx512"), avxvnni = kernels_available("avxvnni");
        for (int th = 1; th <= all; th += all - 1 > 0 ? all - 1 : 1) {
            kernels_set_threads(th);
            double f64 = 0, i8 = 0, i16 = 0;
            compute_peaks(th, avx512, avxvnni, &f64, &i8, &i16);
            printf("compute peak (%d thread%s): f64 FMA %.0f GFLOP/s (%s)", th, th > 1 ? "s" : "", f64,
                   avx512 ? "zmm" : "ymm");
            if (avx512 || avxvnni) printf(", int8 VNNI %.0f GOP/s (%s)", i8, avx512 ? "zmm" : "ymm");
            if (avx512) printf(", int16 VNNI %.0f GOP/s", i16);
            else printf(", int16 VPMADDWD+VPADDD %.0f GOP/s (ymm)", i16);
            if (kernels_available("amx")) printf(", int8 AMX tiles %.0f GOP/s", amx_peak(th));
            printf("\n");
            if (all == 1) break;
        }
    }
#endif

    const int max_cols = 16384, Tmax = 64;
    uint8_t *xc = malloc((size_t)Tmax * max_cols);
    float *xs = malloc((size_t)Tmax * (max_cols / 128) * sizeof(float));
    float *xf = malloc((size_t)Tmax * max_cols * sizeof(float));
    float *y = malloc((size_t)Tmax * 32768 * sizeof(float));
    for (int i = 0; i < Tmax * max_cols; i++) {
        xc[i] = rnd8() & 0x77;
        xf[i] = bf16_round((float)((int)rnd8() - 128) / 64.0f);
    }
    for (int i = 0; i < Tmax * (max_cols / 128); i++) xs[i] = 1.0f / 256;

    const char *const *variants = kernels_variant_names;
    printf("\n%-12s %-22s %-7s %-4s %10s %9s %9s %9s\n", "kernel", "shape", "variant", "thr", "ms/call", "GFLOP/s",
           "GB/s wts", "GB/s cpu");
    for (size_t pi = 0; pi < sizeof products / sizeof products[0]; pi++) {
        const product *p = &products[pi];
        for (int T = 1; T <= Tmax; T *= Tmax) {
            for (size_t vi = 0; variants[vi]; vi++) {
                if (!kernels_available(variants[vi])) continue;
                char msg[128];
                kernels_select(variants[vi], msg, sizeof msg);
                const int scalar = !strcmp(variants[vi], "scalar");
                if (scalar && T > 1) continue; /* minutes per figure, and no batching in the reference */
                for (int th = 1; th <= all; th = th == all ? all + 1 : all) {
                    kernels_set_threads(th);
                    double cpu = 0;
                    const double s = time_product(p, T, quick ? 0.2 : 0.5, xc, xs, xf, y, &cpu);
                    const double flops = 2.0 * p->rows * p->cols * T;
                    printf("%-12s %-22s %-7s %-4d %10.3f %9.1f %9.1f %9.1f\n", kind_names[p->k], p->what, variants[vi], th,
                           s * 1e3, flops / s / 1e9, (double)weight_bytes(p) / s / 1e9, (double)weight_bytes(p) / cpu / 1e9);
                    fflush(stdout);
                }
            }
            if (T == 1) printf("%-12s %-22s (above: decode, 1 token; below: prefill chunk, %d tokens)\n", "", "", Tmax);
        }
    }
    low_codes_section(quick, xc, xs, y);
    gaussian_activations_section(quick, best_of, from_ram, token_counts, n_counts, y);
    printf("\nGB/s wts: weight bytes read per second (decode is bound by memory: compare with %.1f GB/s);\n"
           "GB/s cpu: the same per second of process CPU time (all threads, spinning pool workers included);\n"
           "GFLOP/s: 2 * rows * cols * tokens per second (a prefill chunk is bound by compute).\n",
           bwn);
    free(pool_mem);
    return 0;
}
