/* Lightning indexer (OFF-M Indexer.forward, spec §3.4.4): scores every visible compressed entry
 * for the query and keeps the top index_topk. OFF-M computes the scores with bf16 tensors, so each
 * head's dot product, its ReLU times the head weight, and the sum over heads are rounded to bf16
 * as there. */
#include "nn/layers.h"
#include "kernels/kernels.h"

#include <math.h>

/* Min-heap on (score, -index): the root is the entry that leaves first when a better one comes.
 * Among equal scores the higher index is "worse", so ties keep the lower index. */
typedef struct { float score; int32_t index; } scored;

static int worse(scored a, scored b) { return a.score < b.score || (a.score == b.score && a.index > b.index); }

static void sift_down(scored *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && worse(h[l], h[m])) m = l;
        if (r < n && worse(h[r], h[m])) m = r;
        if (m == i) return;
        scored t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

int indexer_select(const nn_session *s, const compressor_state *keys, const float *q_index, const float *head_weights,
                   int64_t pos, float *head_scores, float *scores, int32_t *selected) {
    const model_config *c = s->c;
    const int heads = c->index_n_heads, hd = c->index_head_dim;
    int n = (int)((pos + 1) / 4);
    if (n > keys->n_entries) n = keys->n_entries;
    /* Every head against every entry in one product: the entries are the rows of a bf16 matrix,
     * the heads its inputs; head_scores[h][w] is the sequential dot product of the reference. */
    if (n > 0) {
        const bf16_matrix entries = {keys->entries, n, hd, MATRIX_ROWS};
        par_matmul_bf16(&entries, q_index, hd, heads, head_scores, n, 0, n);
    }
    for (int w = 0; w < n; w++) {
        double total = 0;
        for (int h = 0; h < heads; h++) {
            float dot = bf16_round(head_scores[(size_t)h * n + w]);
            float relu = dot > 0.0f ? dot : 0.0f;
            total += bf16_round(relu * head_weights[h]);
        }
        scores[w] = bf16_round((float)total);
    }
    const int k = n < c->index_topk ? n : c->index_topk;
    if (k == 0) return 0;
    /* heap of the k best so far, stored in a scratch area right after the scores */
    scored *heap = (scored *)(scores + n);
    int size = 0;
    for (int w = 0; w < n; w++) {
        scored e = {scores[w], w};
        if (size < k) {
            heap[size++] = e;
            for (int i = size / 2 - 1; size == k && i >= 0; i--) sift_down(heap, size, i);
        } else if (worse(heap[0], e)) {
            heap[0] = e;
            sift_down(heap, size, 0);
        }
    }
    if (size < k) return 0; /* unreachable: k <= n */
    /* Pop worst-first, fill from the back: best first (descending score, ties by lower index). */
    for (int i = k - 1; i >= 0; i--) {
        selected[i] = heap[0].index;
        heap[0] = heap[--size];
        sift_down(heap, size, 0);
    }
    return k;
}
