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
