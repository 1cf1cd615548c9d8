/* ds4f serve: request parsing and validation (see server_request.h). */
#include "app/server_request.h"

#include <cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/dsml.h"

/* ---- errors ----------------------------------------------------------------------------------- */

static int error_vset(server_error *e, int status, const char *type, const char *code, const char *param,
                      const char *fmt, va_list ap) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    return -1;
}

int server_error_set(server_error *e, int status, const char *type, const char *code, const char *param,
                     const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vset(e, status, type, code, param, fmt, ap);
    va_end(ap);
    return -1;
}

int server_error_invalid(server_error *e, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vset(e, 400, "invalid_request_error", "invalid_value", param, fmt, ap);
    va_end(ap);
    return -1;
}

static int unsupported(server_error *e, const char *param, const char *what) {
    return server_error_set(e, 400, "invalid_request_error", "unsupported_parameter", param,
                            "%s is not supported by ds4f serve", what);
}

/* ---- request lifetime -------------------------------------------------------------------------- */

void server_request_init(server_request *r) {
    memset(r, 0, sizeof *r);
    chat_init(&r->conv);
    chat_options_default(&r->chat);
    r->sampling.temperature = 1.0f;
    r->sampling.top_p = 1.0f;
}

void server_request_free(server_request *r) {
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    chat_free(&r->conv);
    free(r->prompt);
    free(r->prompt_ids);
    memset(r, 0, sizeof *r);
}

/* ---- typed fields -------------------------------------------------------------------------------- */

/* The last member of that name (a JSON object parsed by Python or JavaScript keeps the last of
 * repeated keys, and so do the chat helpers). */
static const cJSON *field(const cJSON *obj, const char *name) {
    const cJSON *found = NULL;
    for (const cJSON *k = obj->child; k; k = k->next)
        if (k->string && strcmp(k->string, name) == 0) found = k;
    return found;
}

static bool absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

static int get_bool(const cJSON *obj, const char *name, bool *out, server_error *e) {
    const cJSON *v = field(obj, name);
    if (absent(v)) return 0;
    if (!cJSON_IsBool(v)) return server_error_invalid(e, name, "%s must be true or false", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* A number in [lo, hi]; *given tells whether it was there. */
static int get_number(const cJSON *obj, const char *name, double lo, double hi, double *out, bool *given,
                      server_error *e) {
    const cJSON *v = field(obj, name);
    *given = false;
    if (absent(v)) return 0;
    if (!cJSON_IsNumber(v)) return server_error_invalid(e, name, "%s must be a number", name);
    const double x = v->valuedouble;
    if (!(x >= lo && x <= hi)) return server_error_invalid(e, name, "%s must be between %g and %g, got %g", name, lo, hi, x);
    *out = x;
    *given = true;
    return 0;
}

/* An integer in [lo, hi] (JSON numbers like 8.0 count as integers, as in Python's clients). */
static int get_int(const cJSON *obj, const char *name, double lo, double hi, double *out, bool *given,
                   server_error *e) {
    const cJSON *v = field(obj, name);
    *given = false;
    if (absent(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return server_error_invalid(e, name, "%s must be an integer", name);
    const double x = v->valuedouble;
    if (!(x >= lo && x <= hi)) return server_error_invalid(e, name, "%s must be between %.0f and %.0f, got %.0f", name, lo, hi, x);
    *out = x;
    *given = true;
    return 0;
}

static int get_string(const cJSON *obj, const char *name, const char **out, server_error *e) {
    const cJSON *v = field(obj, name);
    *out = NULL;
    if (absent(v)) return 0;
    if (!cJSON_IsString(v)) return server_error_invalid(e, name, "%s must be a string", name);
    if (!utf8_valid(v->valuestring, strlen(v->valuestring)))
        return server_error_invalid(e, name, "%s is not valid UTF-8", name);
    *out = v->valuestring;
    return 0;
}

static int copy_text(const char *s, size_t n, char **out, server_error *e) {
    char *p = malloc(n + 1);
    if (!p) return server_error_set(e, 500, "server_error", "out_of_memory", NULL, "out of memory");
    memcpy(p, s, n);
    p[n] = 0;
    *out = p;
    return 0;
}

/* ---- fields shared by both endpoints ---------------------------------------------------------- */

static int parse_stop(const cJSON *body, server_request *r, server_error *e) {
    const cJSON *v = field(body, "stop");
    if (absent(v)) return 0;
    if (cJSON_IsString(v)) {
        if (!*v->valuestring) return server_error_invalid(e, "stop", "stop must not be an empty string");
        if (!utf8_valid(v->valuestring, strlen(v->valuestring)))
            return server_error_invalid(e, "stop", "stop is not valid UTF-8");
        if (copy_text(v->valuestring, strlen(v->valuestring), &r->stops[0], e)) return -1;
        r->n_stops = 1;
        return 0;
    }
    if (!cJSON_IsArray(v)) return server_error_invalid(e, "stop", "stop must be a string or an array of strings");
    int i = 0;
    for (const cJSON *s = v->child; s; s = s->next, i++) {
        if (i == SERVER_MAX_STOPS)
            return server_error_invalid(e, "stop", "stop may hold at most %d strings", SERVER_MAX_STOPS);
        if (!cJSON_IsString(s)) return server_error_invalid(e, "stop", "stop[%d] must be a string", i);
        if (!*s->valuestring) return server_error_invalid(e, "stop", "stop[%d] must not be empty", i);
        if (!utf8_valid(s->valuestring, strlen(s->valuestring)))
            return server_error_invalid(e, "stop", "stop[%d] is not valid UTF-8", i);
        if (copy_text(s->valuestring, strlen(s->valuestring), &r->stops[r->n_stops], e)) return -1;
        r->n_stops++;
    }
    return 0;
}

static int parse_sampling(const cJSON *body, const server_request_defaults *d, server_request *r, server_error *e) {
    double x;
    bool given;
    if (get_number(body, "temperature", 0, 2, &x, &given, e)) return -1;
    if (given) r->sampling.temperature = (float)x;
    if (get_number(body, "top_p", 0, 1, &x, &given, e)) return -1;
    if (given) {
        /* Nucleus sampling with p = 0 keeps only the most probable token: greedy. */
        if (x == 0) r->sampling.temperature = 0;
        else r->sampling.top_p = (float)x;
    }
    if (get_int(body, "top_k", 0, 1 << 30, &x, &given, e)) return -1;
    if (given) r->sampling.top_k = (int)x;
    if (get_number(body, "min_p", 0, 1, &x, &given, e)) return -1;
    if (given) r->sampling.min_p = (float)x;
    /* Any 64-bit integer, negative ones included (OpenAI's type is a signed integer). */
    if (get_int(body, "seed", -9223372036854775808.0, 18446744073709551615.0, &x, &given, e)) return -1;
    if (given) {
        r->sampling.seed = x < 0 ? (uint64_t)(int64_t)x : x >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)x;
        r->seed_given = true;
    }

    /* max_completion_tokens is OpenAI's newer name; when both are there it wins. */
    r->max_tokens = d ? d->max_tokens : 0;
    if (get_int(body, "max_tokens", 1, 1 << 30, &x, &given, e)) return -1;
    if (given) r->max_tokens = (int)x;
    if (r->api != SERVER_API_COMPLETIONS) {
        if (get_int(body, "max_completion_tokens", 1, 1 << 30, &x, &given, e)) return -1;
        if (given) r->max_tokens = (int)x;
    }

    if (get_int(body, "n", 1, 1 << 20, &x, &given, e)) return -1;
    if (given && x != 1) return unsupported(e, "n", "n other than 1 (one choice per request)");
    const char *penalties[] = {"presence_penalty", "frequency_penalty", "repetition_penalty"};
    for (size_t i = 0; i < sizeof penalties / sizeof *penalties; i++) {
        if (get_number(body, penalties[i], i == 2 ? 0 : -2, i == 2 ? 10 : 2, &x, &given, e)) return -1;
        if (given && x != (i == 2 ? 1 : 0)) {
            char what[64];
            snprintf(what, sizeof what, "a %s other than %d", penalties[i], i == 2 ? 1 : 0);
            return unsupported(e, penalties[i], what);
        }
    }
    const cJSON *bias = field(body, "logit_bias");
    if (!absent(bias)) {
        if (!cJSON_IsObject(bias)) return server_error_invalid(e, "logit_bias", "logit_bias must be an object");
        if (bias->child) return unsupported(e, "logit_bias", "logit_bias");
    }

    if (get_bool(body, "stream", &r->stream, e) || get_bool(body, "ignore_eos", &r->ignore_eos, e)) return -1;
    const cJSON *so = field(body, "stream_options");
    if (!absent(so)) {
        if (!cJSON_IsObject(so)) return server_error_invalid(e, "stream_options", "stream_options must be an object");
        if (get_bool(so, "include_usage", &r->include_usage, e)) {
            snprintf(e->param, sizeof e->param, "stream_options.include_usage");
            return -1;
        }
    }
    const char *s;
    if (get_string(body, "model", &s, e) || get_string(body, "user", &s, e)) return -1;
    return parse_stop(body, r, e);
}

/* ---- chat --------------------------------------------------------------------------------------- */

static int parse_thinking(const cJSON *body, server_request *r, server_error *e) {
    const char *effort;
    if (get_string(body, "reasoning_effort", &effort, e)) return -1;
    if (effort) {
        ds4f_error err;
        if (chat_apply_reasoning_effort(&r->chat, effort, &err))
            return server_error_invalid(e, "reasoning_effort", "%s", err.msg);
    }
    /* DeepSeek's switch: {"type": "enabled" | "disabled"}. */
    const cJSON *t = field(body, "thinking");
    if (!absent(t)) {
        const cJSON *type = cJSON_IsObject(t) ? field(t, "type") : NULL;
        if (cJSON_IsBool(t)) r->chat.thinking = cJSON_IsTrue(t);
        else if (cJSON_IsString(type) && strcmp(type->valuestring, "enabled") == 0) r->chat.thinking = true;
        else if (cJSON_IsString(type) && strcmp(type->valuestring, "disabled") == 0) r->chat.thinking = false;
        else return server_error_invalid(e, "thinking", "thinking must be {\"type\": \"enabled\"} or {\"type\": \"disabled\"}");
    }
    const cJSON *kw = field(body, "chat_template_kwargs");
    if (!absent(kw)) {
        if (!cJSON_IsObject(kw))
            return server_error_invalid(e, "chat_template_kwargs", "chat_template_kwargs must be an object");
        bool on = r->chat.thinking;
        if (get_bool(kw, "thinking", &on, e) || get_bool(kw, "enable_thinking", &on, e)) {
            snprintf(e->param, sizeof e->param, "chat_template_kwargs");
            return -1;
        }
        r->chat.thinking = on;
    }
    if (!r->chat.thinking) r->chat.effort = CHAT_EFFORT_DEFAULT;
    return 0;
}

/* tool_choice: "auto" (the default) and "none" are what the DSV4 format can express: the model
 * decides, or it is not shown the tools. Forcing a call is not something it was trained on. */
static int parse_tool_choice(const cJSON *body, bool *tools_hidden, server_error *e) {
    const cJSON *v = field(body, "tool_choice");
    *tools_hidden = false;
    if (absent(v)) return 0;
    if (cJSON_IsString(v) && strcmp(v->valuestring, "auto") == 0) return 0;
    if (cJSON_IsString(v) && strcmp(v->valuestring, "none") == 0) {
        *tools_hidden = true;
        return 0;
    }
    if (cJSON_IsString(v) && strcmp(v->valuestring, "required") == 0)
        return unsupported(e, "tool_choice", "tool_choice \"required\" (the model decides whether to call a tool)");
    if (cJSON_IsObject(v)) return unsupported(e, "tool_choice", "forcing a named tool with tool_choice");
    return server_error_invalid(e, "tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or an object");
}

static int parse_chat(const cJSON *body, const server_request_defaults *d, server_request *r, server_error *e) {
    r->chat.thinking = d ? d->thinking : false;
    if (parse_thinking(body, r, e)) return -1;

    const cJSON *rf = field(body, "response_format");
    if (!absent(rf)) {
        const cJSON *type = cJSON_IsObject(rf) ? field(rf, "type") : NULL;
        if (!cJSON_IsString(type))
            return server_error_invalid(e, "response_format", "response_format must be an object with a \"type\"");
        if (strcmp(type->valuestring, "text") != 0)
            return unsupported(e, "response_format",
                               "response_format other than text (there is no constrained decoding; describe the format in "
                               "the prompt)");
    }
    const cJSON *logprobs = field(body, "logprobs");
    if (!absent(logprobs) && !cJSON_IsFalse(logprobs)) {
        if (!cJSON_IsBool(logprobs)) return server_error_invalid(e, "logprobs", "logprobs must be true or false");
        return unsupported(e, "logprobs", "logprobs");
    }
    double x;
    bool given;
    if (get_int(body, "top_logprobs", 0, 20, &x, &given, e)) return -1;
    if (given && x > 0) return unsupported(e, "top_logprobs", "top_logprobs");
    bool parallel = true;
    if (get_bool(body, "parallel_tool_calls", &parallel, e)) return -1;

    bool tools_hidden;
    if (parse_tool_choice(body, &tools_hidden, e)) return -1;
    const cJSON *tools = field(body, "tools");
    if (!absent(tools) && !cJSON_IsArray(tools)) return server_error_invalid(e, "tools", "tools must be an array");
    if (absent(tools) || tools_hidden) tools = NULL;

    const cJSON *messages = field(body, "messages");
    if (absent(messages)) return server_error_set(e, 400, "invalid_request_error", "missing_required_parameter", "messages",
                                                  "messages is required");
    if (!cJSON_IsArray(messages)) return server_error_invalid(e, "messages", "messages must be an array");
    if (!messages->child) return server_error_invalid(e, "messages", "messages must not be empty");
    ds4f_error err;
    /* The OpenAI "developer" role means system instructions (DSV4's own developer role, a search
     * agent's turn, is not what an OpenAI client means by it). */
    if (chat_from_openai(&r->conv, messages, tools, CHAT_OPENAI_DEVELOPER_AS_SYSTEM, &err))
        return server_error_invalid(e, "messages", "%s", err.msg);

    /* The model answers after a user turn (tool results are one) or continues an assistant turn
     * left open with "prefix": true; anything else has no place for the answer. */
    const chat_message *last = &r->conv.messages[r->conv.n_messages - 1];
    const bool answerable = last->role == CHAT_ROLE_USER || last->role == CHAT_ROLE_TOOL ||
                            last->role == CHAT_ROLE_DEVELOPER || (last->role == CHAT_ROLE_ASSISTANT && last->wo_eos);
    if (!answerable)
        return server_error_invalid(e, "messages",
                                    "the last message has role \"%s\": it must be a user or tool message (or an assistant "
                                    "message with \"prefix\": true, to be continued)",
                                    chat_role_name(last->role));
    for (size_t i = 0; i + 1 < r->conv.n_messages; i++)
        if (r->conv.messages[i].wo_eos && r->conv.messages[i].role == CHAT_ROLE_ASSISTANT)
            return server_error_invalid(e, "messages", "messages[%zu]: only the last message may have \"prefix\": true", i);
    return 0;
}

/* ---- completions --------------------------------------------------------------------------------- */

static int parse_prompt_ids(const cJSON *arr, server_request *r, server_error *e) {
    const int n = cJSON_GetArraySize(arr);
    if (n == 0) return server_error_invalid(e, "prompt", "prompt must not be an empty array");
    r->prompt_ids = malloc((size_t)n * sizeof *r->prompt_ids);
    if (!r->prompt_ids) return server_error_set(e, 500, "server_error", "out_of_memory", NULL, "out of memory");
    int i = 0;
    for (const cJSON *t = arr->child; t; t = t->next, i++) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
            t->valuedouble > INT32_MAX)
            return server_error_invalid(e, "prompt", "prompt[%d] must be a token id (a non-negative integer)", i);
        r->prompt_ids[i] = (int32_t)t->valuedouble;
    }
    r->n_prompt_ids = n;
    return 0;
}

static int parse_completions(const cJSON *body, server_request *r, server_error *e) {
    const cJSON *p = field(body, "prompt");
    if (absent(p))
        return server_error_set(e, 400, "invalid_request_error", "missing_required_parameter", "prompt", "prompt is required");
    /* One prompt: a string, or token ids, or either one wrapped in a one-element array. */
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        p = p->child;
    if (cJSON_IsString(p)) {
        if (!utf8_valid(p->valuestring, strlen(p->valuestring)))
            return server_error_invalid(e, "prompt", "prompt is not valid UTF-8");
        if (copy_text(p->valuestring, strlen(p->valuestring), &r->prompt, e)) return -1;
        r->prompt_len = strlen(p->valuestring);
    } else if (cJSON_IsArray(p) && (!p->child || cJSON_IsNumber(p->child))) {
        if (parse_prompt_ids(p, r, e)) return -1;
    } else if (cJSON_IsArray(p)) {
        return unsupported(e, "prompt", "more than one prompt per request");
    } else {
        return server_error_invalid(e, "prompt", "prompt must be a string or an array of token ids");
    }

    bool echo = false;
    if (get_bool(body, "echo", &echo, e)) return -1;
    if (echo) return unsupported(e, "echo", "echo");
    const char *suffix;
    if (get_string(body, "suffix", &suffix, e)) return -1;
    if (suffix && *suffix) return unsupported(e, "suffix", "suffix (insertion)");
    double x;
    bool given;
    if (get_int(body, "best_of", 1, 1 << 20, &x, &given, e)) return -1;
    if (given && x != 1) return unsupported(e, "best_of", "best_of other than 1");
    if (get_int(body, "logprobs", 0, 20, &x, &given, e)) return -1;
    if (given && x > 0) return unsupported(e, "logprobs", "logprobs");
    return 0;
}

/* ---- entry points -------------------------------------------------------------------------------- */

int server_request_parse(server_api api, const char *body, size_t len, const server_request_defaults *d,
                         server_request *r, server_error *e) {
    server_request_init(r);
    r->api = api;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        size_t at = end && end >= body ? (size_t)(end - body) : 0;
        return server_error_set(e, 400, "invalid_request_error", "invalid_json", NULL,
                                "the request body is not valid JSON (error near byte %zu)", at);
    }
    /* Only white space may follow the value (cJSON stops at its end and would ignore the rest). */
    for (const char *t = end; t && t < body + len; t++)
        if (*t != ' ' && *t != '\t' && *t != '\n' && *t != '\r') {
            cJSON_Delete(root);
            return server_error_set(e, 400, "invalid_request_error", "invalid_json", NULL,
                                    "the request body has text after its JSON value (at byte %zu)", (size_t)(t - body));
        }
    int rc = -1;
    if (!cJSON_IsObject(root)) {
        server_error_set(e, 400, "invalid_request_error", "invalid_json", NULL, "the request body must be a JSON object");
        goto out;
    }
    if (parse_sampling(root, d, r, e)) goto out;
    if (api == SERVER_API_COMPLETIONS ? parse_completions(root, r, e) : parse_chat(root, d, r, e)) goto out;
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

/* In thinking mode, earlier assistant turns can keep their reasoning only if all of them have it:
 * a turn rendered with an empty reasoning block would teach the model to skip its reasoning. */
static bool earlier_reasoning_complete(const chat_conversation *c) {
    size_t last_user = 0;
    bool any_user = false;
    for (size_t i = 0; i < c->n_messages; i++) {
        chat_role role = c->messages[i].role;
        if (role == CHAT_ROLE_USER || role == CHAT_ROLE_TOOL || role == CHAT_ROLE_DEVELOPER) {
            last_user = i;
            any_user = true;
        }
    }
    if (!any_user) return true;
    for (size_t i = 0; i < last_user; i++)
        if (c->messages[i].role == CHAT_ROLE_ASSISTANT && !c->messages[i].reasoning_content) return false;
    return true;
}

int server_request_prompt(const server_request *r, bool keep_reasoning, char **text, size_t *len,
                          bool *opens_reasoning, server_error *e) {
    *text = NULL;
    *len = 0;
    *opens_reasoning = false;
    if (r->api == SERVER_API_COMPLETIONS) {
        if (!r->prompt) return server_error_set(e, 500, "server_error", "internal", NULL, "the prompt was given as token ids");
        const size_t bos_len = strlen(DSV4_BOS);
        const bool has_bos = r->prompt_len >= bos_len && memcmp(r->prompt, DSV4_BOS, bos_len) == 0;
        const size_t n = r->prompt_len + (has_bos ? 0 : bos_len);
        char *p = malloc(n + 1);
        if (!p) return server_error_set(e, 500, "server_error", "out_of_memory", NULL, "out of memory");
        if (!has_bos) memcpy(p, DSV4_BOS, bos_len);
        memcpy(p + (has_bos ? 0 : bos_len), r->prompt, r->prompt_len);
        p[n] = 0;
        *text = p;
        *len = n;
        return 0;
    }
    chat_options o = r->chat;
    o.drop_thinking = !(keep_reasoning && earlier_reasoning_complete(&r->conv));
    ds4f_error err;
    if (chat_render(&r->conv, &o, text, len, &err)) return server_error_invalid(e, "messages", "%s", err.msg);
    const size_t tl = strlen(DSV4_THINK_START);
    *opens_reasoning = *len >= tl && memcmp(*text + *len - tl, DSV4_THINK_START, tl) == 0;
    return 0;
}
