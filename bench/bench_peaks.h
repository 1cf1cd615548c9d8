/* The machine's measured limits, shared by the benchmarks (bench_kernels.c, bench_model.c): the
 * memory read bandwidth and the compute peaks of the x86 units the kernels use. Static functions:
 * each benchmark is one translation unit. */
#ifndef DS4F_BENCH_PEAKS_H
#define DS4F_BENCH_PEAKS_H

#include "base/timer.h"
#include "kernels/kernels.h"

#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

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
__attribute__((unused)) static double amx_peak(int threads) {
    double out[64];
    double t = time_now_seconds();
    kernels_parallel_for(peak_amx, out, threads);
    t = time_now_seconds() - t;
    return (double)threads * PEAK_AMX_ITERS * 4 * 16 * 16 * 64 * 2 / t / 1e9;
}
#endif

#endif
