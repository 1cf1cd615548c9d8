#include "stream/expert_cache.h"
#include "base/large_alloc.h"
#include "base/timer.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef enum { SLOT_EMPTY = 0, SLOT_INFLIGHT, SLOT_READY, SLOT_FAILED } slot_state;

/* Where a slot's current expert came from: a prefetch_kind, or a demand request. */
#define ORIGIN_DEMAND 2

typedef struct cache_slot {
    io_job job;                /* first member: the read's done() finds its slot from the job */
    struct expert_cache *cache;
    uint8_t *data;
    uint64_t part_offsets[EXPERT_PARTS];
    int32_t key;               /* block * n_experts + expert; -1 when EMPTY */
    slot_state state;
    int pins;                  /* requests holding it; a pinned slot is never evicted */
    int origin;                /* ORIGIN_DEMAND or the prefetch_kind that read it */
    int speculative_read;      /* its read was issued by a hint (counts against the hint limit) */
    int used;                  /* a request asked for it since it was read */
    int hot;                   /* pinned for the cache's lifetime */
    uint64_t wanted_at;        /* 1 + request clock when a hint last named it; 0: no hint pending */
    ds4f_error *error;         /* FAILED: what went wrong */
} cache_slot;

typedef struct expert_cache {
    expert_source base;        /* first member: the expert_source pointer is the cache */
    const model_weights *m;
    const model_config *c;
    expert_store store;
    io_pool *pool;
    pthread_mutex_t lock;
    pthread_cond_t changed;    /* a slot became READY, FAILED or unpinned */
    cache_slot *slots;
    int n_slots;
    uint8_t *slot_memory;
    int32_t *slot_of_key;      /* [n_keys]: the slot holding (or reading) a key, -1 if none */
    int32_t *free_slots;       /* EMPTY slots */
    int n_free;
    int n_keys;
    cache_policy policy;
    uint64_t now;              /* requests begun: the policy clock */
    int current_block;         /* the block of the latest request */
    uint64_t protect_requests; /* a hinted expert is protected from other hints this long */
    int hint_inflight, max_hint_inflight;
    int k;                     /* experts per token: a demand request's share of free slots */
    int prefetch;
    int tracing;
    stream_trace trace;
    stream_stats stats;
} expert_cache;

static void cache_destroy(expert_source *self);

void expert_cache_options_init(expert_cache_options *opt) {
    memset(opt, 0, sizeof *opt);
    opt->slots = 64;
    opt->io_threads = 8;
    opt->io_chunk_bytes = 1u << 20;
    opt->prefetch = 1;
    opt->lookahead = 1;
    opt->policy = POLICY_NEXTUSE;
    opt->half_life_tokens = POLICY_DEFAULT_HALF_LIFE_TOKENS;
}

static int key_block(const expert_cache *c, int32_t key) { return key / c->c->n_routed_experts; }
static int key_expert(const expert_cache *c, int32_t key) { return key % c->c->n_routed_experts; }

static int slot_protected(const expert_cache *c, const cache_slot *s) {
    return s->wanted_at && c->now + 1 - s->wanted_at <= c->protect_requests;
}

/* The slot a new read may take, or -1: an EMPTY one, else the READY unpinned (not hot) slot with
 * the lowest policy score, unprotected ones first. For a hint, protected slots are never taken
 * and at least `k` evictable slots must remain for the next demand request. Caller holds the
 * lock. */
static int choose_victim(expert_cache *c, int for_hint) {
    if (c->n_free > 0 && (!for_hint || c->n_free > c->k)) return c->free_slots[--c->n_free];
    int best = -1, best_protected = 1, evictable = c->n_free;
    double best_score = 0;
    for (int i = 0; i < c->n_slots; i++) {
        const cache_slot *s = &c->slots[i];
        if (s->state != SLOT_READY || s->pins || s->hot) continue;
        evictable++;
        const int prot = slot_protected(c, s);
        if (for_hint && prot) continue;
        const double score = policy_keep_value(&c->policy, s->key, (double)c->now, c->current_block);
        if (best < 0 || prot < best_protected || (prot == best_protected && score < best_score)) {
            best = i;
            best_protected = prot;
            best_score = score;
        }
    }
    if (for_hint && evictable - 1 < c->k) return -1;
    if (c->n_free > 0) return c->free_slots[--c->n_free];
    return best;
}

/* Claims slot v for key: evicts what it held and plans the read (submitted by the caller after
 * unlocking). Caller holds the lock. */
static void claim_slot(expert_cache *c, int v, int32_t key, int origin) {
    cache_slot *s = &c->slots[v];
    if (s->state == SLOT_READY) {
        c->stats.evictions++;
        if (s->origin != ORIGIN_DEMAND && !s->used) c->stats.prefetch_wasted[s->origin]++;
        c->slot_of_key[s->key] = -1;
    }
    s->key = key;
    s->state = SLOT_INFLIGHT;
    s->origin = origin;
    s->used = 0;
    s->wanted_at = 0;
    s->pins = 0;
    s->speculative_read = origin != ORIGIN_DEMAND;
    c->slot_of_key[key] = v;
    expert_store_plan_read(&c->store, key_block(c, key), key_expert(c, key), s->data, &s->job, s->part_offsets);
    s->job.priority = origin == ORIGIN_DEMAND ? IO_DEMAND : IO_SPECULATIVE;
    if (s->speculative_read) {
        c->hint_inflight++;
        c->stats.prefetch_reads[origin]++;
    } else {
        c->stats.demand_reads++;
    }
}

/* First request for a slot's expert since it was read: credit the prefetch that read it. */
static void note_use(expert_cache *c, cache_slot *s) {
    if (!s->used) {
        s->used = 1;
        if (s->origin != ORIGIN_DEMAND) {
            c->stats.prefetch_used[s->origin]++;
            if (s->state != SLOT_READY) c->stats.prefetch_late[s->origin]++;
        }
    }
    s->wanted_at = 0;
}

static void release_if_failed(expert_cache *c, cache_slot *s) {
    if (s->state == SLOT_FAILED && s->pins == 0) {
        free(s->error);
        s->error = NULL;
        s->state = SLOT_EMPTY;
        s->key = -1;
        c->free_slots[c->n_free++] = (int32_t)(s - c->slots);
    }
}

/* Runs on an I/O thread once a slot's read finished: phase 3, publish only what fully arrived
 * (and, packed, matches its checksum). */
static void slot_read_done(void *ctx, io_job *job) {
    cache_slot *s = ctx;
    expert_cache *c = s->cache;
    const int block = key_block(c, s->key), expert = key_expert(c, s->key);
    ds4f_error failure;
    int ok = !job->failed;
    if (!ok) failure = job->err;
    else if (expert_store_check(&c->store, block, expert, s->data, &failure) != 0) ok = 0;
    pthread_mutex_lock(&c->lock);
    c->stats.bytes_read += job->bytes_read;
    if (s->speculative_read) {
        c->hint_inflight--;
        c->stats.prefetch_bytes[s->origin] += job->bytes_read;
    } else {
        c->stats.demand_bytes += job->bytes_read;
    }
    if (ok) {
        s->state = SLOT_READY;
    } else {
        c->stats.read_failures++;
        c->slot_of_key[s->key] = -1;
        s->state = SLOT_FAILED;
        s->error = malloc(sizeof *s->error);
        if (s->error) {
            *s->error = failure;
            error_prefix(s->error, "reading block %d expert %d", block, expert);
        }
        release_if_failed(c, s); /* nobody waits for it (a hint's read): just forget it */
    }
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
}

/* Reads in file order: the store's segments of each job, by file then offset. */
static void submit_sorted(expert_cache *c, io_job **jobs, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0; j--) {
            const io_segment *a = &jobs[j - 1]->seg[0], *b = &jobs[j]->seg[0];
            if (a->fd < b->fd || (a->fd == b->fd && a->offset <= b->offset)) break;
            io_job *t = jobs[j]; jobs[j] = jobs[j - 1]; jobs[j - 1] = t;
        }
    for (int i = 0; i < n; i++) io_pool_submit(c->pool, jobs[i]);
}

/* Phase 1 for the request's experts that hold no slot yet, as far as slots allow. Caller holds
 * the lock; the jobs to submit and the speculative jobs to promote are returned. */
static void reserve_pending(expert_cache *c, expert_request *req, io_job **submit, int *n_submit, io_job **promote,
                            int *n_promote) {
    const int E = c->c->n_routed_experts;
    for (int i = 0; i < req->n; i++) {
        if (req->status[i] != EXPERT_PENDING || req->handle[i] >= 0) continue;
        const int32_t key = req->block * E + req->ids[i];
        int v = c->slot_of_key[key];
        if (v >= 0) { /* a hint brought it in meanwhile */
            cache_slot *s = &c->slots[v];
            s->pins++;
            note_use(c, s);
            if (s->state == SLOT_INFLIGHT && s->job.priority == IO_SPECULATIVE) promote[(*n_promote)++] = &s->job;
            req->handle[i] = v;
            continue;
        }
        v = choose_victim(c, 0);
        if (v < 0) return;
        claim_slot(c, v, key, ORIGIN_DEMAND);
        cache_slot *s = &c->slots[v];
        s->pins = 1;
        s->used = 1;
        req->handle[i] = v;
        submit[(*n_submit)++] = &s->job;
    }
}

static int cache_begin(expert_source *self, expert_request *req, ds4f_error *err) {
    expert_cache *c = (expert_cache *)self;
    const int E = c->c->n_routed_experts;
    if (req->block < 0 || req->block >= c->m->n_blocks) return error_set(err, "block %d out of range", req->block);
    if (req->n < 0 || req->n > EXPERT_REQUEST_MAX) return error_set(err, "request of %d experts", req->n);
    for (int i = 0; i < req->n; i++)
        if (req->ids[i] < 0 || req->ids[i] >= E) return error_set(err, "expert id %d out of range", req->ids[i]);
    io_job *submit[EXPERT_REQUEST_MAX], *promote[EXPERT_REQUEST_MAX];
    int n_submit = 0, n_promote = 0;
    pthread_mutex_lock(&c->lock);
    c->now++;
    c->current_block = req->block;
    c->stats.requests++;
    req->delivered = 0;
    for (int i = 0; i < req->n; i++) {
        const int32_t key = req->block * E + req->ids[i];
        req->status[i] = EXPERT_PENDING;
        req->handle[i] = -1;
        c->stats.expert_requests++;
        policy_touch(&c->policy, key, (double)c->now, 0);
        const int v = c->slot_of_key[key];
        if (v < 0) {
            c->stats.misses++;
            continue;
        }
        cache_slot *s = &c->slots[v];
        if (s->state == SLOT_READY) {
            c->stats.hits++;
        } else {
            c->stats.misses++;
            if (s->job.priority == IO_SPECULATIVE) promote[n_promote++] = &s->job;
        }
        note_use(c, s);
        s->pins++;
        req->handle[i] = v;
    }
    reserve_pending(c, req, submit, &n_submit, promote, &n_promote);
    pthread_mutex_unlock(&c->lock);
    for (int i = 0; i < n_promote; i++) io_pool_promote(c->pool, promote[i]);
    submit_sorted(c, submit, n_submit);
    return 0;
}

/* Delivers one pending expert of req whose slot is READY (1), reports a failed read (-1), or finds
 * none (0). Called with the lock held. */
static int deliver_ready(expert_cache *c, expert_request *req, int *index, ds4f_error *err) {
    for (int i = 0; i < req->n; i++) {
        if (req->status[i] != EXPERT_PENDING || req->handle[i] < 0) continue;
        const cache_slot *s = &c->slots[req->handle[i]];
        if (s->state == SLOT_READY) {
            expert_view_from_parts(c->c, s->data, s->part_offsets, &req->views[i]);
            req->status[i] = EXPERT_DELIVERED;
            req->delivered++;
            *index = i;
            return 1;
        }
        if (s->state == SLOT_FAILED) {
            if (s->error) *err = *s->error;
            else error_set(err, "reading block %d expert %d failed", req->block, req->ids[i]);
            return -1;
        }
    }
    return 0;
}

static int cache_ready(expert_source *self, expert_request *req, int *index, ds4f_error *err) {
    expert_cache *c = (expert_cache *)self;
    pthread_mutex_lock(&c->lock);
    const int rc = deliver_ready(c, req, index, err);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

static int cache_next(expert_source *self, expert_request *req, int *index, ds4f_error *err) {
    expert_cache *c = (expert_cache *)self;
    io_job *submit[EXPERT_REQUEST_MAX], *promote[EXPERT_REQUEST_MAX];
    pthread_mutex_lock(&c->lock);
    for (;;) {
        const int rc = deliver_ready(c, req, index, err);
        if (rc != 0) {
            pthread_mutex_unlock(&c->lock);
            return rc;
        }
        if (req->delivered == req->n) {
            pthread_mutex_unlock(&c->lock);
            return 0;
        }
        int n_submit = 0, n_promote = 0;
        reserve_pending(c, req, submit, &n_submit, promote, &n_promote);
        if (n_submit || n_promote) {
            pthread_mutex_unlock(&c->lock);
            for (int i = 0; i < n_promote; i++) io_pool_promote(c->pool, promote[i]);
            submit_sorted(c, submit, n_submit);
            pthread_mutex_lock(&c->lock);
            continue;
        }
        const double wait_start = time_now_seconds();
        pthread_cond_wait(&c->changed, &c->lock);
        c->stats.seconds_waiting += time_now_seconds() - wait_start;
    }
}

static void cache_finish(expert_source *self, expert_request *req, int index) {
    expert_cache *c = (expert_cache *)self;
    pthread_mutex_lock(&c->lock);
    if (req->handle[index] >= 0 && req->status[index] != EXPERT_FINISHED) {
        cache_slot *s = &c->slots[req->handle[index]];
        s->pins--;
        release_if_failed(c, s);
    }
    req->status[index] = EXPERT_FINISHED;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
}

static void cache_end(expert_source *self, expert_request *req) {
    expert_cache *c = (expert_cache *)self;
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < req->n; i++) {
        if (req->handle[i] >= 0 && req->status[i] != EXPERT_FINISHED) {
            cache_slot *s = &c->slots[req->handle[i]];
            s->pins--;
            release_if_failed(c, s);
        }
        req->status[i] = EXPERT_FINISHED;
    }
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
}

static void cache_prefetch(expert_source *self, int block, const int32_t *ids, int n, prefetch_kind kind) {
    expert_cache *c = (expert_cache *)self;
    const int E = c->c->n_routed_experts;
    if (!c->prefetch || block < 0 || block >= c->m->n_blocks) return;
    io_job *submit[EXPERT_REQUEST_MAX];
    int n_submit = 0;
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < n && n_submit < EXPERT_REQUEST_MAX; i++) {
        if (ids[i] < 0 || ids[i] >= E) continue;
        const int32_t key = block * E + ids[i];
        int v = c->slot_of_key[key];
        if (v >= 0) {
            if (!c->slots[v].hot) c->slots[v].wanted_at = c->now + 1;
            continue;
        }
        if (c->hint_inflight >= c->max_hint_inflight || (v = choose_victim(c, 1)) < 0) {
            c->stats.prefetch_dropped++;
            continue;
        }
        claim_slot(c, v, key, (int)kind);
        c->slots[v].wanted_at = c->now + 1;
        submit[n_submit++] = &c->slots[v].job;
    }
    pthread_mutex_unlock(&c->lock);
    submit_sorted(c, submit, n_submit);
}

static void cache_routed(expert_source *self, int block, int64_t pos, int32_t token, const int32_t *ids, int k) {
    expert_cache *c = (expert_cache *)self;
    pthread_mutex_lock(&c->lock);
    /* routed() precedes the begin() of the same request: it will be request now + 1. */
    trace_record(&c->trace, c->now + 1, pos, token, block, ids, k);
    pthread_mutex_unlock(&c->lock);
}

int expert_cache_create(const model_weights *m, expert_store *store, const expert_cache_options *opt,
                        expert_source **out, ds4f_error *err) {
    const model_config *cfg = &m->config;
    expert_cache *c = calloc(1, sizeof *c);
    if (!c) {
        expert_store_close(store);
        return error_set(err, "out of memory");
    }
    c->store = *store;
    memset(store, 0, sizeof *store);
    c->m = m;
    c->c = cfg;
    c->k = cfg->num_experts_per_tok;
    c->n_keys = m->n_blocks * cfg->n_routed_experts;
    c->n_slots = opt->slots;
    c->prefetch = opt->prefetch;
    c->protect_requests = (uint64_t)cfg->num_hidden_layers;
    c->max_hint_inflight = 4 * c->k;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->changed, NULL);
    c->base.begin = cache_begin;
    c->base.next = cache_next;
    c->base.ready = cache_ready;
    c->base.finish = cache_finish;
    c->base.end = cache_end;
    c->base.prefetch = cache_prefetch;
    c->base.destroy = cache_destroy;
    c->base.wants_lookahead = opt->prefetch && opt->lookahead;
    if (cfg->n_routed_experts > EXPERT_REQUEST_MAX) {
        cache_destroy(&c->base);
        return error_set(err, "%d routed experts per layer: at most %d are supported", cfg->n_routed_experts,
                         EXPERT_REQUEST_MAX);
    }
    if (opt->slots < 1) {
        cache_destroy(&c->base);
        return error_set(err, "the expert cache needs at least 1 slot");
    }
    c->slots = calloc((size_t)c->n_slots, sizeof *c->slots);
    c->slot_of_key = malloc((size_t)c->n_keys * sizeof *c->slot_of_key);
    c->free_slots = malloc((size_t)c->n_slots * sizeof *c->free_slots);
    const uint64_t slot_bytes = (c->store.slot_bytes + IO_ALIGN - 1) & ~(uint64_t)(IO_ALIGN - 1);
    c->slot_memory = large_alloc(slot_bytes * (uint64_t)c->n_slots);
    if (!c->slots || !c->slot_of_key || !c->free_slots || !c->slot_memory ||
        policy_init(&c->policy, opt->policy, c->n_keys, cfg->n_routed_experts, cfg->num_hidden_layers,
                    opt->half_life_tokens * cfg->num_hidden_layers) != 0) {
        const double gb = (double)slot_bytes * c->n_slots / 1e9;
        cache_destroy(&c->base);
        return error_set(err, "cannot allocate %.2f GB for %d expert cache slots", gb, opt->slots);
    }
    for (int i = 0; i < c->n_keys; i++) c->slot_of_key[i] = -1;
    for (int i = 0; i < c->n_slots; i++) {
        cache_slot *s = &c->slots[i];
        s->cache = c;
        s->data = c->slot_memory + (uint64_t)i * slot_bytes;
        s->key = -1;
        s->job.done = slot_read_done;
        s->job.done_ctx = s;
        c->free_slots[c->n_free++] = c->n_slots - 1 - i; /* popped from the end: slot 0 first */
    }
    c->stats.slots = c->n_slots;
    if (io_pool_create(opt->io_threads, opt->io_chunk_bytes, opt->io, &c->pool, err) != 0) {
        cache_destroy(&c->base);
        return -1;
    }
    if (opt->trace_path) {
        trace_header h = {m->n_blocks, cfg->n_routed_experts, cfg->num_experts_per_tok, cfg->num_hash_layers,
                          cfg->num_hidden_layers, c->store.expert_bytes};
        if (trace_create(&c->trace, opt->trace_path, &h, err) != 0) {
            cache_destroy(&c->base);
            return -1;
        }
        c->tracing = 1;
        c->base.routed = cache_routed;
    }
    *out = &c->base;
    return 0;
}

static void cache_destroy(expert_source *self) {
    expert_cache *c = (expert_cache *)self;
    if (!c) return;
    io_pool_destroy(c->pool); /* waits for reads still landing in the slots */
    if (c->tracing) {
        ds4f_error ignored;
        trace_close(&c->trace, &ignored);
    }
    if (c->slots)
        for (int i = 0; i < c->n_slots; i++) free(c->slots[i].error);
    free(c->slots);
    free(c->slot_of_key);
    free(c->free_slots);
    free(c->slot_memory);
    policy_free(&c->policy);
    expert_store_close(&c->store);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->changed);
    free(c);
}

int expert_cache_pin(expert_source *src, const int32_t *keys, int n, ds4f_error *err) {
    expert_cache *c = (expert_cache *)src;
    if (n > c->n_slots - c->k)
        return error_set(err, "cannot pin %d experts in %d slots: %d must stay free for requests", n, c->n_slots, c->k);
    io_job *submit[64];
    int rc = 0;
    for (int start = 0; start < n && rc == 0; start += 64) {
        int n_submit = 0;
        const int end = n - start < 64 ? n : start + 64;
        pthread_mutex_lock(&c->lock);
        for (int i = start; i < end; i++) {
            if (keys[i] < 0 || keys[i] >= c->n_keys) continue;
            int v = c->slot_of_key[keys[i]];
            if (v < 0) {
                v = choose_victim(c, 0);
                if (v < 0) break;
                claim_slot(c, v, keys[i], ORIGIN_DEMAND);
                submit[n_submit++] = &c->slots[v].job;
            }
            c->slots[v].hot = 1;
            c->slots[v].pins++;
        }
        pthread_mutex_unlock(&c->lock);
        submit_sorted(c, submit, n_submit);
        pthread_mutex_lock(&c->lock);
        for (int i = start; i < end; i++) {
            if (keys[i] < 0 || keys[i] >= c->n_keys) continue;
            for (;;) {
                const int v = c->slot_of_key[keys[i]];
                const cache_slot *s = v >= 0 ? &c->slots[v] : NULL;
                if (s && s->state == SLOT_READY) break;
                if (!s || s->state == SLOT_FAILED) {
                    if (s && s->error) *err = *s->error;
                    else error_set(err, "pinning block %d expert %d failed", key_block(c, keys[i]), key_expert(c, keys[i]));
                    rc = -1;
                    break;
                }
                pthread_cond_wait(&c->changed, &c->lock);
            }
            if (rc) break;
        }
        /* Hot slots are held by the cache itself, not by a request: their pins only kept them
         * from eviction while loading; hot keeps them from now on. */
        for (int i = start; i < end; i++) {
            if (keys[i] < 0 || keys[i] >= c->n_keys) continue;
            const int v = c->slot_of_key[keys[i]];
            if (v >= 0 && c->slots[v].hot && c->slots[v].pins > 0) c->slots[v].pins--;
        }
        pthread_mutex_unlock(&c->lock);
    }
    if (rc == 0) {
        pthread_mutex_lock(&c->lock);
        c->stats.pinned_slots = 0;
        for (int i = 0; i < c->n_slots; i++) c->stats.pinned_slots += c->slots[i].hot;
        pthread_mutex_unlock(&c->lock);
    }
    return rc;
}

void expert_cache_get_stats(expert_source *src, stream_stats *out) {
    expert_cache *c = (expert_cache *)src;
    pthread_mutex_lock(&c->lock);
    *out = c->stats;
    /* Prefetched experts still unused now count as wasted (the run is over when this is read). */
    for (int i = 0; i < c->n_slots; i++) {
        const cache_slot *s = &c->slots[i];
        if (s->state == SLOT_READY && s->origin != ORIGIN_DEMAND && !s->used) out->prefetch_wasted[s->origin]++;
    }
    pthread_mutex_unlock(&c->lock);
}

void expert_cache_reset_stats(expert_source *src) {
    expert_cache *c = (expert_cache *)src;
    pthread_mutex_lock(&c->lock);
    const int slots = c->stats.slots, pinned = c->stats.pinned_slots;
    memset(&c->stats, 0, sizeof c->stats);
    c->stats.slots = slots;
    c->stats.pinned_slots = pinned;
    /* What is cached now was paid for before: it no longer counts as a prefetch to judge. */
    for (int i = 0; i < c->n_slots; i++)
        if (c->slots[i].state == SLOT_READY) c->slots[i].used = 1;
    pthread_mutex_unlock(&c->lock);
}

int expert_cache_direct_io(expert_source *src) { return ((expert_cache *)src)->store.direct_io; }
int expert_cache_is_packed(expert_source *src) { return ((expert_cache *)src)->store.packed; }
int expert_source_is_cache(const expert_source *src) { return src && src->destroy == cache_destroy; }

int expert_cache_key_state(expert_source *src, int32_t key) {
    expert_cache *c = (expert_cache *)src;
    pthread_mutex_lock(&c->lock);
    int state = -1;
    if (key >= 0 && key < c->n_keys && c->slot_of_key[key] >= 0) state = (int)c->slots[c->slot_of_key[key]].state;
    else
        for (int i = 0; i < c->n_slots; i++) /* a FAILED slot is unmapped but may still hold the key */
            if (c->slots[i].key == key && c->slots[i].state != SLOT_EMPTY) state = (int)c->slots[i].state;
    pthread_mutex_unlock(&c->lock);
    return state;
}
