/* Error reporting used across all layers.
 *
 * Every fallible function returns 0 on success and -1 on failure, after writing one human-readable
 * sentence into a ds4f_error (what failed, which file/tensor/offset, what was expected). Callers
 * add context by prefixing, never by replacing, so the innermost cause is always kept. */
#ifndef DS4F_BASE_ERROR_H
#define DS4F_BASE_ERROR_H

#include <stddef.h>
#include "ds4f.h"

/* Writes the message and returns -1, so `return error_set(err, ...)` reads naturally. */
int error_set(ds4f_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prepends "context: " to the existing message; returns -1. */
int error_prefix(ds4f_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
