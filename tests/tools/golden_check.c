/* golden_check REFERENCE.safetensors ENGINE.safetensors: runs every check of
 * tests/data/golden/README.md ("How to compare") on an engine output written by
 * `ds4f logits --all` and prints the failures; exit status 1 if any. */
#include <stdarg.h>
#include <stdio.h>

#include "../unit/golden.h"

static void print_fail(void *ctx, const char *file, int line, const char *msg) { printf("FAIL: %s\n", msg); }
static void print_note(void *ctx, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: golden_check REFERENCE.safetensors ENGINE.safetensors\n");
        return 2;
    }
    golden_run g;
    char msg[1024] = "";
    if (golden_load_reference(&g, argv[1], msg, sizeof msg) != 0 || golden_load_engine_file(&g, argv[2], msg, sizeof msg) != 0) {
        fprintf(stderr, "golden_check: %s\n", msg);
        return 2;
    }
    golden_report r = {NULL, print_fail, print_note, 0};
    golden_check_all(&g, &r);
    printf("%s: %d failed checks\n", g.name, r.failures);
    golden_free(&g);
    return r.failures ? 1 : 0;
}
