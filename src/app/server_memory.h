/* ds4f serve: what the server remembers between requests so that a conversation's next turn
 * reuses the computed state of the previous one.
 *
 * The generator reuses its session when a new prompt starts with every token it has consumed
 * (include/ds4f.h, "Generation"); any difference restarts it from position 0, which for a long
 * conversation means a long prefill. Two things would make a client's next turn differ from
 * what the session holds, although the conversation is the same:
 *
 *  1. Tokenization. The model generated its answer token by token; the client sends the answer
 *     back as text, and encoding that text need not give the same tokens (BPE has one canonical
 *     split; a model may produce another). server_prompt_cache keeps the last request's text and
 *     the exact tokens the session saw for it; a prompt whose text extends that text exactly, at
 *     a special-token boundary, reuses those tokens and encodes only the rest.
 *  2. Reasoning. In thinking mode the model wrote "reasoning</think>answer", but clients send
 *     back only the answer (OpenAI's format has no place for reasoning in history; DeepSeek's API
 *     drops it). server_reasoning_memory remembers the reasoning of the answers this server gave,
 *     keyed by the answer's content and tool calls, and puts it back into the assistant messages
 *     of later requests that lack it (see server_request_prompt, keep_reasoning).
 *
 * Both are hints: when they do not apply, the prompt is simply encoded from its text. */
#ifndef DS4F_APP_SERVER_MEMORY_H
#define DS4F_APP_SERVER_MEMORY_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "app/server_response.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

typedef struct server_prompt_cache {
    char *text;     /* the last request's prompt text followed by its generated text as the client
                       received it (see server_prompt_cache_set) */
    size_t len;
    int32_t *ids;   /* the tokens of that text as the session consumed them */
    int n;
} server_prompt_cache;

void server_prompt_cache_free(server_prompt_cache *c);

/* The token ids of a prompt text (malloc'd). *reused: how many came from the cache (0 when the
 * text does not extend the cached text at a special-token boundary; then it is encoded whole). */
int server_prompt_cache_encode(const server_prompt_cache *c, const tokenizer *tok, const char *text, size_t len,
                               int32_t **ids, int *n, int *reused, ds4f_error *err);

/* Records a finished request: its prompt (text and ids) and the tokens generated after it (the
 * stop token included when the generation stopped on one). The text is recorded as the client
 * received it, with U+FFFD for bytes that are not UTF-8, so that the client's next turn matches
 * it; the ids stay the model's own. */
int server_prompt_cache_set(server_prompt_cache *c, const tokenizer *tok, const char *prompt_text, size_t prompt_len,
                            const int32_t *prompt_ids, int n_prompt, const int32_t *generated, int n_generated,
                            ds4f_error *err);

typedef struct server_reasoning_entry {
    uint64_t hash;
    char *key;       /* content, then each tool call's name and arguments, NUL-separated */
    size_t key_len;
    char *reasoning;
} server_reasoning_entry;

/* A bounded memory (oldest entries forgotten first), safe to use from any thread. */
typedef struct server_reasoning_memory {
    pthread_mutex_t mu;
    server_reasoning_entry *entries; /* ring */
    int capacity, next, count;
} server_reasoning_memory;

int server_reasoning_memory_init(server_reasoning_memory *m, int capacity);
void server_reasoning_memory_free(server_reasoning_memory *m);
/* Remembers the reasoning of an answer given as `content` and `calls`. */
void server_reasoning_memory_put(server_reasoning_memory *m, const char *content, size_t content_len,
                                 const server_tool_call *calls, size_t n_calls, const char *reasoning,
                                 size_t reasoning_len);
/* Gives every assistant message without reasoning_content the reasoning remembered for it.
 * Returns how many were restored, -1 when memory ran out. */
int server_reasoning_memory_restore(server_reasoning_memory *m, chat_conversation *c, ds4f_error *err);

#endif
