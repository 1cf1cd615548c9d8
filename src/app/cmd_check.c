/* ds4f check: the official continuation vectors on a real checkpoint.
 *
 * tests/data/official-vectors (README there) holds five prompts and what DeepSeek's hosted
 * deepseek-v4-flash answered to them greedily, with its top-20 log-probabilities per step. For
 * each case this renders the prompt as the API does (BOS, <｜User｜>PROMPT<｜Assistant｜></think>),
 * checks that it has the API's prompt_tokens, prefills it, and at every step compares the local
 * greedy token with the official one and the official top log-probabilities with the local
 * ones; the official token is then fed back (teacher forcing), so that a step's disagreement
 * does not shift the later ones.
 *
 * Everything that needs only the tokenizer (prompt lengths, the official tokens' ids) is checked
 * before the model is opened: a synthetic model (its own small vocabulary) fails there in a
 * second, with what was expected, instead of after loading.
 *
 * --record OUT writes the engine's own answers to the same prompts in the same format, so that
 * another build, thread count or cache setting can be checked against them (and the tests can
 * exercise the comparison on a synthetic model).
 */
#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app/cli_generate.h"
#include "app/commands.h"
#include "app/report.h"
#include "base/file_io.h"
#include "base/progress.h"
#include "ds4f.h"
#include "text/dsml.h"
#include "text/tokenizer.h"

#define OFFICIAL_MODEL "deepseek-v4-flash"
#define OFFICIAL_VOCAB 129280
#define RECORD_MODEL "ds4f-record"
#define TOP_N 20
/* The API reports log-probabilities below its floor as -9999: nothing to compare there. */
#define LOGPROB_FLOOR -9998.0

/* Cases whose official answer is known to differ from what the public official code computes
 * (tests/data/official-vectors/README.md): reported, never failed on. */
static const char *const known_disagreements[] = {"long_memory_archive"};

static void usage(FILE *out) {
    fprintf(out,
            "usage: ds4f check -m DIR [--vectors DIR] [--tolerance NATS] [--record OUT] [streaming options]\n"
            "\n"
            "Runs the official DeepSeek-V4-Flash continuation vectors (five prompts, the hosted model's\n"
            "greedy answers with top-20 log-probabilities) on the checkpoint and prints, per case, how\n"
            "many tokens agree and the worst log-probability difference. A case passes when every\n"
            "step's greedy token is the official one, every official top token is among the local\n"
            "top 20, and each official log-probability is within the tolerance of the local one.\n"
            "Needs the real checkpoint (160 GB); on any other model it stops before loading, saying why.\n"
            "\n"
            "  -m DIR            checkpoint directory\n"
            "  --vectors DIR     the vectors (default: tests/data/official-vectors of the ds4f source\n"
            "                    tree, found next to the executable or under the current directory)\n"
            "  --tolerance NATS  largest accepted log-probability difference (default 4.0, the rule of\n"
            "                    another DSV4 engine; an exact engine is far tighter: see the report)\n"
            "  --record OUT      write this engine's answers to the same prompts as vectors in OUT,\n"
            "                    to check other builds or settings against them later\n"
            "%s"
            "  -h, --help        this help\n"
            "\n"
            "Exit status: 0 when every case passes (known disagreements aside), 1 otherwise.\n",
            stream_flags_help);
}

/* ---- the vectors ----------------------------------------------------------------------------- */

typedef struct vec_token {
    uint8_t *bytes;
    size_t len;
    double logprob;
    int32_t id; /* in the local vocabulary; -1 if no token has these bytes */
} vec_token;

typedef struct vec_step {
    vec_token chosen;
    vec_token *top;
    int n_top;
} vec_step;

typedef struct vec_case {
    char *id;
    char *prompt;
    size_t prompt_len;
    int official_prompt_tokens; /* -1 when unknown (recording) */
    vec_step *steps;
    int n_steps;
    bool known_disagreement;
    int32_t *ids; /* the rendered prompt */
    size_t n_ids;
} vec_case;

typedef struct vec_set {
    char *model; /* manifest "model" */
    int vocab_size; /* manifest "vocab_size" of recorded vectors; 0 if absent */
    vec_case *cases;
    int n_cases;
} vec_set;

static void vec_set_free(vec_set *v) {
    for (int c = 0; c < v->n_cases; c++) {
        vec_case *k = &v->cases[c];
        for (int s = 0; k->steps && s < k->n_steps; s++) {
            free(k->steps[s].chosen.bytes);
            for (int t = 0; t < k->steps[s].n_top; t++) free(k->steps[s].top[t].bytes);
            free(k->steps[s].top);
        }
        free(k->steps);
        free(k->id);
        free(k->prompt);
        free(k->ids);
    }
    free(v->cases);
    free(v->model);
    memset(v, 0, sizeof *v);
}

static const cJSON *get(const cJSON *o, const char *key) { return cJSON_GetObjectItemCaseSensitive(o, key); }

/* {"bytes": [..]} (the API's token object) into t. */
static int parse_token(const cJSON *token, const char *where, vec_token *t, ds4f_error *err) {
    const cJSON *bytes = get(token, "bytes");
    if (!cJSON_IsArray(bytes)) return error_set(err, "%s: a token without a \"bytes\" array", where);
    t->len = (size_t)cJSON_GetArraySize(bytes);
    t->bytes = malloc(t->len + 1);
    if (!t->bytes) return error_set(err, "out of memory");
    size_t i = 0;
    for (const cJSON *b = bytes->child; b; b = b->next, i++) {
        if (!cJSON_IsNumber(b) || b->valuedouble < 0 || b->valuedouble > 255)
            return error_set(err, "%s: token bytes must be integers 0..255", where);
        t->bytes[i] = (uint8_t)b->valuedouble;
    }
    t->id = -1;
    return 0;
}

static int parse_official(const char *path, vec_case *k, ds4f_error *err) {
    char *text;
    if (file_read_all(path, &text, NULL, err) != 0) return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    int rc = -1;
    const cJSON *usage = get(root, "usage"), *steps = get(root, "steps");
    const cJSON *pt = get(usage, "prompt_tokens");
    if (!root || !cJSON_IsNumber(pt) || !cJSON_IsArray(steps)) {
        error_set(err, "%s: expected an object with usage.prompt_tokens and a steps array", path);
        goto out;
    }
    k->official_prompt_tokens = (int)pt->valuedouble;
    k->n_steps = cJSON_GetArraySize(steps);
    k->steps = calloc((size_t)k->n_steps + 1, sizeof *k->steps);
    if (!k->steps) {
        error_set(err, "out of memory");
        goto out;
    }
    int s = 0;
    for (const cJSON *step = steps->child; step; step = step->next, s++) {
        char where[4200];
        snprintf(where, sizeof where, "%s: steps[%d]", path, s);
        const cJSON *lp = get(step, "logprob"), *top = get(step, "top_logprobs");
        if (!cJSON_IsNumber(lp) || !cJSON_IsArray(top)) {
            error_set(err, "%s: expected token, logprob and top_logprobs", where);
            goto out;
        }
        vec_step *st = &k->steps[s];
        if (parse_token(get(step, "token"), where, &st->chosen, err) != 0) goto out;
        st->chosen.logprob = lp->valuedouble;
        st->top = calloc((size_t)cJSON_GetArraySize(top) + 1, sizeof *st->top);
        if (!st->top) {
            error_set(err, "out of memory");
            goto out;
        }
        for (const cJSON *e = top->child; e; e = e->next) {
            const cJSON *elp = get(e, "logprob");
            if (!cJSON_IsNumber(elp)) {
                error_set(err, "%s: a top_logprobs entry without a logprob", where);
                goto out;
            }
            vec_token *t = &st->top[st->n_top++];
            if (parse_token(get(e, "token"), where, t, err) != 0) goto out;
            t->logprob = elp->valuedouble;
        }
    }
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

/* Reads DIR/manifest.json, the prompts, and (unless recording) the official answers. */
static int load_vectors(const char *dir, bool recording, vec_set *v, ds4f_error *err) {
    memset(v, 0, sizeof *v);
    char path[4096];
    path_join(path, sizeof path, dir, "manifest.json");
    char *text;
    if (file_read_all(path, &text, NULL, err) != 0) return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *prompts = get(root, "prompts"), *model = get(root, "model"), *vocab = get(root, "vocab_size");
    int rc = -1;
    if (!root || !cJSON_IsArray(prompts) || !cJSON_IsString(model)) {
        error_set(err, "%s: expected an object with \"model\" and a \"prompts\" array", path);
        goto out;
    }
    v->model = strdup(model->valuestring);
    v->vocab_size = cJSON_IsNumber(vocab) ? (int)vocab->valuedouble : 0;
    v->cases = calloc((size_t)cJSON_GetArraySize(prompts) + 1, sizeof *v->cases);
    if (!v->model || !v->cases) {
        error_set(err, "out of memory");
        goto out;
    }
    for (const cJSON *p = prompts->child; p; p = p->next) {
        const cJSON *id = get(p, "id"), *pf = get(p, "prompt_file"), *of = get(p, "official_file"), *steps = get(p, "steps");
        if (!cJSON_IsString(id) || !cJSON_IsString(pf) || !cJSON_IsString(of)) {
            error_set(err, "%s: prompts[%d] needs id, prompt_file and official_file", path, v->n_cases);
            goto out;
        }
        vec_case *k = &v->cases[v->n_cases++];
        k->id = strdup(id->valuestring);
        k->official_prompt_tokens = -1;
        for (size_t i = 0; i < sizeof known_disagreements / sizeof *known_disagreements; i++)
            k->known_disagreement |= !strcmp(id->valuestring, known_disagreements[i]) && !strcmp(v->model, OFFICIAL_MODEL);
        char file[4096];
        path_join(file, sizeof file, dir, pf->valuestring);
        if (!k->id || file_read_all(file, &k->prompt, &k->prompt_len, err) != 0) goto out;
        if (recording) {
            /* only the number of steps is taken from the source */
            k->n_steps = cJSON_IsNumber(steps) && steps->valuedouble >= 1 ? (int)steps->valuedouble : 4;
            continue;
        }
        path_join(file, sizeof file, dir, of->valuestring);
        if (parse_official(file, k, err) != 0) goto out;
        if (k->n_steps < 1) {
            error_set(err, "%s: no steps", file);
            goto out;
        }
    }
    if (v->n_cases == 0) error_set(err, "%s: no prompts", path);
    else rc = 0;
out:
    cJSON_Delete(root);
    if (rc) vec_set_free(v);
    return rc;
}

/* The default vectors: the source tree's copy, next to the executable (build/ds4f) or under the
 * current directory. */
static const char *find_vectors(char *buf, size_t size) {
    struct stat st;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(buf, size, "%s/../tests/data/official-vectors", exe);
            if (stat(buf, &st) == 0) return buf;
        }
    }
    snprintf(buf, size, "tests/data/official-vectors");
    return stat(buf, &st) == 0 ? buf : NULL;
}

/* ---- tokenizer-only checks ---------------------------------------------------------------- */

static int32_t id_of_bytes(const tokenizer *tok, const uint8_t *bytes, size_t len) {
    const int32_t n = tokenizer_vocab_size(tok);
    for (int32_t id = 0; id < n; id++) {
        size_t l;
        const uint8_t *b = tokenizer_token_bytes(tok, id, &l);
        if (b && l == len && !memcmp(b, bytes, len)) return id;
    }
    return -1;
}

/* Renders each prompt as the API did and maps the official tokens to ids. Returns the number of
 * cases whose prompt length differs from the official one (each explained on stdout). */
static int prepare_cases(const tokenizer *tok, vec_set *v, ds4f_error *err) {
    int mismatches = 0, chosen = 0, chosen_found = 0;
    for (int c = 0; c < v->n_cases; c++) {
        vec_case *k = &v->cases[c];
        /* the vectors were taken with thinking disabled and no system prompt */
        if (cli_encode_user_turn(tok, NULL, k->prompt, false, true, &k->ids, &k->n_ids, err) != 0)
            return error_prefix(err, "%s", k->id);
        if (k->official_prompt_tokens >= 0 && (size_t)k->official_prompt_tokens != k->n_ids) {
            printf("%-24s the prompt renders to %zu tokens with this tokenizer; the official count is %d\n", k->id,
                   k->n_ids, k->official_prompt_tokens);
            mismatches++;
        }
        for (int s = 0; k->steps && s < k->n_steps; s++) { /* no steps when recording */
            vec_step *st = &k->steps[s];
            st->chosen.id = id_of_bytes(tok, st->chosen.bytes, st->chosen.len);
            chosen++;
            chosen_found += st->chosen.id >= 0;
            for (int t = 0; t < st->n_top; t++)
                if (st->top[t].logprob > LOGPROB_FLOOR)
                    st->top[t].id = id_of_bytes(tok, st->top[t].bytes, st->top[t].len);
        }
    }
    if (chosen) {
        printf("tokenizer: %d of %d prompts render to the official token counts; %d of %d official answer tokens are "
               "in the vocabulary\n",
               v->n_cases - mismatches, v->n_cases, chosen_found, chosen);
        fflush(stdout);
    }
    return mismatches;
}

/* config.json's vocab_size, read before the (long) model load; 0 if it cannot be read here (the
 * model loader then says what is wrong). */
static int config_vocab_size(const char *dir) {
    char path[4096];
    path_join(path, sizeof path, dir, "config.json");
    char *text;
    ds4f_error ignored;
    if (file_read_all(path, &text, NULL, &ignored) != 0) return 0;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *v = get(root, "vocab_size");
    const int n = cJSON_IsNumber(v) ? (int)v->valuedouble : 0;
    cJSON_Delete(root);
    return n;
}

/* ---- running ------------------------------------------------------------------------------- */

/* log-softmax of the logits into lp (double, for differences of small log-probabilities). */
static void log_softmax(const float *logits, int n, double *lp) {
    double max = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] > max) max = logits[i];
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - max);
    const double log_sum = log(sum) + max;
    for (int i = 0; i < n; i++) lp[i] = (double)logits[i] - log_sum;
}

/* The TOP_N most probable ids, most probable first (lowest id on ties). */
static void top_ids(const double *lp, int n, int32_t *top) {
    int count = 0;
    for (int32_t id = 0; id < n; id++) {
        if (count == TOP_N && lp[id] <= lp[top[TOP_N - 1]]) continue;
        int at = count < TOP_N ? count++ : TOP_N - 1;
        while (at > 0 && lp[top[at - 1]] < lp[id]) {
            top[at] = top[at - 1];
            at--;
        }
        top[at] = id;
    }
}

/* Prefill with a progress bar (the long prompts take a while on a real model). */
static int prefill(ds4f_session *s, const vec_case *k, float *logits, ds4f_error *err) {
    progress bar;
    progress_begin(&bar, k->id, k->n_ids, "tokens");
    const size_t chunk = 256;
    for (size_t done = 0; done < k->n_ids; done += chunk) {
        const size_t n = k->n_ids - done < chunk ? k->n_ids - done : chunk;
        if (ds4f_session_eval(s, k->ids + done, (int)n, done + n == k->n_ids ? logits : NULL, 0, err) != 0) return -1;
        progress_update(&bar, done + n);
    }
    progress_end(&bar);
    return 0;
}

typedef struct case_result {
    int agree, steps;          /* greedy tokens equal to the official ones */
    int tops, tops_in_local;   /* official top tokens above the floor, and those in the local top 20 */
    int unmapped;              /* official tokens with no id in this vocabulary */
    double worst;              /* largest |official - local| log-probability */
    bool pass;
} case_result;

static int check_case(ds4f_session *s, const tokenizer *tok, const vec_case *k, int vocab, double tolerance,
                      float *logits, double *lp, case_result *r, ds4f_error *err) {
    memset(r, 0, sizeof *r);
    ds4f_session_reset(s);
    if (prefill(s, k, logits, err) != 0) return -1;
    int32_t top[TOP_N];
    for (int step = 0; step < k->n_steps; step++) {
        const vec_step *st = &k->steps[step];
        log_softmax(logits, vocab, lp);
        top_ids(lp, vocab, top);
        size_t len;
        const uint8_t *local = tokenizer_token_bytes(tok, top[0], &len);
        r->steps++;
        r->agree += local && len == st->chosen.len && !memcmp(local, st->chosen.bytes, len);
        for (int t = 0; t < st->n_top; t++) {
            const vec_token *o = &st->top[t];
            if (o->logprob <= LOGPROB_FLOOR) continue;
            r->tops++;
            if (o->id < 0 || o->id >= vocab) {
                r->unmapped++;
                continue;
            }
            for (int j = 0; j < TOP_N; j++) r->tops_in_local += top[j] == o->id;
            const double d = fabs(o->logprob - lp[o->id]);
            if (d > r->worst) r->worst = d;
        }
        if (step + 1 == k->n_steps) break;
        if (st->chosen.id < 0 || st->chosen.id >= vocab) {
            r->unmapped++;
            break; /* cannot feed the official token back: later steps are not compared */
        }
        if (ds4f_session_eval(s, &st->chosen.id, 1, logits, 0, err) != 0) return -1;
    }
    r->pass = r->steps == k->n_steps && r->agree == r->steps && r->unmapped == 0 && r->tops_in_local == r->tops &&
              r->worst <= tolerance;
    return 0;
}

/* ---- recording ------------------------------------------------------------------------------ */

static cJSON *token_json(const tokenizer *tok, int32_t id) {
    size_t len;
    const uint8_t *b = tokenizer_token_bytes(tok, id, &len);
    cJSON *t = cJSON_CreateObject(), *bytes = cJSON_CreateArray();
    char *text = malloc(len + 1);
    if (text) {
        memcpy(text, b, len);
        text[len] = 0;
    }
    /* the bytes are what counts; the text is for people, when it is text */
    cJSON_AddStringToObject(t, "text", text && utf8_valid(text, len) && !memchr(text, 0, len) ? text : "");
    free(text);
    for (size_t i = 0; i < len; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber(b[i]));
    cJSON_AddItemToObject(t, "bytes", bytes);
    return t;
}

static int write_json(const char *path, cJSON *json, ds4f_error *err) {
    char *text = cJSON_Print(json);
    if (!text) return error_set(err, "out of memory");
    int rc = file_write_all(path, text, strlen(text), err);
    free(text);
    return rc;
}

static int record_case(ds4f_session *s, const tokenizer *tok, const vec_case *k, int vocab, const char *out_dir,
                       float *logits, double *lp, ds4f_error *err) {
    ds4f_session_reset(s);
    if (prefill(s, k, logits, err) != 0) return -1;
    cJSON *root = cJSON_CreateObject(), *usage = cJSON_CreateObject(), *steps = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "schema", "ds4-official-logprobs-v1");
    cJSON_AddStringToObject(root, "source", "ds4f check --record");
    cJSON_AddStringToObject(root, "model", RECORD_MODEL);
    cJSON_AddStringToObject(root, "id", k->id);
    cJSON_AddNumberToObject(usage, "prompt_tokens", (double)k->n_ids);
    cJSON_AddItemToObject(root, "usage", usage);
    int32_t top[TOP_N];
    for (int step = 0; step < k->n_steps; step++) {
        log_softmax(logits, vocab, lp);
        top_ids(lp, vocab, top);
        cJSON *st = cJSON_CreateObject(), *tops = cJSON_CreateArray();
        cJSON_AddNumberToObject(st, "step", step);
        cJSON_AddItemToObject(st, "token", token_json(tok, top[0]));
        cJSON_AddNumberToObject(st, "logprob", lp[top[0]]);
        for (int j = 0; j < TOP_N && j < vocab; j++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddItemToObject(e, "token", token_json(tok, top[j]));
            cJSON_AddNumberToObject(e, "logprob", lp[top[j]]);
            cJSON_AddItemToArray(tops, e);
        }
        cJSON_AddItemToObject(st, "top_logprobs", tops);
        cJSON_AddItemToArray(steps, st);
        if (step + 1 < k->n_steps && ds4f_session_eval(s, &top[0], 1, logits, 0, err) != 0) {
            cJSON_Delete(root);
            return -1;
        }
    }
    cJSON_AddItemToObject(root, "steps", steps);
    char path[4096], name[1024];
    snprintf(name, sizeof name, "official/%s.official.json", k->id);
    path_join(path, sizeof path, out_dir, name);
    int rc = write_json(path, root, err);
    cJSON_Delete(root);
    if (rc) return -1;
    snprintf(name, sizeof name, "prompts/%s.txt", k->id);
    path_join(path, sizeof path, out_dir, name);
    return file_write_all(path, k->prompt, k->prompt_len, err);
}

static int write_manifest(const vec_set *v, int vocab, const char *out_dir, ds4f_error *err) {
    cJSON *root = cJSON_CreateObject(), *prompts = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "schema", "ds4-test-vector-manifest-v1");
    cJSON_AddStringToObject(root, "source", "ds4f check --record");
    cJSON_AddStringToObject(root, "model", RECORD_MODEL);
    cJSON_AddNumberToObject(root, "vocab_size", vocab);
    cJSON_AddNumberToObject(root, "top_logprobs", TOP_N);
    for (int c = 0; c < v->n_cases; c++) {
        char file[1024];
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "id", v->cases[c].id);
        snprintf(file, sizeof file, "prompts/%s.txt", v->cases[c].id);
        cJSON_AddStringToObject(p, "prompt_file", file);
        snprintf(file, sizeof file, "official/%s.official.json", v->cases[c].id);
        cJSON_AddStringToObject(p, "official_file", file);
        cJSON_AddNumberToObject(p, "steps", v->cases[c].n_steps);
        cJSON_AddItemToArray(prompts, p);
    }
    cJSON_AddItemToObject(root, "prompts", prompts);
    char path[4096];
    path_join(path, sizeof path, out_dir, "manifest.json");
    int rc = write_json(path, root, err);
    cJSON_Delete(root);
    return rc;
}

/* ---- the command ----------------------------------------------------------------------------- */

int cmd_check(int argc, char **argv) {
    const char *dir = NULL, *vectors_dir = NULL, *record_dir = NULL;
    double tolerance = 4.0;
    ds4f_model_options mo;
    ds4f_model_options_init(&mo);
    mo.show_progress = 1;
    for (int i = 1; i < argc;) {
        const int r = stream_flag_parse(argc, argv, &i, &mo);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") && i + 1 < argc) {
            dir = argv[++i];
        } else if (!strcmp(a, "--vectors") && i + 1 < argc) {
            vectors_dir = argv[++i];
        } else if (!strcmp(a, "--record") && i + 1 < argc) {
            record_dir = argv[++i];
        } else if (!strcmp(a, "--tolerance") && i + 1 < argc) {
            char *end;
            tolerance = strtod(argv[++i], &end);
            if (*end || !(tolerance >= 0)) {
                fprintf(stderr, "ds4f check: --tolerance expects a number of nats >= 0, got '%s'\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "ds4f check: unknown or incomplete option '%s' (ds4f check --help)\n", a);
            return 2;
        }
        i++;
    }
    if (!dir) {
        fprintf(stderr, "ds4f check: no checkpoint: give -m DIR (ds4f check --help)\n");
        return 2;
    }
    char found[4200];
    if (!vectors_dir && !(vectors_dir = find_vectors(found, sizeof found))) {
        fprintf(stderr, "ds4f check: the official vectors were not found: give --vectors DIR (tests/data/official-vectors "
                        "in the ds4f source tree)\n");
        return 2;
    }

    ds4f_error err;
    vec_set v;
    ds4f_tokenizer *tok = NULL;
    ds4f_model *model = NULL;
    ds4f_session *session = NULL;
    float *logits = NULL;
    double *lp = NULL;
    int status = 1;
    const bool recording = record_dir != NULL;
    if (load_vectors(vectors_dir, recording, &v, &err) != 0) {
        fprintf(stderr, "ds4f check: %s\n", err.msg);
        return 1;
    }
    const bool official = !strcmp(v.model, OFFICIAL_MODEL);
    if (ds4f_tokenizer_open(dir, &tok, &err) != 0) {
        fprintf(stderr, "ds4f check: %s\n", err.msg);
        goto out;
    }
    const int tok_vocab = tokenizer_vocab_size(tok);
    if (!recording && official && tok_vocab != OFFICIAL_VOCAB)
        printf("the tokenizer has %d ids; DeepSeek-V4-Flash's has %d\n", tok_vocab, OFFICIAL_VOCAB);
    if (!recording && !official && v.vocab_size && v.vocab_size != tok_vocab)
        printf("the vectors were recorded with a vocabulary of %d ids; this tokenizer has %d\n", v.vocab_size, tok_vocab);
    const int mismatches = prepare_cases(tok, &v, &err);
    if (mismatches < 0) {
        fprintf(stderr, "ds4f check: %s\n", err.msg);
        goto out;
    }
    if (mismatches > 0 || (!recording && official && tok_vocab != OFFICIAL_VOCAB)) {
        fprintf(stderr,
                "ds4f check: %s is not the checkpoint these vectors were made with: %s. The official vectors need the "
                "real DeepSeek-V4-Flash checkpoint (its tokenizer.json and weights); a synthetic model has its own "
                "vocabulary. Nothing was run.\n",
                dir, mismatches ? "its tokenizer renders the prompts to other token counts (above)" : "its vocabulary differs");
        goto out;
    }

    const int config_vocab = config_vocab_size(dir);
    if (config_vocab && config_vocab != tok_vocab) {
        fprintf(stderr, "ds4f check: the model's vocabulary (config.json) has %d ids but its tokenizer.json %d: they do "
                        "not belong together%s\n",
                config_vocab, tok_vocab, official ? " (the official vectors need the real DeepSeek-V4-Flash checkpoint)" : "");
        goto out;
    }

    /* The plan reserves the longest prompt and its steps. */
    int needed = 0;
    for (int c = 0; c < v.n_cases; c++)
        if ((int)v.cases[c].n_ids + v.cases[c].n_steps > needed) needed = (int)v.cases[c].n_ids + v.cases[c].n_steps;
    if (mo.context && mo.context < needed) {
        fprintf(stderr, "ds4f check: --ctx %d is shorter than the longest case (%d tokens)\n", mo.context, needed);
        goto out;
    }
    if (!mo.context) mo.context = needed;
    if (ds4f_model_open(dir, &mo, &model, &err) != 0) {
        fprintf(stderr, "ds4f check: %s\n", err.msg);
        goto out;
    }
    ds4f_model_info info;
    ds4f_model_get_info(model, &info);
    if (info.vocab_size != tok_vocab) {
        fprintf(stderr, "ds4f check: the model's vocabulary has %d ids but its tokenizer.json %d: they do not belong "
                        "together%s\n",
                info.vocab_size, tok_vocab, official ? " (the official vectors need the real DeepSeek-V4-Flash checkpoint)" : "");
        goto out;
    }
    ds4f_session_options so;
    ds4f_session_options_init(&so);
    so.context = mo.context;
    logits = malloc((size_t)info.vocab_size * sizeof *logits);
    lp = malloc((size_t)info.vocab_size * sizeof *lp);
    if (!logits || !lp || ds4f_session_create(model, &so, &session, &err) != 0) {
        fprintf(stderr, "ds4f check: %s\n", logits && lp ? err.msg : "out of memory");
        goto out;
    }

    if (recording) {
        char sub[4200];
        path_join(sub, sizeof sub, record_dir, "prompts");
        int rc = dir_create(sub, &err);
        path_join(sub, sizeof sub, record_dir, "official");
        if (rc == 0) rc = dir_create(sub, &err);
        for (int c = 0; c < v.n_cases && rc == 0; c++)
            rc = record_case(session, tok, &v.cases[c], info.vocab_size, record_dir, logits, lp, &err);
        if (rc == 0) rc = write_manifest(&v, info.vocab_size, record_dir, &err);
        if (rc != 0) {
            fprintf(stderr, "ds4f check: %s\n", err.msg);
            goto out;
        }
        printf("recorded %d cases into %s\n", v.n_cases, record_dir);
        status = 0;
        goto out;
    }

    int passed = 0, failed = 0, known = 0;
    printf("%-24s %7s  %-13s  %-17s  %-15s  %s\n", "case", "prompt", "tokens agree", "top-20 contains", "worst |dlogp|",
           "verdict");
    for (int c = 0; c < v.n_cases; c++) {
        const vec_case *k = &v.cases[c];
        case_result r;
        if (check_case(session, tok, k, info.vocab_size, tolerance, logits, lp, &r, &err) != 0) {
            fprintf(stderr, "ds4f check: %s: %s\n", k->id, err.msg);
            goto out;
        }
        const char *verdict = r.pass ? "PASS" : k->known_disagreement ? "known disagreement (see README)" : "FAIL";
        char agree[32], tops[32];
        snprintf(agree, sizeof agree, "%d/%d", r.agree, k->n_steps);
        snprintf(tops, sizeof tops, "%d/%d", r.tops_in_local, r.tops);
        printf("%-24s %7zu  %-13s  %-17s  %-15.6f  %s", k->id, k->n_ids, agree, tops, r.worst, verdict);
        if (r.unmapped) printf(" (%d official tokens are not in this vocabulary)", r.unmapped);
        printf("\n");
        fflush(stdout);
        if (r.pass) passed++;
        else if (k->known_disagreement) known++;
        else failed++;
    }
    printf("check: %d passed, %d failed", passed, failed);
    if (known) printf(", %d known disagreement%s reported", known, known > 1 ? "s" : "");
    printf(" (tolerance %.2f nats)\n", tolerance);
    status = failed ? 1 : 0;
out:
    free(logits);
    free(lp);
    ds4f_session_free(session);
    ds4f_model_close(model);
    ds4f_tokenizer_close(tok);
    vec_set_free(&v);
    return status;
}
