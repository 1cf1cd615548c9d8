/* ds4f logits: runs given tokens through the model with the reference schedule (prefill of the
 * first N tokens in one call, then one-token decode steps) and writes per-position outputs in the
 * layout of tests/data/golden/NAME/reference.safetensors, so anyone can compare an engine run
 * with the official outputs position by position. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/commands.h"
#include "base/file_io.h"
#include "ds4f.h"
#include "format/safetensors.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: ds4f logits -m DIR --tokens FILE --out OUT.safetensors [--prefill N] [--all] [--mtp]\n\n"
            "Reads {\"tokens\": [...], \"prefill\": N} (the format of tests/data/golden/*/tokens.json), runs a\n"
            "prefill of the first N tokens then one-token decode steps, and writes `logits` F32 [T, vocab]\n"
            "(row i given tokens 0..i).\n\n"
            "  -m DIR          checkpoint directory\n"
            "  --tokens FILE   token ids (JSON)\n"
            "  --out FILE      output safetensors file\n"
            "  --prefill N     prefill length (default: the file's \"prefill\", else all tokens)\n"
            "  --all           also final_hidden, hidden, expert_ids, expert_weights, indexer_selected,\n"
            "                  indexer_scores (names, dtypes and layouts of the golden references)\n"
            "  --mtp           also mtp_logits F32 [T-1, vocab]: row i from the main state at position i\n"
            "                  and token i+1, predicting token i+2\n");
}

typedef struct {
    int T, L, hc, d, k, topk, n4, entries;
    int indexer_layers[128];
    float *final_hidden;
    uint16_t *hidden;
    int32_t *expert_ids;
    float *expert_weights;
    int32_t *index_selected;
    uint16_t *index_scores;
} capture;

static void on_block(void *ctx, int layer, int64_t pos, const float *state) {
    capture *c = ctx;
    if (layer >= c->L || pos >= c->T) return;
    size_t n = (size_t)c->hc * c->d;
    uint16_t *dst = c->hidden + ((size_t)layer * c->T + (size_t)pos) * n;
    for (size_t i = 0; i < n; i++) dst[i] = f32_to_bf16(state[i]);
}

static void on_routing(void *ctx, int layer, int64_t pos, const int32_t *ids, const float *w, int k) {
    capture *c = ctx;
    if (layer >= c->L || pos >= c->T || k != c->k) return;
    size_t at = ((size_t)layer * c->T + (size_t)pos) * c->k;
    memcpy(c->expert_ids + at, ids, (size_t)k * sizeof *ids);
    memcpy(c->expert_weights + at, w, (size_t)k * sizeof *w);
}

static void on_indexer(void *ctx, int layer, int64_t pos, const float *scores, int n, const int32_t *sel, int k) {
    capture *c = ctx;
    int which = -1;
    for (int i = 0; i < c->n4; i++)
        if (c->indexer_layers[i] == layer) which = i;
    if (which < 0 || pos >= c->T) return;
    int32_t *dst = c->index_selected + ((size_t)which * c->T + (size_t)pos) * c->topk;
    for (int i = 0; i < k && i < c->topk; i++) dst[i] = sel[i];
    uint16_t *sc = c->index_scores + ((size_t)which * c->T + (size_t)pos) * c->entries;
    for (int i = 0; i < n && i < c->entries; i++) sc[i] = f32_to_bf16(scores[i]);
}

static void on_final(void *ctx, int64_t pos, const float *y) {
    capture *c = ctx;
    if (pos < c->T) memcpy(c->final_hidden + (size_t)pos * c->d, y, (size_t)c->d * sizeof *y);
}

/* {"tokens": [ids], "prefill": N}: every id an integer in [0, vocab). */
static int read_tokens(const char *path, int vocab, int32_t **tokens, int *count, int *prefill, ds4f_error *err) {
    char *text;
    if (file_read_all(path, &text, NULL, err)) return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *arr = root ? cJSON_GetObjectItemCaseSensitive(root, "tokens") : NULL;
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) == 0) {
        cJSON_Delete(root);
        return error_set(err, "%s: expected a JSON object with a non-empty \"tokens\" array", path);
    }
    int n = cJSON_GetArraySize(arr);
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    int i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!cJSON_IsNumber(e) || v != floor(v) || v < 0 || v >= vocab) {
            free(ids);
            cJSON_Delete(root);
            return error_set(err, "%s: tokens[%d] is not a token id in [0, %d)", path, i, vocab);
        }
        ids[i] = (int32_t)v;
    }
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prefill");
    *prefill = n;
    if (p) {
        if (!cJSON_IsNumber(p) || p->valuedouble != floor(p->valuedouble) || p->valuedouble < 1 || p->valuedouble > n) {
            free(ids);
            cJSON_Delete(root);
            return error_set(err, "%s: \"prefill\" must be an integer in [1, %d]", path, n);
        }
        *prefill = (int)p->valuedouble;
    }
    cJSON_Delete(root);
    *tokens = ids;
    *count = n;
    return 0;
}

int cmd_logits(int argc, char **argv) {
    const char *dir = NULL, *tokens_path = NULL, *out_path = NULL;
    int prefill_arg = 0, all = 0, mtp = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(a, "--tokens") && i + 1 < argc) tokens_path = argv[++i];
        else if (!strcmp(a, "--out") && i + 1 < argc) out_path = argv[++i];
        else if (!strcmp(a, "--prefill") && i + 1 < argc) prefill_arg = atoi(argv[++i]);
        else if (!strcmp(a, "--all")) all = 1;
        else if (!strcmp(a, "--mtp")) mtp = 1;
        else { fprintf(stderr, "ds4f logits: unknown or incomplete option '%s'\n\n", a); usage(stderr); return 2; }
    }
    if (!dir || !tokens_path || !out_path) { usage(stderr); return 2; }

    ds4f_error err = {{0}};
    ds4f_model_options mo;
    ds4f_model_options_init(&mo);
    mo.show_progress = 1;
    ds4f_model *model = NULL;
    if (ds4f_model_open(dir, &mo, &model, &err) != 0) { fprintf(stderr, "ds4f logits: %s\n", err.msg); return 1; }
    ds4f_model_info info;
    ds4f_model_get_info(model, &info);
    int32_t *tokens = NULL;
    int T = 0, prefill = 0, rc = 1;
    float *logits = NULL, *mtp_logits = NULL;
    capture cap = {0};
    ds4f_session *s = NULL;
    if (read_tokens(tokens_path, info.vocab_size, &tokens, &T, &prefill, &err) != 0) goto fail;
    if (prefill_arg) {
        if (prefill_arg < 1 || prefill_arg > T) { error_set(&err, "--prefill must be in [1, %d]", T); goto fail; }
        prefill = prefill_arg;
    }
    if (mtp && info.mtp_layers < 1) { error_set(&err, "--mtp: this model has no MTP block"); goto fail; }

    ds4f_session_options so;
    ds4f_session_options_init(&so);
    so.context = T;
    so.mtp = mtp;
    if (ds4f_session_create(model, &so, &s, &err) != 0) goto fail;
    logits = malloc((size_t)T * info.vocab_size * sizeof(float));
    if (mtp) mtp_logits = malloc((size_t)(T > 1 ? T - 1 : 1) * info.vocab_size * sizeof(float));
    if (!logits || (mtp && !mtp_logits)) { error_set(&err, "out of memory for %d x %d logits", T, info.vocab_size); goto fail; }
    if (all) {
        cap.T = T;
        cap.L = info.layers;
        cap.hc = info.hc_mult;
        cap.d = info.hidden_size;
        cap.k = info.experts_per_token;
        cap.topk = info.index_topk;
        cap.n4 = info.n_indexer_layers;
        cap.entries = T / 4;
        memcpy(cap.indexer_layers, info.indexer_layers, sizeof cap.indexer_layers);
        cap.final_hidden = calloc((size_t)T * cap.d, sizeof(float));
        cap.hidden = calloc((size_t)cap.L * T * cap.hc * cap.d, sizeof(uint16_t));
        cap.expert_ids = calloc((size_t)cap.L * T * cap.k, sizeof(int32_t));
        cap.expert_weights = calloc((size_t)cap.L * T * cap.k, sizeof(float));
        cap.index_selected = malloc(((size_t)cap.n4 * T * cap.topk + 1) * sizeof(int32_t));
        cap.index_scores = malloc(((size_t)cap.n4 * T * cap.entries + 1) * sizeof(uint16_t));
        if (!cap.final_hidden || !cap.hidden || !cap.expert_ids || !cap.expert_weights || !cap.index_selected ||
            !cap.index_scores) {
            error_set(&err, "out of memory for the --all outputs");
            goto fail;
        }
        for (size_t i = 0; i < (size_t)cap.n4 * T * cap.topk; i++) cap.index_selected[i] = -1;
        for (size_t i = 0; i < (size_t)cap.n4 * T * cap.entries; i++) cap.index_scores[i] = 0xff80; /* bf16 -inf */
        ds4f_observer obs = {&cap, on_block, on_routing, on_indexer, on_final};
        ds4f_session_set_observer(s, &obs);
    }

    /* The reference schedule: one prefill call, then one position per call. */
    if (ds4f_session_eval(s, tokens, prefill, logits, 1, &err) != 0) goto fail;
    if (mtp && ds4f_session_eval_mtp(s, tokens + 1, prefill < T ? prefill : T - 1, mtp_logits, &err) != 0) goto fail;
    for (int p = prefill; p < T; p++) {
        if (ds4f_session_eval(s, tokens + p, 1, logits + (size_t)p * info.vocab_size, 1, &err) != 0) goto fail;
        if (mtp && p + 1 < T &&
            ds4f_session_eval_mtp(s, tokens + p + 1, 1, mtp_logits + (size_t)p * info.vocab_size, &err) != 0)
            goto fail;
    }

    {
        int32_t *positions = malloc((size_t)T * sizeof *positions);
        for (int i = 0; i < T; i++) positions[i] = i;
        st_write_tensor t[16];
        size_t n = 0;
        t[n++] = (st_write_tensor){"tokens", DTYPE_I32, 1, {T}, tokens};
        t[n++] = (st_write_tensor){"logits", DTYPE_F32, 2, {T, info.vocab_size}, logits};
        if (all) {
            t[n++] = (st_write_tensor){"final_hidden", DTYPE_F32, 2, {T, cap.d}, cap.final_hidden};
            t[n++] = (st_write_tensor){"hidden", DTYPE_BF16, 4, {cap.L, T, cap.hc, cap.d}, cap.hidden};
            t[n++] = (st_write_tensor){"hidden_positions", DTYPE_I32, 1, {T}, positions};
            t[n++] = (st_write_tensor){"expert_ids", DTYPE_I32, 3, {cap.L, T, cap.k}, cap.expert_ids};
            t[n++] = (st_write_tensor){"expert_weights", DTYPE_F32, 3, {cap.L, T, cap.k}, cap.expert_weights};
            t[n++] = (st_write_tensor){"indexer_layers", DTYPE_I32, 1, {cap.n4}, cap.indexer_layers};
            t[n++] = (st_write_tensor){"indexer_selected", DTYPE_I32, 3, {cap.n4, T, cap.topk}, cap.index_selected};
            t[n++] = (st_write_tensor){"indexer_scores", DTYPE_BF16, 3, {cap.n4, T, cap.entries}, cap.index_scores};
        }
        if (mtp && T > 1) t[n++] = (st_write_tensor){"mtp_logits", DTYPE_F32, 2, {T - 1, info.vocab_size}, mtp_logits};
        char prefill_s[32], total_s[32];
        snprintf(prefill_s, sizeof prefill_s, "%d", prefill);
        snprintf(total_s, sizeof total_s, "%d", T);
        const char *meta[] = {"engine", "ds4f", "prefill", prefill_s, "total", total_s, "schedule",
                              "prefill tokens[0:prefill] in one call, then one-token decode steps", NULL};
        int wrc = st_write_file(out_path, t, n, meta, NULL, NULL, NULL, &err);
        free(positions);
        if (wrc != 0) goto fail;
    }
    fprintf(stderr, "ds4f logits: %d positions (prefill %d) -> %s\n", T, prefill, out_path);
    rc = 0;
fail:
    if (rc) fprintf(stderr, "ds4f logits: %s\n", err.msg);
    ds4f_session_free(s);
    ds4f_model_close(model);
    free(tokens);
    free(logits);
    free(mtp_logits);
    free(cap.final_hidden);
    free(cap.hidden);
    free(cap.expert_ids);
    free(cap.expert_weights);
    free(cap.index_selected);
    free(cap.index_scores);
    return rc;
}
