#include "golden.h"

#include <cJSON.h>
#include <stdarg.h>
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

int golden_load_reference(golden_run *g, const char *path, char *msg, size_t msg_size) {
    memset(g, 0, sizeof *g);
    ds4f_error err;
    st_file ref;
    if (st_open(&ref, path, &err) != 0) {
        snprintf(msg, msg_size, "%s", err.msg);
        return -1;
    }
    const st_tensor *tok = st_find(&ref, "tokens"), *hid = st_find(&ref, "hidden"), *exp = st_find(&ref, "expert_ids");
    const st_tensor *sel = st_find(&ref, "indexer_selected"), *sc = st_find(&ref, "indexer_scores");
    const st_tensor *lg = st_find(&ref, "logits");
    if (!tok || !hid || !exp || !sel || !sc || !lg || hid->ndim != 4 || exp->ndim != 3 || sel->ndim != 3 || sc->ndim != 3) {
        snprintf(msg, msg_size, "%s: not a golden reference file", path);
        st_close(&ref);
        return -1;
    }
    g->T = (int)tok->shape[0];
    g->L = (int)hid->shape[0];
    g->hc = (int)hid->shape[2];
    g->d = (int)hid->shape[3];
    g->vocab = (int)lg->shape[1];
    g->k = (int)exp->shape[2];
    g->topk = (int)sel->shape[2];
    g->entries4 = (int)sc->shape[2];
    g->tokens = read_tensor(&ref, "tokens", DTYPE_I32, msg, msg_size);
    g->P = atoi(st_metadata(&ref, "prefill") ? st_metadata(&ref, "prefill") : "0");
    g->ref_logits = read_tensor(&ref, "logits", DTYPE_F32, msg, msg_size);
    g->ref_final = read_tensor(&ref, "final_hidden", DTYPE_F32, msg, msg_size);
    g->ref_hidden = bf16_tensor_to_f32(&ref, "hidden", NULL, msg, msg_size);
    g->hidden_positions = read_tensor(&ref, "hidden_positions", DTYPE_I32, msg, msg_size);
    g->Ts = (int)hid->shape[1];
    g->ref_expert_ids = read_tensor(&ref, "expert_ids", DTYPE_I32, msg, msg_size);
    g->ref_expert_w = read_tensor(&ref, "expert_weights", DTYPE_F32, msg, msg_size);
    g->index_layers = read_tensor(&ref, "indexer_layers", DTYPE_I32, msg, msg_size);
    g->n4 = (int)st_find(&ref, "indexer_layers")->shape[0];
    g->ref_index_sel = read_tensor(&ref, "indexer_selected", DTYPE_I32, msg, msg_size);
    g->ref_index_scores = bf16_tensor_to_f32(&ref, "indexer_scores", NULL, msg, msg_size);
    const char *tol = st_metadata(&ref, "tolerances");
    const char *case_name = st_metadata(&ref, "case");
    snprintf(g->name_buf, sizeof g->name_buf, "%s", case_name ? case_name : "golden");
    g->name = g->name_buf;
    cJSON *tj = tol ? cJSON_Parse(tol) : NULL;
    if (!tj) {
        snprintf(msg, msg_size, "%s: reference has no tolerances", path);
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
    if (!g->tokens || !g->ref_logits || !g->ref_final || !g->ref_hidden || !g->hidden_positions || !g->ref_expert_ids ||
        !g->ref_expert_w || !g->index_layers || !g->ref_index_sel || !g->ref_index_scores)
        return -1;

    const size_t T = (size_t)g->T;
    g->logits = calloc(T * g->vocab, sizeof(float));
    g->final = calloc(T * g->d, sizeof(float));
    g->hidden = calloc((size_t)g->L * g->Ts * g->hc * g->d, sizeof(float));
    g->expert_ids = calloc((size_t)g->L * T * g->k, sizeof(int32_t));
    g->expert_w = calloc((size_t)g->L * T * g->k, sizeof(float));
    g->index_sel = malloc(((size_t)g->n4 * T * g->topk + 1) * sizeof(int32_t));
    for (size_t i = 0; i < (size_t)g->n4 * T * g->topk; i++) g->index_sel[i] = -1;
    g->index_scores = malloc(((size_t)g->n4 * T * g->entries4 + 1) * sizeof(float));
    for (size_t i = 0; i < (size_t)g->n4 * T * g->entries4; i++) g->index_scores[i] = -INFINITY;
    g->hidden_slot = malloc(T * sizeof(int));
    for (size_t i = 0; i < T; i++) g->hidden_slot[i] = -1;
    for (int i = 0; i < g->Ts; i++) g->hidden_slot[g->hidden_positions[i]] = i;
    return 0;
}

int golden_load(golden_run *g, const char *name, model_weights *w, expert_source **experts, char *msg, size_t msg_size) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "tests/data/golden/%s", name);
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    if (golden_load_reference(g, path, msg, msg_size) != 0) return -1;
    ds4f_error err;
    model_load_options opt = {0};
    if (model_weights_load(w, dir, &opt, &err) != 0 || expert_source_resident_create(w, 0, experts, &err) != 0) {
        snprintf(msg, msg_size, "%s", err.msg);
        return -1;
    }
    if (w->config.num_hidden_layers != g->L || w->config.hidden_size != g->d || w->config.vocab_size != g->vocab) {
        snprintf(msg, msg_size, "%s: reference and checkpoint disagree on the dimensions", dir);
        return -1;
    }
    return 0;
}

/* An engine output file written by `ds4f logits --all` (every position stored). */
int golden_load_engine_file(golden_run *g, const char *path, char *msg, size_t msg_size) {
    ds4f_error err;
    st_file f;
    if (st_open(&f, path, &err) != 0) {
        snprintf(msg, msg_size, "%s", err.msg);
        return -1;
    }
    const size_t T = (size_t)g->T;
    struct { const char *name; dtype t; size_t count; void *dst; } want[] = {
        {"logits", DTYPE_F32, T * g->vocab, g->logits},
        {"final_hidden", DTYPE_F32, T * g->d, g->final},
        {"expert_ids", DTYPE_I32, (size_t)g->L * T * g->k, g->expert_ids},
        {"expert_weights", DTYPE_F32, (size_t)g->L * T * g->k, g->expert_w},
        {"indexer_selected", DTYPE_I32, (size_t)g->n4 * T * g->topk, g->index_sel},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0] && rc == 0; i++) {
        const st_tensor *t = st_find(&f, want[i].name);
        if (!t || t->dtype != want[i].t || st_element_count(t) != want[i].count) {
            snprintf(msg, msg_size, "%s: tensor %s missing or of the wrong shape", path, want[i].name);
            rc = -1;
        } else if (st_read(&f, t, want[i].dst, &err) != 0) {
            snprintf(msg, msg_size, "%s", err.msg);
            rc = -1;
        }
    }
    size_t n_hidden = 0, n_scores = 0;
    float *hidden = rc == 0 ? bf16_tensor_to_f32(&f, "hidden", &n_hidden, msg, msg_size) : NULL;
    float *scores = rc == 0 ? bf16_tensor_to_f32(&f, "indexer_scores", &n_scores, msg, msg_size) : NULL;
    const size_t state = (size_t)g->hc * g->d;
    if (rc == 0 && (!hidden || n_hidden != (size_t)g->L * T * state || !scores || n_scores != (size_t)g->n4 * T * g->entries4)) {
        snprintf(msg, msg_size, "%s: hidden or indexer_scores missing or of the wrong shape", path);
        rc = -1;
    }
    if (rc == 0) {
        for (int l = 0; l < g->L; l++)
            for (int i = 0; i < g->Ts; i++)
                memcpy(g->hidden + ((size_t)l * g->Ts + i) * state, hidden + ((size_t)l * T + g->hidden_positions[i]) * state,
                       state * sizeof(float));
        memcpy(g->index_scores, scores, n_scores * sizeof(float));
    }
    free(hidden);
    free(scores);
    st_close(&f);
    return rc;
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

void golden_report_fail(golden_report *r, const char *file, int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->failures++;
    r->fail(r->ctx, file, line, msg);
}

static void check_top1(const golden_run *g, golden_report *r) {
    int bad = 0, first = -1;
    for (int i = 0; i < g->T; i++) {
        const float *a = g->logits + (size_t)i * g->vocab, *b = g->ref_logits + (size_t)i * g->vocab;
        int ia = 0, ib = 0;
        for (int v = 1; v < g->vocab; v++) {
            if (a[v] > a[ia]) ia = v;
            if (b[v] > b[ib]) ib = v;
        }
        if (ia != ib && bad++ == 0) first = i;
    }
    REPORT(r, bad == 0, "%s: top-1 differs at %d positions, first at position %d", g->name, bad, first);
}

static void check_decisions(const golden_run *g, golden_report *r) {
    int bad = 0, first_pos = -1, first_layer = -1;
    for (int pos = 0; pos < g->T; pos++)
        for (int l = 0; l < g->L; l++) {
            const int32_t *a = g->expert_ids + ((size_t)l * g->T + pos) * g->k;
            const int32_t *b = g->ref_expert_ids + ((size_t)l * g->T + pos) * g->k;
            if (memcmp(a, b, (size_t)g->k * sizeof(int32_t)) && bad++ == 0) { first_pos = pos; first_layer = l; }
        }
    REPORT(r, bad == 0, "%s: expert sets differ at %d (layer, position) pairs, first at position %d layer %d", g->name, bad,
          first_pos, first_layer);
    double max_w = 0;
    for (size_t i = 0; i < (size_t)g->L * g->T * g->k; i++) max_w = fmax(max_w, fabs(g->expert_w[i] - g->ref_expert_w[i]));
    REPORT(r, max_w <= g->tol.expert_weights_abs, "%s: expert weights max abs diff %.3g > %.3g", g->name, max_w,
          g->tol.expert_weights_abs);

    bad = 0;
    for (int pos = 0; pos < g->T; pos++)
        for (int w = 0; w < g->n4; w++) {
            const int32_t *a = g->index_sel + ((size_t)w * g->T + pos) * g->topk;
            const int32_t *b = g->ref_index_sel + ((size_t)w * g->T + pos) * g->topk;
            if (memcmp(a, b, (size_t)g->topk * sizeof(int32_t)) && bad++ == 0) { first_pos = pos; first_layer = g->index_layers[w]; }
        }
    REPORT(r, bad == 0, "%s: indexer selections differ at %d pairs, first at position %d layer %d", g->name, bad, first_pos,
          first_layer);
    double worst = 0;
    for (int w = 0; w < g->n4; w++)
        for (int pos = 0; pos < g->T; pos++) {
            const float *a = g->index_scores + ((size_t)w * g->T + pos) * g->entries4;
            const float *b = g->ref_index_scores + ((size_t)w * g->T + pos) * g->entries4;
            double row_max = 0, diff = 0;
            for (int e = 0; e < (pos + 1) / 4 && e < g->entries4; e++) {
                row_max = fmax(row_max, fabs(b[e]));
                diff = fmax(diff, fabs((double)a[e] - b[e]));
            }
            if (row_max > 0) worst = fmax(worst, diff / row_max);
        }
    REPORT(r, worst <= g->tol.indexer_scores_rel, "%s: indexer scores max diff / row max %.3g > %.3g", g->name, worst,
          g->tol.indexer_scores_rel);
    r->note(r->ctx, "    %s: expert weights max abs %.2e (tol %.2e), indexer scores rel %.3f (tol %.2f)\n", g->name, max_w,
           g->tol.expert_weights_abs, worst, g->tol.indexer_scores_rel);
}

static void check_logits(const golden_run *g, golden_report *r) {
    double *rel = malloc((size_t)g->T * sizeof(double)), worst = 0;
    int first_bad = -1;
    for (int i = 0; i < g->T; i++) {
        rel[i] = rel_l2(g->logits + (size_t)i * g->vocab, g->ref_logits + (size_t)i * g->vocab, g->vocab);
        if (rel[i] > worst) worst = rel[i];
        if (rel[i] > g->tol.logits_rel_l2 && first_bad < 0) first_bad = i;
    }
    double med = median(rel, g->T);
    REPORT(r, first_bad < 0, "%s: logits rel L2 %.3g > %.3g first at position %d (max %.3g)", g->name,
          first_bad >= 0 ? rel_l2(g->logits + (size_t)first_bad * g->vocab, g->ref_logits + (size_t)first_bad * g->vocab, g->vocab) : 0,
          g->tol.logits_rel_l2, first_bad, worst);
    REPORT(r, med <= g->tol.logits_rel_l2_median, "%s: logits rel L2 median %.3g > %.3g", g->name, med, g->tol.logits_rel_l2_median);
    r->note(r->ctx, "    %s: logits rel L2 median %.2e max %.2e (tol %.2e / %.2e)\n", g->name, med, worst,
           g->tol.logits_rel_l2_median, g->tol.logits_rel_l2);
    double fworst = 0;
    for (int i = 0; i < g->T; i++)
        fworst = fmax(fworst, rel_l2(g->final + (size_t)i * g->d, g->ref_final + (size_t)i * g->d, g->d));
    REPORT(r, fworst <= g->tol.final_hidden_rel_l2, "%s: final_hidden rel L2 %.3g > %.3g", g->name, fworst, g->tol.final_hidden_rel_l2);
    free(rel);
}

/* Per layer and stored position: relative L2 of the whole HC state. Reports the first (position,
 * then layer) over tolerance, and each layer's median against its median tolerance. */
void golden_check_hidden(const golden_run *g, const float *engine, const double *tol, const double *tol_median,
                         const char *what, golden_report *r) {
    const size_t n = (size_t)g->hc * g->d;
    double *rel = malloc((size_t)g->L * g->Ts * sizeof(double));
    for (int l = 0; l < g->L; l++)
        for (int i = 0; i < g->Ts; i++)
            rel[(size_t)l * g->Ts + i] = rel_l2(engine + ((size_t)l * g->Ts + i) * n, g->ref_hidden + ((size_t)l * g->Ts + i) * n, (int)n);
    int found = 0;
    for (int i = 0; i < g->Ts && !found; i++)
        for (int l = 0; l < g->L && !found; l++)
            if (rel[(size_t)l * g->Ts + i] > tol[l]) {
                found = 1;
                REPORT(r, 0, "%s %s: first divergence at position %d layer %d: rel L2 %.3g > %.3g", g->name, what,
                      g->hidden_positions[i], l, rel[(size_t)l * g->Ts + i], tol[l]);
            }
    r->note(r->ctx, "    %s %s medians:", g->name, what);
    for (int l = 0; l < g->L; l++) {
        double worst = 0;
        for (int i = 0; i < g->Ts; i++) worst = fmax(worst, rel[(size_t)l * g->Ts + i]);
        int exact = 0;
        for (int i = 0; i < g->Ts; i++) exact += rel[(size_t)l * g->Ts + i] == 0;
        double med = median(rel + (size_t)l * g->Ts, g->Ts);
        r->note(r->ctx, " L%d %.1e/%.1e (max %.1e, %d%% bitwise equal)", l, med, tol_median[l], worst, 100 * exact / g->Ts);
        REPORT(r, med <= tol_median[l], "%s %s: layer %d median rel L2 %.3g > %.3g", g->name, what, l, med, tol_median[l]);
    }
    r->note(r->ctx, "\n");
    free(rel);
}


void golden_check_all(const golden_run *g, golden_report *r) {
    check_top1(g, r);
    check_decisions(g, r);
    check_logits(g, r);
    golden_check_hidden(g, g->hidden, g->tol.hidden_rel_l2, g->tol.hidden_rel_l2_median, "hidden", r);
}
