/* ds4f serve: prompt cache and reasoning memory (see server_memory.h). */
#include "app/server_memory.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "text/dsml.h"

/* ---- prompt cache ------------------------------------------------------------------------------ */

void server_prompt_cache_free(server_prompt_cache *c) {
    free(c->text);
    free(c->ids);
    memset(c, 0, sizeof *c);
}

/* Whether the tokenizer matches s as an added token: then text is split there before any other
 * rule applies. (A vocabulary entry of the same spelling would not split the text.) */
static bool is_added_token(const tokenizer *tok, const char *s) {
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    ds4f_error err;
    bool added = false;
    if (tokenizer_encode(tok, s, strlen(s), &a, &na, &err) == 0 &&
        tokenizer_encode_flags(tok, s, strlen(s), TOKENIZER_PLAIN_TEXT, &b, &nb, &err) == 0)
        added = na == 1 && !(nb == 1 && b[0] == a[0]);
    free(a);
    free(b);
    return added;
}

/* Encoding the rest of a text on its own gives the tokens that encoding the whole text gives
 * there only where the tokenizer splits anyway: at an added token, which is matched before any
 * other rule. The chat encoding puts one after every turn (the EOS, then <｜User｜>...), and
 * </think> after reasoning. */
static bool starts_at_special_token(const tokenizer *tok, const char *rest, size_t len) {
    static const char *const specials[] = {DSV4_EOS,  DSV4_USER,       DSV4_ASSISTANT,       DSV4_BOS,
                                           DSV4_THINK_END, DSV4_THINK_START, DSV4_LATEST_REMINDER};
    if (len == 0) return true;
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) {
        const size_t n = strlen(specials[i]);
        if (len >= n && memcmp(rest, specials[i], n) == 0) return is_added_token(tok, specials[i]);
    }
    return false;
}

int server_prompt_cache_encode(const server_prompt_cache *c, const tokenizer *tok, const char *text, size_t len,
                               int32_t **ids, int *n, int *reused, ds4f_error *err) {
    *ids = NULL;
    *n = 0;
    *reused = 0;
    size_t from = 0;
    if (c->n > 0 && len >= c->len && memcmp(text, c->text, c->len) == 0 &&
        starts_at_special_token(tok, text + c->len, len - c->len))
        from = c->len;
    int32_t *rest = NULL;
    size_t n_rest = 0;
    if (tokenizer_encode(tok, text + from, len - from, &rest, &n_rest, err)) return -1;
    const size_t head = from ? (size_t)c->n : 0;
    if (head + n_rest > (size_t)INT32_MAX) {
        free(rest);
        return error_set(err, "the prompt has too many tokens");
    }
    int32_t *all = malloc((head + n_rest + 1) * sizeof *all);
    if (!all) {
        free(rest);
        return error_set(err, "out of memory");
    }
    if (head) memcpy(all, c->ids, head * sizeof *all);
    if (n_rest) memcpy(all + head, rest, n_rest * sizeof *all);
    free(rest);
    *ids = all;
    *n = (int)(head + n_rest);
    *reused = (int)head;
    return 0;
}

int server_prompt_cache_set(server_prompt_cache *c, const tokenizer *tok, const char *prompt_text, size_t prompt_len,
                            const int32_t *prompt_ids, int n_prompt, const int32_t *generated, int n_generated,
                            ds4f_error *err) {
    server_prompt_cache_free(c);
    char *gen_text = NULL;
    size_t gen_len = 0;
    if (n_generated > 0 && tokenizer_decode(tok, generated, (size_t)n_generated, &gen_text, &gen_len, err)) return -1;
    /* The answer as the client received it and will send it back: bytes that are not UTF-8
     * became U+FFFD in the JSON. The ids stay the model's own, which is what the session holds. */
    dsml_buf text = {0};
    dsml_buf_put(&text, prompt_text, prompt_len);
    utf8_put_sanitized(&text, gen_text ? gen_text : "", gen_len);
    free(gen_text);
    int32_t *ids = malloc(((size_t)n_prompt + (size_t)n_generated + 1) * sizeof *ids);
    size_t len = 0;
    char *t = dsml_buf_take(&text, &len);
    if (!t || !ids) {
        free(t);
        free(ids);
        return error_set(err, "out of memory");
    }
    memcpy(ids, prompt_ids, (size_t)n_prompt * sizeof *ids);
    if (n_generated > 0) memcpy(ids + n_prompt, generated, (size_t)n_generated * sizeof *ids);
    c->text = t;
    c->len = len;
    c->ids = ids;
    c->n = n_prompt + n_generated;
    return 0;
}

/* ---- reasoning memory --------------------------------------------------------------------------- */

/* Keys are length-prefixed fields, so that no content can imitate another's tool calls. */
static void key_field(dsml_buf *b, const char *s, size_t len) {
    const uint64_t n = len;
    dsml_buf_put(b, &n, sizeof n);
    if (len) dsml_buf_put(b, s, len);
}

static uint64_t fnv1a(const char *s, size_t len) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

int server_reasoning_memory_init(server_reasoning_memory *m, int capacity) {
    memset(m, 0, sizeof *m);
    m->capacity = capacity > 0 ? capacity : 1;
    m->entries = calloc((size_t)m->capacity, sizeof *m->entries);
    if (!m->entries) return -1;
    pthread_mutex_init(&m->mu, NULL);
    return 0;
}

static void entry_free(server_reasoning_entry *e) {
    free(e->key);
    free(e->reasoning);
    memset(e, 0, sizeof *e);
}

void server_reasoning_memory_free(server_reasoning_memory *m) {
    if (!m->entries) return;
    for (int i = 0; i < m->capacity; i++) entry_free(&m->entries[i]);
    free(m->entries);
    pthread_mutex_destroy(&m->mu);
    memset(m, 0, sizeof *m);
}

void server_reasoning_memory_put(server_reasoning_memory *m, const char *content, size_t content_len,
                                 const server_tool_call *calls, size_t n_calls, const char *reasoning,
                                 size_t reasoning_len) {
    dsml_buf key = {0};
    key_field(&key, content, content_len);
    for (size_t i = 0; i < n_calls; i++) {
        key_field(&key, calls[i].name, strlen(calls[i].name));
        key_field(&key, calls[i].arguments, strlen(calls[i].arguments));
    }
    char *r = malloc(reasoning_len + 1);
    if (key.oom || !r) {
        dsml_buf_free(&key);
        free(r);
        return; /* a hint only: forgetting it costs a longer prefill later, nothing else */
    }
    if (reasoning_len) memcpy(r, reasoning, reasoning_len);
    r[reasoning_len] = 0;
    server_reasoning_entry e = {.hash = fnv1a(key.data, key.len), .key_len = key.len, .reasoning = r};
    e.key = dsml_buf_take(&key, NULL);
    pthread_mutex_lock(&m->mu);
    entry_free(&m->entries[m->next]);
    m->entries[m->next] = e;
    m->next = (m->next + 1) % m->capacity;
    if (m->count < m->capacity) m->count++;
    pthread_mutex_unlock(&m->mu);
}

int server_reasoning_memory_restore(server_reasoning_memory *m, chat_conversation *c, ds4f_error *err) {
    int restored = 0;
    for (size_t i = 0; i < c->n_messages; i++) {
        chat_message *msg = &c->messages[i];
        if (msg->role != CHAT_ROLE_ASSISTANT || msg->reasoning_content) continue;
        dsml_buf key = {0};
        key_field(&key, msg->content ? msg->content : "", msg->content ? strlen(msg->content) : 0);
        for (size_t k = 0; k < msg->n_tool_calls; k++) {
            const chat_tool_call *tc = &msg->tool_calls[k];
            key_field(&key, tc->name ? tc->name : "", tc->name ? strlen(tc->name) : 0);
            key_field(&key, tc->arguments ? tc->arguments : "", tc->arguments ? strlen(tc->arguments) : 0);
        }
        if (key.oom) {
            dsml_buf_free(&key);
            return error_set(err, "out of memory");
        }
        const uint64_t h = fnv1a(key.data ? key.data : "", key.len);
        char *found = NULL;
        pthread_mutex_lock(&m->mu);
        /* Newest first: the same answer given twice keeps its latest reasoning. */
        for (int k = 0; k < m->count && !found; k++) {
            const server_reasoning_entry *e = &m->entries[(m->next - 1 - k + m->capacity) % m->capacity];
            if (e->hash == h && e->key_len == key.len && memcmp(e->key, key.data, key.len) == 0) found = strdup(e->reasoning);
        }
        pthread_mutex_unlock(&m->mu);
        dsml_buf_free(&key);
        if (found) {
            int rc = chat_set_reasoning(msg, found, err);
            free(found);
            if (rc) return -1;
            restored++;
        }
    }
    return restored;
}
