#include "format/matrix.h"

#include <stdlib.h>
#include <string.h>

/* One group at a time through a scratch copy: a group occupies the same bytes in both orders. */
int matrix_group_rows(void *values, size_t elem_bytes, int rows, int cols) {
    const int G = MATRIX_GROUP_ROWS;
    const size_t group_bytes = (size_t)G * cols * elem_bytes;
    if (rows < G || cols <= 0) return 0;
    uint8_t *tmp = malloc(group_bytes);
    if (!tmp) return -1;
    for (int g = 0; g < rows / G; g++) {
        uint8_t *dst = (uint8_t *)values + (size_t)g * group_bytes;
        memcpy(tmp, dst, group_bytes);
        /* 16 source rows read side by side, the destination written in order */
        switch (elem_bytes) {
        case 1:
            for (int c = 0; c < cols; c++)
                for (int i = 0; i < G; i++) dst[(size_t)c * G + i] = tmp[(size_t)i * cols + c];
            break;
        case 2: {
            uint16_t *d = (uint16_t *)dst;
            const uint16_t *s = (const uint16_t *)tmp;
            for (int c = 0; c < cols; c++)
                for (int i = 0; i < G; i++) d[(size_t)c * G + i] = s[(size_t)i * cols + c];
            break;
        }
        default:
            for (int c = 0; c < cols; c++)
                for (int i = 0; i < G; i++)
                    memcpy(dst + ((size_t)c * G + i) * elem_bytes, tmp + ((size_t)i * cols + c) * elem_bytes, elem_bytes);
        }
    }
    free(tmp);
    return 0;
}

size_t fp8_low_codes_bytes_bound(int rows, size_t max_low) {
    return sizeof(fp8_low_codes) + 16 + ((size_t)rows + 1) * sizeof(uint32_t) + max_low * sizeof(uint16_t);
}

/* Bit 8i + 7 set for each byte i of the 8 codes in v that may be low (fp8_code_is_low): those
 * whose exponent field is at most 4. With the fields kept (bytes 0x00..0x78 in steps of 8),
 * adding 0x58 to each byte sets its top bit exactly where the field is 5 or more (0x28 + 0x58 =
 * 0x80), and no byte carries into the next (0x78 + 0x58 = 0xd0). */
static inline uint64_t maybe_low_bytes(uint64_t v) {
    const uint64_t t = v & 0x7878787878787878ull;
    return ~(t + 0x5858585858585858ull) & 0x8080808080808080ull;
}

/* The low codes among one row's codes: the rare candidates checked one by one. */
static uint32_t row_low_count(const uint8_t *row, int cols) {
    const int words = cols / 8;
    uint32_t n = 0;
    for (int j = 0; j < words; j++) {
        uint64_t v;
        memcpy(&v, row + 8 * (size_t)j, 8);
        for (uint64_t bits = maybe_low_bytes(v); bits; bits &= bits - 1)
            n += fp8_code_is_low(row[8 * (size_t)j + (size_t)__builtin_ctzll(bits) / 8]);
    }
    for (int c = 8 * words; c < cols; c++) n += fp8_code_is_low(row[c]);
    return n;
}

/* Two passes: count each row's low codes, then list those of the rows that have any. */
fp8_low_codes *fp8_low_codes_list(const fp8_matrix *w, size_t max_low, int *too_many) {
    *too_many = 0;
    const size_t first_offset = (sizeof(fp8_low_codes) + 15) & ~(size_t)15;
    const size_t cols_offset = first_offset + ((size_t)w->rows + 1) * sizeof(uint32_t);
    uint8_t *block = malloc(cols_offset);
    if (!block) return NULL;
    uint32_t *row_first = (uint32_t *)(block + first_offset);
    size_t n = 0;
    for (int r = 0; r < w->rows; r++) {
        row_first[r] = (uint32_t)n;
        n += row_low_count(w->codes + (size_t)r * w->cols, w->cols);
        if (n > max_low) {
            free(block);
            *too_many = 1;
            return NULL;
        }
    }
    row_first[w->rows] = (uint32_t)n;
    uint8_t *grown = realloc(block, cols_offset + (n ? n : 1) * sizeof(uint16_t));
    if (!grown) {
        free(block);
        return NULL;
    }
    block = grown;
    fp8_low_codes *list = (fp8_low_codes *)block;
    row_first = (uint32_t *)(block + first_offset);
    uint16_t *cols = (uint16_t *)(block + cols_offset);
    const int words = w->cols / 8;
    for (int r = 0; r < w->rows; r++) {
        if (row_first[r + 1] == row_first[r]) continue;
        const uint8_t *row = w->codes + (size_t)r * w->cols;
        uint32_t k = row_first[r];
        for (int j = 0; j < words; j++) {
            uint64_t v;
            memcpy(&v, row + 8 * (size_t)j, 8);
            for (uint64_t bits = maybe_low_bytes(v); bits; bits &= bits - 1) {
                const int c = 8 * j + __builtin_ctzll(bits) / 8;
                if (fp8_code_is_low(row[c])) cols[k++] = (uint16_t)c;
            }
        }
        for (int c = 8 * words; c < w->cols; c++)
            if (fp8_code_is_low(row[c])) cols[k++] = (uint16_t)c;
    }
    list->row_first = row_first;
    list->cols = cols;
    return list;
}
