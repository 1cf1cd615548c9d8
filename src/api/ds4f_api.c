/* The public interface (include/ds4f.h) on top of the model and nn layers. */
#include "ds4f.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "model/expert_source.h"
#include "nn/session.h"
#include "stream/expert_cache.h"
#include "stream/memory_plan.h"
#include "stream/trace.h"

struct ds4f_model {
    model_weights weights;
    expert_source *experts;
    int planned;                 /* streaming: the plan below holds */
    memory_plan plan;
    char *plan_text;
    uint64_t live_session_bytes; /* forecast of the sessions open now */
    int chunk;                   /* prefill chunk of sessions that do not name one */
};

struct ds4f_session {
    ds4f_model *model;
    nn_session *nn;
    ds4f_observer observer;
    uint64_t planned_bytes;
};

void ds4f_model_options_init(ds4f_model_options *opt) { memset(opt, 0, sizeof *opt); }

/* The pin set: the most requested experts of a trace, most requested first. */
static int pin_from_trace(ds4f_model *m, const char *path, int slots, ds4f_error *err) {
    trace_data t;
    if (trace_load(path, &t, err) != 0) return -1;
    const model_config *c = &m->weights.config;
    if (t.header.blocks != m->weights.n_blocks || t.header.experts != c->n_routed_experts) {
        trace_free(&t);
        return error_set(err, "%s: trace of %d blocks x %d experts, the model has %d x %d", path, t.header.blocks,
                         t.header.experts, m->weights.n_blocks, c->n_routed_experts);
    }
    const int n_keys = m->weights.n_blocks * c->n_routed_experts;
    uint64_t *count = calloc((size_t)n_keys, sizeof *count);
    int32_t *keys = malloc((size_t)n_keys * sizeof *keys);
    if (!count || !keys) {
        free(count);
        free(keys);
        trace_free(&t);
        return error_set(err, "out of memory");
    }
    for (size_t i = 0; i < t.n_lines; i++)
        for (int j = 0; j < t.header.k; j++) count[t.lines[i].block * c->n_routed_experts + t.experts[t.lines[i].first + j]]++;
    int n = 0;
    for (int k = 0; k < n_keys; k++)
        if (count[k]) keys[n++] = k;
    /* Insertion sort by count (descending) is fine for a few thousand keys at start-up. */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && count[keys[j - 1]] < count[keys[j]]; j--) {
            int32_t x = keys[j]; keys[j] = keys[j - 1]; keys[j - 1] = x;
        }
    if (n > slots) n = slots;
    int rc = expert_cache_pin(m->experts, keys, n, err);
    free(count);
    free(keys);
    trace_free(&t);
    return rc;
}

/* Plan, then load: the checkpoint's headers and the expert store give every size the plan needs
 * before anything large is allocated. */
static int open_streaming(ds4f_model *m, const char *dir, const ds4f_model_options *opt, ds4f_error *err) {
    checkpoint ck;
    expert_extent *extents = NULL;
    expert_store store = {0};
    int store_open = 0, rc = -1;
    if (checkpoint_open(&ck, dir, err) != 0) {
        checkpoint_close(&ck);
        return -1;
    }
    const int io_threads = opt->io_threads > 0 ? opt->io_threads : DS4F_DEFAULT_IO_THREADS;
    expert_store_options so = {.direct_io = !opt->buffered_io, .verify_checksums = 1};
    if (expert_extents_from_checkpoint(&ck, &extents, err) != 0) goto done;
    if (opt->experts_file ? expert_store_open_packed(&store, opt->experts_file, &ck, extents, &so, err)
                          : expert_store_open_shards(&store, &ck, extents, &so, err))
        goto done;
    store_open = 1;
    memory_plan_request req = {
        .budget_bytes = opt->ram_bytes,
        .context = opt->context > 0 ? opt->context : DS4F_DEFAULT_CONTEXT,
        .sessions = opt->sessions > 0 ? opt->sessions : 1,
        .chunk = opt->chunk > 0 ? opt->chunk : DS4F_DEFAULT_CHUNK,
        .cache_slots = opt->cache_slots,
        .slot_bytes = store.slot_bytes,
        .io_threads = io_threads,
        .packed = store.packed,
    };
    if (memory_plan_build(&ck, &req, &m->plan, err) != 0) goto done;
    size_t text_len = 0;
    FILE *text = open_memstream(&m->plan_text, &text_len);
    if (text) {
        memory_plan_print(&m->plan, text);
        fprintf(text, "  experts from %s, %s I/O\n", store.packed ? store.files[0].path : "the checkpoint's shards",
                store.direct_io ? "direct" : "buffered (page cache)");
        fclose(text);
    }
    if (opt->print_plan && m->plan_text) fputs(m->plan_text, stderr);
    if (!m->plan.fits) {
        error_set(err, "%s", m->plan.refusal);
        goto done;
    }
    checkpoint_close(&ck);
    model_load_options load = {.show_progress = opt->show_progress};
    if (model_weights_load(&m->weights, dir, &load, err) != 0) goto done_closed;
    /* The resident weights are in the arena now: their pages in the page cache are a second copy
     * the plan does not count (and a memory cgroup would charge). */
    for (size_t i = 0; i < m->weights.ck.n_shards; i++)
        posix_fadvise(m->weights.ck.shards[i].fd, 0, 0, POSIX_FADV_DONTNEED);
    expert_cache_options co;
    expert_cache_options_init(&co);
    co.slots = m->plan.cache_slots;
    co.io_threads = io_threads;
    co.prefetch = !opt->no_prefetch;
    co.lookahead = !opt->no_lookahead;
    co.trace_path = opt->trace_file;
    if (opt->cache_policy && policy_from_name(opt->cache_policy, &co.policy) != 0) {
        error_set(err, "unknown cache policy '%s' (nextuse, lfru or lru)", opt->cache_policy);
        goto done_closed;
    }
    store_open = 0; /* the cache owns it now, also when creation fails */
    if (expert_cache_create(&m->weights, &store, &co, &m->experts, err) != 0) goto done_closed;
    m->planned = 1;
    if (opt->pin_trace &&
        pin_from_trace(m, opt->pin_trace, opt->pin_slots > 0 ? opt->pin_slots : m->plan.cache_slots / 4, err) != 0)
        goto done_closed;
    rc = 0;
    goto done_closed;
done:
    checkpoint_close(&ck);
done_closed:
    if (store_open) expert_store_close(&store);
    free(extents);
    return rc;
}

int ds4f_model_open(const char *dir, const ds4f_model_options *opt, ds4f_model **out, ds4f_error *err) {
    ds4f_model_options defaults;
    if (!opt) {
        ds4f_model_options_init(&defaults);
        opt = &defaults;
    }
    ds4f_model *m = calloc(1, sizeof *m);
    if (!m) return error_set(err, "out of memory");
    m->chunk = opt->chunk > 0 ? opt->chunk : DS4F_DEFAULT_CHUNK;
    int rc;
    if (opt->resident_experts) {
        model_load_options load = {.show_progress = opt->show_progress};
        rc = model_weights_load(&m->weights, dir, &load, err);
        if (rc == 0) rc = expert_source_resident_create(&m->weights, opt->show_progress, &m->experts, err);
    } else {
        rc = open_streaming(m, dir, opt, err);
    }
    if (rc != 0) {
        ds4f_model_close(m);
        return -1;
    }
    *out = m;
    return 0;
}

void ds4f_model_close(ds4f_model *m) {
    if (!m) return;
    if (m->experts) m->experts->destroy(m->experts);
    model_weights_free(&m->weights);
    free(m->plan_text);
    free(m);
}

void ds4f_model_get_stream_stats(ds4f_model *m, ds4f_stream_stats *st) {
    memset(st, 0, sizeof *st);
    if (!m->planned || !expert_source_is_cache(m->experts)) return;
    stream_stats s;
    expert_cache_get_stats(m->experts, &s);
    st->streaming = 1;
    st->cache_slots = s.slots;
    st->pinned_slots = s.pinned_slots;
    st->total_experts = m->plan.total_experts;
    st->direct_io = expert_cache_direct_io(m->experts);
    st->packed = expert_cache_is_packed(m->experts);
    st->expert_bytes = m->weights.expert_bytes;
    st->expert_requests = s.expert_requests;
    st->hits = s.hits;
    st->misses = s.misses;
    st->bytes_read = s.bytes_read;
    st->demand_bytes = s.demand_bytes;
    for (int k = 0; k < 2; k++) {
        st->prefetch_reads[k] = s.prefetch_reads[k];
        st->prefetch_bytes[k] = s.prefetch_bytes[k];
        st->prefetch_used[k] = s.prefetch_used[k];
        st->prefetch_late[k] = s.prefetch_late[k];
        st->prefetch_wasted[k] = s.prefetch_wasted[k];
    }
    st->prefetch_dropped = s.prefetch_dropped;
    st->evictions = s.evictions;
    st->read_failures = s.read_failures;
    st->seconds_waiting = s.seconds_waiting;
    st->plan_bytes = m->plan.total_bytes;
    st->budget_bytes = m->plan.budget_bytes;
}

void ds4f_model_reset_stream_stats(ds4f_model *m) {
    if (m->planned && expert_source_is_cache(m->experts)) expert_cache_reset_stats(m->experts);
}

const char *ds4f_model_plan_text(const ds4f_model *m) { return m->plan_text ? m->plan_text : ""; }

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
    info->chunk = m->chunk;
    inventory inv;
    checkpoint_inventory(&m->weights.ck, &inv);
    info->routed_expert_bytes = inv.routed_expert_bytes;
    info->resident_bytes = inv.bytes - inv.routed_expert_bytes;
}

void ds4f_session_options_init(ds4f_session_options *opt) {
    memset(opt, 0, sizeof *opt);
    opt->context = 4096;
    opt->chunk = 0; /* the model's (ds4f_model_options.chunk) */
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
    ds4f_session_options resolved = *opt;
    if (resolved.chunk == 0) resolved.chunk = m->chunk;
    opt = &resolved;
    if (opt->context < 1 || opt->chunk < 1) return error_set(err, "context and chunk must be positive");
    if (opt->context > m->weights.config.max_position_embeddings)
        return error_set(err, "context %d exceeds the model's max_position_embeddings %lld", opt->context,
                         m->weights.config.max_position_embeddings);
    /* Invariant 4: a session beyond the plan is allowed only while the budget has room for it. */
    uint64_t need = 0;
    if (m->planned) {
        need = memory_plan_session_bytes(&m->weights.config, opt->context, opt->chunk, opt->mtp);
        const uint64_t planned = m->plan.sessions_reserved_bytes;
        const uint64_t spare = m->plan.budget_bytes > m->plan.total_bytes ? m->plan.budget_bytes - m->plan.total_bytes : 0;
        if (m->live_session_bytes + need > planned + spare)
            return error_set(err, "a session of %d positions needs %.2f GiB of decode state and scratch; the memory plan "
                             "reserved %.2f GiB for sessions (%.2f GiB in use) and the budget has %.2f GiB spare: plan "
                             "for it (model options context / sessions) or give the cache fewer slots",
                             opt->context, need / 1073741824.0, planned / 1073741824.0,
                             m->live_session_bytes / 1073741824.0, spare / 1073741824.0);
    }
    ds4f_session *s = calloc(1, sizeof *s);
    if (!s) return error_set(err, "out of memory");
    s->model = m;
    s->planned_bytes = need;
    m->live_session_bytes += need;
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
    s->model->live_session_bytes -= s->planned_bytes;
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
