/* Sampling: each filter against its definition, the fast candidate path against a plain full
 * sort, seeded reproducibility, and draw frequencies over many draws with a fixed seed (so the
 * checks are exact repeats, never flaky). */
#include "test.h"

#include <math.h>
#include <string.h>

#include "text/sampling.h"

/* Logits whose softmax is exactly the given probabilities (up to float rounding). */
static void logits_from_probs(const double *p, int n, float *logits) {
    for (int i = 0; i < n; i++) logits[i] = p[i] > 0 ? (float)log(p[i]) : -INFINITY;
}

static sampling_params params(float t, int k, float top_p, float min_p) {
    sampling_params p = {t, k, top_p, min_p};
    return p;
}

/* The distribution the sampler should use, computed the plain way: sort everything, apply the
 * filters one after another (top-k, top-p on the renormalised rest, min-p), renormalise. */
static void reference_distribution(const float *logits, int n, const sampling_params *p, double *probs) {
    double *w = malloc((size_t)n * sizeof *w);
    int *idx = malloc((size_t)n * sizeof *idx);
    float max = -INFINITY;
    for (int i = 0; i < n; i++)
        if (logits[i] > max) max = logits[i];
    for (int i = 0; i < n; i++) {
        w[i] = exp(((double)logits[i] - max) * (1.0 / p->temperature));
        idx[i] = i;
    }
    /* insertion sort would be slow for 129k; a simple shell sort keeps this independent of the
     * code under test */
    for (int gap = n / 2; gap > 0; gap /= 2)
        for (int i = gap; i < n; i++) {
            int v = idx[i], j = i;
            while (j >= gap && (w[idx[j - gap]] < w[v] || (w[idx[j - gap]] == w[v] && idx[j - gap] > v))) {
                idx[j] = idx[j - gap];
                j -= gap;
            }
            idx[j] = v;
        }
    int kept = 0;
    while (kept < n && w[idx[kept]] > 0) kept++;
    if (p->top_k > 0 && p->top_k < kept) kept = p->top_k;
    if (p->top_p < 1) {
        double total = 0, cum = 0;
        for (int i = 0; i < kept; i++) total += w[idx[i]];
        int m = 0;
        while (m < kept && cum < p->top_p * total) cum += w[idx[m++]];
        kept = m;
    }
    if (p->min_p > 0) {
        int m = 0;
        while (m < kept && w[idx[m]] >= p->min_p * w[idx[0]]) m++;
        kept = m;
    }
    double total = 0;
    for (int i = 0; i < kept; i++) total += w[idx[i]];
    for (int i = 0; i < n; i++) probs[i] = 0;
    for (int i = 0; i < kept; i++) probs[idx[i]] = w[idx[i]] / total;
    free(w);
    free(idx);
}

TEST(sampling_greedy) {
    sampler s;
    REQUIRE(sampler_init(&s, 8, NULL) == 0, "init");
    sampling_rng rng;
    sampling_rng_seed(&rng, 1);
    float logits[8] = {0.5f, 3.0f, -1.0f, 3.0f, NAN, 2.9f, -INFINITY, 1.0f};
    sampling_params g = params(0, 0, 1, 0);
    CHECK(sampling_argmax(logits, 8) == 1, "argmax takes the lowest id among equal maxima");
    const sampling_rng before = rng;
    CHECK(sampler_sample(&s, logits, 8, &g, &rng) == 1, "temperature 0 is greedy");
    CHECK(memcmp(&before, &rng, sizeof rng) == 0, "greedy draws no random number");
    double probs[8];
    sampler_distribution(&s, logits, 8, &g, probs);
    CHECK(probs[1] == 1 && probs[3] == 0, "greedy distribution is one-hot");
    float nans[3] = {NAN, NAN, NAN};
    CHECK(sampling_argmax(nans, 3) == 0, "all NaN gives id 0");
    /* top-k 1 is greedy too, whatever the temperature */
    sampling_params k1 = params(5.0f, 1, 1, 0);
    for (int i = 0; i < 50; i++) CHECK(sampler_sample(&s, logits, 8, &k1, &rng) == 1, "top-k 1");
    sampler_free(&s);
}

TEST(sampling_temperature_distribution) {
    sampler s;
    REQUIRE(sampler_init(&s, 5, NULL) == 0, "init");
    float logits[5] = {1.0f, 2.0f, 0.0f, -1.0f, 2.5f};
    const float temps[] = {1.0f, 0.5f, 2.0f};
    for (int t = 0; t < 3; t++) {
        sampling_params p = params(temps[t], 0, 1, 0);
        double probs[5], want[5], sum = 0;
        sampler_distribution(&s, logits, 5, &p, probs);
        for (int i = 0; i < 5; i++) sum += want[i] = exp(logits[i] / temps[t]);
        for (int i = 0; i < 5; i++)
            CHECK(fabs(probs[i] - want[i] / sum) < 1e-12, "T=%g id %d: %g vs %g", temps[t], i, probs[i], want[i] / sum);
    }
    sampler_free(&s);
}

TEST(sampling_top_k_top_p_min_p) {
    sampler s;
    REQUIRE(sampler_init(&s, 4, NULL) == 0, "init");
    const double p4[4] = {0.1, 0.4, 0.2, 0.3}; /* order by probability: 1, 3, 2, 0 */
    float logits[4];
    logits_from_probs(p4, 4, logits);
    double probs[4];

    sampling_params k2 = params(1, 2, 1, 0);
    sampler_distribution(&s, logits, 4, &k2, probs);
    CHECK(probs[0] == 0 && probs[2] == 0, "top-k 2 keeps ids 1 and 3");
    CHECK(fabs(probs[1] - 4.0 / 7) < 1e-6 && fabs(probs[3] - 3.0 / 7) < 1e-6, "top-k renormalises: %g %g", probs[1], probs[3]);

    sampling_params tp = params(1, 0, 0.5f, 0);
    sampler_distribution(&s, logits, 4, &tp, probs);
    CHECK(probs[1] > 0 && probs[3] > 0 && probs[2] == 0 && probs[0] == 0, "top-p 0.5: 0.4 < 0.5 so 0.3 joins");
    tp.top_p = 0.35f;
    sampler_distribution(&s, logits, 4, &tp, probs);
    CHECK(probs[1] == 1, "top-p 0.35: the first token alone reaches it");
    tp.top_p = 0.75f;
    sampler_distribution(&s, logits, 4, &tp, probs);
    CHECK(probs[2] > 0 && probs[0] == 0 && fabs(probs[2] - 0.2 / 0.9) < 1e-6, "top-p 0.75 keeps three (%g)", probs[2]);

    /* top-p applies to what top-k left, renormalised: with k=2 the first token has 4/7 > 0.5 */
    sampling_params both = params(1, 2, 0.5f, 0);
    sampler_distribution(&s, logits, 4, &both, probs);
    CHECK(probs[1] == 1, "top-k then top-p on the renormalised rest");

    sampling_params mp = params(1, 0, 1, 0.6f); /* threshold 0.6 * 0.4 = 0.24 */
    sampler_distribution(&s, logits, 4, &mp, probs);
    CHECK(probs[1] > 0 && probs[3] > 0 && probs[2] == 0 && probs[0] == 0, "min-p 0.6 keeps 0.4 and 0.3");
    CHECK(fabs(probs[1] - 4.0 / 7) < 1e-6, "min-p renormalises");
    mp.min_p = 1.0f;
    sampler_distribution(&s, logits, 4, &mp, probs);
    CHECK(probs[1] == 1, "min-p 1 keeps the maximum only");

    /* temperature is applied before the filters: at T=0.25 the top token has most of the mass */
    sampling_params cold = params(0.25f, 0, 0.5f, 0);
    sampler_distribution(&s, logits, 4, &cold, probs);
    CHECK(probs[1] == 1, "top-p after temperature");
    sampler_free(&s);
}

TEST(sampling_params_refused) {
    ds4f_error err;
    sampling_params ok;
    sampling_params_default(&ok);
    CHECK(ok.temperature == 1.0f && ok.top_p == 1.0f && ok.top_k == 0 && ok.min_p == 0, "defaults are DeepSeek's");
    CHECK(sampling_params_check(&ok, &err) == 0, "defaults pass");
    sampling_params bad[] = {params(-1, 0, 1, 0), params(NAN, 0, 1, 0), params(1, 0, 0, 0), params(1, 0, 1.5f, 0),
                             params(1, 0, 1, 1.5f), params(1, -3, 1, 0), params(INFINITY, 0, 1, 0)};
    const char *names[] = {"temperature", "temperature", "top_p", "top_p", "min_p", "top_k", "temperature"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(sampling_params_check(&bad[i], &err) != 0, "case %zu refused", i);
        CHECK(strstr(err.msg, names[i]) != NULL, "case %zu names %s: %s", i, names[i], err.msg);
    }
}

/* The fast path (candidates above a weight threshold first) must keep exactly what a full sort
 * keeps, for a real-size vocabulary, peaked and flat logits, ties, and every filter mix. */
TEST(sampling_fast_path_equals_full_sort) {
    const int n = 129280;
    float *logits = malloc((size_t)n * sizeof *logits);
    double *got = malloc((size_t)n * sizeof *got), *want = malloc((size_t)n * sizeof *want);
    sampler s;
    REQUIRE(logits && got && want && sampler_init(&s, n, NULL) == 0, "alloc");
    sampling_rng rng;
    sampling_rng_seed(&rng, 42);
    const float spreads[] = {12.0f, 3.0f, 0.01f};
    const sampling_params cases[] = {params(1, 0, 0.9f, 0),  params(1, 40, 1, 0),    params(1, 0, 1, 0.05f),
                                     params(0.7f, 50, 0.95f, 0.01f), params(1.5f, 0, 0.999f, 0),
                                     params(1, 100000, 0.6f, 0), params(1, 3, 1, 0.9f)};
    for (int sp = 0; sp < 3; sp++) {
        for (int i = 0; i < n; i++) {
            /* quantised values give many exact ties */
            double u = sampling_rng_uniform(&rng);
            logits[i] = (float)(floor(u * u * u * 400) / 400 * spreads[sp]);
        }
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            sampler_distribution(&s, logits, n, &cases[c], got);
            reference_distribution(logits, n, &cases[c], want);
            int kept_got = 0, kept_want = 0, differ = 0;
            for (int i = 0; i < n; i++) {
                kept_got += got[i] > 0;
                kept_want += want[i] > 0;
                if ((got[i] > 0) != (want[i] > 0) || fabs(got[i] - want[i]) > 1e-9) differ++;
            }
            CHECK(differ == 0, "spread %g case %zu: kept %d vs %d, %d ids differ", spreads[sp], c, kept_got, kept_want,
                  differ);
        }
    }
    sampler_free(&s);
    free(logits);
    free(got);
    free(want);
}

TEST(sampling_seeded_reproducibility) {
    sampler s;
    REQUIRE(sampler_init(&s, 1000, NULL) == 0, "init");
    float logits[1000];
    for (int i = 0; i < 1000; i++) logits[i] = (float)sin(i * 0.37) * 3;
    const sampling_params p = params(1, 0, 0.95f, 0);
    int32_t a[300], b[300], c[300];
    sampling_rng r1, r2, r3;
    sampling_rng_seed(&r1, 1234);
    sampling_rng_seed(&r2, 1234);
    sampling_rng_seed(&r3, 1235);
    for (int i = 0; i < 300; i++) {
        a[i] = sampler_sample(&s, logits, 1000, &p, &r1);
        b[i] = sampler_sample(&s, logits, 1000, &p, &r2);
        c[i] = sampler_sample(&s, logits, 1000, &p, &r3);
    }
    CHECK(memcmp(a, b, sizeof a) == 0, "same seed, same tokens");
    CHECK(memcmp(a, c, sizeof a) != 0, "another seed, other tokens");
    /* the generator itself: uniform in [0, 1), and seed 0 is a valid seed */
    sampling_rng z;
    sampling_rng_seed(&z, 0);
    double sum = 0;
    for (int i = 0; i < 100000; i++) {
        double u = sampling_rng_uniform(&z);
        CHECK(u >= 0 && u < 1, "uniform in range");
        sum += u;
    }
    CHECK(fabs(sum / 100000 - 0.5) < 0.005, "mean %g", sum / 100000);
    sampler_free(&s);
}

TEST(sampling_draw_frequencies) {
    sampler s;
    REQUIRE(sampler_init(&s, 6, NULL) == 0, "init");
    const double p6[6] = {0.05, 0.35, 0.25, 0.2, 0.1, 0.05};
    float logits[6];
    logits_from_probs(p6, 6, logits);
    const sampling_params cases[] = {params(1, 0, 1, 0), params(1, 3, 1, 0), params(0.7f, 0, 0.9f, 0),
                                     params(1, 0, 1, 0.3f)};
    sampling_rng rng;
    sampling_rng_seed(&rng, 7);
    const int draws = 200000;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double want[6];
        int count[6] = {0};
        sampler_distribution(&s, logits, 6, &cases[c], want);
        for (int i = 0; i < draws; i++) count[sampler_sample(&s, logits, 6, &cases[c], &rng)]++;
        for (int i = 0; i < 6; i++) {
            const double freq = (double)count[i] / draws;
            /* 5 standard deviations of a binomial proportion at p = 0.5 is 0.0056 */
            CHECK(fabs(freq - want[i]) < 0.006, "case %zu id %d: frequency %.4f, probability %.4f", c, i, freq, want[i]);
            if (want[i] == 0) CHECK(count[i] == 0, "case %zu id %d filtered out but drawn %d times", c, i, count[i]);
        }
    }
    sampler_free(&s);
}
