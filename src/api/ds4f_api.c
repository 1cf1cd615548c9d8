/* The public interface (include/ds4f.h) on top of the model and nn layers. */
#include "ds4f.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "model/expert_source.h"
#include "nn/session.h"

struct ds4f_model {
    model_weights weights;
    expert_source *experts;
};

struct ds4f_session {
    ds4f_model *model;
    nn_session *nn;
    ds4f_observer observer;
};

void ds4f_model_options_init(ds4f_model_options *opt) { memset(opt, 0, sizeof *opt); }

int ds4f_model_open(const char *dir, const ds4f_model_options *opt, ds4f_model **out, ds4f_error *err) {
    ds4f_model_options defaults;
    if (!opt) {
        ds4f_model_options_init(&defaults);
        opt = &defaults;
    }
    ds4f_model *m = calloc(1, sizeof *m);
    if (!m) return error_set(err, "out of memory");
    model_load_options load = {.show_progress = opt->show_progress};
    if (model_weights_load(&m->weights, dir, &load, err) != 0) {
        free(m);
        return -1;
    }
    if (expert_source_resident_create(&m->weights, opt->show_progress, &m->experts, err) != 0) {
        model_weights_free(&m->weights);
        free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void ds4f_model_close(ds4f_model *m) {
    if (!m) return;
    if (m->experts) m->experts->destroy(m->experts);
    model_weights_free(&m->weights);
    free(m);
}

void ds4f_model_get_info(const ds4f_model *m, ds4f_model_info *info) {
    const model_config *c = &m->weights.config;
    memset(info, 0, sizeof *info);
    info->vocab_size = c->vocab_size;
    info->hidden_size = c->hidden_size;
    info->layers = c->num_hidden_layers;
    info->mtp_layers = c->num_nextn_predict_layers;
    info->hc_mult = c->hc_mult;
    info->experts_per_token = c->num_experts_per_tok;
    info->routed_experts = c->n_routed_experts;
    info->index_topk = c->index_topk;
    for (int l = 0; l < c->num_hidden_layers && info->n_indexer_layers < 128; l++)
        if (c->compress_ratios[l] == 4) info->indexer_layers[info->n_indexer_layers++] = l;
    info->bos_token_id = c->bos_token_id;
    info->eos_token_id = c->eos_token_id;
    info->max_position = c->max_position_embeddings;
    inventory inv;
    checkpoint_inventory(&m->weights.ck, &inv);
    info->routed_expert_bytes = inv.routed_expert_bytes;
    info->resident_bytes = inv.bytes - inv.routed_expert_bytes;
}

void ds4f_session_options_init(ds4f_session_options *opt) {
    memset(opt, 0, sizeof *opt);
    opt->context = 4096;
    opt->chunk = 64;
}

/* The observer is forwarded through the nn probe with the same signatures. */
static void probe_block(void *ctx, int block, int64_t pos, const float *state) {
    ds4f_session *s = ctx;
    if (s->observer.block_output) s->observer.block_output(s->observer.ctx, block, pos, state);
}
static void probe_routing(void *ctx, int block, int64_t pos, const int32_t *ids, const float *w, int k) {
    ds4f_session *s = ctx;
    if (s->observer.routing) s->observer.routing(s->observer.ctx, block, pos, ids, w, k);
}
static void probe_indexer(void *ctx, int block, int64_t pos, const float *sc, int n, const int32_t *sel, int k) {
    ds4f_session *s = ctx;
    if (s->observer.indexer) s->observer.indexer(s->observer.ctx, block, pos, sc, n, sel, k);
}
static void probe_final(void *ctx, int64_t pos, const float *y) {
    ds4f_session *s = ctx;
    if (s->observer.final_hidden) s->observer.final_hidden(s->observer.ctx, pos, y);
}

int ds4f_session_create(ds4f_model *m, const ds4f_session_options *opt, ds4f_session **out, ds4f_error *err) {
    ds4f_session_options defaults;
    if (!opt) {
        ds4f_session_options_init(&defaults);
        opt = &defaults;
    }
    if (opt->context < 1 || opt->chunk < 1) return error_set(err, "context and chunk must be positive");
    if (opt->context > m->weights.config.max_position_embeddings)
        return error_set(err, "context %d exceeds the model's max_position_embeddings %lld", opt->context,
                         m->weights.config.max_position_embeddings);
    ds4f_session *s = calloc(1, sizeof *s);
    if (!s) return error_set(err, "out of memory");
    s->model = m;
    if (nn_session_create(&m->weights, m->experts, opt->context, opt->chunk, &s->nn, err) != 0) {
        free(s);
        return -1;
    }
    if (opt->mtp && nn_session_keep_states(s->nn, opt->context, err) != 0) {
        ds4f_session_free(s);
        return -1;
    }
    *out = s;
    return 0;
}

void ds4f_session_free(ds4f_session *s) {
    if (!s) return;
    nn_session_free(s->nn);
    free(s);
}

void ds4f_session_reset(ds4f_session *s) { nn_session_reset(s->nn); }

int64_t ds4f_session_position(const ds4f_session *s) { return s->nn->position; }

void ds4f_session_set_observer(ds4f_session *s, const ds4f_observer *observer) {
    if (observer) {
        s->observer = *observer;
        s->nn->probe = (nn_probe){s, probe_block, probe_routing, probe_indexer, probe_final};
    } else {
        memset(&s->observer, 0, sizeof s->observer);
        memset(&s->nn->probe, 0, sizeof s->nn->probe);
    }
}

int ds4f_session_eval(ds4f_session *s, const int32_t *tokens, int n, float *logits, int all_positions,
                      ds4f_error *err) {
    if (n < 1) return error_set(err, "no tokens to evaluate");
    return nn_forward(s->nn, tokens, n, logits, all_positions, err);
}

int ds4f_session_eval_mtp(ds4f_session *s, const int32_t *next_tokens, int n, float *logits, ds4f_error *err) {
    nn_session *nn = s->nn;
    if (!nn->keep_states) return error_set(err, "the session was created without the mtp option");
    /* The kept states are those of the last eval call; the MTP block must have caught up to its
     * first position and may take at most all of them. */
    const int64_t first_kept = nn->position - nn->kept_count;
    if (nn->mtp_position < first_kept || nn->mtp_position + n > nn->position)
        return error_set(err, "MTP positions must follow the evaluated ones in order (MTP at %lld, kept %lld..%lld, asked %d)",
                         (long long)nn->mtp_position, (long long)first_kept, (long long)nn->position - 1, n);
    const size_t state = (size_t)nn->c->hc_mult * nn->c->hidden_size;
    return nn_mtp_forward(nn, nn->kept_states + (size_t)(nn->mtp_position - first_kept) * state, next_tokens, n, logits, err);
}
