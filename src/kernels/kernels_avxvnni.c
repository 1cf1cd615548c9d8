/* AVX2 + AVX-VNNI kernels (VEX-encoded VPDPBUSD and VPDPWSSD on 256-bit vectors: Intel client
 * cores from Alder Lake on, which have no AVX-512), bit-identical to kernels_scalar.c. Only the
 * FP4 x FP8 products differ from the AVX2 variant (the rest comes from it, see `base` below): the
 * same two forms (kernels_avx2_fp4.h), compiled here with __AVXVNNI__, so that each byte plane's
 * dot product is one VPDPBUSD per half instead of VPMADDUBSW + VPMADDWD (1 to 3 tokens) and each
 * word pair product one VPDPWSSD instead of VPMADDWD + VPADDD (4 or more). */
#include "kernels/kernels_avx2_fp4.h"
#include "kernels/kernels_internal.h"

const kernel_ops kernel_ops_avxvnni = {
    .name = "avxvnni",
    .base = &kernel_ops_avx2,
    .matmul_fp4 = avx2_matmul_fp4,
    .fp4_act_bytes = avx2_fp4_act_bytes,
    .fp4_act_prepare = avx2_fp4_act_prepare,
    .matmul_fp4_prepared = avx2_matmul_fp4_prepared,
};
