/* libFuzzer harness for the DSV4 chat encoding: the OpenAI-JSON -> conversation builder and the
 * renderer, the Python-compatible JSON reader, the DSML argument encoder, the parser of generated
 * turns and its streaming splitter. Not part of `make test` (the Makefile builds only the files in
 * tests/unit).
 *
 * Build and run from the repository root (clang's libFuzzer: apt-get install clang
 * libclang-rt-14-dev):
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=c11 -D_GNU_SOURCE -Iinclude -Isrc \
 *     $(pkg-config --cflags libcjson) tests/fuzz/fuzz_chat.c src/text/chat_template.c src/text/dsml.c \
 *     src/base/error.c $(pkg-config --libs libcjson) -lm -o build/fuzz_chat
 *   mkdir -p build/fuzz_chat_corpus
 *   build/fuzz_chat -max_len=4096 -max_total_time=600 build/fuzz_chat_corpus tests/data/chat
 *
 * (tests/data/chat as a second corpus directory seeds it with the official examples.) The first
 * input byte chooses what is fuzzed and its options; the rest is the data. Any failed property
 * aborts. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_template.h"
#include "text/dsml.h"

#define PROPERTY(cond)                                                                 \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "property failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                   \
        }                                                                              \
    } while (0)

/* Any OpenAI-style JSON: a message list, or {"messages", "tools"}. Accepted conversations must
 * render, or fail with a message; what renders is valid UTF-8 (every input string was checked)
 * and opens with the BOS. */
static void fuzz_conversation(uint8_t opt, const char *text, size_t len) {
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j) return;
    const cJSON *msgs = j, *tools = NULL;
    if (cJSON_IsObject(j)) {
        msgs = cJSON_GetObjectItem(j, "messages");
        tools = cJSON_GetObjectItem(j, "tools");
    }
    chat_conversation c;
    chat_init(&c);
    ds4f_error err = {{0}};
    if (chat_from_openai(&c, msgs, tools, opt & 1 ? CHAT_OPENAI_DEVELOPER_AS_SYSTEM : 0, &err) == 0) {
        chat_options o;
        chat_options_default(&o);
        o.thinking = opt & 2;
        o.drop_thinking = opt & 4;
        o.effort = (chat_effort)((opt >> 3) % 3);
        char *out = NULL;
        size_t n = 0;
        if (chat_render(&c, &o, &out, &n, &err) == 0) {
            PROPERTY(strlen(out) == n);
            PROPERTY(utf8_valid(out, n));
            PROPERTY(strncmp(out, DSV4_BOS, strlen(DSV4_BOS)) == 0);
            free(out);
        } else {
            PROPERTY(err.msg[0]);
        }
    } else {
        PROPERTY(err.msg[0]);
    }
    chat_free(&c);
    cJSON_Delete(j);
}

/* Python-style JSON: what is accepted comes out valid UTF-8 and is its own canonical form. */
static void fuzz_pyjson(const char *text, size_t len) {
    dsml_buf a = {0}, b = {0};
    ds4f_error err;
    if (pyjson_canonical(text, len, &a, &err) == 0) {
        PROPERTY(a.data && utf8_valid(a.data, a.len));
        PROPERTY(pyjson_canonical(a.data, a.len, &b, &err) == 0);
        PROPERTY(a.len == b.len && memcmp(a.data, b.data, a.len) == 0);
    }
    dsml_buf_free(&a);
    dsml_buf_free(&b);
    /* The argument encoder takes any text: JSON objects, other JSON (refused), non-JSON. */
    char *z = malloc(len + 1);
    if (!z) return;
    memcpy(z, text, len);
    z[len] = 0;
    dsml_encode_arguments(z, &a, &err);
    dsml_buf_free(&a);
    free(z);
}

typedef struct {
    dsml_buf reasoning, content;
    size_t calls;
    dsml_buf names[8], arguments[8];
} seen;

static void on_event(void *user, const dsml_event *ev) {
    seen *s = user;
    if (ev->kind == DSML_EVENT_TOOL_CALL) {
        PROPERTY(ev->tool_index == s->calls);
        PROPERTY(strlen(ev->name) <= ev->name_len && strlen(ev->arguments) <= ev->arguments_len);
        if (s->calls < 8) {
            dsml_buf_put(&s->names[s->calls], ev->name, ev->name_len);
            dsml_buf_put(&s->arguments[s->calls], ev->arguments, ev->arguments_len);
        }
        s->calls++;
        return;
    }
    PROPERTY(s->calls == 0);
    if (ev->kind == DSML_EVENT_REASONING) PROPERTY(s->content.len == 0);
    dsml_buf_put(ev->kind == DSML_EVENT_REASONING ? &s->reasoning : &s->content, ev->text, ev->len);
}

/* A generated turn: the stream, fed in pieces whose sizes come from the option byte, agrees with
 * the whole-text parse, and its events equal the parse's fields when the parse succeeds. */
static void fuzz_completion(uint8_t opt, const char *text, size_t len) {
    unsigned flags = (opt & 1 ? DSML_PARSE_THINKING : 0) | (opt & 2 ? DSML_PARSE_EOS_OPTIONAL : 0);
    size_t step = (size_t)(opt >> 2) % 9; /* 0: one byte at a time, growing by one */
    dsml_parsed whole, streamed;
    ds4f_error e1, e2;
    int rc_whole = dsml_parse_completion(text, len, flags, &whole, &e1);
    seen s = {0};
    dsml_stream st;
    dsml_stream_init(&st, flags, on_event, &s);
    for (size_t i = 0, k = 1; i < len; i += k, k = step ? step : k + 1) {
        if (k > len - i) k = len - i;
        PROPERTY(dsml_stream_feed(&st, text + i, k, &e2) == 0);
    }
    int rc_stream = dsml_stream_finish(&st, &streamed, &e2);
    PROPERTY(rc_whole == rc_stream);
    if (rc_whole == 0) {
        PROPERTY(s.reasoning.len == whole.reasoning_len);
        PROPERTY(memcmp(s.reasoning.data ? s.reasoning.data : "", whole.reasoning_content, s.reasoning.len) == 0);
        PROPERTY(s.content.len == whole.content_len);
        PROPERTY(memcmp(s.content.data ? s.content.data : "", whole.content, s.content.len) == 0);
        PROPERTY(s.calls == whole.n_tool_calls && streamed.n_tool_calls == whole.n_tool_calls);
        for (size_t i = 0; i < s.calls && i < 8; i++) {
            const dsml_tool_call *w = &whole.tool_calls[i];
            PROPERTY(s.names[i].len == w->name_len && memcmp(s.names[i].data ? s.names[i].data : "", w->name, w->name_len) == 0);
            PROPERTY(s.arguments[i].len == w->arguments_len && memcmp(s.arguments[i].data, w->arguments, w->arguments_len) == 0);
        }
        dsml_parsed_free(&whole);
        dsml_parsed_free(&streamed);
    } else {
        /* What was reported plus what was not covers no more than the text. */
        size_t rest;
        dsml_stream_unreported(&st, &rest);
        PROPERTY(s.reasoning.len + s.content.len + rest <= len);
    }
    for (size_t i = 0; i < 8; i++) {
        dsml_buf_free(&s.names[i]);
        dsml_buf_free(&s.arguments[i]);
    }
    dsml_buf_free(&s.reasoning);
    dsml_buf_free(&s.content);
    dsml_stream_free(&st);
}

/* An assistant tool call rendered then parsed back: with a plain name and arguments that are a
 * JSON object, the parse returns the arguments as Python would print them. */
static void fuzz_round_trip(const char *text, size_t len) {
    char *args = malloc(len + 1);
    if (!args) return;
    memcpy(args, text, len);
    args[len] = 0;
    dsml_buf canon = {0};
    ds4f_error err;
    bool object = pyjson_canonical(args, len, &canon, &err) == 0 && canon.data[0] == '{';
    /* Keys or string values holding DSML markup or tag-like text can legitimately break the
     * round trip (the official format has no escaping); keep to text without them. */
    bool plain = object && !memchr(args, '<', len) && !memchr(args, '>', len) && !strstr(args, "\\u00") &&
                 !strstr(args, "｜") && !strstr(args, "\\uff5c") && !strstr(args, "\\uFF5C") && !strstr(args, "\\\"");
    if (plain) {
        chat_conversation c;
        chat_init(&c);
        chat_message *m = chat_append(&c, CHAT_ROLE_ASSISTANT, "", &err);
        PROPERTY(m && chat_add_tool_call(m, "1", "f", args, &err) == 0);
        chat_options o;
        chat_options_default(&o);
        o.thinking = false;
        o.add_bos = false;
        char *r;
        if (chat_render(&c, &o, &r, NULL, &err) == 0) {
            dsml_parsed p;
            if (dsml_parse_completion(r, strlen(r), 0, &p, &err) == 0) {
                PROPERTY(p.n_tool_calls == 1);
                PROPERTY(strcmp(p.tool_calls[0].arguments, canon.data) == 0);
                dsml_parsed_free(&p);
            }
            free(r);
        }
        chat_free(&c);
    }
    dsml_buf_free(&canon);
    free(args);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t sel = data[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    switch (sel & 3) {
    case 0: fuzz_conversation(sel >> 2, text, len); break;
    case 1: fuzz_pyjson(text, len); break;
    case 2: fuzz_completion(sel >> 2, text, len); break;
    case 3: fuzz_round_trip(text, len); break;
    }
    return 0;
}
