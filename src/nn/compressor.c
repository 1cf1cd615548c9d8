/* KV compressor (OFF-M Compressor, spec §3.4.3): gated pooling of `ratio` consecutive tokens
 * into one entry, per channel, in f32. Ratio 4 pools overlapping windows: entry w softmaxes over
 * the 4 tokens of window w-1 (their first D channels) and the 4 tokens of window w (their second
 * D channels).
 *
 * Row layout of the state (as OFF-M's decode path): ratio 128 keeps token t in row t % 128; ratio
 * 4 keeps the previous window in rows 0..3 and the current one in rows 4..7, and shifts after each
 * emission. Rows start as kv 0 / score -inf, so window -1 contributes nothing to entry 0. */
#include "nn/layers.h"

#include <math.h>
#include <string.h>

int compressor_push(compressor_state *st, const float *kv, const float *score, const float *ape, int64_t pos,
                    float *entry) {
    const int r = st->ratio, D = st->dim, width = (st->overlap ? 2 : 1) * D;
    const int slot = (int)(pos % r);
    const int row = st->overlap ? r + slot : slot;
    float *kv_row = st->kv_rows + (size_t)row * width, *score_row = st->score_rows + (size_t)row * width;
    memcpy(kv_row, kv, (size_t)width * sizeof(float));
    for (int i = 0; i < width; i++) score_row[i] = score[i] + ape[(size_t)slot * width + i];
    if ((pos + 1) % r != 0) return 0;

    const int candidates = st->overlap ? 2 * r : r;
    for (int dch = 0; dch < D; dch++) {
        /* Candidate i: (row, column). Overlap: rows 0..r-1 use column d, rows r..2r-1 column D+d. */
        float z[256], m = -INFINITY;
        for (int i = 0; i < candidates; i++) {
            int col = st->overlap && i >= r ? D + dch : dch;
            z[i] = st->score_rows[(size_t)i * width + col];
            m = max_num_f32(m, z[i]);
        }
        double sum = 0;
        for (int i = 0; i < candidates; i++) {
            z[i] = expf(z[i] - m);
            sum += z[i];
        }
        double acc = 0;
        for (int i = 0; i < candidates; i++) {
            int col = st->overlap && i >= r ? D + dch : dch;
            float weight = z[i] / (float)sum;
            acc += (double)(st->kv_rows[(size_t)i * width + col] * weight);
        }
        entry[dch] = bf16_round((float)acc);
    }
    if (st->overlap) {
        memcpy(st->kv_rows, st->kv_rows + (size_t)r * width, (size_t)r * width * sizeof(float));
        memcpy(st->score_rows, st->score_rows + (size_t)r * width, (size_t)r * width * sizeof(float));
    }
    return 1;
}
