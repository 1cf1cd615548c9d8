/* Unit-test runner: runs every registered TEST (or those whose name contains argv[1]) and prints
 * "N passed, N failed". Exit status 1 if anything failed. */
#include "test.h"

#include <stdarg.h>
#include <string.h>
#include <time.h>

#define MAX_TESTS 1024

static struct { const char *name, *file; test_fn fn; } tests[MAX_TESTS];
static int test_count, current_failures;

void test_register(const char *name, const char *file, test_fn fn) {
    if (test_count == MAX_TESTS) { fprintf(stderr, "too many tests\n"); exit(2); }
    tests[test_count].name = name;
    tests[test_count].file = file;
    tests[test_count].fn = fn;
    test_count++;
}

void test_fail(const char *file, int line, const char *fmt, ...) {
    if (current_failures < 20) {
        fprintf(stdout, "    %s:%d: ", file, line);
        va_list ap;
        va_start(ap, fmt);
        vfprintf(stdout, fmt, ap);
        va_end(ap);
        fputc('\n', stdout);
    } else if (current_failures == 20) {
        fprintf(stdout, "    (further failures of this test not shown)\n");
    }
    current_failures++;
}

int test_failed_now(void) { return current_failures > 0; }

int main(int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL;
    int passed = 0, failed = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 0; i < test_count; i++) {
        if (filter && !strstr(tests[i].name, filter)) continue;
        current_failures = 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        tests[i].fn();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double sec = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        if (current_failures) {
            failed++;
            printf("FAIL %s (%d failed checks)\n", tests[i].name, current_failures);
        } else {
            passed++;
            printf("ok   %s (%.2fs)\n", tests[i].name, sec);
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
