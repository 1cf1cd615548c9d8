/* ds4f run: one prompt, one answer streamed to stdout, the report on stderr. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/cli_generate.h"
#include "app/commands.h"
#include "base/file_io.h"
#include "text/tokenizer.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: ds4f run -m DIR (-p PROMPT | -f FILE | < FILE) [options]\n"
            "\n"
            "Renders the prompt as one user turn of the DeepSeek-V4 chat encoding (BOS, optional system\n"
            "text, <｜User｜>PROMPT<｜Assistant｜> and </think> or <think>), streams the answer to stdout\n"
            "as it is generated and prints one report line on stderr. A prompt read from a file or stdin\n"
            "loses its trailing newlines (not with --raw).\n"
            "\n"
            "  -p PROMPT        the prompt\n"
            "  -f FILE          read the prompt from FILE (stdin when neither -p nor -f is given)\n"
            "  --raw            no chat template: the text is tokenized as it is (special tokens such as\n"
            "                   <｜User｜> written in it become their ids) after one BOS, unless it\n"
            "                   starts with the BOS text already\n"
            "%s%s"
            "  -h, --help       this help\n"
            "\n"
            "Ctrl-C stops the answer (the report is still printed); a second Ctrl-C ends at once.\n"
            "example: ds4f run -m ~/models/DeepSeek-V4-Flash -p \"Explain RAID 5\" -n 256\n",
            cli_gen_flags_help, stream_flags_help);
}

static char *read_stream(FILE *f, size_t *len) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        char *bigger = realloc(buf, cap * 2);
        if (!bigger) {
            free(buf);
            return NULL;
        }
        buf = bigger;
        cap *= 2;
    }
    if (!buf || ferror(f)) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* The prompt token ids: chat-rendered, or raw text after one BOS. */
static int build_prompt(const cli_engine *e, const cli_gen_options *o, const char *text, size_t len, bool raw,
                        int32_t **ids, size_t *n_ids, ds4f_error *err) {
    if (raw) {
        int32_t *body;
        size_t n;
        if (tokenizer_encode(e->tok, text, len, &body, &n, err) != 0) return -1;
        const bool has_bos = n > 0 && body[0] == e->bos;
        int32_t *all = malloc((n + 1) * sizeof *all);
        if (!all) {
            free(body);
            return error_set(err, "out of memory");
        }
        size_t k = 0;
        if (!has_bos) all[k++] = e->bos;
        if (n) memcpy(all + k, body, n * sizeof *body);
        free(body);
        *ids = all;
        *n_ids = n + k;
        return 0;
    }
    return cli_encode_user_turn(e->tok, o->system, text, o->thinking, true, ids, n_ids, err);
}

typedef struct run_output {
    bool wrote, ends_with_newline;
    run_report report;
} run_output;

static int prefill_step(void *user, int done, int total) {
    run_output *out = user;
    cli_prefill_step(&out->report, done, total);
    return 0;
}

static int print_token(void *user, const ds4f_token_event *ev) {
    run_output *out = user;
    if (ev->len) {
        cli_write_generated(ev->text, ev->len);
        out->wrote = true;
        out->ends_with_newline = ev->text[ev->len - 1] == '\n';
    }
    return 0;
}

int cmd_run(int argc, char **argv) {
    cli_gen_options o;
    cli_gen_options_init(&o);
    const char *prompt_arg = NULL, *prompt_file = NULL;
    bool raw = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--raw")) {
            raw = true;
            continue;
        }
        if ((!strcmp(a, "-p") || !strcmp(a, "-f")) && i + 1 < argc) {
            *(a[1] == 'p' ? &prompt_arg : &prompt_file) = argv[++i];
            continue;
        }
        int r = cli_gen_parse_flag(&o, argc, argv, &i, "run");
        if (r < 0) return 2;
        if (r == 0) {
            fprintf(stderr, "ds4f run: unknown or incomplete option '%s' (ds4f run --help)\n", a);
            return 2;
        }
    }
    if (cli_gen_finish_options(&o, "run") != 0) return 2;
    if (prompt_arg && prompt_file) {
        fprintf(stderr, "ds4f run: give the prompt with -p or -f, not both\n");
        return 2;
    }
    if (!prompt_arg && !prompt_file && isatty(0)) {
        fprintf(stderr, "ds4f run: no prompt: give -p PROMPT, -f FILE, or pipe it on stdin\n");
        return 2;
    }

    ds4f_error err;
    char *text;
    size_t len;
    if (prompt_arg) {
        len = strlen(prompt_arg);
        text = strdup(prompt_arg);
    } else if (prompt_file) {
        if (file_read_all(prompt_file, &text, &len, &err) != 0) {
            fprintf(stderr, "ds4f run: %s\n", err.msg);
            return 1;
        }
    } else {
        text = read_stream(stdin, &len);
        if (!text) {
            fprintf(stderr, "ds4f run: could not read the prompt from stdin\n");
            return 1;
        }
    }
    if (!raw && !prompt_arg)
        while (len && (text[len - 1] == '\n' || text[len - 1] == '\r')) text[--len] = 0;

    cli_engine e;
    if (cli_engine_open(&o, &e, "run") != 0) {
        free(text);
        return 1;
    }
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int status = 1;
    if (build_prompt(&e, &o, text, len, raw, &ids, &n_ids, &err) != 0) {
        fprintf(stderr, "ds4f run: %s\n", err.msg);
        goto out;
    }

    run_output out;
    memset(&out, 0, sizeof out);
    ds4f_generate_params p;
    ds4f_generate_params_init(&p);
    p.sampling = o.sampling;
    p.max_tokens = o.max_tokens;
    p.stop_strings = o.stops;
    p.n_stop_strings = o.n_stops;
    p.on_token = print_token;
    p.on_prefill = prefill_step;
    p.user = &out;
    if (!o.seed_given && o.sampling.temperature > 0)
        fprintf(stderr, "ds4f run: seed %llu (--seed %llu gives this answer again)\n",
                (unsigned long long)o.sampling.seed, (unsigned long long)o.sampling.seed);
    cli_interrupt_install(e.gen);
    cli_interrupt_generating(true);
    run_report_begin(&out.report, e.model);
    ds4f_generate_result r;
    const int rc = ds4f_generate(e.gen, ids, (int)n_ids, &p, &r, &err);
    run_report_end(&out.report, r.decode_tokens);
    cli_interrupt_generating(false);
    cli_prefill_progress_close();
    if (out.wrote && !out.ends_with_newline && isatty(1)) cli_write_text("\n", 1);
    if (rc != 0) {
        fprintf(stderr, "ds4f run: %s\n", err.msg);
        goto out;
    }
    run_report_print_line(&out.report, stderr);
    if (r.finish == DS4F_FINISH_LENGTH && o.max_tokens == 0)
        fprintf(stderr, "ds4f run: the context (%d tokens) is full; --ctx raises it\n", o.context);
    status = r.finish == DS4F_FINISH_CANCELLED ? 130 : 0;
out:
    free(ids);
    free(text);
    cli_engine_close(&e);
    return status;
}
