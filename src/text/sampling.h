/* Sampling: choosing the next token from a logits vector.
 *
 * Pure functions of (logits, parameters, random state), so that the same seed gives the same
 * tokens on every machine and in every build. The filters follow the order of Hugging Face's
 * generate() and vLLM, which is what "temperature 1.0, top_p 1.0" (DeepSeek's recommendation)
 * refers to:
 *
 *   1. temperature: p_i proportional to exp((logit_i - max) / T); T <= 0 means greedy (argmax,
 *      lowest id on ties);
 *   2. top-k: keep the k most probable tokens;
 *   3. top-p: renormalise over what is left and keep the smallest set of most probable tokens
 *      whose probability reaches top_p (the token that crosses it is kept);
 *   4. min-p: keep the tokens whose probability is at least min_p times the largest one.
 *
 * Every filter keeps a prefix of the tokens sorted by probability (descending, then ascending
 * id), so the kept set is simply the shortest of the three prefixes; the draw then walks that
 * prefix in the same order. NaN logits count as -infinity. */
#ifndef DS4F_TEXT_SAMPLING_H
#define DS4F_TEXT_SAMPLING_H

#include <stdint.h>
#include "base/error.h"

typedef struct sampling_params {
    float temperature; /* <= 0: greedy */
    int top_k;         /* <= 0: off */
    float top_p;       /* >= 1: off; must be > 0 */
    float min_p;       /* <= 0: off; must be <= 1 */
} sampling_params;

/* temperature 1, top_p 1, no top-k, no min-p: DeepSeek's recommendation. */
void sampling_params_default(sampling_params *p);
/* Refuses values that have no meaning (NaN, negative top-p, min-p above 1, ...), naming the
 * parameter. */
int sampling_params_check(const sampling_params *p, ds4f_error *err);

/* xoshiro256** seeded through splitmix64: small, fast, and the same sequence everywhere. */
typedef struct sampling_rng {
    uint64_t s[4];
} sampling_rng;

void sampling_rng_seed(sampling_rng *r, uint64_t seed);
uint64_t sampling_rng_next(sampling_rng *r);
/* Uniform in [0, 1), 53 random bits. */
double sampling_rng_uniform(sampling_rng *r);

/* The index of the largest logit (the lowest index among equal ones); 0 when all are NaN. */
int32_t sampling_argmax(const float *logits, int n);

/* Scratch space sized for one vocabulary, reused from token to token (no allocation per token). */
typedef struct sampler {
    int capacity;
    double *weight;  /* [capacity] exp((logit - max) / T) */
    int32_t *order;  /* [capacity] candidate ids, most probable first */
    struct sampler_candidate *candidates; /* [capacity] sort scratch */
} sampler;

int sampler_init(sampler *s, int vocab, ds4f_error *err);
void sampler_free(sampler *s);

/* The distribution the draw uses: probs[0..n) (zero outside the kept set, summing to 1).
 * n must not exceed the sampler's capacity. Parameters must have passed sampling_params_check. */
void sampler_distribution(sampler *s, const float *logits, int n, const sampling_params *p, double *probs);
/* Draws one token. Greedy draws nothing from rng, so a greedy step does not shift the random
 * sequence of the sampled steps that follow. */
int32_t sampler_sample(sampler *s, const float *logits, int n, const sampling_params *p, sampling_rng *rng);

#endif
