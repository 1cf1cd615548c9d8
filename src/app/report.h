/* The run report: what every command that generates prints at the end (`ds4f bench`, and `run`,
 * `chat`, `serve`). It uses the public API only.
 *
 * Usage: run_report_begin before the prompt, run_report_mark_prompt after it, run_report_end
 * after decoding, then run_report_print. Each mark snapshots the expert-streaming statistics,
 * the kernel's I/O counters (/proc/self/io: read_bytes is what the block layer fetched for this
 * process, direct I/O included) and the clock, so prompt and decode figures are separate. */
#ifndef DS4F_APP_REPORT_H
#define DS4F_APP_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "ds4f.h"

typedef struct run_snapshot {
    double seconds;
    double cpu_seconds;          /* user + system time of the whole process (all threads) */
    ds4f_stream_stats stream;
    uint64_t kernel_read_bytes;  /* /proc/self/io read_bytes; 0 if unavailable */
    int kernel_io_known;
} run_snapshot;

typedef struct run_report {
    ds4f_model *model;
    run_snapshot start, prompt_done, end;
    int prompt_tokens, decode_tokens;
} run_report;

void run_report_begin(run_report *r, ds4f_model *m);
void run_report_mark_prompt(run_report *r, int prompt_tokens);
void run_report_end(run_report *r, int decode_tokens);

/* One line: prompt and decode speed, GB read per token, hit rate, peak RSS against the plan. */
void run_report_print_line(const run_report *r, FILE *out);
/* The full report (bench): the line, then time split, cache, prefetch and memory details. */
void run_report_print(const run_report *r, FILE *out);

/* Figures for scripts (bench/): per decoded token unless named otherwise. */
typedef struct run_figures {
    double prompt_tokens_per_s, decode_tokens_per_s, decode_s_per_token;
    double decode_wait_s_per_token, decode_compute_s_per_token;
    double gb_read_per_token, kernel_gb_read_per_token, miss_gb_per_token;
    double hit_rate;
    double guess_accuracy, exact_accuracy;   /* prefetched and then used / prefetched */
    double wasted_gb_per_token;
    double peak_rss_gib, plan_gib, budget_gib;
    double decode_cpu_s_per_token;           /* process CPU time: survives a shared machine */
} run_figures;
void run_report_figures(const run_report *r, run_figures *f);

/* The streaming flags every model-running command accepts (--ram, --ctx, --cache-slots,
 * --experts, --no-prefetch, ...): if argv[*i] is one, stores it in opt, advances *i past its
 * value and returns 1; returns 0 if it is not one; -1 (message on stderr) if its value is bad. */
int stream_flag_parse(int argc, char **argv, int *i, ds4f_model_options *opt);
/* Their --help lines. */
extern const char stream_flags_help[];

#endif
