/* ds4f serve: the JSON the OpenAI-compatible endpoints answer with.
 *
 * server_output turns the text of one generation into OpenAI's formats: chat.completion and its
 * streamed chat.completion.chunk events, text_completion and its stream. For chat it runs the
 * generated text through the DSML splitter (text/dsml.h): reasoning becomes `reasoning_content`,
 * a tool-call block becomes `tool_calls` with finish_reason "tool_calls", and a block the model
 * got wrong is passed on as content (it is never dropped). The engine feeds it token texts as the
 * generator reports them; tests feed it any text (that is how the DSML -> tool_calls path is
 * tested without a model that writes DSML).
 *
 * All JSON is written by hand with json_put_string, which makes any byte string valid JSON: the
 * model may produce NUL bytes or bytes that are not UTF-8 (each becomes U+FFFD), and cJSON could
 * carry neither. */
#ifndef DS4F_APP_SERVER_RESPONSE_H
#define DS4F_APP_SERVER_RESPONSE_H

#include <stdbool.h>
#include <stddef.h>

#include "app/server_request.h"
#include "text/dsml.h"

/* A JSON string literal of the bytes: escapes as JSON requires, and U+FFFD for every byte that
 * does not belong to a well-formed UTF-8 character. */
void json_put_string(dsml_buf *b, const char *s, size_t len);
void json_put_cstring(dsml_buf *b, const char *s);
/* The bytes as a client receives them in JSON: U+FFFD in place of every byte that does not
 * belong to a well-formed UTF-8 character, everything else unchanged. */
void utf8_put_sanitized(dsml_buf *b, const char *s, size_t len);

/* {"error": {"message", "type", "param", "code"}} */
char *server_error_json(const server_error *e, size_t *len);

/* An id for a response or a tool call: prefix + 24 random hexadecimal digits. */
void server_random_id(char *out, size_t size, const char *prefix);

typedef struct server_usage {
    int prompt_tokens;
    int completion_tokens; /* sampled tokens, the stop token included */
    int cached_tokens;     /* prompt tokens reused from the previous request */
    int reasoning_tokens;  /* chat, thinking mode: completion tokens spent before </think> */
} server_usage;

/* Where streamed output goes: complete SSE events ("data: ...\n\n"), in order. */
typedef void (*server_sink_fn)(void *user, const char *bytes, size_t len);

typedef struct server_tool_call {
    char id[40];
    char *name, *arguments;
} server_tool_call;

typedef struct server_output {
    server_api api;        /* SERVER_API_CHAT or SERVER_API_COMPLETIONS */
    bool stream, include_usage;
    bool thinking;         /* chat: the prompt opened the reasoning */
    char id[48];
    const char *model;
    long long created;
    server_sink_fn sink;
    void *sink_user;
    dsml_stream split;     /* chat */
    bool role_sent;        /* chat stream: the first chunk carries the role */
    bool reasoning_closed; /* chat: </think> has been generated */
    size_t think_scan;     /* where to look for </think> next */
    int reasoning_tokens;
    bool malformed;        /* chat: the generated turn broke the format (see malformed_reason) */
    char malformed_reason[256];
    /* The answer so far (both modes: the engine remembers reasoning for later turns). */
    dsml_buf reasoning, content;
    server_tool_call *calls;
    size_t n_calls;
    bool oom;
} server_output;

/* model must outlive the output. sink: where SSE events go when stream is set. */
void server_output_init(server_output *o, server_api api, bool stream, bool include_usage, bool thinking,
                        const char *model, server_sink_fn sink, void *sink_user);
void server_output_free(server_output *o);

/* The text that one token (or the generator's final event) made final. */
void server_output_feed(server_output *o, const char *text, size_t len);
/* Counts one generated token for usage (reasoning or not: call it after server_output_feed). */
void server_output_count_token(server_output *o);

/* OpenAI's finish_reason for how the generation ended: "tool_calls" when the answer has tool
 * calls, "length" for DS4F_FINISH_LENGTH, else "stop". */
const char *server_output_finish_reason(const server_output *o, ds4f_finish_reason finish);

/* Ends the answer. Streaming: sends the last chunks (the final delta with finish_reason, usage
 * when include_usage) and "data: [DONE]" through the sink; *body is NULL. Otherwise: *body is the
 * whole response (malloc'd JSON). -1 only when memory ran out. */
int server_output_finish(server_output *o, ds4f_finish_reason finish, const server_usage *u, char **body, size_t *len);

/* An error inside a stream whose 200 status is already sent: an SSE event with OpenAI's error
 * object (the openai client libraries raise it), then "data: [DONE]". */
void server_output_stream_error(server_output *o, const server_error *e);

/* The SSE comment that keeps a connection and its proxies from timing out (clients ignore it). */
#define SERVER_SSE_KEEPALIVE ": keep-alive\n\n"

#endif
