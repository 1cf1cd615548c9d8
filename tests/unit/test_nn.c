/* nn layer: numerics helpers (Sinkhorn, YaRN table, Hadamard, FP8/FP4 simulation) and the
 * schedule invariance of the whole forward pass. */
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ds4f.h"
#include "kernels/kernels.h"
#include "nn/layers.h"

/* The official algorithm in double: softmax rows + eps, normalise columns, then 19 x (rows,
 * columns), eps in every denominator. */
static void sinkhorn_reference(double *c, int iters, double eps) {
    for (int j = 0; j < 4; j++) {
        double m = c[j * 4], s = 0;
        for (int k = 1; k < 4; k++) m = fmax(m, c[j * 4 + k]);
        for (int k = 0; k < 4; k++) s += (c[j * 4 + k] = exp(c[j * 4 + k] - m));
        for (int k = 0; k < 4; k++) c[j * 4 + k] = c[j * 4 + k] / s + eps;
    }
    for (int it = 0; it < iters; it++) {
        for (int j = 0; it > 0 && j < 4; j++) {
            double s = 0;
            for (int k = 0; k < 4; k++) s += c[j * 4 + k];
            for (int k = 0; k < 4; k++) c[j * 4 + k] /= s + eps;
        }
        for (int k = 0; k < 4; k++) {
            double s = 0;
            for (int j = 0; j < 4; j++) s += c[j * 4 + k];
            for (int j = 0; j < 4; j++) c[j * 4 + k] /= s + eps;
        }
    }
}

TEST(sinkhorn_rows_and_columns_sum_to_one) {
    float comb[16];
    double ref[16];
    uint32_t state = 12345;
    for (int trial = 0; trial < 500; trial++) {
        /* Comb logits of the size the trained model produces (|logit| <= 1) converge within the
         * 20 iterations; wider ones (up to 4) are checked against the algorithm itself. */
        const float spread = trial < 250 ? 2.0f : 8.0f;
        for (int i = 0; i < 16; i++) {
            state = state * 1664525u + 1013904223u;
            comb[i] = ((float)(state >> 8) / 16777216.0f - 0.5f) * spread;
            ref[i] = comb[i];
        }
        hc_sinkhorn(comb, 4, 20, 1e-6f);
        sinkhorn_reference(ref, 20, 1e-6);
        for (int j = 0; j < 4; j++) {
            float row = 0, col = 0;
            for (int k = 0; k < 4; k++) {
                row += comb[j * 4 + k];
                col += comb[k * 4 + j];
                CHECK(comb[j * 4 + k] > 0, "entries stay positive");
                CHECK(fabs(comb[j * 4 + k] - ref[j * 4 + k]) < 2e-6, "trial %d entry %d,%d: %.8f vs %.8f", trial, j, k,
                      comb[j * 4 + k], ref[j * 4 + k]);
            }
            /* Columns are normalised last: they sum to one up to eps and rounding. */
            CHECK(fabsf(col - 1.0f) < 1e-5f, "trial %d column %d sums to %.8f", trial, j, col);
            if (trial < 250) CHECK(fabsf(row - 1.0f) < 1e-4f, "trial %d row %d sums to %.8f", trial, j, row);
        }
    }
}

TEST(yarn_frequency_table) {
    rope_table plain, yarn;
    rope_table_init(&plain, 64, 160000.0, 0, 16, 65536, 32, 1);
    rope_table_init(&yarn, 64, 160000.0, 1, 16, 65536, 32, 1);
    /* Correction range for beta_fast 32 / beta_slow 1, L0 65536, base 160000: low 15, high 25. */
    for (int k = 0; k < 32; k++) {
        float want_plain = 1.0f / powf(160000.0f, (float)(2 * k) / 64.0f);
        CHECK(plain.inv_freq[k] == want_plain, "plain k=%d", k);
        if (k <= 15) CHECK(yarn.inv_freq[k] == plain.inv_freq[k], "k=%d keeps the base frequency", k);
        if (k >= 25) CHECK(fabsf(yarn.inv_freq[k] - plain.inv_freq[k] / 16.0f) <= 1e-6f * plain.inv_freq[k], "k=%d is divided by 16", k);
        if (k > 15 && k < 25) {
            float ramp = (float)(k - 15) / 10.0f;
            float want = plain.inv_freq[k] / 16.0f * ramp + plain.inv_freq[k] * (1.0f - ramp);
            CHECK(fabsf(yarn.inv_freq[k] - want) <= 1e-6f * want, "k=%d blends (%g vs %g)", k, yarn.inv_freq[k], want);
        }
    }
    /* Rotation by +angle then -angle returns (up to bf16 rounding) the input. */
    float x[64], y[64];
    for (int i = 0; i < 64; i++) x[i] = y[i] = bf16_round(sinf((float)i) * 0.7f);
    rope_apply_bf16(&yarn, y, 1234, 0);
    rope_apply_bf16(&yarn, y, 1234, 1);
    for (int i = 0; i < 64; i++) CHECK(fabsf(y[i] - x[i]) <= 0.02f, "inverse rope at %d: %g vs %g", i, y[i], x[i]);
}

/* The per-head q normalisation (its sum of squares runs in eight chains when that is exact)
 * against the definition written out: sequential f64 sum of bf16 squares. Heads of ordinary
 * values, values spread over 2^-60..2^20 (the exactness test must send them the sequential way),
 * zeros, subnormals, an infinity, and lengths that are not a multiple of 8. */
static void head_rms_definition(float *q, int n, float eps) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)bf16_round(q[i] * q[i]);
    float mean = bf16_round((float)s / (float)n);
    float r = bf16_round(1.0f / sqrtf(bf16_round(mean + eps)));
    for (int i = 0; i < n; i++) q[i] = bf16_round(q[i] * r);
}

TEST(head_rms_normalize_matches_definition) {
    uint64_t rng = 0x243f6a8885a308d3ull;
    int bad = 0, cases = 0;
    for (int kind = 0; kind < 5; kind++)
        for (int rep = 0; rep < 40; rep++) {
            const int n = rep % 3 == 0 ? 512 : rep % 3 == 1 ? 128 : 77;
            float q[512], want[512];
            for (int i = 0; i < n; i++) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                const float unit = (float)((int)(rng >> 40) % 2001 - 1000) / 256.0f;
                const int spread = kind == 1 ? (int)((rng >> 20) % 81) - 60 : kind == 3 ? -140 + (int)((rng >> 20) % 8) : 0;
                float v = ldexpf(unit, spread);
                if (kind == 2 && i % 5 == 0) v = 0.0f;
                if (kind == 4 && i == n / 2) v = INFINITY;
                q[i] = want[i] = bf16_round(v);
            }
            head_rms_definition(want, n, 1e-6f);
            head_rms_normalize_bf16(q, n, 1e-6f);
            cases++;
            bad += memcmp(q, want, (size_t)n * sizeof(float)) != 0;
        }
    CHECK(bad == 0, "%d of %d heads differ from the sequential definition", bad, cases);
    /* The sum itself, where order matters in f64: one large square and many below half its last
     * bit (the sequential sum drops each; chains would keep them), at every position of the large
     * one; and sums that are exact (the fast path). */
    float v[100];
    int sum_bad = 0;
    for (int big = 0; big < 100; big++) {
        for (int i = 0; i < 100; i++) v[i] = i == big ? 0x1p40f : 0x1.02p-14f;
        double seq = 0;
        for (int i = 0; i < 100; i++) seq += (double)v[i];
        sum_bad += sum_nonnegative_bf16(v, 100) != seq;
        for (int i = 0; i < 100; i++) v[i] = i == big ? 0x1p20f : 0x1.02p-14f;
        seq = 0;
        for (int i = 0; i < 100; i++) seq += (double)v[i];
        sum_bad += sum_nonnegative_bf16(v, 100) != seq;
    }
    CHECK(sum_bad == 0, "sum_nonnegative_bf16 differs from the sequential sum %d times", sum_bad);
}

/* sum_nonnegative_bf16 is defined as the sequential f64 sum: its eight-chain path may only be
 * taken where every order gives those bits. Random lengths (every remainder of 8), exponent
 * spreads from none to far past 53 bits, zeros, subnormals, and the values outside its contract
 * (-0, infinity, NaN) that must take the sequential path. */
TEST(sum_nonnegative_bf16_is_the_sequential_sum) {
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int bad = 0, cases = 0;
    float v[200];
    for (int rep = 0; rep < 4000; rep++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        const int n = 1 + (int)(rng % 200), spread = (int)((rng >> 8) % 90), special = (int)((rng >> 16) % 8);
        for (int i = 0; i < n; i++) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            float x = bf16_round(ldexpf((float)(1 + (rng >> 40) % 255) / 128.0f, (int)((rng >> 20) % (unsigned)(spread + 1)) - 60));
            if (special == 1 && i % 3 == 0) x = 0.0f;
            if (special == 2) x = bf16_round(ldexpf(x, -80)); /* subnormal squares, as bf16 holds them */
            v[i] = x;
        }
        const int at = (int)((rng >> 30) % (unsigned)n);
        if (special == 3) v[at] = -0.0f;
        if (special == 4) v[at] = INFINITY;
        if (special == 5) v[at] = NAN;
        if (special == 6)
            for (int i = 0; i < n; i++) v[i] = 0.0f;
        double seq = 0;
        for (int i = 0; i < n; i++) seq += (double)v[i];
        const double got = sum_nonnegative_bf16(v, n);
        cases++;
        bad += isnan(seq) ? !isnan(got) : memcmp(&got, &seq, sizeof got) != 0;
    }
    CHECK(bad == 0, "%d of %d sums differ from the sequential one", bad, cases);
}

/* hc_post_tokens (vectorised, split across threads) against its definition written out, on
 * values of every magnitude, a hidden size that is not a multiple of 8, several positions. */
static uint64_t hc_test_next(uint64_t *rng) {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    return *rng;
}

/* bf16 values from about 2^-30 to 1000, both signs */
static float hc_test_value(uint64_t *rng) {
    const int mantissa = (int)(hc_test_next(rng) >> 40) % 2001 - 1000;
    return bf16_round(ldexpf((float)mantissa, -(int)(hc_test_next(rng) % 30)));
}

TEST(hc_post_matches_definition) {
    model_config c;
    memset(&c, 0, sizeof c);
    c.hc_mult = 4;
    c.hidden_size = 4099;
    enum { N = 5 };
    const int hc = 4, d = 4099;
    float *out = malloc(sizeof(float) * N * d), *res = malloc(sizeof(float) * N * hc * d);
    float *got = malloc(sizeof(float) * N * hc * d), *want = malloc(sizeof(float) * N * hc * d);
    float post[N * 4], comb[N * 16];
    uint64_t rng = 0x13198a2e03707344ull;
    for (int i = 0; i < N * d; i++) out[i] = hc_test_value(&rng);
    for (int i = 0; i < N * hc * d; i++) res[i] = hc_test_value(&rng);
    for (int i = 0; i < N * 4; i++) post[i] = (float)(hc_test_next(&rng) % 1000) / 500.0f;
    for (int i = 0; i < N * 16; i++) comb[i] = (float)(hc_test_next(&rng) % 1000) / 999.0f;
    for (int t = 0; t < N; t++)
        for (int k = 0; k < hc; k++)
            for (int i = 0; i < d; i++) {
                const float *r = res + (size_t)t * hc * d, *cb = comb + t * 16;
                float mixed = cb[k] * r[i];
                for (int j = 1; j < hc; j++) mixed = mixed + cb[j * hc + k] * r[(size_t)j * d + i];
                want[((size_t)t * hc + k) * d + i] = bf16_round(post[t * 4 + k] * out[(size_t)t * d + i] + mixed);
            }
    const int before = kernels_threads();
    for (int threads = 1; threads <= 2; threads++) {
        kernels_set_threads(threads);
        hc_post_tokens(&c, out, res, post, comb, N, got);
        CHECK(!memcmp(got, want, sizeof(float) * N * hc * d), "%d threads: hc_post_tokens differs from its definition", threads);
    }
    kernels_set_threads(before);
    free(out);
    free(res);
    free(got);
    free(want);
}

TEST(hadamard_transform) {
    /* The unnormalised Sylvester matrix times n^-1/2: e_0 maps to the constant vector, and the
     * transform is its own inverse. */
    float x[128] = {0};
    x[0] = 1.0f;
    hadamard_bf16(x, 128);
    for (int i = 0; i < 128; i++) CHECK(x[i] == bf16_round(1.0f / sqrtf(128.0f)), "H e0 [%d] = %g", i, x[i]);
    float v[128], w[128];
    for (int i = 0; i < 128; i++) v[i] = w[i] = bf16_round(cosf((float)i * 0.37f));
    hadamard_bf16(w, 128);
    hadamard_bf16(w, 128);
    for (int i = 0; i < 128; i++) CHECK(fabsf(w[i] - v[i]) < 0.02f, "H H v [%d]: %g vs %g", i, w[i], v[i]);
    /* Row 1 of the natural-order matrix alternates signs: H e1 = (+,-,+,-,...)/sqrt(128). */
    float e1[128] = {0};
    e1[1] = 1.0f;
    hadamard_bf16(e1, 128);
    for (int i = 0; i < 128; i++) CHECK((e1[i] > 0) == (i % 2 == 0), "H e1 sign at %d", i);
}

TEST(fp8_and_fp4_simulation) {
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = (float)(i - 32) * 0.013f;
    float y[64];
    memcpy(y, x, sizeof x);
    fp8_simulate_bf16(y, 64, 64);
    /* amax = 0.416 -> scale 2^ceil(log2(0.416/448)) = 2^-10; values are e4m3 multiples of it. */
    for (int i = 0; i < 64; i++) {
        float q = y[i] / 0x1p-10f;
        CHECK(e4m3_to_f32(e4m3_encode_rne(q)) == q, "fp8 sim value %d is on the grid", i);
        CHECK(fabsf(y[i] - x[i]) <= fabsf(x[i]) * 0.0625f + 1e-6f, "fp8 sim error at %d", i);
    }
    memcpy(y, x, sizeof x);
    fp4_simulate_bf16(y, 64, 32);
    /* block 0: amax 0.416 -> scale 2^ceil(log2(0.416/6)) = 2^-3 */
    for (int i = 0; i < 32; i++) {
        float q = y[i] / 0.125f;
        CHECK(e2m1_to_f32(e2m1_encode_rne(q)) == q, "fp4 sim value %d on the grid (%g)", i, q);
    }
    uint8_t codes[128];
    float scales[1], a[128];
    for (int i = 0; i < 128; i++) a[i] = i == 7 ? 448.0f : 0.5f;
    quantize_fp8_act(a, 128, codes, scales);
    CHECK(scales[0] == 1.0f, "amax 448 gives scale 1, got %g", scales[0]);
    CHECK(e4m3_to_f32(codes[7]) == 448.0f && e4m3_to_f32(codes[0]) == 0.5f, "codes");
}

/* ---- schedule invariance on the golden `small` checkpoint ---- */

static ds4f_model *open_small(void) {
    ds4f_model *m = NULL;
    ds4f_error err;
    if (ds4f_model_open("tests/data/golden/small", NULL, &m, &err) != 0) {
        CHECK(0, "%s", err.msg);
        return NULL;
    }
    return m;
}

static int32_t *small_tokens(int n) {
    int32_t *t = malloc((size_t)n * sizeof *t);
    for (int i = 0; i < n; i++) t[i] = (int32_t)((i * 37 + 11) % 1024);
    return t;
}

TEST(prefill_then_decode_equals_longer_prefill) {
    ds4f_model *m = open_small();
    REQUIRE(m, "model");
    ds4f_model_info info;
    ds4f_model_get_info(m, &info);
    const int V = info.vocab_size;
    int32_t *tokens = small_tokens(300);
    float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
    ds4f_session *s;
    ds4f_error err;
    ds4f_session_options so;
    ds4f_session_options_init(&so);
    so.context = 300;
    REQUIRE(ds4f_session_create(m, &so, &s, &err) == 0, "%s", err.msg);
    /* N spans a window wrap (128), compressor emissions (ratio 4 at N+1 = 4k, ratio 128 at 256). */
    static const int cases[] = {3, 127, 128, 259};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int N = cases[c];
        ds4f_session_reset(s);
        REQUIRE(ds4f_session_eval(s, tokens, N + 1, a, 0, &err) == 0, "%s", err.msg);
        ds4f_session_reset(s);
        REQUIRE(ds4f_session_eval(s, tokens, N, NULL, 0, &err) == 0, "%s", err.msg);
        REQUIRE(ds4f_session_eval(s, tokens + N, 1, b, 0, &err) == 0, "%s", err.msg);
        CHECK(!memcmp(a, b, (size_t)V * sizeof(float)), "prefill %d + decode differs from prefill %d", N, N + 1);
    }
    ds4f_session_free(s);
    /* Chunk size (positions per matrix product) changes nothing either. */
    float *all1 = malloc((size_t)140 * V * sizeof(float)), *all2 = malloc((size_t)140 * V * sizeof(float));
    static const int chunks[] = {1, 13, 140};
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        so.chunk = chunks[c];
        REQUIRE(ds4f_session_create(m, &so, &s, &err) == 0, "%s", err.msg);
        REQUIRE(ds4f_session_eval(s, tokens, 140, c == 0 ? all1 : all2, 1, &err) == 0, "%s", err.msg);
        if (c > 0) CHECK(!memcmp(all1, all2, (size_t)140 * V * sizeof(float)), "chunk %d differs from chunk 1", chunks[c]);
        ds4f_session_free(s);
    }
    free(all1);
    free(all2);
    free(a);
    free(b);
    free(tokens);
    ds4f_model_close(m);
}

TEST(mtp_logits_schedule_invariant) {
    ds4f_model *m = open_small();
    REQUIRE(m, "model");
    ds4f_model_info info;
    ds4f_model_get_info(m, &info);
    REQUIRE(info.mtp_layers == 1, "small has an MTP block");
    const int V = info.vocab_size, T = 40;
    int32_t *tokens = small_tokens(T);
    float *a = malloc((size_t)T * V * sizeof(float)), *b = malloc((size_t)T * V * sizeof(float));
    ds4f_session *s;
    ds4f_error err;
    ds4f_session_options so;
    ds4f_session_options_init(&so);
    so.context = T;
    so.mtp = 1;
    REQUIRE(ds4f_session_create(m, &so, &s, &err) == 0, "%s", err.msg);
    /* all at once */
    REQUIRE(ds4f_session_eval(s, tokens, T, NULL, 0, &err) == 0, "%s", err.msg);
    REQUIRE(ds4f_session_eval_mtp(s, tokens + 1, T - 1, a, &err) == 0, "%s", err.msg);
    /* one position at a time */
    ds4f_session_reset(s);
    for (int p = 0; p < T - 1; p++) {
        REQUIRE(ds4f_session_eval(s, tokens + p, 1, NULL, 0, &err) == 0, "%s", err.msg);
        REQUIRE(ds4f_session_eval_mtp(s, tokens + p + 1, 1, b + (size_t)p * V, &err) == 0, "%s", err.msg);
    }
    CHECK(!memcmp(a, b, (size_t)(T - 1) * V * sizeof(float)), "MTP logits depend on the schedule");
    int finite = 1;
    double spread = 0;
    for (size_t i = 0; i < (size_t)(T - 1) * V; i++) {
        finite &= isfinite(a[i]);
        spread = fmax(spread, fabs(a[i]));
    }
    CHECK(finite && spread > 0.1, "MTP logits finite and non-trivial (max |l| %g)", spread);
    /* Out of order use is refused. */
    CHECK(ds4f_session_eval_mtp(s, tokens, 1, b, &err) != 0, "MTP past the evaluated positions must fail");
    ds4f_session_free(s);
    free(a);
    free(b);
    free(tokens);
    ds4f_model_close(m);
}
