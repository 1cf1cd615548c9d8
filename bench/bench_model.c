/* Model benchmark: decode seconds per token and prefill tokens per second on a checkpoint held
 * entirely in RAM (every routed expert resident: the compute floor, no disk), for each kernel
 * variant and thread count asked for, against the memory-bandwidth floor measured in the same
 * run: weight bytes read per decoded token / read bandwidth.
 *
 *   bench/bench_model.sh DIR [--prompt N] [--decode N] [--variants a,b] [--threads a,b]
 *                            [--scalar-prompt N] [--scalar-decode N] [--chunk N]
 *
 * Defaults: a 512-token prompt, 8 decode steps, every variant this CPU runs, 1 thread and all
 * physical cores; the scalar reference gets a 16-token prompt and 2 decode steps (it is slow). */
#include "base/timer.h"
#include "ds4f.h"
#include "kernels/kernels.h"
#include "model/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of weights one decoded token reads: every resident tensor of the main layers and the
 * head (not the MTP block, one row of the embedding, one row of each hash table), plus the routed
 * experts it uses. */
static int bytes_per_token(const char *dir, double *dense, double *experts, ds4f_error *err) {
    checkpoint ck;
    if (checkpoint_open(&ck, dir, err) != 0) return -1;
    const model_config *c = &ck.config;
    double d = 0, expert_each = 0;
    for (size_t i = 0; i < ck.expected.count; i++) {
        const tensor_spec *s = &ck.expected.specs[i];
        const double b = (double)tensor_spec_bytes(s);
        if (s->expert >= 0) {
            if (s->block == 0 && s->expert == 0) expert_each += b;
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
    }
    *dense = d;
    *experts = expert_each * c->num_experts_per_tok * c->num_hidden_layers;
    checkpoint_close(&ck);
    return 0;
}

typedef uint64_t v8u64 __attribute__((vector_size(64)));
typedef struct read_job {
    const v8u64 *buf;
    size_t n_vec;
    int tasks;
    uint64_t sink[64];
} read_job;

static void read_task(void *ctx, int task) {
    read_job *j = ctx;
    const size_t per = j->n_vec / (size_t)j->tasks, begin = per * (size_t)task;
    v8u64 a = {0}, b = {0};
    for (size_t i = begin; i + 2 <= begin + per; i += 2) {
        a += j->buf[i];
        b += j->buf[i + 1];
    }
    j->sink[task & 63] = a[0] + b[7];
}

/* Best of 5 passes over 1 GB, all threads. */
static double read_bandwidth(void) {
    const size_t bytes = (size_t)1 << 30;
    void *buf = aligned_alloc(64, bytes);
    if (!buf) return 0;
    memset(buf, 1, bytes);
    const int threads = kernels_threads();
    read_job j = {buf, bytes / 64, threads, {0}};
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t = time_now_seconds();
        kernels_parallel_for(read_task, &j, threads);
        t = time_now_seconds() - t;
        if ((double)bytes / t > best) best = (double)bytes / t;
    }
    free(buf);
    return best / 1e9;
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
    double dense = 0, experts = 0;
    if (bytes_per_token(dir, &dense, &experts, &err) != 0) {
        fprintf(stderr, "bench_model: %s\n", err.msg);
        return 1;
    }
    kernels_set_threads(0);
    const double bw = read_bandwidth();
    const double floor_s = (dense + experts) / (bw * 1e9);
    printf("model %s\n", dir);
    printf("weights read per decoded token: %.2f GB dense + %.2f GB routed experts = %.2f GB\n", dense / 1e9,
           experts / 1e9, (dense + experts) / 1e9);
    printf("memory read bandwidth (%d threads): %.1f GB/s -> bandwidth floor %.3f s/token\n", kernels_threads(), bw,
           floor_s);
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

    printf("%-8s %-7s %8s %12s %8s %12s %10s %10s %14s %12s\n", "kernels", "threads", "prompt", "prefill t/s", "decode",
           "decode s/t", "of floor", "pf/dec", "decode cpu s/t", "prefill cpu");
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
            c = time_process_cpu_seconds();
            t = time_now_seconds();
            for (int i = 0; i < dsteps; i++)
                if (ds4f_session_eval(s, tokens + p + i, 1, logits, 0, &err) != 0) {
                    fprintf(stderr, "bench_model: %s\n", err.msg);
                    return 1;
                }
            const double decode_s = (time_now_seconds() - t) / dsteps, decode_cpu = (time_process_cpu_seconds() - c) / dsteps;
            ds4f_session_free(s);
            const double pf_per_token = prefill_s / p;
            printf("%-8s %-7d %8d %12.2f %8d %12.3f %9.0f%% %9.1fx %14.3f %10.3f/t\n", variants[vi], kernels_threads(), p,
                   1.0 / pf_per_token, dsteps, decode_s, 100.0 * floor_s / decode_s, decode_s / pf_per_token, decode_cpu,
                   prefill_cpu / p);
            fflush(stdout);
        }
    }
    printf("\nof floor: bandwidth floor / decode time (100%% = decoding at the memory bandwidth);\n"
           "pf/dec: how many times faster prefill is per token than decode;\n"
           "cpu: process CPU seconds (all threads, spinning included) per token: with 1 thread, the time a\n"
           "dedicated core would take when other jobs share the machine.\n");
    free(tokens);
    free(logits);
    ds4f_model_close(m);
    return 0;
}
