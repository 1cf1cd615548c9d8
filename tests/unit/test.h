/* Minimal test harness: TEST(name) { ... } registers a test; CHECK(cond, fmt, ...) records a
 * failure with file:line and keeps going (so one run shows every broken check); REQUIRE stops the
 * current test. Each TEST counts once in the closing "N passed, N failed" line. Tests find their
 * data under tests/data/ relative to the repository root (the runner's working directory). */
#ifndef DS4F_TEST_H
#define DS4F_TEST_H

#include <stdio.h>
#include <stdlib.h>

typedef void (*test_fn)(void);
void test_register(const char *name, const char *file, test_fn fn);
void test_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int test_failed_now(void);

#define TEST(name)                                                                    \
    static void test_##name(void);                                                    \
    __attribute__((constructor)) static void test_register_##name(void) {            \
        test_register(#name, __FILE__, test_##name);                                   \
    }                                                                                 \
    static void test_##name(void)

#define CHECK(cond, ...)                                                              \
    do {                                                                              \
        if (!(cond)) test_fail(__FILE__, __LINE__, __VA_ARGS__);                       \
    } while (0)

#define REQUIRE(cond, ...)                                                            \
    do {                                                                              \
        if (!(cond)) { test_fail(__FILE__, __LINE__, __VA_ARGS__); return; }           \
    } while (0)

#endif
