/* Whole-model invariance: the logits of tests/data/golden/small are byte-identical for every
 * kernel variant this machine runs and for 1, 2 and 3 threads (invariant 2: placement and
 * threads change speed only). The sequence spans the window wrap (128), ratio-4 and ratio-128
 * compressor emissions and indexer top-k selection, with a chunked prefill then decode steps. */
#include "test.h"

#include <stdlib.h>
#include <string.h>

#include "ds4f.h"
#include "kernels/kernels.h"

#define PREFILL 133
#define DECODE 3

static float *run_small(const char *variant, int threads, int *vocab) {
    char msg[256];
    if (kernels_select(variant, msg, sizeof msg) != 0) return NULL;
    if (kernels_set_threads(threads) != 0) return NULL;
    ds4f_model *m = NULL;
    ds4f_error err;
    if (ds4f_model_open("tests/data/golden/small", NULL, &m, &err) != 0) {
        printf("    %s\n", err.msg);
        return NULL;
    }
    ds4f_model_info info;
    ds4f_model_get_info(m, &info);
    const int V = info.vocab_size, T = PREFILL + DECODE;
    *vocab = V;
    int32_t tokens[PREFILL + DECODE];
    for (int i = 0; i < T; i++) tokens[i] = (int32_t)((i * 37 + 11) % 1024);
    ds4f_session_options so;
    ds4f_session_options_init(&so);
    so.context = T;
    so.chunk = 48;
    ds4f_session *s = NULL;
    float *logits = malloc((size_t)T * V * sizeof(float));
    int ok = logits && ds4f_session_create(m, &so, &s, &err) == 0 &&
             ds4f_session_eval(s, tokens, PREFILL, logits, 1, &err) == 0;
    for (int i = 0; ok && i < DECODE; i++)
        ok = ds4f_session_eval(s, tokens + PREFILL + i, 1, logits + (size_t)(PREFILL + i) * V, 0, &err) == 0;
    if (!ok) printf("    %s\n", err.msg);
    ds4f_session_free(s);
    ds4f_model_close(m);
    if (!ok) {
        free(logits);
        return NULL;
    }
    return logits;
}

TEST(kernels_model_logits_identical_across_variants_and_threads) {
    char msg[256];
    const char *before = kernels_selected();
    const int threads_before = kernels_threads();
    int V = 0;
    float *ref = run_small("scalar", 1, &V);
    REQUIRE(ref, "scalar reference run failed");
    const size_t bytes = (size_t)(PREFILL + DECODE) * V * sizeof(float);
    const char *const *variants = kernels_variant_names + 1; /* all but scalar */
    for (size_t i = 0; variants[i]; i++) {
        if (!kernels_available(variants[i])) continue;
        for (int threads = 1; threads <= 3; threads++) {
            /* every variant at 2 threads; the thread sweep on the best one */
            if (threads != 2 && strcmp(variants[i], "avx512") && strcmp(variants[i], "amx") && strcmp(variants[i], "neon"))
                continue;
            int v2 = 0;
            float *got = run_small(variants[i], threads, &v2);
            CHECK(got && v2 == V, "%s with %d threads: run failed", variants[i], threads);
            if (!got) continue;
            size_t first = 0;
            while (first < bytes / sizeof(float) && !memcmp(&got[first], &ref[first], sizeof(float))) first++;
            CHECK(first == bytes / sizeof(float), "%s with %d threads: logits differ from scalar at position %zu, token %zu",
                  variants[i], threads, first / (size_t)V, first % (size_t)V);
            free(got);
        }
    }
    /* the scalar reference itself does not depend on threads either */
    float *scalar3 = run_small("scalar", 3, &V);
    CHECK(scalar3 && !memcmp(scalar3, ref, bytes), "scalar with 3 threads differs from 1 thread");
    free(scalar3);
    free(ref);
    kernels_select(before, msg, sizeof msg);
    kernels_set_threads(threads_before);
}
