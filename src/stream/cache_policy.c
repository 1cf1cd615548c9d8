#include "stream/cache_policy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int policy_init(cache_policy *p, policy_kind kind, int n_keys, double half_life_requests) {
    memset(p, 0, sizeof *p);
    p->kind = kind;
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
    case POLICY_LFRU: {
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

const char *policy_name(policy_kind kind) {
    switch (kind) {
    case POLICY_LRU: return "lru";
    case POLICY_LFRU: return "lfru";
    case POLICY_BELADY: return "belady";
    }
    return "?";
}

int policy_from_name(const char *name, policy_kind *out) {
    if (!strcmp(name, "lru")) *out = POLICY_LRU;
    else if (!strcmp(name, "lfru")) *out = POLICY_LFRU;
    else return -1;
    return 0;
}
