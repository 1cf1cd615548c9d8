/* Synthetic checkpoints (model/synth.h): the tiny preset binds completely, is deterministic in the
 * seed, carries a working tokenizer, and computes sanely: finite logits with a spread, bounded
 * hyper-connection states through every layer, router decisions with margins.
 *
 * DS4F_SYNTH_CHECK_DIR=DIR additionally runs the same health measurements on an existing
 * checkpoint (for example `ds4f synth --preset full`), over DS4F_SYNTH_CHECK_TOKENS tokens
 * (default 2), and prints them. */
#include "test.h"

#include <cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file_io.h"
#include "model/checkpoint.h"
#include "model/synth.h"
#include "model/weights.h"
#include "nn/layers.h"
#include "nn/numerics.h"
#include "text/tokenizer.h"

#define SYNTH_TEST_ROOT "build/test_synth"

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char path[4096];
        path_join(path, sizeof path, dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(path);
        else unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static int synth_tiny(const char *dir, uint64_t seed, uint64_t max_shard_bytes, synth_result *res, ds4f_error *err) {
    synth_options opt;
    synth_options_init(&opt);
    opt.preset = SYNTH_PRESET_TINY;
    opt.seed = seed;
    opt.max_shard_bytes = max_shard_bytes;
    remove_tree(dir);
    return synth_write(dir, &opt, res, err);
}

static int files_equal(const char *a, const char *b) {
    char *x, *y;
    size_t nx, ny;
    ds4f_error err;
    if (file_read_all(a, &x, &nx, &err) != 0) return -1;
    if (file_read_all(b, &y, &ny, &err) != 0) { free(x); return -1; }
    int eq = nx == ny && !memcmp(x, y, nx);
    free(x);
    free(y);
    return eq;
}

TEST(synth_config_presets_validate) {
    static const synth_preset all[] = {SYNTH_PRESET_TINY, SYNTH_PRESET_SMALL, SYNTH_PRESET_FULL};
    for (int i = 0; i < 3; i++) {
        synth_options opt;
        synth_options_init(&opt);
        opt.preset = all[i];
        char *json;
        ds4f_error err;
        REQUIRE(synth_config_json(&opt, &json, &err) == 0, "%s", err.msg);
        model_config c;
        CHECK(config_parse(&c, json, "synth", &err) == 0, "preset %d: %s", i, err.msg);
        CHECK(c.num_nextn_predict_layers == 1 && c.compress_ratios[c.num_hidden_layers] == 0, "MTP block present");
        CHECK(c.num_hash_layers == (c.num_hidden_layers < 3 ? c.num_hidden_layers : 3), "hash layers");
        CHECK(c.vocab_size >= synth_tokenizer_natural_size(), "vocab covers the tokenizer");
        if (all[i] == SYNTH_PRESET_FULL) {
            /* The real dimensions, except the number of routed experts. */
            model_config real;
            REQUIRE(config_load(&real, "tests/data/configs/deepseek-v4-flash.json", &err) == 0, "%s", err.msg);
            CHECK(c.n_routed_experts == 8, "full defaults to 8 experts, got %d", c.n_routed_experts);
            c.n_routed_experts = real.n_routed_experts;
            CHECK(!memcmp(&c, &real, sizeof c), "full preset differs from the real config beyond the expert count");
        }
        free(json);
    }
    /* Overrides: layers regenerate the ratio pattern; too few experts are refused. */
    synth_options opt;
    synth_options_init(&opt);
    opt.preset = SYNTH_PRESET_FULL;
    opt.layers = 2;
    opt.experts = 32;
    char *json;
    ds4f_error err;
    REQUIRE(synth_config_json(&opt, &json, &err) == 0, "%s", err.msg);
    model_config c;
    REQUIRE(config_parse(&c, json, "synth", &err) == 0, "%s", err.msg);
    CHECK(c.num_hidden_layers == 2 && c.num_hash_layers == 2 && c.n_routed_experts == 32, "overrides applied");
    CHECK(c.compress_ratios[0] == 0 && c.compress_ratios[1] == 0 && c.compress_ratios[2] == 0, "ratios for 2 layers");
    free(json);
    opt.experts = 5;
    CHECK(synth_config_json(&opt, &json, &err) != 0 && strstr(err.msg, "--experts"), "5 experts refused: %s", err.msg);
    opt.experts = 0;
    opt.layers = 200;
    CHECK(synth_config_json(&opt, &json, &err) != 0 && strstr(err.msg, "--layers"), "200 layers refused: %s", err.msg);
}

TEST(synth_tiny_binds_and_is_deterministic) {
    ds4f_error err;
    synth_result ra, rb, rc, rd;
    const char *a = SYNTH_TEST_ROOT "/seed1", *b = SYNTH_TEST_ROOT "/seed1_again", *c = SYNTH_TEST_ROOT "/seed2",
               *d = SYNTH_TEST_ROOT "/seed1_sharded";
    REQUIRE(dir_create(SYNTH_TEST_ROOT, &err) == 0, "%s", err.msg);
    REQUIRE(synth_tiny(a, 1, 0, &ra, &err) == 0, "%s", err.msg);
    REQUIRE(synth_tiny(b, 1, 0, &rb, &err) == 0, "%s", err.msg);
    REQUIRE(synth_tiny(c, 2, 0, &rc, &err) == 0, "%s", err.msg);
    REQUIRE(synth_tiny(d, 1, 2u << 20, &rd, &err) == 0, "%s", err.msg);

    checkpoint ck;
    REQUIRE(checkpoint_open(&ck, a, &err) == 0, "%s", err.msg);
    CHECK(ck.n_problems == 0, "%zu binding problems", ck.n_problems);
    CHECK(ck.n_shards == 1 && ra.shards == 1, "tiny fits one shard");
    CHECK(ra.tensors == ck.expected.count, "wrote %zu tensors, the config implies %zu", ra.tensors, ck.expected.count);
    inventory inv;
    checkpoint_inventory(&ck, &inv);
    CHECK(inv.bytes == ra.bytes, "total bytes");

    /* Value ranges the formats forbid or the model must not see. */
    const model_config *cfg = &ck.config;
    for (size_t i = 0; i < ck.expected.count; i++) {
        const tensor_spec *s = &ck.expected.specs[i];
        uint64_t bytes = tensor_spec_bytes(s);
        uint8_t *data = malloc(bytes);
        REQUIRE(data, "out of memory");
        REQUIRE(checkpoint_read(&ck, i, data, &err) == 0, "%s", err.msg);
        size_t bad = 0;
        if (s->dtype == DTYPE_F8_E4M3) {
            for (uint64_t k = 0; k < bytes; k++) bad += (data[k] & 0x7f) == 0x7f;
        } else if (s->dtype == DTYPE_F8_E8M0) {
            for (uint64_t k = 0; k < bytes; k++) bad += data[k] == 255 || data[k] == 0;
        } else if (s->dtype == DTYPE_BF16) {
            for (uint64_t k = 0; k < bytes / 2; k++) bad += !isfinite(bf16_to_f32(((uint16_t *)data)[k]));
        } else if (s->dtype == DTYPE_F32) {
            for (uint64_t k = 0; k < bytes / 4; k++) bad += !isfinite(((float *)data)[k]);
        } else if (s->dtype == DTYPE_I64) {
            const int64_t *ids = (const int64_t *)data;
            for (int64_t row = 0; row < s->shape[0]; row++)
                for (int j = 0; j < s->shape[1]; j++) {
                    int64_t v = ids[row * s->shape[1] + j];
                    int dup = 0;
                    for (int k = 0; k < j; k++) dup |= ids[row * s->shape[1] + k] == v;
                    bad += v < 0 || v >= cfg->n_routed_experts || dup;
                }
        }
        CHECK(bad == 0, "%s: %zu invalid values", s->name, bad);
        free(data);
    }
    checkpoint_close(&ck);

    /* Same seed, same bytes (whatever the shard split); another seed, other values. */
    const char *files[] = {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json",
                           "model-00001-of-00001.safetensors"};
    for (int i = 0; i < 5; i++) {
        char pa[4096], pb[4096], pc[4096];
        path_join(pa, sizeof pa, a, files[i]);
        path_join(pb, sizeof pb, b, files[i]);
        path_join(pc, sizeof pc, c, files[i]);
        CHECK(files_equal(pa, pb) == 1, "%s differs between two runs with the same seed", files[i]);
        int same = files_equal(pa, pc);
        if (i == 4) CHECK(same == 0, "the shard does not depend on the seed");
        else CHECK(same == 1, "%s should not depend on the seed", files[i]);
    }

    /* Several shards: the index routes every tensor, and the values are those of the one-shard run. */
    CHECK(rd.shards > 2, "2 MB shards: got %d", rd.shards);
    checkpoint one, many;
    REQUIRE(checkpoint_open(&one, a, &err) == 0, "%s", err.msg);
    REQUIRE(checkpoint_open(&many, d, &err) == 0, "%s", err.msg);
    CHECK(many.n_shards == (size_t)rd.shards && many.n_problems == 0, "sharded checkpoint binds");
    for (size_t i = 0; i < one.expected.count; i += 7) {
        uint64_t bytes = tensor_spec_bytes(&one.expected.specs[i]);
        uint8_t *x = malloc(bytes), *y = malloc(bytes);
        REQUIRE(x && y, "out of memory");
        CHECK(checkpoint_read(&one, i, x, &err) == 0 && checkpoint_read(&many, i, y, &err) == 0 && !memcmp(x, y, bytes),
              "%s differs between the one-shard and the sharded run", one.expected.specs[i].name);
        free(x);
        free(y);
    }
    checkpoint_close(&one);
    checkpoint_close(&many);

    /* A second run into the same directory with another shard count leaves no stale shards. */
    char stale_name[64], stale[4096];
    snprintf(stale_name, sizeof stale_name, "model-00001-of-%05d.safetensors", rd.shards);
    path_join(stale, sizeof stale, d, stale_name);
    CHECK(access(stale, F_OK) == 0, "%s exists before the rewrite", stale_name);
    REQUIRE(synth_write(d, &(synth_options){.preset = SYNTH_PRESET_TINY, .seed = 1}, &rd, &err) == 0, "%s", err.msg);
    CHECK(access(stale, F_OK) != 0, "stale shard removed");
    CHECK(checkpoint_open(&many, d, &err) == 0, "rewritten checkpoint binds: %s", err.msg);
    checkpoint_close(&many);

    remove_tree(a);
    remove_tree(b);
    remove_tree(c);
    remove_tree(d);
    rmdir(SYNTH_TEST_ROOT);
}

/* Values depend on the element index only: any split of a chunk among threads gives the same
 * bytes (tiny's embedding, head and wq_b are big enough to be split). */
TEST(synth_values_do_not_depend_on_threads) {
    ds4f_error err;
    const char *a = SYNTH_TEST_ROOT "/threads1", *b = SYNTH_TEST_ROOT "/threads3";
    REQUIRE(dir_create(SYNTH_TEST_ROOT, &err) == 0, "%s", err.msg);
    synth_options opt;
    synth_options_init(&opt);
    opt.preset = SYNTH_PRESET_TINY;
    opt.threads = 1;
    synth_result res;
    remove_tree(a);
    remove_tree(b);
    REQUIRE(synth_write(a, &opt, &res, &err) == 0, "%s", err.msg);
    /* Also: a temporary shard left by an interrupted run is cleaned up. */
    REQUIRE(dir_create(b, &err) == 0, "%s", err.msg);
    char leftover[4096];
    path_join(leftover, sizeof leftover, b, "model-00001-of-00001.safetensors.tmp12345");
    REQUIRE(file_write_all(leftover, "x", 1, &err) == 0, "%s", err.msg);
    opt.threads = 3;
    REQUIRE(synth_write(b, &opt, &res, &err) == 0, "%s", err.msg);
    CHECK(access(leftover, F_OK) != 0, "temporary file of an interrupted run is removed");
    char pa[4096], pb[4096];
    path_join(pa, sizeof pa, a, "model-00001-of-00001.safetensors");
    path_join(pb, sizeof pb, b, "model-00001-of-00001.safetensors");
    CHECK(files_equal(pa, pb) == 1, "1 and 3 generation threads give different bytes");
    remove_tree(a);
    remove_tree(b);
    rmdir(SYNTH_TEST_ROOT);
}

TEST(synth_tokenizer_loads_and_round_trips) {
    ds4f_error err;
    const char *dir = SYNTH_TEST_ROOT "/tokenizer";
    synth_result res;
    REQUIRE(dir_create(SYNTH_TEST_ROOT, &err) == 0, "%s", err.msg);
    REQUIRE(synth_tiny(dir, 0, 0, &res, &err) == 0, "%s", err.msg);
    char path[4096];
    path_join(path, sizeof path, dir, "tokenizer.json");
    tokenizer *tok;
    REQUIRE(tokenizer_load(path, &tok, &err) == 0, "%s", err.msg);
    model_config c;
    char cpath[4096];
    path_join(cpath, sizeof cpath, dir, "config.json");
    REQUIRE(config_load(&c, cpath, &err) == 0, "%s", err.msg);
    CHECK(tokenizer_vocab_size(tok) == c.vocab_size, "tokenizer has %d ids, config vocab %d", tokenizer_vocab_size(tok),
          c.vocab_size);
    CHECK(tokenizer_token_id(tok, "<｜begin▁of▁sentence｜>") == c.bos_token_id && c.bos_token_id == 0, "BOS id 0");
    CHECK(tokenizer_token_id(tok, "<｜end▁of▁sentence｜>") == c.eos_token_id && c.eos_token_id == 1, "EOS id 1");
    static const char *const markers[] = {"<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜",
                                          "<｜latest_reminder｜>", "<｜tool▁calls▁begin｜>", "<｜end▁of▁sentence｜>"};
    for (size_t i = 0; i < sizeof markers / sizeof markers[0]; i++) {
        int32_t id = tokenizer_token_id(tok, markers[i]);
        CHECK(id >= 0, "%s missing", markers[i]);
        int32_t *ids;
        size_t n;
        REQUIRE(tokenizer_encode(tok, markers[i], strlen(markers[i]), &ids, &n, &err) == 0, "%s", err.msg);
        CHECK(n == 1 && ids[0] == id, "%s encodes to one id", markers[i]);
        free(ids);
    }

    static const char *const texts[] = {
        "The library opens its doors every morning, and the children come in after school.",
        "<｜User｜>Why would anyone keep a small library?<｜Assistant｜><think>Because</think> it matters.",
        "Numbers 1234567, symbols #$%&, unicode: naïve café, 漢字かな, emoji \xF0\x9F\x99\x82\n\ttabs  and  spaces",
        "\xff\xfe invalid UTF-8 \xc3 bytes",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *ids;
        size_t n;
        char *back;
        size_t back_len;
        REQUIRE(tokenizer_encode(tok, texts[i], strlen(texts[i]), &ids, &n, &err) == 0, "%s", err.msg);
        REQUIRE(tokenizer_decode(tok, ids, n, &back, &back_len, &err) == 0, "%s", err.msg);
        CHECK(back_len == strlen(texts[i]) && !memcmp(back, texts[i], back_len), "text %zu does not round-trip", i);
        if (i == 0) CHECK(n * 3 < strlen(texts[i]), "English is merged: %zu ids for %zu bytes", n, strlen(texts[i]));
        free(ids);
        free(back);
    }
    /* Every id decodes (filler words included). */
    for (int32_t id = 0; id < tokenizer_vocab_size(tok); id++) {
        size_t len;
        CHECK(tokenizer_token_bytes(tok, id, &len) && len > 0, "id %d has no bytes", id);
    }
    tokenizer_free(tok);

    /* The pre-processing sections are those of the official file. */
    char *ours, *real;
    REQUIRE(file_read_all(path, &ours, NULL, &err) == 0, "%s", err.msg);
    REQUIRE(file_read_all("tests/data/tokenizer/tokenizer.json", &real, NULL, &err) == 0, "%s", err.msg);
    cJSON *a = cJSON_Parse(ours), *b = cJSON_Parse(real);
    REQUIRE(a && b, "tokenizer JSON parses");
    static const char *const sections[] = {"normalizer", "pre_tokenizer", "post_processor", "decoder"};
    for (int i = 0; i < 4; i++)
        CHECK(cJSON_Compare(cJSON_GetObjectItem(a, sections[i]), cJSON_GetObjectItem(b, sections[i]), 1),
              "%s differs from the official tokenizer.json", sections[i]);
    /* Added tokens: the official strings and flags. */
    const cJSON *ra = cJSON_GetObjectItem(b, "added_tokens"), *oa = cJSON_GetObjectItem(a, "added_tokens");
    int matched = 0;
    for (const cJSON *o = oa->child; o; o = o->next) {
        const char *content = cJSON_GetObjectItem(o, "content")->valuestring;
        for (const cJSON *r = ra->child; r; r = r->next)
            if (!strcmp(cJSON_GetObjectItem(r, "content")->valuestring, content)) {
                matched++;
                CHECK(cJSON_Compare(cJSON_GetObjectItem(o, "special"), cJSON_GetObjectItem(r, "special"), 1) &&
                          cJSON_Compare(cJSON_GetObjectItem(o, "normalized"), cJSON_GetObjectItem(r, "normalized"), 1),
                      "%s: flags differ from the official file", content);
            }
    }
    CHECK(matched == cJSON_GetArraySize(oa), "%d of %d added tokens are official ones", matched, cJSON_GetArraySize(oa));
    cJSON_Delete(a);
    cJSON_Delete(b);
    free(ours);
    free(real);
    remove_tree(dir);
    rmdir(SYNTH_TEST_ROOT);
}

/* ---- model health ---- */

typedef struct health {
    const model_weights *w;
    int n_blocks, hc, d, n_pos;
    float *states;          /* [n_blocks][n_pos][hc][d] */
    double max_stream_rms;  /* over blocks, positions, streams */
    double min_stream_rms;
    double block_rms[CONFIG_MAX_LAYERS]; /* max over positions */
    int expert_used[CONFIG_MAX_LAYERS][256];
} health;

static void health_block_output(void *ctx, int block, int64_t pos, const float *state) {
    health *h = ctx;
    if (block >= h->n_blocks || pos >= h->n_pos) return;
    memcpy(h->states + (((size_t)block * h->n_pos + (size_t)pos) * h->hc) * h->d, state,
           (size_t)h->hc * h->d * sizeof(float));
    for (int s = 0; s < h->hc; s++) {
        double sq = 0;
        for (int i = 0; i < h->d; i++) sq += (double)state[s * h->d + i] * state[s * h->d + i];
        double rms = sqrt(sq / h->d);
        if (rms > h->max_stream_rms) h->max_stream_rms = rms;
        if (rms < h->min_stream_rms) h->min_stream_rms = rms;
        if (rms > h->block_rms[block]) h->block_rms[block] = rms;
    }
}

static void health_routing(void *ctx, int block, int64_t pos, const int32_t *ids, const float *weights, int k) {
    health *h = ctx;
    for (int i = 0; i < k; i++)
        if (ids[i] >= 0 && ids[i] < 256) h->expert_used[block][ids[i]] = 1;
}

static int compare_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}
static int compare_asc_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct health_summary {
    int finite;
    double logit_std_min, logit_std_max, logit_std_median;
    double perplexity_median; /* exp(entropy) of the softmax */
    int distinct_top1;
    double max_stream_rms, min_stream_rms;
    int n_margins;
    double margin_min, margin_median, margin_small_fraction; /* below 0.01 */
    int experts_used_min; /* over score-routed main layers */
} health_summary;

/* Runs n tokens and measures. The router margin is measured on the router's real input
 * distribution, approximated: the next block's ffn hc_pre and norm applied to this block's
 * output (the probe does not expose the state between attention and MoE). */
static int measure_health(const char *dir, const int32_t *tokens, int n, health_summary *out, ds4f_error *err) {
    memset(out, 0, sizeof *out);
    model_weights w;
    model_load_options lo = {0};
    if (model_weights_load(&w, dir, &lo, err) != 0) return -1;
    expert_source *src;
    if (expert_source_resident_create(&w, 0, &src, err) != 0) { model_weights_free(&w); return -1; }
    nn_session *s;
    if (nn_session_create(&w, src, n + 8, 64, &s, err) != 0) {
        src->destroy(src);
        model_weights_free(&w);
        return -1;
    }
    const model_config *c = &w.config;
    health h = {.w = &w, .n_blocks = c->num_hidden_layers, .hc = c->hc_mult, .d = c->hidden_size, .n_pos = n,
                .min_stream_rms = 1e30};
    h.states = malloc((size_t)h.n_blocks * n * h.hc * h.d * sizeof(float));
    float *logits = malloc((size_t)n * c->vocab_size * sizeof(float));
    int rc = -1;
    if (!h.states || !logits) { error_set(err, "out of memory"); goto done; }
    s->probe = (nn_probe){.ctx = &h, .block_output = health_block_output, .routing = health_routing};
    if (nn_forward(s, tokens, n, logits, 1, err) != 0) goto done;

    const int V = c->vocab_size;
    double *stds = malloc((size_t)n * sizeof(double)), *ppl = malloc((size_t)n * sizeof(double));
    int *top1 = malloc((size_t)n * sizeof(int));
    out->finite = 1;
    for (int p = 0; p < n; p++) {
        const float *l = logits + (size_t)p * V;
        double sum = 0, sq = 0, mx = -1e30;
        int arg = 0;
        for (int v = 0; v < V; v++) {
            if (!isfinite(l[v])) out->finite = 0;
            sum += l[v];
            sq += (double)l[v] * l[v];
            if (l[v] > mx) { mx = l[v]; arg = v; }
        }
        double mean = sum / V;
        stds[p] = sqrt(sq / V - mean * mean);
        double z = 0, el = 0;
        for (int v = 0; v < V; v++) {
            double e = exp(l[v] - mx);
            z += e;
            el += e * (l[v] - mx);
        }
        ppl[p] = exp(log(z) - el / z);
        top1[p] = arg;
    }
    qsort(stds, (size_t)n, sizeof *stds, compare_asc_double);
    qsort(ppl, (size_t)n, sizeof *ppl, compare_asc_double);
    out->logit_std_min = stds[0];
    out->logit_std_max = stds[n - 1];
    out->logit_std_median = stds[n / 2];
    out->perplexity_median = ppl[n / 2];
    for (int p = 0; p < n; p++) {
        int seen = 0;
        for (int q = 0; q < p; q++) seen |= top1[q] == top1[p];
        out->distinct_top1 += !seen;
    }
    free(stds);
    free(ppl);
    free(top1);
    out->max_stream_rms = h.max_stream_rms;
    out->min_stream_rms = h.min_stream_rms;

    /* Router margins of the score-routed main blocks (block b's input = block b-1's output). */
    const int d = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
    float *u = malloc((size_t)d * sizeof(float)), *b = malloc((size_t)d * sizeof(float));
    float *scores = malloc((size_t)E * sizeof(float));
    double *margins = malloc((size_t)c->num_hidden_layers * n * sizeof(double));
    out->experts_used_min = E;
    for (int blk = c->num_hash_layers > 1 ? c->num_hash_layers : 1; blk < c->num_hidden_layers; blk++) {
        const block_weights *bw = &w.blocks[blk];
        int used = 0;
        for (int e = 0; e < E && e < 256; e++) used += h.expert_used[blk][e];
        if (used < out->experts_used_min) out->experts_used_min = used;
        if (E <= K) continue;
        for (int p = 0; p < n; p++) {
            const float *state = h.states + (((size_t)(blk - 1) * n + p) * h.hc) * d;
            float post[16], comb[256];
            hc_pre(c, &bw->hc_ffn_fn, bw->hc_ffn_scale, bw->hc_ffn_base, state, u, post, comb);
            rmsnorm_bf16(u, bw->ffn_norm, d, c->rms_norm_eps, b);
            for (int e = 0; e < E; e++) {
                double acc = 0;
                size_t step; /* the loader stores the router in MATRIX_GROUPS16 */
                const uint16_t *row = bw->gate.values + matrix_row_origin(bw->gate.layout, E, d, e, &step);
                for (int i = 0; i < d; i++) acc += (double)bf16_to_f32(row[(size_t)i * step]) * b[i];
                scores[e] = sqrtf(softplus_f32((float)acc)) + bw->gate_bias[e];
            }
            qsort(scores, (size_t)E, sizeof *scores, compare_desc);
            margins[out->n_margins++] = scores[K - 1] - scores[K];
        }
    }
    if (out->n_margins) {
        qsort(margins, (size_t)out->n_margins, sizeof *margins, compare_asc_double);
        out->margin_min = margins[0];
        out->margin_median = margins[out->n_margins / 2];
        int small = 0;
        for (int i = 0; i < out->n_margins; i++) small += margins[i] < 0.01;
        out->margin_small_fraction = (double)small / out->n_margins;
    }
    free(u);
    free(b);
    free(scores);
    free(margins);
    rc = 0;
done:
    free(h.states);
    free(logits);
    nn_session_free(s);
    src->destroy(src);
    model_weights_free(&w);
    return rc;
}

static void print_health(const char *what, const health_summary *hs) {
    printf("    %s: logits finite %d, std min/median/max %.2f/%.2f/%.2f, perplexity median %.1f, %d distinct top-1;\n"
           "    HC stream RMS %.3f..%.3f; router margin (6th-7th biased score) min %.4f median %.3f, %.1f%% below 0.01 "
           "(%d samples); experts used per layer >= %d\n",
           what, hs->finite, hs->logit_std_min, hs->logit_std_median, hs->logit_std_max, hs->perplexity_median,
           hs->distinct_top1, hs->min_stream_rms, hs->max_stream_rms, hs->margin_min, hs->margin_median,
           100 * hs->margin_small_fraction, hs->n_margins, hs->experts_used_min);
}

TEST(synth_tiny_forward_is_healthy) {
    ds4f_error err;
    const char *dir = SYNTH_TEST_ROOT "/forward";
    synth_result res;
    REQUIRE(dir_create(SYNTH_TEST_ROOT, &err) == 0, "%s", err.msg);
    REQUIRE(synth_tiny(dir, 7, 0, &res, &err) == 0, "%s", err.msg);
    /* 64 tokens of English, starting with BOS. */
    char path[4096];
    path_join(path, sizeof path, dir, "tokenizer.json");
    tokenizer *tok;
    REQUIRE(tokenizer_load(path, &tok, &err) == 0, "%s", err.msg);
    const char *text =
        "Every morning the caretaker opens the library, and the first visitors read the newspapers while the rain "
        "falls on the tall windows. Later the children arrive from school to borrow stories and do their homework, "
        "and the librarian reads aloud to the younger ones until their parents come.";
    int32_t *ids;
    size_t n_ids;
    REQUIRE(tokenizer_encode(tok, text, strlen(text), &ids, &n_ids, &err) == 0, "%s", err.msg);
    tokenizer_free(tok);
    const int n = 64;
    REQUIRE(n_ids >= (size_t)n - 1, "text gives only %zu tokens", n_ids);
    int32_t tokens[64];
    tokens[0] = 0;
    memcpy(tokens + 1, ids, (n - 1) * sizeof *tokens);
    free(ids);

    health_summary hs;
    REQUIRE(measure_health(dir, tokens, n, &hs, &err) == 0, "%s", err.msg);
    if (getenv("DS4F_TEST_VERBOSE")) print_health("tiny", &hs);
    CHECK(hs.finite, "non-finite logits");
    CHECK(hs.logit_std_min > 1.0 && hs.logit_std_max < 6.0, "logit std %.2f..%.2f outside [1, 6]", hs.logit_std_min,
          hs.logit_std_max);
    CHECK(hs.distinct_top1 >= 16, "only %d distinct top-1 tokens over %d positions", hs.distinct_top1, n);
    CHECK(hs.perplexity_median > 2.0, "the next-token distribution is nearly one-hot (perplexity %.2f)",
          hs.perplexity_median);
    CHECK(hs.max_stream_rms < 8.0 && hs.min_stream_rms > 0.3, "HC stream RMS %.3f..%.3f: not bounded",
          hs.min_stream_rms, hs.max_stream_rms);
    CHECK(hs.n_margins > 0 && hs.margin_median > 0.05 && hs.margin_small_fraction < 0.1,
          "router margins: median %.4f, %.1f%% below 0.01", hs.margin_median, 100 * hs.margin_small_fraction);
    CHECK(hs.experts_used_min >= 12, "routing uses only %d of 16 experts in some layer", hs.experts_used_min);
    remove_tree(dir);
    rmdir(SYNTH_TEST_ROOT);
}

/* Manual check of a bigger synthetic checkpoint (not run by default: set DS4F_SYNTH_CHECK_DIR). */
TEST(synth_external_checkpoint_health) {
    const char *dir = getenv("DS4F_SYNTH_CHECK_DIR");
    if (!dir) return;
    const char *count = getenv("DS4F_SYNTH_CHECK_TOKENS");
    int n = count ? atoi(count) : 2;
    if (n < 1 || n > 4096) n = 2;
    int32_t *tokens = malloc((size_t)n * sizeof *tokens);
    REQUIRE(tokens, "out of memory");
    /* BOS, then ids spread over the vocabulary's lower part (the BPE tokens). */
    for (int i = 0; i < n; i++) tokens[i] = i == 0 ? 0 : 3 + (i * 37) % 600;
    health_summary hs;
    ds4f_error err;
    REQUIRE(measure_health(dir, tokens, n, &hs, &err) == 0, "%s", err.msg);
    print_health(dir, &hs);
    CHECK(hs.finite, "non-finite logits");
    free(tokens);
}
