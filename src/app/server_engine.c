/* ds4f serve: jobs, the worker thread and the generation of one request (see server_engine.h). */
#include "app/server_engine.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

#include "app/server_response.h"
#include "base/error.h"
#include "base/timer.h"
#include "text/tokenizer.h"

/* ---- log ------------------------------------------------------------------------------------------ */

void server_log(const char *fmt, ...) {
    char line[2048];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    int n = (int)strftime(line, sizeof line, "ds4f serve: %H:%M:%S ", &tm);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    /* Messages may quote what a client sent: one request, one line, whatever it contained. */
    for (char *c = line + n; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = ' ';
    /* one write per line, so that lines from different threads never interleave */
    fprintf(stderr, "%s\n", line);
}

/* ---- jobs ------------------------------------------------------------------------------------------- */

server_job *server_job_new(void) {
    server_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->changed, NULL);
    j->refs = 1;
    j->fd = -1;
    server_request_init(&j->req);
    return j;
}

void server_job_retain(server_job *j) {
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void server_job_release(server_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    const int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    server_request_free(&j->req);
    free(j->prompt_text);
    dsml_buf_free(&j->sse);
    free(j->body);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->changed);
    free(j);
}

bool server_job_client_alive(server_job *j) {
    pthread_mutex_lock(&j->mu);
    if (!j->client_gone && j->fd >= 0) {
        /* A peer that closed its end reads as end-of-file; MSG_PEEK leaves any bytes it sent
         * (a pipelined request) for the HTTP library. */
        char c;
        ssize_t n = recv(j->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) j->client_gone = true;
    }
    const bool alive = !j->client_gone;
    pthread_mutex_unlock(&j->mu);
    return alive;
}

void server_job_mark_gone(server_job *j) {
    pthread_mutex_lock(&j->mu);
    j->client_gone = true;
    pthread_cond_broadcast(&j->changed);
    pthread_mutex_unlock(&j->mu);
}

static void deadline_after(struct timespec *ts, double seconds) {
    clock_gettime(CLOCK_REALTIME, ts);
    double whole = floor(seconds);
    ts->tv_sec += (time_t)whole;
    ts->tv_nsec += (long)((seconds - whole) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

long server_job_read(server_job *j, char *buf, size_t max, double seconds) {
    struct timespec until;
    deadline_after(&until, seconds);
    pthread_mutex_lock(&j->mu);
    long rc = 0;
    for (;;) {
        if (j->sse.len > j->sse_sent) {
            size_t n = j->sse.len - j->sse_sent;
            if (n > max) n = max;
            memcpy(buf, j->sse.data + j->sse_sent, n);
            j->sse_sent += n;
            rc = (long)n;
            break;
        }
        if (j->done) {
            rc = -1;
            break;
        }
        if (pthread_cond_timedwait(&j->changed, &j->mu, &until) == ETIMEDOUT) break;
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

bool server_job_wait(server_job *j, double seconds) {
    struct timespec until;
    deadline_after(&until, seconds);
    pthread_mutex_lock(&j->mu);
    while (!j->done)
        if (pthread_cond_timedwait(&j->changed, &j->mu, &until) == ETIMEDOUT) break;
    const bool done = j->done;
    pthread_mutex_unlock(&j->mu);
    return done;
}

static void job_sink(void *user, const char *bytes, size_t len) {
    server_job *j = user;
    pthread_mutex_lock(&j->mu);
    dsml_buf_put(&j->sse, bytes, len);
    pthread_cond_broadcast(&j->changed);
    pthread_mutex_unlock(&j->mu);
}

/* Ends the job: body (non-streaming; taken over) and status. */
static void job_done(server_job *j, int status, char *body, size_t len) {
    pthread_mutex_lock(&j->mu);
    j->status = status;
    free(j->body);
    j->body = body;
    j->body_len = len;
    j->done = true;
    pthread_cond_broadcast(&j->changed);
    pthread_mutex_unlock(&j->mu);
}

/* Answers a job with an error: the JSON and status, or inside its stream. */
static void job_fail(server_job *j, server_output *out, const server_error *e) {
    if (j->req.stream && out) {
        server_output_stream_error(out, e);
        job_done(j, 200, NULL, 0);
        return;
    }
    if (j->req.stream) {
        /* No output yet: a stream that only carries the error. */
        server_output o;
        server_output_init(&o, j->req.api == SERVER_API_COMPLETIONS ? SERVER_API_COMPLETIONS : SERVER_API_CHAT, true,
                           false, false, "", job_sink, j);
        server_output_stream_error(&o, e);
        server_output_free(&o);
        job_done(j, 200, NULL, 0);
        return;
    }
    size_t len;
    char *body = server_error_json(e, &len);
    job_done(j, e->status, body, body ? len : 0);
}

/* ---- engine ------------------------------------------------------------------------------------------ */

int server_engine_open(server_engine *e, const server_engine_config *cfg, ds4f_error *err) {
    memset(e, 0, sizeof *e);
    e->cfg = *cfg;
    atomic_init(&e->stopping, 0);
    atomic_init(&e->served, 0);
    atomic_init(&e->cancelled, 0);
    if (server_queue_init(&e->queue, cfg->queue) || server_reasoning_memory_init(&e->reasoning, 256)) {
        server_engine_close(e);
        return error_set(err, "out of memory");
    }
    /* The tokenizer first: a checkpoint without one fails at once, not after the long load. */
    if (ds4f_tokenizer_open(cfg->model_dir, &e->tok, err)) {
        server_engine_close(e);
        return -1;
    }
    ds4f_model_options mo = cfg->model;
    mo.context = cfg->context;
    mo.sessions = 1; /* one generator, whatever the queue holds */
    if (ds4f_model_open(cfg->model_dir, &mo, &e->model, err)) {
        server_engine_close(e);
        return -1;
    }
    ds4f_model_info info;
    ds4f_model_get_info(e->model, &info);
    e->vocab = info.vocab_size;
    ds4f_session_options so;
    ds4f_session_options_init(&so);
    so.context = cfg->context;
    if (ds4f_generator_create(e->model, &so, e->tok, &e->gen, err)) {
        server_engine_close(e);
        return -1;
    }
    return 0;
}

static void *worker_main(void *arg);

int server_engine_start(server_engine *e, ds4f_error *err) {
    int rc = pthread_create(&e->worker, NULL, worker_main, e);
    if (rc) return error_set(err, "cannot start the generation thread: %s", strerror(rc));
    e->worker_started = true;
    return 0;
}

int server_engine_prepare(server_engine *e, server_job *j, server_error *err) {
    server_request *r = &j->req;
    if (r->api == SERVER_API_COMPLETIONS && !r->prompt) {
        for (int i = 0; i < r->n_prompt_ids; i++)
            if (r->prompt_ids[i] >= e->vocab)
                return server_error_invalid(err, "prompt", "prompt[%d] = %d is not a token id (the vocabulary has %d)", i,
                                            r->prompt_ids[i], e->vocab);
        j->prompt_tokens = r->n_prompt_ids;
    } else {
        ds4f_error derr;
        if (r->api != SERVER_API_COMPLETIONS && e->cfg.keep_reasoning && r->chat.thinking &&
            server_reasoning_memory_restore(&e->reasoning, &r->conv, &derr) < 0)
            return server_error_set(err, 500, "server_error", "out_of_memory", NULL, "%s", derr.msg);
        if (server_request_prompt(r, e->cfg.keep_reasoning, &j->prompt_text, &j->prompt_len, &j->opens_reasoning, err))
            return -1;
        /* Counted here, on the connection's thread, so that an over-long prompt is refused before it
         * waits in the queue. (The worker may count a few tokens differently when it reuses the
         * tokens of the previous answer; it checks again.) */
        int32_t *ids;
        size_t n;
        if (tokenizer_encode(e->tok, j->prompt_text, j->prompt_len, &ids, &n, &derr))
            return server_error_set(err, 500, "server_error", "tokenizer", NULL, "%s", derr.msg);
        free(ids);
        j->prompt_tokens = n > (size_t)INT32_MAX ? INT32_MAX : (int)n;
    }
    if (j->prompt_tokens > e->cfg.context)
        return server_error_set(err, 400, "invalid_request_error", "context_length_exceeded",
                                r->api == SERVER_API_COMPLETIONS ? "prompt" : "messages",
                                "this model's context is %d tokens (ds4f serve --ctx), but the prompt has %d tokens; "
                                "shorten it",
                                e->cfg.context, j->prompt_tokens);
    return 0;
}

int server_engine_submit(server_engine *e, server_job *j, server_error *err) {
    if (atomic_load(&e->stopping))
        return server_error_set(err, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
    server_job_retain(j); /* the queue's (then the worker's) reference */
    int ahead = 0;
    const int rc = server_queue_push(&e->queue, j, &ahead);
    if (rc == SERVER_QUEUE_OK) return 0;
    server_job_release(j);
    if (rc == SERVER_QUEUE_CLOSED)
        return server_error_set(err, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
    return server_error_set(err, 429, "rate_limit_error", "queue_full", NULL,
                            "the server is busy: one request is generating and %d are waiting (ds4f serve --queue %d); "
                            "retry later",
                            e->cfg.queue, e->cfg.queue);
}

void server_engine_stop(server_engine *e) {
    atomic_store(&e->stopping, 1);
    server_queue_close(&e->queue);
    if (e->gen) ds4f_generator_cancel(e->gen);
    if (e->worker_started) {
        pthread_join(e->worker, NULL);
        e->worker_started = false;
    }
    server_error err;
    server_error_set(&err, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
    for (server_job *j; (j = server_queue_take(&e->queue));) {
        job_fail(j, NULL, &err);
        server_log("%s %s %s 503: shut down while queued", j->peer, j->method, j->path);
        server_job_release(j);
    }
}

void server_engine_close(server_engine *e) {
    if (e->worker_started) server_engine_stop(e);
    ds4f_generator_free(e->gen);
    ds4f_model_close(e->model);
    ds4f_tokenizer_close(e->tok);
    server_prompt_cache_free(&e->cache);
    server_reasoning_memory_free(&e->reasoning);
    server_queue_destroy(&e->queue);
    memset(e, 0, sizeof *e);
}

/* ---- one generation ------------------------------------------------------------------------------------ */

typedef struct run_state {
    server_engine *e;
    server_job *j;
    server_output *out;
    int32_t *generated;  /* every sampled token reported, in order */
    int n_generated, cap_generated;
    bool oom;
    double last_output;
    bool client_gone, stopping;
} run_state;

static bool should_stop(run_state *s) {
    if (atomic_load(&s->e->stopping)) s->stopping = true;
    else if (!server_job_client_alive(s->j)) s->client_gone = true;
    return s->stopping || s->client_gone;
}

static int on_token(void *user, const ds4f_token_event *ev) {
    run_state *s = user;
    if (ev->id >= 0) {
        if (s->n_generated == s->cap_generated) {
            int cap = s->cap_generated ? s->cap_generated * 2 : 256;
            int32_t *p = realloc(s->generated, (size_t)cap * sizeof *p);
            if (!p) {
                s->oom = true;
                return 1;
            }
            s->generated = p;
            s->cap_generated = cap;
        }
        s->generated[s->n_generated++] = ev->id;
        server_output_count_token(s->out);
    }
    server_output_feed(s->out, ev->text, ev->len);
    if (ev->len) s->last_output = time_now_seconds();
    return should_stop(s) || s->out->oom;
}

static int on_prefill(void *user, int done, int total) {
    run_state *s = user;
    /* A long prefill sends nothing for a while: an SSE comment keeps the client and any proxy from
     * giving up on the connection. */
    const double now = time_now_seconds();
    if (s->j->req.stream && done > 0 && now - s->last_output >= s->e->cfg.keepalive) {
        job_sink(s->j, SERVER_SSE_KEEPALIVE, strlen(SERVER_SSE_KEEPALIVE));
        s->last_output = now;
    }
    (void)total;
    return should_stop(s);
}

static uint64_t fresh_seed(void) {
    char id[48];
    server_random_id(id, sizeof id, "");
    return strtoull(id + 8, NULL, 16) % 1000000000ull; /* short enough to type back in */
}

static void run_job(server_engine *e, server_job *j) {
    const double t_start = time_now_seconds();
    server_request *r = &j->req;
    server_error err;
    ds4f_error derr;
    int32_t *ids = NULL;
    int n_ids = 0, from_cache = 0; /* prompt tokens taken from the previous answer's exact tokens */

    if (j->prompt_text) {
        if (server_prompt_cache_encode(&e->cache, e->tok, j->prompt_text, j->prompt_len, &ids, &n_ids, &from_cache, &derr)) {
            server_error_set(&err, 500, "server_error", "tokenizer", NULL, "%s", derr.msg);
            job_fail(j, NULL, &err);
            server_log("%s %s %s 500: %s", j->peer, j->method, j->path, err.message);
            return;
        }
    } else {
        ids = malloc((size_t)r->n_prompt_ids * sizeof *ids);
        if (ids) memcpy(ids, r->prompt_ids, (size_t)r->n_prompt_ids * sizeof *ids);
        n_ids = r->n_prompt_ids;
    }
    if (!ids) {
        server_error_set(&err, 500, "server_error", "out_of_memory", NULL, "out of memory");
        job_fail(j, NULL, &err);
        return;
    }
    if (n_ids > e->cfg.context) {
        server_error_set(&err, 400, "invalid_request_error", "context_length_exceeded", "messages",
                         "this model's context is %d tokens (ds4f serve --ctx), but the prompt has %d tokens; shorten it",
                         e->cfg.context, n_ids);
        job_fail(j, NULL, &err);
        server_log("%s %s %s 400: %s", j->peer, j->method, j->path, err.message);
        free(ids);
        return;
    }

    const server_api api = r->api == SERVER_API_COMPLETIONS ? SERVER_API_COMPLETIONS : SERVER_API_CHAT;
    server_output out;
    server_output_init(&out, api, r->stream, r->include_usage, j->opens_reasoning, e->cfg.model_name, job_sink, j);
    run_state s = {.e = e, .j = j, .out = &out, .last_output = time_now_seconds()};

    ds4f_generate_params p;
    ds4f_generate_params_init(&p);
    p.sampling = r->sampling;
    if (!r->seed_given) p.sampling.seed = fresh_seed();
    p.max_tokens = r->max_tokens;
    p.stop_at_eos = !r->ignore_eos;
    p.stop_strings = (const char *const *)r->stops;
    p.n_stop_strings = r->n_stops;
    p.on_token = on_token;
    p.on_prefill = on_prefill;
    p.user = &s;
    ds4f_generate_result res;
    const int rc = ds4f_generate(e->gen, ids, n_ids, &p, &res, &derr);

    char stream_note[16] = "";
    if (r->stream) snprintf(stream_note, sizeof stream_note, " stream");
    if (rc != 0 || s.oom) {
        if (rc == 0) snprintf(derr.msg, sizeof derr.msg, "out of memory");
        server_error_set(&err, 500, "server_error", "generation_failed", NULL, "generation failed: %s", derr.msg);
        job_fail(j, &out, &err);
        server_log("%s %s %s 500%s: %s", j->peer, j->method, j->path, stream_note, err.message);
        server_output_free(&out);
        free(ids);
        free(s.generated);
        return;
    }

    /* What the next request of this conversation will start with (the stop token included: the
     * chat encoding writes the EOS after the answer). */
    if (res.stop_token >= 0 && s.n_generated < INT32_MAX) {
        s.generated = realloc(s.generated, ((size_t)s.n_generated + 1) * sizeof *s.generated);
        if (s.generated) s.generated[s.n_generated++] = res.stop_token;
        else s.n_generated = 0;
    }
    if (server_prompt_cache_set(&e->cache, e->tok, j->prompt_text ? j->prompt_text : "", j->prompt_text ? j->prompt_len : 0,
                                ids, n_ids, s.generated, s.n_generated, &derr))
        server_prompt_cache_free(&e->cache);
    if (!j->prompt_text) server_prompt_cache_free(&e->cache); /* its text is not known: no reuse by text */

    const bool cancelled = res.finish == DS4F_FINISH_CANCELLED;
    if (cancelled && !s.client_gone) s.stopping = true; /* ds4f_generator_cancel from server_engine_stop */
    char timing[160];
    snprintf(timing, sizeof timing, "%.2f s queued, %.2f s prefill, %.2f s decode", t_start - j->t_arrival,
             res.prefill_seconds, res.decode_seconds);
    if (cancelled) {
        atomic_fetch_add(&e->cancelled, 1);
        if (s.stopping) {
            server_error_set(&err, 503, "server_error", "shutting_down", NULL,
                             "the server is shutting down; the answer was cut off");
            job_fail(j, &out, &err);
        } else {
            job_done(j, 499, NULL, 0); /* nobody is listening any more */
        }
        server_log("%s %s %s cancelled%s (%s): prompt %d tokens (%d cached), %d generated; %s", j->peer, j->method,
                   j->path, stream_note, s.stopping ? "server shutting down" : "client disconnected", res.prompt_tokens,
                   res.cached_tokens, res.generated_tokens, timing);
    } else {
        server_usage u = {res.prompt_tokens, res.generated_tokens, res.cached_tokens, out.reasoning_tokens};
        char *body = NULL;
        size_t len = 0;
        const int frc = server_output_finish(&out, res.finish, &u, &body, &len);
        /* Remember the reasoning before the client can send its next turn. */
        /* Only answers that can be told apart: many answers cut off in their reasoning share the
         * empty content, and restoring the wrong reasoning would be worse than none. */
        if (api == SERVER_API_CHAT && j->opens_reasoning && out.reasoning_closed && (out.content.len || out.n_calls))
            server_reasoning_memory_put(&e->reasoning, out.content.data ? out.content.data : "", out.content.len, out.calls,
                                        out.n_calls, out.reasoning.data ? out.reasoning.data : "", out.reasoning.len);
        const char *reason = server_output_finish_reason(&out, res.finish);
        char malformed[300] = "";
        if (out.malformed && res.finish == DS4F_FINISH_STOP)
            snprintf(malformed, sizeof malformed, "; the answer broke the DSV4 format (%.200s), sent as content",
                     out.malformed_reason);
        if (frc != 0 && !r->stream) {
            free(body);
            server_error_set(&err, 500, "server_error", "out_of_memory", NULL, "out of memory writing the answer");
            job_fail(j, NULL, &err);
        } else {
            job_done(j, 200, body, len);
        }
        atomic_fetch_add(&e->served, 1);
        server_log("%s %s %s 200%s: prompt %d tokens (%d cached), %d generated, finish %s%s; %s", j->peer, j->method,
                   j->path, stream_note, res.prompt_tokens, res.cached_tokens, res.generated_tokens, reason, malformed,
                   timing);
    }
    server_output_free(&out);
    free(ids);
    free(s.generated);
}

static void *worker_main(void *arg) {
    server_engine *e = arg;
    for (server_job *j; (j = server_queue_pop(&e->queue));) {
        if (!server_job_client_alive(j)) {
            job_done(j, 499, NULL, 0);
            server_log("%s %s %s cancelled (client disconnected while queued)", j->peer, j->method, j->path);
            atomic_fetch_add(&e->cancelled, 1);
        } else {
            run_job(e, j);
        }
        server_queue_done(&e->queue);
        server_job_release(j);
    }
    return NULL;
}
