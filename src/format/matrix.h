/* In-memory views of weight matrices in their checkpoint formats ([rows][cols], rows = outputs).
 * The values stay in the native format; kernels decode on the fly. */
#ifndef DS4F_FORMAT_MATRIX_H
#define DS4F_FORMAT_MATRIX_H

#include <stddef.h>
#include <stdint.h>

/* Storage order of the values of an fp8_matrix or bf16_matrix (the `layout` field).
 *  MATRIX_ROWS: the checkpoint's row-major order (the zero value).
 *  MATRIX_GROUPS16: the first rows16 = rows - rows % 16 rows in groups of 16 consecutive rows,
 *    each group column-major: element (r, c) at index ((r / 16) * cols + c) * 16 + r % 16. The
 *    last rows % 16 rows follow row-major, which is where row-major order has them anyway.
 * A group reads one column of 16 rows with one load, so products that vectorise across rows
 * (the float products) need no transpose; the size is the same, so the loader rearranges in
 * place. FP8 scales keep their [ceil(rows/128)][ceil(cols/128)] order in both layouts. */
enum { MATRIX_ROWS = 0, MATRIX_GROUPS16 = 1 };
#define MATRIX_GROUP_ROWS 16

/* Index of the first element of row r, and in *step the distance between its elements. */
static inline size_t matrix_row_origin(int layout, int rows, int cols, int r, size_t *step) {
    if (layout == MATRIX_GROUPS16 && r < rows - rows % MATRIX_GROUP_ROWS) {
        *step = MATRIX_GROUP_ROWS;
        return (size_t)(r - r % MATRIX_GROUP_ROWS) * cols + (size_t)(r % MATRIX_GROUP_ROWS);
    }
    *step = 1;
    return (size_t)r * cols;
}

/* Rearranges row-major values (elem_bytes 1, 2 or 4 per element) into MATRIX_GROUPS16, in place.
 * Returns 0, or -1 when the one-group scratch buffer cannot be allocated (values unchanged). */
int matrix_group_rows(void *values, size_t elem_bytes, int rows, int cols);

/* The low codes of a row-major FP8 matrix, row by row: row r's lie at columns
 * cols[row_first[r] .. row_first[r + 1]), ascending. A code is low when its exponent field is zero
 * (the e4m3 subnormals and the two zeros) or when 16 does not divide its k = value * 2^9 (the
 * normals below 0.25 whose mantissa leaves a remainder: fields 1 to 4). The x86 kernels need them
 * apart in two ways. Their f64 forms read a code as an f64 whose exponent is raised so that no
 * weight value is subnormal (Intel cores take a microcode assist for every subnormal operand,
 * and real checkpoints hold 1e-4 to 1e-3 of such codes); that reading is off for the codes whose
 * field is zero, by an exact amount the kernels take back using this list (for the other listed
 * codes the amount is zero). The AVX-512 one-token form reads each code as the int16 word k / 16,
 * which exists only when 16 divides k, and adds the product of every other code from the list. */
typedef struct fp8_low_codes {
    const uint32_t *row_first; /* [rows + 1] */
    const uint16_t *cols;      /* [row_first[rows]] */
} fp8_low_codes;

/* F8_E4M3 codes [rows][cols] with one E8M0 scale per 128x128 block:
 * scales [ceil(rows/128)][ceil(cols/128)], element (r,c) multiplies scales[r/128][c/128]. */
typedef struct fp8_matrix {
    const uint8_t *codes;
    const uint8_t *scales;
    int rows, cols;
    int layout; /* of codes: MATRIX_ROWS or MATRIX_GROUPS16 (float products only) */
    /* MATRIX_ROWS only; NULL: not listed, and the kernels place every code as it is (exact too,
     * but an e4m3 subnormal is then an f64 subnormal) */
    const fp8_low_codes *low;
} fp8_matrix;

/* Whether an e4m3 code is low (see fp8_low_codes). */
static inline int fp8_code_is_low(uint8_t code) {
    const int e = (code >> 3) & 15, m = code & 7;
    if (e == 0) return 1;
    if (e > 4) return 0; /* k = (8 + m) * 2^(e - 1), a multiple of 16 from e = 5 */
    return (((8 + m) << (e - 1)) & 15) != 0;
}

/* The widest matrix a list can describe (its columns are 16-bit). */
#define FP8_LOW_CODES_MAX_COLS 65536

/* Lists the low codes of w (MATRIX_ROWS, cols <= FP8_LOW_CODES_MAX_COLS) in one allocation, to be
 * passed to free(). NULL with *too_many = 1 when w has more than max_low of them (nothing
 * allocated: the list would cost more than it saves), NULL with *too_many = 0 when out of memory. */
fp8_low_codes *fp8_low_codes_list(const fp8_matrix *w, size_t max_low, int *too_many);

/* Bytes fp8_low_codes_list allocates at most for a rows x cols matrix and max_low codes. */
size_t fp8_low_codes_bytes_bound(int rows, size_t max_low);

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
    int layout; /* MATRIX_ROWS or MATRIX_GROUPS16 */
} bf16_matrix;

typedef struct f32_matrix {
    const float *values;
    int rows, cols;
} f32_matrix;

#endif
