/* How the forward pass gets routed experts.
 *
 * The MoE sublayer names, for one block, the distinct experts a chunk of tokens was routed to
 * (an expert_request), then takes them one at a time in whatever order they become available:
 *
 *     begin(req)            reserve and start fetching everything the request names
 *     while next(req, &i)   expert req->ids[i] is in RAM: compute with req->views[i] ...
 *         finish(req, i)    ... then hand it back (its slot may be reused from now on)
 *     end(req)              hand back anything still held (also after an error)
 *
 * Implementations: all experts resident in RAM (below), and the streaming cache of the stream
 * layer (stream/expert_cache.h). Contract, relied on by the callers:
 *  - next() delivers an expert only when every byte of it arrived (invariant 3); a failed or
 *    short read makes next() fail with a message naming the file and offset.
 *  - The views show exactly the checkpoint's bytes wherever they live (invariant 2), so the order
 *    of delivery may vary from run to run but the numbers computed from a view never do.
 *  - A delivered view stays valid until finish(req, i) or end(req). The caller finishes each
 *    delivered expert before asking next() again; that is what lets a request name more experts
 *    than the cache has slots (the slots are recycled within the request).
 *  - prefetch() is a hint: the source may read the experts early, at lower priority than any
 *    demand read, or ignore it. It never changes what a later request delivers. */
#ifndef DS4F_MODEL_EXPERT_SOURCE_H
#define DS4F_MODEL_EXPERT_SOURCE_H

#include "model/weights.h"

/* Distinct experts one request may name: n_routed_experts must not exceed it (the real model has
 * 256). */
#define EXPERT_REQUEST_MAX 512

typedef struct expert_view {
    fp4_matrix w1; /* gate_proj [inter, d] */
    fp4_matrix w3; /* up_proj   [inter, d] */
    fp4_matrix w2; /* down_proj [d, inter] */
} expert_view;

enum { EXPERT_PENDING = 0, EXPERT_DELIVERED = 1, EXPERT_FINISHED = 2 };

typedef struct expert_request {
    /* set by the caller */
    int block;
    int n;                                /* distinct experts, ascending ids */
    int n_tokens;                         /* tokens of the chunk that routed to them (>= 1) */
    int32_t ids[EXPERT_REQUEST_MAX];
    /* filled by the source */
    expert_view views[EXPERT_REQUEST_MAX];
    uint8_t status[EXPERT_REQUEST_MAX];   /* EXPERT_PENDING / DELIVERED / FINISHED */
    int32_t handle[EXPERT_REQUEST_MAX];   /* the source's own bookkeeping (cache slot), -1 if none */
    int delivered;
} expert_request;

/* Why a prefetch hint was given: exact (hash-routed layers: the token id decides the experts)
 * or a guess (the router of the next layer applied early). Counted separately. */
typedef enum { PREFETCH_EXACT = 0, PREFETCH_GUESS = 1 } prefetch_kind;

typedef struct expert_source expert_source;
struct expert_source {
    int (*begin)(expert_source *self, expert_request *req, ds4f_error *err);
    /* 1 and *index set: req->views[*index] is ready. 0: every expert was delivered. -1: error. */
    int (*next)(expert_source *self, expert_request *req, int *index, ds4f_error *err);
    /* As next(), but never waits: 0 also when nothing more is in RAM right now. Unlike next() it may
     * be called while delivered experts are still held (it cannot deadlock on their slots), which
     * lets the caller gather every expert already in RAM and compute them side by side. */
    int (*ready)(expert_source *self, expert_request *req, int *index, ds4f_error *err);
    void (*finish)(expert_source *self, expert_request *req, int index);
    void (*end)(expert_source *self, expert_request *req);
    /* May be NULL (no prefetching). ids need not be distinct or sorted. */
    void (*prefetch)(expert_source *self, int block, const int32_t *ids, int n, prefetch_kind kind);
    void (*destroy)(expert_source *self);
    /* Optional (may be NULL): told, before begin(), which experts each token of the chunk was
     * routed to (ascending ids). The streaming source records traces from it. */
    void (*routed)(expert_source *self, int block, int64_t pos, int32_t token, const int32_t *ids, int k);
    /* Whether the MoE sublayer should compute next-layer router guesses for prefetch(). */
    int wants_lookahead;
};

/* Reads every routed expert into RAM once (fine when they fit: the golden and small synthetic
 * models, or a big machine). The reference the streaming cache is compared with. */
int expert_source_resident_create(const model_weights *m, int show_progress, expert_source **out, ds4f_error *err);

/* Blocking convenience for callers that want all experts at once (tests, tools): begin + next
 * until done. The views stay valid until expert_request_release. */
int expert_request_acquire_all(expert_source *src, expert_request *req, ds4f_error *err);
void expert_request_release(expert_source *src, expert_request *req);

/* Points views at one expert's six tensors laid out as in a contiguous record
 * (w1 weight, w1 scale, w3 weight, w3 scale, w2 weight, w2 scale). */
void expert_view_from_record(const model_config *c, const uint8_t *record, expert_view *v);
/* Same with each part at its own offset from base (a cache slot holding the expert's bytes as
 * they lie in the checkpoint's shards). */
void expert_view_from_parts(const model_config *c, const uint8_t *base, const uint64_t part_offsets[EXPERT_PARTS],
                            expert_view *v);
/* Byte offsets of the six parts inside such a record; offsets[EXPERT_PARTS] is the record size. */
void expert_record_layout(const model_config *c, uint64_t offsets[EXPERT_PARTS + 1]);

#endif
