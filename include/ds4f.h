/* ds4f — DeepSeek-V4-Flash on an ordinary computer.
 *
 * The narrow public interface: open a checkpoint, create a session (one sequence with its decode
 * state), feed tokens, read logits. The CLI and the HTTP server use only this header.
 *
 * Numerics follow the official DeepSeek-V4 inference code (current revision): the logits of a
 * position do not depend on how the sequence was split into calls, on the thread count, or on
 * where the weights live. */
#ifndef DS4F_H
#define DS4F_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every fallible call returns 0 on success, -1 on failure with one sentence in msg. */
typedef struct ds4f_error {
    char msg[1024];
} ds4f_error;

typedef struct ds4f_model ds4f_model;
typedef struct ds4f_session ds4f_session;

typedef struct ds4f_model_options {
    int show_progress; /* progress bars on stderr while loading (drawn only on a terminal) */
} ds4f_model_options;

void ds4f_model_options_init(ds4f_model_options *opt);
/* Opens the checkpoint directory (config.json, safetensors shards + index), checks every tensor,
 * loads the resident weights. */
int ds4f_model_open(const char *dir, const ds4f_model_options *opt, ds4f_model **out, ds4f_error *err);
void ds4f_model_close(ds4f_model *m);

typedef struct ds4f_model_info {
    int vocab_size;
    int hidden_size;
    int layers;            /* main blocks */
    int mtp_layers;        /* 0 or 1 */
    int hc_mult;           /* residual streams per position */
    int experts_per_token;
    int routed_experts;
    int index_topk;
    int n_indexer_layers;  /* layers with compress ratio 4, ascending */
    int indexer_layers[128];
    int bos_token_id, eos_token_id;
    long long max_position;
    uint64_t resident_bytes, routed_expert_bytes;
} ds4f_model_info;

void ds4f_model_get_info(const ds4f_model *m, ds4f_model_info *info);

/* Observer of intermediate values (numerics checks: `ds4f logits --all`). Any callback may be
 * NULL; pointers are valid during the call only. */
typedef struct ds4f_observer {
    void *ctx;
    /* HC state [hc_mult][hidden] after block `layer` at position pos. */
    void (*block_output)(void *ctx, int layer, int64_t pos, const float *state);
    /* Routed experts of a layer at pos, ascending ids, with their routing weights. */
    void (*routing)(void *ctx, int layer, int64_t pos, const int32_t *ids, const float *weights, int k);
    /* Indexer scores of the n visible compressed entries, and the chosen entries ascending. */
    void (*indexer)(void *ctx, int layer, int64_t pos, const float *scores, int n, const int32_t *selected, int k);
    /* The LM head's input [hidden] (after the HC collapse and the final norm). */
    void (*final_hidden)(void *ctx, int64_t pos, const float *hidden);
} ds4f_observer;

typedef struct ds4f_session_options {
    int context;   /* maximum positions; default 4096 */
    int chunk;     /* positions processed per matrix product during prefill; default 64 */
    int mtp;       /* keep what the MTP block needs (see ds4f_session_eval_mtp); default 0 */
} ds4f_session_options;

void ds4f_session_options_init(ds4f_session_options *opt);
int ds4f_session_create(ds4f_model *m, const ds4f_session_options *opt, ds4f_session **out, ds4f_error *err);
void ds4f_session_free(ds4f_session *s);
/* Forgets the sequence. */
void ds4f_session_reset(ds4f_session *s);
int64_t ds4f_session_position(const ds4f_session *s);
void ds4f_session_set_observer(ds4f_session *s, const ds4f_observer *observer);

/* Feeds tokens[0..n) at the next n positions. logits: NULL, or [vocab] floats for the last
 * position, or [n][vocab] when all_positions is set. */
int ds4f_session_eval(ds4f_session *s, const int32_t *tokens, int n, float *logits, int all_positions,
                      ds4f_error *err);

/* The MTP (next-next token) block, with the pairing of the DeepSeek-V3 report: the main model's
 * final state at position p combined with the embedding of token p+1 predicts token p+2. Call it
 * after ds4f_session_eval, once per evaluated position in order: next_tokens[i] is the token that
 * follows the i-th position of the last eval call. Requires the session option mtp. */
int ds4f_session_eval_mtp(ds4f_session *s, const int32_t *next_tokens, int n, float *logits, ds4f_error *err);

#ifdef __cplusplus
}
#endif
#endif
