/* ds4f serve: HTTP plumbing on libmicrohttpd (see server_http.h). */
#include "app/server_http.h"

#include <microhttpd.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "app/server_response.h"
#include "base/error.h"
#include "base/timer.h"
#include "text/dsml.h"

/* Per-request state, from the first call of the access handler to the completion callback. */
typedef struct request_ctx {
    dsml_buf body;
    bool too_large;
    double t_arrival;
    server_job *job;        /* once a generation request was accepted */
    bool worker_logs;       /* the worker writes this request's log line */
    int status;             /* for the log line */
    char note[1024];        /* for the log line: the error message */
    char peer[64], method[8], path[64];
} request_ctx;

/* ---- responses ------------------------------------------------------------------------------------- */

/* Sends a body (taken over; NULL means out of memory) with a status. */
static enum MHD_Result send_body(struct MHD_Connection *c, request_ctx *ctx, int status, char *body, size_t len,
                                 const char *content_type) {
    if (!body) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                                  "\"code\":\"out_of_memory\"}}";
        body = strdup(oom);
        if (!body) return MHD_NO;
        len = strlen(body);
        status = 500;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (ctx) ctx->status = status;
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result send_json(struct MHD_Connection *c, request_ctx *ctx, int status, dsml_buf *b) {
    size_t len;
    char *body = dsml_buf_take(b, &len);
    return send_body(c, ctx, status, body, len, "application/json");
}

static enum MHD_Result send_error(struct MHD_Connection *c, request_ctx *ctx, const server_error *e) {
    size_t len;
    char *body = server_error_json(e, &len);
    snprintf(ctx->note, sizeof ctx->note, "%s", e->message);
    return send_body(c, ctx, e->status, body, len, "application/json");
}

/* ---- simple endpoints -------------------------------------------------------------------------------- */

static void put_model(dsml_buf *b, const server_http *h) {
    dsml_buf_puts(b, "{\"id\":");
    json_put_cstring(b, h->model_name);
    dsml_buf_puts(b, ",\"object\":\"model\",\"created\":");
    char t[64];
    snprintf(t, sizeof t, "%lld,\"owned_by\":\"ds4f\",\"context_length\":%d}", h->created, h->context);
    dsml_buf_puts(b, t);
}

static enum MHD_Result handle_health(struct MHD_Connection *c, request_ctx *ctx, server_http *h) {
    const int state = atomic_load(&h->state);
    dsml_buf b = {0};
    if (state != SERVER_READY) {
        dsml_buf_puts(&b, state == SERVER_LOADING ? "{\"status\":\"loading\"}" : "{\"status\":\"shutting down\"}");
        return send_json(c, ctx, 503, &b);
    }
    char t[160];
    snprintf(t, sizeof t, "{\"status\":\"ok\",\"queued\":%d,\"served\":%ld,\"cancelled\":%ld}",
             server_queue_waiting(&h->engine->queue), atomic_load(&h->engine->served),
             atomic_load(&h->engine->cancelled));
    dsml_buf_puts(&b, t);
    return send_json(c, ctx, 200, &b);
}

static enum MHD_Result handle_models(struct MHD_Connection *c, request_ctx *ctx, server_http *h, const char *one) {
    dsml_buf b = {0};
    if (one) {
        if (strcmp(one, h->model_name) != 0) {
            server_error e;
            server_error_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                             "the model '%.100s' does not exist; this server has '%.100s'", one, h->model_name);
            return send_error(c, ctx, &e);
        }
        put_model(&b, h);
        return send_json(c, ctx, 200, &b);
    }
    dsml_buf_puts(&b, "{\"object\":\"list\",\"data\":[");
    put_model(&b, h);
    dsml_buf_puts(&b, "]}");
    return send_json(c, ctx, 200, &b);
}

/* ---- generation endpoints ------------------------------------------------------------------------------ */

typedef struct stream_cls {
    server_http *h;
    server_job *job;
} stream_cls;

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_cls *s = cls;
    (void)pos;
    const double wait = s->h->keepalive > 0 ? s->h->keepalive : 1.0;
    const long n = server_job_read(s->job, buf, max, wait);
    if (n > 0) return (ssize_t)n;
    if (n < 0) return MHD_CONTENT_READER_END_OF_STREAM;
    /* Nothing for a while (waiting in the queue, a long prefill): make sure the client is still
     * there, and tell it that we are. */
    if (!server_job_client_alive(s->job)) return MHD_CONTENT_READER_END_WITH_ERROR;
    const size_t k = strlen(SERVER_SSE_KEEPALIVE);
    if (max < k) return 0;
    memcpy(buf, SERVER_SSE_KEEPALIVE, k);
    return (ssize_t)k;
}

static void stream_free(void *cls) {
    stream_cls *s = cls;
    server_job_release(s->job);
    free(s);
}

static enum MHD_Result start_stream(struct MHD_Connection *c, request_ctx *ctx, server_http *h) {
    stream_cls *s = malloc(sizeof *s);
    if (!s) return MHD_NO;
    s->h = h;
    s->job = ctx->job;
    server_job_retain(s->job);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, s, stream_free);
    if (!r) {
        stream_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no"); /* nginx: pass events on as they come */
    ctx->status = 200;
    enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return rc;
}

static int connection_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? (int)ci->connect_fd : -1;
}

static enum MHD_Result handle_generation(struct MHD_Connection *c, request_ctx *ctx, server_http *h, server_api api) {
    server_error e;
    if (ctx->too_large) {
        server_error_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                         "the request body is larger than %zu bytes", h->max_body);
        return send_error(c, ctx, &e);
    }
    const int state = atomic_load(&h->state);
    if (state == SERVER_LOADING) {
        server_error_set(&e, 503, "server_error", "model_loading", NULL, "the model is still loading; retry shortly");
        return send_error(c, ctx, &e);
    }
    if (state == SERVER_STOPPING) {
        server_error_set(&e, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
        return send_error(c, ctx, &e);
    }
    server_job *j = server_job_new();
    if (!j) return MHD_NO;
    ctx->job = j;
    if (server_request_parse(api, ctx->body.data ? ctx->body.data : "", ctx->body.len, &h->defaults, &j->req, &e) ||
        server_engine_prepare(h->engine, j, &e))
        return send_error(c, ctx, &e);

    if (api == SERVER_API_APPLY_TEMPLATE) {
        dsml_buf b = {0};
        dsml_buf_puts(&b, "{\"prompt\":");
        json_put_string(&b, j->prompt_text, j->prompt_len);
        char t[64];
        snprintf(t, sizeof t, ",\"tokens\":%d}", j->prompt_tokens);
        dsml_buf_puts(&b, t);
        return send_json(c, ctx, 200, &b);
    }

    snprintf(j->peer, sizeof j->peer, "%s", ctx->peer);
    snprintf(j->method, sizeof j->method, "%s", ctx->method);
    snprintf(j->path, sizeof j->path, "%s", ctx->path);
    j->t_arrival = ctx->t_arrival;
    j->fd = connection_fd(c);
    if (server_engine_submit(h->engine, j, &e)) return send_error(c, ctx, &e);
    ctx->worker_logs = true;
    if (j->req.stream) return start_stream(c, ctx, h);

    /* Non-streaming: this thread waits for the answer, looking at the socket now and then so that
     * a client that gave up while its request waited in the queue is noticed. */
    while (!server_job_wait(j, 0.5)) (void)server_job_client_alive(j); /* marks the job: the worker then skips or
                                                                          cancels it, and logs that */
    pthread_mutex_lock(&j->mu);
    const int status = j->status;
    char *body = j->body;
    const size_t len = j->body_len;
    j->body = NULL;
    pthread_mutex_unlock(&j->mu);
    if (status == 499) {
        /* The client is gone; this answer only closes the exchange properly. */
        free(body);
        server_error_set(&e, 499, "invalid_request_error", "client_closed", NULL, "the client closed the connection");
        size_t n;
        body = server_error_json(&e, &n);
        return send_body(c, ctx, status, body, n, "application/json");
    }
    return send_body(c, ctx, status, body, len, "application/json");
}

/* ---- routing ------------------------------------------------------------------------------------------ */

static enum MHD_Result route(struct MHD_Connection *c, request_ctx *ctx, server_http *h, const char *url,
                             const char *method) {
    const bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    const bool post = strcmp(method, "POST") == 0;
    const char *path = url;
    /* The OpenAI paths work with and without the /v1 prefix (clients differ in their base URL). */
    const char *tail = strncmp(path, "/v1/", 4) == 0 ? path + 3 : path;
    server_error e;
    const char *allow = NULL;
    if (!strcmp(tail, "/chat/completions")) {
        if (post) return handle_generation(c, ctx, h, SERVER_API_CHAT);
        allow = "POST";
    } else if (!strcmp(tail, "/completions")) {
        if (post) return handle_generation(c, ctx, h, SERVER_API_COMPLETIONS);
        allow = "POST";
    } else if (!strcmp(path, "/apply-template")) {
        if (post) return handle_generation(c, ctx, h, SERVER_API_APPLY_TEMPLATE);
        allow = "POST";
    } else if (!strcmp(tail, "/models") || !strncmp(tail, "/models/", 8)) {
        if (get) return handle_models(c, ctx, h, tail[7] == '/' ? tail + 8 : NULL);
        allow = "GET";
    } else if (!strcmp(path, "/health") || !strcmp(path, "/v1/health")) {
        if (get) return handle_health(c, ctx, h);
        allow = "GET";
    }
    if (allow) {
        server_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%.100s takes %s, not %.16s", path,
                         allow, method);
    } else {
        server_error_set(&e, 404, "invalid_request_error", "not_found", NULL,
                         "no such endpoint: %.16s %.100s (ds4f serve has /v1/chat/completions, /v1/completions, "
                         "/v1/models, /health, /apply-template)",
                         method, path);
    }
    return send_error(c, ctx, &e);
}

static void peer_name(struct MHD_Connection *c, char *out, size_t size) {
    snprintf(out, size, "?");
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr) return;
    const socklen_t len =
        ci->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    char host[NI_MAXHOST];
    if (getnameinfo(ci->client_addr, len, host, sizeof host, NULL, 0, NI_NUMERICHOST) == 0) snprintf(out, size, "%.63s", host);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    server_http *h = cls;
    (void)version;
    request_ctx *ctx = *con_cls;
    if (!ctx) {
        ctx = calloc(1, sizeof *ctx);
        if (!ctx) return MHD_NO;
        ctx->t_arrival = time_now_seconds();
        peer_name(c, ctx->peer, sizeof ctx->peer);
        snprintf(ctx->method, sizeof ctx->method, "%s", method);
        snprintf(ctx->path, sizeof ctx->path, "%s", url);
        *con_cls = ctx;
        atomic_fetch_add(&h->active, 1);
        return MHD_YES;
    }
    if (*upload_size) {
        if (ctx->body.len + *upload_size > h->max_body) ctx->too_large = true;
        if (!ctx->too_large) dsml_buf_put(&ctx->body, upload_data, *upload_size);
        if (ctx->body.oom) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    return route(c, ctx, h, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    server_http *h = cls;
    (void)c;
    request_ctx *ctx = *con_cls;
    if (!ctx) return;
    *con_cls = NULL;
    atomic_fetch_sub(&h->active, 1);
    if (ctx->job) {
        /* From here on the connection may be closed and its socket number reused. */
        server_job_mark_gone(ctx->job);
        server_job_release(ctx->job);
    }
    if (!ctx->worker_logs) {
        const bool quiet = ctx->status == 200 && (!strcmp(ctx->path, "/health") || !strcmp(ctx->path, "/v1/health"));
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !ctx->status)
            server_log("%s %s %s: connection closed before an answer", ctx->peer, ctx->method, ctx->path);
        else if (!quiet)
            server_log("%s %s %s %d%s%s", ctx->peer, ctx->method, ctx->path, ctx->status, ctx->note[0] ? ": " : "",
                       ctx->note);
    }
    dsml_buf_free(&ctx->body);
    free(ctx);
}

/* ---- daemon ----------------------------------------------------------------------------------------------- */

int server_http_start(server_http *h, const char *host, int port, unsigned max_connections, ds4f_error *err) {
    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", port);
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gai = getaddrinfo(host, port_text, &hints, &ai);
    if (gai) return error_set(err, "cannot resolve the address %s: %s", host, gai_strerror(gai));
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (MHD_is_feature_supported(MHD_FEATURE_POLL) == MHD_YES) flags |= MHD_USE_POLL;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->daemon = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, h,
                                 MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                                 MHD_OPTION_CONNECTION_LIMIT, max_connections,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
                                 MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->daemon)
        return error_set(err, "cannot listen on %s port %d (in use, or not an address of this machine?)", host, port);
    h->listen_fd = -1;
    h->port = port;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_LISTEN_FD);
    if (di) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        if (getsockname(di->listen_fd, (struct sockaddr *)&ss, &len) == 0)
            h->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                     : ((struct sockaddr_in *)&ss)->sin_port);
    }
    return 0;
}

void server_http_quiesce(server_http *h) {
    if (h->daemon && h->listen_fd < 0) h->listen_fd = (int)MHD_quiesce_daemon(h->daemon);
}

void server_http_drain(server_http *h, double seconds) {
    const double until = time_now_seconds() + seconds;
    while (atomic_load(&h->active) > 0 && time_now_seconds() < until) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

void server_http_stop(server_http *h) {
    if (!h->daemon) return;
    MHD_stop_daemon(h->daemon);
    h->daemon = NULL;
    if (h->listen_fd >= 0) close(h->listen_fd);
    h->listen_fd = -1;
}
