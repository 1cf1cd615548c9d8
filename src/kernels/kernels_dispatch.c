/* The single dispatch point: which variant runs the products, chosen once from the CPU's
 * features (or by kernels_select, behind the --kernels flag), and the public entry
 * points that forward to it. */
#include "kernels/kernels_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>

typedef struct x86_features {
    int avx2, avx_vnni, fma, f16c, avx512f, avx512bw, avx512dq, avx512vl, avx512vnni, avx512vbmi;
    int amx_tile, amx_int8, amx_bf16; /* the CPU has them and the OS saves the tile state (XCR0 bits 17, 18) */
} x86_features;

static unsigned long long read_xcr0(void) {
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

/* CPUID says what the core implements; XCR0 says whether the OS saves the wide registers (a CPU
 * with AVX-512 under an OS that does not enable it must not run AVX-512 code). */
static x86_features detect_x86(void) {
    x86_features f = {0};
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    f.fma = (c >> 12) & 1;
    f.f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return (x86_features){0};
    const unsigned long long xcr0 = read_xcr0();
    const int ymm_state = (xcr0 & 0x6) == 0x6, zmm_state = (xcr0 & 0xe6) == 0xe6;
    if (!ymm_state) return (x86_features){0};
    if (__get_cpuid_max(0, NULL) < 7) return f;
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = (b >> 5) & 1;
    const unsigned leaf7_subleafs = a;
    if (zmm_state) {
        f.avx512f = (b >> 16) & 1;
        f.avx512dq = (b >> 17) & 1;
        f.avx512bw = (b >> 30) & 1;
        f.avx512vl = (b >> 31) & 1;
        f.avx512vnni = (c >> 11) & 1;
        f.avx512vbmi = (c >> 1) & 1;
    }
    if (leaf7_subleafs >= 1) {
        unsigned a1, b1, c1, d1;
        __cpuid_count(7, 1, a1, b1, c1, d1);
        f.avx_vnni = (a1 >> 4) & 1; /* VEX-encoded VPDPBUSD on xmm / ymm */
    }
    if ((xcr0 & 0x60000) == 0x60000) {
        f.amx_tile = (d >> 24) & 1;
        f.amx_int8 = (d >> 25) & 1;
        f.amx_bf16 = (d >> 22) & 1;
    }
    return f;
}

static int cpu_runs(const char *name) {
    const x86_features f = detect_x86();
    if (!strcmp(name, "avx2")) return f.avx2 && f.fma && f.f16c;
    if (!strcmp(name, "avxvnni")) return f.avx2 && f.fma && f.f16c && f.avx_vnni;
    if (!strcmp(name, "avx512"))
        return f.avx2 && f.fma && f.f16c && f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl && f.avx512vnni &&
               f.avx512vbmi;
    if (!strcmp(name, "amx"))
        return cpu_runs("avx512") && f.amx_tile && f.amx_int8 && f.amx_bf16 && kernels_amx_permitted();
    return 0;
}
#else
static int cpu_runs(const char *name) {
    (void)name;
    return 1; /* NEON (Advanced SIMD) is part of every arm64 CPU */
}
#endif

/* A variant with its NULL entries filled from its base (itself filled), else the scalar table. */
static kernel_ops filled(const kernel_ops *v) {
    kernel_ops k = *v;
    kernel_ops base = v->base ? filled(v->base) : kernel_ops_scalar;
    const kernel_ops *s = &base;
    if (!k.plain_c_level) k.plain_c_level = s->plain_c_level;
    if (!k.quantize_fp8_act) k.quantize_fp8_act = s->quantize_fp8_act;
    if (!k.matmul_fp8) k.matmul_fp8 = s->matmul_fp8;
    if (!k.matmul_fp4) k.matmul_fp4 = s->matmul_fp4;
    if (!k.matmul_fp8_dequant) k.matmul_fp8_dequant = s->matmul_fp8_dequant;
    if (!k.matmul_bf16) k.matmul_bf16 = s->matmul_bf16;
    if (!k.matmul_f32) k.matmul_f32 = s->matmul_f32;
    if (!k.rescale_add_weighted_rows_f32) k.rescale_add_weighted_rows_f32 = s->rescale_add_weighted_rows_f32;
    if (!k.fp8_act_bytes) {
        k.fp8_act_bytes = s->fp8_act_bytes;
        k.fp8_act_prepare = s->fp8_act_prepare;
        k.matmul_fp8_prepared = s->matmul_fp8_prepared;
    }
    if (!k.fp4_act_bytes) {
        k.fp4_act_bytes = s->fp4_act_bytes;
        k.fp4_act_prepare = s->fp4_act_prepare;
        k.matmul_fp4_prepared = s->matmul_fp4_prepared;
    }
    return k;
}

static const kernel_ops *raw_lookup(const char *name) {
    if (!strcmp(name, "scalar")) return &kernel_ops_scalar;
#if defined(__x86_64__) || defined(_M_X64)
    if (!strcmp(name, "avx2") && cpu_runs("avx2")) return &kernel_ops_avx2;
    if (!strcmp(name, "avxvnni") && cpu_runs("avxvnni")) return &kernel_ops_avxvnni;
    if (!strcmp(name, "avx512") && cpu_runs("avx512")) return &kernel_ops_avx512;
    if (!strcmp(name, "amx") && cpu_runs("amx")) return &kernel_ops_amx;
#endif
#if defined(__aarch64__)
    if (!strcmp(name, "neon") && cpu_runs("neon")) return &kernel_ops_neon;
#endif
    return NULL;
}

const char *const kernels_variant_names[] = {"scalar", "avx2", "avxvnni", "avx512", "amx", "neon", NULL};

const kernel_ops *kernels_lookup(const char *name) {
    enum { N_NAMES = sizeof kernels_variant_names / sizeof kernels_variant_names[0] - 1 };
    static kernel_ops tables[N_NAMES];
    const kernel_ops *v = raw_lookup(name);
    if (!v) return NULL;
    for (int i = 0; i < N_NAMES; i++)
        if (!strcmp(name, kernels_variant_names[i])) {
            tables[i] = filled(v);
            return &tables[i];
        }
    return NULL;
}

int kernels_available(const char *name) { return kernels_lookup(name) != NULL; }

static const char *best_variant(void) {
    static const char *const order[] = {"amx", "avx512", "avxvnni", "avx2", "neon"};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (kernels_lookup(order[i])) return order[i];
    return "scalar";
}

kernel_ops kernels_current;

static void install(const kernel_ops *v) { kernels_current = *v; }

int kernels_select(const char *name, char *msg, size_t msg_size) {
    if (!name || !strcmp(name, "auto")) name = best_variant();
    const kernel_ops *v = kernels_lookup(name);
    if (!v) {
        int known = 0;
        char choices[128] = "";
        for (int i = 0; kernels_variant_names[i]; i++) {
            known |= !strcmp(name, kernels_variant_names[i]);
            snprintf(choices + strlen(choices), sizeof choices - strlen(choices), "%s%s", i ? ", " : "",
                     kernels_variant_names[i]);
        }
        if (msg)
            snprintf(msg, msg_size, "kernels '%s' %s (choose %s or auto; this CPU runs up to %s)", name,
                     known ? "are not available on this machine" : "are unknown", choices, best_variant());
        return -1;
    }
    install(v);
    return 0;
}

const char *kernels_selected(void) { return kernels_current.name; }

int kernels_plain_c_level(void) { return kernels_current.plain_c_level; }

/* The default before any explicit choice (the --kernels flag): the best variant this CPU runs. */
__attribute__((constructor)) static void kernels_init(void) { kernels_select("auto", NULL, 0); }

int kernels_flag_parse(int argc, char **argv, int *i) {
    const char *a = argv[*i];
    const int threads = !strcmp(a, "-t") || !strcmp(a, "--threads");
    if (!threads && strcmp(a, "--kernels")) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "ds4f: %s needs a value\n", a);
        return -1;
    }
    const char *v = argv[*i + 1];
    if (threads) {
        char *end;
        const long n = strtol(v, &end, 10);
        if (*end || n < 1 || n > 256) {
            fprintf(stderr, "ds4f: %s wants a thread count from 1 to 256, not '%s'\n", a, v);
            return -1;
        }
        if (kernels_set_threads((int)n) != 0) {
            fprintf(stderr, "ds4f: cannot start %ld threads\n", n);
            return -1;
        }
    } else {
        char msg[256];
        if (kernels_select(v, msg, sizeof msg) != 0) {
            fprintf(stderr, "ds4f: --kernels: %s\n", msg);
            return -1;
        }
    }
    *i += 2;
    return 1;
}

void quantize_fp8_act(const float *x, int n, uint8_t *codes, float *scales) {
    kernels_current.quantize_fp8_act(x, n, codes, scales);
}

void matmul_fp8(const fp8_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                int y_stride, int row_begin, int row_end) {
    kernels_current.matmul_fp8(w, x_codes, x_scales, n_tokens, y, y_stride, row_begin, row_end);
}

void matmul_fp4(const fp4_matrix *w, const uint8_t *x_codes, const float *x_scales, int n_tokens, float *y,
                int y_stride, int row_begin, int row_end) {
    kernels_current.matmul_fp4(w, x_codes, x_scales, n_tokens, y, y_stride, row_begin, row_end);
}

void matmul_fp8_dequant(const fp8_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                        int row_begin, int row_end) {
    kernels_current.matmul_fp8_dequant(w, x, x_stride, n_tokens, y, y_stride, row_begin, row_end);
}

void matmul_bf16(const bf16_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                 int row_begin, int row_end) {
    kernels_current.matmul_bf16(w, x, x_stride, n_tokens, y, y_stride, row_begin, row_end);
}

void matmul_f32(const f32_matrix *w, const float *x, int x_stride, int n_tokens, float *y, int y_stride,
                int row_begin, int row_end) {
    kernels_current.matmul_f32(w, x, x_stride, n_tokens, y, y_stride, row_begin, row_end);
}

void rescale_add_weighted_rows_f32(float *y, const float *rescale, const float *a, int a_stride, int n_heads,
                                   const float *const *rows, int n_rows, int n, int products_exact) {
    kernels_current.rescale_add_weighted_rows_f32(y, rescale, a, a_stride, n_heads, rows, n_rows, n, products_exact);
}
