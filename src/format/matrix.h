/* In-memory views of weight matrices in their checkpoint formats (row-major [rows][cols],
 * rows = outputs). The data stays in the native format; kernels decode on the fly. */
#ifndef DS4F_FORMAT_MATRIX_H
#define DS4F_FORMAT_MATRIX_H

#include <stdint.h>

/* F8_E4M3 codes [rows][cols] with one E8M0 scale per 128x128 block:
 * scales [ceil(rows/128)][ceil(cols/128)], element (r,c) multiplies scales[r/128][c/128]. */
typedef struct fp8_matrix {
    const uint8_t *codes;
    const uint8_t *scales;
    int rows, cols;
} fp8_matrix;

/* Packed FP4 E2M1 [rows][cols/2] (element 2j in the low nibble of byte j, 2j+1 in the high
 * nibble) with one E8M0 scale per 32 values along a row: scales [rows][cols/32]. cols is the
 * logical width. */
typedef struct fp4_matrix {
    const uint8_t *packed;
    const uint8_t *scales;
    int rows, cols;
} fp4_matrix;

typedef struct bf16_matrix {
    const uint16_t *values;
    int rows, cols;
} bf16_matrix;

typedef struct f32_matrix {
    const float *values;
    int rows, cols;
} f32_matrix;

#endif
