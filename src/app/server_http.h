/* ds4f serve: the HTTP side, on libmicrohttpd.
 *
 * Routes: POST /v1/chat/completions, POST /v1/completions (also without the /v1 prefix),
 * GET /v1/models (and /v1/models/NAME), GET /health, and POST /apply-template (llama.cpp's name:
 * a chat body answered with the prompt it renders to, for checking a client's conversation).
 *
 * libmicrohttpd runs one thread per connection. That thread reads the body, parses and checks it
 * and renders the prompt (so a bad request is refused at once, without queueing), then either
 * waits for the worker's answer (non-streaming) or sends the SSE stream as the worker writes it,
 * with a keep-alive comment whenever nothing came for a while (waiting in the queue, a long
 * prefill). The server listens before the model is loaded: meanwhile /health and the generation
 * endpoints answer 503. */
#ifndef DS4F_APP_SERVER_HTTP_H
#define DS4F_APP_SERVER_HTTP_H

#include <stdatomic.h>
#include <stddef.h>

#include "app/server_engine.h"
#include "app/server_request.h"

typedef enum { SERVER_LOADING, SERVER_READY, SERVER_STOPPING } server_state;

typedef struct server_http {
    server_engine *engine;           /* usable once state is SERVER_READY */
    atomic_int state;
    server_request_defaults defaults;
    const char *model_name;
    int context;
    double keepalive;                /* seconds without output before an SSE comment */
    size_t max_body;                 /* larger request bodies get 413 */
    long long created;               /* for /v1/models */
    struct MHD_Daemon *daemon;
    int port;                        /* the port actually bound */
    int listen_fd;                   /* after server_http_quiesce, closed by server_http_stop */
    atomic_int active;               /* requests between their first byte and their completion */
} server_http;

/* Binds host:port (port 0: any free port, see h->port) and starts answering. */
int server_http_start(server_http *h, const char *host, int port, unsigned max_connections, ds4f_error *err);
/* Stops accepting connections; open ones are served on. */
void server_http_quiesce(server_http *h);
/* Waits up to `seconds` for the requests in progress to finish sending their answers. */
void server_http_drain(server_http *h, double seconds);
/* Closes every connection and joins their threads. */
void server_http_stop(server_http *h);

#endif
