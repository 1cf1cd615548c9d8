/* ds4f serve without a network or a model: request validation, prompt rendering (reasoning kept
 * or dropped, tool calls and results), the OpenAI answers built from generated text (the
 * DSML -> tool_calls path, streamed and not, malformed blocks, bytes that are not UTF-8), the
 * prompt cache and the reasoning memory that make a conversation's next turn reuse the session,
 * and the bounded queue. tests/cli/serve.sh runs the real server. */
#include "test.h"

#include <cJSON.h>
#include <string.h>

#include "app/server_memory.h"
#include "app/server_queue.h"
#include "app/server_request.h"
#include "app/server_response.h"
#include "model/synth.h"
#include "text/dsml.h"
#include "text/tokenizer.h"

#define CHECK_STR(got, want)                                                                         \
    CHECK((got) && strcmp((got), (want)) == 0, "got \"%s\"\n      want \"%s\"", (got) ? (got) : "(null)", (want))

static int parse(server_api api, const char *body, server_request *r, server_error *e) {
    server_request_defaults d = {.thinking = false, .max_tokens = 0};
    memset(e, 0, sizeof *e);
    return server_request_parse(api, body, strlen(body), &d, r, e);
}

/* A request that must be refused with this status and a message containing `needle`. */
static void expect_refused(server_api api, const char *body, int status, const char *param, const char *needle) {
    server_request r;
    server_error e;
    int rc = parse(api, body, &r, &e);
    CHECK(rc == -1, "accepted: %s", body);
    if (rc == -1) {
        CHECK(e.status == status, "%s: status %d, want %d (%s)", body, e.status, status, e.message);
        CHECK(strstr(e.message, needle), "%s: message \"%s\" lacks \"%s\"", body, e.message, needle);
        if (param) CHECK(strcmp(e.param, param) == 0, "%s: param \"%s\", want \"%s\"", body, e.param, param);
        CHECK(e.type && e.code, "%s: no type or code", body);
    }
    server_request_free(&r);
}

TEST(server_request_valid_chat) {
    server_request r;
    server_error e;
    const char *body = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":"
                       "\"Hi\"}],\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"seed\":-1,\"max_completion_tokens\":"
                       "12,\"stop\":[\"a\",\"bc\"],\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                       "\"presence_penalty\":0,\"n\":1,\"user\":\"u\",\"tool_choice\":\"auto\",\"logprobs\":false}  \n";
    REQUIRE(parse(SERVER_API_CHAT, body, &r, &e) == 0, "%s", e.message);
    CHECK(r.sampling.temperature == 0.5f && r.sampling.top_p == 0.9f && r.sampling.top_k == 40, "sampling");
    CHECK(r.seed_given && r.sampling.seed == UINT64_MAX, "seed -1 -> %llu", (unsigned long long)r.sampling.seed);
    CHECK(r.max_tokens == 12, "max_tokens %d", r.max_tokens);
    CHECK(r.n_stops == 2 && strcmp(r.stops[1], "bc") == 0, "stops");
    CHECK(r.stream && r.include_usage, "stream");
    CHECK(!r.chat.thinking, "the default is chat mode");
    CHECK(r.conv.n_messages == 2, "messages");
    char *text;
    size_t len;
    bool opens;
    REQUIRE(server_request_prompt(&r, true, &text, &len, &opens, &e) == 0, "%s", e.message);
    CHECK_STR(text, DSV4_BOS "S" DSV4_USER "Hi" DSV4_ASSISTANT DSV4_THINK_END);
    CHECK(!opens, "chat mode does not open reasoning");
    free(text);
    server_request_free(&r);

    /* top_p 0 is greedy; max_tokens without the newer name. */
    REQUIRE(parse(SERVER_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":0,\"max_tokens\":3}",
                  &r, &e) == 0,
            "%s", e.message);
    CHECK(r.sampling.temperature == 0 && r.max_tokens == 3, "top_p 0");
    server_request_free(&r);
}

TEST(server_request_refusals) {
    const char *user = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    char body[512];
    expect_refused(SERVER_API_CHAT, "{\"messages\":[", 400, NULL, "not valid JSON");
    expect_refused(SERVER_API_CHAT, "{\"messages\":[]} x", 400, NULL, "after its JSON value");
    expect_refused(SERVER_API_CHAT, "[1,2]", 400, NULL, "must be a JSON object");
    expect_refused(SERVER_API_CHAT, "", 400, NULL, "not valid JSON");
    expect_refused(SERVER_API_CHAT, "{}", 400, "messages", "messages is required");
    expect_refused(SERVER_API_CHAT, "{\"messages\":[]}", 400, "messages", "must not be empty");
    expect_refused(SERVER_API_CHAT, "{\"messages\":{}}", 400, "messages", "must be an array");
    expect_refused(SERVER_API_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "messages",
                   "unknown role \"wizard\"");
    expect_refused(SERVER_API_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages", "has no role");
    expect_refused(SERVER_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages",
                   "content must be");
    expect_refused(SERVER_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"y\"}]}",
                   400, "messages", "last message has role \"assistant\"");
    expect_refused(SERVER_API_CHAT, "{\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", 400, "messages",
                   "last message has role \"system\"");
    struct { const char *extra, *param, *needle; int status; } cases[] = {
        {"\"temperature\":2.5", "temperature", "between 0 and 2", 400},
        {"\"temperature\":-0.1", "temperature", "between 0 and 2", 400},
        {"\"temperature\":\"hot\"", "temperature", "must be a number", 400},
        {"\"top_p\":1.5", "top_p", "between 0 and 1", 400},
        {"\"max_tokens\":0", "max_tokens", "between 1", 400},
        {"\"max_tokens\":2.5", "max_tokens", "must be an integer", 400},
        {"\"max_completion_tokens\":-3", "max_completion_tokens", "between 1", 400},
        {"\"stream\":\"yes\"", "stream", "true or false", 400},
        {"\"stop\":5", "stop", "string or an array", 400},
        {"\"stop\":[\"\"]", "stop", "must not be empty", 400},
        {"\"stop\":[\"a\",1]", "stop", "stop[1] must be a string", 400},
        {"\"n\":2", "n", "not supported", 400},
        {"\"logprobs\":true", "logprobs", "not supported", 400},
        {"\"presence_penalty\":0.5", "presence_penalty", "not supported", 400},
        {"\"logit_bias\":{\"5\":1}", "logit_bias", "not supported", 400},
        {"\"response_format\":{\"type\":\"json_object\"}", "response_format", "not supported", 400},
        {"\"tool_choice\":\"required\"", "tool_choice", "not supported", 400},
        {"\"tools\":{}", "tools", "must be an array", 400},
        {"\"thinking\":{\"type\":\"sometimes\"}", "thinking", "enabled", 400},
        {"\"reasoning_effort\":\"extreme\"", "reasoning_effort", "not one of", 400},
        {"\"stream_options\":{\"include_usage\":1}", "stream_options.include_usage", "true or false", 400},
        {"\"model\":7", "model", "must be a string", 400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(body, sizeof body, "{%s,%s}", user, cases[i].extra);
        expect_refused(SERVER_API_CHAT, body, cases[i].status, cases[i].param, cases[i].needle);
    }
    expect_refused(SERVER_API_COMPLETIONS, "{}", 400, "prompt", "prompt is required");
    expect_refused(SERVER_API_COMPLETIONS, "{\"prompt\":5}", 400, "prompt", "string or an array of token ids");
    expect_refused(SERVER_API_COMPLETIONS, "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt", "more than one prompt");
    expect_refused(SERVER_API_COMPLETIONS, "{\"prompt\":[1,-2]}", 400, "prompt", "prompt[1] must be a token id");
    expect_refused(SERVER_API_COMPLETIONS, "{\"prompt\":\"x\",\"echo\":true}", 400, "echo", "not supported");
    expect_refused(SERVER_API_COMPLETIONS, "{\"prompt\":\"x\",\"best_of\":3}", 400, "best_of", "not supported");
    expect_refused(SERVER_API_COMPLETIONS, "{\"prompt\":\"\xff\"}", 400, "prompt", "not valid UTF-8");
    expect_refused(SERVER_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc0\xaf\"}]}", 400, "messages",
                   "not valid UTF-8");
}

TEST(server_request_completions_prompt) {
    server_request r;
    server_error e;
    REQUIRE(parse(SERVER_API_COMPLETIONS, "{\"prompt\":\"Once\",\"max_tokens\":4}", &r, &e) == 0, "%s", e.message);
    char *text;
    size_t len;
    bool opens;
    REQUIRE(server_request_prompt(&r, true, &text, &len, &opens, &e) == 0, "%s", e.message);
    CHECK_STR(text, DSV4_BOS "Once");
    free(text);
    server_request_free(&r);
    /* A prompt that has its BOS already keeps just the one. */
    REQUIRE(parse(SERVER_API_COMPLETIONS, "{\"prompt\":[\"" DSV4_BOS "Once\"]}", &r, &e) == 0, "%s", e.message);
    REQUIRE(server_request_prompt(&r, true, &text, &len, &opens, &e) == 0, "%s", e.message);
    CHECK_STR(text, DSV4_BOS "Once");
    free(text);
    server_request_free(&r);
    REQUIRE(parse(SERVER_API_COMPLETIONS, "{\"prompt\":[[0,5,6]]}", &r, &e) == 0, "%s", e.message);
    CHECK(r.n_prompt_ids == 3 && r.prompt_ids[2] == 6 && !r.prompt, "ids");
    server_request_free(&r);
}

/* Thinking switches and the rendering of earlier reasoning. */
TEST(server_request_thinking_and_reasoning_history) {
    const char *conv = "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},"
                       "{\"role\":\"assistant\",\"content\":\"Hello\",\"reasoning_content\":\"greet\"},"
                       "{\"role\":\"user\",\"content\":\"Bye\"}]";
    const char *switches[] = {"\"thinking\":{\"type\":\"enabled\"}", "\"reasoning_effort\":\"high\"",
                              "\"chat_template_kwargs\":{\"thinking\":true}"};
    char body[512];
    for (size_t i = 0; i < 3; i++) {
        snprintf(body, sizeof body, "{%s,%s}", conv, switches[i]);
        server_request r;
        server_error e;
        REQUIRE(parse(SERVER_API_CHAT, body, &r, &e) == 0, "%s", e.message);
        CHECK(r.chat.thinking, "%s turns thinking on", switches[i]);
        char *text;
        size_t len;
        bool opens;
        REQUIRE(server_request_prompt(&r, true, &text, &len, &opens, &e) == 0, "%s", e.message);
        /* Kept: the next turn extends what the model generated. */
        CHECK_STR(text, DSV4_BOS DSV4_USER "Hi" DSV4_ASSISTANT DSV4_THINK_START "greet" DSV4_THINK_END "Hello" DSV4_EOS
                  DSV4_USER "Bye" DSV4_ASSISTANT DSV4_THINK_START);
        CHECK(opens, "thinking opens the reasoning");
        free(text);
        /* without --keep-reasoning: the official default rendering. */
        REQUIRE(server_request_prompt(&r, false, &text, &len, &opens, &e) == 0, "%s", e.message);
        CHECK_STR(text, DSV4_BOS DSV4_USER "Hi" DSV4_ASSISTANT DSV4_THINK_END "Hello" DSV4_EOS DSV4_USER "Bye" DSV4_ASSISTANT
                  DSV4_THINK_START);
        free(text);
        server_request_free(&r);
    }
    /* An earlier answer without reasoning: all earlier reasoning is dropped (never an empty block). */
    server_request r;
    server_error e;
    REQUIRE(parse(SERVER_API_CHAT,
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Hello\"},"
                  "{\"role\":\"user\",\"content\":\"Bye\"}],\"thinking\":{\"type\":\"enabled\"}}",
                  &r, &e) == 0,
            "%s", e.message);
    char *text;
    size_t len;
    bool opens;
    REQUIRE(server_request_prompt(&r, true, &text, &len, &opens, &e) == 0, "%s", e.message);
    CHECK_STR(text, DSV4_BOS DSV4_USER "Hi" DSV4_ASSISTANT DSV4_THINK_END "Hello" DSV4_EOS DSV4_USER "Bye" DSV4_ASSISTANT
              DSV4_THINK_START);
    free(text);
    server_request_free(&r);
    /* thinking disabled and reasoning_effort none both mean chat mode. */
    REQUIRE(parse(SERVER_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"none\"}", &r,
                  &e) == 0,
            "%s", e.message);
    CHECK(!r.chat.thinking, "reasoning_effort none");
    server_request_free(&r);
}

/* ---- answers ------------------------------------------------------------------------------------- */

static const char TOOL_BLOCK[] = "\n\n<" DSV4_DSML "tool_calls>\n<" DSV4_DSML "invoke name=\"get_weather\">\n<" DSV4_DSML
                                 "parameter name=\"city\" string=\"true\">Paris</" DSV4_DSML "parameter>\n<" DSV4_DSML
                                 "parameter name=\"days\" string=\"false\">3</" DSV4_DSML "parameter>\n</" DSV4_DSML
                                 "invoke>\n</" DSV4_DSML "tool_calls>";

typedef struct sse_log {
    dsml_buf bytes;
} sse_log;

static void collect(void *user, const char *bytes, size_t len) { dsml_buf_put(&((sse_log *)user)->bytes, bytes, len); }

/* Feeds text in pieces of `step` bytes, as a generator would in tokens. */
static void feed_pieces(server_output *o, const char *text, size_t step) {
    const size_t len = strlen(text);
    for (size_t at = 0; at < len; at += step) {
        server_output_count_token(o);
        server_output_feed(o, text + at, at + step <= len ? step : len - at);
    }
}

static cJSON *finish_json(server_output *o, ds4f_finish_reason finish) {
    server_usage u = {10, 5, 4, 0};
    char *body;
    size_t len;
    if (server_output_finish(o, finish, &u, &body, &len)) return NULL;
    cJSON *j = cJSON_ParseWithLength(body, len);
    free(body);
    return j;
}

static const char *jstr(const cJSON *obj, const char *path) {
    /* dotted path with numeric indexes, e.g. "choices.0.message.content" */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *cur = obj;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = (*tok >= '0' && *tok <= '9') ? cJSON_GetArrayItem(cur, atoi(tok)) : cJSON_GetObjectItemCaseSensitive(cur, tok);
    return cJSON_IsString(cur) ? cur->valuestring : cJSON_IsNull(cur) ? "(null)" : NULL;
}

TEST(server_output_dsml_becomes_tool_calls) {
    for (size_t step = 1; step <= 64; step *= 4) {
        server_output o;
        server_output_init(&o, SERVER_API_CHAT, false, false, false, "m", NULL, NULL);
        char text[1024];
        snprintf(text, sizeof text, "Let me check.%s", TOOL_BLOCK);
        feed_pieces(&o, text, step);
        cJSON *j = finish_json(&o, DS4F_FINISH_STOP);
        REQUIRE(j, "the answer is JSON");
        CHECK_STR(jstr(j, "object"), "chat.completion");
        CHECK_STR(jstr(j, "choices.0.finish_reason"), "tool_calls");
        CHECK_STR(jstr(j, "choices.0.message.content"), "Let me check.");
        CHECK_STR(jstr(j, "choices.0.message.tool_calls.0.type"), "function");
        CHECK_STR(jstr(j, "choices.0.message.tool_calls.0.function.name"), "get_weather");
        CHECK_STR(jstr(j, "choices.0.message.tool_calls.0.function.arguments"), "{\"city\": \"Paris\", \"days\": 3}");
        const char *id = jstr(j, "choices.0.message.tool_calls.0.id");
        CHECK(id && strncmp(id, "call_", 5) == 0, "tool call id %s", id ? id : "(none)");
        CHECK(!cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "message"),
                                   "reasoning_content"),
              "no reasoning_content in chat mode");
        cJSON_Delete(j);
        server_output_free(&o);
    }
    /* Only a tool call: content is null, as OpenAI writes it. */
    server_output o;
    server_output_init(&o, SERVER_API_CHAT, false, false, false, "m", NULL, NULL);
    feed_pieces(&o, TOOL_BLOCK + 2, 7); /* a block at the very start has no blank line before it */
    cJSON *j = finish_json(&o, DS4F_FINISH_STOP);
    REQUIRE(j, "JSON");
    /* The official format wants the blank line; without it the text is content, not a call. */
    CHECK_STR(jstr(j, "choices.0.finish_reason"), "stop");
    cJSON_Delete(j);
    server_output_free(&o);
    server_output_init(&o, SERVER_API_CHAT, false, false, false, "m", NULL, NULL);
    feed_pieces(&o, TOOL_BLOCK, 5);
    j = finish_json(&o, DS4F_FINISH_STOP);
    REQUIRE(j, "JSON");
    CHECK_STR(jstr(j, "choices.0.message.content"), "(null)");
    CHECK_STR(jstr(j, "choices.0.finish_reason"), "tool_calls");
    cJSON_Delete(j);
    server_output_free(&o);
}

/* The streamed form: the chunks, accumulated the way client libraries do, give the same answer. */
TEST(server_output_stream_tool_calls_and_reasoning) {
    sse_log log = {{0}};
    server_output o;
    server_output_init(&o, SERVER_API_CHAT, true, true, true, "m", collect, &log);
    char text[1024];
    snprintf(text, sizeof text, "think hard" DSV4_THINK_END "Sure.%s", TOOL_BLOCK);
    feed_pieces(&o, text, 3);
    server_usage u = {10, 5, 4, 0};
    u.reasoning_tokens = o.reasoning_tokens;
    char *body;
    size_t len;
    REQUIRE(server_output_finish(&o, DS4F_FINISH_STOP, &u, &body, &len) == 0 && !body, "stream finish");
    CHECK(o.reasoning_tokens == (int)((strlen("think hard" DSV4_THINK_END) + 2) / 3), "reasoning tokens %d",
          o.reasoning_tokens);
    dsml_buf reasoning = {0}, content = {0};
    char *calls_name = NULL, *calls_args = NULL, *finish = NULL;
    int events = 0, role_events = 0, usage_events = 0;
    bool done = false;
    char *all = dsml_buf_take(&log.bytes, NULL);
    REQUIRE(all, "output");
    for (char *ev = all, *next; ev && *ev; ev = next) {
        next = strstr(ev, "\n\n");
        REQUIRE(next, "events end with a blank line");
        *next = 0;
        next += 2;
        REQUIRE(strncmp(ev, "data: ", 6) == 0, "event \"%s\"", ev);
        CHECK(!done, "nothing after [DONE]");
        if (!strcmp(ev + 6, "[DONE]")) {
            done = true;
            continue;
        }
        events++;
        cJSON *j = cJSON_Parse(ev + 6);
        REQUIRE(j, "chunk is JSON: %s", ev);
        CHECK_STR(jstr(j, "object"), "chat.completion.chunk");
        cJSON *choices = cJSON_GetObjectItem(j, "choices");
        if (cJSON_GetArraySize(choices) == 0) {
            usage_events++;
            cJSON *usage = cJSON_GetObjectItem(j, "usage");
            CHECK(cJSON_GetObjectItem(usage, "total_tokens")->valueint == 15, "total");
            CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(usage, "prompt_tokens_details"), "cached_tokens")->valueint == 4,
                  "cached");
        } else {
            cJSON *delta = cJSON_GetObjectItem(cJSON_GetArrayItem(choices, 0), "delta");
            const char *s;
            if ((s = jstr(delta, "role"))) role_events++;
            if ((s = jstr(delta, "reasoning_content"))) dsml_buf_puts(&reasoning, s);
            if ((s = jstr(delta, "content"))) dsml_buf_puts(&content, s);
            if ((s = jstr(delta, "tool_calls.0.function.name"))) calls_name = strdup(s);
            if ((s = jstr(delta, "tool_calls.0.function.arguments"))) calls_args = strdup(s);
            const char *f = jstr(cJSON_GetArrayItem(choices, 0), "finish_reason");
            if (f && strcmp(f, "(null)")) finish = strdup(f);
        }
        cJSON_Delete(j);
    }
    CHECK(done, "ends with [DONE]");
    CHECK(role_events == 1, "the role comes once, first (%d)", role_events);
    CHECK(usage_events == 1, "one usage chunk");
    CHECK_STR(reasoning.data, "think hard");
    CHECK_STR(content.data, "Sure.");
    CHECK_STR(calls_name, "get_weather");
    CHECK_STR(calls_args, "{\"city\": \"Paris\", \"days\": 3}");
    CHECK_STR(finish, "tool_calls");
    free(all);
    free(calls_name);
    free(calls_args);
    free(finish);
    dsml_buf_free(&reasoning);
    dsml_buf_free(&content);
    server_output_free(&o);
}

/* What the model got wrong is passed on, not lost; bytes that are not UTF-8 stay valid JSON. */
TEST(server_output_malformed_and_binary) {
    server_output o;
    server_output_init(&o, SERVER_API_CHAT, false, false, false, "m", NULL, NULL);
    const char bad[] = "Hi\n\n<" DSV4_DSML "tool_calls>\n<" DSV4_DSML "invoke nam=\"x\">\n</" DSV4_DSML "tool_calls>";
    feed_pieces(&o, bad, 4);
    cJSON *j = finish_json(&o, DS4F_FINISH_STOP);
    REQUIRE(j, "JSON");
    CHECK(o.malformed, "the block is reported malformed");
    CHECK_STR(jstr(j, "choices.0.message.content"), bad);
    CHECK_STR(jstr(j, "choices.0.finish_reason"), "stop");
    cJSON_Delete(j);
    server_output_free(&o);

    server_output_init(&o, SERVER_API_COMPLETIONS, false, false, false, "m", NULL, NULL);
    const char bytes[] = {'a', (char)0xff, 'b', 0, 'c', (char)0xe2, (char)0x82, (char)0xac, '"', '\n'};
    server_output_feed(&o, bytes, sizeof bytes);
    j = finish_json(&o, DS4F_FINISH_LENGTH);
    REQUIRE(j, "JSON");
    CHECK_STR(jstr(j, "object"), "text_completion");
    CHECK_STR(jstr(j, "choices.0.finish_reason"), "length");
    const char *t = jstr(j, "choices.0.text");
    CHECK(t && memcmp(t, "a\xEF\xBF\xBD" "b", 5) == 0, "U+FFFD for 0xff: %s", t ? t : "(null)");
    cJSON_Delete(j);
    server_output_free(&o);

    dsml_buf b = {0};
    json_put_string(&b, "\x01\x7f\xed\xa0\x80\xf4\x90\x80\x80\xc0\xaf", 11);
    /* a surrogate (3 bytes), a code point above U+10FFFF (4), an overlong '/' (2): one U+FFFD each */
    CHECK_STR(b.data, "\"\\u0001\x7f\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF"
                      "\xBF\xBD\xEF\xBF\xBD\"");
    dsml_buf_free(&b);

    server_error e;
    server_error_set(&e, 429, "rate_limit_error", "queue_full", NULL, "busy \"now\"");
    char *err = server_error_json(&e, NULL);
    CHECK_STR(err, "{\"error\":{\"message\":\"busy \\\"now\\\"\",\"type\":\"rate_limit_error\",\"param\":null,\"code\":"
                   "\"queue_full\"}}");
    free(err);
}

/* The tool-call round trip without a model: the model's block becomes tool_calls; the client
 * sends them back with the tool's result; the new prompt contains exactly what the model wrote
 * (so the session is reused) followed by the result in a user turn. */
TEST(server_tool_call_round_trip_renders_back) {
    const char *tools = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\","
                        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{"
                        "\"type\":\"integer\"}}}}}]";
    char body[4096];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],%s}", tools);
    server_request r1;
    server_error e;
    REQUIRE(parse(SERVER_API_CHAT, body, &r1, &e) == 0, "%s", e.message);
    char *prompt1;
    size_t len1;
    bool opens;
    REQUIRE(server_request_prompt(&r1, true, &prompt1, &len1, &opens, &e) == 0, "%s", e.message);
    CHECK(strstr(prompt1, "## Tools") && strstr(prompt1, "\"name\": \"get_weather\""), "tools rendered: %s", prompt1);

    server_output o;
    server_output_init(&o, SERVER_API_CHAT, false, false, false, "m", NULL, NULL);
    feed_pieces(&o, TOOL_BLOCK, 6);
    cJSON *answer = finish_json(&o, DS4F_FINISH_STOP);
    REQUIRE(answer, "JSON");
    cJSON *msg = cJSON_Duplicate(
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(answer, "choices"), 0), "message"), 1);
    const char *call_id = jstr(msg, "tool_calls.0.id");
    REQUIRE(call_id, "call id");
    char *msg_text = cJSON_PrintUnformatted(msg);
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},%s,"
             "{\"role\":\"tool\",\"tool_call_id\":\"%s\",\"content\":\"18C and sunny\"}],%s}",
             msg_text, call_id, tools);
    server_request r2;
    REQUIRE(parse(SERVER_API_CHAT, body, &r2, &e) == 0, "%s", e.message);
    char *prompt2;
    size_t len2;
    REQUIRE(server_request_prompt(&r2, true, &prompt2, &len2, &opens, &e) == 0, "%s", e.message);
    dsml_buf want = {0};
    dsml_buf_put(&want, prompt1, len1);
    dsml_buf_puts(&want, TOOL_BLOCK);
    dsml_buf_puts(&want, DSV4_EOS DSV4_USER "<tool_result>18C and sunny</tool_result>" DSV4_ASSISTANT DSV4_THINK_END);
    CHECK_STR(prompt2, want.data);
    dsml_buf_free(&want);
    free(msg_text);
    cJSON_Delete(msg);
    cJSON_Delete(answer);
    free(prompt1);
    free(prompt2);
    server_output_free(&o);
    server_request_free(&r1);
    server_request_free(&r2);
}

/* ---- memory -------------------------------------------------------------------------------------- */

static tokenizer *synth_tok(void) {
    static tokenizer *tok;
    if (tok) return tok;
    char *json;
    size_t len;
    ds4f_error err;
    if (synth_tokenizer_json(synth_tokenizer_natural_size(), &json, &len, &err) ||
        tokenizer_load_from_memory(json, len, "synthetic tokenizer.json", &tok, &err))
        test_fail(__FILE__, __LINE__, "tokenizer: %s", err.msg);
    free(json);
    return tok;
}

TEST(server_prompt_cache_reuses_the_models_tokens) {
    tokenizer *tok = synth_tok();
    REQUIRE(tok, "tokenizer");
    ds4f_error err;
    const char prompt[] = DSV4_BOS DSV4_USER "Hello there" DSV4_ASSISTANT DSV4_THINK_END;
    int32_t *p_ids;
    size_t n_p;
    REQUIRE(tokenizer_encode(tok, prompt, strlen(prompt), &p_ids, &n_p, &err) == 0, "%s", err.msg);
    /* An answer split in a non-canonical way (a word that is one token, as two tokens), with a
     * byte that is not UTF-8, ended by the EOS. */
    int32_t word = -1, left = -1, right = -1;
    char word_text[64] = "";
    for (int32_t id = 0; id < tokenizer_vocab_size(tok) && word < 0; id++) {
        size_t bl;
        const uint8_t *b = tokenizer_token_bytes(tok, id, &bl);
        if (!b || bl < 3 || bl >= sizeof word_text) continue;
        bool letters = true;
        for (size_t k = 0; k < bl; k++) letters &= b[k] >= 'a' && b[k] <= 'z';
        if (!letters) continue;
        for (size_t cut = 1; cut < bl && word < 0; cut++) {
            int32_t *x, *y, *w;
            size_t nx, ny, nw;
            if (tokenizer_encode(tok, (const char *)b, cut, &x, &nx, &err) || tokenizer_encode(tok, (const char *)b + cut, bl - cut, &y, &ny, &err) ||
                tokenizer_encode(tok, (const char *)b, bl, &w, &nw, &err))
                break;
            if (nx == 1 && ny == 1 && nw == 1 && w[0] == id) {
                word = id;
                left = x[0];
                right = y[0];
                memcpy(word_text, b, bl);
                word_text[bl] = 0;
            }
            free(x);
            free(y);
            free(w);
        }
    }
    REQUIRE(word >= 0, "a word of the synthetic vocabulary made of two tokens");
    const int32_t eos = tokenizer_token_id(tok, DSV4_EOS);
    int32_t ff = -1; /* the byte 0xff on its own */
    for (int32_t id = 0; id < tokenizer_vocab_size(tok) && ff < 0; id++) {
        size_t bl;
        const uint8_t *b = tokenizer_token_bytes(tok, id, &bl);
        if (b && bl == 1 && b[0] == 0xff) ff = id;
    }
    REQUIRE(ff >= 0 && eos >= 0, "byte token and EOS");
    const int32_t gen[] = {left, right, ff, eos};
    server_prompt_cache c = {0};
    REQUIRE(server_prompt_cache_set(&c, tok, prompt, strlen(prompt), p_ids, (int)n_p, gen, 4, &err) == 0, "%s", err.msg);

    /* The client's next turn: the answer as it received it (U+FFFD for the byte), closed by the EOS. */
    char next[512];
    snprintf(next, sizeof next, "%s%s\xEF\xBF\xBD%s", prompt, word_text,
             DSV4_EOS DSV4_USER "More" DSV4_ASSISTANT DSV4_THINK_END);
    int32_t *ids;
    int n, reused;
    REQUIRE(server_prompt_cache_encode(&c, tok, next, strlen(next), &ids, &n, &reused, &err) == 0, "%s", err.msg);
    CHECK(reused == (int)n_p + 4, "reused %d of %d", reused, (int)n_p + 4);
    CHECK(n > reused && memcmp(ids, p_ids, n_p * sizeof *ids) == 0 && memcmp(ids + n_p, gen, sizeof gen) == 0,
          "the prompt starts with the session's tokens (%s as two)", word_text);
    free(ids);
    /* Another conversation: encoded from scratch. */
    const char other[] = DSV4_BOS DSV4_USER "Bye" DSV4_ASSISTANT DSV4_THINK_END;
    REQUIRE(server_prompt_cache_encode(&c, tok, other, strlen(other), &ids, &n, &reused, &err) == 0, "%s", err.msg);
    CHECK(reused == 0, "no reuse for another conversation");
    free(ids);
    /* Extending in the middle of a word is not a token boundary: encoded from scratch. */
    server_prompt_cache_free(&c);
    REQUIRE(server_prompt_cache_set(&c, tok, prompt, strlen(prompt), p_ids, (int)n_p, gen, 2, &err) == 0, "%s", err.msg);
    const char mid[] = DSV4_BOS DSV4_USER "Hello there" DSV4_ASSISTANT DSV4_THINK_END "there";
    REQUIRE(server_prompt_cache_encode(&c, tok, mid, strlen(mid), &ids, &n, &reused, &err) == 0, "%s", err.msg);
    CHECK(reused == 0, "no reuse inside a word (%d)", reused);
    free(ids);
    server_prompt_cache_free(&c);
    free(p_ids);
}

TEST(server_reasoning_memory_restores_by_answer) {
    server_reasoning_memory m;
    REQUIRE(server_reasoning_memory_init(&m, 2) == 0, "init");
    char name[] = "f", args[] = "{\"a\": 1}";
    server_tool_call call = {.name = name, .arguments = args};
    server_reasoning_memory_put(&m, "Hello", 5, NULL, 0, "greeting", 8);
    server_reasoning_memory_put(&m, "", 0, &call, 1, "need f", 6);
    server_request r;
    server_error e;
    REQUIRE(parse(SERVER_API_CHAT,
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Hello\"},"
                  "{\"role\":\"user\",\"content\":\"f?\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"
                  "\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1}\"}}]},{\"role\":"
                  "\"tool\",\"tool_call_id\":\"c\",\"content\":\"1\"},{\"role\":\"assistant\",\"content\":\"Helloo\"},"
                  "{\"role\":\"user\",\"content\":\"?\"}],\"thinking\":{\"type\":\"enabled\"}}",
                  &r, &e) == 0,
            "%s", e.message);
    ds4f_error err;
    CHECK(server_reasoning_memory_restore(&m, &r.conv, &err) == 2, "two answers known");
    CHECK_STR(r.conv.messages[1].reasoning_content, "greeting");
    CHECK_STR(r.conv.messages[3].reasoning_content, "need f");
    CHECK(r.conv.messages[5].reasoning_content == NULL, "an unknown answer stays without");
    server_request_free(&r);
    /* Bounded: a third answer pushes out the oldest. */
    server_reasoning_memory_put(&m, "x", 1, NULL, 0, "rx", 2);
    REQUIRE(parse(SERVER_API_CHAT,
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Hello\"},"
                  "{\"role\":\"user\",\"content\":\"?\"}]}",
                  &r, &e) == 0,
            "%s", e.message);
    CHECK(server_reasoning_memory_restore(&m, &r.conv, &err) == 0, "forgotten");
    server_request_free(&r);
    server_reasoning_memory_free(&m);
}

TEST(server_queue_bounded_fifo) {
    server_queue q;
    REQUIRE(server_queue_init(&q, 1) == 0, "init");
    int a = 1, b = 2, c = 3, ahead = -1;
    /* Idle consumer: one goes straight through, one may wait. */
    CHECK(server_queue_push(&q, &a, &ahead) == SERVER_QUEUE_OK && ahead == 0, "a");
    CHECK(server_queue_push(&q, &b, &ahead) == SERVER_QUEUE_OK && ahead == 1, "b");
    CHECK(server_queue_push(&q, &c, &ahead) == SERVER_QUEUE_FULL, "c refused");
    CHECK(server_queue_pop(&q) == &a, "fifo");
    CHECK(server_queue_push(&q, &c, &ahead) == SERVER_QUEUE_FULL, "still full while a runs and b waits");
    server_queue_done(&q);
    CHECK(server_queue_push(&q, &c, &ahead) == SERVER_QUEUE_OK && ahead == 1, "room once a is done");
    CHECK(server_queue_waiting(&q) == 2, "two waiting");
    server_queue_close(&q);
    CHECK(server_queue_push(&q, &a, &ahead) == SERVER_QUEUE_CLOSED, "closed");
    CHECK(server_queue_pop(&q) == NULL, "pop ends once closed");
    CHECK(server_queue_take(&q) == &b && server_queue_take(&q) == &c && server_queue_take(&q) == NULL, "the rest");
    server_queue_destroy(&q);

    REQUIRE(server_queue_init(&q, 0) == 0, "init 0");
    CHECK(server_queue_push(&q, &a, &ahead) == SERVER_QUEUE_OK, "queue 0 still runs one");
    CHECK(server_queue_push(&q, &b, &ahead) == SERVER_QUEUE_FULL, "but nobody waits");
    server_queue_destroy(&q);
}
