/* Kernel benchmark: the machine's measured peaks (memory read bandwidth, f64 FMA and int8 dot
 * product rates) and, for every kernel variant this CPU runs at 1 thread and at all threads,
 * GFLOP/s and GB/s of weights of each product at the model's real shapes: decode (1 token, the
 * weights streamed from RAM, so the figure to compare is GB/s against the bandwidth) and a
 * prefill chunk (64 tokens, compute-bound: compare GFLOP/s). One run, figures side by side.
 *
 *   bench/bench_kernels.sh [--quick] [--several-tokens]   (builds this against build/libds4f.a)
 */
#include "base/timer.h"
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

/* ---- memory bandwidth: each task sums its share of a large buffer ---- */

typedef uint64_t v8u64 __attribute__((vector_size(64)));
typedef struct read_job {
    const v8u64 *buf;
    size_t n_vec;
    int tasks;
    uint64_t sink[64];
} read_job;

static void read_task(void *ctx, int task) {
    read_job *j = ctx;
    const size_t per = j->n_vec / (size_t)j->tasks, begin = per * (size_t)task;
    v8u64 a = {0}, b = {0}, c = {0}, d = {0};
    for (size_t i = begin; i + 4 <= begin + per; i += 4) {
        a += j->buf[i];
        b += j->buf[i + 1];
        c += j->buf[i + 2];
        d += j->buf[i + 3];
    }
    v8u64 s = a + b + c + d;
    j->sink[task & 63] = s[0] + s[7];
}

static double read_bandwidth(const void *buf, size_t bytes, int threads) {
    read_job j = {buf, bytes / 64, threads, {0}};
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t = time_now_seconds();
        kernels_parallel_for(read_task, &j, threads);
        t = time_now_seconds() - t;
        if (bytes / t > best) best = (double)bytes / t;
    }
    return best / 1e9;
}

/* ---- compute peaks of the best x86 variant: independent chains of FMAs / VNNI dot products ----
 * The chain loops are unrolled by hand (the pragma): left as loops, GCC -O2 keeps the 12 chains
 * in a stack array and the peak measures store-to-load forwarding (about a quarter of the rate). */
#define PEAK_UNROLL _Pragma("GCC unroll 12")
/* The VNNI chains step through one asm statement on 12 variables z0..z11: as intrinsics on an array
 * GCC 12 copied every chain to another register and back each iteration (24 moves per 12
 * VPDPBUSDs, on the same two ports), which measured 3.6 G VPDPBUSD/s per core where the unit
 * issues 5.4 (two per cycle). */
#define PEAK_VNNI12(insn, z, u, s)                                                                                   \
    __asm__(insn " %13, %12, %0\n\t" insn " %13, %12, %1\n\t" insn " %13, %12, %2\n\t" insn " %13, %12, %3\n\t"     \
            insn " %13, %12, %4\n\t" insn " %13, %12, %5\n\t" insn " %13, %12, %6\n\t" insn " %13, %12, %7\n\t"     \
            insn " %13, %12, %8\n\t" insn " %13, %12, %9\n\t" insn " %13, %12, %10\n\t" insn " %13, %12, %11"         \
            : "+x"(z##0), "+x"(z##1), "+x"(z##2), "+x"(z##3), "+x"(z##4), "+x"(z##5), "+x"(z##6), "+x"(z##7),           \
              "+x"(z##8), "+x"(z##9), "+x"(z##10), "+x"(z##11)                                                         \
            : "x"(u), "x"(s))

#if defined(__x86_64__)
#define PEAK_ITERS 20000000L
__attribute__((target("avx512f"))) static void peak_fma_avx512(void *ctx, int task) {
    double *out = ctx;
    __m512d a[12];
    for (int k = 0; k < 12; k++) a[k] = _mm512_set1_pd(1.0 + k);
    const __m512d m = _mm512_set1_pd(0.999999), c = _mm512_set1_pd(1e-7);
    for (long i = 0; i < PEAK_ITERS; i++) {
        PEAK_UNROLL
        for (int k = 0; k < 12; k++) a[k] = _mm512_fmadd_pd(a[k], m, c);
    }
    double sum = 0;
    for (int k = 0; k < 12; k++) sum += _mm512_reduce_add_pd(a[k]);
    out[task] = sum;
}

/* VPDPBUSD (int8, 64 products) or VPDPWSSD (int16, 32 products: the FP4 words and FP8 int16 forms)
 * on zmm, as the instruction names. */
__attribute__((target("avx512f,avx512vnni"))) static double peak_vnni_avx512_chains(int task, int words) {
    __m512i z0 = _mm512_set1_epi32(task), z1 = z0, z2 = z0, z3 = z0, z4 = z0, z5 = z0, z6 = z0, z7 = z0, z8 = z0,
            z9 = z0, z10 = z0, z11 = z0;
    const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
    if (words)
        for (long i = 0; i < PEAK_ITERS; i++) PEAK_VNNI12("vpdpwssd", z, u, s);
    else
        for (long i = 0; i < PEAK_ITERS; i++) PEAK_VNNI12("vpdpbusd", z, u, s);
    const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(z0, z1), _mm512_add_epi32(z2, z3)),
                                         _mm512_add_epi32(_mm512_add_epi32(z4, z5), _mm512_add_epi32(z6, z7)));
    return (double)_mm512_reduce_add_epi32(
        _mm512_add_epi32(sum, _mm512_add_epi32(_mm512_add_epi32(z8, z9), _mm512_add_epi32(z10, z11))));
}
static void peak_vnni_avx512(void *ctx, int task) { ((double *)ctx)[task] = peak_vnni_avx512_chains(task, 0); }
static void peak_vnni16_avx512(void *ctx, int task) { ((double *)ctx)[task] = peak_vnni_avx512_chains(task, 1); }

/* The AVX-VNNI variant's unit: VEX-encoded VPDPBUSD on ymm (CPUs without AVX-512). */
__attribute__((target("avx2,avxvnni"))) static void peak_vnni_ymm(void *ctx, int task) {
    double *out = ctx;
    __m256i z0 = _mm256_set1_epi32(task), z1 = z0, z2 = z0, z3 = z0, z4 = z0, z5 = z0, z6 = z0, z7 = z0, z8 = z0,
            z9 = z0, z10 = z0, z11 = z0;
    const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2);
    for (long i = 0; i < PEAK_ITERS; i++) PEAK_VNNI12("%{vex%} vpdpbusd", z, u, s);
    const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(z0, z1), _mm256_add_epi32(z2, z3)),
                                         _mm256_add_epi32(_mm256_add_epi32(z4, z5), _mm256_add_epi32(z6, z7)));
    int32_t tmp[8];
    _mm256_storeu_si256((__m256i *)tmp,
                        _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_add_epi32(z8, z9), _mm256_add_epi32(z10, z11))));
    out[task] = tmp[0] + tmp[7];
}

/* The AVX2 words forms' unit without VNNI: VPMADDWD (16 int16 pair products, 32 operations)
 * then VPADDD into the chain, 12 chains; the products go through two scratch registers. */
#define PEAK_MADD12(z, u, s)                                                                                         \
    __asm__("vpmaddwd %13, %12, %%ymm14\n\tvpaddd %%ymm14, %0, %0\n\tvpmaddwd %13, %12, %%ymm15\n\tvpaddd %%ymm15, %1, %1\n\t" \
            "vpmaddwd %13, %12, %%ymm14\n\tvpaddd %%ymm14, %2, %2\n\tvpmaddwd %13, %12, %%ymm15\n\tvpaddd %%ymm15, %3, %3\n\t"   \
            "vpmaddwd %13, %12, %%ymm14\n\tvpaddd %%ymm14, %4, %4\n\tvpmaddwd %13, %12, %%ymm15\n\tvpaddd %%ymm15, %5, %5\n\t"   \
            "vpmaddwd %13, %12, %%ymm14\n\tvpaddd %%ymm14, %6, %6\n\tvpmaddwd %13, %12, %%ymm15\n\tvpaddd %%ymm15, %7, %7\n\t"   \
            "vpmaddwd %13, %12, %%ymm14\n\tvpaddd %%ymm14, %8, %8\n\tvpmaddwd %13, %12, %%ymm15\n\tvpaddd %%ymm15, %9, %9\n\t"   \
            "vpmaddwd %13, %12, %%ymm14\n\tvpaddd %%ymm14, %10, %10\n\tvpmaddwd %13, %12, %%ymm15\n\tvpaddd %%ymm15, %11, %11" \
            : "+x"(z##0), "+x"(z##1), "+x"(z##2), "+x"(z##3), "+x"(z##4), "+x"(z##5), "+x"(z##6), "+x"(z##7),           \
              "+x"(z##8), "+x"(z##9), "+x"(z##10), "+x"(z##11)                                                         \
            : "x"(u), "x"(s)                                                                                           \
            : "xmm14", "xmm15")

__attribute__((target("avx2"))) static void peak_madd_avx2(void *ctx, int task) {
    double *out = ctx;
    __m256i z0 = _mm256_set1_epi32(task), z1 = z0, z2 = z0, z3 = z0, z4 = z0, z5 = z0, z6 = z0, z7 = z0, z8 = z0,
            z9 = z0, z10 = z0, z11 = z0;
    const __m256i u = _mm256_set1_epi16(3), s = _mm256_set1_epi16(-2);
    for (long i = 0; i < PEAK_ITERS; i++) PEAK_MADD12(z, u, s);
    const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(z0, z1), _mm256_add_epi32(z2, z3)),
                                         _mm256_add_epi32(_mm256_add_epi32(z4, z5), _mm256_add_epi32(z6, z7)));
    int32_t tmp[8];
    _mm256_storeu_si256((__m256i *)tmp,
                        _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_add_epi32(z8, z9), _mm256_add_epi32(z10, z11))));
    out[task] = tmp[0] + tmp[7];
}

__attribute__((target("avx2,fma"))) static void peak_task_avx2(void *ctx, int task) {
    double *out = ctx;
    __m256d a[12];
    for (int k = 0; k < 12; k++) a[k] = _mm256_set1_pd(1.0 + k);
    const __m256d m = _mm256_set1_pd(0.999999), c = _mm256_set1_pd(1e-7);
    for (long i = 0; i < PEAK_ITERS; i++) {
        PEAK_UNROLL
        for (int k = 0; k < 12; k++) a[k] = _mm256_fmadd_pd(a[k], m, c);
    }
    double sum = 0, tmp[4];
    for (int k = 0; k < 12; k++) {
        _mm256_storeu_pd(tmp, a[k]);
        sum += tmp[0] + tmp[3];
    }
    out[task] = sum;
}

/* AMX: four independent 16 x 16 int32 tiles, each TDPBSSD 16 x 16 x 64 byte products. */
#define PEAK_AMX_ITERS 2000000L
typedef struct __attribute__((packed)) peak_tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} peak_tile_config;

__attribute__((target("amx-tile,amx-int8"))) static void peak_amx(void *ctx, int task) {
    double *out = ctx;
    peak_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;
    }
    static int8_t a[1024], b[1024];
    int32_t c[256];
    for (int i = 0; i < 1024; i++) a[i] = b[i] = (int8_t)(i % 7 - 3);
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b, 64);
    for (long i = 0; i < PEAK_AMX_ITERS; i++) {
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
    }
    _tile_stored(0, c, 64);
    _tile_release();
    out[task] = c[0];
}

/* f64 FMA GFLOP/s (2 per lane per FMA); with AVX-512, int8 and int16 VNNI GOP/s (2 per pair
 * product); with AVX2, the int16 VPMADDWD + VPADDD rate (and with AVX-VNNI its int8 VPDPBUSD), on
 * `threads` threads. */
static void compute_peaks(int threads, int avx512, int avxvnni, double *gflops_f64, double *gops_int8,
                          double *gops_int16) {
    double out[64];
    double t = time_now_seconds();
    kernels_parallel_for(avx512 ? peak_fma_avx512 : peak_task_avx2, out, threads);
    t = time_now_seconds() - t;
    *gflops_f64 = (double)threads * PEAK_ITERS * 12 * (avx512 ? 8 : 4) * 2 / t / 1e9;
    *gops_int8 = *gops_int16 = 0;
    if (avx512) {
        t = time_now_seconds();
        kernels_parallel_for(peak_vnni_avx512, out, threads);
        t = time_now_seconds() - t;
        *gops_int8 = (double)threads * PEAK_ITERS * 12 * 64 * 2 / t / 1e9;
        t = time_now_seconds();
        kernels_parallel_for(peak_vnni16_avx512, out, threads);
        t = time_now_seconds() - t;
        *gops_int16 = (double)threads * PEAK_ITERS * 12 * 32 * 2 / t / 1e9;
    } else {
        if (avxvnni) {
            t = time_now_seconds();
            kernels_parallel_for(peak_vnni_ymm, out, threads);
            t = time_now_seconds() - t;
            *gops_int8 = (double)threads * PEAK_ITERS * 12 * 32 * 2 / t / 1e9;
        }
        t = time_now_seconds();
        kernels_parallel_for(peak_madd_avx2, out, threads);
        t = time_now_seconds() - t;
        *gops_int16 = (double)threads * PEAK_ITERS * 12 * 16 * 2 / t / 1e9;
    }
}

/* AMX int8 tile GOP/s (2 per byte pair) on `threads` threads; the variant's lookup asked the OS. */
static double amx_peak(int threads) {
    double out[64];
    double t = time_now_seconds();
    kernels_parallel_for(peak_amx, out, threads);
    t = time_now_seconds() - t;
    return (double)threads * PEAK_AMX_ITERS * 4 * 16 * 16 * 64 * 2 / t / 1e9;
}
#endif

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

static void run_product(const product *p, size_t offset, const uint8_t *xc, const float *xs, const float *xf, int T,
                        float *y) {
    const uint8_t *base = pool_mem + offset;
    const size_t n = (size_t)p->rows * p->cols;
    switch (p->k) {
    case K_FP8: {
        const fp8_matrix w = {base, base + n, p->rows, p->cols, MATRIX_ROWS, NULL};
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
           "(plain: low codes read as they are; listed: fp8_low_codes, the raised form):\n");
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
static void gaussian_activations_section(int quick, const int *token_counts, int n_counts, float *y) {
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
    const fp8_matrix m8 = {w8, s8, 4096, COLS, MATRIX_ROWS, NULL};
    const fp4_matrix m4 = {w4, s4, 2048, COLS};
    printf("\nSeveral-token products on quantized Gaussian activations, 1 thread, ms per token:\n");
    printf("%-12s %-10s %-7s", "kernel", "shape", "variant");
    for (int i = 0; i < n_counts; i++) printf(" %7d tok", token_counts[i]);
    printf("\n");
    kernels_set_threads(1);
    for (int k = 0; k < 2; k++)
        for (size_t vi = 0; kernels_variant_names[vi]; vi++) {
            const char *v = kernels_variant_names[vi];
            if (!strcmp(v, "scalar") || !kernels_available(v)) continue;
            char msg[128];
            kernels_select(v, msg, sizeof msg);
            printf("%-12s %-10s %-7s", k ? "fp4 x fp8" : "fp8 x fp8", k ? "2048x4096" : "4096x4096", v);
            for (int i = 0; i < n_counts; i++) {
                const int T = token_counts[i];
                int calls = 0;
                double t0 = 0;
                do {
                    if (k) par_matmul_fp4(&m4, xc, xs, T, y, 2048, 0, 2048);
                    else par_matmul_fp8(&m8, xc, xs, T, y, 4096, 0, 4096);
                    if (calls++ == 0) t0 = time_now_seconds(); /* the first call warms up */
                } while (calls < 3 || time_now_seconds() - t0 < (quick ? 0.2 : 0.5));
                printf(" %11.4f", (time_now_seconds() - t0) / (calls - 1) / T * 1e3);
                fflush(stdout);
            }
            printf("\n");
        }
    free(x);
    free(xc);
    free(xs);
    free(w8);
    free(s8);
    free(w4);
    free(s4);
}

int main(int argc, char **argv) {
    int quick = 0, several_only = 0, token_counts[16] = {4, 8, 64, 256}, n_counts = 4;
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
        } else {
            fprintf(stderr, "usage: bench_kernels [--quick] [--several-tokens [N,N,...]]\n"
                            "  --quick           shorter timings and a 512 MB pool\n"
                            "  --several-tokens  only the several-token products on Gaussian activations\n"
                            "                    (default 4,8,64,256 tokens)\n");
            return 2;
        }
    }
    if (several_only) {
        float *y = malloc((size_t)256 * 4096 * sizeof(float));
        gaussian_activations_section(quick, token_counts, n_counts, y);
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
    gaussian_activations_section(quick, token_counts, n_counts, y);
    printf("\nGB/s wts: weight bytes read per second (decode is bound by memory: compare with %.1f GB/s);\n"
           "GB/s cpu: the same per second of process CPU time (all threads, spinning pool workers included);\n"
           "GFLOP/s: 2 * rows * cols * tokens per second (a prefill chunk is bound by compute).\n",
           bwn);
    free(pool_mem);
    return 0;
}
