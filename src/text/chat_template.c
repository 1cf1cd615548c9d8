#include "text/chat_template.h"

#include <stdlib.h>
#include <string.h>

/* ---- fixed prompt text (part of the format: byte-identical to the official encoder) --------- */

static const char REASONING_EFFORT_MAX_TEXT[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

static const char TOOLS_BEFORE_SCHEMAS[] =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    "\"<" DSV4_DSML "tool_calls>\" block like the following:\n\n"
    "<" DSV4_DSML "tool_calls>\n"
    "<" DSV4_DSML "invoke name=\"$TOOL_NAME\">\n"
    "<" DSV4_DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSV4_DSML "parameter>\n"
    "...\n"
    "</" DSV4_DSML "invoke>\n"
    "<" DSV4_DSML "invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" DSV4_DSML "invoke>\n"
    "</" DSV4_DSML "tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by " DSV4_THINK_START "), you MUST output your complete reasoning "
    "inside " DSV4_THINK_START "..." DSV4_THINK_END " BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after " DSV4_THINK_END " with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";

static const char TOOLS_AFTER_SCHEMAS[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

static const char RESPONSE_FORMAT_LEAD[] =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

static const char *const TASK_TOKENS[] = {
    [CHAT_TASK_ACTION] = "<｜action｜>",       [CHAT_TASK_QUERY] = "<｜query｜>",
    [CHAT_TASK_AUTHORITY] = "<｜authority｜>", [CHAT_TASK_DOMAIN] = "<｜domain｜>",
    [CHAT_TASK_TITLE] = "<｜title｜>",         [CHAT_TASK_READ_URL] = "<｜read_url｜>",
};
static const char *const TASK_NAMES[] = {
    [CHAT_TASK_ACTION] = "action", [CHAT_TASK_QUERY] = "query", [CHAT_TASK_AUTHORITY] = "authority",
    [CHAT_TASK_DOMAIN] = "domain", [CHAT_TASK_TITLE] = "title", [CHAT_TASK_READ_URL] = "read_url",
};

const char *chat_role_name(chat_role r) {
    switch (r) {
    case CHAT_ROLE_SYSTEM: return "system";
    case CHAT_ROLE_DEVELOPER: return "developer";
    case CHAT_ROLE_USER: return "user";
    case CHAT_ROLE_ASSISTANT: return "assistant";
    case CHAT_ROLE_TOOL: return "tool";
    case CHAT_ROLE_LATEST_REMINDER: return "latest_reminder";
    }
    return "?";
}

void chat_options_default(chat_options *o) {
    o->thinking = true;
    o->effort = CHAT_EFFORT_DEFAULT;
    o->drop_thinking = true;
    o->add_bos = true;
}

/* ---- conversation building ------------------------------------------------------------------- */

void chat_init(chat_conversation *c) { memset(c, 0, sizeof *c); }

static void message_free(chat_message *m) {
    free(m->content);
    free(m->reasoning_content);
    for (size_t i = 0; i < m->n_tool_calls; i++) {
        free(m->tool_calls[i].id);
        free(m->tool_calls[i].name);
        free(m->tool_calls[i].arguments);
    }
    free(m->tool_calls);
    free(m->tool_call_id);
    for (size_t i = 0; i < m->n_tools; i++) free(m->tools[i]);
    free(m->tools);
    free(m->response_format);
}

void chat_free(chat_conversation *c) {
    for (size_t i = 0; i < c->n_messages; i++) message_free(&c->messages[i]);
    free(c->messages);
    memset(c, 0, sizeof *c);
}

static int copy_str(char **dst, const char *src, ds4f_error *err) {
    char *p = NULL;
    if (src && !(p = strdup(src))) return error_set(err, "out of memory");
    free(*dst);
    *dst = p;
    return 0;
}

chat_message *chat_append(chat_conversation *c, chat_role role, const char *content, ds4f_error *err) {
    if (c->n_messages == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 8;
        chat_message *p = realloc(c->messages, cap * sizeof *p);
        if (!p) { error_set(err, "out of memory"); return NULL; }
        c->messages = p;
        c->cap = cap;
    }
    chat_message *m = &c->messages[c->n_messages];
    memset(m, 0, sizeof *m);
    m->role = role;
    if (copy_str(&m->content, content, err)) return NULL;
    c->n_messages++;
    return m;
}

int chat_set_reasoning(chat_message *m, const char *reasoning, ds4f_error *err) {
    return copy_str(&m->reasoning_content, reasoning, err);
}

int chat_set_tool_call_id(chat_message *m, const char *id, ds4f_error *err) {
    return copy_str(&m->tool_call_id, id, err);
}

int chat_add_tool_call(chat_message *m, const char *id, const char *name, const char *arguments, ds4f_error *err) {
    chat_tool_call *p = realloc(m->tool_calls, (m->n_tool_calls + 1) * sizeof *p);
    if (!p) return error_set(err, "out of memory");
    m->tool_calls = p;
    chat_tool_call tc = {0};
    if (copy_str(&tc.id, id, err) || copy_str(&tc.name, name, err) || copy_str(&tc.arguments, arguments, err)) {
        free(tc.id);
        free(tc.name);
        return -1;
    }
    m->tool_calls[m->n_tool_calls++] = tc;
    return 0;
}

static int push_tool(chat_message *m, dsml_buf *json, ds4f_error *err) {
    char **p = realloc(m->tools, (m->n_tools + 1) * sizeof *p);
    if (!p) { dsml_buf_free(json); return error_set(err, "out of memory"); }
    m->tools = p;
    char *s = dsml_buf_take(json, NULL);
    if (!s) return error_set(err, "out of memory");
    m->tools[m->n_tools++] = s;
    return 0;
}

int chat_add_tool_json(chat_message *m, const char *function_json, ds4f_error *err) {
    dsml_buf b = {0};
    if (pyjson_canonical(function_json, strlen(function_json), &b, err)) {
        dsml_buf_free(&b);
        return error_prefix(err, "tool schema");
    }
    return push_tool(m, &b, err);
}

int chat_add_tools_openai(chat_message *m, const cJSON *tools, ds4f_error *err) {
    if (!cJSON_IsArray(tools)) return error_set(err, "tools must be an array");
    size_t i = 0;
    for (const cJSON *t = tools->child; t; t = t->next, i++) {
        const cJSON *fn = NULL;
        if (cJSON_IsObject(t))
            for (const cJSON *k = t->child; k; k = k->next)
                if (k->string && strcmp(k->string, "function") == 0) fn = k; /* a dict keeps the last */
        if (!fn) return error_set(err, "tools[%zu] has no \"function\" object", i);
        dsml_buf b = {0};
        if (pyjson_dump_cjson(fn, &b, err)) {
            dsml_buf_free(&b);
            return error_prefix(err, "tools[%zu].function", i);
        }
        if (push_tool(m, &b, err)) return -1;
    }
    return 0;
}

int chat_set_response_format_json(chat_message *m, const char *json, ds4f_error *err) {
    dsml_buf b = {0};
    if (pyjson_canonical(json, strlen(json), &b, err)) {
        dsml_buf_free(&b);
        return error_prefix(err, "response_format");
    }
    char *s = dsml_buf_take(&b, NULL);
    if (!s) return error_set(err, "out of memory");
    free(m->response_format);
    m->response_format = s;
    return 0;
}

/* ---- rendering ----------------------------------------------------------------------------------
 * Mirrors encode_messages: merge tool and user messages into user turns made of blocks, order
 * tool results as the calls were ordered, drop earlier reasoning, then render turn by turn. */

typedef struct {
    bool is_tool_result;
    const char *text;        /* the text, or the tool result's content */
    const char *tool_use_id; /* tool results: the id they answer ("" if none) */
} block;

typedef struct {
    chat_role role;
    const chat_message *src; /* the message itself; NULL for merged user turns */
    block *blocks;           /* user turns */
    size_t n_blocks, cap_blocks;
    chat_task task;
    bool wo_eos;
    bool drop_reasoning;
} turn;

typedef struct {
    turn *items;
    size_t n, cap;
} turn_list;

static void turns_free(turn_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->items[i].blocks);
    free(l->items);
}

static turn *turn_push(turn_list *l) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        turn *p = realloc(l->items, cap * sizeof *p);
        if (!p) return NULL;
        l->items = p;
        l->cap = cap;
    }
    turn *t = &l->items[l->n++];
    memset(t, 0, sizeof *t);
    return t;
}

static bool block_push(turn *t, block b) {
    if (t->n_blocks == t->cap_blocks) {
        size_t cap = t->cap_blocks ? t->cap_blocks * 2 : 4;
        block *p = realloc(t->blocks, cap * sizeof *p);
        if (!p) return false;
        t->blocks = p;
        t->cap_blocks = cap;
    }
    t->blocks[t->n_blocks++] = b;
    return true;
}

/* Official merge_tool_messages: a tool result joins the user turn just before it (or starts
 * one); a user message joins a preceding user turn unless that turn carries a task. */
static int merge_messages(const chat_conversation *c, turn_list *out, ds4f_error *err) {
    for (size_t i = 0; i < c->n_messages; i++) {
        const chat_message *m = &c->messages[i];
        turn *last = out->n ? &out->items[out->n - 1] : NULL;
        if (m->role == CHAT_ROLE_TOOL || m->role == CHAT_ROLE_USER) {
            bool is_tool = m->role == CHAT_ROLE_TOOL;
            block b = {is_tool, m->content ? m->content : "",
                       is_tool && m->tool_call_id ? m->tool_call_id : ""};
            bool join = last && last->role == CHAT_ROLE_USER && (is_tool || last->task == CHAT_TASK_NONE);
            turn *t = join ? last : turn_push(out);
            if (!t) return error_set(err, "out of memory");
            if (!join) {
                t->role = CHAT_ROLE_USER;
                if (!is_tool) {
                    t->task = m->task;
                    t->wo_eos = m->wo_eos;
                }
            }
            if (!block_push(t, b)) return error_set(err, "out of memory");
        } else {
            turn *t = turn_push(out);
            if (!t) return error_set(err, "out of memory");
            t->role = m->role;
            t->src = m;
            t->task = m->task;
            t->wo_eos = m->wo_eos;
        }
    }
    return 0;
}

/* Official sort_tool_results_by_call_order: within a user turn, tool results are put in the
 * order of the calls of the latest assistant turn that made calls (stable; unknown ids count
 * as position 0). */
static int sort_tool_results(turn_list *l, ds4f_error *err) {
    const chat_message *calls = NULL;
    for (size_t i = 0; i < l->n; i++) {
        turn *t = &l->items[i];
        if (t->role == CHAT_ROLE_ASSISTANT && t->src->n_tool_calls) {
            calls = t->src;
            continue;
        }
        if (t->role != CHAT_ROLE_USER || !calls) continue;
        bool any_id = false;
        for (size_t k = 0; k < calls->n_tool_calls; k++)
            if (calls->tool_calls[k].id && *calls->tool_calls[k].id) any_id = true;
        size_t n = 0;
        for (size_t k = 0; k < t->n_blocks; k++) n += t->blocks[k].is_tool_result;
        if (n < 2 || !any_id) continue;
        block *tools = malloc(n * sizeof *tools);
        size_t *key = malloc(n * sizeof *key);
        if (!tools || !key) { free(tools); free(key); return error_set(err, "out of memory"); }
        n = 0;
        for (size_t k = 0; k < t->n_blocks; k++) {
            if (!t->blocks[k].is_tool_result) continue;
            size_t pos = 0; /* a dict of id -> index keeps the last index for a repeated id */
            for (size_t j = 0; j < calls->n_tool_calls; j++) {
                const char *id = calls->tool_calls[j].id;
                if (id && *id && strcmp(id, t->blocks[k].tool_use_id) == 0) pos = j;
            }
            size_t at = n++;
            while (at > 0 && key[at - 1] > pos) {
                tools[at] = tools[at - 1];
                key[at] = key[at - 1];
                at--;
            }
            tools[at] = t->blocks[k];
            key[at] = pos;
        }
        n = 0;
        for (size_t k = 0; k < t->n_blocks; k++)
            if (t->blocks[k].is_tool_result) t->blocks[k] = tools[n++];
        free(tools);
        free(key);
    }
    return 0;
}

static bool is_user_like(chat_role r) { return r == CHAT_ROLE_USER || r == CHAT_ROLE_DEVELOPER; }

static long last_user_index(const turn_list *l) {
    for (size_t i = l->n; i-- > 0;)
        if (is_user_like(l->items[i].role)) return (long)i;
    return -1;
}

/* Official _drop_thinking_messages: before the last user turn, assistant turns lose their
 * reasoning and developer turns disappear. */
static void drop_earlier_thinking(turn_list *l) {
    long last_user = last_user_index(l);
    size_t w = 0;
    for (size_t i = 0; i < l->n; i++) {
        turn t = l->items[i];
        bool later = (long)i >= last_user;
        if (!later && t.role == CHAT_ROLE_ASSISTANT) t.drop_reasoning = true;
        if (!later && t.role == CHAT_ROLE_DEVELOPER) {
            free(t.blocks);
            continue;
        }
        l->items[w++] = t;
    }
    l->n = w;
}

static void render_tools_and_format(dsml_buf *b, const chat_message *m) {
    if (m->n_tools) {
        dsml_buf_puts(b, "\n\n");
        dsml_buf_puts(b, TOOLS_BEFORE_SCHEMAS);
        for (size_t i = 0; i < m->n_tools; i++) {
            if (i) dsml_buf_puts(b, "\n");
            dsml_buf_puts(b, m->tools[i]);
        }
        dsml_buf_puts(b, TOOLS_AFTER_SCHEMAS);
    }
    if (m->response_format) {
        dsml_buf_puts(b, "\n\n");
        dsml_buf_puts(b, RESPONSE_FORMAT_LEAD);
        dsml_buf_puts(b, m->response_format);
    }
}

static int render_tool_calls(dsml_buf *b, const chat_message *m, ds4f_error *err) {
    dsml_buf_puts(b, "\n\n<" DSV4_DSML "tool_calls>\n");
    for (size_t i = 0; i < m->n_tool_calls; i++) {
        const chat_tool_call *tc = &m->tool_calls[i];
        if (!tc->name) return error_set(err, "tool call %zu has no name", i);
        if (i) dsml_buf_puts(b, "\n");
        dsml_buf_puts(b, "<" DSV4_DSML "invoke name=\"");
        dsml_buf_puts(b, tc->name);
        dsml_buf_puts(b, "\">\n");
        if (dsml_encode_arguments(tc->arguments, b, err)) return error_prefix(err, "tool call %zu (%s)", i, tc->name);
        dsml_buf_puts(b, "\n</" DSV4_DSML "invoke>");
    }
    dsml_buf_puts(b, "\n" DSV4_TOOL_CALLS_END);
    return 0;
}

static int render_turn(dsml_buf *b, const turn_list *l, size_t idx, const chat_options *o, bool drop_thinking,
                       long last_user, ds4f_error *err) {
    const turn *t = &l->items[idx];
    const chat_message *m = t->src;
    if (idx == 0 && o->thinking && o->effort == CHAT_EFFORT_MAX) dsml_buf_puts(b, REASONING_EFFORT_MAX_TEXT);

    switch (t->role) {
    case CHAT_ROLE_SYSTEM:
        if (m->content) dsml_buf_puts(b, m->content);
        render_tools_and_format(b, m);
        break;
    case CHAT_ROLE_DEVELOPER:
        if (!m->content || !*m->content) return error_set(err, "developer message has no content");
        dsml_buf_puts(b, DSV4_USER);
        dsml_buf_puts(b, m->content);
        render_tools_and_format(b, m);
        break;
    case CHAT_ROLE_USER:
        dsml_buf_puts(b, DSV4_USER);
        for (size_t k = 0; k < t->n_blocks; k++) {
            if (k) dsml_buf_puts(b, "\n\n");
            if (t->blocks[k].is_tool_result) dsml_buf_puts(b, "<tool_result>");
            dsml_buf_puts(b, t->blocks[k].text);
            if (t->blocks[k].is_tool_result) dsml_buf_puts(b, "</tool_result>");
        }
        break;
    case CHAT_ROLE_LATEST_REMINDER:
        if (!m->content) return error_set(err, "latest_reminder message has no content");
        dsml_buf_puts(b, DSV4_LATEST_REMINDER);
        dsml_buf_puts(b, m->content);
        break;
    case CHAT_ROLE_ASSISTANT: {
        /* The answer to a task token is a bare label, never reasoned about. */
        bool after_task = idx > 0 && l->items[idx - 1].task != CHAT_TASK_NONE;
        if (o->thinking && !after_task && (!drop_thinking || (long)idx > last_user)) {
            if (m->reasoning_content && !t->drop_reasoning) dsml_buf_puts(b, m->reasoning_content);
            dsml_buf_puts(b, DSV4_THINK_END);
        }
        if (m->content) dsml_buf_puts(b, m->content);
        if (m->n_tool_calls && render_tool_calls(b, m, err)) return -1;
        if (!t->wo_eos) dsml_buf_puts(b, DSV4_EOS);
        break;
    }
    case CHAT_ROLE_TOOL:
        return error_set(err, "internal: tool message left unmerged");
    }

    /* What follows a turn: nothing unless the next turn is the assistant's (or a reminder) or
     * this is the last turn; then the assistant prefix, or a task token. */
    if (idx + 1 < l->n) {
        chat_role next = l->items[idx + 1].role;
        if (next != CHAT_ROLE_ASSISTANT && next != CHAT_ROLE_LATEST_REMINDER) return 0;
    }
    if (t->task != CHAT_TASK_NONE) {
        if (t->task != CHAT_TASK_ACTION) {
            dsml_buf_puts(b, TASK_TOKENS[t->task]);
        } else {
            dsml_buf_puts(b, DSV4_ASSISTANT);
            dsml_buf_puts(b, o->thinking ? DSV4_THINK_START : DSV4_THINK_END);
            dsml_buf_puts(b, TASK_TOKENS[t->task]);
        }
    } else if (is_user_like(t->role)) {
        dsml_buf_puts(b, DSV4_ASSISTANT);
        bool open_thinking = o->thinking && (!drop_thinking || (long)idx >= last_user);
        dsml_buf_puts(b, open_thinking ? DSV4_THINK_START : DSV4_THINK_END);
    }
    return 0;
}

int chat_render(const chat_conversation *c, const chat_options *o, char **out, size_t *out_len, ds4f_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    turn_list turns = {0};
    dsml_buf b = {0};
    int rc = -1;
    if (merge_messages(c, &turns, err) || sort_tool_results(&turns, err)) goto done;

    bool drop_thinking = o->drop_thinking;
    for (size_t i = 0; i < turns.n; i++)
        if (turns.items[i].src && turns.items[i].src->n_tools) drop_thinking = false;
    if (o->thinking && drop_thinking) drop_earlier_thinking(&turns);

    if (o->add_bos) dsml_buf_puts(&b, DSV4_BOS);
    long last_user = last_user_index(&turns);
    for (size_t i = 0; i < turns.n; i++) {
        if (render_turn(&b, &turns, i, o, drop_thinking, last_user, err)) {
            const turn *t = &turns.items[i];
            error_prefix(err, "rendering %s turn %zu", chat_role_name(t->role), i);
            goto done;
        }
    }
    *out = dsml_buf_take(&b, out_len);
    if (!*out) { error_set(err, "out of memory rendering the prompt"); goto done; }
    rc = 0;
done:
    dsml_buf_free(&b);
    turns_free(&turns);
    return rc;
}

/* ---- OpenAI requests ------------------------------------------------------------------------- */

static int clip40(const char *s) { return utf8_clip(s, strlen(s), 40); }

/* cJSON keeps repeated keys; a Python dict (what the official code is handed) keeps the last. */
static const cJSON *field(const cJSON *obj, const char *name) {
    const cJSON *found = NULL;
    for (const cJSON *k = obj->child; k; k = k->next)
        if (k->string && strcmp(k->string, name) == 0) found = k;
    return found;
}

static int utf8_field(const char *s, size_t idx, const char *what, ds4f_error *err) {
    if (!utf8_valid(s, strlen(s))) return error_set(err, "messages[%zu].%s is not valid UTF-8", idx, what);
    return 0;
}

/* A string field that may be absent or null. */
static int opt_string(const cJSON *obj, const char *name, size_t idx, const char **out, ds4f_error *err) {
    const cJSON *v = field(obj, name);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) return error_set(err, "messages[%zu].%s must be a string", idx, name);
    *out = v->valuestring;
    return utf8_field(*out, idx, name, err);
}

/* content: string, null, or an array of parts. */
static int content_text(const cJSON *v, chat_role role, size_t idx, dsml_buf *out, bool *present, ds4f_error *err) {
    *present = false;
    if (!v || cJSON_IsNull(v)) return 0;
    *present = true;
    if (cJSON_IsString(v)) {
        if (utf8_field(v->valuestring, idx, "content", err)) return -1;
        dsml_buf_puts(out, v->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(v)) return error_set(err, "messages[%zu].content must be a string, null or an array of parts", idx);
    size_t k = 0;
    for (const cJSON *p = v->child; p; p = p->next, k++) {
        if (!cJSON_IsObject(p)) return error_set(err, "messages[%zu].content[%zu] is not an object", idx, k);
        const cJSON *type = field(p, "type");
        const char *type_name = cJSON_IsString(type) ? type->valuestring : NULL;
        if (k) dsml_buf_puts(out, "\n\n");
        if (type_name && strcmp(type_name, "text") == 0) {
            const cJSON *text = field(p, "text");
            if (text && !cJSON_IsString(text))
                return error_set(err, "messages[%zu].content[%zu].text must be a string", idx, k);
            if (text) {
                if (utf8_field(text->valuestring, idx, "content[].text", err)) return -1;
                dsml_buf_puts(out, text->valuestring);
            }
        } else if (role == CHAT_ROLE_TOOL) {
            /* The official encoder keeps a placeholder for what it cannot show in a tool result. */
            if (type_name && utf8_field(type_name, idx, "content[].type", err)) return -1;
            dsml_buf_puts(out, "[Unsupported ");
            dsml_buf_puts(out, type_name ? type_name : "None");
            dsml_buf_puts(out, "]");
        } else {
            return error_set(err, "messages[%zu].content[%zu] has type \"%s\"; only text parts are supported", idx, k,
                             type_name ? type_name : "(none)");
        }
    }
    return 0;
}

static int role_from_name(const char *s, unsigned flags, chat_role *r) {
    if (strcmp(s, "system") == 0) *r = CHAT_ROLE_SYSTEM;
    else if (strcmp(s, "developer") == 0)
        *r = (flags & CHAT_OPENAI_DEVELOPER_AS_SYSTEM) ? CHAT_ROLE_SYSTEM : CHAT_ROLE_DEVELOPER;
    else if (strcmp(s, "user") == 0) *r = CHAT_ROLE_USER;
    else if (strcmp(s, "assistant") == 0) *r = CHAT_ROLE_ASSISTANT;
    else if (strcmp(s, "tool") == 0) *r = CHAT_ROLE_TOOL;
    else if (strcmp(s, "latest_reminder") == 0) *r = CHAT_ROLE_LATEST_REMINDER;
    else return -1;
    return 0;
}

static int add_openai_tool_calls(chat_message *m, const cJSON *calls, size_t idx, ds4f_error *err) {
    if (!calls || cJSON_IsNull(calls)) return 0;
    if (!cJSON_IsArray(calls)) return error_set(err, "messages[%zu].tool_calls must be an array", idx);
    size_t k = 0;
    for (const cJSON *tc = calls->child; tc; tc = tc->next, k++) {
        if (!cJSON_IsObject(tc)) return error_set(err, "messages[%zu].tool_calls[%zu] is not an object", idx, k);
        const cJSON *fn = field(tc, "function");
        if (!cJSON_IsObject(fn)) return error_set(err, "messages[%zu].tool_calls[%zu] has no function object", idx, k);
        const cJSON *name = field(fn, "name"), *args = field(fn, "arguments");
        if (!cJSON_IsString(name)) return error_set(err, "messages[%zu].tool_calls[%zu].function.name must be a string", idx, k);
        if (utf8_field(name->valuestring, idx, "tool_calls[].function.name", err)) return -1;
        /* The id orders tool results; the official code falls back to function.id. */
        const cJSON *id = field(tc, "id");
        if (!cJSON_IsString(id) || !*id->valuestring) id = field(fn, "id");
        const char *id_text = cJSON_IsString(id) ? id->valuestring : NULL;
        if (id_text && utf8_field(id_text, idx, "tool_calls[].id", err)) return -1;
        dsml_buf text = {0};
        const char *args_text;
        if (cJSON_IsString(args)) {
            args_text = args->valuestring;
            if (utf8_field(args_text, idx, "tool_calls[].function.arguments", err)) return -1;
        } else if (cJSON_IsObject(args)) {
            /* Some clients send the arguments as an object rather than its JSON text. */
            if (pyjson_dump_cjson(args, &text, err)) {
                dsml_buf_free(&text);
                return error_prefix(err, "messages[%zu].tool_calls[%zu].function.arguments", idx, k);
            }
            args_text = text.data;
        } else {
            return error_set(err, "messages[%zu].tool_calls[%zu].function.arguments must be a JSON string", idx, k);
        }
        int rc = chat_add_tool_call(m, id_text, name->valuestring, args_text, err);
        dsml_buf_free(&text);
        if (rc) return -1;
    }
    return 0;
}

static int add_openai_message(chat_conversation *c, const cJSON *msg, size_t idx, unsigned flags, ds4f_error *err) {
    if (!cJSON_IsObject(msg)) return error_set(err, "messages[%zu] is not an object", idx);
    const cJSON *role_v = field(msg, "role");
    if (!cJSON_IsString(role_v)) return error_set(err, "messages[%zu] has no role", idx);
    chat_role role;
    if (role_from_name(role_v->valuestring, flags, &role))
        return error_set(err, "messages[%zu] has unknown role \"%.*s\"", idx, clip40(role_v->valuestring),
                         role_v->valuestring);

    dsml_buf content = {0};
    bool has_content;
    if (content_text(field(msg, "content"), role, idx, &content, &has_content, err)) {
        dsml_buf_free(&content);
        return -1;
    }
    if (content.oom) return error_set(err, "out of memory");
    chat_message *m = chat_append(c, role, has_content ? (content.data ? content.data : "") : NULL, err);
    dsml_buf_free(&content);
    if (!m) return -1;

    const char *s;
    if (opt_string(msg, "reasoning_content", idx, &s, err) || chat_set_reasoning(m, s, err)) return -1;
    if (opt_string(msg, "tool_call_id", idx, &s, err) || chat_set_tool_call_id(m, s, err)) return -1;
    if (add_openai_tool_calls(m, field(msg, "tool_calls"), idx, err)) return -1;

    const cJSON *tools = field(msg, "tools");
    if (tools && !cJSON_IsNull(tools) && chat_add_tools_openai(m, tools, err))
        return error_prefix(err, "messages[%zu]", idx);
    const cJSON *rf = field(msg, "response_format");
    if (rf && !cJSON_IsNull(rf)) {
        dsml_buf b = {0};
        if (pyjson_dump_cjson(rf, &b, err)) {
            dsml_buf_free(&b);
            return error_prefix(err, "messages[%zu].response_format", idx);
        }
        free(m->response_format);
        if (!(m->response_format = dsml_buf_take(&b, NULL))) return error_set(err, "out of memory");
    }

    const cJSON *task = field(msg, "task");
    if (task && !cJSON_IsNull(task)) {
        if (!cJSON_IsString(task)) return error_set(err, "messages[%zu].task must be a string", idx);
        for (int k = CHAT_TASK_ACTION; k <= CHAT_TASK_READ_URL; k++)
            if (strcmp(task->valuestring, TASK_NAMES[k]) == 0) m->task = (chat_task)k;
        if (m->task == CHAT_TASK_NONE)
            return error_set(err, "messages[%zu].task \"%.*s\" is not one of action, query, authority, domain, title, read_url",
                             idx, clip40(task->valuestring), task->valuestring);
    }
    m->wo_eos = cJSON_IsTrue(field(msg, "wo_eos")) || cJSON_IsTrue(field(msg, "prefix"));
    return 0;
}

int chat_from_openai(chat_conversation *c, const cJSON *messages, const cJSON *tools, unsigned flags,
                     ds4f_error *err) {
    if (!cJSON_IsArray(messages)) return error_set(err, "messages must be an array");
    size_t first = c->n_messages;
    bool request_tools = tools && !cJSON_IsNull(tools);
    if (request_tools && !cJSON_IsArray(tools)) return error_set(err, "tools must be an array");
    if (request_tools && !tools->child) request_tools = false;
    if (request_tools) {
        const cJSON *m0 = messages->child;
        const cJSON *r0 = cJSON_IsObject(m0) ? field(m0, "role") : NULL;
        chat_role role;
        bool first_is_system = cJSON_IsString(r0) && role_from_name(r0->valuestring, flags, &role) == 0 &&
                               role == CHAT_ROLE_SYSTEM;
        if (!first_is_system && !chat_append(c, CHAT_ROLE_SYSTEM, NULL, err)) return -1;
    }
    size_t idx = 0;
    for (const cJSON *m = messages->child; m; m = m->next, idx++)
        if (add_openai_message(c, m, idx, flags, err)) return -1;
    if (request_tools && chat_add_tools_openai(&c->messages[first], tools, err)) return error_prefix(err, "request");
    return 0;
}

int chat_apply_reasoning_effort(chat_options *o, const char *value, ds4f_error *err) {
    if (!value) return 0;
    if (strcmp(value, "none") == 0) {
        o->thinking = false;
        o->effort = CHAT_EFFORT_DEFAULT;
    } else if (strcmp(value, "low") == 0 || strcmp(value, "medium") == 0 || strcmp(value, "high") == 0) {
        o->thinking = true;
        o->effort = CHAT_EFFORT_HIGH;
    } else if (strcmp(value, "max") == 0 || strcmp(value, "xhigh") == 0) {
        o->thinking = true;
        o->effort = CHAT_EFFORT_MAX;
    } else {
        return error_set(err, "reasoning_effort \"%.*s\" is not one of none, low, medium, high, xhigh, max", clip40(value),
                         value);
    }
    return 0;
}
