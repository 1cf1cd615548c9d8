/* Sampling (see sampling.h for the rules). */
#include "text/sampling.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>

void sampling_params_default(sampling_params *p) {
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
}

int sampling_params_check(const sampling_params *p, ds4f_error *err) {
    if (!isfinite(p->temperature) || p->temperature < 0)
        return error_set(err, "temperature must be a finite number >= 0 (0 means greedy), got %g", p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return error_set(err, "top_p must be in (0, 1], got %g", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return error_set(err, "min_p must be in [0, 1], got %g", p->min_p);
    if (p->top_k < 0) return error_set(err, "top_k must be >= 0 (0 means off), got %d", p->top_k);
    return 0;
}

/* ---- random numbers ---------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void sampling_rng_seed(sampling_rng *r, uint64_t seed) {
    /* splitmix64 never yields four zero words in a row, the one state xoshiro cannot leave. */
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t sampling_rng_next(sampling_rng *r) {
    uint64_t *s = r->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double sampling_rng_uniform(sampling_rng *r) { return (double)(sampling_rng_next(r) >> 11) * 0x1.0p-53; }

/* ---- the sampler ---------------------------------------------------------------------------- */

typedef struct sampler_candidate {
    double weight;
    int32_t id;
} candidate;

int32_t sampling_argmax(const float *logits, int n) {
    int32_t best = -1;
    for (int i = 0; i < n; i++)
        if (!isnan(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
    return best < 0 ? 0 : best;
}

int sampler_init(sampler *s, int vocab, ds4f_error *err) {
    s->capacity = vocab;
    s->weight = malloc((size_t)vocab * sizeof *s->weight);
    s->order = malloc((size_t)vocab * sizeof *s->order);
    s->candidates = malloc((size_t)vocab * sizeof *s->candidates);
    if (!s->weight || !s->order || !s->candidates) {
        sampler_free(s);
        return error_set(err, "out of memory for the sampler (%d tokens)", vocab);
    }
    return 0;
}

void sampler_free(sampler *s) {
    free(s->weight);
    free(s->order);
    free(s->candidates);
    s->weight = NULL;
    s->order = NULL;
    s->candidates = NULL;
    s->capacity = 0;
}

static int by_weight_then_id(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->weight != y->weight) return x->weight > y->weight ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The candidates with weight >= t (and > 0), most probable first, into s->order. */
static int collect_sorted(sampler *s, int n, double t) {
    candidate *c = s->candidates;
    int count = 0;
    for (int i = 0; i < n; i++)
        if (s->weight[i] > 0 && s->weight[i] >= t) c[count++] = (candidate){s->weight[i], i};
    qsort(c, (size_t)count, sizeof *c, by_weight_then_id);
    for (int i = 0; i < count; i++) s->order[i] = c[i].id;
    return count;
}

/* Length of the kept prefix of the global order, if it can be decided from the candidates with
 * weight >= t (the first `count` of the global order); -1 when it needs the smaller ones too.
 * total: sum of all weights; positive: number of weights > 0. */
static int kept_prefix(const sampler *s, int count, int positive, double total, const sampling_params *p, double t) {
    const int complete = count == positive;
    int kept = complete ? count : INT_MAX;
    if (p->min_p > 0 && (double)p->min_p >= t) {
        /* The largest weight is exp(0) = 1, so min-p is a fixed weight threshold. */
        int m = 0;
        while (m < count && s->weight[s->order[m]] >= (double)p->min_p) m++;
        if (m < kept) kept = m;
    }
    int k_len = INT_MAX;
    double k_total = total;
    if (p->top_k > 0 && p->top_k < positive) {
        if (p->top_k > count) {
            /* The top-k set reaches below t: its sum (which top-p needs) is not known here. */
            if (p->top_p < 1) return -1;
        } else {
            k_len = p->top_k;
            k_total = 0;
            for (int i = 0; i < k_len; i++) k_total += s->weight[s->order[i]];
            if (k_len < kept) kept = k_len;
        }
    }
    if (p->top_p < 1) {
        const int limit = k_len < count ? k_len : count;
        const double target = (double)p->top_p * k_total;
        double cum = 0;
        int m = 0;
        while (m < limit && cum < target) cum += s->weight[s->order[m++]];
        if (cum >= target) {
            if (m < kept) kept = m;
        } else if (!complete && limit == count) {
            return -1; /* the cut lies among the smaller weights */
        }
        /* else rounding kept the sum just under the target: everything up to `limit` stays */
    }
    return kept == INT_MAX ? -1 : kept;
}

/* Computes the weights and the kept set. Returns the number of kept ids in s->order, or -1 when
 * no filter is active (every id is kept, in id order); *total is the kept weight. For greedy
 * (or logits with no finite maximum) the kept set is the argmax alone. */
static int prepare(sampler *s, const float *logits, int n, const sampling_params *p, double *total) {
    float max = -INFINITY;
    for (int i = 0; i < n; i++)
        if (logits[i] > max) max = logits[i];
    if (p->temperature <= 0 || !isfinite(max)) {
        s->order[0] = sampling_argmax(logits, n);
        *total = 1;
        return 1;
    }
    const double inv_t = 1.0 / (double)p->temperature;
    double sum = 0;
    int positive = 0;
    for (int i = 0; i < n; i++) {
        double w = isnan(logits[i]) ? 0.0 : exp(((double)logits[i] - (double)max) * inv_t);
        s->weight[i] = w;
        sum += w;
        positive += w > 0;
    }
    *total = sum;
    if (p->top_k <= 0 && p->top_p >= 1 && p->min_p <= 0) return -1;

    /* Sorting the whole vocabulary (129k ids) for every token is wasteful when almost all the
     * probability sits in a few thousand ids: try only the weights >= t first, and fall back
     * to all of them when that does not decide the cut. Both give the same kept set. */
    const double first_t = p->min_p > 0 ? (double)p->min_p : 1e-6;
    int kept = kept_prefix(s, collect_sorted(s, n, first_t), positive, sum, p, first_t);
    if (kept < 0) kept = kept_prefix(s, collect_sorted(s, n, 0), positive, sum, p, 0);
    double kept_sum = 0;
    for (int i = 0; i < kept; i++) kept_sum += s->weight[s->order[i]];
    *total = kept_sum;
    return kept;
}

void sampler_distribution(sampler *s, const float *logits, int n, const sampling_params *p, double *probs) {
    double total;
    const int kept = prepare(s, logits, n, p, &total);
    if (kept < 0) {
        for (int i = 0; i < n; i++) probs[i] = s->weight[i] / total;
        return;
    }
    for (int i = 0; i < n; i++) probs[i] = 0;
    if (p->temperature <= 0 || kept == 1) {
        probs[s->order[0]] = 1;
        return;
    }
    for (int i = 0; i < kept; i++) probs[s->order[i]] = s->weight[s->order[i]] / total;
}

int32_t sampler_sample(sampler *s, const float *logits, int n, const sampling_params *p, sampling_rng *rng) {
    if (p->temperature <= 0) return sampling_argmax(logits, n);
    double total;
    const int kept = prepare(s, logits, n, p, &total);
    const double u = sampling_rng_uniform(rng) * total;
    double cum = 0;
    if (kept < 0) {
        int32_t last = 0;
        for (int i = 0; i < n; i++) {
            if (s->weight[i] <= 0) continue;
            cum += s->weight[i];
            last = i;
            if (u < cum) return i;
        }
        return last; /* u landed on the rounding slack at the very end */
    }
    for (int i = 0; i < kept; i++) {
        cum += s->weight[s->order[i]];
        if (u < cum) return s->order[i];
    }
    return s->order[kept - 1];
}
