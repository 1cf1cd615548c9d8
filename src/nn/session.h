/* The forward pass of one sequence: per-layer decode state (spec §4), scratch for a chunk of
 * tokens, and the probe through which numerics checks observe intermediate values.
 *
 * Tokens are processed in chunks of up to max_chunk positions. Within a chunk every projection
 * is one matrix product over the chunk's tokens; the stateful parts (window ring, compressors,
 * indexer, attention) then advance token by token in position order, which is what makes any
 * split into chunks (prefill, decode, both) compute the same numbers. */
#ifndef DS4F_NN_SESSION_H
#define DS4F_NN_SESSION_H

#include "model/expert_source.h"
#include "nn/numerics.h"

/* Observer of intermediate values, for `ds4f logits --all` and the golden tests. Any callback may
 * be NULL. Values are the f32 forms of what the official code holds (bf16-valued where bf16). */
typedef struct nn_probe {
    void *ctx;
    /* HC state [hc][d] after block `block` at position pos. */
    void (*block_output)(void *ctx, int block, int64_t pos, const float *state);
    /* Routed experts of block at pos, sorted by id, with their routing weights. */
    void (*routing)(void *ctx, int block, int64_t pos, const int32_t *ids, const float *weights, int k);
    /* Indexer scores over the n visible compressed entries, and the selected entries ascending. */
    void (*indexer)(void *ctx, int block, int64_t pos, const float *scores, int n, const int32_t *selected, int k);
    /* Input of the LM head (after hc_head and the final norm) [d]. */
    void (*final_hidden)(void *ctx, int64_t pos, const float *y);
} nn_probe;

typedef struct compressor_state {
    int ratio, dim, overlap;
    float *kv_rows, *score_rows; /* [coff*ratio][coff*dim]: f32 rows of the current (and previous) window */
    uint16_t *entries;           /* [capacity][dim] bf16 compressed entries */
    int n_entries, capacity;
} compressor_state;

typedef struct block_state {
    uint16_t *window;            /* [sliding_window][head_dim] bf16 ring: position p at slot p % window */
    compressor_state compressor; /* ratio != 0 */
    compressor_state indexer;    /* ratio == 4: the indexer's key entries */
} block_state;

typedef struct nn_session {
    const model_weights *w;
    const model_config *c;
    expert_source *experts;
    int max_context, max_chunk;
    int64_t position;           /* next position to process */
    block_state *blocks;
    rope_table rope_plain;      /* ratio-0 layers: rope_theta, no YaRN */
    rope_table rope_compressed; /* ratio-4/128 layers: compress_rope_theta with YaRN */
    nn_probe probe;
    /* scratch (one chunk) */
    uint8_t *scratch;
    size_t scratch_bytes;
    int scratch_threads;        /* threads the scratch has per-thread work space for */
    float *last_hidden;         /* [max_chunk][hc][d]: the chunk's HC states through the blocks */
    /* MTP: the final main states of the last nn_forward call (when keep_states), the block's
     * own position, and its input buffer. */
    int keep_states, kept_capacity, kept_count;
    float *kept_states;         /* [kept_capacity][hc][d] */
    int64_t mtp_position;
    float *mtp_states;          /* [max_chunk][hc][d] */
    /* statistics */
    double seconds_in_experts_wait;
} nn_session;

/* Bytes of the scratch arena a session of max_chunk positions per call and max_context positions
 * allocates with the current thread count (the memory plan forecasts sessions with it). */
size_t nn_session_scratch_bytes(const model_config *c, int max_chunk, int max_context);

int nn_session_create(const model_weights *w, expert_source *experts, int max_context, int max_chunk,
                      nn_session **out, ds4f_error *err);
void nn_session_free(nn_session *s);
/* Makes nn_forward keep the final main states of its last call (up to capacity positions), which
 * the MTP block consumes. */
int nn_session_keep_states(nn_session *s, int capacity, ds4f_error *err);
/* Forgets the sequence (position 0, empty state). */
void nn_session_reset(nn_session *s);

/* Runs tokens[0..n) at positions position..position+n-1 (any n; split into chunks internally).
 * logits: NULL, or [n][vocab] when all_logits, or [vocab] for the last token only. */
int nn_forward(nn_session *s, const int32_t *tokens, int n, float *logits, int all_logits, ds4f_error *err);

/* Runs one block alone over n positions starting at first_pos, on given input HC states
 * [n][hc][d] (in place: they become the block's output). Advances that block's state only (the
 * layer-local golden check runs blocks this way). */
int nn_block_forward(nn_session *s, int block, float *states, const int32_t *tokens, int n, int64_t first_pos,
                     ds4f_error *err);

/* The MTP block (spec §3.8): main final states [n][hc][d] of consecutive positions starting at
 * s->mtp_position, each paired with the token that follows it; logits [n][vocab] (or NULL). */
int nn_mtp_forward(nn_session *s, const float *main_states, const int32_t *next_tokens, int n, float *logits,
                   ds4f_error *err);

/* The LM head on HC states [n][hc][d]: hc_head collapse, final norm, logits [n][vocab]. */
void nn_head(nn_session *s, const float *states, int n, int64_t first_pos, float *logits);

#endif
