/* Synthetic checkpoint writer (see synth.h).
 *
 * Value ranges: every layer's input is an RMSNorm output (RMS ~1), so each weight is scaled to
 * map RMS-1 inputs to RMS-1 outputs: elements with standard deviation 1/sqrt(fan_in). For the
 * quantized formats that standard deviation is split into a code distribution (a quantized
 * Gaussian looked up from a random byte) times a power-of-two block scale; block scales jitter by
 * one binade (-1, 0, 0, +1) so that a kernel applying the wrong block's scale gives visibly wrong
 * numbers, and the jitter's average gain (sqrt(mean 4^j) = 1.25) is divided out. The residual
 * stream then only grows like the square root of the depth: the Sinkhorn-normalised comb matrix
 * is doubly stochastic (it cannot amplify) and each sublayer adds an output of RMS <= ~1.
 * Hyper-connection controls are small perturbations around pre = 1/hc, post = 1 and a comb that
 * keeps ~85% of each stream; the router's logits have a standard deviation of 3 so the sixth and
 * seventh scores are well apart; the LM head gives logits with a standard deviation of ~3, which
 * over a vocabulary of V leaves a perplexity of about V/90 (varied sampled text). */
#include "model/synth.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/file_io.h"
#include "base/progress.h"
#include "base/str_map.h"
#include "base/timer.h"
#include "format/config.h"
#include "format/dtype.h"
#include "format/safetensors.h"
#include "model/tensor_list.h"

/* ---- presets and config.json ---- */

typedef struct preset_dims {
    const char *name;
    int hidden, layers, heads, head_dim, q_lora, o_groups, o_lora, index_heads, index_topk, experts, moe_inter;
    int vocab; /* 0: the tokenizer's size rounded up to a multiple of 128 */
} preset_dims;

static const preset_dims presets[] = {
    [SYNTH_PRESET_TINY] = {"tiny", 256, 4, 4, 512, 128, 2, 128, 4, 16, 16, 128, 0},
    [SYNTH_PRESET_SMALL] = {"small", 1024, 8, 8, 512, 256, 4, 256, 8, 64, 32, 512, 0},
    [SYNTH_PRESET_FULL] = {"full", 4096, 43, 64, 512, 1024, 8, 1024, 64, 512, 8, 2048, 129280},
};

#define EXPERTS_PER_TOKEN 6
#define DEFAULT_MAX_SHARD_BYTES 4000000000ull

void synth_options_init(synth_options *opt) {
    memset(opt, 0, sizeof *opt);
    opt->preset = SYNTH_PRESET_TINY;
}

int synth_preset_from_name(const char *name, synth_preset *out) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(name, presets[i].name)) {
            *out = (synth_preset)i;
            return 0;
        }
    return -1;
}

int synth_config_json(const synth_options *opt, char **json, ds4f_error *err) {
    *json = NULL;
    if ((unsigned)opt->preset >= sizeof presets / sizeof presets[0]) return error_set(err, "unknown synth preset");
    const preset_dims *p = &presets[opt->preset];
    int layers = opt->layers ? opt->layers : p->layers;
    int experts = opt->experts ? opt->experts : p->experts;
    if (layers < 1 || layers > CONFIG_MAX_LAYERS - 2)
        return error_set(err, "--layers must be between 1 and %d (got %d)", CONFIG_MAX_LAYERS - 2, layers);
    if (experts < EXPERTS_PER_TOKEN || experts > 65536)
        return error_set(err, "--experts must be between %d (the experts each token uses) and 65536 (got %d)",
                         EXPERTS_PER_TOKEN, experts);
    int vocab = p->vocab;
    if (!vocab) {
        int natural = synth_tokenizer_natural_size();
        if (natural < 0) return error_set(err, "out of memory sizing the synthetic tokenizer");
        vocab = (natural + 127) / 128 * 128;
    }
    /* The real pattern: two sliding-window layers, then ratio 4 on even and 128 on odd layers;
     * the MTP block is a window-only layer. */
    char ratios[CONFIG_MAX_LAYERS * 5 + 8];
    size_t pos = 0;
    for (int i = 0; i <= layers; i++) {
        int r = i >= layers || i < 2 ? 0 : i % 2 == 0 ? 4 : 128;
        pos += (size_t)snprintf(ratios + pos, sizeof ratios - pos, "%s%d", i ? ", " : "", r);
    }
    const char *format =
        "{\n"
        "  \"architectures\": [\n"
        "    \"DeepseekV4ForCausalLM\"\n"
        "  ],\n"
        "  \"attention_bias\": false,\n"
        "  \"attention_dropout\": 0.0,\n"
        "  \"bos_token_id\": 0,\n"
        "  \"eos_token_id\": 1,\n"
        "  \"expert_dtype\": \"fp4\",\n"
        "  \"hc_eps\": 1e-06,\n"
        "  \"hc_mult\": 4,\n"
        "  \"hc_sinkhorn_iters\": 20,\n"
        "  \"head_dim\": %d,\n"
        "  \"hidden_act\": \"silu\",\n"
        "  \"hidden_size\": %d,\n"
        "  \"index_head_dim\": 128,\n"
        "  \"index_n_heads\": %d,\n"
        "  \"index_topk\": %d,\n"
        "  \"initializer_range\": 0.02,\n"
        "  \"max_position_embeddings\": 1048576,\n"
        "  \"model_type\": \"deepseek_v4\",\n"
        "  \"moe_intermediate_size\": %d,\n"
        "  \"n_routed_experts\": %d,\n"
        "  \"n_shared_experts\": 1,\n"
        "  \"norm_topk_prob\": true,\n"
        "  \"num_attention_heads\": %d,\n"
        "  \"num_experts_per_tok\": %d,\n"
        "  \"num_hidden_layers\": %d,\n"
        "  \"num_hash_layers\": %d,\n"
        "  \"num_key_value_heads\": 1,\n"
        "  \"num_nextn_predict_layers\": 1,\n"
        "  \"o_groups\": %d,\n"
        "  \"o_lora_rank\": %d,\n"
        "  \"q_lora_rank\": %d,\n"
        "  \"qk_rope_head_dim\": 64,\n"
        "  \"quantization_config\": {\n"
        "    \"activation_scheme\": \"dynamic\",\n"
        "    \"fmt\": \"e4m3\",\n"
        "    \"quant_method\": \"fp8\",\n"
        "    \"scale_fmt\": \"ue8m0\",\n"
        "    \"weight_block_size\": [\n"
        "      128,\n"
        "      128\n"
        "    ]\n"
        "  },\n"
        "  \"rms_norm_eps\": 1e-06,\n"
        "  \"rope_scaling\": {\n"
        "    \"beta_fast\": 32,\n"
        "    \"beta_slow\": 1,\n"
        "    \"factor\": 16,\n"
        "    \"original_max_position_embeddings\": 65536,\n"
        "    \"type\": \"yarn\"\n"
        "  },\n"
        "  \"rope_theta\": 10000,\n"
        "  \"routed_scaling_factor\": 1.5,\n"
        "  \"scoring_func\": \"sqrtsoftplus\",\n"
        "  \"sliding_window\": 128,\n"
        "  \"swiglu_limit\": 10.0,\n"
        "  \"tie_word_embeddings\": false,\n"
        "  \"topk_method\": \"noaux_tc\",\n"
        "  \"torch_dtype\": \"bfloat16\",\n"
        "  \"transformers_version\": \"4.57.1\",\n"
        "  \"use_cache\": true,\n"
        "  \"vocab_size\": %d,\n"
        "  \"compress_rope_theta\": 160000,\n"
        "  \"compress_ratios\": [%s]\n"
        "}\n";
    int hash_layers = layers < 3 ? layers : 3;
    size_t cap = strlen(format) + sizeof ratios + 256;
    char *text = malloc(cap);
    if (!text) return error_set(err, "out of memory");
    snprintf(text, cap, format, p->head_dim, p->hidden, p->index_heads, p->index_topk, p->moe_inter, experts, p->heads,
             EXPERTS_PER_TOKEN, layers, hash_layers, p->o_groups, p->o_lora, p->q_lora, vocab, ratios);
    *json = text;
    return 0;
}

/* ---- the counter-based generator ---- */

/* SplitMix64's output function: a bijective mixer whose outputs at consecutive counters pass
 * standard statistical batteries. random_at(key, i) depends only on its arguments, so any chunk
 * of any tensor can be generated alone, in any order, by any thread. */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline uint64_t random_at(uint64_t key, uint64_t counter) {
    return mix64(key + (counter + 1) * 0x9E3779B97F4A7C15ull);
}
static uint64_t tensor_key(uint64_t seed, const char *name) {
    return mix64(mix64(seed ^ 0xD5F4C0DE5EED0001ull) ^ str_hash(name));
}

/* Quantiles of the standard normal at (i + 0.5) / n: a random index gives a Gaussian sample
 * without transcendental functions per element. */
static float normal_4096[4096], normal_256[256];
static pthread_once_t normal_tables_once = PTHREAD_ONCE_INIT;

static double normal_quantile(double p) {
    double lo = -10, hi = 10;
    for (int it = 0; it < 80; it++) {
        double mid = 0.5 * (lo + hi);
        if (0.5 * erfc(-mid / sqrt(2.0)) < p) lo = mid;
        else hi = mid;
    }
    return 0.5 * (lo + hi);
}

static void build_normal_tables(void) {
    for (int i = 0; i < 4096; i++) normal_4096[i] = (float)normal_quantile((i + 0.5) / 4096.0);
    for (int i = 0; i < 256; i++) normal_256[i] = (float)normal_quantile((i + 0.5) / 256.0);
}

/* ---- what each tensor holds ---- */

typedef enum {
    GEN_BF16_NORMAL, /* mean + std * N(0,1) */
    GEN_F32_NORMAL,
    GEN_F32_HC_BASE, /* pre / post / comb biases (below) */
    GEN_E4M3,        /* FP8 codes from lut */
    GEN_FP4,         /* two E2M1 nibbles per byte, each from lut */
    GEN_E8M0,        /* 127 + exponent + jitter */
    GEN_TID2EID,     /* per token, topk distinct experts in [0, experts) */
} gen_kind;

typedef struct recipe {
    gen_kind kind;
    uint64_t key;
    float mean, std;
    int hc;           /* GEN_F32_HC_BASE */
    int exponent;     /* GEN_E8M0 */
    int experts, topk;
    uint8_t lut[256]; /* GEN_E4M3 codes, GEN_FP4 nibbles */
} recipe;

/* Standard deviations, in units that make the numbers easy to read:
 * logits of the LM head and of the router are (weight std) * sqrt(d) for an RMS-1 input. */
#define HEAD_LOGIT_STD 3.0f
#define ROUTER_LOGIT_STD 6.0f
#define NORM_WEIGHT_STD 0.05f
#define SCALE_JITTER_GAIN 1.25f /* sqrt(E[4^j]) for j = -1, 0, 0, +1 */
#define FP8_CODE_RMS_LOW 16.0f  /* FP8 code RMS in [16, 32): max |code| ~ 85, far from 448 */
#define FP4_CODE_RMS_LOW 1.0f   /* FP4 code RMS in [1, 2): the grid tops out at 6 */

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Block-scale exponent and code RMS of a quantized weight: elements have std 1/sqrt(fan_in), so
 * an RMS-1 input gives an RMS-1 output. (Every FP8/FP4 linear reads a normalised activation or
 * a combination of such; none needs another gain to keep the model sane.) */
static void quantized_plan(const tensor_spec *s, int *exponent, float *code_rms) {
    double fan_in = s->dtype == DTYPE_I8 ? 2.0 * (double)s->shape[1] : (double)s->shape[1];
    double element_std = 1.0 / sqrt(fan_in) / SCALE_JITTER_GAIN;
    double low = s->dtype == DTYPE_I8 ? FP4_CODE_RMS_LOW : FP8_CODE_RMS_LOW;
    int k = (int)floor(log2(element_std / low));
    *exponent = k;
    *code_rms = (float)(element_std / ldexp(1.0, k));
}

/* Code table whose decoded values have the wanted RMS: Gaussian quantiles at spread sigma,
 * rounded to the format; sigma is corrected for the rounding (and FP4's clipping at 6). */
static void build_code_lut(dtype t, float code_rms, uint8_t lut[256]) {
    double sigma = code_rms;
    for (int iter = 0; iter < 6; iter++) {
        double sum_sq = 0;
        for (int i = 0; i < 256; i++) {
            float v = (float)(sigma * normal_256[i]);
            if (t == DTYPE_I8) {
                v = v > 6.0f ? 6.0f : v < -6.0f ? -6.0f : v;
                lut[i] = e2m1_encode_rne(v);
                float d = e2m1_to_f32(lut[i]);
                sum_sq += (double)d * d;
            } else {
                lut[i] = e4m3_encode_rne(v);
                float d = e4m3_to_f32(lut[i]);
                sum_sq += (double)d * d;
            }
        }
        double rms = sqrt(sum_sq / 256);
        if (rms > 0) sigma *= code_rms / rms;
    }
}

typedef struct synth_ctx {
    const model_config *c;
    const tensor_list *list;
    uint64_t seed;
    int threads;
    /* current tensor */
    size_t recipe_index;
    recipe r;
    /* last code table (all experts of one part share it) */
    dtype lut_dtype;
    float lut_code_rms;
    uint8_t lut[256];
    /* shard being written */
    size_t shard_first;
    uint64_t bytes_before_shard;
    progress bar;
} synth_ctx;

static int make_recipe(synth_ctx *x, size_t index, ds4f_error *err) {
    const tensor_spec *s = &x->list->specs[index];
    recipe *r = &x->r;
    memset(r, 0, sizeof *r);
    r->key = tensor_key(x->seed, s->name);
    const double d = x->c->hidden_size, cols = s->ndim == 2 ? (double)s->shape[1] : 1;
    switch (s->dtype) {
    case DTYPE_F8_E4M3:
    case DTYPE_I8: {
        int k;
        float code_rms;
        quantized_plan(s, &k, &code_rms);
        if (x->lut_dtype != s->dtype || x->lut_code_rms != code_rms) {
            build_code_lut(s->dtype, code_rms, x->lut);
            x->lut_dtype = s->dtype;
            x->lut_code_rms = code_rms;
        }
        memcpy(r->lut, x->lut, 256);
        r->kind = s->dtype == DTYPE_I8 ? GEN_FP4 : GEN_E4M3;
        return 0;
    }
    case DTYPE_F8_E8M0: {
        /* Scales follow their weight in the inventory. */
        const tensor_spec *w = index ? &x->list->specs[index - 1] : NULL;
        if (!w || (w->dtype != DTYPE_F8_E4M3 && w->dtype != DTYPE_I8))
            return error_set(err, "internal: scale tensor '%s' does not follow its weight", s->name);
        float code_rms;
        quantized_plan(w, &r->exponent, &code_rms);
        r->kind = GEN_E8M0;
        return 0;
    }
    case DTYPE_I64:
        r->kind = GEN_TID2EID;
        r->experts = x->c->n_routed_experts;
        r->topk = (int)s->shape[1];
        return 0;
    case DTYPE_BF16:
        r->kind = GEN_BF16_NORMAL;
        if (s->ndim == 1) { /* RMSNorm weights */
            r->mean = 1.0f;
            r->std = NORM_WEIGHT_STD;
        } else if (!strcmp(s->name, "embed.weight")) {
            r->std = 1.0f;
        } else if (!strcmp(s->name, "head.weight")) {
            r->std = (float)(HEAD_LOGIT_STD / sqrt(d));
        } else if (ends_with(s->name, "ffn.gate.weight")) {
            r->std = (float)(ROUTER_LOGIT_STD / sqrt(d));
        } else { /* compressor and indexer projections: RMS-1 outputs */
            r->std = (float)(1.0 / sqrt(cols));
        }
        return 0;
    case DTYPE_F32:
        r->kind = GEN_F32_NORMAL;
        if (ends_with(s->name, "_fn")) {
            /* m = fn . (x / rms(x)) has std 1; the scales below turn that into small variations. */
            r->std = (float)(1.0 / sqrt(cols));
        } else if (ends_with(s->name, "_base")) {
            r->kind = GEN_F32_HC_BASE;
            r->hc = x->c->hc_mult;
        } else if (ends_with(s->name, "_scale")) {
            r->mean = 0.5f;
            r->std = 0.05f;
        } else if (ends_with(s->name, "attn_sink")) {
            r->std = 0.2f;
        } else if (ends_with(s->name, ".ape")) {
            r->std = 0.1f;
        } else if (ends_with(s->name, "gate.bias")) {
            r->std = 0.1f;
        } else {
            return error_set(err, "internal: no value recipe for F32 tensor '%s'", s->name);
        }
        return 0;
    default:
        return error_set(err, "internal: no value recipe for %s tensor '%s'", dtype_name(s->dtype), s->name);
    }
}

/* Elements [e0, e1) drawn LANES at a time from one 64-bit random, BITS bits each; `bits` holds
 * the current lane's bits in its low end. */
#define FOR_EACH_LANE(key, e0, e1, LANES, BITS, BODY)                                               \
    for (uint64_t e = (e0); e < (e1);) {                                                            \
        uint64_t bits = random_at((key), e / (LANES)) >> ((e % (LANES)) * (BITS));                  \
        for (unsigned lane = (unsigned)(e % (LANES)); lane < (LANES) && e < (e1); lane++, e++, bits >>= (BITS)) { \
            BODY                                                                                    \
        }                                                                                           \
    }

/* HC biases: pre = sigmoid(-ln(hc-1)) = 1/hc, post = 2 sigmoid(0) = 1, comb logits +3 on the
 * diagonal (after the row softmax ~0.85 of a stream stays in place), each with a little noise so
 * that layers differ. */
static float hc_base_value(int hc, uint64_t n, uint64_t e, float noise) {
    float pre = hc > 1 ? -logf((float)(hc - 1)) : 0.0f;
    if (n == (uint64_t)hc) return pre + noise; /* hc_head_base: pre only */
    if (e < (uint64_t)hc) return pre + noise;
    if (e < 2 * (uint64_t)hc) return noise;
    uint64_t k = e - 2 * (uint64_t)hc;
    return (k / (uint64_t)hc == k % (uint64_t)hc ? 3.0f : 0.0f) + noise;
}

static void generate_rows(const recipe *r, const tensor_spec *s, int64_t first_row, int64_t n_rows, uint8_t *dst) {
    const uint64_t per_row = s->ndim == 2 ? (uint64_t)s->shape[1] : 1;
    const uint64_t e0 = (uint64_t)first_row * per_row, e1 = e0 + (uint64_t)n_rows * per_row;
    const uint64_t key = r->key;
    switch (r->kind) {
    case GEN_E4M3: {
        const uint8_t *lut = r->lut;
        FOR_EACH_LANE(key, e0, e1, 8, 8, dst[e - e0] = lut[bits & 255];)
        break;
    }
    case GEN_FP4: {
        const uint8_t *lut = r->lut;
        FOR_EACH_LANE(key, e0, e1, 4, 16, dst[e - e0] = (uint8_t)(lut[bits & 255] | lut[(bits >> 8) & 255] << 4);)
        break;
    }
    case GEN_E8M0: {
        static const int jitter[4] = {-1, 0, 0, 1};
        int base = 127 + r->exponent;
        FOR_EACH_LANE(key, e0, e1, 8, 8, {
            int v = base + jitter[bits & 3];
            dst[e - e0] = (uint8_t)(v < 1 ? 1 : v > 254 ? 254 : v);
        })
        break;
    }
    case GEN_BF16_NORMAL: {
        uint16_t *out = (uint16_t *)dst;
        const float mean = r->mean, std = r->std;
        FOR_EACH_LANE(key, e0, e1, 4, 16, out[e - e0] = f32_to_bf16(mean + std * normal_4096[(bits >> 4) & 4095]);)
        break;
    }
    case GEN_F32_NORMAL: {
        float *out = (float *)dst;
        const float mean = r->mean, std = r->std;
        FOR_EACH_LANE(key, e0, e1, 4, 16, out[e - e0] = mean + std * normal_4096[(bits >> 4) & 4095];)
        break;
    }
    case GEN_F32_HC_BASE: {
        float *out = (float *)dst;
        uint64_t n = (uint64_t)s->shape[0];
        for (uint64_t e = e0; e < e1; e++)
            out[e - e0] = hc_base_value(r->hc, n, e, 0.1f * normal_4096[random_at(key, e) & 4095]);
        break;
    }
    case GEN_TID2EID: {
        /* Partial Fisher-Yates per token over a shared identity permutation, undone afterwards,
         * so each row costs O(topk) whatever the number of experts. */
        int64_t *out = (int64_t *)dst;
        const int E = r->experts, K = r->topk;
        int32_t *perm = malloc((size_t)E * sizeof *perm);
        int32_t picks[64];
        if (!perm || K > 64) { /* cannot happen for valid configs; leave a recognisable pattern */
            for (uint64_t e = e0; e < e1; e++) out[e - e0] = (int64_t)(e % (uint64_t)K);
            free(perm);
            break;
        }
        for (int i = 0; i < E; i++) perm[i] = i;
        for (int64_t row = first_row; row < first_row + n_rows; row++) {
            for (int j = 0; j < K; j++) {
                uint64_t x = random_at(key, (uint64_t)row * (uint64_t)K + (uint64_t)j);
                int pick = j + (int)(x % (uint64_t)(E - j));
                int32_t t = perm[j]; perm[j] = perm[pick]; perm[pick] = t;
                picks[j] = pick;
                out[(row - first_row) * K + j] = perm[j];
            }
            for (int j = K - 1; j >= 0; j--) {
                int32_t t = perm[j]; perm[j] = perm[picks[j]]; perm[picks[j]] = t;
            }
        }
        free(perm);
        break;
    }
    }
}

/* ---- writing ---- */

typedef struct gen_job {
    const recipe *r;
    const tensor_spec *s;
    int64_t first_row, n_rows;
    uint8_t *dst;
} gen_job;

static void *gen_job_run(void *arg) {
    gen_job *j = arg;
    generate_rows(j->r, j->s, j->first_row, j->n_rows, j->dst);
    return NULL;
}

#define MAX_THREADS 16

static int synth_fill(void *vctx, size_t tensor_index, int64_t first_row, int64_t n_rows, void *dst, ds4f_error *err) {
    synth_ctx *x = vctx;
    size_t index = x->shard_first + tensor_index;
    if (index != x->recipe_index) {
        if (make_recipe(x, index, err) != 0) return -1;
        x->recipe_index = index;
    }
    const tensor_spec *s = &x->list->specs[index];
    const uint64_t row_bytes = s->shape[0] ? tensor_spec_bytes(s) / (uint64_t)s->shape[0] : 0;
    int threads = x->threads;
    /* Threads pay off from a few hundred KB (starting one costs tens of microseconds). */
    if ((uint64_t)n_rows * row_bytes < (256u << 10)) threads = 1;
    if (threads > n_rows) threads = (int)n_rows;
    gen_job jobs[MAX_THREADS];
    pthread_t tids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    int64_t row = first_row;
    for (int t = 0; t < threads; t++) {
        int64_t rows = n_rows / threads + (t < n_rows % threads);
        jobs[t] = (gen_job){&x->r, s, row, rows, (uint8_t *)dst + (uint64_t)(row - first_row) * row_bytes};
        row += rows;
    }
    for (int t = 1; t < threads; t++) started[t] = pthread_create(&tids[t], NULL, gen_job_run, &jobs[t]) == 0;
    gen_job_run(&jobs[0]);
    for (int t = 1; t < threads; t++) {
        if (started[t]) pthread_join(tids[t], NULL);
        else gen_job_run(&jobs[t]); /* could not start a thread: do its share here */
    }
    return 0;
}

static void synth_progress(void *vctx, uint64_t bytes_written) {
    synth_ctx *x = vctx;
    progress_update(&x->bar, x->bytes_before_shard + bytes_written);
}

static void shard_name(char *out, size_t size, int shard, int n_shards) {
    snprintf(out, size, "model-%05d-of-%05d.safetensors", shard + 1, n_shards);
}

static int compare_names(const void *a, const void *b) {
    return strcmp((*(const tensor_spec *const *)a)->name, (*(const tensor_spec *const *)b)->name);
}

/* model.safetensors.index.json as Hugging Face writes it: total_size, then the weight map sorted
 * by tensor name. */
static int write_index(const char *dir, const tensor_list *list, const int *shard_of, int n_shards, uint64_t total,
                       ds4f_error *err) {
    const tensor_spec **sorted = malloc(list->count * sizeof *sorted);
    size_t cap = 256 + list->count * (sizeof list->specs[0].name + 48), len = 0;
    char *text = malloc(cap);
    if (!sorted || !text) {
        free(sorted);
        free(text);
        return error_set(err, "out of memory writing the index");
    }
    for (size_t i = 0; i < list->count; i++) sorted[i] = &list->specs[i];
    qsort(sorted, list->count, sizeof *sorted, compare_names);
    len += (size_t)snprintf(text + len, cap - len, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {\n",
                            (unsigned long long)total);
    for (size_t i = 0; i < list->count; i++) {
        char shard[64];
        shard_name(shard, sizeof shard, shard_of[sorted[i] - list->specs], n_shards);
        len += (size_t)snprintf(text + len, cap - len, "    \"%s\": \"%s\"%s\n", sorted[i]->name, shard,
                                i + 1 < list->count ? "," : "");
    }
    len += (size_t)snprintf(text + len, cap - len, "  }\n}\n");
    char path[4096];
    path_join(path, sizeof path, dir, "model.safetensors.index.json");
    int rc = file_write_all(path, text, len, err);
    free(sorted);
    free(text);
    return rc;
}

static uint64_t existing_file_bytes(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
}

/* Shard files of an earlier run with a different shard count are not part of the result
 * (n_shards < 0: none are); temporary files of an interrupted run are never part of it. */
static void remove_stale_shards(const char *dir, int n_shards) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int a, b, pid, consumed = 0;
        int is_shard = sscanf(e->d_name, "model-%5d-of-%5d.safetensors%n", &a, &b, &consumed) == 2 &&
                       consumed == (int)strlen(e->d_name);
        consumed = 0;
        int is_temporary = sscanf(e->d_name, "model-%5d-of-%5d.safetensors.tmp%d%n", &a, &b, &pid, &consumed) == 3 &&
                           consumed == (int)strlen(e->d_name);
        if (is_temporary || (is_shard && n_shards > 0 && b != n_shards)) {
            char path[4096];
            path_join(path, sizeof path, dir, e->d_name);
            unlink(path);
        }
    }
    closedir(d);
}

int synth_write(const char *dir, const synth_options *opt, synth_result *result, ds4f_error *err) {
    memset(result, 0, sizeof *result);
    double start = time_now_seconds();
    pthread_once(&normal_tables_once, build_normal_tables);

    char *config_text = NULL, *tokenizer_text = NULL;
    size_t tokenizer_len = 0;
    model_config c;
    tensor_list list = {0};
    int *shard_of = NULL;
    uint64_t *shard_bytes = NULL;
    st_write_tensor *writes = NULL;
    int rc = -1, created_dir = 0;
    if (synth_config_json(opt, &config_text, err) != 0) return -1;
    if (config_parse(&c, config_text, "synthetic config.json", err) != 0) {
        error_prefix(err, "internal");
        goto done;
    }
    if (tensor_list_build(&c, &list, err) != 0) goto done;
    if (synth_tokenizer_json(c.vocab_size, &tokenizer_text, &tokenizer_len, err) != 0) goto done;

    /* Shards: the inventory in order, cut before a tensor that would overflow the limit. */
    const uint64_t max_shard = opt->max_shard_bytes ? opt->max_shard_bytes : DEFAULT_MAX_SHARD_BYTES;
    shard_of = malloc(list.count * sizeof *shard_of);
    shard_bytes = calloc(list.count + 1, sizeof *shard_bytes); /* file bytes per shard, estimated */
    if (!shard_of || !shard_bytes) { error_set(err, "out of memory"); goto done; }
    int n_shards = 0;
    uint64_t in_shard = 0, total = 0;
    for (size_t i = 0; i < list.count; i++) {
        uint64_t b = tensor_spec_bytes(&list.specs[i]);
        if (n_shards == 0 || (in_shard > 0 && in_shard + b > max_shard)) {
            n_shards++;
            in_shard = 0;
        }
        shard_of[i] = n_shards - 1;
        in_shard += b;
        total += b;
        /* header entry: name, dtype, shape and offsets in JSON */
        shard_bytes[n_shards - 1] += b + strlen(list.specs[i].name) + 96;
    }

    struct stat dir_stat;
    created_dir = stat(dir, &dir_stat) != 0;
    if (dir_create(dir, err) != 0) goto done;
    char path[4096];
    /* An index from an earlier run would describe shards that are about to be replaced. */
    path_join(path, sizeof path, dir, "model.safetensors.index.json");
    if (unlink(path) != 0 && errno != ENOENT) {
        error_set(err, "%s: cannot remove the old index: %s", path, strerror(errno));
        goto done;
    }
    remove_stale_shards(dir, -1); /* only temporary files left by an interrupted run */

    /* Space: shards replace same-named files one at a time (temporary file, then rename), so
     * usage peaks while some new shard coexists with the old file it is about to replace. */
    {
        uint64_t json_bytes = strlen(config_text) + tokenizer_len + strlen(synth_tokenizer_config_json()) +
                              list.count * (sizeof list.specs[0].name + 48);
        int64_t usage = (int64_t)json_bytes, peak = usage;
        for (int s = 0; s < n_shards; s++) {
            char name[64];
            shard_name(name, sizeof name, s, n_shards);
            path_join(path, sizeof path, dir, name);
            usage += (int64_t)shard_bytes[s];
            if (usage > peak) peak = usage;
            usage -= (int64_t)existing_file_bytes(path);
        }
        struct statvfs fs;
        if (statvfs(dir, &fs) == 0) {
            uint64_t avail = (uint64_t)fs.f_bavail * (uint64_t)fs.f_frsize;
            uint64_t needed = (uint64_t)peak + (64u << 20); /* keep a little room */
            if (needed > avail) {
                error_set(err, "%s: not enough free space: the checkpoint needs %.2f GB, the file system has %.2f GB free",
                          dir, (double)needed / 1e9, (double)avail / 1e9);
                goto done;
            }
        }
    }

    path_join(path, sizeof path, dir, "config.json");
    if (file_write_all(path, config_text, strlen(config_text), err) != 0) goto done;
    path_join(path, sizeof path, dir, "tokenizer.json");
    if (file_write_all(path, tokenizer_text, tokenizer_len, err) != 0) goto done;
    path_join(path, sizeof path, dir, "tokenizer_config.json");
    if (file_write_all(path, synth_tokenizer_config_json(), strlen(synth_tokenizer_config_json()), err) != 0) goto done;
    result->file_bytes = strlen(config_text) + tokenizer_len + strlen(synth_tokenizer_config_json());

    synth_ctx x;
    memset(&x, 0, sizeof x);
    x.c = &c;
    x.list = &list;
    x.seed = opt->seed;
    x.recipe_index = (size_t)-1;
    x.lut_dtype = DTYPE_INVALID;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    x.threads = opt->threads > 0 ? opt->threads : cpus > 4 ? 4 : cpus > 0 ? (int)cpus : 1;
    if (x.threads > MAX_THREADS) x.threads = MAX_THREADS;
    progress_begin(&x.bar, "synth", total, "B");
    if (!opt->show_progress) x.bar.enabled = 0;

    writes = calloc(list.count, sizeof *writes);
    if (!writes) { error_set(err, "out of memory"); goto done; }
    static const char *const shard_metadata[] = {"format", "pt", NULL};
    size_t first = 0;
    for (int s = 0; s < n_shards; s++) {
        size_t end = first;
        while (end < list.count && shard_of[end] == s) end++;
        for (size_t i = first; i < end; i++) {
            const tensor_spec *t = &list.specs[i];
            st_write_tensor *w = &writes[i - first];
            w->name = t->name;
            w->dtype = t->dtype;
            w->ndim = t->ndim;
            for (int k = 0; k < t->ndim; k++) w->shape[k] = t->shape[k];
            w->data = NULL;
        }
        char name[64];
        shard_name(name, sizeof name, s, n_shards);
        path_join(path, sizeof path, dir, name);
        x.shard_first = first;
        if (st_write_file(path, writes, end - first, shard_metadata, synth_fill, &x, synth_progress, err) != 0) {
            if (x.bar.enabled) fputc('\n', stderr); /* end the progress line before the error */
            goto done;
        }
        for (size_t i = first; i < end; i++) x.bytes_before_shard += tensor_spec_bytes(&list.specs[i]);
        result->file_bytes += existing_file_bytes(path);
        first = end;
    }
    progress_end(&x.bar);

    if (write_index(dir, &list, shard_of, n_shards, total, err) != 0) goto done;
    path_join(path, sizeof path, dir, "model.safetensors.index.json");
    result->file_bytes += existing_file_bytes(path);
    remove_stale_shards(dir, n_shards);

    result->files = n_shards + 4;
    result->shards = n_shards;
    result->tensors = list.count;
    result->bytes = total;
    result->seconds = time_now_seconds() - start;
    rc = 0;
done:
    if (rc != 0 && created_dir) rmdir(dir); /* only if still empty: a refusal leaves nothing behind */
    free(writes);
    free(shard_of);
    free(shard_bytes);
    tensor_list_free(&list);
    free(config_text);
    free(tokenizer_text);
    return rc;
}
