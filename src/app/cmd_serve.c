/* ds4f serve: an OpenAI-compatible HTTP server for one model (server_http.h has the endpoints,
 * server_engine.h the generation side). Listens first, loads the model, serves until SIGINT or
 * SIGTERM, then stops gracefully: no new connections, waiting requests answered 503, the running
 * generation cancelled (its client gets the end of its stream), everything freed. A second
 * signal ends the process at once. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "app/commands.h"
#include "app/report.h"
#include "app/server_engine.h"
#include "app/server_http.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: ds4f serve -m DIR [options]\n"
            "\n"
            "OpenAI-compatible HTTP server: POST /v1/chat/completions (streaming or not, tools, reasoning),\n"
            "POST /v1/completions, GET /v1/models, GET /health, POST /apply-template (the rendered prompt).\n"
            "One generation runs at a time; others wait in a bounded queue. Each request is logged on stderr.\n"
            "\n"
            "  -m DIR            checkpoint directory (config.json, safetensors, tokenizer.json)\n"
            "  --host ADDR       address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 or ::\n"
            "                    exposes the server to the network, without any authentication)\n"
            "  --port N          port (default 8080; 0: any free port, printed when listening)\n"
            "  --queue N         requests that may wait while one generates (default 8); more get 429\n"
            "  --alias NAME      model name in responses and /v1/models (default: the directory's name)\n"
            "  --think           thinking mode for requests that do not choose (answers start with reasoning,\n"
            "                    sent as reasoning_content)\n"
            "  --no-think        chat mode for requests that do not choose (the default)\n"
            "  --keep-reasoning  in thinking mode, keep earlier answers' reasoning in the prompt (sent back\n"
            "                    by the client, or remembered by the server) so that a new turn prefills only\n"
            "                    its new tokens. By default earlier answers are rendered without their\n"
            "                    reasoning, as the official encoder does (and the model was trained), and a\n"
            "                    new thinking-mode turn prefills the whole conversation again\n"
            "  -n, --max-tokens N  tokens per answer when a request gives no max_tokens (default: until EOS\n"
            "                    or the context is full)\n"
            "  --keepalive S     seconds without output before an SSE keep-alive comment (default 5; 0: after\n"
            "                    every prefill chunk)\n"
            "  -h, --help        this help\n"
            "\n"
            "Model and streaming (--ctx is the context of the one session: prompt and answer together):\n"
            "%s"
            "\n"
            "Requests choose thinking with DeepSeek's \"thinking\": {\"type\": \"enabled\"}, \"reasoning_effort\", or\n"
            "\"chat_template_kwargs\": {\"thinking\": true}. SIGINT or SIGTERM stops the server gracefully.\n"
            "example: ds4f serve -m ~/models/DeepSeek-V4-Flash --port 8080 --ctx 16384\n",
            stream_flags_help);
}

static int parse_long(const char *flag, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "ds4f serve: %s expects an integer in [%lld, %lld], got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* ---- signals ------------------------------------------------------------------------------------ */

/* Signals are blocked in every thread and taken by this one with sigwait, so that the reaction
 * can use locks and the log like any other code. */
typedef struct signal_watch {
    sigset_t set;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int signal;          /* the first signal received (0: none yet) */
    const server_http *http;
} signal_watch;

static void *signal_main(void *arg) {
    signal_watch *w = arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&w->set, &sig) != 0) continue;
        pthread_mutex_lock(&w->mu);
        const bool first = w->signal == 0;
        if (first) w->signal = sig;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        if (!first) {
            server_log("second %s: exiting at once", sig == SIGINT ? "SIGINT" : "SIGTERM");
            _exit(1);
        }
        if (atomic_load(&w->http->state) == SERVER_LOADING) {
            /* Loading cannot be interrupted and holds nothing worth a clean shutdown. */
            server_log("%s while loading the model: exiting", sig == SIGINT ? "SIGINT" : "SIGTERM");
            _exit(1);
        }
        server_log("%s: shutting down (a second one exits at once)", sig == SIGINT ? "SIGINT" : "SIGTERM");
    }
    return NULL;
}

/* The name under which the model is served: the checkpoint directory's last component. */
static void default_model_name(const char *dir, char *out, size_t size) {
    size_t end = strlen(dir);
    while (end > 1 && dir[end - 1] == '/') end--;
    size_t start = end;
    while (start > 0 && dir[start - 1] != '/') start--;
    snprintf(out, size, "%.*s", (int)(end - start), dir + start);
    if (!out[0]) snprintf(out, size, "ds4f");
}

int cmd_serve(int argc, char **argv) {
    const char *model_dir = NULL, *host = "127.0.0.1", *alias = NULL;
    long long port = 8080, queue = 8, max_tokens = 0;
    double keepalive = 5;
    bool thinking = false, keep_reasoning = false;
    ds4f_model_options model_options;
    ds4f_model_options_init(&model_options);
    model_options.show_progress = isatty(2);
    for (int i = 1; i < argc;) {
        /* --ram, --ctx, --experts, -t, ...: the flags every model-running command shares */
        const int shared = stream_flag_parse(argc, argv, &i, &model_options);
        if (shared < 0) return 2;
        if (shared > 0) continue;
        const char *a = argv[i++];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--think") || !strcmp(a, "--no-think")) {
            thinking = !strcmp(a, "--think");
            continue;
        }
        if (!strcmp(a, "--keep-reasoning")) {
            keep_reasoning = true;
            continue;
        }
        static const char *const with_value[] = {"-m", "--host", "--port", "--queue", "--alias",
                                                 "-n", "--max-tokens", "--keepalive"};
        bool known = false;
        for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++) known |= !strcmp(a, with_value[k]);
        if (!known) {
            fprintf(stderr, "ds4f serve: unknown option '%s' (ds4f serve --help)\n", a);
            return 2;
        }
        if (i >= argc) {
            fprintf(stderr, "ds4f serve: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[i++];
        if (!strcmp(a, "-m")) model_dir = v;
        else if (!strcmp(a, "--host")) host = v;
        else if (!strcmp(a, "--alias")) alias = v;
        else if (!strcmp(a, "--port")) {
            if (parse_long(a, v, 0, 65535, &port)) return 2;
        } else if (!strcmp(a, "--queue")) {
            if (parse_long(a, v, 0, 4096, &queue)) return 2;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) {
            if (parse_long(a, v, 0, 1 << 30, &max_tokens)) return 2;
        } else if (!strcmp(a, "--keepalive")) {
            char *end;
            keepalive = strtod(v, &end);
            if (end == v || *end || !(keepalive >= 0 && keepalive <= 3600)) {
                fprintf(stderr, "ds4f serve: --keepalive expects seconds in [0, 3600], got '%s'\n", v);
                return 2;
            }
        }
    }
    const long long context = model_options.context > 0 ? model_options.context : 4096;
    if (!model_dir) {
        fprintf(stderr, "ds4f serve: no checkpoint: give -m DIR (ds4f serve --help)\n");
        return 2;
    }
    char model_name[256];
    if (alias) snprintf(model_name, sizeof model_name, "%s", alias);
    else default_model_name(model_dir, model_name, sizeof model_name);

    /* Before any thread exists, so that all of them inherit the mask. A client that disconnects
     * must not kill the server with SIGPIPE either. */
    /* static: the detached signal thread may still look at it while the process exits */
    static signal_watch watch = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    sigemptyset(&watch.set);
    sigaddset(&watch.set, SIGINT);
    sigaddset(&watch.set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &watch.set, NULL);
    signal(SIGPIPE, SIG_IGN);

    server_engine engine;
    memset(&engine, 0, sizeof engine);
    server_http http;
    memset(&http, 0, sizeof http);
    atomic_init(&http.state, SERVER_LOADING);
    http.engine = &engine;
    http.defaults.thinking = thinking;
    http.defaults.max_tokens = (int)max_tokens;
    http.model_name = model_name;
    http.context = (int)context;
    http.keepalive = keepalive;
    http.max_body = 64u << 20;
    http.created = (long long)time(NULL);
    watch.http = &http;

    pthread_t signal_thread;
    if (pthread_create(&signal_thread, NULL, signal_main, &watch) != 0) {
        fprintf(stderr, "ds4f serve: cannot start the signal thread\n");
        return 1;
    }
    pthread_detach(signal_thread);

    ds4f_error err;
    /* Each waiting or generating request holds a connection; leave room for /health and friends. */
    const unsigned max_connections = (unsigned)queue + 64;
    if (server_http_start(&http, host, (int)port, max_connections, &err)) {
        fprintf(stderr, "ds4f serve: %s\n", err.msg);
        return 1;
    }
    const bool v6 = strchr(host, ':') != NULL;
    server_log("listening on http://%s%s%s:%d (loading %s)", v6 ? "[" : "", host, v6 ? "]" : "", http.port, model_dir);

    server_engine_config cfg = {
        .model_dir = model_dir,
        .model_name = model_name,
        .context = (int)context,
        .queue = (int)queue,
        .keep_reasoning = keep_reasoning,
        .keepalive = keepalive,
        .model = model_options,
    };
    if (server_engine_open(&engine, &cfg, &err) || server_engine_start(&engine, &err)) {
        fprintf(stderr, "ds4f serve: %s\n", err.msg);
        atomic_store(&http.state, SERVER_STOPPING);
        server_http_stop(&http);
        server_engine_close(&engine);
        return 1;
    }
    atomic_store(&http.state, SERVER_READY);
    server_log("ready: model %s, context %lld tokens, queue %lld, %s by default", model_name, context, queue,
               thinking ? "thinking" : "chat mode");

    pthread_mutex_lock(&watch.mu);
    while (!watch.signal) pthread_cond_wait(&watch.cv, &watch.mu);
    pthread_mutex_unlock(&watch.mu);

    atomic_store(&http.state, SERVER_STOPPING);
    server_http_quiesce(&http);
    server_engine_stop(&engine);
    server_http_drain(&http, 3.0); /* the last events of cut-off streams, the 503s of the queue */
    server_http_stop(&http);
    server_log("stopped: %ld requests answered, %ld cancelled", atomic_load(&engine.served), atomic_load(&engine.cancelled));
    server_engine_close(&engine);
    return 0;
}
