/* Replacement policies of the expert cache, shared by the live cache and `ds4f replay` so that
 * what replay measures is what the engine does.
 *
 * A policy keeps one score per expert key (block * n_experts + expert) — also for experts not in
 * the cache, so that frequency survives eviction — and the cache evicts the lowest score among
 * the slots it may evict. Scores change only when their own key is touched; that is what lets
 * replay keep the cached keys in a heap.
 *
 *  - LRU: score = time of the last request.
 *  - LFRU: an exponentially decayed request count, count(t) = sum over past
 *    requests of 2^-((t - t_i) / half_life). Stored as log2(count) + t / half_life, which orders
 *    keys exactly like count(now) for every now without touching the others as time passes.
 *    Short half-lives behave like LRU, long ones like LFU; the experts of a layer that a model
 *    keeps choosing stay while one-off choices pass through.
 *  - Next-use (the default): LFRU's decayed count turned into a per-token probability p, and the layer cycle:
 *    every token visits the blocks in order, so an expert of block B can next be asked for when
 *    B comes round again (d requests from now), and then on average every 1/p tokens. Evicts the
 *    largest expected time to the next request, d + (1/p - 1) * blocks: Belady's rule with the
 *    future replaced by its expectation. Its values move with the clock, so replay scans for it.
 *  - Belady (replay only): score = -(time of the next request), the offline optimum.
 * Time counts MoE requests: one per block per chunk of tokens. */
#ifndef DS4F_STREAM_CACHE_POLICY_H
#define DS4F_STREAM_CACHE_POLICY_H

#include <stdint.h>

typedef enum { POLICY_LRU = 0, POLICY_LFRU = 1, POLICY_BELADY = 2, POLICY_NEXTUSE = 3 } policy_kind;

typedef struct cache_policy {
    policy_kind kind;
    double half_life;   /* LFRU, next-use: in requests */
    int n_keys;
    int n_experts;      /* key = block * n_experts + expert */
    int cycle_blocks;   /* requests per token (the main blocks) */
    double *score;      /* [n_keys]: higher = keep */
} cache_policy;

int policy_init(cache_policy *p, policy_kind kind, int n_keys, int n_experts, int cycle_blocks,
                double half_life_requests);
void policy_free(cache_policy *p);
void policy_reset(cache_policy *p);
/* A request for key at time now (Belady: next_use is the time of the key's next request, or
 * a huge value if none). */
void policy_touch(cache_policy *p, int key, double now, double next_use);
static inline double policy_score(const cache_policy *p, int key) { return p->score[key]; }
/* The value of keeping key at time now, while block current_block runs (higher = keep): the
 * stored score, or for next-use minus the expected requests until the key is asked for. */
double policy_keep_value(const cache_policy *p, int key, double now, int current_block);
const char *policy_name(policy_kind kind);
/* "lru", "lfru", "nextuse" -> kind; -1 if unknown (Belady is not a live policy). */
int policy_from_name(const char *name, policy_kind *out);

/* Default LFRU half-life, in tokens (chosen from replayed traces: README, "## Streaming"). */
#define POLICY_DEFAULT_HALF_LIFE_TOKENS 32.0

#endif
