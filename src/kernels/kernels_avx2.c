/* AVX2 + FMA + F16C kernels (placeholder table until the AVX2 kernels land: scalar entries). */
#include "kernels/kernels_internal.h"

const kernel_ops kernel_ops_avx2 = {
    .name = "avx2",
};
