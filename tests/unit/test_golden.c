/* Golden numerics: the engine against the official implementation's outputs on the two tiny
 * checkpoints of tests/data/golden (README there: "How to compare"). Every check of that list,
 * with the tolerances stored in each reference file; a failure names the first layer and
 * position that diverges. */
#include "test.h"
#include "golden.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void check_top1(golden_run *g) {
    int bad = 0, first = -1;
    for (int i = 0; i < g->T; i++) {
        const float *a = g->logits + (size_t)i * g->vocab, *b = g->ref_logits + (size_t)i * g->vocab;
        int ia = 0, ib = 0;
        for (int v = 1; v < g->vocab; v++) {
            if (a[v] > a[ia]) ia = v;
            if (b[v] > b[ib]) ib = v;
        }
        if (ia != ib && bad++ == 0) first = i;
    }
    CHECK(bad == 0, "%s: top-1 differs at %d positions, first at position %d", g->name, bad, first);
}

static void check_decisions(golden_run *g) {
    int bad = 0, first_pos = -1, first_layer = -1;
    for (int pos = 0; pos < g->T; pos++)
        for (int l = 0; l < g->L; l++) {
            const int32_t *a = g->expert_ids + ((size_t)l * g->T + pos) * g->k;
            const int32_t *b = g->ref_expert_ids + ((size_t)l * g->T + pos) * g->k;
            if (memcmp(a, b, (size_t)g->k * sizeof(int32_t)) && bad++ == 0) { first_pos = pos; first_layer = l; }
        }
    CHECK(bad == 0, "%s: expert sets differ at %d (layer, position) pairs, first at position %d layer %d", g->name, bad,
          first_pos, first_layer);
    double max_w = 0;
    for (size_t i = 0; i < (size_t)g->L * g->T * g->k; i++) max_w = fmax(max_w, fabs(g->expert_w[i] - g->ref_expert_w[i]));
    CHECK(max_w <= g->tol.expert_weights_abs, "%s: expert weights max abs diff %.3g > %.3g", g->name, max_w,
          g->tol.expert_weights_abs);

    bad = 0;
    for (int pos = 0; pos < g->T; pos++)
        for (int w = 0; w < g->n4; w++) {
            const int32_t *a = g->index_sel + ((size_t)w * g->T + pos) * g->topk;
            const int32_t *b = g->ref_index_sel + ((size_t)w * g->T + pos) * g->topk;
            if (memcmp(a, b, (size_t)g->topk * sizeof(int32_t)) && bad++ == 0) { first_pos = pos; first_layer = g->index_layers[w]; }
        }
    CHECK(bad == 0, "%s: indexer selections differ at %d pairs, first at position %d layer %d", g->name, bad, first_pos,
          first_layer);
    double worst = 0;
    for (int w = 0; w < g->n4; w++)
        for (int pos = 0; pos < g->T; pos++) {
            const float *a = g->index_scores + ((size_t)w * g->T + pos) * g->entries4;
            const float *b = g->ref_index_scores + ((size_t)w * g->T + pos) * g->entries4;
            double row_max = 0, diff = 0;
            for (int e = 0; e < (pos + 1) / 4 && e < g->entries4; e++) {
                row_max = fmax(row_max, fabs(b[e]));
                diff = fmax(diff, fabs((double)a[e] - b[e]));
            }
            if (row_max > 0) worst = fmax(worst, diff / row_max);
        }
    CHECK(worst <= g->tol.indexer_scores_rel, "%s: indexer scores max diff / row max %.3g > %.3g", g->name, worst,
          g->tol.indexer_scores_rel);
    printf("    %s: expert weights max abs %.2e (tol %.2e), indexer scores rel %.3f (tol %.2f)\n", g->name, max_w,
           g->tol.expert_weights_abs, worst, g->tol.indexer_scores_rel);
}

static void check_logits(golden_run *g) {
    double *rel = malloc((size_t)g->T * sizeof(double)), worst = 0;
    int first_bad = -1;
    for (int i = 0; i < g->T; i++) {
        rel[i] = rel_l2(g->logits + (size_t)i * g->vocab, g->ref_logits + (size_t)i * g->vocab, g->vocab);
        if (rel[i] > worst) worst = rel[i];
        if (rel[i] > g->tol.logits_rel_l2 && first_bad < 0) first_bad = i;
    }
    double med = median(rel, g->T);
    CHECK(first_bad < 0, "%s: logits rel L2 %.3g > %.3g first at position %d (max %.3g)", g->name,
          first_bad >= 0 ? rel_l2(g->logits + (size_t)first_bad * g->vocab, g->ref_logits + (size_t)first_bad * g->vocab, g->vocab) : 0,
          g->tol.logits_rel_l2, first_bad, worst);
    CHECK(med <= g->tol.logits_rel_l2_median, "%s: logits rel L2 median %.3g > %.3g", g->name, med, g->tol.logits_rel_l2_median);
    printf("    %s: logits rel L2 median %.2e max %.2e (tol %.2e / %.2e)\n", g->name, med, worst,
           g->tol.logits_rel_l2_median, g->tol.logits_rel_l2);
    double fworst = 0;
    for (int i = 0; i < g->T; i++)
        fworst = fmax(fworst, rel_l2(g->final + (size_t)i * g->d, g->ref_final + (size_t)i * g->d, g->d));
    CHECK(fworst <= g->tol.final_hidden_rel_l2, "%s: final_hidden rel L2 %.3g > %.3g", g->name, fworst, g->tol.final_hidden_rel_l2);
    free(rel);
}

/* Per layer and stored position: relative L2 of the whole HC state. Reports the first (position,
 * then layer) over tolerance, and each layer's median against its median tolerance. */
static void check_hidden(golden_run *g, const float *engine, const double *tol, const double *tol_median, const char *what) {
    const size_t n = (size_t)g->hc * g->d;
    double *rel = malloc((size_t)g->L * g->Ts * sizeof(double));
    for (int l = 0; l < g->L; l++)
        for (int i = 0; i < g->Ts; i++)
            rel[(size_t)l * g->Ts + i] = rel_l2(engine + ((size_t)l * g->Ts + i) * n, g->ref_hidden + ((size_t)l * g->Ts + i) * n, (int)n);
    int found = 0;
    for (int i = 0; i < g->Ts && !found; i++)
        for (int l = 0; l < g->L && !found; l++)
            if (rel[(size_t)l * g->Ts + i] > tol[l]) {
                found = 1;
                CHECK(0, "%s %s: first divergence at position %d layer %d: rel L2 %.3g > %.3g", g->name, what,
                      g->hidden_positions[i], l, rel[(size_t)l * g->Ts + i], tol[l]);
            }
    printf("    %s %s medians:", g->name, what);
    for (int l = 0; l < g->L; l++) {
        double worst = 0;
        for (int i = 0; i < g->Ts; i++) worst = fmax(worst, rel[(size_t)l * g->Ts + i]);
        int exact = 0;
        for (int i = 0; i < g->Ts; i++) exact += rel[(size_t)l * g->Ts + i] == 0;
        double med = median(rel + (size_t)l * g->Ts, g->Ts);
        printf(" L%d %.1e/%.1e (max %.1e, %d%% bitwise equal)", l, med, tol_median[l], worst, 100 * exact / g->Ts);
        CHECK(med <= tol_median[l], "%s %s: layer %d median rel L2 %.3g > %.3g", g->name, what, l, med, tol_median[l]);
    }
    printf("\n");
    free(rel);
}

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
    check_top1(&g);
    check_decisions(&g);
    check_logits(&g);
    check_hidden(&g, g.hidden, g.tol.hidden_rel_l2, g.tol.hidden_rel_l2_median, "hidden");

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
        check_hidden(&g, local, g.tol.hidden_local_rel_l2, g.tol.hidden_local_rel_l2_median, "layer-local");
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
