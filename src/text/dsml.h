/* The DSV4 model's output side and the JSON text the official encoder writes.
 *
 * Three things live here, all following DeepSeek's encoding_dsv4.py (see chat_template.h):
 *
 *  1. JSON printed exactly as Python's json.dumps(value, ensure_ascii=False) prints it, because
 *     the prompt embeds such text (tool schemas, non-string tool arguments) and the model saw that
 *     exact spelling in training: ", " and ": " separators, non-ASCII kept raw, Python's escapes,
 *     ints as written, floats in Python's shortest repr, NaN/Infinity, duplicate keys collapsed
 *     the way a dict collapses them (first position, last value).
 *  2. DSML: tool-call arguments rendered as <｜DSML｜parameter> lines, and the reverse parse of a
 *     generated assistant turn into reasoning, content and tool calls (official
 *     parse_message_from_completion_text, strict: malformed output is an error, as there).
 *  3. A streaming splitter for a server that forwards text while it is generated.
 */
#ifndef DS4F_TEXT_DSML_H
#define DS4F_TEXT_DSML_H

#include <stdbool.h>
#include <stddef.h>
#include <cJSON.h>
#include "base/error.h"

/* Special strings of the format; each one is a single token of the vocabulary. */
#define DSV4_BOS            "<｜begin▁of▁sentence｜>"
#define DSV4_EOS            "<｜end▁of▁sentence｜>"
#define DSV4_USER           "<｜User｜>"
#define DSV4_ASSISTANT      "<｜Assistant｜>"
#define DSV4_LATEST_REMINDER "<｜latest_reminder｜>"
#define DSV4_THINK_START    "<think>"
#define DSV4_THINK_END      "</think>"
#define DSV4_DSML           "｜DSML｜"
/* What separates an assistant's content from its tool calls. */
#define DSV4_TOOL_CALLS_START "\n\n<" DSV4_DSML "tool_calls"
#define DSV4_TOOL_CALLS_END   "</" DSV4_DSML "tool_calls>"

/* ---- growable byte buffer ---------------------------------------------------------------- */

/* Always NUL-terminated once anything was written. An allocation failure sets `oom` and makes
 * later writes no-ops, so a long sequence of writes is checked once at the end. */
typedef struct dsml_buf {
    char *data;
    size_t len, cap;
    bool oom;
} dsml_buf;

void dsml_buf_put(dsml_buf *b, const void *bytes, size_t n);
void dsml_buf_puts(dsml_buf *b, const char *s);
void dsml_buf_free(dsml_buf *b);
/* Hands over the NUL-terminated contents (an empty string when nothing was written) and resets
 * the buffer; NULL if an allocation failed at any point. */
char *dsml_buf_take(dsml_buf *b, size_t *len);

/* ---- Python-compatible JSON ---------------------------------------------------------------- */

/* json.dumps(json.loads(text), ensure_ascii=False). Fails (with the byte offset) exactly where
 * Python's json.loads fails, and also on a lone UTF-16 surrogate or invalid UTF-8, which Python
 * could not encode into a prompt either. */
int pyjson_canonical(const char *text, size_t len, dsml_buf *out, ds4f_error *err);
/* json.dumps of a cJSON tree. cJSON keeps numbers only as doubles, so a number whose value is an
 * integer of magnitude <= 2^53 is printed as an int and every other number as Python prints a
 * float: the one place where the output can differ from Python's (a schema that writes 1.0
 * gets "1"; Python prints "1.0"). Use pyjson_canonical on the original text to avoid that. */
int pyjson_dump_cjson(const cJSON *item, dsml_buf *out, ds4f_error *err);
/* A JSON string literal for the bytes, escaped as json.dumps(str, ensure_ascii=False) does. */
void pyjson_put_string(dsml_buf *out, const char *s, size_t len);
/* Python's repr(float) of a finite double, or NaN / Infinity / -Infinity as json.dumps writes
 * them. */
void pyjson_put_double(dsml_buf *out, double v);

/* ---- UTF-8 helpers -------------------------------------------------------------------------- */

bool utf8_valid(const char *s, size_t len);
/* The longest prefix of s[0..len) of at most max bytes that does not cut a character in two:
 * for quoting text in error messages. */
int utf8_clip(const char *s, size_t len, size_t max);

/* ---- DSML: rendering -------------------------------------------------------------------------- */

/* The parameter lines of one invoke for a tool call whose arguments are JSON text (official
 * encode_arguments_to_dsml): a JSON object gives one line per key, strings raw with
 * string="true", anything else as Python JSON with string="false". Text that is not JSON becomes
 * the single string parameter "arguments", as the official code does; JSON that is not an object
 * is an error (the official code fails on it too). */
int dsml_encode_arguments(const char *arguments, dsml_buf *out, ds4f_error *err);

/* ---- parsing a generated assistant turn ------------------------------------------------------ */

/* Strings are NUL-terminated, with their lengths too: generated text may contain NUL bytes. */
typedef struct dsml_tool_call {
    char *name;
    char *arguments; /* a JSON object as text, built as the official decode_dsml_to_arguments:
                        string="false" values are copied verbatim, so this is only JSON if the
                        model wrote JSON there */
    size_t name_len, arguments_len;
} dsml_tool_call;

typedef struct dsml_parsed {
    char *reasoning_content; /* "" in chat mode */
    char *content;
    size_t reasoning_len, content_len;
    dsml_tool_call *tool_calls;
    size_t n_tool_calls;
} dsml_parsed;

enum {
    DSML_PARSE_THINKING = 1,     /* the prompt ended in <think>: the turn opens with reasoning */
    DSML_PARSE_EOS_OPTIONAL = 2, /* text without the EOS text is parsed as if it ended with it
                                    (a server that stops on the EOS id and never detokenizes it).
                                    Without this flag the official rules apply: the EOS text is
                                    required after content, but a tool-call block cut off at the
                                    end of the text (say by a token limit) is accepted as far as
                                    it goes; with the flag such a block is an error */
};

/* Splits one generated assistant turn (everything after the prompt). Returns -1 with the reason
 * when the text breaks the format, where the official parser raises: missing </think> or EOS,
 * malformed DSML, text after the tool calls or after EOS, special tokens in reasoning/content. */
int dsml_parse_completion(const char *text, size_t len, unsigned flags, dsml_parsed *out, ds4f_error *err);
void dsml_parsed_free(dsml_parsed *p);

/* ---- streaming -------------------------------------------------------------------------------- */

typedef enum {
    DSML_EVENT_REASONING, /* text, len: more reasoning */
    DSML_EVENT_CONTENT,   /* text, len: more content */
    DSML_EVENT_TOOL_CALL, /* tool_index, name, arguments: one complete tool call */
} dsml_event_kind;

typedef struct dsml_event {
    dsml_event_kind kind;
    const char *text;
    size_t len;
    size_t tool_index;
    const char *name, *arguments; /* NUL-terminated; lengths as in dsml_tool_call */
    size_t name_len, arguments_len;
} dsml_event;

typedef void (*dsml_event_fn)(void *user, const dsml_event *ev);

/* Fed the generated text in pieces of any size, reports reasoning and content as soon as they
 * are certain. Text that might be the start of </think>, of the tool-calls block or of the EOS is
 * held back until the next piece decides it, and so is an incomplete UTF-8 character; the DSML
 * block itself is never reported as text: its tool calls are reported once the block closes.
 * For any text the official parser accepts, the reported reasoning, content and tool calls
 * concatenate to exactly what dsml_parse_completion returns. */
typedef struct dsml_stream {
    unsigned flags;
    dsml_event_fn fn;
    void *user;
    dsml_buf text;        /* everything fed so far */
    size_t done;          /* bytes of `text` already reported or consumed as a marker */
    int state;
    size_t tools_at;      /* where the DSML block starts (just past DSV4_TOOL_CALLS_START) */
    size_t tools_scan;    /* where to resume looking for the block's end */
    size_t tool_calls_reported;
} dsml_stream;

void dsml_stream_init(dsml_stream *s, unsigned flags, dsml_event_fn fn, void *user);
/* -1 only when memory runs out. */
int dsml_stream_feed(dsml_stream *s, const char *bytes, size_t len, ds4f_error *err);
/* Reports what was held back, then parses the whole text with dsml_parse_completion (same flags)
 * into `out` (which may be NULL) and returns its verdict. On -1, dsml_stream_unreported gives the
 * text that was never reported (a malformed DSML block), e.g. to pass it on as content. */
int dsml_stream_finish(dsml_stream *s, dsml_parsed *out, ds4f_error *err);
const char *dsml_stream_unreported(const dsml_stream *s, size_t *len);
void dsml_stream_free(dsml_stream *s);

#endif
