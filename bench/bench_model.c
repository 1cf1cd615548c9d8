/* Model benchmark: decode seconds per token and prefill tokens per second on a checkpoint held
 * entirely in RAM (every routed expert resident: the compute floor, no disk), for each kernel
 * variant and thread count asked for, against the memory-bandwidth floor measured in the same
 * run: weight bytes read per decoded token / read bandwidth, the bandwidth measured again beside
 * each row's decode (a shared host's load moves it by half between rows).
 *
 *   bench/bench_model.sh DIR [--prompt N] [--decode N] [--variants a,b] [--threads a,b]
 *                            [--scalar-prompt N] [--scalar-decode N] [--chunk N]
 *
 * Defaults: a 512-token prompt, 8 decode steps, every variant this CPU runs, 1 thread and all
 * physical cores; the scalar reference gets a 16-token prompt and 2 decode steps (it is slow). */
#include "base/timer.h"
#include "bench_peaks.h"
#include "ds4f.h"
#include "kernels/kernels.h"
#include "model/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of weights one decoded token reads: every resident tensor of the main layers and the
 * head (not the MTP block, one row of the embedding, one row of each hash table), plus the routed
 * experts it uses. And the multiply-adds of its weight products (each matrix's rows x columns; the
 * embedding lookup, element-wise tensors and the attention scores not counted): FP8 and FP4
 * (integer forms on x86) apart from bf16, f32 and the dequantized FP8 of wo_a (f32 products). */
typedef struct token_work {
    double dense_bytes, expert_bytes;
    double quant_macs, float_macs;
} token_work;

static int work_per_token(const char *dir, token_work *w, ds4f_error *err) {
    checkpoint ck;
    if (checkpoint_open(&ck, dir, err) != 0) return -1;
    const model_config *c = &ck.config;
    double d = 0, expert_each = 0, expert_macs = 0;
    memset(w, 0, sizeof *w);
    for (size_t i = 0; i < ck.expected.count; i++) {
        const tensor_spec *s = &ck.expected.specs[i];
        const double b = (double)tensor_spec_bytes(s);
        const double elems = s->ndim == 2 ? (double)s->shape[0] * (double)s->shape[1] : 0;
        if (s->expert >= 0) {
            if (s->block == 0 && s->expert == 0) {
                expert_each += b;
                if (s->dtype == DTYPE_I8) expert_macs += 2 * elems; /* packed FP4: two per byte */
            }
            continue;
        }
        if (s->block >= c->num_hidden_layers) continue; /* MTP block */
        if (!strcmp(s->name, "embed.weight")) {
            d += 2.0 * c->hidden_size;
            continue;
        }
        if (strstr(s->name, "tid2eid")) {
            d += 8.0 * c->num_experts_per_tok;
            continue;
        }
        d += b;
        /* wo_a is FP8 used dequantized (matmul_fp8_dequant): f32 products in the reference's order */
        if (s->dtype == DTYPE_F8_E4M3 && !strstr(s->name, "wo_a")) w->quant_macs += elems;
        else if (s->dtype == DTYPE_F8_E4M3) w->float_macs += elems;
        else if ((s->dtype == DTYPE_BF16 || s->dtype == DTYPE_F32) && !strstr(s->name, "ape")) w->float_macs += elems;
    }
    const double routed = (double)c->num_experts_per_tok * c->num_hidden_layers;
    w->dense_bytes = d;
    w->expert_bytes = expert_each * routed;
    w->quant_macs += expert_macs * routed;
    checkpoint_close(&ck);
    return 0;
}

/* Read bandwidth over a 1 GB buffer at every physical core (best of read_bandwidth's passes), the
 * pool left at the thread count it had. The buffer stays allocated for the row measurements. */
static void *bandwidth_buffer;
#define BANDWIDTH_BUFFER_BYTES ((size_t)1 << 30)

static double model_read_bandwidth(void) {
    if (!bandwidth_buffer) {
        bandwidth_buffer = aligned_alloc(64, BANDWIDTH_BUFFER_BYTES);
        if (!bandwidth_buffer) return 0;
        memset(bandwidth_buffer, 1, BANDWIDTH_BUFFER_BYTES);
    }
    const int threads = kernels_threads();
    kernels_set_threads(0);
    const double gbs = read_bandwidth(bandwidth_buffer, BANDWIDTH_BUFFER_BYTES, kernels_threads());
    kernels_set_threads(threads);
    return gbs;
}

static int split_list(char *s, char **out, int max) {
    int n = 0;
    for (char *tok = strtok(s, ","); tok && n < max; tok = strtok(NULL, ",")) out[n++] = tok;
    return n;
}

int main(int argc, char **argv) {
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: bench_model DIR [--prompt N] [--decode N] [--variants a,b] [--threads a,b]\n"
                        "                       [--scalar-prompt N] [--scalar-decode N] [--chunk N]\n");
        return 2;
    }
    const char *dir = argv[1];
    int prompt = 512, decode = 8, scalar_prompt = 16, scalar_decode = 2, chunk = 0;
    char variants_arg[256] = "", threads_arg[256] = "";
    for (int i = 0; kernels_variant_names[i]; i++) /* every variant, those this CPU lacks skipped below */
        snprintf(variants_arg + strlen(variants_arg), sizeof variants_arg - strlen(variants_arg), "%s%s", i ? "," : "",
                 kernels_variant_names[i]);
    snprintf(threads_arg, sizeof threads_arg, "1,%d", kernels_default_threads());
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--prompt")) prompt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--decode")) decode = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--chunk")) chunk = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--scalar-prompt")) scalar_prompt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--scalar-decode")) scalar_decode = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--variants")) snprintf(variants_arg, sizeof variants_arg, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) snprintf(threads_arg, sizeof threads_arg, "%s", argv[i + 1]);
        else {
            fprintf(stderr, "bench_model: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    char *variants[8], *threads_list[8];
    const int n_variants = split_list(variants_arg, variants, 8), n_threads = split_list(threads_arg, threads_list, 8);

    ds4f_error err;
    token_work work;
    if (work_per_token(dir, &work, &err) != 0) {
        fprintf(stderr, "bench_model: %s\n", err.msg);
        return 1;
    }
    const double dense = work.dense_bytes, experts = work.expert_bytes;
    kernels_set_threads(0);
    const double bw = model_read_bandwidth();
    const double floor_s = (dense + experts) / (bw * 1e9);
    printf("model %s\n", dir);
    printf("weights read per decoded token: %.2f GB dense + %.2f GB routed experts = %.2f GB\n", dense / 1e9,
           experts / 1e9, (dense + experts) / 1e9);
    printf("memory read bandwidth (%d threads): %.1f GB/s -> bandwidth floor %.3f s/token\n", kernels_threads(), bw,
           floor_s);
    printf("multiply-adds per token in the weight products: %.2f G FP8/FP4 + %.2f G bf16/f32/wo_a\n", work.quant_macs / 1e9,
           work.float_macs / 1e9);
#if defined(__x86_64__)
    /* The prefill compute floor: every multiply-add of the FP8/FP4 products at the int16 unit's peak
     * (the AVX2 and AVX-512 integer forms; the AMX forms are not covered by this figure) and the
     * float ones at the f32 rate (twice the f64 FMA's): no batching can run faster than this. */
    if (kernels_available("avx2")) {
        double f64 = 0, i8 = 0, i16 = 0;
        compute_peaks(kernels_threads(), kernels_available("avx512"), kernels_available("avxvnni"), &f64, &i8, &i16);
        const double compute_s = 2 * work.quant_macs / (i16 * 1e9) + 2 * work.float_macs / (2 * f64 * 1e9);
        printf("prefill compute floor at the measured peaks (%d threads: int16 %.0f GOP/s, f32 %.0f GFLOP/s): %.3f s/token\n"
               "  = %.1f tokens/s, at most %.1fx the bandwidth-floor decode\n",
               kernels_threads(), i16, 2 * f64, compute_s, 1 / compute_s, floor_s / compute_s);
        /* A bound below that floor, which no exact form reaches: the FP8/FP4 products at the int8
         * unit's rate (VPDPBUSD, twice the products per instruction of int16), as if one byte of
         * each activation were enough. An E4M3 block's values span up to 18 bits as integers, so an
         * exact form takes two byte planes (or one int16 word) per activation; the float products
         * stay at the f32 rate because the reference fixes their order. */
        if (i8 > 0) {
            const double ideal_s = 2 * work.quant_macs / (i8 * 1e9) + 2 * work.float_macs / (2 * f64 * 1e9);
            printf("  with the FP8/FP4 products at the int8 rate instead (%.0f GOP/s; not exact): %.3f s/token,"
                   " at most %.1fx\n",
                   i8, ideal_s, floor_s / ideal_s);
        }
    }
#endif
    fflush(stdout);

    ds4f_model_options mo;
    ds4f_model_options_init(&mo);
    mo.resident_experts = 1;
    mo.show_progress = 1;
    mo.context = prompt + decode + 8;
    mo.chunk = chunk; /* 0: the engine's default */
    ds4f_model *m = NULL;
    double t = time_now_seconds();
    if (ds4f_model_open(dir, &mo, &m, &err) != 0) {
        fprintf(stderr, "bench_model: %s\n", err.msg);
        return 1;
    }
    printf("loaded in %.1f s (experts resident)\n", time_now_seconds() - t);
    {
        ds4f_model_info info;
        ds4f_model_get_info(m, &info);
        printf("prefill chunk: %d positions per matrix product\n", info.chunk);
    }
    ds4f_model_info info;
    ds4f_model_get_info(m, &info);
    const int T = prompt + decode;
    int32_t *tokens = malloc((size_t)T * sizeof(int32_t));
    for (int i = 0; i < T; i++) tokens[i] = (int32_t)(1000 + (i * 7919) % (info.vocab_size - 2000));
    float *logits = malloc((size_t)info.vocab_size * sizeof(float));

    /* Warm-up, untimed: one pass over every weight. The first pass after loading can be many
     * times slower than the next ones (on virtual machines the host may back the freshly loaded
     * memory lazily), which is not what decode or prefill cost. */
    {
        ds4f_session_options so;
        ds4f_session_options_init(&so);
        so.context = 8;
        ds4f_session *s = NULL;
        t = time_now_seconds();
        if (ds4f_session_create(m, &so, &s, &err) != 0 || ds4f_session_eval(s, tokens, 2, logits, 0, &err) != 0 ||
            ds4f_session_eval(s, tokens + 2, 1, logits, 0, &err) != 0) {
            fprintf(stderr, "bench_model: %s\n", err.msg);
            return 1;
        }
        ds4f_session_free(s);
        printf("warm-up pass (untimed in the table): %.1f s\n\n", time_now_seconds() - t);
    }

    printf("%-8s %-7s %8s %12s %8s %12s %9s %10s %10s %14s %12s\n", "kernels", "threads", "prompt", "prefill t/s",
           "decode", "decode s/t", "read GB/s", "of floor", "pf/dec", "decode cpu s/t", "prefill cpu");
    for (int vi = 0; vi < n_variants; vi++) {
        char msg[256];
        if (!kernels_available(variants[vi])) continue;
        kernels_select(variants[vi], msg, sizeof msg);
        const int scalar = !strcmp(variants[vi], "scalar");
        const int p = scalar ? scalar_prompt : prompt, dsteps = scalar ? scalar_decode : decode;
        for (int ti = 0; ti < n_threads; ti++) {
            kernels_set_threads(atoi(threads_list[ti]));
            ds4f_session_options so;
            ds4f_session_options_init(&so);
            so.context = p + dsteps + 8;
            ds4f_session *s = NULL;
            if (ds4f_session_create(m, &so, &s, &err) != 0) {
                fprintf(stderr, "bench_model: %s\n", err.msg);
                return 1;
            }
            double c = time_process_cpu_seconds();
            t = time_now_seconds();
            if (ds4f_session_eval(s, tokens, p, logits, 0, &err) != 0) {
                fprintf(stderr, "bench_model: %s\n", err.msg);
                return 1;
            }
            const double prefill_s = time_now_seconds() - t, prefill_cpu = time_process_cpu_seconds() - c;
            /* The floor of this row from the read bandwidth measured just before and just after its
             * decode steps (the larger: the host's load moves between the rows, and the benchmark
             * should not flatter the decode), not from the one measured before loading. */
            const double bw_before = model_read_bandwidth();
            c = time_process_cpu_seconds();
            t = time_now_seconds();
            for (int i = 0; i < dsteps; i++)
                if (ds4f_session_eval(s, tokens + p + i, 1, logits, 0, &err) != 0) {
                    fprintf(stderr, "bench_model: %s\n", err.msg);
                    return 1;
                }
            const double decode_s = (time_now_seconds() - t) / dsteps, decode_cpu = (time_process_cpu_seconds() - c) / dsteps;
            const double bw_after = model_read_bandwidth(), row_bw = bw_before > bw_after ? bw_before : bw_after;
            const double row_floor_s = (dense + experts) / (row_bw * 1e9);
            ds4f_session_free(s);
            const double pf_per_token = prefill_s / p;
            printf("%-8s %-7d %8d %12.2f %8d %12.3f %9.1f %9.0f%% %9.1fx %14.3f %10.3f/t\n", variants[vi], kernels_threads(),
                   p, 1.0 / pf_per_token, dsteps, decode_s, row_bw, 100.0 * row_floor_s / decode_s, decode_s / pf_per_token,
                   decode_cpu, prefill_cpu / p);
            fflush(stdout);
        }
    }
    printf("\nread GB/s: the read bandwidth at every core, measured just before and just after the row's decode\n"
           "steps, the larger of the two; of floor: the bandwidth floor at that bandwidth / decode time (100%% =\n"
           "decoding at the memory bandwidth);\n"
           "pf/dec: how many times faster prefill is per token than decode;\n"
           "cpu: process CPU seconds (all threads, spinning included) per token: with 1 thread, the time a\n"
           "dedicated core would take when other jobs share the machine.\n");
    free(tokens);
    free(logits);
    free(bandwidth_buffer);
    ds4f_model_close(m);
    return 0;
}
