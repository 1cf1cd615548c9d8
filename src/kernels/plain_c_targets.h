/* Plain C loops compiled once per vector level, chosen with the kernel variant.
 *
 * Much of a prefill chunk outside the products is elementwise C that the compiler vectorizes
 * (bf16 rounding, hyper-connection mixing, per-head norms). The library is built for the baseline
 * ISA, so those loops ran on 128-bit SSE2 even where 512-bit vectors exist. PLAIN_C_TARGETS makes
 * three copies of one always-inline body: baseline, AVX2 and AVX-512 target (GCC/Clang `target`
 * attribute; the body may inline into a copy whose target is a superset of its own), and
 * PLAIN_C_TARGETS_CALL calls the one the current kernel variant stands for: scalar and neon the
 * baseline, avx2 and avxvnni the AVX2 copy, avx512 and amx the AVX-512 copy.
 *
 * Why the results are the same bits: the copies are the same C, compiled without fast-math and
 * with -ffp-contract=off, so each is the same sequence of IEEE operations in the same order (the
 * compiler may not reassociate float sums or fuse a multiply and add); only the instructions that
 * carry them differ. And because the copy follows the kernel variant, the variant tests
 * (kernels_model_logits_identical_across_variants_and_threads) run every copy this CPU can. */
#ifndef DS4F_PLAIN_C_TARGETS_H
#define DS4F_PLAIN_C_TARGETS_H

#include "kernels/kernels.h"

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__GNUC__)
#define PLAIN_C_TARGET_AVX2 __attribute__((target("avx2,fma,f16c,bmi,bmi2")))
#define PLAIN_C_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi,bmi2")))
/* Defines name##_baseline, name##_avx2, name##_avx512 (static, void) calling name##_body. */
#define PLAIN_C_TARGETS(name, params, args)                                                      \
    static void name##_baseline params { name##_body args; }                                   \
    PLAIN_C_TARGET_AVX2 static void name##_avx2 params { name##_body args; }                   \
    PLAIN_C_TARGET_AVX512 static void name##_avx512 params { name##_body args; }
#define PLAIN_C_TARGETS_CALL(name, args)                                                         \
    do {                                                                                         \
        const int plain_c_level_ = kernels_plain_c_level();                                      \
        if (plain_c_level_ >= KERNELS_PLAIN_C_AVX512)                                            \
            name##_avx512 args;                                                                  \
        else if (plain_c_level_ == KERNELS_PLAIN_C_AVX2)                                         \
            name##_avx2 args;                                                                    \
        else                                                                                     \
            name##_baseline args;                                                                \
    } while (0)
#else
#define PLAIN_C_TARGETS(name, params, args) static void name##_baseline params { name##_body args; }
#define PLAIN_C_TARGETS_CALL(name, args) name##_baseline args
#endif

#endif
