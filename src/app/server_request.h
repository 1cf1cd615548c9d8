/* ds4f serve: request bodies of the OpenAI-compatible endpoints, checked and turned into what the
 * engine needs (sampling, limits, stop strings, the conversation or the raw prompt), and the
 * prompt text they render to.
 *
 * Pure functions of their input (no I/O, no engine): `ds4f serve` runs them on the connection's
 * thread before a request may queue, the unit tests call them directly and
 * tests/fuzz/fuzz_server_request.c fuzzes them. Every refusal is a server_error whose message
 * names the offending field, ready to be sent as OpenAI's error object.
 *
 * Accepted, beyond OpenAI's own fields: DeepSeek's `thinking` {"type": "enabled"|"disabled"},
 * `reasoning_effort` (chat_apply_reasoning_effort), `chat_template_kwargs` {"thinking": bool}
 * (the vLLM / SGLang spelling), `top_k`, `min_p` and `ignore_eos` (generate until max_tokens even
 * past the end of the answer: for benchmarks and tests, as in vLLM and llama.cpp). Fields that would change the answer but are
 * not implemented are refused rather than ignored: n > 1, logprobs, a non-empty logit_bias,
 * non-zero presence/frequency penalties, response_format other than text, tool_choice other than
 * auto / none, echo / suffix / best_of on completions. Unknown fields are ignored, as OpenAI's
 * clients add their own. */
#ifndef DS4F_APP_SERVER_REQUEST_H
#define DS4F_APP_SERVER_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ds4f.h"
#include "text/chat_template.h"

typedef enum {
    SERVER_API_CHAT,           /* /v1/chat/completions */
    SERVER_API_COMPLETIONS,    /* /v1/completions */
    SERVER_API_APPLY_TEMPLATE, /* /apply-template: a chat body, answered with its rendered prompt */
} server_api;

/* An error answer: the HTTP status and OpenAI's {"error": {message, type, param, code}}. */
typedef struct server_error {
    int status;
    const char *type;  /* "invalid_request_error", "server_error", ... (static strings) */
    const char *code;  /* machine-readable reason, e.g. "invalid_json"; static */
    char param[64];    /* the offending field ("" when none) */
    char message[1024];
} server_error;

/* Fills *e and returns -1. */
int server_error_set(server_error *e, int status, const char *type, const char *code, const char *param,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* A 400 invalid_request_error with code "invalid_value" (the common case). */
int server_error_invalid(server_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define SERVER_MAX_STOPS 16

/* What the server applies when a request leaves a choice open (flags of `ds4f serve`). */
typedef struct server_request_defaults {
    bool thinking;  /* chat: thinking mode when the request does not choose */
    int max_tokens; /* when the request gives none; 0: until EOS or the context is full */
} server_request_defaults;

typedef struct server_request {
    server_api api;
    bool stream;
    bool include_usage;        /* stream_options.include_usage: a final chunk with usage */
    ds4f_sampling sampling;
    bool seed_given;           /* else the server picks a seed */
    int max_tokens;            /* 0: until EOS or the context is full */
    bool ignore_eos;           /* do not stop on the EOS token */
    char *stops[SERVER_MAX_STOPS];
    int n_stops;
    /* chat and apply-template */
    chat_conversation conv;
    chat_options chat;         /* thinking mode and effort; drop_thinking is decided when rendering */
    /* completions: the prompt as text (prompt != NULL), or as token ids */
    char *prompt;
    size_t prompt_len;
    int32_t *prompt_ids;
    int n_prompt_ids;
} server_request;

void server_request_init(server_request *r);
void server_request_free(server_request *r);

/* Parses and checks a request body of the given endpoint. On failure *r holds nothing that needs
 * freeing beyond server_request_free (which is always safe to call). */
int server_request_parse(server_api api, const char *body, size_t len, const server_request_defaults *d,
                         server_request *r, server_error *e);

/* The prompt text the request renders to: the chat encoding of the conversation, or the raw
 * prompt after one BOS text (unless it starts with it already). Not for prompts given as ids.
 *
 * keep_reasoning: in thinking mode, render earlier assistant turns with their reasoning when
 * every one of them has it (given by the client, or restored by the server), so that the
 * prompt of the next turn extends the tokens the model generated and only the new turn needs a
 * prefill. Otherwise, and always when keep_reasoning is false, earlier reasoning is dropped as
 * the official encoder does by default. *opens_reasoning tells whether the prompt ends in
 * <think> (the answer starts with reasoning). */
int server_request_prompt(const server_request *r, bool keep_reasoning, char **text, size_t *len,
                          bool *opens_reasoning, server_error *e);

#endif
