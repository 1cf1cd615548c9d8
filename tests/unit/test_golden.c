/* Golden numerics: the engine against the official implementation's outputs on the two tiny
 * checkpoints of tests/data/golden (README there: "How to compare"). Every check of that list,
 * with the tolerances stored in each reference file; a failure names the first layer and
 * position that diverges. */
#include "test.h"
#include "golden.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static void report_fail(void *ctx, const char *file, int line, const char *msg) { test_fail(file, line, "%s", msg); }
static void report_note(void *ctx, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
}
static golden_report test_reporter(void) { return (golden_report){NULL, report_fail, report_note, 0}; }

static void run_case(const char *name) {
    model_weights w;
    expert_source *experts = NULL;
    golden_run g;
    char msg[1024] = "";
    REQUIRE(golden_load(&g, name, &w, &experts, msg, sizeof msg) == 0, "%s", msg);
    nn_session *s;
    ds4f_error err;
    REQUIRE(nn_session_create(&w, experts, g.T + 8, 256, &s, &err) == 0, "%s", err.msg);
    s->probe = golden_probe(&g);
    REQUIRE(golden_run_schedule(&g, s, &err) == 0, "%s", err.msg);
    golden_report r = test_reporter();
    golden_check_all(&g, &r);

    if (g.tol.has_local) {
        /* Layer-local: each block alone on the reference's own input states, same schedule. */
        const size_t n = (size_t)g.hc * g.d;
        float *local = calloc((size_t)g.L * g.Ts * n, sizeof(float));
        float *states = malloc((size_t)g.T * n * sizeof(float));
        for (int l = 0; l < g.L; l++) {
            nn_session_reset(s);
            for (int pos = 0; pos < g.T; pos++) {
                float *dst = states + (size_t)pos * n;
                if (l == 0) {
                    const uint16_t *row = w.embed + (size_t)g.tokens[pos] * g.d;
                    for (int h = 0; h < g.hc; h++)
                        for (int i = 0; i < g.d; i++) dst[(size_t)h * g.d + i] = bf16_to_f32(row[i]);
                } else {
                    memcpy(dst, g.ref_hidden + ((size_t)(l - 1) * g.Ts + g.hidden_slot[pos]) * n, n * sizeof(float));
                }
            }
            s->probe = (nn_probe){0};
            REQUIRE(nn_block_forward(s, l, states, g.tokens, g.P, 0, &err) == 0, "%s", err.msg);
            for (int p = g.P; p < g.T; p++)
                REQUIRE(nn_block_forward(s, l, states + (size_t)p * n, g.tokens + p, 1, p, &err) == 0, "%s", err.msg);
            for (int pos = 0; pos < g.T; pos++)
                memcpy(local + ((size_t)l * g.Ts + g.hidden_slot[pos]) * n, states + (size_t)pos * n, n * sizeof(float));
        }
        golden_check_hidden(&g, local, g.tol.hidden_local_rel_l2, g.tol.hidden_local_rel_l2_median, "layer-local", &r);
        free(local);
        free(states);
    }
    nn_session_free(s);
    experts->destroy(experts);
    model_weights_free(&w);
    golden_free(&g);
}

TEST(golden_small) { run_case("small"); }
TEST(golden_wide) { run_case("wide"); }
