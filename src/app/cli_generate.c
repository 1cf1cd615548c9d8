/* Shared parts of `ds4f run` and `ds4f chat` (see cli_generate.h). */
#include "app/cli_generate.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/progress.h"
#include "stream/memory_plan.h"
#include "text/chat_template.h"
#include "text/dsml.h"
#include "text/sampling.h"
#include "text/tokenizer.h"

const char cli_gen_flags_help[] =
    "  -m DIR           checkpoint directory (config.json, safetensors, tokenizer.json)\n"
    "  -n N             tokens to generate at most (default: until EOS or the context is full)\n"
    "  --temp T         temperature (default 1.0, DeepSeek's recommendation; 0: greedy)\n"
    "  --top-p P        nucleus sampling (default 1.0: off)\n"
    "  --top-k K        keep the K most probable tokens (default 0: off)\n"
    "  --min-p P        drop tokens below P times the most probable one (default 0: off)\n"
    "  --seed S         random seed (default: a random one, shown in the report); same seed, same text\n"
    "  --think          thinking mode: the answer starts with its reasoning, ended by </think>\n"
    "  --no-think       chat mode, no reasoning (the default, like the official API's chat mode)\n"
    "  --system TEXT    system prompt\n"
    "  --stop TEXT      stop before this text (repeatable; the text is not printed)\n";

void cli_gen_options_init(cli_gen_options *o) {
    memset(o, 0, sizeof *o);
    ds4f_model_options_init(&o->model);
    o->model.show_progress = 1;
    o->sampling.temperature = 1.0f;
    o->sampling.top_p = 1.0f;
}

static int parse_float(const char *cmd, const char *flag, const char *s, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) {
        fprintf(stderr, "ds4f %s: %s expects a number, got '%s'\n", cmd, flag, s);
        return -1;
    }
    *out = (float)v;
    return 0;
}

static int parse_int(const char *cmd, const char *flag, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "ds4f %s: %s expects an integer in [%lld, %lld], got '%s'\n", cmd, flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_gen_parse_flag(cli_gen_options *o, int argc, char **argv, int *i, const char *cmd) {
    const char *a = argv[*i];
    static const char *const with_value[] = {"-m", "-n", "--temp", "--top-p", "--top-k", "--min-p",
                                             "--seed", "--system", "--stop"};
    bool takes_value = false;
    for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++) takes_value |= !strcmp(a, with_value[k]);
    if (!takes_value) {
        if (!strcmp(a, "--think")) o->thinking = true;
        else if (!strcmp(a, "--no-think")) o->thinking = false;
        else {
            /* report.h's parser leaves *i past what it consumed; ours leaves it on the last
             * consumed argument (the caller's loop steps over it) */
            const int r = stream_flag_parse(argc, argv, i, &o->model);
            if (r > 0) --*i;
            return r;
        }
        return 1;
    }
    if (*i + 1 >= argc) {
        fprintf(stderr, "ds4f %s: %s needs a value\n", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    long long n;
    if (!strcmp(a, "-m")) o->model_dir = v;
    else if (!strcmp(a, "--system")) o->system = v;
    else if (!strcmp(a, "--stop")) {
        if (!*v) {
            fprintf(stderr, "ds4f %s: --stop needs a non-empty text\n", cmd);
            return -1;
        }
        if (o->n_stops == CLI_MAX_STOPS) {
            fprintf(stderr, "ds4f %s: at most %d --stop texts\n", cmd, CLI_MAX_STOPS);
            return -1;
        }
        o->stops[o->n_stops++] = v;
    } else if (!strcmp(a, "--temp")) {
        if (parse_float(cmd, a, v, &o->sampling.temperature)) return -1;
    } else if (!strcmp(a, "--top-p")) {
        if (parse_float(cmd, a, v, &o->sampling.top_p)) return -1;
    } else if (!strcmp(a, "--min-p")) {
        if (parse_float(cmd, a, v, &o->sampling.min_p)) return -1;
    } else if (!strcmp(a, "--top-k")) {
        if (parse_int(cmd, a, v, 0, 1 << 30, &n)) return -1;
        o->sampling.top_k = (int)n;
    } else if (!strcmp(a, "-n")) {
        /* -1 means "no limit" in llama.cpp; accept it */
        if (parse_int(cmd, a, v, -1, 1 << 30, &n)) return -1;
        o->max_tokens = n < 0 ? 0 : (int)n;
    } else if (!strcmp(a, "--seed")) {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(v, &end, 10);
        if (errno || end == v || *end || *v == '-') {
            fprintf(stderr, "ds4f %s: --seed expects a non-negative integer, got '%s'\n", cmd, v);
            return -1;
        }
        o->sampling.seed = s;
        o->seed_given = true;
    }
    return 1;
}

int cli_gen_finish_options(cli_gen_options *o, const char *cmd) {
    if (!o->model_dir) {
        fprintf(stderr, "ds4f %s: no checkpoint: give -m DIR (ds4f %s --help)\n", cmd, cmd);
        return -1;
    }
    /* The session gets the context the memory plan reserved. */
    if (!o->model.context) o->model.context = 4096;
    o->context = o->model.context;
    sampling_params sp = {o->sampling.temperature, o->sampling.top_k, o->sampling.top_p, o->sampling.min_p};
    ds4f_error err;
    if (sampling_params_check(&sp, &err) != 0) {
        fprintf(stderr, "ds4f %s: %s\n", cmd, err.msg);
        return -1;
    }
    if (!o->seed_given) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        /* Any value will do; it is printed in the report so that the run can be repeated. */
        o->sampling.seed = ((uint64_t)ts.tv_sec * 1000003u) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
        o->sampling.seed %= 1000000000ull;
    }
    return 0;
}

/* ---- engine ---------------------------------------------------------------------------------- */

int cli_engine_open(const cli_gen_options *o, cli_engine *e, const char *cmd) {
    memset(e, 0, sizeof *e);
    ds4f_error err;
    if (ds4f_tokenizer_open(o->model_dir, &e->tok, &err) != 0) {
        fprintf(stderr, "ds4f %s: %s\n", cmd, err.msg);
        return -1;
    }
    if (ds4f_model_open(o->model_dir, &o->model, &e->model, &err) != 0) {
        fprintf(stderr, "ds4f %s: %s\n", cmd, err.msg);
        cli_engine_close(e);
        return -1;
    }
    ds4f_model_get_info(e->model, &e->info);
    ds4f_session_options so;
    ds4f_session_options_init(&so);
    so.context = o->context;
    if (ds4f_generator_create(e->model, &so, e->tok, &e->gen, &err) != 0) {
        fprintf(stderr, "ds4f %s: %s\n", cmd, err.msg);
        cli_engine_close(e);
        return -1;
    }
    e->bos = tokenizer_token_id(e->tok, DSV4_BOS);
    e->eos = tokenizer_token_id(e->tok, DSV4_EOS);
    e->think_start = tokenizer_token_id(e->tok, DSV4_THINK_START);
    e->think_end = tokenizer_token_id(e->tok, DSV4_THINK_END);
    if (e->bos < 0) e->bos = e->info.bos_token_id;
    if (e->eos < 0) e->eos = e->info.eos_token_id;
    return 0;
}

void cli_engine_close(cli_engine *e) {
    ds4f_generator_free(e->gen);
    ds4f_model_close(e->model);
    ds4f_tokenizer_close(e->tok);
    memset(e, 0, sizeof *e);
}

int cli_encode_user_turn(const ds4f_tokenizer *tok, const char *system, const char *text, bool thinking, bool add_bos,
                         int32_t **ids, size_t *n_ids, ds4f_error *err) {
    chat_conversation conv;
    chat_init(&conv);
    chat_options co;
    chat_options_default(&co);
    co.thinking = thinking;
    co.add_bos = add_bos;
    char *rendered = NULL;
    size_t len;
    /* the rendered text holds the special tokens, so it is encoded with added tokens matched, as
     * the official encoder's output is */
    const int rc = (system && !chat_append(&conv, CHAT_ROLE_SYSTEM, system, err)) ||
                           !chat_append(&conv, CHAT_ROLE_USER, text, err) ||
                           chat_render(&conv, &co, &rendered, &len, err) != 0 ||
                           tokenizer_encode(tok, rendered, len, ids, n_ids, err) != 0
                       ? -1
                       : 0;
    free(rendered);
    chat_free(&conv);
    return rc;
}

/* ---- progress, interrupts, output ------------------------------------------------------------ */

static progress prefill_bar;
static bool prefill_bar_active;

void cli_prefill_step(run_report *report, int done, int total) {
    if (done == total) run_report_mark_prompt(report, total);
    progress *const bar = &prefill_bar;
    bool *const active = &prefill_bar_active;
    if (done == 0) {
        /* short prompts (a chat turn) finish before a bar would be worth drawing */
        *active = total >= 64;
        if (*active) progress_begin(bar, "prefill", (uint64_t)total, "tokens");
    } else if (*active) {
        progress_update(bar, (uint64_t)done);
        if (done == total) {
            progress_end(bar);
            *active = false;
        }
    }
}

void cli_prefill_progress_close(void) {
    if (!prefill_bar_active) return;
    /* a cancelled prefill leaves the bar where it stopped; the line still gets its end */
    if (prefill_bar.enabled) fputc('\n', stderr);
    prefill_bar_active = false;
}

volatile sig_atomic_t cli_interrupted;
static ds4f_generator *interrupt_target;
static volatile sig_atomic_t generating, interrupts_while_generating;

static void on_sigint(int sig) {
    cli_interrupted = 1;
    if (!generating) return;
    if (++interrupts_while_generating >= 2) {
        /* the first one did not stop it soon enough for the user: leave the default way */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    if (interrupt_target) ds4f_generator_cancel(interrupt_target);
}

void cli_interrupt_install(ds4f_generator *g) {
    interrupt_target = g;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a blocking read returns so that the prompt can be redrawn */
    sigaction(SIGINT, &sa, NULL);
}

void cli_interrupt_generating(bool on) {
    interrupts_while_generating = 0;
    generating = on;
}

void cli_write_text(const char *text, size_t len) {
    if (!len) return;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

void cli_write_generated(const char *text, size_t len) {
    static int stdout_is_tty = -1;
    if (stdout_is_tty < 0) stdout_is_tty = isatty(1);
    if (!stdout_is_tty) {
        cli_write_text(text, len);
        return;
    }
    size_t from = 0;
    for (size_t i = 0; i < len; i++) {
        const unsigned char ch = (unsigned char)text[i];
        if ((ch >= 0x20 && ch != 0x7f) || ch == '\n' || ch == '\t' || ch == '\r') continue;
        fwrite(text + from, 1, i - from, stdout);
        const char caret[2] = {'^', ch == 0x7f ? '?' : (char)(ch + '@')};
        fwrite(caret, 1, 2, stdout);
        from = i + 1;
    }
    cli_write_text(text + from, len - from);
}

static void put_rate(FILE *out, int64_t tokens, double seconds) {
    if (tokens > 0 && seconds > 0) fprintf(out, "%.2f tok/s", (double)tokens / seconds);
    else fprintf(out, "- tok/s");
}

void cli_report_session(FILE *out, const ds4f_generator_stats *t, int turns, uint64_t seed) {
    fprintf(out, "report: chat of %d turns: prompt %lld tok (%lld reused) ", turns, (long long)t->prompt_evaluated,
            (long long)t->prompt_reused);
    put_rate(out, t->prompt_evaluated, t->prefill_seconds);
    fprintf(out, " | decode %lld tok ", (long long)t->generated);
    put_rate(out, t->decoded, t->decode_seconds);
    fprintf(out, " | peak RSS %.2f GiB | seed %llu\n", (double)memory_peak_rss_bytes() / 1073741824.0, (unsigned long long)seed);
}
