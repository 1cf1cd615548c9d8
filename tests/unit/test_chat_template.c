/* DSV4 chat encoding (text/chat_template.h) and output parsing (text/dsml.h).
 *
 * Data in tests/data/chat/ (see its README):
 *  - test_input_N.json / test_output_N.txt: the official encoder's own tests (encoding/tests/ of
 *    DeepSeek's encoding_dsv4.py). Inputs 1-3 are rendered in thinking mode, 4 in chat mode, as
 *    the official test_encoding_dsv4.py does; input 1 is {"tools", "messages"} with the tools put
 *    on messages[0] (the system message).
 *  - encoding_dsv4_golden.jsonl: the same four outputs with their token ids; line N (0-based,
 *    "source_index" 111+N) is test_output_{N+1}.txt, byte for byte (checked below).
 *  - official_render_cases.jsonl / official_parse_cases.jsonl: what the official encoder and
 *    parser return for hand-written and seeded random cases (make_official_cases.py).
 * The token ids are checked with the tokenizer and tests/data/tokenizer/tokenizer.json.
 */
#include "test.h"

#include <string.h>

#include "base/file_io.h"
#include "text/chat_template.h"
#include "text/dsml.h"
#include "text/tokenizer.h"

#define DATA "tests/data/chat/"

static char *read_text(const char *path, size_t *len) {
    char *s = NULL;
    ds4f_error err;
    if (file_read_all(path, &s, len, &err)) {
        test_fail(__FILE__, __LINE__, "%s", err.msg);
        return NULL;
    }
    return s;
}

/* Renders an OpenAI-style message list (JSON text) with the given options. */
static char *render_json(const char *messages_json, const char *tools_json, const chat_options *o, ds4f_error *err) {
    cJSON *msgs = cJSON_Parse(messages_json), *tools = tools_json ? cJSON_Parse(tools_json) : NULL;
    if (!msgs) {
        error_set(err, "test JSON does not parse");
        return NULL;
    }
    chat_conversation c;
    chat_init(&c);
    char *out = NULL;
    if (chat_from_openai(&c, msgs, tools, 0, err) == 0) chat_render(&c, o, &out, NULL, err);
    chat_free(&c);
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    return out;
}

static chat_options opts(bool thinking) {
    chat_options o;
    chat_options_default(&o);
    o.thinking = thinking;
    return o;
}

#define CHECK_STR(got, want)                                                                        \
    do {                                                                                            \
        const char *g_ = (got), *w_ = (want);                                                       \
        CHECK(g_ && strcmp(g_, w_) == 0, "got  [%s]\n    want [%s]", g_ ? g_ : "(null)", w_);       \
    } while (0)

/* ---- the official examples ---------------------------------------------------------------- */

TEST(chat_official_examples) {
    for (int i = 1; i <= 4; i++) {
        char path[256];
        size_t len, want_len;
        snprintf(path, sizeof path, DATA "test_input_%d.json", i);
        char *input = read_text(path, &len);
        snprintf(path, sizeof path, DATA "test_output_%d.txt", i);
        char *want = read_text(path, &want_len);
        REQUIRE(input && want, "missing data");
        cJSON *j = cJSON_Parse(input);
        REQUIRE(j, "input %d does not parse", i);
        const cJSON *msgs = cJSON_IsObject(j) ? cJSON_GetObjectItem(j, "messages") : j;
        const cJSON *tools = cJSON_IsObject(j) ? cJSON_GetObjectItem(j, "tools") : NULL;
        chat_conversation c;
        chat_init(&c);
        ds4f_error err = {{0}};
        char *got = NULL;
        size_t got_len = 0;
        chat_options o = opts(i != 4);
        int rc = chat_from_openai(&c, msgs, tools, 0, &err);
        if (rc == 0) rc = chat_render(&c, &o, &got, &got_len, &err);
        CHECK(rc == 0, "case %d: %s", i, err.msg);
        CHECK(rc == 0 && got_len == want_len && memcmp(got, want, want_len) == 0, "case %d differs from test_output_%d.txt", i, i);
        free(got);
        chat_free(&c);
        cJSON_Delete(j);
        free(input);
        free(want);
    }
}

/* The official test also parses the assistant turns of cases 1 and 2 back out of the prompt. */
TEST(chat_official_example_parses) {
    size_t len;
    char *p1 = read_text(DATA "test_output_1.txt", &len);
    char *p2 = read_text(DATA "test_output_2.txt", &len);
    REQUIRE(p1 && p2, "missing data");
    const char *marker = DSV4_ASSISTANT DSV4_THINK_START;
    ds4f_error err;
    dsml_parsed r;

    const char *a = strstr(p1, marker) + strlen(marker), *b = strstr(a, DSV4_USER);
    REQUIRE(dsml_parse_completion(a, (size_t)(b - a), DSML_PARSE_THINKING, &r, &err) == 0, "%s", err.msg);
    CHECK_STR(r.reasoning_content, "The user wants to know the weather in Beijing. I should use the get_weather tool.");
    CHECK_STR(r.content, "");
    REQUIRE(r.n_tool_calls == 1, "%zu tool calls", r.n_tool_calls);
    CHECK_STR(r.tool_calls[0].name, "get_weather");
    CHECK_STR(r.tool_calls[0].arguments, "{\"location\": \"Beijing\", \"unit\": \"celsius\"}");
    dsml_parsed_free(&r);

    const char *last = NULL;
    for (const char *q = p1; (q = strstr(q, marker)); q++) last = q;
    last += strlen(marker);
    REQUIRE(dsml_parse_completion(last, strlen(last), DSML_PARSE_THINKING, &r, &err) == 0, "%s", err.msg);
    CHECK_STR(r.reasoning_content, "Got the weather data. Let me format a nice response.");
    CHECK(strstr(r.content, "22°C") != NULL, "content: %s", r.content);
    CHECK(r.n_tool_calls == 0, "tool calls");
    dsml_parsed_free(&r);

    last = NULL;
    for (const char *q = p2; (q = strstr(q, marker)); q++) last = q;
    last += strlen(marker);
    REQUIRE(dsml_parse_completion(last, strlen(last), DSML_PARSE_THINKING, &r, &err) == 0, "%s", err.msg);
    CHECK_STR(r.reasoning_content, "The user asks about the capital of France. It is Paris.");
    CHECK_STR(r.content, "The capital of France is Paris.");
    dsml_parsed_free(&r);
    CHECK(!strstr(p2, "The user said hello"), "case 2 kept the dropped reasoning");
    free(p1);
    free(p2);
}

TEST(chat_golden_jsonl_is_official_outputs) {
    size_t len;
    char *all = read_text(DATA "encoding_dsv4_golden.jsonl", &len);
    REQUIRE(all, "missing data");
    int line_no = 0;
    for (char *line = strtok(all, "\n"); line; line = strtok(NULL, "\n"), line_no++) {
        cJSON *j = cJSON_Parse(line);
        REQUIRE(j, "line %d does not parse", line_no);
        const cJSON *text = cJSON_GetObjectItem(j, "text"), *src = cJSON_GetObjectItem(j, "source_index");
        char path[256];
        snprintf(path, sizeof path, DATA "test_output_%d.txt", line_no + 1);
        size_t want_len;
        char *want = read_text(path, &want_len);
        CHECK(cJSON_IsString(text) && want && strcmp(text->valuestring, want) == 0,
              "golden line %d is not test_output_%d.txt", line_no, line_no + 1);
        CHECK(cJSON_IsNumber(src) && src->valueint == 111 + line_no, "line %d source_index", line_no);
        free(want);
        cJSON_Delete(j);
    }
    CHECK(line_no == 4, "%d lines", line_no);
    free(all);
}

/* Message list -> prompt text -> ids, against the ids HF's tokenizer gave the official prompts. */
TEST(chat_golden_token_ids) {
    tokenizer *tok = NULL;
    ds4f_error err;
    REQUIRE(tokenizer_load("tests/data/tokenizer/tokenizer.json", &tok, &err) == 0, "%s", err.msg);
    size_t len;
    char *all = read_text(DATA "encoding_dsv4_golden.jsonl", &len);
    REQUIRE(all, "missing data");
    int k = 0;
    char *save = NULL;
    for (char *line = strtok_r(all, "\n", &save); line; line = strtok_r(NULL, "\n", &save), k++) {
        cJSON *row = cJSON_Parse(line);
        const cJSON *want = row ? cJSON_GetObjectItem(row, "ids") : NULL;
        char path[256];
        snprintf(path, sizeof path, DATA "test_input_%d.json", k + 1);
        char *input = read_text(path, &len);
        cJSON *j = input ? cJSON_Parse(input) : NULL;
        if (!cJSON_IsArray(want) || !j) {
            CHECK(0, "golden line %d or test_input_%d.json unreadable", k, k + 1);
        } else {
            const cJSON *msgs = cJSON_IsObject(j) ? cJSON_GetObjectItem(j, "messages") : j;
            const cJSON *tools = cJSON_IsObject(j) ? cJSON_GetObjectItem(j, "tools") : NULL;
            chat_conversation c;
            chat_init(&c);
            chat_options o = opts(k != 3);
            char *text = NULL;
            size_t text_len = 0, n_ids = 0;
            int32_t *ids = NULL;
            int rc = chat_from_openai(&c, msgs, tools, 0, &err);
            if (rc == 0) rc = chat_render(&c, &o, &text, &text_len, &err);
            if (rc == 0) rc = tokenizer_encode(tok, text, text_len, &ids, &n_ids, &err);
            CHECK(rc == 0, "case %d: %s", k + 1, err.msg);
            CHECK(rc != 0 || (int)n_ids == cJSON_GetArraySize(want), "case %d: %zu ids, want %d", k + 1, n_ids,
                  cJSON_GetArraySize(want));
            size_t i = 0;
            for (const cJSON *w = want->child; rc == 0 && w && i < n_ids; w = w->next, i++)
                if (ids[i] != w->valueint) {
                    CHECK(0, "case %d: id %zu is %d, want %d", k + 1, i, ids[i], w->valueint);
                    break;
                }
            CHECK(rc != 0 || ids[0] == tokenizer_token_id(tok, DSV4_BOS), "case %d: does not start with one BOS", k + 1);
            free(ids);
            free(text);
            chat_free(&c);
        }
        cJSON_Delete(j);
        cJSON_Delete(row);
        free(input);
    }
    CHECK(k == 4, "%d golden lines", k);
    free(all);
    tokenizer_free(tok);
}

/* ---- recorded official behaviour ---------------------------------------------------------------- */

typedef void (*jsonl_fn)(const cJSON *row, int line);

static void each_jsonl(const char *path, jsonl_fn fn) {
    size_t len;
    char *all = read_text(path, &len);
    if (!all) return;
    int line_no = 0;
    char *save = NULL;
    for (char *line = strtok_r(all, "\n", &save); line; line = strtok_r(NULL, "\n", &save), line_no++) {
        cJSON *row = cJSON_Parse(line);
        CHECK(row, "%s line %d does not parse", path, line_no);
        if (row) fn(row, line_no);
        cJSON_Delete(row);
    }
    CHECK(line_no > 100, "%s: only %d lines", path, line_no);
    free(all);
}

static void check_render_case(const cJSON *row, int line) {
    const char *name = cJSON_GetObjectItem(row, "name")->valuestring;
    chat_options o;
    chat_options_default(&o);
    o.thinking = cJSON_IsTrue(cJSON_GetObjectItem(row, "thinking"));
    o.drop_thinking = cJSON_IsTrue(cJSON_GetObjectItem(row, "drop"));
    o.add_bos = cJSON_IsTrue(cJSON_GetObjectItem(row, "bos"));
    const cJSON *effort = cJSON_GetObjectItem(row, "effort");
    if (cJSON_IsString(effort)) o.effort = strcmp(effort->valuestring, "max") == 0 ? CHAT_EFFORT_MAX : CHAT_EFFORT_HIGH;
    chat_conversation c;
    chat_init(&c);
    ds4f_error err = {{0}};
    char *got = NULL;
    int rc = chat_from_openai(&c, cJSON_GetObjectItem(row, "messages"), cJSON_GetObjectItem(row, "request_tools"), 0, &err);
    if (rc == 0) rc = chat_render(&c, &o, &got, NULL, &err);
    const cJSON *text = cJSON_GetObjectItem(row, "text");
    if (text) {
        CHECK(rc == 0, "line %d (%s): %s", line, name, err.msg);
        CHECK(rc != 0 || strcmp(got, text->valuestring) == 0, "line %d (%s): rendered text differs:\n%s\n--- want ---\n%s", line,
              name, got, text->valuestring);
    } else {
        CHECK(rc != 0, "line %d (%s): the official encoder raised %s, we rendered", line, name,
              cJSON_GetObjectItem(row, "error")->valuestring);
    }
    free(got);
    chat_free(&c);
}

TEST(chat_official_render_cases) { each_jsonl(DATA "official_render_cases.jsonl", check_render_case); }

typedef struct {
    dsml_buf reasoning, content;
    dsml_tool_call calls[16];
    size_t n_calls;
    int last_kind;
    bool out_of_order, split_utf8;
} collected;

static void collect(void *user, const dsml_event *ev) {
    collected *c = user;
    if ((int)ev->kind < c->last_kind) c->out_of_order = true;
    c->last_kind = (int)ev->kind;
    if (ev->kind == DSML_EVENT_TOOL_CALL) {
        if (c->n_calls < 16 && ev->tool_index == c->n_calls) {
            c->calls[c->n_calls].name = strdup(ev->name);
            c->calls[c->n_calls].arguments = strdup(ev->arguments);
        }
        c->n_calls++;
        return;
    }
    /* A piece must not end inside a UTF-8 character when the text is well-formed UTF-8. */
    if (ev->len && utf8_valid(ev->text, ev->len) == false) c->split_utf8 = true;
    dsml_buf_put(ev->kind == DSML_EVENT_REASONING ? &c->reasoning : &c->content, ev->text, ev->len);
}

static void collected_free(collected *c) {
    dsml_buf_free(&c->reasoning);
    dsml_buf_free(&c->content);
    for (size_t i = 0; i < c->n_calls && i < 16; i++) {
        free(c->calls[i].name);
        free(c->calls[i].arguments);
    }
}

/* Feeds text to a stream in pieces of `step` bytes (0: growing pieces 1, 2, 3, ...) and checks
 * its events against the whole-text parse. */
static void check_stream(const char *name, const char *text, size_t len, unsigned flags, size_t step) {
    dsml_parsed whole;
    ds4f_error err, err2;
    int want_rc = dsml_parse_completion(text, len, flags, &whole, &err);
    collected col = {0};
    dsml_stream s;
    dsml_stream_init(&s, flags, collect, &col);
    for (size_t i = 0, k = 1; i < len; i += k, k = step ? step : k + 1) {
        if (k > len - i) k = len - i;
        CHECK(dsml_stream_feed(&s, text + i, k, &err2) == 0, "%s: feed", name);
    }
    dsml_parsed got;
    int rc = dsml_stream_finish(&s, &got, &err2);
    CHECK(rc == want_rc, "%s (step %zu): stream %d, whole parse %d", name, step, rc, want_rc);
    if (rc == 0 && want_rc == 0) {
        CHECK(col.reasoning.len == whole.reasoning_len &&
                  memcmp(col.reasoning.data ? col.reasoning.data : "", whole.reasoning_content, col.reasoning.len) == 0,
              "%s (step %zu): streamed reasoning differs", name, step);
        CHECK(col.content.len == whole.content_len &&
                  memcmp(col.content.data ? col.content.data : "", whole.content, col.content.len) == 0,
              "%s (step %zu): streamed content differs", name, step);
        CHECK(col.n_calls == whole.n_tool_calls, "%s (step %zu): %zu streamed tool calls, %zu parsed", name, step, col.n_calls,
              whole.n_tool_calls);
        for (size_t i = 0; i < col.n_calls && i < whole.n_tool_calls && i < 16; i++)
            CHECK(col.calls[i].name && strcmp(col.calls[i].name, whole.tool_calls[i].name) == 0 &&
                      strcmp(col.calls[i].arguments, whole.tool_calls[i].arguments) == 0,
                  "%s (step %zu): tool call %zu differs", name, step, i);
        CHECK(!col.out_of_order, "%s: events out of order", name);
        CHECK(!(utf8_valid(text, len) && col.split_utf8), "%s (step %zu): a piece ended inside a character", name, step);
        CHECK(strcmp(got.content, whole.content) == 0, "%s: finish result differs", name);
        dsml_parsed_free(&got);
    }
    if (want_rc == 0) dsml_parsed_free(&whole);
    dsml_stream_free(&s);
    collected_free(&col);
}

static void check_parse_case(const cJSON *row, int line) {
    const char *name = cJSON_GetObjectItem(row, "name")->valuestring;
    const char *text = cJSON_GetObjectItem(row, "text")->valuestring;
    unsigned flags = (cJSON_IsTrue(cJSON_GetObjectItem(row, "thinking")) ? DSML_PARSE_THINKING : 0) |
                     (cJSON_IsTrue(cJSON_GetObjectItem(row, "eos_optional")) ? DSML_PARSE_EOS_OPTIONAL : 0);
    dsml_parsed p;
    ds4f_error err = {{0}};
    int rc = dsml_parse_completion(text, strlen(text), flags, &p, &err);
    const cJSON *want = cJSON_GetObjectItem(row, "result");
    if (!want) {
        CHECK(rc != 0, "line %d (%s): the official parser raised %s, we accepted", line, name,
              cJSON_GetObjectItem(row, "error")->valuestring);
        if (rc == 0) dsml_parsed_free(&p);
    } else {
        CHECK(rc == 0, "line %d (%s): %s", line, name, err.msg);
        if (rc == 0) {
            CHECK_STR(p.reasoning_content, cJSON_GetObjectItem(want, "reasoning_content")->valuestring);
            CHECK_STR(p.content, cJSON_GetObjectItem(want, "content")->valuestring);
            const cJSON *calls = cJSON_GetObjectItem(want, "tool_calls");
            CHECK((int)p.n_tool_calls == cJSON_GetArraySize(calls), "line %d (%s): %zu tool calls", line, name, p.n_tool_calls);
            size_t i = 0;
            for (const cJSON *tc = calls->child; tc && i < p.n_tool_calls; tc = tc->next, i++) {
                CHECK_STR(p.tool_calls[i].name, cJSON_GetObjectItem(tc, "name")->valuestring);
                CHECK_STR(p.tool_calls[i].arguments, cJSON_GetObjectItem(tc, "arguments")->valuestring);
            }
            dsml_parsed_free(&p);
        }
    }
    check_stream(name, text, strlen(text), flags, 1);
    check_stream(name, text, strlen(text), flags, 0);
}

TEST(chat_official_parse_cases) { each_jsonl(DATA "official_parse_cases.jsonl", check_parse_case); }

/* ---- behaviours, spelled out ------------------------------------------------------------------ */

TEST(chat_multi_turn_chat_mode) {
    ds4f_error err;
    chat_options o = opts(false);
    char *got = render_json("[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                            "{\"role\":\"user\",\"content\":\"Hi\"},"
                            "{\"role\":\"assistant\",\"content\":\"Hello.\",\"reasoning_content\":\"ignored in chat mode\"},"
                            "{\"role\":\"user\",\"content\":\"2+2?\"}]",
                            NULL, &o, &err);
    CHECK_STR(got, DSV4_BOS "Be brief." DSV4_USER "Hi" DSV4_ASSISTANT DSV4_THINK_END "Hello." DSV4_EOS DSV4_USER
                            "2+2?" DSV4_ASSISTANT DSV4_THINK_END);
    free(got);
    /* Without BOS (a continuation appended to an existing context). */
    o.add_bos = false;
    got = render_json("[{\"role\":\"user\",\"content\":\"Hi\"}]", NULL, &o, &err);
    CHECK_STR(got, DSV4_USER "Hi" DSV4_ASSISTANT DSV4_THINK_END);
    free(got);
}

TEST(chat_thinking_mode) {
    ds4f_error err;
    chat_options o = opts(true);
    char *got = render_json("[{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"},"
                            "{\"role\":\"user\",\"content\":\"What is 2+2?\"}]",
                            NULL, &o, &err);
    CHECK_STR(got, DSV4_BOS "You are a helpful assistant." DSV4_USER "What is 2+2?" DSV4_ASSISTANT DSV4_THINK_START);
    free(got);
    /* A finished last turn keeps its reasoning; an open one (prefix completion) has no EOS. */
    got = render_json("[{\"role\":\"user\",\"content\":\"Q\"},"
                      "{\"role\":\"assistant\",\"reasoning_content\":\"R\",\"content\":\"A\",\"prefix\":true}]",
                      NULL, &o, &err);
    CHECK_STR(got, DSV4_BOS DSV4_USER "Q" DSV4_ASSISTANT DSV4_THINK_START "R" DSV4_THINK_END "A");
    free(got);
}

TEST(chat_drop_earlier_reasoning) {
    ds4f_error err;
    const char *conv = "[{\"role\":\"user\",\"content\":\"Hi\"},"
                       "{\"role\":\"assistant\",\"reasoning_content\":\"greeting\",\"content\":\"Hello\"},"
                       "{\"role\":\"user\",\"content\":\"Bye\"}]";
    chat_options o = opts(true);
    char *got = render_json(conv, NULL, &o, &err);
    CHECK_STR(got, DSV4_BOS DSV4_USER "Hi" DSV4_ASSISTANT DSV4_THINK_END "Hello" DSV4_EOS DSV4_USER "Bye" DSV4_ASSISTANT
                       DSV4_THINK_START);
    free(got);
    o.drop_thinking = false;
    got = render_json(conv, NULL, &o, &err);
    CHECK_STR(got, DSV4_BOS DSV4_USER "Hi" DSV4_ASSISTANT DSV4_THINK_START "greeting" DSV4_THINK_END "Hello" DSV4_EOS DSV4_USER
                       "Bye" DSV4_ASSISTANT DSV4_THINK_START);
    free(got);
    /* Tools anywhere keep all reasoning, whatever drop_thinking says. */
    o.drop_thinking = true;
    got = render_json(conv, "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", &o, &err);
    CHECK(got && strstr(got, DSV4_ASSISTANT DSV4_THINK_START "greeting" DSV4_THINK_END "Hello" DSV4_EOS), "%s",
          got ? got : err.msg);
    free(got);
}

static const char EFFORT_MAX[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, "
    "rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, "
    "and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

TEST(chat_reasoning_effort_max) {
    ds4f_error err;
    const char *conv = "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"U\"}]";
    chat_options o = opts(true);
    REQUIRE(chat_apply_reasoning_effort(&o, "max", &err) == 0, "%s", err.msg);
    char *got = render_json(conv, NULL, &o, &err);
    char want[2048];
    snprintf(want, sizeof want, "%s%s%s", DSV4_BOS, EFFORT_MAX, "S" DSV4_USER "U" DSV4_ASSISTANT DSV4_THINK_START);
    CHECK_STR(got, want);
    free(got);
    /* "high" renders as no effort at all; "max" does nothing in chat mode; "none" is chat mode. */
    char *plain = render_json(conv, NULL, &(chat_options){true, CHAT_EFFORT_DEFAULT, true, true}, &err);
    REQUIRE(chat_apply_reasoning_effort(&o, "high", &err) == 0, "%s", err.msg);
    got = render_json(conv, NULL, &o, &err);
    CHECK_STR(got, plain);
    free(got);
    free(plain);
    got = render_json(conv, NULL, &(chat_options){false, CHAT_EFFORT_MAX, true, true}, &err);
    CHECK_STR(got, DSV4_BOS "S" DSV4_USER "U" DSV4_ASSISTANT DSV4_THINK_END);
    free(got);
    REQUIRE(chat_apply_reasoning_effort(&o, "none", &err) == 0, "%s", err.msg);
    CHECK(!o.thinking, "none keeps thinking on");
    CHECK(chat_apply_reasoning_effort(&o, "extreme", &err) == -1 && strstr(err.msg, "extreme"), "accepted \"extreme\"");
}

TEST(chat_tools_section) {
    ds4f_error err;
    chat_options o = opts(true);
    char *got = render_json("[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"U\"}]",
                            "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"é\\n\\\"\","
                            "\"parameters\":{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"default\":-1}}}}}]",
                            &o, &err);
    REQUIRE(got, "%s", err.msg);
    CHECK(strncmp(got, DSV4_BOS "S\n\n## Tools\n\nYou have access to a set of tools", strlen(DSV4_BOS) + 41) == 0, "%s", got);
    CHECK(strstr(got, "### Available Tool Schemas\n\n{\"name\": \"f\", \"description\": \"é\\n\\\"\", \"parameters\": "
                      "{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\", \"default\": -1}}}}\n\n"
                      "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n" DSV4_USER
                      "U" DSV4_ASSISTANT DSV4_THINK_START),
          "%s", got);
    free(got);

    /* Without a system message the tools get an empty one of their own. */
    got = render_json("[{\"role\":\"user\",\"content\":\"U\"}]", "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", &o,
                      &err);
    CHECK(got && strncmp(got, DSV4_BOS "\n\n## Tools\n\n", strlen(DSV4_BOS) + 10) == 0, "%s", got ? got : err.msg);
    free(got);

    /* From JSON text the numbers are kept as Python prints them (cJSON would turn 1.0 into 1). */
    chat_conversation c;
    chat_init(&c);
    chat_message *m = chat_append(&c, CHAT_ROLE_SYSTEM, NULL, &err);
    REQUIRE(m && chat_add_tool_json(m, "{\"name\": \"g\", \"x\": [1.0, 1e5, -0, 1E-7, 10000000000000000.0]}", &err) == 0, "%s",
            err.msg);
    CHECK_STR(m->tools[0], "{\"name\": \"g\", \"x\": [1.0, 100000.0, 0, 1e-07, 1e+16]}");
    CHECK(chat_add_tool_json(m, "{\"name\": ", &err) == -1 && strstr(err.msg, "tool schema"), "bad schema accepted");
    chat_free(&c);
}

TEST(chat_tool_results_merged) {
    ds4f_error err;
    chat_options o = opts(true);
    char *got = render_json(
        "[{\"role\":\"user\",\"content\":\"U\"},"
        "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":["
        "{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\": 1}\"}},"
        "{\"id\":\"b\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"s\\\": \\\"t\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":\"B\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":[{\"type\":\"text\",\"text\":\"A1\"},{\"type\":\"image_url\"}]},"
        "{\"role\":\"user\",\"content\":\"more\"}]",
        "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", &o, &err);
    REQUIRE(got, "%s", err.msg);
    const char *tail = DSV4_USER "U" DSV4_ASSISTANT DSV4_THINK_START DSV4_THINK_END "\n\n<" DSV4_DSML "tool_calls>\n"
                       "<" DSV4_DSML "invoke name=\"f\">\n<" DSV4_DSML "parameter name=\"x\" string=\"false\">1</" DSV4_DSML
                       "parameter>\n</" DSV4_DSML "invoke>\n"
                       "<" DSV4_DSML "invoke name=\"g\">\n<" DSV4_DSML "parameter name=\"s\" string=\"true\">t</" DSV4_DSML
                       "parameter>\n</" DSV4_DSML "invoke>\n</" DSV4_DSML "tool_calls>" DSV4_EOS
                       DSV4_USER "<tool_result>A1\n\n[Unsupported image_url]</tool_result>\n\n<tool_result>B</tool_result>\n\nmore"
                       DSV4_ASSISTANT DSV4_THINK_START;
    CHECK(strlen(got) > strlen(tail) && strcmp(got + strlen(got) - strlen(tail), tail) == 0, "got %s\nwant tail %s", got, tail);
    free(got);

    /* Direct use of the data model: two user messages in a row become one turn. */
    chat_conversation c;
    chat_init(&c);
    chat_append(&c, CHAT_ROLE_USER, "one", &err);
    chat_append(&c, CHAT_ROLE_USER, "two", &err);
    size_t n;
    REQUIRE(chat_render(&c, &o, &got, &n, &err) == 0, "%s", err.msg);
    CHECK_STR(got, DSV4_BOS DSV4_USER "one\n\ntwo" DSV4_ASSISTANT DSV4_THINK_START);
    CHECK(n == strlen(got), "length");
    free(got);
    chat_free(&c);
}

TEST(chat_parse_tool_calls) {
    const char *text = "Let me look.</think>Checking." DSV4_TOOL_CALLS_START ">\n"
                       "<" DSV4_DSML "invoke name=\"search\">\n"
                       "<" DSV4_DSML "parameter name=\"q\" string=\"true\">say \"hi\"\nnow</" DSV4_DSML "parameter>\n"
                       "<" DSV4_DSML "parameter name=\"n\" string=\"false\">[1, 2.50]</" DSV4_DSML "parameter>\n"
                       "</" DSV4_DSML "invoke>\n"
                       "<" DSV4_DSML "invoke name=\"noargs\">\n\n</" DSV4_DSML "invoke>\n" DSV4_TOOL_CALLS_END DSV4_EOS;
    dsml_parsed p;
    ds4f_error err;
    REQUIRE(dsml_parse_completion(text, strlen(text), DSML_PARSE_THINKING, &p, &err) == 0, "%s", err.msg);
    CHECK_STR(p.reasoning_content, "Let me look.");
    CHECK_STR(p.content, "Checking.");
    REQUIRE(p.n_tool_calls == 2, "%zu calls", p.n_tool_calls);
    CHECK_STR(p.tool_calls[0].name, "search");
    /* string="true": JSON-escaped; string="false": copied as written. */
    CHECK_STR(p.tool_calls[0].arguments, "{\"q\": \"say \\\"hi\\\"\\nnow\", \"n\": [1, 2.50]}");
    CHECK_STR(p.tool_calls[1].name, "noargs");
    CHECK_STR(p.tool_calls[1].arguments, "{}");
    dsml_parsed_free(&p);

    /* Rendering a call and parsing it back gives the arguments in Python's spelling. */
    chat_conversation c;
    chat_init(&c);
    chat_options o = opts(false);
    o.add_bos = false;
    chat_message *m = chat_append(&c, CHAT_ROLE_ASSISTANT, "", &err);
    REQUIRE(m && chat_add_tool_call(m, "1", "f", "{\"a\":1.0,\"b\":{\"c\":[true,null]},\"s\":\"x\\ty\"}", &err) == 0, "%s",
            err.msg);
    char *r;
    REQUIRE(chat_render(&c, &o, &r, NULL, &err) == 0, "%s", err.msg);
    REQUIRE(dsml_parse_completion(r, strlen(r), 0, &p, &err) == 0, "%s in %s", err.msg, r);
    REQUIRE(p.n_tool_calls == 1, "calls");
    CHECK_STR(p.tool_calls[0].arguments, "{\"a\": 1.0, \"b\": {\"c\": [true, null]}, \"s\": \"x\\ty\"}");
    dsml_parsed_free(&p);
    free(r);
    chat_free(&c);
}

TEST(chat_parse_malformed) {
    struct {
        const char *text;
        unsigned flags;
        const char *error_has;
    } cases[] = {
        {"no end of thinking" DSV4_EOS, DSML_PARSE_THINKING, "</think>"},
        {"no eos", 0, "EOS"},
        {"a" DSV4_EOS "b", 0, "after the EOS"},
        {"a" DSV4_EOS "b", DSML_PARSE_EOS_OPTIONAL, "after the EOS"},
        {"x <think> y" DSV4_EOS, 0, "<think>"},
        {DSV4_TOOL_CALLS_START ">\n<" DSV4_DSML "invoke name=\"f\">\n<" DSV4_DSML "parameter name=\"k\" string=\"yes\">1</" DSV4_DSML
         "parameter>\n</" DSV4_DSML "invoke>\n" DSV4_TOOL_CALLS_END DSV4_EOS,
         0, "malformed parameter"},
        {DSV4_TOOL_CALLS_START ">\n<" DSV4_DSML "invoke name=\"f\">\n</" DSV4_DSML "invoke>\n" DSV4_TOOL_CALLS_END "junk" DSV4_EOS,
         0, "after its tool calls"},
        {DSV4_TOOL_CALLS_START ">\n<" DSV4_DSML "invoke name=\"f\">\n<" DSV4_DSML "parameter name=\"k\" string=\"true\">1</" DSV4_DSML
         "parameter>\n<" DSV4_DSML "parameter name=\"k\" string=\"true\">2</" DSV4_DSML "parameter>\n</" DSV4_DSML
         "invoke>\n" DSV4_TOOL_CALLS_END DSV4_EOS,
         0, "given twice"},
        {DSV4_TOOL_CALLS_START "><" DSV4_DSML "invoke name=\"f\">\n", 0, "expected \">\\n\""},
        /* Cut off inside the block: the official parser takes what is there, unless the end of the
         * text is to stand for the EOS. */
        {"c" DSV4_TOOL_CALLS_START ">\n<" DSV4_DSML "invoke name=\"f\">\n", DSML_PARSE_EOS_OPTIONAL, "DSML"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        dsml_parsed p;
        ds4f_error err = {{0}};
        int rc = dsml_parse_completion(cases[i].text, strlen(cases[i].text), cases[i].flags, &p, &err);
        CHECK(rc == -1, "case %zu accepted", i);
        if (rc == 0) dsml_parsed_free(&p);
        else CHECK(strstr(err.msg, cases[i].error_has), "case %zu: \"%s\" does not mention %s", i, err.msg, cases[i].error_has);
    }
    dsml_parsed p;
    ds4f_error err;
    const char *cut = "c" DSV4_TOOL_CALLS_START ">\n<" DSV4_DSML "invoke name=\"f\">\n";
    REQUIRE(dsml_parse_completion(cut, strlen(cut), 0, &p, &err) == 0, "%s", err.msg);
    CHECK(p.n_tool_calls == 1 && strcmp(p.tool_calls[0].arguments, "{}") == 0, "truncated block");
    dsml_parsed_free(&p);
    REQUIRE(dsml_parse_completion("r</think>c", 10, DSML_PARSE_THINKING | DSML_PARSE_EOS_OPTIONAL, &p, &err) == 0, "%s", err.msg);
    CHECK_STR(p.content, "c");
    dsml_parsed_free(&p);
}

TEST(chat_stream_byte_by_byte) {
    const char *texts[] = {
        "Simple 思考 😀.</think>2 + 2 = 4." DSV4_EOS,
        "r </thin k</think>x\n\ny\n\n<not dsml" DSV4_EOS,
        "</think>" DSV4_TOOL_CALLS_START ">\n<" DSV4_DSML "invoke name=\"f\">\n<" DSV4_DSML
        "parameter name=\"v\" string=\"true\">" DSV4_TOOL_CALLS_END "</" DSV4_DSML "parameter>\n</" DSV4_DSML "invoke>\n" DSV4_TOOL_CALLS_END
        DSV4_EOS,
        "reasoning never ends",
        "a</think>b" DSV4_TOOL_CALLS_START ">\n<" DSV4_DSML "invoke name=\"f\">\n</" DSV4_DSML "invoke>\n" DSV4_TOOL_CALLS_END "x",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        for (unsigned flags = 0; flags < 4; flags++)
            for (size_t step = 0; step < 4; step++) {
                char name[32];
                snprintf(name, sizeof name, "text %zu flags %u", i, flags);
                check_stream(name, texts[i], strlen(texts[i]), flags, step);
            }

    /* Generated text may hold NUL bytes (a token can decode to one). */
    static const char with_nul[] = "a\0b</think>c\0d" DSV4_EOS;
    check_stream("with NUL", with_nul, sizeof with_nul - 1, DSML_PARSE_THINKING, 1);
    dsml_parsed np;
    ds4f_error nerr;
    REQUIRE(dsml_parse_completion(with_nul, sizeof with_nul - 1, DSML_PARSE_THINKING, &np, &nerr) == 0, "%s", nerr.msg);
    CHECK(np.reasoning_len == 3 && np.content_len == 3 && memcmp(np.content, "c\0d", 3) == 0, "NUL bytes lost");
    dsml_parsed_free(&np);

    /* Held back: a possible </think> start and a partial character; then released. */
    collected col = {0};
    dsml_stream s;
    ds4f_error err;
    dsml_stream_init(&s, DSML_PARSE_THINKING, collect, &col);
    dsml_stream_feed(&s, "ab</thi", 7, &err);
    CHECK(col.reasoning.len == 2, "reported %zu bytes before a possible </think>", col.reasoning.len);
    dsml_stream_feed(&s, "s\xe4\xb8", 3, &err);
    CHECK(col.reasoning.len == 8, "reported %zu bytes", col.reasoning.len);
    dsml_stream_feed(&s, "\x96</think>\n", 10, &err);
    CHECK(col.reasoning.len == 11 && col.content.len == 0, "reasoning %zu, content %zu", col.reasoning.len, col.content.len);
    dsml_stream_feed(&s, "\nz", 2, &err);
    CHECK(col.content.len == 3, "content %zu", col.content.len);
    dsml_stream_feed(&s, DSV4_TOOL_CALLS_START ">\n<" DSV4_DSML "invoke", strlen(DSV4_TOOL_CALLS_START) + 2 + 17, &err);
    CHECK(col.content.len == 3, "DSML leaked as content");
    dsml_parsed p;
    CHECK(dsml_stream_finish(&s, &p, &err) == -1, "truncated block accepted");
    size_t n;
    const char *rest = dsml_stream_unreported(&s, &n);
    CHECK(n == strlen(DSV4_TOOL_CALLS_START) + 2 + 17 && strncmp(rest, DSV4_TOOL_CALLS_START, strlen(DSV4_TOOL_CALLS_START)) == 0,
          "unreported %zu bytes", n);
    dsml_stream_free(&s);
    collected_free(&col);
}

TEST(chat_python_json) {
    struct {
        const char *in, *out;
    } ok[] = {
        {"{\"a\":1,\"b\":[true,false,null],\"c\":{}}", "{\"a\": 1, \"b\": [true, false, null], \"c\": {}}"},
        {" [ ] ", "[]"},
        {"\"\\u00e9\\ud83d\\ude00\\/\\u0001\\u007f\"", "\"é😀/\\u0001\x7f\""},
        {"[1.0, 1.5e300, 1e400, -1e400, 5e-324, 0.1, 1e16, 1e15, 0.0001, 0.00001, -0.0, 1E2, 12345678901234567890]",
         "[1.0, 1.5e+300, Infinity, -Infinity, 5e-324, 0.1, 1e+16, 1000000000000000.0, 0.0001, 1e-05, -0.0, 100.0, "
         "12345678901234567890]"},
        {"[NaN, Infinity, -Infinity, -0]", "[NaN, Infinity, -Infinity, 0]"},
        {"{\"k\": 1, \"j\": 2, \"k\": 3}", "{\"k\": 3, \"j\": 2}"},
        {"\"tab\\tnl\\nq\\\"bs\\\\\"", "\"tab\\tnl\\nq\\\"bs\\\\\""},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        dsml_buf b = {0};
        ds4f_error err;
        CHECK(pyjson_canonical(ok[i].in, strlen(ok[i].in), &b, &err) == 0, "%s: %s", ok[i].in, err.msg);
        CHECK(b.data && strcmp(b.data, ok[i].out) == 0, "%s -> %s, want %s", ok[i].in, b.data ? b.data : "", ok[i].out);
        dsml_buf_free(&b);
    }
    const char *bad[] = {"", "01", "1.", "[1,]", "{\"a\" 1}", "{'a': 1}", "\"\x01\"", "\"\\x\"", "tru", "1 2", "\"\\ud800\"",
                         "\"\xff\"", "[", "{\"a\":1,}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        dsml_buf b = {0};
        ds4f_error err;
        CHECK(pyjson_canonical(bad[i], strlen(bad[i]), &b, &err) == -1, "accepted %s", bad[i]);
        dsml_buf_free(&b);
    }
    /* Through cJSON, integers print as integers and other numbers as Python floats. */
    cJSON *j = cJSON_Parse("{\"i\": -3, \"f\": 0.25, \"big\": 1e300, \"s\": \"\\u2028\"}");
    dsml_buf b = {0};
    ds4f_error err;
    CHECK(pyjson_dump_cjson(j, &b, &err) == 0, "%s", err.msg);
    CHECK_STR(b.data, "{\"i\": -3, \"f\": 0.25, \"big\": 1e+300, \"s\": \"\xe2\x80\xa8\"}");
    dsml_buf_free(&b);
    cJSON_Delete(j);
}

TEST(chat_dsml_arguments) {
    struct {
        const char *args, *out;
    } cases[] = {
        {"{\"city\": \"Oslo\", \"days\": 3}", "<" DSV4_DSML "parameter name=\"city\" string=\"true\">Oslo</" DSV4_DSML "parameter>\n<" DSV4_DSML
                                          "parameter name=\"days\" string=\"false\">3</" DSV4_DSML "parameter>"},
        {"{}", ""},
        {"not json", "<" DSV4_DSML "parameter name=\"arguments\" string=\"true\">not json</" DSV4_DSML "parameter>"},
        {"{\"o\":{\"a\":[1,\"é\"]},\"s\":\"a\\nb\"}", "<" DSV4_DSML "parameter name=\"o\" string=\"false\">{\"a\": [1, \"é\"]}</" DSV4_DSML
                                                   "parameter>\n<" DSV4_DSML "parameter name=\"s\" string=\"true\">a\nb</" DSV4_DSML "parameter>"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        dsml_buf b = {0};
        ds4f_error err;
        CHECK(dsml_encode_arguments(cases[i].args, &b, &err) == 0, "%s: %s", cases[i].args, err.msg);
        CHECK_STR(b.data ? b.data : "", cases[i].out);
        dsml_buf_free(&b);
    }
    dsml_buf b = {0};
    ds4f_error err;
    CHECK(dsml_encode_arguments("[1]", &b, &err) == -1 && strstr(err.msg, "not an object"), "array arguments accepted");
    CHECK(dsml_encode_arguments("{\"a\": \"\\udc00\"}", &b, &err) == -1, "lone surrogate accepted");
    dsml_buf_free(&b);
}

TEST(chat_openai_builder) {
    struct {
        const char *messages, *error_has;
    } bad[] = {
        {"{}", "array"},
        {"[{\"content\":\"x\"}]", "messages[0] has no role"},
        {"[{\"role\":\"wizard\"}]", "unknown role \"wizard\""},
        {"[{\"role\":\"user\",\"content\":42}]", "messages[0].content"},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]", "image_url"},
        {"[{\"role\":\"user\",\"content\":\"\xc3\"}]", "UTF-8"},
        {"[{\"role\":\"user\",\"content\":\"x\",\"task\":\"dance\"}]", "task \"dance\""},
        {"[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}]", "function.name"},
        {"[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":3}}]}]", "arguments"},
        {"[{\"role\":\"system\",\"tools\":[{\"type\":\"function\"}]}]", "no \"function\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cJSON *j = cJSON_Parse(bad[i].messages);
        REQUIRE(j, "case %zu does not parse", i);
        chat_conversation c;
        chat_init(&c);
        ds4f_error err = {{0}};
        CHECK(chat_from_openai(&c, j, NULL, 0, &err) == -1, "case %zu accepted", i);
        CHECK(strstr(err.msg, bad[i].error_has), "case %zu: \"%s\" does not mention %s", i, err.msg, bad[i].error_has);
        chat_free(&c);
        cJSON_Delete(j);
    }

    /* Accepted forms: text parts, null content, arguments given as an object, the last of
     * repeated keys, OpenAI's developer role as system on request. */
    ds4f_error err;
    cJSON *j = cJSON_Parse("[{\"role\":\"developer\",\"content\":\"D\"},"
                           "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
                           "{\"role\":\"assistant\",\"content\":null,\"content\":null,\"tool_calls\":[{\"id\":\"1\",\"function\":"
                           "{\"name\":\"f\",\"arguments\":{\"x\":[1,2]}}}]},"
                           "{\"role\":\"tool\",\"tool_call_id\":\"1\",\"content\":\"r\"}]");
    chat_conversation c;
    chat_init(&c);
    REQUIRE(chat_from_openai(&c, j, NULL, CHAT_OPENAI_DEVELOPER_AS_SYSTEM, &err) == 0, "%s", err.msg);
    CHECK(c.n_messages == 4 && c.messages[0].role == CHAT_ROLE_SYSTEM, "developer not mapped to system");
    CHECK_STR(c.messages[1].content, "a\n\nb");
    CHECK(c.messages[2].content == NULL, "null content");
    CHECK_STR(c.messages[2].tool_calls[0].arguments, "{\"x\": [1, 2]}");
    CHECK_STR(c.messages[3].tool_call_id, "1");
    char *got;
    chat_options o = opts(false);
    REQUIRE(chat_render(&c, &o, &got, NULL, &err) == 0, "%s", err.msg);
    CHECK(strncmp(got, DSV4_BOS "D" DSV4_USER "a\n\nb" DSV4_ASSISTANT DSV4_THINK_END "\n\n<" DSV4_DSML "tool_calls>", 60) == 0, "%s",
          got);
    free(got);
    chat_free(&c);
    cJSON_Delete(j);
}
