/* ds4f serve: OpenAI JSON responses and SSE streams (see server_response.h). */
#include "app/server_response.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- JSON text ---------------------------------------------------------------------------------- */

/* Length of the well-formed UTF-8 character at s (RFC 3629: no overlong forms, no surrogates,
 * nothing above U+10FFFF), or 0 when the bytes there are not one. */
static size_t utf8_char_len(const unsigned char *s, size_t avail) {
    const unsigned c = s[0];
    size_t n;
    unsigned min2 = 0x80, max2 = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) min2 = 0xA0;      /* overlong */
        else if (c == 0xED) max2 = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) min2 = 0x90;      /* overlong */
        else if (c == 0xF4) max2 = 0x8F; /* above U+10FFFF */
    } else {
        return 0;
    }
    if (avail < n || s[1] < min2 || s[1] > max2) return 0;
    for (size_t k = 2; k < n; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return n;
}

void json_put_string(dsml_buf *b, const char *s, size_t len) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    dsml_buf_put(b, "\"", 1);
    size_t run = 0; /* bytes copied as they are, written in one go */
    for (size_t i = 0; i < len;) {
        const unsigned c = u[i];
        size_t n = 1;
        const char *esc = NULL;
        char ctl[7];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c < 0x20) {
            memcpy(ctl, "\\u00", 4);
            ctl[4] = hex[c >> 4];
            ctl[5] = hex[c & 15];
            ctl[6] = 0;
            esc = ctl;
        } else if (c >= 0x80) {
            n = utf8_char_len(u + i, len - i);
            if (n == 0) {
                esc = "\xEF\xBF\xBD"; /* U+FFFD for one stray byte */
                n = 1;
            }
        }
        if (esc) {
            dsml_buf_put(b, s + i - run, run);
            run = 0;
            dsml_buf_puts(b, esc);
        } else {
            run += n;
        }
        i += n;
    }
    dsml_buf_put(b, s + len - run, run);
    dsml_buf_put(b, "\"", 1);
}

void json_put_cstring(dsml_buf *b, const char *s) { json_put_string(b, s, strlen(s)); }

void utf8_put_sanitized(dsml_buf *b, const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t run = 0;
    for (size_t i = 0; i < len;) {
        const size_t n = utf8_char_len(u + i, len - i);
        if (n) {
            run += n;
            i += n;
            continue;
        }
        dsml_buf_put(b, s + i - run, run);
        run = 0;
        dsml_buf_puts(b, "\xEF\xBF\xBD");
        i++;
    }
    dsml_buf_put(b, s + len - run, run);
}

static void put_int(dsml_buf *b, long long v) {
    char t[32];
    int n = snprintf(t, sizeof t, "%lld", v);
    dsml_buf_put(b, t, (size_t)n);
}

char *server_error_json(const server_error *e, size_t *len) {
    dsml_buf b = {0};
    dsml_buf_puts(&b, "{\"error\":{\"message\":");
    json_put_cstring(&b, e->message);
    dsml_buf_puts(&b, ",\"type\":");
    json_put_cstring(&b, e->type ? e->type : "server_error");
    dsml_buf_puts(&b, ",\"param\":");
    if (e->param[0]) json_put_cstring(&b, e->param);
    else dsml_buf_puts(&b, "null");
    dsml_buf_puts(&b, ",\"code\":");
    if (e->code) json_put_cstring(&b, e->code);
    else dsml_buf_puts(&b, "null");
    dsml_buf_puts(&b, "}}");
    return dsml_buf_take(&b, len);
}

/* ---- ids ------------------------------------------------------------------------------------------- */

static uint64_t id_seed;
static atomic_uint_fast64_t id_counter;
static pthread_once_t id_once = PTHREAD_ONCE_INIT;

static void id_seed_init(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    id_seed = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 16);
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Unique within a process and unlikely to repeat across restarts; not a secret. */
void server_random_id(char *out, size_t size, const char *prefix) {
    pthread_once(&id_once, id_seed_init);
    const uint64_t k = atomic_fetch_add(&id_counter, 1);
    const uint64_t a = mix64(id_seed + k * 0x9e3779b97f4a7c15ull), b = mix64(a ^ 0x5851f42d4c957f2dull);
    snprintf(out, size, "%s%016llx%08llx", prefix, (unsigned long long)a, (unsigned long long)(b >> 32));
}

/* ---- output: common ------------------------------------------------------------------------------- */

static void on_dsml_event(void *user, const dsml_event *ev);

void server_output_init(server_output *o, server_api api, bool stream, bool include_usage, bool thinking,
                        const char *model, server_sink_fn sink, void *sink_user) {
    memset(o, 0, sizeof *o);
    o->api = api;
    o->stream = stream;
    o->include_usage = include_usage;
    o->thinking = thinking;
    o->model = model;
    o->created = (long long)time(NULL);
    o->sink = sink;
    o->sink_user = sink_user;
    server_random_id(o->id, sizeof o->id, api == SERVER_API_CHAT ? "chatcmpl-" : "cmpl-");
    if (api == SERVER_API_CHAT)
        dsml_stream_init(&o->split, (thinking ? DSML_PARSE_THINKING : 0) | DSML_PARSE_EOS_OPTIONAL, on_dsml_event, o);
}

void server_output_free(server_output *o) {
    if (o->api == SERVER_API_CHAT) dsml_stream_free(&o->split);
    dsml_buf_free(&o->reasoning);
    dsml_buf_free(&o->content);
    for (size_t i = 0; i < o->n_calls; i++) {
        free(o->calls[i].name);
        free(o->calls[i].arguments);
    }
    free(o->calls);
    memset(o, 0, sizeof *o);
}

/* The start of a chunk event, up to the opening of its first choice (or of "choices"). */
static void chunk_open(const server_output *o, dsml_buf *b) {
    dsml_buf_puts(b, "data: {\"id\":");
    json_put_cstring(b, o->id);
    dsml_buf_puts(b, o->api == SERVER_API_CHAT ? ",\"object\":\"chat.completion.chunk\"" : ",\"object\":\"text_completion\"");
    dsml_buf_puts(b, ",\"created\":");
    put_int(b, o->created);
    dsml_buf_puts(b, ",\"model\":");
    json_put_cstring(b, o->model);
    dsml_buf_puts(b, ",\"system_fingerprint\":\"ds4f\",\"choices\":");
}

static void emit(server_output *o, dsml_buf *b) {
    if (b->oom) o->oom = true;
    else if (o->sink && b->len) o->sink(o->sink_user, b->data, b->len);
    dsml_buf_free(b);
}

static void put_usage(dsml_buf *b, const server_output *o, const server_usage *u) {
    dsml_buf_puts(b, "{\"prompt_tokens\":");
    put_int(b, u->prompt_tokens);
    dsml_buf_puts(b, ",\"completion_tokens\":");
    put_int(b, u->completion_tokens);
    dsml_buf_puts(b, ",\"total_tokens\":");
    put_int(b, (long long)u->prompt_tokens + u->completion_tokens);
    dsml_buf_puts(b, ",\"prompt_tokens_details\":{\"cached_tokens\":");
    put_int(b, u->cached_tokens);
    dsml_buf_puts(b, "}");
    if (o->api == SERVER_API_CHAT) {
        dsml_buf_puts(b, ",\"completion_tokens_details\":{\"reasoning_tokens\":");
        put_int(b, u->reasoning_tokens);
        dsml_buf_puts(b, "}");
    }
    /* DeepSeek's API reports the cache with these two. */
    dsml_buf_puts(b, ",\"prompt_cache_hit_tokens\":");
    put_int(b, u->cached_tokens);
    dsml_buf_puts(b, ",\"prompt_cache_miss_tokens\":");
    put_int(b, (long long)u->prompt_tokens - u->cached_tokens);
    dsml_buf_puts(b, "}");
}

/* ---- output: chat ------------------------------------------------------------------------------------ */

static void put_tool_call(dsml_buf *b, const server_tool_call *c, long long index, bool with_index) {
    dsml_buf_puts(b, "{");
    if (with_index) {
        dsml_buf_puts(b, "\"index\":");
        put_int(b, index);
        dsml_buf_puts(b, ",");
    }
    dsml_buf_puts(b, "\"id\":");
    json_put_cstring(b, c->id);
    dsml_buf_puts(b, ",\"type\":\"function\",\"function\":{\"name\":");
    json_put_cstring(b, c->name);
    dsml_buf_puts(b, ",\"arguments\":");
    json_put_cstring(b, c->arguments);
    dsml_buf_puts(b, "}}");
}

/* One chat chunk whose delta is `delta_json` (an object's members, without braces). */
static void chat_chunk(server_output *o, const char *delta_members, const char *text, size_t len) {
    dsml_buf b = {0};
    chunk_open(o, &b);
    dsml_buf_puts(&b, "[{\"index\":0,\"delta\":{");
    if (!o->role_sent) {
        dsml_buf_puts(&b, "\"role\":\"assistant\",");
        o->role_sent = true;
    }
    dsml_buf_puts(&b, delta_members);
    if (text) json_put_string(&b, text, len);
    dsml_buf_puts(&b, "},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    emit(o, &b);
}

static char *copy_bytes(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

static void on_dsml_event(void *user, const dsml_event *ev) {
    server_output *o = user;
    switch (ev->kind) {
    case DSML_EVENT_REASONING:
        dsml_buf_put(&o->reasoning, ev->text, ev->len);
        if (o->stream) chat_chunk(o, "\"reasoning_content\":", ev->text, ev->len);
        break;
    case DSML_EVENT_CONTENT:
        dsml_buf_put(&o->content, ev->text, ev->len);
        if (o->stream) chat_chunk(o, "\"content\":", ev->text, ev->len);
        break;
    case DSML_EVENT_TOOL_CALL: {
        server_tool_call *p = realloc(o->calls, (o->n_calls + 1) * sizeof *p);
        if (!p) {
            o->oom = true;
            return;
        }
        o->calls = p;
        server_tool_call *c = &o->calls[o->n_calls];
        memset(c, 0, sizeof *c);
        server_random_id(c->id, sizeof c->id, "call_");
        c->name = copy_bytes(ev->name, ev->name_len);
        c->arguments = copy_bytes(ev->arguments, ev->arguments_len);
        if (!c->name || !c->arguments) {
            free(c->name);
            free(c->arguments);
            o->oom = true;
            return;
        }
        o->n_calls++;
        if (o->stream) {
            /* A complete call in one delta: clients that accumulate deltas by index see the same
             * result as from a call streamed piece by piece. */
            dsml_buf d = {0};
            dsml_buf_puts(&d, "\"tool_calls\":[");
            put_tool_call(&d, c, (long long)o->n_calls - 1, true);
            dsml_buf_puts(&d, "]");
            if (d.oom) o->oom = true;
            else chat_chunk(o, d.data, NULL, 0);
            dsml_buf_free(&d);
        }
        break;
    }
    }
}

static void completion_chunk(server_output *o, const char *text, size_t len) {
    dsml_buf b = {0};
    chunk_open(o, &b);
    dsml_buf_puts(&b, "[{\"index\":0,\"text\":");
    json_put_string(&b, text, len);
    dsml_buf_puts(&b, ",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    emit(o, &b);
}

void server_output_count_token(server_output *o) {
    if (o->api == SERVER_API_CHAT && o->thinking && !o->reasoning_closed) o->reasoning_tokens++;
}

void server_output_feed(server_output *o, const char *text, size_t len) {
    if (!len) return;
    if (o->api != SERVER_API_CHAT) {
        dsml_buf_put(&o->content, text, len);
        if (o->stream) completion_chunk(o, text, len);
        return;
    }
    ds4f_error err;
    if (dsml_stream_feed(&o->split, text, len, &err)) o->oom = true;
    if (o->thinking && !o->reasoning_closed && o->split.text.data) {
        const char *hit = memmem(o->split.text.data + o->think_scan, o->split.text.len - o->think_scan, DSV4_THINK_END,
                                 strlen(DSV4_THINK_END));
        if (hit) o->reasoning_closed = true;
        else if (o->split.text.len >= strlen(DSV4_THINK_END)) o->think_scan = o->split.text.len - strlen(DSV4_THINK_END) + 1;
    }
}

const char *server_output_finish_reason(const server_output *o, ds4f_finish_reason finish) {
    if (o->n_calls) return "tool_calls";
    return finish == DS4F_FINISH_LENGTH ? "length" : "stop";
}

/* Chat: what the splitter still holds, and a verdict on the whole turn. */
static void chat_finish_text(server_output *o) {
    ds4f_error err;
    dsml_parsed parsed;
    if (dsml_stream_finish(&o->split, &parsed, &err) == 0) {
        dsml_parsed_free(&parsed);
        return;
    }
    o->malformed = true;
    snprintf(o->malformed_reason, sizeof o->malformed_reason, "%.*s", (int)sizeof o->malformed_reason - 1, err.msg); /* a reason, cut to fit */
    /* Text the splitter never reported (a DSML block that does not parse, or text after it) is
     * part of the answer all the same: the client gets it as content. */
    size_t n;
    const char *rest = dsml_stream_unreported(&o->split, &n);
    if (n) {
        dsml_event ev = {.kind = DSML_EVENT_CONTENT, .text = rest, .len = n};
        on_dsml_event(o, &ev);
        o->split.done = o->split.text.len;
    }
}

static void put_finish_reason(dsml_buf *b, const char *reason) {
    dsml_buf_puts(b, "\"finish_reason\":");
    json_put_cstring(b, reason);
}

int server_output_finish(server_output *o, ds4f_finish_reason finish, const server_usage *u, char **body, size_t *len) {
    *body = NULL;
    *len = 0;
    if (o->api == SERVER_API_CHAT) chat_finish_text(o);
    const char *reason = server_output_finish_reason(o, finish);
    dsml_buf b = {0};

    if (o->stream) {
        if (o->api == SERVER_API_CHAT) {
            chunk_open(o, &b);
            dsml_buf_puts(&b, "[{\"index\":0,\"delta\":{");
            if (!o->role_sent) dsml_buf_puts(&b, "\"role\":\"assistant\",\"content\":\"\"");
            o->role_sent = true;
            dsml_buf_puts(&b, "},\"logprobs\":null,");
        } else {
            chunk_open(o, &b);
            dsml_buf_puts(&b, "[{\"index\":0,\"text\":\"\",\"logprobs\":null,");
        }
        put_finish_reason(&b, reason);
        dsml_buf_puts(&b, "}]}\n\n");
        if (o->include_usage) {
            chunk_open(o, &b);
            dsml_buf_puts(&b, "[],\"usage\":");
            put_usage(&b, o, u);
            dsml_buf_puts(&b, "}\n\n");
        }
        dsml_buf_puts(&b, "data: [DONE]\n\n");
        emit(o, &b);
        return o->oom ? -1 : 0;
    }

    dsml_buf_puts(&b, "{\"id\":");
    json_put_cstring(&b, o->id);
    dsml_buf_puts(&b, o->api == SERVER_API_CHAT ? ",\"object\":\"chat.completion\"" : ",\"object\":\"text_completion\"");
    dsml_buf_puts(&b, ",\"created\":");
    put_int(&b, o->created);
    dsml_buf_puts(&b, ",\"model\":");
    json_put_cstring(&b, o->model);
    dsml_buf_puts(&b, ",\"system_fingerprint\":\"ds4f\",\"choices\":[{\"index\":0,");
    if (o->api == SERVER_API_CHAT) {
        dsml_buf_puts(&b, "\"message\":{\"role\":\"assistant\",\"content\":");
        /* OpenAI's convention: no content next to tool calls is null, not "". */
        if (o->n_calls && o->content.len == 0) dsml_buf_puts(&b, "null");
        else json_put_string(&b, o->content.data ? o->content.data : "", o->content.len);
        if (o->thinking) {
            dsml_buf_puts(&b, ",\"reasoning_content\":");
            json_put_string(&b, o->reasoning.data ? o->reasoning.data : "", o->reasoning.len);
        }
        if (o->n_calls) {
            dsml_buf_puts(&b, ",\"tool_calls\":[");
            for (size_t i = 0; i < o->n_calls; i++) {
                if (i) dsml_buf_puts(&b, ",");
                put_tool_call(&b, &o->calls[i], 0, false);
            }
            dsml_buf_puts(&b, "]");
        }
        dsml_buf_puts(&b, "},");
    } else {
        dsml_buf_puts(&b, "\"text\":");
        json_put_string(&b, o->content.data ? o->content.data : "", o->content.len);
        dsml_buf_puts(&b, ",");
    }
    dsml_buf_puts(&b, "\"logprobs\":null,");
    put_finish_reason(&b, reason);
    dsml_buf_puts(&b, "}],\"usage\":");
    put_usage(&b, o, u);
    dsml_buf_puts(&b, "}");
    *body = dsml_buf_take(&b, len);
    return *body && !o->oom ? 0 : -1;
}

void server_output_stream_error(server_output *o, const server_error *e) {
    size_t n;
    char *json = server_error_json(e, &n);
    dsml_buf b = {0};
    dsml_buf_puts(&b, "data: ");
    if (json) dsml_buf_put(&b, json, n);
    dsml_buf_puts(&b, "\n\ndata: [DONE]\n\n");
    free(json);
    emit(o, &b);
}
