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

/* What a zero field of ds4f_model_options stands for. The chunk: 256 positions, so that a routed
 * expert streamed for a chunk serves about 6 of its tokens (256 experts, 6 per token) where 64
 * gave 1.5: on a 256-expert synth checkpoint under a 5 GB budget a 512-token prompt read 3.1x
 * less from disk and ran 2.4-2.9x faster than with 64. In RAM, where every expert is resident, 256
 * also prefills faster than 64 (4-layer full-width synth, bench/bench_model.sh --chunk: AMX 114-115
 * against 106-110 tokens/s, AVX-512 37-38 against 34-36); it costs about 0.16 GiB more scratch
 * per session. */
#define DS4F_DEFAULT_CONTEXT 4096
#define DS4F_DEFAULT_CHUNK 256
#define DS4F_DEFAULT_IO_THREADS 8

/* Routed experts stay on disk and are streamed into an expert cache in RAM (README, "##
 * Streaming"); everything else is loaded. Before allocating, ds4f_model_open makes a memory plan
 * for the whole process (resident weights, decode state for `sessions` sessions of `context`
 * positions, scratch, I/O, cache slots) and refuses with the numbers when it exceeds ram_bytes.
 * Zero values mean the defaults, so a zeroed struct is a sensible configuration. None of these
 * options changes a single logit (invariant 2), only speed and memory. */
typedef struct ds4f_model_options {
    int show_progress;        /* progress bars on stderr while loading (drawn only on a terminal) */
    uint64_t ram_bytes;       /* memory budget of the process; 0: 80% of the available memory
                                 (MemAvailable, or the cgroup limit when lower) */
    int context;              /* positions per session the plan reserves; 0: 4096 */
    int sessions;             /* sessions the plan reserves; 0: 1 */
    int chunk;                /* prefill chunk: positions per matrix product, the default of every
                                 session and what the plan reserves scratch for; 0: 256. Larger
                                 chunks read each weight (and each streamed expert) once for more
                                 tokens; speed and memory only */
    int cache_slots;          /* expert cache slots (one expert each); 0: as many as the budget
                                 allows, at most every expert */
    const char *experts_file; /* packed experts (`ds4f pack`); NULL: read the checkpoint's shards */
    int no_prefetch;          /* 1: no prefetch (hash-routed layers, next-layer router guesses) */
    int no_lookahead;         /* 1: hash-layer prefetch only, no router guesses */
    int buffered_io;          /* 1: read experts through the page cache instead of direct I/O */
    int io_threads;           /* expert reads in parallel; 0: 8 */
    const char *cache_policy; /* "nextuse" (default: decayed request counts and the layer cycle),
                                 "lfru" (decayed request counts) or "lru" */
    const char *trace_file;   /* record (position, token, layer, experts) for `ds4f replay` */
    const char *pin_trace;    /* pin the most requested experts of this trace for the whole run... */
    int pin_slots;            /* ...in this many slots; 0: a quarter of the cache */
    int print_plan;           /* print the memory plan on stderr */
    int resident_experts;     /* 1: read every expert into RAM at open instead (no cache) */
} ds4f_model_options;

void ds4f_model_options_init(ds4f_model_options *opt);
/* Opens the checkpoint directory (config.json, safetensors shards + index), checks every tensor,
 * makes the memory plan, loads the resident weights and creates the expert cache. */
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
    int chunk;             /* the prefill chunk sessions get by default */
    uint64_t resident_bytes, routed_expert_bytes;
} ds4f_model_info;

void ds4f_model_get_info(const ds4f_model *m, ds4f_model_info *info);

/* Expert streaming figures since the model was opened (or last reset). Prefetch arrays are
 * indexed 0: exact (hash-routed layers, known from the token id), 1: guesses (the next layer's
 * router applied early). A hit is an expert already in RAM when a layer asked for it. */
typedef struct ds4f_stream_stats {
    int streaming;                 /* 0: experts resident, the figures below are zero */
    int cache_slots, pinned_slots, total_experts;
    int direct_io, packed;
    uint64_t expert_bytes;         /* one routed expert */
    uint64_t expert_requests, hits, misses;
    uint64_t bytes_read;           /* by the engine, as issued (4 KiB-aligned ranges) */
    uint64_t demand_bytes;
    uint64_t prefetch_reads[2], prefetch_bytes[2];
    uint64_t prefetch_used[2];     /* prefetched experts that a layer then asked for */
    uint64_t prefetch_late[2];     /* ... still being read at that moment */
    uint64_t prefetch_wasted[2];   /* evicted or left unused */
    uint64_t prefetch_dropped;     /* hints not followed (no slot could be spared) */
    uint64_t evictions, read_failures;
    double seconds_waiting;        /* the forward pass blocked on expert reads */
    uint64_t plan_bytes, budget_bytes; /* the memory plan's total and its budget */
} ds4f_stream_stats;

void ds4f_model_get_stream_stats(ds4f_model *m, ds4f_stream_stats *st);
void ds4f_model_reset_stream_stats(ds4f_model *m);
/* The memory plan as printed by print_plan (valid while the model is open). */
const char *ds4f_model_plan_text(const ds4f_model *m);

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
    int chunk;     /* positions processed per matrix product during prefill; 0 (the default):
                      the model's chunk (ds4f_model_options.chunk) */
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

/* ---- Generation ---------------------------------------------------------------------------- *
 *
 * A generator owns one session and remembers the tokens it has consumed. ds4f_generate takes a
 * whole prompt (token ids, BOS and chat markers included) and evaluates only what the session
 * has not seen yet: when the prompt starts with every token consumed so far (the next turn of a
 * chat, or a client resending a conversation with one more message), only the new tokens are
 * prefilled. When the prompt diverges from them, the session restarts from position 0 and
 * replays the prompt: the decode state (sliding-window ring, compressors and indexer entries)
 * cannot be rewound cheaply, so reset-and-replay is the simple correct answer (counted in
 * ds4f_generator_stats.replays). A prompt that equals the consumed tokens exactly reuses the
 * logits kept from the last evaluation. After a generation the consumed tokens are the prompt and
 * every generated token but the last one sampled (nothing needed its logits yet): the next turn
 * sends the prompt, the whole answer (its EOS included) and the new tokens, and the last answer
 * token is evaluated with the new ones.
 *
 * Tokens are sampled with text/sampling.h's rules (temperature, top-k, top-p, min-p; greedy at
 * temperature 0) from a random sequence seeded by ds4f_sampling.seed: the same seed, prompt and
 * parameters give the same tokens. Each token is reported to on_token with the text that became
 * final with it: never a broken UTF-8 character, and never a part of the text that could still
 * turn out to be the start of a stop string (such text is held back and reported with a later
 * token, or dropped when the stop string completes). Stop tokens (EOS by default) end the
 * generation without being reported or evaluated.
 *
 * Cancellation: return nonzero from on_token or on_prefill (race-free, per request: the server
 * checks its client there), or call ds4f_generator_cancel from another thread or a signal
 * handler (Ctrl-C). Either way ds4f_generate returns 0 with finish DS4F_FINISH_CANCELLED and the
 * session keeps everything it evaluated, so the next prompt that extends it reuses it.
 *
 * One ds4f_generate at a time per generator; ds4f_generator_cancel may be called at any time. */

/* The tokenizer of a checkpoint (src/text/tokenizer.h has the full interface: encode, decode,
 * special-token lookup). */
typedef struct tokenizer ds4f_tokenizer;

/* Loads DIR/tokenizer.json; a missing file is an error that says so. */
int ds4f_tokenizer_open(const char *model_dir, ds4f_tokenizer **out, ds4f_error *err);
void ds4f_tokenizer_close(ds4f_tokenizer *tok);

typedef struct ds4f_sampling {
    float temperature; /* default 1.0 (DeepSeek's recommendation); 0: greedy */
    float top_p;       /* default 1.0 (off) */
    int top_k;         /* default 0 (off) */
    float min_p;       /* default 0 (off) */
    uint64_t seed;     /* default 0; same seed, same tokens */
} ds4f_sampling;

typedef enum ds4f_finish_reason {
    DS4F_FINISH_STOP,      /* a stop token (EOS) or a stop string */
    DS4F_FINISH_LENGTH,    /* max_tokens reached, or the context is full */
    DS4F_FINISH_CANCELLED, /* a callback returned nonzero, or ds4f_generator_cancel */
    DS4F_FINISH_ERROR,     /* the evaluation failed: ds4f_generate returned -1 */
} ds4f_finish_reason;

/* "stop", "length", "cancelled", "error". */
const char *ds4f_finish_reason_name(ds4f_finish_reason r);

typedef struct ds4f_token_event {
    int32_t id;         /* the sampled token; -1 for the final event that only hands over text
                           held back until the end */
    int index;          /* 0-based among the generated tokens of this call */
    const char *text;   /* the text that became final with this token (possibly empty; it may
                           include text of earlier tokens that was held back); not NUL-terminated,
                           may contain NUL bytes */
    size_t len;
    const float *logits; /* [vocab] the model's logits this token was sampled from; NULL in the
                            final event */
    int vocab;
} ds4f_token_event;

/* Pointers are valid during the call only. Return nonzero to cancel. */
typedef int (*ds4f_token_fn)(void *user, const ds4f_token_event *ev);
/* Called before the prompt's first chunk and after each evaluated chunk: done of total new
 * tokens. Return nonzero to cancel (keep-alive writes and client checks fit here). */
typedef int (*ds4f_prefill_fn)(void *user, int done, int total);

typedef struct ds4f_generate_params {
    ds4f_sampling sampling;
    int max_tokens;                /* tokens to generate at most (stop token included); <= 0:
                                      until the context is full. Default 0 */
    int stop_at_eos;               /* default 1: the model's EOS id is a stop token */
    const int32_t *stop_tokens;    /* more stop token ids */
    int n_stop_tokens;
    const char *const *stop_strings; /* UTF-8; the generated text ends before the first match */
    int n_stop_strings;
    ds4f_token_fn on_token;        /* may be NULL */
    ds4f_prefill_fn on_prefill;    /* may be NULL */
    void *user;
} ds4f_generate_params;

void ds4f_generate_params_init(ds4f_generate_params *p);

typedef struct ds4f_generate_result {
    ds4f_finish_reason finish;
    int32_t stop_token;       /* the stop token that ended it, else -1 */
    int stop_string;          /* index of the stop string that ended it, else -1 */
    int prompt_tokens;        /* length of the prompt */
    int cached_tokens;        /* prompt tokens the session had already consumed (not evaluated) */
    int prefill_tokens;       /* prompt tokens evaluated by this call */
    int generated_tokens;     /* tokens sampled, the stop token included */
    int decode_tokens;        /* generated tokens evaluated (fed back into the model) */
    int replayed;             /* 1 when the session restarted from 0 because the prompt diverged */
    double prefill_seconds;   /* evaluating the prompt */
    double decode_seconds;    /* from the first sampled token to the end */
} ds4f_generate_result;

typedef struct ds4f_generator ds4f_generator;

/* tok may be NULL: tokens are then reported without text, and stop strings are refused. The
 * tokenizer must outlive the generator. */
int ds4f_generator_create(ds4f_model *m, const ds4f_session_options *opt, const ds4f_tokenizer *tok,
                          ds4f_generator **out, ds4f_error *err);
void ds4f_generator_free(ds4f_generator *g);
/* Forgets the consumed tokens (the next prompt is evaluated from position 0). */
void ds4f_generator_reset(ds4f_generator *g);
/* Async-signal-safe: sets a flag the running ds4f_generate checks between chunks and tokens. A
 * ds4f_generate that starts later clears it. */
void ds4f_generator_cancel(ds4f_generator *g);

/* Returns 0 when the generation finished (stop, length or cancelled; see result->finish), -1 on
 * an error (invalid parameters, a prompt longer than the context, a failed evaluation: then the
 * session is reset). result may be NULL. */
int ds4f_generate(ds4f_generator *g, const int32_t *prompt, int n_prompt, const ds4f_generate_params *params,
                  ds4f_generate_result *result, ds4f_error *err);

/* The tokens the session has consumed (valid until the next call on the generator). */
const int32_t *ds4f_generator_tokens(const ds4f_generator *g, int *n);

typedef struct ds4f_generator_stats {
    int64_t position;          /* tokens in the session now */
    int context;               /* its maximum */
    int64_t requests;          /* ds4f_generate calls */
    int64_t prompt_evaluated;  /* prompt tokens evaluated, all calls */
    int64_t prompt_reused;     /* prompt tokens taken from the session instead */
    int64_t generated;         /* tokens sampled */
    int64_t decoded;           /* sampled tokens evaluated (fed back into the model) */
    int64_t replays;           /* restarts from 0 because a prompt diverged */
    double prefill_seconds, decode_seconds;
} ds4f_generator_stats;

void ds4f_generator_get_stats(const ds4f_generator *g, ds4f_generator_stats *st);

#ifdef __cplusplus
}
#endif
#endif
