#include "stream/cache_policy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int policy_init(cache_policy *p, policy_kind kind, int n_keys, int n_experts, int cycle_blocks,
                double half_life_requests) {
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->n_experts = n_experts > 0 ? n_experts : 1;
    p->cycle_blocks = cycle_blocks > 0 ? cycle_blocks : 1;
    p->half_life = half_life_requests > 0 ? half_life_requests : 1;
    p->n_keys = n_keys;
    p->score = malloc((size_t)(n_keys > 0 ? n_keys : 1) * sizeof *p->score);
    if (!p->score) return -1;
    policy_reset(p);
    return 0;
}

void policy_free(cache_policy *p) {
    free(p->score);
    p->score = NULL;
}

void policy_reset(cache_policy *p) {
    for (int i = 0; i < p->n_keys; i++) p->score[i] = -INFINITY;
}

void policy_touch(cache_policy *p, int key, double now, double next_use) {
    switch (p->kind) {
    case POLICY_LRU:
        p->score[key] = now;
        break;
    case POLICY_LFRU:
    case POLICY_NEXTUSE: {
        /* count_now = 2^(score - now/H); after this request count_now + 1. */
        const double shift = now / p->half_life;
        const double count_now = exp2(p->score[key] - shift);
        p->score[key] = log2(count_now + 1.0) + shift;
        break;
    }
    case POLICY_BELADY:
        p->score[key] = -next_use;
        break;
    }
}

double policy_keep_value(const cache_policy *p, int key, double now, int current_block) {
    if (p->kind != POLICY_NEXTUSE) return p->score[key];
    const double cycle = p->cycle_blocks;
    /* A key asked for every token settles at count 1 / (1 - 2^(-cycle/H)): scale to [0, 1]. */
    double prob = exp2(p->score[key] - now / p->half_life) * (1.0 - exp2(-cycle / p->half_life));
    if (prob > 1) prob = 1;
    if (!(prob > 0)) return -INFINITY;
    const int block = key / p->n_experts;
    double until_block = cycle; /* MTP blocks and the running block: a full cycle away */
    if (block < p->cycle_blocks && block != current_block)
        until_block = (double)(((block - current_block) % p->cycle_blocks + p->cycle_blocks) % p->cycle_blocks);
    return -(until_block + (1.0 / prob - 1.0) * cycle);
}

const char *policy_name(policy_kind kind) {
    switch (kind) {
    case POLICY_LRU: return "lru";
    case POLICY_LFRU: return "lfru";
    case POLICY_BELADY: return "belady";
    case POLICY_NEXTUSE: return "nextuse";
    }
    return "?";
}

int policy_from_name(const char *name, policy_kind *out) {
    if (!strcmp(name, "lru")) *out = POLICY_LRU;
    else if (!strcmp(name, "lfru")) *out = POLICY_LFRU;
    else if (!strcmp(name, "nextuse")) *out = POLICY_NEXTUSE;
    else return -1;
    return 0;
}
