/* Mixture of experts (OFF-M Gate / Expert / MoE, spec §3.5).
 *
 * Router: f32 scores sqrt(softplus(gate . b)); the first num_hash_layers blocks take their experts
 * from tid2eid[token], the others the top-k of score + bias (the bias chooses, it never weighs).
 * Weights are the unbiased scores of the chosen experts, normalised, times routed_scaling_factor.
 * Experts run in ascending id and accumulate in f32; the shared expert is added last; the sum is
 * rounded to bf16. The SwiGLU clamp applies to routed and shared experts (current revision).
 *
 * Expert flow (how this file keeps the disk and the cores busy at once). For one chunk of tokens:
 *   1. route every token; the distinct experts of the chunk form one request to the expert source,
 *      which starts reading the missing ones at once (begin);
 *   2. (before this layer's attention, moe_prefetch) hint the source with the experts the next
 *      layer will probably want, its router applied to this layer's attention input, so they are
 *      read while this layer's attention and experts compute; the hash-routed layers' experts are
 *      known from the token ids and hinted before the first layer's attention;
 *   3. compute the shared expert, then each routed expert as soon as it is in RAM, in whatever
 *      order the source delivers them, over all tokens routed to it;
 *   4. sum each token's expert outputs in ascending expert id, then add the shared output.
 * Invariant 2 (placement never changes results): every (token, expert) output is computed alone
 * into its own buffer and the sums of step 4 always run in the same order, so the delivery order
 * of step 3, the cache state and the prefetch decisions cannot change a single bit. */
#include "nn/moe.h"
#include "nn/layers.h"
#include "kernels/kernels.h"
#include "kernels/plain_c_targets.h"
#include "base/timer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Per-thread working memory for one chunk: grown on demand, kept for the thread's lifetime (the
 * forward pass runs on the caller's thread; the memory planner counts it as moe_workspace_bytes). */
typedef struct moe_workspace {
    uint8_t *base;
    size_t bytes;
} moe_workspace;
static _Thread_local moe_workspace workspace;

/* What one routed expert needs while it runs over at most n gathered rows. */
typedef struct expert_scratch {
    uint8_t *rows_codes;      /* [n][d]: the inputs of the tokens routed to the expert */
    float *rows_scales;       /* [n][d/128] */
    float *row_weights;       /* [n]: their routing weights */
    float *gate, *up;         /* [n][inter] */
    uint8_t *h_codes;         /* [n][inter] */
    float *h_scales;          /* [n][inter/128] */
    float *y;                 /* [n][d] */
} expert_scratch;

/* Decode computes the experts already in RAM side by side, one pool task each, when the chunk has
 * at most this many tokens (each expert is then too small to split its rows across threads
 * without the threads mostly waiting for each other); longer chunks split each expert's rows. */
#define SIDE_BY_SIDE_MAX_TOKENS 4
#define SIDE_BY_SIDE_MAX_EXPERTS 64

static int side_by_side(const model_config *c, int n) {
    return n <= SIDE_BY_SIDE_MAX_TOKENS && n * c->num_experts_per_tok <= SIDE_BY_SIDE_MAX_EXPERTS;
}

typedef struct moe_buffers {
    float *logits, *scores;   /* [n][E] */
    int32_t *ids;             /* [n][K], ascending per token */
    float *weights;           /* [n][K] */
    uint8_t *x_codes;         /* [n][d] */
    float *x_scales;          /* [n][d/128] */
    float *expert_out;        /* [n][K][d]: each (token, expert) output alone (invariant 2) */
    int32_t *pair_start;      /* [E+1]: the (token, k) pairs of expert e are pairs[pair_start[e]..] */
    int32_t *pairs;           /* [n*K]: t*K + k */
    int32_t *cursor;          /* [E] */
    int32_t *guess;           /* [n][K]: next-layer guesses */
    expert_request *req;
    expert_scratch scratch;   /* one expert at a time, rows split across threads */
    expert_scratch side_scratch[SIDE_BY_SIDE_MAX_EXPERTS]; /* [n*K] when n <= SIDE_BY_SIDE_MAX_TOKENS */
} moe_buffers;

#define CARVE(field, bytes)                                                  \
    do {                                                                     \
        if (base) b->field = (void *)(base + used);                          \
        used += ((size_t)(bytes) + 63) & ~(size_t)63;                        \
    } while (0)

static size_t expert_scratch_layout(const model_config *c, int n, uint8_t *base, expert_scratch *b) {
    const size_t d = (size_t)c->hidden_size, inter = (size_t)c->moe_intermediate_size, T = (size_t)n;
    const size_t f = sizeof(float);
    size_t used = 0;
    CARVE(rows_codes, T * d);
    CARVE(rows_scales, T * (d / FP8_ACT_BLOCK) * f);
    CARVE(row_weights, T * f);
    CARVE(gate, T * inter * f);
    CARVE(up, T * inter * f);
    CARVE(h_codes, T * inter);
    CARVE(h_scales, T * (inter / FP8_ACT_BLOCK) * f);
    CARVE(y, T * d * f);
    return used;
}

/* Carves the buffers for n tokens out of `base` (NULL: only measures); returns the bytes used. */
static size_t moe_layout(const model_config *c, int n, uint8_t *base, moe_buffers *b) {
    const size_t d = (size_t)c->hidden_size, E = (size_t)c->n_routed_experts, K = (size_t)c->num_experts_per_tok;
    const size_t T = (size_t)n, f = sizeof(float);
    size_t used = 0;
    CARVE(logits, T * E * f);
    CARVE(scores, T * E * f);
    CARVE(ids, T * K * sizeof(int32_t));
    CARVE(weights, T * K * f);
    CARVE(x_codes, T * d);
    CARVE(x_scales, T * (d / FP8_ACT_BLOCK) * f);
    CARVE(expert_out, T * K * d * f);
    CARVE(pair_start, (E + 1) * sizeof(int32_t));
    CARVE(pairs, T * K * sizeof(int32_t));
    CARVE(cursor, E * sizeof(int32_t));
    CARVE(guess, T * K * sizeof(int32_t));
    CARVE(req, sizeof(expert_request));
    used += expert_scratch_layout(c, n, base ? base + used : NULL, b ? &b->scratch : NULL);
    if (side_by_side(c, n))
        for (size_t i = 0; i < T * K; i++)
            used += expert_scratch_layout(c, n, base ? base + used : NULL, b ? &b->side_scratch[i] : NULL);
#undef CARVE
    return used;
}

size_t moe_workspace_bytes(const model_config *c, int max_chunk) { return moe_layout(c, max_chunk, NULL, NULL); }

void moe_workspace_release(void) {
    free(workspace.base);
    workspace.base = NULL;
    workspace.bytes = 0;
}

static int moe_buffers_get(const model_config *c, int n, moe_buffers *b, ds4f_error *err) {
    const size_t need = moe_layout(c, n, NULL, NULL);
    if (need > workspace.bytes) {
        uint8_t *p = aligned_alloc(64, need);
        if (!p) return error_set(err, "out of memory for the MoE workspace (%zu bytes)", need);
        free(workspace.base);
        workspace.base = p;
        workspace.bytes = need;
    }
    moe_layout(c, n, workspace.base, b);
    return 0;
}

/* The router's choice for one token: top-k of score + bias in descending order, ties to the lower
 * id (OFF-M Gate). */
static void top_k_biased(const float *scores, const float *bias, int E, int K, int32_t *ids) {
    for (int k = 0; k < K; k++) {
        int best = -1;
        float best_v = -INFINITY;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= ids[j] == e;
            float v = scores[e] + bias[e];
            if (!taken && (best < 0 || v > best_v)) {
                best = e;
                best_v = v;
            }
        }
        ids[k] = best;
    }
}

/* SwiGLU of m rows whose gate and up projections are in gate/up: h = bf16(weight * silu(min(g, L))
 * * clamp(u, -L, L)) (weights NULL: unweighted, the shared expert), quantized into h_codes. */
typedef struct swiglu_job {
    const model_config *c;
    float *gate;
    const float *up, *weights;
    uint8_t *h_codes;
    float *h_scales;
} swiglu_job;

/* Per element: g = bf16(gate), u = bf16(up), clamped when limit > 0, h = bf16(silu(g) * u, times the
 * weight first when there is one). In three passes over SWIGLU_PIECE elements so that all but the
 * expf calls vectorize (plain C copies per vector level, kernels/plain_c_targets.h); each element's
 * operations are the same, in the same order. */
#define SWIGLU_PIECE 256
static inline __attribute__((always_inline)) void swiglu_rows_range_body(const swiglu_job *p, int begin, int end) {
    const int inter = p->c->moe_intermediate_size;
    const float limit = p->c->swiglu_limit;
    float g[SWIGLU_PIECE], u[SWIGLU_PIECE], e[SWIGLU_PIECE];
    for (int j = begin; j < end; j++) {
        float *g_row = p->gate + (size_t)j * inter;
        const float *u_row = p->up + (size_t)j * inter;
        for (int i0 = 0; i0 < inter; i0 += SWIGLU_PIECE) {
            const int m = inter - i0 < SWIGLU_PIECE ? inter - i0 : SWIGLU_PIECE;
            for (int i = 0; i < m; i++) {
                g[i] = bf16_round(g_row[i0 + i]);
                u[i] = bf16_round(u_row[i0 + i]);
                if (limit > 0) {
                    u[i] = min_num_f32(max_num_f32(u[i], -limit), limit);
                    g[i] = min_num_f32(g[i], limit);
                }
            }
            for (int i = 0; i < m; i++) e[i] = expf(-g[i]);
            for (int i = 0; i < m; i++) {
                float h = g[i] / (1.0f + e[i]) * u[i]; /* silu_f32(g) * u */
                if (p->weights) h = p->weights[j] * h;
                g_row[i0 + i] = bf16_round(h);
            }
        }
        quantize_fp8_act(g_row, inter, p->h_codes + (size_t)j * inter, p->h_scales + (size_t)j * (inter / FP8_ACT_BLOCK));
    }
}
PLAIN_C_TARGETS(swiglu_rows_range, (const swiglu_job *p, int begin, int end), (p, begin, end))

static void swiglu_task_rows(void *ctx, int begin, int end) {
    PLAIN_C_TARGETS_CALL(swiglu_rows_range, ((const swiglu_job *)ctx, begin, end));
}

/* Rows are independent: split across the pool (inside a pool task, on the calling thread). */
static void swiglu_rows(const model_config *c, float *gate, const float *up, const float *weights, int m,
                        uint8_t *h_codes, float *h_scales) {
    swiglu_job job = {c, gate, up, weights, h_codes, h_scales};
    kernels_parallel_rows(swiglu_task_rows, &job, m);
}

/* The gather of an expert's input rows and the scatter of its output rows (run_routed_expert):
 * row j of the pass is pair pairs[j]. Rows are independent, so they split across the pool like
 * the products around them (on the calling thread they left the other threads waiting: 2% of a
 * 512-token prefill with 8 experts). */
typedef struct expert_rows_job {
    const model_config *c;
    const moe_buffers *b;
    const int *pairs;
    expert_scratch *s;
} expert_rows_job;

static void expert_gather_rows(void *ctx, int begin, int end) {
    const expert_rows_job *j = ctx;
    const int d = j->c->hidden_size, K = j->c->num_experts_per_tok, scale_cols = d / FP8_ACT_BLOCK;
    for (int r = begin; r < end; r++) {
        const int pair = j->pairs[r], t = pair / K;
        memcpy(j->s->rows_codes + (size_t)r * d, j->b->x_codes + (size_t)t * d, (size_t)d);
        memcpy(j->s->rows_scales + (size_t)r * scale_cols, j->b->x_scales + (size_t)t * scale_cols,
               (size_t)scale_cols * sizeof(float));
        j->s->row_weights[r] = j->b->weights[pair];
    }
}

/* plain C copies per vector level (kernels/plain_c_targets.h) */
static inline __attribute__((always_inline)) void expert_scatter_range_body(const expert_rows_job *j, int begin, int end) {
    const int d = j->c->hidden_size;
    for (int r = begin; r < end; r++) {
        float *o = j->b->expert_out + (size_t)j->pairs[r] * d;
        memcpy(o, j->s->y + (size_t)r * d, (size_t)d * sizeof(float));
        bf16_round_array(o, (size_t)d);
    }
}
PLAIN_C_TARGETS(expert_scatter_range, (const expert_rows_job *j, int begin, int end), (j, begin, end))

static void expert_scatter_rows(void *ctx, int begin, int end) {
    PLAIN_C_TARGETS_CALL(expert_scatter_range, ((const expert_rows_job *)ctx, begin, end));
}

/* Routed expert e over the tokens routed to it, at most n rows at a time (a token names an expert
 * more than once only if its tid2eid row repeats it): gathers their quantized inputs, runs
 * w1/w3, SwiGLU with the routing weight, w2, and writes each (token, k) output, rounded to bf16,
 * into its own place in b->expert_out. Only that place and the scratch are written, so experts can
 * run side by side. */
static void run_routed_expert(const model_config *c, const moe_buffers *b, const expert_view *v, int e, int n,
                              expert_scratch *s) {
    const int inter = c->moe_intermediate_size, d = c->hidden_size;
    for (int first = b->pair_start[e]; first < b->pair_start[e + 1]; first += n) {
        const int m = b->pair_start[e + 1] - first < n ? b->pair_start[e + 1] - first : n;
        expert_rows_job rows = {c, b, b->pairs + first, s};
        kernels_parallel_light_rows(expert_gather_rows, &rows, m);
        par_matmul_fp4_pair(&v->w1, &v->w3, s->rows_codes, s->rows_scales, m, s->gate, s->up, inter);
        swiglu_rows(c, s->gate, s->up, s->row_weights, m, s->h_codes, s->h_scales);
        par_matmul_fp4(&v->w2, s->h_codes, s->h_scales, m, s->y, d, 0, d);
        kernels_parallel_light_rows(expert_scatter_rows, &rows, m);
    }
}

typedef struct side_by_side_job {
    const model_config *c;
    moe_buffers *b;
    const expert_request *req;
    const int *batch; /* request indices of the experts to run */
    int n;
} side_by_side_job;

static void side_by_side_task(void *ctx, int task) {
    const side_by_side_job *j = ctx;
    const int index = j->batch[task];
    run_routed_expert(j->c, j->b, &j->req->views[index], j->req->ids[index], j->n, &j->b->side_scratch[task]);
}

/* The shared expert over all n tokens: bf16 outputs in out [n][d]. */
static void run_shared_expert(const model_config *c, const block_weights *bw, int n, moe_buffers *b, float *out) {
    const int inter = c->moe_intermediate_size, d = c->hidden_size;
    expert_scratch *s = &b->scratch;
    par_matmul_fp8(&bw->shared_w1, b->x_codes, b->x_scales, n, s->gate, inter, 0, inter);
    par_matmul_fp8(&bw->shared_w3, b->x_codes, b->x_scales, n, s->up, inter, 0, inter);
    swiglu_rows(c, s->gate, s->up, NULL, n, s->h_codes, s->h_scales);
    par_matmul_fp8_bf16(&bw->shared_w2, s->h_codes, s->h_scales, n, out, d, 0, d);
}

/* Routes n tokens: ids/weights [n][K], ascending ids per token with their weights. */
static void route(nn_session *s, int block, const float *b_in, const int32_t *tokens, int n, moe_buffers *b) {
    const model_config *c = s->c;
    const block_weights *bw = &s->w->blocks[block];
    const int d = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    par_matmul_bf16(&bw->gate, b_in, d, n, b->logits, E, 0, E);
    for (int t = 0; t < n; t++) {
        const float *logits = b->logits + (size_t)t * E;
        float *scores = b->scores + (size_t)t * E;
        int32_t *ids = b->ids + (size_t)t * K;
        float *weights = b->weights + (size_t)t * K;
        for (int e = 0; e < E; e++) scores[e] = sqrtf(softplus_f32(logits[e]));
        if (bw->hash_routed) {
            for (int k = 0; k < K; k++) ids[k] = (int32_t)bw->tid2eid[(size_t)tokens[t] * K + k];
        } else {
            top_k_biased(scores, bw->gate_bias, E, K, ids);
        }
        float sum = 0.0f;
        for (int k = 0; k < K; k++) {
            weights[k] = scores[ids[k]];
            sum += weights[k];
        }
        for (int k = 0; k < K; k++) weights[k] = weights[k] / sum * c->routed_scaling_factor;
        /* OFF-M loops over experts in ascending id; sort (id, weight) pairs. */
        for (int i = 1; i < K; i++)
            for (int j = i; j > 0 && ids[j - 1] > ids[j]; j--) {
                int32_t ti = ids[j]; ids[j] = ids[j - 1]; ids[j - 1] = ti;
                float tw = weights[j]; weights[j] = weights[j - 1]; weights[j - 1] = tw;
            }
    }
}

void moe_prefetch(nn_session *s, int block, const float *a_in, const int32_t *tokens, int n) {
    expert_source *src = s->experts;
    const model_config *c = s->c;
    const int d = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    if (!src->prefetch || block >= c->num_hidden_layers) return;
    /* Before the first block's attention, the experts of every hash-routed block (the first
     * num_hash_layers) are known from the token ids: read them all now. */
    const int exact = block == 0 && s->w->blocks[0].hash_routed;
    const int next = block + 1;
    const block_weights *nw = next < c->num_hidden_layers ? &s->w->blocks[next] : NULL;
    const int guess = src->wants_lookahead && nw && !nw->hash_routed;
    if (!exact && !guess) return;
    moe_buffers b;
    ds4f_error err;
    if (moe_buffers_get(c, n, &b, &err) != 0) return; /* a hint: skipping it changes nothing */
    if (exact)
        for (int h = 0; h < c->num_hidden_layers && s->w->blocks[h].hash_routed; h++) {
            const block_weights *hw = &s->w->blocks[h];
            for (int t = 0; t < n; t++)
                for (int k = 0; k < K; k++) b.guess[(size_t)t * K + k] = (int32_t)hw->tid2eid[(size_t)tokens[t] * K + k];
            src->prefetch(src, h, b.guess, n * K, PREFETCH_EXACT);
        }
    if (!guess) return;
    par_matmul_bf16(&nw->gate, a_in, d, n, b.logits, E, 0, E);
    for (int t = 0; t < n; t++) {
        float *scores = b.scores + (size_t)t * E;
        for (int e = 0; e < E; e++) scores[e] = sqrtf(softplus_f32(b.logits[(size_t)t * E + e]));
        top_k_biased(scores, nw->gate_bias, E, K, b.guess + (size_t)t * K);
    }
    src->prefetch(src, next, b.guess, n * K, PREFETCH_GUESS);
}

typedef struct combine_job {
    const model_config *c;
    const float *expert_out; /* [n][K][d] */
    float *out;              /* [n][d]: the shared expert's output, then the block's */
} combine_job;

static void combine_rows(void *ctx, int begin, int end) {
    const combine_job *j = ctx;
    const int d = j->c->hidden_size, K = j->c->num_experts_per_tok;
    for (int t = begin; t < end; t++) {
        float *o = j->out + (size_t)t * d;
        const float *eo = j->expert_out + (size_t)t * K * d;
        for (int i = 0; i < d; i++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += eo[(size_t)k * d + i];
            o[i] = bf16_round(acc + o[i]);
        }
    }
}

int moe_forward(nn_session *s, int block, const float *b_in, const int32_t *tokens, int n, int64_t first_pos,
                float *out, scratch_arena *scratch, ds4f_error *err) {
    const model_config *c = s->c;
    const block_weights *bw = &s->w->blocks[block];
    const int d = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    expert_source *src = s->experts;
    moe_buffers b;
    if (moe_buffers_get(c, n, &b, err) != 0) return -1;

    route(s, block, b_in, tokens, n, &b);
    for (int t = 0; t < n; t++) {
        const int32_t *ids = b.ids + (size_t)t * K;
        if (s->probe.routing) s->probe.routing(s->probe.ctx, block, first_pos + t, ids, b.weights + (size_t)t * K, K);
        if (src->routed) src->routed(src, block, first_pos + t, tokens[t], ids, K);
    }

    /* The chunk's distinct experts in ascending id, each with the (token, k) pairs routed to it. */
    memset(b.pair_start, 0, (size_t)(E + 1) * sizeof(int32_t));
    for (int i = 0; i < n * K; i++) b.pair_start[b.ids[i] + 1]++;
    for (int e = 0; e < E; e++) b.pair_start[e + 1] += b.pair_start[e];
    expert_request *req = b.req;
    req->block = block;
    req->n_tokens = n;
    req->n = 0;
    for (int e = 0; e < E; e++)
        if (b.pair_start[e + 1] > b.pair_start[e]) req->ids[req->n++] = e;
    memcpy(b.cursor, b.pair_start, (size_t)E * sizeof(int32_t));
    for (int i = 0; i < n * K; i++) b.pairs[b.cursor[b.ids[i]]++] = i;

    double io_start = time_now_seconds();
    if (src->begin(src, req, err) != 0) return -1;
    s->seconds_in_experts_wait += time_now_seconds() - io_start;

    par_quantize_fp8_act(b_in, d, d, n, b.x_codes, b.x_scales);
    run_shared_expert(c, bw, n, &b, out);

    /* Each round waits for one expert (holding none, as next() requires), takes every other one
     * already in RAM, and computes them: side by side, one thread each, when there are enough to
     * keep every thread busy; the rest one at a time with their rows split across threads. */
    const int threads = kernels_threads();
    int batch[EXPERT_REQUEST_MAX];
    int rc, index;
    for (;;) {
        io_start = time_now_seconds();
        rc = src->next(src, req, &index, err);
        s->seconds_in_experts_wait += time_now_seconds() - io_start;
        if (rc <= 0) break;
        int n_batch = 0;
        batch[n_batch++] = index;
        const int gather = threads > 1 && side_by_side(c, n);
        if (gather)
            while (n_batch < req->n && (rc = src->ready(src, req, &index, err)) == 1) batch[n_batch++] = index;
        if (rc < 0) break;
        const int together = gather ? n_batch - n_batch % threads : 0;
        if (together > 0) {
            side_by_side_job job = {c, &b, req, batch, n};
            kernels_parallel_for(side_by_side_task, &job, together);
        }
        for (int i = together; i < n_batch; i++) run_routed_expert(c, &b, &req->views[batch[i]], req->ids[batch[i]], n, &b.scratch);
        for (int i = 0; i < n_batch; i++) src->finish(src, req, batch[i]);
    }
    src->end(src, req);
    if (rc < 0) return -1;

    /* Step 4: ascending expert id per token (ids are sorted), then the shared expert. */
    combine_job combine = {c, b.expert_out, out};
    kernels_parallel_rows(combine_rows, &combine, n);
    (void)scratch;
    return 0;
}
