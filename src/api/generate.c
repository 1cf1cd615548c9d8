/* Generation (include/ds4f.h, "Generation"): prompt reuse, sampling, streamed text with stop
 * strings held back, cancellation. Uses the session only through the public API. */
#include "ds4f.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "base/timer.h"
#include "text/dsml.h"
#include "text/sampling.h"
#include "text/tokenizer.h"

struct ds4f_generator {
    ds4f_model *model;
    ds4f_session *session;
    const tokenizer *tok;
    int context, chunk, vocab;
    int32_t eos;
    int32_t *consumed;  /* [context] the tokens the session has evaluated, in order */
    int n_consumed;
    float *logits;      /* [vocab] logits after the last consumed token, when logits_valid */
    bool logits_valid;
    sampler sampler;
    atomic_int cancel;
    ds4f_generator_stats stats;
};

/* ---- tokenizer ------------------------------------------------------------------------------ */

int ds4f_tokenizer_open(const char *model_dir, ds4f_tokenizer **out, ds4f_error *err) {
    struct stat st;
    if (stat(model_dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return error_set(err, "%s: %s", model_dir,
                         stat(model_dir, &st) != 0 ? "no such checkpoint directory" : "not a directory");
    size_t n = strlen(model_dir) + sizeof "/tokenizer.json";
    char *path = malloc(n);
    if (!path) return error_set(err, "out of memory");
    snprintf(path, n, "%s/tokenizer.json", model_dir);
    if (stat(path, &st) != 0) {
        int e = errno;
        error_set(err, "%s: %s; ds4f needs the checkpoint's tokenizer.json (the official checkpoint ships it, and "
                  "`ds4f synth` writes one)",
                  path, e == ENOENT ? "no such file" : strerror(e));
        free(path);
        return -1;
    }
    int rc = tokenizer_load(path, out, err);
    free(path);
    return rc;
}

void ds4f_tokenizer_close(ds4f_tokenizer *tok) { tokenizer_free(tok); }

/* ---- parameters --------------------------------------------------------------------------- */

const char *ds4f_finish_reason_name(ds4f_finish_reason r) {
    switch (r) {
    case DS4F_FINISH_STOP: return "stop";
    case DS4F_FINISH_LENGTH: return "length";
    case DS4F_FINISH_CANCELLED: return "cancelled";
    case DS4F_FINISH_ERROR: return "error";
    }
    return "error";
}

void ds4f_generate_params_init(ds4f_generate_params *p) {
    memset(p, 0, sizeof *p);
    p->sampling.temperature = 1.0f;
    p->sampling.top_p = 1.0f;
    p->stop_at_eos = 1;
}

/* ---- the generator ------------------------------------------------------------------------- */

int ds4f_generator_create(ds4f_model *m, const ds4f_session_options *opt, const ds4f_tokenizer *tok,
                          ds4f_generator **out, ds4f_error *err) {
    ds4f_session_options defaults;
    if (!opt) {
        ds4f_session_options_init(&defaults);
        opt = &defaults;
    }
    ds4f_model_info info;
    ds4f_model_get_info(m, &info);
    if (tok && tokenizer_vocab_size(tok) < info.vocab_size)
        return error_set(err, "the tokenizer has %d ids but the model's vocabulary has %d: they do not belong together",
                         (int)tokenizer_vocab_size(tok), info.vocab_size);
    ds4f_generator *g = calloc(1, sizeof *g);
    if (!g) return error_set(err, "out of memory");
    g->model = m;
    g->tok = tok;
    g->context = opt->context;
    g->chunk = opt->chunk > 0 ? opt->chunk : info.chunk;
    g->vocab = info.vocab_size;
    g->eos = info.eos_token_id;
    atomic_init(&g->cancel, 0);
    if (ds4f_session_create(m, opt, &g->session, err) != 0) {
        free(g);
        return -1;
    }
    g->consumed = malloc((size_t)g->context * sizeof *g->consumed);
    g->logits = malloc((size_t)g->vocab * sizeof *g->logits);
    if (!g->consumed || !g->logits) {
        ds4f_generator_free(g);
        return error_set(err, "out of memory for a generator of context %d", opt->context);
    }
    if (sampler_init(&g->sampler, g->vocab, err) != 0) {
        ds4f_generator_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

void ds4f_generator_free(ds4f_generator *g) {
    if (!g) return;
    ds4f_session_free(g->session);
    sampler_free(&g->sampler);
    free(g->consumed);
    free(g->logits);
    free(g);
}

void ds4f_generator_reset(ds4f_generator *g) {
    ds4f_session_reset(g->session);
    g->n_consumed = 0;
    g->logits_valid = false;
}

void ds4f_generator_cancel(ds4f_generator *g) { atomic_store(&g->cancel, 1); }

const int32_t *ds4f_generator_tokens(const ds4f_generator *g, int *n) {
    *n = g->n_consumed;
    return g->consumed;
}

void ds4f_generator_get_stats(const ds4f_generator *g, ds4f_generator_stats *st) {
    *st = g->stats;
    st->position = g->n_consumed;
    st->context = g->context;
}

static bool cancelled(ds4f_generator *g) { return atomic_load(&g->cancel) != 0; }

/* Evaluates tokens and records them as consumed; logits of the last one into g->logits when
 * want_logits. On failure the session's state is unknown, so it is forgotten. */
static int consume(ds4f_generator *g, const int32_t *tokens, int n, bool want_logits, ds4f_error *err) {
    g->logits_valid = false;
    if (ds4f_session_eval(g->session, tokens, n, want_logits ? g->logits : NULL, 0, err) != 0) {
        ds4f_generator_reset(g);
        return -1;
    }
    memcpy(g->consumed + g->n_consumed, tokens, (size_t)n * sizeof *tokens);
    g->n_consumed += n;
    g->logits_valid = want_logits;
    return 0;
}

/* ---- streamed text with stop strings -------------------------------------------------------- */

/* Generated text that is decoded but not yet reported: at most the longest stop string's length
 * (minus one) plus one token's text after each step, since everything that cannot start a stop
 * string is reported at once. */
typedef struct held_text {
    dsml_buf text;
    const char *const *stops;
    size_t *stop_len;
    int n_stops;
} held_text;

static int held_append(held_text *h, const char *s, size_t n, ds4f_error *err) {
    dsml_buf_put(&h->text, s, n);
    return h->text.oom ? error_set(err, "out of memory for generated text") : 0;
}

/* How much of the held text is final: *ready bytes from the start. *match is the index of a
 * stop string found complete (its first occurrence; the text ends before it), else -1. Without
 * a match the bytes from the first position where a stop string could still begin are kept; at
 * the end (final) nothing is kept. */
static void held_split(const held_text *h, bool final, size_t *ready, int *match) {
    const char *data = h->text.data;
    const size_t len = h->text.len;
    size_t best_at = len;
    *match = -1;
    for (int i = 0; i < h->n_stops; i++) {
        const size_t sl = h->stop_len[i];
        if (sl > len) continue;
        const char *hit = memmem(data, len, h->stops[i], sl);
        if (hit && (size_t)(hit - data) < best_at) {
            best_at = (size_t)(hit - data);
            *match = i;
        }
    }
    if (*match >= 0 || final) {
        *ready = best_at;
        return;
    }
    /* The earliest position whose remainder is a proper prefix of some stop string. */
    for (size_t at = 0; at < len; at++) {
        const size_t rest = len - at;
        for (int i = 0; i < h->n_stops; i++)
            if (h->stop_len[i] > rest && memcmp(data + at, h->stops[i], rest) == 0) {
                *ready = at;
                return;
            }
    }
    *ready = len;
}

static void held_drop_front(held_text *h, size_t n) {
    if (n == 0) return; /* nothing to drop; data may still be NULL, where even +0 is undefined */
    memmove(h->text.data, h->text.data + n, h->text.len - n);
    h->text.len -= n;
}

/* ---- ds4f_generate ------------------------------------------------------------------------ */

static int check_request(const ds4f_generator *g, const int32_t *prompt, int n_prompt, const ds4f_generate_params *p,
                         ds4f_error *err) {
    if (n_prompt < 1) return error_set(err, "the prompt is empty: generation needs at least one token");
    if (n_prompt > g->context)
        return error_set(err, "the prompt has %d tokens but the context holds %d (raise --ctx / the session context)",
                         n_prompt, g->context);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= g->vocab)
            return error_set(err, "prompt token %d (index %d) is outside the vocabulary [0, %d)", prompt[i], i, g->vocab);
    for (int i = 0; i < p->n_stop_tokens; i++)
        if (p->stop_tokens[i] < 0 || p->stop_tokens[i] >= g->vocab)
            return error_set(err, "stop token %d is outside the vocabulary [0, %d)", p->stop_tokens[i], g->vocab);
    if (p->n_stop_strings > 0 && !g->tok) return error_set(err, "stop strings need a tokenizer");
    for (int i = 0; i < p->n_stop_strings; i++)
        if (!p->stop_strings[i] || !p->stop_strings[i][0]) return error_set(err, "stop string %d is empty", i);
    sampling_params sp = {p->sampling.temperature, p->sampling.top_k, p->sampling.top_p, p->sampling.min_p};
    return sampling_params_check(&sp, err);
}

static bool is_stop_token(const ds4f_generator *g, const ds4f_generate_params *p, int32_t id) {
    if (p->stop_at_eos && id == g->eos) return true;
    for (int i = 0; i < p->n_stop_tokens; i++)
        if (p->stop_tokens[i] == id) return true;
    return false;
}

/* Makes the session hold exactly a prefix of the prompt that can be extended: everything it has
 * consumed when the prompt starts with that, else nothing. Returns the number of prompt tokens
 * it already holds. */
static int reuse_prefix(ds4f_generator *g, const int32_t *prompt, int n_prompt, bool *replayed) {
    *replayed = false;
    /* Someone who drove the session directly would leave it out of step with our record. */
    if (ds4f_session_position(g->session) != g->n_consumed) ds4f_generator_reset(g);
    int same = 0;
    while (same < g->n_consumed && same < n_prompt && g->consumed[same] == prompt[same]) same++;
    if (same == g->n_consumed && (n_prompt > same || g->logits_valid)) return same;
    *replayed = g->n_consumed > 0;
    ds4f_generator_reset(g);
    return 0;
}

int ds4f_generate(ds4f_generator *g, const int32_t *prompt, int n_prompt, const ds4f_generate_params *params,
                  ds4f_generate_result *result, ds4f_error *err) {
    ds4f_generate_params defaults;
    if (!params) {
        ds4f_generate_params_init(&defaults);
        params = &defaults;
    }
    ds4f_generate_result r;
    memset(&r, 0, sizeof r);
    r.finish = DS4F_FINISH_ERROR;
    r.stop_token = -1;
    r.stop_string = -1;
    r.prompt_tokens = n_prompt;
    if (result) *result = r;
    if (check_request(g, prompt, n_prompt, params, err) != 0) return -1;
    atomic_store(&g->cancel, 0);
    g->stats.requests++;

    held_text held = {.stops = params->stop_strings, .n_stops = params->n_stop_strings};
    tokenizer_stream stream;
    bool have_stream = false;
    int rc = -1;
    if (held.n_stops) {
        held.stop_len = malloc((size_t)held.n_stops * sizeof *held.stop_len);
        if (!held.stop_len) {
            error_set(err, "out of memory");
            goto done;
        }
        for (int i = 0; i < held.n_stops; i++) held.stop_len[i] = strlen(held.stops[i]);
    }

    /* Prefill: only what the session has not consumed, in chunks so that a cancel is noticed
     * and progress reported between them (the chunking changes no number: see ds4f.h). */
    bool replayed;
    const int cached = reuse_prefix(g, prompt, n_prompt, &replayed);
    r.cached_tokens = cached;
    r.replayed = replayed;
    g->stats.replays += replayed;
    g->stats.prompt_reused += cached;
    const int total_new = n_prompt - cached;
    const double t_prefill = time_now_seconds();
    bool stop_now = params->on_prefill && params->on_prefill(params->user, 0, total_new);
    for (int done_new = 0; done_new < total_new && !stop_now;) {
        if (cancelled(g)) {
            stop_now = true;
            break;
        }
        const int step = total_new - done_new < g->chunk ? total_new - done_new : g->chunk;
        const bool last = done_new + step == total_new;
        if (consume(g, prompt + cached + done_new, step, last, err) != 0) {
            r.prefill_seconds = time_now_seconds() - t_prefill;
            goto done;
        }
        done_new += step;
        r.prefill_tokens = done_new;
        g->stats.prompt_evaluated += step;
        if (params->on_prefill && params->on_prefill(params->user, done_new, total_new)) stop_now = true;
    }
    r.prefill_seconds = time_now_seconds() - t_prefill;
    g->stats.prefill_seconds += r.prefill_seconds;
    if (stop_now || cancelled(g)) {
        r.finish = DS4F_FINISH_CANCELLED;
        rc = 0;
        goto done;
    }

    /* Decode. */
    const double t_decode = time_now_seconds();
    sampling_params sp = {params->sampling.temperature, params->sampling.top_k, params->sampling.top_p,
                          params->sampling.min_p};
    sampling_rng rng;
    sampling_rng_seed(&rng, params->sampling.seed);
    if (g->tok) {
        tokenizer_stream_init(&stream, g->tok);
        have_stream = true;
    }
    for (;;) {
        if (cancelled(g)) {
            r.finish = DS4F_FINISH_CANCELLED;
            break;
        }
        const int32_t id = sampler_sample(&g->sampler, g->logits, g->vocab, &sp, &rng);
        r.generated_tokens++;
        g->stats.generated++;
        if (is_stop_token(g, params, id)) {
            r.finish = DS4F_FINISH_STOP;
            r.stop_token = id;
            break;
        }
        size_t ready = 0;
        int match = -1;
        if (have_stream) {
            const char *piece;
            size_t piece_len;
            if (tokenizer_stream_push(&stream, id, &piece, &piece_len, err) != 0 ||
                held_append(&held, piece, piece_len, err) != 0)
                goto decode_failed;
            held_split(&held, false, &ready, &match);
        }
        ds4f_token_event ev = {id, r.generated_tokens - 1, held.text.data, ready, g->logits, g->vocab};
        const int stop_asked = params->on_token ? params->on_token(params->user, &ev) : 0;
        held_drop_front(&held, ready);
        if (match >= 0) {
            r.finish = DS4F_FINISH_STOP;
            r.stop_string = match;
            held.text.len = 0; /* the stop string and whatever followed it in this token */
            break;
        }
        if (stop_asked) {
            r.finish = DS4F_FINISH_CANCELLED;
            break;
        }
        if (params->max_tokens > 0 && r.generated_tokens >= params->max_tokens) {
            r.finish = DS4F_FINISH_LENGTH;
            break;
        }
        if (g->n_consumed >= g->context) {
            r.finish = DS4F_FINISH_LENGTH;
            break;
        }
        if (consume(g, &id, 1, true, err) != 0) goto decode_failed;
        r.decode_tokens++;
        g->stats.decoded++;
    }
    /* Hand over what was held back: an unfinished UTF-8 character's bytes, or text that could
     * have begun a stop string that never came. */
    if (have_stream && r.stop_string < 0) {
        const char *tail;
        size_t tail_len;
        tokenizer_stream_flush(&stream, &tail, &tail_len);
        if (held_append(&held, tail, tail_len, err) != 0) goto decode_failed;
        size_t ready;
        int match;
        held_split(&held, true, &ready, &match);
        if (match >= 0) {
            r.finish = DS4F_FINISH_STOP;
            r.stop_string = match;
        }
        if (ready > 0 && params->on_token) {
            ds4f_token_event ev = {-1, r.generated_tokens, held.text.data, ready, NULL, g->vocab};
            params->on_token(params->user, &ev);
        }
    }
    r.decode_seconds = time_now_seconds() - t_decode;
    g->stats.decode_seconds += r.decode_seconds;
    rc = 0;
    goto done;

decode_failed:
    r.decode_seconds = time_now_seconds() - t_decode;
    g->stats.decode_seconds += r.decode_seconds;
    r.finish = DS4F_FINISH_ERROR;
done:
    if (have_stream) tokenizer_stream_free(&stream);
    dsml_buf_free(&held.text);
    free(held.stop_len);
    if (result) *result = r;
    return rc;
}
