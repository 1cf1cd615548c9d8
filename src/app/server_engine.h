/* ds4f serve: the model, its one generator, and the worker thread that runs queued requests.
 *
 * A request becomes a server_job on the connection's thread (parsed, rendered, its tokens counted
 * against the context: everything that can be refused with a 400 is refused there), waits in the
 * bounded queue, and is run by the single worker thread, which writes the answer into the job:
 * SSE events as they are generated (the connection's thread sends them), or the whole JSON body
 * at the end. Jobs are shared by the two threads and reference-counted.
 *
 * Cancellation: the worker checks the client's socket before every token and prefill chunk (a
 * closed connection reads as end-of-file there, before any write fails), and the HTTP side marks
 * the job when libmicrohttpd reports the connection closed; either way the generator is told to
 * stop through its per-request callbacks, and the session keeps what it evaluated. */
#ifndef DS4F_APP_SERVER_ENGINE_H
#define DS4F_APP_SERVER_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "app/server_memory.h"
#include "app/server_queue.h"
#include "app/server_request.h"
#include "ds4f.h"

typedef struct server_job {
    pthread_mutex_t mu;
    pthread_cond_t changed;   /* output appended, or the job is done */
    int refs;                 /* under mu */

    server_request req;
    char *prompt_text;        /* NULL for a completions prompt given as token ids */
    size_t prompt_len;
    bool opens_reasoning;     /* chat: the prompt ends in <think> */
    int prompt_tokens;        /* as counted on arrival */

    int fd;                   /* the client's socket (-1: not watched) */
    bool client_gone;         /* under mu; the socket must not be touched once set */
    char peer[64], method[8], path[64];
    double t_arrival;

    /* Output. Streaming: SSE bytes, sent up to sse_sent. Otherwise status and body. */
    dsml_buf sse;
    size_t sse_sent;
    bool done;
    int status;
    char *body;
    size_t body_len;
} server_job;

server_job *server_job_new(void);
void server_job_retain(server_job *j);
void server_job_release(server_job *j);
/* False once the client has closed its connection (checks the socket without reading). */
bool server_job_client_alive(server_job *j);
/* The connection is closed or about to be: never touch its socket again. */
void server_job_mark_gone(server_job *j);
/* Streaming: waits up to `seconds` for output. Returns the bytes copied into buf (at most max),
 * 0 when the time ran out with nothing new, -1 when the job is done and everything was read. */
long server_job_read(server_job *j, char *buf, size_t max, double seconds);
/* Non-streaming: waits up to `seconds`; true once the job is done. */
bool server_job_wait(server_job *j, double seconds);

typedef struct server_engine_config {
    const char *model_dir;
    const char *model_name;  /* reported in responses and /v1/models */
    int context;             /* tokens per session */
    int queue;               /* requests that may wait while one generates */
    bool keep_reasoning;     /* see server_request_prompt */
    double keepalive;        /* seconds without output before an SSE comment (0: every prefill chunk) */
    ds4f_model_options model; /* memory budget, expert streaming, ... (its context is set to `context`) */
} server_engine_config;

typedef struct server_engine {
    server_engine_config cfg;
    ds4f_tokenizer *tok;
    ds4f_model *model;
    ds4f_generator *gen;
    int vocab;
    server_queue queue;
    pthread_t worker;
    bool worker_started;
    atomic_int stopping;
    server_prompt_cache cache;          /* the worker's alone */
    server_reasoning_memory reasoning;  /* written by the worker, read by connection threads */
    atomic_long served, cancelled;
} server_engine;

/* Loads the tokenizer and the model and creates the generator (the long part of start-up). */
int server_engine_open(server_engine *e, const server_engine_config *cfg, ds4f_error *err);
int server_engine_start(server_engine *e, ds4f_error *err);
/* Turns a parsed request into a job ready to queue: restores remembered reasoning, renders the
 * prompt, counts its tokens and refuses one longer than the context. */
int server_engine_prepare(server_engine *e, server_job *j, server_error *err);
/* Queues a prepared job: 429 when the queue is full, 503 while stopping. */
int server_engine_submit(server_engine *e, server_job *j, server_error *err);
/* Graceful stop: refuses new jobs, answers the waiting ones with 503, cancels the running one and
 * joins the worker. */
void server_engine_stop(server_engine *e);
void server_engine_close(server_engine *e);

/* One line on stderr, prefixed and timestamped, written in one piece. */
void server_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
