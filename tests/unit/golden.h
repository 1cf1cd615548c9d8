/* Golden-reference comparison (tests/data/golden/README.md, "How to compare"). */
#ifndef DS4F_TEST_GOLDEN_H
#define DS4F_TEST_GOLDEN_H

#include <stdint.h>

#include "format/safetensors.h"
#include "model/expert_source.h"
#include "nn/session.h"

typedef struct golden_tolerances {
    double logits_rel_l2, logits_rel_l2_median, final_hidden_rel_l2, expert_weights_abs, indexer_scores_rel;
    double hidden_rel_l2[64], hidden_rel_l2_median[64];
    double hidden_local_rel_l2[64], hidden_local_rel_l2_median[64];
    int has_local;
} golden_tolerances;

/* Everything the reference file holds, plus what the engine produced for the same tokens. */
typedef struct golden_run {
    const char *name;
    char name_buf[64];
    int T, P, L, hc, d, vocab, k, n4, topk, Ts, entries4;
    int32_t *tokens;
    golden_tolerances tol;
    /* reference */
    float *ref_logits, *ref_final, *ref_hidden, *ref_expert_w, *ref_index_scores;
    int32_t *ref_expert_ids, *ref_index_sel, *hidden_positions, *index_layers;
    /* engine */
    float *logits, *final, *hidden, *expert_w, *index_scores;
    int32_t *expert_ids, *index_sel;
    int *hidden_slot; /* position -> row in hidden arrays, or -1 */
} golden_run;

/* Loads a reference.safetensors and allocates the engine arrays. */
int golden_load_reference(golden_run *g, const char *path, char *msg, size_t msg_size);
/* Fills the engine arrays from a `ds4f logits --all` output file. */
int golden_load_engine_file(golden_run *g, const char *path, char *msg, size_t msg_size);
/* Loads tests/data/golden/NAME (checkpoint, tokens, reference). */
int golden_load(golden_run *g, const char *name, model_weights *w, expert_source **experts, char *msg, size_t msg_size);
void golden_free(golden_run *g);
/* Probe that records into g's engine arrays. */
nn_probe golden_probe(golden_run *g);
/* Runs the reference schedule (prefill P, then one-token decode steps). */
int golden_run_schedule(golden_run *g, nn_session *s, ds4f_error *err);

/* Where check failures go: the unit tests turn them into CHECK failures, the CLI checker prints. */
typedef struct golden_report {
    void *ctx;
    void (*fail)(void *ctx, const char *file, int line, const char *msg);
    void (*note)(void *ctx, const char *fmt, ...);
    int failures;
} golden_report;
void golden_report_fail(golden_report *r, const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
#define REPORT(r, cond, ...)                                                          \
    do {                                                                              \
        if (!(cond)) golden_report_fail((r), __FILE__, __LINE__, __VA_ARGS__);          \
    } while (0)

/* Every check of the README's "How to compare" on the engine arrays of g (top-1, expert and
 * indexer decisions, expert weights, indexer scores, logits, final_hidden, hidden states). */
void golden_check_all(const golden_run *g, golden_report *r);
/* Per-layer hidden-state check of `engine` [L][Ts][hc][d] against the reference. */
void golden_check_hidden(const golden_run *g, const float *engine, const double *tol, const double *tol_median,
                         const char *what, golden_report *r);

double rel_l2(const float *a, const float *b, int n);
double median(const double *v, int n);

#endif
