/* Tokenizer benchmark: load time of tokenizer.json and single-core encode speed per corpus, all
 * measured in one run (these machines are noisy; compare figures of the same run).
 *
 *   bench_tokenizer TOKENIZER_JSON LABEL=FILE[,FILE...] ...
 *
 * For each corpus: "whole" encodes each file with one call (the per-call piece cache sees the
 * whole file), "lines" encodes each line with its own call (prompt-sized inputs, cold cache).
 * Every figure is the best of several repetitions. Built and run by bench/bench_tokenizer.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file_io.h"
#include "base/timer.h"
#include "text/tokenizer.h"

#define REPEATS 5

typedef struct corpus {
    const char *label;
    char **texts;
    size_t *lens;
    size_t n_texts, bytes;
} corpus;

static int add_file(corpus *c, const char *path) {
    ds4f_error err;
    char *text;
    size_t len;
    if (file_read_all(path, &text, &len, &err) != 0) { fprintf(stderr, "%s\n", err.msg); return -1; }
    c->texts = realloc(c->texts, (c->n_texts + 1) * sizeof *c->texts);
    c->lens = realloc(c->lens, (c->n_texts + 1) * sizeof *c->lens);
    c->texts[c->n_texts] = text;
    c->lens[c->n_texts] = len;
    c->n_texts++;
    c->bytes += len;
    return 0;
}

/* Seconds for one pass over the corpus; by_line: one encode call per line. */
static double encode_pass(const tokenizer *tok, const corpus *c, int by_line, size_t *n_tokens) {
    ds4f_error err;
    *n_tokens = 0;
    double t0 = time_now_seconds();
    for (size_t f = 0; f < c->n_texts; f++) {
        const char *p = c->texts[f], *end = p + c->lens[f];
        while (p < end) {
            const char *stop = end;
            if (by_line) {
                const char *nl = memchr(p, '\n', (size_t)(end - p));
                if (nl) stop = nl + 1;
            }
            int32_t *ids;
            size_t n;
            if (tokenizer_encode(tok, p, (size_t)(stop - p), &ids, &n, &err) != 0) {
                fprintf(stderr, "encode failed: %s\n", err.msg);
                exit(1);
            }
            *n_tokens += n;
            free(ids);
            p = stop;
        }
    }
    return time_now_seconds() - t0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON LABEL=FILE[,FILE...] ...\n", argv[0]);
        return 2;
    }
    ds4f_error err;
    tokenizer *tok = NULL;
    double best_load = 1e9;
    for (int r = 0; r < REPEATS; r++) {
        double t0 = time_now_seconds();
        if (tokenizer_load(argv[1], &tok, &err) != 0) { fprintf(stderr, "%s\n", err.msg); return 1; }
        double t = time_now_seconds() - t0;
        if (t < best_load) best_load = t;
        if (r + 1 < REPEATS) tokenizer_free(tok);
    }
    printf("load %s: %.1f ms (best of %d), vocab %d\n", argv[1], best_load * 1e3, REPEATS, tokenizer_vocab_size(tok));
    printf("%-10s %10s %10s %13s %13s\n", "corpus", "bytes", "tokens", "whole MB/s", "lines MB/s");
    for (int a = 2; a < argc; a++) {
        corpus c = {0};
        char *spec = strdup(argv[a]);
        char *eq = strchr(spec, '=');
        if (!eq) { fprintf(stderr, "expected LABEL=FILE[,FILE...], got %s\n", argv[a]); return 2; }
        *eq = 0;
        c.label = spec;
        for (char *f = strtok(eq + 1, ","); f; f = strtok(NULL, ","))
            if (add_file(&c, f) != 0) return 1;
        double best[2] = {1e9, 1e9};
        size_t tokens = 0;
        for (int r = 0; r < REPEATS; r++)
            for (int by_line = 0; by_line < 2; by_line++) {
                double t = encode_pass(tok, &c, by_line, &tokens);
                if (t < best[by_line]) best[by_line] = t;
            }
        printf("%-10s %10zu %10zu %13.1f %13.1f\n", c.label, c.bytes, tokens, c.bytes / best[0] / 1e6,
               c.bytes / best[1] / 1e6);
        for (size_t i = 0; i < c.n_texts; i++) free(c.texts[i]);
        free(c.texts);
        free(c.lens);
        free(spec);
    }
    tokenizer_free(tok);
    return 0;
}
