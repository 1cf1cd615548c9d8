#include "golden.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file_io.h"

double rel_l2(const float *a, const float *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        double diff = (double)a[i] - (double)b[i];
        num += diff * diff;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double median(const double *v, int n) {
    double *copy = malloc((size_t)n * sizeof *copy);
    memcpy(copy, v, (size_t)n * sizeof *copy);
    qsort(copy, (size_t)n, sizeof *copy, compare_doubles);
    double m = n % 2 ? copy[n / 2] : 0.5 * (copy[n / 2 - 1] + copy[n / 2]);
    free(copy);
    return m;
}

static void *read_tensor(st_file *f, const char *name, dtype want, char *msg, size_t msg_size) {
    const st_tensor *t = st_find(f, name);
    if (!t || t->dtype != want) {
        snprintf(msg, msg_size, "reference lacks %s", name);
        return NULL;
    }
    void *buf = malloc(t->bytes);
    ds4f_error err;
    if (st_read(f, t, buf, &err) != 0) {
        snprintf(msg, msg_size, "%s", err.msg);
        free(buf);
        return NULL;
    }
    return buf;
}

static float *bf16_tensor_to_f32(st_file *f, const char *name, size_t *count, char *msg, size_t msg_size) {
    const st_tensor *t = st_find(f, name);
    uint16_t *raw = read_tensor(f, name, DTYPE_BF16, msg, msg_size);
    if (!raw) return NULL;
    size_t n = t->bytes / 2;
    float *out = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) out[i] = bf16_to_f32(raw[i]);
    free(raw);
    if (count) *count = n;
    return out;
}

static void parse_array(const cJSON *arr, double *dst, int max) {
    for (int i = 0; i < cJSON_GetArraySize(arr) && i < max; i++) dst[i] = cJSON_GetArrayItem(arr, i)->valuedouble;
}

int golden_load(golden_run *g, const char *name, model_weights *w, expert_source **experts, char *msg, size_t msg_size) {
    memset(g, 0, sizeof *g);
    g->name = name;
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "tests/data/golden/%s", name);
    ds4f_error err;
    model_load_options opt = {0};
    if (model_weights_load(w, dir, &opt, &err) != 0 || expert_source_resident_create(w, 0, experts, &err) != 0) {
        snprintf(msg, msg_size, "%s", err.msg);
        return -1;
    }
    const model_config *c = &w->config;
    g->L = c->num_hidden_layers;
    g->hc = c->hc_mult;
    g->d = c->hidden_size;
    g->vocab = c->vocab_size;
    g->k = c->num_experts_per_tok;
    g->topk = c->index_topk;

    st_file ref;
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    if (st_open(&ref, path, &err) != 0) {
        snprintf(msg, msg_size, "%s", err.msg);
        return -1;
    }
    const st_tensor *tok = st_find(&ref, "tokens");
    g->T = tok ? (int)tok->shape[0] : 0;
    g->tokens = read_tensor(&ref, "tokens", DTYPE_I32, msg, msg_size);
    g->P = atoi(st_metadata(&ref, "prefill") ? st_metadata(&ref, "prefill") : "0");
    g->ref_logits = read_tensor(&ref, "logits", DTYPE_F32, msg, msg_size);
    g->ref_final = read_tensor(&ref, "final_hidden", DTYPE_F32, msg, msg_size);
    g->ref_hidden = bf16_tensor_to_f32(&ref, "hidden", NULL, msg, msg_size);
    g->hidden_positions = read_tensor(&ref, "hidden_positions", DTYPE_I32, msg, msg_size);
    g->Ts = (int)st_find(&ref, "hidden_positions")->shape[0];
    g->ref_expert_ids = read_tensor(&ref, "expert_ids", DTYPE_I32, msg, msg_size);
    g->ref_expert_w = read_tensor(&ref, "expert_weights", DTYPE_F32, msg, msg_size);
    g->index_layers = read_tensor(&ref, "indexer_layers", DTYPE_I32, msg, msg_size);
    g->n4 = (int)st_find(&ref, "indexer_layers")->shape[0];
    g->ref_index_sel = read_tensor(&ref, "indexer_selected", DTYPE_I32, msg, msg_size);
    g->ref_index_scores = bf16_tensor_to_f32(&ref, "indexer_scores", NULL, msg, msg_size);
    g->entries4 = (int)st_find(&ref, "indexer_scores")->shape[2];
    const char *tol = st_metadata(&ref, "tolerances");
    cJSON *tj = tol ? cJSON_Parse(tol) : NULL;
    if (!tj) {
        snprintf(msg, msg_size, "reference has no tolerances");
        st_close(&ref);
        return -1;
    }
#define NUM(key) cJSON_GetObjectItem(tj, key) ? cJSON_GetObjectItem(tj, key)->valuedouble : 0
    g->tol.logits_rel_l2 = NUM("logits_rel_l2");
    g->tol.logits_rel_l2_median = NUM("logits_rel_l2_median");
    g->tol.final_hidden_rel_l2 = NUM("final_hidden_rel_l2");
    g->tol.expert_weights_abs = NUM("expert_weights_abs");
    g->tol.indexer_scores_rel = NUM("indexer_scores_rel");
#undef NUM
    parse_array(cJSON_GetObjectItem(tj, "hidden_rel_l2"), g->tol.hidden_rel_l2, 64);
    parse_array(cJSON_GetObjectItem(tj, "hidden_rel_l2_median"), g->tol.hidden_rel_l2_median, 64);
    if (cJSON_GetObjectItem(tj, "hidden_local_rel_l2")) {
        g->tol.has_local = 1;
        parse_array(cJSON_GetObjectItem(tj, "hidden_local_rel_l2"), g->tol.hidden_local_rel_l2, 64);
        parse_array(cJSON_GetObjectItem(tj, "hidden_local_rel_l2_median"), g->tol.hidden_local_rel_l2_median, 64);
    }
    cJSON_Delete(tj);
    st_close(&ref);
    if (!g->tokens || !g->ref_logits || !g->ref_hidden || !g->ref_expert_ids || !g->ref_index_sel) return -1;

    const size_t T = (size_t)g->T;
    g->logits = calloc(T * g->vocab, sizeof(float));
    g->final = calloc(T * g->d, sizeof(float));
    g->hidden = calloc((size_t)g->L * g->Ts * g->hc * g->d, sizeof(float));
    g->expert_ids = calloc((size_t)g->L * T * g->k, sizeof(int32_t));
    g->expert_w = calloc((size_t)g->L * T * g->k, sizeof(float));
    g->index_sel = malloc((size_t)g->n4 * T * g->topk * sizeof(int32_t));
    for (size_t i = 0; i < (size_t)g->n4 * T * g->topk; i++) g->index_sel[i] = -1;
    g->index_scores = malloc((size_t)g->n4 * T * g->entries4 * sizeof(float));
    for (size_t i = 0; i < (size_t)g->n4 * T * g->entries4; i++) g->index_scores[i] = -INFINITY;
    g->hidden_slot = malloc(T * sizeof(int));
    for (size_t i = 0; i < T; i++) g->hidden_slot[i] = -1;
    for (int i = 0; i < g->Ts; i++) g->hidden_slot[g->hidden_positions[i]] = i;
    return 0;
}

void golden_free(golden_run *g) {
    free(g->tokens); free(g->ref_logits); free(g->ref_final); free(g->ref_hidden); free(g->ref_expert_w);
    free(g->ref_index_scores); free(g->ref_expert_ids); free(g->ref_index_sel); free(g->hidden_positions);
    free(g->index_layers); free(g->logits); free(g->final); free(g->hidden); free(g->expert_w);
    free(g->index_scores); free(g->expert_ids); free(g->index_sel); free(g->hidden_slot);
}

static void on_block(void *ctx, int block, int64_t pos, const float *state) {
    golden_run *g = ctx;
    if (block >= g->L || pos >= g->T || g->hidden_slot[pos] < 0) return;
    size_t n = (size_t)g->hc * g->d;
    memcpy(g->hidden + ((size_t)block * g->Ts + g->hidden_slot[pos]) * n, state, n * sizeof(float));
}

static void on_routing(void *ctx, int block, int64_t pos, const int32_t *ids, const float *weights, int k) {
    golden_run *g = ctx;
    if (block >= g->L || pos >= g->T) return;
    size_t at = ((size_t)block * g->T + pos) * g->k;
    memcpy(g->expert_ids + at, ids, (size_t)k * sizeof(int32_t));
    memcpy(g->expert_w + at, weights, (size_t)k * sizeof(float));
}

static void on_indexer(void *ctx, int block, int64_t pos, const float *scores, int n, const int32_t *selected, int k) {
    golden_run *g = ctx;
    int which = -1;
    for (int i = 0; i < g->n4; i++)
        if (g->index_layers[i] == block) which = i;
    if (which < 0 || pos >= g->T) return;
    size_t sel_at = ((size_t)which * g->T + pos) * g->topk;
    for (int i = 0; i < k && i < g->topk; i++) g->index_sel[sel_at + i] = selected[i];
    size_t sc_at = ((size_t)which * g->T + pos) * g->entries4;
    for (int i = 0; i < n && i < g->entries4; i++) g->index_scores[sc_at + i] = scores[i];
}

static void on_final(void *ctx, int64_t pos, const float *y) {
    golden_run *g = ctx;
    if (pos < g->T) memcpy(g->final + (size_t)pos * g->d, y, (size_t)g->d * sizeof(float));
}

nn_probe golden_probe(golden_run *g) {
    nn_probe p = {g, on_block, on_routing, on_indexer, on_final};
    return p;
}

int golden_run_schedule(golden_run *g, nn_session *s, ds4f_error *err) {
    if (nn_forward(s, g->tokens, g->P, g->logits, 1, err) != 0) return -1;
    for (int p = g->P; p < g->T; p++)
        if (nn_forward(s, g->tokens + p, 1, g->logits + (size_t)p * g->vocab, 1, err) != 0) return -1;
    return 0;
}
