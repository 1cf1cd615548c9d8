/* Expert streaming: placement never changes results (invariant 2), the cache's slot rules, the
 * I/O pool's priorities, the memory plan against the real allocations, traces and replay.
 * Faults (invariant 3) are in test_stream_faults.c. */
#include "test.h"
#include "test_stream_util.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ds4f.h"
#include "kernels/kernels.h"
#include "nn/moe.h"
#include "nn/session.h"
#include "stream/checksum.h"
#include "stream/expert_cache.h"
#include "stream/memory_plan.h"
#include "app/report.h"
#include "stream/replay.h"

#define SMALL "tests/data/golden/small"

/* ---- invariance ---- */

#define RUN_TOKENS 300
#define RUN_PREFILL 100

typedef struct run_config {
    const char *label;
    int resident;
    int slots;          /* 0: all experts; -1: one per block */
    int packed;
    int no_prefetch;
    int buffered;
    int threads;
    int io_threads;
    const char *policy;
    int record_trace;   /* write dir/run.trace */
    int pin_slots;      /* pin this many experts from dir/run.trace */
} run_config;

/* 100 prompt tokens (chunks of 64 and 36) then 200 decode steps; logits of all 300 positions. */
static float *run_300(const run_config *rc, const char *dir, const char *packed_path, int *vocab,
                      ds4f_stream_stats *stats) {
    char msg[256];
    if (kernels_set_threads(rc->threads) != 0) return NULL;
    (void)msg;
    ds4f_model_options mo;
    ds4f_model_options_init(&mo);
    mo.resident_experts = rc->resident;
    mo.context = RUN_TOKENS;
    mo.cache_slots = rc->slots;
    mo.experts_file = rc->packed ? packed_path : NULL;
    mo.no_prefetch = rc->no_prefetch;
    mo.buffered_io = rc->buffered;
    mo.io_threads = rc->io_threads;
    mo.cache_policy = rc->policy;
    char trace[300];
    snprintf(trace, sizeof trace, "%s/run.trace", dir);
    if (rc->record_trace) mo.trace_file = trace;
    if (rc->pin_slots) {
        mo.pin_trace = trace;
        mo.pin_slots = rc->pin_slots;
    }
    ds4f_model *m = NULL;
    ds4f_error err;
    if (rc->slots < 0) {
        ds4f_model_info info;
        mo.cache_slots = 1;
        if (ds4f_model_open(SMALL, &mo, &m, &err) != 0) {
            printf("    %s: %s\n", rc->label, err.msg);
            return NULL;
        }
        ds4f_model_get_info(m, &info);
        ds4f_model_close(m);
        mo.cache_slots = info.layers + info.mtp_layers;
    }
    if (ds4f_model_open(SMALL, &mo, &m, &err) != 0) {
        printf("    %s: %s\n", rc->label, err.msg);
        return NULL;
    }
    ds4f_model_info info;
    ds4f_model_get_info(m, &info);
    const int V = info.vocab_size;
    *vocab = V;
    int32_t tokens[RUN_TOKENS];
    uint32_t x = 2024;
    for (int i = 0; i < RUN_TOKENS; i++) {
        x = x * 1664525u + 1013904223u;
        tokens[i] = (int32_t)((x >> 8) % (uint32_t)V);
    }
    ds4f_session_options so;
    ds4f_session_options_init(&so);
    so.context = RUN_TOKENS;
    ds4f_session *s = NULL;
    float *logits = malloc((size_t)RUN_TOKENS * V * sizeof(float));
    int ok = logits && ds4f_session_create(m, &so, &s, &err) == 0 &&
             ds4f_session_eval(s, tokens, RUN_PREFILL, logits, 1, &err) == 0;
    for (int i = RUN_PREFILL; ok && i < RUN_TOKENS; i++)
        ok = ds4f_session_eval(s, tokens + i, 1, logits + (size_t)i * V, 0, &err) == 0;
    if (!ok) printf("    %s: %s\n", rc->label, err.msg);
    if (stats) ds4f_model_get_stream_stats(m, stats);
    ds4f_session_free(s);
    ds4f_model_close(m);
    if (!ok) {
        free(logits);
        return NULL;
    }
    return logits;
}

TEST(stream_logits_identical_across_placement) {
    const int threads_before = kernels_threads();
    char dir[256], packed[300];
    REQUIRE(stream_test_tmpdir(dir, sizeof dir) == 0, "cannot create a temporary directory");
    snprintf(packed, sizeof packed, "%s/small.experts", dir);
    ds4f_error err;
    REQUIRE(stream_test_pack(SMALL, packed, &err) == 0, "pack: %s", err.msg);

    const run_config ref_cfg = {"resident, 1 thread", 1, 0, 0, 0, 0, 1, 0, NULL, 0, 0};
    int V = 0;
    float *ref = run_300(&ref_cfg, dir, packed, &V, NULL);
    REQUIRE(ref, "reference run failed");
    const run_config configs[] = {
        {"1 slot per block, shards, prefetch, direct, 1 thread", 0, -1, 0, 0, 0, 1, 0, NULL, 0, 0},
        {"every expert cached, shards, prefetch, direct, 2 threads", 0, 0, 0, 0, 0, 2, 0, NULL, 0, 0},
        {"1 slot per block, packed, prefetch, direct, 2 threads", 0, -1, 1, 0, 0, 2, 0, NULL, 0, 0},
        {"every expert cached, packed, no prefetch, buffered, 1 thread", 0, 0, 1, 1, 1, 1, 0, NULL, 0, 0},
        {"1 slot per block, shards, no prefetch, buffered, 2 threads", 0, -1, 0, 1, 1, 2, 0, NULL, 0, 0},
        {"3 slots (fewer than a token's 6), shards, prefetch, LRU, 1 I/O thread", 0, 3, 0, 0, 0, 2, 1, "lru", 0, 0},
        {"24 slots, packed, prefetch, direct, 2 threads, 2 I/O threads, LFRU, trace", 0, 24, 1, 0, 0, 2, 2, "lfru", 1, 0},
        {"16 slots, 8 pinned from the trace, shards, prefetch, 2 threads", 0, 16, 0, 0, 0, 2, 0, NULL, 0, 8},
    };
    const size_t n_values = (size_t)RUN_TOKENS * V;
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        int v2 = 0;
        ds4f_stream_stats st;
        float *got = run_300(&configs[i], dir, packed, &v2, &st);
        CHECK(got && v2 == V, "%s: run failed", configs[i].label);
        if (!got) continue;
        size_t first = 0;
        while (first < n_values && !memcmp(&got[first], &ref[first], sizeof(float))) first++;
        CHECK(first == n_values, "%s: logits differ from the resident run at position %zu, token %zu", configs[i].label,
              first / (size_t)V, first % (size_t)V);
        CHECK(st.streaming && st.expert_requests > 0, "%s: the cache was not used", configs[i].label);
        CHECK(st.read_failures == 0, "%s: %llu read failures", configs[i].label, (unsigned long long)st.read_failures);
        if (!configs[i].buffered && stream_test_direct_io_works(dir))
            CHECK(st.direct_io, "%s: direct I/O was asked for and works here, but is off", configs[i].label);
        if (configs[i].buffered) CHECK(!st.direct_io, "%s: buffered I/O was asked for", configs[i].label);
        CHECK(st.packed == configs[i].packed, "%s: packed %d", configs[i].label, st.packed);
        if (configs[i].pin_slots) CHECK(st.pinned_slots == configs[i].pin_slots, "%s: %d slots pinned", configs[i].label,
                                        st.pinned_slots);
        if (configs[i].slots == 0) CHECK(st.hits + st.misses == st.expert_requests && st.misses <= (uint64_t)st.total_experts,
                                         "%s: a cache holding everything reads each expert once", configs[i].label);
        free(got);
    }
    free(ref);
    stream_test_rmdir(dir);
    kernels_set_threads(threads_before);
}

/* ---- the cache's slot rules, with reads held at a gate ---- */

typedef struct gated_io {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int open;            /* reads pass */
    int waiting;         /* reads held at the gate now */
    int reads;           /* preads issued */
    uint64_t offsets[256];
    int n_offsets;
} gated_io;

static ssize_t gated_pread(void *ctx, int fd, void *dst, size_t bytes, uint64_t offset) {
    gated_io *g = ctx;
    pthread_mutex_lock(&g->lock);
    g->reads++;
    if (g->n_offsets < 256) g->offsets[g->n_offsets++] = offset ^ ((uint64_t)fd << 48);
    g->waiting++;
    pthread_cond_broadcast(&g->cond);
    while (!g->open) pthread_cond_wait(&g->cond, &g->lock);
    g->waiting--;
    pthread_mutex_unlock(&g->lock);
    return pread(fd, dst, bytes, (off_t)offset);
}

static void gate_set(gated_io *g, int open) {
    pthread_mutex_lock(&g->lock);
    g->open = open;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
}

static void gate_wait_for_reads(gated_io *g, int n) {
    pthread_mutex_lock(&g->lock);
    while (g->waiting < n) pthread_cond_wait(&g->cond, &g->lock);
    pthread_mutex_unlock(&g->lock);
}

/* Waits until key is READY (reads run on the pool's threads). */
static int wait_ready(expert_source *src, int32_t key) {
    for (int i = 0; i < 5000; i++) {
        if (expert_cache_key_state(src, key) == 2) return 1;
        usleep(1000);
    }
    return 0;
}

static int offsets_read_twice(const gated_io *g) {
    for (int i = 0; i < g->n_offsets; i++)
        for (int j = i + 1; j < g->n_offsets; j++)
            if (g->offsets[i] == g->offsets[j]) return 1;
    return 0;
}

TEST(stream_cache_inflight_slots_are_never_claimed_twice_or_evicted) {
    model_weights w;
    ds4f_error err;
    REQUIRE(stream_test_load_weights(SMALL, &w, &err) == 0, "%s", err.msg);
    const int K = w.config.num_experts_per_tok, E = w.config.n_routed_experts;
    gated_io g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, {0}, 0};
    const io_ops ops = {&g, gated_pread};
    expert_cache_options co;
    expert_cache_options_init(&co);
    co.slots = K + 2;
    co.io_threads = 2;
    co.io = &ops;
    expert_source *src = NULL;
    REQUIRE(stream_test_cache(&w, 0, &co, &src, &err) == 0, "%s", err.msg);

    /* A hint starts reading expert 3 of block 2 and is held at the gate. */
    int32_t id = 3;
    src->prefetch(src, 2, &id, 1, PREFETCH_GUESS);
    gate_wait_for_reads(&g, 1);
    CHECK(expert_cache_key_state(src, 2 * E + 3) == 1, "the hinted expert is INFLIGHT");
    /* A second hint for it and a demand for it join the read in flight. */
    src->prefetch(src, 2, &id, 1, PREFETCH_GUESS);
    expert_request *req = calloc(1, sizeof *req);
    req->block = 2;
    req->n = 1;
    req->n_tokens = 1;
    req->ids[0] = 3;
    REQUIRE(src->begin(src, req, &err) == 0, "%s", err.msg);
    gate_set(&g, 1);
    int index = -1;
    CHECK(src->next(src, req, &index, &err) == 1 && index == 0, "the joined expert is delivered");
    CHECK(stream_test_view_matches(&w, 2, 3, &req->views[0]), "delivered bytes are the checkpoint's");
    src->finish(src, req, 0);
    CHECK(src->next(src, req, &index, &err) == 0, "nothing more to deliver");
    src->end(src, req);
    CHECK(!offsets_read_twice(&g), "one read per expert, not one per hint or request");
    stream_stats st;
    expert_cache_get_stats(src, &st);
    CHECK(st.misses == 1 && st.hits == 0 && st.prefetch_late[PREFETCH_GUESS] == 1 && st.prefetch_used[PREFETCH_GUESS] == 1,
          "a demand that joins a hint in flight is a miss and a late prefetch (misses %llu, late %llu)",
          (unsigned long long)st.misses, (unsigned long long)st.prefetch_late[1]);
    src->destroy(src);

    /* K + 1 slots; a hint holds one INFLIGHT. A demand for K + 1 other experts gets K slots at
     * once; the last must wait (the INFLIGHT slot is not taken) until the caller finishes some. */
    memset(&g, 0, sizeof g);
    pthread_mutex_init(&g.lock, NULL);
    pthread_cond_init(&g.cond, NULL);
    co.slots = K + 1;
    REQUIRE(stream_test_cache(&w, 0, &co, &src, &err) == 0, "%s", err.msg);
    id = E - 1;
    src->prefetch(src, 4, &id, 1, PREFETCH_GUESS);
    gate_wait_for_reads(&g, 1);
    memset(req, 0, sizeof *req);
    req->block = 4;
    req->n = K + 1;
    req->n_tokens = 2;
    for (int i = 0; i <= K; i++) req->ids[i] = i;
    REQUIRE(src->begin(src, req, &err) == 0, "%s", err.msg);
    int waiting_for_slot = 0;
    for (int i = 0; i <= K; i++) waiting_for_slot += expert_cache_key_state(src, 4 * E + i) == -1;
    CHECK(expert_cache_key_state(src, 4 * E + E - 1) == 1 && waiting_for_slot == 1,
          "the hinted expert stays INFLIGHT, one demanded expert waits for a slot (%d)", waiting_for_slot);
    gate_set(&g, 1);
    int delivered = 0;
    while (src->next(src, req, &index, &err) == 1) {
        CHECK(stream_test_view_matches(&w, 4, req->ids[index], &req->views[index]), "expert %d bytes", req->ids[index]);
        src->finish(src, req, index);
        delivered++;
    }
    src->end(src, req);
    CHECK(delivered == K + 1, "all %d experts delivered through %d slots (%d)", K + 1, K + 1, delivered);
    CHECK(!offsets_read_twice(&g), "each expert read once");
    free(req);
    src->destroy(src);
    model_weights_free(&w);
}

TEST(stream_cache_hints_never_evict_pinned_or_protected_experts) {
    model_weights w;
    ds4f_error err;
    REQUIRE(stream_test_load_weights(SMALL, &w, &err) == 0, "%s", err.msg);
    const int K = w.config.num_experts_per_tok, E = w.config.n_routed_experts;
    /* The rule below counts the slots demand could take without waiting: free ones and READY
     * unpinned ones, protected or not. The exact hints' reads are held at the gate so that they stay
     * INFLIGHT (not takeable) while the guesses are judged; a READY exact hint would count. */
    gated_io g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 1, 0, 0, {0}, 0};
    const io_ops ops = {&g, gated_pread};
    expert_cache_options co;
    expert_cache_options_init(&co);
    co.slots = 2 * K + 2;
    co.io = &ops;
    expert_source *src = NULL;
    REQUIRE(stream_test_cache(&w, 0, &co, &src, &err) == 0, "%s", err.msg);
    /* A demand request holds K experts of block 3 (pinned while computing). */
    expert_request *req = calloc(1, sizeof *req);
    req->block = 3;
    req->n = K;
    req->n_tokens = 1;
    for (int i = 0; i < K; i++) req->ids[i] = i;
    REQUIRE(expert_request_acquire_all(src, req, &err) == 0, "%s", err.msg);
    /* Exact hints for block 1 may take free slots as long as K stay for demand: 2 of them. */
    int32_t ids[16];
    for (int i = 0; i < K; i++) ids[i] = i;
    gate_set(&g, 0);
    src->prefetch(src, 1, ids, K, PREFETCH_EXACT);
    int exact_in = 0;
    for (int i = 0; i < K; i++) exact_in += expert_cache_key_state(src, 1 * E + i) >= 1;
    CHECK(exact_in == 2, "%d exact hints taken, expected 2", exact_in);
    /* Guesses may take nothing now: the rest is pinned or must stay free for demand. */
    for (int i = 0; i < K; i++) ids[i] = E - 1 - i;
    src->prefetch(src, 2, ids, K, PREFETCH_GUESS);
    for (int i = 0; i < K; i++) CHECK(expert_cache_key_state(src, 2 * E + E - 1 - i) == -1, "guess %d dropped", i);
    for (int i = 0; i < K; i++) CHECK(expert_cache_key_state(src, 3 * E + i) == 2, "pinned expert %d stays READY", i);
    gate_set(&g, 1);
    expert_request_release(src, req);
    /* Unpinned: guesses for block 2 fill the free slots; then guesses for block 5 must evict, and
     * may only take block 3's experts (used, unprotected), not the hinted ones still to be used. */
    src->prefetch(src, 2, ids, K, PREFETCH_GUESS);
    for (int i = 0; i < K; i++) CHECK(wait_ready(src, 2 * E + E - 1 - i), "guess for block 2 expert %d", E - 1 - i);
    for (int i = 0; i < 2; i++) CHECK(wait_ready(src, 1 * E + i), "exact hint %d", i);
    for (int i = 0; i < K; i++) ids[i] = i;
    src->prefetch(src, 5, ids, K, PREFETCH_GUESS);
    for (int i = 0; i < K; i++) CHECK(wait_ready(src, 5 * E + i), "guess for block 5 expert %d", i);
    for (int i = 0; i < 2; i++) CHECK(expert_cache_key_state(src, 1 * E + i) == 2, "protected exact hint %d evicted", i);
    for (int i = 0; i < K; i++)
        CHECK(expert_cache_key_state(src, 2 * E + E - 1 - i) == 2, "protected guess %d evicted", E - 1 - i);
    for (int i = 0; i < K; i++) CHECK(expert_cache_key_state(src, 3 * E + i) == -1, "block 3 expert %d evicted", i);
    free(req);
    src->destroy(src);
    model_weights_free(&w);
}

/* ---- I/O pool priorities ---- */

typedef struct order_io {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int first_held;      /* the first read waits until released */
    int released;
    uint64_t order[64];
    int n;
} order_io;

static ssize_t order_pread(void *ctx, int fd, void *dst, size_t bytes, uint64_t offset) {
    order_io *o = ctx;
    pthread_mutex_lock(&o->lock);
    if (o->n < 64) o->order[o->n] = offset;
    const int me = o->n++;
    pthread_cond_broadcast(&o->cond);
    while (me == 0 && !o->released) pthread_cond_wait(&o->cond, &o->lock);
    pthread_mutex_unlock(&o->lock);
    memset(dst, 0, bytes);
    (void)fd;
    return (ssize_t)bytes;
}

static void count_done(void *ctx, io_job *job) {
    (void)job;
    __atomic_add_fetch((int *)ctx, 1, __ATOMIC_SEQ_CST);
}

TEST(stream_io_pool_demand_chunks_go_before_speculative_ones) {
    order_io o = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 1, 0, {0}, 0};
    const io_ops ops = {&o, order_pread};
    io_pool *pool;
    ds4f_error err;
    REQUIRE(io_pool_create(1, 4096, &ops, &pool, &err) == 0, "%s", err.msg);
    static uint8_t buf_a[4 * 4096] __attribute__((aligned(4096))), buf_b[2 * 4096] __attribute__((aligned(4096)));
    int done = 0;
    io_job a = {0}, b = {0};
    a.seg[0] = (io_segment){.fd = -1, .path = "a", .offset = 0, .bytes = sizeof buf_a, .needed_bytes = sizeof buf_a, .dst = buf_a};
    a.n_segments = 1;
    a.priority = IO_SPECULATIVE;
    a.done = count_done;
    a.done_ctx = &done;
    b.seg[0] = (io_segment){.fd = -1, .path = "b", .offset = 1 << 20, .bytes = sizeof buf_b, .needed_bytes = sizeof buf_b, .dst = buf_b};
    b.n_segments = 1;
    b.priority = IO_DEMAND;
    b.done = count_done;
    b.done_ctx = &done;
    io_pool_submit(pool, &a);
    pthread_mutex_lock(&o.lock);
    while (o.n < 1) pthread_cond_wait(&o.cond, &o.lock);
    pthread_mutex_unlock(&o.lock);
    io_pool_submit(pool, &b); /* arrives while a's first chunk is in flight */
    pthread_mutex_lock(&o.lock);
    o.released = 1;
    pthread_cond_broadcast(&o.cond);
    pthread_mutex_unlock(&o.lock);
    while (__atomic_load_n(&done, __ATOMIC_SEQ_CST) < 2) usleep(1000);
    io_pool_destroy(pool);
    const uint64_t want[6] = {0, 1 << 20, (1 << 20) + 4096, 4096, 8192, 12288};
    CHECK(o.n == 6, "6 chunk reads, not %d", o.n);
    for (int i = 0; i < 6 && i < o.n; i++) CHECK(o.order[i] == want[i], "read %d at %llu, expected %llu", i,
                                                  (unsigned long long)o.order[i], (unsigned long long)want[i]);
    CHECK(!a.failed && !b.failed && a.bytes_read == sizeof buf_a && b.bytes_read == sizeof buf_b, "both jobs complete");
}

/* ---- memory plan ---- */

static uint64_t compressor_state_bytes(const compressor_state *st) {
    if (!st->kv_rows) return 0;
    const uint64_t coff = st->overlap ? 2 : 1;
    return 2 * (coff * st->ratio) * (coff * st->dim) * sizeof(float) + (uint64_t)st->capacity * st->dim * 2;
}

static void check_plan_against_session(const char *dir, int context, int chunk, int mtp) {
    model_weights w;
    ds4f_error err;
    if (stream_test_load_weights(dir, &w, &err) != 0) {
        CHECK(0, "%s", err.msg);
        return;
    }
    const model_config *c = &w.config;
    expert_source *src = NULL;
    nn_session *s = NULL;
    CHECK(expert_source_resident_create(&w, 0, &src, &err) == 0 &&
              nn_session_create(&w, src, context, chunk, &s, &err) == 0 && (!mtp || nn_session_keep_states(s, context, &err) == 0),
          "%s", err.msg);
    if (s) {
        uint64_t actual = ((uint64_t)s->scratch_bytes + 63) & ~(uint64_t)63;
        for (int b = 0; b < w.n_blocks; b++) {
            actual += (uint64_t)c->sliding_window * c->head_dim * 2;
            actual += compressor_state_bytes(&s->blocks[b].compressor) + compressor_state_bytes(&s->blocks[b].indexer);
        }
        actual += 2 * (uint64_t)chunk * c->hc_mult * c->hidden_size * sizeof(float);
        if (mtp) actual += (uint64_t)s->kept_capacity * c->hc_mult * c->hidden_size * sizeof(float);
        actual += moe_workspace_bytes(c, chunk) + (uint64_t)c->vocab_size * sizeof(float);
        const uint64_t planned = memory_plan_session_bytes(c, context, chunk, mtp);
        CHECK(planned == actual, "%s context %d chunk %d: plan %llu bytes, the session allocates %llu", dir, context, chunk,
              (unsigned long long)planned, (unsigned long long)actual);
        const uint64_t resident = memory_plan_resident_bytes(&w.ck);
        CHECK(resident >= w.arena_bytes && resident - w.arena_bytes < w.arena_bytes / 10,
              "%s: resident forecast %llu vs arena %llu", dir, (unsigned long long)resident,
              (unsigned long long)w.arena_bytes);
    }
    nn_session_free(s);
    if (src) src->destroy(src);
    model_weights_free(&w);
}

TEST(stream_plan_matches_session_allocations) {
    check_plan_against_session(SMALL, 300, 64, 0);
    check_plan_against_session(SMALL, 4096, 16, 1);
    check_plan_against_session("tests/data/golden/wide", 1000, 32, 0);
}

TEST(stream_plan_refuses_with_numbers) {
    checkpoint ck;
    ds4f_error err;
    REQUIRE(checkpoint_open(&ck, SMALL, &err) == 0, "%s", err.msg);
    memory_plan_request req = {.budget_bytes = 40u << 20, .context = 4096, .sessions = 1, .chunk = 64,
                               .slot_bytes = 53248, .io_threads = 8};
    memory_plan p;
    REQUIRE(memory_plan_build(&ck, &req, &p, &err) == 0, "%s", err.msg);
    CHECK(!p.fits && strstr(p.refusal, "GiB") && strstr(p.refusal, "resident weights"), "refusal: %s", p.refusal);
    req.budget_bytes = 1ull << 30;
    REQUIRE(memory_plan_build(&ck, &req, &p, &err) == 0, "%s", err.msg);
    CHECK(p.fits && p.cache_slots == p.total_experts, "a roomy budget caches every expert (%d of %d)", p.cache_slots,
          p.total_experts);
    req.cache_slots = 100000;
    REQUIRE(memory_plan_build(&ck, &req, &p, &err) == 0, "%s", err.msg);
    CHECK(!p.fits && strstr(p.refusal, "100000 slots"), "too many explicit slots: %s", p.refusal);
    checkpoint_close(&ck);
    CHECK(memory_parse_size("16G") == 16ull << 30 && memory_parse_size("800M") == 800ull << 20 &&
              memory_parse_size("1.5g") == 3ull << 29 && memory_parse_size("123") == 123 && memory_parse_size("12Q") == 0 &&
              memory_parse_size("-1G") == 0 && memory_parse_size("16GiB") == 16ull << 30,
          "sizes");
}

/* ---- checksum, trace, replay ---- */

TEST(stream_checksum_incremental_and_sensitive) {
    uint8_t data[1000];
    for (int i = 0; i < 1000; i++) data[i] = (uint8_t)(i * 7 + 3);
    const uint64_t whole = checksum64(data, sizeof data, 0);
    checksum_state st;
    checksum_begin(&st, 0);
    checksum_update(&st, data, 320);
    checksum_update(&st, data + 320, 680);
    CHECK(checksum_end(&st) == whole, "updates of 32-byte multiples equal one pass");
    for (int i = 0; i < 1000; i += 37) {
        data[i] ^= 1;
        CHECK(checksum64(data, sizeof data, 0) != whole, "a flipped bit at %d changes the checksum", i);
        data[i] ^= 1;
    }
    CHECK(checksum64(data, 999, 0) != whole && checksum64(data, sizeof data, 1) != whole, "length and seed count");
}

static int write_trace(const char *path, int experts, int k, const int32_t *seq, int n) {
    stream_trace t;
    ds4f_error err;
    trace_header h = {1, experts, k, 0, 1, 4096};
    if (trace_create(&t, path, &h, &err) != 0) return -1;
    for (int i = 0; i < n; i++) trace_record(&t, (uint64_t)i, i, 7, 0, seq + (size_t)i * k, k);
    return trace_close(&t, &err);
}

static double replay_hits(const trace_data *t, int slots, policy_kind kind, double half_life) {
    replay_result r;
    ds4f_error err;
    if (replay_simulate(t, slots, kind, half_life, &r, &err) != 0) return -1;
    return (double)r.hits;
}

TEST(stream_trace_round_trip_and_replay) {
    char dir[256], path[300];
    REQUIRE(stream_test_tmpdir(dir, sizeof dir) == 0, "tmpdir");
    snprintf(path, sizeof path, "%s/t.trace", dir);
    /* keys 0 1 2 0 1 2, two slots: LRU never hits, Belady hits twice. */
    const int32_t cyc[6] = {0, 1, 2, 0, 1, 2};
    REQUIRE(write_trace(path, 4, 1, cyc, 6) == 0, "write");
    trace_data t;
    ds4f_error err;
    REQUIRE(trace_load(path, &t, &err) == 0, "%s", err.msg);
    CHECK(t.n_lines == 6 && t.header.experts == 4 && t.lines[3].pos == 3 && t.experts[4] == 1, "round trip");
    CHECK(replay_hits(&t, 2, POLICY_LRU, 1) == 0 && replay_hits(&t, 2, POLICY_BELADY, 1) == 2, "LRU %g, Belady %g",
          replay_hits(&t, 2, POLICY_LRU, 1), replay_hits(&t, 2, POLICY_BELADY, 1));
    trace_free(&t);
    /* One key every third request among keys seen once: decayed counts keep it, LRU drops it. */
    int32_t seq[300];
    for (int i = 0; i < 300; i++) seq[i] = i % 3 == 0 ? 0 : 1 + (i * 7919) % 3000 % 63;
    REQUIRE(write_trace(path, 64, 1, seq, 300) == 0, "write");
    REQUIRE(trace_load(path, &t, &err) == 0, "%s", err.msg);
    const double lru = replay_hits(&t, 2, POLICY_LRU, 1), lfru = replay_hits(&t, 2, POLICY_LFRU, 100),
                 opt = replay_hits(&t, 2, POLICY_BELADY, 1);
    CHECK(lfru > lru && opt >= lfru, "LRU %g < LFRU %g <= Belady %g", lru, lfru, opt);
    trace_free(&t);
    /* Random traces: Belady is never beaten; a cache of every key only misses each key once. */
    uint32_t x = 99;
    int32_t rnd[2000 * 3];
    for (int i = 0; i < 2000; i++) {
        for (int j = 0; j < 3; j++) {
            int e;
            do {
                x = x * 1103515245u + 12345u;
                e = (int)((x >> 16) % 40u);
                e = e < 20 ? e / 4 : e; /* skewed */
            } while ((j > 0 && e == rnd[i * 3]) || (j > 1 && e == rnd[i * 3 + 1]));
            rnd[i * 3 + j] = e;
        }
        /* ascending ids per line, as the engine records them */
        for (int a = 1; a < 3; a++)
            for (int b = a; b > 0 && rnd[i * 3 + b - 1] > rnd[i * 3 + b]; b--) {
                int32_t tmp = rnd[i * 3 + b]; rnd[i * 3 + b] = rnd[i * 3 + b - 1]; rnd[i * 3 + b - 1] = tmp;
            }
    }
    REQUIRE(write_trace(path, 40, 3, rnd, 2000) == 0, "write");
    REQUIRE(trace_load(path, &t, &err) == 0, "%s", err.msg);
    for (int s = 3; s <= 40; s += 5) {
        const double b = replay_hits(&t, s, POLICY_BELADY, 1);
        CHECK(b >= replay_hits(&t, s, POLICY_LRU, 1) && b >= replay_hits(&t, s, POLICY_LFRU, 8) &&
                  b >= replay_hits(&t, s, POLICY_NEXTUSE, 8),
              "Belady beaten at %d", s);
    }
    CHECK(replay_hits(&t, 40, POLICY_LRU, 1) == 2000 * 3 - 25, "a cache of every key misses each of the 25 keys once (%g)",
          replay_hits(&t, 40, POLICY_LRU, 1));
    trace_free(&t);
    stream_test_rmdir(dir);
}

/* The run report's decode-phase prefetch waste: a snapshot counts the prefetched experts not used
 * yet as wasted, so the count can fall between two snapshots (experts prefetched during the
 * prompt and used while decoding). That is no waste, never a wrapped-around unsigned difference. */
TEST(stream_report_prefetch_waste_never_negative) {
    run_report r;
    memset(&r, 0, sizeof r);
    r.prompt_done.seconds = 1.0;
    r.end.seconds = 3.0;
    r.decode_tokens = 2;
    r.end.stream.expert_bytes = 1000000000ull; /* 1 GB per expert: figures in experts */
    r.prompt_done.stream.prefetch_wasted[1] = 7;
    r.end.stream.prefetch_wasted[1] = 3;
    run_figures f;
    run_report_figures(&r, &f);
    CHECK(f.wasted_gb_per_token == 0.0, "wasted %.3g GB/token from a falling count", f.wasted_gb_per_token);
    r.end.stream.prefetch_wasted[1] = 11; /* 4 more wasted over 2 tokens */
    run_report_figures(&r, &f);
    CHECK(fabs(f.wasted_gb_per_token - 2.0) < 1e-9, "wasted %.3g GB/token, expected 2", f.wasted_gb_per_token);
}
