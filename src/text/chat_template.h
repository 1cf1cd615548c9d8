/* The DSV4 chat encoding: a conversation rendered into the prompt text the model was trained on.
 *
 * There is no Jinja template for DeepSeek-V4; the format is defined by DeepSeek's Python encoder
 * encoding_dsv4.py (GitHub Nicooo-Wang/DeepSeek-V4-Pro-code, encoding/, commit 0ec3a03; see also
 * ../shared/spec/dsv4-architecture.md §6.2). chat_render follows its encode_messages exactly,
 * including its preprocessing: tool messages become <tool_result> blocks of a user turn
 * (consecutive user turns merge too), tool results are reordered to the order of the calls,
 * and in thinking mode the reasoning of turns before the last user message is dropped unless
 * some message carries tools. Its own tests (tests/data/chat/) are reproduced byte for byte.
 *
 * The rendered text starts with the BOS text; tokenize it without adding another BOS. Parsing
 * the model's answer back (reasoning, content, DSML tool calls) is in text/dsml.h.
 *
 * Where this differs from the official code, only for input it crashes on or mangles: a user or
 * tool message with null content renders as empty (officially a TypeError, or the text "None");
 * a latest_reminder without content is refused (officially "None"); user content given as text
 * parts is joined with blank lines (officially a TypeError); function.arguments given as a JSON
 * object rather than its text is used as that text (officially it would become one parameter
 * named "arguments"). Not offered: encode_messages' `context` (encoding only the tail of a
 * conversation); render the whole conversation instead. Tool schemas that come in as cJSON trees
 * print integral floats as ints (see pyjson_dump_cjson); chat_add_tool_json is exact.
 */
#ifndef DS4F_TEXT_CHAT_TEMPLATE_H
#define DS4F_TEXT_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <cJSON.h>
#include "base/error.h"
#include "text/dsml.h"

typedef enum {
    CHAT_ROLE_SYSTEM,
    CHAT_ROLE_DEVELOPER,       /* DeepSeek's search-agent role: rendered as a user turn that may
                                  carry tools; dropped before the last user turn in thinking mode */
    CHAT_ROLE_USER,
    CHAT_ROLE_ASSISTANT,
    CHAT_ROLE_TOOL,            /* a tool result; merged into a user turn when rendered */
    CHAT_ROLE_LATEST_REMINDER, /* date/locale note, <｜latest_reminder｜> */
} chat_role;

/* Quick-instruction tasks (official "task" field): a special token that asks for one short
 * classification or generation instead of a normal answer. */
typedef enum {
    CHAT_TASK_NONE,
    CHAT_TASK_ACTION,
    CHAT_TASK_QUERY,
    CHAT_TASK_AUTHORITY,
    CHAT_TASK_DOMAIN,
    CHAT_TASK_TITLE,
    CHAT_TASK_READ_URL,
} chat_task;

typedef struct chat_tool_call {
    char *id;        /* may be NULL; only used to order the tool results */
    char *name;
    char *arguments; /* JSON object as text, as in OpenAI's function.arguments */
} chat_tool_call;

typedef struct chat_message {
    chat_role role;
    char *content;           /* NULL when absent */
    char *reasoning_content; /* assistant; NULL when absent */
    chat_tool_call *tool_calls;
    size_t n_tool_calls;
    char *tool_call_id;      /* tool: which call this answers */
    char **tools;            /* system/developer: each tool's "function" object as Python-style JSON */
    size_t n_tools;
    char *response_format;   /* system/developer: a schema, Python-style JSON; NULL when absent */
    chat_task task;
    bool wo_eos;             /* assistant: leave the turn open (no EOS), to continue it */
} chat_message;

typedef struct chat_conversation {
    chat_message *messages;
    size_t n_messages, cap;
} chat_conversation;

typedef enum {
    CHAT_EFFORT_DEFAULT, /* the official None */
    CHAT_EFFORT_HIGH,    /* renders exactly as DEFAULT */
    CHAT_EFFORT_MAX,     /* thinking mode: the "Reasoning Effort: Absolute maximum" preamble */
} chat_effort;

typedef struct chat_options {
    bool thinking;      /* thinking mode (prompt ends in <think>) vs chat mode (ends in </think>) */
    chat_effort effort;
    bool drop_thinking; /* official default true: forget reasoning of turns before the last user
                           message (ignored, as officially, when any message has tools) */
    bool add_bos;       /* official add_default_bos_token, default true */
} chat_options;

/* thinking on (DeepSeek's API default for V4), effort DEFAULT, drop_thinking and add_bos on. */
void chat_options_default(chat_options *o);

void chat_init(chat_conversation *c);
void chat_free(chat_conversation *c);

/* Appends a message (content may be NULL) and returns it; the pointer stays valid until the next
 * append. NULL with err set if memory runs out. */
chat_message *chat_append(chat_conversation *c, chat_role role, const char *content, ds4f_error *err);
int chat_set_reasoning(chat_message *m, const char *reasoning, ds4f_error *err);
int chat_set_tool_call_id(chat_message *m, const char *id, ds4f_error *err);
int chat_add_tool_call(chat_message *m, const char *id, const char *name, const char *arguments, ds4f_error *err);
/* One tool's function object ({"name", "description", "parameters"}) as JSON text; kept as
 * Python would print it (exact, numbers included). */
int chat_add_tool_json(chat_message *m, const char *function_json, ds4f_error *err);
/* An OpenAI "tools" array ([{"type": "function", "function": {...}}, ...]). */
int chat_add_tools_openai(chat_message *m, const cJSON *tools, ds4f_error *err);
int chat_set_response_format_json(chat_message *m, const char *json, ds4f_error *err);

/* Renders the conversation: the prompt text (malloc'd, NUL-terminated) and its length. A
 * conversation that ends with a user (or developer) turn ends with the generation prompt
 * "<｜Assistant｜><think>" (or "</think>" in chat mode). */
int chat_render(const chat_conversation *c, const chat_options *o, char **out, size_t *out_len, ds4f_error *err);

/* ---- OpenAI chat-completions requests -------------------------------------------------------- */

enum {
    /* OpenAI's newer "developer" role means system instructions, while DSV4's developer role is
     * a different thing (see chat_role); with this flag it becomes a system message. */
    CHAT_OPENAI_DEVELOPER_AS_SYSTEM = 1,
};

/* Appends the messages of an OpenAI request: role system/developer/user/assistant/tool (and the
 * DSV4 latest_reminder); content as a string, null, or an array of {"type": "text", "text"}
 * parts (joined with a blank line; a tool result's other parts become "[Unsupported TYPE]" as
 * officially, other messages refuse them); assistant "reasoning_content" and "tool_calls"
 * (function.arguments as a JSON string, or an object); tool "tool_call_id"; the DSV4 extras
 * "task", "wo_eos" (DeepSeek's "prefix": true means the same), and "tools"/"response_format" on
 * a system or developer message. Unknown keys are ignored.
 *
 * `tools` (may be NULL) is the request's tools array. DSV4 declares tools in a system message:
 * they go to the first message when it is a system message (as the official tests do),
 * otherwise into a new empty system message put first. Every string must be valid UTF-8.
 * Errors name the message index and field. */
int chat_from_openai(chat_conversation *c, const cJSON *messages, const cJSON *tools, unsigned flags,
                     ds4f_error *err);

/* Request-level reasoning_effort as DeepSeek's API reads it: "low"/"medium"/"high" -> HIGH,
 * "max"/"xhigh" -> MAX; "none" turns thinking off (the convention of hosted V4 endpoints).
 * Sets the fields of `o`; -1 for any other value. */
int chat_apply_reasoning_effort(chat_options *o, const char *value, ds4f_error *err);

const char *chat_role_name(chat_role r);

#endif
