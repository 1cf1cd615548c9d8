/* ds4f bench -m DIR: decode speed with expert streaming, on synthetic token ids (no tokenizer):
 * a prompt, then sampled tokens, then the run report (app/report.h). With --io-floor N it
 * measures instead how fast the disk delivers N random experts with the engine's own reader at
 * its queue depth: the I/O floor of a token is its miss bytes divided by that bandwidth. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/commands.h"
#include "app/report.h"
#include "base/timer.h"
#include "model/checkpoint.h"
#include "stream/expert_store.h"
#include "stream/io_pool.h"
#include "text/sampling.h"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: ds4f bench -m DIR [--prompt N] [--tokens N] [--seed S] [streaming flags]\n"
            "       ds4f bench -m DIR --io-floor N [--experts FILE] [--io-threads N] [--buffered]\n\n"
            "Runs N prompt tokens (random ids) and decodes --tokens more (sampled at temperature 1 from the\n"
            "model's logits, seeded), then prints the run report: prompt and decode speed, GB read per token\n"
            "(engine and kernel counts), cache hit rate, prefetch use and waste, compute vs waiting for\n"
            "experts, peak RSS against the memory plan. The last line (bench: key=value ...) is for scripts.\n\n"
            "  -m DIR            checkpoint directory\n"
            "  --prompt N        prompt tokens (default 16)\n"
            "  --tokens N        tokens to decode (default 64)\n"
            "  --seed S          token ids and sampling (default 1)\n"
            "  --verbose         one line per decoded token on stderr\n"
            "  --io-floor N      read N random distinct experts with the engine's reader and print GB/s\n%s",
            stream_flags_help);
}

typedef struct floor_state {
    int done;
    int failed;
    ds4f_error err;
} floor_state;

typedef struct floor_job {
    io_job job;
    floor_state *state;
} floor_job;

static pthread_mutex_t floor_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t floor_cond = PTHREAD_COND_INITIALIZER;

static void floor_done(void *ctx, io_job *job) {
    floor_state *st = ctx;
    pthread_mutex_lock(&floor_lock);
    if (job->failed && !st->failed) {
        st->failed = 1;
        st->err = job->err;
    }
    st->done++;
    pthread_cond_broadcast(&floor_cond);
    pthread_mutex_unlock(&floor_lock);
}

/* Reads n distinct random experts, all submitted at once, into n buffers; the pool's workers
 * keep io_threads chunk reads in flight, as the engine does. */
static int io_floor(const char *dir, const ds4f_model_options *opt, int n, uint64_t seed) {
    ds4f_error err = {{0}};
    checkpoint ck;
    if (checkpoint_open(&ck, dir, &err) != 0) {
        fprintf(stderr, "ds4f bench: %s\n", err.msg);
        checkpoint_close(&ck);
        return 1;
    }
    expert_extent *extents = NULL;
    expert_store store = {0};
    expert_store_options so = {.direct_io = !opt->buffered_io, .verify_checksums = 0};
    io_pool *pool = NULL;
    uint8_t *buffers = NULL;
    floor_job *jobs = NULL;
    int32_t *keys = NULL;
    int rc = 1;
    const int threads = opt->io_threads > 0 ? opt->io_threads : 8;
    if (expert_extents_from_checkpoint(&ck, &extents, &err) != 0 ||
        (opt->experts_file ? expert_store_open_packed(&store, opt->experts_file, &ck, extents, &so, &err)
                           : expert_store_open_shards(&store, &ck, extents, &so, &err)) != 0 ||
        io_pool_create(threads, 1u << 20, NULL, &pool, &err) != 0) {
        fprintf(stderr, "ds4f bench: %s\n", err.msg);
        goto done;
    }
    const int total = store.n_blocks * store.n_experts;
    if (n > total) n = total;
    const uint64_t slot = (store.slot_bytes + IO_ALIGN - 1) & ~(uint64_t)(IO_ALIGN - 1);
    buffers = aligned_alloc(IO_ALIGN, slot * (uint64_t)n);
    jobs = calloc((size_t)n, sizeof *jobs);
    keys = malloc((size_t)total * sizeof *keys);
    if (!buffers || !jobs || !keys) {
        fprintf(stderr, "ds4f bench: cannot allocate %.2f GB for the I/O floor buffers\n", (double)slot * n / 1e9);
        goto done;
    }
    memset(buffers, 0, slot * (uint64_t)n); /* fault the pages in before timing */
    sampling_rng rng;
    sampling_rng_seed(&rng, seed);
    for (int i = 0; i < total; i++) keys[i] = i;
    for (int i = 0; i < n; i++) { /* partial Fisher-Yates: n distinct random experts */
        int j = i + (int)(sampling_rng_next(&rng) % (uint64_t)(total - i));
        int32_t t = keys[i]; keys[i] = keys[j]; keys[j] = t;
    }
    floor_state st = {0};
    uint64_t part_offsets[EXPERT_PARTS];
    const double start = time_now_seconds();
    for (int i = 0; i < n; i++) {
        expert_store_plan_read(&store, keys[i] / store.n_experts, keys[i] % store.n_experts, buffers + slot * i,
                               &jobs[i].job, part_offsets);
        jobs[i].job.priority = IO_DEMAND;
        jobs[i].job.done = floor_done;
        jobs[i].job.done_ctx = &st;
        io_pool_submit(pool, &jobs[i].job);
    }
    pthread_mutex_lock(&floor_lock);
    while (st.done < n) pthread_cond_wait(&floor_cond, &floor_lock);
    pthread_mutex_unlock(&floor_lock);
    const double seconds = time_now_seconds() - start;
    if (st.failed) {
        fprintf(stderr, "ds4f bench: %s\n", st.err.msg);
        goto done;
    }
    io_pool_stats ps;
    io_pool_get_stats(pool, &ps);
    printf("io floor: %d random experts (%.2f MB each) from %s, %s I/O, %d threads x 1 MiB chunks: %.2f GB in %.2f s = "
           "%.3f GB/s, %.1f ms per expert\n",
           n, (double)store.expert_bytes / 1e6, store.packed ? "the packed file" : "the shards",
           store.direct_io ? "direct" : "buffered", threads, (double)ps.bytes_read / 1e9, seconds,
           (double)ps.bytes_read / 1e9 / seconds, 1000 * seconds / n);
    printf("bench: io_floor_gbps=%.4f expert_mb=%.3f direct=%d\n", (double)ps.bytes_read / 1e9 / seconds,
           (double)store.expert_bytes / 1e6, store.direct_io);
    rc = 0;
done:
    io_pool_destroy(pool);
    free(buffers);
    free(jobs);
    free(keys);
    expert_store_close(&store);
    free(extents);
    checkpoint_close(&ck);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    const char *dir = NULL;
    ds4f_model_options opt;
    ds4f_model_options_init(&opt);
    opt.show_progress = isatty(2);
    opt.print_plan = 1;
    int prompt = 16, tokens = 64, floor_n = 0, verbose = 0;
    uint64_t seed = 1;
    for (int i = 1; i < argc;) {
        int r = stream_flag_parse(argc, argv, &i, &opt);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            print_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") && i + 1 < argc) {
            dir = argv[++i];
        } else if (!strcmp(a, "--prompt") && i + 1 < argc) {
            prompt = atoi(argv[++i]);
        } else if ((!strcmp(a, "--tokens") || !strcmp(a, "-n")) && i + 1 < argc) {
            tokens = atoi(argv[++i]);
        } else if (!strcmp(a, "--seed") && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--io-floor") && i + 1 < argc) {
            floor_n = atoi(argv[++i]);
        } else if (!strcmp(a, "--verbose")) {
            verbose = 1;
        } else {
            fprintf(stderr, "ds4f bench: unknown or incomplete argument '%s'\n\n", a);
            print_usage(stderr);
            return 2;
        }
        i++;
    }
    if (!dir || prompt < 1 || tokens < 0) {
        print_usage(stderr);
        return 2;
    }
    if (floor_n > 0) return io_floor(dir, &opt, floor_n, seed);

    if (!opt.context) opt.context = prompt + tokens + 8;
    ds4f_error err = {{0}};
    ds4f_model *m = NULL;
    ds4f_session *s = NULL;
    float *logits = NULL;
    int32_t *ids = NULL;
    sampler smp = {0};
    int rc = 1;
    const double open_start = time_now_seconds();
    if (ds4f_model_open(dir, &opt, &m, &err) != 0) {
        fprintf(stderr, "ds4f bench: %s\n", err.msg);
        return 1;
    }
    const double open_seconds = time_now_seconds() - open_start;
    ds4f_model_info info;
    ds4f_model_get_info(m, &info);
    ds4f_session_options so;
    ds4f_session_options_init(&so);
    so.context = opt.context;
    logits = malloc((size_t)info.vocab_size * sizeof *logits);
    ids = malloc((size_t)(prompt + tokens + 1) * sizeof *ids);
    if (!logits || !ids || sampler_init(&smp, info.vocab_size, &err) != 0 || ds4f_session_create(m, &so, &s, &err) != 0) {
        fprintf(stderr, "ds4f bench: %s\n", err.msg[0] ? err.msg : "out of memory");
        goto done;
    }
    sampling_rng rng;
    sampling_rng_seed(&rng, seed);
    for (int i = 0; i < prompt; i++) ids[i] = (int32_t)(2 + sampling_rng_next(&rng) % (uint64_t)(info.vocab_size - 2));
    sampling_params sp;
    sampling_params_default(&sp);
    fprintf(stderr, "ds4f bench: model opened in %.1f s; prompt %d tokens, then %d decoded\n", open_seconds, prompt, tokens);

    run_report report;
    run_report_begin(&report, m);
    if (ds4f_session_eval(s, ids, prompt, logits, 0, &err) != 0) {
        fprintf(stderr, "ds4f bench: %s\n", err.msg);
        goto done;
    }
    run_report_mark_prompt(&report, prompt);
    for (int t = 0; t < tokens; t++) {
        const int32_t next = sampler_sample(&smp, logits, info.vocab_size, &sp, &rng);
        ids[prompt + t] = next;
        const double t0 = time_now_seconds();
        if (ds4f_session_eval(s, &next, 1, logits, 0, &err) != 0) {
            fprintf(stderr, "ds4f bench: %s\n", err.msg);
            goto done;
        }
        if (verbose) {
            ds4f_stream_stats st;
            ds4f_model_get_stream_stats(m, &st);
            fprintf(stderr, "token %d (id %d): %.3f s, hits %llu/%llu so far, %.2f GB read so far\n", t, next,
                    time_now_seconds() - t0, (unsigned long long)st.hits, (unsigned long long)st.expert_requests,
                    (double)st.bytes_read / 1e9);
        }
    }
    run_report_end(&report, tokens);
    run_report_print(&report, stdout);
    run_figures f;
    run_report_figures(&report, &f);
    printf("bench: s_per_token=%.4f compute_s_per_token=%.4f wait_s_per_token=%.4f gb_per_token=%.4f "
           "kernel_gb_per_token=%.4f miss_gb_per_token=%.4f hit_rate=%.4f guess_accuracy=%.4f exact_accuracy=%.4f "
           "wasted_gb_per_token=%.4f prompt_tok_per_s=%.4f peak_rss_gib=%.3f plan_gib=%.3f budget_gib=%.3f "
           "cpu_s_per_token=%.4f\n",
           f.decode_s_per_token, f.decode_compute_s_per_token, f.decode_wait_s_per_token, f.gb_read_per_token,
           f.kernel_gb_read_per_token, f.miss_gb_per_token, f.hit_rate, f.guess_accuracy, f.exact_accuracy,
           f.wasted_gb_per_token, f.prompt_tokens_per_s, f.peak_rss_gib, f.plan_gib, f.budget_gib,
           f.decode_cpu_s_per_token);
    rc = 0;
done:
    sampler_free(&smp);
    free(logits);
    free(ids);
    ds4f_session_free(s);
    ds4f_model_close(m);
    return rc;
}
