/* libFuzzer harness for ds4f serve's request path: the body of /v1/chat/completions,
 * /v1/completions or /apply-template through validation (server_request_parse), the reasoning
 * memory and the prompt rendering (server_request_prompt); and, in a second mode, any bytes as
 * generated text through the OpenAI answer builder (server_output: DSML splitting, tool calls,
 * JSON escaping), whose output must be valid JSON. Not part of `make test`.
 *
 * Build with `make fuzz` (clang's libFuzzer: apt-get install clang libclang-rt-14-dev), then run
 * from the repository root:
 *
 *   mkdir -p build/fuzz/corpus/server_request
 *   build/fuzz/fuzz_server_request -max_len=4096 -max_total_time=600 -jobs=1 \
 *     -dict=tests/fuzz/corpus/server_request.dict build/fuzz/corpus/server_request \
 *     tests/fuzz/corpus/server_request
 *
 * Input: the first byte chooses the mode and options (bits 0-1: chat, completions, apply-template
 * or generated text; requests: bit 2 keeps earlier reasoning, bit 3 makes thinking the default;
 * generated text: bit 2 completions instead of chat, bit 4 streamed, bit 5 opens with reasoning,
 * bits 6-7 the piece size), the rest is the body or the text.
 * Properties (any failure aborts): a refusal is a 400 (or a 500 for memory) with a message, a
 * type and a code; an accepted request has sane limits and renders, or is refused with a message;
 * a rendered prompt is valid UTF-8 and starts with the BOS; every answer is valid JSON. */
#include <cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/server_memory.h"
#include "app/server_request.h"
#include "app/server_response.h"
#include "text/dsml.h"

#define PROPERTY(cond)                                                                 \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "property failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                   \
        }                                                                              \
    } while (0)

static server_reasoning_memory memory;

static void check_error(const server_error *e) {
    PROPERTY(e->status == 400 || e->status == 500);
    PROPERTY(e->message[0] && e->type && e->code);
    size_t len;
    char *json = server_error_json(e, &len);
    PROPERTY(json);
    cJSON *j = cJSON_ParseWithLength(json, len);
    PROPERTY(j);
    cJSON_Delete(j);
    free(json);
}

static void fuzz_request(server_api api, uint8_t opt, const char *body, size_t len) {
    server_request_defaults d = {.thinking = (opt & 8) != 0, .max_tokens = 0};
    server_request r;
    server_error e;
    memset(&e, 0, sizeof e);
    if (server_request_parse(api, body, len, &d, &r, &e)) {
        check_error(&e);
        server_request_free(&r);
        return;
    }
    PROPERTY(r.sampling.temperature >= 0 && r.sampling.temperature <= 2);
    PROPERTY(r.sampling.top_p > 0 && r.sampling.top_p <= 1);
    PROPERTY(r.sampling.min_p >= 0 && r.sampling.min_p <= 1 && r.sampling.top_k >= 0);
    PROPERTY(r.max_tokens >= 0 && r.n_stops >= 0 && r.n_stops <= SERVER_MAX_STOPS);
    for (int i = 0; i < r.n_stops; i++) PROPERTY(r.stops[i][0] && utf8_valid(r.stops[i], strlen(r.stops[i])));
    if (api == SERVER_API_COMPLETIONS) {
        PROPERTY((r.prompt != NULL) != (r.n_prompt_ids > 0));
        if (!r.prompt) {
            server_request_free(&r);
            return;
        }
    } else {
        PROPERTY(r.conv.n_messages > 0);
        ds4f_error derr;
        PROPERTY(server_reasoning_memory_restore(&memory, &r.conv, &derr) >= 0);
    }
    char *text = NULL;
    size_t text_len = 0;
    bool opens = false;
    if (server_request_prompt(&r, (opt & 4) != 0, &text, &text_len, &opens, &e) == 0) {
        PROPERTY(text && strlen(text) == text_len);
        PROPERTY(utf8_valid(text, text_len));
        PROPERTY(strncmp(text, DSV4_BOS, strlen(DSV4_BOS)) == 0);
        PROPERTY(!opens || r.chat.thinking);
        free(text);
    } else {
        check_error(&e);
    }
    server_request_free(&r);
}

static void collect(void *user, const char *bytes, size_t len) { dsml_buf_put(user, bytes, len); }

/* Generated text (any bytes) through the answer builder, in pieces as a generator reports them. */
static void fuzz_output(uint8_t opt, const char *text, size_t len) {
    const bool stream = opt & 16, thinking = opt & 32;
    const server_api api = (opt & 4) ? SERVER_API_COMPLETIONS : SERVER_API_CHAT;
    dsml_buf sse = {0};
    server_output o;
    server_output_init(&o, api, stream, true, thinking, "m", collect, &sse);
    const size_t step = 1 + (opt >> 6) * 3;
    for (size_t at = 0; at < len; at += step) {
        server_output_count_token(&o);
        server_output_feed(&o, text + at, at + step <= len ? step : len - at);
    }
    server_usage u = {1, 2, 0, o.reasoning_tokens};
    char *body = NULL;
    size_t body_len = 0;
    PROPERTY(server_output_finish(&o, DS4F_FINISH_STOP, &u, &body, &body_len) == 0);
    if (!stream) {
        cJSON *j = cJSON_ParseWithLength(body, body_len);
        PROPERTY(j);
        cJSON_Delete(j);
        free(body);
    } else {
        PROPERTY(!body && sse.data);
        /* Every event is "data: " + JSON, and the stream ends with [DONE]. */
        char *p = sse.data;
        bool done = false;
        while (*p) {
            char *end = strstr(p, "\n\n");
            PROPERTY(end && strncmp(p, "data: ", 6) == 0 && !done);
            *end = 0;
            if (strcmp(p + 6, "[DONE]") == 0) {
                done = true;
            } else {
                cJSON *j = cJSON_Parse(p + 6);
                PROPERTY(j);
                cJSON_Delete(j);
            }
            p = end + 2;
        }
        PROPERTY(done);
    }
    server_output_free(&o);
    dsml_buf_free(&sse);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (!memory.entries) {
        server_reasoning_memory_init(&memory, 4);
        char name[] = "get_weather", args[] = "{\"city\": \"Paris\"}";
        server_tool_call call = {.name = name, .arguments = args};
        server_reasoning_memory_put(&memory, "Hello", 5, NULL, 0, "greet", 5);
        server_reasoning_memory_put(&memory, "", 0, &call, 1, "look it up", 10);
    }
    const uint8_t opt = data[0];
    /* An exact-size copy without a terminating NUL, so that reading past the end is caught. */
    char *text = malloc(size > 1 ? size - 1 : 1);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    switch (opt & 3) {
    case 0: fuzz_request(SERVER_API_CHAT, opt, text, size - 1); break;
    case 1: fuzz_request(SERVER_API_COMPLETIONS, opt, text, size - 1); break;
    case 2: fuzz_request(SERVER_API_APPLY_TEMPLATE, opt, text, size - 1); break;
    default: fuzz_output(opt, text, size - 1); break;
    }
    free(text);
    return 0;
}
