#include "app/report.h"
#include "kernels/kernels.h"
#include "base/timer.h"
#include "stream/memory_plan.h"

#include <stdlib.h>
#include <string.h>

#define GIB 1073741824.0

static void snapshot(ds4f_model *m, run_snapshot *s) {
    memset(s, 0, sizeof *s);
    s->seconds = time_now_seconds();
    s->cpu_seconds = time_process_cpu_seconds();
    ds4f_model_get_stream_stats(m, &s->stream);
    FILE *f = fopen("/proc/self/io", "r");
    if (f) {
        char line[128];
        unsigned long long v;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "read_bytes: %llu", &v) == 1) {
                s->kernel_read_bytes = v;
                s->kernel_io_known = 1;
            }
        fclose(f);
    }
}

void run_report_begin(run_report *r, ds4f_model *m) {
    memset(r, 0, sizeof *r);
    r->model = m;
    snapshot(m, &r->start);
    r->prompt_done = r->end = r->start;
}

void run_report_mark_prompt(run_report *r, int prompt_tokens) {
    r->prompt_tokens = prompt_tokens;
    snapshot(r->model, &r->prompt_done);
    r->end = r->prompt_done;
}

void run_report_end(run_report *r, int decode_tokens) {
    r->decode_tokens = decode_tokens;
    snapshot(r->model, &r->end);
}

/* b - a for the counters of the decode phase. */
typedef struct phase {
    double seconds, wait;
    uint64_t requests, hits, misses, bytes, demand_bytes, kernel_bytes;
    uint64_t reads[2], used[2], late[2], wasted[2], pbytes[2], dropped;
} phase;

static phase phase_between(const run_snapshot *a, const run_snapshot *b) {
    phase p;
    memset(&p, 0, sizeof p);
    p.seconds = b->seconds - a->seconds;
    p.wait = b->stream.seconds_waiting - a->stream.seconds_waiting;
    p.requests = b->stream.expert_requests - a->stream.expert_requests;
    p.hits = b->stream.hits - a->stream.hits;
    p.misses = b->stream.misses - a->stream.misses;
    p.bytes = b->stream.bytes_read - a->stream.bytes_read;
    p.demand_bytes = b->stream.demand_bytes - a->stream.demand_bytes;
    p.kernel_bytes = b->kernel_read_bytes - a->kernel_read_bytes;
    for (int k = 0; k < 2; k++) {
        p.reads[k] = b->stream.prefetch_reads[k] - a->stream.prefetch_reads[k];
        p.used[k] = b->stream.prefetch_used[k] - a->stream.prefetch_used[k];
        p.late[k] = b->stream.prefetch_late[k] - a->stream.prefetch_late[k];
        /* a snapshot counts the prefetched experts not used yet as wasted; some of those taken
         * at `a` are used before `b`, so this difference can be negative: none wasted then */
        p.wasted[k] = b->stream.prefetch_wasted[k] > a->stream.prefetch_wasted[k]
                          ? b->stream.prefetch_wasted[k] - a->stream.prefetch_wasted[k]
                          : 0;
        p.pbytes[k] = b->stream.prefetch_bytes[k] - a->stream.prefetch_bytes[k];
    }
    p.dropped = b->stream.prefetch_dropped - a->stream.prefetch_dropped;
    return p;
}

static double ratio(double a, double b) { return b > 0 ? a / b : 0; }

void run_report_figures(const run_report *r, run_figures *f) {
    memset(f, 0, sizeof *f);
    const phase pr = phase_between(&r->start, &r->prompt_done), de = phase_between(&r->prompt_done, &r->end);
    const double n = r->decode_tokens;
    f->prompt_tokens_per_s = ratio(r->prompt_tokens, pr.seconds);
    f->decode_tokens_per_s = ratio(n, de.seconds);
    f->decode_s_per_token = ratio(de.seconds, n);
    f->decode_wait_s_per_token = ratio(de.wait, n);
    f->decode_compute_s_per_token = ratio(de.seconds - de.wait, n);
    f->decode_cpu_s_per_token = ratio(r->end.cpu_seconds - r->prompt_done.cpu_seconds, n);
    f->gb_read_per_token = ratio((double)de.bytes / 1e9, n);
    f->kernel_gb_read_per_token = r->end.kernel_io_known ? ratio((double)de.kernel_bytes / 1e9, n) : -1;
    f->miss_gb_per_token = ratio((double)de.misses * r->end.stream.expert_bytes / 1e9, n);
    f->hit_rate = ratio((double)de.hits, (double)de.requests);
    f->exact_accuracy = ratio((double)de.used[0], (double)de.reads[0]);
    f->guess_accuracy = ratio((double)de.used[1], (double)de.reads[1]);
    f->wasted_gb_per_token = ratio((double)(de.wasted[0] + de.wasted[1]) * r->end.stream.expert_bytes / 1e9, n);
    f->peak_rss_gib = (double)memory_peak_rss_bytes() / GIB;
    f->plan_gib = (double)r->end.stream.plan_bytes / GIB;
    f->budget_gib = (double)r->end.stream.budget_bytes / GIB;
}

void run_report_print_line(const run_report *r, FILE *out) {
    run_figures f;
    run_report_figures(r, &f);
    fprintf(out, "report: prompt %d tok %.2f tok/s | decode %d tok %.2f tok/s (%.2f s/tok) | ", r->prompt_tokens,
            f.prompt_tokens_per_s, r->decode_tokens, f.decode_tokens_per_s, f.decode_s_per_token);
    if (r->end.stream.streaming) {
        fprintf(out, "read %.2f GB/tok", f.gb_read_per_token);
        if (f.kernel_gb_read_per_token >= 0) fprintf(out, " (kernel %.2f)", f.kernel_gb_read_per_token);
        fprintf(out, " | hit %.1f%% | peak RSS %.2f GiB (plan %.2f)\n", 100 * f.hit_rate, f.peak_rss_gib, f.plan_gib);
    } else {
        fprintf(out, "experts resident | peak RSS %.2f GiB\n", f.peak_rss_gib);
    }
}

void run_report_print(const run_report *r, FILE *out) {
    run_report_print_line(r, out);
    const ds4f_stream_stats *st = &r->end.stream;
    if (!st->streaming) return;
    run_figures f;
    run_report_figures(r, &f);
    const phase pr = phase_between(&r->start, &r->prompt_done), de = phase_between(&r->prompt_done, &r->end);
    const double n = r->decode_tokens > 0 ? r->decode_tokens : 1;
    fprintf(out, "  prompt: %d tokens in %.2f s, waiting for experts %.2f s, read %.2f GB\n", r->prompt_tokens,
            pr.seconds, pr.wait, (double)pr.bytes / 1e9);
    fprintf(out, "  decode: %.3f s/token = compute %.3f + waiting for experts %.3f (process CPU %.3f s/token)\n",
            f.decode_s_per_token, f.decode_compute_s_per_token, f.decode_wait_s_per_token, f.decode_cpu_s_per_token);
    fprintf(out, "  cache: %d slots (%d pinned) of %d experts, %s, %s I/O; per token: %.1f experts asked, %.1f hits "
            "(%.1f%%), %.1f misses = %.3f GB\n",
            st->cache_slots, st->pinned_slots, st->total_experts, st->packed ? "packed file" : "shards",
            st->direct_io ? "direct" : "buffered", de.requests / n, de.hits / n, 100 * f.hit_rate, de.misses / n,
            f.miss_gb_per_token);
    fprintf(out, "  disk per token: engine %.3f GB (demand %.3f, prefetch %.3f)", f.gb_read_per_token,
            (double)de.demand_bytes / 1e9 / n, (double)(de.pbytes[0] + de.pbytes[1]) / 1e9 / n);
    if (f.kernel_gb_read_per_token >= 0) fprintf(out, ", kernel read_bytes %.3f GB", f.kernel_gb_read_per_token);
    fprintf(out, "\n");
    const char *kind[2] = {"exact (hash layers)", "guess (next router)"};
    for (int k = 0; k < 2; k++)
        fprintf(out, "  prefetch %s: %.1f/token read, %.0f%% used (%.0f%% of those late), %.1f/token wasted (%.3f GB)\n",
                kind[k], de.reads[k] / n, 100 * ratio(de.used[k], de.reads[k]), 100 * ratio(de.late[k], de.used[k]),
                de.wasted[k] / n, (double)de.wasted[k] * st->expert_bytes / 1e9 / n);
    if (de.dropped) fprintf(out, "  prefetch hints dropped (no slot to spare): %.1f/token\n", de.dropped / n);
    fprintf(out, "  memory: peak RSS %.2f GiB, plan %.2f GiB, budget %.2f GiB%s\n", f.peak_rss_gib, f.plan_gib,
            f.budget_gib, f.peak_rss_gib <= f.plan_gib ? "" : "  (PEAK ABOVE PLAN)");
}

const char stream_flags_help[] =
    "  --ram SIZE          memory budget of the process (16G, 800M); default 80% of the available\n"
    "                      memory (the cgroup limit when lower). The run refuses if its plan exceeds it\n"
    "  --ctx N             positions the plan reserves per session (default 4096)\n"
    "  --chunk N           prompt positions per matrix product (default 256): each streamed expert\n"
    "                      is read once per chunk, so larger chunks read less from disk; costs scratch\n"
    "  --cache-slots N     expert cache slots (one routed expert each); default: what the budget allows\n"
    "  --experts FILE      read routed experts from a packed file (ds4f pack) instead of the shards\n"
    "  --no-prefetch       no prefetch (neither hash-layer experts nor next-layer router guesses)\n"
    "  --no-lookahead      prefetch the hash-routed layers' experts only, no router guesses\n"
    "  --buffered          read experts through the page cache (default: direct I/O)\n"
    "  --io-threads N      parallel expert reads (default 8)\n"
    "  --policy NAME       cache replacement: nextuse (default: expected time to the next request,\n"
    "                      from decayed request counts and the layer cycle), lfru or lru\n"
    "  --trace FILE        record (position, token, layer, experts) of every step for ds4f replay\n"
    "  --pin TRACE         keep the most requested experts of TRACE cached for the whole run\n"
    "  --pin-slots N       slots for --pin (default a quarter of the cache)\n"
    KERNELS_FLAGS_HELP;

static int flag_value(int argc, char **argv, int *i, const char **out) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "ds4f: %s needs a value\n", argv[*i]);
        return -1;
    }
    *out = argv[++*i];
    return 0;
}

static int positive_int(const char *flag, const char *v, int *out) {
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < 1 || n > 1 << 30) {
        fprintf(stderr, "ds4f: %s wants a positive integer, not '%s'\n", flag, v);
        return -1;
    }
    *out = (int)n;
    return 0;
}

int stream_flag_parse(int argc, char **argv, int *i, ds4f_model_options *opt) {
    const int kernel_flag = kernels_flag_parse(argc, argv, i); /* -t / --threads, --kernels */
    if (kernel_flag != 0) return kernel_flag;
    const char *a = argv[*i], *v;
    if (!strcmp(a, "--no-prefetch")) opt->no_prefetch = 1;
    else if (!strcmp(a, "--no-lookahead")) opt->no_lookahead = 1;
    else if (!strcmp(a, "--buffered")) opt->buffered_io = 1;
    else if (!strcmp(a, "--ram") || !strcmp(a, "--ctx") || !strcmp(a, "--chunk") || !strcmp(a, "--cache-slots") || !strcmp(a, "--experts") ||
             !strcmp(a, "--io-threads") || !strcmp(a, "--policy") || !strcmp(a, "--trace") || !strcmp(a, "--pin") ||
             !strcmp(a, "--pin-slots")) {
        if (flag_value(argc, argv, i, &v) != 0) return -1;
        if (!strcmp(a, "--ram")) {
            opt->ram_bytes = memory_parse_size(v);
            if (!opt->ram_bytes) {
                fprintf(stderr, "ds4f: --ram wants a size like 16G or 800M, not '%s'\n", v);
                return -1;
            }
        } else if (!strcmp(a, "--ctx")) {
            if (positive_int(a, v, &opt->context) != 0) return -1;
        } else if (!strcmp(a, "--chunk")) {
            if (positive_int(a, v, &opt->chunk) != 0) return -1;
        } else if (!strcmp(a, "--cache-slots")) {
            if (positive_int(a, v, &opt->cache_slots) != 0) return -1;
        } else if (!strcmp(a, "--io-threads")) {
            if (positive_int(a, v, &opt->io_threads) != 0) return -1;
        } else if (!strcmp(a, "--pin-slots")) {
            if (positive_int(a, v, &opt->pin_slots) != 0) return -1;
        } else if (!strcmp(a, "--experts")) {
            opt->experts_file = v;
        } else if (!strcmp(a, "--policy")) {
            if (strcmp(v, "nextuse") && strcmp(v, "lfru") && strcmp(v, "lru")) {
                fprintf(stderr, "ds4f: --policy is nextuse, lfru or lru, not '%s'\n", v);
                return -1;
            }
            opt->cache_policy = v;
        } else if (!strcmp(a, "--trace")) {
            opt->trace_file = v;
        } else {
            opt->pin_trace = v;
        }
    } else {
        return 0;
    }
    (*i)++;
    return 1;
}
