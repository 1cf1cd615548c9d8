#include "stream/replay.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/expert_source.h"

/* A request holds at most this many experts; set aside while looking for a victim. */
#define EXPERT_SET_ASIDE_MAX EXPERT_REQUEST_MAX

/* Min-heap of the cached keys by policy score, with each key's heap position for updates. */
typedef struct key_heap {
    int32_t *keys;
    int32_t *where;      /* [n_keys]: heap index, -1 if not cached */
    int size;
    const cache_policy *policy;
} key_heap;

static int heap_less(const key_heap *h, int a, int b) {
    return policy_score(h->policy, h->keys[a]) < policy_score(h->policy, h->keys[b]);
}
static void heap_swap(key_heap *h, int a, int b) {
    int32_t t = h->keys[a];
    h->keys[a] = h->keys[b];
    h->keys[b] = t;
    h->where[h->keys[a]] = a;
    h->where[h->keys[b]] = b;
}
static void heap_up(key_heap *h, int i) {
    while (i > 0 && heap_less(h, i, (i - 1) / 2)) {
        heap_swap(h, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}
static void heap_down(key_heap *h, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->size && heap_less(h, l, m)) m = l;
        if (r < h->size && heap_less(h, r, m)) m = r;
        if (m == i) return;
        heap_swap(h, i, m);
        i = m;
    }
}
static void heap_push(key_heap *h, int32_t key) {
    h->keys[h->size] = key;
    h->where[key] = h->size;
    h->size++;
    heap_up(h, h->size - 1);
}
static int32_t heap_pop(key_heap *h) {
    int32_t key = h->keys[0];
    heap_swap(h, 0, h->size - 1);
    h->size--;
    h->where[key] = -1;
    if (h->size) heap_down(h, 0);
    return key;
}
static void heap_update(key_heap *h, int32_t key) {
    heap_up(h, h->where[key]);
    heap_down(h, h->where[key]);
}

int replay_simulate(const trace_data *t, int slots, policy_kind kind, double half_life_tokens, replay_result *out,
                    ds4f_error *err) {
    memset(out, 0, sizeof *out);
    const int E = t->header.experts, k = t->header.k;
    const int n_keys = t->header.blocks * E;
    if (slots < 1) return error_set(err, "a cache needs at least one slot");
    /* Requests: runs of lines of one block; their distinct keys, in a flat array. */
    int32_t *req_first = malloc((t->n_lines + 1) * sizeof *req_first);
    int32_t *req_block = malloc((t->n_lines + 1) * sizeof *req_block);
    int32_t *req_keys = malloc((t->n_lines * (size_t)k + 1) * sizeof *req_keys);
    double *next_use = malloc((t->n_lines * (size_t)k + 1) * sizeof *next_use);
    double *last_seen = malloc((size_t)n_keys * sizeof *last_seen);
    int32_t *mark = malloc((size_t)n_keys * sizeof *mark);
    key_heap h = {malloc((size_t)slots * sizeof(int32_t)), malloc((size_t)n_keys * sizeof(int32_t)), 0, NULL};
    cache_policy policy = {0};
    const int main_blocks = t->header.main_blocks > 0 ? t->header.main_blocks : t->header.blocks;
    int rc = -1;
    if (!req_first || !req_keys || !next_use || !last_seen || !mark || !h.keys || !h.where ||
        !req_block || policy_init(&policy, kind, n_keys, E, main_blocks, half_life_tokens * main_blocks) != 0) {
        error_set(err, "out of memory replaying %zu trace lines", t->n_lines);
        goto done;
    }
    h.policy = &policy;
    for (int i = 0; i < n_keys; i++) mark[i] = -1, h.where[i] = -1;
    size_t n_req = 0, n_keys_total = 0;
    for (size_t i = 0; i < t->n_lines;) {
        const int block = t->lines[i].block;
        const uint64_t request = t->lines[i].request;
        req_first[n_req] = (int32_t)n_keys_total;
        req_block[n_req] = block;
        for (; i < t->n_lines && t->lines[i].block == block && t->lines[i].request == request; i++) {
            if (t->lines[i].pos + 1 > (int64_t)out->tokens) out->tokens = (uint64_t)t->lines[i].pos + 1;
            for (int j = 0; j < k; j++) {
                const int32_t key = block * E + t->experts[t->lines[i].first + j];
                if (mark[key] == (int32_t)n_req) continue;
                mark[key] = (int32_t)n_req;
                req_keys[n_keys_total++] = key;
            }
        }
        n_req++;
    }
    req_first[n_req] = (int32_t)n_keys_total;
    /* Belady needs each access's next use: one backward pass. */
    for (int i = 0; i < n_keys; i++) last_seen[i] = INFINITY;
    for (size_t r = n_req; r-- > 0;)
        for (int32_t j = req_first[r]; j < req_first[r + 1]; j++) {
            next_use[j] = last_seen[req_keys[j]];
            last_seen[req_keys[j]] = (double)r;
        }
    for (int i = 0; i < n_keys; i++) mark[i] = -1;
    /* Next-use values move with the clock: that policy scans the cached keys (h.keys used as a
     * plain array); the others keep them in the heap. */
    const int scan = kind == POLICY_NEXTUSE;
    int32_t set_aside[EXPERT_SET_ASIDE_MAX];
    for (size_t r = 0; r < n_req; r++) {
        const double now = (double)r;
        for (int32_t j = req_first[r]; j < req_first[r + 1]; j++) mark[req_keys[j]] = (int32_t)r;
        for (int32_t j = req_first[r]; j < req_first[r + 1]; j++) {
            const int32_t key = req_keys[j];
            out->requests++;
            if (h.where[key] >= 0) {
                out->hits++;
                policy_touch(&policy, key, now, next_use[j]);
                if (!scan) heap_update(&h, key);
            }
        }
        for (int32_t j = req_first[r]; j < req_first[r + 1]; j++) {
            const int32_t key = req_keys[j];
            if (h.where[key] >= 0) continue;
            policy_touch(&policy, key, now, next_use[j]);
            if (h.size == slots && scan) {
                int victim = -1;
                double worst = 0;
                for (int i = 0; i < h.size; i++) {
                    if (mark[h.keys[i]] == (int32_t)r) continue;
                    const double v = policy_keep_value(&policy, h.keys[i], now, req_block[r]);
                    if (victim < 0 || v < worst) victim = i, worst = v;
                }
                if (victim < 0) continue; /* every slot holds this request's experts */
                h.where[h.keys[victim]] = -1;
                h.keys[victim] = h.keys[--h.size];
                if (victim < h.size) h.where[h.keys[victim]] = victim;
            } else if (h.size == slots) {
                /* Evict the lowest score that this request does not hold. */
                int n_aside = 0;
                while (h.size && mark[h.keys[0]] == (int32_t)r && n_aside < EXPERT_SET_ASIDE_MAX)
                    set_aside[n_aside++] = heap_pop(&h);
                int evicted = 0;
                if (h.size && mark[h.keys[0]] != (int32_t)r) {
                    heap_pop(&h);
                    evicted = 1;
                }
                for (int a = 0; a < n_aside; a++) heap_push(&h, set_aside[a]);
                if (!evicted) continue; /* every slot holds this request's experts */
            }
            if (scan) {
                h.keys[h.size] = key;
                h.where[key] = h.size++;
            } else {
                heap_push(&h, key);
            }
        }
    }
    rc = 0;
done:
    free(req_first);
    free(req_block);
    free(req_keys);
    free(next_use);
    free(last_seen);
    free(mark);
    free(h.keys);
    free(h.where);
    policy_free(&policy);
    return rc;
}
