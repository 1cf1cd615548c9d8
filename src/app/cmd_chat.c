/* ds4f chat: interactive multi-turn conversation.
 *
 * The conversation is kept as token ids, exactly as the model saw and produced them: every new
 * turn is those ids (the last answer closed with EOS when it did not end with it), then the new
 * user turn rendered alone (<｜User｜>TEXT<｜Assistant｜> and </think> or <think>). So the
 * prompt of each turn extends what the session has consumed and only the new tokens are
 * prefilled (re-rendering the conversation as text would re-tokenize the answers: BPE can spell
 * the same text with other ids).
 *
 * Thinking mode: the official encoder renders an earlier answer without its reasoning
 * (<｜Assistant｜></think>ANSWER), and the model was trained on that. So before a new turn the
 * last answer's <think>REASONING span is cut out of the tokens, which makes the next prompt
 * diverge from the session and replay the conversation. --keep-reasoning keeps the reasoning
 * instead (what the official encoder does when tools are present): every turn then only
 * prefills its new tokens, at the price of a context the model did not see in training.
 */
#include <editline/readline.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/cli_generate.h"
#include "stream/memory_plan.h"
#include "app/commands.h"
#include "text/tokenizer.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: ds4f chat -m DIR [options]\n"
            "\n"
            "Talks with the model, one turn per line. On a terminal the line can be edited and earlier\n"
            "lines recalled (arrow keys); from a pipe the lines are read as they come. Each turn\n"
            "prefills only its own new tokens: the conversation's computed state is reused.\n"
            "\n"
            "%s%s"
            "  --keep-reasoning in thinking mode, keep earlier answers' reasoning in the context: each turn\n"
            "                   prefills only its new tokens, but the official encoding drops it (the\n"
            "                   default, which replays the conversation at every turn)\n"
            "  -h, --help       this help\n"
            "\n"
            "commands:\n"
            "  /think on|off    thinking mode from the next turn (reasoning shown dimmed on a terminal)\n"
            "  /reset           forget the conversation\n"
            "  /stats           tokens and speeds of the last turn and of the conversation\n"
            "  /help            these commands\n"
            "  /quit            leave (also /exit or Ctrl-D)\n"
            "Ctrl-C stops the current answer and keeps the conversation.\n",
            cli_gen_flags_help, stream_flags_help);
}

static const char commands_help[] =
    "/think on|off  thinking mode from the next turn\n"
    "/reset         forget the conversation\n"
    "/stats         tokens and speeds of the last turn and of the conversation\n"
    "/quit          leave (also /exit or Ctrl-D); Ctrl-C stops an answer\n";

typedef struct chat_session {
    cli_gen_options o;
    cli_engine e;
    bool tty_in, tty_out;
    int32_t *conv; /* the conversation's tokens, the last answer's included */
    size_t n_conv, cap;
    bool answer_closed; /* conv ends with an answer's EOS (or is empty) */
    /* The last answer's reasoning as a span of conv: [reasoning_begin, reasoning_end) holds its
     * <think> token and the reasoning, up to (not including) its </think>; empty when the turn
     * was not in thinking mode. reasoning_closed: the answer produced </think>. */
    size_t reasoning_begin, reasoning_end;
    bool reasoning_closed;
    int turns;          /* of this conversation (since /reset) */
    int turns_total;    /* of the whole session */
    bool have_last;
    ds4f_generate_result last;
    run_report report; /* of the last turn */
    int32_t *answer_ids; /* the tokens of the answer being generated */
    size_t n_answer, answer_cap;
    /* display of the answer being generated */
    bool reasoning_shown, wrote, ends_with_newline;
} chat_session;

static int conv_append(chat_session *c, const int32_t *ids, size_t n) {
    if (c->n_conv + n > c->cap) {
        size_t cap = c->cap ? c->cap : 1024;
        while (cap < c->n_conv + n) cap *= 2;
        int32_t *p = realloc(c->conv, cap * sizeof *p);
        if (!p) return -1;
        c->conv = p;
        c->cap = cap;
    }
    memcpy(c->conv + c->n_conv, ids, n * sizeof *ids);
    c->n_conv += n;
    return 0;
}

/* The official rendering of an earlier thinking-mode answer: <｜Assistant｜></think>ANSWER. The
 * tokens <think>REASONING become a single </think> (the answer's own </think>, when it produced
 * one, follows the span and stays). */
static void drop_last_reasoning(chat_session *c) {
    if (c->reasoning_end <= c->reasoning_begin) return;
    size_t keep_from = c->reasoning_end;
    size_t at = c->reasoning_begin;
    if (!c->reasoning_closed) c->conv[at++] = c->e.think_end;
    memmove(c->conv + at, c->conv + keep_from, (c->n_conv - keep_from) * sizeof *c->conv);
    c->n_conv -= keep_from - at;
    c->reasoning_begin = c->reasoning_end = 0;
}

/* The next prompt: the first turn rendered whole (BOS, system text, user turn), later turns as
 * the conversation's tokens + the new user turn rendered alone. */
static int next_prompt(chat_session *c, const char *line, int32_t **ids, size_t *n_ids, ds4f_error *err) {
    if (!c->o.keep_reasoning) drop_last_reasoning(c);
    const bool first = c->n_conv == 0;
    int32_t *turn;
    size_t n_turn;
    if (cli_encode_user_turn(c->e.tok, first ? c->o.system : NULL, line, c->o.thinking, first, &turn, &n_turn, err) != 0)
        return -1;
    const size_t close = c->answer_closed ? 0 : 1;
    int32_t *all = malloc((c->n_conv + close + n_turn) * sizeof *all);
    if (!all) {
        free(turn);
        return error_set(err, "out of memory");
    }
    if (c->n_conv) memcpy(all, c->conv, c->n_conv * sizeof *all);
    if (close) all[c->n_conv] = c->e.eos;
    memcpy(all + c->n_conv + close, turn, n_turn * sizeof *turn);
    free(turn);
    *ids = all;
    *n_ids = c->n_conv + close + n_turn;
    return 0;
}

static int prefill_step(void *user, int done, int total) {
    chat_session *c = user;
    cli_prefill_step(&c->report, done, total);
    return 0;
}

static const char dim[] = "\033[2m", plain[] = "\033[0m";

static void show(chat_session *c, const char *text, size_t len) {
    if (!len) return;
    cli_write_generated(text, len);
    c->wrote = true;
    c->ends_with_newline = text[len - 1] == '\n';
}

static int on_token(void *user, const ds4f_token_event *ev) {
    chat_session *c = user;
    if (ev->id >= 0) {
        if (c->n_answer == c->answer_cap) {
            size_t cap = c->answer_cap ? 2 * c->answer_cap : 256;
            int32_t *p = realloc(c->answer_ids, cap * sizeof *p);
            if (!p) return 1; /* out of memory: stop the answer rather than lose its tokens */
            c->answer_ids = p;
            c->answer_cap = cap;
        }
        c->answer_ids[c->n_answer++] = ev->id;
    }
    const char *text = ev->text;
    size_t len = ev->len;
    if (c->reasoning_shown && ev->id >= 0 && ev->id == c->e.think_end) {
        /* End of the reasoning: on a terminal the marker gives way to a change of style. */
        const size_t marker = strlen("</think>");
        if (len >= marker && !memcmp(text + len - marker, "</think>", marker)) len -= marker;
        show(c, text, len);
        cli_write_text(plain, strlen(plain));
        if (c->wrote && !c->ends_with_newline) show(c, "\n", 1);
        c->reasoning_shown = false;
        return 0;
    }
    show(c, text, len);
    return 0;
}

static void print_stats(const chat_session *c) {
    ds4f_generator_stats st;
    ds4f_generator_get_stats(c->e.gen, &st);
    if (c->have_last) {
        const ds4f_generate_result *r = &c->last;
        printf("last turn: prompt %d tokens = %d reused + %d prefilled (%.2f s", r->prompt_tokens, r->cached_tokens,
               r->prefill_tokens, r->prefill_seconds);
        if (r->prefill_tokens && r->prefill_seconds > 0) printf(", %.1f tok/s", r->prefill_tokens / r->prefill_seconds);
        printf("); %d generated (%.2f s", r->generated_tokens, r->decode_seconds);
        if (r->decode_tokens && r->decode_seconds > 0) printf(", %.1f tok/s", r->decode_tokens / r->decode_seconds);
        printf("); finish %s%s\n", ds4f_finish_reason_name(r->finish), r->replayed ? "; replayed from 0" : "");
        run_report_print_line(&c->report, stdout);
    } else {
        printf("last turn: none yet\n");
    }
    printf("conversation: %d turns, %zu tokens, %lld of %d context positions in use, thinking %s\n", c->turns,
           c->n_conv, (long long)st.position, st.context, c->o.thinking ? "on" : "off");
    printf("session: %lld prompt tokens prefilled, %lld reused, %lld generated, %lld replays; peak RSS %.0f MB\n",
           (long long)st.prompt_evaluated, (long long)st.prompt_reused, (long long)st.generated, (long long)st.replays,
           (double)memory_peak_rss_bytes() / 1e6);
    fflush(stdout);
}

/* One user turn: prompt, streamed answer, conversation update. */
static void answer(chat_session *c, const char *line) {
    ds4f_error err;
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    if (next_prompt(c, line, &prompt, &n_prompt, &err) != 0) {
        fprintf(stderr, "ds4f chat: %s\n", err.msg);
        return;
    }
    if (n_prompt >= (size_t)c->o.context) {
        fprintf(stderr, "ds4f chat: the conversation would take %zu tokens of a %d-token context: /reset starts over "
                        "(or restart with a larger --ctx)\n",
                n_prompt, c->o.context);
        free(prompt);
        return;
    }
    ds4f_generate_params p;
    ds4f_generate_params_init(&p);
    p.sampling = c->o.sampling;
    /* each turn draws its own numbers, and a whole conversation repeats with the same seed */
    p.sampling.seed = c->o.sampling.seed + (uint64_t)c->turns;
    p.max_tokens = c->o.max_tokens;
    p.stop_strings = c->o.stops;
    p.n_stop_strings = c->o.n_stops;
    p.on_token = on_token;
    p.on_prefill = prefill_step;
    p.user = c;
    c->wrote = false;
    c->ends_with_newline = false;
    c->n_answer = 0;
    c->reasoning_shown = c->o.thinking && c->tty_out && c->e.think_end >= 0;
    if (c->reasoning_shown) cli_write_text(dim, strlen(dim));

    ds4f_generate_result r;
    cli_interrupted = 0;
    cli_interrupt_generating(true);
    run_report_begin(&c->report, c->e.model);
    const int rc = ds4f_generate(c->e.gen, prompt, (int)n_prompt, &p, &r, &err);
    run_report_end(&c->report, r.decode_tokens);
    cli_interrupt_generating(false);
    cli_prefill_progress_close();
    if (c->reasoning_shown) cli_write_text(plain, strlen(plain));
    if (r.finish == DS4F_FINISH_CANCELLED) {
        if (c->wrote && !c->ends_with_newline) cli_write_text("\n", 1);
        fprintf(stderr, "[stopped]\n");
    } else if (c->wrote && !c->ends_with_newline) {
        cli_write_text("\n", 1);
    }
    if (rc != 0) {
        fprintf(stderr, "ds4f chat: %s\n", err.msg);
        free(prompt);
        return;
    }
    /* The conversation now: the prompt and every token sampled for the answer (the stop token
     * included), whether or not the session has evaluated the last one yet. */
    c->n_conv = 0;
    if (conv_append(c, prompt, n_prompt) != 0 || conv_append(c, c->answer_ids, c->n_answer) != 0 ||
        (r.stop_token >= 0 && conv_append(c, &r.stop_token, 1) != 0)) {
        fprintf(stderr, "ds4f chat: out of memory; the conversation is cleared\n");
        c->n_conv = 0;
        ds4f_generator_reset(c->e.gen);
    }
    c->answer_closed = c->n_conv == 0 || r.stop_token == c->e.eos;
    /* Where this answer's reasoning lies, for drop_last_reasoning before the next turn: the
     * prompt ended with <think> in thinking mode. */
    c->reasoning_begin = c->reasoning_end = 0;
    if (c->n_conv && n_prompt && c->e.think_start >= 0 && prompt[n_prompt - 1] == c->e.think_start) {
        /* the answer's EOS is not reasoning: the rendered turn ends with it either way */
        const size_t limit = c->n_conv - (r.stop_token == c->e.eos ? 1 : 0);
        size_t end = n_prompt;
        while (end < limit && c->conv[end] != c->e.think_end) end++;
        c->reasoning_closed = end < limit;
        /* an answer cut short has no EOS yet: the reasoning ends where the answer ends */
        c->reasoning_begin = n_prompt - 1;
        c->reasoning_end = end;
    }
    c->last = r;
    c->have_last = true;
    c->turns++;
    c->turns_total++;
    free(prompt);
}

static void handle_command(chat_session *c, const char *line, bool *quit) {
    char word[32] = {0}, arg[32] = {0};
    sscanf(line, "/%31s %31s", word, arg);
    if (!strcmp(word, "quit") || !strcmp(word, "exit")) {
        *quit = true;
    } else if (!strcmp(word, "help")) {
        fputs(commands_help, stdout);
    } else if (!strcmp(word, "think")) {
        /* an earlier answer is rendered the same way whatever the current mode */
        if (!strcmp(arg, "on")) c->o.thinking = true;
        else if (!strcmp(arg, "off")) c->o.thinking = false;
        else if (arg[0]) {
            printf("/think on or /think off\n");
            return;
        }
        printf("thinking %s\n", c->o.thinking ? "on" : "off");
    } else if (!strcmp(word, "reset")) {
        ds4f_generator_reset(c->e.gen);
        c->reasoning_begin = c->reasoning_end = 0;
        c->n_conv = 0;
        c->answer_closed = true;
        c->turns = 0;
        c->have_last = false;
        printf("conversation cleared\n");
    } else if (!strcmp(word, "stats")) {
        print_stats(c);
    } else {
        printf("unknown command /%s; /help lists the commands\n", word);
    }
    fflush(stdout);
}

/* The next input line without its newline (malloc'd), or NULL at the end of input. */
static char *read_line(chat_session *c) {
    if (c->tty_in) {
        for (;;) {
            cli_interrupted = 0;
            char *line = readline("> ");
            if (line) return line;
            if (!cli_interrupted) return NULL;
            /* Ctrl-C at the prompt: a fresh line, as shells do */
            printf("\n");
        }
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) {
        free(line);
        return NULL;
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    return line;
}

int cmd_chat(int argc, char **argv) {
    chat_session c;
    memset(&c, 0, sizeof c);
    cli_gen_options_init(&c.o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--keep-reasoning")) {
            c.o.keep_reasoning = true;
            continue;
        }
        int r = cli_gen_parse_flag(&c.o, argc, argv, &i, "chat");
        if (r < 0) return 2;
        if (r == 0) {
            fprintf(stderr, "ds4f chat: unknown or incomplete option '%s' (ds4f chat --help)\n", a);
            return 2;
        }
    }
    if (cli_gen_finish_options(&c.o, "chat") != 0) return 2;
    if (cli_engine_open(&c.o, &c.e, "chat") != 0) return 1;
    c.tty_in = isatty(0);
    c.tty_out = isatty(1);
    c.answer_closed = true;
    cli_interrupt_install(c.e.gen);
    if (c.tty_in) {
        using_history();
        printf("ds4f chat: %s (%d layers, vocabulary %d, context %d). /help lists the commands; Ctrl-C stops an "
               "answer, Ctrl-D leaves.\n",
               c.o.model_dir, c.e.info.layers, c.e.info.vocab_size, c.o.context);
    }
    bool quit = false;
    while (!quit) {
        char *line = read_line(&c);
        if (!line) break;
        const char *s = line;
        while (*s == ' ' || *s == '\t') s++;
        if (*s) {
            if (c.tty_in) add_history(line);
            if (*s == '/') handle_command(&c, s, &quit);
            else answer(&c, line);
        }
        free(line);
    }
    if (c.tty_in && !quit) printf("\n");
    ds4f_generator_stats st;
    ds4f_generator_get_stats(c.e.gen, &st);
    cli_report_session(stderr, &st, c.turns_total, c.o.sampling.seed);
    free(c.conv);
    free(c.answer_ids);
    cli_engine_close(&c.e);
    return 0;
}
